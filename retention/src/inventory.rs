//! Inventory. In: the stores of every tier and the catalog. Out: what each
//! tier holds now (hot partitions, the rejects log's day partitions,
//! aggregate days, cold objects and their
//! manifest rows), the compactor's day records, the deletions the audit
//! table records, and the DLQ topic as the broker holds it ([`crate::dlq`]).
//! A store that cannot be read is an error naming the tier.

use std::collections::BTreeMap;

use inferlog_store::catalog::{day_of, Catalog, DayRecord, ManifestEntry};
use inferlog_store::cold::{ColdObject, ColdStore};
use inferlog_store::hot::{HotPartition, HotTier, ReplicaPartitions};
use inferlog_store::model::aggregates::AGGREGATE_TABLES;
use inferlog_store::{Day, StoreError};
use sqlx::Row;

use crate::config::Config;
use crate::dlq::DlqTopic;
use crate::error::RetentionError;

/// A non-dry-run deletion recorded in the audit table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    pub tier: String,
    pub unit: String,
    pub action: String,
}

#[derive(Debug, Clone)]
pub struct Inventory {
    pub hot: Vec<HotPartition>,
    /// Day partitions of the rejects log (kept under the hot policy).
    pub rejects: Vec<HotPartition>,
    /// Day partitions of ingest's replay log, by the day its entries were
    /// written (kept under the hot policy).
    pub replay_log: Vec<HotPartition>,
    /// On a ClickHouse cluster, each replica's day partitions of the hot
    /// table (empty on one server).
    pub replicas: Vec<ReplicaPartitions>,
    pub days: BTreeMap<Day, DayRecord>,
    pub manifest: Vec<ManifestEntry>,
    pub objects: Vec<ColdObject>,
    /// Rows of every aggregate table (`AGGREGATE_TABLES`), per day.
    pub aggregate_days: BTreeMap<Day, u64>,
    pub deletions: Vec<Deletion>,
    /// When the DLQ replay ledger's oldest stored entry was written (epoch ms); `None`: it holds none.
    pub ledger_oldest: Option<i64>,
    pub dlq: DlqTopic,
}

/// Handles on every store.
#[derive(Debug, Clone)]
pub struct Stores {
    pub hot: HotTier,
    pub cold: ColdStore,
    pub catalog: Catalog,
}

impl Stores {
    pub async fn connect(config: &Config) -> Result<Stores, RetentionError> {
        Ok(Stores {
            hot: HotTier::new(&config.clickhouse).map_err(RetentionError::tier("hot"))?,
            cold: ColdStore::new(&config.cold).map_err(RetentionError::tier("cold"))?,
            catalog: Catalog::connect(&config.postgres).await.map_err(RetentionError::tier("aggregates"))?,
        })
    }
}

/// Days with aggregate rows, and how many rows each holds.
pub async fn aggregate_days(catalog: &Catalog) -> Result<BTreeMap<Day, u64>, StoreError> {
    let per_table = AGGREGATE_TABLES.map(|table| format!("SELECT day, count(*) AS n FROM {table} GROUP BY day")).join(" UNION ALL ");
    let rows = sqlx::query(&format!("SELECT day, sum(n)::bigint AS n FROM ({per_table}) t GROUP BY day ORDER BY day"))
        .fetch_all(catalog.pool())
        .await
        .map_err(StoreError::postgres("list aggregate days"))?;
    let mut days = BTreeMap::new();
    for r in rows {
        let day: chrono::NaiveDate = r.try_get("day").map_err(StoreError::postgres("decode aggregate days"))?;
        let n: i64 = r.try_get("n").map_err(StoreError::postgres("decode aggregate days"))?;
        days.insert(day_of(day), n as u64);
    }
    Ok(days)
}

async fn deletions(catalog: &Catalog) -> Result<Vec<Deletion>, StoreError> {
    let rows = sqlx::query("SELECT DISTINCT tier, unit, action FROM retention_audit WHERE NOT dry_run ORDER BY tier, unit, action")
        .fetch_all(catalog.pool())
        .await
        .map_err(StoreError::postgres("read audit table"))?;
    rows.iter()
        .map(|r| {
            Ok(Deletion {
                tier: r.try_get("tier").map_err(StoreError::postgres("decode audit table"))?,
                unit: r.try_get("unit").map_err(StoreError::postgres("decode audit table"))?,
                action: r.try_get("action").map_err(StoreError::postgres("decode audit table"))?,
            })
        })
        .collect()
}

impl Inventory {
    pub async fn take(stores: &Stores, config: &Config) -> Result<Inventory, RetentionError> {
        // An audit that cannot see a replica cannot say the replica is clean.
        let replicas = stores.hot.replica_partitions(&stores.hot.table).await.map_err(|e| RetentionError::Unaudited(e.to_string()))?;
        let hot = stores.hot.partitions().await.map_err(RetentionError::tier("hot"))?;
        let rejects = stores.hot.reject_partitions().await.map_err(RetentionError::tier("rejects"))?;
        let replay_log = stores.hot.replay_log_partitions().await.map_err(RetentionError::tier("replay_log"))?;
        let catalog = &stores.catalog;
        let agg = RetentionError::tier("aggregates");
        let days = catalog.days().await.map_err(agg)?.into_iter().map(|r| (r.day, r)).collect();
        let manifest = catalog.manifest(None).await.map_err(RetentionError::tier("aggregates"))?;
        let objects = stores.cold.list_all().await.map_err(RetentionError::tier("cold"))?;
        let aggregate_days = aggregate_days(catalog).await.map_err(RetentionError::tier("aggregates"))?;
        let deletions = deletions(catalog).await.map_err(RetentionError::tier("aggregates"))?;
        let ledger_oldest = catalog.replay_oldest_stored().await.map_err(RetentionError::tier("aggregates"))?;
        let dlq = crate::dlq::inspect(&config.kafka).await;
        Ok(Inventory { hot, rejects, replay_log, replicas, days, manifest, objects, aggregate_days, deletions, ledger_oldest, dlq })
    }

    /// Whether the compactor holds a verified archive (and aggregates) of exactly the day's rows.
    pub fn verified_archive(&self, day: Day) -> bool {
        let Some(record) = self.days.get(&day) else { return false };
        let archived: u64 = self.manifest.iter().filter(|m| m.day == day).map(|m| m.represented_rows).sum();
        matches!(record.state, inferlog_store::catalog::DayState::Aggregated | inferlog_store::catalog::DayState::Releasing)
            && archived == record.hot_rows
            && archived > 0
    }
}
