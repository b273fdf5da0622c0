//! The aggregates tier as a source of facts. In: the days routed to
//! Postgres and the filter. Out: [`Facts`] read from `daily_aggregates`,
//! `hourly_aggregates` (when the view shows hours; TTFT and TPOT
//! histograms only), `daily_errors`, and `daily_waste` with
//! `daily_outputs` (when the view counts waste, and no model filter is
//! set: they are kept per business line), with the cost stored when the
//! day was aggregated (or last repriced). Hashed users and prompts are not
//! kept there.

use std::collections::BTreeMap;

use inferlog_schema::histogram::Histogram;
use inferlog_store::catalog::{date_of, day_of, Catalog};
use inferlog_store::{Day, StoreError};
use sqlx::Row as _;

use inferlog_store::model::aggregates::{hist_column, DAILY_COUNTS, DAILY_KEY, ERROR_COLUMNS, OUTPUT_COLUMNS, WASTE_COLUMNS};
use inferlog_store::model::fold::Totals;
use inferlog_store::model::measures::MEASURES;
use inferlog_store::model::waste::{LineWaste, TypeWaste, Waste};

use crate::error::ReportError;
use crate::facts::{Counts, ErrorFacts, ErrorKey, Facts, GroupFacts, GroupKey, HourFacts, HourKey, Tier, TPOT, TTFT};
use crate::source::{Filter, Reads};

/// The filter of every query: `$1` the days, `$2` the business line, `$3` the model (NULL: any).
const WHERE: &str = "WHERE day = ANY($1) AND ($2::text IS NULL OR business_line = $2) AND ($3::text IS NULL OR model_name = $3)";

fn pg(operation: &'static str) -> impl Fn(sqlx::Error) -> ReportError {
    move |e| ReportError::Store(StoreError::postgres(operation)(e))
}

/// A stored histogram (NULL: no request carried the measure).
fn histogram(encoded: Option<Vec<i64>>, column: &str) -> Result<Option<Histogram>, ReportError> {
    encoded.map(|e| Histogram::decode(&e)).transpose().map_err(|e| ReportError::Data(format!("{column}: {e}")))
}

/// A stored count (`bigint`; a negative one, which no writer stores, as 0).
fn count(row: &sqlx::postgres::PgRow, column: &str) -> Result<u64, sqlx::Error> {
    row.try_get::<i64, _>(column).map(|v| v.max(0) as u64)
}

/// The counts of a stored row; `cost_usd` NULL means unpriced.
fn counts(row: &sqlx::postgres::PgRow, cache_hits: bool) -> Result<Counts, sqlx::Error> {
    let n = |c: &str| count(row, c);
    let mut counts = Counts::from(Totals {
        requests: n("requests")?,
        errors: n("errors")?,
        input_tokens: n("input_tokens")?,
        output_tokens: n("output_tokens")?,
        cache_hits: if cache_hits { n("cache_hits")? } else { 0 },
        cache_prefix_tokens: n("cache_prefix_tokens")?,
    });
    counts.price(row.try_get::<Option<f64>, _>("cost_usd")?);
    Ok(counts)
}

/// Runs one of the reads: `sql` filtered by [`WHERE`].
async fn fetch(
    catalog: &Catalog,
    sql: &str,
    dates: &[chrono::NaiveDate],
    filter: &Filter,
    operation: &'static str,
) -> Result<Vec<sqlx::postgres::PgRow>, ReportError> {
    sqlx::query(sql).bind(dates).bind(&filter.business_line).bind(&filter.model).fetch_all(catalog.pool()).await.map_err(pg(operation))
}

/// The columns a daily row and an error row share: day, business line, model, version, input bucket.
fn common(row: &sqlx::postgres::PgRow) -> Result<(Day, String, String, String, String), sqlx::Error> {
    Ok((
        day_of(row.try_get("day")?),
        row.try_get("business_line")?,
        row.try_get("model_name")?,
        row.try_get("model_version")?,
        row.try_get("input_bucket")?,
    ))
}

/// An hour's load per minute from its two arrays (`None`: an hour
/// aggregated before minutes were kept, or arrays not of 60 minutes).
fn minutes(requests: Option<Vec<i64>>, tokens: Option<Vec<i64>>) -> Option<[(u64, u64); 60]> {
    let (requests, tokens) = (requests?, tokens?);
    if requests.len() != 60 || tokens.len() != 60 {
        return None;
    }
    Some(std::array::from_fn(|i| (requests[i].max(0) as u64, tokens[i].max(0) as u64)))
}

/// The hourly histograms a report shows (TTFT and TPOT per hour); the
/// others stay in Postgres (they are most of the hourly rows' bytes).
const HOURLY_HISTOGRAMS: [usize; 2] = [TTFT, TPOT];

/// The filter of the waste tables: they keep no model, so a model filter reads none of their rows.
const WASTE_WHERE: &str = "WHERE day = ANY($1) AND ($2::text IS NULL OR business_line = $2) AND $3::text IS NULL";

/// Reads `days` from the aggregates tier; the hourly rows and the waste only when `reads` asks.
pub async fn load(catalog: &Catalog, days: &[Day], filter: &Filter, reads: Reads) -> Result<Facts, ReportError> {
    let mut facts = Facts { tiers: days.iter().map(|&d| (d, Tier::Aggregates)).collect(), ..Facts::default() };
    if days.is_empty() {
        return Ok(facts);
    }
    let dates: Vec<chrono::NaiveDate> = days.iter().map(|&d| date_of(d)).collect();
    let hist_columns: Vec<String> = (0..MEASURES.len()).map(hist_column).collect();
    let hists = hist_columns.join(", ");

    let sql = format!("SELECT {}, {}, {hists} FROM daily_aggregates {WHERE}", DAILY_KEY.join(", "), DAILY_COUNTS.join(", "));
    let rows = fetch(catalog, &sql, &dates, filter, "read daily aggregates").await?;
    for row in rows {
        let read = || -> Result<(GroupKey, Counts), sqlx::Error> {
            let (day, business_line, model_name, model_version, input_bucket) = common(&row)?;
            let key = GroupKey { day, business_line, model_name, model_version, input_bucket, output_bucket: row.try_get("output_bucket")? };
            Ok((key, counts(&row, true)?))
        };
        let (key, counts) = read().map_err(pg("read daily aggregates"))?;
        let mut group = GroupFacts { counts, ..GroupFacts::default() };
        for (i, column) in hist_columns.iter().enumerate() {
            group.hists[i] = histogram(row.try_get(column.as_str()).map_err(pg("read daily aggregates"))?, column)?;
        }
        facts.groups.insert(key, group);
    }

    let sql = format!(
        "SELECT (extract(epoch FROM hour) / 3600)::bigint AS hour_number, business_line, model_name, model_version, requests, errors, \
         input_tokens, output_tokens, cache_prefix_tokens, cost_usd, (extract(epoch FROM peak_minute) / 60)::bigint AS peak_minute_number, \
         peak_minute_requests, peak_minute_tokens, minute_requests, minute_tokens, {} FROM hourly_aggregates {WHERE}",
        HOURLY_HISTOGRAMS.map(hist_column).join(", ")
    );
    let rows = if reads.hours { fetch(catalog, &sql, &dates, filter, "read hourly aggregates").await? } else { Vec::new() };
    for row in rows {
        let read = || -> Result<(HourKey, HourFacts), sqlx::Error> {
            let key = HourKey {
                hour: row.try_get("hour_number")?,
                business_line: row.try_get("business_line")?,
                model_name: row.try_get("model_name")?,
                model_version: row.try_get("model_version")?,
            };
            let hour = HourFacts {
                counts: counts(&row, false)?,
                peak_minute: row.try_get("peak_minute_number")?,
                peak_minute_requests: count(&row, "peak_minute_requests")?,
                peak_minute_tokens: count(&row, "peak_minute_tokens")?,
                minutes: minutes(row.try_get("minute_requests")?, row.try_get("minute_tokens")?),
                hists: Default::default(),
            };
            Ok((key, hour))
        };
        let (key, mut hour) = read().map_err(pg("read hourly aggregates"))?;
        for i in HOURLY_HISTOGRAMS {
            let column = hist_column(i);
            hour.hists[i] = histogram(row.try_get(column.as_str()).map_err(pg("read hourly aggregates"))?, &column)?;
        }
        facts.hours.insert(key, hour);
    }

    let sql = format!("SELECT {} FROM daily_errors {WHERE}", ERROR_COLUMNS.join(", "));
    let rows = fetch(catalog, &sql, &dates, filter, "read error counts").await?;
    for row in rows {
        let read = || -> Result<(ErrorKey, ErrorFacts), sqlx::Error> {
            let (day, business_line, model_name, model_version, input_bucket) = common(&row)?;
            let key = ErrorKey {
                day,
                business_line,
                model_name,
                model_version,
                input_bucket,
                error_code: row.try_get("error_code")?,
                error_stage: row.try_get("error_stage")?,
            };
            Ok((key, ErrorFacts { name: row.try_get("error_name")?, errors: count(&row, "errors")? }))
        };
        let (key, error) = read().map_err(pg("read error counts"))?;
        facts.errors.insert(key, error);
    }
    if reads.waste {
        facts.waste = waste(catalog, &dates, filter).await?;
    }
    Ok(facts)
}

/// A row of `daily_outputs`: its day, (business line, request type), the
/// stored histogram and the counts.
type OutputRow = (Day, (String, String), Option<Vec<i64>>, TypeWaste);

/// The waste of the days that have it (days aggregated before it was
/// counted have none): per line, and per line × request type.
async fn waste(catalog: &Catalog, dates: &[chrono::NaiveDate], filter: &Filter) -> Result<BTreeMap<Day, Waste>, ReportError> {
    let mut days: BTreeMap<Day, Waste> = BTreeMap::new();
    let sql = format!("SELECT {} FROM daily_waste {WASTE_WHERE}", WASTE_COLUMNS.join(", "));
    for row in fetch(catalog, &sql, dates, filter, "read waste").await? {
        let read = || -> Result<(Day, String, LineWaste), sqlx::Error> {
            let n = |c: &str| count(&row, c);
            let line = LineWaste {
                requests: n("requests")?,
                tokens: n("tokens")?,
                input_tokens: n("input_tokens")?,
                hashed: n("hashed")?,
                repeats: n("repeats")?,
                repeat_tokens: n("repeat_tokens")?,
                repeat_uncached_input: n("repeat_uncached_input")?,
            };
            Ok((day_of(row.try_get("day")?), row.try_get("business_line")?, line))
        };
        let (day, business_line, line) = read().map_err(pg("read waste"))?;
        days.entry(day).or_default().lines.insert(business_line, line);
    }
    let sql = format!("SELECT {} FROM daily_outputs {WASTE_WHERE}", OUTPUT_COLUMNS.join(", "));
    for row in fetch(catalog, &sql, dates, filter, "read output lengths").await? {
        let read = || -> Result<OutputRow, sqlx::Error> {
            let n = |c: &str| count(&row, c);
            let t = TypeWaste {
                requests: n("requests")?,
                output_tokens: n("output_tokens")?,
                limited: n("limited")?,
                at_limit: n("at_limit")?,
                at_limit_tokens: n("at_limit_tokens")?,
                ..TypeWaste::default()
            };
            let key = (row.try_get("business_line")?, row.try_get("request_type")?);
            Ok((day_of(row.try_get("day")?), key, row.try_get("output_hist")?, t))
        };
        let (day, key, hist, mut t) = read().map_err(pg("read output lengths"))?;
        t.outputs = histogram(hist, "output_hist")?.unwrap_or_default();
        days.entry(day).or_default().types.insert(key, t);
    }
    Ok(days)
}

/// The days of `from..=to` the aggregates tier holds.
pub async fn days(catalog: &Catalog, from: Day, to: Day) -> Result<Vec<Day>, ReportError> {
    let rows = sqlx::query("SELECT DISTINCT day FROM daily_aggregates WHERE day BETWEEN $1 AND $2 ORDER BY day")
        .bind(date_of(from))
        .bind(date_of(to))
        .fetch_all(catalog.pool())
        .await
        .map_err(pg("list aggregated days"))?;
    rows.iter().map(|r| r.try_get("day").map(day_of)).collect::<Result<_, _>>().map_err(pg("list aggregated days"))
}
