//! The `errors` view. In: the facts of the range and of the range before.
//! Out: errors by code × stage × business line × input bucket, each as a
//! share of the requests of its business line and input bucket, against
//! the previous range. Rows are ordered by excess errors (the rise of the
//! share times the requests now: the errors the previous rate does not
//! explain), so that a 2% → 20% jump in a busy bucket comes before one
//! error among three requests. A rise of 5 points or more, or a share at
//! least doubled (and up a point), over at least [`MIN_ERRORS`] errors, is
//! marked.

use std::collections::BTreeMap;

use crate::document::{Cell, Kind, Table};
use crate::facts::Facts;
use crate::range::Range;
use crate::views::{bucket_rank, groups, Context};

/// A rise in share (points, as a fraction) that is always marked.
pub const RISE_POINTS: f64 = 0.05;
/// Fewer errors than this are never marked as a rise (noise).
pub const MIN_ERRORS: u64 = 5;

type ErrorGroup = (i32, String, String, String, String);
/// Errors per [`ErrorGroup`], and requests per (business line, input bucket).
type Counted = (BTreeMap<ErrorGroup, u64>, BTreeMap<(String, String), u64>);

/// One row: the group, errors and share now, errors and share before, the change of share.
struct Row {
    group: ErrorGroup,
    errors: u64,
    share: Option<f64>,
    previous_errors: u64,
    previous_share: Option<f64>,
    change: Option<f64>,
    /// `change` times the requests now.
    excess: Option<f64>,
}

/// Errors per (code, name, stage, business line, input bucket) and requests per (business line, input bucket) in `range`.
fn count(facts: &Facts, range: Range) -> Counted {
    let mut errors = BTreeMap::new();
    for (k, e) in facts.errors.iter().filter(|(k, _)| range.contains(k.day)) {
        *errors.entry((k.error_code, e.name.clone(), k.error_stage.clone(), k.business_line.clone(), k.input_bucket.clone())).or_default() +=
            e.errors;
    }
    let mut requests: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (k, g) in groups(facts, range, |_| true) {
        *requests.entry((k.business_line.clone(), k.input_bucket.clone())).or_default() += g.counts.totals.requests;
        // Days aggregated before errors had input buckets count against their whole line.
        *requests.entry((k.business_line.clone(), "*".to_owned())).or_default() += g.counts.totals.requests;
    }
    (errors, requests)
}

pub fn tables(facts: &Facts, ctx: &Context) -> Vec<Table> {
    let (now, before) = (count(facts, ctx.range), count(facts, ctx.range.previous()));
    let share = |(errors, requests): &Counted, key: &ErrorGroup| {
        let n = errors.get(key).copied().unwrap_or(0);
        let of = requests.get(&(key.3.clone(), key.4.clone())).copied().unwrap_or(0);
        (n, (of > 0).then(|| n as f64 / of as f64))
    };
    let mut keys: Vec<ErrorGroup> = now.0.keys().chain(before.0.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    let mut rows: Vec<Row> = keys
        .into_iter()
        .map(|group| {
            let (errors, share_now) = share(&now, &group);
            let (previous_errors, share_before) = share(&before, &group);
            let change = match (share_now, share_before) {
                (Some(x), Some(y)) => Some(x - y),
                (Some(x), None) => Some(x),
                (None, Some(y)) => Some(-y),
                (None, None) => None,
            };
            let requests = now.1.get(&(group.3.clone(), group.4.clone())).copied().unwrap_or(0) as f64;
            let excess = change.map(|c| c * requests);
            Row { group, errors, share: share_now, previous_errors, previous_share: share_before, change, excess }
        })
        .collect();
    // Most excess errors first, then bucket order.
    rows.sort_by(|a, b| {
        b.excess
            .unwrap_or(f64::MIN)
            .total_cmp(&a.excess.unwrap_or(f64::MIN))
            .then((a.group.3.as_str(), bucket_rank(&a.group.4)).cmp(&(b.group.3.as_str(), bucket_rank(&b.group.4))))
    });
    let mut table = Table::new(
        "errors",
        "errors by code, stage, business line and input bucket; share of the line's requests in the bucket, most excess errors first",
        &[
            ("code", "code"),
            ("name", "name"),
            ("stage", "stage"),
            ("business_line", "business line"),
            ("input_bucket", "input"),
            ("errors", "errors"),
            ("share", "share"),
            ("previous_errors", "previous errors"),
            ("previous_share", "previous share"),
            ("change", "change"),
            ("excess_errors", "excess errors"),
            ("rising", "rising"),
        ],
    );
    for Row { group: (code, name, stage, line, bucket), errors: a, share: sa, previous_errors: b, previous_share: sb, change: delta, excess } in rows
    {
        let rising = a >= MIN_ERRORS && delta.is_some_and(|d| d >= RISE_POINTS || (d >= 0.01 && sa.unwrap_or(0.0) >= 2.0 * sb.unwrap_or(0.0)));
        table.push(vec![
            Cell::text(code.to_string()),
            Cell::text(name),
            Cell::text(if stage.is_empty() { "-".to_owned() } else { stage }),
            Cell::text(line),
            Cell::text(bucket),
            Cell::count(a),
            Cell::num(sa, Kind::Share),
            Cell::count(b),
            Cell::num(sb, Kind::Share),
            Cell::num(delta, Kind::Points),
            Cell::num(excess, Kind::Rate),
            Cell::text(if rising { "RISING" } else { "" }),
        ]);
    }
    vec![table]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{ErrorFacts, ErrorKey, GroupKey};

    fn add(f: &mut Facts, day: i32, bucket: &str, requests: u64, code: i32, errors: u64) {
        let key = GroupKey::of(day, "chat", "m", "v", bucket);
        f.groups.entry(key).or_default().counts.totals.requests += requests;
        let key = ErrorKey {
            day,
            business_line: "chat".into(),
            model_name: "m".into(),
            model_version: "v".into(),
            input_bucket: bucket.into(),
            error_code: code,
            error_stage: "prefill".into(),
        };
        f.errors.insert(key, ErrorFacts { name: format!("e{code}"), errors });
    }

    #[test]
    fn a_share_that_jumps_comes_first_and_is_marked() {
        let mut f = Facts::default();
        // Previous day: length errors 2% of 8k-32k, timeouts 3% of 0-1k. This day: 20% and 3.5%.
        add(&mut f, 9, "8k-32k", 1000, 1002, 20);
        add(&mut f, 9, "0-1k", 1000, 1003, 30);
        add(&mut f, 10, "8k-32k", 1000, 1002, 200);
        add(&mut f, 10, "0-1k", 1000, 1003, 35);
        // A tiny bucket: one error among three requests (33%) is noise, not the headline.
        add(&mut f, 10, "32k+", 3, 1007, 1);
        let ctx = crate::views::Context {
            range: Range { from: 10, to: 10 },
            filter: Default::default(),
            now_ms: 0,
            budgets: vec![],
            top_users: 0,
            versions: None,
        };
        let t = &tables(&f, &ctx)[0];
        let first: Vec<String> = t.rows[0].iter().map(Cell::display).collect();
        assert_eq!(first, ["1002", "e1002", "prefill", "chat", "8k-32k", "200", "20.00%", "20", "2.00%", "+18.00 pt", "180.0", "RISING"]);
        assert_eq!(t.rows[1][9].display(), "+0.50 pt");
        assert_eq!(t.rows[1][11].display(), "", "half a point is not a rise worth marking");
        assert_eq!(
            (t.rows[2][0].display(), t.rows[2][10].display(), t.rows[2][11].display()),
            ("1007".into(), "1.0".into(), "".into()),
            "one error of three"
        );
    }
}
