//! The late-day guard. In: the UTC day of an insert about to start. Out:
//! nothing for a day well inside the hot policy; for a day the compactor
//! may release before the insert ends (expired, or expiring within
//! [`MARGIN`]), the day's shared advisory lock in the catalog
//! ([`inferlog_store::catalog::DayLock`]), held until the insert ended, so
//! its rows land before a release looks at the day (its fingerprint check
//! sees them and the day is archived again) or after its drop (late rows,
//! archived as a supplement), never between the check and the drop.
//!
//! While a release holds the day, taking the lock fails with
//! [`IngestError::DayReleasing`], a transient error the writer retries.
//! The catalog is connected on first need: a daemon that never meets such
//! a day never talks to Postgres.

use std::time::Duration;

use inferlog_store::catalog::{Catalog, DayLock};
use inferlog_store::config::PostgresConfig;
use inferlog_store::{Day, Policy};
use tokio::sync::OnceCell;

use crate::error::IngestError;

/// How long before its expiry a day's inserts take its lock: longer than
/// an insert and its retries take in the normal run of things, and than
/// the clocks of ingest and the compactor differ.
pub const MARGIN: Duration = Duration::from_secs(3600);

/// When a day's inserts take the shared day lock, and the catalog to take it in.
#[derive(Debug)]
pub struct LateDays {
    policy: Policy,
    postgres: PostgresConfig,
    catalog: OnceCell<Catalog>,
}

impl LateDays {
    pub fn new(policy: Policy, postgres: PostgresConfig) -> LateDays {
        LateDays { policy, postgres, catalog: OnceCell::new() }
    }

    /// Whether an insert into `day` starting at `now_ms` takes the day's lock.
    pub fn needs_lock(&self, day: Day, now_ms: i64) -> bool {
        self.policy.expired(day, inferlog_store::day_of_ms(now_ms + MARGIN.as_millis() as i64))
    }

    /// The shared lock of `day` when an insert into it needs one (see the
    /// module doc); `None` when it does not.
    pub async fn hold(&self, day: Day, now_ms: i64) -> Result<Option<DayLock>, IngestError> {
        if !self.needs_lock(day, now_ms) {
            return Ok(None);
        }
        let catalog = self.catalog.get_or_try_init(|| Catalog::connect(&self.postgres)).await?;
        match catalog.lock_days_shared(&[day], false).await? {
            Some(lock) => Ok(Some(lock)),
            None => Err(IngestError::DayReleasing { day: inferlog_store::day_string(day) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS_PER_DAY: i64 = 86_400_000;

    #[test]
    fn only_days_at_the_policys_edge_take_the_lock() {
        let late = LateDays::new(Policy::Days(7), PostgresConfig::default());
        let today: Day = 20_000;
        let noon = i64::from(today) * MS_PER_DAY + MS_PER_DAY / 2;
        // Seven days before today are kept; the eighth is expired.
        assert!(!late.needs_lock(today, noon));
        assert!(!late.needs_lock(today - 7, noon), "kept all day");
        assert!(late.needs_lock(today - 8, noon), "expired");
        // Within the margin of midnight, the day that expires then takes it too.
        let late_evening = (i64::from(today) + 1) * MS_PER_DAY - MARGIN.as_millis() as i64 / 2;
        assert!(late.needs_lock(today - 7, late_evening));
        assert!(!late.needs_lock(today - 6, late_evening));
        let forever = LateDays::new(Policy::Forever, PostgresConfig::default());
        assert!(!forever.needs_lock(0, noon), "a day kept forever is never released");
    }
}
