//! The archive format, shared by the archive stage (which writes it) and
//! the verify stage (which reads it back): what is recorded about each
//! object written, and where in an object the columns verification decodes
//! lie. The objects' schema is [`inferlog_store::model::archive`].
//!
//! File key-value metadata: `inferlog.schema_version`, `inferlog.day`,
//! `inferlog.part`. Nothing in a file depends on when or from which table
//! it was written, so re-archiving unchanged rows gives byte-identical objects.

use std::ops::Range;

use parquet::file::metadata::ParquetMetaData;

/// One object as written: what verification must find when reading it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenObject {
    pub key: String,
    pub rows: u64,
    pub bytes: u64,
    pub sha256: String,
    /// Where the fingerprint columns lie, so verification keeps them while
    /// streaming the object back; empty for an object re-listed after a crash.
    pub fingerprint_ranges: Vec<std::ops::Range<u64>>,
}

/// The byte ranges verification decodes in an object the writer described:
/// the fingerprint columns of every row group.
pub fn fingerprint_ranges(metadata: &ParquetMetaData) -> Vec<Range<u64>> {
    let mut ranges = Vec::new();
    for group in metadata.row_groups() {
        for column in group.columns() {
            if FINGERPRINT_COLUMNS.contains(&column.column_path().string().as_str()) {
                let (start, length) = column.byte_range();
                ranges.push(start..start + length);
            }
        }
    }
    ranges
}

/// The columns whose aggregates are compared with ClickHouse's fingerprint
/// (and the weights, with its row count), in the archive's column order.
pub const FINGERPRINT_COLUMNS: [&str; 5] = ["timestamp", "input_tokens", "output_tokens", "error_code", "sample_weight"];
