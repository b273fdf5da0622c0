//! `inferlog-report --config FILE [--from D] [--to D] [--business-line B]
//! [--model M] [--format text|json|csv] [--html FILE] [--fail-if EXPR]… VIEW`:
//! one view of the stored data on stdout, each day read from the tier that
//! holds it. Views: overview, latency, cost, cache, errors, `capacity
//! [--forecast]`, diagnose, page, `compare --a V --b V` and `budget
//! [--as-of D]`. Exit 0; 1 when a threshold is crossed (`--fail-if`, a
//! business line at 90% of its monthly budget); 2 on usage, config or
//! store errors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use inferlog_report::budget::BudgetReport;
use inferlog_report::facts::Tier;
use inferlog_report::range::Range;
use inferlog_report::source::{Filter, Reads, Stores};
use inferlog_report::threshold::FailIf;
use inferlog_report::views::{self, Context, View};
use inferlog_report::{render, Config, ReportError};
use inferlog_store::catalog::Catalog;
use inferlog_store::cold::ColdStore;
use inferlog_store::hot::HotTier;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Csv,
}

#[derive(Debug, Parser)]
#[command(name = "inferlog-report", version, about = "Answer the questions SREs and cost owners bring, each day from the tier that holds it")]
struct Args {
    /// The inferlog config file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// First UTC day of the range (included). Default: 6 days before --to.
    #[arg(long, global = true, value_name = "YYYY-MM-DD")]
    from: Option<String>,
    /// Last UTC day of the range (included). Default: today.
    #[arg(long, global = true, value_name = "YYYY-MM-DD")]
    to: Option<String>,
    /// Only this business line.
    #[arg(long, global = true)]
    business_line: Option<String>,
    /// Only this model (model_name).
    #[arg(long, global = true)]
    model: Option<String>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    format: Format,
    /// Also write the HTML page (overview, diagnosis, performance, version comparison, capacity, cost, cache, errors) to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Exit 1 when the range's metric crosses this, e.g. 'p99_ttft_ms>2000', 'success_rate<0.99'. Repeatable.
    #[arg(long, value_name = "METRIC>VALUE")]
    fail_if: Vec<String>,
    /// Hashed users listed by the cost view.
    #[arg(long, default_value_t = 10)]
    top_users: usize,
    #[command(subcommand)]
    view: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    View(View),
    /// Version B of a model against version A: requests, output lengths, error shares and TTFT/TPOT/total percentiles per input × output bucket, marked where B differs beyond what the counts explain; and the requests both served.
    Compare {
        /// Version A (the baseline).
        #[arg(long, value_name = "VERSION")]
        a: String,
        /// Version B (the candidate).
        #[arg(long, value_name = "VERSION")]
        b: String,
    },
    /// Each business line's spend, budget, used share and month-end forecast; exit 1 when any has used 90% or more.
    Budget {
        /// Report as of this day (the days before it are closed). Default: today (UTC).
        #[arg(long, value_name = "YYYY-MM-DD")]
        as_of: Option<String>,
    },
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

async fn budget(config: &Config, as_of: Option<String>, format: Format) -> Result<i32, ReportError> {
    let as_of = match as_of {
        Some(text) => inferlog_store::parse_day(&text).ok_or_else(|| ReportError::Usage(format!("--as-of {text:?} is not a date YYYY-MM-DD")))?,
        None => inferlog_store::day_of_ms(now_ms()),
    };
    let catalog = Catalog::connect(&config.postgres).await?;
    let status = inferlog_store::budget::status(&catalog, &config.budgets, as_of).await?;
    let report = BudgetReport::new(inferlog_store::day_string(as_of), status);
    inferlog_store::cli::print_stdout(&match format {
        Format::Text => report.text(),
        Format::Json | Format::Csv => report.json(),
    });
    Ok(report.exit_code())
}

async fn run(args: Args) -> Result<i32, ReportError> {
    inferlog_store::test_hooks::refuse_unless_built_in(inferlog_report::source::HOLD_ENV).map_err(ReportError::Config)?;
    let config = Config::load(&args.config)?;
    let (view, versions) = match args.view {
        Command::Budget { as_of } => return budget(&config, as_of, args.format).await,
        Command::View(view) => (view, None),
        Command::Compare { a, b } => (View::Compare, Some(views::compare::Versions { model: args.model.clone(), a, b })),
    };
    let now = now_ms();
    let today = inferlog_store::day_of_ms(now);
    let mut range = Range::parse(args.from.as_deref(), args.to.as_deref(), today)?;
    if matches!(view, View::Capacity { forecast: true, .. }) && args.from.is_none() {
        // A forecast fits the growth of a month.
        range.from = range.to - (views::forecast::FIT_DAYS - 1);
    }
    let view = match view {
        // The hour asked for and the four weeks before it.
        View::Spikes { hour } => {
            let hour = hour.unwrap_or_else(|| views::spikes::default_hour(today, now));
            range = Range { from: hour.div_euclid(24) as i32 - views::spikes::LOOKBACK_DAYS, to: hour.div_euclid(24) as i32 };
            View::Spikes { hour: Some(hour) }
        }
        other => other,
    };
    let thresholds = args.fail_if.iter().map(|t| FailIf::parse(t)).collect::<Result<Vec<_>, _>>()?;
    let filter = Filter { business_line: args.business_line, model: args.model };
    let dictionary = config.schema.validate().map_err(|e| ReportError::Config(e.to_string()))?;
    let stores = Stores {
        hot: HotTier::new(&config.clickhouse)?,
        catalog: Catalog::connect(&config.postgres).await?,
        // Without a usable `[cold]`, the days only the archive holds are missing.
        cold: ColdStore::new(&config.cold).inspect_err(|e| tracing::warn!(error = %e, "the archive is not readable here")).ok(),
        prices: config.cost.validate()?,
        dictionary,
    };

    let compares = view.compares() || args.html.is_some();
    let html = args.html.is_some();
    let reads = Reads {
        hours: view.shows_hours() || html,
        waste: view.shows_waste() || html,
        callers: view.shows_callers() || html,
        types: view.shows_types() || html,
        gpus: view.shows_gpus() || html,
    };
    let mut facts = inferlog_report::source::load(&stores, if compares { range.with_previous() } else { range }, &filter, reads).await?;
    // The versions compared, and the requests both served on the hot days (the page compares too).
    let versions = versions.or_else(|| (view == View::Page || args.html.is_some()).then(|| views::compare::pick(&facts, range)).flatten());
    if let Some(v) = &versions {
        let hot_days: Vec<_> = range.iter().filter(|d| facts.tier(*d) == Tier::Hot).collect();
        if !hot_days.is_empty() {
            let narrowed = Filter { business_line: filter.business_line.clone(), model: v.model.clone() };
            facts.pairs = Some(inferlog_report::source::hot::pairs(&stores.hot, &hot_days, &narrowed, &v.a, &v.b).await?);
        }
    }
    let wants_budgets = matches!(view, View::Cost | View::Page) || args.html.is_some();
    let budgets = if wants_budgets {
        let as_of = (range.to + 1).min(today);
        let mut all = inferlog_store::budget::status(&stores.catalog, &config.budgets, as_of).await?;
        all.retain(|b| filter.business_line.as_ref().is_none_or(|l| *l == b.business_line));
        all
    } else {
        Vec::new()
    };
    let ctx = Context { range, filter, now_ms: now, budgets, top_users: args.top_users, versions };

    let mut doc = views::build(view, &facts, &ctx);
    let codes: Vec<(i32, String)> = stores.dictionary.entries().iter().filter(|(c, _)| *c != 0).cloned().collect();
    let mut metrics = views::overview::metrics(&facts, range, now, &codes);
    if let View::Spikes { hour: Some(hour) } = view {
        metrics.extend(views::spikes::metrics(&facts, hour));
    }
    for t in &thresholds {
        if let Some(alert) = t.check(&metrics)? {
            doc.alerts.push(alert);
        }
    }
    let mut alerts = doc.alerts.len();
    if let Some(path) = &args.html {
        let mut page = if view == View::Page { doc.clone() } else { views::build(View::Page, &facts, &ctx) };
        page.alerts.extend(doc.alerts.iter().filter(|a| !page.alerts.contains(a)).cloned().collect::<Vec<_>>());
        alerts = alerts.max(page.alerts.len());
        let generated = inferlog_schema::timestamp::format_rfc3339_ms(now);
        std::fs::write(path, render::html::page(&page, &generated))
            .map_err(|e| ReportError::Usage(format!("--html {}: cannot write: {e}", path.display())))?;
        tracing::info!(path = %path.display(), "page written");
    }
    inferlog_store::cli::print_stdout(&match args.format {
        Format::Text => render::text(&doc),
        Format::Json => render::json(&doc),
        Format::Csv => render::csv(&doc),
    });
    Ok(i32::from(alerts > 0))
}

fn main() -> ExitCode {
    inferlog_store::cli::init_logging();
    let args = match Args::try_parse() {
        Ok(args) => args,
        // Usage errors exit 2 like every other error of the report (clap's --help and --version exit 0).
        Err(e) => e.exit(),
    };
    inferlog_store::cli::run("inferlog-report", run(args))
}
