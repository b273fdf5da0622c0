//! The `capacity` view. In: the hourly facts of the range (and the daily
//! ones for each day's tier). Out: requests and tokens per UTC hour of day
//! and per weekday, the busiest minutes (each hour's peak minute per
//! business line × model × version, the top ten), tokens per day and the
//! trend of daily token volume (least-squares slope over the complete days
//! with traffic, and what it means per week; the day still running is
//! left out).

use std::collections::BTreeMap;

use crate::document::{Cell, Kind, Table};
use crate::facts::{Counts, Facts};
use crate::views::{minute_string, Context};

/// Busiest minutes listed.
pub const BUSIEST: usize = 10;

const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Monday = 0 of a day number (1970-01-01 was a Thursday).
pub fn weekday(day: i32) -> usize {
    (day + 3).rem_euclid(7) as usize
}

/// Least-squares slope of `points` (x, y); `None` with fewer than two x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

pub fn tables(facts: &Facts, ctx: &Context) -> Vec<Table> {
    let mut by_hour = [Counts::default(); 24];
    let mut by_weekday = [Counts::default(); 7];
    let mut by_day: BTreeMap<i32, Counts> = ctx.range.iter().map(|d| (d, Counts::default())).collect();
    let mut peaks = Vec::new();
    for (k, h) in facts.hours.iter().filter(|(k, _)| ctx.range.contains(k.hour.div_euclid(24) as i32)) {
        let day = k.hour.div_euclid(24) as i32;
        by_hour[k.hour.rem_euclid(24) as usize].add(&h.counts);
        by_weekday[weekday(day)].add(&h.counts);
        by_day.entry(day).or_default().add(&h.counts);
        peaks.push((h.peak_minute_requests, -h.peak_minute, k, h));
    }
    let total_requests: u64 = by_hour.iter().map(|c| c.totals.requests).sum();

    let mut hours = Table::new(
        "by_hour_of_day",
        "requests and tokens per UTC hour of day",
        &[("hour", "hour (UTC)"), ("requests", "requests"), ("tokens", "tokens"), ("request_share", "share")],
    );
    for (hour, c) in by_hour.iter().enumerate() {
        hours.push(vec![
            Cell::text(format!("{hour:02}:00")),
            Cell::count(c.totals.requests),
            Cell::count(c.tokens()),
            Cell::num((total_requests > 0).then(|| c.totals.requests as f64 / total_requests as f64), Kind::Share),
        ]);
    }

    let mut weekdays = Table::new(
        "by_weekday",
        "requests and tokens per weekday",
        &[("weekday", "weekday"), ("days", "days"), ("requests", "requests"), ("tokens", "tokens"), ("requests_per_day", "requests per day")],
    );
    for (i, name) in WEEKDAYS.iter().enumerate() {
        let days = ctx.range.iter().filter(|d| weekday(*d) == i).count() as u64;
        let c = &by_weekday[i];
        weekdays.push(vec![
            Cell::text(*name),
            Cell::count(days),
            Cell::count(c.totals.requests),
            Cell::count(c.tokens()),
            Cell::num((days > 0).then(|| c.totals.requests as f64 / days as f64), Kind::Rate),
        ]);
    }

    peaks.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
    let mut busiest = Table::new(
        "busiest_minutes",
        "busiest minutes (per business line, model and version)",
        &[
            ("minute", "minute (UTC)"),
            ("business_line", "business line"),
            ("model_name", "model"),
            ("model_version", "version"),
            ("requests", "requests"),
            ("tokens", "tokens"),
        ],
    );
    for (_, _, k, h) in peaks.into_iter().take(BUSIEST) {
        busiest.push(vec![
            Cell::text(minute_string(h.peak_minute)),
            Cell::text(k.business_line.clone()),
            Cell::text(k.model_name.clone()),
            Cell::text(k.model_version.clone()),
            Cell::count(h.peak_minute_requests),
            Cell::count(h.peak_minute_tokens),
        ]);
    }

    let mut daily = Table::new("daily_tokens", "tokens per day", &[("day", "day"), ("tier", "tier"), ("requests", "requests"), ("tokens", "tokens")]);
    let mut points = Vec::new();
    for (day, c) in &by_day {
        daily.push(vec![
            Cell::text(inferlog_store::day_string(*day)),
            Cell::text(facts.tier(*day).as_str()),
            Cell::count(c.totals.requests),
            Cell::count(c.tokens()),
        ]);
        let complete = (i64::from(*day) + 1) * 86_400_000 <= ctx.now_ms;
        if c.totals.requests > 0 && complete {
            points.push((f64::from(*day), c.tokens() as f64));
        }
    }
    let mean = (!points.is_empty()).then(|| points.iter().map(|p| p.1).sum::<f64>() / points.len() as f64);
    let per_day = slope(&points);
    let mut trend = Table::new(
        "token_trend",
        "trend of daily token volume (least squares over the complete days with traffic)",
        &[("days", "days"), ("mean_tokens_per_day", "mean tokens/day"), ("slope_tokens_per_day", "change per day"), ("weekly_change", "per week")],
    );
    trend.push(vec![
        Cell::count(points.len() as u64),
        Cell::num(mean, Kind::Rate),
        Cell::num(per_day, Kind::Rate),
        Cell::num(per_day.zip(mean).filter(|(_, m)| *m > 0.0).map(|(s, m)| 7.0 * s / m), Kind::Change),
    ]);
    vec![hours, weekdays, busiest, daily, trend]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weekdays_and_slopes() {
        assert_eq!(WEEKDAYS[weekday(0)], "Thursday");
        assert_eq!(WEEKDAYS[weekday(inferlog_store::parse_day("2026-12-01").expect("day"))], "Tuesday");
        assert_eq!(slope(&[(1.0, 10.0), (2.0, 20.0), (3.0, 30.0)]), Some(10.0));
        assert_eq!(slope(&[(1.0, 10.0)]), None);
    }
}
