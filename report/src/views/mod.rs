//! The views. In: [`Facts`] of the range (and of the range before it) and
//! the [`Context`] of the question. Out: a [`Document`] of tables, one file
//! per view:
//!
//! - [`overview`]: the range against the one before, largest changes first;
//! - [`latency`]: percentiles by business line × input × output bucket, and the stage that dominates;
//! - [`cost`]: tokens and cost by line, model and version, top users, budgets;
//! - [`cache`]: cache hits and cached-prefix lengths by model version;
//! - [`errors`]: error shares by code × stage × line × input bucket, and how they moved;
//! - [`capacity`]: load by hour of day and weekday, busiest minutes, daily token trend;
//!   with `--forecast`, [`forecast`]: the per-minute load, the knee and the days until it;
//! - [`compare`]: two versions of a model side by side, with significance marks, and their shadow pairs;
//! - [`waste`]: repeated prompts by line, the most repeated prompts with their callers, long outputs and answers cut at max_tokens;
//! - [`spikes`]: each line's and hashed caller's tokens in an hour against the same hour before, flagged when they grow without the requests;
//! - [`diagnose`]: the decision tree (success rate → TTFT → TPOT → tokens) walked against the previous range;
//! - [`page`]: what the HTML page shows (overview, diagnosis, performance, version comparison, cost, cache, errors, hourly series).

pub mod cache;
pub mod capacity;
pub mod compare;
pub mod cost;
pub mod diagnose;
pub mod errors;
pub mod forecast;
pub mod latency;
pub mod overview;
pub mod page;
pub mod spikes;
pub mod waste;

use inferlog_schema::{InputBucket, OutputBucket};
use inferlog_store::budget::BudgetStatus;

use crate::document::{DayTier, Document, Table};
use crate::facts::{Facts, GroupFacts, GroupKey, Summary};
use crate::range::Range;
use crate::source::Filter;

/// The question besides the facts.
#[derive(Debug, Clone)]
pub struct Context {
    pub range: Range,
    pub filter: Filter,
    /// Now, epoch ms (for the minutes a range still running has had).
    pub now_ms: i64,
    /// Each business line's budget as of the end of the range (the cost view shows them).
    pub budgets: Vec<BudgetStatus>,
    /// Hashed users listed by the cost view.
    pub top_users: usize,
    /// The versions `compare` compares (`None`: the page picks them, [`compare::pick`]).
    pub versions: Option<compare::Versions>,
}

/// The views a user can ask for (the command's subcommands; the doc
/// comments are their `--help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Subcommand)]
pub enum View {
    /// Requests, success rate, errors by code, TTFT/TPOT percentiles, tokens per minute and cost against the previous range.
    Overview,
    /// Latency percentiles by business line × input × output bucket and the stage that dominates.
    Latency,
    /// Tokens and cost by business line, model and version; top hashed users; budgets (exit 1 at 90%).
    Cost,
    /// Cache-hit ratio and cached-prefix length by model version.
    Cache,
    /// Errors by code × stage × business line × input bucket, and how each share moved.
    Errors,
    /// Requests and tokens per hour of day and weekday, busiest minutes, daily token trend; with --forecast, the knee and when the load reaches it.
    Capacity {
        /// Also the exact per-minute load, the knee (the load at which p99 TTFT reaches --knee-ttft-ms) and the days until the load reaches it. Default range: the 30 days through --to.
        #[arg(long)]
        forecast: bool,
        /// The p99 TTFT (ms) whose load is the knee.
        #[arg(long, value_name = "MS", default_value_t = forecast::DEFAULT_KNEE_TTFT_MS)]
        knee_ttft_ms: u32,
    },
    /// Two versions of a model side by side (`compare --a V --b V`; a subcommand of its own).
    #[command(skip)]
    Compare,
    /// Where the problem is: success rate, then TTFT, TPOT and tokens against the previous range, naming the dimension that explains the change.
    Diagnose,
    /// Tokens spent for nothing: repeated prompts by business line with what a prompt cache would save, the most repeated prompts and their hashed callers, long outputs and answers cut at max_tokens (hot and whole archive days).
    Waste {
        /// The repeated prompts listed.
        #[arg(long, value_name = "N", default_value_t = waste::DEFAULT_TOP)]
        top: usize,
    },
    /// Who is burning tokens now: each business line's tokens in the last complete hour against the same hour over the 4 weeks before, and each hashed caller's against the same hour on the hot days before; flagged when tokens grow 1.5x without the requests (--fail-if 'spiking_callers>0' for cron).
    Spikes {
        /// The hour to look at (UTC). Default: the last complete hour.
        #[arg(long, value_name = "YYYY-MM-DDTHH", value_parser = spikes::parse_hour)]
        hour: Option<i64>,
    },
    /// Everything the HTML page shows.
    Page,
}

impl View {
    /// Whether the view compares with the previous range (its facts are loaded too).
    pub fn compares(self) -> bool {
        matches!(self, View::Overview | View::Errors | View::Diagnose | View::Page)
    }

    /// Whether the view shows hourly facts (the busiest minutes, the hourly series).
    pub fn shows_hours(self) -> bool {
        matches!(self, View::Capacity { .. } | View::Spikes { .. } | View::Page)
    }

    /// Whether the view shows request types (the days read from rows count them).
    pub fn shows_types(self) -> bool {
        matches!(self, View::Compare | View::Page)
    }

    /// Whether the view shows each hashed caller's hours (hot days).
    pub fn shows_callers(self) -> bool {
        matches!(self, View::Spikes { .. } | View::Page)
    }

    /// Whether the view names GPUs (the days read from rows count them).
    pub fn shows_gpus(self) -> bool {
        matches!(self, View::Diagnose | View::Page)
    }

    /// Whether the view shows repeated prompts and output lengths (the days read from rows count them).
    pub fn shows_waste(self) -> bool {
        matches!(self, View::Waste { .. } | View::Page)
    }

    pub fn name(self) -> &'static str {
        match self {
            View::Overview => "overview",
            View::Latency => "latency",
            View::Cost => "cost",
            View::Cache => "cache",
            View::Errors => "errors",
            View::Capacity { .. } => "capacity",
            View::Compare => "compare",
            View::Diagnose => "diagnose",
            View::Waste { .. } => "waste",
            View::Spikes { .. } => "spikes",
            View::Page => "page",
        }
    }
}

/// Builds `view` from `facts` (which cover the previous range too when the view compares).
pub fn build(view: View, facts: &Facts, ctx: &Context) -> Document {
    let mut notes = facts.notes.clone();
    let mut alerts = Vec::new();
    let tables: Vec<Table> = match view {
        View::Overview => overview::tables(facts, ctx, &mut notes),
        View::Latency => latency::tables(facts, ctx),
        View::Cost => cost::tables(facts, ctx, &mut notes, &mut alerts),
        View::Cache => cache::tables(facts, ctx),
        View::Errors => errors::tables(facts, ctx),
        View::Capacity { forecast, knee_ttft_ms } => {
            let mut tables = capacity::tables(facts, ctx);
            if forecast {
                tables.extend(forecast::tables(facts, ctx, knee_ttft_ms, &mut notes));
            }
            tables
        }
        View::Compare => compare::tables(facts, ctx, &mut notes),
        View::Diagnose => diagnose::tables(facts, ctx, &mut notes),
        View::Waste { top } => waste::tables(facts, ctx, top, &mut notes),
        View::Spikes { hour } => spikes::tables(facts, ctx, hour.unwrap_or_else(|| spikes::default_hour(ctx.range.to, ctx.now_ms)), &mut notes),
        View::Page => page::tables(facts, ctx, &mut notes, &mut alerts),
    };
    let shown = if view.compares() { ctx.range.with_previous() } else { ctx.range };
    let missing: Vec<String> = shown.iter().filter(|d| facts.tier(*d) == crate::facts::Tier::None).map(inferlog_store::day_string).collect();
    if !missing.is_empty() {
        notes.push(format!("no tier holds {} (no traffic, deleted by retention, or not aggregated yet)", missing.join(", ")));
    }
    Document {
        view: view.name(),
        range: ctx.range.text(),
        previous: view.compares().then(|| ctx.range.previous().text()),
        filter: ctx.filter.clone(),
        tiers: shown.iter().map(|d| DayTier { day: inferlog_store::day_string(d), tier: facts.tier(d) }).collect(),
        tables,
        notes,
        alerts,
    }
}

/// The groups of `range` that `keep` accepts.
pub fn groups<'a>(
    facts: &'a Facts,
    range: Range,
    keep: impl Fn(&GroupKey) -> bool + 'a,
) -> impl Iterator<Item = (&'a GroupKey, &'a GroupFacts)> + 'a {
    facts.groups.iter().filter(move |(k, _)| range.contains(k.day) && keep(k))
}

/// The summary of every group of `range`.
pub fn summary(facts: &Facts, range: Range) -> Summary {
    Summary::of(groups(facts, range, |_| true).map(|(_, g)| g))
}

/// The natural order of a length bucket (`0-1k` before `1k-2k` … `32k+`; `*` last).
pub fn bucket_rank(bucket: &str) -> usize {
    InputBucket::ALL
        .iter()
        .position(|b| b.as_str() == bucket)
        .or_else(|| OutputBucket::ALL.iter().position(|b| b.as_str() == bucket))
        .unwrap_or(usize::MAX)
}

/// The floor-rank `q`-quantile of `sorted` (0-based position ⌊q·n⌋, the
/// percentiles' rank everywhere); `None` when empty.
pub fn floor_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    (!sorted.is_empty()).then(|| sorted[((q * sorted.len() as f64) as usize).min(sorted.len() - 1)])
}

/// The UTC `YYYY-MM-DD HH:MM` of minutes since the epoch.
pub fn minute_string(minute: i64) -> String {
    // The schema's RFC 3339 form, `YYYY-MM-DDTHH:MM:SS.mmmZ`, cut to the minute.
    inferlog_schema::timestamp::format_rfc3339_ms(minute * 60_000)[..16].replacen('T', " ", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_sort_in_their_natural_order() {
        let mut buckets = vec!["32k+", "1k-2k", "0-1k", "8k-32k", "*", "2k-4k", "4k-8k"];
        buckets.sort_by_key(|b| bucket_rank(b));
        assert_eq!(buckets, ["0-1k", "1k-2k", "2k-4k", "4k-8k", "8k-32k", "32k+", "*"]);
        let mut out = vec!["8k+", "512-2k", "0-128", "2k-8k", "128-512"];
        out.sort_by_key(|b| bucket_rank(b));
        assert_eq!(out, ["0-128", "128-512", "512-2k", "2k-8k", "8k+"]);
        assert_eq!(minute_string(20_000 * 1440 + 13 * 60 + 7), "2024-10-04 13:07");
    }
}
