//! Verify stage. In: the objects the archive stage wrote, and the day's
//! fingerprint as ClickHouse computes it now. Out: manifest entries, only
//! if every object read back from the store has the bytes that were
//! written (size and SHA-256), a Parquet footer with the expected row
//! count and schema version, and the day's column aggregates (rows, token
//! sums, errors, first and last timestamp) equal ClickHouse's.
//!
//! Each object is read once, as one streamed GET: every chunk is hashed,
//! and the chunks that hold the footer and the fingerprint columns (their
//! byte ranges are known from the writer) are kept and decoded after the
//! stream ends. Whatever the decoder asks for that was not kept (an object
//! re-listed after a crash has no hint) is fetched with a ranged GET, so
//! the hint only saves work, it never decides what is checked: the footer
//! and the columns decoded are the ones read back from the store.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMillisecondType};
use futures_util::TryStreamExt;
use inferlog_schema::SCHEMA_VERSION;
use inferlog_store::catalog::ManifestEntry;
use inferlog_store::cold::ColdStore;
use inferlog_store::hot::DayFingerprint;
use inferlog_store::model::archive::archive_schema;
use inferlog_store::model::stored::StoredRow;
use inferlog_store::{Day, StoreError};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use sha2::{Digest, Sha256};

use crate::error::CompactorError;
use crate::format::{WrittenObject, FINGERPRINT_COLUMNS};

/// Column aggregates of the objects read back (or of the rows an archive
/// run kept), comparable to a [`DayFingerprint`], and the rows they stand
/// for (the sum of `sample_weight`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadBack {
    rows: u64,
    represented: u64,
    input_tokens: u64,
    output_tokens: u64,
    errors: u64,
    min_ts: Option<i64>,
    max_ts: Option<i64>,
}

impl ReadBack {
    /// Adds one row kept with `weight`.
    pub(crate) fn add_row(&mut self, row: &StoredRow<'_>, weight: u64) {
        let t = row.timestamp_ms as i64;
        self.add(&[t], &[i64::from(row.input_tokens)], &[i64::from(row.output_tokens)], &[row.error_code], &[weight as i64]);
    }

    /// Rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The rows they stand for.
    pub fn represented(&self) -> u64 {
        self.represented
    }

    /// Adds the fingerprint columns of a batch of rows.
    pub(crate) fn add(&mut self, ts: &[i64], input: &[i64], output: &[i64], errors: &[i32], weights: &[i64]) {
        self.rows += ts.len() as u64;
        self.represented += weights.iter().map(|v| *v as u64).sum::<u64>();
        self.input_tokens += input.iter().map(|v| *v as u64).sum::<u64>();
        self.output_tokens += output.iter().map(|v| *v as u64).sum::<u64>();
        self.errors += errors.iter().filter(|v| **v != 0).count() as u64;
        for &t in ts {
            self.min_ts = Some(self.min_ts.map_or(t, |m| m.min(t)));
            self.max_ts = Some(self.max_ts.map_or(t, |m| m.max(t)));
        }
    }

    pub(crate) fn fingerprint(&self) -> DayFingerprint {
        if self.rows == 0 {
            return DayFingerprint::EMPTY;
        }
        DayFingerprint {
            rows: self.rows,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            errors: self.errors,
            min_timestamp_ms: self.min_ts.unwrap_or(0) as u64,
            max_timestamp_ms: self.max_ts.unwrap_or(0) as u64,
        }
    }
}

/// Bytes kept from the end of an object while streaming it: the footer
/// (tens of KB for a 4M-row object) fits many times over.
const TAIL_BYTES: u64 = 1024 * 1024;

/// Sorted, merged ranges of `0..size` worth keeping: the hint and the tail.
fn kept_ranges(hint: &[Range<u64>], size: u64, tail: u64) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = hint.iter().map(|r| r.start.min(size)..r.end.min(size)).filter(|r| !r.is_empty()).collect();
    ranges.push(size.saturating_sub(tail)..size);
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// One object as streamed back from the store: its size, its SHA-256, and
/// the kept ranges, which serve the Parquet reader without another request.
#[derive(Debug)]
pub struct ReadBackObject {
    pub size: u64,
    pub sha256: String,
    kept: Vec<(u64, Bytes)>,
    fallback: inferlog_store::cold::ObjectReader,
}

impl ReadBackObject {
    /// Streams `key` once, hashing all of it and keeping the bytes of
    /// `hint` and of the tail (relative to the size the store reports).
    /// Memory is the kept ranges plus one chunk, whatever the object's size.
    pub async fn fetch(cold: &ColdStore, key: &str, hint: &[Range<u64>]) -> Result<ReadBackObject, CompactorError> {
        ReadBackObject::fetch_keeping(cold, key, hint, TAIL_BYTES).await
    }

    async fn fetch_keeping(cold: &ColdStore, key: &str, hint: &[Range<u64>], tail: u64) -> Result<ReadBackObject, CompactorError> {
        let get = cold.store().get(&Path::from(key)).await.map_err(StoreError::object("read back", key))?;
        let wanted = kept_ranges(hint, get.meta.size, tail);
        let mut kept: Vec<(u64, BytesMut)> = wanted.iter().map(|r| (r.start, BytesMut::with_capacity((r.end - r.start) as usize))).collect();
        let mut stream = get.into_stream();
        let mut hasher = Sha256::new();
        let mut position = 0u64;
        let mut next = 0usize; // first wanted range not yet complete
        while let Some(chunk) = stream.try_next().await.map_err(StoreError::object("read back", key))? {
            hasher.update(&chunk);
            let (from, to) = (position, position + chunk.len() as u64);
            while next < wanted.len() && wanted[next].end <= from {
                next += 1;
            }
            for (range, (_, buffer)) in wanted[next..].iter().zip(kept[next..].iter_mut()) {
                if range.start >= to {
                    break;
                }
                let (start, end) = (range.start.max(from), range.end.min(to));
                if start < end {
                    buffer.extend_from_slice(&chunk[(start - from) as usize..(end - from) as usize]);
                }
            }
            position = to;
        }
        // A short or long object keeps partial ranges; drop those, the size check rejects it anyway.
        let kept = kept
            .into_iter()
            .zip(&wanted)
            .filter(|((_, b), r)| b.len() as u64 == r.end - r.start)
            .map(|((start, b), _)| (start, b.freeze()))
            .collect();
        let fallback = cold.reader(key, position);
        Ok(ReadBackObject { size: position, sha256: hex::encode(hasher.finalize()), kept, fallback })
    }

    /// `range` from the kept bytes, if one kept range covers it.
    fn kept_slice(&self, range: &Range<u64>) -> Option<Bytes> {
        let index = self.kept.partition_point(|(start, _)| *start <= range.start).checked_sub(1)?;
        let (start, bytes) = &self.kept[index];
        let end = start + bytes.len() as u64;
        (range.end <= end).then(|| bytes.slice((range.start - start) as usize..(range.end - start) as usize))
    }
}

impl AsyncFileReader for ReadBackObject {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        match self.kept_slice(&range) {
            Some(bytes) => Box::pin(async move { Ok(bytes) }),
            None => self.fallback.get_bytes(range),
        }
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        match ranges.iter().map(|r| self.kept_slice(r)).collect::<Option<Vec<Bytes>>>() {
            Some(all) => Box::pin(async move { Ok(all) }),
            None => self.fallback.get_byte_ranges(ranges),
        }
    }

    fn get_metadata<'a>(&'a mut self, _options: Option<&'a ArrowReaderOptions>) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            Ok(Arc::new(ParquetMetaDataReader::new().load_and_finish(self, size).await?))
        })
    }
}

impl ReadBackObject {
    /// The row count in the object's footer, decoded from the kept tail. An
    /// object that is not Parquet fails verification of `day`.
    pub async fn footer_rows(self, day: Day) -> Result<u64, CompactorError> {
        let key = self.fallback.key();
        match ParquetRecordBatchStreamBuilder::new(self).await {
            Ok(builder) => Ok(builder.metadata().file_metadata().num_rows() as u64),
            Err(e) => Err(undecodable(day, &key, &e)),
        }
    }
}

/// The object read back is not the Parquet the archive writes (corrupt,
/// or another file under the day's key): a verification failure, never
/// retried as is (the day is archived again).
fn undecodable(day: Day, key: &str, e: &parquet::errors::ParquetError) -> CompactorError {
    match e {
        // The store failed mid-read: transient, the next pass reads again.
        parquet::errors::ParquetError::External(inner) if inner.is::<object_store::Error>() => {
            CompactorError::Archive { day: inferlog_store::day_string(day), message: format!("reading {key} back: {e}") }
        }
        _ => mismatch(day, key, format!("not a readable inferlog Parquet object: {e}")),
    }
}

fn mismatch(day: Day, key: &str, message: String) -> CompactorError {
    CompactorError::Verification { day: inferlog_store::day_string(day), key: key.to_owned(), message }
}

/// What the objects of a day must hold when read back: the fingerprint of
/// the rows archived, and the rows they stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub fingerprint: DayFingerprint,
    pub represented_rows: u64,
}

impl Expected {
    /// Every row of `fp`, weight 1 (an archive without sampling).
    pub fn all(fp: &DayFingerprint) -> Expected {
        Expected { fingerprint: *fp, represented_rows: fp.rows }
    }

    /// The rows `kept` (ClickHouse's rows `day`, as the rule selects them),
    /// standing for all `day_rows` of the day.
    pub fn sampled(kept: &ReadBack, day_rows: u64) -> Expected {
        Expected { fingerprint: kept.fingerprint(), represented_rows: day_rows }
    }
}

/// Reads every object back and checks it against what was written and
/// against `expected` (from ClickHouse's rows of the day).
pub async fn verify_day(cold: &ColdStore, day: Day, objects: &[WrittenObject], expected: &Expected) -> Result<Vec<ManifestEntry>, CompactorError> {
    let mut total = ReadBack::default();
    let mut entries = Vec::with_capacity(objects.len());
    for object in objects {
        let read_back = ReadBackObject::fetch(cold, &object.key, &object.fingerprint_ranges).await?;
        let (size, sha256) = (read_back.size, read_back.sha256.clone());
        if size != object.bytes || sha256 != object.sha256 {
            return Err(mismatch(
                day,
                &object.key,
                format!("read back {size} bytes sha256 {sha256}, wrote {} bytes sha256 {}", object.bytes, object.sha256),
            ));
        }
        let (object_rows, sums) = read_columns(read_back, day, object).await?;
        if object_rows != object.rows {
            return Err(mismatch(day, &object.key, format!("decoded {object_rows} rows, wrote {}", object.rows)));
        }
        total.rows += object_rows;
        total.represented += sums.represented;
        total.input_tokens += sums.input_tokens;
        total.output_tokens += sums.output_tokens;
        total.errors += sums.errors;
        for t in [sums.min_ts, sums.max_ts].into_iter().flatten() {
            total.min_ts = Some(total.min_ts.map_or(t, |m| m.min(t)));
            total.max_ts = Some(total.max_ts.map_or(t, |m| m.max(t)));
        }
        entries.push(ManifestEntry {
            object_key: object.key.clone(),
            day,
            rows: object.rows,
            represented_rows: sums.represented,
            bytes: size,
            sha256,
            schema_version: SCHEMA_VERSION,
        });
    }
    let found = total.fingerprint();
    let key = objects.first().map_or("-", |o| o.key.as_str());
    if found != expected.fingerprint {
        return Err(mismatch(day, key, format!("archive has {}, ClickHouse has {}", found.encode(), expected.fingerprint.encode())));
    }
    if total.represented != expected.represented_rows {
        return Err(mismatch(
            day,
            key,
            format!("the archive's weights add up to {} rows, ClickHouse has {}", total.represented, expected.represented_rows),
        ));
    }
    Ok(entries)
}

/// The footer (row count, schema version) and the fingerprint columns of
/// one object: (rows decoded, their aggregates).
async fn read_columns(reader: ReadBackObject, day: Day, object: &WrittenObject) -> Result<(u64, ReadBack), CompactorError> {
    let parquet_err = |e: parquet::errors::ParquetError| undecodable(day, &object.key, &e);
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await.map_err(parquet_err)?;
    let meta = builder.metadata().file_metadata();
    if meta.num_rows() as u64 != object.rows {
        return Err(mismatch(day, &object.key, format!("footer has {} rows, wrote {}", meta.num_rows(), object.rows)));
    }
    let version = meta.key_value_metadata().and_then(|kv| kv.iter().find(|e| e.key == "inferlog.schema_version")).and_then(|e| e.value.clone());
    if version.as_deref() != Some(SCHEMA_VERSION.to_string().as_str()) {
        return Err(mismatch(day, &object.key, format!("schema version {version:?} in the footer, expected {SCHEMA_VERSION}")));
    }
    let mut total = ReadBack::default();
    let schema = builder.parquet_schema();
    let column = |name: &str| schema.columns().iter().position(|c| c.name() == name);
    let leaves: Vec<usize> = FINGERPRINT_COLUMNS.iter().filter_map(|n| column(n)).collect();
    if leaves.len() != FINGERPRINT_COLUMNS.len() {
        return Err(mismatch(day, &object.key, "a fingerprint column is missing".into()));
    }
    let mask = ProjectionMask::leaves(schema, leaves);
    let mut batches = builder.with_projection(mask).with_batch_size(65_536).build().map_err(parquet_err)?;
    while let Some(batch) = batches.try_next().await.map_err(parquet_err)? {
        // A file of another schema under the day's key: say which column differs.
        let wrong_type = |i: usize| {
            let field = batch.schema_ref().field(i).clone();
            mismatch(day, &object.key, format!("column {} is {}, the archive writes {}", field.name(), field.data_type(), archive_type(field.name())))
        };
        let ts = batch.column(0).as_primitive_opt::<TimestampMillisecondType>().ok_or_else(|| wrong_type(0))?;
        let input = batch.column(1).as_primitive_opt::<Int64Type>().ok_or_else(|| wrong_type(1))?;
        let output = batch.column(2).as_primitive_opt::<Int64Type>().ok_or_else(|| wrong_type(2))?;
        let errors = batch.column(3).as_primitive_opt::<Int32Type>().ok_or_else(|| wrong_type(3))?;
        let weights = batch.column(4).as_primitive_opt::<Int64Type>().ok_or_else(|| wrong_type(4))?;
        total.add(ts.values(), input.values(), output.values(), errors.values(), weights.values());
    }
    Ok((total.rows, total))
}

/// The type the archive writes for column `name`, for a mismatch message.
fn archive_type(name: &str) -> String {
    archive_schema().field_with_name(name).map_or_else(|_| "no such column".to_owned(), |f| f.data_type().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fingerprint_ranges;
    use inferlog_schema::ErrorClass;
    use inferlog_store::model::archive::BatchBuilder;
    use inferlog_store::model::sample::Reason;
    use inferlog_store::model::stored::StoredRow;
    use inferlog_store::ColdConfig;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;

    #[test]
    fn kept_ranges_are_clipped_sorted_and_merged_with_the_tail() {
        let hint = [50..60, 10..20, 15..30, 95..120, 200..300];
        assert_eq!(kept_ranges(&hint, 100, 10), vec![10..30, 50..60, 90..100]);
        assert_eq!(kept_ranges(&[], 5, 10), vec![0..5]);
    }

    /// Writes `rows` generated rows as one Parquet object of small row
    /// groups and returns what the archive stage would have recorded.
    async fn write_object(cold: &ColdStore, key: &str, rows: usize) -> (WrittenObject, Expected) {
        let ids: Vec<String> = (0..rows).map(|i| format!("{:016x}{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15), i * 7919)).collect();
        let mut builder = BatchBuilder::new(archive_schema());
        let mut expected = ReadBack::default();
        for (i, id) in ids.iter().enumerate() {
            let row = StoredRow {
                timestamp_ms: 1_764_000_000_000 + i as u64 * 37,
                request_id: id,
                business_line: "search",
                model_name: "m",
                model_version: "v1",
                input_tokens: (i % 4000) as u32,
                output_tokens: (i % 700) as u32,
                total_latency_ms: i as f64 * 0.25,
                error_code: if i % 50 == 0 { 1003 } else { 0 },
                error_stage: None,
                user_id_hash: Some(id),
                tenant: None,
                session_id: None,
                request_type: None,
                queue_wait_ms: None,
                prefill_time_ms: None,
                decode_time_ms: None,
                ttft_ms: None,
                tpot_ms: None,
                gpu_id: None,
                batch_size: None,
                cache_hit: None,
                cache_prefix_tokens: None,
                gpu_mem_peak_mb: None,
                truncated: None,
                prompt_hash: None,
                max_tokens: None,
                schema_version: 1,
                kafka_topic: "t",
                kafka_partition: 0,
                kafka_offset: i as u64,
                kafka_index: 0,
                ingested_at: 1_764_000_001,
            };
            // Weights of a sampled archive: 3 rows each.
            builder.append(&row, Reason::Sampled, 3);
            expected.represented += 3;
            expected.rows += 1;
            expected.input_tokens += u64::from(row.input_tokens);
            expected.output_tokens += u64::from(row.output_tokens);
            expected.errors += u64::from(row.error_code != 0);
            let t = row.timestamp_ms as i64;
            expected.min_ts = Some(expected.min_ts.map_or(t, |m| m.min(t)));
            expected.max_ts = Some(expected.max_ts.map_or(t, |m| m.max(t)));
        }
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows / 4))
            .set_key_value_metadata(Some(vec![KeyValue::new("inferlog.schema_version".into(), SCHEMA_VERSION.to_string())]))
            .build();
        let mut bytes = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut bytes, archive_schema(), Some(properties)).expect("writer");
        writer.write(&builder.finish().expect("batch")).expect("write");
        let metadata = writer.close().expect("close");
        cold.store().put(&Path::from(key), bytes.clone().into()).await.expect("put");
        let object = WrittenObject {
            key: key.to_owned(),
            rows: rows as u64,
            bytes: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
            fingerprint_ranges: fingerprint_ranges(&metadata),
        };
        (object, Expected { fingerprint: expected.fingerprint(), represented_rows: expected.represented })
    }

    fn local_store(dir: &std::path::Path) -> ColdStore {
        ColdStore::new(&ColdConfig { url: format!("file://{}/", dir.display()), ..ColdConfig::default() }).expect("cold store")
    }

    #[tokio::test]
    async fn one_streamed_read_serves_the_footer_and_the_fingerprint_columns() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cold = local_store(dir.path());
        let (object, expected) = write_object(&cold, "dt=2025-11-24/part-0000.parquet", 40_000).await;
        let tail = 32 * 1024;
        assert!(object.bytes > 8 * tail, "the object ({} bytes) must be larger than what is kept", object.bytes);
        assert_eq!(object.fingerprint_ranges.len(), 20, "5 columns x 4 row groups");

        let read_back = ReadBackObject::fetch_keeping(&cold, &object.key, &object.fingerprint_ranges, tail).await.expect("fetch");
        assert_eq!((read_back.size, read_back.sha256.as_str()), (object.bytes, object.sha256.as_str()));
        // With the object gone, decoding can only use what the one read kept.
        cold.delete(&object.key).await.expect("delete");
        let (rows, sums) = read_columns(read_back, 20_416, &object).await.expect("decoded from kept bytes");
        assert_eq!(rows, object.rows);
        assert_eq!(Expected { fingerprint: sums.fingerprint(), represented_rows: sums.represented() }, expected);

        // Without the hint the columns are not kept, and the (now missing) object is asked for again.
        let (object, _) = write_object(&cold, "dt=2025-11-24/part-0001.parquet", 40_000).await;
        let read_back = ReadBackObject::fetch_keeping(&cold, &object.key, &[], tail).await.expect("fetch");
        cold.delete(&object.key).await.expect("delete");
        assert!(read_columns(read_back, 20_416, &object).await.is_err(), "columns outside the kept ranges need the store");
    }

    #[tokio::test]
    async fn verify_day_accepts_the_object_as_written_and_rejects_a_changed_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cold = local_store(dir.path());
        let day = 20_416;
        let (object, expected) = write_object(&cold, "dt=2025-11-24/part-0000.parquet", 20_000).await;
        let entries = verify_day(&cold, day, std::slice::from_ref(&object), &expected).await.expect("verified");
        assert_eq!((entries.len(), entries[0].rows, entries[0].bytes), (1, object.rows, object.bytes));

        assert_eq!(entries[0].represented_rows, 3 * object.rows, "the weights");
        let wrong =
            Expected { fingerprint: DayFingerprint { input_tokens: expected.fingerprint.input_tokens + 1, ..expected.fingerprint }, ..expected };
        let e = verify_day(&cold, day, std::slice::from_ref(&object), &wrong).await.expect_err("a sum that differs fails");
        assert!(e.to_string().contains("ClickHouse has"), "{e}");
        let short = Expected { represented_rows: expected.represented_rows + 1, ..expected };
        let e = verify_day(&cold, day, std::slice::from_ref(&object), &short).await.expect_err("weights that differ fail");
        assert!(e.to_string().contains("weights add up to"), "{e}");

        let path = Path::from(object.key.as_str());
        let mut bytes = cold.store().get(&path).await.expect("get").bytes().await.expect("bytes").to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x55;
        cold.store().put(&path, bytes.into()).await.expect("put");
        let e = verify_day(&cold, day, std::slice::from_ref(&object), &expected).await.expect_err("a changed byte fails");
        assert!(e.to_string().contains("sha256"), "{e}");
    }

    /// What the compactor does after a crash between archiving and
    /// verifying: digest the object as the store holds it, read its footer,
    /// verify. Returns the error verification ends with.
    async fn verify_as_relisted(cold: &ColdStore, key: &str, expected: &Expected) -> CompactorError {
        let day = 20_416;
        let read_back = ReadBackObject::fetch(cold, key, &[]).await.expect("fetch");
        let (bytes, sha256) = (read_back.size, read_back.sha256.clone());
        let rows = match read_back.footer_rows(day).await {
            Ok(rows) => rows,
            Err(e) => return e,
        };
        let object = WrittenObject { key: key.to_owned(), rows, bytes, sha256, fingerprint_ranges: Vec::new() };
        verify_day(cold, day, &[object], expected).await.expect_err("a foreign object never verifies")
    }

    #[tokio::test]
    async fn a_corrupt_or_foreign_object_fails_verification_without_a_panic() {
        use arrow_array::{Int64Array, RecordBatch, StringArray};
        use arrow_schema::{DataType, Field, Schema};
        let dir = tempfile::tempdir().expect("tempdir");
        let cold = local_store(dir.path());
        let key = "dt=2025-11-24/part-0000.parquet";
        let (_, expected) = write_object(&cold, key, 1_000).await;

        // Bytes changed after upload: the footer no longer decodes.
        let path = Path::from(key);
        let mut bytes = cold.store().get(&path).await.expect("get").bytes().await.expect("bytes").to_vec();
        let len = bytes.len();
        bytes[len - 6] ^= 0xff; // inside the footer length / magic
        cold.store().put(&path, bytes.into()).await.expect("put");
        let e = verify_as_relisted(&cold, key, &expected).await;
        assert_eq!(e.class(), ErrorClass::Reject, "{e}");
        assert!(e.to_string().contains(key) && e.to_string().contains("not a readable"), "{e}");

        // A valid Parquet file of another schema, claiming our schema version.
        let schema = Arc::new(Schema::new(vec![
            Field::new("timestamp", DataType::Utf8, false),
            Field::new("input_tokens", DataType::Int64, false),
            Field::new("output_tokens", DataType::Int64, false),
            Field::new("error_code", DataType::Int64, false),
            Field::new("sample_weight", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["2025-11-24"; 3])),
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(Int64Array::from(vec![0, 0, 1])),
                Arc::new(Int64Array::from(vec![1, 1, 1])),
            ],
        )
        .expect("batch");
        let properties = WriterProperties::builder()
            .set_key_value_metadata(Some(vec![KeyValue::new("inferlog.schema_version".into(), SCHEMA_VERSION.to_string())]))
            .build();
        let mut foreign = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut foreign, schema, Some(properties)).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
        cold.store().put(&path, foreign.into()).await.expect("put");
        let e =
            verify_as_relisted(&cold, key, &Expected { fingerprint: DayFingerprint { rows: 3, ..expected.fingerprint }, represented_rows: 3 }).await;
        assert_eq!(e.class(), ErrorClass::Reject, "{e}");
        assert!(e.to_string().contains("column timestamp is Utf8"), "names the column and the difference: {e}");
    }
}
