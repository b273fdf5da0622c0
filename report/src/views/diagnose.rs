//! The `diagnose` view: where is the problem? In: the facts of the range
//! and of the one before it. Out: the seeds' decision tree, walked: success
//! rate → TTFT p99 → TPOT p99 → tokens per minute. Each step compares the
//! range with the one before; the first step that is worse stops the walk
//! and names the dimension (business line, model version, input bucket,
//! output bucket, error code, error stage, GPU) whose one value explains
//! most of the change, and for a latency, the stage (queue, prefill,
//! decode) that grew in that slice. GPU is a dimension only when every day
//! of both ranges was read from rows (hot, archive): the aggregates keep no
//! GPU, and a note says so.
//!
//! A step is worse when the change is beyond what the counts explain
//! ([`crate::significance`], α = 0.001) and large enough to matter: the
//! error share up [`MIN_ERROR_POINTS`], a p99 up [`MIN_LATENCY_RISE`],
//! tokens per minute up [`MIN_TOKEN_RISE`] (a sum of tokens has no count
//! to test, so only the size counts there).
//!
//! How a value's part of the change is measured:
//! - error share: its errors over all requests, now minus before;
//! - a p99: its excess tail, the requests now above the previous p99
//!   minus those its own previous rate above it would give (a value new in
//!   the range takes the whole range's previous rate);
//! - tokens per minute: its tokens per minute, now minus before.
//!
//! A value's parts add up to the whole change (within a dimension), so
//! "explains 85%" is a share of the change itself.

use std::collections::BTreeMap;

use crate::document::{change, Cell, Kind, Table};
use crate::facts::{ErrorKey, Facts, GroupKey, Summary, Tier, DECODE, PREFILL, QUEUE, TPOT, TTFT};
use crate::range::Range;
use crate::significance::{proportions, quantile_shift, Shift};
use crate::views::{groups, summary, Context};

/// The rise of the error share (absolute) that matters.
pub const MIN_ERROR_POINTS: f64 = 0.002;
/// The relative rise of a p99 that matters.
pub const MIN_LATENCY_RISE: f64 = 0.10;
/// The relative rise of tokens per minute that matters.
pub const MIN_TOKEN_RISE: f64 = 0.20;

/// The dimensions a step can name, as shown.
const DIMENSIONS: [&str; 7] = ["business line", "model version", "input bucket", "output bucket", "error code", "error stage", "GPU"];

/// The index of the GPU in [`DIMENSIONS`].
const GPU: usize = 6;

/// A GPU as a value of its dimension.
fn gpu_value(id: Option<u32>) -> String {
    id.map_or_else(|| "none named".to_owned(), |id| format!("gpu {id}"))
}

/// The days of `now` and `before` the aggregates answer: with any, GPU is no dimension.
fn without_gpus(facts: &Facts, now: Range, before: Range) -> Vec<inferlog_store::Day> {
    before.iter().chain(now.iter()).filter(|d| facts.tier(*d) == Tier::Aggregates).collect()
}

/// A group's value in dimension `d` (`None`: groups have no error code or stage).
fn group_value(d: usize, k: &GroupKey) -> Option<String> {
    match d {
        0 => Some(k.business_line.clone()),
        1 => Some(format!("{} {}", k.model_name, k.model_version)),
        2 => Some(k.input_bucket.clone()),
        3 => Some(k.output_bucket.clone()),
        _ => None,
    }
}

/// An error count's value in dimension `d` (`None`: errors have no output bucket).
fn error_value(d: usize, k: &ErrorKey, name: &str) -> Option<String> {
    match d {
        0 => Some(k.business_line.clone()),
        1 => Some(format!("{} {}", k.model_name, k.model_version)),
        2 => Some(k.input_bucket.clone()),
        4 => Some(format!("{} {name}", k.error_code)),
        5 => Some(k.error_stage.clone()),
        _ => None,
    }
}

/// Per (dimension, value), the summary of the groups of `range`; per GPU
/// when `gpus`.
fn slices(facts: &Facts, range: Range, gpus: bool) -> BTreeMap<(usize, String), Summary> {
    let mut out: BTreeMap<(usize, String), Summary> = BTreeMap::new();
    for (k, g) in groups(facts, range, |_| true) {
        for d in 0..DIMENSIONS.len() {
            if let Some(v) = group_value(d, k) {
                out.entry((d, v)).or_default().add(g);
            }
        }
    }
    for ((_, id), g) in facts.gpus.iter().filter(|((day, _), _)| gpus && range.contains(*day)) {
        out.entry((GPU, gpu_value(*id))).or_default().add(g);
    }
    out
}

/// One dimension's best explanation of a change.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub dimension: &'static str,
    pub value: String,
    /// The value's part of the change, as a share of the whole change.
    pub explains: f64,
    /// The stage that grew in that value's slice, e.g. `queue p99 40.0 → 3040.0 ms`.
    pub stage: Option<String>,
}

/// Per dimension, the value with the largest part of `total`, best first.
fn explain(parts: &BTreeMap<(usize, String), f64>, total: f64) -> Vec<Explanation> {
    let mut best: BTreeMap<usize, (&String, f64)> = BTreeMap::new();
    for ((d, v), part) in parts {
        let entry = best.entry(*d).or_insert((v, *part));
        if *part > entry.1 {
            *entry = (v, *part);
        }
    }
    let mut out: Vec<Explanation> = best
        .into_iter()
        .map(|(d, (v, part))| Explanation { dimension: DIMENSIONS[d], value: v.clone(), explains: part / total, stage: None })
        .collect();
    out.sort_by(|a, b| b.explains.total_cmp(&a.explains).then(a.dimension.cmp(b.dimension)));
    out
}

/// How a step came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Worse,
    Fine,
    /// Too few requests (or none before) to compare.
    TooFew,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Worse => "worse",
            Verdict::Fine => "fine",
            Verdict::TooFew => "too few to tell",
        }
    }
}

/// One step of the walk.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: &'static str,
    pub kind: Kind,
    pub previous: Option<f64>,
    pub current: Option<f64>,
    pub z: Option<f64>,
    pub verdict: Verdict,
    /// Best first (the first is the answer), when the step is worse.
    pub explanations: Vec<Explanation>,
}

fn success_step(facts: &Facts, now: Range, before: Range, gpus: bool) -> Step {
    let (now_s, before_s) = (summary(facts, now), summary(facts, before));
    let (cur, prev) = (now_s.counts, before_s.counts);
    let z = proportions(prev.totals.errors, prev.totals.requests, cur.totals.errors, cur.totals.requests);
    // Error shares: 1 − the success rates.
    let (p, c) = (before_s.success_rate().map(|r| 1.0 - r), now_s.success_rate().map(|r| 1.0 - r));
    let up = p.zip(c).map(|(p, c)| c - p);
    let verdict = match Shift::of(z) {
        Shift::Higher if up.is_some_and(|u| u >= MIN_ERROR_POINTS) => Verdict::Worse,
        Shift::TooFew if prev.totals.requests == 0 || cur.totals.requests == 0 || prev.totals.errors + cur.totals.errors > 0 => Verdict::TooFew,
        _ => Verdict::Fine,
    };
    let mut explanations = Vec::new();
    if verdict == Verdict::Worse {
        let mut parts: BTreeMap<(usize, String), f64> = BTreeMap::new();
        for (range, n, sign) in [(now, cur.totals.requests, 1.0), (before, prev.totals.requests, -1.0)] {
            for (k, e) in facts.errors.iter().filter(|(k, _)| range.contains(k.day)) {
                for d in 0..DIMENSIONS.len() {
                    if let Some(v) = error_value(d, k, &e.name) {
                        *parts.entry((d, v)).or_default() += sign * e.errors as f64 / n as f64;
                    }
                }
            }
            for ((_, id), g) in facts.gpus.iter().filter(|((day, _), _)| gpus && range.contains(*day)) {
                *parts.entry((GPU, gpu_value(*id))).or_default() += sign * g.counts.totals.errors as f64 / n as f64;
            }
        }
        explanations = explain(&parts, up.unwrap_or(0.0));
    }
    Step {
        name: "success rate",
        kind: Kind::Share,
        previous: before_s.success_rate(),
        current: now_s.success_rate(),
        z: z.map(|z| -z),
        verdict,
        explanations,
    }
}

/// The p99 step of `measure`; `stages`: the stages whose growth is looked
/// for in the slice that explains most.
fn latency_step(facts: &Facts, now: Range, before: Range, gpus: bool, name: &'static str, measure: usize, stages: &[(usize, &str)]) -> Step {
    let (cur, prev) = (summary(facts, now), summary(facts, before));
    let (p, c) = (prev.quantile(measure, 0.99), cur.quantile(measure, 0.99));
    let z = prev.hists[measure].as_ref().zip(cur.hists[measure].as_ref()).and_then(|(a, b)| quantile_shift(a, b, 0.99));
    let verdict = match Shift::of(z) {
        Shift::Higher if change(c, p).is_some_and(|r| r >= MIN_LATENCY_RISE) => Verdict::Worse,
        Shift::TooFew => Verdict::TooFew,
        _ => Verdict::Fine,
    };
    let mut explanations = Vec::new();
    if let (Verdict::Worse, Some(split), Some(prev_h), Some(cur_h)) = (verdict, p, prev.hists[measure].as_ref(), cur.hists[measure].as_ref()) {
        // The excess tail: requests now above the previous p99, beyond the previous rate above it.
        let rate = |h: &inferlog_schema::histogram::Histogram| h.count_above(split) as f64 / h.count().max(1) as f64;
        let whole_rate = rate(prev_h);
        let total = cur_h.count_above(split) as f64 - cur_h.count() as f64 * whole_rate;
        let (now_slices, before_slices) = (slices(facts, now, gpus), slices(facts, before, gpus));
        let mut parts: BTreeMap<(usize, String), f64> = BTreeMap::new();
        for (key, s) in &now_slices {
            let Some(h) = s.hists[measure].as_ref() else { continue };
            let before_rate = before_slices.get(key).and_then(|b| b.hists[measure].as_ref()).filter(|b| b.count() > 0).map_or(whole_rate, rate);
            parts.insert(key.clone(), h.count_above(split) as f64 - h.count() as f64 * before_rate);
        }
        explanations = explain(&parts, total);
        if let Some(top) = explanations.first_mut() {
            let d = DIMENSIONS.iter().position(|n| *n == top.dimension).unwrap_or(0);
            let key = (d, top.value.clone());
            let empty = Summary::default();
            let (was, is) = (before_slices.get(&key).unwrap_or(&empty), now_slices.get(&key).unwrap_or(&empty));
            top.stage = stages
                .iter()
                .filter_map(|(m, stage)| {
                    let (a, b) = (was.quantile(*m, 0.99)?, is.quantile(*m, 0.99)?);
                    Some((b - a, format!("{stage} p99 {a:.1} → {b:.1} ms")))
                })
                .max_by(|x, y| x.0.total_cmp(&y.0))
                .filter(|(grew, _)| *grew > 0.0)
                .map(|(_, text)| text);
        }
    }
    Step { name, kind: Kind::Ms, previous: p, current: c, z, verdict, explanations }
}

fn token_step(facts: &Facts, now: Range, before: Range, gpus: bool, now_ms: i64) -> Step {
    let (now_min, before_min) = (facts.answered_minutes(now, now_ms), facts.answered_minutes(before, now_ms));
    let per_minute = |range: Range, minutes: Option<f64>| minutes.map(|m| summary(facts, range).counts.tokens() as f64 / m);
    let (p, c) = (per_minute(before, before_min), per_minute(now, now_min));
    let verdict = match change(c, p) {
        None => Verdict::TooFew,
        Some(r) if r >= MIN_TOKEN_RISE => Verdict::Worse,
        Some(_) => Verdict::Fine,
    };
    let mut explanations = Vec::new();
    if let (Verdict::Worse, Some(nm), Some(bm), Some(p), Some(c)) = (verdict, now_min, before_min, p, c) {
        let mut parts: BTreeMap<(usize, String), f64> = BTreeMap::new();
        for (range, minutes, sign) in [(now, nm, 1.0), (before, bm, -1.0)] {
            for (key, s) in slices(facts, range, gpus) {
                *parts.entry(key).or_default() += sign * s.counts.tokens() as f64 / minutes;
            }
        }
        explanations = explain(&parts, c - p);
    }
    Step { name: "tokens per minute", kind: Kind::Rate, previous: p, current: c, z: None, verdict, explanations }
}

/// The walk: each step until the first that is worse (included).
pub fn walk(facts: &Facts, range: Range, now_ms: i64) -> Vec<Step> {
    let before = range.previous();
    let gpus = without_gpus(facts, range, before).is_empty();
    let steps: [&dyn Fn() -> Step; 4] = [
        &|| success_step(facts, range, before, gpus),
        &|| latency_step(facts, range, before, gpus, "TTFT p99", TTFT, &[(QUEUE, "queue"), (PREFILL, "prefill")]),
        &|| latency_step(facts, range, before, gpus, "TPOT p99", TPOT, &[(DECODE, "decode")]),
        &|| token_step(facts, range, before, gpus, now_ms),
    ];
    let mut out = Vec::new();
    for step in steps {
        let s = step();
        let stop = s.verdict == Verdict::Worse;
        out.push(s);
        if stop {
            break;
        }
    }
    out
}

pub fn tables(facts: &Facts, ctx: &Context, notes: &mut Vec<String>) -> Vec<Table> {
    let steps = walk(facts, ctx.range, ctx.now_ms);
    let mut path = Table::new(
        "diagnosis",
        "the decision tree, walked: each step against the previous range until one is worse",
        &[
            ("step", "step"),
            ("previous", "previous"),
            ("current", "current"),
            ("change", "change"),
            ("z", "z"),
            ("verdict", "verdict"),
            ("dimension", "dimension"),
            ("value", "value"),
            ("explains", "explains"),
            ("stage", "stage"),
        ],
    );
    for s in &steps {
        let top = s.explanations.first();
        path.push(vec![
            Cell::text(s.name),
            Cell::num(s.previous, s.kind),
            Cell::num(s.current, s.kind),
            Cell::num(change(s.current, s.previous), Kind::Change),
            Cell::num(s.z, Kind::Rate),
            Cell::text(s.verdict.as_str()),
            Cell::text(top.map_or("", |t| t.dimension)),
            Cell::text(top.map_or(String::new(), |t| t.value.clone())),
            Cell::num(top.map(|t| t.explains), Kind::Share),
            Cell::text(top.and_then(|t| t.stage.clone()).unwrap_or_default()),
        ]);
    }
    let mut tables = vec![path];
    match steps.last() {
        Some(last) if last.verdict == Verdict::Worse => {
            let mut dims = Table::new(
                "diagnosis_dimensions",
                format!("{}: each dimension's value that explains most of the change", last.name),
                &[("dimension", "dimension"), ("value", "value"), ("explains", "explains")],
            );
            for e in &last.explanations {
                dims.push(vec![Cell::text(e.dimension), Cell::text(e.value.clone()), Cell::num(Some(e.explains), Kind::Share)]);
            }
            tables.push(dims);
        }
        _ => notes.push("no step is worse than in the previous range".into()),
    }
    let aggregated = without_gpus(facts, ctx.range, ctx.range.previous());
    if !aggregated.is_empty() {
        let days: Vec<String> = aggregated.iter().map(|d| inferlog_store::day_string(*d)).collect();
        notes.push(format!("diagnose: GPU is no dimension here: {} answered by the aggregates, which keep no GPU", days.join(", ")));
    }
    tables
}

#[cfg(test)]
mod tests {
    use inferlog_schema::histogram::Histogram;

    use super::*;
    use crate::facts::{GroupFacts, Tier};

    /// `n` requests of one line × input bucket on `day`: TTFT = queue + 100 ms.
    fn add(f: &mut Facts, day: i32, line: &str, input: &str, n: u64, queue_ms: f64) {
        let mut g = GroupFacts::default();
        g.counts.totals.requests = n;
        g.counts.totals.input_tokens = n * 1000;
        for (m, base) in [(QUEUE, queue_ms), (PREFILL, 100.0), (TTFT, queue_ms + 100.0)] {
            let mut h = Histogram::new();
            for i in 0..n {
                h.add(base + (i % 40) as f64);
            }
            g.hists[m] = Some(h);
        }
        let key = GroupKey::of(day, line, "m", "v1", input);
        f.groups.insert(key, g);
    }

    #[test]
    fn queueing_in_one_input_bucket_is_found_at_the_ttft_step() {
        let mut f = Facts { tiers: vec![(0, Tier::Hot), (1, Tier::Hot)], ..Facts::default() };
        for (day, slow_queue) in [(0, 10.0), (1, 3000.0)] {
            for line in ["search", "ads"] {
                add(&mut f, day, line, "0-1k", 3000, 10.0);
                add(&mut f, day, line, "8k-32k", 300, slow_queue);
            }
        }
        let steps = walk(&f, Range { from: 1, to: 1 }, i64::MAX);
        let verdicts: Vec<(&str, Verdict)> = steps.iter().map(|s| (s.name, s.verdict)).collect();
        assert_eq!(verdicts, [("success rate", Verdict::Fine), ("TTFT p99", Verdict::Worse)], "no errors either day; the walk stops at TTFT");
        let top = &steps[1].explanations[0];
        assert_eq!((top.dimension, top.value.as_str()), ("input bucket", "8k-32k"));
        assert!((top.explains - 1.0).abs() < 0.05, "the whole excess tail: {}", top.explains);
        assert!(top.stage.as_deref().is_some_and(|s| s.starts_with("queue p99")), "{top:?}");
        let line = steps[1].explanations.iter().find(|e| e.dimension == "business line").expect("line");
        assert!((line.explains - 0.5).abs() < 0.05, "each line holds half of it: {}", line.explains);
    }

    #[test]
    fn an_unchanged_range_walks_every_step() {
        let mut f = Facts { tiers: vec![(0, Tier::Hot), (1, Tier::Hot)], ..Facts::default() };
        for day in [0, 1] {
            add(&mut f, day, "search", "0-1k", 3000, 10.0);
        }
        let steps = walk(&f, Range { from: 1, to: 1 }, i64::MAX);
        assert_eq!(steps.len(), 4);
        assert!(steps[1..].iter().all(|s| s.verdict != Verdict::Worse), "{steps:?}");
        assert_eq!(steps[3].verdict, Verdict::Fine, "the same tokens per minute");
    }
}
