//! Aggregate stage. In: one closed day of hot rows (retries collapsed).
//! Out: that day's rows of `daily_aggregates` and `daily_errors` in
//! Postgres, replaced in one transaction, so a re-run gives the same rows
//! and never adds to them.
//!
//! Percentiles are computed in ClickHouse with `quantilesExact`: exact,
//! the value at 0-based position floor(q·n) of the group's n sorted values
//! (nearest rank; NULL when no request of the group carried the field).

use clickhouse::Row;
use inferlog_schema::config::ErrorDictionary;
use inferlog_schema::InputBucket;
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

/// The percentile levels stored.
pub const LEVELS: [f64; 3] = [0.5, 0.95, 0.99];

/// One group of `daily_aggregates` as ClickHouse returns it.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct AggregateRow {
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_bucket: String,
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

/// `multiIf` mapping input_tokens to the contract's input-length buckets.
fn bucket_sql() -> String {
    let mut sql = String::from("multiIf(");
    for pair in InputBucket::ALL.windows(2) {
        sql.push_str(&format!("input_tokens < {}, '{}', ", pair[1].lower_bound(), pair[0].as_str()));
    }
    sql.push_str(&format!("'{}')", InputBucket::Over32k.as_str()));
    sql
}

fn aggregate_sql(table: &str, mode: ReadMode) -> String {
    let levels = LEVELS.map(|l| l.to_string()).join(", ");
    let present: Vec<String> = DURATIONS.iter().map(|(c, _)| format!("count({c})")).collect();
    let quantiles: Vec<String> = DURATIONS.iter().map(|(c, _)| format!("quantilesExact({levels})({c})")).collect();
    format!(
        "SELECT business_line, model_name, model_version, {bucket} AS input_bucket, \
         count() AS requests, countIf(error_code != 0) AS errors, \
         sum(toUInt64(input_tokens)) AS sum_input_tokens, sum(toUInt64(output_tokens)) AS sum_output_tokens, \
         countIf(ifNull(cache_hit, 0) = 1) AS cache_hits, sum(toUInt64(ifNull(cache_prefix_tokens, 0))) AS sum_cache_prefix_tokens, \
         {present}, {quantiles} \
         FROM {table} {modifier} WHERE day = toDate(?) \
         GROUP BY business_line, model_name, model_version, input_bucket \
         ORDER BY business_line, model_name, model_version, input_bucket",
        bucket = bucket_sql(),
        present = present.join(", "),
        quantiles = quantiles.join(", "),
        modifier = mode.modifier(),
    )
}

/// Computes the day's aggregates in ClickHouse.
pub async fn compute(hot: &HotTier, day: Day, mode: ReadMode) -> Result<(Vec<AggregateRow>, Vec<ErrorRow>), CompactorError> {
    let groups = hot
        .client()
        .query(&aggregate_sql(&hot.qualified(), mode))
        .bind(inferlog_store::day_string(day))
        .fetch_all::<AggregateRow>()
        .await
        .map_err(hot.error("aggregate"))?;
    let errors_sql = format!(
        "SELECT business_line, model_name, model_version, error_code, ifNull(error_stage, '') AS error_stage, count() AS errors \
         FROM {} {} WHERE day = toDate(?) AND error_code != 0 \
         GROUP BY business_line, model_name, model_version, error_code, error_stage \
         ORDER BY business_line, model_name, model_version, error_code, error_stage",
        hot.qualified(),
        mode.modifier()
    );
    let errors =
        hot.client().query(&errors_sql).bind(inferlog_store::day_string(day)).fetch_all::<ErrorRow>().await.map_err(hot.error("aggregate errors"))?;
    Ok((groups, errors))
}

/// Replaces the day's aggregate rows in Postgres with `groups` and `errors`, atomically.
pub async fn store(
    catalog: &Catalog,
    dictionary: &ErrorDictionary,
    day: Day,
    groups: &[AggregateRow],
    errors: &[ErrorRow],
) -> Result<(), CompactorError> {
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
    let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
    let insert = format!("INSERT INTO daily_aggregates ({}) VALUES ({})", columns.join(", "), placeholders.join(", "));
    for g in groups {
        let mut q = sqlx::query(&insert)
            .bind(date)
            .bind(&g.business_line)
            .bind(&g.model_name)
            .bind(&g.model_version)
            .bind(&g.input_bucket)
            .bind(g.requests as i64)
            .bind(g.errors as i64)
            .bind(g.input_tokens as i64)
            .bind(g.output_tokens as i64)
            .bind(g.cache_hits as i64)
            .bind(g.cache_prefix_tokens as i64);
        for (present, quantiles) in g.durations() {
            for i in 0..LEVELS.len() {
                // quantilesExact over only NULLs answers 0: store NULL instead.
                let value = (present > 0).then(|| quantiles.get(i).copied()).flatten();
                q = q.bind(value);
            }
        }
        q.execute(&mut *tx).await.map_err(pg("insert aggregates"))?;
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
        assert_eq!(
            bucket_sql(),
            "multiIf(input_tokens < 1024, '0-1k', input_tokens < 2048, '1k-2k', input_tokens < 4096, '2k-4k', \
             input_tokens < 8192, '4k-8k', input_tokens < 32768, '8k-32k', '32k+')"
        );
        let sql = aggregate_sql("d.t", ReadMode::Final);
        assert!(sql.contains("FROM d.t FINAL WHERE"), "{sql}");
        assert!(sql.contains("quantilesExact(0.5, 0.95, 0.99)(ttft_ms)"), "{sql}");
        assert!(sql.contains("count(decode_time_ms)"), "{sql}");
    }
}
