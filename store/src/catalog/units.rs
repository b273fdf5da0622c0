//! The catalog's record of a day archived in units, and the hand-out of
//! its units to any number of compactors. In: the planner's plan (a day,
//! its fingerprint, how many units) and the workers' claims and results.
//! Out: a pending unit for each worker that asks (each unit to one worker at
//! a time), and, once every unit is verified, the objects of them all and
//! their folds merged.
//!
//! The hand-out is Postgres's own row locks: a claim is a transaction that
//! took the unit's row with `FOR UPDATE SKIP LOCKED` and stays open while
//! the unit is archived and verified; its commit records the unit verified
//! with its objects. A worker that dies (or drops the claim) ends its
//! transaction with its connection, so the unit is pending and free again
//! for the next worker: no lease, no timeout of ours.

use sqlx::{Postgres, Row, Transaction};

use super::{date_of, Catalog, ManifestEntry};
use crate::error::StoreError;
use crate::hot::{DayFingerprint, ReadMode};
use crate::model::fold::{FoldMerge, Folded};
use crate::model::unit::Unit;
use crate::Day;

/// A unit claimed by this worker: its row stays locked until
/// [`UnitClaim::verified`] commits it, or the claim is dropped (the unit
/// is pending again).
#[derive(Debug)]
pub struct UnitClaim {
    tx: Transaction<'static, Postgres>,
    pub day: Day,
    pub unit: Unit,
    /// The day's fingerprint the plan is for.
    pub fingerprint: String,
    pub mode: ReadMode,
    /// The day is archived with its recorded sampling rule.
    pub sampled: bool,
}

/// Where a day's units stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnitProgress {
    pub units: u32,
    pub verified: u32,
}

impl UnitProgress {
    pub fn done(self) -> bool {
        self.units > 0 && self.verified == self.units
    }
}

fn mode_name(mode: ReadMode) -> &'static str {
    match mode {
        ReadMode::OnePart => "one_part",
        ReadMode::Final => "final",
    }
}

impl Catalog {
    /// Plans `day` (of fingerprint `fp`, read as `mode`, `sampled` or
    /// not) in `units`, once: a plan for the same fingerprint and sampling
    /// is kept as it is (with its units and those already verified); a
    /// plan for other rows or the other sampling is replaced. Returns the
    /// number of units in effect.
    pub async fn plan_units(&self, day: Day, fp: &DayFingerprint, mode: ReadMode, sampled: bool, units: &[Unit]) -> Result<u32, StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::postgres("begin"))?;
        // A unit of an old plan still being worked keeps its row locked:
        // this waits for that worker, whose objects the new plan replaces.
        sqlx::query("DELETE FROM compactor_units WHERE day = $1 AND (fingerprint <> $2 OR sampled <> $3)")
            .bind(date_of(day))
            .bind(fp.encode())
            .bind(sampled)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::postgres("replace a day's units"))?;
        let existing: Option<i32> = sqlx::query_scalar("SELECT units FROM compactor_units WHERE day = $1 LIMIT 1")
            .bind(date_of(day))
            .fetch_optional(&mut *tx)
            .await
            .map_err(StoreError::postgres("read a day's plan"))?;
        if existing.is_none() {
            for u in units {
                sqlx::query(
                    "INSERT INTO compactor_units (day, unit, units, fingerprint, read_mode, shard, condition, sampled) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(date_of(day))
                .bind(u.index as i32)
                .bind(u.of as i32)
                .bind(fp.encode())
                .bind(mode_name(mode))
                .bind(u.shard.map(|s| s as i32))
                .bind(&u.condition)
                .bind(sampled)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::postgres("plan a day's units"))?;
            }
        }
        tx.commit().await.map_err(StoreError::postgres("commit a day's plan"))?;
        Ok(existing.map_or(units.len() as u32, |n| n as u32))
    }

    /// A pending unit of `day` no other worker holds, claimed (see
    /// [`UnitClaim`]); none when every unit is verified or held.
    pub async fn claim_unit(&self, day: Day) -> Result<Option<UnitClaim>, StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::postgres("begin"))?;
        let row = sqlx::query(
            "SELECT unit, units, fingerprint, read_mode, shard, condition, sampled FROM compactor_units WHERE day = $1 AND state = 'pending' \
             ORDER BY unit LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .bind(date_of(day))
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::postgres("claim a unit"))?;
        let Some(row) = row else { return Ok(None) };
        let decode = |e| StoreError::postgres("decode a unit")(e);
        let index: i32 = row.try_get("unit").map_err(decode)?;
        let of: i32 = row.try_get("units").map_err(decode)?;
        let mode = match row.try_get::<String, _>("read_mode").map_err(decode)?.as_str() {
            "one_part" => ReadMode::OnePart,
            _ => ReadMode::Final,
        };
        Ok(Some(UnitClaim {
            day,
            unit: Unit {
                index: index as u32,
                of: of as u32,
                shard: row.try_get::<Option<i32>, _>("shard").map_err(decode)?.map(|s| s as u32),
                condition: row.try_get("condition").map_err(decode)?,
            },
            fingerprint: row.try_get("fingerprint").map_err(decode)?,
            mode,
            sampled: row.try_get("sampled").map_err(decode)?,
            tx,
        }))
    }

    /// How many units `day` is planned in and how many are verified.
    pub async fn unit_progress(&self, day: Day) -> Result<UnitProgress, StoreError> {
        let row = sqlx::query("SELECT count(*) AS units, count(*) FILTER (WHERE state = 'verified') AS verified FROM compactor_units WHERE day = $1")
            .bind(date_of(day))
            .fetch_one(&self.pool)
            .await
            .map_err(StoreError::postgres("read a day's units"))?;
        let decode = |e| StoreError::postgres("decode a day's units")(e);
        Ok(UnitProgress {
            units: row.try_get::<i64, _>("units").map_err(decode)? as u32,
            verified: row.try_get::<i64, _>("verified").map_err(decode)? as u32,
        })
    }

    /// Once every unit of `day`'s plan for `fp` is verified: replaces the
    /// day's manifest with the units' objects, marks the day verified and
    /// forgets the plan, in one transaction. Returns the objects and the
    /// units' folds merged (the day's, but for its waste's repeats: see
    /// [`FoldMerge`]); an error if the plan is not complete (or is for
    /// other rows), or a unit's fold is missing or does not decode (the
    /// plan is then dropped, planned again on the next pass).
    pub async fn record_units_verified(&self, day: Day, fp: &DayFingerprint) -> Result<(Vec<ManifestEntry>, Folded), StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::postgres("begin"))?;
        // The plan's rows, locked: no claim of them is open (each is verified).
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM compactor_units WHERE day = $1 AND (state <> 'verified' OR fingerprint <> $2) FOR UPDATE) AS open",
        )
        .bind(date_of(day))
        .bind(fp.encode())
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::postgres("check a day's units"))?;
        if open > 0 {
            return Err(StoreError::Unconfirmed(format!("{open} units of {} are not verified for {}", crate::day_string(day), fp.encode())));
        }
        // The units must hold the day: a plan that missed rows is dropped
        // (planned again on the next pass), never recorded.
        let held: i64 = sqlx::query_scalar("SELECT coalesce(sum(rows), 0)::bigint FROM compactor_units WHERE day = $1")
            .bind(date_of(day))
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::postgres("check a day's units"))?;
        if held as u64 != fp.rows {
            forget_plan(&mut *tx, day).await?;
            tx.commit().await.map_err(StoreError::postgres("commit"))?;
            return Err(StoreError::Unconfirmed(format!(
                "the units of {} hold {held} rows, the day {}: planned again on the next pass",
                crate::day_string(day),
                fp.rows
            )));
        }
        let folds: Vec<(i32, Option<Vec<u8>>)> = sqlx::query_as("SELECT unit, fold FROM compactor_units WHERE day = $1 ORDER BY unit")
            .bind(date_of(day))
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::postgres("read a day's unit folds"))?;
        let mut merge = FoldMerge::default();
        for (unit, fold) in folds {
            match fold.as_deref().map(Folded::from_record) {
                Some(Ok(fold)) => merge.add(fold),
                bad => {
                    forget_plan(&mut *tx, day).await?;
                    tx.commit().await.map_err(StoreError::postgres("commit"))?;
                    let why = match bad {
                        Some(Err(e)) => e,
                        _ => "none recorded".into(),
                    };
                    return Err(StoreError::Unconfirmed(format!(
                        "the fold of unit {unit} of {} ({why}): planned again on the next pass",
                        crate::day_string(day)
                    )));
                }
            }
        }
        let entries: Vec<ManifestEntry> = sqlx::query(
            "SELECT object_key, day, rows, represented_rows, bytes, sha256, schema_version FROM compactor_unit_objects \
             WHERE day = $1 ORDER BY object_key",
        )
        .bind(date_of(day))
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::postgres("read a day's unit objects"))?
        .iter()
        .map(super::manifest_entry)
        .collect::<Result<_, _>>()?;
        super::replace_manifest(&mut tx, day, fp, &entries).await?;
        forget_plan(&mut *tx, day).await?;
        tx.commit().await.map_err(StoreError::postgres("commit manifest"))?;
        Ok((entries, merge.finish()))
    }

    /// Forgets `day`'s plan (its units and their objects' records, not
    /// the objects): once the day's manifest holds them, or when the day
    /// is archived whole again.
    pub async fn forget_units(&self, day: Day) -> Result<(), StoreError> {
        forget_plan(&self.pool, day).await
    }
}

impl UnitClaim {
    /// Records the unit verified with its objects (their rows replacing
    /// what an earlier claim of it recorded) and the fold of its rows
    /// ([`Folded::record`]), by `worker`, and frees it.
    pub async fn verified(mut self, worker: &str, rows: u64, objects: &[ManifestEntry], fold: &[u8]) -> Result<(), StoreError> {
        let (day, unit) = (date_of(self.day), self.unit.index as i32);
        sqlx::query("DELETE FROM compactor_unit_objects WHERE day = $1 AND unit = $2")
            .bind(day)
            .bind(unit)
            .execute(&mut *self.tx)
            .await
            .map_err(StoreError::postgres("record a unit's objects"))?;
        for e in objects {
            sqlx::query(
                "INSERT INTO compactor_unit_objects (day, unit, object_key, rows, represented_rows, bytes, sha256, schema_version) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(day)
            .bind(unit)
            .bind(&e.object_key)
            .bind(e.rows as i64)
            .bind(e.represented_rows as i64)
            .bind(e.bytes as i64)
            .bind(&e.sha256)
            .bind(e.schema_version as i32)
            .execute(&mut *self.tx)
            .await
            .map_err(StoreError::postgres("record a unit's objects"))?;
        }
        sqlx::query(
            "UPDATE compactor_units SET state = 'verified', worker = $3, rows = $4, fold = $5, verified_at = now() WHERE day = $1 AND unit = $2",
        )
        .bind(day)
        .bind(unit)
        .bind(worker)
        .bind(rows as i64)
        .bind(fold)
        .execute(&mut *self.tx)
        .await
        .map_err(StoreError::postgres("record a unit verified"))?;
        self.tx.commit().await.map_err(StoreError::postgres("commit a unit"))
    }
}

/// Deletes `day`'s plan: its units and, by cascade, their objects' records.
async fn forget_plan<'e, E: sqlx::Executor<'e, Database = Postgres>>(executor: E, day: Day) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM compactor_units WHERE day = $1")
        .bind(date_of(day))
        .execute(executor)
        .await
        .map_err(StoreError::postgres("forget a day's units"))?;
    Ok(())
}
