//! The Grafana boards of `deploy/grafana/dashboards/` as tests run them
//! without Grafana: every panel's targets, with the variables and the
//! datasources' macros expanded as Grafana and its plugins expand them
//! for a fixed range.

use serde_json::Value;

use crate::repo_root;

/// The three boards.
pub const BOARDS: [&str; 3] = ["service", "pipeline", "history"];

/// The datasources the boards name, by uid
/// (deploy/grafana/provisioning/datasources/inferlog.yml).
pub const PROMETHEUS: &str = "inferlog-prometheus";
pub const CLICKHOUSE: &str = "inferlog-clickhouse";
pub const POSTGRES: &str = "inferlog-postgres";

/// The hot table as the boards name it (the example config's).
pub const HOT_TABLE: &str = "inferlog.inference_logs";

/// One query of one panel.
#[derive(Debug, Clone)]
pub struct Query {
    pub board: String,
    pub panel: String,
    /// The datasource's uid.
    pub datasource: String,
    /// PromQL or SQL, as the board stores it.
    pub text: String,
}

/// Every query of `board`, in panel order.
fn queries(board: &str) -> Vec<Query> {
    let path = repo_root().join(format!("deploy/grafana/dashboards/{board}.json"));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("a board")).expect("the board's JSON");
    let mut out = Vec::new();
    for panel in json["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let text = target["expr"]
                .as_str()
                .or_else(|| target["rawSql"].as_str())
                .unwrap_or_else(|| panic!("{board}: a target without a query: {target}"));
            out.push(Query {
                board: board.to_string(),
                panel: panel["title"].as_str().unwrap_or("").to_string(),
                datasource: target["datasource"]["uid"].as_str().unwrap_or("").to_string(),
                text: text.to_string(),
            });
        }
    }
    assert!(!out.is_empty(), "{board} has no queries");
    out
}

/// Every query of every board.
pub fn all_queries() -> Vec<Query> {
    BOARDS.iter().flat_map(|b| queries(b)).collect()
}

/// A PromQL query as Grafana sends it: the variables at "All" (`.*`),
/// `$__rate_interval` and `$__range` given.
pub fn promql(text: &str, rate_interval: &str, range: &str) -> String {
    text.replace("$business_line", ".*").replace("$model_version", ".*").replace("$__rate_interval", rate_interval).replace("$__range", range)
}

/// A UTC range of whole days, `from` 00:00:00 through `to` 23:59:59, as
/// the macros read it.
#[derive(Debug, Clone, Copy)]
pub struct Days {
    pub from: i32,
    pub to: i32,
}

impl Days {
    fn first_second(self) -> i64 {
        i64::from(self.from) * 86_400
    }

    fn last_second(self) -> i64 {
        (i64::from(self.to) + 1) * 86_400 - 1
    }
}

/// Replaces each `$__name(argument)` in `sql` with `expand(argument)`.
fn expand_calls(sql: &str, name: &str, expand: impl Fn(&str) -> String) -> String {
    let needle = format!("$__{name}(");
    let mut out = String::new();
    let mut rest = sql;
    while let Some(at) = rest.find(&needle) {
        out.push_str(&rest[..at]);
        let after = &rest[at + needle.len()..];
        let end = after.find(')').unwrap_or_else(|| panic!("unclosed {needle} in {sql}"));
        out.push_str(&expand(after[..end].trim()));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The ClickHouse plugin's (grafana-clickhouse-datasource 4.x) macros over
/// `days`, the hot table renamed to `table`.
pub fn clickhouse_sql(text: &str, days: Days, table: &str) -> String {
    let sql = expand_calls(text, "dateFilter", |c| {
        format!("{c} >= toDate('{}') AND {c} <= toDate('{}')", inferlog_store::day_string(days.from), inferlog_store::day_string(days.to))
    });
    let sql =
        expand_calls(&sql, "timeFilter", |c| format!("{c} >= toDateTime({}) AND {c} <= toDateTime({})", days.first_second(), days.last_second()));
    let sql = sql
        .replace("$__fromTime", &format!("toDateTime({})", days.first_second()))
        .replace("$__toTime", &format!("toDateTime({})", days.last_second()));
    assert!(!sql.contains("$__"), "a ClickHouse macro the tests do not expand: {sql}");
    sql.replace(HOT_TABLE, table)
}

/// Grafana's PostgreSQL macros over `days`.
pub fn postgres_sql(text: &str, days: Days) -> String {
    let stamp = |secs: i64| {
        let day = secs.div_euclid(86_400) as i32;
        let s = secs.rem_euclid(86_400);
        format!("'{}T{:02}:{:02}:{:02}Z'", inferlog_store::day_string(day), s / 3600, s / 60 % 60, s % 60)
    };
    let sql = expand_calls(text, "timeFilter", |c| format!("{c} BETWEEN {} AND {}", stamp(days.first_second()), stamp(days.last_second())));
    assert!(!sql.contains("$__"), "a PostgreSQL macro the tests do not expand: {sql}");
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macros_expand_as_the_plugins_do() {
        let days = Days { from: 20_000, to: 20_001 };
        assert_eq!(
            clickhouse_sql("SELECT 1 FROM inferlog.inference_logs WHERE $__dateFilter(day) AND $__timeFilter( event_time )", days, "db.t"),
            "SELECT 1 FROM db.t WHERE day >= toDate('2024-10-04') AND day <= toDate('2024-10-05') AND event_time >= toDateTime(1728000000) AND event_time <= toDateTime(1728172799)"
        );
        assert_eq!(postgres_sql("WHERE $__timeFilter(hour)", days), "WHERE hour BETWEEN '2024-10-04T00:00:00Z' AND '2024-10-05T23:59:59Z'");
        assert_eq!(promql("rate(x{a=~\"$business_line\"}[$__rate_interval])", "1m", "5m"), "rate(x{a=~\".*\"}[1m])");
    }
}
