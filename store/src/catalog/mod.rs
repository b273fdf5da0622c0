//! The Postgres catalog: the system of record for what each tier holds.
//! In: state changes from the compactor and deletions from retention. Out:
//! the day states, the cold manifest, the audit table, and advisory locks
//! that let several replicas share the work. Migrations are embedded and
//! applied at start-up.

use std::str::FromStr;

use chrono::NaiveDate;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool, Postgres, Row};

use crate::config::PostgresConfig;
use crate::error::StoreError;
use crate::hot::DayFingerprint;
use crate::Day;

mod units;
pub use units::{UnitClaim, UnitProgress};

/// Where the compactor is with one day. The order is the order of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DayState {
    /// Objects are being written.
    Archiving,
    /// Every object is written, not yet read back.
    Archived,
    /// Objects read back and matched; the manifest rows are recorded.
    Verified,
    /// Aggregates are in Postgres: the day is complete while it stays hot.
    Aggregated,
    /// The hot partition is being dropped.
    Releasing,
    /// The hot partition is gone; the drop is in the audit table.
    Released,
}

impl DayState {
    pub const ALL: [DayState; 6] =
        [DayState::Archiving, DayState::Archived, DayState::Verified, DayState::Aggregated, DayState::Releasing, DayState::Released];

    pub const fn as_str(self) -> &'static str {
        match self {
            DayState::Archiving => "archiving",
            DayState::Archived => "archived",
            DayState::Verified => "verified",
            DayState::Aggregated => "aggregated",
            DayState::Releasing => "releasing",
            DayState::Released => "released",
        }
    }
}

impl FromStr for DayState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<DayState, StoreError> {
        DayState::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| StoreError::Config(format!("unknown day state {s:?}")))
    }
}

/// One row of `compactor_days`.
#[derive(Debug, Clone, PartialEq)]
pub struct DayRecord {
    pub day: Day,
    pub state: DayState,
    pub hot_rows: u64,
    pub fingerprint: String,
    pub objects: u32,
    pub bytes: u64,
    pub last_error: Option<String>,
}

/// One verified object of the cold tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    pub object_key: String,
    pub day: Day,
    pub rows: u64,
    /// The day's rows the object stands for: the sum of its rows'
    /// `sample_weight`; `rows` in an object of a day archived without sampling.
    pub represented_rows: u64,
    pub bytes: u64,
    pub sha256: String,
    pub schema_version: u32,
}

/// One deletion (or, with `dry_run`, one deletion that would happen).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    pub tier: &'static str,
    pub unit: String,
    pub action: &'static str,
    pub rows: Option<u64>,
    pub bytes: Option<u64>,
    pub policy: String,
    pub dry_run: bool,
    pub actor: &'static str,
    pub detail: Option<String>,
}

/// The first key of inferlog's advisory locks: a hash of the catalog's
/// schema, so two deployments sharing a database never block each other;
/// the second key is the day.
fn lock_space(schema: &str) -> i32 {
    stable_hash(format!("inferlog.{schema}").as_bytes()) as i32
}

/// FNV-1a: stable across builds and platforms (unlike std's hasher).
pub(crate) fn stable_hash(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

pub fn date_of(day: Day) -> NaiveDate {
    NaiveDate::from_num_days_from_ce_opt(day + 719_163).unwrap_or_default()
}

pub fn day_of(date: NaiveDate) -> Day {
    date.num_days_from_ce() - 719_163
}

use chrono::Datelike;

/// Held per-day advisory locks (one day, or several). They live on their
/// own connection; `unlock` releases them, and if the process dies
/// Postgres releases them with the connection.
///
/// Two modes: the exclusive lock of whoever changes a day as a whole (the
/// compactor archiving and releasing it, retention, erasure; each only
/// tries, and skips a busy day), and the shared lock of whoever adds rows
/// to a day that may be released meanwhile (a replay; the ingest daemon
/// for a day near or past the hot policy). Rows added under the shared
/// lock land either before a release looks at the day (its fingerprint
/// check sees them) or after its drop (late rows, archived as a
/// supplement): never between the check and the drop.
#[derive(Debug)]
pub struct DayLock {
    conn: Option<sqlx::pool::PoolConnection<Postgres>>,
    space: i32,
    days: Vec<Day>,
    shared: bool,
}

impl DayLock {
    /// Exclusive locks held on `conn` under `space`, with these second keys.
    pub(crate) fn held(conn: sqlx::pool::PoolConnection<Postgres>, space: i32, keys: Vec<i32>) -> DayLock {
        DayLock { conn: Some(conn), space, days: keys, shared: false }
    }

    pub async fn unlock(mut self) {
        let sql = if self.shared { "SELECT pg_advisory_unlock_shared($1, $2)" } else { "SELECT pg_advisory_unlock($1, $2)" };
        if let Some(mut conn) = self.conn.take() {
            for &day in &self.days {
                let unlocked = sqlx::query(sql).bind(self.space).bind(day).execute(&mut *conn).await;
                if unlocked.is_err() {
                    // The lock may still be held by this session: never reuse it.
                    conn.close_on_drop();
                    return;
                }
            }
        }
    }
}

impl Drop for DayLock {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            // Dropped without unlock (an error path): closing the session releases the lock.
            conn.close_on_drop();
        }
    }
}

/// The catalog database.
#[derive(Debug, Clone)]
pub struct Catalog {
    pool: PgPool,
    lock_space: i32,
}

impl Catalog {
    /// Connects, creates the schema if missing and applies the migrations.
    pub async fn connect(config: &PostgresConfig) -> Result<Catalog, StoreError> {
        let mut options =
            PgConnectOptions::from_str(&config.url).map_err(|e| StoreError::Config(format!("postgres.url: {e}")))?.application_name("inferlog");
        if let Some(password) = config.password()? {
            options = options.password(&password);
        }
        let schema = config.schema.clone();
        let search_path = format!("SET search_path TO \"{schema}\"");
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.connect_timeout)
            .after_connect(move |conn, _| {
                let search_path = search_path.clone();
                Box::pin(async move {
                    conn.execute(search_path.as_str()).await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(StoreError::postgres("connect"))?;
        // Two replicas starting together may race on CREATE SCHEMA; the loser's duplicate error is harmless.
        if let Err(e) = pool.execute(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"").as_str()).await {
            let duplicate = e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "23505" || c == "42P06");
            if !duplicate {
                return Err(StoreError::postgres("create schema")(e));
            }
        }
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Catalog { pool, lock_space: lock_space(&config.schema) })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The first key of this deployment's advisory locks.
    pub(crate) fn lock_space(&self) -> i32 {
        self.lock_space
    }

    /// Takes the advisory lock of `day` unless another replica holds it.
    pub async fn try_lock_day(&self, day: Day) -> Result<Option<DayLock>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(StoreError::postgres("acquire"))?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(self.lock_space)
            .bind(day)
            .fetch_one(&mut *conn)
            .await
            .map_err(StoreError::postgres("advisory lock"))?;
        Ok(locked.then_some(DayLock { conn: Some(conn), space: self.lock_space, days: vec![day], shared: false }))
    }

    /// Takes the shared lock of each of `days` on one connection, or none
    /// of them while a process holds one exclusively (a release in
    /// progress): see [`DayLock`]. With `wait`, waits for it instead
    /// (only the exclusive holders wait never, so waiting cannot deadlock).
    pub async fn lock_days_shared(&self, days: &[Day], wait: bool) -> Result<Option<DayLock>, StoreError> {
        let sql =
            if wait { "SELECT true FROM (SELECT pg_advisory_lock_shared($1, $2)) AS waited" } else { "SELECT pg_try_advisory_lock_shared($1, $2)" };
        self.lock_days(days, sql, true).await
    }

    /// Takes the advisory locks of every day of `days` on one connection,
    /// or none of them if another replica holds one.
    pub async fn try_lock_days(&self, days: &[Day]) -> Result<Option<DayLock>, StoreError> {
        self.lock_days(days, "SELECT pg_try_advisory_lock($1, $2)", false).await
    }

    /// Runs `sql` (one lock, answering whether it was taken) for each of
    /// `days` on one connection; the first refusal releases what was taken.
    async fn lock_days(&self, days: &[Day], sql: &'static str, shared: bool) -> Result<Option<DayLock>, StoreError> {
        let conn = self.pool.acquire().await.map_err(StoreError::postgres("acquire"))?;
        let mut lock = DayLock { conn: Some(conn), space: self.lock_space, days: Vec::with_capacity(days.len()), shared };
        for &day in days {
            let Some(conn) = lock.conn.as_mut() else { break };
            let locked: bool = sqlx::query_scalar(sql)
                .bind(self.lock_space)
                .bind(day)
                .fetch_one(&mut **conn)
                .await
                .map_err(StoreError::postgres("advisory lock"))?;
            if !locked {
                lock.unlock().await;
                return Ok(None);
            }
            lock.days.push(day);
        }
        Ok(Some(lock))
    }

    pub async fn day(&self, day: Day) -> Result<Option<DayRecord>, StoreError> {
        let row = sqlx::query("SELECT day, state, hot_rows, fingerprint, objects, bytes, last_error FROM compactor_days WHERE day = $1")
            .bind(date_of(day))
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::postgres("read day state"))?;
        row.map(|r| day_record(&r)).transpose()
    }

    /// Every day the compactor has a record of, oldest first.
    pub async fn days(&self) -> Result<Vec<DayRecord>, StoreError> {
        let rows = sqlx::query("SELECT day, state, hot_rows, fingerprint, objects, bytes, last_error FROM compactor_days ORDER BY day")
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::postgres("read day states"))?;
        rows.iter().map(day_record).collect()
    }

    /// Records that `day` reached `state`, made from rows with `fingerprint`.
    pub async fn set_state(&self, day: Day, state: DayState, fingerprint: &DayFingerprint, objects: u32, bytes: u64) -> Result<(), StoreError> {
        set_state(&self.pool, day, state, fingerprint, objects, bytes).await
    }

    /// Moves the day to `state`, keeping what its record says about its rows.
    pub async fn mark(&self, day: Day, state: DayState) -> Result<(), StoreError> {
        sqlx::query("UPDATE compactor_days SET state = $2, updated_at = now() WHERE day = $1")
            .bind(date_of(day))
            .bind(state.as_str())
            .execute(&self.pool)
            .await
            .map_err(StoreError::postgres("record day state"))?;
        Ok(())
    }

    /// Notes a failure of the day's work without changing its state.
    pub async fn set_error(&self, day: Day, error: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE compactor_days SET last_error = $2, updated_at = now() WHERE day = $1")
            .bind(date_of(day))
            .bind(error)
            .execute(&self.pool)
            .await
            .map_err(StoreError::postgres("record day error"))?;
        Ok(())
    }

    /// Replaces the day's manifest with `entries` and marks it verified, atomically.
    pub async fn record_verified(&self, day: Day, fingerprint: &DayFingerprint, entries: &[ManifestEntry]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::postgres("begin"))?;
        replace_manifest(&mut tx, day, fingerprint, entries).await?;
        tx.commit().await.map_err(StoreError::postgres("commit manifest"))
    }

    /// Adds supplement objects (late rows of a released day) to the
    /// manifest, with the audit row of the drop that follows, atomically.
    /// Idempotent: the same objects written again replace their rows, and
    /// the audit row is written once (a run killed before the drop and
    /// finished by the next records one drop).
    pub async fn add_supplement(&self, entries: &[ManifestEntry], audit: &AuditEntry) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::postgres("begin"))?;
        for e in entries {
            upsert_manifest_row(&mut *tx, e).await?;
        }
        insert_audit_once(&mut tx, audit).await?;
        tx.commit().await.map_err(StoreError::postgres("commit supplement"))
    }

    /// Writes `entry` unless the same deletion (tier, unit, action and
    /// detail) is already recorded: a step a killed run audited and a
    /// resumed run repeats is recorded once.
    pub async fn audit_once(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await.map_err(StoreError::postgres("connect"))?;
        insert_audit_once(&mut conn, entry).await
    }

    /// Replaces the manifest row of `old_key` with `new` (or removes it),
    /// with the audit row of the change, atomically (an object rewritten
    /// without an erased user's rows, or left with no rows).
    pub async fn replace_object(&self, old_key: &str, new: Option<&ManifestEntry>, audit: &AuditEntry) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::postgres("begin"))?;
        sqlx::query("DELETE FROM cold_manifest WHERE object_key = $1")
            .bind(old_key)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::postgres("replace manifest row"))?;
        if let Some(e) = new {
            upsert_manifest_row(&mut *tx, e).await?;
        }
        insert_audit(&mut *tx, audit).await?;
        tx.commit().await.map_err(StoreError::postgres("commit manifest row"))
    }

    /// The manifest rows of one day, or of every day.
    pub async fn manifest(&self, day: Option<Day>) -> Result<Vec<ManifestEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT object_key, day, rows, coalesce(represented_rows, rows) AS represented_rows, bytes, sha256, schema_version FROM cold_manifest \
             WHERE $1::date IS NULL OR day = $1 ORDER BY day, object_key",
        )
        .bind(day.map(date_of))
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::postgres("read manifest"))?;
        rows.iter().map(manifest_entry).collect()
    }

    /// Writes the audit row of a hot-partition drop and marks the day
    /// released, atomically (the drop itself already happened and is
    /// idempotent). The day keeps the fingerprint its archive was verified against.
    pub async fn record_release(&self, day: Day, audit: &AuditEntry) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::postgres("begin"))?;
        insert_audit(&mut *tx, audit).await?;
        sqlx::query("UPDATE compactor_days SET state = 'released', updated_at = now(), last_error = NULL WHERE day = $1")
            .bind(date_of(day))
            .execute(&mut *tx)
            .await
            .map_err(StoreError::postgres("record release"))?;
        tx.commit().await.map_err(StoreError::postgres("commit release"))
    }

    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        insert_audit(&self.pool, entry).await
    }
}

async fn insert_audit_once(conn: &mut sqlx::PgConnection, audit: &AuditEntry) -> Result<(), StoreError> {
    let recorded: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM retention_audit WHERE tier = $1 AND unit = $2 AND action = $3 AND detail = $4 AND NOT dry_run)",
    )
    .bind(audit.tier)
    .bind(&audit.unit)
    .bind(audit.action)
    .bind(&audit.detail)
    .fetch_one(&mut *conn)
    .await
    .map_err(StoreError::postgres("read audit table"))?;
    if !recorded {
        insert_audit(&mut *conn, audit).await?;
    }
    Ok(())
}

/// One manifest row, replacing the row of the same object if there is one.
/// In `tx`: the day's manifest replaced by `entries`, the day verified.
async fn replace_manifest(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    day: Day,
    fingerprint: &DayFingerprint,
    entries: &[ManifestEntry],
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM cold_manifest WHERE day = $1")
        .bind(date_of(day))
        .execute(&mut **tx)
        .await
        .map_err(StoreError::postgres("replace manifest"))?;
    for e in entries {
        upsert_manifest_row(&mut **tx, e).await?;
    }
    let bytes = entries.iter().map(|e| e.bytes).sum();
    set_state(&mut **tx, day, DayState::Verified, fingerprint, entries.len() as u32, bytes).await
}

async fn upsert_manifest_row<'e, E: Executor<'e, Database = Postgres>>(executor: E, e: &ManifestEntry) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO cold_manifest (object_key, day, rows, bytes, sha256, schema_version, represented_rows) VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (object_key) DO UPDATE SET day = $2, rows = $3, bytes = $4, sha256 = $5, schema_version = $6, represented_rows = $7",
    )
    .bind(&e.object_key)
    .bind(date_of(e.day))
    .bind(e.rows as i64)
    .bind(e.bytes as i64)
    .bind(&e.sha256)
    .bind(e.schema_version as i32)
    .bind(e.represented_rows as i64)
    .execute(executor)
    .await
    .map_err(StoreError::postgres("write manifest row"))?;
    Ok(())
}

/// A manifest row (`cold_manifest`'s columns, or a unit's objects' in
/// `compactor_unit_objects`, which has the same).
fn manifest_entry(r: &sqlx::postgres::PgRow) -> Result<ManifestEntry, StoreError> {
    let decode = |e| StoreError::postgres("decode manifest")(e);
    Ok(ManifestEntry {
        object_key: r.try_get("object_key").map_err(decode)?,
        day: day_of(r.try_get("day").map_err(decode)?),
        rows: r.try_get::<i64, _>("rows").map_err(decode)? as u64,
        represented_rows: r.try_get::<i64, _>("represented_rows").map_err(decode)? as u64,
        bytes: r.try_get::<i64, _>("bytes").map_err(decode)? as u64,
        sha256: r.try_get("sha256").map_err(decode)?,
        schema_version: r.try_get::<i32, _>("schema_version").map_err(decode)? as u32,
    })
}

fn day_record(r: &sqlx::postgres::PgRow) -> Result<DayRecord, StoreError> {
    let decode = StoreError::postgres;
    Ok(DayRecord {
        day: day_of(r.try_get("day").map_err(decode("decode day state"))?),
        state: r.try_get::<String, _>("state").map_err(decode("decode day state"))?.parse()?,
        hot_rows: r.try_get::<i64, _>("hot_rows").map_err(decode("decode day state"))? as u64,
        fingerprint: r.try_get("fingerprint").map_err(decode("decode day state"))?,
        objects: r.try_get::<i32, _>("objects").map_err(decode("decode day state"))? as u32,
        bytes: r.try_get::<i64, _>("bytes").map_err(decode("decode day state"))? as u64,
        last_error: r.try_get("last_error").map_err(decode("decode day state"))?,
    })
}

async fn set_state<'e, E: Executor<'e, Database = Postgres>>(
    executor: E,
    day: Day,
    state: DayState,
    fingerprint: &DayFingerprint,
    objects: u32,
    bytes: u64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO compactor_days (day, state, hot_rows, fingerprint, objects, bytes, updated_at, last_error) \
         VALUES ($1, $2, $3, $4, $5, $6, now(), NULL) \
         ON CONFLICT (day) DO UPDATE SET state = $2, hot_rows = $3, fingerprint = $4, objects = $5, bytes = $6, updated_at = now(), last_error = NULL",
    )
    .bind(date_of(day))
    .bind(state.as_str())
    .bind(fingerprint.rows as i64)
    .bind(fingerprint.encode())
    .bind(objects as i32)
    .bind(bytes as i64)
    .execute(executor)
    .await
    .map_err(StoreError::postgres("record day state"))?;
    Ok(())
}

pub async fn insert_audit<'e, E: Executor<'e, Database = Postgres>>(executor: E, e: &AuditEntry) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO retention_audit (tier, unit, action, rows, bytes, policy, dry_run, actor, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(e.tier)
    .bind(&e.unit)
    .bind(e.action)
    .bind(e.rows.map(|r| r as i64))
    .bind(e.bytes.map(|b| b as i64))
    .bind(&e.policy)
    .bind(e.dry_run)
    .bind(e.actor)
    .bind(&e.detail)
    .execute(executor)
    .await
    .map_err(StoreError::postgres("write audit row"))?;
    Ok(())
}

/// One row of `cost_audit`: a day whose aggregates left requests unpriced,
/// or whose cost a reprice rewrote.
#[derive(Debug, Clone, PartialEq)]
pub struct CostAuditEntry {
    pub day: Day,
    /// `unpriced` or `reprice`.
    pub action: &'static str,
    /// Unpriced requests (`unpriced`); aggregate rows rewritten (`reprice`).
    pub rows: u64,
    pub unpriced_requests: u64,
    pub cost_before: Option<f64>,
    pub cost_after: Option<f64>,
    /// The price table's digest.
    pub prices: String,
    pub actor: &'static str,
    pub detail: Option<String>,
}

/// Replaces the `daily_series` rows of `day` with the rollup of its
/// `daily_aggregates` rows ([`crate::model::aggregates::series_rollup`]):
/// run in the transaction that wrote or repriced the day's groups.
pub async fn roll_up_series(conn: &mut sqlx::PgConnection, day: Day) -> Result<(), StoreError> {
    const OPERATION: &str = "roll the groups up into series";
    sqlx::query("DELETE FROM daily_series WHERE day = $1").bind(date_of(day)).execute(&mut *conn).await.map_err(StoreError::postgres(OPERATION))?;
    sqlx::query(&crate::model::aggregates::series_rollup()).bind(date_of(day)).execute(&mut *conn).await.map_err(StoreError::postgres(OPERATION))?;
    Ok(())
}

pub async fn insert_cost_audit<'e, E: Executor<'e, Database = Postgres>>(executor: E, e: &CostAuditEntry) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO cost_audit (day, action, rows, unpriced_requests, cost_before, cost_after, prices, actor, detail) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(date_of(e.day))
    .bind(e.action)
    .bind(e.rows as i64)
    .bind(e.unpriced_requests as i64)
    .bind(e.cost_before)
    .bind(e.cost_after)
    .bind(&e.prices)
    .bind(e.actor)
    .bind(&e.detail)
    .execute(executor)
    .await
    .map_err(StoreError::postgres("write cost audit row"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_spaces_differ_per_schema_and_are_stable() {
        assert_eq!(lock_space("public"), lock_space("public"));
        assert_ne!(lock_space("public"), lock_space("other"));
    }

    #[test]
    fn day_numbers_map_to_dates() {
        assert_eq!(date_of(0), NaiveDate::from_ymd_opt(1970, 1, 1).expect("date"));
        let d = crate::parse_day("2026-11-29").expect("day");
        assert_eq!(date_of(d).to_string(), "2026-11-29");
        assert_eq!(day_of(date_of(d)), d);
        for s in DayState::ALL {
            assert_eq!(s.as_str().parse::<DayState>().expect("round trip"), s);
        }
    }
}
