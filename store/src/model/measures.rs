//! The measures the aggregates describe, written once. In: a hot row
//! ([`FoldRow`]). Out: its measures in [`MEASURES`] order. Each measure
//! names its ClickHouse expression (the compactor's exact percentiles),
//! its Postgres column prefix (`<prefix>_p50`, `<prefix>_hist`, …) and how
//! the report labels it; [`crate::model::fold`] counts their histograms.

use crate::model::stored::FoldRow;

/// One measure with a mergeable histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measure {
    /// Its value in ClickHouse (a column, or an expression over one).
    pub expr: &'static str,
    /// The prefix of its Postgres columns.
    pub prefix: &'static str,
    /// Its key in the report's JSON and CSV.
    pub key: &'static str,
    /// Its label in the report's text and page.
    pub label: &'static str,
}

impl Measure {
    /// The report's column of this measure at `level`: its key
    /// (`ttft_p50_ms`) and its label (`TTFT p50`).
    pub fn percentile_column(&self, level: f64) -> (String, String) {
        let level = (level * 100.0).round();
        (format!("{}_p{level}_ms", self.key), format!("{} p{level}", self.label))
    }
}

const fn m(expr: &'static str, prefix: &'static str, key: &'static str, label: &'static str) -> Measure {
    Measure { expr, prefix, key, label }
}

/// Every measure, in column order: the [`DURATIONS`] (milliseconds, with
/// exact percentiles in `daily_aggregates` and histograms per hour), then
/// how much of each prompt the cache served (tokens) and the peak GPU
/// memory (MB).
pub const MEASURES: [Measure; 8] = [
    m("total_latency_ms", "total_latency", "total", "total"),
    m("ttft_ms", "ttft", "ttft", "TTFT"),
    m("tpot_ms", "tpot", "tpot", "TPOT"),
    m("queue_wait_ms", "queue_wait", "queue", "queue"),
    m("prefill_time_ms", "prefill", "prefill", "prefill"),
    m("decode_time_ms", "decode", "decode", "decode"),
    m("toFloat64(cache_prefix_tokens)", "cache_prefix", "cache_prefix", "cached prefix"),
    m("gpu_mem_peak_mb", "gpu_mem", "gpu_mem", "GPU memory"),
];

/// How many measures have a histogram.
pub const COUNT: usize = MEASURES.len();
/// How many of the first [`MEASURES`] are durations.
pub const DURATIONS: usize = 6;

/// Indexes in [`MEASURES`].
pub const TOTAL: usize = 0;
pub const TTFT: usize = 1;
pub const TPOT: usize = 2;
pub const QUEUE: usize = 3;
pub const PREFILL: usize = 4;
pub const DECODE: usize = 5;
pub const CACHE_PREFIX: usize = 6;
pub const GPU_MEM: usize = 7;

/// The percentile levels stored.
pub const LEVELS: [f64; 3] = [0.5, 0.95, 0.99];

/// The durations: the first [`DURATIONS`] measures.
pub fn durations() -> &'static [Measure] {
    &MEASURES[..DURATIONS]
}

/// A row's measures in [`MEASURES`] order (`None`: the request did not carry it).
pub fn of_row(row: &FoldRow<'_>) -> [Option<f64>; COUNT] {
    [
        Some(row.total_latency_ms),
        row.ttft_ms,
        row.tpot_ms,
        row.queue_wait_ms,
        row.prefill_time_ms,
        row.decode_time_ms,
        row.cache_prefix_tokens.map(f64::from),
        row.gpu_mem_peak_mb,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::stored::StoredRow;

    #[test]
    fn row_measures_follow_the_column_order() {
        let exprs: Vec<&str> = MEASURES.iter().map(|m| m.expr).collect();
        assert_eq!(
            exprs,
            [
                "total_latency_ms",
                "ttft_ms",
                "tpot_ms",
                "queue_wait_ms",
                "prefill_time_ms",
                "decode_time_ms",
                "toFloat64(cache_prefix_tokens)",
                "gpu_mem_peak_mb"
            ]
        );
        assert_eq!([TOTAL, TTFT, TPOT, QUEUE, PREFILL, DECODE].map(|i| MEASURES[i].label), ["total", "TTFT", "TPOT", "queue", "prefill", "decode"]);
        assert_eq!((MEASURES[CACHE_PREFIX].prefix, MEASURES[GPU_MEM].prefix), ("cache_prefix", "gpu_mem"));

        let mut row = StoredRow::example();
        (row.total_latency_ms, row.ttft_ms, row.tpot_ms, row.queue_wait_ms) = (1.0, Some(2.0), Some(3.0), Some(4.0));
        (row.prefill_time_ms, row.decode_time_ms, row.cache_prefix_tokens, row.gpu_mem_peak_mb) = (Some(5.0), Some(6.0), Some(7), Some(8.0));
        assert_eq!(of_row(&row.fold_row()), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0].map(Some));
        row.gpu_mem_peak_mb = None;
        row.ttft_ms = None;
        assert_eq!(of_row(&row.fold_row())[TTFT], None);
        assert_eq!(of_row(&row.fold_row())[GPU_MEM], None);
    }
}
