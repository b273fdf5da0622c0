//! Where each day's answer comes from. In: the range, the filter and both
//! stores. Out: [`Facts`] for every day, each day read from one tier:
//!
//! - the hot tier (ClickHouse, every row) while it holds the day and the
//!   compactor has not released it;
//! - else the aggregates tier (Postgres), when the compactor aggregated it;
//! - else the archive, when the manifest lists objects of the day (the
//!   aggregates deleted by a shorter policy than the archive's): its rows,
//!   weighted by `sample_weight`, with a note of what is exact and what an
//!   estimate;
//! - else no tier: the day is reported as missing, never as zero traffic
//!   silently.
//!
//! A day the compactor releases while the report reads it (listed hot,
//! then dropped) is read again from the aggregates, which hold it before
//! it is released, so it never shows as a day of no traffic.
//!
//! A released day that received late rows is answered by its aggregates
//! (which hold the day as released), or is missing when they are gone;
//! never by its late rows, which the compactor archives as a supplement. When
//! ClickHouse does not answer, every day the aggregates hold is read from
//! them and the output says so; the others are reported missing.

pub mod aggregates;
pub mod archive;
pub mod hot;

use std::collections::BTreeSet;

use inferlog_schema::config::ErrorDictionary;
use inferlog_store::catalog::{Catalog, DayState};
use inferlog_store::cold::ColdStore;
use inferlog_store::cost::PriceTable;
use inferlog_store::hot::HotTier;
use inferlog_store::model::fold::{DayFold, Extras};
use inferlog_store::Day;

use crate::error::ReportError;
use crate::facts::{Facts, Tier};
use crate::range::Range;

/// Test hook ([`inferlog_store::test_hooks::hold_point`]): `routed`, after
/// each day's tier is chosen and before any is read.
pub const HOLD_ENV: &str = "INFERLOG_REPORT_HOLD_AFTER";

/// `--business-line` and `--model`: rows of other lines or models are not read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Filter {
    pub business_line: Option<String>,
    pub model: Option<String>,
}

/// What a report reads besides each day's groups and errors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reads {
    /// The hourly facts of aggregate days (the days read from rows always have them).
    pub hours: bool,
    /// The repeated prompts and output lengths of the days read from rows,
    /// and what the aggregates keep of them.
    pub waste: bool,
    /// Each hashed caller's load per hour, on hot days.
    pub callers: bool,
    /// Each model × version × request type of the days read from rows.
    pub types: bool,
    /// Each GPU of the days read from rows.
    pub gpus: bool,
}

impl Reads {
    /// The fold of a day read from rows: users always, waste, request
    /// types and GPUs when asked; callers when asked and `tier_has_callers`
    /// (the hot tier's: the archive keeps no caller per hour).
    pub fn fold(self, tier_has_callers: bool) -> DayFold {
        DayFold::counting(Extras { users: true, waste: self.waste, callers: self.callers && tier_has_callers, types: self.types, gpus: self.gpus })
    }
}

/// Whether the hot tier answers `day`: it holds the day's partition and
/// the day is not released (a released day's hot rows are late ones,
/// waiting to be archived as a supplement, never the day).
fn hot_answers(day: Day, held: &BTreeSet<Day>, released: &BTreeSet<Day>) -> bool {
    held.contains(&day) && !released.contains(&day)
}

/// The tier of each day of `range`, given what each tier holds.
pub fn route(
    range: Range,
    hot_days: &BTreeSet<Day>,
    released: &BTreeSet<Day>,
    aggregated: &BTreeSet<Day>,
    archived: &BTreeSet<Day>,
) -> Vec<(Day, Tier)> {
    range
        .iter()
        .map(|day| {
            let tier = if hot_answers(day, hot_days, released) {
                Tier::Hot
            } else if aggregated.contains(&day) {
                Tier::Aggregates
            } else if archived.contains(&day) {
                Tier::Archive
            } else {
                Tier::None
            };
            (day, tier)
        })
        .collect()
}

/// The stores a report reads.
#[derive(Debug)]
pub struct Stores {
    pub hot: HotTier,
    pub catalog: Catalog,
    /// The archive (`None`: `[cold]` not usable here; its days are missing).
    pub cold: Option<ColdStore>,
    pub prices: PriceTable,
    pub dictionary: ErrorDictionary,
}

/// Reads every day of `range`, each from the tier that holds it, with what
/// `reads` asks for besides.
pub async fn load(stores: &Stores, range: Range, filter: &Filter, reads: Reads) -> Result<Facts, ReportError> {
    let mut notes = Vec::new();
    let hot_days: BTreeSet<Day> = match stores.hot.partitions().await {
        Ok(partitions) => partitions.into_iter().map(|p| p.day).filter(|d| range.contains(*d)).collect(),
        // An SRE asks during outages too: the aggregated days still have an answer.
        Err(e) => {
            tracing::warn!(error = %e, "the hot tier is unreachable; the aggregates answer the days they hold");
            notes.push(format!("the hot tier did not answer ({e}): each day was read from the aggregates where they hold it"));
            BTreeSet::new()
        }
    };
    let released: BTreeSet<Day> =
        stores.catalog.days().await?.into_iter().filter(|r| r.state == DayState::Released && range.contains(r.day)).map(|r| r.day).collect();
    let aggregated: BTreeSet<Day> = aggregates::days(&stores.catalog, range.from, range.to).await?.into_iter().collect();
    let archived: BTreeSet<Day> = match &stores.cold {
        Some(_) => stores.catalog.manifest(None).await?.into_iter().map(|e| e.day).filter(|d| range.contains(*d)).collect(),
        None => BTreeSet::new(),
    };
    let routes = route(range, &hot_days, &released, &aggregated, &archived);
    let pick = |tier: Tier| routes.iter().filter(|(_, t)| *t == tier).map(|(d, _)| *d).collect::<Vec<Day>>();
    let (hot_days, aggregate_days, archive_days) = (pick(Tier::Hot), pick(Tier::Aggregates), pick(Tier::Archive));
    inferlog_store::test_hooks::hold_point(HOLD_ENV, "routed").await;
    // An archive that does not answer leaves its days missing, said so; the other tiers still answer.
    let from_archive = async {
        let Some(cold) = &stores.cold else { return Ok(Facts::default()) };
        match archive::load(cold, &stores.catalog, &archive_days, filter, reads, &stores.prices, &stores.dictionary).await {
            Err(ReportError::Store(e)) if e.class() == inferlog_schema::ErrorClass::Retry => {
                tracing::warn!(error = %e, "the archive is unreachable; the days only it holds are reported missing");
                let days: Vec<String> = archive_days.iter().map(|d| inferlog_store::day_string(*d)).collect();
                let note = format!("the archive did not answer ({e}): {} reported missing", days.join(", "));
                Ok(Facts { tiers: archive_days.iter().map(|d| (*d, Tier::None)).collect(), notes: vec![note], ..Facts::default() })
            }
            other => other,
        }
    };
    let (from_hot, from_aggregates, from_archive) = tokio::try_join!(
        hot::load(&stores.hot, &hot_days, filter, reads, &stores.prices, &stores.dictionary),
        aggregates::load(&stores.catalog, &aggregate_days, filter, reads),
        from_archive,
    )?;
    let mut facts = Facts { tiers: routes.iter().filter(|(_, t)| *t == Tier::None).copied().collect(), notes, ..Facts::default() };
    // A day released while it was read may have been read after its drop:
    // it comes from the aggregates instead (released days were aggregated first).
    let gone = released_meanwhile(stores, &hot_days).await?;
    let from_hot = from_hot.without_days(&gone);
    if !gone.is_empty() {
        let days: Vec<Day> = gone.iter().copied().collect();
        let aggregated: BTreeSet<Day> = aggregates::days(&stores.catalog, range.from, range.to).await?.into_iter().collect();
        let (again, lost): (Vec<Day>, Vec<Day>) = days.iter().partition(|d| aggregated.contains(d));
        facts.tiers.extend(lost.iter().map(|d| (*d, Tier::None)));
        facts.absorb(aggregates::load(&stores.catalog, &again, filter, reads).await?);
        let names: Vec<String> = days.iter().map(|d| inferlog_store::day_string(*d)).collect();
        tracing::info!(days = %names.join(", "), "released from the hot tier while being read; read from the aggregates");
        facts.notes.push(format!("{} released from the hot tier while the report read it: answered by the aggregates", names.join(", ")));
    }
    facts.absorb(from_hot);
    facts.absorb(from_aggregates);
    facts.absorb(from_archive);
    Ok(facts)
}

/// Of `hot_days`, those the hot tier no longer answers ([`hot_answers`]
/// on a fresh listing and catalog). A hot tier that no longer responds
/// changes nothing: what was read stands.
async fn released_meanwhile(stores: &Stores, hot_days: &[Day]) -> Result<BTreeSet<Day>, ReportError> {
    if hot_days.is_empty() {
        return Ok(BTreeSet::new());
    }
    let Ok(partitions) = stores.hot.partitions().await else { return Ok(BTreeSet::new()) };
    let held: BTreeSet<Day> = partitions.into_iter().map(|p| p.day).collect();
    let released: BTreeSet<Day> = stores.catalog.days().await?.into_iter().filter(|r| r.state == DayState::Released).map(|r| r.day).collect();
    Ok(hot_days.iter().copied().filter(|d| !hot_answers(*d, &held, &released)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_day_goes_to_the_tier_that_holds_all_of_it() {
        let set = |days: &[Day]| days.iter().copied().collect::<BTreeSet<Day>>();
        // 1: aggregates only; 2: hot and aggregated (not released); 3: released with late hot rows;
        // 4: hot only (today); 5: nothing; 6: released, no aggregates (deleted by retention) but late rows:
        // missing, never answered from its late rows alone.
        let routes = route(Range { from: 1, to: 6 }, &set(&[2, 3, 4, 6]), &set(&[1, 3, 6]), &set(&[1, 2, 3]), &BTreeSet::new());
        assert_eq!(routes, vec![(1, Tier::Aggregates), (2, Tier::Hot), (3, Tier::Aggregates), (4, Tier::Hot), (5, Tier::None), (6, Tier::None)]);
        // 6 again, now with its archive: the archive answers it; 1 and 2 stay with their tiers.
        let routes = route(Range { from: 1, to: 6 }, &set(&[2, 3, 4, 6]), &set(&[1, 3, 6]), &set(&[1, 2, 3]), &set(&[1, 2, 6]));
        assert_eq!(routes[5], (6, Tier::Archive));
        assert_eq!((routes[0], routes[1]), ((1, Tier::Aggregates), (2, Tier::Hot)));
    }
}
