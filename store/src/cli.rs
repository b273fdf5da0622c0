//! What every command's `main` does the same way: logs to stderr (filter
//! from `RUST_LOG`, default `info`), a multi-threaded runtime, and the exit
//! code of its error's class ([`inferlog_schema::error::exit`]).

use std::fmt::Display;

use inferlog_schema::error::exit;
use inferlog_schema::Classified;
use std::future::Future;
use std::process::ExitCode;

pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(log_filter(std::env::var("RUST_LOG").ok().as_deref()))
        .init();
}

/// `RUST_LOG` (default "info"), with the `clickhouse` crate held to
/// warnings unless `RUST_LOG` names it: that crate enters an INFO span each
/// time a row cursor is polled, which costs ~3% of an archive pass while
/// logging nothing.
fn log_filter(rust_log: Option<&str>) -> tracing_subscriber::EnvFilter {
    let directives = rust_log.filter(|s| !s.trim().is_empty()).unwrap_or("info");
    let directives = if directives.contains("clickhouse") { directives.to_owned() } else { format!("{directives},clickhouse=warn") };
    tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|_| "info,clickhouse=warn".into())
}

/// A receiver that turns true at the first SIGTERM or SIGINT, logged with
/// `then` (what the daemon does next). The one signal handler of every
/// daemon. Call inside the runtime.
pub fn shutdown_signal(then: &'static str) -> tokio::sync::watch::Receiver<bool> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(term), Ok(int)) => (term, int),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(%e, "cannot listen for SIGTERM / SIGINT");
                return;
            }
        };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{name}: {then}");
        let _ = tx.send(true);
    });
    rx
}

/// Writes a command's report to stdout (logs go to stderr).
#[allow(clippy::print_stdout)]
pub fn print_stdout(text: &str) {
    print!("{text}");
}

/// Runs `work` to completion: its code, or on an error (logged as
/// `<command> failed`) the exit code of the error's class.
pub fn run<E: Display + Classified>(command: &str, work: impl Future<Output = Result<i32, E>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(%e, "cannot start the runtime");
            return ExitCode::from(exit::PERMANENT);
        }
    };
    match runtime.block_on(work) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            let class = e.class();
            tracing::error!(error = %e, ?class, "{command} failed");
            ExitCode::from(class.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn the_clickhouse_crate_is_held_to_warnings_unless_rust_log_names_it() {
        for rust_log in [None, Some(""), Some("debug"), Some("inferlog_compactor=trace")] {
            let filter = log_filter(rust_log).to_string();
            assert!(filter.contains("clickhouse=warn"), "{rust_log:?} gave {filter}");
        }
        let filter = log_filter(Some("info,clickhouse=trace")).to_string();
        assert!(filter.contains("clickhouse=trace") && !filter.contains("clickhouse=warn"), "{filter}");
    }
}
