//! The `[clickhouse]` table: the hot tier's server or cluster, its tables
//! and the shards' partitions and quorums.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{identifier, secret, CLICKHOUSE_PASSWORD_ENV};
use crate::error::StoreError;

/// The `[clickhouse]` table: the hot tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClickHouseConfig {
    /// HTTP interface. Default: "http://127.0.0.1:8123".
    pub url: String,
    /// Database, created if missing. Default: "inferlog".
    pub database: String,
    /// Table of hot rows, created if missing. Default: "inference_logs".
    pub table: String,
    /// Table of rejected messages (reason, field, source offset), created if missing. Default: "inference_rejects".
    pub rejects_table: String,
    /// User. Default: "default". The password comes from INFERLOG_CLICKHOUSE_PASSWORD or `password_file`.
    pub user: String,
    /// File holding the password. Default: none.
    pub password_file: Option<PathBuf>,
    /// How long ingest waits for one INSERT to be sent and answered; past
    /// it the attempt has failed, and its retry first ends it on the
    /// server and checks whether it landed. Default: "60s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub request_timeout: Duration,
    /// Make each hot-table part durable on disk (fsync) before ClickHouse
    /// acknowledges the insert, so a host power loss cannot take a part
    /// whose offset ingest then committed. Applied where the server has
    /// the MergeTree setting `fsync_after_insert` (21.x on; 18.16 has
    /// none: docs/operations.md, failure model). Default: true.
    pub fsync_after_insert: bool,
    /// The ClickHouse cluster (its `remote_servers` name) the hot tier
    /// lives on: ingest creates each table `ON CLUSTER` as a replicated
    /// `<table>_local` per shard and a `Distributed` `<table>` over them,
    /// and writes each Kafka partition's rows to its shard's local table;
    /// readers read `<table>` at `url` (any server of the cluster). None:
    /// one server at `url`. Default: none.
    pub cluster: Option<String>,
    /// The cluster's shards, with `cluster`: each shard's replicas and the
    /// Kafka partitions it stores (docs/scaling.md). Default: none.
    pub shards: Vec<ShardConfig>,
    /// Replicas of its shard an INSERT must reach before ingest takes it as
    /// written and commits its offsets, with `cluster`; 0: a majority of
    /// the shard's replicas. Default: 0.
    pub insert_quorum: u32,
}

/// One shard of `[clickhouse] cluster`, as `[[clickhouse.shards]]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ShardConfig {
    /// The HTTP URL of each replica of the shard; ingest writes to the
    /// first that answers. Default: none.
    pub replicas: Vec<String>,
    /// The Kafka partitions (of every topic ingest reads) whose rows this
    /// shard stores: a partition's rows, its retries and its replay
    /// lookups always meet the same shard. A partition stays on its shard
    /// for good; one no shard lists is refused when it is assigned.
    /// Default: none.
    pub partitions: Vec<u16>,
}

impl Default for ClickHouseConfig {
    fn default() -> Self {
        ClickHouseConfig {
            url: "http://127.0.0.1:8123".into(),
            database: "inferlog".into(),
            table: "inference_logs".into(),
            rejects_table: "inference_rejects".into(),
            user: "default".into(),
            password_file: None,
            request_timeout: Duration::from_secs(60),
            fsync_after_insert: true,
            cluster: None,
            shards: Vec::new(),
            insert_quorum: 0,
        }
    }
}

impl ClickHouseConfig {
    /// The password from `INFERLOG_CLICKHOUSE_PASSWORD`, else `password_file`, else none.
    pub fn password(&self) -> Result<Option<String>, StoreError> {
        secret(CLICKHOUSE_PASSWORD_ENV, self.password_file.as_ref(), "clickhouse.password_file")
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        identifier(&self.database, "clickhouse.database")?;
        identifier(&self.table, "clickhouse.table")?;
        identifier(&self.rejects_table, "clickhouse.rejects_table")?;
        let Some(cluster) = &self.cluster else {
            if !self.shards.is_empty() {
                return Err(StoreError::Config("clickhouse.shards is set without clickhouse.cluster".into()));
            }
            return Ok(());
        };
        identifier(cluster, "clickhouse.cluster")?;
        if self.shards.is_empty() {
            return Err(StoreError::Config(format!("clickhouse.cluster = {cluster:?} needs its [[clickhouse.shards]]")));
        }
        let mut owner: HashMap<u16, usize> = HashMap::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let n = i + 1;
            if shard.replicas.is_empty() {
                return Err(StoreError::Config(format!("clickhouse.shards[{n}] lists no replicas")));
            }
            if self.insert_quorum as usize > shard.replicas.len() {
                return Err(StoreError::Config(format!(
                    "clickhouse.insert_quorum = {} is more than the {} replicas of clickhouse.shards[{n}]",
                    self.insert_quorum,
                    shard.replicas.len()
                )));
            }
            for p in &shard.partitions {
                if let Some(other) = owner.insert(*p, n) {
                    return Err(StoreError::Config(format!("Kafka partition {p} is in clickhouse.shards[{other}] and clickhouse.shards[{n}]")));
                }
            }
        }
        Ok(())
    }

    /// The shard (0-based) storing Kafka partition `partition`; always 0
    /// on one server; `None` on a cluster whose shards do not list it.
    pub fn shard_of(&self, partition: u16) -> Option<usize> {
        if self.cluster.is_none() {
            return Some(0);
        }
        self.shards.iter().position(|s| s.partitions.contains(&partition))
    }

    /// Replicas an INSERT into `shard` must reach: `insert_quorum`, else a
    /// majority of the shard's replicas.
    pub fn quorum(&self, shard: usize) -> usize {
        let replicas = self.shards.get(shard).map_or(1, |s| s.replicas.len());
        if self.insert_quorum > 0 {
            self.insert_quorum as usize
        } else {
            replicas / 2 + 1
        }
    }

    /// Replicas of `shard` that must answer, and agree, before a day read
    /// from it counts: enough that any of them shares every insert's
    /// quorum (read + write quorum > replicas), so they cannot all miss
    /// a row that was acknowledged. With the default majority quorum a
    /// shard of two replicas needs one answer; with `insert_quorum = 1`,
    /// both.
    pub fn read_quorum(&self, shard: usize) -> usize {
        let replicas = self.shards.get(shard).map_or(1, |s| s.replicas.len());
        replicas + 1 - self.quorum(shard).min(replicas)
    }

    /// A client for this server (not bound to a database).
    pub fn client(&self) -> Result<clickhouse::Client, StoreError> {
        self.client_at(&self.url)
    }

    /// A client for the server at `url` (a replica of a shard), with this
    /// config's user and password.
    pub fn client_at(&self, url: &str) -> Result<clickhouse::Client, StoreError> {
        let mut client = clickhouse::Client::default()
            .with_url(url)
            .with_user(&self.user)
            // 18.16 does not send the column types the validation needs.
            .with_validation(false)
            .with_compression(clickhouse::Compression::None);
        if let Some(password) = self.password()? {
            client = client.with_password(password);
        }
        Ok(client)
    }
}
