//! The tiers' data model, each shape written once and used by every crate
//! that reads or writes it. The hot row is one list, `store/hot_row.toml`:
//! the store's build step generates its table columns, the row ingest
//! writes and its encoder, the rows read back, the archive's fields,
//! builders and read-back, its Parquet encodings and the fields a keep rule
//! may test. Adding a column is one line there (with `added` for existing
//! tables, which ingest alters at start-up).
//!
//! - [`tables`]: the ClickHouse tables' shapes (columns, DDL, insert lists, drift checks).
//! - [`rows`]: the rows ingest writes ([`rows::HotRow`] and its RowBinary encoder, [`rows::RejectRow`]).
//! - [`stored`]: hot rows as read back ([`stored::StoredRow`]: every column; [`stored::FoldRow`]: what the aggregates fold).
//! - [`archive`]: the archive's Arrow schema and the batches built from stored rows.
//! - [`sample`]: the sampled archive's rule (which rows a day keeps, why, and the weights that keep totals exact).
//! - [`keep`]: the user's `[[sampling.keep]]` rules (conditions over a stored row).
//! - [`keep_field`]: a keep field's value in a stored row (which fields a rule may name is config's).
//! - [`measures`]: the measures the aggregates describe (ClickHouse expression, Postgres columns, report label).
//! - [`fold`]: the one fold from hot rows to daily groups, hours, errors and users.
//! - [`fold_record`]: a unit's fold as the catalog keeps it until the day's units are merged.
//! - [`callers`]: the fold's account of each hashed caller's load per hour (hot days).
//! - [`waste`]: the fold's account of repeated prompts and output lengths (hot and whole archive days).
//! - [`unit`]: a closed day cut into units that compactors archive independently.
//! - [`aggregates`]: the Postgres aggregate tables' columns.

pub mod aggregates;
pub mod archive;
pub mod callers;
pub mod fold;
pub mod fold_record;
pub mod keep;
pub mod keep_field;
pub mod measures;
pub mod rows;
pub mod sample;
pub mod stored;
pub mod tables;
pub mod unit;
pub mod waste;

/// A random seed for a test and its generator, the seed printed (and
/// named in the test's messages) to replay a failure.
#[cfg(test)]
#[allow(clippy::print_stderr)]
pub(crate) fn seeded_rng() -> (u64, rand_chacha::ChaCha8Rng) {
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::thread_rng().gen();
    eprintln!("seed {seed}");
    (seed, rand_chacha::ChaCha8Rng::seed_from_u64(seed))
}
