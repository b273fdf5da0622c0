//! Aggregate stage. In: one closed day of hot rows (retries collapsed).
//! Out: that day's rows of `daily_aggregates` and `daily_errors` in
//! Postgres, replaced in one transaction, so a re-run gives the same rows
//! and never adds to them.
//!
//! Groups: business line × model × version × input bucket × output bucket.
//! Percentiles are computed in ClickHouse with `quantilesExact`: exact,
//! the value at 0-based position floor(q·n) of the group's n sorted values
//! (nearest rank; NULL when no request of the group carried the field).
//! Beside them, each duration's mergeable histogram
//! ([`inferlog_schema::histogram`]): ClickHouse counts the rows per
//! logarithmic bucket, and Postgres stores the counts as `bigint[]`.

use std::collections::HashMap;

use clickhouse::Row;
use inferlog_schema::config::ErrorDictionary;
use inferlog_schema::histogram::{self, Histogram};
use inferlog_schema::{InputBucket, OutputBucket};
use inferlog_store::catalog::{date_of, Catalog};
use inferlog_store::hot::{HotTier, ReadMode};
use inferlog_store::{Day, StoreError};
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

/// Groups per INSERT statement (47 parameters each; Postgres takes 65,535).
const INSERT_ROWS: usize = 1000;

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
    pub error_code: i32,
    pub error_stage: String,
    pub errors: u64,
}

/// How many rows of a group had a measure in one histogram bucket.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
struct BucketCount {
    /// [`BucketKey`] packed in one number.
    key: u64,
    rows: u64,
}

/// The histogram query counts rows per one 64-bit key (a third faster than
/// grouping by three columns): the group id's upper 40 bits, the measure
/// (index into [`histograms`]) in bits 16-23, and the bucket index plus
/// 32768 in bits 0-15 (0 for values of zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BucketKey {
    group: u64,
    measure: usize,
    /// `None`: zero.
    bucket: Option<i32>,
}

/// The bits of a group id that the keys keep.
const GROUP_MASK: u64 = 0xFFFF_FFFF_FF00_0000;

/// The bucket the histogram query gives values of zero (packed as 0).
const ZERO_BUCKET: i32 = -32768;

/// The bucket the histogram query gives a missing (NULL) value; left out.
const NULL_BUCKET: i32 = i32::MAX;

impl BucketKey {
    fn unpack(key: u64) -> BucketKey {
        let bucket = (key & 0xFFFF) as i32 - 32768;
        BucketKey { group: key & GROUP_MASK, measure: ((key >> 16) & 0xFF) as usize, bucket: (bucket != ZERO_BUCKET).then_some(bucket) }
    }
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
/// output bucket): the upper 40 bits of a hash, the same expression in
/// both queries. The histograms are counted per id rather than per five
/// strings.
fn group_id_sql() -> String {
    let (input, output) = length_buckets_sql();
    format!("bitAnd(cityHash64(business_line, model_name, model_version, {input}, {output}), {GROUP_MASK})")
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

/// Rows per [`BucketKey`]: each row's bucket of every measure in one array
/// (NULL as [`NULL_BUCKET`], zero as [`ZERO_BUCKET`]), spread by ARRAY JOIN,
/// packed and counted.
fn histogram_sql(table: &str, mode: ReadMode) -> String {
    let buckets: Vec<String> = histograms()
        .map(|(c, _)| {
            format!(
                "toInt32(if(isNull({c}), {NULL_BUCKET}, if(ifNull({c}, 0) <= 0, {ZERO_BUCKET}, \
                 least(ceil(log(greatest(ifNull({c}, 0), {min:?})) / log({gamma:?})), {max}))))",
                min = histogram::MIN_VALUE,
                gamma = histogram::GAMMA,
                max = histogram::MAX_INDEX,
            )
        })
        .collect();
    let measures: Vec<String> = (0..MEASURES).map(|i| i.to_string()).collect();
    format!(
        "SELECT key, count() AS bucket_rows FROM (\
         SELECT bitOr(group_id, toUInt64(measure * 65536 + (bucket + 32768))) AS key \
         FROM (SELECT {group_id} AS group_id, [{buckets}] AS buckets FROM {table} {modifier} WHERE day = toDate(?)) \
         ARRAY JOIN buckets AS bucket, [{measures}] AS measure \
         WHERE bucket != {NULL_BUCKET}) \
         GROUP BY key",
        group_id = group_id_sql(),
        buckets = buckets.join(", "),
        measures = measures.join(", "),
        modifier = mode.modifier(),
    )
}

/// Computes the day's aggregates in ClickHouse.
pub async fn compute(hot: &HotTier, day: Day, mode: ReadMode) -> Result<(Vec<Group>, Vec<ErrorRow>), CompactorError> {
    let date = inferlog_store::day_string(day);
    let rows =
        hot.client().query(&aggregate_sql(&hot.qualified(), mode)).bind(&date).fetch_all::<AggregateRow>().await.map_err(hot.error("aggregate"))?;
    let counts =
        hot.client().query(&histogram_sql(&hot.qualified(), mode)).bind(&date).fetch_all::<BucketCount>().await.map_err(hot.error("histograms"))?;
    let mut histograms: HashMap<u64, [Option<Histogram>; MEASURES]> = HashMap::new();
    for c in counts {
        let key = BucketKey::unpack(c.key);
        let Some(slot) = histograms.entry(key.group).or_default().get_mut(key.measure) else { continue };
        slot.get_or_insert_with(Histogram::new).add_bucket(key.bucket, c.rows);
    }
    let mut groups = Vec::with_capacity(rows.len());
    for row in rows {
        let histograms = histograms.remove(&row.group_id);
        if histograms.is_none() && groups.iter().any(|g: &Group| g.row.group_id == row.group_id) {
            return Err(CompactorError::Aggregate { day: date, message: format!("two groups share the hash {:#x}", row.group_id) });
        }
        groups.push(Group { histograms: histograms.unwrap_or_default(), row });
    }
    let errors_sql = format!(
        "SELECT business_line, model_name, model_version, error_code, ifNull(error_stage, '') AS error_stage, count() AS errors \
         FROM {} {} WHERE day = toDate(?) AND error_code != 0 \
         GROUP BY business_line, model_name, model_version, error_code, error_stage \
         ORDER BY business_line, model_name, model_version, error_code, error_stage",
        hot.qualified(),
        mode.modifier()
    );
    let errors = hot.client().query(&errors_sql).bind(&date).fetch_all::<ErrorRow>().await.map_err(hot.error("aggregate errors"))?;
    Ok((groups, errors))
}

/// Replaces the day's aggregate rows in Postgres with `groups` and `errors`, atomically.
pub async fn store(catalog: &Catalog, dictionary: &ErrorDictionary, day: Day, groups: &[Group], errors: &[ErrorRow]) -> Result<(), CompactorError> {
    let pg = StoreError::postgres;
    let mut tx = catalog.pool().begin().await.map_err(pg("begin"))?;
    let date = date_of(day);
    sqlx::query("DELETE FROM daily_aggregates WHERE day = $1").bind(date).execute(&mut *tx).await.map_err(pg("replace aggregates"))?;
    sqlx::query("DELETE FROM daily_errors WHERE day = $1").bind(date).execute(&mut *tx).await.map_err(pg("replace aggregates"))?;
    let mut columns: Vec<String> = [
        "day",
        "business_line",
        "model_name",
        "model_version",
        "input_bucket",
        "output_bucket",
        "requests",
        "errors",
        "input_tokens",
        "output_tokens",
        "cache_hits",
        "cache_prefix_tokens",
    ]
    .map(String::from)
    .to_vec();
    for (_, prefix) in DURATIONS {
        for level in ["p50", "p95", "p99"] {
            columns.push(format!("{prefix}_{level}_ms"));
        }
    }
    columns.extend(["gpu_mem_p50_mb", "gpu_mem_p99_mb", "gpu_mem_max_mb"].map(String::from));
    columns.extend(histograms().map(|(_, prefix)| format!("{prefix}_hist")));
    // A few statements of many rows each: one round trip per group made the
    // stage as slow as the queries that compute it.
    for chunk in groups.chunks(INSERT_ROWS) {
        let mut insert = sqlx::QueryBuilder::new(format!("INSERT INTO daily_aggregates ({}) ", columns.join(", ")));
        insert.push_values(chunk, |mut q, Group { row: g, histograms }| {
            q.push_bind(date)
                .push_bind(&g.business_line)
                .push_bind(&g.model_name)
                .push_bind(&g.model_version)
                .push_bind(&g.input_bucket)
                .push_bind(&g.output_bucket)
                .push_bind(g.requests as i64)
                .push_bind(g.errors as i64)
                .push_bind(g.input_tokens as i64)
                .push_bind(g.output_tokens as i64)
                .push_bind(g.cache_hits as i64)
                .push_bind(g.cache_prefix_tokens as i64);
            for (present, quantiles) in g.durations() {
                for i in 0..LEVELS.len() {
                    // quantilesExact over only NULLs answers 0: store NULL instead.
                    q.push_bind((present > 0).then(|| quantiles.get(i).copied()).flatten());
                }
            }
            let gpu_mem = g.present_gpu_mem > 0;
            q.push_bind(g.q_gpu_mem.first().copied().filter(|_| gpu_mem))
                .push_bind(g.q_gpu_mem.get(1).copied().filter(|_| gpu_mem))
                .push_bind(gpu_mem.then_some(g.max_gpu_mem));
            for h in histograms {
                q.push_bind(h.as_ref().map(Histogram::encode));
            }
        });
        insert.build().execute(&mut *tx).await.map_err(pg("insert aggregates"))?;
    }
    for e in errors {
        sqlx::query(
            "INSERT INTO daily_errors (day, business_line, model_name, model_version, error_code, error_name, error_stage, errors) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(date)
        .bind(&e.business_line)
        .bind(&e.model_name)
        .bind(&e.model_version)
        .bind(e.error_code)
        .bind(dictionary.get(e.error_code).unwrap_or("unknown"))
        .bind(&e.error_stage)
        .bind(e.errors as i64)
        .execute(&mut *tx)
        .await
        .map_err(pg("insert error counts"))?;
    }
    tx.commit().await.map_err(pg("commit aggregates"))?;
    Ok(())
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
        let sql = histogram_sql("d.t", ReadMode::Final);
        assert!(sql.contains(&format!("(SELECT {} AS group_id, [", group_id_sql())), "{sql}");
        assert!(sql.contains("FROM d.t FINAL WHERE day = toDate(?)) ARRAY JOIN buckets AS bucket, [0, 1, 2, 3, 4, 5, 6, 7] AS measure"), "{sql}");
        assert!(
            sql.contains("if(isNull(toFloat64(cache_prefix_tokens)), 2147483647, if(ifNull(toFloat64(cache_prefix_tokens), 0) <= 0, -32768"),
            "{sql}"
        );
        assert!(sql.contains("least(ceil(log(greatest(ifNull(gpu_mem_peak_mb, 0), 0.001))"), "{sql}");
        assert!(sql.contains(&format!("log({:?})", histogram::GAMMA)), "{sql}");
    }

    #[test]
    fn bucket_keys_unpack() {
        let group = 0xABCD_EF01_2300_0000;
        assert_eq!(BucketKey::unpack(group | (7 << 16) | (32768 + 345)), BucketKey { group, measure: 7, bucket: Some(345) });
        assert_eq!(BucketKey::unpack(group | (1 << 16) | (32768 - 345)), BucketKey { group, measure: 1, bucket: Some(-345) });
        assert_eq!(BucketKey::unpack(group | (2 << 16)), BucketKey { group, measure: 2, bucket: None });
        assert_eq!(BucketKey::unpack(group | (32768 + 32767)).bucket, Some(histogram::MAX_INDEX));
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
