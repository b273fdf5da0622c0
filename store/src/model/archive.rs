//! The archive's row format. In: [`StoredRow`]s. Out: Arrow record
//! batches of [`archive_schema`], which the compactor writes as Parquet
//! objects and reads back to verify; and back from such a batch, each
//! row's [`FoldRow`] with its weight ([`fold_rows`], what the report folds
//! for a day only the archive holds).
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
//! | prompt_hash | BYTE_ARRAY UTF8 | yes |
//! | max_tokens | INT64 | yes |
//! | schema_version | INT32 | no |
//! | kafka_topic | BYTE_ARRAY UTF8 | no |
//! | kafka_partition | INT32 | no |
//! | kafka_offset | INT64 | no |
//! | kafka_index | INT64 | no |
//! | ingested_at | INT64 TIMESTAMP(MILLIS, UTC) | no |
//! | sample_weight | INT64 | no |
//! | sample_reason | BYTE_ARRAY UTF8 | no |
//!
//! `sample_weight` is how many of the day's rows the row stands for and
//! `sample_reason` why it was kept ([`Reason`]): `all` and weight 1 in a
//! day archived without sampling. `kafka_index` is the event's place in
//! its Kafka message (0 for a JSON event, the span's index for OTLP).
//! Objects written before a column existed read it with its default
//! (`all`, weight 1, index 0, no prompt hash, no output limit:
//! [`in_current_schema`]).

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::file::properties::{EnabledStatistics, WriterPropertiesBuilder};
use parquet::schema::types::ColumnPath;

use crate::model::sample::Reason;
use crate::model::stored::{FoldRow, StoredRow};

/// Rows per Arrow batch: what the archive's reader hands its encoder.
pub const BATCH_ROWS: usize = 32_768;

include!(concat!(env!("OUT_DIR"), "/archive_columns.rs"));

/// The Arrow schema of an archive object (see the module doc): the hot
/// row's columns as `store/hot_row.toml` lists them, then the sample's.
pub fn archive_schema() -> SchemaRef {
    let mut fields = hot_fields();
    fields.push(Field::new("sample_weight", DataType::Int64, false));
    fields.push(Field::new("sample_reason", DataType::Utf8, false));
    Arc::new(Schema::new(fields))
}

/// The columns the sampled archive adds after the hot table's.
pub const SAMPLE_COLUMNS: [&str; 2] = ["sample_weight", "sample_reason"];

/// `batch` in the archive schema: a batch of an object written before a
/// column existed gets it with its default (`sample_weight` 1,
/// `sample_reason` `all`, a hot column added later as its older rows read:
/// `kafka_index` 0, `prompt_hash` and `max_tokens` null).
pub fn in_current_schema(batch: RecordBatch) -> Result<RecordBatch, arrow_schema::ArrowError> {
    let schema = archive_schema();
    if batch.schema() == schema {
        return Ok(batch);
    }
    let rows = batch.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|field| match (batch.column_by_name(field.name()), field.name().as_str()) {
            (Some(column), _) => Ok(column.clone()),
            (None, "sample_weight") => Ok(Arc::new(arrow_array::Int64Array::from(vec![1; rows])) as ArrayRef),
            (None, "sample_reason") => Ok(Arc::new(arrow_array::StringArray::from(vec![Reason::All.as_str(); rows])) as ArrayRef),
            (None, name) => {
                added_default(name, rows).ok_or_else(|| arrow_schema::ArrowError::SchemaError(format!("the archive object has no column {name}")))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema, columns)
}

/// How a column is encoded in Parquet, by what it holds (measured on
/// generated days; see the compactor's README). Each column's is set in
/// `store/hot_row.toml` ([`ENCODINGS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// A value unique per row (request and session ids): no dictionary (it
    /// would overflow and fall back anyway), and no min/max statistics,
    /// which no scan filters by and which cost two string comparisons per value.
    Unique,
    /// Hashed ids, tens of thousands per day: no statistics, and a
    /// dictionary big enough to hold them.
    Hashed,
    /// Times and offsets, sorted or nearly so within a business line and model: deltas.
    Delta,
    /// Measured doubles: byte-stream split, which lets ZSTD find the shared exponent bytes.
    Split,
}

/// `builder` with each column's [`Encoding`].
pub fn column_encodings(mut builder: WriterPropertiesBuilder) -> WriterPropertiesBuilder {
    for (name, encoding) in ENCODINGS {
        let column = || ColumnPath::from(*name);
        builder = match encoding {
            Encoding::Unique => {
                builder.set_column_dictionary_enabled(column(), false).set_column_statistics_enabled(column(), EnabledStatistics::None)
            }
            Encoding::Hashed => builder
                .set_column_statistics_enabled(column(), EnabledStatistics::None)
                .set_column_dictionary_page_size_limit(column(), 8 * 1024 * 1024),
            Encoding::Delta => {
                builder.set_column_dictionary_enabled(column(), false).set_column_encoding(column(), parquet::basic::Encoding::DELTA_BINARY_PACKED)
            }
            Encoding::Split => {
                builder.set_column_dictionary_enabled(column(), false).set_column_encoding(column(), parquet::basic::Encoding::BYTE_STREAM_SPLIT)
            }
        };
    }
    builder
}

/// Column builders for one batch of [`StoredRow`]s.
#[derive(Debug)]
pub struct BatchBuilder {
    schema: SchemaRef,
    hot: HotBuilders,
    sample_weight: Int64Builder,
    sample_reason: StringBuilder,
    rows: usize,
}

impl BatchBuilder {
    pub fn new(schema: SchemaRef) -> BatchBuilder {
        BatchBuilder::with_text_bytes(schema, [BATCH_ROWS * 24; HOT_TEXT_COLUMNS])
    }

    /// Builders whose text columns start with room for `text_bytes` bytes
    /// each (in column order), so a batch like the last one fills them
    /// without reallocating.
    fn with_text_bytes(schema: SchemaRef, text_bytes: [usize; HOT_TEXT_COLUMNS]) -> BatchBuilder {
        BatchBuilder {
            schema,
            hot: HotBuilders::new(text_bytes),
            sample_weight: Int64Builder::with_capacity(BATCH_ROWS),
            sample_reason: StringBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 8),
            rows: 0,
        }
    }

    /// Appends a row kept for `reason`, standing for `weight` rows of its day.
    pub fn append(&mut self, r: &StoredRow<'_>, reason: Reason, weight: u64) {
        self.hot.append(r);
        self.sample_weight.append_value(weight as i64);
        self.sample_reason.append_value(reason.as_str());
        self.rows += 1;
    }

    /// Rows appended since the last [`BatchBuilder::finish`].
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The batch so far; the builder starts again, sized like this batch
    /// (arrow's `finish` hands its buffers over and leaves empty ones).
    pub fn finish(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let text_bytes = self.hot.text_bytes().map(|bytes| bytes + bytes / 8);
        let mut full = std::mem::replace(self, BatchBuilder::with_text_bytes(self.schema.clone(), text_bytes));
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(full.schema.fields().len());
        full.hot.finish(&mut columns);
        columns.push(Arc::new(full.sample_weight.finish()));
        columns.push(Arc::new(full.sample_reason.finish()));
        RecordBatch::try_new(full.schema.clone(), columns)
    }
}

/// Calls `f` with each row of `batch` (of [`archive_schema`], after
/// [`in_current_schema`]) as the fold reads it, and its `sample_weight`.
pub fn fold_rows(batch: &RecordBatch, mut f: impl FnMut(&FoldRow<'_>, u64)) -> Result<(), arrow_schema::ArrowError> {
    use arrow_array::cast::AsArray;
    let columns = FoldColumns::of(batch)?;
    let weight = column(batch, "sample_weight")?.as_primitive_opt::<arrow_array::types::Int64Type>().ok_or_else(|| kind("sample_weight"))?;
    for i in 0..batch.num_rows() {
        f(&columns.row(i), weight.value(i).max(0) as u64);
    }
    Ok(())
}

fn column<'b>(batch: &'b RecordBatch, name: &str) -> Result<&'b ArrayRef, arrow_schema::ArrowError> {
    batch.column_by_name(name).ok_or_else(|| arrow_schema::ArrowError::SchemaError(format!("the archive has no column {name}")))
}

fn kind(name: &str) -> arrow_schema::ArrowError {
    arrow_schema::ArrowError::SchemaError(format!("the archive's column {name} is not of its schema's type"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows written by the builder read back as the fold sees them, with their weights.
    #[test]
    fn archived_rows_read_back_as_fold_rows_with_weights() {
        let mut b = BatchBuilder::new(archive_schema());
        let row = StoredRow {
            cache_hit: Some(1),
            ttft_ms: None,
            error_stage: Some("decode"),
            error_code: 1003,
            max_tokens: Some(512),
            ..StoredRow::example()
        };
        b.append(&row, Reason::Error, 1);
        b.append(&StoredRow::example(), Reason::Sampled, 9);
        let batch = b.finish().expect("batch");
        let mut read = Vec::new();
        fold_rows(&batch, |r, w| read.push((format!("{r:?}"), w))).expect("reads");
        let want = |r: &StoredRow<'_>| {
            let f = FoldRow {
                timestamp_ms: r.timestamp_ms,
                business_line: r.business_line,
                model_name: r.model_name,
                model_version: r.model_version,
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                total_latency_ms: r.total_latency_ms,
                error_code: r.error_code,
                error_stage: r.error_stage,
                user_id_hash: r.user_id_hash,
                request_type: r.request_type,
                queue_wait_ms: r.queue_wait_ms,
                prefill_time_ms: r.prefill_time_ms,
                decode_time_ms: r.decode_time_ms,
                ttft_ms: r.ttft_ms,
                tpot_ms: r.tpot_ms,
                gpu_id: r.gpu_id,
                cache_hit: r.cache_hit,
                cache_prefix_tokens: r.cache_prefix_tokens,
                gpu_mem_peak_mb: r.gpu_mem_peak_mb,
                prompt_hash: r.prompt_hash,
                max_tokens: r.max_tokens,
            };
            format!("{f:?}")
        };
        assert_eq!(read, vec![(want(&row), 1), (want(&StoredRow::example()), 9)]);
    }

    /// A column added to the hot table and read back is archived too.
    #[test]
    fn the_archive_has_every_column_read_back() {
        let read: Vec<&str> =
            <StoredRow<'_> as clickhouse::Row>::COLUMN_NAMES.iter().map(|c| if *c == "timestamp_ms" { "timestamp" } else { c }).collect();
        let schema = archive_schema();
        let archived: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(archived[..read.len()], read);
        assert_eq!(archived[read.len()..], SAMPLE_COLUMNS);
    }

    #[test]
    fn builder_columns_match_the_schema() {
        let mut b = BatchBuilder::new(archive_schema());
        let row = StoredRow::example();
        b.append(&row, Reason::All, 1);
        b.append(&row, Reason::Sampled, 9);
        let batch = b.finish().expect("columns match the schema");
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.num_columns(), archive_schema().fields().len());
        assert_eq!(b.rows, 0);
        // An object of the schema before the sample columns and the span
        // index reads as `all`, weight 1, index 0.
        let index = archive_schema().index_of("kafka_index").expect("kafka_index");
        let old_columns: Vec<usize> = (0..batch.num_columns() - 2).filter(|c| *c != index).collect();
        let old = batch.project(&old_columns).expect("project");
        let upgraded = in_current_schema(old).expect("upgraded");
        assert_eq!(upgraded.schema(), archive_schema());
        let int64 = |name: &str| {
            upgraded.column_by_name(name).and_then(|c| c.as_any().downcast_ref::<arrow_array::Int64Array>()).expect(name).values().to_vec()
        };
        assert_eq!(int64("sample_weight"), vec![1, 1]);
        assert_eq!(int64("kafka_index"), vec![0, 0]);
        assert_eq!(upgraded.column_by_name("request_id"), batch.column_by_name("request_id"));
        // A current batch passes as it is.
        assert_eq!(in_current_schema(batch.clone()).expect("current"), batch);
    }
}
