//! The tiers' data model, each shape written once and used by every crate
//! that reads or writes it. Adding a column to the hot table is a change
//! in this folder only: its shape ([`tables::HOT`]), the row ingest writes,
//! the row read back and the archive's schema and builder (a unit test
//! fails for each one left out), plus a migration of existing tables.
//!
//! - [`tables`]: the ClickHouse tables' shapes (columns, DDL, insert lists, drift checks).
//! - [`rows`]: the rows ingest writes ([`rows::HotRow`] and its RowBinary encoder, [`rows::RejectRow`]).
//! - [`stored`]: hot rows as read back ([`stored::StoredRow`]: every column; [`stored::FoldRow`]: what the aggregates fold).
//! - [`archive`]: the archive's Arrow schema and the batches built from stored rows.
//! - [`sample`]: the sampled archive's rule (which rows a day keeps, why, and the weights that keep totals exact).
//! - [`keep`]: the user's `[[sampling.keep]]` rules (conditions over a stored row).
//! - [`measures`]: the measures the aggregates describe (ClickHouse expression, Postgres columns, report label).
//! - [`fold`]: the one fold from hot rows to daily groups, hours, errors and users.
//! - [`callers`]: the fold's account of each hashed caller's load per hour (hot days).
//! - [`waste`]: the fold's account of repeated prompts and output lengths (hot and whole archive days).
//! - [`aggregates`]: the Postgres aggregate tables' columns.

pub mod aggregates;
pub mod archive;
pub mod callers;
pub mod fold;
pub mod keep;
pub mod measures;
pub mod rows;
pub mod sample;
pub mod stored;
pub mod tables;
pub mod waste;
