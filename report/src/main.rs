//! `inferlog-report --config FILE [--format text|json] VIEW`: one view of
//! the stored data on stdout. Views: `budget [--as-of YYYY-MM-DD]`. Exit 0,
//! 1 when a threshold is crossed (a business line at 90% of its monthly
//! budget), 2 on usage, config or store errors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use inferlog_report::budget::BudgetReport;
use inferlog_report::{Config, ReportError};
use inferlog_store::catalog::Catalog;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Parser)]
#[command(name = "inferlog-report", version, about = "Answer the questions SREs and cost owners bring, from the stored aggregates")]
struct Args {
    /// The inferlog config file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    #[command(subcommand)]
    view: View,
}

#[derive(Debug, Subcommand)]
enum View {
    /// Each business line's spend, budget, used share and month-end forecast; exit 1 when any has used 90% or more.
    Budget {
        /// Report as of this day (the days before it are closed). Default: today (UTC).
        #[arg(long, value_name = "YYYY-MM-DD")]
        as_of: Option<String>,
    },
}

async fn run(args: Args) -> Result<i32, ReportError> {
    let config = Config::load(&args.config)?;
    match args.view {
        View::Budget { as_of } => {
            let as_of = match as_of {
                Some(text) => {
                    inferlog_store::parse_day(&text).ok_or_else(|| ReportError::Usage(format!("--as-of {text:?} is not a date YYYY-MM-DD")))?
                }
                None => {
                    inferlog_store::day_of_ms(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64))
                }
            };
            let catalog = Catalog::connect(&config.postgres).await?;
            let status = inferlog_store::budget::status(&catalog, &config.budgets, as_of).await?;
            let report = BudgetReport::new(inferlog_store::day_string(as_of), status);
            inferlog_store::cli::print_stdout(&match args.format {
                Format::Text => report.text(),
                Format::Json => report.json(),
            });
            Ok(report.exit_code())
        }
    }
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
