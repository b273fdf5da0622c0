//! The hot rows as read back from ClickHouse. In: a day's rows of the
//! hot table ([`HOT`]). Out: [`StoredRow`] (every column: the archive and
//! erasure read it) or [`FoldRow`] (the columns the aggregates fold: the
//! report reads only these), each with the `SELECT` list its fields name,
//! so no reader spells the table's columns.

use clickhouse::Row;

#[cfg(any(doc, test))]
use crate::model::tables::HOT;

/// The request type of a row that names none.
pub const NO_TYPE: &str = "-";

include!(concat!(env!("OUT_DIR"), "/stored_row.rs"));

impl StoredRow<'_> {
    /// `timestamp_ms, request_id, …`: the `SELECT` list of a [`StoredRow`].
    pub fn select_list() -> String {
        <StoredRow<'_> as Row>::COLUMN_NAMES.join(", ")
    }
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
