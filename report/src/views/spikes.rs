//! The `spikes` view: who is burning tokens right now. In: the hourly
//! facts of the hour asked for and of the same hour in the four weeks
//! before (any tier), and the hot days' per-caller hours. Out:
//!
//! - `spikes`: per business line, the hour's tokens and requests against
//!   their baseline, the mean of the same hour 1, 2, 3 and 4 weeks before
//!   (the weeks a tier answers with traffic in that hour; a line without
//!   traffic in such a week counts as 0). A line is flagged when its
//!   tokens reach [`TOKEN_RISE`] × the baseline *and* [`TOKEN_RISE`] × its
//!   requests' growth: tokens growing half again faster than the business
//!   (the seed's "growth of 50% without business growth", which holds on a
//!   day busier or quieter than the weeks before).
//! - `spike_callers`: per business line × hashed caller, the hour's tokens
//!   against the mean of the same hour on the hot days before (the hot tier
//!   alone keeps callers; a day the caller sent nothing counts as 0),
//!   flagged when they reach [`TOKEN_RISE`] × it and [`TOKEN_RISE`] × the
//!   line's requests' growth, the excess is at least [`CALLER_FLOOR`] of
//!   its line's tokens that hour, and it sent [`MIN_CALLER_REQUESTS`] or
//!   more (one long request, or a quiet caller's noise, is not a spike).
//!
//! The same rule for lines runs from the live service metrics as the
//! Prometheus alert `InferenceTokenSpikeVsBaseline`
//! (deploy/prometheus/service.rules.yml).

use std::collections::BTreeMap;

use crate::document::{Cell, Kind, Table};
use crate::facts::{Facts, Tier};
use crate::views::overview::Metric;
use crate::views::{minute_string, Context};

/// Tokens at this many times their baseline are a spike.
pub const TOKEN_RISE: f64 = 1.5;
/// A caller sending fewer requests in the hour is never flagged.
pub const MIN_CALLER_REQUESTS: f64 = 5.0;
/// A caller's excess over its baseline must be at least this share of its line's tokens in the hour.
pub const CALLER_FLOOR: f64 = 0.05;
/// Weeks of the same hour the lines' baseline averages.
pub const BASELINE_WEEKS: i64 = 4;
/// Days before the hour's day the range reads: four weeks.
pub const LOOKBACK_DAYS: i32 = 28;
/// Hot days before the hour's day the callers' baseline averages, at most.
pub const CALLER_DAYS: usize = 28;

/// The hour `spikes` looks at by default: the last complete hour, or the
/// last hour of a range that ended before it. Hours since the epoch.
pub fn default_hour(last_day: i32, now_ms: i64) -> i64 {
    (now_ms.div_euclid(3_600_000) - 1).min((i64::from(last_day) + 1) * 24 - 1)
}

/// `YYYY-MM-DDTHH` (minutes allowed and ignored): hours since the epoch.
pub fn parse_hour(text: &str) -> Result<i64, String> {
    let bad = || format!("{text:?} is not an hour YYYY-MM-DDTHH (UTC)");
    let (day, rest) = text.split_once(['T', ' ']).ok_or_else(bad)?;
    let day = inferlog_store::parse_day(day).ok_or_else(bad)?;
    let hour: i64 = rest.get(..2).and_then(|h| h.parse().ok()).filter(|h| (0..24).contains(h)).ok_or_else(bad)?;
    Ok(i64::from(day) * 24 + hour)
}

/// Requests and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Load {
    requests: f64,
    tokens: f64,
}

/// One line's hour against its baseline.
#[derive(Debug, Clone, PartialEq)]
struct LineSpike {
    line: String,
    now: Load,
    /// `None`: no week of the baseline is answered.
    baseline: Option<Load>,
    weeks: usize,
}

impl LineSpike {
    fn token_ratio(&self) -> Option<f64> {
        self.baseline.filter(|b| b.tokens > 0.0).map(|b| self.now.tokens / b.tokens)
    }

    fn request_ratio(&self) -> Option<f64> {
        self.baseline.filter(|b| b.requests > 0.0).map(|b| self.now.requests / b.requests)
    }

    /// Whether tokens that grew `token_ratio` times grew [`TOKEN_RISE`] ×
    /// faster than the line's requests (true without a baseline of requests:
    /// nothing to hold against them).
    fn outgrows_requests(&self, token_ratio: f64) -> bool {
        self.request_ratio().is_none_or(|r| token_ratio >= TOKEN_RISE * r)
    }

    /// A line without a baseline of tokens (new, or no week answered) is never flagged.
    fn flagged(&self) -> bool {
        self.token_ratio().is_some_and(|r| r >= TOKEN_RISE && self.outgrows_requests(r))
    }
}

/// One caller's hour against its baseline.
#[derive(Debug, Clone, PartialEq)]
struct CallerSpike {
    line: String,
    caller: String,
    now: Load,
    baseline: Load,
    days: usize,
    flagged: bool,
}

fn line_loads(facts: &Facts, hour: i64) -> BTreeMap<String, Load> {
    let mut out: BTreeMap<String, Load> = BTreeMap::new();
    for (k, h) in facts.hours.iter().filter(|(k, _)| k.hour == hour) {
        let l = out.entry(k.business_line.clone()).or_default();
        l.requests += h.counts.totals.requests as f64;
        l.tokens += h.counts.tokens() as f64;
    }
    out
}

fn lines(facts: &Facts, hour: i64) -> Vec<LineSpike> {
    let now = line_loads(facts, hour);
    // A week whose hour no tier answers, or that had no traffic at all (before the first event), is no baseline.
    let weeks: Vec<BTreeMap<String, Load>> = (1..=BASELINE_WEEKS)
        .map(|w| hour - w * 7 * 24)
        .filter(|h| facts.tier(h.div_euclid(24) as i32) != Tier::None)
        .map(|h| line_loads(facts, h))
        .filter(|w| !w.is_empty())
        .collect();
    let mut names: Vec<&String> = now.keys().chain(weeks.iter().flat_map(|w| w.keys())).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|line| {
            let baseline = (!weeks.is_empty()).then(|| {
                let n = weeks.len() as f64;
                let sum = |f: fn(&Load) -> f64| weeks.iter().map(|w| w.get(line).map_or(0.0, f)).sum::<f64>() / n;
                Load { requests: sum(|l| l.requests), tokens: sum(|l| l.tokens) }
            });
            LineSpike { line: line.clone(), now: now.get(line).copied().unwrap_or_default(), baseline, weeks: weeks.len() }
        })
        .collect()
}

fn callers(facts: &Facts, hour: i64, lines: &[LineSpike]) -> Vec<CallerSpike> {
    let day = hour.div_euclid(24) as i32;
    let at = hour.rem_euclid(24) as usize;
    let mut before: Vec<i32> = facts.tiers.iter().filter(|(d, t)| *d < day && *t == Tier::Hot).map(|(d, _)| *d).collect();
    before.sort_unstable();
    let before = &before[before.len().saturating_sub(CALLER_DAYS)..];
    let mut out = Vec::new();
    for ((d, line, caller), load) in &facts.callers {
        let (requests, tokens) = load[at];
        if *d != day || tokens == 0 {
            continue;
        }
        let n = before.len().max(1) as f64;
        let (mut b_requests, mut b_tokens) = (0.0, 0.0);
        for past in before {
            if let Some(l) = facts.callers.get(&(*past, line.clone(), caller.clone())) {
                b_requests += l[at].0 as f64 / n;
                b_tokens += l[at].1 as f64 / n;
            }
        }
        let of_line = lines.iter().find(|l| l.line == *line);
        let line_tokens = of_line.map_or(0.0, |l| l.now.tokens);
        let tokens = tokens as f64;
        let ratio = if b_tokens > 0.0 { tokens / b_tokens } else { f64::INFINITY };
        let flagged = !before.is_empty()
            && requests as f64 >= MIN_CALLER_REQUESTS
            && ratio >= TOKEN_RISE
            && tokens - b_tokens >= CALLER_FLOOR * line_tokens
            && of_line.is_none_or(|l| l.outgrows_requests(ratio));
        out.push(CallerSpike {
            line: line.clone(),
            caller: caller.clone(),
            now: Load { requests: requests as f64, tokens },
            baseline: Load { requests: b_requests, tokens: b_tokens },
            days: before.len(),
            flagged,
        });
    }
    out.sort_by(|a, b| {
        b.flagged
            .cmp(&a.flagged)
            .then((b.now.tokens - b.baseline.tokens).total_cmp(&(a.now.tokens - a.baseline.tokens)))
            .then(a.caller.cmp(&b.caller))
    });
    out
}

fn ratio(now: f64, base: f64) -> Cell {
    Cell::num((base > 0.0).then(|| now / base), Kind::Rate)
}

fn flag(flagged: bool) -> Cell {
    Cell::text(if flagged { "spike" } else { "" })
}

pub fn tables(facts: &Facts, ctx: &Context, hour: i64, notes: &mut Vec<String>) -> Vec<Table> {
    let lines = lines(facts, hour);
    let callers = callers(facts, hour, &lines);
    let shown = minute_string(hour * 60);
    let mut by_line = Table::new(
        "spikes",
        format!("tokens per business line in {shown} UTC against the same hour over the 4 weeks before"),
        &[
            ("business_line", "line"),
            ("tokens", "tokens"),
            ("baseline_tokens", "baseline tokens"),
            ("token_ratio", "token ratio"),
            ("requests", "requests"),
            ("baseline_requests", "baseline requests"),
            ("request_ratio", "request ratio"),
            ("weeks", "weeks"),
            ("flag", "flag"),
        ],
    );
    let mut ordered: Vec<&LineSpike> = lines.iter().collect();
    ordered.sort_by(|a, b| b.flagged().cmp(&a.flagged()).then(b.token_ratio().unwrap_or(0.0).total_cmp(&a.token_ratio().unwrap_or(0.0))));
    for l in ordered {
        let b = l.baseline.unwrap_or_default();
        by_line.push(vec![
            Cell::text(l.line.clone()),
            Cell::num(Some(l.now.tokens), Kind::Count),
            Cell::num(l.baseline.map(|b| b.tokens.round()), Kind::Count),
            Cell::num(l.token_ratio(), Kind::Rate),
            Cell::num(Some(l.now.requests), Kind::Count),
            Cell::num(l.baseline.map(|b| b.requests.round()), Kind::Count),
            ratio(l.now.requests, b.requests),
            Cell::count(l.weeks as u64),
            flag(l.flagged()),
        ]);
    }
    let mut by_caller = Table::new(
        "spike_callers",
        format!("hashed callers in {shown} UTC against the same hour on the hot days before"),
        &[
            ("business_line", "line"),
            ("caller", "caller"),
            ("tokens", "tokens"),
            ("baseline_tokens", "baseline tokens"),
            ("token_ratio", "token ratio"),
            ("share_of_line", "share of line"),
            ("requests", "requests"),
            ("baseline_requests", "baseline requests"),
            ("days", "days"),
            ("flag", "flag"),
        ],
    );
    for c in callers.iter().take(ctx.top_users) {
        let line_tokens = lines.iter().find(|l| l.line == c.line).map_or(0.0, |l| l.now.tokens);
        by_caller.push(vec![
            Cell::text(c.line.clone()),
            Cell::text(crate::views::waste::short_hash(&c.caller)),
            Cell::num(Some(c.now.tokens), Kind::Count),
            Cell::num(Some(c.baseline.tokens.round()), Kind::Count),
            ratio(c.now.tokens, c.baseline.tokens),
            Cell::num((line_tokens > 0.0).then(|| c.now.tokens / line_tokens), Kind::Share),
            Cell::num(Some(c.now.requests), Kind::Count),
            Cell::num(Some(c.baseline.requests.round()), Kind::Count),
            Cell::count(c.days as u64),
            flag(c.flagged),
        ]);
    }
    if facts.tier(hour.div_euclid(24) as i32) != Tier::Hot {
        notes.push(format!("spikes: {shown} is not on a hot day: callers are kept by the hot tier only"));
    }
    if lines.iter().all(|l| l.weeks == 0) {
        notes.push(format!("spikes: no tier answers the same hour 1 to 4 weeks before {shown}: no line has a baseline"));
    }
    notes.push(format!(
        "spikes: flagged when tokens reach {TOKEN_RISE}x the baseline and {TOKEN_RISE}x the line's growth in requests; a caller \
         must also send {MIN_CALLER_REQUESTS} requests or more, its excess at least {}% of its line's tokens in the hour",
        CALLER_FLOOR * 100.0
    ));
    vec![by_line, by_caller]
}

/// `spiking_lines` and `spiking_callers` for `--fail-if` (e.g. `spiking_callers>0` from cron).
pub fn metrics(facts: &Facts, hour: i64) -> Vec<Metric> {
    let lines = lines(facts, hour);
    let callers = callers(facts, hour, &lines);
    vec![
        Metric { key: "spiking_lines".into(), value: Some(lines.iter().filter(|l| l.flagged()).count() as f64), kind: Kind::Count },
        Metric { key: "spiking_callers".into(), value: Some(callers.iter().filter(|c| c.flagged).count() as f64), kind: Kind::Count },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{Counts, HourFacts, HourKey};

    fn hour_facts(facts: &mut Facts, hour: i64, line: &str, requests: u64, tokens: u64) {
        let key = HourKey { hour, business_line: line.into(), model_name: "m".into(), model_version: "v".into() };
        let counts = Counts {
            totals: inferlog_store::model::fold::Totals { requests, input_tokens: tokens, ..inferlog_store::model::fold::Totals::default() },
            ..Counts::default()
        };
        facts.hours.insert(key, HourFacts { counts, ..HourFacts::default() });
    }

    #[test]
    fn a_line_spikes_when_tokens_grow_without_requests() {
        let day = 100;
        let hour = i64::from(day) * 24 + 14;
        let mut facts = Facts { tiers: (day - 28..=day).map(|d| (d, Tier::Aggregates)).collect(), ..Facts::default() };
        for w in 1..=4 {
            hour_facts(&mut facts, hour - w * 168, "search", 100, 10_000);
            hour_facts(&mut facts, hour - w * 168, "ads", 100, 10_000);
        }
        // Week 2 of search is missing from its tier: it counts as 0 traffic, not as a gap.
        facts.hours.retain(|k, _| !(k.hour == hour - 2 * 168 && k.business_line == "search"));
        hour_facts(&mut facts, hour, "search", 70, 20_000);
        hour_facts(&mut facts, hour, "ads", 210, 30_000);
        let spikes = lines(&facts, hour);
        let search = spikes.iter().find(|l| l.line == "search").expect("search");
        assert_eq!((search.weeks, search.baseline.map(|b| b.tokens)), (4, Some(7_500.0)));
        assert!(search.flagged(), "2.7x the tokens on the same requests");
        let ads = spikes.iter().find(|l| l.line == "ads").expect("ads");
        assert!(!ads.flagged(), "3x the tokens on 2.1x the requests is mostly business growth");
        // A week no tier answers is left out of the baseline, and so is one without any traffic in the hour (before the first event).
        facts.tiers.retain(|(d, _)| *d != day - 7);
        assert_eq!(lines(&facts, hour).iter().find(|l| l.line == "ads").map(|l| l.weeks), Some(3));
        facts.hours.retain(|k, _| k.hour != hour - 4 * 168);
        assert_eq!(lines(&facts, hour).iter().find(|l| l.line == "ads").map(|l| l.weeks), Some(2));
        let m = metrics(&facts, hour);
        assert_eq!((m[0].key.as_str(), m[0].value), ("spiking_lines", Some(1.0)));
    }

    #[test]
    fn a_caller_spikes_against_its_own_hours_on_the_hot_days_before() {
        let day = 100;
        let hour = i64::from(day) * 24 + 14;
        let mut facts = Facts { tiers: (day - 3..=day).map(|d| (d, Tier::Hot)).collect(), ..Facts::default() };
        let mut load = |d: i32, caller: &str, requests: u64, tokens: u64| {
            let mut l = [(0, 0); 24];
            l[14] = (requests, tokens);
            facts.callers.insert((d, "search".into(), caller.into()), l);
        };
        for d in day - 3..day {
            load(d, "k:cron", 10, 1_000);
            load(d, "k:web", 50, 5_000);
        }
        load(day, "k:cron", 12, 9_000);
        load(day, "k:web", 50, 5_100);
        load(day, "k:tiny", 1, 50);
        load(day, "k:big", 1, 4_000);
        hour_facts(&mut facts, hour, "search", 64, 18_150);
        let c = callers(&facts, hour, &lines(&facts, hour));
        assert_eq!((c[0].caller.as_str(), c[0].flagged, c[0].days, c[0].baseline.tokens), ("k:cron", true, 3, 1_000.0));
        let tiny = c.iter().find(|c| c.caller == "k:tiny").expect("tiny");
        assert!(!tiny.flagged, "a new caller of 50 tokens is under the floor");
        assert!(!c.iter().find(|c| c.caller == "k:big").expect("big").flagged, "one long request is no spike");
        assert!(!c.iter().find(|c| c.caller == "k:web").expect("web").flagged);
    }

    #[test]
    fn hours_parse_and_default_to_the_last_complete_one() {
        assert_eq!(parse_hour("1970-01-02T05"), Ok(29));
        assert_eq!(parse_hour("1970-01-02 05:30"), Ok(29));
        assert!(parse_hour("1970-01-02T24").is_err() && parse_hour("yesterday").is_err());
        let now = (100 * 24 + 10) * 3_600_000 + 5;
        assert_eq!(default_hour(100, now), 100 * 24 + 9, "the hour before the running one");
        assert_eq!(default_hour(98, now), 98 * 24 + 23, "a range that ended: its last hour");
    }
}
