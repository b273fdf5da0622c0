//! The `[compactor]` table: when and how a closed day is archived.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `[compactor]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CompactorConfig {
    /// Time between two passes of the daemon. Default: "5m".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub interval: Duration,
    /// A UTC day is closed, and compacted, once it ended this long ago.
    /// Rows arriving later still land in ClickHouse; the next pass sees the
    /// day's fingerprint change and archives and aggregates it again. Default: "1h".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub lateness: Duration,
    /// Address of `/metrics` and `/healthz`; empty disables them. Default: "127.0.0.1:9465".
    pub metrics_addr: String,
    /// ClickHouse's memory for sorting one day before spilling to disk, in bytes. Default: 1073741824.
    pub sort_memory_bytes: u64,
    /// A closed day of more rows is archived in units of at most this many
    /// rows (ranges of the sorting key: whole series, or a series cut by
    /// `event_time`), which any number of compactors share: see
    /// docs/scaling.md. 0: one unit whatever the
    /// size. A day archived with sampling is one unit. Default: 20000000.
    pub unit_max_rows: u64,
    /// How long the compactor that planned a day's units waits, once none is
    /// left to claim, for the units other compactors hold, before it leaves
    /// the day to the next pass. Default: "1h".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub unit_wait: Duration,
}

impl Default for CompactorConfig {
    fn default() -> Self {
        CompactorConfig {
            interval: Duration::from_secs(300),
            lateness: Duration::from_secs(3600),
            metrics_addr: "127.0.0.1:9465".into(),
            sort_memory_bytes: 1 << 30,
            unit_max_rows: 20_000_000,
            unit_wait: Duration::from_secs(3600),
        }
    }
}
