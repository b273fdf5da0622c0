//! The `[retention]` table: how long each tier keeps a day.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::policy::Policy;

/// The `[retention]` table: how long each tier keeps a day. Each is a
/// number of days or "forever".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Raw rows in ClickHouse. Default: 7.
    pub hot_days: Policy,
    /// Daily aggregates in Postgres. Default: 365.
    pub aggregate_days: Policy,
    /// Parquet objects in the cold store. Default: 365.
    pub cold_days: Policy,
    /// How often `inferlog-retention enforce --daemon` enforces. Default: "1h".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub interval: Duration,
    /// Address of `/metrics` and `/healthz` of `inferlog-retention enforce --daemon`; empty disables them. Default: "127.0.0.1:9466".
    pub metrics_addr: String,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            hot_days: Policy::Days(7),
            aggregate_days: Policy::Days(365),
            cold_days: Policy::Days(365),
            interval: Duration::from_secs(3600),
            metrics_addr: "127.0.0.1:9466".into(),
        }
    }
}

impl RetentionConfig {
    /// Ingest rejects events older than `max_event_age`; if that were longer
    /// than the hot retention, a late event could land in a day already
    /// archived and released, and be lost to the archive.
    ///
    /// The archive and the aggregates must outlive the hot rows: a day is
    /// released from the hot tier only once both hold it, so a shorter
    /// `cold_days` or `aggregate_days` would delete them while the day is
    /// still hot, and the day could then never be released.
    pub fn validate(&self, max_event_age: Duration) -> Result<(), StoreError> {
        for (name, policy) in [("cold_days", self.cold_days), ("aggregate_days", self.aggregate_days)] {
            if !policy.outlives(self.hot_days) {
                return Err(StoreError::Config(format!(
                    "retention.{name} ({policy}) must be at least retention.hot_days ({}): a day still in the hot tier would lose its {} and could never be released",
                    self.hot_days,
                    if name == "cold_days" { "archive" } else { "aggregates" }
                )));
            }
        }
        if let Policy::Days(days) = self.hot_days {
            if max_event_age > Duration::from_secs(u64::from(days) * 86_400) {
                return Err(StoreError::Config(format!(
                    "schema.max_event_age ({}) must not exceed retention.hot_days ({days}): a late event would land in a day already released from the hot tier",
                    humantime::format_duration(max_event_age)
                )));
            }
        }
        Ok(())
    }
}
