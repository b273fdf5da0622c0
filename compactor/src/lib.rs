//! `inferlog-compactor`: closed UTC days of the hot tier into the cold and
//! aggregate tiers, then out of the hot tier. Stages, in data-flow order,
//! driven per day by [`day`] and per pass by [`service`]:
//!
//! ClickHouse day partition → [`archive`] (Parquet objects on the cold
//! store; each row also to the store's one fold,
//! [`inferlog_store::model::fold`]: histograms, hours, errors) →
//! [`verify`] (read back, matched against ClickHouse; manifest in
//! Postgres; a large day in [`units`] that any number of compactors share)
//! → [`aggregate`] (exact percentiles from ClickHouse joined to
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
pub mod units;
pub mod verify;

/// Test hook ([`inferlog_store::test_hooks`]): `<state>`, `superseded` (after
/// the first superseded object's audit row, before its deletion),
/// `supplemented` (late rows archived and in the manifest, not dropped),
/// `dropped`, or `unit-written` (a unit's objects written, not verified).
pub const PAUSE_ENV: &str = "INFERLOG_COMPACTOR_PAUSE_AFTER";

pub use config::Config;
pub use error::CompactorError;
