//! `inferlog-ingest --config FILE [--exit-when-idle DURATION]`: the consumer
//! daemon. Logs to stderr. Exit 0 after a clean shutdown (SIGTERM/SIGINT,
//! or drained with --exit-when-idle), 2 on permanent errors (config,
//! credentials, rights, a drifted table, a missing DLQ), 75 on transient
//! ones that outlasted their wait, 70 when a task panicked (a bug).
//!
//! `inferlog-ingest --print-ddl DATABASE.TABLE [--server-version 24.8]`:
//! the hot table's `CREATE TABLE` (stdout), what the benches create.
//!
//! `inferlog-ingest --config FILE dlq inspect [--from T] [--to T] [--format
//! text|json]`: what the DLQ holds (stdout). Exit 0, 1 when its oldest
//! message is older than the hot policy, 2 or 75 as above.
//!
//! `inferlog-ingest --config FILE dlq replay [--reason R]... [--from T]
//! [--to T] [--dry-run] [--format text|json] [--metrics-file F]`: the
//! DLQ's events that pass today's contract stored once, by their source
//! coordinates; the run's figures for Prometheus in `F`. Exit 0, 1 when a
//! selected event is still invalid or refused, 2 or 75 as above.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use inferlog_ingest::dlq_inspect::{self, Inspector, Window};
use inferlog_ingest::dlq_replay;
use inferlog_ingest::pipeline::{run, RunOptions};
use inferlog_ingest::{metrics, Config, IngestError};
use inferlog_schema::error::exit;

#[derive(Debug, Parser)]
#[command(name = "inferlog-ingest", version, about = "Kafka to ClickHouse, exactly once; rejects to the DLQ")]
struct Cli {
    /// inferlog config file (TOML); INFERLOG_<TABLE>__<KEY> variables override it.
    #[arg(long, env = "INFERLOG_CONFIG", value_name = "FILE", required_unless_present = "print_ddl")]
    config: Option<PathBuf>,
    /// Print the hot table's `CREATE TABLE` as `DATABASE.TABLE` and exit,
    /// for a server of `--server-version` (what the benches create).
    #[arg(long, value_name = "DATABASE.TABLE")]
    print_ddl: Option<String>,
    /// With --print-ddl: the server's version, MAJOR.MINOR.
    #[arg(long, value_name = "MAJOR.MINOR", default_value = "24.8", value_parser = parse_version, requires = "print_ddl")]
    server_version: (u32, u32),
    /// Drain the topics, commit and exit after this long without new messages
    /// and with every assigned partition read to its high watermark (e.g. "10s").
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    exit_when_idle: Option<Duration>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The dead-letter queue (`[kafka] dlq_topic`).
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
}

#[derive(Debug, Subcommand)]
enum DlqAction {
    /// What the DLQ holds: messages by reason × field × source topic and by
    /// hour, a sample per reason (as stored), the oldest message's age
    /// against the hot policy. Reads the whole topic; commits nothing.
    Inspect {
        /// Count messages refused at or after this time (YYYY-MM-DD or RFC 3339, UTC).
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        from: Option<i64>,
        /// Count messages refused before this time (YYYY-MM-DD or RFC 3339, UTC).
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        to: Option<i64>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Validates the DLQ's messages again under today's config and stores
    /// the events that now pass in the hot tier, once each by their source
    /// coordinates; the still-invalid stay in the DLQ, counted by reason.
    Replay {
        /// Replay only messages refused for this reason (repeatable; default: all).
        #[arg(long = "reason", value_name = "REASON")]
        reasons: Vec<String>,
        /// Replay messages refused at or after this time (YYYY-MM-DD or RFC 3339, UTC).
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        from: Option<i64>,
        /// Replay messages refused before this time (YYYY-MM-DD or RFC 3339, UTC).
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        to: Option<i64>,
        /// Report what would pass, per reason; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Messages handled together (one ledger round trip, one INSERT per day).
        #[arg(long, value_name = "N", default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..))]
        batch: u32,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// After a run that changed something (not `--dry-run`), write its
        /// figures in Prometheus' text format to this file, replaced whole
        /// (for node_exporter's textfile collector).
        #[arg(long, value_name = "FILE")]
        metrics_file: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// `MAJOR.MINOR` as numbers.
fn parse_version(text: &str) -> Result<(u32, u32), String> {
    let (major, minor) = text.split_once('.').ok_or_else(|| format!("{text:?} is not MAJOR.MINOR"))?;
    let number = |n: &str| n.parse::<u32>().map_err(|_| format!("{text:?} is not MAJOR.MINOR"));
    Ok((number(major)?, number(minor)?))
}

/// `YYYY-MM-DD` (its UTC midnight) or an RFC 3339 time, as epoch ms.
fn parse_time(text: &str) -> Result<i64, String> {
    inferlog_schema::timestamp::parse_day(text)
        .or_else(|| inferlog_schema::timestamp::parse_rfc3339_ms(text).ok())
        .ok_or_else(|| format!("{text:?} is neither YYYY-MM-DD nor an RFC 3339 time"))
}

/// `dlq inspect`: the summary on stdout; 1 when the oldest message outlived the hot policy.
async fn inspect(config: Config, window: Window, format: Format) -> Result<i32, IngestError> {
    let inspector = dlq_inspect::read(&config.kafka, Inspector::new(window)).await?;
    let summary = inspector.finish(&config.kafka.dlq_topic, config.retention.hot_days, inferlog_ingest::dlq::now_ms());
    let text = match format {
        Format::Text => dlq_inspect::render_text(&summary),
        Format::Json => serde_json::to_string_pretty(&summary).map_err(|e| IngestError::Config(format!("the summary as JSON: {e}")))? + "\n",
    };
    inferlog_store::cli::print_stdout(&text);
    if summary.exceeds_policy {
        tracing::warn!(oldest = ?summary.oldest, policy = %summary.policy, "the DLQ holds a message older than the hot policy");
        return Ok(i32::from(exit::PROBLEMS));
    }
    Ok(i32::from(exit::OK))
}

/// `dlq replay`: the summary on stdout; 1 when a selected event is still invalid or refused.
async fn replay(config: Config, options: dlq_replay::Options, format: Format, metrics_file: Option<PathBuf>) -> Result<i32, IngestError> {
    let summary = dlq_replay::run(config, options).await?;
    if let Some(path) = metrics_file.filter(|_| !summary.dry_run) {
        write_metrics(&path, &summary)?;
    }
    let text = match format {
        Format::Text => dlq_replay::render_text(&summary),
        Format::Json => serde_json::to_string_pretty(&summary).map_err(|e| IngestError::Config(format!("the summary as JSON: {e}")))? + "\n",
    };
    inferlog_store::cli::print_stdout(&text);
    tracing::info!(
        dry_run = summary.dry_run,
        selected = summary.selected,
        replayed = summary.replayed,
        already_stored = summary.already_stored,
        still_invalid = summary.still_invalid,
        refused = summary.refused,
        late_rows = summary.late_rows,
        "dlq replay done"
    );
    Ok(i32::from(if summary.still_invalid + summary.refused > 0 { exit::PROBLEMS } else { exit::OK }))
}

/// The run's figures to `path`, through a file beside it renamed over it,
/// so a collector never reads half of them.
fn write_metrics(path: &Path, summary: &dlq_replay::Summary) -> Result<(), IngestError> {
    let failed = |e: &dyn std::fmt::Display| IngestError::Config(format!("--metrics-file {}: {e}", path.display()));
    let finished = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let text = inferlog_ingest::dlq_replay_metrics::render(summary, finished).map_err(|e| failed(&e))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| failed(&e))?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(|e| failed(&e))?;
    file.persist(path).map_err(|e| failed(&e))?;
    Ok(())
}

fn main() -> ExitCode {
    inferlog_ingest::memory::fix_mmap_threshold();
    inferlog_store::cli::init_logging();
    let cli = Cli::parse();
    if let Err(e) = inferlog_ingest::hooks::refuse_unless_built_in() {
        tracing::error!(error = %e, "refusing to start");
        return ExitCode::from(inferlog_schema::error::exit::PERMANENT);
    }
    if let Some(name) = &cli.print_ddl {
        let Some((database, table)) = name.split_once('.') else {
            tracing::error!(name, "--print-ddl takes DATABASE.TABLE");
            return ExitCode::from(inferlog_schema::error::exit::PERMANENT);
        };
        inferlog_store::cli::print_stdout(&format!("{}\n", inferlog_store::model::tables::HOT.ddl(database, table, cli.server_version)));
        return ExitCode::SUCCESS;
    }
    let Some(path) = &cli.config else {
        tracing::error!("--config (or INFERLOG_CONFIG) is required");
        return ExitCode::from(inferlog_schema::error::exit::PERMANENT);
    };
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "invalid configuration");
            return ExitCode::from(inferlog_schema::error::exit::PERMANENT);
        }
    };
    match cli.command {
        Some(Command::Dlq { action: DlqAction::Inspect { from, to, format } }) => {
            return inferlog_store::cli::run("dlq inspect", inspect(config, Window { from_ms: from, to_ms: to }, format));
        }
        Some(Command::Dlq { action: DlqAction::Replay { reasons, from, to, dry_run, batch, format, metrics_file } }) => {
            let options = dlq_replay::Options { reasons, window: Window { from_ms: from, to_ms: to }, dry_run, batch: batch as usize };
            return inferlog_store::cli::run("dlq replay", replay(config, options, format, metrics_file));
        }
        None => {}
    }
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

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    #[test]
    fn the_command_line_is_consistent_and_print_ddl_needs_no_config() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["inferlog-ingest", "--print-ddl", "b.t", "--server-version", "18.16"]).expect("no --config needed");
        assert_eq!((cli.print_ddl.as_deref(), cli.server_version), (Some("b.t"), (18, 16)));
        assert!(Cli::try_parse_from(["inferlog-ingest", "--server-version", "18.16"]).is_err(), "--server-version only with --print-ddl");
        assert!(Cli::try_parse_from(["inferlog-ingest", "--print-ddl", "b.t", "--server-version", "18"]).is_err());
    }
}
