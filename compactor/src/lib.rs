//! `inferlog-compactor`: closed UTC days of the hot tier into the cold and
//! aggregate tiers, then out of the hot tier. Stages, in data-flow order,
//! driven per day by [`day`] and per pass by [`service`]:
//!
//! ClickHouse day partition → [`archive`] (Parquet objects on the cold
//! store; each row also to [`fold`]: histograms, hours, errors) →
//! [`verify`] (read back, matched against ClickHouse; manifest in
//! Postgres) → [`aggregate`] (exact percentiles from ClickHouse joined to
//! the fold) → [`publish`] (priced, into Postgres) → release (the hot
//! partition dropped and audited, once past the hot retention).
//! [`measures`] names the measures every stage after the archive describes;
//! [`erase`] writes an archived object again without an erased user's rows.

pub mod aggregate;
pub mod archive;
pub mod config;
pub mod day;
pub mod erase;
pub mod error;
pub mod fold;
pub mod format;
pub mod measures;
pub mod metrics;
pub mod publish;
pub mod reprice;
pub mod service;
pub mod verify;

pub use config::Config;
pub use error::CompactorError;
