//! The `overview` view. In: the facts of the range and of the range
//! before it. Out: the headline metrics (requests, success rate, TTFT and
//! TPOT percentiles, tokens per minute, cost, each error code's share) for
//! both ranges, largest relative change first, and errors by code. The
//! metric keys are the names `--fail-if` accepts.

use std::collections::BTreeMap;

use crate::document::{change, Cell, Kind, Table};
use crate::facts::{Facts, TOTAL, TPOT, TTFT};
use crate::range::Range;
use crate::views::{summary, Context};

/// One headline figure of a range.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub key: String,
    pub value: Option<f64>,
    pub kind: Kind,
}

/// Errors per code in `range`: (code, name) → errors.
pub fn errors_by_code(facts: &Facts, range: Range) -> BTreeMap<(i32, String), u64> {
    let mut by_code = BTreeMap::new();
    for (k, e) in facts.errors.iter().filter(|(k, _)| range.contains(k.day)) {
        *by_code.entry((k.error_code, e.name.clone())).or_default() += e.errors;
    }
    by_code
}

/// The headline metrics of `range`; `codes` are the error codes to give a share for.
pub fn metrics(facts: &Facts, range: Range, now_ms: i64, codes: &[(i32, String)]) -> Vec<Metric> {
    let s = summary(facts, range);
    let m = |key: &str, value: Option<f64>, kind: Kind| Metric { key: key.to_owned(), value, kind };
    let requests = s.counts.requests as f64;
    let mut out = vec![
        m("requests", Some(requests), Kind::Count),
        m("success_rate", s.success_rate(), Kind::Share),
        m("error_rate", s.success_rate().map(|r| 1.0 - r), Kind::Share),
        m("tokens_per_minute", Some(s.counts.tokens() as f64 / range.minutes(now_ms)), Kind::Rate),
        m("input_tokens", Some(s.counts.input_tokens as f64), Kind::Count),
        m("output_tokens", Some(s.counts.output_tokens as f64), Kind::Count),
        m("cost_usd", Some(s.counts.cost_usd), Kind::Usd),
        m("unpriced_requests", Some(s.counts.unpriced_requests as f64), Kind::Count),
    ];
    for (measure, name) in [(TTFT, "ttft"), (TPOT, "tpot"), (TOTAL, "total")] {
        for (q, p) in [(0.5, "p50"), (0.95, "p95"), (0.99, "p99")] {
            out.push(m(&format!("{p}_{name}_ms"), s.quantile(measure, q), Kind::Ms));
        }
    }
    let by_code = errors_by_code(facts, range);
    for code in codes {
        let errors = by_code.get(code).copied().unwrap_or(0) as f64;
        out.push(m(&format!("error_share.{}", code.1), (requests > 0.0).then(|| errors / requests), Kind::Share));
    }
    out
}

pub fn tables(facts: &Facts, ctx: &Context) -> Vec<Table> {
    let (now, before) = (ctx.range, ctx.range.previous());
    let mut codes: Vec<(i32, String)> = errors_by_code(facts, now).into_keys().collect();
    codes.extend(errors_by_code(facts, before).into_keys());
    codes.sort();
    codes.dedup();
    let current = metrics(facts, now, ctx.now_ms, &codes);
    let previous = metrics(facts, before, ctx.now_ms, &codes);
    let mut rows: Vec<(Metric, Option<f64>, Option<f64>)> =
        current.into_iter().zip(previous).map(|(c, p)| (c.clone(), p.value, change(c.value, p.value))).collect();
    // Largest change first; metrics without a comparable previous value last.
    rows.sort_by(|a, b| b.2.map(f64::abs).unwrap_or(-1.0).total_cmp(&a.2.map(f64::abs).unwrap_or(-1.0)));
    let mut overview = Table::new(
        "overview",
        "the range against the one before, largest change first",
        &[("metric", "metric"), ("current", "current"), ("previous", "previous"), ("change", "change")],
    );
    for (metric, previous, delta) in rows {
        overview.push(vec![
            Cell::text(metric.key),
            Cell::num(metric.value, metric.kind),
            Cell::num(previous, metric.kind),
            Cell::num(delta, Kind::Change),
        ]);
    }

    let (s_now, s_before) = (summary(facts, now), summary(facts, before));
    let (e_now, e_before) = (errors_by_code(facts, now), errors_by_code(facts, before));
    let share = |errors: u64, requests: u64| (requests > 0).then(|| errors as f64 / requests as f64);
    let mut by_code = Table::new(
        "errors_by_code",
        "errors by code",
        &[
            ("code", "code"),
            ("name", "name"),
            ("errors", "errors"),
            ("share", "share"),
            ("previous_errors", "previous errors"),
            ("previous_share", "previous share"),
            ("change", "change"),
        ],
    );
    for code in &codes {
        let (a, b) = (e_now.get(code).copied().unwrap_or(0), e_before.get(code).copied().unwrap_or(0));
        let (sa, sb) = (share(a, s_now.counts.requests), share(b, s_before.counts.requests));
        by_code.push(vec![
            Cell::text(code.0.to_string()),
            Cell::text(code.1.clone()),
            Cell::count(a),
            Cell::num(sa, Kind::Share),
            Cell::count(b),
            Cell::num(sb, Kind::Share),
            Cell::num(sa.zip(sb).map(|(x, y)| x - y), Kind::Points),
        ]);
    }
    vec![overview, by_code]
}
