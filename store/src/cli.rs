//! What every command's `main` does the same way: logs to stderr (filter
//! from `RUST_LOG`, default `info`), a multi-threaded runtime, and the exit
//! code of the SPEC (the command's own 0/1, or 2 on a failure).

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
}

/// Runs `work` to completion: its code, or 2 (logged as `<command> failed`) on an error.
pub fn run<E: Display>(command: &str, work: impl Future<Output = Result<i32, E>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(%e, "cannot start the runtime");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(work) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            tracing::error!(error = %e, "{command} failed");
            ExitCode::from(2)
        }
    }
}
