//! The one fold from hot rows to aggregates. In: one UTC day's hot rows
//! ([`FoldRow`]), as the compactor streams them to the archive or the
//! report reads them from the hot tier. Out: [`Folded`]: per daily group
//! (business line × model × version × input bucket × output bucket) its
//! counts and mergeable histograms; per UTC hour × business line × model
//! × version its totals, busiest minute and duration histograms; the error
//! counts; and, when asked, each hashed user's requests and tokens and the
//! day's repeated prompts and output lengths ([`crate::model::waste`]) and
//! each hashed caller's load per hour ([`crate::model::callers`]).
//!
//! The compactor publishes a day's fold to Postgres and the report folds a
//! hot day with this same code, so a question has the same answer from
//! either tier by construction.
//!
//! Rows arrive in the table's key order (business line, model, version,
//! time), so a series is looked up once per run of rows and its hour once
//! per hour; a row in another order is counted the same, only slower.

use std::collections::HashMap;

use crate::cost::Usage;
use crate::model::callers::{CallerFold, Callers};
use crate::model::measures::{self, COUNT, DURATIONS};
use crate::model::stored::FoldRow;
use crate::model::waste::{Waste, WasteFold};
use inferlog_schema::histogram::{self, Histogram};
use inferlog_schema::{InputBucket, OutputBucket};

/// One histogram per measure (`None`: no row carried it).
pub type Histograms<const N: usize> = [Option<Histogram>; N];

/// A daily group's key: business line, model, version, input bucket, output bucket.
pub type GroupKey = (String, String, String, &'static str, &'static str);

/// One hour of one business line × model × version: its totals and busiest minute.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HourRow {
    /// Hours since 1970-01-01 00:00 UTC.
    pub hour: u64,
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_prefix_tokens: u64,
    /// Minutes since 1970-01-01 00:00 UTC of the busiest minute (most
    /// requests; the earliest of equals).
    pub peak_minute: u64,
    pub peak_minute_requests: u64,
    /// Input plus output tokens in the busiest minute.
    pub peak_minute_tokens: u64,
    /// Per minute of the hour (0..59): requests and input plus output tokens.
    #[serde(with = "minutes")]
    pub minutes: [(u64, u64); 60],
}

/// An hour's 60 minutes as a sequence (serde derives arrays up to 32).
mod minutes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(minutes: &[(u64, u64); 60], s: S) -> Result<S::Ok, S::Error> {
        minutes.as_slice().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[(u64, u64); 60], D::Error> {
        let v = Vec::<(u64, u64)>::deserialize(d)?;
        let n = v.len();
        v.try_into().map_err(|_| serde::de::Error::invalid_length(n, &"60 minutes"))
    }
}

impl HourRow {
    /// The hour's totals (hours do not count cache hits: 0).
    pub fn totals(&self) -> Totals {
        Totals {
            requests: self.requests,
            errors: self.errors,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cache_hits: 0,
            cache_prefix_tokens: self.cache_prefix_tokens,
        }
    }

    /// The token sums the hour is priced from.
    pub fn usage(&self) -> Usage {
        self.totals().usage()
    }

    /// Sets the busiest minute from `minutes`: the most requests, the
    /// earliest of equals.
    fn set_peak(&mut self) {
        let (peak, &(requests, tokens)) = self.minutes.iter().enumerate().rev().max_by_key(|(_, (requests, _))| *requests).unwrap_or((0, &(0, 0)));
        (self.peak_minute, self.peak_minute_requests, self.peak_minute_tokens) = (self.hour * 60 + peak as u64, requests, tokens);
    }

    /// Adds `other` (the same hour and series, other rows) and finds the
    /// busiest minute again.
    fn add(&mut self, other: &HourRow) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_prefix_tokens += other.cache_prefix_tokens;
        for (m, o) in self.minutes.iter_mut().zip(&other.minutes) {
            (m.0, m.1) = (m.0 + o.0, m.1 + o.1);
        }
        self.set_peak();
    }
}

/// An hour with its duration histograms in [`measures::durations`] order.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hour {
    pub row: HourRow,
    pub histograms: Histograms<DURATIONS>,
}

/// Failed requests of one business line × model × version × input bucket × code × stage.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ErrorRow {
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_bucket: String,
    pub error_code: i32,
    /// Empty when the request did not say.
    pub error_stage: String,
    pub errors: u64,
}

/// The additive figures of any set of requests: a daily group's as the
/// fold counts them, as ClickHouse counts them (the compactor's
/// `AggregateRow`), and the report's figures before their cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, derive_more::AddAssign)]
pub struct Totals {
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Requests the prefix cache served (`cache_hit` = 1).
    pub cache_hits: u64,
    pub cache_prefix_tokens: u64,
}

impl Totals {
    /// The token sums these totals are priced from.
    pub fn usage(&self) -> Usage {
        Usage {
            requests: self.requests,
            input_tokens: self.input_tokens,
            cached_input_tokens: self.cache_prefix_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

/// A daily group: its totals and a histogram per measure in
/// [`measures::MEASURES`] order.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    pub totals: Totals,
    pub histograms: Histograms<COUNT>,
}

/// A day's requests of one model × version × request type (the request
/// type `-` when a row names none): its totals and histograms. The
/// aggregates keep no request type: the report's `compare` reads these
/// from the days it folds rows of.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeGroup {
    pub model_name: String,
    pub model_version: String,
    pub request_type: String,
    pub group: Group,
}

impl Group {
    /// A group no row has been counted in yet.
    pub fn empty() -> Group {
        Group { totals: Totals::default(), histograms: std::array::from_fn(|_| None) }
    }

    /// Adds `other`'s totals and merges its histograms.
    pub fn add(&mut self, other: &Group) {
        self.totals += other.totals;
        merge_histograms(&mut self.histograms, &other.histograms);
    }
}

/// Merges each of `other`'s histograms into `into`'s.
fn merge_histograms<const N: usize>(into: &mut Histograms<N>, other: &Histograms<N>) {
    for (a, b) in into.iter_mut().zip(other) {
        if let Some(b) = b {
            a.get_or_insert_with(Histogram::new).merge(b);
        }
    }
}

/// One hashed user's use of a day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserUse {
    pub requests: u64,
    /// Input plus output tokens.
    pub tokens: u64,
}

/// What a day's rows fold into.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    /// Rows folded (the rows they stand for, when weighted).
    pub rows: u64,
    pub daily: HashMap<GroupKey, Group>,
    /// Ordered by hour, business line, model, version.
    pub hours: Vec<Hour>,
    /// Ordered by business line, model, version, input bucket, code, stage.
    pub errors: Vec<ErrorRow>,
    /// Per hashed user (only when the fold counts users).
    pub users: HashMap<String, UserUse>,
    /// Repeated prompts and output lengths (only when the fold counts waste).
    pub waste: Option<Waste>,
    /// Each line's hashed callers' load per hour (only when the fold counts callers).
    pub callers: Option<Callers>,
    /// Per model × version × request type, in that order (only when the fold counts request types).
    pub types: Option<Vec<TypeGroup>>,
    /// Per GPU (`None`: rows that name none), by GPU id (only when the fold counts GPUs).
    pub gpus: Option<Vec<(Option<u32>, Group)>>,
}

/// An hour row's place: its hour and series.
fn hour_key(r: &HourRow) -> (u64, &str, &str, &str) {
    (r.hour, &r.business_line, &r.model_name, &r.model_version)
}

/// An error row's place: its series, input bucket, code and stage.
fn error_key(r: &ErrorRow) -> (&str, &str, &str, &str, i32, &str) {
    (&r.business_line, &r.model_name, &r.model_version, &r.input_bucket, r.error_code, &r.error_stage)
}

type HourKey = (u64, String, String, String);
type ErrorKey = (String, String, String, String, i32, String);

impl Folded {
    /// Hours and errors in their documented order.
    fn sort(&mut self) {
        self.hours.sort_by(|a, b| hour_key(&a.row).cmp(&hour_key(&b.row)));
        self.errors.sort_by(|a, b| error_key(a).cmp(&error_key(b)));
    }
}

/// Units' folds merged into the day's: totals add, histograms merge
/// exactly, an hour two units share adds its minutes and finds its busiest
/// minute again, errors add. Each hour's and error's place is indexed once
/// for all the units, and the rows are sorted once, by [`FoldMerge::finish`].
#[derive(Debug, Default)]
pub struct FoldMerge {
    folded: Folded,
    hours: HashMap<HourKey, usize>,
    errors: HashMap<ErrorKey, usize>,
}

impl FoldMerge {
    pub fn add(&mut self, other: Folded) {
        debug_assert!(other.users.is_empty() && other.callers.is_none() && other.types.is_none() && other.gpus.is_none());
        let merged = &mut self.folded;
        merged.rows += other.rows;
        for (key, group) in other.daily {
            match merged.daily.get_mut(&key) {
                Some(g) => g.add(&group),
                None => {
                    merged.daily.insert(key, group);
                }
            }
        }
        for hour in other.hours {
            let (h, line, model, version) = hour_key(&hour.row);
            let key = (h, line.to_owned(), model.to_owned(), version.to_owned());
            match self.hours.get(&key) {
                Some(&i) => {
                    let h = &mut merged.hours[i];
                    h.row.add(&hour.row);
                    merge_histograms(&mut h.histograms, &hour.histograms);
                }
                None => {
                    self.hours.insert(key, merged.hours.len());
                    merged.hours.push(hour);
                }
            }
        }
        for e in other.errors {
            let (line, model, version, bucket, code, stage) = error_key(&e);
            let key = (line.to_owned(), model.to_owned(), version.to_owned(), bucket.to_owned(), code, stage.to_owned());
            match self.errors.get(&key) {
                Some(&i) => merged.errors[i].errors += e.errors,
                None => {
                    self.errors.insert(key, merged.errors.len());
                    merged.errors.push(e);
                }
            }
        }
        if let Some(o) = other.waste {
            merged.waste.get_or_insert_with(Waste::default).merge(o);
        }
    }

    /// The merged fold, its hours and errors in their documented order.
    pub fn finish(mut self) -> Folded {
        self.folded.sort();
        self.folded
    }
}

/// An hour being counted.
#[derive(Debug, Clone)]
struct HourCount {
    hour: u64,
    requests: u64,
    errors: u64,
    input_tokens: u64,
    output_tokens: u64,
    cache_prefix_tokens: u64,
    /// Per minute of the hour: requests and tokens.
    minutes: [(u64, u64); 60],
    histograms: Histograms<DURATIONS>,
}

/// One business line × model × version being counted.
#[derive(Debug, Default)]
struct Series {
    business_line: String,
    model_name: String,
    model_version: String,
    /// Per input × output bucket (`input * 5 + output`).
    daily: Vec<Option<Box<Group>>>,
    hours: Vec<HourCount>,
    /// The index in `hours` of the previous row's hour.
    last_hour: usize,
    /// (input bucket, code, stage or empty, errors); a handful per series.
    errors: Vec<(InputBucket, i32, String, u64)>,
}

/// The fold of one day's rows.
#[derive(Debug, Default)]
pub struct DayFold {
    series: Vec<Series>,
    /// The series of the previous row.
    last: Option<usize>,
    rows: u64,
    /// `Some` when the fold counts users.
    users: Option<HashMap<String, UserUse>>,
    /// `Some` when the fold counts waste.
    waste: Option<WasteFold>,
    /// `Some` when the fold counts callers.
    callers: Option<CallerFold>,
    /// `Some` when the fold counts request types; a handful per day.
    types: Option<Vec<TypeGroup>>,
    /// The index in `types` of the previous row's.
    last_type: usize,
    /// `Some` when the fold counts GPUs.
    gpus: Option<HashMap<Option<u32>, Group>>,
}

/// What a fold counts beyond the aggregates' groups, hours and errors:
/// each costs memory and time, so only the readers that show it ask.
/// Default: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    /// Each hashed user's use (the hot tier's per-user attribution; the
    /// aggregates keep no users).
    pub users: bool,
    /// Repeated prompts and output lengths ([`crate::model::waste`]: the
    /// report's `waste` view; the aggregates keep no prompts).
    pub waste: bool,
    /// Each hashed caller's load per hour ([`crate::model::callers`]: the
    /// report's `spikes` view).
    pub callers: bool,
    /// Each model × version × request type's totals and histograms
    /// ([`TypeGroup`]: the report's `compare`).
    pub types: bool,
    /// Each GPU's totals and histograms (the report's `diagnose`; the
    /// aggregates keep no GPU).
    pub gpus: bool,
}

impl DayFold {
    /// What the compactor publishes (`daily_aggregates`, `hourly_aggregates`,
    /// `daily_errors`, `daily_waste`): the groups, hours and errors, and the
    /// waste. A day, or each of its units, is folded this way.
    pub fn aggregates() -> DayFold {
        DayFold::counting(Extras { waste: true, ..Extras::default() })
    }

    /// A fold that also counts `extras`.
    pub fn counting(extras: Extras) -> DayFold {
        DayFold {
            users: extras.users.then(HashMap::new),
            waste: extras.waste.then(WasteFold::default),
            callers: extras.callers.then(CallerFold::default),
            types: extras.types.then(Vec::new),
            gpus: extras.gpus.then(HashMap::new),
            ..DayFold::default()
        }
    }

    /// The request-type group of `row`, when the fold counts them.
    fn type_group<'t>(types: &'t mut Option<Vec<TypeGroup>>, last: &mut usize, row: &FoldRow<'_>) -> Option<&'t mut Group> {
        let types = types.as_mut()?;
        let request_type = row.request_type_or_none();
        let same = |t: &TypeGroup| t.request_type == request_type && t.model_name == row.model_name && t.model_version == row.model_version;
        if !types.get(*last).is_some_and(same) {
            *last = types.iter().position(same).unwrap_or_else(|| {
                types.push(TypeGroup {
                    model_name: row.model_name.to_owned(),
                    model_version: row.model_version.to_owned(),
                    request_type: request_type.to_owned(),
                    group: Group::empty(),
                });
                types.len() - 1
            });
        }
        types.get_mut(*last).map(|t| &mut t.group)
    }

    fn series_of(&mut self, row: &FoldRow<'_>) -> usize {
        let same = |s: &Series| s.business_line == row.business_line && s.model_name == row.model_name && s.model_version == row.model_version;
        if let Some(i) = self.last.filter(|i| same(&self.series[*i])) {
            return i;
        }
        let i = self.series.iter().position(same).unwrap_or_else(|| {
            self.series.push(Series {
                business_line: row.business_line.to_owned(),
                model_name: row.model_name.to_owned(),
                model_version: row.model_version.to_owned(),
                daily: vec![None; InputBucket::ALL.len() * OutputBucket::ALL.len()],
                ..Series::default()
            });
            self.series.len() - 1
        });
        self.last = Some(i);
        i
    }

    /// Counts one row.
    pub fn add(&mut self, row: &FoldRow<'_>) {
        self.add_weighted(row, 1);
    }

    /// Counts one row as `weight` rows (an archived row of a sampled day
    /// stands for `sample_weight` requests).
    pub fn add_weighted(&mut self, row: &FoldRow<'_>, weight: u64) {
        let w = weight;
        self.rows += w;
        if let Some(waste) = self.waste.as_mut() {
            waste.add(row, w);
        }
        if let Some(callers) = self.callers.as_mut() {
            callers.add(row, w);
        }
        let s = self.series_of(row);
        let series = &mut self.series[s];
        let input_bucket = InputBucket::of(row.input_tokens);
        let slot = input_bucket as usize * OutputBucket::ALL.len() + OutputBucket::of(row.output_tokens) as usize;
        let daily = series.daily[slot].get_or_insert_with(|| Box::new(Group::empty()));

        let hour_number = row.timestamp_ms / 3_600_000;
        if series.hours.get(series.last_hour).is_none_or(|h| h.hour != hour_number) {
            series.last_hour = series.hours.iter().position(|h| h.hour == hour_number).unwrap_or_else(|| {
                series.hours.push(HourCount {
                    hour: hour_number,
                    requests: 0,
                    errors: 0,
                    input_tokens: 0,
                    output_tokens: 0,
                    cache_prefix_tokens: 0,
                    minutes: [(0, 0); 60],
                    histograms: std::array::from_fn(|_| None),
                });
                series.hours.len() - 1
            });
        }
        let hour = &mut series.hours[series.last_hour];
        let tokens = u64::from(row.input_tokens) + u64::from(row.output_tokens);
        let (errors, input, output) = (w * u64::from(row.error_code != 0), w * u64::from(row.input_tokens), w * u64::from(row.output_tokens));
        let cached = w * u64::from(row.cache_prefix_tokens.unwrap_or(0));
        hour.requests += w;
        hour.errors += errors;
        hour.input_tokens += input;
        hour.output_tokens += output;
        hour.cache_prefix_tokens += cached;
        let minute = &mut hour.minutes[((row.timestamp_ms / 60_000) % 60) as usize];
        minute.0 += w;
        minute.1 += w * tokens;
        // The row's group, and its request type's and GPU's when they are counted.
        let typed = DayFold::type_group(&mut self.types, &mut self.last_type, row);
        let gpu = self.gpus.as_mut().map(|gpus| gpus.entry(row.gpu_id).or_insert_with(Group::empty));
        let mut groups = [Some(&mut **daily), typed, gpu];
        for g in groups.iter_mut().flatten() {
            let t = &mut g.totals;
            t.requests += w;
            t.errors += errors;
            t.input_tokens += input;
            t.output_tokens += output;
            t.cache_hits += w * u64::from(row.cache_hit == Some(1));
            t.cache_prefix_tokens += cached;
        }

        for (m, value) in measures::of_row(row).into_iter().enumerate() {
            let Some(v) = value else { continue };
            // Each value's bucket once; a duration counts in every histogram it belongs to.
            let bucket = (v > 0.0).then(|| histogram::bucket(v));
            for g in groups.iter_mut().flatten() {
                g.histograms[m].get_or_insert_with(Histogram::new).add_bucket(bucket, w);
            }
            if let Some(h) = hour.histograms.get_mut(m) {
                h.get_or_insert_with(Histogram::new).add_bucket(bucket, w);
            }
        }

        if row.error_code != 0 {
            // A stage left out and an empty one are the same group, as in `daily_errors`.
            let stage = row.error_stage.unwrap_or("");
            match series.errors.iter_mut().find(|e| e.0 == input_bucket && e.1 == row.error_code && e.2 == stage) {
                Some(e) => e.3 += w,
                None => series.errors.push((input_bucket, row.error_code, stage.to_owned(), w)),
            }
        }

        if let (Some(users), Some(user)) = (self.users.as_mut(), row.user_id_hash.filter(|u| !u.is_empty())) {
            // Allocates for a user's first row only.
            if !users.contains_key(user) {
                users.insert(user.to_owned(), UserUse::default());
            }
            if let Some(u) = users.get_mut(user) {
                u.requests += w;
                u.tokens += w * tokens;
            }
        }
    }

    /// The day's groups, hours (each with its busiest minute) and errors.
    pub fn finish(self) -> Folded {
        let mut folded = Folded {
            rows: self.rows,
            users: self.users.unwrap_or_default(),
            waste: self.waste.map(WasteFold::finish),
            callers: self.callers.map(CallerFold::finish),
            types: self.types.map(|mut types| {
                types.sort_by(|a, b| (&a.model_name, &a.model_version, &a.request_type).cmp(&(&b.model_name, &b.model_version, &b.request_type)));
                types
            }),
            gpus: self.gpus.map(|gpus| {
                let mut gpus: Vec<_> = gpus.into_iter().collect();
                gpus.sort_by_key(|(id, _)| *id);
                gpus
            }),
            ..Folded::default()
        };
        for s in self.series {
            let key =
                |input: &'static str, output: &'static str| (s.business_line.clone(), s.model_name.clone(), s.model_version.clone(), input, output);
            for (slot, group) in s.daily.into_iter().enumerate() {
                let Some(group) = group else { continue };
                let (input, output) = (InputBucket::ALL[slot / OutputBucket::ALL.len()], OutputBucket::ALL[slot % OutputBucket::ALL.len()]);
                folded.daily.insert(key(input.as_str(), output.as_str()), *group);
            }
            for h in s.hours {
                let mut row = HourRow {
                    hour: h.hour,
                    business_line: s.business_line.clone(),
                    model_name: s.model_name.clone(),
                    model_version: s.model_version.clone(),
                    requests: h.requests,
                    errors: h.errors,
                    input_tokens: h.input_tokens,
                    output_tokens: h.output_tokens,
                    cache_prefix_tokens: h.cache_prefix_tokens,
                    peak_minute: 0,
                    peak_minute_requests: 0,
                    peak_minute_tokens: 0,
                    minutes: h.minutes,
                };
                row.set_peak();
                folded.hours.push(Hour { row, histograms: h.histograms });
            }
            for (input, code, stage, errors) in s.errors {
                folded.errors.push(ErrorRow {
                    business_line: s.business_line.clone(),
                    model_name: s.model_name.clone(),
                    model_version: s.model_version.clone(),
                    input_bucket: input.as_str().to_owned(),
                    error_code: code,
                    error_stage: stage,
                    errors,
                });
            }
        }
        folded.sort();
        folded
    }
}

#[cfg(test)]
mod tests {
    use rand::seq::SliceRandom;
    use rand::Rng;

    use super::*;
    use crate::model::stored::StoredRow;

    const HOUR_MS: u64 = 3_600_000;
    /// 2025-11-24 15:00 UTC, in hours since the epoch.
    const H: u64 = 490_383;

    fn row(line: &'static str, minute: u64, input: u32, output: u32, error: (i32, Option<&'static str>)) -> StoredRow<'static> {
        let mut r = StoredRow::example();
        r.business_line = line;
        r.timestamp_ms = H * HOUR_MS + minute * 60_000 + 17;
        (r.input_tokens, r.output_tokens) = (input, output);
        (r.error_code, r.error_stage) = error;
        r
    }

    #[test]
    fn rows_fold_into_groups_hours_busiest_minutes_and_errors() {
        let ok = (0, None);
        let rows = [
            row("search", 0, 10, 3, ok),
            row("search", 0, 2000, 3, (1003, Some("decode"))),
            row("chat", 1, 10, 3, ok), // another series between two runs of the first
            row("search", 5, 10, 200, (1003, None)),
            row("search", 5, 10, 3, (1003, Some(""))),
            row("search", 7, 10, 3, ok),
            row("search", 61, 10, 3, ok), // the next hour
        ];
        let mut fold = DayFold::counting(Extras { users: true, ..Extras::default() });
        for (i, r) in rows.iter().enumerate() {
            let user = ["u1", "u2", ""][i % 3];
            fold.add(&FoldRow { user_id_hash: Some(user), ..r.fold_row() });
        }
        let folded = fold.finish();
        assert_eq!(folded.rows, 7);

        let key = |line: &str, input: InputBucket, output: OutputBucket| {
            (line.to_owned(), "m".to_owned(), "v1".to_owned(), input.as_str(), output.as_str())
        };
        assert_eq!(folded.daily.len(), 4, "{:?}", folded.daily.keys());
        let small = &folded.daily[&key("search", InputBucket::UpTo1k, OutputBucket::UpTo128)];
        // Minutes 0, 5, 7 and 61 of search, one failed; every example row is a cache hit with a 4-token prefix.
        let totals = Totals { requests: 4, errors: 1, input_tokens: 40, output_tokens: 12, cache_hits: 4, cache_prefix_tokens: 16 };
        assert_eq!(small.totals, totals);
        let small = &small.histograms;
        assert_eq!(small[0].as_ref().map(Histogram::count), Some(4), "total latency of the four short requests");
        assert_eq!(small[1], None, "no request carried a TTFT");
        assert_eq!(small[6].as_ref().map(Histogram::count), Some(4), "cache prefix");
        assert_eq!(small[7], None, "no request reported GPU memory");
        assert!(folded.daily.contains_key(&key("search", InputBucket::UpTo2k, OutputBucket::UpTo128)));
        assert!(folded.daily.contains_key(&key("search", InputBucket::UpTo1k, OutputBucket::UpTo512)));
        assert!(folded.daily.contains_key(&key("chat", InputBucket::UpTo1k, OutputBucket::UpTo128)));

        let hours: Vec<(u64, &str, u64, u64, u64, u64, u64)> = folded
            .hours
            .iter()
            .map(|h| {
                let r = &h.row;
                (r.hour, r.business_line.as_str(), r.requests, r.errors, r.input_tokens, r.peak_minute, r.peak_minute_requests)
            })
            .collect();
        assert_eq!(
            hours,
            [
                (H, "chat", 1, 0, 10, H * 60 + 1, 1),
                // Minutes 0 and 5 both have two requests: the earlier one is the busiest.
                (H, "search", 5, 3, 2040, H * 60, 2),
                (H + 1, "search", 1, 0, 10, (H + 1) * 60 + 1, 1),
            ]
        );
        assert_eq!(folded.hours[1].row.peak_minute_tokens, 10 + 3 + 2000 + 3);
        assert_eq!(folded.hours[1].row.minutes.iter().map(|m| m.0).sum::<u64>(), folded.hours[1].row.requests, "every request in one minute");
        assert_eq!(folded.hours[1].row.cache_prefix_tokens, 5 * 4);
        assert_eq!(folded.hours[1].histograms[0].as_ref().map(Histogram::count), Some(5));
        assert_eq!(folded.hours[1].histograms[4], None, "no prefill time");

        let errors: Vec<(&str, i32, &str, u64)> =
            folded.errors.iter().map(|e| (e.input_bucket.as_str(), e.error_code, e.error_stage.as_str(), e.errors)).collect();
        // A missing stage and an empty one are one group.
        assert_eq!(errors, [("0-1k", 1003, "", 2), ("1k-2k", 1003, "decode", 1)]);

        // Rows 0, 3, 6 are u1's, rows 1, 4 u2's; an empty user is no user.
        assert_eq!(folded.users.len(), 2);
        assert_eq!(folded.users["u1"], UserUse { requests: 3, tokens: 13 + 210 + 13 });
        assert_eq!(folded.users["u2"], UserUse { requests: 2, tokens: 2003 + 13 });
        assert!(DayFold::default().finish().users.is_empty(), "users only when counted");
    }

    #[test]
    fn a_day_folded_in_units_and_merged_is_the_day_folded_whole() {
        use crate::model::waste::LineRepeats;
        let (seed, mut rng) = crate::model::seeded_rng();
        let lines = ["search", "chat", "ads"];
        let prompts = ["p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8"];
        let mut rows: Vec<StoredRow<'static>> = (0..3_000)
            .map(|_| {
                let error = if rng.gen_bool(0.1) { (rng.gen_range(1001..1004), [None, Some("decode")][rng.gen_range(0..2)]) } else { (0, None) };
                let mut r = row(lines[rng.gen_range(0..3)], rng.gen_range(0..180), rng.gen_range(0..40_000), rng.gen_range(0..10_000), error);
                r.total_latency_ms = rng.gen_range(0.0..600_000.0);
                r.ttft_ms = rng.gen_bool(0.8).then(|| rng.gen_range(0.0..5_000.0));
                r.prompt_hash = rng.gen_bool(0.7).then(|| prompts[rng.gen_range(0..prompts.len())]);
                r.max_tokens = rng.gen_bool(0.5).then(|| rng.gen_range(100..10_000));
                r.request_type = [None, Some("chat"), Some("code")][rng.gen_range(0..3)];
                r
            })
            .collect();
        rows.sort_by_key(|r| (r.business_line, r.timestamp_ms));
        let fold = |rows: &[StoredRow<'_>]| {
            let mut fold = DayFold::aggregates();
            rows.iter().for_each(|r| fold.add(&r.fold_row()));
            fold.finish()
        };
        let mut whole = fold(&rows);
        // Units: contiguous runs of the key order, cut anywhere (a line's
        // hour and a prompt's requests spread over several).
        let mut cuts: Vec<usize> = (0..5).map(|_| rng.gen_range(0..rows.len())).collect();
        cuts.extend([0, rows.len()]);
        cuts.sort_unstable();
        let mut merge = FoldMerge::default();
        for w in cuts.windows(2) {
            let unit = fold(&rows[w[0]..w[1]]);
            merge.add(Folded::from_record(&unit.record()).expect("the record decodes"));
        }
        let mut merged = merge.finish();
        let waste = whole.waste.as_mut().expect("waste counted");
        let repeats: HashMap<String, LineRepeats> = waste
            .lines
            .iter()
            .map(|(l, w)| {
                (l.clone(), LineRepeats { repeats: w.repeats, repeat_tokens: w.repeat_tokens, repeat_uncached_input: w.repeat_uncached_input })
            })
            .collect();
        assert!(repeats.values().all(|r| r.repeats > 0), "prompts repeat on every line");
        waste.repeated.clear();
        merged.waste.as_mut().expect("waste merged").set_repeats(&repeats);
        assert!(merged == whole, "seed {seed}: the merged units differ from the whole day");
    }

    #[test]
    fn the_order_of_rows_does_not_change_the_fold() {
        let (seed, mut rng) = crate::model::seeded_rng();
        let lines = ["search", "chat", "ads"];
        let stages = [None, Some(""), Some("decode"), Some("prefill")];
        let mut rows: Vec<StoredRow<'static>> = (0..2_000)
            .map(|_| {
                let error = if rng.gen_bool(0.2) { (rng.gen_range(1001..1004), stages[rng.gen_range(0..4)]) } else { (0, None) };
                let mut r = row(lines[rng.gen_range(0..3)], rng.gen_range(0..180), rng.gen_range(0..40_000), rng.gen_range(0..10_000), error);
                r.total_latency_ms = rng.gen_range(0.0..600_000.0);
                r.ttft_ms = rng.gen_bool(0.8).then(|| rng.gen_range(0.0..5_000.0));
                r.gpu_mem_peak_mb = rng.gen_bool(0.5).then(|| rng.gen_range(1.0..80_000.0));
                r.request_type = [None, Some(""), Some("chat"), Some("code")][rng.gen_range(0..4)];
                r.gpu_id = rng.gen_bool(0.9).then(|| rng.gen_range(0..8));
                r
            })
            .collect();
        rows.sort_by_key(|r| (r.business_line, r.timestamp_ms));
        let fold = |rows: &[StoredRow<'_>]| {
            let mut fold = DayFold::counting(Extras { types: true, gpus: true, ..Extras::default() });
            rows.iter().for_each(|r| fold.add(&r.fold_row()));
            fold.finish()
        };
        let in_key_order = fold(&rows);
        rows.shuffle(&mut rng);
        assert_eq!(fold(&rows), in_key_order, "seed {seed}");
        assert_eq!(in_key_order.hours.iter().map(|h| h.row.requests).sum::<u64>(), 2_000);
        assert_eq!(in_key_order.daily.values().map(|g| g.totals.requests).sum::<u64>(), 2_000);
        assert_eq!(in_key_order.daily.values().map(|g| g.histograms[0].as_ref().map_or(0, Histogram::count)).sum::<u64>(), 2_000);
        let types = in_key_order.types.as_ref().expect("types counted");
        assert_eq!(types.iter().map(|t| t.group.totals.requests).sum::<u64>(), 2_000, "every row in one request type");
        let errors: u64 = in_key_order.daily.values().map(|g| g.totals.errors).sum();
        assert_eq!(types.iter().map(|t| t.group.totals.errors).sum::<u64>(), errors);
        let gpus = in_key_order.gpus.as_ref().expect("GPUs counted");
        assert_eq!(gpus.iter().map(|(_, g)| g.totals.requests).sum::<u64>(), 2_000, "every row on one GPU or none");
        assert_eq!(gpus.iter().map(|(_, g)| g.totals.errors).sum::<u64>(), errors);
        for (id, g) in gpus {
            assert_eq!(g.totals.requests, rows.iter().filter(|r| r.gpu_id == *id).count() as u64, "GPU {id:?}");
        }
        for m in 0..COUNT {
            let by_group: u64 = in_key_order.daily.values().map(|g| g.histograms[m].as_ref().map_or(0, Histogram::count)).sum();
            assert_eq!(types.iter().map(|t| t.group.histograms[m].as_ref().map_or(0, Histogram::count)).sum::<u64>(), by_group, "measure {m}");
            assert_eq!(gpus.iter().map(|(_, g)| g.histograms[m].as_ref().map_or(0, Histogram::count)).sum::<u64>(), by_group, "measure {m}");
        }

        // A row of weight w folds as w copies of it, users included.
        let mut weighted = DayFold::counting(Extras { users: true, ..Extras::default() });
        let mut copies = DayFold::counting(Extras { users: true, ..Extras::default() });
        for (i, r) in rows.iter().enumerate() {
            let (w, r) = ((i % 4 + 1) as u64, r.fold_row());
            weighted.add_weighted(&r, w);
            (0..w).for_each(|_| copies.add(&r));
        }
        assert_eq!(weighted.finish(), copies.finish(), "seed {seed}");
    }
}
