//! The `cost` view. In: the facts of the range and each business line's
//! budget status. Out: tokens and cost by business line, by model and
//! version, the top hashed users by tokens (hot days only: the aggregates
//! keep no users), and budget use with the month-end forecast. A line at
//! 90% of its budget or more is an alert (exit 1).

use std::collections::{BTreeMap, HashMap};

use inferlog_store::budget::{Unit, ALERT_RATIO};

use crate::document::{Cell, Kind, Table};
use crate::facts::{Counts, Facts, Tier};
use crate::views::{groups, Context};

const COLUMNS: [(&str, &str); 7] = [
    ("requests", "requests"),
    ("input_tokens", "input tokens"),
    ("cached_input_tokens", "cached input"),
    ("output_tokens", "output tokens"),
    ("cost_usd", "cost"),
    ("cost_share", "share"),
    ("unpriced_requests", "unpriced"),
];

fn cells(c: &Counts, total_cost: f64) -> Vec<Cell> {
    vec![
        Cell::count(c.totals.requests),
        Cell::count(c.totals.input_tokens),
        Cell::count(c.totals.cache_prefix_tokens),
        Cell::count(c.totals.output_tokens),
        Cell::num(c.cost(), Kind::of_cost(c)),
        Cell::num(c.cost().filter(|_| total_cost > 0.0).map(|cost| cost / total_cost), Kind::Share),
        Cell::count(c.unpriced_requests),
    ]
}

/// The hot days as runs, `none in the range` when there is none.
fn day_spans(days: &[i32]) -> String {
    if days.is_empty() {
        return "none in the range".into();
    }
    crate::range::runs_text(days)
}

pub fn tables(facts: &Facts, ctx: &Context, notes: &mut Vec<String>, alerts: &mut Vec<String>) -> Vec<Table> {
    let mut by_line: BTreeMap<String, Counts> = BTreeMap::new();
    let mut by_model: BTreeMap<(String, String), Counts> = BTreeMap::new();
    let mut total = Counts::default();
    for (k, g) in groups(facts, ctx.range, |_| true) {
        by_line.entry(k.business_line.clone()).or_default().add(&g.counts);
        by_model.entry((k.model_name.clone(), k.model_version.clone())).or_default().add(&g.counts);
        total.add(&g.counts);
    }
    let mut line_rows: Vec<(String, Counts)> = by_line.into_iter().collect();
    line_rows.sort_by(|a, b| b.1.cost_usd.total_cmp(&a.1.cost_usd).then(b.1.tokens().cmp(&a.1.tokens())));
    let mut columns = vec![("business_line", "business line")];
    columns.extend(COLUMNS);
    let mut lines = Table::new("cost_by_business_line", "tokens and cost by business line, highest cost first", &columns);
    for (line, c) in &line_rows {
        let mut row = vec![Cell::text(line.clone())];
        row.extend(cells(c, total.cost_usd));
        lines.push(row);
    }
    let mut columns = vec![("model_name", "model"), ("model_version", "version")];
    columns.extend(COLUMNS);
    let mut models = Table::new("cost_by_model", "tokens and cost by model and version", &columns);
    for ((model, version), c) in &by_model {
        let mut row = vec![Cell::text(model.clone()), Cell::text(version.clone())];
        row.extend(cells(c, total.cost_usd));
        models.push(row);
    }
    if total.unpriced_requests > 0 {
        notes.push(format!("{} requests have no price in [cost] prices: their tokens count, their cost does not", total.unpriced_requests));
    }

    let hot_days: Vec<i32> = facts.tiers.iter().filter(|(d, t)| *t == Tier::Hot && ctx.range.contains(*d)).map(|(d, _)| *d).collect();
    let mut users: HashMap<&str, (u64, u64)> = HashMap::new();
    for ((day, user), u) in &facts.users {
        if ctx.range.contains(*day) {
            let e = users.entry(user.as_str()).or_default();
            e.0 += u.requests;
            e.1 += u.tokens;
        }
    }
    let user_tokens: u64 = users.values().map(|u| u.1).sum();
    let mut top: Vec<(&str, (u64, u64))> = users.into_iter().collect();
    top.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(b.0)));
    let mut users_table = Table::new(
        "top_users",
        format!("top hashed users by tokens (hot days only: {})", day_spans(&hot_days)),
        &[("user", "hashed user"), ("requests", "requests"), ("tokens", "tokens"), ("token_share", "share of user tokens")],
    );
    for (user, (requests, tokens)) in top.into_iter().take(ctx.top_users) {
        users_table.push(vec![
            Cell::text(user),
            Cell::count(requests),
            Cell::count(tokens),
            Cell::num((user_tokens > 0).then(|| tokens as f64 / user_tokens as f64), Kind::Share),
        ]);
    }
    if hot_days.len() < ctx.range.days() as usize {
        notes.push("top users cover the hot days only: the aggregates tier keeps no user ids".into());
    }

    let mut budgets = Table::new(
        "budgets",
        format!("monthly budgets (alert at {:.0}%)", ALERT_RATIO * 100.0),
        &[
            ("business_line", "business line"),
            ("month", "month"),
            ("unit", "unit"),
            ("spent", "spent"),
            ("budget", "budget"),
            ("used", "used"),
            ("forecast", "month-end forecast"),
            ("forecast_used", "forecast used"),
        ],
    );
    for b in &ctx.budgets {
        let (unit, kind) = match b.unit {
            Unit::Usd => ("usd", Kind::Usd),
            Unit::Tokens => ("tokens", Kind::Count),
        };
        budgets.push(vec![
            Cell::text(b.business_line.clone()),
            Cell::text(b.month.clone()),
            Cell::text(unit),
            Cell::num(Some(b.spent), kind),
            Cell::num(b.budget, kind),
            Cell::num(b.used_ratio, Kind::Share),
            Cell::num(Some(b.forecast), kind),
            Cell::num(b.forecast_ratio, Kind::Share),
        ]);
        if b.over_alert() {
            alerts.push(format!("budget: {} has used {:.1}% of its {} budget", b.business_line, b.used_ratio.unwrap_or(0.0) * 100.0, b.month));
        }
    }
    vec![lines, models, users_table, budgets]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::facts::{GroupFacts, GroupKey};
    use crate::range::Range;

    fn add(f: &mut Facts, line: &str, model: &str, requests: u64, cost: Option<f64>) {
        let key = GroupKey::of(10, line, model, "v1", "0-1k");
        let mut counts = Counts {
            totals: inferlog_store::model::fold::Totals {
                requests,
                input_tokens: 100 * requests,
                output_tokens: 10 * requests,
                ..inferlog_store::model::fold::Totals::default()
            },
            ..Counts::default()
        };
        counts.price(cost);
        f.groups.insert(key, GroupFacts { counts, ..GroupFacts::default() });
    }

    #[test]
    fn an_unpriced_line_shows_no_cost_and_a_partly_priced_sum_is_marked() {
        let mut f = Facts::default();
        add(&mut f, "search", "priced", 10, Some(3.0));
        add(&mut f, "chat", "priced", 5, Some(1.0));
        add(&mut f, "chat", "unknown", 5, None);
        add(&mut f, "batch", "unknown", 7, None);
        let ctx = Context { range: Range { from: 10, to: 10 }, filter: Default::default(), now_ms: 0, budgets: vec![], top_users: 0, versions: None };
        let mut notes = Vec::new();
        let lines = &tables(&f, &ctx, &mut notes, &mut Vec::new())[0];
        let shown: Vec<(String, String, String, String)> =
            lines.rows.iter().map(|r| (r[0].display(), r[5].display(), r[6].display(), r[7].display())).collect();
        assert_eq!(
            shown,
            [
                ("search".into(), "$3.0000".into(), "75.00%".into(), "0".into()),
                ("chat".into(), "≥$1.0000".into(), "25.00%".into(), "5".into()),
                ("batch".into(), "-".into(), "-".into(), "7".into()),
            ],
            "batch had no price: no cost, not $0; chat's sum is partial"
        );
        assert_eq!(lines.rows[2][5].json(), serde_json::Value::Null);
        assert!(notes.iter().any(|n| n.starts_with("12 requests have no price")), "{notes:?}");
    }

    #[test]
    fn hot_days_read_as_runs() {
        assert_eq!(day_spans(&[]), "none in the range");
        assert_eq!(day_spans(&[0, 1, 2, 4]), "1970-01-01..1970-01-03, 1970-01-05");
    }
}
