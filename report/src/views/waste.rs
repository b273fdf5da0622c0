//! The `waste` view: where tokens go for nothing. In: the waste facts of
//! the range's days read from rows (hot days, and archive days kept whole;
//! [`inferlog_store::model::waste`]). Out:
//!
//! - `waste`: per business line, the requests whose prompt repeats (a
//!   repeat: the line sent the same prompt earlier the same UTC day), the
//!   tokens spent on them, and the cache-benefit estimate: the prefill
//!   tokens a cache of whole prompts would have saved on the repeats (their
//!   input less the prefix the prefix cache already served), as a share of
//!   the line's input tokens;
//! - `waste_prompts`: the most repeated prompts by tokens on repeats, with
//!   their hashed callers;
//! - `waste_outputs`: per request type the output-length distribution
//!   against its p50, the long outputs (above [`LONG_FACTOR`] × p50) and
//!   the requests that ended at their `max_tokens`.
//!
//! The days the aggregates answer count in `waste` and `waste_outputs`
//! from what the compactor kept of them (`daily_waste`, `daily_outputs`),
//! but keep no prompts: `waste_prompts` lists the days read from rows, and
//! a note names the others. Days aggregated before waste was kept, days of
//! a `--model` report (waste is kept per business line), and sampled
//! archive days (a sample cannot tell how often a prompt repeated) are
//! left out, and a note names them.

use std::collections::BTreeMap;

use inferlog_store::model::waste::{LineWaste, PromptUse, TypeWaste};

use crate::document::{Cell, Kind, Table};
use crate::facts::{Facts, Tier};
use crate::views::Context;

/// An output longer than this many times its request type's p50 is long.
pub const LONG_FACTOR: f64 = 4.0;

/// The prompts listed by default.
pub const DEFAULT_TOP: usize = 10;

/// The output-length quantiles shown.
const OUTPUT_LEVELS: [(f64, &str, &str); 3] =
    [(0.5, "output_p50_tokens", "output p50"), (0.9, "output_p90_tokens", "output p90"), (0.99, "output_p99_tokens", "output p99")];

/// A hash as shown in text: its key id and the first 12 hex digits.
pub fn short_hash(hash: &str) -> String {
    match hash.split_once(':') {
        Some((key, hex)) => format!("{key}:{}", &hex[..hex.len().min(12)]),
        None => hash.chars().take(16).collect(),
    }
}

fn share(part: u64, whole: u64) -> Cell {
    Cell::num((whole > 0).then(|| part as f64 / whole as f64), Kind::Share)
}

/// The range's waste, summed over the days it covers.
#[derive(Debug, Default)]
struct Summed {
    lines: BTreeMap<String, LineWaste>,
    prompts: BTreeMap<(String, String), PromptUse>,
    types: BTreeMap<String, TypeWaste>,
}

fn sum(facts: &Facts, ctx: &Context, notes: &mut Vec<String>) -> Summed {
    let mut s = Summed::default();
    let (mut sampled, mut aggregated, mut unlisted) = (Vec::new(), Vec::new(), Vec::new());
    for day in ctx.range.iter() {
        match (facts.tier(day), facts.waste.get(&day)) {
            (_, Some(w)) if w.sampled => sampled.push(inferlog_store::day_string(day)),
            (tier, Some(w)) => {
                if tier == Tier::Aggregates {
                    unlisted.push(inferlog_store::day_string(day));
                }
                for (line, l) in &w.lines {
                    *s.lines.entry(line.clone()).or_default() += *l;
                }
                for (key, p) in &w.repeated {
                    let into = s.prompts.entry(key.clone()).or_default();
                    into.requests += p.repeats();
                    into.tokens += p.repeat_tokens();
                    into.uncached_input += p.repeat_uncached_input();
                    for (caller, n) in &p.callers {
                        match into.callers.iter_mut().find(|(c, _)| c == caller) {
                            Some(c) => c.1 += n,
                            None => into.callers.push((caller.clone(), *n)),
                        }
                    }
                }
                for ((_, t), w) in &w.types {
                    *s.types.entry(t.clone()).or_default() += w.clone();
                }
            }
            (Tier::Aggregates, None) => aggregated.push(inferlog_store::day_string(day)),
            _ => {}
        }
    }
    if !aggregated.is_empty() {
        let why = match &ctx.filter.model {
            Some(_) => "whose waste is kept per business line, not per model",
            None => "aggregated before their waste was kept",
        };
        notes.push(format!("waste: {} answered by the aggregates, {why}: not counted", aggregated.join(", ")));
    }
    if !unlisted.is_empty() {
        notes.push(format!(
            "waste_prompts: {} answered by the aggregates, which keep no prompts: their repeats count in waste, their prompts are not listed",
            unlisted.join(", ")
        ));
    }
    if !sampled.is_empty() {
        notes.push(format!("waste: {} read from a sampled archive, which cannot tell how often a prompt repeated: not counted", sampled.join(", ")));
    }
    notes.push(
        "waste: a repeat is a request whose business line sent the same prompt (its keyed hash) earlier the same UTC day; prompts hashed \
         under another key, or sent once as a producer's hash and once as text, do not match"
            .to_owned(),
    );
    s
}

pub fn tables(facts: &Facts, ctx: &Context, top: usize, notes: &mut Vec<String>) -> Vec<Table> {
    let s = sum(facts, ctx, notes);
    vec![lines(&s), prompts(&s, top), outputs(&s)]
}

fn lines(s: &Summed) -> Table {
    let mut table = Table::new(
        "waste",
        "repeated prompts by business line, and what a prompt cache would save",
        &[
            ("business_line", "line"),
            ("requests", "requests"),
            ("hashed_share", "with prompt hash"),
            ("repeats", "repeats"),
            ("repeat_share", "repeat share"),
            ("repeat_tokens", "tokens on repeats"),
            ("repeat_token_share", "share of tokens"),
            ("cache_saved_prefill_tokens", "prefill a cache saves"),
            ("cache_saved_share", "share of input"),
        ],
    );
    let mut all = LineWaste::default();
    let row = |name: &str, l: &LineWaste| {
        vec![
            Cell::text(name),
            Cell::count(l.requests),
            share(l.hashed, l.requests),
            Cell::count(l.repeats),
            share(l.repeats, l.hashed),
            Cell::count(l.repeat_tokens),
            share(l.repeat_tokens, l.tokens),
            Cell::count(l.repeat_uncached_input),
            share(l.repeat_uncached_input, l.input_tokens),
        ]
    };
    let mut by_tokens: Vec<(&String, &LineWaste)> = s.lines.iter().collect();
    by_tokens.sort_by(|a, b| b.1.repeat_tokens.cmp(&a.1.repeat_tokens).then(a.0.cmp(b.0)));
    for (line, l) in by_tokens {
        all += *l;
        table.push(row(line, l));
    }
    if s.lines.len() > 1 {
        table.push(row("all", &all));
    }
    table
}

fn prompts(s: &Summed, top: usize) -> Table {
    let mut table = Table::new(
        "waste_prompts",
        format!("the {top} most repeated prompts (keyed hashes) by tokens on repeats"),
        &[
            ("business_line", "line"),
            ("prompt_hash", "prompt"),
            ("repeats", "repeats"),
            ("repeat_tokens", "tokens on repeats"),
            ("cache_saved_prefill_tokens", "prefill a cache saves"),
            ("callers", "callers"),
            ("top_caller", "top caller"),
            ("top_caller_requests", "its requests"),
        ],
    );
    let mut ranked: Vec<(&(String, String), &PromptUse)> = s.prompts.iter().collect();
    ranked.sort_by(|a, b| b.1.tokens.cmp(&a.1.tokens).then(a.0.cmp(b.0)));
    for ((line, hash), p) in ranked.into_iter().take(top) {
        let named = p.callers.iter().filter(|(c, _)| !c.is_empty());
        let top_caller = named.clone().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        table.push(vec![
            Cell::text(line.clone()),
            Cell::text(short_hash(hash)),
            // Summed over days, `requests` holds the repeats and `tokens` their tokens.
            Cell::count(p.requests),
            Cell::count(p.tokens),
            Cell::count(p.uncached_input),
            Cell::count(named.count() as u64),
            Cell::text(top_caller.map_or_else(|| "-".to_owned(), |(c, _)| short_hash(c))),
            Cell::count(top_caller.map_or(0, |(_, n)| *n)),
        ]);
    }
    table
}

fn outputs(s: &Summed) -> Table {
    let mut columns = vec![("request_type", "request type"), ("requests", "requests")];
    columns.extend(OUTPUT_LEVELS.map(|(_, k, l)| (k, l)));
    columns.extend([
        ("long_requests", "long (> 4× p50)"),
        ("long_share", "long share"),
        ("limited_share", "set max_tokens"),
        ("at_limit", "ended at max_tokens"),
        ("at_limit_share", "of those that set it"),
        ("at_limit_output_tokens", "their output tokens"),
    ]);
    let mut table = Table::new("waste_outputs", "output lengths by request type against their p50, and answers cut at max_tokens", &columns);
    for (name, t) in &s.types {
        let p50 = t.outputs.quantile(0.5);
        let long = p50.map(|p| t.outputs.count_above(LONG_FACTOR * p));
        let mut row = vec![Cell::text(name.clone()), Cell::count(t.requests)];
        row.extend(OUTPUT_LEVELS.map(|(q, _, _)| Cell::num(t.outputs.quantile(q).map(f64::round), Kind::Count)));
        row.extend([
            Cell::num(long.map(|n| n as f64), Kind::Count),
            Cell::num(long.filter(|_| t.requests > 0).map(|n| n as f64 / t.requests as f64), Kind::Share),
            share(t.limited, t.requests),
            Cell::count(t.at_limit),
            share(t.at_limit, t.limited),
            Cell::count(t.at_limit_tokens),
        ]);
        table.push(row);
    }
    table
}

#[cfg(test)]
mod tests {
    use inferlog_store::model::waste::Waste;

    use super::*;
    use crate::range::Range;
    use crate::source::Filter;

    fn ctx(from: i32, to: i32) -> Context {
        Context { range: Range { from, to }, filter: Filter::default(), now_ms: i64::MAX, budgets: Vec::new(), top_users: 5, versions: None }
    }

    /// A day's prompt whose first request had 10 tokens, 4 of them uncached input.
    fn prompt(requests: u64, tokens: u64, callers: &[(&str, u64)]) -> PromptUse {
        let callers = callers.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect();
        PromptUse { requests, tokens, uncached_input: tokens / 2, first: (0, 10, 4), callers }
    }

    #[test]
    fn days_without_prompts_are_named_and_left_out() {
        let mut day = Waste::default();
        day.lines.insert(
            "search".into(),
            LineWaste { requests: 10, tokens: 1000, input_tokens: 600, hashed: 8, repeats: 4, repeat_tokens: 400, repeat_uncached_input: 200 },
        );
        let sampled = Waste { sampled: true, ..day.clone() };
        let facts = Facts {
            tiers: vec![(1, Tier::Hot), (2, Tier::Aggregates), (3, Tier::Archive)],
            waste: [(1, day), (3, sampled)].into_iter().collect(),
            ..Facts::default()
        };
        let mut notes = Vec::new();
        let t = tables(&facts, &ctx(1, 3), 10, &mut notes);
        assert_eq!(t[0].rows.len(), 1, "one line, no total row");
        let cell = |name: &str| t[0].rows[0][t[0].column(name).expect("column")].value();
        assert_eq!((cell("repeats"), cell("repeat_share"), cell("cache_saved_share")), (Some(4.0), Some(0.5), Some(200.0 / 600.0)));
        assert!(notes.iter().any(|n| n.contains("aggregates") && n.contains("1970-01-03")), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("sampled") && n.contains("1970-01-04")), "{notes:?}");
    }

    #[test]
    fn top_prompts_sum_their_repeats_over_days_and_name_the_busiest_caller() {
        let mut d1 = Waste::default();
        d1.repeated.insert(("s".into(), "k:aaaaaaaaaaaaaaaa".into()), prompt(3, 30, &[("k:u1", 2), ("", 1)]));
        let mut d2 = d1.clone();
        d2.repeated.insert(("s".into(), "k:bbbb".into()), prompt(2, 500, &[("k:u2", 2)]));
        let facts = Facts { tiers: vec![(1, Tier::Hot), (2, Tier::Hot)], waste: [(1, d1), (2, d2)].into_iter().collect(), ..Facts::default() };
        let t = tables(&facts, &ctx(1, 2), 10, &mut Vec::new());
        let prompts = &t[1];
        let text: Vec<Vec<String>> = prompts.rows.iter().map(|r| r.iter().map(Cell::display).collect()).collect();
        assert_eq!(text[0][1], "k:bbbb", "the most tokens on repeats first: {text:?}");
        assert_eq!(text[1][1], "k:aaaaaaaaaaaa", "shown short");
        let a = &prompts.rows[1];
        // Each day: 3 requests, 2 repeats of 20 tokens (11 uncached input); u1 sent 2 a day.
        assert_eq!((a[2].value(), a[3].value(), a[4].value()), (Some(4.0), Some(40.0), Some(22.0)));
        assert_eq!((a[5].value(), a[7].value()), (Some(1.0), Some(4.0)), "one named caller");
        assert_eq!(a[6].display(), "k:u1");
    }
}
