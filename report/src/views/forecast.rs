//! `capacity --forecast`: when do we run out? In: the hourly facts of the
//! range (each hour's load minute by minute and its TTFT histogram) and
//! the TTFT threshold. Out, for the fleet and for each model:
//!
//! - the per-minute load: every minute of the range's complete hours
//!   summed over the series (exact: a minute's sum, not a sum of the
//!   series' own busiest minutes), its p50 / p99 / max;
//! - the knee: the load at which p99 TTFT crosses the threshold. The
//!   hours are put in ten equal-count bins by their busiest minute's load;
//!   each bin's p99 TTFT comes from its merged histograms; the knee is
//!   where the piecewise-linear curve through the bins (mean load, p99)
//!   first reaches the threshold. It is not extrapolated past the highest
//!   bin: "not reached" says up to which load it held;
//! - the forecast: daily requests grow exponentially at the rate of a
//!   least-squares fit of ln(requests) over the complete days; the next 7
//!   days' expected peak is the range's p99 per-minute load (the seed's
//!   planning figure) grown from the middle of the range to 7 days past its
//!   end; days until the knee is when today's p99 per-minute load, grown
//!   at that rate, reaches it.

use std::collections::BTreeMap;

use inferlog_schema::histogram::Histogram;

use crate::document::{Cell, Kind, Table};
use crate::facts::{Facts, TTFT};
use crate::views::{capacity::slope, floor_rank as rank, minute_string, Context};

/// The p99 TTFT (ms) the knee is the load of, unless `--knee-ttft-ms` says otherwise.
pub const DEFAULT_KNEE_TTFT_MS: u32 = 2000;
/// Bins of hours by load.
pub const BINS: usize = 10;
/// Days `capacity --forecast` reads when `--from` is not given.
pub const FIT_DAYS: i32 = 30;
/// Days ahead of the expected peak.
pub const AHEAD_DAYS: f64 = 7.0;

/// One scope's hours: per minute its requests and tokens, and per hour its TTFT histogram.
#[derive(Debug, Default)]
struct Scope {
    minutes: BTreeMap<i64, (u64, u64)>,
    hours: BTreeMap<i64, Histogram>,
    /// Hours of the scope whose minutes are unknown (aggregated before minutes were kept).
    without_minutes: usize,
}

/// A crossing of the threshold, or why there is none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Knee {
    /// The load (requests per minute) where the curve reaches the threshold.
    At(f64),
    /// Already at or above the threshold in the lowest bin (up to this load).
    Below(f64),
    /// Not reached up to this load (the highest bin's).
    NotReached(f64),
}

/// The knee of `curve` ((mean load, p99) per bin, by load) at `threshold`.
pub fn knee(curve: &[(f64, f64)], threshold: f64) -> Option<Knee> {
    let first = curve.iter().position(|(_, p99)| *p99 >= threshold);
    match first {
        None => curve.last().map(|(load, _)| Knee::NotReached(*load)),
        Some(0) => Some(Knee::Below(curve[0].0)),
        Some(i) => {
            let ((x0, y0), (x1, y1)) = (curve[i - 1], curve[i]);
            Some(Knee::At(x0 + (threshold - y0) * (x1 - x0) / (y1 - y0)))
        }
    }
}

/// The curve of `hours` ((busiest minute's load, TTFT histogram)): ten
/// equal-count bins by load, each (mean load, p99 TTFT of its merged
/// histograms); bins without TTFT are left out.
pub fn curve(mut hours: Vec<(u64, &Histogram)>) -> Vec<(f64, f64)> {
    hours.sort_by_key(|(load, _)| *load);
    let size = hours.len().div_ceil(BINS).max(1);
    hours
        .chunks(size)
        .filter_map(|bin| {
            let mut merged = Histogram::new();
            bin.iter().for_each(|(_, h)| merged.merge(h));
            let load = bin.iter().map(|(l, _)| *l as f64).sum::<f64>() / bin.len() as f64;
            merged.quantile(0.99).map(|p99| (load, p99))
        })
        .collect()
}

/// The daily growth of `daily` (day, requests): e^slope of ln(requests) per day, and the days' mean.
pub fn growth(daily: &[(i32, u64)]) -> Option<(f64, f64)> {
    let points: Vec<(f64, f64)> = daily.iter().filter(|(_, n)| *n > 0).map(|(d, n)| (f64::from(*d), (*n as f64).ln())).collect();
    let rate = slope(&points)?;
    Some((rate, points.iter().map(|p| p.0).sum::<f64>() / points.len() as f64))
}

pub fn tables(facts: &Facts, ctx: &Context, threshold_ms: u32, notes: &mut Vec<String>) -> Vec<Table> {
    let first = i64::from(ctx.range.from) * 24;
    let last = ((i64::from(ctx.range.to) + 1) * 24).min(ctx.now_ms.div_euclid(3_600_000));
    // Every complete hour of an answered day, in every scope: a minute without traffic is a load of 0.
    let answered: Vec<i64> = (first..last).filter(|h| facts.tier(h.div_euclid(24) as i32) != crate::facts::Tier::None).collect();
    let mut scopes: BTreeMap<String, Scope> = BTreeMap::new();
    let mut daily: BTreeMap<i32, u64> = BTreeMap::new();
    for (k, h) in facts.hours.iter().filter(|(k, _)| (first..last).contains(&k.hour)) {
        *daily.entry(k.hour.div_euclid(24) as i32).or_default() += h.counts.totals.requests;
        for scope in ["fleet".to_owned(), k.model_name.clone()] {
            let s = scopes.entry(scope).or_default();
            match &h.minutes {
                Some(minutes) => {
                    for (i, (requests, tokens)) in minutes.iter().enumerate() {
                        let m = s.minutes.entry(k.hour * 60 + i as i64).or_default();
                        m.0 += requests;
                        m.1 += tokens;
                    }
                }
                None => s.without_minutes += 1,
            }
            if let Some(ttft) = &h.hists[TTFT] {
                s.hours.entry(k.hour).or_default().merge(ttft);
            }
        }
    }
    let complete_days: Vec<(i32, u64)> = daily.into_iter().filter(|(d, _)| (i64::from(*d) + 1) * 24 <= last).collect();
    let growth = growth(&complete_days);
    let threshold = f64::from(threshold_ms);

    let mut load = Table::new(
        "minute_load",
        "load per minute over the complete hours (exact: each minute summed over the series)",
        &[
            ("scope", "scope"),
            ("minutes", "minutes"),
            ("p50_requests_per_minute", "requests/min p50"),
            ("p99_requests_per_minute", "requests/min p99"),
            ("max_requests_per_minute", "requests/min max"),
            ("busiest_minute", "busiest minute (UTC)"),
            ("p99_tokens_per_minute", "tokens/min p99"),
            ("max_tokens_per_minute", "tokens/min max"),
        ],
    );
    let mut knees = Table::new(
        "knee",
        format!("the knee: the load at which p99 TTFT reaches {threshold_ms} ms (hours in {BINS} bins by their busiest minute, piecewise linear)"),
        &[
            ("scope", "scope"),
            ("hours", "hours"),
            ("knee_requests_per_minute", "knee (requests/min)"),
            ("knee", "knee"),
            ("top_bin_requests_per_minute", "highest bin (requests/min)"),
            ("top_bin_p99_ttft_ms", "its p99 TTFT"),
        ],
    );
    let mut forecast = Table::new(
        "forecast",
        format!(
            "the next {AHEAD_DAYS} days: the p99 per-minute load grown at the fitted daily rate (ln requests, least squares over the complete days)"
        ),
        &[
            ("scope", "scope"),
            ("days", "days fitted"),
            ("daily_growth", "growth per day"),
            ("p99_requests_per_minute", "requests/min p99"),
            ("expected_peak_requests_per_minute", "expected peak, next 7 days"),
            ("knee_requests_per_minute", "knee"),
            ("days_until_knee", "days until the knee"),
        ],
    );
    let mut fleet_curve = Table::new(
        "knee_curve",
        "fleet p99 TTFT by load (the bins the knee is read from)",
        &[("requests_per_minute", "requests/min"), ("p99_ttft_ms", "p99 TTFT (ms)"), ("threshold_ms", "threshold (ms)")],
    );
    for (name, s) in &scopes {
        // Minutes of answered hours with no row in this scope carry no load.
        let mut minutes: Vec<(i64, (u64, u64))> = Vec::new();
        let mut busiest_of_hour: BTreeMap<i64, u64> = BTreeMap::new();
        for &hour in &answered {
            for m in hour * 60..(hour + 1) * 60 {
                let v = s.minutes.get(&m).copied().unwrap_or((0, 0));
                minutes.push((m, v));
                let b = busiest_of_hour.entry(hour).or_default();
                *b = (*b).max(v.0);
            }
        }
        let mut requests: Vec<u64> = minutes.iter().map(|(_, v)| v.0).collect();
        let mut tokens: Vec<u64> = minutes.iter().map(|(_, v)| v.1).collect();
        requests.sort_unstable();
        tokens.sort_unstable();
        let busiest = minutes.iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(&a.0))).map(|(m, _)| *m);
        let p99 = rank(&requests, 0.99);
        let num = |v: Option<u64>| Cell::num(v.map(|v| v as f64), Kind::Count);
        load.push(vec![
            Cell::text(name.clone()),
            Cell::count(minutes.len() as u64),
            num(rank(&requests, 0.5)),
            num(p99),
            num(requests.last().copied()),
            Cell::text(busiest.map(minute_string).unwrap_or_default()),
            num(rank(&tokens, 0.99)),
            num(tokens.last().copied()),
        ]);

        let hours: Vec<(u64, &Histogram)> = s.hours.iter().map(|(h, hist)| (busiest_of_hour.get(h).copied().unwrap_or(0), hist)).collect();
        let n_hours = hours.len();
        let c = curve(hours);
        if name == "fleet" {
            for (x, y) in &c {
                fleet_curve.push(vec![Cell::num(Some(*x), Kind::Rate), Cell::num(Some(*y), Kind::Ms), Cell::num(Some(threshold), Kind::Ms)]);
            }
        }
        let k = knee(&c, threshold);
        let (knee_load, said) = match k {
            Some(Knee::At(x)) => (Some(x), format!("crosses at {x:.1}/min")),
            Some(Knee::Below(x)) => (Some(0.0), format!("at or above {threshold_ms} ms already at {x:.1}/min")),
            Some(Knee::NotReached(x)) => (None, format!("not reached up to {x:.1}/min")),
            None => (None, "no TTFT reported".into()),
        };
        let top = c.last().copied();
        knees.push(vec![
            Cell::text(name.clone()),
            Cell::count(n_hours as u64),
            Cell::num(knee_load, Kind::Rate),
            Cell::text(said),
            Cell::num(top.map(|t| t.0), Kind::Rate),
            Cell::num(top.map(|t| t.1), Kind::Ms),
        ]);

        // Today's load: the p99 grown from the middle of the fitted days to the end of the range.
        let end = f64::from(ctx.range.to + 1);
        let grown = |days: f64| growth.zip(p99).map(|((rate, _), p)| p as f64 * (rate * days).exp());
        let (to_today, ahead) = match growth {
            Some((_, middle)) => (end - middle, end - middle + AHEAD_DAYS),
            None => (0.0, 0.0),
        };
        let today = grown(to_today);
        let until = match (knee_load, today, growth) {
            (Some(k), Some(now), Some(_)) if k <= now => Some(0.0),
            (Some(k), Some(now), Some((rate, _))) if rate > 0.0 => Some((k / now).ln() / rate),
            _ => None,
        };
        forecast.push(vec![
            Cell::text(name.clone()),
            Cell::count(complete_days.len() as u64),
            Cell::num(growth.map(|(rate, _)| rate.exp() - 1.0), Kind::Change),
            num(p99),
            Cell::num(grown(ahead), Kind::Rate),
            Cell::num(knee_load, Kind::Rate),
            Cell::num(until, Kind::Rate),
        ]);
        if s.without_minutes > 0 {
            notes.push(format!("{name}: {} hour(s) were aggregated before minutes were kept; their minutes count as no load", s.without_minutes));
        }
    }
    if growth.is_none() {
        notes.push("fewer than two complete days with traffic: no growth fitted, no forecast".into());
    }
    vec![load, knees, fleet_curve, forecast]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_knee_is_read_between_the_bins_that_straddle_the_threshold() {
        let c = [(10.0, 500.0), (20.0, 1000.0), (30.0, 3000.0), (40.0, 9000.0)];
        assert_eq!(knee(&c, 2000.0), Some(Knee::At(25.0)), "halfway from 1000 to 3000 ms");
        assert_eq!(knee(&c, 400.0), Some(Knee::Below(10.0)));
        assert_eq!(knee(&c, 10_000.0), Some(Knee::NotReached(40.0)));
        assert_eq!(knee(&[], 1.0), None);
    }

    #[test]
    fn bins_hold_equal_counts_of_hours_by_load() {
        let slow = {
            let mut h = Histogram::new();
            h.add(5000.0);
            h
        };
        let fast = {
            let mut h = Histogram::new();
            h.add(100.0);
            h
        };
        // 20 hours: loads 1..=20, the top 6 slow.
        let hours: Vec<(u64, &Histogram)> = (1..=20).map(|l| (l, if l > 14 { &slow } else { &fast })).collect();
        let c = curve(hours);
        assert_eq!(c.len(), 10, "two hours a bin");
        assert_eq!(c[0].0, 1.5);
        assert!((c[7].1 - 5000.0).abs() < 50.0, "hours 15 and 16: slow");
        assert!((c[6].1 - 100.0).abs() < 1.0, "hours 13 and 14: fast");
        let Some(Knee::At(x)) = knee(&c, 2000.0) else { panic!("a knee") };
        assert!(x > 13.5 && x < 15.5, "{x}");
    }

    #[test]
    fn growth_is_the_slope_of_the_log_of_daily_requests() {
        let daily: Vec<(i32, u64)> = (0..10).map(|d| (d, (1000.0 * (0.05 * f64::from(d)).exp()).round() as u64)).collect();
        let (rate, middle) = growth(&daily).expect("fitted");
        assert!((rate - 0.05).abs() < 1e-3, "{rate}");
        assert_eq!(middle, 4.5);
        assert_eq!(growth(&[(1, 10)]), None);
    }
}
