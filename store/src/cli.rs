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
/// daemon. Call inside the runtime. A handler that cannot be installed is
/// an error (exit 2): a daemon that could not be stopped cleanly must not
/// run, and one whose signal stream ended must not take that for a stop.
pub fn shutdown_signal(then: &'static str) -> Result<tokio::sync::watch::Receiver<bool>, std::io::Error> {
    use tokio::signal::unix::SignalKind;
    shutdown_on(&[(SignalKind::terminate(), "SIGTERM"), (SignalKind::interrupt(), "SIGINT")], then)
}

/// [`shutdown_signal`] for the given signals and their names (every
/// handler is installed before this returns).
pub fn shutdown_on(
    kinds: &[(tokio::signal::unix::SignalKind, &'static str)],
    then: &'static str,
) -> Result<tokio::sync::watch::Receiver<bool>, std::io::Error> {
    let mut streams = Vec::with_capacity(kinds.len());
    for (kind, name) in kinds {
        streams.push((tokio::signal::unix::signal(*kind)?, *name));
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    let tx = std::sync::Arc::new(tx);
    for (mut stream, name) in streams {
        let tx = tx.clone();
        tokio::spawn(async move {
            if stream.recv().await.is_some() && tx.send_if_modified(|stop| !std::mem::replace(stop, true)) {
                tracing::info!("{name}: {then}");
            }
            // The sender stays alive: receivers see one change, never a closed channel.
            std::future::pending::<()>().await;
        });
    }
    Ok(rx)
}

/// Writes a command's report to stdout (logs go to stderr). A reader
/// that stops early (`| head`) is no error: the rest is dropped, as other
/// command-line tools do, instead of a panic and exit 101. Any other
/// failure (a full disk under `> file`) exits 75: the report was not
/// delivered, and running it again may.
pub fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            tracing::error!(error = %e, "cannot write the report to stdout");
            std::process::exit(i32::from(exit::TRANSIENT));
        }
        _ => {}
    }
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

    /// A signal no process may catch cannot get a handler: that is an
    /// error for the caller (exit 2), not a receiver that reads as a stop.
    #[tokio::test]
    async fn a_handler_that_cannot_be_installed_is_an_error() {
        let kill = tokio::signal::unix::SignalKind::from_raw(9);
        assert!(super::shutdown_on(&[(kill, "SIGKILL")], "stopping").is_err());
        let mut rx = super::shutdown_signal("stopping").expect("SIGTERM and SIGINT handlers");
        assert!(!*rx.borrow_and_update());
        let changed = tokio::time::timeout(std::time::Duration::from_millis(200), rx.changed()).await;
        assert!(changed.is_err(), "no signal, no change (and the channel is not closed)");
    }

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
