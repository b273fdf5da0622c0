//! The `page` view: everything the HTML page shows. In: the facts of the
//! range and of the one before. Out: the overview, the performance tables
//! (latency by input bucket, stage breakdown), the cost tables, cache and
//! errors, spikes, waste, the diagnosis walk, the version comparison, the capacity
//! forecast, and the hourly series of requests, tokens and TTFT/TPOT
//! percentiles the page's time-series charts are drawn from.

use std::collections::BTreeMap;

use crate::document::{Cell, Kind, Table};
use crate::facts::{merge_hists, Counts, Facts, HourHists, TPOT, TTFT};
use crate::views::{cache, compare, cost, diagnose, errors, forecast, latency, overview, spikes, waste, Context};

/// The hourly series: every complete hour of the range.
pub fn hourly(facts: &Facts, ctx: &Context) -> Table {
    let mut hours: BTreeMap<i64, (Counts, HourHists)> = BTreeMap::new();
    let first = i64::from(ctx.range.from) * 24;
    // The hour still running is left out: its partial counts would read as a drop.
    let last = ((i64::from(ctx.range.to) + 1) * 24).min(ctx.now_ms.div_euclid(3_600_000));
    for hour in first..last {
        hours.insert(hour, Default::default());
    }
    for (k, h) in facts.hours.iter().filter(|(k, _)| (first..last).contains(&k.hour)) {
        let entry = hours.entry(k.hour).or_default();
        entry.0.add(&h.counts);
        merge_hists(&mut entry.1, &h.hists);
    }
    let mut columns = vec![("hour", "hour (UTC)"), ("requests", "requests"), ("tokens", "tokens"), ("errors", "errors")];
    // TTFT and TPOT p50/p95/p99, as the latency view names them.
    columns.extend_from_slice(&latency::percentile_columns()[3 * TTFT..3 * (TPOT + 1)]);
    let mut table = Table::new("hourly", "requests, tokens and TTFT/TPOT percentiles (ms) per hour", &columns);
    for (hour, (c, hists)) in hours {
        let mut row = vec![
            Cell::text(crate::views::minute_string(hour * 60)),
            Cell::count(c.totals.requests),
            Cell::count(c.tokens()),
            Cell::count(c.totals.errors),
        ];
        for m in [TTFT, TPOT] {
            row.extend([0.5, 0.95, 0.99].map(|q| Cell::num(hists[m].as_ref().and_then(|h| h.quantile(q)), Kind::Ms)));
        }
        table.push(row);
    }
    table
}

pub fn tables(facts: &Facts, ctx: &Context, notes: &mut Vec<String>, alerts: &mut Vec<String>) -> Vec<Table> {
    let mut tables = overview::tables(facts, ctx, notes);
    tables.extend(diagnose::tables(facts, ctx, notes));
    tables.push(hourly(facts, ctx));
    tables.extend(latency::tables(facts, ctx).into_iter().filter(|t| t.name != "latency"));
    tables.extend(compare::tables(facts, ctx, notes));
    tables.extend(forecast::tables(facts, ctx, forecast::DEFAULT_KNEE_TTFT_MS, notes));
    tables.extend(cost::tables(facts, ctx, notes, alerts).into_iter().filter(|t| t.name != "top_users"));
    tables.extend(cache::tables(facts, ctx));
    tables.extend(spikes::tables(facts, ctx, spikes::default_hour(ctx.range.to, ctx.now_ms), notes));
    tables.extend(waste::tables(facts, ctx, waste::DEFAULT_TOP, notes));
    tables.extend(errors::tables(facts, ctx));
    tables
}
