//! Archive stage. In: one closed UTC day of hot rows, streamed from
//! ClickHouse in sort-key order. Out: Parquet objects (ZSTD) on the cold
//! store under `dt=YYYY-MM-DD/part-NNNN.parquet`, each with its row count,
//! size and SHA-256 as written.
//!
//! Memory stays bounded whatever the day's size: rows become Arrow batches
//! of [`BATCH_ROWS`], two batches at most wait between the ClickHouse
//! reader task and the Parquet encoder, the encoder holds one row group,
//! and the upload is multipart with a fixed part size.
//!
//! The rows' schema is [`inferlog_store::model::archive`]; what is recorded
//! per object is [`crate::format`].
//!
//! With a sampling [`Rule`], the day is read twice: once to count each
//! stratum's ordinary rows ([`Planner`]), then to archive the rows the rule
//! keeps, each with its weight and reason ([`Selector`]). The sink (the
//! aggregates' fold) sees every row either way.

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use bytes::Bytes;
use clickhouse::query::RowCursor;
use futures_util::future::BoxFuture;
use inferlog_schema::SCHEMA_VERSION;
use inferlog_store::cold::ColdStore;
use inferlog_store::hot::{HotTier, ReadMode, UnitSource};
use inferlog_store::model::archive::{archive_schema, column_encodings, BatchBuilder, BATCH_ROWS};
use inferlog_store::model::fold::DayFold;
use inferlog_store::model::sample::{Planner, Reason, Rule, Selector, Summary};
use inferlog_store::model::stored::StoredRow;
use inferlog_store::model::tables::HOT;
use inferlog_store::model::unit::Unit;
use inferlog_store::{ColdConfig, Day};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use parquet::arrow::async_writer::{AsyncArrowWriter, AsyncFileWriter};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::error::CompactorError;
use crate::format::{fingerprint_ranges, WrittenObject};
use crate::verify::ReadBack;

/// Multipart upload part size: S3's minimum is 5 MiB; 8 MiB (the AWS CLI's
/// default) keeps little unsent when the last row group is written, so the
/// close waits for less than with 16 MiB (measured: 0.59 s → 0.43 s).
const UPLOAD_PART_BYTES: usize = 8 * 1024 * 1024;

/// Where the archive's reader hands each row besides the Parquet batches
/// (the aggregates' [`DayFold`]), so the day is read from ClickHouse once.
pub trait RowSink: Send + 'static {
    fn row(&mut self, row: &StoredRow<'_>);
}

/// The aggregates' fold counts every row archived.
impl RowSink for DayFold {
    fn row(&mut self, row: &StoredRow<'_>) {
        self.add(&row.fold_row());
    }
}

/// Rows written, not counted (a supplement has no aggregates of its own).
impl RowSink for () {
    fn row(&mut self, _: &StoredRow<'_>) {}
}

/// Forwards Parquet bytes to a multipart upload, hashing them on the way.
pub(crate) struct HashingUpload {
    inner: BufWriter,
    hasher: Sha256,
    bytes: u64,
    /// Set on `complete`: (sha256 hex, bytes).
    done: Arc<Mutex<Option<(String, u64)>>>,
}

impl AsyncFileWriter for HashingUpload {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.hasher.update(&bs);
        self.bytes += bs.len() as u64;
        Box::pin(async move { self.inner.put(bs).await.map_err(|e| parquet::errors::ParquetError::External(Box::new(e))) })
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        Box::pin(async move {
            tokio::io::AsyncWriteExt::shutdown(&mut self.inner).await.map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
            let digest = hex::encode(std::mem::take(&mut self.hasher).finalize());
            if let Ok(mut done) = self.done.lock() {
                *done = Some((digest, self.bytes));
            }
            Ok(())
        })
    }
}

/// The first pass of a sampled archive counts every row.
impl RowSink for Planner {
    fn row(&mut self, row: &StoredRow<'_>) {
        self.add(row);
    }
}

/// What a sampled archive kept: the fingerprint of the rows kept (and the
/// rows they stand for), and the rows per business line and reason.
#[derive(Debug, Clone)]
pub struct Sampled {
    pub kept: ReadBack,
    pub summary: Summary,
}

/// The second pass of a sampled archive: each row's decision, and the
/// fingerprint of the rows kept.
#[derive(Debug)]
pub struct Selecting {
    selector: Selector,
    kept: ReadBack,
}

impl Selecting {
    fn select(&mut self, row: &StoredRow<'_>) -> Option<(Reason, u64)> {
        let decision = self.selector.select(row);
        if let Some((_, weight)) = decision {
            self.kept.add_row(row, weight);
        }
        decision
    }

    fn finish(self, day: Day) -> Result<Sampled, CompactorError> {
        let summary = self.selector.finish().map_err(|message| CompactorError::RowsChanged {
            day: inferlog_store::day_string(day),
            step: "archiving",
            message,
        })?;
        Ok(Sampled { kept: self.kept, summary })
    }
}

/// What archiving a day with a rule keeps, counted without writing.
impl RowSink for Selecting {
    fn row(&mut self, row: &StoredRow<'_>) {
        self.select(row);
    }
}

/// Everything the archive stage needs.
#[derive(Debug, Clone)]
pub struct Archiver {
    pub hot: HotTier,
    pub cold: ColdStore,
    pub config: ColdConfig,
    pub sort_memory_bytes: u64,
}

pub(crate) struct OpenObject {
    pub(crate) writer: AsyncArrowWriter<HashingUpload>,
    pub(crate) key: String,
    pub(crate) rows: u64,
    done: Arc<Mutex<Option<(String, u64)>>>,
}

impl Archiver {
    fn properties(&self, day: Day, part: u32) -> WriterProperties {
        let level = ZstdLevel::try_new(self.config.zstd_level).unwrap_or_default();
        let kv = |k: &str, v: String| KeyValue::new(k.to_owned(), v);
        // Each column's encoding, as `store/hot_row.toml` sets it.
        let builder = column_encodings(WriterProperties::builder());
        builder
            .set_compression(Compression::ZSTD(level))
            .set_max_row_group_row_count(Some(self.config.row_group_rows))
            .set_created_by(format!("inferlog-compactor {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(vec![
                kv("inferlog.schema_version", SCHEMA_VERSION.to_string()),
                kv("inferlog.day", inferlog_store::day_string(day)),
                kv("inferlog.part", part.to_string()),
            ]))
            .build()
    }

    pub(crate) fn open(&self, day: Day, part: u32, key: String) -> Result<OpenObject, CompactorError> {
        let upload = BufWriter::with_capacity(self.cold.store().clone(), Path::from(key.as_str()), UPLOAD_PART_BYTES)
            .with_max_concurrency(self.config.upload_concurrency);
        let done = Arc::new(Mutex::new(None));
        let sink = HashingUpload { inner: upload, hasher: Sha256::new(), bytes: 0, done: done.clone() };
        let writer = AsyncArrowWriter::try_new(sink, archive_schema(), Some(self.properties(day, part)))
            .map_err(|source| CompactorError::Parquet { operation: "open", key: key.clone(), source })?;
        Ok(OpenObject { writer, key, rows: 0, done })
    }

    pub(crate) async fn close(&self, object: OpenObject) -> Result<WrittenObject, CompactorError> {
        let OpenObject { writer, key, rows, done } = object;
        let closing = std::time::Instant::now();
        let metadata = writer.close().await.map_err(|source| CompactorError::Parquet { operation: "close", key: key.clone(), source })?;
        tracing::debug!(%key, rows, close_ms = closing.elapsed().as_millis() as u64, "object closed (last row group, footer, upload completed)");
        let (sha256, bytes) = done
            .lock()
            .ok()
            .and_then(|d| d.clone())
            .ok_or_else(|| CompactorError::Archive { day: key.clone(), message: "upload completed without a digest".into() })?;
        Ok(WrittenObject { key, rows, bytes, sha256, fingerprint_ranges: fingerprint_ranges(&metadata) })
    }

    /// Writes the day's rows (those `sampling` keeps, if given) as
    /// `part-0000`, `part-0001`, … objects of at most `object_max_rows`
    /// rows each, and returns them as written, with `sink` after it saw
    /// every row, and with sampling what was kept.
    pub async fn archive_day<S: RowSink>(
        &self,
        day: Day,
        mode: ReadMode,
        sink: S,
        sampling: Option<&Rule>,
    ) -> Result<(Vec<WrittenObject>, S, Option<Sampled>), CompactorError> {
        let read = self.whole(day, mode);
        let selecting = match sampling {
            Some(rule) => Some(self.plan(&read, rule).await?),
            None => None,
        };
        self.archive_as(read, sink, selecting, |part| self.cold.object_key(day, part)).await
    }

    /// Writes the rows of `unit` of `day` (those `sampling` keeps, if
    /// given: a sampled day's units hold whole strata) as
    /// `unit-UUUU-of-NNNN-part-KKKK` objects of at most `object_max_rows`
    /// rows each, in the day's order; the same rows make the same objects,
    /// so a unit written again replaces its objects. The rows are read from
    /// `source` (on a cluster, the unit's shard on a replica that confirmed
    /// them); `sink` sees every row (the unit's fold).
    pub async fn archive_unit<S: RowSink>(
        &self,
        (day, mode): (Day, ReadMode),
        unit: &Unit,
        source: UnitSource,
        sink: S,
        sampling: Option<&Rule>,
    ) -> Result<(Vec<WrittenObject>, S, Option<Sampled>), CompactorError> {
        let read = Read { day, mode, unit: unit.clone(), source };
        let selecting = match sampling {
            Some(rule) => Some(self.plan(&read, rule).await?),
            None => None,
        };
        self.archive_as(read, sink, selecting, |part| self.cold.unit_object_key(day, unit, part)).await
    }

    /// First pass of a sampled archive: each stratum's counts over `read`.
    async fn plan(&self, read: &Read, rule: &Rule) -> Result<Selecting, CompactorError> {
        let planner = self.fold(read, Planner::new(rule.clone())).await?;
        Ok(Selecting { selector: planner.finish(), kept: ReadBack::default() })
    }

    /// What archiving `day` with `rule` keeps, without writing anything
    /// (to verify objects a killed run wrote).
    pub async fn selected(&self, day: Day, mode: ReadMode, rule: &Rule) -> Result<Sampled, CompactorError> {
        let read = self.whole(day, mode);
        let selecting = self.plan(&read, rule).await?;
        self.fold(&read, selecting).await?.finish(day)
    }

    /// Writes the rows a released day holds again (rows that arrived after
    /// its release) as supplement objects `late-<tag>-NNNN` beside its
    /// archive; the same `tag` (of the same rows) names the same objects.
    pub async fn archive_supplement(&self, day: Day, mode: ReadMode, tag: &str) -> Result<Vec<WrittenObject>, CompactorError> {
        // Late rows are few: kept whole, whatever the sampling.
        let (written, (), _) = self.archive_as(self.whole(day, mode), (), None, |part| self.cold.supplement_key(day, tag, part)).await?;
        Ok(written)
    }

    /// The whole of `day`, read as the hot tier's table names it.
    fn whole(&self, day: Day, mode: ReadMode) -> Read {
        Read { day, mode, unit: Unit::whole_day(), source: self.hot.source() }
    }

    async fn archive_as<S: RowSink>(
        &self,
        read: Read,
        sink: S,
        selecting: Option<Selecting>,
        key: impl Fn(u32) -> String,
    ) -> Result<(Vec<WrittenObject>, S, Option<Sampled>), CompactorError> {
        let day = read.day;
        let (tx, mut rx) = mpsc::channel::<RecordBatch>(2);
        let reader = tokio::spawn(read_day(self.hot.clone(), read, self.sort_memory_bytes, tx, sink, selecting));
        let mut written = Vec::new();
        let mut current: Option<OpenObject> = None;
        let max_rows = self.config.object_max_rows;
        let result: Result<(), CompactorError> = async {
            while let Some(batch) = rx.recv().await {
                let mut offset = 0;
                while offset < batch.num_rows() {
                    if current.is_none() {
                        let part = written.len() as u32;
                        current = Some(self.open(day, part, key(part))?);
                    }
                    let Some(object) = current.as_mut() else { break };
                    let take = ((max_rows - object.rows) as usize).min(batch.num_rows() - offset);
                    object.writer.write(&batch.slice(offset, take)).await.map_err(|source| CompactorError::Parquet {
                        operation: "write",
                        key: object.key.clone(),
                        source,
                    })?;
                    object.rows += take as u64;
                    offset += take;
                    if object.rows == max_rows {
                        if let Some(full) = current.take() {
                            written.push(self.close(full).await?);
                        }
                    }
                }
            }
            if let Some(last) = current.take() {
                written.push(self.close(last).await?);
            }
            Ok(())
        }
        .await;
        // The reader's error explains a closed channel; report it first.
        let read =
            reader.await.map_err(|e| CompactorError::Archive { day: inferlog_store::day_string(day), message: format!("reader task: {e}") })?;
        let (rows, sink, selecting) = read?;
        result?;
        let archived: u64 = written.iter().map(|o| o.rows).sum();
        if rows != archived {
            return Err(CompactorError::Archive {
                day: inferlog_store::day_string(day),
                message: format!("{rows} rows kept but {archived} written"),
            });
        }
        let sampled = match selecting {
            Some(selecting) => Some(selecting.finish(day)?),
            None => None,
        };
        Ok((written, sink, sampled))
    }

    /// Streams the day's rows as [`Archiver::archive_day`] reads them into
    /// `sink` only (for a day an earlier run archived).
    pub async fn fold_day<S: RowSink>(&self, day: Day, mode: ReadMode, sink: S) -> Result<S, CompactorError> {
        self.fold(&self.whole(day, mode), sink).await
    }

    /// Streams the rows of `read` into `sink` only.
    async fn fold<S: RowSink>(&self, read: &Read, mut sink: S) -> Result<S, CompactorError> {
        let mut cursor = day_rows(&self.hot, read, self.sort_memory_bytes)?;
        while let Some(row) = cursor.next().await.map_err(self.hot.error("archive read"))? {
            sink.row(&row);
        }
        Ok(sink)
    }
}

/// What one read of the hot tier covers: a day (or a unit of it), how it
/// is read, and from where.
#[derive(Debug, Clone)]
struct Read {
    day: Day,
    mode: ReadMode,
    unit: Unit,
    source: UnitSource,
}

/// The day's rows (those of the read's unit, from its source) in sort-key
/// order (so the same rows make the same objects), producer retries
/// collapsed: a day merged into one part is read as is by one thread,
/// which is in key order; otherwise it is read with `FINAL` and sorted.
fn day_rows(hot: &HotTier, read: &Read, sort_memory_bytes: u64) -> Result<RowCursor<StoredRow<'static>>, CompactorError> {
    let Read { day, mode, unit, source } = read;
    let mode = *mode;
    // The table's own order, then the Kafka coordinates: what one merged part holds.
    let order = match mode {
        ReadMode::OnePart => String::new(),
        ReadMode::Final => format!("ORDER BY {}, kafka_topic, kafka_partition, kafka_offset", HOT.order_by),
    };
    let sql =
        format!("SELECT {} FROM {} {} WHERE day = toDate(?) AND {} {order}", StoredRow::select_list(), source.table, mode.modifier(), unit.condition);
    Ok(source
        .client
        .clone()
        .with_setting("max_bytes_before_external_sort", sort_memory_bytes.to_string())
        .with_setting("max_threads", if mode == ReadMode::OnePart { "1" } else { "0" })
        .query(&sql)
        .bind(inferlog_store::day_string(*day))
        .fetch::<StoredRow<'_>>()
        .map_err(hot.error("archive read"))?)
}

/// Streams the day's rows ([`day_rows`]) into `sink` and, those the
/// sampling keeps (every row without it), into batches; returns how many
/// rows it batched, the sink and the sampling.
async fn read_day<S: RowSink>(
    hot: HotTier,
    read: Read,
    sort_memory_bytes: u64,
    tx: mpsc::Sender<RecordBatch>,
    mut sink: S,
    mut selecting: Option<Selecting>,
) -> Result<(u64, S, Option<Selecting>), CompactorError> {
    let mut cursor = day_rows(&hot, &read, sort_memory_bytes)?;
    let day = read.day;
    let schema = archive_schema();
    let mut builder = BatchBuilder::new(schema);
    let mut total = 0u64;
    let day_name = inferlog_store::day_string(day);
    let to_err = |e: arrow_schema::ArrowError| CompactorError::Archive { day: day_name.clone(), message: e.to_string() };
    while let Some(row) = cursor.next().await.map_err(hot.error("archive read"))? {
        sink.row(&row);
        let (reason, weight) = match selecting.as_mut() {
            Some(selecting) => match selecting.select(&row) {
                Some(decision) => decision,
                None => continue,
            },
            None => (Reason::All, 1),
        };
        builder.append(&row, reason, weight);
        total += 1;
        if builder.rows() == BATCH_ROWS {
            let batch = builder.finish().map_err(to_err)?;
            if tx.send(batch).await.is_err() {
                return Ok((total, sink, selecting)); // the writer failed; its error is reported
            }
        }
    }
    if builder.rows() > 0 {
        let batch = builder.finish().map_err(to_err)?;
        let _ = tx.send(batch).await;
    }
    Ok((total, sink, selecting))
}
