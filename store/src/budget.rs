//! Monthly budgets per business line. In: the `[budgets]` table and the
//! daily cost and token sums of `daily_aggregates`. Out: per business line
//! the month's spend, its budget, the share used and the month-end forecast
//! at the current rate — what `inferlog-report budget` prints and the
//! compactor exports as `inferlog_budget_used_ratio` and
//! `inferlog_budget_forecast_ratio`.
//!
//! The month is the month of the last closed day (the day before `as_of`),
//! so on the 1st the report shows the month just ended, complete. Spend
//! counts the days the aggregates cover, and the forecast runs at the rate
//! of those days, not of the calendar days elapsed: a compactor behind by
//! two days leaves the spend "through the last aggregated day" and the
//! forecast unbiased. A line without a configured budget gets the rule
//! cost owners use: `default_factor` (1.2) times its daily average over
//! the 30 days before the month began, counted from the line's own first
//! day there (a line that started a week ago is not averaged over a
//! month), among the days the aggregates cover, times the month's days;
//! in USD when that history carries a cost, in tokens otherwise. A line
//! with no such history has no budget, and says so.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{Datelike, NaiveDate};
use serde::{Deserialize, Serialize};
use sqlx::Row as _;

use crate::catalog::{date_of, day_of, Catalog};
use crate::{Day, StoreError};

/// Days of history behind a default budget.
pub const HISTORY_DAYS: i32 = 30;

/// The share of a budget at which a line is reported (and alerted on).
pub const ALERT_RATIO: f64 = 0.9;

/// The `[budgets]` table: a monthly budget per business line, as
/// `[budgets.lines.<line>]` with `monthly_usd` or `monthly_tokens` (input
/// plus output). A line without one gets `default_factor` times its daily
/// average over the 30 days before the month, times the month's days.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetsConfig {
    /// The budget of a line without its own: this factor times its daily
    /// average over the 30 days before the month, times the month's days. Default: 1.2.
    pub default_factor: f64,
    /// Monthly budgets by business line, as `[budgets.lines.<line>]` with
    /// `monthly_usd` or `monthly_tokens`. Default: none.
    pub lines: BTreeMap<String, LineBudget>,
}

impl Default for BudgetsConfig {
    fn default() -> Self {
        BudgetsConfig { default_factor: 1.2, lines: BTreeMap::new() }
    }
}

/// One business line's monthly budget: exactly one of the two.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LineBudget {
    /// USD per calendar month (UTC). Default: unset.
    #[serde(default)]
    pub monthly_usd: Option<f64>,
    /// Input plus output tokens per calendar month (UTC). Default: unset.
    #[serde(default)]
    pub monthly_tokens: Option<u64>,
}

impl BudgetsConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        if !self.default_factor.is_finite() || self.default_factor <= 0.0 {
            return Err(StoreError::Config(format!("budgets.default_factor must be > 0, got {}", self.default_factor)));
        }
        for (line, b) in &self.lines {
            match (b.monthly_usd, b.monthly_tokens) {
                (Some(usd), None) if usd.is_finite() && usd > 0.0 => {}
                (None, Some(tokens)) if tokens > 0 => {}
                (Some(_), Some(_)) | (None, None) => {
                    return Err(StoreError::Config(format!("budgets.lines.{line}: set exactly one of monthly_usd and monthly_tokens")))
                }
                _ => return Err(StoreError::Config(format!("budgets.lines.{line}: the budget must be > 0"))),
            }
        }
        Ok(())
    }
}

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Usd,
    /// Input plus output tokens.
    Tokens,
}

/// Where a line's budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    Configured,
    /// `default_factor` × the 30 days' daily average.
    Default,
    /// No budget configured and no history to derive one.
    None,
}

/// One business line's day, as the aggregates hold it.
#[derive(Debug, Clone, PartialEq)]
pub struct DailySpend {
    pub day: Day,
    pub business_line: String,
    /// Priced cost; `None` when no request of the day was priced.
    pub cost_usd: Option<f64>,
    pub tokens: u64,
    pub unpriced_requests: u64,
}

/// One business line's month.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetStatus {
    pub business_line: String,
    /// `YYYY-MM`.
    pub month: String,
    pub unit: Unit,
    pub basis: Basis,
    /// Spent this month through the last closed day, in `unit`.
    pub spent: f64,
    pub budget: Option<f64>,
    pub used_ratio: Option<f64>,
    /// `spent` per covered day times the month's days.
    pub forecast: f64,
    pub forecast_ratio: Option<f64>,
    /// Closed days of the month so far, and the month's days.
    pub days_elapsed: u32,
    pub days_in_month: u32,
    /// Closed days of the month the aggregates cover (any line): the days
    /// `spent` counts; fewer than `days_elapsed` while the compactor is behind.
    pub days_covered: u32,
    /// Requests of the month no price covered (their tokens count, their cost does not).
    pub unpriced_requests: u64,
}

impl BudgetStatus {
    /// Whether the line has used [`ALERT_RATIO`] of its budget or more.
    pub fn over_alert(&self) -> bool {
        self.used_ratio.is_some_and(|r| r >= ALERT_RATIO)
    }
}

/// The month a report as of `as_of` covers: (first day, days elapsed, days in month).
pub fn month_of(as_of: Day) -> (Day, u32, u32) {
    let last_closed = date_of(as_of - 1);
    let first = last_closed.with_day(1).unwrap_or(last_closed);
    let next = if first.month() == 12 {
        NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
    }
    .unwrap_or(first);
    (day_of(first), last_closed.day(), (next - first).num_days() as u32)
}

/// Every business line's budget status as of `as_of` (a day number; the
/// days before it are closed), from `daily` (covering at least the month
/// and the [`HISTORY_DAYS`] before it).
pub fn evaluate(config: &BudgetsConfig, as_of: Day, daily: &[DailySpend]) -> Vec<BudgetStatus> {
    let (first, elapsed, days_in_month) = month_of(as_of);
    let month = crate::day_string(first)[..7].to_owned();
    let history = (first - HISTORY_DAYS)..first;
    let covered: BTreeSet<Day> = daily.iter().filter(|d| history.contains(&d.day)).map(|d| d.day).collect();
    let covered_now = daily.iter().filter(|d| d.day >= first && d.day < as_of).map(|d| d.day).collect::<BTreeSet<Day>>().len() as u32;
    let mut lines: BTreeSet<&str> = daily.iter().filter(|d| d.day >= first && d.day < as_of).map(|d| d.business_line.as_str()).collect();
    lines.extend(config.lines.keys().map(String::as_str));
    let mut out = Vec::new();
    for line in lines {
        let of_line = || daily.iter().filter(move |d| d.business_line == line);
        let past_cost: Option<f64> = of_line().filter(|d| history.contains(&d.day)).filter_map(|d| d.cost_usd).reduce(|a, b| a + b);
        let past_tokens: u64 = of_line().filter(|d| history.contains(&d.day)).map(|d| d.tokens).sum();
        let configured = config.lines.get(line);
        let (unit, basis, budget) = match configured {
            Some(LineBudget { monthly_usd: Some(usd), .. }) => (Unit::Usd, Basis::Configured, Some(*usd)),
            Some(LineBudget { monthly_tokens: Some(tokens), .. }) => (Unit::Tokens, Basis::Configured, Some(*tokens as f64)),
            _ => {
                // The line's own days: from its first day in the history on.
                let since = of_line().filter(|d| history.contains(&d.day)).map(|d| d.day).min().unwrap_or(first);
                let scale = config.default_factor * f64::from(days_in_month) / covered.range(since..).count().max(1) as f64;
                match past_cost {
                    Some(cost) if cost > 0.0 => (Unit::Usd, Basis::Default, Some(cost * scale)),
                    _ if past_tokens > 0 => (Unit::Tokens, Basis::Default, Some(past_tokens as f64 * scale)),
                    // No budget: shown in USD when anything of the month is priced.
                    _ => {
                        let priced = of_line().any(|d| d.day >= first && d.day < as_of && d.cost_usd.is_some());
                        (if priced { Unit::Usd } else { Unit::Tokens }, Basis::None, None)
                    }
                }
            }
        };
        let this_month = || of_line().filter(|d| d.day >= first && d.day < as_of);
        let spent = match unit {
            Unit::Usd => this_month().filter_map(|d| d.cost_usd).sum::<f64>(),
            Unit::Tokens => this_month().map(|d| d.tokens).sum::<u64>() as f64,
        };
        let forecast = spent / f64::from(covered_now.max(1)) * f64::from(days_in_month);
        out.push(BudgetStatus {
            business_line: line.to_owned(),
            month: month.clone(),
            unit,
            basis,
            spent,
            budget,
            used_ratio: budget.map(|b| spent / b),
            forecast,
            forecast_ratio: budget.map(|b| forecast / b),
            days_elapsed: elapsed,
            days_in_month,
            days_covered: covered_now,
            unpriced_requests: this_month().map(|d| d.unpriced_requests).sum(),
        });
    }
    out
}

/// Reads the daily sums [`evaluate`] needs from the catalog and evaluates.
pub async fn status(catalog: &Catalog, config: &BudgetsConfig, as_of: Day) -> Result<Vec<BudgetStatus>, StoreError> {
    let (first, _, _) = month_of(as_of);
    let rows = sqlx::query(
        "SELECT day, business_line, sum(cost_usd) AS cost_usd, sum(input_tokens + output_tokens)::bigint AS tokens, \
         (coalesce(sum(requests) FILTER (WHERE cost_usd IS NULL), 0))::bigint AS unpriced \
         FROM daily_aggregates WHERE day >= $1 AND day < $2 GROUP BY day, business_line",
    )
    .bind(date_of(first - HISTORY_DAYS))
    .bind(date_of(as_of))
    .fetch_all(catalog.pool())
    .await
    .map_err(StoreError::postgres("read daily spend"))?;
    let decode = |r: &sqlx::postgres::PgRow| -> Result<DailySpend, sqlx::Error> {
        Ok(DailySpend {
            day: day_of(r.try_get::<NaiveDate, _>("day")?),
            business_line: r.try_get("business_line")?,
            cost_usd: r.try_get("cost_usd")?,
            tokens: r.try_get::<i64, _>("tokens")? as u64,
            unpriced_requests: r.try_get::<i64, _>("unpriced")? as u64,
        })
    };
    let daily = rows.iter().map(decode).collect::<Result<Vec<_>, _>>().map_err(StoreError::postgres("decode daily spend"))?;
    Ok(evaluate(config, as_of, &daily))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(text: &str) -> Day {
        crate::parse_day(text).expect("date")
    }

    fn spend(d: &str, line: &str, cost: Option<f64>, tokens: u64) -> DailySpend {
        DailySpend { day: day(d), business_line: line.into(), cost_usd: cost, tokens, unpriced_requests: u64::from(cost.is_none()) }
    }

    #[test]
    fn the_month_is_the_month_of_the_last_closed_day() {
        assert_eq!(month_of(day("2026-11-15")), (day("2026-11-01"), 14, 30));
        assert_eq!(month_of(day("2026-12-01")), (day("2026-11-01"), 30, 30), "on the 1st: the month just ended");
        assert_eq!(month_of(day("2027-01-01")), (day("2026-12-01"), 31, 31));
        assert_eq!(month_of(day("2028-03-01")), (day("2028-02-01"), 29, 29), "leap year");
    }

    #[test]
    fn configured_budgets_give_used_share_and_forecast() {
        let mut config = BudgetsConfig::default();
        config.lines.insert("search".into(), LineBudget { monthly_usd: Some(300.0), monthly_tokens: None });
        config.lines.insert("chat".into(), LineBudget { monthly_usd: None, monthly_tokens: Some(3000) });
        config.validate().expect("valid");
        // As of Nov 11: ten closed days of November.
        let daily: Vec<DailySpend> = (1..=10)
            .flat_map(|d| {
                let date = format!("2026-11-{d:02}");
                [spend(&date, "search", Some(20.0), 100), spend(&date, "chat", None, 50)]
            })
            .chain([spend("2026-11-11", "search", Some(1000.0), 1)])
            .collect();
        let status = evaluate(&config, day("2026-11-11"), &daily);
        let search = status.iter().find(|s| s.business_line == "search").expect("search");
        assert_eq!(
            (search.unit, search.basis, search.spent, search.budget),
            (Unit::Usd, Basis::Configured, 200.0, Some(300.0)),
            "today is not closed"
        );
        assert!((search.used_ratio.expect("budget") - 2.0 / 3.0).abs() < 1e-12);
        assert!((search.forecast - 600.0).abs() < 1e-9, "20 a day for 30 days");
        assert!((search.forecast_ratio.expect("budget") - 2.0).abs() < 1e-12);
        assert!(!search.over_alert());
        let chat = status.iter().find(|s| s.business_line == "chat").expect("chat");
        assert_eq!((chat.unit, chat.spent, chat.unpriced_requests), (Unit::Tokens, 500.0, 10), "unpriced requests are still counted in tokens");
        assert!((chat.forecast_ratio.expect("budget") - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_line_without_budget_gets_120_percent_of_its_history() {
        let config = BudgetsConfig::default();
        // October: 10 covered days at 3 USD a day (the other 21 days hold nothing at all).
        let mut daily: Vec<DailySpend> = (22..=31).map(|d| spend(&format!("2026-10-{d:02}"), "search", Some(3.0), 10)).collect();
        daily.extend((1..=9).map(|d| spend(&format!("2026-11-{d:02}"), "search", Some(4.0), 10)));
        daily.push(spend("2026-11-03", "newcomer", Some(1.0), 10));
        daily.push(spend("2026-10-30", "tokens-only", None, 40));
        daily.push(spend("2026-11-02", "tokens-only", None, 100));
        let status = evaluate(&config, day("2026-11-10"), &daily);
        let search = status.iter().find(|s| s.business_line == "search").expect("search");
        // 1.2 x 3 USD/day x 30 days = 108 USD.
        assert_eq!((search.unit, search.basis), (Unit::Usd, Basis::Default));
        assert!((search.budget.expect("derived") - 108.0).abs() < 1e-9, "{search:?}");
        assert!((search.spent - 36.0).abs() < 1e-9);
        assert!((search.forecast - 120.0).abs() < 1e-9);
        let newcomer = status.iter().find(|s| s.business_line == "newcomer").expect("newcomer");
        assert_eq!((newcomer.basis, newcomer.budget, newcomer.used_ratio), (Basis::None, None, None), "no history, no budget");
        assert_eq!((newcomer.unit, newcomer.spent), (Unit::Usd, 1.0), "shown in USD: its month is priced");
        let tokens = status.iter().find(|s| s.business_line == "tokens-only").expect("tokens-only");
        assert_eq!((tokens.unit, tokens.basis, tokens.spent), (Unit::Tokens, Basis::Default, 100.0));
        assert!((tokens.budget.expect("derived") - 1.2 * 20.0 * 30.0).abs() < 1e-9, "40 tokens over its own 2 days (Oct 30, 31), not 10");
    }

    #[test]
    fn a_compactor_behind_leaves_the_forecast_at_the_rate_of_the_days_covered() {
        let mut config = BudgetsConfig::default();
        config.lines.insert("search".into(), LineBudget { monthly_usd: Some(300.0), monthly_tokens: None });
        // As of Nov 11 ten days are closed, but only Nov 1-8 are aggregated.
        let daily: Vec<DailySpend> = (1..=8).map(|d| spend(&format!("2026-11-{d:02}"), "search", Some(5.0), 10)).collect();
        let search = evaluate(&config, day("2026-11-11"), &daily).pop().expect("search");
        assert_eq!((search.days_elapsed, search.days_covered, search.spent), (10, 8, 40.0));
        assert!((search.forecast - 150.0).abs() < 1e-9, "5 a day for 30 days, not 4: {}", search.forecast);
        assert!((search.forecast_ratio.expect("budget") - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_line_new_in_the_history_is_averaged_over_its_own_days() {
        // "old" has spent 2 USD a day for 30 days; "new" began on Oct 25 at 6 USD a day.
        let mut daily: Vec<DailySpend> = (2..=31).map(|d| spend(&format!("2026-10-{d:02}"), "old", Some(2.0), 1)).collect();
        daily.extend((25..=31).map(|d| spend(&format!("2026-10-{d:02}"), "new", Some(6.0), 1)));
        daily.extend(
            (1..=8).flat_map(|d| [spend(&format!("2026-11-{d:02}"), "new", Some(6.0), 1), spend(&format!("2026-11-{d:02}"), "old", Some(2.0), 1)]),
        );
        let status = evaluate(&BudgetsConfig::default(), day("2026-11-09"), &daily);
        let new = status.iter().find(|s| s.business_line == "new").expect("new");
        assert!((new.budget.expect("derived") - 1.2 * 6.0 * 30.0).abs() < 1e-9, "{new:?}");
        assert!(!new.over_alert(), "8 days at its usual rate are not 90% of its month: {new:?}");
        let old = status.iter().find(|s| s.business_line == "old").expect("old");
        assert!((old.budget.expect("derived") - 1.2 * 2.0 * 30.0).abs() < 1e-9, "{old:?}");
    }

    #[test]
    fn bad_budgets_are_named() {
        let mut config = BudgetsConfig::default();
        config.lines.insert("search".into(), LineBudget { monthly_usd: Some(1.0), monthly_tokens: Some(1) });
        assert!(config.validate().expect_err("both").to_string().contains("budgets.lines.search: set exactly one"));
        config.lines.insert("search".into(), LineBudget { monthly_usd: Some(-1.0), monthly_tokens: None });
        assert!(config.validate().expect_err("negative").to_string().contains("must be > 0"));
        let zero = BudgetsConfig { default_factor: 0.0, ..BudgetsConfig::default() };
        assert!(zero.validate().expect_err("zero").to_string().contains("default_factor"));
    }
}
