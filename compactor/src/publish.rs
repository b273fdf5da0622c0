//! Publish stage. In: one day's hours, error counts and waste (from
//! [`inferlog_store::model::fold`]), its groups once [`crate::aggregate`] has them, and the
//! price table. Out: the day's rows of `daily_aggregates` (and their
//! rollup, `daily_series`), `hourly_aggregates`, `daily_errors`,
//! `daily_waste` and `daily_outputs` in Postgres, each priced,
//! replaced in one transaction (a re-run gives the same rows and never adds
//! to them), and a `cost_audit` row when requests of the day had no price.
//! The hours and errors are written while the groups are still computed.

use std::collections::BTreeMap;
use std::future::Future;

use chrono::{DateTime, Utc};
use inferlog_schema::config::ErrorDictionary;
use inferlog_schema::histogram::Histogram;
use inferlog_store::catalog::{date_of, insert_cost_audit, roll_up_series, Catalog, CostAuditEntry};
use inferlog_store::cost::{PriceTable, Usage};
use inferlog_store::model::aggregates::{daily_columns, hourly_columns, AGGREGATE_TABLES, ERROR_COLUMNS, OUTPUT_COLUMNS, WASTE_COLUMNS};
use inferlog_store::model::fold::{ErrorRow, Hour};
use inferlog_store::model::measures::LEVELS;
use inferlog_store::model::waste::Waste;
use inferlog_store::{Day, StoreError};

use crate::aggregate::Group;
use crate::error::CompactorError;

/// Rows per INSERT statement (at most 43 parameters each; Postgres takes 65,535).
const INSERT_ROWS: usize = 1000;

/// What publishing a day found worth telling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Published {
    /// Requests no price covered, by model.
    pub unpriced: BTreeMap<String, u64>,
    /// Of those, the ones an earlier publication of the day did not
    /// already count, by model: what the unpriced counter adds. A day
    /// published again (late rows, `--day`) counts only its new ones.
    pub newly_unpriced: BTreeMap<String, u64>,
    /// The day's cost of the priced requests, in USD.
    pub cost_usd: f64,
}

/// The epoch-seconds instant `units` × `seconds` as a timestamp.
fn instant(units: u64, seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(units as i64 * seconds, 0).unwrap_or_default()
}

/// What the fold counted of a day besides its groups.
#[derive(Debug, Clone, Copy)]
pub struct DayCounts<'a> {
    pub hours: &'a [Hour],
    pub errors: &'a [ErrorRow],
    /// `None`: not counted (nothing is written to the waste tables).
    pub waste: Option<&'a Waste>,
}

/// Replaces the day's aggregate rows in Postgres with `counts` and
/// `groups`, priced by `prices`, atomically.
pub async fn publish(
    catalog: &Catalog,
    dictionary: &ErrorDictionary,
    prices: &PriceTable,
    day: Day,
    counts: DayCounts<'_>,
    groups: impl Future<Output = Result<Vec<Group>, CompactorError>>,
) -> Result<Published, CompactorError> {
    let DayCounts { hours, errors, waste } = counts;
    let pg = StoreError::postgres;
    let mut tx = catalog.pool().begin().await.map_err(pg("begin"))?;
    let date = date_of(day);
    // What an earlier publication of the day left unpriced, before it is replaced.
    let before: BTreeMap<String, u64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT model_name, sum(requests)::bigint FROM daily_aggregates WHERE day = $1 AND cost_usd IS NULL GROUP BY model_name",
    )
    .bind(date)
    .fetch_all(&mut *tx)
    .await
    .map_err(pg("read the day's unpriced requests"))?
    .into_iter()
    .map(|(model, n)| (model, n as u64))
    .collect();
    for table in AGGREGATE_TABLES {
        sqlx::query(&format!("DELETE FROM {table} WHERE day = $1")).bind(date).execute(&mut *tx).await.map_err(pg("replace aggregates"))?;
    }
    let mut published = Published::default();
    let cost = |model: &str, usage: Usage| prices.cost(model, day, usage);

    // The hours and errors are known already: written while ClickHouse
    // computes the groups' exact percentiles.
    let hours_and_errors = async {
        let columns = hourly_columns().join(", ");
        for chunk in hours.chunks(INSERT_ROWS) {
            let mut insert = sqlx::QueryBuilder::new(format!("INSERT INTO hourly_aggregates ({columns}) "));
            insert.push_values(chunk, |mut q, Hour { row: h, histograms }| {
                q.push_bind(instant(h.hour, 3600))
                    .push_bind(date)
                    .push_bind(&h.business_line)
                    .push_bind(&h.model_name)
                    .push_bind(&h.model_version)
                    .push_bind(h.requests as i64)
                    .push_bind(h.errors as i64)
                    .push_bind(h.input_tokens as i64)
                    .push_bind(h.output_tokens as i64)
                    .push_bind(h.cache_prefix_tokens as i64)
                    .push_bind(cost(&h.model_name, h.usage()))
                    .push_bind(instant(h.peak_minute, 60))
                    .push_bind(h.peak_minute_requests as i64)
                    .push_bind(h.peak_minute_tokens as i64)
                    .push_bind(h.minutes.iter().map(|m| m.0 as i64).collect::<Vec<i64>>())
                    .push_bind(h.minutes.iter().map(|m| m.1 as i64).collect::<Vec<i64>>());
                for h in histograms {
                    q.push_bind(h.as_ref().map(Histogram::encode));
                }
            });
            insert.build().execute(&mut *tx).await.map_err(pg("insert hourly aggregates"))?;
        }

        for chunk in errors.chunks(INSERT_ROWS) {
            let mut insert = sqlx::QueryBuilder::new(format!("INSERT INTO daily_errors ({}) ", ERROR_COLUMNS.join(", ")));
            insert.push_values(chunk, |mut q, e| {
                q.push_bind(date)
                    .push_bind(&e.business_line)
                    .push_bind(&e.model_name)
                    .push_bind(&e.model_version)
                    .push_bind(&e.input_bucket)
                    .push_bind(e.error_code)
                    .push_bind(dictionary.get(e.error_code).unwrap_or("unknown"))
                    .push_bind(&e.error_stage)
                    .push_bind(e.errors as i64);
            });
            insert.build().execute(&mut *tx).await.map_err(pg("insert error counts"))?;
        }

        // A sampled fold's waste is not the day's (the compactor folds every row, so it never is).
        if let Some(waste) = waste.filter(|w| !w.sampled) {
            let lines: Vec<_> = waste.lines.iter().collect();
            for chunk in lines.chunks(INSERT_ROWS) {
                let mut insert = sqlx::QueryBuilder::new(format!("INSERT INTO daily_waste ({}) ", WASTE_COLUMNS.join(", ")));
                insert.push_values(chunk, |mut q, (line, l)| {
                    q.push_bind(date).push_bind(line.as_str());
                    for n in [l.requests, l.tokens, l.input_tokens, l.hashed, l.repeats, l.repeat_tokens, l.repeat_uncached_input] {
                        q.push_bind(n as i64);
                    }
                });
                insert.build().execute(&mut *tx).await.map_err(pg("insert waste"))?;
            }
            let types: Vec<_> = waste.types.iter().collect();
            for chunk in types.chunks(INSERT_ROWS) {
                let mut insert = sqlx::QueryBuilder::new(format!("INSERT INTO daily_outputs ({}) ", OUTPUT_COLUMNS.join(", ")));
                insert.push_values(chunk, |mut q, ((line, request_type), t)| {
                    q.push_bind(date)
                        .push_bind(line.as_str())
                        .push_bind(request_type.as_str())
                        .push_bind(t.requests as i64)
                        .push_bind(t.output_tokens as i64)
                        .push_bind(t.outputs.encode())
                        .push_bind(t.limited as i64)
                        .push_bind(t.at_limit as i64)
                        .push_bind(t.at_limit_tokens as i64);
                });
                insert.build().execute(&mut *tx).await.map_err(pg("insert output lengths"))?;
            }
        }
        Ok::<(), CompactorError>(())
    };
    let (groups, written) = tokio::join!(groups, hours_and_errors);
    written?;
    let groups = groups?;

    // A few statements of many rows each: one round trip per group made the
    // stage as slow as the queries that compute it.
    let columns = daily_columns().join(", ");
    for chunk in groups.chunks(INSERT_ROWS) {
        let mut insert = sqlx::QueryBuilder::new(format!("INSERT INTO daily_aggregates ({columns}) "));
        insert.push_values(chunk, |mut q, Group { row: g, histograms }| {
            let cost_usd = cost(&g.model_name, g.usage());
            match cost_usd {
                Some(c) => published.cost_usd += c,
                None => *published.unpriced.entry(g.model_name.clone()).or_default() += g.totals.requests,
            }
            q.push_bind(date)
                .push_bind(&g.business_line)
                .push_bind(&g.model_name)
                .push_bind(&g.model_version)
                .push_bind(&g.input_bucket)
                .push_bind(&g.output_bucket)
                .push_bind(g.totals.requests as i64)
                .push_bind(g.totals.errors as i64)
                .push_bind(g.totals.input_tokens as i64)
                .push_bind(g.totals.output_tokens as i64)
                .push_bind(g.totals.cache_hits as i64)
                .push_bind(g.totals.cache_prefix_tokens as i64)
                .push_bind(cost_usd);
            for (present, quantiles) in g.durations() {
                for i in 0..LEVELS.len() {
                    // quantilesExact over only NULLs answers 0: store NULL instead.
                    q.push_bind((present > 0).then(|| quantiles.get(i).copied()).flatten());
                }
            }
            let gpu_mem = g.present_gpu_mem > 0;
            q.push_bind(g.q_gpu_mem.first().copied().filter(|_| gpu_mem))
                .push_bind(g.q_gpu_mem.get(1).copied().filter(|_| gpu_mem))
                .push_bind(gpu_mem.then_some(g.max_gpu_mem));
            for h in histograms {
                q.push_bind(h.as_ref().map(Histogram::encode));
            }
        });
        insert.build().execute(&mut *tx).await.map_err(pg("insert aggregates"))?;
    }
    roll_up_series(&mut tx, day).await?;

    published.newly_unpriced = newly_unpriced(&before, &published.unpriced);
    let unpriced: u64 = published.unpriced.values().sum();
    // One audit row per change: publishing the day again with the same
    // unpriced requests is not a new finding.
    if unpriced > 0 && published.unpriced != before {
        let detail = published.unpriced.iter().map(|(model, n)| format!("{model}: {n}")).collect::<Vec<_>>().join(", ");
        let entry = CostAuditEntry {
            day,
            action: "unpriced",
            rows: unpriced,
            unpriced_requests: unpriced,
            cost_before: None,
            cost_after: Some(published.cost_usd),
            prices: prices.digest().to_owned(),
            actor: "compactor",
            detail: Some(format!("no price for {detail}")),
        };
        insert_cost_audit(&mut *tx, &entry).await?;
    }
    tx.commit().await.map_err(pg("commit aggregates"))?;
    Ok(published)
}

/// Per model, the unpriced requests of `now` beyond those of `before`.
fn newly_unpriced(before: &BTreeMap<String, u64>, now: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    now.iter()
        .filter_map(|(model, n)| {
            let new = n.saturating_sub(before.get(model).copied().unwrap_or(0));
            (new > 0).then(|| (model.clone(), new))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_published_again_counts_only_its_new_unpriced_requests() {
        let map = |v: &[(&str, u64)]| v.iter().map(|(m, n)| ((*m).to_owned(), *n)).collect::<BTreeMap<_, _>>();
        assert_eq!(newly_unpriced(&map(&[]), &map(&[("a", 5)])), map(&[("a", 5)]), "first publication");
        assert_eq!(newly_unpriced(&map(&[("a", 5)]), &map(&[("a", 5)])), map(&[]), "the same day again");
        assert_eq!(newly_unpriced(&map(&[("a", 5)]), &map(&[("a", 7), ("b", 1)])), map(&[("a", 2), ("b", 1)]), "late rows");
        assert_eq!(newly_unpriced(&map(&[("a", 5)]), &map(&[])), map(&[]), "priced since (a reprice)");
    }

    #[test]
    fn columns_name_every_bound_value() {
        assert!(daily_columns().len() * INSERT_ROWS < 65_535);
        assert_eq!(instant(2, 3600).to_rfc3339(), "1970-01-01T02:00:00+00:00");
        assert_eq!(instant(61, 60).to_rfc3339(), "1970-01-01T01:01:00+00:00");
    }
}
