//! The ClickHouse stage. In: batches of rows already encoded as RowBinary
//! ([`HotRow::encode`]), one UTC day per insert, and the log of rejected
//! messages. Out: rows durable in the hot tier, and, for the replay
//! filter, the Kafka offsets already stored.
//!
//! Exactly once without transactions: every row carries its Kafka
//! coordinates (topic, partition, offset). One INSERT holds one day, so it
//! lands as one part of one partition and is atomic. After a crash or a
//! rebalance, the new owner of a partition asks which offsets past the
//! committed one are already stored and skips them ([`ClickHouseSink::stored_offsets`]).

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use clickhouse::{Client, Row};
use inferlog_schema::{InferenceEvent, SCHEMA_VERSION};
use serde::{Deserialize, Serialize};

use crate::config::ClickHouseConfig;
use crate::error::IngestError;

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
    pub fn new(e: InferenceEvent, topic: std::sync::Arc<str>, partition: i32, offset: i64, ingested_at: u32) -> HotRow {
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
            kafka_partition: partition as u16,
            kafka_offset: offset as u64,
            ingested_at,
        }
    }

    /// Appends the row in ClickHouse's RowBinary format, in the column
    /// order of [`hot_table_ddl`]: a batch holds its rows encoded (about
    /// 330 bytes a row, against about 750 as a `HotRow` with its strings),
    /// and the normalizing threads encode them. Checked against the
    /// `clickhouse` crate's own serializer of this struct on a real server
    /// (`tests/tests/ingest.rs`).
    pub fn encode(&self, out: &mut Vec<u8>) {
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
        put_str(out, &self.kafka_topic);
        out.extend_from_slice(&self.kafka_partition.to_le_bytes());
        out.extend_from_slice(&self.kafka_offset.to_le_bytes());
        out.extend_from_slice(&self.ingested_at.to_le_bytes());
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
    pub first: (Arc<str>, u16, u64),
    pub rows: usize,
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
struct OffsetRow {
    kafka_offset: u64,
}

#[derive(Debug, Row, Deserialize)]
struct VersionRow {
    version: String,
}

/// The hot tier's tables and the one client that writes them.
#[derive(Clone)]
pub struct ClickHouseSink {
    /// Bound to the database: inserts and queries.
    client: Client,
    /// Not bound to a database: `CREATE DATABASE`.
    admin: Client,
    database: String,
    table: String,
    rejects_table: String,
}

impl std::fmt::Debug for ClickHouseSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouseSink").field("database", &self.database).field("table", &self.table).finish_non_exhaustive()
    }
}

pub use inferlog_store::hot::parse_version;

/// DDL of the hot table. Works on ClickHouse 18.16 and current releases;
/// `LowCardinality` is used where the server has it without a setting.
///
/// - ReplacingMergeTree: a producer retry that slipped past ingest's
///   request-id window has an identical sorting key, so merges collapse it
///   (ingest itself never writes a replayed offset twice).
/// - PARTITION BY day: retention and the compactor work a UTC day at a time
///   (`DROP PARTITION`), and time-range queries prune to the days they touch.
/// - ORDER BY (business_line, model_name, model_version, event_time, request_id):
///   the questions users ask filter by business line and model version over
///   a time range (p99 by input bucket, tokens by business line, errors by
///   code and stage); the key prefix makes those range scans, and low-
///   cardinality columns first compress best. request_id last makes the
///   key unique per request, as ReplacingMergeTree needs.
pub fn hot_table_ddl(database: &str, table: &str, server: (u32, u32)) -> String {
    let lc = if server >= (20, 1) { "LowCardinality(String)" } else { "String" };
    format!(
        "CREATE TABLE IF NOT EXISTS {database}.{table} (
            day Date,
            event_time DateTime,
            timestamp_ms UInt64,
            request_id String,
            business_line {lc},
            model_name {lc},
            model_version {lc},
            input_tokens UInt32,
            output_tokens UInt32,
            total_latency_ms Float64,
            error_code Int32,
            error_stage Nullable(String),
            user_id_hash Nullable(String),
            tenant Nullable(String),
            session_id Nullable(String),
            request_type Nullable(String),
            queue_wait_ms Nullable(Float64),
            prefill_time_ms Nullable(Float64),
            decode_time_ms Nullable(Float64),
            ttft_ms Nullable(Float64),
            tpot_ms Nullable(Float64),
            gpu_id Nullable(UInt32),
            batch_size Nullable(UInt32),
            cache_hit Nullable(UInt8),
            cache_prefix_tokens Nullable(UInt32),
            gpu_mem_peak_mb Nullable(Float64),
            truncated Nullable(UInt8),
            schema_version UInt8,
            kafka_topic String,
            kafka_partition UInt16,
            kafka_offset UInt64,
            ingested_at DateTime
        ) ENGINE = ReplacingMergeTree()
        PARTITION BY day
        ORDER BY (business_line, model_name, model_version, event_time, request_id)"
    )
}

fn rejects_table_ddl(database: &str, table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {database}.{table} (
            day Date,
            received_at DateTime,
            reason String,
            field String,
            message String,
            kafka_topic String,
            kafka_partition UInt16,
            kafka_offset UInt64,
            bytes UInt32
        ) ENGINE = MergeTree()
        PARTITION BY day
        ORDER BY (reason, received_at)"
    )
}

impl ClickHouseSink {
    pub fn new(config: &ClickHouseConfig) -> Result<ClickHouseSink, IngestError> {
        let client = config.client()?;
        Ok(ClickHouseSink {
            admin: client.clone(),
            client: client.with_database(&config.database),
            database: config.database.clone(),
            table: config.table.clone(),
            rejects_table: config.rejects_table.clone(),
        })
    }

    fn error(&self, operation: &'static str, table: &str, source: clickhouse::error::Error) -> IngestError {
        IngestError::ClickHouse { operation, table: format!("{}.{table}", self.database), source }
    }

    pub async fn server_version(&self) -> Result<String, IngestError> {
        let row = self.admin.query("SELECT version() AS version").fetch_one::<VersionRow>().await.map_err(|e| self.error("version", "-", e))?;
        Ok(row.version)
    }

    /// Creates the database and both tables if missing.
    pub async fn ensure_schema(&self) -> Result<(), IngestError> {
        let version = parse_version(&self.server_version().await?);
        let db = &self.database;
        let statements = [
            (format!("CREATE DATABASE IF NOT EXISTS {db}"), "-"),
            (hot_table_ddl(db, &self.table, version), self.table.as_str()),
            (rejects_table_ddl(db, &self.rejects_table), self.rejects_table.as_str()),
        ];
        for (sql, table) in statements {
            self.admin.query(&sql).execute().await.map_err(|e| self.error("create", table, e))?;
        }
        Ok(())
    }

    /// Inserts encoded rows of one UTC day as one INSERT (one part:
    /// atomic). A retry first checks whether the earlier attempt landed
    /// after all (its answer lost to a dropped connection): all of it did
    /// or none did.
    pub async fn insert_rows(&self, rows: &EncodedRows, retry: bool) -> Result<(), IngestError> {
        if rows.rows == 0 {
            return Ok(());
        }
        let (topic, partition, offset) = &rows.first;
        if retry && self.has_offset(&self.table, topic, *partition, *offset).await? {
            tracing::info!(table = %self.table, rows = rows.rows, "an earlier attempt of this insert landed; not inserting again");
            return Ok(());
        }
        let table = &self.table;
        let mut insert = self.client.insert_formatted_with(format!("INSERT INTO {}.{table} FORMAT RowBinary", self.database));
        for chunk in &rows.chunks {
            insert.send(chunk.clone()).await.map_err(|e| self.error("insert", table, e))?;
        }
        insert.end().await.map_err(|e| self.error("insert", table, e))
    }

    /// Logs rejects, with the same landed-already check on retry.
    pub async fn insert_rejects(&self, rows: &[RejectRow], retry: bool) -> Result<(), IngestError> {
        let Some(first) = rows.first() else { return Ok(()) };
        if retry && self.has_offset(&self.rejects_table, &first.kafka_topic, first.kafka_partition, first.kafka_offset).await? {
            return Ok(());
        }
        self.insert(&self.rejects_table, rows).await
    }

    async fn has_offset(&self, table: &str, topic: &str, partition: u16, offset: u64) -> Result<bool, IngestError> {
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

    async fn insert<T: Row + Serialize + for<'a> clickhouse::RowWrite<Value<'a> = T> + 'static>(
        &self,
        table: &str,
        rows: &[T],
    ) -> Result<(), IngestError> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut insert = self.client.insert::<T>(table).await.map_err(|e| self.error("insert", table, e))?;
        for row in rows {
            insert.write(row).await.map_err(|e| self.error("insert", table, e))?;
        }
        insert.end().await.map_err(|e| self.error("insert", table, e))
    }

    /// Offsets ≥ `from` of one topic partition already stored, as rows or
    /// as logged rejects: what a replay must skip.
    pub async fn stored_offsets(&self, topic: &str, partition: i32, from: i64) -> Result<HashSet<i64>, IngestError> {
        let mut stored = HashSet::new();
        for table in [&self.table, &self.rejects_table] {
            let sql =
                format!("SELECT kafka_offset FROM {}.{table} WHERE kafka_topic = ? AND kafka_partition = ? AND kafka_offset >= ?", self.database);
            let rows = self
                .client
                .query(&sql)
                .bind(topic)
                .bind(partition as u16)
                .bind(from.max(0) as u64)
                .fetch_all::<OffsetRow>()
                .await
                .map_err(|e| self.error("replay-filter query", table, e))?;
            stored.extend(rows.into_iter().map(|r| r.kafka_offset as i64));
        }
        Ok(stored)
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

    #[test]
    fn version_gates_low_cardinality() {
        assert_eq!(parse_version("18.16.1"), (18, 16));
        assert!(!hot_table_ddl("d", "t", parse_version("18.16.1")).contains("LowCardinality"));
        assert!(hot_table_ddl("d", "t", parse_version("24.8.4.13")).contains("LowCardinality(String)"));
    }
}
