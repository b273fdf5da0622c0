//! The sampled archive's rule. In: one UTC day's hot rows as
//! [`StoredRow`]s, the `[sampling]` config and the thresholds of each
//! group (business line × model × version × input bucket). Out: for each
//! row, whether the archive keeps it, why ([`Reason`]) and how many of the
//! day's rows it stands for (its weight).
//!
//! - The tail is kept whole, weight 1: `error` (error_code ≠ 0),
//!   `truncated`, `slow` (total latency or TTFT above its group's
//!   threshold), `long` (input or output tokens above the threshold),
//!   then the user's `[[sampling.keep]]` rules, each under its own reason
//!   ([`crate::model::keep`]).
//! - The rest of each stratum (group × UTC hour) is sampled: a row is kept
//!   when the top byte of the seeded XXH64 of its `request_id` is below the
//!   stratum's cut. The cut starts at `base_rate` (rounded up to 1/256) and
//!   rises until the stratum keeps `min_per_stratum` rows (or all it has).
//! - Weights are integers: a stratum of `n` ordinary rows that keeps `k`
//!   gives each kept row `n / k`, and the first `n % k` kept rows (in the
//!   order the archive reads them) one more, so the weights of a stratum add
//!   up to `n` exactly, and `sum(sample_weight)` over any set of strata is
//!   the exact row count.
//!
//! Deciding needs each stratum's counts first, so a day is read twice: a
//! [`Planner`] counts every ordinary row by stratum and hash byte (256
//! counters per stratum, whatever the day's size), then a [`Selector`]
//! decides each row as the archive streams it, in the same order, and
//! checks at the end that it kept what the plan counted.

use std::collections::{BTreeMap, HashMap};

use inferlog_schema::InputBucket;

use crate::config::SamplingConfig;
use crate::error::StoreError;
use crate::model::keep::Keep;
use crate::model::stored::StoredRow;

/// Why an archived row is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    Error,
    Truncated,
    Slow,
    Long,
    /// A `[[sampling.keep]]` rule of this name matched.
    Keep(&'static str),
    /// One of the ordinary rows its stratum kept.
    Sampled,
    /// The day was archived without sampling: every row, weight 1.
    All,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Error => "error",
            Reason::Truncated => "truncated",
            Reason::Slow => "slow",
            Reason::Long => "long",
            Reason::Keep(name) => name,
            Reason::Sampled => "sampled",
            Reason::All => "all",
        }
    }
}

/// A group: business line, model, version, input bucket.
pub type Group = (String, String, String, &'static str);

/// Where a group's thresholds come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The configured quantile of the group's merged histograms.
    History,
    /// The configured static thresholds (no or too little history).
    Static,
}

impl Source {
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::History => "history",
            Source::Static => "static",
        }
    }
}

/// The thresholds above which a request of a group is kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub slow_total_latency_ms: f64,
    pub slow_ttft_ms: f64,
    pub long_output_tokens: u32,
    pub long_input_tokens: u32,
    pub source: Source,
}

impl Thresholds {
    /// The configured static thresholds.
    pub fn fixed(config: &SamplingConfig) -> Thresholds {
        Thresholds {
            slow_total_latency_ms: config.slow_total_latency_ms,
            slow_ttft_ms: config.slow_ttft_ms,
            long_output_tokens: config.long_output_tokens,
            long_input_tokens: config.long_input_tokens,
            source: Source::Static,
        }
    }
}

/// A group's history, as the aggregates hold it: requests and the
/// configured quantile of total latency and of TTFT (each with the count
/// of values it is over).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupHistory {
    pub group: Group,
    pub total_rows: u64,
    pub total_quantile_ms: Option<f64>,
    pub ttft_rows: u64,
    pub ttft_quantile_ms: Option<f64>,
}

/// The day's sampling parameters and thresholds: what decides each row.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub base_rate: f64,
    pub min_per_stratum: u64,
    pub seed: u64,
    /// Thresholds of the groups that have history; the rest use `fixed`.
    pub groups: HashMap<Group, Thresholds>,
    pub fixed: Thresholds,
    /// The user's keep rules, in order.
    pub keep: Vec<Keep>,
}

impl Rule {
    /// The rule of `config`, with thresholds from `history` where a group
    /// has at least `min_history_rows` values of the measure.
    pub fn new(config: &SamplingConfig, history: &[GroupHistory]) -> Result<Rule, StoreError> {
        let fixed = Thresholds::fixed(config);
        let enough = |rows: u64, q: Option<f64>| q.filter(|_| rows >= config.min_history_rows.max(1));
        let groups = history
            .iter()
            .filter_map(|h| {
                let total = enough(h.total_rows, h.total_quantile_ms)?;
                let ttft = enough(h.ttft_rows, h.ttft_quantile_ms).unwrap_or(fixed.slow_ttft_ms);
                Some((h.group.clone(), Thresholds { slow_total_latency_ms: total, slow_ttft_ms: ttft, source: Source::History, ..fixed }))
            })
            .collect();
        let keep = config.keep.iter().map(Keep::new).collect::<Result<_, _>>()?;
        Ok(Rule { base_rate: config.base_rate, min_per_stratum: config.min_per_stratum, seed: config.seed, groups, fixed, keep })
    }

    /// The thresholds of a row's group.
    pub fn thresholds(&self, line: &str, model: &str, version: &str, bucket: &'static str) -> &Thresholds {
        if self.groups.is_empty() {
            return &self.fixed;
        }
        // Borrowed lookups of a tuple key need an owned key; groups are few, rows many: see `Strata`.
        self.groups.get(&(line.to_owned(), model.to_owned(), version.to_owned(), bucket)).unwrap_or(&self.fixed)
    }

    /// The reason a row is kept whatever the sample, if any.
    pub fn tail(&self, row: &StoredRow<'_>, t: &Thresholds) -> Option<Reason> {
        if row.error_code != 0 {
            Some(Reason::Error)
        } else if row.truncated == Some(1) {
            Some(Reason::Truncated)
        } else if row.total_latency_ms > t.slow_total_latency_ms || row.ttft_ms.is_some_and(|v| v > t.slow_ttft_ms) {
            Some(Reason::Slow)
        } else if row.output_tokens > t.long_output_tokens || row.input_tokens > t.long_input_tokens {
            Some(Reason::Long)
        } else {
            self.keep.iter().find(|k| k.keeps(row)).map(|k| Reason::Keep(k.reason()))
        }
    }

    /// The top byte of the seeded hash of `request_id`: 0..=255, uniform.
    pub fn hash_byte(&self, request_id: &str) -> usize {
        (twox_hash::XxHash64::oneshot(self.seed, request_id.as_bytes()) >> 56) as usize
    }

    /// The cut `base_rate` gives: a row is kept when its hash byte is below it.
    fn base_cut(&self) -> usize {
        ((self.base_rate * 256.0).ceil() as usize).clamp(1, 256)
    }
}

/// One series (business line × model × version) of a day: its groups'
/// thresholds (one per input bucket) and a slot per input bucket × hour.
#[derive(Debug)]
struct Series<T> {
    thresholds: [Thresholds; BUCKETS],
    slots: Vec<Option<T>>,
}

const BUCKETS: usize = InputBucket::ALL.len();

/// The day's series, found without allocating per row: rows come in
/// series order, so a series is looked up (and its thresholds found) once
/// per run of rows.
#[derive(Debug)]
struct Strata<T> {
    index: HashMap<(String, String, String), usize>,
    last: Option<(usize, String, String, String)>,
    series: Vec<Series<T>>,
}

impl<T> Strata<T> {
    fn new() -> Strata<T> {
        Strata { index: HashMap::new(), last: None, series: Vec::new() }
    }

    /// The row's series, input bucket and slot (bucket × hour).
    fn locate(&mut self, rule: &Rule, row: &StoredRow<'_>) -> (usize, usize, usize) {
        let (line, model, version) = (row.business_line, row.model_name, row.model_version);
        let bucket = InputBucket::of(row.input_tokens) as usize;
        let slot = bucket * 24 + ((row.timestamp_ms / 3_600_000) % 24) as usize;
        if let Some((i, l, m, v)) = &self.last {
            if l == line && m == model && v == version {
                return (*i, bucket, slot);
            }
        }
        let next = self.series.len();
        let i = *self.index.entry((line.to_owned(), model.to_owned(), version.to_owned())).or_insert(next);
        if i == next {
            let thresholds = InputBucket::ALL.map(|b| *rule.thresholds(line, model, version, b.as_str()));
            self.series.push(Series { thresholds, slots: (0..BUCKETS * 24).map(|_| None).collect() });
        }
        self.last = Some((i, line.to_owned(), model.to_owned(), version.to_owned()));
        (i, bucket, slot)
    }
}

/// First pass: counts each stratum's ordinary rows by hash byte.
#[derive(Debug)]
pub struct Planner {
    rule: Rule,
    strata: Strata<Box<[u64; 256]>>,
}

impl Planner {
    pub fn new(rule: Rule) -> Planner {
        Planner { rule, strata: Strata::new() }
    }

    pub fn add(&mut self, row: &StoredRow<'_>) {
        let (series, bucket, slot) = self.strata.locate(&self.rule, row);
        let series = &mut self.strata.series[series];
        if self.rule.tail(row, &series.thresholds[bucket]).is_some() {
            return;
        }
        let byte = self.rule.hash_byte(row.request_id);
        series.slots[slot].get_or_insert_with(|| Box::new([0; 256]))[byte] += 1;
    }

    /// Each stratum's cut and weights.
    pub fn finish(self) -> Selector {
        let Planner { rule, strata, .. } = self;
        let base = rule.base_cut();
        let series = strata
            .series
            .into_iter()
            .map(|Series { thresholds, slots }| Series {
                thresholds,
                slots: slots
                    .into_iter()
                    .map(|slot| {
                        slot.map(|counts| {
                            let rows: u64 = counts.iter().sum();
                            let want = rows.min(((rule.base_rate * rows as f64).ceil() as u64).max(rule.min_per_stratum));
                            let mut cut = base;
                            let mut kept: u64 = counts[..cut].iter().sum();
                            while kept < want.max(1) && cut < 256 {
                                kept += counts[cut];
                                cut += 1;
                            }
                            Cut { cut, rows, kept, seen: 0 }
                        })
                    })
                    .collect(),
            })
            .collect();
        let strata = Strata { index: strata.index, last: None, series };
        Selector { rule, strata, summary: Summary::default() }
    }
}

/// A stratum's decision: keep rows whose hash byte is below `cut`.
#[derive(Debug, Clone, Copy)]
struct Cut {
    cut: usize,
    /// Ordinary rows of the stratum, and how many the cut keeps.
    rows: u64,
    kept: u64,
    /// Kept so far in the second pass.
    seen: u64,
}

/// What the archive of a day kept, per business line and reason: rows
/// kept and the rows they stand for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub kept: BTreeMap<String, BTreeMap<Reason, (u64, u64)>>,
}

impl Summary {
    pub fn add(&mut self, line: &str, reason: Reason, weight: u64) {
        let reasons = match self.kept.get_mut(line) {
            Some(reasons) => reasons,
            None => self.kept.entry(line.to_owned()).or_default(),
        };
        let counts = reasons.entry(reason).or_default();
        counts.0 += 1;
        counts.1 += weight;
    }

    /// (line, reason, rows kept, rows they stand for), for each reason a line kept rows for.
    pub fn entries(&self) -> impl Iterator<Item = (&str, Reason, u64, u64)> {
        self.kept.iter().flat_map(|(line, reasons)| reasons.iter().map(move |(r, (rows, weight))| (line.as_str(), *r, *rows, *weight)))
    }

    /// Rows kept, and the rows they stand for, over every line and reason.
    pub fn totals(&self) -> (u64, u64) {
        self.entries().fold((0, 0), |(k, w), (_, _, rows, weight)| (k + rows, w + weight))
    }
}

/// Second pass: decides each row, in the order the plan counted them.
#[derive(Debug)]
pub struct Selector {
    rule: Rule,
    strata: Strata<Cut>,
    summary: Summary,
}

impl Selector {
    /// `Some((reason, weight))` when the archive keeps `row`.
    pub fn select(&mut self, row: &StoredRow<'_>) -> Option<(Reason, u64)> {
        let (series, bucket, slot) = self.strata.locate(&self.rule, row);
        let series = &mut self.strata.series[series];
        let decision = match self.rule.tail(row, &series.thresholds[bucket]) {
            Some(reason) => Some((reason, 1)),
            None => {
                let byte = self.rule.hash_byte(row.request_id);
                // A stratum the plan did not see gets nothing: `finish` reports the difference.
                let slot = &mut series.slots[slot];
                match slot {
                    Some(c) if byte < c.cut => {
                        let (base, extra) = (c.rows / c.kept, c.rows % c.kept);
                        let weight = base + u64::from(c.seen < extra);
                        c.seen += 1;
                        Some((Reason::Sampled, weight))
                    }
                    Some(_) => None,
                    None => {
                        *slot = Some(Cut { cut: 0, rows: 0, kept: 0, seen: 1 });
                        None
                    }
                }
            }
        };
        if let Some((reason, weight)) = decision {
            self.summary.add(row.business_line, reason, weight);
        }
        decision
    }

    /// What was kept; an error naming a stratum whose kept rows differ from
    /// the plan's (the day's rows changed between the two passes).
    pub fn finish(self) -> Result<Summary, String> {
        for (series, Series { slots, .. }) in self.strata.series.iter().enumerate() {
            for (i, slot) in slots.iter().enumerate() {
                if let Some(c) = slot {
                    if c.seen != c.kept {
                        let name = self.strata.index.iter().find(|(_, v)| **v == series).map(|(k, _)| format!("{k:?}")).unwrap_or_default();
                        return Err(format!(
                            "stratum {name} input bucket {} hour {}: kept {} rows, the plan counted {}",
                            InputBucket::ALL[i / 24].as_str(),
                            i % 24,
                            c.seen,
                            c.kept
                        ));
                    }
                }
            }
        }
        Ok(self.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(id: &'a str, line: &'a str, hour: u64, latency: f64, error: i32) -> StoredRow<'a> {
        StoredRow {
            timestamp_ms: 1_764_028_800_000 + hour * 3_600_000,
            request_id: id,
            business_line: line,
            model_name: "m",
            model_version: "v1",
            input_tokens: 100,
            output_tokens: 50,
            total_latency_ms: latency,
            error_code: error,
            ttft_ms: Some(10.0),
            truncated: Some(0),
            ..StoredRow::example()
        }
    }

    fn run(rule: &Rule, rows: &[StoredRow<'_>]) -> (Vec<Option<(Reason, u64)>>, Summary) {
        let mut planner = Planner::new(rule.clone());
        rows.iter().for_each(|r| planner.add(r));
        let mut selector = planner.finish();
        let decisions = rows.iter().map(|r| selector.select(r)).collect();
        (decisions, selector.finish().expect("same rows"))
    }

    #[test]
    fn the_tail_is_kept_and_weights_add_up_to_each_stratums_rows() {
        let config = SamplingConfig { enabled: true, min_per_stratum: 5, ..SamplingConfig::default() };
        let rule = Rule::new(&config, &[]).expect("rule");
        let ids: Vec<String> = (0..5000).map(|i| format!("req-{i}")).collect();
        // Two lines, three hours each; every 50th row an error, every 70th slow.
        let rows: Vec<StoredRow<'_>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let line = if i % 7 == 0 { "small" } else { "big" };
                let latency = if i % 70 == 0 { 40_000.0 } else { 100.0 + i as f64 };
                row(id, line, (i % 3) as u64, latency, if i % 50 == 0 { 500 } else { 0 })
            })
            .collect();
        let (decisions, summary) = run(&rule, &rows);
        let mut per_stratum: HashMap<(&str, u64), (u64, u64)> = HashMap::new();
        for (r, d) in rows.iter().zip(&decisions) {
            let e = per_stratum.entry((r.business_line, r.timestamp_ms / 3_600_000)).or_default();
            e.0 += 1;
            if let Some((reason, w)) = d {
                e.1 += w;
                if r.error_code != 0 {
                    assert_eq!((*reason, *w), (Reason::Error, 1));
                }
            } else {
                assert!(r.error_code == 0 && r.total_latency_ms <= 30_000.0, "a tail row was dropped");
            }
        }
        for (stratum, (rows, weights)) in &per_stratum {
            assert_eq!(rows, weights, "{stratum:?}: the weights add up to the stratum's rows");
        }
        let kept = decisions.iter().flatten().count() as u64;
        assert_eq!(summary.totals(), (kept, rows.len() as u64));
        // About a tenth of the ordinary rows, plus the tail (100 errors, 72 slow, less overlap).
        assert!((550..800).contains(&kept), "kept {kept}");
    }

    #[test]
    fn small_strata_keep_their_floor_and_the_same_rows_twice() {
        let config = SamplingConfig { enabled: true, min_per_stratum: 20, ..SamplingConfig::default() };
        let rule = Rule::new(&config, &[]).expect("rule");
        let ids: Vec<String> = (0..30).map(|i| format!("x{i}")).collect();
        let rows: Vec<StoredRow<'_>> = ids.iter().map(|id| row(id, "tiny", 1, 5.0, 0)).collect();
        let (first, _) = run(&rule, &rows);
        let kept = first.iter().flatten().count();
        assert!((20..30).contains(&kept), "kept {kept} of 30 with a floor of 20");
        assert_eq!(first.iter().flatten().map(|(_, w)| w).sum::<u64>(), 30);
        let (second, _) = run(&rule, &rows);
        assert_eq!(first, second, "deterministic");
        let other = Rule::new(&SamplingConfig { seed: 7, ..config }, &[]).expect("rule");
        assert_ne!(run(&other, &rows).0, first, "another seed keeps other rows");
    }

    #[test]
    fn history_sets_a_groups_thresholds_when_it_has_enough_rows() {
        let config = SamplingConfig { enabled: true, min_history_rows: 100, ..SamplingConfig::default() };
        let group = |line: &str| (line.to_owned(), "m".to_owned(), "v1".to_owned(), "0-1k");
        let history = [
            GroupHistory { group: group("a"), total_rows: 500, total_quantile_ms: Some(800.0), ttft_rows: 50, ttft_quantile_ms: Some(90.0) },
            GroupHistory { group: group("b"), total_rows: 99, total_quantile_ms: Some(800.0), ttft_rows: 99, ttft_quantile_ms: Some(90.0) },
        ];
        let rule = Rule::new(&config, &history).expect("rule");
        let a = rule.thresholds("a", "m", "v1", "0-1k");
        assert_eq!((a.slow_total_latency_ms, a.slow_ttft_ms, a.source), (800.0, 5_000.0, Source::History));
        assert_eq!(rule.thresholds("b", "m", "v1", "0-1k"), &Thresholds::fixed(&config));
        let slow = row("s", "a", 0, 900.0, 0);
        assert_eq!(rule.tail(&slow, a), Some(Reason::Slow));
        assert_eq!(rule.tail(&slow, rule.thresholds("b", "m", "v1", "0-1k")), None);
    }

    /// The names a keep rule may not take are the built-in reasons' own.
    #[test]
    fn built_in_reasons_are_the_ones_keep_rules_may_not_name() {
        let names = [Reason::Error, Reason::Truncated, Reason::Slow, Reason::Long, Reason::Sampled, Reason::All].map(Reason::as_str);
        assert_eq!(names, crate::config::BUILT_IN_REASONS);
    }

    #[test]
    fn rows_that_change_between_the_passes_are_reported() {
        let rule = Rule::new(&SamplingConfig { enabled: true, base_rate: 1.0, ..SamplingConfig::default() }, &[]).expect("rule");
        let rows = [row("a", "x", 0, 1.0, 0), row("b", "x", 0, 1.0, 0)];
        let mut planner = Planner::new(rule);
        planner.add(&rows[0]);
        let mut selector = planner.finish();
        rows.iter().for_each(|r| {
            selector.select(r);
        });
        let err = selector.finish().expect_err("one more row than planned");
        assert!(err.contains("kept 2 rows, the plan counted 1"), "{err}");
    }
}
