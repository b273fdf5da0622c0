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
//!   when the seeded XXH64 of its `request_id` is below the stratum's cut
//!   ([`Method`]). The cut is `base_rate` × 2^64, raised to the stratum's
//!   `min_per_stratum` smallest hashes where it would keep fewer (all its
//!   ordinary rows where it has fewer).
//! - Weights are integers: a stratum of `n` ordinary rows that keeps `k`
//!   gives each kept row `n / k`, and the first `n % k` kept rows (in the
//!   order the archive reads them) one more, so the weights of a stratum add
//!   up to `n` exactly, and `sum(sample_weight)` over any set of strata is
//!   the exact row count.
//!
//! Deciding needs each stratum's counts first, so a day is read twice: a
//! [`Planner`] counts every stratum's rows and keeps its few smallest
//! hashes (a bounded map, whatever the day's size), then a [`Selector`]
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

/// How a day's ordinary rows are picked; recorded with the day
/// (`sampling_days.method`), so a day is derived again as it was archived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Days recorded before 2026-12-05: the top byte of the hash against a
    /// cut of `base_rate` rounded up to 1/256, raised byte by byte until the
    /// stratum keeps `max(ceil(base_rate × n), min_per_stratum)` of its `n`
    /// ordinary rows.
    HashByte = 1,
    /// The whole 64-bit hash against `base_rate` × 2^64, so a stratum keeps
    /// `base_rate` of its ordinary rows on average, not up to 1/256 more;
    /// raised to the stratum's `min_per_stratum` smallest hashes only where
    /// it would keep fewer (all of them where it has fewer).
    Hash64 = 2,
}

impl Method {
    /// The method new days are recorded with.
    pub const CURRENT: Method = Method::Hash64;

    pub fn from_code(code: i16) -> Result<Method, StoreError> {
        match code {
            1 => Ok(Method::HashByte),
            2 => Ok(Method::Hash64),
            other => Err(StoreError::Config(format!("unknown sampling method {other} in the catalog"))),
        }
    }

    pub const fn code(self) -> i16 {
        self as i16
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
    pub method: Method,
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
        Ok(Rule {
            method: Method::CURRENT,
            base_rate: config.base_rate,
            min_per_stratum: config.min_per_stratum,
            seed: config.seed,
            groups,
            fixed,
            keep,
        })
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

    /// The rank of `request_id` among its stratum's rows: the seeded hash,
    /// or its top byte (0..=255) for [`Method::HashByte`].
    pub fn rank(&self, request_id: &str) -> u64 {
        let hash = twox_hash::XxHash64::oneshot(self.seed, request_id.as_bytes());
        match self.method {
            Method::HashByte => hash >> 56,
            Method::Hash64 => hash,
        }
    }

    /// The cut `base_rate` gives: a row is kept when its rank is below it.
    fn base_cut(&self) -> u128 {
        match self.method {
            Method::HashByte => ((self.base_rate * 256.0).ceil() as u128).clamp(1, 256),
            Method::Hash64 => ((self.base_rate * 2f64.powi(64)).ceil() as u128).clamp(1, 1 << 64),
        }
    }

    /// How many ordinary rows a stratum of `rows` ordinary ones keeps at
    /// least. Its tail rows do not count: they say nothing of its body.
    fn floor(&self, rows: u64) -> u64 {
        let floor = match self.method {
            Method::HashByte => ((self.base_rate * rows as f64).ceil() as u64).max(self.min_per_stratum),
            Method::Hash64 => self.min_per_stratum,
        };
        floor.max(1).min(rows)
    }

    /// Smallest ranks a stratum's plan must hold to find its floor.
    fn ranks_held(&self) -> u64 {
        match self.method {
            // Every byte: the floor grows with the stratum (256 keys at most).
            Method::HashByte => u64::MAX,
            Method::Hash64 => self.min_per_stratum.max(1),
        }
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

/// A stratum's counts in the first pass.
#[derive(Debug, Default)]
struct Count {
    /// Ordinary rows, and those ranked below the base cut.
    rows: u64,
    below_base: u64,
    /// The smallest ranks and how often each came: the fewest whose counts
    /// reach [`Rule::ranks_held`].
    smallest: BTreeMap<u64, u64>,
    held: u64,
}

impl Count {
    fn add(&mut self, rank: u64, base: u128, limit: u64) {
        self.rows += 1;
        self.below_base += u64::from(u128::from(rank) < base);
        if self.held >= limit && self.smallest.last_key_value().is_some_and(|(top, _)| rank > *top) {
            return;
        }
        *self.smallest.entry(rank).or_default() += 1;
        self.held += 1;
        // Drop the largest rank while the others alone still reach the limit.
        while let Some((&top, &n)) = self.smallest.last_key_value() {
            if self.held - n < limit {
                break;
            }
            self.smallest.remove(&top);
            self.held -= n;
        }
    }

    /// The stratum's cut: the base one, or just above the rank that makes
    /// the floor; and the ordinary rows it keeps.
    fn cut(&self, rule: &Rule, base: u128) -> Cut {
        let floor = rule.floor(self.rows);
        let (cut, kept) = if self.below_base >= floor {
            (base, self.below_base)
        } else {
            let mut kept = 0;
            let top = self.smallest.iter().find(|(_, n)| {
                kept += **n;
                kept >= floor
            });
            (top.map_or(base, |(rank, _)| u128::from(*rank) + 1), kept)
        };
        Cut { cut, rows: self.rows, kept, seen: 0 }
    }
}

/// First pass: counts each stratum's rows and holds its smallest ranks.
#[derive(Debug)]
pub struct Planner {
    rule: Rule,
    base: u128,
    limit: u64,
    strata: Strata<Count>,
}

impl Planner {
    pub fn new(rule: Rule) -> Planner {
        Planner { base: rule.base_cut(), limit: rule.ranks_held(), rule, strata: Strata::new() }
    }

    pub fn add(&mut self, row: &StoredRow<'_>) {
        let (series, bucket, slot) = self.strata.locate(&self.rule, row);
        let series = &mut self.strata.series[series];
        if self.rule.tail(row, &series.thresholds[bucket]).is_some() {
            return;
        }
        series.slots[slot].get_or_insert_with(Count::default).add(self.rule.rank(row.request_id), self.base, self.limit);
    }

    /// Each stratum's cut and weights.
    pub fn finish(self) -> Selector {
        let Planner { rule, base, strata, .. } = self;
        let series = strata
            .series
            .into_iter()
            .map(|Series { thresholds, slots }| Series {
                thresholds,
                slots: slots.into_iter().map(|slot| slot.map(|count| count.cut(&rule, base))).collect(),
            })
            .collect();
        let strata = Strata { index: strata.index, last: None, series };
        Selector { rule, strata, summary: Summary::default() }
    }
}

/// A stratum's decision: keep ordinary rows ranked below `cut`.
#[derive(Debug, Clone, Copy)]
struct Cut {
    cut: u128,
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
                let rank = u128::from(self.rule.rank(row.request_id));
                // A stratum the plan did not see gets nothing: `finish` reports the difference.
                let slot = &mut series.slots[slot];
                match slot {
                    Some(c) if rank < c.cut => {
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
            prompt_hash: None,
            max_tokens: None,
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
        assert_eq!(kept, 20, "kept {kept} of 30 with a floor of 20");
        assert_eq!(first.iter().flatten().map(|(_, w)| w).sum::<u64>(), 30);
        let (second, _) = run(&rule, &rows);
        assert_eq!(first, second, "deterministic");
        let other = Rule::new(&SamplingConfig { seed: 7, ..config }, &[]).expect("rule");
        assert_ne!(run(&other, &rows).0, first, "another seed keeps other rows");
    }

    #[test]
    fn the_floor_is_of_ordinary_rows_and_takes_the_smallest_hashes() {
        let config = SamplingConfig { enabled: true, base_rate: 0.01, min_per_stratum: 5, ..SamplingConfig::default() };
        let rule = Rule::new(&config, &[]).expect("rule");
        let ids: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
        // Hour 0: 3 errors and 20 ordinary rows; hour 1: 6 errors and 11 ordinary rows.
        let rows: Vec<StoredRow<'_>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| match i {
                0..3 => row(id, "l", 0, 5.0, 500),
                3..23 => row(id, "l", 0, 5.0, 0),
                23..29 => row(id, "l", 1, 5.0, 500),
                _ => row(id, "l", 1, 5.0, 0),
            })
            .collect();
        let (decisions, _) = run(&rule, &rows);
        let sampled = |hour: u64| -> Vec<u64> {
            rows.iter()
                .zip(&decisions)
                .filter(|(r, d)| r.timestamp_ms / 3_600_000 % 24 == hour && matches!(d, Some((Reason::Sampled, _))))
                .map(|(_, d)| d.expect("kept").1)
                .collect()
        };
        // Five ordinary rows each, whatever the tail: 20 = 5 × 4; 11 = 3 + 4 × 2.
        assert_eq!(sampled(0), vec![4; 5]);
        assert_eq!(sampled(1), vec![3, 2, 2, 2, 2]);
        // The kept ones are the smallest hashes.
        let mut ranks: Vec<(u64, bool)> = rows[3..23].iter().zip(&decisions[3..23]).map(|(r, d)| (rule.rank(r.request_id), d.is_some())).collect();
        ranks.sort();
        assert!(ranks[..5].iter().all(|r| r.1) && ranks[5..].iter().all(|r| !r.1), "{ranks:?}");
    }

    /// A day recorded with [`Method::HashByte`] keeps the rows it kept
    /// before `Method::Hash64`: the old rule, written out here on its own.
    #[test]
    fn days_recorded_with_the_byte_method_keep_the_same_rows() {
        let config = SamplingConfig { enabled: true, base_rate: 0.1, min_per_stratum: 7, ..SamplingConfig::default() };
        let rule = Rule { method: Method::HashByte, ..Rule::new(&config, &[]).expect("rule") };
        // Strata of 125 to 250 rows, where ceil(rate × n) is the floor, and of 5, under `min_per_stratum`.
        let ids: Vec<String> = (0..9000).map(|i| format!("old-{i}")).collect();
        let rows: Vec<StoredRow<'_>> = ids
            .iter()
            .enumerate()
            .map(
                |(i, id)| {
                    if i < 8880 {
                        row(id, ["a", "b", "c"][i % 3], (i % 40) as u64 % 24, 5.0, 0)
                    } else {
                        row(id, "d", (i % 24) as u64, 5.0, 0)
                    }
                },
            )
            .collect();
        let (decisions, _) = run(&rule, &rows);
        let byte = |r: &StoredRow<'_>| (twox_hash::XxHash64::oneshot(0, r.request_id.as_bytes()) >> 56) as usize;
        let mut counts: HashMap<(&str, u64), [u64; 256]> = HashMap::new();
        rows.iter().for_each(|r| counts.entry((r.business_line, r.timestamp_ms / 3_600_000 % 24)).or_insert([0; 256])[byte(r)] += 1);
        for (r, d) in rows.iter().zip(&decisions) {
            let c = &counts[&(r.business_line, r.timestamp_ms / 3_600_000 % 24)];
            let n: u64 = c.iter().sum();
            let want = n.min(((0.1 * n as f64).ceil() as u64).max(7));
            let (mut cut, mut kept) = (26, c[..26].iter().sum::<u64>());
            while kept < want {
                kept += c[cut];
                cut += 1;
            }
            assert_eq!(d.is_some(), byte(r) < cut, "{}", r.request_id);
        }
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
