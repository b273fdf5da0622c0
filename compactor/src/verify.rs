//! Verify stage. In: the objects the archive stage wrote, and the day's
//! fingerprint as ClickHouse computes it now. Out: manifest entries, only
//! if every object read back from the store has the bytes that were
//! written (size and SHA-256), a Parquet footer with the expected row
//! count and schema version, and the day's column aggregates (rows, token
//! sums, errors, first and last timestamp) equal ClickHouse's.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMillisecondType};
use futures_util::TryStreamExt;
use inferlog_schema::SCHEMA_VERSION;
use inferlog_store::catalog::ManifestEntry;
use inferlog_store::cold::ColdStore;
use inferlog_store::hot::DayFingerprint;
use inferlog_store::{Day, StoreError};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use object_store::ObjectStore;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use sha2::{Digest, Sha256};

use crate::archive::WrittenObject;
use crate::error::CompactorError;

/// Column aggregates of the objects read back, comparable to a [`DayFingerprint`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct ReadBack {
    rows: u64,
    input_tokens: u64,
    output_tokens: u64,
    errors: u64,
    min_ts: Option<i64>,
    max_ts: Option<i64>,
}

impl ReadBack {
    fn fingerprint(&self) -> DayFingerprint {
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

/// Ranged reads of one object of known size, for the Parquet reader.
#[derive(Debug)]
pub struct ObjectReader {
    pub store: Arc<dyn ObjectStore>,
    pub path: Path,
    pub size: u64,
}

fn external(e: object_store::Error) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(e))
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        Box::pin(async move { self.store.get_range(&self.path, range).await.map_err(external) })
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move { self.store.get_ranges(&self.path, &ranges).await.map_err(external) })
    }

    fn get_metadata<'a>(&'a mut self, _options: Option<&'a ArrowReaderOptions>) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            Ok(Arc::new(ParquetMetaDataReader::new().load_and_finish(self, size).await?))
        })
    }
}

/// The row count in the footer of one object of `size` bytes.
pub async fn footer_rows(cold: &ColdStore, key: &str, size: u64) -> Result<u64, CompactorError> {
    let reader = ObjectReader { store: cold.store().clone(), path: Path::from(key), size };
    let builder = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(|source| CompactorError::Parquet { operation: "read footer", key: key.to_owned(), source })?;
    Ok(builder.metadata().file_metadata().num_rows() as u64)
}

fn mismatch(day: Day, key: &str, message: String) -> CompactorError {
    CompactorError::Verification { day: inferlog_store::day_string(day), key: key.to_owned(), message }
}

/// Reads every object back and checks it against what was written and
/// against `expected` (ClickHouse's fingerprint of the day).
pub async fn verify_day(
    cold: &ColdStore,
    day: Day,
    objects: &[WrittenObject],
    expected: &DayFingerprint,
) -> Result<Vec<ManifestEntry>, CompactorError> {
    let mut total = ReadBack::default();
    let mut entries = Vec::with_capacity(objects.len());
    for object in objects {
        // Two reads of one object, one after the other: reading both at once
        // measured no faster against the local S3 server (see README).
        let (size, sha256) = object_digest(cold, &object.key).await?;
        if size != object.bytes || sha256 != object.sha256 {
            return Err(mismatch(day, &object.key, format!("read back {size} bytes sha256 {sha256}, wrote {} bytes sha256 {}", object.bytes, object.sha256)));
        }
        let (object_rows, sums) = read_columns(cold, day, object).await?;
        if object_rows != object.rows {
            return Err(mismatch(day, &object.key, format!("decoded {object_rows} rows, wrote {}", object.rows)));
        }
        total.rows += object_rows;
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
            bytes: size,
            sha256,
            schema_version: SCHEMA_VERSION,
        });
    }
    let found = total.fingerprint();
    if found != *expected {
        let key = objects.first().map_or("-", |o| o.key.as_str());
        return Err(mismatch(day, key, format!("archive has {}, ClickHouse has {}", found.encode(), expected.encode())));
    }
    Ok(entries)
}

/// Size and SHA-256 of an object as the store returns it, streamed so
/// memory does not grow with the object.
pub async fn object_digest(cold: &ColdStore, key: &str) -> Result<(u64, String), CompactorError> {
    let get = cold.store().get(&Path::from(key)).await.map_err(StoreError::object("read back", key))?;
    let mut stream = get.into_stream();
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = stream.try_next().await.map_err(StoreError::object("read back", key))? {
        hasher.update(&chunk);
        size += chunk.len() as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// The footer (row count, schema version) and the fingerprint columns of
/// one object: (rows decoded, their aggregates).
async fn read_columns(cold: &ColdStore, day: Day, object: &WrittenObject) -> Result<(u64, ReadBack), CompactorError> {
    let reader = ObjectReader { store: cold.store().clone(), path: Path::from(object.key.as_str()), size: object.bytes };
    let parquet_err = |source| CompactorError::Parquet { operation: "read back", key: object.key.clone(), source };
    let builder = ParquetRecordBatchStreamBuilder::new(reader).await.map_err(parquet_err)?;
    let meta = builder.metadata().file_metadata();
    if meta.num_rows() as u64 != object.rows {
        return Err(mismatch(day, &object.key, format!("footer has {} rows, wrote {}", meta.num_rows(), object.rows)));
    }
    let version = meta
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|e| e.key == "inferlog.schema_version"))
        .and_then(|e| e.value.clone());
    if version.as_deref() != Some(SCHEMA_VERSION.to_string().as_str()) {
        return Err(mismatch(day, &object.key, format!("schema version {version:?} in the footer, expected {SCHEMA_VERSION}")));
    }
    let mut total = ReadBack::default();
    let schema = builder.parquet_schema();
    let column = |name: &str| schema.columns().iter().position(|c| c.name() == name);
    let wanted = ["timestamp", "input_tokens", "output_tokens", "error_code"];
    let leaves: Vec<usize> = wanted.iter().filter_map(|n| column(n)).collect();
    if leaves.len() != wanted.len() {
        return Err(mismatch(day, &object.key, "a fingerprint column is missing".into()));
    }
    let mask = ProjectionMask::leaves(schema, leaves);
    let mut batches = builder.with_projection(mask).with_batch_size(65_536).build().map_err(parquet_err)?;
    while let Some(batch) = batches.try_next().await.map_err(parquet_err)? {
        let ts = batch.column(0).as_primitive::<TimestampMillisecondType>();
        let input = batch.column(1).as_primitive::<Int64Type>();
        let output = batch.column(2).as_primitive::<Int64Type>();
        let errors = batch.column(3).as_primitive::<Int32Type>();
        total.rows += batch.num_rows() as u64;
        total.input_tokens += input.values().iter().map(|v| *v as u64).sum::<u64>();
        total.output_tokens += output.values().iter().map(|v| *v as u64).sum::<u64>();
        total.errors += errors.values().iter().filter(|v| **v != 0).count() as u64;
        for &t in ts.values().iter() {
            total.min_ts = Some(total.min_ts.map_or(t, |m| m.min(t)));
            total.max_ts = Some(total.max_ts.map_or(t, |m| m.max(t)));
        }
    }
    Ok((total.rows, total))
}
