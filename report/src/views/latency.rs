//! The `latency` view. In: the facts of the range. Out: p50/p95/p99 of
//! total latency, TTFT, TPOT, queue, prefill and decode by business line ×
//! input bucket × output bucket (buckets in their natural order), each
//! group's dominant stage (the one of queue, prefill and decode with the
//! largest p99) and whether it is slow (its total p99 at or above the
//! whole selection's: the groups holding the tail); the same by input bucket alone; and the stage breakdown.

use std::collections::BTreeMap;

use std::sync::OnceLock;

use inferlog_store::model::measures::{durations, DURATIONS, LEVELS};

use crate::document::{leak, Cell, Kind, Table};
use crate::facts::{Facts, Summary, DECODE, PREFILL, QUEUE, TOTAL};
use crate::views::{bucket_rank, groups, summary, Context};

/// The percentile columns: per duration in
/// [`inferlog_store::model::measures::durations`] order, at each of
/// [`LEVELS`], named by
/// [`percentile_column`](inferlog_store::model::measures::Measure::percentile_column).
pub fn percentile_columns() -> &'static [(&'static str, &'static str)] {
    static COLUMNS: OnceLock<Vec<(&'static str, &'static str)>> = OnceLock::new();
    COLUMNS.get_or_init(|| {
        durations().iter().flat_map(|m| LEVELS.map(|q| m.percentile_column(q))).map(|(key, label)| (leak(key), leak(label))).collect()
    })
}

/// The stage of queue, prefill and decode with the largest p99 (`-` when none was reported).
pub fn dominant_stage(s: &Summary) -> &'static str {
    [(QUEUE, "queue"), (PREFILL, "prefill"), (DECODE, "decode")]
        .into_iter()
        .filter_map(|(m, name)| s.quantile(m, 0.99).map(|v| (v, name)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map_or("-", |(_, name)| name)
}

fn percentiles(s: &Summary) -> Vec<Cell> {
    (0..DURATIONS).flat_map(|m| LEVELS.map(|q| Cell::num(s.quantile(m, q), Kind::Ms))).collect()
}

pub fn tables(facts: &Facts, ctx: &Context) -> Vec<Table> {
    let fleet_p99 = summary(facts, ctx.range).quantile(TOTAL, 0.99);
    let mut by_group: BTreeMap<(String, usize, usize), (String, String, Summary)> = BTreeMap::new();
    let mut by_input: BTreeMap<usize, (String, Summary)> = BTreeMap::new();
    for (k, g) in groups(facts, ctx.range, |_| true) {
        let entry = by_group
            .entry((k.business_line.clone(), bucket_rank(&k.input_bucket), bucket_rank(&k.output_bucket)))
            .or_insert_with(|| (k.input_bucket.clone(), k.output_bucket.clone(), Summary::default()));
        entry.2.add(g);
        by_input.entry(bucket_rank(&k.input_bucket)).or_insert_with(|| (k.input_bucket.clone(), Summary::default())).1.add(g);
    }

    let mut columns = vec![("business_line", "business line"), ("input_bucket", "input"), ("output_bucket", "output"), ("requests", "requests")];
    columns.extend_from_slice(percentile_columns());
    columns.extend([("dominant_stage", "dominant stage"), ("slow", "slow")]);
    let mut latency = Table::new("latency", "latency (ms) by business line, input and output bucket", &columns);
    for ((line, _, _), (input, output, s)) in &by_group {
        let slow = s.quantile(TOTAL, 0.99).zip(fleet_p99).is_some_and(|(p, fleet)| p >= fleet);
        let mut row = vec![Cell::text(line.clone()), Cell::text(input.clone()), Cell::text(output.clone()), Cell::count(s.counts.totals.requests)];
        row.extend(percentiles(s));
        row.extend([Cell::text(dominant_stage(s)), Cell::text(if slow { "slow" } else { "" })]);
        latency.push(row);
    }

    let mut columns = vec![("input_bucket", "input"), ("requests", "requests")];
    columns.extend_from_slice(percentile_columns());
    columns.push(("dominant_stage", "dominant stage"));
    let mut by_bucket = Table::new("latency_by_input_bucket", "latency (ms) by input bucket", &columns);
    let mut stages = Table::new(
        "stages",
        "stage breakdown by input bucket (ms)",
        &[
            ("input_bucket", "input"),
            ("queue_p50_ms", "queue p50"),
            ("prefill_p50_ms", "prefill p50"),
            ("decode_p50_ms", "decode p50"),
            ("queue_p99_ms", "queue p99"),
            ("prefill_p99_ms", "prefill p99"),
            ("decode_p99_ms", "decode p99"),
            ("dominant_stage", "dominant stage"),
        ],
    );
    for (input, s) in by_input.values() {
        let mut row = vec![Cell::text(input.clone()), Cell::count(s.counts.totals.requests)];
        row.extend(percentiles(s));
        row.push(Cell::text(dominant_stage(s)));
        by_bucket.push(row);
        let mut row = vec![Cell::text(input.clone())];
        for q in [0.5, 0.99] {
            row.extend([QUEUE, PREFILL, DECODE].map(|m| Cell::num(s.quantile(m, q), Kind::Ms)));
        }
        row.push(Cell::text(dominant_stage(s)));
        stages.push(row);
    }
    vec![latency, by_bucket, stages]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_columns_are_the_durations_at_each_level() {
        let columns = percentile_columns();
        assert_eq!(columns.len(), 18);
        assert_eq!(columns[0], ("total_p50_ms", "total p50"));
        assert_eq!(columns[4], ("ttft_p95_ms", "TTFT p95"));
        assert_eq!(columns[17], ("decode_p99_ms", "decode p99"));
    }
    use crate::facts::{GroupFacts, GroupKey};
    use inferlog_schema::histogram::Histogram;

    fn facts(groups: &[(&str, &str, f64, f64)]) -> Facts {
        let mut f = Facts::default();
        for (i, (line, input, total, decode)) in groups.iter().enumerate() {
            let mut g = GroupFacts::default();
            g.counts.totals.requests = 1;
            for (m, v) in [(TOTAL, *total), (QUEUE, 1.0), (PREFILL, 2.0), (DECODE, *decode)] {
                let mut h = Histogram::new();
                h.add(v);
                g.hists[m] = Some(h);
            }
            let key = GroupKey::of(0, line, "m", &i.to_string(), input);
            f.groups.insert(key, g);
        }
        f
    }

    #[test]
    fn groups_come_in_bucket_order_with_their_dominant_stage() {
        let f = facts(&[("search", "32k+", 900.0, 0.5), ("search", "0-1k", 10.0, 5.0), ("search", "8k-32k", 20.0, 9.0), ("ads", "1k-2k", 12.0, 6.0)]);
        let ctx = Context {
            range: crate::range::Range { from: 0, to: 0 },
            filter: Default::default(),
            now_ms: 0,
            budgets: vec![],
            top_users: 10,
            versions: None,
        };
        let tables = tables(&f, &ctx);
        let latency = &tables[0];
        let order: Vec<String> = latency.rows.iter().map(|r| format!("{}/{}", r[0].display(), r[1].display())).collect();
        assert_eq!(order, ["ads/1k-2k", "search/0-1k", "search/8k-32k", "search/32k+"]);
        let stage = latency.column("dominant_stage").expect("column");
        let slow = latency.column("slow").expect("column");
        assert_eq!(latency.rows[3][stage].display(), "prefill", "decode 0.5 < prefill 2 < ...");
        assert_eq!(latency.rows[1][stage].display(), "decode");
        assert_eq!(latency.rows[3][slow].display(), "slow", "900 ms is the selection's p99");
        assert_eq!(latency.rows[0][slow].display(), "");
        let by_bucket: Vec<String> = tables[1].rows.iter().map(|r| r[0].display()).collect();
        assert_eq!(by_bucket, ["0-1k", "1k-2k", "8k-32k", "32k+"]);
        assert_eq!(tables[2].columns.len(), tables[2].rows[0].len());
    }
}
