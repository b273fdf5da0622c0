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
    let requests = s.counts.totals.requests as f64;
    let mut out = vec![
        m("requests", Some(requests), Kind::Count),
        m("success_rate", s.success_rate(), Kind::Share),
        m("error_rate", s.success_rate().map(|r| 1.0 - r), Kind::Share),
        m("tokens_per_minute", facts.answered_minutes(range, now_ms).map(|minutes| s.counts.tokens() as f64 / minutes), Kind::Rate),
        m("input_tokens", Some(s.counts.totals.input_tokens as f64), Kind::Count),
        m("output_tokens", Some(s.counts.totals.output_tokens as f64), Kind::Count),
        m("cost_usd", s.counts.cost(), Kind::of_cost(&s.counts)),
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

/// Metrics that add up over days: against a range missing some of its
/// days their change says nothing, so it is not shown.
const TOTALS: [&str; 5] = ["requests", "input_tokens", "output_tokens", "cost_usd", "unpriced_requests"];

pub fn tables(facts: &Facts, ctx: &Context, notes: &mut Vec<String>) -> Vec<Table> {
    let (now, before) = (ctx.range, ctx.range.previous());
    let (missing_now, missing_before) = (facts.missing_days(now), facts.missing_days(before));
    let partial = (missing_now > 0 || missing_before > 0) && missing_before < before.days() as usize;
    if partial {
        notes.push(format!(
            "no change shown for totals ({}): the range lacks {missing_now} of its {} days and the previous one {missing_before} of its {}; \
             rates, shares and percentiles compare",
            TOTALS.join(", "),
            now.days(),
            before.days()
        ));
    }
    let mut codes: Vec<(i32, String)> = errors_by_code(facts, now).into_keys().collect();
    codes.extend(errors_by_code(facts, before).into_keys());
    codes.sort();
    codes.dedup();
    let current = metrics(facts, now, ctx.now_ms, &codes);
    let previous = metrics(facts, before, ctx.now_ms, &codes);
    let mut rows: Vec<(Metric, Option<f64>, Option<f64>)> = current
        .into_iter()
        .zip(previous)
        .map(|(c, p)| {
            let delta = if partial && TOTALS.contains(&c.key.as_str()) { None } else { change(c.value, p.value) };
            (c.clone(), p.value, delta)
        })
        .collect();
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
        let (sa, sb) = (share(a, s_now.counts.totals.requests), share(b, s_before.counts.totals.requests));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{Counts, GroupFacts, GroupKey, Tier};

    fn day_of_traffic(f: &mut Facts, day: i32, requests: u64, errors: u64) {
        let key = GroupKey::of(day, "chat", "m", "v1", "0-1k");
        let counts = Counts {
            totals: inferlog_store::model::fold::Totals {
                requests,
                errors,
                input_tokens: 1440 * requests,
                ..inferlog_store::model::fold::Totals::default()
            },
            ..Counts::default()
        };
        f.groups.insert(key, GroupFacts { counts, ..GroupFacts::default() });
    }

    fn row<'a>(t: &'a Table, key: &str) -> &'a [Cell] {
        &t.rows.iter().find(|r| r[0].display() == key).unwrap_or_else(|| panic!("no {key}"))[..]
    }

    #[test]
    fn a_day_no_tier_holds_counts_no_minutes_and_hides_the_change_of_totals() {
        // Days 10-11 against 8-9. Day 11 and day 8 are held by no tier.
        let mut f = Facts { tiers: vec![(8, Tier::None), (9, Tier::Aggregates), (10, Tier::Hot), (11, Tier::None)], ..Facts::default() };
        day_of_traffic(&mut f, 9, 100, 10);
        day_of_traffic(&mut f, 10, 100, 5);
        let ctx = Context {
            range: Range { from: 10, to: 11 },
            filter: Default::default(),
            now_ms: i64::MAX,
            budgets: vec![],
            top_users: 0,
            versions: None,
        };
        let mut notes = Vec::new();
        let t = &tables(&f, &ctx, &mut notes)[0];
        // 144,000 tokens over day 10's 1,440 minutes, not over two days' 2,880.
        assert_eq!(row(t, "tokens_per_minute")[1].value(), Some(100.0));
        assert_eq!(row(t, "tokens_per_minute")[3].value(), Some(0.0), "the same rate as day 9's");
        assert_eq!(row(t, "requests")[3].value(), None, "100 against 100 of half a range says nothing");
        assert_eq!(row(t, "input_tokens")[3].value(), None);
        let rate = row(t, "error_rate")[3].value().expect("a rate compares");
        assert!((rate + 0.5).abs() < 1e-9, "5% against 10%: {rate}");
        assert!(notes.iter().any(|n| n.starts_with("no change shown for totals")), "{notes:?}");

        // Every day held: the totals compare again, with no note.
        f.tiers = vec![(8, Tier::Hot), (9, Tier::Hot), (10, Tier::Hot), (11, Tier::Hot)];
        let mut notes = Vec::new();
        let t = &tables(&f, &ctx, &mut notes)[0];
        assert_eq!(row(t, "requests")[3].value(), Some(0.0));
        assert_eq!(row(t, "tokens_per_minute")[1].value(), Some(50.0), "two held days, one of them without traffic");
        assert!(notes.is_empty(), "{notes:?}");
    }
}
