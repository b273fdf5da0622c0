//! The archive format, shared by the archive stage (which writes it) and
//! the verify stage (which reads it back): the Arrow schema of an object,
//! what is recorded about each object written, and where in an object the
//! columns verification decodes lie.
//!
//! ## Archive schema (schema version 1)
//!
//! | column | Parquet type | null |
//! |---|---|---|
//! | timestamp | INT64 TIMESTAMP(MILLIS, UTC) | no |
//! | request_id, business_line, model_name, model_version | BYTE_ARRAY UTF8 | no |
//! | input_tokens, output_tokens | INT64 | no |
//! | total_latency_ms | DOUBLE | no |
//! | error_code | INT32 | no |
//! | error_stage, user_id_hash, tenant, session_id, request_type | BYTE_ARRAY UTF8 | yes |
//! | queue_wait_ms, prefill_time_ms, decode_time_ms, ttft_ms, tpot_ms | DOUBLE | yes |
//! | gpu_id, batch_size, cache_prefix_tokens | INT64 | yes |
//! | cache_hit, truncated | BOOLEAN | yes |
//! | gpu_mem_peak_mb | DOUBLE | yes |
//! | schema_version | INT32 | no |
//! | kafka_topic | BYTE_ARRAY UTF8 | no |
//! | kafka_partition | INT32 | no |
//! | kafka_offset | INT64 | no |
//! | ingested_at | INT64 TIMESTAMP(MILLIS, UTC) | no |
//!
//! File key-value metadata: `inferlog.schema_version`, `inferlog.day`,
//! `inferlog.part`. Nothing in a file depends on when or from which table
//! it was written, so re-archiving unchanged rows gives byte-identical objects.

use std::ops::Range;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::file::metadata::ParquetMetaData;

/// The Arrow schema of an archive object (see the module doc).
pub fn archive_schema() -> SchemaRef {
    let utc = || DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let f = Field::new;
    Arc::new(Schema::new(vec![
        f("timestamp", utc(), false),
        f("request_id", DataType::Utf8, false),
        f("business_line", DataType::Utf8, false),
        f("model_name", DataType::Utf8, false),
        f("model_version", DataType::Utf8, false),
        f("input_tokens", DataType::Int64, false),
        f("output_tokens", DataType::Int64, false),
        f("total_latency_ms", DataType::Float64, false),
        f("error_code", DataType::Int32, false),
        f("error_stage", DataType::Utf8, true),
        f("user_id_hash", DataType::Utf8, true),
        f("tenant", DataType::Utf8, true),
        f("session_id", DataType::Utf8, true),
        f("request_type", DataType::Utf8, true),
        f("queue_wait_ms", DataType::Float64, true),
        f("prefill_time_ms", DataType::Float64, true),
        f("decode_time_ms", DataType::Float64, true),
        f("ttft_ms", DataType::Float64, true),
        f("tpot_ms", DataType::Float64, true),
        f("gpu_id", DataType::Int64, true),
        f("batch_size", DataType::Int64, true),
        f("cache_hit", DataType::Boolean, true),
        f("cache_prefix_tokens", DataType::Int64, true),
        f("gpu_mem_peak_mb", DataType::Float64, true),
        f("truncated", DataType::Boolean, true),
        f("schema_version", DataType::Int32, false),
        f("kafka_topic", DataType::Utf8, false),
        f("kafka_partition", DataType::Int32, false),
        f("kafka_offset", DataType::Int64, false),
        f("ingested_at", utc(), false),
    ]))
}

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

/// The columns whose aggregates are compared with ClickHouse's fingerprint.
pub const FINGERPRINT_COLUMNS: [&str; 4] = ["timestamp", "input_tokens", "output_tokens", "error_code"];
