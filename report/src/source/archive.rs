//! The archive as a source of facts, for the days no other tier holds (the
//! hot rows released, the aggregates deleted by a shorter policy). In: the
//! days routed here, the manifest and the cold store. Out: [`Facts`] folded
//! from the day's archived rows by the store's one fold, each row counted
//! as many times as its `sample_weight` says, and a note per day saying
//! which figures are exact and which are estimates.
//!
//! A day archived whole (`sample_reason` `all`, weight 1) gives the same
//! facts as the hot tier did. A sampled day gives exact requests per
//! business line × model × version × input bucket × hour (and so per line,
//! model, version and day): the weights of each stratum add up to its row
//! count, and errors are kept whole. Tokens, cost, percentiles, busiest
//! minutes, output buckets and hashed users come from the kept rows,
//! weighted: estimates (the tail above each group's `slow` threshold is
//! whole, so high percentiles are read from complete data).

use inferlog_schema::config::ErrorDictionary;
use inferlog_store::catalog::Catalog;
use inferlog_store::cold::ColdStore;
use inferlog_store::cost::PriceTable;
use inferlog_store::model::archive::{fold_rows, with_sample_columns};
use inferlog_store::model::fold::DayFold;
use inferlog_store::Day;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::ReportError;
use crate::facts::{Facts, Tier};
use crate::source::hot::add_day;
use crate::source::Filter;

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

/// Reads `days` from the archive.
pub async fn load(
    cold: &ColdStore,
    catalog: &Catalog,
    days: &[Day],
    filter: &Filter,
    prices: &PriceTable,
    dictionary: &ErrorDictionary,
) -> Result<Facts, ReportError> {
    let mut facts = Facts::default();
    for &day in days {
        let mut fold = DayFold::counting_users();
        let mut read = DayRead::default();
        for entry in catalog.manifest(Some(day)).await? {
            let bytes = cold.get(&entry.object_key).await?;
            let filter = filter.clone();
            // Decoding is CPU work: off the async workers.
            let folded = tokio::task::spawn_blocking(move || fold_object(bytes, fold, &filter, read)).await;
            let bad = |e: String| ReportError::Data(format!("archive object {}: {e}", entry.object_key));
            (fold, read) = folded.map_err(|e| bad(e.to_string()))?.map_err(bad)?;
        }
        add_day(&mut facts, day, fold.finish(), prices, dictionary);
        facts.notes.push(note(day, read));
    }
    facts.tiers = days.iter().map(|&d| (d, Tier::Archive)).collect();
    Ok(facts)
}

/// Folds one Parquet object's rows (those the filter keeps), each as many
/// times as its weight.
fn fold_object(bytes: bytes::Bytes, mut fold: DayFold, filter: &Filter, mut read: DayRead) -> Result<(DayFold, DayRead), String> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).and_then(|b| b.build()).map_err(|e| e.to_string())?;
    for batch in reader {
        let batch = with_sample_columns(batch.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        fold_rows(&batch, |row, weight| {
            let wanted =
                filter.business_line.as_deref().is_none_or(|l| l == row.business_line) && filter.model.as_deref().is_none_or(|m| m == row.model_name);
            if wanted {
                read.rows += 1;
                read.represented += weight;
                for _ in 0..weight {
                    fold.add(row);
                }
            }
        })
        .map_err(|e| e.to_string())?;
    }
    Ok((fold, read))
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
