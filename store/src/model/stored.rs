//! The hot rows as read back from ClickHouse. In: a day's rows of the
//! hot table ([`HOT`]). Out: [`StoredRow`] (every column: the archive and
//! erasure read it) or [`FoldRow`] (the columns the aggregates fold: the
//! report reads only these), each with the `SELECT` list its fields name,
//! so no reader spells the table's columns.

use clickhouse::Row;
use serde::Deserialize;

#[cfg(any(doc, test))]
use crate::model::tables::HOT;

/// The request type of a row that names none.
pub const NO_TYPE: &str = "-";

/// One hot row as read back: every column of [`HOT`] but `day` and
/// `event_time` (both derived from `timestamp_ms`), in its order. Strings
/// borrow from the response buffer.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct StoredRow<'a> {
    pub timestamp_ms: u64,
    pub request_id: &'a str,
    pub business_line: &'a str,
    pub model_name: &'a str,
    pub model_version: &'a str,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub total_latency_ms: f64,
    pub error_code: i32,
    #[serde(borrow)]
    pub error_stage: Option<&'a str>,
    #[serde(borrow)]
    pub user_id_hash: Option<&'a str>,
    #[serde(borrow)]
    pub tenant: Option<&'a str>,
    #[serde(borrow)]
    pub session_id: Option<&'a str>,
    #[serde(borrow)]
    pub request_type: Option<&'a str>,
    pub queue_wait_ms: Option<f64>,
    pub prefill_time_ms: Option<f64>,
    pub decode_time_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub gpu_id: Option<u32>,
    pub batch_size: Option<u32>,
    pub cache_hit: Option<u8>,
    pub cache_prefix_tokens: Option<u32>,
    pub gpu_mem_peak_mb: Option<f64>,
    pub truncated: Option<u8>,
    #[serde(borrow)]
    pub prompt_hash: Option<&'a str>,
    pub max_tokens: Option<u32>,
    pub schema_version: u8,
    pub kafka_topic: &'a str,
    pub kafka_partition: u16,
    pub kafka_offset: u64,
    pub kafka_index: u32,
    pub ingested_at: u32,
}

impl StoredRow<'_> {
    /// `timestamp_ms, request_id, …`: the `SELECT` list of a [`StoredRow`].
    pub fn select_list() -> String {
        <StoredRow<'_> as Row>::COLUMN_NAMES.join(", ")
    }

    /// The columns the aggregates fold.
    pub fn fold_row(&self) -> FoldRow<'_> {
        FoldRow {
            timestamp_ms: self.timestamp_ms,
            business_line: self.business_line,
            model_name: self.model_name,
            model_version: self.model_version,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            total_latency_ms: self.total_latency_ms,
            error_code: self.error_code,
            error_stage: self.error_stage,
            user_id_hash: self.user_id_hash,
            request_type: self.request_type,
            queue_wait_ms: self.queue_wait_ms,
            prefill_time_ms: self.prefill_time_ms,
            decode_time_ms: self.decode_time_ms,
            ttft_ms: self.ttft_ms,
            tpot_ms: self.tpot_ms,
            gpu_id: self.gpu_id,
            cache_hit: self.cache_hit,
            cache_prefix_tokens: self.cache_prefix_tokens,
            gpu_mem_peak_mb: self.gpu_mem_peak_mb,
            prompt_hash: self.prompt_hash,
            max_tokens: self.max_tokens,
        }
    }

    /// A row with every column set (some to `None`), for tests.
    pub fn example() -> StoredRow<'static> {
        StoredRow {
            timestamp_ms: 1_764_000_000_123,
            request_id: "r1",
            business_line: "search",
            model_name: "m",
            model_version: "v1",
            input_tokens: 10,
            output_tokens: 3,
            total_latency_ms: 12.5,
            error_code: 1003,
            error_stage: Some("decode"),
            user_id_hash: None,
            tenant: Some("web"),
            session_id: None,
            request_type: Some("chat"),
            queue_wait_ms: Some(1.0),
            prefill_time_ms: None,
            decode_time_ms: Some(2.0),
            ttft_ms: None,
            tpot_ms: Some(1.0),
            gpu_id: Some(3),
            batch_size: None,
            cache_hit: Some(1),
            cache_prefix_tokens: Some(4),
            gpu_mem_peak_mb: None,
            truncated: Some(0),
            prompt_hash: Some("k1:ab"),
            max_tokens: None,
            schema_version: 1,
            kafka_topic: "t",
            kafka_partition: 2,
            kafka_offset: 99,
            kafka_index: 0,
            ingested_at: 1_764_000_001,
        }
    }
}

/// The columns of a hot row the aggregates fold ([`crate::model::fold`]):
/// the series, the tokens, the error, the user, the request type, the
/// measures, the GPU, the prompt and the output limit. Fields keep [`HOT`]'s names
/// and order.
#[derive(Debug, Clone, Copy, PartialEq, Row, Deserialize)]
pub struct FoldRow<'a> {
    pub timestamp_ms: u64,
    pub business_line: &'a str,
    pub model_name: &'a str,
    pub model_version: &'a str,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub total_latency_ms: f64,
    pub error_code: i32,
    #[serde(borrow)]
    pub error_stage: Option<&'a str>,
    #[serde(borrow)]
    pub user_id_hash: Option<&'a str>,
    #[serde(borrow)]
    pub request_type: Option<&'a str>,
    pub queue_wait_ms: Option<f64>,
    pub prefill_time_ms: Option<f64>,
    pub decode_time_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub gpu_id: Option<u32>,
    pub cache_hit: Option<u8>,
    pub cache_prefix_tokens: Option<u32>,
    pub gpu_mem_peak_mb: Option<f64>,
    #[serde(borrow)]
    pub prompt_hash: Option<&'a str>,
    pub max_tokens: Option<u32>,
}

impl<'a> FoldRow<'a> {
    /// The request type, or [`NO_TYPE`] when the row names none (or an empty one).
    pub fn request_type_or_none(&self) -> &'a str {
        self.request_type.filter(|t| !t.is_empty()).unwrap_or(NO_TYPE)
    }

    /// `timestamp_ms, business_line, …`: the `SELECT` list of a [`FoldRow`].
    pub fn select_list() -> String {
        <FoldRow<'_> as Row>::COLUMN_NAMES.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `names` are columns of the hot table, in its order.
    fn in_table_order(names: &[&str]) -> bool {
        let positions: Vec<Option<usize>> = names.iter().map(|n| HOT.columns.iter().position(|c| c.name == *n)).collect();
        positions.iter().all(Option::is_some) && positions.windows(2).all(|w| w[0] < w[1])
    }

    #[test]
    fn the_rows_read_are_the_hot_tables_columns() {
        let stored = <StoredRow<'_> as Row>::COLUMN_NAMES;
        let all_but_derived: Vec<&str> = HOT.columns.iter().map(|c| c.name).filter(|n| !["day", "event_time"].contains(n)).collect();
        assert_eq!(stored, all_but_derived.as_slice());
        assert!(in_table_order(<FoldRow<'_> as Row>::COLUMN_NAMES));
        assert!(StoredRow::select_list().starts_with("timestamp_ms, request_id, business_line,"));
        assert!(FoldRow::select_list().ends_with("cache_prefix_tokens, gpu_mem_peak_mb, prompt_hash, max_tokens"));
    }

    #[test]
    fn the_fold_row_is_the_stored_rows_columns() {
        let row = StoredRow::example();
        let fold = row.fold_row();
        assert_eq!((fold.timestamp_ms, fold.error_stage, fold.cache_prefix_tokens), (row.timestamp_ms, row.error_stage, row.cache_prefix_tokens));
        assert_eq!((fold.tpot_ms, fold.decode_time_ms, fold.queue_wait_ms), (row.tpot_ms, row.decode_time_ms, row.queue_wait_ms));
        assert_eq!((fold.request_type, fold.prompt_hash, fold.max_tokens), (row.request_type, row.prompt_hash, row.max_tokens));
    }
}
