//! Aggregate stage. In: one closed day of hot rows (retries collapsed)
//! and what the store's one fold ([`inferlog_store::model::fold`])
//! counted from them. Out: the day's
//! [`Group`]s, which [`crate::publish`] writes to Postgres beside the
//! fold's hours and error counts.
//!
//! Daily groups: business line × model × version × input bucket × output
//! bucket, computed in ClickHouse. Percentiles are computed with
//! `quantilesExact`: exact, the value at 0-based position floor(q·n) of the
//! group's n sorted values (floor rank; NULL when no request of the group
//! carried the field). Beside them, each measure's mergeable histogram
//! ([`inferlog_schema::histogram`]) from the fold, joined by the group's key.

use std::collections::HashMap;

use clickhouse::Row;
use inferlog_schema::{InputBucket, OutputBucket};
use inferlog_store::cost::Usage;
use inferlog_store::hot::{HotTier, ReadMode};
use inferlog_store::model::fold::{self, GroupKey, Histograms, Totals};
use inferlog_store::model::measures::{durations, COUNT, LEVELS};
use inferlog_store::Day;
use serde::Deserialize;

use crate::error::CompactorError;

/// One group of `daily_aggregates` as ClickHouse returns it.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct AggregateRow {
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_bucket: String,
    pub output_bucket: String,
    /// Its additive figures, as the fold counts them (a tuple of columns:
    /// RowBinary is positional).
    pub totals: Totals,
    /// Per duration in [`durations`] order: how many rows carried it.
    pub present: Vec<u64>,
    /// Per duration in [`durations`] order: its quantiles at [`LEVELS`].
    pub quantiles: Vec<Vec<f64>>,
    // Peak GPU memory: rows that reported it, its p50 and p99, its maximum.
    pub present_gpu_mem: u64,
    pub q_gpu_mem: Vec<f64>,
    pub max_gpu_mem: f64,
}

impl AggregateRow {
    /// The token sums the group is priced from.
    pub fn usage(&self) -> Usage {
        self.totals.usage()
    }

    /// Per duration in [`durations`] order: (rows that carried it, its quantiles at [`LEVELS`]).
    pub fn durations(&self) -> impl Iterator<Item = (u64, &[f64])> {
        self.present.iter().copied().zip(self.quantiles.iter().map(Vec::as_slice))
    }
}

/// One group of the day: its counts and exact percentiles, and per measure
/// in [`histograms`] order its histogram (`None` when no row carried it).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub row: AggregateRow,
    pub histograms: Histograms<COUNT>,
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

fn aggregate_sql(table: &str, mode: ReadMode) -> String {
    let levels = LEVELS.map(|l| l.to_string()).join(", ");
    let present: Vec<String> = durations().iter().map(|m| format!("count({})", m.expr)).collect();
    let quantiles: Vec<String> = durations().iter().map(|m| format!("quantilesExact({levels})({})", m.expr)).collect();
    let (input, output) = length_buckets_sql();
    format!(
        "SELECT business_line, model_name, model_version, {input} AS input_bucket, {output} AS output_bucket, \
         count() AS requests, countIf(error_code != 0) AS errors, \
         sum(toUInt64(input_tokens)) AS sum_input_tokens, sum(toUInt64(output_tokens)) AS sum_output_tokens, \
         countIf(ifNull(cache_hit, 0) = 1) AS cache_hits, sum(toUInt64(ifNull(cache_prefix_tokens, 0))) AS sum_cache_prefix_tokens, \
         [{present}] AS present, [{quantiles}] AS quantiles, \
         count(gpu_mem_peak_mb), quantilesExact(0.5, 0.99)(gpu_mem_peak_mb), ifNull(max(gpu_mem_peak_mb), 0) \
         FROM {table} {modifier} WHERE day = toDate(?) \
         GROUP BY business_line, model_name, model_version, input_bucket, output_bucket \
         ORDER BY business_line, model_name, model_version, input_bucket, output_bucket",
        present = present.join(", "),
        quantiles = quantiles.join(", "),
        modifier = mode.modifier(),
    )
}

/// Computes the day's groups: the exact percentiles from ClickHouse,
/// joined to `daily`, the histograms of the `folded` rows counted on their
/// way to the archive. A group on one side only, or another number of
/// requests, means the two did not see the same rows.
pub async fn compute(
    hot: &HotTier,
    day: Day,
    mode: ReadMode,
    folded: u64,
    daily: HashMap<GroupKey, fold::Group>,
) -> Result<Vec<Group>, CompactorError> {
    let date = inferlog_store::day_string(day);
    let rows =
        hot.client().query(&aggregate_sql(&hot.qualified(), mode)).bind(&date).fetch_all::<AggregateRow>().await.map_err(hot.error("aggregate"))?;
    join(&date, rows, folded, daily)
}

/// Gives each group its folded histograms; refuses a group on one side
/// only, or another number of requests.
fn join(date: &str, rows: Vec<AggregateRow>, folded: u64, mut daily: HashMap<GroupKey, fold::Group>) -> Result<Vec<Group>, CompactorError> {
    let disagree = |message: String| CompactorError::RowsChanged { day: date.to_owned(), step: "aggregated", message };
    let requests: u64 = rows.iter().map(|r| r.totals.requests).sum();
    if requests != folded {
        return Err(disagree(format!("{requests} requests in the groups but {folded} rows folded")));
    }
    let mut groups = Vec::with_capacity(rows.len());
    for row in rows {
        let key = (
            row.business_line.clone(),
            row.model_name.clone(),
            row.model_version.clone(),
            bucket_label(&row.input_bucket),
            bucket_label(&row.output_bucket),
        );
        let folded = daily.remove(&key).ok_or_else(|| disagree(format!("the group {key:?} was not folded")))?;
        let counted = row.totals;
        if folded.totals != counted {
            return Err(disagree(format!("the group {key:?} counts {counted:?} in ClickHouse but {:?} folded", folded.totals)));
        }
        groups.push(Group { row, histograms: folded.histograms });
    }
    if let Some(key) = daily.keys().next() {
        return Err(disagree(format!("the folded group {key:?} is not in ClickHouse's groups")));
    }
    Ok(groups)
}

/// The bucket label as the fold's keys hold it (`""` for one no bucket has).
fn bucket_label(label: &str) -> &'static str {
    InputBucket::ALL.iter().map(|b| b.as_str()).chain(OutputBucket::ALL.iter().map(|b| b.as_str())).find(|l| *l == label).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use inferlog_schema::histogram;

    use super::*;
    use inferlog_store::model::measures::MEASURES;

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
        assert_eq!(bucket_label("8k-32k"), "8k-32k");
        assert_eq!(bucket_label("128-512"), "128-512");
        assert_eq!(bucket_label("nothing"), "");
    }

    #[test]
    fn the_catalog_functions_use_the_same_mapping() {
        let migration = include_str!("../../store/migrations/0002_histograms.sql");
        assert_eq!(histogram::RELATIVE_ERROR, 0.01);
        assert!(migration.contains("gamma constant double precision := (1 + 0.01) / (1 - 0.01);"), "the SQL quantile's γ");
        for prefix in MEASURES.iter().map(|m| m.prefix) {
            assert!(migration.contains(&format!("ADD COLUMN {prefix}_hist bigint[]")), "{prefix}_hist");
        }
        for b in OutputBucket::ALL {
            assert!(migration.contains(&format!("'{}'", b.as_str())), "{b:?} in the CHECK");
        }
    }

    fn group(line: &str, requests: u64) -> AggregateRow {
        AggregateRow {
            business_line: line.into(),
            model_name: "m".into(),
            model_version: "v1".into(),
            input_bucket: "0-1k".into(),
            output_bucket: "0-128".into(),
            totals: Totals { requests, ..Totals::default() },
            present: [requests, 0, 0, 0, 0, 0].to_vec(),
            quantiles: [vec![1.0; 3], vec![], vec![], vec![], vec![], vec![]].to_vec(),
            present_gpu_mem: 0,
            q_gpu_mem: vec![],
            max_gpu_mem: 0.0,
        }
    }

    #[test]
    fn groups_join_their_folded_histograms_and_a_disagreement_is_refused() {
        let key = |line: &str| (line.to_owned(), "m".to_owned(), "v1".to_owned(), "0-1k", "0-128");
        let mut counted = inferlog_schema::histogram::Histogram::new();
        counted.add(12.0);
        let folded = |lines: &[(&str, u64)]| -> HashMap<GroupKey, fold::Group> {
            let group = |requests| fold::Group {
                totals: Totals { requests, ..Totals::default() },
                histograms: std::array::from_fn(|m| (m == 0).then(|| counted.clone())),
            };
            lines.iter().map(|&(l, requests)| (key(l), group(requests))).collect()
        };
        let groups = join("2025-11-24", vec![group("chat", 2), group("search", 3)], 5, folded(&[("search", 3), ("chat", 2)])).expect("the same rows");
        assert_eq!(
            groups.iter().map(|g| (g.row.business_line.as_str(), g.histograms[0].as_ref().map(|h| h.count()))).collect::<Vec<_>>(),
            [("chat", Some(1)), ("search", Some(1))]
        );
        let refused = |result: Result<Vec<Group>, CompactorError>| match result {
            Err(e @ CompactorError::RowsChanged { .. }) => e.to_string(),
            other => panic!("expected rows changed, got {other:?}"),
        };
        let message = refused(join("2025-11-24", vec![group("chat", 2)], 3, folded(&[("chat", 2)])));
        assert!(message.contains("2 requests in the groups but 3 rows folded"), "{message}");
        let message = refused(join("2025-11-24", vec![group("chat", 2), group("ads", 1)], 3, folded(&[("chat", 2)])));
        assert!(message.contains("\"ads\"") && message.contains("was not folded"), "{message}");
        let message = refused(join("2025-11-24", vec![group("chat", 3)], 3, folded(&[("chat", 3), ("search", 1)])));
        assert!(message.contains("\"search\"") && message.contains("not in ClickHouse's groups"), "{message}");
        // The same rows in each group, but one more failed in ClickHouse's count than in the fold's.
        let mut failed = group("chat", 2);
        failed.totals.errors = 1;
        let message = refused(join("2025-11-24", vec![failed], 2, folded(&[("chat", 2)])));
        assert!(message.contains("errors: 1") && message.contains("errors: 0") && message.contains("folded"), "{message}");
    }
}
