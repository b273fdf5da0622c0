//! The ClickHouse stage. In: batches of rows already encoded as RowBinary
//! ([`HotRow::encode`]), one UTC day per insert, and the log of rejected
//! messages, one UTC day per insert. Out: rows durable in the hot tier.
//!
//! Exactly once without transactions: every row carries its Kafka
//! coordinates (topic, partition, offset). One INSERT holds one day, so it
//! lands as one part of one partition and is atomic. After a crash or a
//! rebalance, the new owner of a partition learns from the replay log
//! ([`crate::replay_log`]) which offsets past the committed one are
//! already handled and skips them.
//!
//! Every INSERT names its columns ([`inferlog_store::tables`]): a column an
//! operator adds is left to its default. At start the tables are created
//! if missing and compared with what ingest writes: a missing column or
//! another type stops ingest (exit 2) naming it, before anything is
//! written. Inserts are synchronous where the server knows `async_insert`,
//! so an acknowledged insert is a part on disk before its offset is
//! committed.

use std::sync::Arc;

use bytes::Bytes;
use clickhouse::{Client, Row};
use inferlog_schema::{InferenceEvent, SCHEMA_VERSION};
use inferlog_store::tables::{self, ExistingColumn, Shape};
use serde::{Deserialize, Serialize};

use crate::config::ClickHouseConfig;
use crate::error::IngestError;
use crate::in_flight::{self, InsertIds};

/// One hot row: the normalized event plus where it came from. Field order
/// is the column order of the table (RowBinary is positional).
#[derive(Debug, Clone, PartialEq, Row, Serialize)]
pub struct HotRow {
    /// UTC day of the event, days since 1970-01-01 (ClickHouse `Date`).
    pub day: u16,
    /// Event time, whole seconds (ClickHouse `DateTime`), for time-range filters.
    pub event_time: u32,
    pub timestamp_ms: u64,
    pub request_id: String,
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub total_latency_ms: f64,
    pub error_code: i32,
    pub error_stage: Option<&'static str>,
    pub user_id_hash: Option<String>,
    pub tenant: Option<String>,
    pub session_id: Option<String>,
    pub request_type: Option<String>,
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
    pub schema_version: u8,
    /// Shared by every row of the topic: no allocation per row.
    pub kafka_topic: std::sync::Arc<str>,
    pub kafka_partition: u16,
    pub kafka_offset: u64,
    pub ingested_at: u32,
}

impl HotRow {
    pub fn new(e: InferenceEvent, topic: std::sync::Arc<str>, partition: u16, offset: i64, ingested_at: u32) -> HotRow {
        // Timestamps are validated to lie in 2000..2100, so these fit.
        let day = e.timestamp_ms.div_euclid(inferlog_schema::timestamp::MS_PER_DAY) as u16;
        HotRow {
            day,
            event_time: (e.timestamp_ms / 1000) as u32,
            timestamp_ms: e.timestamp_ms as u64,
            request_id: e.request_id,
            business_line: e.business_line,
            model_name: e.model_name,
            model_version: e.model_version,
            input_tokens: e.input_tokens,
            output_tokens: e.output_tokens,
            total_latency_ms: e.total_latency_ms,
            error_code: e.error_code,
            error_stage: e.error_stage.map(|s| s.as_str()),
            user_id_hash: e.user_id_hash,
            tenant: e.tenant,
            session_id: e.session_id,
            request_type: e.request_type,
            queue_wait_ms: e.queue_wait_ms,
            prefill_time_ms: e.prefill_time_ms,
            decode_time_ms: e.decode_time_ms,
            ttft_ms: e.ttft_ms,
            tpot_ms: e.tpot_ms,
            gpu_id: e.gpu_id,
            batch_size: e.batch_size,
            cache_hit: e.cache_hit.map(u8::from),
            cache_prefix_tokens: e.cache_prefix_tokens,
            gpu_mem_peak_mb: e.gpu_mem_peak_mb,
            truncated: e.truncated.map(u8::from),
            schema_version: SCHEMA_VERSION as u8,
            kafka_topic: topic,
            kafka_partition: partition,
            kafka_offset: offset as u64,
            ingested_at,
        }
    }

    /// Appends the row in ClickHouse's RowBinary format, in the column
    /// order of [`tables::HOT`]: a batch holds its rows encoded (about
    /// 330 bytes a row, against about 750 as a `HotRow` with its strings),
    /// and the normalizing threads encode them. Checked against the
    /// `clickhouse` crate's own serializer of this struct on a real server
    /// (`tests/tests/ingest.rs`). Returns how many of the bytes written are
    /// the event itself (what two retries of one request share); the rest
    /// are its Kafka coordinates and ingest time.
    pub fn encode(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&self.day.to_le_bytes());
        out.extend_from_slice(&self.event_time.to_le_bytes());
        out.extend_from_slice(&self.timestamp_ms.to_le_bytes());
        put_str(out, &self.request_id);
        put_str(out, &self.business_line);
        put_str(out, &self.model_name);
        put_str(out, &self.model_version);
        out.extend_from_slice(&self.input_tokens.to_le_bytes());
        out.extend_from_slice(&self.output_tokens.to_le_bytes());
        out.extend_from_slice(&self.total_latency_ms.to_le_bytes());
        out.extend_from_slice(&self.error_code.to_le_bytes());
        put_nullable(out, self.error_stage, put_str);
        for text in [&self.user_id_hash, &self.tenant, &self.session_id, &self.request_type] {
            put_nullable(out, text.as_deref(), put_str);
        }
        for ms in [self.queue_wait_ms, self.prefill_time_ms, self.decode_time_ms, self.ttft_ms, self.tpot_ms] {
            put_nullable(out, ms, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        }
        for count in [self.gpu_id, self.batch_size] {
            put_nullable(out, count, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        }
        put_nullable(out, self.cache_hit, |out, v| out.push(v));
        put_nullable(out, self.cache_prefix_tokens, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        put_nullable(out, self.gpu_mem_peak_mb, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        put_nullable(out, self.truncated, |out, v| out.push(v));
        out.push(self.schema_version);
        let event = out.len() - start;
        put_str(out, &self.kafka_topic);
        out.extend_from_slice(&self.kafka_partition.to_le_bytes());
        out.extend_from_slice(&self.kafka_offset.to_le_bytes());
        out.extend_from_slice(&self.ingested_at.to_le_bytes());
        event
    }
}

/// A RowBinary `String`: its length as an unsigned LEB128, then its bytes.
fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut len = s.len() as u64;
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(s.as_bytes());
}

/// A RowBinary `Nullable(T)`: 1 for NULL, else 0 and the value.
fn put_nullable<T>(out: &mut Vec<u8>, value: Option<T>, put: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        None => out.push(1),
        Some(v) => {
            out.push(0);
            put(out, v);
        }
    }
}

/// Rows of one UTC day, RowBinary-encoded, as one INSERT: `chunks` are
/// sent in order (one per partition of the batch, not copied again), and
/// `first` is the Kafka coordinate of the first row, which a retry looks up
/// to learn whether the earlier attempt landed.
#[derive(Debug, Clone)]
pub struct EncodedRows {
    pub chunks: Vec<Bytes>,
    pub first: (Arc<str>, i32, i64),
    pub rows: usize,
}

/// A Kafka partition number as the tables store it (`UInt16`). Ingest
/// refuses a partition beyond it when it is assigned, so this never fails
/// on an owned partition; it is never cast.
pub fn table_partition(topic: &str, partition: i32) -> Result<u16, IngestError> {
    u16::try_from(partition).map_err(|_| {
        IngestError::Config(format!("partition {partition} of topic {topic} does not fit the tables' kafka_partition (UInt16, 0..=65535)"))
    })
}

/// One rejected message, as logged in ClickHouse next to the DLQ (so rejects
/// are queryable by reason and day, and replays know what was rejected).
#[derive(Debug, Clone, PartialEq, Row, Serialize)]
pub struct RejectRow {
    /// Day the message was received (its own timestamp may be unreadable).
    pub day: u16,
    pub received_at: u32,
    pub reason: &'static str,
    pub field: String,
    pub message: String,
    pub kafka_topic: String,
    pub kafka_partition: u16,
    pub kafka_offset: u64,
    pub bytes: u32,
}

#[derive(Debug, Row, Deserialize)]
pub(crate) struct OffsetRow {
    pub kafka_offset: u64,
}

#[derive(Debug, Row, Deserialize)]
struct VersionRow {
    version: String,
}

#[derive(Debug, Row, Deserialize)]
struct NameRow {
    name: String,
}

#[derive(Debug, Row, Deserialize)]
struct ColumnRow {
    name: String,
    #[serde(rename = "type")]
    ty: String,
    default_kind: String,
}

/// What the server offers, learned at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerFeatures {
    pub version: (u32, u32),
    /// The server knows `async_insert` (21.11 on): inserts send `async_insert=0`.
    pub async_insert: bool,
    /// The server knows the MergeTree setting `fsync_after_insert`.
    pub fsync_after_insert: bool,
}

/// The hot tier's tables and the one client that writes them.
#[derive(Clone)]
pub struct ClickHouseSink {
    /// Bound to the database: inserts and queries (with `async_insert=0`
    /// once [`ClickHouseSink::prepare`] found the server knows it).
    pub(crate) client: Client,
    /// Not bound to a database: `CREATE DATABASE`.
    admin: Client,
    pub(crate) database: String,
    pub(crate) table: String,
    pub(crate) rejects_table: String,
    pub(crate) replay_table: String,
    fsync_after_insert: bool,
    /// How long an INSERT may take to send and to be answered; past it the
    /// attempt counts as failed, and its retry ends it first.
    request_timeout: std::time::Duration,
    /// Names every INSERT, for the fences of [`crate::in_flight`].
    pub(crate) ids: Arc<InsertIds>,
}

impl std::fmt::Debug for ClickHouseSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouseSink").field("database", &self.database).field("table", &self.table).finish_non_exhaustive()
    }
}

pub use inferlog_store::hot::parse_version;

impl ClickHouseSink {
    pub fn new(config: &ClickHouseConfig) -> Result<ClickHouseSink, IngestError> {
        let client = config.client()?;
        Ok(ClickHouseSink {
            admin: client.clone(),
            client: client.with_database(&config.database),
            database: config.database.clone(),
            table: config.table.clone(),
            rejects_table: config.rejects_table.clone(),
            replay_table: tables::replay_log_table(&config.table),
            fsync_after_insert: config.fsync_after_insert,
            request_timeout: config.request_timeout,
            ids: Arc::new(InsertIds::new(&config.database, &config.table)),
        })
    }

    pub(crate) fn error(&self, operation: &'static str, table: &str, source: clickhouse::error::Error) -> IngestError {
        IngestError::ClickHouse { operation, table: format!("{}.{table}", self.database), source }
    }

    pub async fn server_version(&self) -> Result<String, IngestError> {
        let row = self.admin.query("SELECT version() AS version").fetch_one::<VersionRow>().await.map_err(|e| self.error("version", "-", e))?;
        Ok(row.version)
    }

    /// Whether `system.<table>` lists a setting called `name`.
    async fn knows(&self, table: &str, name: &str) -> Result<bool, IngestError> {
        let sql = format!("SELECT name FROM system.{table} WHERE name = ?");
        let rows = self.admin.query(&sql).bind(name).fetch_all::<NameRow>().await.map_err(|e| self.error("settings lookup", table, e))?;
        Ok(rows.iter().any(|r| r.name == name))
    }

    /// This sink, ready: [`ClickHouseSink::prepare`] on a copy.
    pub async fn prepared(&self) -> Result<(ClickHouseSink, ServerFeatures), IngestError> {
        let mut sink = self.clone();
        let features = sink.prepare().await?;
        Ok((sink, features))
    }

    /// Creates the database and the tables if missing, checks each against
    /// what ingest writes ([`IngestError::TableDrift`] on a missing column
    /// or another type; the table's other columns are logged once), and
    /// makes every insert synchronous where the server knows
    /// `async_insert`. Run once, before anything is read.
    pub async fn prepare(&mut self) -> Result<ServerFeatures, IngestError> {
        let version = parse_version(&self.server_version().await?);
        let features = ServerFeatures {
            version,
            async_insert: self.knows("settings", "async_insert").await?,
            fsync_after_insert: self.knows("merge_tree_settings", "fsync_after_insert").await?,
        };
        let db = &self.database;
        self.admin.query(&format!("CREATE DATABASE IF NOT EXISTS {db}")).execute().await.map_err(|e| self.error("create", "-", e))?;
        let fsync = self.fsync_after_insert && features.fsync_after_insert;
        for (shape, table) in [(tables::HOT, &self.table), (tables::REJECTS, &self.rejects_table), (tables::REPLAY_LOG, &self.replay_table)] {
            let mut ddl = shape.ddl(db, table, version);
            if fsync && shape.what == tables::HOT.what {
                ddl.push_str("\nSETTINGS fsync_after_insert = 1, fsync_part_directory = 1");
            }
            self.admin.query(&ddl).execute().await.map_err(|e| self.error("create", table, e))?;
            self.check(&shape, table).await?;
        }
        if fsync {
            // A table created before the setting was configured gets it too.
            let sql = format!("ALTER TABLE {db}.{} MODIFY SETTING fsync_after_insert = 1, fsync_part_directory = 1", self.table);
            self.admin.query(&sql).execute().await.map_err(|e| self.error("alter settings", &self.table, e))?;
        } else if self.fsync_after_insert {
            tracing::info!(version = ?version, "this server has no MergeTree setting fsync_after_insert: parts are written without fsync (docs/operations.md, failure model)");
        }
        if features.async_insert {
            self.client = self.client.clone().with_setting("async_insert", "0");
        }
        tracing::info!(?features, fsync_after_insert = fsync, "clickhouse tables checked");
        Ok(features)
    }

    /// Compares `table` with `shape`: drift is an error naming each column
    /// and both types; columns ingest does not write are logged.
    async fn check(&self, shape: &Shape, table: &str) -> Result<(), IngestError> {
        let rows = self
            .admin
            .query("SELECT name, type, default_kind FROM system.columns WHERE database = ? AND table = ?")
            .bind(&self.database)
            .bind(table)
            .fetch_all::<ColumnRow>()
            .await
            .map_err(|e| self.error("column check", table, e))?;
        let existing: Vec<ExistingColumn> =
            rows.into_iter().map(|r| ExistingColumn { name: r.name, ty: r.ty, default_kind: r.default_kind }).collect();
        match shape.check(&existing) {
            Ok(extra) => {
                if !extra.is_empty() {
                    let columns: Vec<String> =
                        extra.iter().map(|c| format!("{} {} {}", c.name, c.ty, c.default_kind).trim_end().to_owned()).collect();
                    tracing::info!(table = %format!("{}.{table}", self.database), ?columns, "the table has columns ingest does not write: inserts leave them to their defaults");
                }
                Ok(())
            }
            Err(drift) => Err(IngestError::TableDrift {
                table: format!("{}.{table}", self.database),
                what: shape.what,
                drift: drift.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
            }),
        }
    }

    /// A new logical insert's id ([`InsertIds::insert`]): its attempts are
    /// named after it.
    pub fn insert_id(&self) -> String {
        self.ids.insert()
    }

    /// Inserts encoded rows of one UTC day as one INSERT (one part:
    /// atomic), naming every column; `id` names its attempts. A retry first
    /// ends the attempts before that may still run, then checks whether
    /// one landed after all (its answer lost to a dropped connection): all
    /// of it did or none did.
    pub async fn insert_rows(&self, rows: &EncodedRows, id: &str, retry: bool) -> Result<(), IngestError> {
        if rows.rows == 0 {
            return Ok(());
        }
        let (topic, partition, offset) = &rows.first;
        if retry && self.landed(&self.table, id, topic, table_partition(topic, *partition)?, *offset as u64).await? {
            tracing::info!(table = %self.table, rows = rows.rows, "an earlier attempt of this insert landed; not inserting again");
            return Ok(());
        }
        let table = &self.table;
        let mut insert = self
            .client
            .insert_formatted_with(tables::HOT.insert_sql(&self.database, table, "RowBinary"))
            .with_setting("query_id", self.ids.attempt(id))
            .with_timeouts(Some(self.request_timeout), Some(self.request_timeout));
        for chunk in &rows.chunks {
            insert.send(chunk.clone()).await.map_err(|e| self.error("insert", table, e))?;
        }
        insert.end().await.map_err(|e| self.error("insert", table, e))
    }

    /// Logs the rejects of one day (one INSERT: atomic), with the same
    /// landed-already check on retry.
    pub async fn insert_rejects(&self, rows: &[RejectRow], id: &str, retry: bool) -> Result<(), IngestError> {
        let Some(first) = rows.first() else { return Ok(()) };
        if retry && self.landed(&self.rejects_table, id, &first.kafka_topic, first.kafka_partition, first.kafka_offset).await? {
            return Ok(());
        }
        self.insert(&self.rejects_table, rows, id).await
    }

    /// Whether an attempt of insert `id` landed, the one whose first row
    /// is at `offset`: ends the attempts still running first.
    async fn landed(&self, table: &str, id: &str, topic: &str, partition: u16, offset: u64) -> Result<bool, IngestError> {
        in_flight::end_attempts(&self.client, id).await.map_err(|e| self.error("end the attempt before", table, e))?;
        let sql =
            format!("SELECT kafka_offset FROM {}.{table} WHERE kafka_topic = ? AND kafka_partition = ? AND kafka_offset = ? LIMIT 1", self.database);
        let rows = self
            .client
            .query(&sql)
            .bind(topic)
            .bind(partition)
            .bind(offset)
            .fetch_all::<OffsetRow>()
            .await
            .map_err(|e| self.error("landed-check query", table, e))?;
        Ok(!rows.is_empty())
    }

    /// One typed INSERT naming the columns of `T` (the `clickhouse` crate
    /// lists a `Row`'s fields), an attempt of logical insert `id`.
    pub(crate) async fn insert<T: Row + Serialize + for<'a> clickhouse::RowWrite<Value<'a> = T> + 'static>(
        &self,
        table: &str,
        rows: &[T],
        id: &str,
    ) -> Result<(), IngestError> {
        if rows.is_empty() {
            return Ok(());
        }
        let insert = self.client.insert::<T>(table).await.map_err(|e| self.error("insert", table, e))?;
        let mut insert = insert.with_setting("query_id", self.ids.attempt(id)).with_timeouts(Some(self.request_timeout), Some(self.request_timeout));
        for row in rows {
            insert.write(row).await.map_err(|e| self.error("insert", table, e))?;
        }
        insert.end().await.map_err(|e| self.error("insert", table, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_carry_their_length_as_leb128() {
        let mut out = Vec::new();
        put_str(&mut out, "ab");
        assert_eq!(out, [2, b'a', b'b']);
        for (len, prefix) in [(127usize, vec![0x7f]), (128, vec![0x80, 0x01]), (300, vec![0xac, 0x02]), (16_384, vec![0x80, 0x80, 0x01])] {
            let mut out = Vec::new();
            put_str(&mut out, &"x".repeat(len));
            assert_eq!(out[..prefix.len()], prefix[..], "length {len}");
            assert_eq!(out.len(), prefix.len() + len);
        }
        let mut out = Vec::new();
        put_nullable(&mut out, None::<u8>, |out, v| out.push(v));
        put_nullable(&mut out, Some(7u8), |out, v| out.push(v));
        assert_eq!(out, [1, 0, 7]);
    }

    /// The typed inserts name the columns of their table's shape, in order.
    #[test]
    fn the_rejects_row_is_the_rejects_tables_shape() {
        let shape: Vec<&str> = tables::REJECTS.columns.iter().map(|c| c.name).collect();
        assert_eq!(<RejectRow as Row>::COLUMN_NAMES, shape.as_slice());
        let hot: Vec<&str> = tables::HOT.columns.iter().map(|c| c.name).collect();
        assert_eq!(<HotRow as Row>::COLUMN_NAMES, hot.as_slice());
        assert_eq!(parse_version("18.16.1"), (18, 16));
    }

    #[test]
    fn a_partition_beyond_uint16_is_refused_not_cast() {
        assert_eq!(table_partition("t", 65_535).ok(), Some(65_535));
        let e = table_partition("t", 65_536).expect_err("too large");
        assert!(e.to_string().contains("partition 65536 of topic t"), "{e}");
    }
}
