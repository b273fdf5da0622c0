//! `inferlog-retention --config FILE enforce [--dry-run] [--now T] [--daemon]`
//! `inferlog-retention --config FILE audit [--format text|json] [--now T] [--user-ids FILE [--hashed]]`
//! and `inferlog-retention --config FILE erase --user-ids FILE [--hashed] [--request-id ID] [--receipt FILE]`.
//! Exit 0 clean, 1 when the work found problems (violations, refused
//! deletions, a tier still holding an erased user), 2 on usage or config
//! errors (a hash key missing or not the tiers'), 75 when a tier cannot be
//! reached or the work is unfinished (run it again).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use inferlog_retention::audit::{audit, render_text};
use inferlog_retention::config::Config;
use inferlog_retention::enforce::{enforce, Action, Outcome};
use inferlog_retention::erase::{erase, find, render_holdings, Request};
use inferlog_retention::inventory::{Inventory, Stores};
use inferlog_retention::metrics::{self, Metrics};
use inferlog_retention::RetentionError;
use inferlog_store::Day;

#[derive(Debug, Parser)]
#[command(name = "inferlog-retention", version, about = "Delete what each tier's policy says has expired, and prove it")]
struct Args {
    /// The inferlog config file (TOML).
    #[arg(long)]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Delete every unit past its tier's policy; every deletion goes to the audit table.
    Enforce {
        /// Delete nothing; report (and audit, marked dry-run) what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Evaluate policies as of this instant (RFC 3339) instead of now.
        #[arg(long)]
        now: Option<String>,
        /// Keep running, enforcing every `retention.interval`, until SIGTERM.
        #[arg(long)]
        daemon: bool,
    },
    /// Report per tier the policy, the oldest data held and every violation.
    Audit {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Evaluate policies as of this instant (RFC 3339) instead of now.
        #[arg(long)]
        now: Option<String>,
        /// Instead of the policies: prove that no tier holds these users
        /// (one id per line; plaintext, hashed with the configured key, unless --hashed).
        #[arg(long)]
        user_ids: Option<PathBuf>,
        /// The --user-ids file holds stored hashes (`<key id>:<hex>`), not plaintext ids.
        #[arg(long, requires = "user_ids")]
        hashed: bool,
    },
    /// Remove every row of some users from every tier, and write a receipt (JSON, also on stdout).
    Erase {
        /// One user id per line (plaintext, hashed with the configured key, unless --hashed).
        #[arg(long)]
        user_ids: PathBuf,
        /// The file holds stored hashes (`<key id>:<hex>`), not plaintext ids.
        #[arg(long)]
        hashed: bool,
        /// The request's id in the receipt, the audit rows and the rewritten objects' keys
        /// (default: derived from the users, so the same request run again is the same request).
        #[arg(long)]
        request_id: Option<String>,
        /// Also write the receipt to this file.
        #[arg(long)]
        receipt: Option<PathBuf>,
    },
}

/// The request named by `--user-ids` (and `--hashed`).
fn request(config: &Config, user_ids: &std::path::Path, hashed: bool, id: Option<String>) -> Result<Request, RetentionError> {
    let text = std::fs::read_to_string(user_ids).map_err(|e| RetentionError::Config(format!("--user-ids {}: {e}", user_ids.display())))?;
    if hashed {
        return Request::parse(&text, None, id);
    }
    let hasher = inferlog_schema::hash::UserIdHasher::from_env(config.schema.hash_key_id.as_deref())
        .map_err(|e| RetentionError::Config(format!("plaintext --user-ids need the hash key the tiers were written with: {e}")))?;
    Request::parse(&text, Some(&hasher), id)
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, RetentionError> {
    serde_json::to_string_pretty(value).map_err(|e| RetentionError::Config(e.to_string()))
}

fn out(text: &str) {
    inferlog_store::cli::print_stdout(&format!("{text}\n"));
}

fn today(now: Option<&str>) -> Result<Day, RetentionError> {
    let ms = match now {
        Some(t) => inferlog_schema::timestamp::parse_rfc3339_ms(t).map_err(|e| RetentionError::Config(format!("--now {t:?}: {e:?}")))?,
        None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64),
    };
    Ok(inferlog_store::day_of_ms(ms))
}

async fn enforce_once(stores: &Stores, config: &Config, today: Day, dry_run: bool) -> Result<(i32, Vec<Action>), RetentionError> {
    let inventory = Inventory::take(stores, config).await?;
    let actions = enforce(stores, &inventory, &config.retention, &config.kafka, today, dry_run).await?;
    let mut refused = 0;
    for a in &actions {
        out(&a.render());
        if matches!(a.outcome, Outcome::Refused(_)) {
            refused += 1;
        }
    }
    let done =
        actions.iter().filter(|a| matches!(a.outcome, Outcome::Deleted | Outcome::WouldDelete | Outcome::Set(_) | Outcome::WouldSet(_))).count();
    tracing::info!(deletions = done, refused, dry_run, "enforce finished");
    Ok((if refused > 0 { 1 } else { 0 }, actions))
}

/// One daemon pass: enforce, then audit what is left, both into the metrics.
async fn daemon_pass(stores: &Stores, config: &Config, metrics: &Metrics, now: Option<&str>, dry_run: bool) -> Result<(), RetentionError> {
    let today = today(now)?;
    let (_, actions) = enforce_once(stores, config, today, dry_run).await?;
    metrics::enforced(metrics, &actions);
    let inventory = Inventory::take(stores, config).await?;
    let report = audit(&inventory, &config.retention, today);
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    metrics::audited(metrics, &report, unix);
    Ok(())
}

/// `enforce --daemon`: a pass every `retention.interval`, `/metrics` and
/// `/healthz` meanwhile, exit 0 on SIGTERM / SIGINT between passes.
async fn daemon(stores: &Stores, config: &Config, now: Option<&str>, dry_run: bool) -> Result<i32, RetentionError> {
    let mut shutdown = inferlog_store::cli::shutdown_signal("stopping between passes")
        .map_err(|e| RetentionError::Config(format!("cannot install the SIGTERM / SIGINT handlers: {e}")))?;
    let metrics = Metrics::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let server = (!config.retention.metrics_addr.is_empty()).then(|| {
        tokio::spawn(inferlog_store::http::serve(
            config.retention.metrics_addr.clone(),
            metrics.registry.clone(),
            metrics.healthy.clone(),
            "the last retention pass failed or its audit found violations",
            stopped,
        ))
    });
    loop {
        if let Err(e) = daemon_pass(stores, config, &metrics, now, dry_run).await {
            metrics::pass_failed(&metrics, &e);
        }
        tokio::select! {
            _ = tokio::time::sleep(config.retention.interval) => {}
            _ = shutdown.changed() => break,
        }
    }
    let _ = stop.send(true);
    if let Some(server) = server {
        match server.await {
            Ok(Err(e)) => tracing::error!(%e, "metrics server stopped"),
            Err(e) => tracing::error!(%e, "metrics server task"),
            Ok(Ok(())) => {}
        }
    }
    tracing::info!("stopped on signal");
    Ok(0)
}

async fn run(args: Args) -> Result<i32, RetentionError> {
    inferlog_store::test_hooks::refuse_unless_built_in(inferlog_retention::enforce::PAUSE_ENV).map_err(RetentionError::Config)?;
    let config = Config::load(&args.config)?;
    let stores = Stores::connect(&config).await?;
    match args.command {
        Command::Audit { format, user_ids: Some(user_ids), hashed, .. } => {
            let request = request(&config, &user_ids, hashed, None)?;
            let holdings = find(&stores, &config, &request).await?;
            match format {
                Format::Text => out(render_holdings(&request, &holdings).trim_end()),
                Format::Json => out(&json(&holdings)?),
            }
            Ok(if holdings.held() { 1 } else { 0 })
        }
        Command::Erase { user_ids, hashed, request_id, receipt } => {
            let request = request(&config, &user_ids, hashed, request_id)?;
            let done = erase(&stores, &config, &request).await?;
            let text = json(&done)?;
            if let Some(path) = receipt {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, format!("{text}\n"))
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|e| RetentionError::Config(format!("--receipt {}: {e}", path.display())))?;
            }
            out(&text);
            tracing::info!(request = %done.request_id, outcome = done.outcome, hot = done.hot.rows_removed, cold = done.cold.rows_removed, "erase finished");
            Ok(0)
        }
        Command::Audit { format, now, .. } => {
            let today = today(now.as_deref())?;
            let inventory = Inventory::take(&stores, &config).await?;
            let report = audit(&inventory, &config.retention, today);
            match format {
                Format::Text => out(render_text(&report).trim_end()),
                Format::Json => out(&serde_json::to_string_pretty(&report).map_err(|e| RetentionError::Config(e.to_string()))?),
            }
            Ok(if report.violations.is_empty() { 0 } else { 1 })
        }
        Command::Enforce { dry_run, now, daemon: false } => Ok(enforce_once(&stores, &config, today(now.as_deref())?, dry_run).await?.0),
        Command::Enforce { dry_run, now, daemon: true } => daemon(&stores, &config, now.as_deref(), dry_run).await,
    }
}

fn main() -> ExitCode {
    inferlog_store::cli::init_logging();
    let args = Args::parse();
    inferlog_store::cli::run("inferlog-retention", run(args))
}
