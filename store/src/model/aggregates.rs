//! The aggregate tables in Postgres (`store/migrations`), as the compactor
//! writes them and the report reads them. In: nothing. Out: each table's
//! columns in insert order, derived from the [`MEASURES`] where they
//! follow them.

use crate::model::measures::{durations, LEVELS, MEASURES};

/// Every aggregate table, each row of which belongs to one UTC `day`:
/// what publishing a day replaces and what retention deletes and counts.
pub const AGGREGATE_TABLES: [&str; 6] = ["daily_aggregates", "daily_series", "hourly_aggregates", "daily_errors", "daily_waste", "daily_outputs"];

/// The key of a daily group in `daily_aggregates`.
pub const DAILY_KEY: [&str; 6] = ["day", "business_line", "model_name", "model_version", "input_bucket", "output_bucket"];

/// A daily group's counts, then its cost (NULL: unpriced).
pub const DAILY_COUNTS: [&str; 7] = ["requests", "errors", "input_tokens", "output_tokens", "cache_hits", "cache_prefix_tokens", "cost_usd"];

/// The peak GPU memory figures of a daily group (MB).
pub const GPU_MEMORY: [&str; 3] = ["gpu_mem_p50_mb", "gpu_mem_p99_mb", "gpu_mem_max_mb"];

/// `daily_errors`, in insert order.
pub const ERROR_COLUMNS: [&str; 9] =
    ["day", "business_line", "model_name", "model_version", "input_bucket", "error_code", "error_name", "error_stage", "errors"];

/// `daily_waste`, in insert order: a business line's day of repeated
/// prompts ([`crate::model::waste::LineWaste`]'s fields).
pub const WASTE_COLUMNS: [&str; 9] =
    ["day", "business_line", "requests", "tokens", "input_tokens", "hashed", "repeats", "repeat_tokens", "repeat_uncached_input"];

/// `daily_outputs`, in insert order: a business line × request type's day
/// of output lengths ([`crate::model::waste::TypeWaste`]'s fields).
pub const OUTPUT_COLUMNS: [&str; 9] =
    ["day", "business_line", "request_type", "requests", "output_tokens", "output_hist", "limited", "at_limit", "at_limit_tokens"];

/// The column of a measure's mergeable histogram.
pub fn hist_column(measure: usize) -> String {
    format!("{}_hist", MEASURES[measure].prefix)
}

/// `daily_aggregates`, in insert order: the key, the counts and cost, each
/// duration's percentiles at [`LEVELS`], the GPU memory figures, then a
/// histogram per measure.
pub fn daily_columns() -> Vec<String> {
    let mut columns: Vec<String> = DAILY_KEY.iter().chain(&DAILY_COUNTS).map(|c| c.to_string()).collect();
    for m in durations() {
        for level in LEVELS {
            columns.push(format!("{}_p{}_ms", m.prefix, (level * 100.0).round()));
        }
    }
    columns.extend(GPU_MEMORY.map(String::from));
    columns.extend((0..MEASURES.len()).map(hist_column));
    columns
}

/// The key of a row of `daily_series`: a day's groups without their buckets.
pub const SERIES_KEY: [&str; 4] = ["day", "business_line", "model_name", "model_version"];

/// `daily_series`, in insert order: the key, the counts and cost, then a
/// histogram per measure (the exact percentiles stay with the groups).
pub fn series_columns() -> Vec<String> {
    SERIES_KEY.iter().chain(&DAILY_COUNTS).map(|c| c.to_string()).chain((0..MEASURES.len()).map(hist_column)).collect()
}

/// The statement that rolls the `daily_aggregates` rows of day `$1` up
/// into `daily_series`: counts summed, histograms merged, the cost summed
/// (NULL when none of the series' groups was priced: a model's groups
/// share one price, so a series is priced whole or not at all). Publishing
/// and repricing a day run it after writing the day's groups, in their
/// transaction, so a series is always the sum of its groups.
pub fn series_rollup() -> String {
    let key = SERIES_KEY.join(", ");
    let counts = DAILY_COUNTS.iter().map(|c| if *c == "cost_usd" { format!("sum({c})") } else { format!("sum({c})::bigint") });
    let hists = (0..MEASURES.len()).map(|m| format!("inferlog_merge({})", hist_column(m)));
    let values: Vec<String> = counts.chain(hists).collect();
    format!(
        "INSERT INTO daily_series ({}) SELECT {key}, {} FROM daily_aggregates WHERE day = $1 GROUP BY {key}",
        series_columns().join(", "),
        values.join(", ")
    )
}

/// `hourly_aggregates`, in insert order: the hour and its series, the
/// counts and cost, the busiest minute, the load of each minute, then a
/// histogram per duration.
pub fn hourly_columns() -> Vec<String> {
    let mut columns: Vec<String> = [
        "hour",
        "day",
        "business_line",
        "model_name",
        "model_version",
        "requests",
        "errors",
        "input_tokens",
        "output_tokens",
        "cache_prefix_tokens",
        "cost_usd",
        "peak_minute",
        "peak_minute_requests",
        "peak_minute_tokens",
        "minute_requests",
        "minute_tokens",
    ]
    .map(String::from)
    .to_vec();
    columns.extend((0..durations().len()).map(hist_column));
    columns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_columns_are_the_migrations() {
        let migrations = [
            include_str!("../../migrations/0001_catalog.sql"),
            include_str!("../../migrations/0002_histograms.sql"),
            include_str!("../../migrations/0003_hourly_cost.sql"),
            include_str!("../../migrations/0004_errors_by_input_bucket.sql"),
            include_str!("../../migrations/0013_minute_load.sql"),
            include_str!("../../migrations/0014_daily_series.sql"),
            include_str!("../../migrations/0015_daily_waste.sql"),
        ]
        .concat();
        for column in daily_columns()
            .iter()
            .chain(&hourly_columns())
            .chain(&series_columns())
            .map(String::as_str)
            .chain(ERROR_COLUMNS)
            .chain(WASTE_COLUMNS)
            .chain(OUTPUT_COLUMNS)
        {
            assert!(migrations.contains(&format!("{column} ")), "{column} is in no migration");
        }
        // 13 keys and counts, 18 percentiles, 3 GPU memory figures, 8 histograms.
        assert_eq!(daily_columns().len(), 42);
        assert!(daily_columns().contains(&"ttft_p95_ms".to_owned()));
        assert_eq!(hourly_columns().len(), 16 + durations().len());
        assert_eq!(hourly_columns().last().map(String::as_str), Some("decode_hist"));
        // The series: its key, the counts and cost, a histogram per measure; each a column of the groups.
        assert_eq!(series_columns().len(), 4 + 7 + 8);
        assert!(series_columns().iter().all(|c| daily_columns().contains(c)));
        let rollup = series_rollup();
        assert!(
            rollup.contains("sum(cost_usd), ") && rollup.contains("inferlog_merge(gpu_mem_hist) FROM daily_aggregates WHERE day = $1"),
            "{rollup}"
        );
        for table in AGGREGATE_TABLES {
            assert!(migrations.contains(&format!("CREATE TABLE {table} (")), "{table} is created by a migration");
        }
    }
}
