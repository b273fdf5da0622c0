//! `inferlog-ingest --config FILE [--exit-when-idle DURATION]`: the consumer
//! daemon. Logs to stderr. Exit 0 after a clean shutdown (SIGTERM/SIGINT,
//! or drained with --exit-when-idle), 2 on permanent errors (config,
//! credentials, rights, a drifted table, a missing DLQ), 75 on transient
//! ones that outlasted their wait, 70 when a task panicked (a bug).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use inferlog_ingest::pipeline::{run, RunOptions};
use inferlog_ingest::{metrics, Config};

#[derive(Debug, Parser)]
#[command(name = "inferlog-ingest", version, about = "Kafka to ClickHouse, exactly once; rejects to the DLQ")]
struct Cli {
    /// inferlog config file (TOML); INFERLOG_<TABLE>__<KEY> variables override it.
    #[arg(long, env = "INFERLOG_CONFIG", value_name = "FILE")]
    config: PathBuf,
    /// Drain the topics, commit and exit after this long without new messages
    /// and with every assigned partition read to its high watermark (e.g. "10s").
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    exit_when_idle: Option<Duration>,
}

fn main() -> ExitCode {
    inferlog_ingest::memory::fix_mmap_threshold();
    inferlog_store::cli::init_logging();
    let cli = Cli::parse();
    if let Err(e) = inferlog_ingest::hooks::refuse_unless_built_in() {
        tracing::error!(error = %e, "refusing to start");
        return ExitCode::from(inferlog_schema::error::exit::PERMANENT);
    }
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "invalid configuration");
            return ExitCode::from(inferlog_schema::error::exit::PERMANENT);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(config.ingest.worker_threads).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::from(inferlog_schema::error::exit::PERMANENT);
        }
    };
    let code = runtime.block_on(async move {
        let shutdown = match inferlog_store::cli::shutdown_signal("stopping fetch, flushing, committing") {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot install the SIGTERM / SIGINT handlers: a daemon that cannot be stopped cleanly does not start");
                return inferlog_schema::error::exit::PERMANENT;
            }
        };
        let metrics = metrics::Metrics::new();
        if !config.ingest.metrics_addr.is_empty() {
            let (addr, m, s) = (config.ingest.metrics_addr.clone(), metrics.clone(), shutdown.clone());
            tokio::spawn(async move {
                if let Err(e) = metrics::serve(addr, m, s).await {
                    tracing::error!(error = %e, "metrics server stopped");
                }
            });
        }
        match run(config, RunOptions { exit_when_idle: cli.exit_when_idle }, metrics, shutdown).await {
            Ok(summary) => {
                tracing::info!(
                    messages = summary.messages,
                    rows = summary.rows,
                    rejects = summary.rejects,
                    duplicates = summary.duplicates,
                    "ingest stopped cleanly"
                );
                inferlog_schema::error::exit::OK
            }
            Err(e) => {
                let class = e.class();
                tracing::error!(error = %e, ?class, exit_code = e.exit_code(), "ingest failed");
                e.exit_code()
            }
        }
    });
    // A broker call still blocked (a broker that went away) must not hold
    // the exit past the shutdown budget.
    runtime.shutdown_timeout(Duration::from_secs(1));
    ExitCode::from(code)
}
