//! Enforce. In: an [`Inventory`], the policies and a point in time. Out:
//! every unit past its policy deleted, tier by tier, each deletion written
//! to the audit table (or, with `dry_run`, nothing deleted and each would-be
//! deletion audited as a dry run). Each unit is deleted under its day's
//! advisory lock, in a way a re-run finishes after a kill at any point:
//!
//! - hot: through the shared release path (verified archive and aggregates
//!   first, else refused), `releasing` recorded before the drop;
//! - rejects log: under the hot policy, nothing to archive (the rejected
//!   messages' bytes are in the DLQ, whose retention is the same); the
//!   audit row is written before the drop, so a kill in between leaves a
//!   partition the audit reports (`deleted.still_present`) and the next
//!   run drops, never a drop no row records;
//! - ingest's replay log: under the hot policy like the rejects log, and
//!   only a day whose every entry is below the ingest group's committed
//!   offsets ([`crate::offsets`]): an entry past them is still read by
//!   the partition's next owner, so that day is refused, saying which;
//! - aggregates: the day's rows and the audit row in one transaction;
//! - cold: the object, then its manifest row and the audit row in one
//!   transaction; a manifest row whose object is already gone is finished;
//! - the DLQ topic: settings that let a message outlive the hot policy are
//!   replaced by ones that fit ([`crate::dlq::target`]) with AlterConfigs,
//!   audited once the broker accepted them; credentials without that right
//!   make it a refusal that says what to set;
//! - the DLQ replay ledger: entries of replayed messages the DLQ topic no
//!   longer holds ([`crate::dlq::DlqTopic::ledger_cutoff`]), audited
//!   before they are deleted; they hold coordinates only, but no replay
//!   can meet their messages again, so nothing keeps them.

use inferlog_store::catalog::{date_of, AuditEntry};
use inferlog_store::kafka::KafkaConfig;
use inferlog_store::model::aggregates::AGGREGATE_TABLES;
use inferlog_store::release::{release_day, Release, ReleaseBy};
use inferlog_store::{day_string, Day, Policy, RetentionConfig, StoreError};
use serde::Serialize;

use crate::error::RetentionError;
use crate::inventory::{Inventory, Stores};

/// Test hook ([`inferlog_store::test_hooks`]): `hot|aggregates|cold` stops
/// after the first deletion in that tier, before its bookkeeping where
/// there is any; `rejects`, `replay_log` and `dlq_ledger` after the audit
/// row, before the deletion.
pub const PAUSE_ENV: &str = "INFERLOG_RETENTION_PAUSE_AFTER";

async fn pause_point(tier: &str) {
    inferlog_store::test_hooks::pause_point(PAUSE_ENV, tier).await;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Deleted,
    WouldDelete,
    /// Not deleted, and why (a hot day without a verified archive).
    Refused(String),
    /// Another replica holds the day's lock; the next run takes it.
    Busy,
    /// Settings changed to these (the DLQ topic's).
    Set(String),
    /// Settings a dry run would set.
    WouldSet(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Action {
    pub tier: &'static str,
    pub unit: String,
    pub action: &'static str,
    pub rows: Option<u64>,
    pub bytes: Option<u64>,
    pub outcome: Outcome,
}

impl Action {
    pub fn render(&self) -> String {
        let size = match (self.rows, self.bytes) {
            (Some(r), _) => format!(" rows={r}"),
            (None, Some(b)) => format!(" bytes={b}"),
            _ => String::new(),
        };
        match &self.outcome {
            Outcome::Deleted => format!("deleted {} {} {}{size}", self.tier, self.unit, self.action),
            Outcome::WouldDelete => format!("would delete {} {} {}{size}", self.tier, self.unit, self.action),
            Outcome::Refused(why) => format!("refused {} {}: {why}", self.tier, self.unit),
            Outcome::Busy => format!("busy {} {}: another replica holds the day", self.tier, self.unit),
            Outcome::Set(to) => format!("set {} {} {to}", self.tier, self.unit),
            Outcome::WouldSet(to) => format!("would set {} {} {to}", self.tier, self.unit),
        }
    }
}

/// Deletes (or, with `dry_run`, lists) every expired unit.
pub async fn enforce(
    stores: &Stores,
    inventory: &Inventory,
    policies: &RetentionConfig,
    kafka: &KafkaConfig,
    today: Day,
    dry_run: bool,
) -> Result<Vec<Action>, RetentionError> {
    let mut actions = Vec::new();
    let catalog = &stores.catalog;
    let tier_err = RetentionError::tier;

    // The DLQ topic's settings, first: they decide every later deletion there.
    if let Some(action) = fit_dlq(stores, inventory, policies, kafka, dry_run).await? {
        actions.push(action);
    }
    if let Some(action) = prune_ledger(stores, inventory, policies, dry_run).await? {
        actions.push(action);
    }

    // Hot: expired day partitions, only with a verified archive; and days
    // whose drop happened but whose bookkeeping did not (a kill in between).
    let mut hot: Vec<inferlog_store::hot::HotPartition> = inventory.hot.iter().filter(|p| policies.hot_days.expired(p.day, today)).copied().collect();
    for r in inventory.days.values().filter(|r| r.state == inferlog_store::catalog::DayState::Releasing) {
        if !hot.iter().any(|p| p.day == r.day) {
            hot.push(inferlog_store::hot::HotPartition { day: r.day, rows: 0, bytes: 0 });
        }
    }
    hot.sort_by_key(|p| p.day);
    for p in &hot {
        let unit = day_string(p.day);
        let Some(lock) = catalog.try_lock_day(p.day).await.map_err(tier_err("aggregates"))? else {
            actions.push(Action { tier: "hot", unit, action: "drop_partition", rows: Some(p.rows), bytes: None, outcome: Outcome::Busy });
            continue;
        };
        let by = ReleaseBy { actor: "retention", policy: policies.hot_days, dry_run };
        let released = release_day(&stores.hot, catalog, p.day, by, std::future::ready(()), pause_point("hot")).await;
        lock.unlock().await;
        let outcome = match released.map_err(tier_err("hot"))? {
            Release::Released { rows, .. } => (Some(rows), if dry_run { Outcome::WouldDelete } else { Outcome::Deleted }),
            Release::Refused(why) => (Some(p.rows), Outcome::Refused(why.to_string())),
        };
        actions.push(Action { tier: "hot", unit, action: "drop_partition", rows: outcome.0, bytes: None, outcome: outcome.1 });
    }

    // Rejects log: expired days, audited first.
    for p in inventory.rejects.iter().filter(|p| policies.hot_days.expired(p.day, today)) {
        let entry = AuditEntry {
            tier: "rejects",
            unit: day_string(p.day),
            action: "drop_partition",
            rows: Some(p.rows),
            bytes: Some(p.bytes),
            policy: policies.hot_days.to_string(),
            dry_run,
            actor: "retention",
            detail: Some(format!("{}.{}", stores.hot.database, stores.hot.rejects_table)),
        };
        audit_then(stores, &entry, stores.hot.drop_rejects_day(p.day)).await?;
        let outcome = if dry_run { Outcome::WouldDelete } else { Outcome::Deleted };
        actions.push(Action { tier: "rejects", unit: day_string(p.day), action: "drop_partition", rows: Some(p.rows), bytes: None, outcome });
    }

    actions.extend(drop_replay_log(stores, inventory, policies, kafka, today, dry_run).await?);

    // Aggregates: expired days' rows.
    for (&day, &rows) in inventory.aggregate_days.iter().filter(|(d, _)| policies.aggregate_days.expired(**d, today)) {
        let unit = day_string(day);
        let Some(lock) = catalog.try_lock_day(day).await.map_err(tier_err("aggregates"))? else {
            actions.push(Action { tier: "aggregates", unit, action: "delete_rows", rows: Some(rows), bytes: None, outcome: Outcome::Busy });
            continue;
        };
        let deleted = delete_aggregates(stores, day, policies, dry_run).await;
        lock.unlock().await;
        let rows = deleted.map_err(tier_err("aggregates"))?;
        if rows > 0 && !dry_run {
            pause_point("aggregates").await;
        }
        let outcome = if dry_run { Outcome::WouldDelete } else { Outcome::Deleted };
        actions.push(Action { tier: "aggregates", unit, action: "delete_rows", rows: Some(rows), bytes: None, outcome });
    }

    // Cold: objects of expired days, and manifest rows of expired days whose object is already gone.
    let mut keys: Vec<(String, Day, u64)> = inventory
        .objects
        .iter()
        .filter_map(|o| o.day.filter(|d| policies.cold_days.expired(*d, today)).map(|d| (o.key.clone(), d, o.bytes)))
        .collect();
    for m in inventory.manifest.iter().filter(|m| policies.cold_days.expired(m.day, today)) {
        if !keys.iter().any(|(k, _, _)| *k == m.object_key) {
            keys.push((m.object_key.clone(), m.day, m.bytes));
        }
    }
    keys.sort();
    for (key, day, bytes) in keys {
        let Some(lock) = catalog.try_lock_day(day).await.map_err(tier_err("aggregates"))? else {
            actions.push(Action { tier: "cold", unit: key, action: "delete_object", rows: None, bytes: Some(bytes), outcome: Outcome::Busy });
            continue;
        };
        let deleted = delete_object(stores, &key, bytes, inventory, policies, dry_run).await;
        lock.unlock().await;
        deleted?;
        let outcome = if dry_run { Outcome::WouldDelete } else { Outcome::Deleted };
        actions.push(Action { tier: "cold", unit: key, action: "delete_object", rows: None, bytes: Some(bytes), outcome });
    }
    Ok(actions)
}

/// Brings the DLQ topic's settings within the hot policy, if they are known and do not fit.
async fn fit_dlq(
    stores: &Stores,
    inventory: &Inventory,
    policies: &RetentionConfig,
    kafka: &KafkaConfig,
    dry_run: bool,
) -> Result<Option<Action>, RetentionError> {
    let (Policy::Days(days), Ok(settings)) = (policies.hot_days, &inventory.dlq.settings) else { return Ok(None) };
    let limit_ms = i64::from(days) * 86_400_000;
    if settings.fit(limit_ms) {
        return Ok(None);
    }
    let to = crate::dlq::target(settings, limit_ms);
    let action = |outcome| Action { tier: "dlq", unit: kafka.dlq_topic.clone(), action: "alter_configs", rows: None, bytes: None, outcome };
    if !dry_run {
        if let Err(why) = crate::dlq::alter(kafka, &to).await {
            return Ok(Some(action(Outcome::Refused(format!("{why}; set {} on the topic", to.describe())))));
        }
    }
    let entry = AuditEntry {
        tier: "dlq",
        unit: kafka.dlq_topic.clone(),
        action: "alter_configs",
        rows: None,
        bytes: None,
        policy: policies.hot_days.to_string(),
        dry_run,
        actor: "retention",
        detail: Some(format!("{} -> {}", settings.describe(), to.describe())),
    };
    stores.catalog.audit(&entry).await.map_err(RetentionError::tier("aggregates"))?;
    Ok(Some(action(if dry_run { Outcome::WouldSet(to.describe()) } else { Outcome::Set(to.describe()) })))
}

/// Writes `entry` to the audit table, then, unless it is a dry run, stops
/// at its tier's test hook and runs `delete` (its result; `None` on a dry
/// run). The audit row comes first, so a kill in between leaves data the
/// audit reports (`deleted.still_present`) and the next run deletes.
async fn audit_then<T>(
    stores: &Stores,
    entry: &AuditEntry,
    delete: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<Option<T>, RetentionError> {
    stores.catalog.audit(entry).await.map_err(RetentionError::tier("aggregates"))?;
    if entry.dry_run {
        return Ok(None);
    }
    pause_point(entry.tier).await;
    delete.await.map(Some).map_err(RetentionError::tier(entry.tier))
}

/// Drops the replay log's expired days the ingest group has committed
/// past, each audited before its drop ([`audit_then`], as the rejects log).
async fn drop_replay_log(
    stores: &Stores,
    inventory: &Inventory,
    policies: &RetentionConfig,
    kafka: &KafkaConfig,
    today: Day,
    dry_run: bool,
) -> Result<Vec<Action>, RetentionError> {
    let mut actions = Vec::new();
    let expired: Vec<_> = inventory.replay_log.iter().filter(|p| policies.hot_days.expired(p.day, today)).collect();
    if expired.is_empty() {
        return Ok(actions);
    }
    let mut reaches = Vec::with_capacity(expired.len());
    for p in &expired {
        reaches.push(stores.hot.replay_log_reach(p.day).await.map_err(RetentionError::tier("replay_log"))?);
    }
    let wanted: std::collections::BTreeSet<(String, i32)> = reaches.iter().flatten().map(|(t, p, _)| (t.clone(), *p)).collect();
    let committed = crate::offsets::committed(kafka, wanted.into_iter().collect()).await;
    for (p, reach) in expired.into_iter().zip(reaches) {
        let unit = day_string(p.day);
        let action =
            |rows, outcome| Action { tier: "replay_log", unit: unit.clone(), action: "drop_partition", rows: Some(rows), bytes: None, outcome };
        let ahead = match &committed {
            Err(why) => Some(why.clone()),
            Ok(committed) => reach.iter().find_map(|(topic, partition, last)| {
                let next = committed.get(&(topic.clone(), *partition)).copied().flatten();
                match next {
                    Some(next) if (*last as i64) < next => None,
                    Some(next) => Some(format!("{topic}/{partition}: an entry reaches offset {last}, group {} committed {next}", kafka.group_id)),
                    None => {
                        Some(format!("{topic}/{partition}: an entry reaches offset {last}, group {} has committed nothing there", kafka.group_id))
                    }
                }
            }),
        };
        if let Some(why) = ahead {
            actions.push(action(p.rows, Outcome::Refused(why)));
            continue;
        }
        let entry = AuditEntry {
            tier: "replay_log",
            unit: unit.clone(),
            action: "drop_partition",
            rows: Some(p.rows),
            bytes: Some(p.bytes),
            policy: policies.hot_days.to_string(),
            dry_run,
            actor: "retention",
            detail: Some(format!("{}.{}", stores.hot.database, inferlog_store::model::tables::replay_log_table(&stores.hot.table))),
        };
        audit_then(stores, &entry, stores.hot.drop_replay_log_day(p.day)).await?;
        actions.push(action(p.rows, if dry_run { Outcome::WouldDelete } else { Outcome::Deleted }));
    }
    Ok(actions)
}

/// Deletes the replay ledger's stored entries of messages the DLQ topic no
/// longer holds, audited first (unit: the cut-off).
async fn prune_ledger(stores: &Stores, inventory: &Inventory, policies: &RetentionConfig, dry_run: bool) -> Result<Option<Action>, RetentionError> {
    let Some(cutoff) = inventory.dlq.ledger_cutoff() else { return Ok(None) };
    match inventory.ledger_oldest {
        Some(oldest) if oldest < cutoff => {}
        _ => return Ok(None),
    }
    let catalog = &stores.catalog;
    let rows = catalog.replay_stored_before(cutoff).await.map_err(RetentionError::tier("aggregates"))?;
    let unit = inferlog_schema::timestamp::format_rfc3339_ms(cutoff);
    let entry = AuditEntry {
        tier: "dlq_ledger",
        unit: unit.clone(),
        action: "delete_entries",
        rows: Some(rows),
        bytes: None,
        policy: policies.hot_days.to_string(),
        dry_run,
        actor: "retention",
        detail: Some(format!(
            "stored replay entries written before {unit}: {} h before the oldest message of DLQ topic {}",
            crate::dlq::LEDGER_MARGIN_MS / 3_600_000,
            inventory.dlq.topic
        )),
    };
    let rows = audit_then(stores, &entry, catalog.replay_prune(cutoff)).await?.unwrap_or(rows);
    let outcome = if dry_run { Outcome::WouldDelete } else { Outcome::Deleted };
    Ok(Some(Action { tier: "dlq_ledger", unit, action: "delete_entries", rows: Some(rows), bytes: None, outcome }))
}

async fn delete_aggregates(stores: &Stores, day: Day, policies: &RetentionConfig, dry_run: bool) -> Result<u64, StoreError> {
    let pg = StoreError::postgres;
    let mut tx = stores.catalog.pool().begin().await.map_err(pg("begin"))?;
    let count_rows = AGGREGATE_TABLES.map(|table| format!("(SELECT count(*) FROM {table} WHERE day = $1)")).join(" + ");
    let count: i64 =
        sqlx::query_scalar(&format!("SELECT {count_rows}")).bind(date_of(day)).fetch_one(&mut *tx).await.map_err(pg("count aggregates"))?;
    if !dry_run {
        for table in AGGREGATE_TABLES {
            sqlx::query(&format!("DELETE FROM {table} WHERE day = $1"))
                .bind(date_of(day))
                .execute(&mut *tx)
                .await
                .map_err(pg("delete aggregates"))?;
        }
    }
    if count > 0 {
        let entry = AuditEntry {
            tier: "aggregates",
            unit: day_string(day),
            action: "delete_rows",
            rows: Some(count as u64),
            bytes: None,
            policy: policies.aggregate_days.to_string(),
            dry_run,
            actor: "retention",
            detail: None,
        };
        inferlog_store::catalog::insert_audit(&mut *tx, &entry).await?;
    }
    tx.commit().await.map_err(pg("commit"))?;
    Ok(count as u64)
}

async fn delete_object(
    stores: &Stores,
    key: &str,
    bytes: u64,
    inventory: &Inventory,
    policies: &RetentionConfig,
    dry_run: bool,
) -> Result<(), RetentionError> {
    let listed = inventory.manifest.iter().any(|m| m.object_key == key);
    let detail = (!listed).then(|| "no manifest row".to_owned());
    if !dry_run {
        stores.cold.delete(key).await.map_err(RetentionError::tier("cold"))?;
        pause_point("cold").await;
    }
    let pg = StoreError::postgres;
    let write = async {
        let mut tx = stores.catalog.pool().begin().await.map_err(pg("begin"))?;
        if !dry_run {
            sqlx::query("DELETE FROM cold_manifest WHERE object_key = $1").bind(key).execute(&mut *tx).await.map_err(pg("delete manifest row"))?;
        }
        let entry = AuditEntry {
            tier: "cold",
            unit: key.to_owned(),
            action: "delete_object",
            rows: None,
            bytes: Some(bytes),
            policy: policies.cold_days.to_string(),
            dry_run,
            actor: "retention",
            detail,
        };
        inferlog_store::catalog::insert_audit(&mut *tx, &entry).await?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok::<(), StoreError>(())
    };
    write.await.map_err(RetentionError::tier("aggregates"))
}
