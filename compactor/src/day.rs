//! One UTC day through its recorded states. In: a closed day and its
//! record in the catalog (if any). Out: the day archived, verified,
//! aggregated and, once past the hot retention, released, each step
//! recorded before the next begins, so a kill at any point resumes from
//! the last recorded state and converges to the same end state.
//!
//! ```text
//! (none) ─► archiving ─► archived ─► verified ─► aggregated ─► releasing ─► released
//!              ▲                                      │
//!              └──── rows changed (late events) ◄─────┘
//! ```

use std::time::Instant;

use inferlog_schema::config::ErrorDictionary;
use inferlog_schema::ErrorClass;
use inferlog_store::catalog::{AuditEntry, Catalog, DayRecord, DayState};
use inferlog_store::cold::ColdStore;
use inferlog_store::cost::PriceTable;
use inferlog_store::hot::{DayFingerprint, HotTier, ReadMode};
use inferlog_store::model::sample::Rule;
use inferlog_store::release::{release_day, Refusal, Release, ReleaseBy};
use inferlog_store::{Day, Policy, SamplingConfig};

use crate::aggregate;
use crate::archive::Archiver;
use crate::error::CompactorError;
use crate::format::WrittenObject;
use crate::metrics::{self, Metrics};
use crate::publish;
use crate::units::UnitWorker;
use crate::verify::{verify_day, Expected};
use inferlog_store::model::fold::{DayFold, Folded};

pub use crate::PAUSE_ENV;

/// What happened to a day in one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DayOutcome {
    /// Archived, verified and aggregated (now or before); still hot.
    Complete,
    /// Past the hot retention and released (now or before).
    Released,
    /// Another replica holds the day's lock.
    Busy,
    /// No hot rows and no record: nothing to do.
    Empty,
}

/// Everything one day's work needs.
#[derive(Debug, Clone)]
pub struct DayWork {
    pub hot: HotTier,
    pub cold: ColdStore,
    pub catalog: Catalog,
    pub archiver: Archiver,
    pub dictionary: ErrorDictionary,
    pub prices: PriceTable,
    pub hot_policy: Policy,
    pub metrics: Metrics,
    pub sampling: SamplingConfig,
    /// A large day's units, and this process as one of their workers.
    pub units: UnitWorker,
}

async fn pause_point(step: &str) {
    inferlog_store::test_hooks::pause_point(PAUSE_ENV, step).await;
}

/// Holds at `step` until the test's resume file exists (a test adds rows meanwhile).
async fn hold_point(step: &str) {
    inferlog_store::test_hooks::hold_point(PAUSE_ENV, step).await;
}

impl DayWork {
    /// Runs `day` as far as it can go today, under the day's advisory lock.
    /// `force` redoes archive and aggregates even when nothing changed.
    /// While another compactor holds the day, this one works the day's
    /// pending units, if it is archived in units, then tries the lock again
    /// (the holder may have died: its units are taken over and the day
    /// finished here).
    pub async fn run(&self, day: Day, today: Day, force: bool) -> Result<DayOutcome, CompactorError> {
        let lock = loop {
            if let Some(lock) = self.catalog.try_lock_day(day).await? {
                break lock;
            }
            if self.units.work(day).await? == 0 {
                tracing::info!(day = %inferlog_store::day_string(day), "another replica holds this day; skipping");
                return Ok(DayOutcome::Busy);
            }
        };
        let outcome = self.run_locked(day, today, force).await;
        if let Err(e) = &outcome {
            // Best effort: the error is also returned and logged by the pass.
            let _ = self.catalog.set_error(day, &e.to_string()).await;
        }
        lock.unlock().await;
        outcome
    }

    async fn record(&self, day: Day, state: DayState, fp: &DayFingerprint, objects: u32, bytes: u64) -> Result<(), CompactorError> {
        self.catalog.set_state(day, state, fp, objects, bytes).await?;
        metrics::day_state(&self.metrics, &inferlog_store::day_string(day), state, fp.rows);
        pause_point(state.as_str()).await;
        Ok(())
    }

    async fn run_locked(&self, day: Day, today: Day, force: bool) -> Result<DayOutcome, CompactorError> {
        let name = inferlog_store::day_string(day);
        let record = self.catalog.day(day).await?;
        let mode = if record.as_ref().is_some_and(|r| r.state == DayState::Released) {
            ReadMode::Final
        } else {
            let started = Instant::now();
            let mode = self.hot.settle_day(day).await?;
            metrics::stage_finished(&self.metrics, &name, "settle", 0, started.elapsed());
            mode
        };
        let fp = self.hot.fingerprint(day, mode).await?;
        let same = |r: &DayRecord| r.fingerprint == fp.encode();
        let mut state = match &record {
            None if fp.rows == 0 => return Ok(DayOutcome::Empty),
            None => None,
            Some(r) if r.state == DayState::Released => {
                if fp.rows > 0 {
                    return self.archive_late_rows(day, mode, &fp).await;
                }
                return Ok(DayOutcome::Released);
            }
            Some(r) if r.state == DayState::Releasing => {
                // Either the drop happened (no rows left) or it did not and the rows are the verified ones.
                if fp.rows == 0 || same(r) {
                    return self.release(day).await;
                }
                None
            }
            // The partition is gone but the day was archived: finish a
            // release if one is due; never archive an empty day over its archive.
            Some(r) if fp.rows == 0 && r.hot_rows > 0 && r.state >= DayState::Verified => {
                if self.hot_policy.expired(day, today) {
                    return self.release(day).await;
                }
                return Err(CompactorError::RowsChanged {
                    day: name,
                    step: "checked",
                    message: format!("its {} archived rows vanished from the hot tier", r.hot_rows),
                });
            }
            Some(r) if force || !same(r) => None,
            Some(r) => Some(r.state),
        };
        let record_objects = record.as_ref().map_or(0, |r| r.objects);

        // Archive (from scratch, or re-list what an earlier run wrote),
        // counting the aggregates' histograms, hours and errors on the way.
        let mut folded: Option<Folded> = None;
        let mut expected = Expected::all(&fp);
        let in_units = self.units.splits(fp.rows);
        if (state.is_none() || state == Some(DayState::Archiving)) && in_units {
            // A large day: archived and verified in units, by this compactor
            // and any other that helps (crate::units); its fold is theirs merged.
            self.record(day, DayState::Archiving, &fp, 0, 0).await?;
            let started = Instant::now();
            // Recorded (or forgotten) before the plan: every unit reads it.
            let sampled = self.sampling_rule(day).await?.is_some();
            let (entries, fold) = self.units.archive_day(day, &fp, mode, sampled).await?;
            let now = self.hot.fingerprint(day, mode).await?;
            if now != fp {
                return Err(CompactorError::RowsChanged { day: name, step: "archived", message: format!("{} became {}", fp.encode(), now.encode()) });
            }
            metrics::stage_finished(&self.metrics, &name, "archive", fp.rows, started.elapsed());
            metrics::day_verified(&self.metrics, fp.rows);
            metrics::day_state(&self.metrics, &name, DayState::Verified, fp.rows);
            tracing::info!(day = %name, objects = entries.len(), "day verified from its units");
            pause_point(DayState::Verified.as_str()).await;
            state = Some(DayState::Verified);
            folded = Some(fold);
        }
        let written: Vec<WrittenObject>;
        if state.is_none() || state == Some(DayState::Archiving) {
            self.catalog.forget_units(day).await?;
            self.record(day, DayState::Archiving, &fp, 0, 0).await?;
            let started = Instant::now();
            let rule = self.sampling_rule(day).await?;
            let (objects, fold, sampled) = self.archiver.archive_day(day, mode, DayFold::aggregates(), rule.as_ref()).await?;
            if let Some(sampled) = &sampled {
                expected = Expected::sampled(&sampled.kept, fp.rows);
                for (line, reason, rows, represented) in sampled.summary.entries() {
                    metrics::sample_kept(&self.metrics, &name, line, reason.as_str(), rows, represented);
                }
            }
            written = objects;
            folded = Some(fold.finish());
            metrics::stage_finished(&self.metrics, &name, "archive", fp.rows, started.elapsed());
            for o in &written {
                metrics::object_written(&self.metrics, &o.key, o.rows, o.bytes);
            }
            let bytes = written.iter().map(|o| o.bytes).sum();
            self.record(day, DayState::Archived, &fp, written.len() as u32, bytes).await?;
            state = Some(DayState::Archived);
        } else {
            written = Vec::new();
        }

        // Verify against ClickHouse as it is now.
        if state == Some(DayState::Archived) {
            let started = Instant::now();
            let (now, verified) = if written.is_empty() {
                // After a crash: the objects as the store holds them now.
                // A sampled day's objects hold the rows its recorded rule keeps.
                if let Some(rule) = self.catalog.sampling_rule(day).await? {
                    expected = Expected::sampled(&self.archiver.selected(day, mode, &rule).await?.kept, fp.rows);
                }
                match self.rehash(day, record_objects).await {
                    Ok(objects) => tokio::join!(self.hot.fingerprint(day, mode), verify_day(&self.cold, day, &objects, &expected)),
                    Err(e) => (self.hot.fingerprint(day, mode).await, Err(e)),
                }
            } else {
                // Reading the objects back and asking ClickHouse for the
                // day's fingerprint now are independent: both at once.
                tokio::join!(self.hot.fingerprint(day, mode), verify_day(&self.cold, day, &written, &expected))
            };
            let now = now?;
            if now != fp {
                return Err(CompactorError::RowsChanged { day: name, step: "archived", message: format!("{} became {}", fp.encode(), now.encode()) });
            }
            let entries = match verified {
                Ok(entries) => entries,
                Err(e) if e.class() != ErrorClass::Reject => return Err(e),
                Err(e) => {
                    metrics::verification_failed(&self.metrics, &e);
                    // Back to archiving: the next pass rewrites the objects.
                    self.catalog.set_state(day, DayState::Archiving, &fp, 0, 0).await?;
                    return Err(e);
                }
            };
            self.catalog.record_verified(day, &fp, &entries).await?;
            metrics::stage_finished(&self.metrics, &name, "verify", fp.rows, started.elapsed());
            metrics::day_verified(&self.metrics, fp.rows);
            metrics::day_state(&self.metrics, &name, DayState::Verified, fp.rows);
            pause_point(DayState::Verified.as_str()).await;
            state = Some(DayState::Verified);
        }
        if state == Some(DayState::Verified) {
            // After verifying, and on a resume at `verified` (a kill before this finished).
            self.remove_superseded(day).await?;
        }

        let verified = self.catalog.day(day).await?.map_or((0, 0), |r| (r.objects, r.bytes));
        if state == Some(DayState::Verified) {
            let started = Instant::now();
            // A day archived by an earlier run is read again for its counts.
            let fold = match folded {
                Some(fold) => fold,
                None => self.archiver.fold_day(day, mode, DayFold::aggregates()).await?.finish(),
            };
            let Folded { rows, daily, hours, errors, waste, .. } = fold;
            let groups = async {
                let groups = aggregate::compute(&self.hot, day, mode, rows, daily).await?;
                let now = self.hot.fingerprint(day, mode).await?;
                if now != fp {
                    return Err(CompactorError::RowsChanged {
                        day: name.clone(),
                        step: "aggregated",
                        message: format!("{} became {}", fp.encode(), now.encode()),
                    });
                }
                Ok(groups)
            };
            let counts = publish::DayCounts { hours: &hours, errors: &errors, waste: waste.as_ref() };
            let published = publish::publish(&self.catalog, &self.dictionary, &self.prices, day, counts, groups).await?;
            metrics::day_published(&self.metrics, &name, &published);
            metrics::stage_finished(&self.metrics, &name, "aggregate", fp.rows, started.elapsed());
            self.record(day, DayState::Aggregated, &fp, verified.0, verified.1).await?;
        }

        if self.hot_policy.expired(day, today) {
            let record =
                self.catalog.day(day).await?.ok_or_else(|| CompactorError::Archive { day: name.clone(), message: "day record vanished".into() })?;
            self.record(day, DayState::Releasing, &fp, record.objects, record.bytes).await?;
            return self.release(day).await;
        }
        Ok(DayOutcome::Complete)
    }

    /// The rule to archive `day` with: with sampling on, the day's recorded
    /// rule, else one derived from its history and recorded; with sampling
    /// off, none (and a rule recorded by an earlier run is forgotten).
    async fn sampling_rule(&self, day: Day) -> Result<Option<Rule>, CompactorError> {
        if self.sampling.enabled {
            Ok(Some(self.catalog.sampling_rule_for(day, &self.sampling).await?))
        } else {
            self.catalog.forget_sampling_rule(day).await?;
            Ok(None)
        }
    }

    /// Rows that arrived after the day was released (a batch flushed just
    /// after midnight): archived as supplement objects beside the day's
    /// archive, read back and verified against ClickHouse, added to the
    /// manifest together with the audit row of their drop (one
    /// transaction, before the drop), then dropped from the hot tier. The
    /// same rows make the same object keys, so a run killed anywhere is
    /// finished by the next. The day's aggregates are not recomputed: the
    /// report answers a released day from them, never from late rows.
    async fn archive_late_rows(&self, day: Day, mode: ReadMode, fp: &DayFingerprint) -> Result<DayOutcome, CompactorError> {
        use sha2::Digest as _;
        let name = inferlog_store::day_string(day);
        let pending = self.catalog.replay_pending_on(day).await?;
        if pending > 0 {
            return Err(CompactorError::ReplayPending { day: name, rows: pending });
        }
        tracing::warn!(day = %name, rows = fp.rows, "rows arrived for a day already released; archiving them as a supplement");
        let tag = hex::encode(&sha2::Sha256::digest(fp.encode().as_bytes())[..6]);
        let written = self.archiver.archive_supplement(day, mode, &tag).await?;
        for o in &written {
            metrics::object_written(&self.metrics, &o.key, o.rows, o.bytes);
        }
        let entries = verify_day(&self.cold, day, &written, &Expected::all(fp)).await?;
        let now = self.hot.fingerprint(day, mode).await?;
        if now != *fp {
            return Err(CompactorError::RowsChanged { day: name, step: "supplemented", message: format!("{} became {}", fp.encode(), now.encode()) });
        }
        let keys: Vec<&str> = entries.iter().map(|e| e.object_key.as_str()).collect();
        let audit = AuditEntry {
            tier: "hot",
            unit: name.clone(),
            action: "drop_partition",
            rows: Some(fp.rows),
            bytes: None,
            policy: self.hot_policy.to_string(),
            dry_run: false,
            actor: "compactor",
            detail: Some(format!("rows that arrived after the day was released, archived in {}", keys.join(", "))),
        };
        self.catalog.add_supplement(&entries, &audit).await?;
        pause_point("supplemented").await;
        self.hot.drop_day(day).await?;
        tracing::info!(day = %name, rows = fp.rows, objects = entries.len(), "late rows archived and dropped");
        Ok(DayOutcome::Released)
    }

    /// Deletes the day's objects that its verified manifest does not list
    /// (an earlier, larger split of the day), each audited before it goes:
    /// a kill between the two leaves the object and an audit row saying it
    /// was deleted, which the audit reports until the next pass, resuming
    /// at `verified`, deletes it; the other order could leave a deletion
    /// no row records.
    async fn remove_superseded(&self, day: Day) -> Result<(), CompactorError> {
        let manifest = self.catalog.manifest(Some(day)).await?;
        let keep: std::collections::HashSet<&str> = manifest.iter().map(|e| e.object_key.as_str()).collect();
        for stale in self.cold.list_day(day).await?.into_iter().filter(|o| !keep.contains(o.key.as_str())) {
            tracing::info!(key = %stale.key, "deleting an object of an earlier archive of this day");
            let entry = AuditEntry {
                tier: "cold",
                unit: stale.key.clone(),
                action: "delete_superseded",
                rows: None,
                bytes: Some(stale.bytes),
                policy: "superseded".into(),
                dry_run: false,
                actor: "compactor",
                detail: Some(format!("not in the verified manifest of {} ({} objects)", inferlog_store::day_string(day), manifest.len())),
            };
            self.catalog.audit(&entry).await?;
            pause_point("superseded").await;
            self.cold.delete(&stale.key).await?;
        }
        Ok(())
    }

    /// Rebuilds what was written from the objects themselves (after a
    /// crash between writing and verifying), so verification reads back and
    /// compares the real bytes; the written digest is recomputed from the
    /// store, and the footer and column checks still hold it to ClickHouse.
    async fn rehash(&self, day: Day, count: u32) -> Result<Vec<WrittenObject>, CompactorError> {
        let mut objects = Vec::new();
        for part in 0..count {
            let key = self.cold.object_key(day, part);
            // One read: the digest of all of it, the footer from its tail.
            let read_back = crate::verify::ReadBackObject::fetch(&self.cold, &key, &[]).await?;
            let (bytes, sha256) = (read_back.size, read_back.sha256.clone());
            let rows = read_back.footer_rows(day).await?;
            objects.push(WrittenObject { key, rows, bytes, sha256, fingerprint_ranges: Vec::new() });
        }
        Ok(objects)
    }

    /// Releases the day from the hot tier through the one shared release
    /// path, which re-checks the archive against the rows first.
    async fn release(&self, day: Day) -> Result<DayOutcome, CompactorError> {
        let name = inferlog_store::day_string(day);
        let by = ReleaseBy { actor: "compactor", policy: self.hot_policy, dry_run: false };
        match release_day(&self.hot, &self.catalog, day, by, hold_point("release-checked"), pause_point("dropped")).await? {
            Release::Released { rows, .. } => {
                metrics::day_state(&self.metrics, &name, DayState::Released, rows);
                Ok(DayOutcome::Released)
            }
            Release::Refused(Refusal::RowsChanged { recorded, now }) => {
                // Archive again on the next pass: never drop rows the archive does not hold.
                self.catalog.mark(day, DayState::Archiving).await?;
                Err(CompactorError::RowsChanged { day: name, step: "released", message: format!("{recorded} became {now}") })
            }
            Release::Refused(Refusal::ReplayPending { rows }) => Err(CompactorError::ReplayPending { day: name, rows }),
            Release::Refused(refusal) => Err(CompactorError::Verification { day: name, key: "-".into(), message: refusal.to_string() }),
        }
    }
}
