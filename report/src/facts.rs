//! The tier-neutral facts every view is computed from. In: rows of either
//! tier (hot rows folded by the store's one fold, [`inferlog_store::model::fold`],
//! in [`crate::source::hot`], aggregate rows read by
//! [`crate::source::aggregates`]). Out: [`Facts`]: per day × business line
//! × model × version × input bucket × output bucket the counts, cost and
//! mergeable histograms; per hour the same with the busiest minute; error
//! counts; and, for hot days only, per hashed user the tokens.
//!
//! Both tiers reduce to the same groups with the same histograms
//! ([`inferlog_schema::histogram`]), so a question has the same answer
//! whichever tier holds its days.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use inferlog_schema::histogram::Histogram;
use inferlog_store::Day;
use serde::Serialize;

use inferlog_store::model::callers::HourLoad;
use inferlog_store::model::fold::{Group, Totals};
pub use inferlog_store::model::measures::{CACHE_PREFIX, DECODE, PREFILL, QUEUE, TOTAL, TPOT, TTFT};
use inferlog_store::model::measures::{COUNT, DURATIONS};
use inferlog_store::model::waste::Waste;

/// A group's histograms, one per measure ([`inferlog_store::model::measures::MEASURES`]).
pub type GroupHists = [Option<Histogram>; COUNT];
/// An hour's histograms: the durations.
pub type HourHists = [Option<Histogram>; DURATIONS];

/// Which tier answered a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// ClickHouse: every row of the day (full detail, hashed users included).
    Hot,
    /// Postgres: the day's aggregates (the hot rows are released).
    Aggregates,
    /// The cold archive: its rows, weighted (the aggregates are gone).
    Archive,
    /// No tier holds the day.
    None,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Hot => "hot",
            Tier::Aggregates => "aggregates",
            Tier::Archive => "archive",
            Tier::None => "none",
        }
    }
}

/// Additive figures of any set of requests: the fold's [`Totals`], then
/// what pricing them gave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counts {
    /// Requests, errors and tokens (cache hits are unknown for hours: 0 there).
    #[serde(flatten)]
    pub totals: Totals,
    /// USD of the priced requests.
    pub cost_usd: f64,
    /// Requests whose model had no price: their tokens count, their cost does not.
    pub unpriced_requests: u64,
}

impl From<Totals> for Counts {
    /// The counts of folded totals, not priced yet.
    fn from(totals: Totals) -> Counts {
        Counts { totals, ..Counts::default() }
    }
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        self.totals += other.totals;
        self.cost_usd += other.cost_usd;
        self.unpriced_requests += other.unpriced_requests;
    }

    /// Whether some of the requests were priced and some were not.
    pub fn partly_priced(&self) -> bool {
        self.unpriced_requests > 0 && self.unpriced_requests < self.totals.requests
    }

    /// The cost to show: `None` when requests were counted and none of
    /// them was priced (never a silent $0).
    pub fn cost(&self) -> Option<f64> {
        (self.unpriced_requests == 0 || self.partly_priced()).then_some(self.cost_usd)
    }

    /// Input plus output tokens.
    pub fn tokens(&self) -> u64 {
        self.totals.input_tokens + self.totals.output_tokens
    }

    /// The counts' usage, as the price table sees it.
    pub fn usage(&self) -> inferlog_store::cost::Usage {
        inferlog_store::cost::Usage {
            requests: self.totals.requests,
            input_tokens: self.totals.input_tokens,
            cached_input_tokens: self.totals.cache_prefix_tokens,
            output_tokens: self.totals.output_tokens,
        }
    }

    /// Prices the counts: `cost` is the price table's answer (`None`: unpriced).
    pub fn price(&mut self, cost: Option<f64>) {
        match cost {
            Some(usd) => self.cost_usd = usd,
            None => self.unpriced_requests = self.totals.requests,
        }
    }
}

/// Merges `from` into `into`, histogram by histogram.
pub fn merge_hists<const N: usize>(into: &mut [Option<Histogram>; N], from: &[Option<Histogram>; N]) {
    for (a, b) in into.iter_mut().zip(from) {
        if let Some(b) = b {
            a.get_or_insert_with(Histogram::new).merge(b);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub day: Day,
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_bucket: String,
    pub output_bucket: String,
}

#[cfg(test)]
impl GroupKey {
    /// A unit test's group (output bucket `0-128`).
    pub fn of(day: Day, business_line: &str, model_name: &str, model_version: &str, input_bucket: &str) -> GroupKey {
        GroupKey {
            day,
            business_line: business_line.into(),
            model_name: model_name.into(),
            model_version: model_version.into(),
            input_bucket: input_bucket.into(),
            output_bucket: "0-128".into(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupFacts {
    pub counts: Counts,
    pub hists: GroupHists,
}

impl From<Group> for GroupFacts {
    /// A folded group's counts (not priced yet) and histograms.
    fn from(g: Group) -> GroupFacts {
        GroupFacts { counts: Counts::from(g.totals), hists: g.histograms }
    }
}

/// A day's model × version × request type (`-`: none given).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TypeKey {
    pub day: Day,
    pub model_name: String,
    pub model_version: String,
    pub request_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HourKey {
    /// Hours since 1970-01-01 00:00 UTC.
    pub hour: i64,
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct HourFacts {
    pub counts: Counts,
    /// Minutes since the epoch of the busiest minute (most requests, the earliest of equals).
    pub peak_minute: i64,
    pub peak_minute_requests: u64,
    /// Input plus output tokens of the busiest minute.
    pub peak_minute_tokens: u64,
    /// Per minute of the hour: requests and tokens (`None`: aggregated
    /// before the aggregates kept minutes; only the busiest one is known).
    pub minutes: Option<[(u64, u64); 60]>,
    pub hists: HourHists,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ErrorKey {
    pub day: Day,
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    /// `*` for days aggregated before errors were counted per input bucket.
    pub input_bucket: String,
    pub error_code: i32,
    pub error_stage: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorFacts {
    /// The error dictionary's name of the code.
    pub name: String,
    pub errors: u64,
}

/// One hashed user's use (hot days only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserFacts {
    pub requests: u64,
    pub tokens: u64,
}

/// Requests two versions of a model both served (shadow traffic: one
/// `request_id`, two versions). Hot days only: the aggregates keep no
/// request ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pairs {
    /// Hot days read.
    pub days: usize,
    pub pairs: u64,
    /// Pairs only version A failed, and only version B.
    pub a_only_failed: u64,
    pub b_only_failed: u64,
    /// B − A of total latency (ms), over the pairs both versions served successfully.
    pub total_diffs: Vec<f64>,
    /// B − A of TTFT (ms), over those of them where both carry it.
    pub ttft_diffs: Vec<f64>,
}

/// Everything known about the days asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    /// Each day of the range and the tier that answered it, oldest first.
    pub tiers: Vec<(Day, Tier)>,
    pub groups: BTreeMap<GroupKey, GroupFacts>,
    pub hours: BTreeMap<HourKey, HourFacts>,
    pub errors: BTreeMap<ErrorKey, ErrorFacts>,
    /// Per hashed user, per day (hot days only: the aggregates keep no users).
    pub users: HashMap<(Day, String), UserFacts>,
    /// What the reader must know about how the facts were read (a tier that did not answer).
    pub notes: Vec<String>,
    /// The requests two compared versions both served (read for `compare` only).
    pub pairs: Option<Pairs>,
    /// Per day read from rows (hot, archive): repeated prompts and output
    /// lengths (read for `waste` and the page only; the aggregates keep no prompts).
    pub waste: BTreeMap<Day, Waste>,
    /// Per hot day, business line and hashed caller: requests and tokens in
    /// each hour of the day (read for `spikes` and the page only).
    pub callers: HashMap<(Day, String, String), HourLoad>,
    /// Per day read from rows (hot, archive), model, version and request
    /// type: counts and histograms (read for `compare` and the page only;
    /// the aggregates keep no request type).
    pub types: BTreeMap<TypeKey, GroupFacts>,
    /// Per day read from rows (hot, archive) and GPU (`None`: requests that
    /// named none): counts and histograms (read for `diagnose` and the
    /// page only; the aggregates keep no GPU).
    pub gpus: BTreeMap<(Day, Option<u32>), GroupFacts>,
}

impl Facts {
    /// The tier of `day` (`None` outside the range loaded).
    pub fn tier(&self, day: Day) -> Tier {
        self.tiers.iter().find(|(d, _)| *d == day).map_or(Tier::None, |(_, t)| *t)
    }

    /// Minutes of `range`'s answered days (a tier holds them) that have
    /// passed at `now_ms`: a rate per minute counts no minute of a day no
    /// tier holds. `None` when no day is answered.
    pub fn answered_minutes(&self, range: crate::range::Range, now_ms: i64) -> Option<f64> {
        let ms: i64 = range
            .iter()
            .filter(|d| self.tier(*d) != Tier::None)
            .map(|d| {
                let start = i64::from(d) * 86_400_000;
                ((start + 86_400_000).min(now_ms) - start).max(0)
            })
            .sum();
        (ms > 0).then(|| ms as f64 / 60_000.0)
    }

    /// Days of `range` no tier holds.
    pub fn missing_days(&self, range: crate::range::Range) -> usize {
        range.iter().filter(|d| self.tier(*d) == Tier::None).count()
    }

    /// These facts without those of `days` (a day to be read from another tier).
    pub fn without_days(mut self, days: &BTreeSet<Day>) -> Facts {
        self.tiers.retain(|(d, _)| !days.contains(d));
        self.groups.retain(|k, _| !days.contains(&k.day));
        self.hours.retain(|k, _| !days.contains(&(k.hour.div_euclid(24) as Day)));
        self.errors.retain(|k, _| !days.contains(&k.day));
        self.users.retain(|(d, _), _| !days.contains(d));
        self.waste.retain(|d, _| !days.contains(d));
        self.callers.retain(|(d, _, _), _| !days.contains(d));
        self.types.retain(|k, _| !days.contains(&k.day));
        self.gpus.retain(|(d, _), _| !days.contains(d));
        self
    }

    /// Merges the facts of one tier's days into these.
    pub fn absorb(&mut self, other: Facts) {
        self.tiers.extend(other.tiers);
        self.tiers.sort_by_key(|(d, _)| *d);
        for (k, v) in other.groups {
            let g = self.groups.entry(k).or_default();
            g.counts.add(&v.counts);
            merge_hists(&mut g.hists, &v.hists);
        }
        self.hours.extend(other.hours);
        for (k, v) in other.errors {
            let e = self.errors.entry(k).or_default();
            e.errors += v.errors;
            e.name = v.name;
        }
        self.users.extend(other.users);
        self.waste.extend(other.waste);
        self.callers.extend(other.callers);
        self.types.extend(other.types);
        self.gpus.extend(other.gpus);
        self.notes.extend(other.notes);
    }
}

/// The counts and merged histograms of a set of groups.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub counts: Counts,
    pub hists: GroupHists,
}

impl Summary {
    pub fn of<'a>(groups: impl IntoIterator<Item = &'a GroupFacts>) -> Summary {
        let mut s = Summary::default();
        for g in groups {
            s.add(g);
        }
        s
    }

    pub fn add(&mut self, g: &GroupFacts) {
        self.counts.add(&g.counts);
        merge_hists(&mut self.hists, &g.hists);
    }

    /// The `q`-quantile of histogram `measure` (`None`: no request carried it).
    pub fn quantile(&self, measure: usize, q: f64) -> Option<f64> {
        self.hists[measure].as_ref().and_then(|h| h.quantile(q))
    }

    /// Successful requests over all requests (`None` without requests).
    pub fn success_rate(&self) -> Option<f64> {
        (self.counts.totals.requests > 0).then(|| 1.0 - self.counts.totals.errors as f64 / self.counts.totals.requests as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(requests: u64, values: &[f64]) -> GroupFacts {
        let mut h = Histogram::new();
        for v in values {
            h.add(*v);
        }
        let mut g = GroupFacts {
            counts: Counts { totals: Totals { requests, errors: 1, ..Totals::default() }, cost_usd: 0.5, ..Counts::default() },
            ..GroupFacts::default()
        };
        g.hists[TTFT] = Some(h);
        g
    }

    #[test]
    fn summaries_add_counts_and_merge_histograms() {
        let s = Summary::of([&group(2, &[10.0, 20.0]), &group(2, &[30.0, 40.0]), &GroupFacts::default()]);
        assert_eq!(s.counts.totals.requests, 4);
        assert_eq!(s.counts.totals.errors, 2);
        assert!((s.counts.cost_usd - 1.0).abs() < 1e-12);
        assert_eq!(s.success_rate(), Some(0.5));
        let p50 = s.quantile(TTFT, 0.5).expect("ttft");
        assert!((p50 - 30.0).abs() <= 0.3, "floor rank of 4 values at 0.5 is the third: {p50}");
        assert_eq!(s.quantile(TPOT, 0.5), None, "no request carried it");
        assert_eq!(Summary::default().success_rate(), None);
    }

    #[test]
    fn answered_minutes_count_held_days_up_to_now() {
        let f = Facts { tiers: vec![(10, Tier::Aggregates), (11, Tier::None), (12, Tier::Hot)], ..Facts::default() };
        let range = crate::range::Range { from: 10, to: 12 };
        assert_eq!(f.answered_minutes(range, i64::MAX), Some(2880.0), "day 11 is held by no tier");
        let noon = (12 * 86_400 + 12 * 3600) * 1000;
        assert_eq!(f.answered_minutes(range, noon), Some(1440.0 + 720.0), "today counts up to now");
        assert_eq!(f.answered_minutes(crate::range::Range { from: 11, to: 11 }, i64::MAX), None);
    }

    #[test]
    fn unpriced_counts_keep_their_tokens() {
        let mut c = Counts { totals: Totals { requests: 3, input_tokens: 10, output_tokens: 5, ..Totals::default() }, ..Counts::default() };
        c.price(None);
        assert_eq!((c.unpriced_requests, c.cost_usd, c.tokens()), (3, 0.0, 15));
        assert_eq!(c.cost(), None, "nothing priced: no cost, not $0");
        c.price(Some(2.0));
        assert_eq!(c.cost_usd, 2.0);
    }
}
