//! `inferlog-compactor --config FILE [--once] [--day YYYY-MM-DD]`: the
//! compactor daemon, or one pass, or one day. Exit 0 on success, 1 when an
//! archive failed verification, 2 on usage, config or connection errors.
//!
//! `inferlog-compactor --config FILE reprice --from D --to D [--dry-run]`:
//! recomputes the cost of the aggregates of those days at the configured
//! prices (after a price correction), one audited transaction per day.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use inferlog_compactor::config::Config;
use inferlog_compactor::metrics::Metrics;
use inferlog_compactor::service::Compactor;

#[derive(Debug, Parser)]
#[command(name = "inferlog-compactor", version, about = "Archive closed days to Parquet, aggregate them into Postgres, release them from ClickHouse")]
struct Args {
    /// The inferlog config file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Run one pass over every closed day, then exit.
    #[arg(long)]
    once: bool,
    /// Run (or re-run) one closed day, then exit.
    #[arg(long, value_name = "YYYY-MM-DD")]
    day: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Recompute the cost of the stored aggregates of a range of days at the configured prices.
    Reprice {
        /// First day (UTC), inclusive.
        #[arg(long, value_name = "YYYY-MM-DD")]
        from: String,
        /// Last day (UTC), inclusive.
        #[arg(long, value_name = "YYYY-MM-DD")]
        to: String,
        /// Print what would change; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn parse_day(flag: &str, text: &str) -> Result<inferlog_store::Day, inferlog_compactor::CompactorError> {
    inferlog_store::parse_day(text).ok_or_else(|| inferlog_compactor::CompactorError::Config(format!("{flag} {text:?} is not a date YYYY-MM-DD")))
}

/// The reprice command: one line per day on stdout.
async fn reprice(config: &Config, from: &str, to: &str, dry_run: bool) -> Result<i32, inferlog_compactor::CompactorError> {
    let (from, to) = (parse_day("--from", from)?, parse_day("--to", to)?);
    if from > to {
        return Err(inferlog_compactor::CompactorError::Config("--from must not be after --to".into()));
    }
    let prices = config.cost.validate()?;
    let catalog = inferlog_store::catalog::Catalog::connect(&config.postgres).await?;
    let days = inferlog_compactor::reprice::reprice(&catalog, &prices, from, to, dry_run).await?;
    let mut out = String::new();
    for day in &days {
        out.push_str(&format!("{}{day}\n", if dry_run { "would reprice " } else { "" }));
    }
    out.push_str(&format!("{} days, prices {}\n", days.len(), prices.digest()));
    inferlog_store::cli::print_stdout(&out);
    Ok(0)
}

async fn run(args: Args) -> Result<i32, inferlog_compactor::CompactorError> {
    for hook in [inferlog_compactor::day::PAUSE_ENV, inferlog_store::test_hooks::NOW_ENV] {
        inferlog_store::test_hooks::refuse_unless_built_in(hook).map_err(inferlog_compactor::CompactorError::Config)?;
    }
    let config = Config::load(&args.config)?;
    if let Some(Command::Reprice { from, to, dry_run }) = &args.command {
        return reprice(&config, from, to, *dry_run).await;
    }
    let day = match &args.day {
        Some(text) => Some(
            inferlog_store::parse_day(text)
                .ok_or_else(|| inferlog_compactor::CompactorError::Config(format!("--day {text:?} is not a date YYYY-MM-DD")))?,
        ),
        None => None,
    };
    let metrics = Metrics::new();
    let compactor = Compactor::connect(config.clone(), metrics.clone()).await?;
    let shutdown = inferlog_store::cli::shutdown_signal("stopping between days")
        .map_err(|e| inferlog_compactor::CompactorError::Config(format!("cannot install the SIGTERM / SIGINT handlers: {e}")))?;
    if let Some(day) = day {
        if !compactor.is_closed(day, inferlog_store::test_hooks::now_ms()) {
            return Err(inferlog_compactor::CompactorError::Config(format!(
                "--day {}: the day is not closed yet (it must have ended more than compactor.lateness = {} ago)",
                inferlog_store::day_string(day),
                humantime_serde::re::humantime::format_duration(config.compactor.lateness)
            )));
        }
        let report = compactor.pass(inferlog_store::test_hooks::now_ms(), Some(vec![day]), true, &shutdown).await;
        return Ok(report.exit_code());
    }
    if args.once {
        let report = compactor.pass(inferlog_store::test_hooks::now_ms(), None, false, &shutdown).await;
        return Ok(report.exit_code());
    }
    if !config.compactor.metrics_addr.is_empty() {
        let server = inferlog_store::http::serve(
            config.compactor.metrics_addr.clone(),
            metrics.registry.clone(),
            metrics.healthy.clone(),
            "the last pass left days failed",
            shutdown.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(%e, "metrics server stopped");
            }
        });
    }
    let mut shutdown_wait = shutdown.clone();
    loop {
        let report = compactor.pass(inferlog_store::test_hooks::now_ms(), None, false, &shutdown).await;
        if report.interrupted || *shutdown.borrow() {
            return Ok(0);
        }
        tokio::select! {
            _ = tokio::time::sleep(config.compactor.interval) => {}
            _ = shutdown_wait.changed() => return Ok(0),
        }
    }
}

fn main() -> ExitCode {
    inferlog_store::cli::init_logging();
    let args = Args::parse();
    inferlog_store::cli::run("inferlog-compactor", run(args))
}
