//! The archive as a source of facts, for the days no other tier holds (the
//! hot rows released, the aggregates deleted by a shorter policy). In: the
//! days routed here, the manifest and the cold store. Out: [`Facts`] folded
//! from the day's archived rows (streamed a row group at a time) by the
//! store's one fold, each row weighted by its `sample_weight`, and a note
//! per day saying which figures are exact and which are estimates.
//!
//! A day archived whole (`sample_reason` `all`, weight 1) gives the same
//! facts as the hot tier did. A sampled day gives exact requests per
//! business line × model × version × input bucket × hour (and so per line,
//! model, version and day): the weights of each stratum add up to its row
//! count, and errors are kept whole. Tokens, cost, percentiles, busiest
//! minutes, output buckets and hashed users come from the kept rows,
//! weighted: estimates (the tail above each group's `slow` threshold is
//! whole, so high percentiles are read from complete data).

use futures_util::TryStreamExt as _;
use inferlog_schema::config::ErrorDictionary;
use inferlog_store::catalog::Catalog;
use inferlog_store::cold::ColdStore;
use inferlog_store::cost::PriceTable;
use inferlog_store::model::archive::{fold_rows, in_current_schema};
use inferlog_store::Day;
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use crate::error::ReportError;
use crate::facts::{Facts, Tier};
use crate::source::hot::add_day;
use crate::source::{Filter, Reads};

/// What one archived day held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DayRead {
    /// Rows in the objects, and the rows they stand for.
    pub rows: u64,
    pub represented: u64,
}

impl DayRead {
    pub fn sampled(self) -> bool {
        self.represented > self.rows
    }
}

/// Reads `days` from the archive, with their waste (a sampled day's is
/// marked so and not used) and request types when `reads` asks.
pub async fn load(
    cold: &ColdStore,
    catalog: &Catalog,
    days: &[Day],
    filter: &Filter,
    reads: Reads,
    prices: &PriceTable,
    dictionary: &ErrorDictionary,
) -> Result<Facts, ReportError> {
    let mut facts = Facts::default();
    for &day in days {
        let mut fold = reads.fold(false);
        let mut read = DayRead::default();
        for entry in catalog.manifest(Some(day)).await? {
            let bad = |e: String| ReportError::Data(format!("archive object {}: {e}", entry.object_key));
            let object = cold.reader(&entry.object_key, entry.bytes);
            let mut batches = ParquetRecordBatchStreamBuilder::new(object).await.and_then(|b| b.build()).map_err(|e| bad(e.to_string()))?;
            while let Some(batch) = batches.try_next().await.map_err(|e| bad(e.to_string()))? {
                let batch = in_current_schema(batch).map_err(|e| bad(e.to_string()))?;
                fold_rows(&batch, |row, weight| {
                    let wanted = filter.business_line.as_deref().is_none_or(|l| l == row.business_line)
                        && filter.model.as_deref().is_none_or(|m| m == row.model_name);
                    if wanted {
                        read.rows += 1;
                        read.represented += weight;
                        fold.add_weighted(row, weight);
                    }
                })
                .map_err(|e| bad(e.to_string()))?;
            }
        }
        add_day(&mut facts, day, fold.finish(), prices, dictionary);
        facts.notes.push(note(day, read));
    }
    facts.tiers = days.iter().map(|&d| (d, Tier::Archive)).collect();
    Ok(facts)
}

/// What the reader must know about a day read from the archive.
pub fn note(day: Day, read: DayRead) -> String {
    let day = inferlog_store::day_string(day);
    if read.sampled() {
        format!(
            "{day}: from the sampled archive ({} rows standing for {}): requests and errors per business line, model, version, input bucket \
             and hour are exact (the sample weights); tokens, cost, percentiles, busiest minutes, output buckets and users are estimates",
            read.rows, read.represented
        )
    } else {
        format!("{day}: from the archive ({} rows, every row of the day): exact", read.rows)
    }
}
