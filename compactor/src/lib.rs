//! `inferlog-compactor`: closed UTC days of the hot tier into the cold and
//! aggregate tiers, then out of the hot tier. Stages, in data-flow order,
//! driven per day by [`day`] and per pass by [`service`]:
//!
//! ClickHouse day partition → [`archive`] (Parquet objects on the cold
//! store; each row also to the store's one fold,
//! [`inferlog_store::model::fold`]: histograms, hours, errors) →
//! [`verify`] (read back, matched against ClickHouse; manifest in
//! Postgres) → [`aggregate`] (exact percentiles from ClickHouse joined to
//! the fold) → [`publish`] (priced, into Postgres) → release (the hot
//! partition dropped and audited, once past the hot retention).
//! [`erase`] writes an archived object again without an erased user's rows.

pub mod aggregate;
pub mod archive;
pub mod config;
pub mod day;
pub mod erase;
pub mod error;
pub mod format;
pub mod metrics;
pub mod publish;
pub mod reprice;
pub mod service;
pub mod verify;

pub use config::Config;
pub use error::CompactorError;
