//! The `compare` view: is version B of a model better than version A? In:
//! the facts of the range (both versions' groups and errors) and, for the
//! hot days, the requests both versions served ([`Pairs`], shadow
//! traffic). Out: the versions side by side per input bucket (all outputs,
//! then each output bucket): requests, the output-length shares, error
//! share, TTFT / TPOT / total p50-p95-p99, each with a mark where B differs
//! beyond what the counts explain ([`crate::significance`]); error shares
//! by code; and the pairs compared request by request.
//!
//! Without `--a`/`--b` (the page), the busiest model with two versions in
//! the range is compared: its busiest version as A, the next as B.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use inferlog_schema::histogram::Histogram;
use inferlog_store::model::measures::{LEVELS, MEASURES};

use crate::document::{leak, Cell, Kind, Table};
use crate::facts::{Facts, Pairs, Summary, TOTAL, TPOT, TTFT};
use crate::significance::{proportions, quantile_shift, sign_test, Shift};
use crate::views::{bucket_rank, floor_rank, groups, Context};

/// The two versions compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// The model (`None`: any model with these version names).
    pub model: Option<String>,
    pub a: String,
    pub b: String,
}

impl Versions {
    /// 0 for version A, 1 for B, `None` for any other.
    pub fn side(&self, version: &str) -> Option<usize> {
        if version == self.a {
            Some(0)
        } else if version == self.b {
            Some(1)
        } else {
            None
        }
    }

    /// Whether `model` is the model compared.
    pub fn covers(&self, model: &str) -> bool {
        self.model.as_deref().is_none_or(|want| want == model)
    }
}

/// What the page compares without `--a`/`--b`: the busiest model with two
/// or more versions in `range`, its busiest version as A and the next as B.
pub fn pick(facts: &Facts, range: crate::range::Range) -> Option<Versions> {
    let mut load: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for (k, g) in groups(facts, range, |_| true) {
        *load.entry(&k.model_name).or_default().entry(&k.model_version).or_default() += g.counts.totals.requests;
    }
    let (model, versions) = load.into_iter().filter(|(_, v)| v.len() >= 2).max_by_key(|(m, v)| (v.values().sum::<u64>(), std::cmp::Reverse(*m)))?;
    let mut versions: Vec<(&str, u64)> = versions.into_iter().collect();
    versions.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(y.0)));
    Some(Versions { model: Some(model.to_owned()), a: versions[0].0.to_owned(), b: versions[1].0.to_owned() })
}

/// The measures compared, in the order of their columns.
const COMPARED: [usize; 3] = [TTFT, TPOT, TOTAL];

/// The comparison's columns: the row's buckets, requests and shares, then
/// per measure compared ([`COMPARED`]) p50/p95/p99 of A and B
/// ([`percentile_column`](inferlog_store::model::measures::Measure::percentile_column)) and the mark.
fn compare_columns() -> &'static [(&'static str, &'static str)] {
    static COLUMNS: OnceLock<Vec<(&'static str, &'static str)>> = OnceLock::new();
    COLUMNS.get_or_init(|| {
        let mut columns = vec![
            ("input_bucket", "input"),
            ("output_bucket", "output"),
            ("requests_a", "requests A"),
            ("requests_b", "requests B"),
            ("share_a", "share A"),
            ("share_b", "share B"),
            ("error_share_a", "errors A"),
            ("error_share_b", "errors B"),
            ("errors_b_vs_a", "errors B vs A"),
        ];
        for m in COMPARED.map(|m| &MEASURES[m]) {
            for level in LEVELS {
                let (key, label) = m.percentile_column(level);
                columns.extend([(leak(format!("{key}_a")), leak(format!("{label} A"))), (leak(format!("{key}_b")), leak(format!("{label} B")))]);
            }
            columns.push((leak(format!("{}_b_vs_a", m.key)), leak(format!("{} B vs A", m.label))));
        }
        columns
    })
}

/// The quantiles marked: the body and the tail.
const TESTED: [(f64, &str); 2] = [(0.5, "p50"), (0.99, "p99")];

/// B against A on one latency: `slower p99`, `faster p50, slower p99`, `` or `too few`.
pub fn latency_mark(a: Option<&Histogram>, b: Option<&Histogram>) -> String {
    let (Some(a), Some(b)) = (a, b) else { return "too few".into() };
    let shifts = TESTED.map(|(q, name)| (Shift::of(quantile_shift(a, b, q)), name));
    if shifts.iter().all(|(s, _)| *s == Shift::TooFew) {
        return "too few".into();
    }
    let marks: Vec<String> = shifts
        .iter()
        .filter_map(|(s, name)| match s {
            Shift::Higher => Some(format!("slower {name}")),
            Shift::Lower => Some(format!("faster {name}")),
            Shift::Same | Shift::TooFew => None,
        })
        .collect();
    marks.join(", ")
}

/// B against A on an error share: `more`, `fewer`, `` or `too few`.
pub fn share_mark(x_a: u64, n_a: u64, x_b: u64, n_b: u64) -> String {
    if x_a + x_b == 0 {
        return String::new();
    }
    match Shift::of(proportions(x_a, n_a, x_b, n_b)) {
        Shift::Higher => "more".into(),
        Shift::Lower => "fewer".into(),
        Shift::Same => String::new(),
        Shift::TooFew => "too few".into(),
    }
}

/// A row's key: (input bucket rank, output bucket rank); `None` is "all" (first).
type RowKey = (Option<usize>, Option<usize>);

/// The comparison's rows: (input shown, output shown, A's and B's summaries).
type Rows = BTreeMap<RowKey, (String, String, [Summary; 2])>;

/// Errors per (code, input bucket rank; `None`: all inputs): (name, input shown, A's and B's errors).
type CodeRows = BTreeMap<(i32, Option<usize>), (String, String, [u64; 2])>;

fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

pub fn tables(facts: &Facts, ctx: &Context, notes: &mut Vec<String>) -> Vec<Table> {
    let Some(v) = ctx.versions.clone().or_else(|| pick(facts, ctx.range)) else {
        notes.push("no model has two versions in the range: nothing to compare".into());
        return Vec::new();
    };
    let model = v.model.as_deref().unwrap_or("any model");
    notes.push(format!(
        "{model}: A = {}, B = {}. B vs A marks a difference the counts cannot explain (two-sided α = 0.001): \
         Mood's quantile test at p50 and p99 for latencies, the two-proportion z-test for error shares, \
         the sign test for pairs (McNemar's for their errors)",
        v.a, v.b
    ));

    let mut rows = Rows::new();
    for (k, g) in groups(facts, ctx.range, |k| v.covers(&k.model_name)) {
        let Some(s) = v.side(&k.model_version) else { continue };
        let (i, o) = (bucket_rank(&k.input_bucket), bucket_rank(&k.output_bucket));
        for (key, input, output) in
            [((None, None), "all", "all"), ((Some(i), None), k.input_bucket.as_str(), "all"), ((Some(i), Some(o)), &k.input_bucket, &k.output_bucket)]
        {
            rows.entry(key).or_insert_with(|| (input.to_owned(), output.to_owned(), Default::default())).2[s].add(g);
        }
    }
    for (s, name) in [(0, &v.a), (1, &v.b)] {
        if rows.get(&(None, None)).is_none_or(|r| r.2[s].counts.totals.requests == 0) {
            notes.push(format!("version {name} served no request of {model} in the range"));
        }
    }

    let mut table = Table::new("compare", format!("{model}: {} (A) against {} (B) by input and output bucket", v.a, v.b), compare_columns());
    for ((input, output), (input_name, output_name, sides)) in &rows {
        // Output shares: of the version's requests in the input bucket; input rows: of all its requests.
        let whole = |s: usize| match (input, output) {
            (None, _) => None,
            (Some(i), Some(_)) => rows.get(&(Some(*i), None)).map(|r| r.2[s].counts.totals.requests),
            (Some(_), None) => rows.get(&(None, None)).map(|r| r.2[s].counts.totals.requests),
        };
        let mut row = vec![Cell::text(input_name.clone()), Cell::text(output_name.clone())];
        row.extend(side_by_side(sides, [0, 1].map(|s| whole(s).and_then(|w| share(sides[s].counts.totals.requests, w)))));
        table.push(row);
    }

    let mut tables = vec![table];
    tables.push(request_types(facts, ctx, &v, notes));
    tables.push(errors(facts, ctx, &v, &rows));
    match &facts.pairs {
        Some(p) if p.pairs > 0 => tables.push(pairs(p)),
        Some(p) => notes.push(format!("no request was served by both versions on the {} hot day(s): no pairs to compare", p.days)),
        None => notes.push("pairs (one request served by both versions) are kept on hot days only, and none is in the range".into()),
    }
    tables
}

/// One row's cells from its requests on: A's and B's requests and
/// `shares`, error shares and their mark, then per latency the quantiles and the mark.
fn side_by_side(sides: &[Summary; 2], shares: [Option<f64>; 2]) -> Vec<Cell> {
    let [a, b] = sides;
    let mut row = vec![
        Cell::count(a.counts.totals.requests),
        Cell::count(b.counts.totals.requests),
        Cell::num(shares[0], Kind::Share),
        Cell::num(shares[1], Kind::Share),
        Cell::num(share(a.counts.totals.errors, a.counts.totals.requests), Kind::Share),
        Cell::num(share(b.counts.totals.errors, b.counts.totals.requests), Kind::Share),
        Cell::text(share_mark(a.counts.totals.errors, a.counts.totals.requests, b.counts.totals.errors, b.counts.totals.requests)),
    ];
    for m in COMPARED {
        for q in LEVELS {
            row.extend([Cell::num(a.quantile(m, q), Kind::Ms), Cell::num(b.quantile(m, q), Kind::Ms)]);
        }
        row.push(Cell::text(latency_mark(a.hists[m].as_ref(), b.hists[m].as_ref())));
    }
    row
}

/// The versions side by side per request type, over the days read from
/// rows (hot, archive): the aggregates keep no request type (no rows
/// when no such day holds the model).
fn request_types(facts: &Facts, ctx: &Context, v: &Versions, notes: &mut Vec<String>) -> Table {
    let mut by_type: BTreeMap<&str, [Summary; 2]> = BTreeMap::new();
    let mut days = std::collections::BTreeSet::new();
    for (k, g) in facts.types.iter().filter(|(k, _)| ctx.range.contains(k.day) && v.covers(&k.model_name)) {
        let Some(s) = v.side(&k.model_version) else { continue };
        by_type.entry(&k.request_type).or_default()[s].add(g);
        days.insert(k.day);
    }
    notes.push(format!(
        "by request type: the {} of the range's {} days read from rows (hot, archive); the aggregates keep no request type",
        days.len(),
        ctx.range.days()
    ));
    let totals = [0, 1].map(|s| by_type.values().map(|sides| sides[s].counts.totals.requests).sum::<u64>());
    let mut columns = vec![("request_type", "request type")];
    columns.extend_from_slice(&compare_columns()[2..]);
    let mut table = Table::new("compare_request_types", "by request type (days read from rows)", &columns);
    for (name, sides) in &by_type {
        let mut row = vec![Cell::text(*name)];
        row.extend(side_by_side(sides, [0, 1].map(|s| share(sides[s].counts.totals.requests, totals[s]))));
        table.push(row);
    }
    table
}

/// Error shares by code: all inputs, then per input bucket.
fn errors(facts: &Facts, ctx: &Context, v: &Versions, rows: &Rows) -> Table {
    let mut by_code = CodeRows::new();
    for (k, e) in facts.errors.iter().filter(|(k, _)| ctx.range.contains(k.day) && v.covers(&k.model_name)) {
        let Some(s) = v.side(&k.model_version) else { continue };
        by_code.entry((k.error_code, None)).or_insert_with(|| (e.name.clone(), "all".into(), [0; 2])).2[s] += e.errors;
        // Days aggregated before errors were counted per input bucket (`*`) count in "all" only.
        if k.input_bucket != "*" {
            by_code
                .entry((k.error_code, Some(bucket_rank(&k.input_bucket))))
                .or_insert_with(|| (e.name.clone(), k.input_bucket.clone(), [0; 2]))
                .2[s] += e.errors;
        }
    }
    let mut table = Table::new(
        "compare_errors",
        "error share by code (of the version's requests in the input bucket)",
        &[
            ("error_code", "code"),
            ("error_name", "error"),
            ("input_bucket", "input"),
            ("errors_a", "errors A"),
            ("errors_b", "errors B"),
            ("share_a", "share A"),
            ("share_b", "share B"),
            ("b_vs_a", "B vs A"),
        ],
    );
    for ((code, input), (name, input_name, [x_a, x_b])) in by_code {
        let n = |s: usize| rows.get(&(input, None)).map_or(0, |r| r.2[s].counts.totals.requests);
        table.push(vec![
            Cell::count(code as u64),
            Cell::text(name),
            Cell::text(input_name),
            Cell::count(x_a),
            Cell::count(x_b),
            Cell::num(share(x_a, n(0)), Kind::Share),
            Cell::num(share(x_b, n(1)), Kind::Share),
            Cell::text(share_mark(x_a, n(0), x_b, n(1))),
        ]);
    }
    table
}

/// The floor-rank median of `values` (`None` when empty).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    floor_rank(&sorted, 0.5)
}

/// The pairs request by request: how often B was slower or faster, the
/// median difference, the sign test; errors by McNemar's test.
fn pairs(p: &Pairs) -> Table {
    let mut table = Table::new(
        "compare_pairs",
        format!("requests both versions served (shadow traffic, {} hot day(s))", p.days),
        &[
            ("measure", "measure"),
            ("pairs", "pairs"),
            ("b_higher", "B higher"),
            ("b_lower", "B lower"),
            ("median_b_minus_a_ms", "median B − A (ms)"),
            ("b_vs_a", "B vs A"),
        ],
    );
    for (name, diffs) in [("total", &p.total_diffs), ("ttft", &p.ttft_diffs)] {
        let higher = diffs.iter().filter(|d| **d > 0.0).count() as u64;
        let lower = diffs.iter().filter(|d| **d < 0.0).count() as u64;
        let mark = match Shift::of(sign_test(higher, lower)) {
            Shift::Higher => "slower",
            Shift::Lower => "faster",
            Shift::Same => "",
            Shift::TooFew => "too few",
        };
        table.push(vec![
            Cell::text(name),
            Cell::count(diffs.len() as u64),
            Cell::count(higher),
            Cell::count(lower),
            Cell::num(median(diffs), Kind::Ms),
            Cell::text(mark),
        ]);
    }
    let mark = match Shift::of(sign_test(p.b_only_failed, p.a_only_failed)) {
        Shift::Higher => "more",
        Shift::Lower => "fewer",
        Shift::Same => "",
        Shift::TooFew if p.a_only_failed + p.b_only_failed == 0 => "",
        Shift::TooFew => "too few",
    };
    table.push(vec![
        Cell::text("errors (only one version failed)"),
        Cell::count(p.pairs),
        Cell::count(p.b_only_failed),
        Cell::count(p.a_only_failed),
        Cell::num(None, Kind::Ms),
        Cell::text(mark),
    ]);
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{GroupFacts, GroupKey};

    fn group(version: &str, input: &str, ttft_ms: f64, requests: u64) -> (GroupKey, GroupFacts) {
        let mut g = GroupFacts::default();
        g.counts.totals.requests = requests;
        let mut h = Histogram::new();
        for i in 0..requests {
            h.add(ttft_ms + (i % 50) as f64);
        }
        g.hists[TTFT] = Some(h);
        let key = GroupKey::of(0, "search", "m", version, input);
        (key, g)
    }

    #[test]
    fn b_is_marked_slower_only_where_it_is() {
        let mut f = Facts::default();
        for (k, g) in [
            group("v1", "0-1k", 100.0, 2000),
            group("v2", "0-1k", 100.0, 500),
            group("v1", "8k-32k", 400.0, 2000),
            group("v2", "8k-32k", 1600.0, 500),
            group("v9", "8k-32k", 1.0, 100),
        ] {
            f.groups.insert(k, g);
        }
        let range = crate::range::Range { from: 0, to: 0 };
        let picked = pick(&f, range).expect("two versions");
        assert_eq!(picked, Versions { model: Some("m".into()), a: "v1".into(), b: "v2".into() }, "the busiest as A, the next as B");
        let ctx = Context { range, filter: Default::default(), now_ms: 0, budgets: vec![], top_users: 10, versions: Some(picked) };
        let mut notes = Vec::new();
        let tables = tables(&f, &ctx, &mut notes);
        let t = &tables[0];
        let at = |input: &str, output: &str, column: &str| {
            let row = t.rows.iter().find(|r| r[0].display() == input && r[1].display() == output).expect("row");
            row[t.column(column).expect("column")].clone()
        };
        assert_eq!(at("all", "all", "requests_a").value(), Some(4000.0), "v9 is neither A nor B");
        assert_eq!(at("all", "all", "requests_b").value(), Some(1000.0));
        assert_eq!(at("8k-32k", "all", "share_b").value(), Some(0.5));
        assert_eq!(at("8k-32k", "0-128", "share_b").value(), Some(1.0), "every 8k-32k request of B was short");
        assert_eq!(at("8k-32k", "all", "ttft_b_vs_a").display(), "slower p50, slower p99");
        assert_eq!(at("0-1k", "all", "ttft_b_vs_a").display(), "", "the same distribution");
        assert_eq!(at("0-1k", "all", "tpot_b_vs_a").display(), "too few", "no TPOT reported");
        let order: Vec<String> = t.rows.iter().map(|r| format!("{}/{}", r[0].display(), r[1].display())).collect();
        assert_eq!(order, ["all/all", "0-1k/all", "0-1k/0-128", "8k-32k/all", "8k-32k/0-128"]);
        assert!(notes.iter().any(|n| n.contains("hot days only")), "{notes:?}");
    }

    #[test]
    fn pairs_are_compared_request_by_request() {
        let p = Pairs { days: 1, pairs: 40, a_only_failed: 0, b_only_failed: 12, total_diffs: vec![5.0; 28], ttft_diffs: vec![-1.0, 0.0, 1.0] };
        let t = pairs(&p);
        let cells: Vec<Vec<String>> = t.rows.iter().map(|r| r.iter().map(Cell::display).collect()).collect();
        assert_eq!(cells[0], ["total", "28", "28", "0", "5.0", "slower"], "28 of 28 slower: z = 5.3");
        assert_eq!(cells[1], ["ttft", "3", "1", "1", "0.0", "too few"]);
        assert_eq!(cells[2], ["errors (only one version failed)", "40", "12", "0", "-", "more"], "z = 12/sqrt(12) = 3.46");
    }
}
