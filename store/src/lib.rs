//! `inferlog-store`: the three tiers as every component sees them. In:
//! the `[clickhouse]`, `[postgres]`, `[cold]` and `[retention]` tables of
//! the config file. Out: handles on each store with the few operations
//! more than one component needs.
//!
//! - [`hot`]: the ClickHouse hot table (day partitions, their fingerprint, dropping one).
//! - [`model`]: the tiers' data model: the tables' shapes, the rows written and read
//!   back, the archive's schema, the measures and the one fold into aggregates.
//! - [`catalog`]: Postgres, the system of record for what each tier holds:
//!   the compactor's day states, the cold manifest, the aggregates, the
//!   audit table of deletions, and the advisory locks replicas share.
//! - [`cold`]: the object store holding Parquet archives under `dt=YYYY-MM-DD/`.
//! - [`dlq_ledger`]: the rejected events a DLQ replay stored, by source coordinates, and the lock replays share.
//! - [`cost`]: the price table and what a model's tokens cost on a day.
//! - [`budget`]: monthly budgets per business line, spend and forecast.
//! - [`policy`]: retention policies and the one rule deciding when a day has expired.
//! - [`sampling`]: each sampled day's rule (parameters and thresholds from history), recorded with the day.
//! - [`release`]: the one way a day leaves the hot tier (verified archive first).
//! - [`http`]: the `/metrics` and `/healthz` endpoint every daemon serves.
//! - [`cli`]: logging, runtime and exit code of every command's `main`.

pub mod budget;
pub mod catalog;
pub mod cli;
pub mod cold;
pub mod cold_lookup;
pub mod config;
pub mod cost;
pub mod dlq_ledger;
pub mod error;
pub mod hot;
pub mod http;
pub mod kafka;
pub mod model;
pub mod policy;
pub mod release;
pub mod retry;
pub mod sampling;
pub mod test_hooks;

pub use config::{ClickHouseConfig, ColdConfig, OtlpConfig, PostgresConfig, RetentionConfig, SamplingConfig, ServiceMetricsConfig};
pub use error::StoreError;
pub use policy::Policy;

/// A UTC day, as days since 1970-01-01 (ClickHouse `Date`'s own number).
pub type Day = i32;

/// `YYYY-MM-DD` of a day number.
pub fn day_string(day: Day) -> String {
    inferlog_schema::timestamp::utc_day(i64::from(day) * inferlog_schema::timestamp::MS_PER_DAY)
}

/// The day number of `YYYY-MM-DD`.
pub fn parse_day(text: &str) -> Option<Day> {
    inferlog_schema::timestamp::parse_day(text).map(|ms| (ms / inferlog_schema::timestamp::MS_PER_DAY) as Day)
}

/// The UTC day holding epoch-ms `ms`.
pub fn day_of_ms(ms: i64) -> Day {
    ms.div_euclid(inferlog_schema::timestamp::MS_PER_DAY) as Day
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_numbers_round_trip() {
        assert_eq!(day_string(0), "1970-01-01");
        let d = parse_day("2026-11-29").expect("valid");
        assert_eq!(day_string(d), "2026-11-29");
        assert_eq!(day_of_ms(i64::from(d) * 86_400_000 + 86_399_999), d);
        assert_eq!(parse_day("2026-13-01"), None);
    }
}
