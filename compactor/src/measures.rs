//! The measures the aggregates describe, in column order: each one's
//! ClickHouse column, Postgres column prefix and value in an archived row.
//! [`crate::fold`] counts their histograms, [`crate::aggregate`] asks
//! ClickHouse for their exact percentiles, [`crate::publish`] names their
//! columns.

use crate::archive::ArchiveRow;

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

/// A row's measures in [`histograms`] order (`None`: the request did not carry it).
pub fn of_row(row: &ArchiveRow<'_>) -> [Option<f64>; MEASURES] {
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

    #[test]
    fn row_measures_follow_the_column_order() {
        let columns: Vec<&str> = histograms().map(|(c, _)| *c).collect();
        assert_eq!(
            columns,
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

        let mut row = crate::archive::sample_row();
        (row.total_latency_ms, row.ttft_ms, row.tpot_ms, row.queue_wait_ms) = (1.0, Some(2.0), Some(3.0), Some(4.0));
        (row.prefill_time_ms, row.decode_time_ms, row.cache_prefix_tokens, row.gpu_mem_peak_mb) = (Some(5.0), Some(6.0), Some(7), Some(8.0));
        assert_eq!(of_row(&row), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0].map(Some));
        row.gpu_mem_peak_mb = None;
        row.ttft_ms = None;
        assert_eq!(of_row(&row)[1], None);
        assert_eq!(of_row(&row)[7], None);
    }
}
