//! The ClickHouse stage. In: batches of rows already encoded as RowBinary
//! ([`inferlog_store::model::rows::HotRow::encode`]), one UTC day per insert, and the log of rejected
//! messages, one UTC day per insert. Out: rows durable in the hot tier.
//!
//! Exactly once without transactions: every row carries its Kafka
//! coordinates (topic, partition, offset). One INSERT holds one day, so it
//! lands as one part of one partition and is atomic. After a crash or a
//! rebalance, the new owner of a partition learns from the replay log
//! ([`crate::sink::replay_log`]) which offsets past the committed one are
//! already handled and skips them.
//!
//! Every INSERT names its columns ([`inferlog_store::model::tables`]): a column an
//! operator adds is left to its default. At start the tables are created
//! if missing and compared with what ingest writes: a missing column or
//! another type stops ingest (exit 2) naming it, before anything is
//! written. Inserts are synchronous where the server knows `async_insert`,
//! so an acknowledged insert is a part on disk before its offset is
//! committed.
//!
//! On a ClickHouse cluster (`[clickhouse] cluster`) the tables are created
//! `ON CLUSTER` (a replicated `<table>_local` per shard and a `Distributed`
//! `<table>`), and every write and lookup of a Kafka partition goes to the
//! local tables of the shard the config maps it to, with the shard's
//! `insert_quorum`: an insert returns only once the quorum holds it. A
//! shard's writes and lookups go to its first replica that answers: one
//! that could not be reached is passed over for [`PASS_OVER`], so a shard
//! whose first replica is down takes inserts wherever its quorum allows.
//! A retry then checks and writes on the next replica; if the attempt
//! before did land on the unreachable one, ZooKeeper knows its block, and
//! the byte-identical retry is deduplicated by the replicated table.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clickhouse::{Client, Row};
use inferlog_store::model::rows::RejectRow;
use inferlog_store::model::tables::{self, ExistingColumn, Shape};
use serde::{Deserialize, Serialize};

use crate::config::ClickHouseConfig;
use crate::error::IngestError;

use super::in_flight::{self, InsertIds};
use super::request::{table_partition, EncodedRows};

/// `call`, given up past `limit` as [`clickhouse::error::Error::TimedOut`]
/// (transient: retried). The `clickhouse` crate bounds inserts but not
/// queries, and a server that takes a query and never answers (hung, or
/// behind a network that drops its answers) would hold the caller for ever:
/// a partition's start, a retry's landed check, a replay (found by the
/// fault matrix's outage cells).
pub(crate) async fn bounded<T>(
    limit: std::time::Duration,
    call: impl std::future::Future<Output = Result<T, clickhouse::error::Error>>,
) -> Result<T, clickhouse::error::Error> {
    tokio::time::timeout(limit, call).await.unwrap_or(Err(clickhouse::error::Error::TimedOut))
}

/// The row a retry looks up ([`ClickHouseSink::landed`]): in the hot
/// table by its index too; the rejects log has none.
struct Landed<'a> {
    day: u16,
    topic: &'a str,
    partition: u16,
    offset: u64,
    index: Option<u32>,
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
    /// The server knows `insert_quorum_parallel` (21.x on, default on):
    /// a cluster's inserts send `insert_quorum_parallel=0`.
    pub insert_quorum_parallel: bool,
}

/// ClickHouse's REPLICA_IS_NOT_IN_QUORUM: a read with
/// `select_sequential_consistency` on a replica without the partition's
/// last quorum part.
const QUORUM_PART_MISSING: u32 = 289;

/// How long a replica that could not be reached is passed over.
pub const PASS_OVER: Duration = Duration::from_secs(10);

/// One shard's replicas, in the config's order, and until when (ms since
/// the epoch) each is passed over because a request could not reach it.
struct Replicas {
    clients: Vec<Client>,
    passed_over_until: Vec<AtomicI64>,
}

impl Replicas {
    fn new(clients: Vec<Client>) -> Replicas {
        let passed_over_until = clients.iter().map(|_| AtomicI64::new(0)).collect();
        Replicas { clients, passed_over_until }
    }

    /// The replica requests go to at `now_ms`: the first not passed over,
    /// or, when all are, the one passed over longest ago.
    fn pick(&self, now_ms: i64) -> usize {
        let until = |i: usize| self.passed_over_until[i].load(Ordering::Relaxed);
        (0..self.clients.len()).find(|&i| until(i) <= now_ms).or_else(|| (0..self.clients.len()).min_by_key(|&i| until(i))).unwrap_or(0)
    }

    /// Every client with `f` applied (a setting added).
    fn map(&self, f: impl Fn(Client) -> Client) -> Replicas {
        Replicas::new(self.clients.iter().cloned().map(f).collect())
    }
}

/// The hot tier's tables and the clients that write them: one server, or
/// on a cluster one client per shard, and which shard takes each Kafka
/// partition. A sink's own queries go to [`ClickHouseSink::shard`]'s.
#[derive(Clone)]
pub struct ClickHouseSink {
    /// Bound to the database: inserts and queries (with `async_insert=0`
    /// once [`ClickHouseSink::prepare`] found the server knows it). On a
    /// cluster, the client of the shard this copy is for (the first one
    /// until [`ClickHouseSink::shard`] picks another).
    pub(crate) client: Client,
    /// Each shard's replicas (one entry of one on one server), with the
    /// shard's `insert_quorum`.
    shards: Arc<[Replicas]>,
    /// The (shard, replica) `client` is, on a copy [`ClickHouseSink::shard`] made.
    replica: Option<(usize, usize)>,
    /// Not bound to a database: `CREATE DATABASE` and the DDL.
    admin: Client,
    config: Arc<ClickHouseConfig>,
    pub(crate) database: String,
    /// The tables ingest writes: on a cluster, the shard-local ones.
    pub(crate) table: String,
    pub(crate) rejects_table: String,
    pub(crate) replay_table: String,
    fsync_after_insert: bool,
    /// How long an INSERT may take to send and to be answered; past it the
    /// attempt counts as failed, and its retry ends it first. Every query
    /// is bounded by it too ([`bounded`]).
    pub(crate) request_timeout: std::time::Duration,
    /// Names every INSERT, for the fences of [`crate::sink::in_flight`].
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
        let shards: Arc<[Replicas]> = if config.cluster.is_none() {
            Arc::new([Replicas::new(vec![client.clone().with_database(&config.database)])])
        } else {
            let quorum_timeout = config.request_timeout.as_millis().to_string();
            let mut shards = Vec::new();
            for (i, shard) in config.shards.iter().enumerate() {
                let mut clients = Vec::new();
                for url in &shard.replicas {
                    clients.push(
                        config
                            .client_at(url)?
                            .with_database(&config.database)
                            .with_setting("insert_quorum", config.quorum(i).to_string())
                            .with_setting("insert_quorum_timeout", quorum_timeout.clone()),
                    );
                }
                shards.push(Replicas::new(clients));
            }
            shards.into()
        };
        let written = |name: &str| if config.cluster.is_some() { tables::local_table(name) } else { name.to_owned() };
        Ok(ClickHouseSink {
            admin: client,
            client: shards[0].clients[0].clone(),
            shards,
            replica: None,
            config: Arc::new(config.clone()),
            database: config.database.clone(),
            table: written(&config.table),
            rejects_table: written(&config.rejects_table),
            replay_table: written(&tables::replay_log_table(&config.table)),
            fsync_after_insert: config.fsync_after_insert,
            request_timeout: config.request_timeout,
            ids: Arc::new(InsertIds::new(&config.database, &config.table)),
        })
    }

    /// How many shards take inserts (1 on one server).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The hot table every shard's rows are read through: on a cluster its
    /// `Distributed` table, on one server the table itself.
    pub fn read_table(&self) -> &str {
        &self.config.table
    }

    /// This sink with its queries and inserts going to `shard`: to its
    /// first replica not passed over ([`PASS_OVER`]).
    pub fn shard(&self, shard: usize) -> ClickHouseSink {
        let replica = self.shards[shard].pick(crate::dlq::now_ms());
        ClickHouseSink { client: self.shards[shard].clients[replica].clone(), replica: Some((shard, replica)), ..self.clone() }
    }

    /// After a request of this copy could not reach its replica (a network
    /// error or no answer in time): the shard's next replica takes its
    /// requests for [`PASS_OVER`].
    fn pass_over(&self, source: &clickhouse::error::Error) {
        let Some((shard, replica)) = self.replica else { return };
        let replicas = &self.shards[shard];
        if replicas.clients.len() < 2 || !matches!(source, clickhouse::error::Error::Network(_) | clickhouse::error::Error::TimedOut) {
            return;
        }
        let now = crate::dlq::now_ms();
        if replicas.passed_over_until[replica].swap(now + PASS_OVER.as_millis() as i64, Ordering::Relaxed) <= now {
            tracing::warn!(
                shard = shard + 1,
                replica = replica + 1,
                error = %source,
                pass_over_s = PASS_OVER.as_secs(),
                "a replica could not be reached: the shard's requests go to its next replica"
            );
        }
    }

    /// The shard storing `partition` of `topic` (0 on one server): an
    /// error (permanent) when no `[[clickhouse.shards]]` lists it.
    pub fn shard_of(&self, topic: &str, partition: i32) -> Result<usize, IngestError> {
        let p = table_partition(topic, partition)?;
        self.config.shard_of(p).ok_or_else(|| {
            IngestError::Config(format!(
                "partition {partition} of topic {topic} is in no [[clickhouse.shards]] partitions list of cluster {}: \
                 add it to one shard for good (docs/scaling.md)",
                self.config.cluster.as_deref().unwrap_or("-")
            ))
        })
    }

    /// A ClickHouse error of `operation` on `table`; on a shard's copy, one
    /// that did not reach the replica passes it over ([`PASS_OVER`]).
    pub(crate) fn error(&self, operation: &'static str, table: &str, source: clickhouse::error::Error) -> IngestError {
        self.pass_over(&source);
        IngestError::ClickHouse { operation, table: format!("{}.{table}", self.database), source }
    }

    pub async fn server_version(&self) -> Result<String, IngestError> {
        let row = bounded(self.request_timeout, self.admin.query("SELECT version() AS version").fetch_one::<VersionRow>())
            .await
            .map_err(|e| self.error("version", "-", e))?;
        Ok(row.version)
    }

    /// Whether `system.<table>` lists a setting called `name`.
    async fn knows(&self, table: &str, name: &str) -> Result<bool, IngestError> {
        let sql = format!("SELECT name FROM system.{table} WHERE name = ?");
        let rows = bounded(self.request_timeout, self.admin.query(&sql).bind(name).fetch_all::<NameRow>())
            .await
            .map_err(|e| self.error("settings lookup", table, e))?;
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
            insert_quorum_parallel: self.knows("settings", "insert_quorum_parallel").await?,
        };
        let db = &self.database;
        let on_cluster = self.config.cluster.as_ref().map(|c| format!(" ON CLUSTER {c}")).unwrap_or_default();
        bounded(self.request_timeout, self.admin.query(&format!("CREATE DATABASE IF NOT EXISTS {db}{on_cluster}")).execute())
            .await
            .map_err(|e| self.error("create", "-", e))?;
        let fsync = self.fsync_after_insert && features.fsync_after_insert;
        let read = |name: &str| name.strip_suffix("_local").filter(|_| self.config.cluster.is_some()).unwrap_or(name).to_owned();
        for (shape, table) in [(tables::HOT, &self.table), (tables::REJECTS, &self.rejects_table), (tables::REPLAY_LOG, &self.replay_table)] {
            let mut ddl = match &self.config.cluster {
                None => vec![shape.ddl(db, table, version)],
                Some(cluster) => shape.cluster_ddl(db, &read(table), cluster, version).to_vec(),
            };
            if fsync && shape.what == tables::HOT.what {
                ddl[0].push_str("\nSETTINGS fsync_after_insert = 1, fsync_part_directory = 1");
            }
            for statement in &ddl {
                bounded(self.request_timeout, self.admin.query(statement).execute()).await.map_err(|e| self.error("create", table, e))?;
            }
            self.check(&shape, table).await?;
        }
        if fsync {
            // A table created before the setting was configured gets it too.
            let sql = format!("ALTER TABLE {db}.{}{on_cluster} MODIFY SETTING fsync_after_insert = 1, fsync_part_directory = 1", self.table);
            bounded(self.request_timeout, self.admin.query(&sql).execute()).await.map_err(|e| self.error("alter settings", &self.table, e))?;
        } else if self.fsync_after_insert {
            tracing::info!(version = ?version, "this server has no MergeTree setting fsync_after_insert: parts are written without fsync (docs/operations.md, failure model)");
        }
        if features.async_insert {
            self.client = self.client.clone().with_setting("async_insert", "0");
            self.shards = self.shards.iter().map(|r| r.map(|c| c.with_setting("async_insert", "0"))).collect();
        }
        // Quorum inserts linearized, as on 18.16: the landed check's
        // `select_sequential_consistency` holds only then, and a replica
        // refuses the next quorum insert until the one before reached its
        // quorum, which a retry of the same block relies on. Servers since
        // 21.x run them in parallel by default.
        if features.insert_quorum_parallel && self.config.cluster.is_some() {
            self.client = self.client.clone().with_setting("insert_quorum_parallel", "0");
            self.shards = self.shards.iter().map(|r| r.map(|c| c.with_setting("insert_quorum_parallel", "0"))).collect();
        }
        tracing::info!(?features, fsync_after_insert = fsync, "clickhouse tables checked");
        Ok(features)
    }

    /// `table`'s columns, as `system.columns` describes them.
    async fn columns(&self, table: &str) -> Result<Vec<ExistingColumn>, IngestError> {
        let query =
            self.admin.query("SELECT name, type, default_kind FROM system.columns WHERE database = ? AND table = ?").bind(&self.database).bind(table);
        let rows = bounded(self.request_timeout, query.fetch_all::<ColumnRow>()).await.map_err(|e| self.error("column check", table, e))?;
        Ok(rows.into_iter().map(|r| ExistingColumn { name: r.name, ty: r.ty, default_kind: r.default_kind }).collect())
    }

    /// Adds the columns `shape` gained since `table` was created (each with
    /// its default for the rows already there), then compares `table` with
    /// `shape`: drift is an error naming each column and both types;
    /// columns ingest does not write are logged.
    async fn check(&self, shape: &Shape, table: &str) -> Result<(), IngestError> {
        let mut existing = self.columns(table).await?;
        let additions = shape.additions(&self.database, table, &existing);
        if !additions.is_empty() && self.config.cluster.is_some() {
            return Err(IngestError::TableDrift {
                table: format!("{}.{table}", self.database),
                what: shape.what,
                drift: format!("missing on the cluster; add them ON CLUSTER to the local and the Distributed table: {}", additions.join("; ")),
            });
        }
        if !additions.is_empty() {
            for sql in &additions {
                tracing::info!(table = %format!("{}.{table}", self.database), %sql, "adding a column this release writes");
                bounded(self.request_timeout, self.admin.query(sql).execute()).await.map_err(|e| self.error("add column", table, e))?;
            }
            existing = self.columns(table).await?;
        }
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
        let first = &rows.first;
        let sink = self.shard(rows.shard);
        let row = Landed {
            day: first.day,
            topic: &first.topic,
            partition: table_partition(&first.topic, first.partition)?,
            offset: first.offset as u64,
            index: Some(first.index),
        };
        if retry && sink.landed(&self.table, id, &row).await? {
            tracing::info!(table = %self.table, rows = rows.rows, shard = rows.shard + 1, "an earlier attempt of this insert landed; not inserting again");
            return Ok(());
        }
        let table = &self.table;
        let mut insert = sink
            .client
            .insert_formatted_with(tables::HOT.insert_sql(&self.database, table, "RowBinary"))
            .with_setting("query_id", self.ids.attempt(id))
            .with_timeouts(Some(self.request_timeout), Some(self.request_timeout));
        for piece in rows.body() {
            insert.send(piece).await.map_err(|e| sink.error("insert", table, e))?;
        }
        insert.end().await.map_err(|e| sink.error("insert", table, e))
    }

    /// Logs the rejects of one day on one shard (one INSERT: atomic), with
    /// the same landed-already check on retry.
    pub async fn insert_rejects(&self, shard: usize, rows: &[RejectRow], id: &str, retry: bool) -> Result<(), IngestError> {
        let Some(first) = rows.first() else { return Ok(()) };
        let sink = self.shard(shard);
        // The rejects log has no index: a message's rejects are received,
        // and so logged, together (one day, one insert).
        let row = Landed { day: first.day, topic: &first.kafka_topic, partition: first.kafka_partition, offset: first.kafka_offset, index: None };
        if retry && sink.landed(&self.rejects_table, id, &row).await? {
            return Ok(());
        }
        sink.insert(&self.rejects_table, rows, id).await
    }

    /// Whether an attempt of insert `id` landed, the one holding `row`:
    /// ends the attempts still running first.
    async fn landed(&self, table: &str, id: &str, row: &Landed<'_>) -> Result<bool, IngestError> {
        bounded(self.request_timeout, in_flight::end_attempts(&self.client, id)).await.map_err(|e| self.error("end the attempt before", table, e))?;
        let index = row.index.map(|i| format!(" AND kafka_index = {i}")).unwrap_or_default();
        let sql = format!(
            "SELECT kafka_offset FROM {}.{table} WHERE day = '{}' AND kafka_topic = ? AND kafka_partition = ? AND kafka_offset = ?{index} LIMIT 1",
            self.database,
            inferlog_store::day_string(i32::from(row.day))
        );
        // Only what reached the quorum: an attempt that timed out waiting
        // for it left its part on one replica, and is sent again (the same
        // block: the replicas refuse it until the part before reaches its
        // quorum, then take it once).
        let read = |sequential: bool| {
            let mut query = self.client.query(&sql);
            if sequential {
                query = query.with_setting("select_sequential_consistency", "1");
            }
            bounded(self.request_timeout, query.bind(row.topic).bind(row.partition).bind(row.offset).fetch_all::<OffsetRow>())
        };
        let rows = match read(self.config.cluster.is_some()).await {
            // The partition's last quorum part is gone (a release dropped
            // the day; ClickHouse 18.16 keeps naming it in ZooKeeper, and
            // every such read fails for good): this replica, which the
            // attempt went to, answers for it. A part of the attempt that
            // only it holds is taken as landed, as the replay log does.
            Err(e) if inferlog_store::error::clickhouse_code(&e) == Some(QUORUM_PART_MISSING) => {
                tracing::info!(day = %inferlog_store::day_string(i32::from(row.day)), "the day's last quorum part is gone (released): checking this replica alone");
                read(false).await
            }
            other => other,
        }
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

    /// A server's version string, as the feature checks read it (the typed
    /// rows' shapes are held in store::model::rows's tests).
    #[test]
    fn a_server_version_parses_to_major_and_minor() {
        assert_eq!(parse_version("18.16.1"), (18, 16));
    }

    #[test]
    fn a_passed_over_replica_gives_its_turn_to_the_next_until_its_time_is_up() {
        let client = || Client::default().with_url("http://127.0.0.1:1");
        let replicas = Replicas::new(vec![client(), client(), client()]);
        assert_eq!(replicas.pick(1_000), 0, "the first replica while all answer");
        replicas.passed_over_until[0].store(5_000, Ordering::Relaxed);
        assert_eq!(replicas.pick(1_000), 1, "the next one while the first is passed over");
        assert_eq!(replicas.pick(5_000), 0, "the first again once its time is up");
        replicas.passed_over_until[1].store(3_000, Ordering::Relaxed);
        replicas.passed_over_until[2].store(4_000, Ordering::Relaxed);
        assert_eq!(replicas.pick(1_000), 1, "all passed over: the one whose time ends first");
    }
}
