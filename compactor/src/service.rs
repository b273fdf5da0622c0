//! The pass. In: the hot tier's day partitions and the catalog's day
//! records. Out: every closed day taken as far as it can go (see
//! [`crate::day`]), oldest first, and a report of what each day reached.
//! The daemon runs a pass every `compactor.interval`; `--once` and `--day`
//! run one.

use std::collections::BTreeSet;
use std::time::Instant;

use inferlog_schema::timestamp::MS_PER_DAY;
use inferlog_schema::ErrorClass;
use inferlog_store::catalog::{Catalog, DayState};
use inferlog_store::cold::ColdStore;
use inferlog_store::hot::HotTier;
use inferlog_store::Day;
use tokio::sync::watch;

use crate::archive::Archiver;
use crate::config::Config;
use crate::day::{DayOutcome, DayWork};
use crate::error::CompactorError;
use crate::metrics::{self, Metrics};
use crate::units::UnitWorker;

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassReport {
    pub complete: Vec<Day>,
    pub released: Vec<Day>,
    pub busy: Vec<Day>,
    pub failed: Vec<(Day, CompactorError)>,
    /// Stopped early by a shutdown signal.
    pub interrupted: bool,
}

impl PassReport {
    /// Exit status of a `--once` run: 0 all done, else the code of the
    /// gravest class among the failed days: 2 misconfigured, 75 a store
    /// unreachable (run again), 1 a verification failed.
    pub fn exit_code(&self) -> i32 {
        let classes: Vec<ErrorClass> = self.failed.iter().map(|(_, e)| e.class()).collect();
        [ErrorClass::Fail, ErrorClass::Retry, ErrorClass::Reject].into_iter().find(|c| classes.contains(c)).map_or(0, |c| i32::from(c.exit_code()))
    }
}

#[derive(Debug, Clone)]
pub struct Compactor {
    pub work: DayWork,
    pub config: Config,
}

impl Compactor {
    /// Connects to the three stores (applying the catalog's migrations).
    pub async fn connect(config: Config, metrics: Metrics) -> Result<Compactor, CompactorError> {
        let hot = HotTier::new(&config.clickhouse)?;
        let cold = ColdStore::new(&config.cold)?;
        let catalog = Catalog::connect(&config.postgres).await?;
        let dictionary = config.schema.validate().map_err(inferlog_store::StoreError::from)?;
        let archiver =
            Archiver { hot: hot.clone(), cold: cold.clone(), config: config.cold.clone(), sort_memory_bytes: config.compactor.sort_memory_bytes };
        let prices = config.cost.validate()?;
        let units = UnitWorker {
            hot: hot.clone(),
            cold: cold.clone(),
            catalog: catalog.clone(),
            archiver: archiver.clone(),
            metrics: metrics.clone(),
            max_rows: config.compactor.unit_max_rows,
            wait: config.compactor.unit_wait,
            name: UnitWorker::process_name(),
        };
        let work = DayWork {
            units,
            hot,
            cold,
            catalog,
            archiver,
            dictionary,
            prices,
            hot_policy: config.retention.hot_days,
            metrics,
            sampling: config.sampling.clone(),
        };
        Ok(Compactor { work, config })
    }

    /// Whether `day` ended more than `lateness` before `now_ms`.
    pub fn is_closed(&self, day: Day, now_ms: i64) -> bool {
        (i64::from(day) + 1) * MS_PER_DAY + self.config.compactor.lateness.as_millis() as i64 <= now_ms
    }

    /// Closed days with hot rows or unfinished work, oldest first.
    pub async fn candidate_days(&self, now_ms: i64) -> Result<Vec<Day>, CompactorError> {
        let mut days: BTreeSet<Day> = self.work.hot.partitions().await?.into_iter().map(|p| p.day).collect();
        days.extend(self.work.catalog.days().await?.into_iter().filter(|r| r.state != DayState::Released).map(|r| r.day));
        Ok(days.into_iter().filter(|d| self.is_closed(*d, now_ms)).collect())
    }

    /// One pass over `days` (every candidate when `None`); `force` redoes
    /// days even when nothing changed. Stops between days on shutdown.
    pub async fn pass(&self, now_ms: i64, days: Option<Vec<Day>>, force: bool, shutdown: &watch::Receiver<bool>) -> PassReport {
        let started = Instant::now();
        let mut report = PassReport::default();
        let days = match days {
            Some(days) => days,
            None => match self.candidate_days(now_ms).await {
                Ok(days) => days,
                Err(e) => {
                    metrics::day_failed(&self.work.metrics, "-", e.class(), &e);
                    report.failed.push((Day::MIN, e));
                    metrics::pass_finished(&self.work.metrics, started.elapsed(), 0, 1, 0);
                    return report;
                }
            },
        };
        let today = inferlog_store::day_of_ms(now_ms);
        for (i, &day) in days.iter().enumerate() {
            if *shutdown.borrow() {
                tracing::info!(remaining = days.len() - i, "shutdown: stopping the pass between days");
                report.interrupted = true;
                break;
            }
            match self.work.run(day, today, force).await {
                Ok(DayOutcome::Complete) => report.complete.push(day),
                Ok(DayOutcome::Released) => report.released.push(day),
                Ok(DayOutcome::Busy) => report.busy.push(day),
                Ok(DayOutcome::Empty) => {}
                Err(e) => {
                    metrics::day_failed(&self.work.metrics, &inferlog_store::day_string(day), e.class(), &e);
                    report.failed.push((day, e));
                }
            }
        }
        // Budgets follow the aggregates just written.
        match inferlog_store::budget::status(&self.work.catalog, &self.config.budgets, today).await {
            Ok(status) => metrics::budgets(&self.work.metrics, &status),
            Err(e) => tracing::warn!(%e, "budget status not updated"),
        }
        let pending = report.failed.len() + report.busy.len();
        metrics::pass_finished(&self.work.metrics, started.elapsed(), report.complete.len() + report.released.len(), report.failed.len(), pending);
        report
    }
}
