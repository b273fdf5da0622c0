//! A closed day archived in units by any number of compactors. In: a day
//! the planner (the compactor holding the day's advisory lock) found too
//! large for one unit, with its fingerprint and read mode. Out: every unit's
//! objects written, read back and verified against ClickHouse's fingerprint
//! of the unit's rows, recorded per unit, then moved into the day's
//! manifest with the day's `verified` state in one transaction. Each unit's
//! fold (the aggregates' groups, hours, errors and waste of its rows) is
//! counted on the unit's one read and recorded with it; the day's fold is
//! their merge, so no compactor reads the whole day for the aggregates.
//!
//! On a cluster the day is planned per shard: each unit holds one shard's
//! rows and is read from that shard's local table on a replica whose
//! fingerprint of the unit agreed with the shard's read quorum, so a
//! replica that is down (or behind) is never read, and the shards' units
//! are read from their own servers in parallel.
//!
//! Units come from the catalog ([`inferlog_store::catalog::UnitClaim`]):
//! the planner and every compactor that finds the day's lock taken claim
//! pending units until none is left; a compactor that dies mid-unit frees
//! it for the others. The same unit's rows make the same object keys, so a
//! unit written again replaces a dead worker's objects; objects of an
//! earlier plan are deleted once the day is verified (`remove_superseded`).

use std::time::{Duration, Instant};

use inferlog_store::catalog::{Catalog, ManifestEntry};
use inferlog_store::cold::ColdStore;
use inferlog_store::hot::{DayFingerprint, HotTier, ReadMode};
use inferlog_store::model::fold::{DayFold, Folded};
use inferlog_store::model::unit::Unit;
use inferlog_store::Day;

use crate::archive::Archiver;
use crate::error::CompactorError;
use crate::metrics::{self, Metrics};
use crate::verify::{verify_day, Expected};
use crate::PAUSE_ENV;

/// What the units of a day need, and who this worker is.
#[derive(Debug, Clone)]
pub struct UnitWorker {
    pub hot: HotTier,
    pub cold: ColdStore,
    pub catalog: Catalog,
    pub archiver: Archiver,
    pub metrics: Metrics,
    /// `[compactor] unit_max_rows`.
    pub max_rows: u64,
    /// `[compactor] unit_wait`.
    pub wait: Duration,
    /// This process, as the catalog records who verified a unit: host and pid.
    pub name: String,
}

impl UnitWorker {
    /// The name of this process: the host's name and the process id.
    pub fn process_name() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "compactor".into());
        format!("{host}:{}", std::process::id())
    }

    /// Whether a day of `rows` rows is archived in units.
    pub fn splits(&self, rows: u64) -> bool {
        self.max_rows > 0 && rows > self.max_rows
    }

    /// As the planner: plans `day` in units (once), works units
    /// until none is left to claim, waits (up to `wait`) for those others
    /// hold, taking any a dead worker freed, and records the day verified
    /// with every unit's objects. Returns the day's manifest entries and
    /// its fold: the units' folds merged, with each line's repeated
    /// prompts counted by ClickHouse over the day (a prompt's requests may
    /// lie in several units).
    /// A `sampled` day (its rule recorded first) is cut at whole hours.
    pub async fn archive_day(
        &self,
        day: Day,
        fp: &DayFingerprint,
        mode: ReadMode,
        sampled: bool,
    ) -> Result<(Vec<ManifestEntry>, Folded), CompactorError> {
        let name = inferlog_store::day_string(day);
        let mut series = self.hot.day_series(day, mode, self.max_rows).await?;
        if sampled {
            series.iter_mut().flat_map(|s| s.series.iter_mut()).for_each(|s| s.align_cuts(3_600));
        }
        let planned = self.catalog.plan_units(day, fp, mode, sampled, &Unit::plan_shards(&series, self.max_rows)).await?;
        tracing::info!(day = %name, units = planned, rows = fp.rows, "day planned in units");
        let deadline = Instant::now() + self.wait;
        let mut pause = Duration::from_millis(100);
        loop {
            self.work(day).await?;
            let progress = self.catalog.unit_progress(day).await?;
            if progress.done() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(CompactorError::UnitsHeld { day: name, verified: progress.verified, units: progress.units });
            }
            // Held by other compactors: their end (done, or dead and freed) is
            // seen on the next look.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
        let (entries, mut fold) = self.catalog.record_units_verified(day, fp).await?;
        let counting = Instant::now();
        let repeats = self.hot.day_repeats(day, mode).await?;
        tracing::info!(day = %name, lines = repeats.len(), elapsed_ms = counting.elapsed().as_millis() as u64, "repeated prompts counted over the day");
        if let Some(waste) = fold.waste.as_mut() {
            waste.set_repeats(&repeats);
        }
        Ok((entries, fold))
    }

    /// Claims and archives pending units of `day` until none is left to
    /// claim; returns how many this worker verified.
    pub async fn work(&self, day: Day) -> Result<u32, CompactorError> {
        let mut done = 0;
        while let Some(claim) = self.catalog.claim_unit(day).await? {
            let (unit, mode) = (claim.unit.clone(), claim.mode);
            let name = inferlog_store::day_string(day);
            let started = Instant::now();
            let rule = match claim.sampled {
                true => Some(self.catalog.sampling_rule(day).await?.ok_or_else(|| CompactorError::Archive {
                    day: name.clone(),
                    message: "planned sampled, but no sampling rule is recorded for the day".into(),
                })?),
                false => None,
            };
            let (fp, source) = self.hot.confirm_unit(day, mode, &unit).await?;
            let replica = source.replica.clone().unwrap_or_default();
            let fold = DayFold::aggregates();
            let (written, fold, sampled) = self.archiver.archive_unit((day, mode), &unit, source, fold, rule.as_ref()).await?;
            for o in &written {
                metrics::object_written(&self.metrics, &o.key, o.rows, o.bytes);
            }
            inferlog_store::test_hooks::pause_point(PAUSE_ENV, "unit-written").await;
            // Reading the objects back and asking ClickHouse for the unit's
            // fingerprint now are independent: both at once.
            let expected = match &sampled {
                Some(sampled) => {
                    for (line, reason, rows, represented) in sampled.summary.entries() {
                        metrics::sample_kept(&self.metrics, &name, line, reason.as_str(), rows, represented);
                    }
                    Expected::sampled(&sampled.kept, fp.rows)
                }
                None => Expected::all(&fp),
            };
            let (now, verified) = tokio::join!(self.hot.unit_fingerprint(day, mode, &unit), verify_day(&self.cold, day, &written, &expected));
            let now = now?;
            if now != fp {
                let message = format!("unit {}: {} became {}", unit.name(), fp.encode(), now.encode());
                return Err(CompactorError::RowsChanged { day: name, step: "unit", message });
            }
            // On an error the claim ends: the unit is pending again.
            let entries = verified.inspect_err(|e| {
                if e.class() == inferlog_schema::ErrorClass::Reject {
                    metrics::verification_failed(&self.metrics, e);
                }
            })?;
            claim.verified(&self.name, fp.rows, &entries, &fold.finish().record()).await?;
            metrics::stage_finished(&self.metrics, &name, "unit", fp.rows, started.elapsed());
            tracing::info!(day = %name, unit = %unit.name(), %replica, rows = fp.rows, objects = entries.len(), "unit verified");
            done += 1;
        }
        Ok(done)
    }
}
