//! The hot tier as the compactor and retention see it: the day partitions
//! of the ClickHouse table ingest writes, what each holds, and dropping one.
//! (Ingest owns the table's DDL and its inserts.) A day's reads in units
//! are [`units`]'s.

mod units;

use clickhouse::{Client, Row};
use serde::Deserialize;

use crate::config::ClickHouseConfig;
use crate::error::StoreError;
use crate::model::unit::Unit;
use crate::Day;

/// How a day's rows are read so that producer retries count once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// The day is one merged part: read as is (fast, in key order).
    OnePart,
    /// The day is in several parts: read with `FINAL` (merged on read).
    Final,
}

impl ReadMode {
    /// The table modifier this mode reads with.
    pub fn modifier(self) -> &'static str {
        match self {
            ReadMode::OnePart => "",
            ReadMode::Final => "FINAL",
        }
    }
}

/// One day partition of the hot table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotPartition {
    pub day: Day,
    /// Rows in active parts (before ReplacingMergeTree collapses retries).
    pub rows: u64,
    pub bytes: u64,
}

/// Figures of one day's rows that any copy of them must reproduce: the
/// archive is verified against it, and a change means late rows arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Row, Deserialize)]
pub struct DayFingerprint {
    pub rows: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub errors: u64,
    pub min_timestamp_ms: u64,
    pub max_timestamp_ms: u64,
}

impl DayFingerprint {
    pub const EMPTY: DayFingerprint =
        DayFingerprint { rows: 0, input_tokens: 0, output_tokens: 0, errors: 0, min_timestamp_ms: 0, max_timestamp_ms: 0 };

    /// The fingerprint of two disjoint sets of rows together (two shards' days).
    pub fn plus(&self, other: &DayFingerprint) -> DayFingerprint {
        match (self.rows, other.rows) {
            (0, _) => *other,
            (_, 0) => *self,
            _ => DayFingerprint {
                rows: self.rows + other.rows,
                input_tokens: self.input_tokens + other.input_tokens,
                output_tokens: self.output_tokens + other.output_tokens,
                errors: self.errors + other.errors,
                min_timestamp_ms: self.min_timestamp_ms.min(other.min_timestamp_ms),
                max_timestamp_ms: self.max_timestamp_ms.max(other.max_timestamp_ms),
            },
        }
    }

    /// A stable text form, stored in the catalog.
    pub fn encode(&self) -> String {
        format!(
            "rows={} in={} out={} err={} ts={}..{}",
            self.rows, self.input_tokens, self.output_tokens, self.errors, self.min_timestamp_ms, self.max_timestamp_ms
        )
    }
}

/// One `count() AS n` answer.
#[derive(Debug, Row, Deserialize)]
struct Count {
    n: u64,
}

#[derive(Debug, Row, Deserialize)]
struct PartitionRow {
    partition_id: String,
    rows: u64,
    bytes: u64,
}

#[derive(Debug, Row, Deserialize)]
struct Reach {
    kafka_topic: String,
    kafka_partition: u16,
    last_offset: u64,
}

/// The hot table, for reading and releasing whole days.
#[derive(Clone)]
pub struct HotTier {
    client: Client,
    pub database: String,
    pub table: String,
    /// The rejects log ([`crate::model::tables::REJECTS`]): under the hot policy too.
    pub rejects_table: String,
    /// On a cluster: its name and every replica of every shard. Reads go
    /// through the `Distributed` tables at `url`; partitions are listed,
    /// merged, dropped and confirmed on the replicas' local tables.
    cluster: Option<Cluster>,
}

/// A cluster as the hot tier reads it.
#[derive(Debug, Clone)]
struct Cluster {
    name: String,
    replicas: Vec<Replica>,
    /// Per shard: how many of its replicas must answer, and agree, for a
    /// day's fingerprint to stand ([`ClickHouseConfig::read_quorum`]).
    read_quorum: Vec<usize>,
}

/// One server of a cluster: its shard (0-based), URL and client.
#[derive(Clone)]
struct Replica {
    shard: usize,
    url: String,
    client: Client,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("shard", &self.shard).field("url", &self.url).finish_non_exhaustive()
    }
}

/// Where a unit's rows are read: a client and the table it names (on a
/// cluster, a shard's local table on one replica, named by `replica`).
#[derive(Clone)]
pub struct UnitSource {
    pub client: Client,
    pub table: String,
    pub replica: Option<String>,
}

impl std::fmt::Debug for UnitSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitSource").field("table", &self.table).field("replica", &self.replica).finish_non_exhaustive()
    }
}

/// One replica's day partitions of a table.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaPartitions {
    pub shard: usize,
    pub url: String,
    pub partitions: Vec<HotPartition>,
}

impl std::fmt::Debug for HotTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotTier").field("database", &self.database).field("table", &self.table).finish_non_exhaustive()
    }
}

/// `(major, minor)` of a ClickHouse version string.
pub fn parse_version(v: &str) -> (u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

impl HotTier {
    pub fn new(config: &ClickHouseConfig) -> Result<HotTier, StoreError> {
        let cluster = match &config.cluster {
            None => None,
            Some(name) => {
                let mut replicas = Vec::new();
                for (shard, s) in config.shards.iter().enumerate() {
                    for url in &s.replicas {
                        replicas.push(Replica { shard, url: url.clone(), client: config.client_at(url)? });
                    }
                }
                let read_quorum = (0..config.shards.len()).map(|s| config.read_quorum(s)).collect();
                Some(Cluster { name: name.clone(), replicas, read_quorum })
            }
        };
        Ok(HotTier {
            client: config.client()?,
            database: config.database.clone(),
            table: config.table.clone(),
            rejects_table: config.rejects_table.clone(),
            cluster,
        })
    }

    /// `database.table` as an `ALTER` or `OPTIMIZE` names it: on a
    /// cluster, the shard-local table `ON CLUSTER`.
    fn target(&self, table: &str) -> String {
        match &self.cluster {
            None => format!("{}.{table}", self.database),
            Some(c) => format!("{}.{} ON CLUSTER {}", self.database, crate::model::tables::local_table(table), c.name),
        }
    }

    /// The client, for stage-specific queries.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `database.table`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.database, self.table)
    }

    /// The error of a failed `operation` on the table. The table's name is
    /// formatted only when it fails: callers pass this in per-row loops
    /// (`cursor.next().await.map_err(hot.error(..))`), where formatting it
    /// eagerly took 6% of the compactor's reader.
    pub fn error(&self, operation: &'static str) -> impl FnOnce(clickhouse::error::Error) -> StoreError + '_ {
        move |source| StoreError::ClickHouse { operation, table: self.qualified(), source }
    }

    /// Every day partition with rows, oldest first. Empty when the table does not exist yet.
    pub async fn partitions(&self) -> Result<Vec<HotPartition>, StoreError> {
        self.partitions_of(&self.table).await
    }

    /// Every day partition of the rejects log with rows, oldest first.
    pub async fn reject_partitions(&self) -> Result<Vec<HotPartition>, StoreError> {
        self.partitions_of(&self.rejects_table).await
    }

    /// Drops one day of the rejects log (nothing to drop succeeds).
    pub async fn drop_rejects_day(&self, day: Day) -> Result<(), StoreError> {
        self.drop_day_of(&self.rejects_table, day, "drop rejects partition").await
    }

    /// Drops one day partition of `table` (nothing to drop succeeds). On
    /// a cluster, on every replica, then confirmed on each: a replica that
    /// still holds the day, or that does not answer, is an error naming it
    /// (transient: the drop is repeated on the next pass).
    async fn drop_day_of(&self, table: &str, day: Day, operation: &'static str) -> Result<(), StoreError> {
        // Every replica must answer before the drop: an `ALTER … ON CLUSTER`
        // would wait for one that is down (up to the server's DDL timeout).
        self.replica_partitions(table).await?;
        let sql = format!("ALTER TABLE {} DROP PARTITION ?", self.target(table));
        self.client.query(&sql).bind(crate::day_string(day)).execute().await.map_err(self.error(operation))?;
        for replica in self.replica_partitions(table).await? {
            if let Some(p) = replica.partitions.iter().find(|p| p.day == day) {
                return Err(StoreError::Unconfirmed(format!(
                    "{}.{table}: replica {} (shard {}) still holds {} rows of {} after the drop",
                    self.database,
                    replica.url,
                    replica.shard + 1,
                    p.rows,
                    crate::day_string(day)
                )));
            }
        }
        Ok(())
    }

    /// Each replica's day partitions of `table` (its shard-local table);
    /// empty on one server. A replica that does not answer is an error
    /// naming it.
    pub async fn replica_partitions(&self, table: &str) -> Result<Vec<ReplicaPartitions>, StoreError> {
        let Some(cluster) = &self.cluster else { return Ok(Vec::new()) };
        let local = crate::model::tables::local_table(table);
        let mut out = Vec::with_capacity(cluster.replicas.len());
        for r in &cluster.replicas {
            let partitions = self
                .partitions_on(&r.client, &local)
                .await
                .map_err(|e| StoreError::Unconfirmed(format!("replica {} (shard {}): {e}", r.url, r.shard + 1)))?;
            out.push(ReplicaPartitions { shard: r.shard, url: r.url.clone(), partitions });
        }
        Ok(out)
    }

    /// Every day partition of the replay log (`<table>_offsets`, by the
    /// day its entries were written) with rows, oldest first.
    pub async fn replay_log_partitions(&self) -> Result<Vec<HotPartition>, StoreError> {
        self.partitions_of(&crate::model::tables::replay_log_table(&self.table)).await
    }

    /// Per topic partition, the highest offset the replay log's entries
    /// written on `day` cover: a reader whose committed offset is past it
    /// never reads them again.
    pub async fn replay_log_reach(&self, day: Day) -> Result<Vec<(String, i32, u64)>, StoreError> {
        let sql = format!(
            "SELECT kafka_topic, kafka_partition, max(last_offset) AS last_offset FROM {}.{} WHERE day = toDate(?) \
             GROUP BY kafka_topic, kafka_partition ORDER BY kafka_topic, kafka_partition",
            self.database,
            crate::model::tables::replay_log_table(&self.table)
        );
        let rows = self.client.query(&sql).bind(crate::day_string(day)).fetch_all::<Reach>().await.map_err(self.error("replay log reach"))?;
        Ok(rows.into_iter().map(|r| (r.kafka_topic, i32::from(r.kafka_partition), r.last_offset)).collect())
    }

    /// Drops one day of the replay log (nothing to drop succeeds).
    pub async fn drop_replay_log_day(&self, day: Day) -> Result<(), StoreError> {
        self.drop_day_of(&crate::model::tables::replay_log_table(&self.table), day, "drop replay log partition").await
    }

    /// On a cluster, merged over the replicas: a day's rows are the sum
    /// over the shards of the most any of the shard's replicas holds.
    /// Replicas that do not answer are left out while each shard keeps its
    /// read quorum (a compactor works on with a replica down; what it
    /// reads is confirmed by the fingerprints, and a release waits for
    /// every replica); fewer is an error naming them.
    async fn partitions_of(&self, table: &str) -> Result<Vec<HotPartition>, StoreError> {
        let Some(cluster) = &self.cluster else {
            return self.partitions_on(&self.client, table).await;
        };
        let local = crate::model::tables::local_table(table);
        let answers = futures_util::future::join_all(cluster.replicas.iter().map(|r| self.partitions_on(&r.client, &local))).await;
        let mut days: std::collections::BTreeMap<Day, std::collections::BTreeMap<usize, HotPartition>> = Default::default();
        let mut answered = vec![0usize; cluster.read_quorum.len()];
        let mut silent = Vec::new();
        for (replica, answer) in cluster.replicas.iter().zip(answers) {
            let partitions = match answer {
                Ok(p) => p,
                Err(e) => {
                    silent.push(format!("replica {} (shard {}): {e}", replica.url, replica.shard + 1));
                    continue;
                }
            };
            answered[replica.shard] += 1;
            for p in partitions {
                let shard = days.entry(p.day).or_default().entry(replica.shard).or_insert_with(|| HotPartition { day: p.day, rows: 0, bytes: 0 });
                if p.rows > shard.rows {
                    *shard = p;
                }
            }
        }
        if answered.iter().zip(&cluster.read_quorum).any(|(a, needed)| a < needed) {
            return Err(StoreError::Unconfirmed(silent.join("; ")));
        }
        if !silent.is_empty() {
            tracing::warn!(table = %local, replicas = %silent.join("; "), "replicas not answering: listed from the others");
        }
        Ok(days
            .into_iter()
            .map(|(day, shards)| HotPartition { day, rows: shards.values().map(|p| p.rows).sum(), bytes: shards.values().map(|p| p.bytes).sum() })
            .collect())
    }

    async fn partitions_on(&self, client: &Client, table: &str) -> Result<Vec<HotPartition>, StoreError> {
        // partition_id of a `PARTITION BY day` (Date) table is YYYYMMDD on 18.16 and current releases.
        let rows = client
            .query(
                "SELECT partition_id, sum(rows) AS rows, sum(bytes_on_disk) AS bytes FROM system.parts \
                 WHERE database = ? AND table = ? AND active GROUP BY partition_id ORDER BY partition_id",
            )
            .bind(&self.database)
            .bind(table)
            .fetch_all::<PartitionRow>()
            .await
            .map_err(self.error("partition listing"))?;
        let mut partitions = Vec::with_capacity(rows.len());
        for row in rows {
            let id = &row.partition_id;
            let day = (id.len() == 8)
                .then(|| crate::parse_day(&format!("{}-{}-{}", &id[..4], &id[4..6], &id[6..])))
                .flatten()
                .ok_or_else(|| StoreError::Config(format!("{}.{table}: partition id {id:?} is not a day (YYYYMMDD)", self.database)))?;
            if row.rows > 0 {
                partitions.push(HotPartition { day, rows: row.rows, bytes: row.bytes });
            }
        }
        Ok(partitions)
    }

    /// Active parts of one day's partition; on a cluster, the most any
    /// replica that answers holds, and whether every replica answered.
    pub async fn parts(&self, day: Day) -> Result<(u64, bool), StoreError> {
        let sql = "SELECT count() AS n FROM system.parts WHERE database = ? AND table = ? AND active AND partition_id = ?";
        let id = crate::day_string(day).replace('-', "");
        let Some(cluster) = &self.cluster else {
            let row = self
                .client
                .query(sql)
                .bind(&self.database)
                .bind(&self.table)
                .bind(&id)
                .fetch_one::<Count>()
                .await
                .map_err(self.error("part count"))?;
            return Ok((row.n, true));
        };
        let local = crate::model::tables::local_table(&self.table);
        let (mut most, mut answered, mut last_error) = (0, 0, None);
        for r in &cluster.replicas {
            match r.client.query(sql).bind(&self.database).bind(&local).bind(&id).fetch_one::<Count>().await {
                Ok(row) => (most, answered) = (most.max(row.n), answered + 1),
                Err(e) => last_error = Some(e),
            }
        }
        match last_error {
            Some(e) if answered == 0 => Err(self.error("part count")(e)),
            _ => Ok((most, answered == cluster.replicas.len())),
        }
    }

    /// Merges a closed day into one part, collapsing producer retries
    /// (`OPTIMIZE … FINAL`), so it can be read without `FINAL`: in key
    /// order, single-threaded, at full speed. Returns how it must be read:
    /// [`ReadMode::Final`] if it is still in several parts (a merge was
    /// already running, or rows arrived meanwhile).
    /// On a cluster with a replica not answering, nothing is merged (an
    /// `OPTIMIZE … ON CLUSTER` would wait for it): a day in several parts
    /// is read with `FINAL`.
    pub async fn settle_day(&self, day: Day) -> Result<ReadMode, StoreError> {
        let (parts, all) = self.parts(day).await?;
        if parts > 1 && all {
            let sql = format!("OPTIMIZE TABLE {} PARTITION ? FINAL", self.target(&self.table));
            self.client.query(&sql).bind(crate::day_string(day)).execute().await.map_err(self.error("optimize partition"))?;
        }
        Ok(if self.parts(day).await?.0 > 1 { ReadMode::Final } else { ReadMode::OnePart })
    }

    /// The fingerprint of one day's rows (read as `mode` says: after
    /// collapsing producer retries). On a cluster, the sum over the shards
    /// of each shard's fingerprint, computed on its local table by every
    /// replica at once: the replicas that answer must agree, and be at
    /// least the shard's read quorum, else the day is not settled on the
    /// cluster yet ([`StoreError::Unconfirmed`], transient). The archive
    /// is read through the `Distributed` table and verified against this
    /// sum, so a `remote_servers` that disagrees with the configured
    /// shards is caught too.
    pub async fn fingerprint(&self, day: Day, mode: ReadMode) -> Result<DayFingerprint, StoreError> {
        self.unit_fingerprint(day, mode, &Unit::whole_day()).await
    }

    /// Whether the hot table exists (a fresh deployment has none yet).
    pub async fn exists(&self) -> Result<bool, StoreError> {
        Ok(self.count_for_table("SELECT count() AS n FROM system.tables WHERE database = ? AND name = ?", "table lookup").await? > 0)
    }

    /// A `count() AS n` of a system table about this table (`database` and the table's name bound, in that order).
    async fn count_for_table(&self, sql: &str, operation: &'static str) -> Result<u64, StoreError> {
        let row = self.client.query(sql).bind(&self.database).bind(&self.table).fetch_one::<Count>().await.map_err(self.error(operation))?;
        Ok(row.n)
    }

    /// `user_id_hash IN (?, …)` with one placeholder per hash.
    fn users_in(hashes: &[String]) -> String {
        format!("user_id_hash IN ({})", vec!["?"; hashes.len()].join(", "))
    }

    /// Rows per day whose `user_id_hash` is one of `hashes` (every stored
    /// row, producer retries not yet collapsed included), oldest day first.
    pub async fn user_rows(&self, hashes: &[String]) -> Result<Vec<(Day, u64)>, StoreError> {
        #[derive(Debug, Row, Deserialize)]
        struct PerDay {
            day: String,
            n: u64,
        }
        if hashes.is_empty() || !self.exists().await? {
            return Ok(Vec::new());
        }
        let sql =
            format!("SELECT toString(day) AS day, count() AS n FROM {} WHERE {} GROUP BY day ORDER BY day", self.qualified(), Self::users_in(hashes));
        let mut query = self.client.query(&sql);
        for h in hashes {
            query = query.bind(h);
        }
        let rows = query.fetch_all::<PerDay>().await.map_err(self.error("count a user's rows"))?;
        rows.into_iter()
            .map(|r| crate::parse_day(&r.day).map(|d| (d, r.n)).ok_or_else(|| StoreError::Config(format!("{}: day {:?}", self.qualified(), r.day))))
            .collect()
    }

    /// The key ids (before the `:`) the stored user id hashes were made with.
    pub async fn user_key_ids(&self) -> Result<Vec<String>, StoreError> {
        #[derive(Debug, Row, Deserialize)]
        struct KeyId {
            key_id: String,
        }
        if !self.exists().await? {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT DISTINCT substring(assumeNotNull(user_id_hash), 1, position(assumeNotNull(user_id_hash), ':') - 1) AS key_id              FROM {} WHERE isNotNull(user_id_hash) ORDER BY key_id",
            self.qualified()
        );
        let rows = self.client.query(&sql).fetch_all::<KeyId>().await.map_err(self.error("list hash key ids"))?;
        Ok(rows.into_iter().map(|r| r.key_id).collect())
    }

    /// Starts a mutation deleting every row of `hashes` (on every part,
    /// whatever its day); [`HotTier::mutations_running`] tells when it is done.
    pub async fn delete_users(&self, hashes: &[String]) -> Result<(), StoreError> {
        let sql = format!("ALTER TABLE {} DELETE WHERE {}", self.target(&self.table), Self::users_in(hashes));
        let mut query = self.client.query(&sql);
        for h in hashes {
            query = query.bind(h);
        }
        query.execute().await.map_err(self.error("delete a user's rows"))
    }

    /// Mutations of the hot table not yet applied to every part (of every replica, on a cluster).
    pub async fn mutations_running(&self) -> Result<u64, StoreError> {
        let sql = "SELECT count() AS n FROM system.mutations WHERE database = ? AND table = ? AND is_done = 0";
        let Some(cluster) = &self.cluster else { return self.count_for_table(sql, "read mutations").await };
        let local = crate::model::tables::local_table(&self.table);
        let mut running = 0;
        for r in &cluster.replicas {
            running += r.client.query(sql).bind(&self.database).bind(&local).fetch_one::<Count>().await.map_err(self.error("read mutations"))?.n;
        }
        Ok(running)
    }

    /// Drops one day's partition. Dropping a day that holds nothing succeeds,
    /// so a drop repeated after a crash is harmless.
    pub async fn drop_day(&self, day: Day) -> Result<(), StoreError> {
        self.drop_day_of(&self.table, day, "drop partition").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_shards_fingerprints_add_up_and_an_empty_shard_adds_nothing() {
        let a = DayFingerprint { rows: 3, input_tokens: 30, output_tokens: 7, errors: 1, min_timestamp_ms: 500, max_timestamp_ms: 900 };
        let b = DayFingerprint { rows: 2, input_tokens: 5, output_tokens: 4, errors: 0, min_timestamp_ms: 100, max_timestamp_ms: 600 };
        let sum = DayFingerprint { rows: 5, input_tokens: 35, output_tokens: 11, errors: 1, min_timestamp_ms: 100, max_timestamp_ms: 900 };
        assert_eq!((a.plus(&b), b.plus(&a)), (sum, sum));
        // An empty shard's zero timestamps must not become the day's first.
        assert_eq!((a.plus(&DayFingerprint::EMPTY), DayFingerprint::EMPTY.plus(&a)), (a, a));
    }
}
