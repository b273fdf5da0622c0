//! Releasing a day from the hot tier: the one place that drops a hot
//! partition, used by the compactor (after archiving) and by retention
//! (enforcing the hot policy). In: a day the catalog records as archived,
//! verified and aggregated. Out: its partition dropped and the drop in the
//! audit table, or a refusal naming what is missing. Never drops rows the
//! verified archive does not hold.

use std::future::Future;

use crate::catalog::{AuditEntry, Catalog, DayState};
use crate::hot::{HotTier, ReadMode};
use crate::{Day, Policy, StoreError};

/// Why a day may not leave the hot tier (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The compactor has not archived, verified and aggregated the day.
    NotArchived { state: Option<DayState> },
    /// The manifest does not hold the day's rows.
    ManifestShort { archived_rows: u64, day_rows: u64, objects: usize },
    /// Rows arrived (or changed) after the archive was verified.
    RowsChanged { recorded: String, now: String },
    /// Rows arrived after the day was released: the compactor archives
    /// them as a supplement before they are dropped.
    LateRows { rows: u64 },
    /// A DLQ replay was killed between inserting rows of the day and
    /// recording them ([`crate::dlq_ledger`]): the next replay resolves them.
    ReplayPending { rows: u64 },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotArchived { state: None } => f.write_str("no verified archive: the compactor has no record of this day"),
            Refusal::NotArchived { state: Some(s) } => {
                write!(f, "no verified archive with aggregates: the compactor's state is {}", s.as_str())
            }
            Refusal::ManifestShort { archived_rows, day_rows, objects } => {
                write!(f, "the manifest holds {archived_rows} rows in {objects} objects, the day had {day_rows}")
            }
            Refusal::RowsChanged { recorded, now } => write!(f, "the hot rows changed since the archive was verified ({recorded} became {now})"),
            Refusal::ReplayPending { rows } => {
                write!(f, "{rows} rows of an interrupted DLQ replay are unresolved; run `inferlog-ingest dlq replay` again to finish it")
            }
            Refusal::LateRows { rows } => {
                write!(f, "{rows} rows arrived after the day was released; the compactor archives them as a supplement, then drops them")
            }
        }
    }
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Dropped (or, in a dry run, would be), with the rows the archive holds.
    Released { rows: u64, objects: usize },
    /// Left in place, and why.
    Refused(Refusal),
}

/// Who releases, under which policy, and whether for real.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseBy {
    pub actor: &'static str,
    pub policy: Policy,
    pub dry_run: bool,
}

/// Drops `day` from the hot tier if, and only if, the catalog holds a
/// verified archive of exactly its current rows and its aggregates. The
/// caller holds the day's advisory lock exclusively, so no replay or late
/// insert (which take it shared, [`crate::catalog::DayLock`]) lands
/// between the check and the drop. `before_drop` runs between the two, and
/// `after_drop` between the drop and its bookkeeping (test hooks).
pub async fn release_day<G: Future<Output = ()>, F: Future<Output = ()>>(
    hot: &HotTier,
    catalog: &Catalog,
    day: Day,
    by: ReleaseBy,
    before_drop: G,
    after_drop: F,
) -> Result<Release, StoreError> {
    let Some(record) = catalog.day(day).await? else {
        return Ok(Release::Refused(Refusal::NotArchived { state: None }));
    };
    if record.state == DayState::Released {
        let late = hot.fingerprint(day, ReadMode::Final).await?.rows;
        if late > 0 {
            return Ok(Release::Refused(Refusal::LateRows { rows: late }));
        }
        return Ok(Release::Released { rows: record.hot_rows, objects: record.objects as usize });
    }
    let pending = catalog.replay_pending_on(day).await?;
    if pending > 0 {
        return Ok(Release::Refused(Refusal::ReplayPending { rows: pending }));
    }
    if !matches!(record.state, DayState::Aggregated | DayState::Releasing) {
        return Ok(Release::Refused(Refusal::NotArchived { state: Some(record.state) }));
    }
    let mode = if hot.parts(day).await?.0 > 1 { ReadMode::Final } else { ReadMode::OnePart };
    let now = hot.fingerprint(day, mode).await?;
    // No rows left means an earlier drop happened and only its bookkeeping is missing.
    if now.rows > 0 && now.encode() != record.fingerprint {
        return Ok(Release::Refused(Refusal::RowsChanged { recorded: record.fingerprint, now: now.encode() }));
    }
    let manifest = catalog.manifest(Some(day)).await?;
    // A sampled day's objects hold fewer rows than they stand for: their weights count.
    let archived_rows: u64 = manifest.iter().map(|m| m.represented_rows).sum();
    if manifest.is_empty() || archived_rows != record.hot_rows {
        return Ok(Release::Refused(Refusal::ManifestShort { archived_rows, day_rows: record.hot_rows, objects: manifest.len() }));
    }
    let audit = AuditEntry {
        tier: "hot",
        unit: crate::day_string(day),
        action: "drop_partition",
        rows: Some(record.hot_rows),
        bytes: None,
        policy: by.policy.to_string(),
        dry_run: by.dry_run,
        actor: by.actor,
        detail: Some(format!("archived in {} verified objects", manifest.len())),
    };
    if by.dry_run {
        catalog.audit(&audit).await?;
        return Ok(Release::Released { rows: record.hot_rows, objects: manifest.len() });
    }
    if record.state != DayState::Releasing {
        catalog.mark(day, DayState::Releasing).await?;
    }
    before_drop.await;
    hot.drop_day(day).await?;
    after_drop.await;
    catalog.record_release(day, &audit).await?;
    Ok(Release::Released { rows: record.hot_rows, objects: manifest.len() })
}
