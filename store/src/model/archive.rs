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

use crate::model::sample::Reason;
use crate::model::stored::{FoldRow, StoredRow};

/// Rows per Arrow batch: what the archive's reader hands its encoder.
pub const BATCH_ROWS: usize = 32_768;

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
        f("prompt_hash", DataType::Utf8, true),
        f("max_tokens", DataType::Int64, true),
        f("schema_version", DataType::Int32, false),
        f("kafka_topic", DataType::Utf8, false),
        f("kafka_partition", DataType::Int32, false),
        f("kafka_offset", DataType::Int64, false),
        f("kafka_index", DataType::Int64, false),
        f("ingested_at", utc(), false),
        f("sample_weight", DataType::Int64, false),
        f("sample_reason", DataType::Utf8, false),
    ]))
}

/// The columns the sampled archive adds after the hot table's.
pub const SAMPLE_COLUMNS: [&str; 2] = ["sample_weight", "sample_reason"];

/// `batch` in the archive schema: a batch of an object written before a
/// column existed gets it with its default (`sample_weight` 1,
/// `sample_reason` `all`, `kafka_index` 0, `prompt_hash` and `max_tokens` null).
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
            (None, "kafka_index") => Ok(Arc::new(arrow_array::Int64Array::from(vec![0; rows])) as ArrayRef),
            (None, "prompt_hash") => Ok(arrow_array::new_null_array(&DataType::Utf8, rows)),
            (None, "max_tokens") => Ok(arrow_array::new_null_array(&DataType::Int64, rows)),
            (None, name) => Err(arrow_schema::ArrowError::SchemaError(format!("the archive object has no column {name}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema, columns)
}

/// Text columns of the archive schema.
const TEXT_COLUMNS: usize = 11;

/// Column builders for one batch of [`StoredRow`]s.
#[derive(Debug)]
pub struct BatchBuilder {
    schema: SchemaRef,
    timestamp: TimestampMillisecondBuilder,
    text: [StringBuilder; 4],
    tokens: [Int64Builder; 2],
    total_latency_ms: Float64Builder,
    error_code: Int32Builder,
    optional_text: [StringBuilder; 5],
    stages: [Float64Builder; 5],
    optional_ints: [Int64Builder; 2],
    cache_hit: BooleanBuilder,
    cache_prefix_tokens: Int64Builder,
    gpu_mem_peak_mb: Float64Builder,
    truncated: BooleanBuilder,
    prompt_hash: StringBuilder,
    max_tokens: Int64Builder,
    schema_version: Int32Builder,
    kafka_topic: StringBuilder,
    kafka_partition: Int32Builder,
    kafka_offset: Int64Builder,
    kafka_index: Int64Builder,
    ingested_at: TimestampMillisecondBuilder,
    sample_weight: Int64Builder,
    sample_reason: StringBuilder,
    rows: usize,
}

impl BatchBuilder {
    pub fn new(schema: SchemaRef) -> BatchBuilder {
        BatchBuilder::with_text_bytes(schema, [BATCH_ROWS * 24; TEXT_COLUMNS])
    }

    /// Builders whose text columns start with room for `text_bytes` bytes
    /// each (in [`BatchBuilder::text_builders`] order), so a batch like the
    /// last one fills them without reallocating.
    fn with_text_bytes(schema: SchemaRef, text_bytes: [usize; TEXT_COLUMNS]) -> BatchBuilder {
        let ts = || TimestampMillisecondBuilder::with_capacity(BATCH_ROWS).with_timezone("UTC");
        let mut bytes = text_bytes.into_iter();
        let mut text = || StringBuilder::with_capacity(BATCH_ROWS, bytes.next().unwrap_or(BATCH_ROWS * 24));
        let float = || Float64Builder::with_capacity(BATCH_ROWS);
        let int = || Int64Builder::with_capacity(BATCH_ROWS);
        BatchBuilder {
            schema,
            timestamp: ts(),
            text: [text(), text(), text(), text()],
            tokens: [int(), int()],
            total_latency_ms: float(),
            error_code: Int32Builder::with_capacity(BATCH_ROWS),
            optional_text: [text(), text(), text(), text(), text()],
            stages: [float(), float(), float(), float(), float()],
            optional_ints: [int(), int()],
            cache_hit: BooleanBuilder::with_capacity(BATCH_ROWS),
            cache_prefix_tokens: int(),
            gpu_mem_peak_mb: float(),
            truncated: BooleanBuilder::with_capacity(BATCH_ROWS),
            prompt_hash: text(),
            max_tokens: int(),
            schema_version: Int32Builder::with_capacity(BATCH_ROWS),
            kafka_topic: text(),
            kafka_partition: Int32Builder::with_capacity(BATCH_ROWS),
            kafka_offset: int(),
            kafka_index: int(),
            ingested_at: ts(),
            sample_weight: int(),
            sample_reason: StringBuilder::with_capacity(BATCH_ROWS, BATCH_ROWS * 8),
            rows: 0,
        }
    }

    /// Appends a row kept for `reason`, standing for `weight` rows of its day.
    pub fn append(&mut self, r: &StoredRow<'_>, reason: Reason, weight: u64) {
        self.timestamp.append_value(r.timestamp_ms as i64);
        for (b, v) in self.text.iter_mut().zip([r.request_id, r.business_line, r.model_name, r.model_version]) {
            b.append_value(v);
        }
        self.tokens[0].append_value(i64::from(r.input_tokens));
        self.tokens[1].append_value(i64::from(r.output_tokens));
        self.total_latency_ms.append_value(r.total_latency_ms);
        self.error_code.append_value(r.error_code);
        for (b, v) in self.optional_text.iter_mut().zip([r.error_stage, r.user_id_hash, r.tenant, r.session_id, r.request_type]) {
            b.append_option(v);
        }
        for (b, v) in self.stages.iter_mut().zip([r.queue_wait_ms, r.prefill_time_ms, r.decode_time_ms, r.ttft_ms, r.tpot_ms]) {
            b.append_option(v);
        }
        self.optional_ints[0].append_option(r.gpu_id.map(i64::from));
        self.optional_ints[1].append_option(r.batch_size.map(i64::from));
        self.cache_hit.append_option(r.cache_hit.map(|v| v != 0));
        self.cache_prefix_tokens.append_option(r.cache_prefix_tokens.map(i64::from));
        self.gpu_mem_peak_mb.append_option(r.gpu_mem_peak_mb);
        self.truncated.append_option(r.truncated.map(|v| v != 0));
        self.prompt_hash.append_option(r.prompt_hash);
        self.max_tokens.append_option(r.max_tokens.map(i64::from));
        self.schema_version.append_value(i32::from(r.schema_version));
        self.kafka_topic.append_value(r.kafka_topic);
        self.kafka_partition.append_value(i32::from(r.kafka_partition));
        self.kafka_offset.append_value(r.kafka_offset as i64);
        self.kafka_index.append_value(i64::from(r.kafka_index));
        self.ingested_at.append_value(i64::from(r.ingested_at) * 1000);
        self.sample_weight.append_value(weight as i64);
        self.sample_reason.append_value(reason.as_str());
        self.rows += 1;
    }

    /// Rows appended since the last [`BatchBuilder::finish`].
    pub fn rows(&self) -> usize {
        self.rows
    }

    fn text_builders(&self) -> impl Iterator<Item = &StringBuilder> {
        self.text.iter().chain(&self.optional_text).chain([&self.prompt_hash, &self.kafka_topic])
    }

    /// The batch so far; the builder starts again, sized like this batch
    /// (arrow's `finish` hands its buffers over and leaves empty ones).
    pub fn finish(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let mut text_bytes = [0; TEXT_COLUMNS];
        for (size, builder) in text_bytes.iter_mut().zip(self.text_builders()) {
            *size = builder.values_slice().len() + builder.values_slice().len() / 8;
        }
        let mut full = std::mem::replace(self, BatchBuilder::with_text_bytes(self.schema.clone(), text_bytes));
        full.take_columns()
    }

    fn take_columns(&mut self) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(32);
        columns.push(Arc::new(self.timestamp.finish()));
        columns.extend(self.text.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        columns.extend(self.tokens.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        columns.push(Arc::new(self.total_latency_ms.finish()));
        columns.push(Arc::new(self.error_code.finish()));
        columns.extend(self.optional_text.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        columns.extend(self.stages.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        columns.extend(self.optional_ints.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        columns.push(Arc::new(self.cache_hit.finish()));
        columns.push(Arc::new(self.cache_prefix_tokens.finish()));
        columns.push(Arc::new(self.gpu_mem_peak_mb.finish()));
        columns.push(Arc::new(self.truncated.finish()));
        columns.push(Arc::new(self.prompt_hash.finish()));
        columns.push(Arc::new(self.max_tokens.finish()));
        columns.push(Arc::new(self.schema_version.finish()));
        columns.push(Arc::new(self.kafka_topic.finish()));
        columns.push(Arc::new(self.kafka_partition.finish()));
        columns.push(Arc::new(self.kafka_offset.finish()));
        columns.push(Arc::new(self.kafka_index.finish()));
        columns.push(Arc::new(self.ingested_at.finish()));
        columns.push(Arc::new(self.sample_weight.finish()));
        columns.push(Arc::new(self.sample_reason.finish()));
        RecordBatch::try_new(self.schema.clone(), columns)
    }
}

/// Calls `f` with each row of `batch` (of [`archive_schema`], after
/// [`in_current_schema`]) as the fold reads it, and its `sample_weight`.
pub fn fold_rows(batch: &RecordBatch, mut f: impl FnMut(&FoldRow<'_>, u64)) -> Result<(), arrow_schema::ArrowError> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int32Type, Int64Type, TimestampMillisecondType};
    use arrow_array::Array;
    let column =
        |name: &str| batch.column_by_name(name).ok_or_else(|| arrow_schema::ArrowError::SchemaError(format!("the archive has no column {name}")));
    let text = |name| column(name).and_then(|c| c.as_string_opt::<i32>().ok_or_else(|| kind(name)));
    let int64 = |name| column(name).and_then(|c| c.as_primitive_opt::<Int64Type>().ok_or_else(|| kind(name)));
    let float = |name| column(name).and_then(|c| c.as_primitive_opt::<Float64Type>().ok_or_else(|| kind(name)));
    let flag = |name| column(name).and_then(|c| c.as_boolean_opt().ok_or_else(|| kind(name)));
    let time = column("timestamp")?.as_primitive_opt::<TimestampMillisecondType>().ok_or_else(|| kind("timestamp"))?;
    let (line, model, version, stage, user) =
        (text("business_line")?, text("model_name")?, text("model_version")?, text("error_stage")?, text("user_id_hash")?);
    let (request_type, prompt, max_tokens) = (text("request_type")?, text("prompt_hash")?, int64("max_tokens")?);
    let (input, output, prefix, weight) = (int64("input_tokens")?, int64("output_tokens")?, int64("cache_prefix_tokens")?, int64("sample_weight")?);
    let gpu = int64("gpu_id")?;
    let code = column("error_code")?.as_primitive_opt::<Int32Type>().ok_or_else(|| kind("error_code"))?;
    let (total, queue, prefill, decode, ttft, tpot, gpu_mem) = (
        float("total_latency_ms")?,
        float("queue_wait_ms")?,
        float("prefill_time_ms")?,
        float("decode_time_ms")?,
        float("ttft_ms")?,
        float("tpot_ms")?,
        float("gpu_mem_peak_mb")?,
    );
    let cache_hit = flag("cache_hit")?;
    let opt_f = |a: &arrow_array::Float64Array, i: usize| a.is_valid(i).then(|| a.value(i));
    for i in 0..batch.num_rows() {
        let row = FoldRow {
            timestamp_ms: time.value(i) as u64,
            business_line: line.value(i),
            model_name: model.value(i),
            model_version: version.value(i),
            input_tokens: input.value(i) as u32,
            output_tokens: output.value(i) as u32,
            total_latency_ms: total.value(i),
            error_code: code.value(i),
            error_stage: opt_str(stage, i),
            user_id_hash: opt_str(user, i),
            request_type: opt_str(request_type, i),
            queue_wait_ms: opt_f(queue, i),
            prefill_time_ms: opt_f(prefill, i),
            decode_time_ms: opt_f(decode, i),
            ttft_ms: opt_f(ttft, i),
            tpot_ms: opt_f(tpot, i),
            gpu_id: gpu.is_valid(i).then(|| gpu.value(i) as u32),
            cache_hit: cache_hit.is_valid(i).then(|| u8::from(cache_hit.value(i))),
            cache_prefix_tokens: prefix.is_valid(i).then(|| prefix.value(i) as u32),
            gpu_mem_peak_mb: opt_f(gpu_mem, i),
            prompt_hash: opt_str(prompt, i),
            max_tokens: max_tokens.is_valid(i).then(|| max_tokens.value(i) as u32),
        };
        f(&row, weight.value(i).max(0) as u64);
    }
    Ok(())
}

fn opt_str(a: &arrow_array::StringArray, i: usize) -> Option<&str> {
    use arrow_array::Array;
    a.is_valid(i).then(|| a.value(i))
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
