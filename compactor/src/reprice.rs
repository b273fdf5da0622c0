//! `inferlog-compactor reprice`: a price correction applied to past days.
//! In: a range of days and the price table of the config. Out: `cost_usd`
//! of every `daily_aggregates` and `hourly_aggregates` row of those days
//! recomputed from the stored token sums (and the day's `daily_series`
//! rolled up again from its groups), one transaction and one
//! `cost_audit` row per day (cost before and after, rows changed,
//! requests still unpriced, the price table's digest).
//!
//! Each day is taken under its advisory lock, so a reprice never
//! interleaves with the compactor publishing the same day.

use std::time::Duration;

use chrono::{DateTime, Utc};
use inferlog_store::catalog::{date_of, insert_cost_audit, roll_up_series, Catalog, CostAuditEntry};
use inferlog_store::cost::{PriceTable, Usage};
use inferlog_store::retry::{backoff_for, Retryable};
use inferlog_store::{Day, StoreError};
use sqlx::Row as _;

use crate::error::CompactorError;

/// What a reprice did to one day.
#[derive(Debug, Clone, PartialEq)]
pub struct DayRepriced {
    pub day: Day,
    /// Daily plus hourly rows whose cost changed.
    pub rows_changed: u64,
    /// The day's cost (daily rows) before and after; `None` when nothing of it was priced.
    pub cost_before: Option<f64>,
    pub cost_after: Option<f64>,
    pub unpriced_requests: u64,
}

impl std::fmt::Display for DayRepriced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let usd = |c: Option<f64>| c.map_or_else(|| "unpriced".to_owned(), |c| format!("{c:.6} USD"));
        write!(
            f,
            "{}: {} rows changed, cost {} -> {}, {} requests unpriced",
            inferlog_store::day_string(self.day),
            self.rows_changed,
            usd(self.cost_before),
            usd(self.cost_after),
            self.unpriced_requests
        )
    }
}

/// A row's token sums and stored cost.
struct Priced {
    model: String,
    usage: Usage,
    cost: Option<f64>,
}

fn priced(r: &sqlx::postgres::PgRow) -> Result<Priced, sqlx::Error> {
    let n = |c: &str| r.try_get::<i64, _>(c).map(|v| v as u64);
    Ok(Priced {
        model: r.try_get("model_name")?,
        usage: Usage {
            requests: n("requests")?,
            input_tokens: n("input_tokens")?,
            cached_input_tokens: n("cache_prefix_tokens")?,
            output_tokens: n("output_tokens")?,
        },
        cost: r.try_get("cost_usd")?,
    })
}

/// Recomputes the cost of every aggregate row of `from..=to` at `prices`.
/// `dry_run` computes and reports without writing.
pub async fn reprice(catalog: &Catalog, prices: &PriceTable, from: Day, to: Day, dry_run: bool) -> Result<Vec<DayRepriced>, CompactorError> {
    let days: Vec<Day> = sqlx::query_scalar::<_, chrono::NaiveDate>(
        "SELECT day FROM daily_aggregates WHERE day BETWEEN $1 AND $2 UNION SELECT day FROM hourly_aggregates WHERE day BETWEEN $1 AND $2 ORDER BY 1",
    )
    .bind(date_of(from))
    .bind(date_of(to))
    .fetch_all(catalog.pool())
    .await
    .map_err(StoreError::postgres("list aggregate days"))?
    .into_iter()
    .map(inferlog_store::catalog::day_of)
    .collect();
    let mut out = Vec::with_capacity(days.len());
    for day in days {
        // The compactor holds a day's lock for seconds at most: wait for it, within reason.
        let lock = (|| async {
            catalog.try_lock_day(day).await.map_err(CompactorError::from)?.ok_or(CompactorError::Busy { day: inferlog_store::day_string(day) })
        })
        .retry(backoff_for(Duration::from_millis(100), Duration::from_secs(5), Duration::from_secs(60)))
        .when(|e| matches!(e, CompactorError::Busy { .. }))
        .await?;
        let result = reprice_day(catalog, prices, day, dry_run).await;
        lock.unlock().await;
        out.push(result?);
    }
    Ok(out)
}

async fn reprice_day(catalog: &Catalog, prices: &PriceTable, day: Day, dry_run: bool) -> Result<DayRepriced, CompactorError> {
    let pg = StoreError::postgres;
    let mut tx = catalog.pool().begin().await.map_err(pg("begin"))?;
    let date = date_of(day);
    let changed = |old: Option<f64>, new: Option<f64>| match (old, new) {
        (Some(a), Some(b)) => (a - b).abs() > 1e-12 * a.abs().max(b.abs()),
        (a, b) => a.is_some() != b.is_some(),
    };

    let rows = sqlx::query(
        "SELECT business_line, model_name, model_version, input_bucket, output_bucket, requests, input_tokens, cache_prefix_tokens, \
         output_tokens, cost_usd FROM daily_aggregates WHERE day = $1 FOR UPDATE",
    )
    .bind(date)
    .fetch_all(&mut *tx)
    .await
    .map_err(pg("read daily aggregates"))?;
    let mut report = DayRepriced { day, rows_changed: 0, cost_before: None, cost_after: None, unpriced_requests: 0 };
    let mut keys: [Vec<String>; 5] = Default::default();
    let mut costs: Vec<Option<f64>> = Vec::new();
    for r in &rows {
        let p = priced(r).map_err(pg("decode daily aggregates"))?;
        let new = prices.cost(&p.model, day, p.usage);
        report.cost_before = [report.cost_before, p.cost].into_iter().flatten().reduce(|a, b| a + b);
        report.cost_after = [report.cost_after, new].into_iter().flatten().reduce(|a, b| a + b);
        report.unpriced_requests += if new.is_none() { p.usage.requests } else { 0 };
        if changed(p.cost, new) {
            for (i, column) in ["business_line", "model_name", "model_version", "input_bucket", "output_bucket"].iter().enumerate() {
                keys[i].push(r.try_get(column).map_err(pg("decode daily aggregates"))?);
            }
            costs.push(new);
        }
    }
    report.rows_changed += costs.len() as u64;
    if !dry_run && !costs.is_empty() {
        let [lines, models, versions, inputs, outputs] = keys;
        sqlx::query(
            "UPDATE daily_aggregates a SET cost_usd = u.cost FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::float8[]) \
             AS u(business_line, model_name, model_version, input_bucket, output_bucket, cost) \
             WHERE a.day = $1 AND a.business_line = u.business_line AND a.model_name = u.model_name AND a.model_version = u.model_version \
             AND a.input_bucket = u.input_bucket AND a.output_bucket = u.output_bucket",
        )
        .bind(date)
        .bind(lines)
        .bind(models)
        .bind(versions)
        .bind(inputs)
        .bind(outputs)
        .bind(costs)
        .execute(&mut *tx)
        .await
        .map_err(pg("reprice daily aggregates"))?;
        // The series sum their groups' cost: rolled up again.
        roll_up_series(&mut tx, day).await?;
    }

    let rows = sqlx::query(
        "SELECT hour, business_line, model_name, model_version, requests, input_tokens, cache_prefix_tokens, output_tokens, cost_usd \
         FROM hourly_aggregates WHERE day = $1 FOR UPDATE",
    )
    .bind(date)
    .fetch_all(&mut *tx)
    .await
    .map_err(pg("read hourly aggregates"))?;
    let (mut hours, mut lines, mut models, mut versions, mut costs) =
        (Vec::<DateTime<Utc>>::new(), Vec::<String>::new(), Vec::new(), Vec::new(), Vec::new());
    for r in &rows {
        let p = priced(r).map_err(pg("decode hourly aggregates"))?;
        let new = prices.cost(&p.model, day, p.usage);
        if changed(p.cost, new) {
            hours.push(r.try_get("hour").map_err(pg("decode hourly aggregates"))?);
            lines.push(r.try_get::<String, _>("business_line").map_err(pg("decode hourly aggregates"))?);
            models.push(p.model);
            versions.push(r.try_get::<String, _>("model_version").map_err(pg("decode hourly aggregates"))?);
            costs.push(new);
        }
    }
    report.rows_changed += costs.len() as u64;
    if !dry_run && !costs.is_empty() {
        sqlx::query(
            "UPDATE hourly_aggregates a SET cost_usd = u.cost FROM unnest($2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::float8[]) \
             AS u(hour, business_line, model_name, model_version, cost) \
             WHERE a.day = $1 AND a.hour = u.hour AND a.business_line = u.business_line AND a.model_name = u.model_name \
             AND a.model_version = u.model_version",
        )
        .bind(date)
        .bind(hours)
        .bind(lines)
        .bind(models)
        .bind(versions)
        .bind(costs)
        .execute(&mut *tx)
        .await
        .map_err(pg("reprice hourly aggregates"))?;
    }

    if !dry_run && report.rows_changed > 0 {
        let entry = CostAuditEntry {
            day,
            action: "reprice",
            rows: report.rows_changed,
            unpriced_requests: report.unpriced_requests,
            cost_before: report.cost_before,
            cost_after: report.cost_after,
            prices: prices.digest().to_owned(),
            actor: "inferlog-compactor reprice",
            detail: None,
        };
        insert_cost_audit(&mut *tx, &entry).await?;
    }
    tx.commit().await.map_err(pg("commit reprice"))?;
    Ok(report)
}
