//! Aggregate stage. In: one closed day of hot rows (retries collapsed).
//! Out: [`DayAggregates`], computed in ClickHouse: the day's groups, its
//! hours and its error counts, which [`crate::publish`] writes to Postgres.
//!
//! Daily groups: business line × model × version × input bucket × output
//! bucket. Percentiles are computed with `quantilesExact`: exact, the value
//! at 0-based position floor(q·n) of the group's n sorted values (nearest
//! rank; NULL when no request of the group carried the field). Beside them,
//! each measure's mergeable histogram ([`inferlog_schema::histogram`]).
//!
//! Hourly groups: UTC hour × business line × model × version, with the
//! latency histograms and the busiest minute (most requests; the earliest
//! of equals) with its requests and tokens.
//!
//! Both kinds of histograms come from one pass: ClickHouse streams each
//! row's two group ids and its measures, and the reference implementation
//! ([`Histogram::add`]) counts them here. (Counting 14 measures per row in
//! a ClickHouse GROUP BY spends most of its time in a hash table of a
//! million sparse hourly buckets; here each group's buckets are one
//! dense array.)

use std::collections::HashMap;

use clickhouse::Row;
use inferlog_schema::histogram::{self, Histogram};
use inferlog_schema::{InputBucket, OutputBucket};
use inferlog_store::cost::Usage;
use inferlog_store::hot::{HotTier, ReadMode};
use inferlog_store::Day;
use serde::Deserialize;

use crate::error::CompactorError;

/// The durations with percentiles, as (ClickHouse column, Postgres column prefix).
pub const DURATIONS: [(&str, &str); 6] = [
    ("total_latency_ms", "total_latency"),
    ("ttft_ms", "ttft"),
    ("tpot_ms", "tpot"),
    ("queue_wait_ms", "queue_wait"),
    ("prefill_time_ms", "prefill"),
    ("decode_time_ms", "decode"),
];

/// The percentile levels stored.
pub const LEVELS: [f64; 3] = [0.5, 0.95, 0.99];

/// The measures with a mergeable histogram besides [`DURATIONS`]: how much
/// of each prompt the cache served (tokens) and the peak GPU memory (MB),
/// as (ClickHouse expression, Postgres column prefix).
const OTHER_HISTOGRAMS: [(&str, &str); 2] = [("toFloat64(cache_prefix_tokens)", "cache_prefix"), ("gpu_mem_peak_mb", "gpu_mem")];

/// How many measures have a histogram.
pub const MEASURES: usize = DURATIONS.len() + OTHER_HISTOGRAMS.len();

/// Every measure with a histogram, in column order: the durations, then
/// [`OTHER_HISTOGRAMS`].
pub fn histograms() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    DURATIONS.iter().chain(OTHER_HISTOGRAMS.iter())
}

/// One group of `daily_aggregates` as ClickHouse returns it.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct AggregateRow {
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_bucket: String,
    pub output_bucket: String,
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_hits: u64,
    pub cache_prefix_tokens: u64,
    // Per duration, in [`DURATIONS`] order: how many rows carried it (RowBinary is positional, so one field each).
    pub present_total: u64,
    pub present_ttft: u64,
    pub present_tpot: u64,
    pub present_queue: u64,
    pub present_prefill: u64,
    pub present_decode: u64,
    // ... and its p50/p95/p99.
    pub q_total: Vec<f64>,
    pub q_ttft: Vec<f64>,
    pub q_tpot: Vec<f64>,
    pub q_queue: Vec<f64>,
    pub q_prefill: Vec<f64>,
    pub q_decode: Vec<f64>,
    // Peak GPU memory: rows that reported it, its p50 and p99, its maximum.
    pub present_gpu_mem: u64,
    pub q_gpu_mem: Vec<f64>,
    pub max_gpu_mem: f64,
    /// [`group_id_sql`]: joins the group to its histograms.
    pub group_id: u64,
}

impl AggregateRow {
    /// The token sums the group is priced from.
    pub fn usage(&self) -> Usage {
        Usage {
            requests: self.requests,
            input_tokens: self.input_tokens,
            cached_input_tokens: self.cache_prefix_tokens,
            output_tokens: self.output_tokens,
        }
    }

    /// Per duration in [`DURATIONS`] order: (rows that carried it, its quantiles at [`LEVELS`]).
    pub fn durations(&self) -> [(u64, &[f64]); 6] {
        [
            (self.present_total, &self.q_total),
            (self.present_ttft, &self.q_ttft),
            (self.present_tpot, &self.q_tpot),
            (self.present_queue, &self.q_queue),
            (self.present_prefill, &self.q_prefill),
            (self.present_decode, &self.q_decode),
        ]
    }
}

#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct ErrorRow {
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_bucket: String,
    pub error_code: i32,
    pub error_stage: String,
    pub errors: u64,
}

/// One hourly group as ClickHouse returns it.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
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
    /// Minutes since 1970-01-01 00:00 UTC of the busiest minute.
    pub peak_minute: u64,
    pub peak_minute_requests: u64,
    /// Input plus output tokens in the busiest minute.
    pub peak_minute_tokens: u64,
    /// [`hour_id_sql`]: joins the hour to its histograms.
    pub group_id: u64,
}

impl HourRow {
    /// The token sums the hour is priced from.
    pub fn usage(&self) -> Usage {
        Usage {
            requests: self.requests,
            input_tokens: self.input_tokens,
            cached_input_tokens: self.cache_prefix_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

/// One hour of one business line × model × version, with its duration
/// histograms in [`DURATIONS`] order.
#[derive(Debug, Clone, PartialEq)]
pub struct Hour {
    pub row: HourRow,
    pub histograms: [Option<Histogram>; DURATIONS.len()],
}

/// Everything the aggregate stage computes for one day.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DayAggregates {
    pub groups: Vec<Group>,
    pub hours: Vec<Hour>,
    pub errors: Vec<ErrorRow>,
}

/// One row's histogram inputs: its daily and hourly group ids, and its
/// measures in [`histograms`] order (`None`: the request did not carry it).
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
struct MeasureRow {
    day_group: u64,
    hour_group: u64,
    measures: [Option<f64>; MEASURES],
}

/// One group of the day: its counts and exact percentiles, and per measure
/// in [`histograms`] order its histogram (`None` when no row carried it).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub row: AggregateRow,
    pub histograms: [Option<Histogram>; MEASURES],
}

/// `multiIf` mapping `column` to buckets given as (label, lowest value).
fn bucket_sql(column: &str, buckets: &[(&str, u32)]) -> String {
    let mut sql = String::from("multiIf(");
    for pair in buckets.windows(2) {
        sql.push_str(&format!("{column} < {}, '{}', ", pair[1].1, pair[0].0));
    }
    sql.push_str(&format!("'{}')", buckets[buckets.len() - 1].0));
    sql
}

/// The input- and output-length bucket expressions of the contract.
fn length_buckets_sql() -> (String, String) {
    let input: Vec<(&str, u32)> = InputBucket::ALL.iter().map(|b| (b.as_str(), b.lower_bound())).collect();
    let output: Vec<(&str, u32)> = OutputBucket::ALL.iter().map(|b| (b.as_str(), b.lower_bound())).collect();
    (bucket_sql("input_tokens", &input), bucket_sql("output_tokens", &output))
}

/// An id of the row's group (business line, model, version, input and
/// output bucket): a hash, the same expression in both queries. The
/// histograms are counted per id rather than per five strings.
fn group_id_sql() -> String {
    let (input, output) = length_buckets_sql();
    format!("cityHash64(business_line, model_name, model_version, {input}, {output})")
}

/// The UTC hour of a row, as hours since the epoch (independent of the
/// server's time zone).
const HOUR_SQL: &str = "intDiv(timestamp_ms, 3600000)";

/// An id of the row's hourly group (hour, business line, model, version).
fn hour_id_sql() -> String {
    format!("cityHash64({HOUR_SQL}, business_line, model_name, model_version)")
}

/// Per hour × business line × model × version: the sums, and the busiest
/// minute from per-minute counts (ties go to the earliest minute: the key
/// orders by requests, then by 59 minus the minute of the hour).
fn hourly_sql(table: &str, mode: ReadMode) -> String {
    format!(
        "SELECT hour, business_line, model_name, model_version, sum(n) AS requests, sum(minute_errors) AS errors, \
         sum(minute_input) AS input_tokens, sum(minute_output) AS output_tokens, sum(minute_cached) AS cache_prefix_tokens, \
         argMax(minute, n * 64 + (59 - minute % 60)) AS peak_minute, max(n) AS peak_minute_requests, \
         argMax(minute_input + minute_output, n * 64 + (59 - minute % 60)) AS peak_minute_tokens, any(gid) AS group_id \
         FROM (SELECT {HOUR_SQL} AS hour, intDiv(timestamp_ms, 60000) AS minute, business_line, model_name, model_version, \
         count() AS n, countIf(error_code != 0) AS minute_errors, sum(toUInt64(input_tokens)) AS minute_input, \
         sum(toUInt64(output_tokens)) AS minute_output, sum(toUInt64(ifNull(cache_prefix_tokens, 0))) AS minute_cached, \
         any({hour_id}) AS gid \
         FROM {table} {modifier} WHERE day = toDate(?) GROUP BY hour, minute, business_line, model_name, model_version) \
         GROUP BY hour, business_line, model_name, model_version \
         ORDER BY hour, business_line, model_name, model_version",
        hour_id = hour_id_sql(),
        modifier = mode.modifier(),
    )
}

fn aggregate_sql(table: &str, mode: ReadMode) -> String {
    let levels = LEVELS.map(|l| l.to_string()).join(", ");
    let present: Vec<String> = DURATIONS.iter().map(|(c, _)| format!("count({c})")).collect();
    let quantiles: Vec<String> = DURATIONS.iter().map(|(c, _)| format!("quantilesExact({levels})({c})")).collect();
    let (input, output) = length_buckets_sql();
    format!(
        "SELECT business_line, model_name, model_version, {input} AS input_bucket, {output} AS output_bucket, \
         count() AS requests, countIf(error_code != 0) AS errors, \
         sum(toUInt64(input_tokens)) AS sum_input_tokens, sum(toUInt64(output_tokens)) AS sum_output_tokens, \
         countIf(ifNull(cache_hit, 0) = 1) AS cache_hits, sum(toUInt64(ifNull(cache_prefix_tokens, 0))) AS sum_cache_prefix_tokens, \
         {present}, {quantiles}, \
         count(gpu_mem_peak_mb), quantilesExact(0.5, 0.99)(gpu_mem_peak_mb), ifNull(max(gpu_mem_peak_mb), 0), \
         any({group_id}) AS group_id \
         FROM {table} {modifier} WHERE day = toDate(?) \
         GROUP BY business_line, model_name, model_version, input_bucket, output_bucket \
         ORDER BY business_line, model_name, model_version, input_bucket, output_bucket",
        present = present.join(", "),
        quantiles = quantiles.join(", "),
        group_id = group_id_sql(),
        modifier = mode.modifier(),
    )
}

/// Each row's group ids and measures, for [`MeasureRow`].
fn measures_sql(table: &str, mode: ReadMode) -> String {
    let measures: Vec<String> = histograms().map(|(c, _)| format!("toNullable({c})")).collect();
    format!(
        "SELECT {group_id} AS day_group, {hour_id} AS hour_group, {measures} FROM {table} {modifier} WHERE day = toDate(?)",
        group_id = group_id_sql(),
        hour_id = hour_id_sql(),
        measures = measures.join(", "),
        modifier = mode.modifier(),
    )
}

/// Per daily and per hourly group id, the histograms of the day's rows.
type Counted = (HashMap<u64, Histograms<MEASURES>>, HashMap<u64, Histograms<{ DURATIONS.len() }>>);

/// Streams every row's measures and counts them into per-group histograms.
async fn count_histograms(hot: &HotTier, day: &str, mode: ReadMode) -> Result<Counted, CompactorError> {
    let mut cursor = hot.client().query(&measures_sql(&hot.qualified(), mode)).bind(day).fetch::<MeasureRow>().map_err(hot.error("histograms"))?;
    let (mut daily, mut hourly): Counted = Default::default();
    while let Some(row) = cursor.next().await.map_err(hot.error("histograms"))? {
        let day_slots = daily.entry(row.day_group).or_insert_with(|| std::array::from_fn(|_| None));
        let hour_slots = hourly.entry(row.hour_group).or_insert_with(|| std::array::from_fn(|_| None));
        for (m, value) in row.measures.into_iter().enumerate() {
            let Some(v) = value else { continue };
            // Each value's bucket once; a duration counts in both histograms.
            let bucket = (v > 0.0).then(|| histogram::bucket(v));
            day_slots[m].get_or_insert_with(Histogram::new).add_bucket(bucket, 1);
            if let Some(slot) = hour_slots.get_mut(m) {
                slot.get_or_insert_with(Histogram::new).add_bucket(bucket, 1);
            }
        }
    }
    Ok((daily, hourly))
}

/// One histogram per measure (`None`: no row carried it).
type Histograms<const N: usize> = [Option<Histogram>; N];

/// Gives each group its histograms; an id two groups share is refused
/// (their counts would mix).
fn attach<R, const N: usize>(
    rows: Vec<R>,
    id: impl Fn(&R) -> u64,
    mut histograms: HashMap<u64, Histograms<N>>,
    day: &str,
) -> Result<Vec<(R, Histograms<N>)>, CompactorError> {
    let mut out: Vec<(R, Histograms<N>)> = Vec::with_capacity(rows.len());
    let mut seen = std::collections::HashSet::with_capacity(rows.len());
    for row in rows {
        if !seen.insert(id(&row)) {
            return Err(CompactorError::Aggregate { day: day.to_owned(), message: format!("two groups share the hash {:#x}", id(&row)) });
        }
        let h = histograms.remove(&id(&row)).unwrap_or_else(|| std::array::from_fn(|_| None));
        out.push((row, h));
    }
    Ok(out)
}

/// Computes the day's aggregates: four ClickHouse queries at once.
pub async fn compute(hot: &HotTier, day: Day, mode: ReadMode) -> Result<DayAggregates, CompactorError> {
    let date = inferlog_store::day_string(day);
    let table = hot.qualified();
    let run = |sql: String| hot.client().query(&sql).bind(&date);
    let errors_sql = format!(
        "SELECT business_line, model_name, model_version, {input} AS input_bucket, error_code, ifNull(error_stage, '') AS error_stage, \
         count() AS errors FROM {table} {} WHERE day = toDate(?) AND error_code != 0 \
         GROUP BY business_line, model_name, model_version, input_bucket, error_code, error_stage \
         ORDER BY business_line, model_name, model_version, input_bucket, error_code, error_stage",
        mode.modifier(),
        input = length_buckets_sql().0,
    );
    let (rows, hours, (daily, hourly), errors) = tokio::try_join!(
        async { run(aggregate_sql(&table, mode)).fetch_all::<AggregateRow>().await.map_err(hot.error("aggregate")).map_err(CompactorError::from) },
        async { run(hourly_sql(&table, mode)).fetch_all::<HourRow>().await.map_err(hot.error("hourly aggregate")).map_err(CompactorError::from) },
        count_histograms(hot, &date, mode),
        async { run(errors_sql.clone()).fetch_all::<ErrorRow>().await.map_err(hot.error("aggregate errors")).map_err(CompactorError::from) },
    )?;
    let groups = attach(rows, |r| r.group_id, daily, &date)?.into_iter().map(|(row, histograms)| Group { row, histograms }).collect();
    let hours = attach(hours, |r| r.group_id, hourly, &date)?.into_iter().map(|(row, histograms)| Hour { row, histograms }).collect();
    Ok(DayAggregates { groups, hours, errors })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_spec() {
        let (input, output) = length_buckets_sql();
        assert_eq!(
            input,
            "multiIf(input_tokens < 1024, '0-1k', input_tokens < 2048, '1k-2k', input_tokens < 4096, '2k-4k', \
             input_tokens < 8192, '4k-8k', input_tokens < 32768, '8k-32k', '32k+')"
        );
        assert_eq!(
            output,
            "multiIf(output_tokens < 128, '0-128', output_tokens < 512, '128-512', output_tokens < 2048, '512-2k', \
             output_tokens < 8192, '2k-8k', '8k+')"
        );
        let sql = aggregate_sql("d.t", ReadMode::Final);
        assert!(sql.contains("FROM d.t FINAL WHERE"), "{sql}");
        assert!(sql.contains("quantilesExact(0.5, 0.95, 0.99)(ttft_ms)"), "{sql}");
        assert!(sql.contains("count(decode_time_ms)"), "{sql}");
        assert!(sql.contains(&format!("any({}) AS group_id", group_id_sql())), "{sql}");
        let sql = measures_sql("d.t", ReadMode::Final);
        assert!(
            sql.starts_with(&format!("SELECT {} AS day_group, {} AS hour_group, toNullable(total_latency_ms), ", group_id_sql(), hour_id_sql())),
            "{sql}"
        );
        assert!(
            sql.ends_with("toNullable(toFloat64(cache_prefix_tokens)), toNullable(gpu_mem_peak_mb) FROM d.t FINAL WHERE day = toDate(?)"),
            "{sql}"
        );
        let hourly = hourly_sql("d.t", ReadMode::Final);
        assert!(hourly.contains("FROM d.t FINAL WHERE day = toDate(?) GROUP BY hour, minute,"), "{hourly}");
        assert!(hourly.contains(&format!("any({}) AS gid", hour_id_sql())), "{hourly}");
    }

    #[test]
    fn the_catalog_functions_use_the_same_mapping() {
        let migration = include_str!("../../store/migrations/0002_histograms.sql");
        assert_eq!(histogram::RELATIVE_ERROR, 0.01);
        assert!(migration.contains("gamma constant double precision := (1 + 0.01) / (1 - 0.01);"), "the SQL quantile's γ");
        for (_, prefix) in histograms() {
            assert!(migration.contains(&format!("ADD COLUMN {prefix}_hist bigint[]")), "{prefix}_hist");
        }
        for b in OutputBucket::ALL {
            assert!(migration.contains(&format!("'{}'", b.as_str())), "{b:?} in the CHECK");
        }
    }
}
