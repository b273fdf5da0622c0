//! Hourly rollups, token cost, price corrections and budgets against the
//! real ClickHouse, Postgres and S3 server. Every figure is computed here
//! again from the generated events, with prices matched by this file's own
//! code, never by inferlog's.

use std::collections::BTreeMap;
use std::time::Duration;

use inferlog_schema::timestamp::{utc_day, MS_PER_DAY};
use inferlog_schema::InferenceEvent;
use inferlog_tests::tiers::{day_string, today, TierScenario};
use inferlog_tests::{free_loopback_addr, http_get, sigterm, wait_for};

/// USD per million (uncached input, cached input, output) tokens, and per request.
type Rates = (f64, f64, f64, f64);

/// The prices of the first config, matched by hand: `llama-3.1-*` changes
/// price on `change_day`; `*-instruct` covers qwen and mistral (llama's own
/// pattern is more specific); gpt-oss-20b has no price.
fn first_prices(model: &str, day: i32, change_day: i32) -> Option<Rates> {
    if model.starts_with("llama-3.1-") {
        Some(if day >= change_day { (0.6, 0.15, 0.8, 0.0) } else { (0.5, 0.1, 0.7, 0.0001) })
    } else if model.ends_with("-instruct") {
        Some((0.2, 0.2, 0.4, 0.0))
    } else {
        None
    }
}

/// After the correction: `*-instruct` costs more from the first day, and gpt-oss-20b is priced.
fn corrected_prices(model: &str, day: i32, change_day: i32) -> Option<Rates> {
    if model == "gpt-oss-20b" {
        Some((0.05, 0.05, 0.2, 0.0))
    } else if !model.starts_with("llama-3.1-") && model.ends_with("-instruct") {
        Some((0.25, 0.05, 0.5, 0.0))
    } else {
        first_prices(model, day, change_day)
    }
}

const FIRST_PRICES: &str = r#"
[[cost.prices]]
model = "llama-3.1-*"
effective_from = "2020-01-01"
input_usd_per_mtok = 0.5
cached_input_usd_per_mtok = 0.1
output_usd_per_mtok = 0.7
request_usd = 0.0001

[[cost.prices]]
model = "llama-3.1-*"
effective_from = "CHANGE_DAY"
input_usd_per_mtok = 0.6
cached_input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.8

[[cost.prices]]
model = "*-instruct"
effective_from = "2020-01-01"
input_usd_per_mtok = 0.2
output_usd_per_mtok = 0.4
"#;

const CORRECTION: &str = r#"
[[cost.prices]]
model = "*-instruct"
effective_from = "2020-01-02"
input_usd_per_mtok = 0.25
cached_input_usd_per_mtok = 0.05
output_usd_per_mtok = 0.5

[[cost.prices]]
model = "gpt-oss-20b"
effective_from = "2020-01-01"
input_usd_per_mtok = 0.05
output_usd_per_mtok = 0.2
"#;

fn day_of(e: &InferenceEvent) -> i32 {
    e.timestamp_ms.div_euclid(MS_PER_DAY) as i32
}

fn cost_of(e: &InferenceEvent, rates: Rates) -> f64 {
    let cached = f64::from(e.cache_prefix_tokens.unwrap_or(0).min(e.input_tokens));
    let uncached = f64::from(e.input_tokens) - cached;
    (uncached * rates.0 + cached * rates.1 + f64::from(e.output_tokens) * rates.2) / 1e6 + rates.3
}

/// Cost per (day, business line, model), `None` when unpriced; and unpriced requests per day.
fn expected_cost(events: &[InferenceEvent], prices: impl Fn(&str, i32) -> Option<Rates>) -> (BTreeMap<String, Option<f64>>, BTreeMap<String, u64>) {
    let mut cost: BTreeMap<String, Option<f64>> = BTreeMap::new();
    let mut unpriced: BTreeMap<String, u64> = BTreeMap::new();
    for e in events {
        let key = format!("{}|{}|{}", day_string(day_of(e)), e.business_line, e.model_name);
        match prices(&e.model_name, day_of(e)) {
            Some(rates) => *cost.entry(key).or_insert(Some(0.0)).get_or_insert(0.0) += cost_of(e, rates),
            None => {
                cost.insert(key, None);
                *unpriced.entry(day_string(day_of(e))).or_default() += 1;
            }
        }
    }
    (cost, unpriced)
}

/// The days of `month` (`YYYY-MM`), counted on the calendar here.
fn days_in_month(month: &str) -> usize {
    let first = inferlog_store::parse_day(&format!("{month}-01")).expect("a month");
    (first..first + 32).take_while(|d| day_string(*d).starts_with(month)).count()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-9)
}

fn assert_costs(s: &TierScenario, table: &str, expected: &BTreeMap<String, Option<f64>>, what: &str) {
    let stored = s.psql(&format!(
        "SELECT day || '|' || business_line || '|' || model_name, sum(cost_usd), bool_and(cost_usd IS NULL), bool_or(cost_usd IS NULL) \
         FROM {table} GROUP BY 1 ORDER BY 1"
    ));
    let mut seen = 0;
    for line in stored.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let want = expected.get(f[0]).unwrap_or_else(|| panic!("{what}: unexpected group {}", f[0]));
        assert_eq!(f[2] == "t", f[3] == "t", "{what}: {}: a model is priced on all of a day's rows or none", f[0]);
        match want {
            None => assert_eq!(f[2], "t", "{what}: {} has no price: cost NULL, never zero", f[0]),
            Some(cost) => {
                let got: f64 = f[1].parse().unwrap_or_else(|e| panic!("{what}: {line}: {e}"));
                assert!(close(got, *cost), "{what}: {}: stored {got}, expected {cost}", f[0]);
            }
        }
        seen += 1;
    }
    assert_eq!(seen, expected.len(), "{what}: every (day, business line, model) priced");
}

#[derive(Debug, Default, PartialEq)]
struct HourFigures {
    requests: u64,
    errors: u64,
    input_tokens: u64,
    output_tokens: u64,
    cache_prefix_tokens: u64,
    /// minute (epoch minutes) -> (requests, tokens)
    minutes: BTreeMap<i64, (u64, u64)>,
}

#[test]
fn hourly_rollups_cost_reprice_and_budgets_equal_independent_figures() {
    let last = today() - 2;
    let change_day = last - 1;
    let extra = FIRST_PRICES.replace("CHANGE_DAY", &day_string(change_day));
    let s = TierScenario::new("rollups", &extra);
    let mut events = TierScenario::events(15_000, 3, last, 41);
    // A burst: 40 requests of one group within one minute, so one hour's
    // peak stands well above the rest.
    let burst_at = i64::from(last) * MS_PER_DAY + 13 * 3_600_000 + 17 * 60_000;
    let template = events[0].clone();
    for i in 0..40 {
        let mut e = template.clone();
        e.request_id = format!("burst-{i}");
        e.timestamp_ms = burst_at + i * 1000;
        events.push(e);
    }
    s.insert(&events);

    // The daemon: it aggregates the days, counts the unpriced requests and exports the budgets.
    let addr = free_loopback_addr();
    s.rewrite_config("metrics_addr = \"\"", &format!("metrics_addr = \"{addr}\""));
    s.rewrite_config("[compactor]", "[budgets.lines.search]\nmonthly_usd = 0.01\n\n[compactor]");
    let mut daemon = s.spawn("inferlog-compactor", &[], "daemon.log", &[]);
    let unpriced_total = events.iter().filter(|e| e.model_name == "gpt-oss-20b").count() as u64;
    let metrics = || http_get(&addr, "/metrics");
    wait_for(
        Duration::from_secs(120),
        || {
            // The metrics come after the migrations; the days' states after the metrics.
            metrics().contains(&format!("inferlog_compactor_unpriced_requests_total{{model_name=\"gpt-oss-20b\"}} {unpriced_total}"))
                && metrics().contains("inferlog_budget_used_ratio{business_line=\"search\"}")
                && s.psql("SELECT count(*) FROM compactor_days WHERE state = 'aggregated'") == "3"
        },
        || format!("{}\n{}", metrics(), s.log("daemon.log")),
    );
    let scraped = metrics();
    sigterm(&mut daemon, Duration::from_secs(30));
    s.rewrite_config(&format!("metrics_addr = \"{addr}\""), "metrics_addr = \"\"");

    // Cost, daily and hourly, against prices matched here; the price change takes effect on its day.
    let (first, unpriced) = expected_cost(&events, |m, d| first_prices(m, d, change_day));
    assert_costs(&s, "daily_aggregates", &first, "daily, first prices");
    assert_costs(&s, "hourly_aggregates", &first, "hourly, first prices");
    let audited = s.psql("SELECT day, rows, unpriced_requests, detail FROM cost_audit WHERE action = 'unpriced' ORDER BY day");
    let expected_audit: Vec<String> = unpriced.iter().map(|(day, n)| format!("{day}\t{n}\t{n}\tno price for gpt-oss-20b: {n}")).collect();
    assert_eq!(audited, expected_audit.join("\n"), "the audit names each day's unpriced requests");
    // A day published again (`--day` redoes it) is no new finding: still one audit row per day.
    let (again, _) = unpriced.iter().next().expect("a day with unpriced requests");
    let (code, _) = s.run("inferlog-compactor", &["--day", again], "again.log");
    assert_eq!(code, 0, "{}", s.log("again.log"));
    assert!(s.log("again.log").contains("aggregates published"), "the day was published again: {}", s.log("again.log"));
    let audited = s.psql("SELECT day, rows, unpriced_requests, detail FROM cost_audit WHERE action = 'unpriced' ORDER BY day");
    assert_eq!(audited, expected_audit.join("\n"), "publishing a day again does not count its unpriced requests again");

    // The series rollup: per day × line × model × version, the counts, cost
    // and merged histograms against the events, and a range's p99 per
    // business line (the contract's long-range query) against the exact
    // floor-rank value, within the histograms' 1%.
    assert_costs(&s, "daily_series", &first, "series, first prices");
    let mut series: BTreeMap<String, (u64, u64, u64, u64, u64, u64)> = BTreeMap::new();
    let mut latencies: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for e in &events {
        let key = format!("{}|{}|{}|{}", day_string(day_of(e)), e.business_line, e.model_name, e.model_version);
        let f = series.entry(key).or_default();
        f.0 += 1;
        f.1 += u64::from(e.error_code != 0);
        f.2 += u64::from(e.input_tokens);
        f.3 += u64::from(e.output_tokens);
        f.4 += u64::from(e.cache_hit == Some(true));
        f.5 += u64::from(e.cache_prefix_tokens.unwrap_or(0));
        latencies.entry(e.business_line.as_str()).or_default().push(e.total_latency_ms);
    }
    let stored = s.psql(
        "SELECT day || '|' || business_line || '|' || model_name || '|' || model_version, requests, errors, input_tokens, output_tokens, \
         cache_hits, cache_prefix_tokens, inferlog_count(total_latency_hist), inferlog_count(ttft_hist) FROM daily_series ORDER BY 1",
    );
    for line in stored.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let want = series.get(f[0]).unwrap_or_else(|| panic!("unexpected series {}", f[0]));
        let n = |i: usize| f[i].parse::<u64>().unwrap_or_else(|e| panic!("{line}: column {i}: {e}"));
        assert_eq!((n(1), n(2), n(3), n(4), n(5), n(6), n(7)), (want.0, want.1, want.2, want.3, want.4, want.5, want.0), "{}: series totals", f[0]);
        assert!(n(8) <= want.0, "{line}: TTFT counted at most once per request");
    }
    assert_eq!(stored.lines().count(), series.len(), "every series stored, and nothing else");
    let p99s = s.psql("SELECT business_line, inferlog_quantile(inferlog_merge(total_latency_hist), 0.99) FROM daily_series GROUP BY 1 ORDER BY 1");
    for line in p99s.lines() {
        let (business_line, p99) = line.split_once('\t').expect("two columns");
        let values = latencies.get_mut(business_line).unwrap_or_else(|| panic!("unexpected line {business_line}"));
        values.sort_by(f64::total_cmp);
        let exact = values[((0.99 * values.len() as f64) as usize).min(values.len() - 1)];
        let got: f64 = p99.parse().expect("p99");
        assert!((got - exact).abs() <= 0.0101 * exact, "{business_line}: p99 {got} from the series, exact {exact}");
    }
    assert_eq!(p99s.lines().count(), latencies.len(), "every business line answered");

    // Hourly totals and the busiest minute.
    let mut hours: BTreeMap<String, HourFigures> = BTreeMap::new();
    for e in &events {
        let hour = e.timestamp_ms.div_euclid(3_600_000);
        let key = format!("{}|{}|{}|{}", hour, e.business_line, e.model_name, e.model_version);
        let h = hours.entry(key).or_default();
        h.requests += 1;
        h.errors += u64::from(e.error_code != 0);
        h.input_tokens += u64::from(e.input_tokens);
        h.output_tokens += u64::from(e.output_tokens);
        h.cache_prefix_tokens += u64::from(e.cache_prefix_tokens.unwrap_or(0));
        let m = h.minutes.entry(e.timestamp_ms.div_euclid(60_000)).or_default();
        m.0 += 1;
        m.1 += u64::from(e.input_tokens) + u64::from(e.output_tokens);
    }
    let stored = s.psql(
        "SELECT (extract(epoch FROM hour) / 3600)::bigint || '|' || business_line || '|' || model_name || '|' || model_version, day, requests, errors, \
         input_tokens, output_tokens, cache_prefix_tokens, (extract(epoch FROM peak_minute) / 60)::bigint, peak_minute_requests, peak_minute_tokens \
         FROM hourly_aggregates ORDER BY 1",
    );
    let mut seen = 0;
    let mut burst_seen = false;
    for line in stored.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let h = hours.get(f[0]).unwrap_or_else(|| panic!("unexpected hour group {}", f[0]));
        let n = |i: usize| f[i].parse::<u64>().unwrap_or_else(|e| panic!("{line}: column {i}: {e}"));
        let hour: i64 = f[0].split('|').next().and_then(|h| h.parse().ok()).expect("hour");
        assert_eq!(f[1], utc_day(hour * 3_600_000), "{line}: the hour's UTC day");
        assert_eq!(
            (n(2), n(3), n(4), n(5), n(6)),
            (h.requests, h.errors, h.input_tokens, h.output_tokens, h.cache_prefix_tokens),
            "{}: hourly totals",
            f[0]
        );
        // The most requests; of equals, the earliest minute.
        let (peak, (requests, tokens)) =
            h.minutes.iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0))).map(|(m, v)| (*m, *v)).expect("a minute");
        assert_eq!((f[7].parse::<i64>().expect("minute"), n(8), n(9)), (peak, requests, tokens), "{}: busiest minute", f[0]);
        burst_seen |= peak == burst_at / 60_000 && requests >= 40;
        seen += 1;
    }
    assert_eq!(seen, hours.len(), "every hour group stored, and nothing else");
    assert!(burst_seen, "the burst is the busiest minute of its hour");
    assert_eq!(
        s.psql("SELECT sum(requests), sum(input_tokens) FROM hourly_aggregates"),
        s.psql("SELECT sum(requests), sum(input_tokens) FROM daily_aggregates"),
        "hours add up to the days"
    );
    // Hourly histograms merge like the daily ones: one count per request.
    assert_eq!(s.psql("SELECT inferlog_count(inferlog_merge(total_latency_hist)) FROM hourly_aggregates"), events.len().to_string());

    // The budget the daemon exported is the report's figure.
    let (code, json) = s.run("inferlog-report", &["--format", "json", "budget"], "budget-today.log");
    assert!(code == 0 || code == 1, "{}", s.log("budget-today.log"));
    let report: serde_json::Value = serde_json::from_str(&json).expect("budget json");
    let search = report["lines"].as_array().expect("lines").iter().find(|l| l["business_line"] == "search").expect("search is configured");
    let used = search["used_ratio"].as_f64().expect("a configured budget has a ratio");
    let exported: f64 = scraped
        .lines()
        .find_map(|l| l.strip_prefix("inferlog_budget_used_ratio{business_line=\"search\"} "))
        .and_then(|v| v.parse().ok())
        .expect("exported ratio");
    // Both against the spend computed here: search's priced cost of the month of yesterday (the report's as-of is today).
    let month_now = &day_string(today() - 1)[..7];
    let spent_now: f64 =
        first.iter().filter(|(k, _)| k.starts_with(month_now) && k.split('|').nth(1) == Some("search")).filter_map(|(_, c)| *c).sum();
    assert!(close(used, spent_now / 0.01), "report {used}, from the events {}", spent_now / 0.01);
    assert!(close(exported, spent_now / 0.01), "exported {exported}, from the events {}", spent_now / 0.01);

    // Budgets as of the day after the last one: the month of `last`.
    let as_of = day_string(last + 1);
    let month = &day_string(last)[..7];
    let spent: f64 = first.iter().filter(|(k, _)| k.starts_with(month) && k.split('|').nth(1) == Some("search")).filter_map(|(_, c)| *c).sum();
    let (code, json) = s.run("inferlog-report", &["--format", "json", "budget", "--as-of", &as_of], "budget.log");
    assert_eq!(code, 1, "search spent {spent} USD of 0.01: over 90%, exit 1; {json}{}", s.log("budget.log"));
    let report: serde_json::Value = serde_json::from_str(&json).expect("budget json");
    let search = report["lines"].as_array().expect("lines").iter().find(|l| l["business_line"] == "search").expect("search");
    assert_eq!((search["unit"].as_str(), search["basis"].as_str(), search["budget"].as_f64()), (Some("usd"), Some("configured"), Some(0.01)));
    assert!(close(search["spent"].as_f64().expect("spent"), spent), "spent {} vs {spent}", search["spent"]);
    // The forecast at the rate of the month's days with aggregates (the event days in it), over the month's length.
    let covered = (last - 2..=last).filter(|d| day_string(*d).starts_with(month)).count() as f64;
    let days = days_in_month(month) as f64;
    assert_eq!(search["days_covered"].as_f64(), Some(covered), "{search}");
    assert!(close(search["forecast"].as_f64().expect("forecast"), spent / covered * days), "{search}");
    assert_eq!(report["over"][0], "search");
    let (code, text) = s.run("inferlog-report", &["budget", "--as-of", &as_of], "budget-text.log");
    assert_eq!(code, 1);
    assert!(text.lines().any(|l| l.starts_with("search") && l.ends_with("OVER 90%")), "{text}");
    // A generous budget: nothing over, exit 0.
    s.rewrite_config("monthly_usd = 0.01", "monthly_usd = 1000000.0");
    let (code, text) = s.run("inferlog-report", &["budget", "--as-of", &as_of], "budget-ok.log");
    assert_eq!(code, 0, "{text}{}", s.log("budget-ok.log"));
    let (code, _) = s.run("inferlog-report", &["budget", "--as-of", "yesterday"], "budget-bad.log");
    assert_eq!(code, 2, "a bad date is a usage error");
    assert!(s.log("budget-bad.log").contains("--as-of \"yesterday\""), "{}", s.log("budget-bad.log"));

    // A price correction, applied to the past by one audited command.
    s.rewrite_config("[compactor]", &format!("{CORRECTION}\n[compactor]"));
    let (from, to) = (day_string(last - 2), day_string(last));
    let (code, out) = s.run("inferlog-compactor", &["reprice", "--from", &from, "--to", &to, "--dry-run"], "dry.log");
    assert_eq!(code, 0, "{}", s.log("dry.log"));
    assert_eq!(out.lines().filter(|l| l.starts_with("would reprice ")).count(), 3, "{out}");
    assert_costs(&s, "daily_aggregates", &first, "after a dry run");
    let (code, out) = s.run("inferlog-compactor", &["reprice", "--from", &from, "--to", &to], "reprice.log");
    assert_eq!(code, 0, "{}", s.log("reprice.log"));
    let (corrected, _) = expected_cost(&events, |m, d| corrected_prices(m, d, change_day));
    assert_costs(&s, "daily_aggregates", &corrected, "daily, corrected prices");
    assert_costs(&s, "hourly_aggregates", &corrected, "hourly, corrected prices");
    assert_costs(&s, "daily_series", &corrected, "series, corrected prices");
    let audit = s.psql("SELECT day, rows > 0, unpriced_requests, cost_before < cost_after, prices LIKE 'sha256:%', actor FROM cost_audit WHERE action = 'reprice' ORDER BY day");
    let expected_audit: Vec<String> = (last - 2..=last).map(|d| format!("{}\tt\t0\tt\tt\tinferlog-compactor reprice", day_string(d))).collect();
    assert_eq!(audit, expected_audit.join("\n"), "one audit row per day repriced: {out}");
    for d in last - 2..=last {
        let after: f64 = corrected.iter().filter(|(k, _)| k.starts_with(&day_string(d))).filter_map(|(_, c)| *c).sum();
        let audited: f64 =
            s.psql(&format!("SELECT cost_after FROM cost_audit WHERE action = 'reprice' AND day = '{}'", day_string(d))).parse().expect("cost");
        assert!(close(audited, after), "{}: audited {audited}, expected {after}", day_string(d));
    }
    // Again: nothing changes, nothing is audited.
    let (code, out) = s.run("inferlog-compactor", &["reprice", "--from", &from, "--to", &to], "reprice2.log");
    assert_eq!(code, 0, "{}", s.log("reprice2.log"));
    assert!(out.lines().take(3).all(|l| l.contains(": 0 rows changed")), "{out}");
    assert_eq!(s.psql("SELECT count(*) FROM cost_audit WHERE action = 'reprice'"), "3");
    let (code, _) = s.run("inferlog-compactor", &["reprice", "--from", &to, "--to", &from], "reversed.log");
    assert_eq!(code, 2, "a reversed range is a usage error");
}

/// `inferlog_merge` in Postgres against the reference merge
/// ([`inferlog_schema::histogram::Histogram::merge`]) on random histograms:
/// disjoint, nested and overlapping bucket ranges, zeros only, empty, NULL,
/// each merged in two orders (the in-place path and the growing one).
#[test]
fn inferlog_merge_adds_histograms_as_the_reference_does() {
    use inferlog_schema::histogram::Histogram;
    use rand::{Rng, SeedableRng};
    // Every assertion below names the seed.
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = TierScenario::new("merge", "");
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "the catalog is created: {}", s.log("compactor.log"));
    let mut rows = Vec::new();
    let mut expected: BTreeMap<u32, Histogram> = BTreeMap::new();
    for i in 0..400 {
        let group = i % 4;
        let hist = if rng.gen_bool(0.05) {
            None
        } else {
            let mut h = Histogram::new();
            let (start, len) = (rng.gen_range(-40..400), rng.gen_range(0..300));
            for index in start..start + len {
                h.add_bucket(Some(index), rng.gen_range(0..20));
            }
            h.add_bucket(None, rng.gen_range(0..3));
            Some(h)
        };
        if let Some(h) = &hist {
            expected.entry(group).or_default().merge(h);
        }
        let text =
            hist.map_or("NULL".to_owned(), |h| format!("'{{{}}}'::bigint[]", h.encode().iter().map(i64::to_string).collect::<Vec<_>>().join(",")));
        rows.push(format!("({i}, {group}, {text})"));
    }
    s.psql("CREATE TABLE merge_input (i int, g int, h bigint[])");
    // In batches: one argument of a command line holds at most 128 KiB.
    for batch in rows.chunks(40) {
        s.psql(&format!("INSERT INTO merge_input VALUES {}", batch.join(",")));
    }
    for order in ["i", "i DESC"] {
        let merged = s.psql(&format!("SELECT g, array_to_string(inferlog_merge(h ORDER BY {order}), ',') FROM merge_input GROUP BY g ORDER BY g"));
        for line in merged.lines() {
            let (group, array) = line.split_once('\t').expect("two columns");
            let values: Vec<i64> = array.split(',').map(|v| v.parse().expect("bigint")).collect();
            let got = Histogram::decode(&values).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let want = &expected[&group.parse::<u32>().expect("group")];
            assert_eq!(got.encode(), want.encode(), "group {group}, order {order}, seed {seed}");
            assert_eq!(got.count(), want.count(), "seed {seed}");
        }
    }
}

/// A line without a configured budget gets 1.2 times its daily average of
/// the 30 days before the month, over the month's days; the peak GPU memory
/// columns are the exact floor-rank p50 / p99 and the max of the group's
/// requests. Both computed here from the events, on a month in the past
/// (the traffic straddles its first day).
#[test]
fn default_budgets_and_gpu_memory_equal_independent_figures() {
    let this_month = inferlog_store::parse_day(&format!("{}-01", &day_string(today())[..7])).expect("day");
    let month = day_string(this_month - 1)[..7].to_owned();
    let first = inferlog_store::parse_day(&format!("{month}-01")).expect("day");
    let flat = "[[cost.prices]]\nmodel = \"*\"\neffective_from = \"2020-01-01\"\ninput_usd_per_mtok = 0.5\n\
                cached_input_usd_per_mtok = 0.1\noutput_usd_per_mtok = 1.5\n";
    let s = TierScenario::new("default_budget", flat);
    // Four days before the month (its history), three in it.
    let events = TierScenario::events(8_000, 7, first + 2, 43);
    s.insert(&events);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "{}", s.log("compactor.log"));
    assert_eq!(s.psql("SELECT count(DISTINCT day) FROM daily_aggregates"), "7", "every day aggregated");

    let rates = (0.5, 0.1, 1.5, 0.0);
    let mut past: BTreeMap<&str, f64> = BTreeMap::new();
    let mut now: BTreeMap<&str, f64> = BTreeMap::new();
    for e in &events {
        let into = if day_of(e) < first { &mut past } else { &mut now };
        *into.entry(e.business_line.as_str()).or_default() += cost_of(e, rates);
    }
    let days = days_in_month(&month) as f64;
    let (code, json) = s.run("inferlog-report", &["--format", "json", "budget", "--as-of", &day_string(first + 3)], "budget.log");
    assert_eq!(code, 0, "three days at the usual rate use about a tenth of 1.2 months: {json}{}", s.log("budget.log"));
    let report: serde_json::Value = serde_json::from_str(&json).expect("budget json");
    let lines = report["lines"].as_array().expect("lines");
    assert_eq!(lines.len(), past.len(), "{json}");
    for line in lines {
        let name = line["business_line"].as_str().expect("line");
        let budget = 1.2 * past[name] / 4.0 * days;
        assert_eq!((line["basis"].as_str(), line["unit"].as_str()), (Some("default"), Some("usd")), "{line}");
        assert!(close(line["budget"].as_f64().expect("budget"), budget), "{name}: budget {}, from the events {budget}", line["budget"]);
        assert!(close(line["spent"].as_f64().expect("spent"), now[name]), "{name}: {line}");
        assert!(close(line["used_ratio"].as_f64().expect("used"), now[name] / budget), "{name}: {line}");
        assert!(close(line["forecast"].as_f64().expect("forecast"), now[name] / 3.0 * days), "{name}: {line}");
    }

    // GPU memory per group: exact p50 / p99 (0-based floor(q·n) rank), max and the histogram's count.
    let mut groups: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for e in &events {
        let key = format!(
            "{}|{}|{}|{}|{}|{}",
            day_string(day_of(e)),
            e.business_line,
            e.model_name,
            e.model_version,
            e.input_bucket().as_str(),
            e.output_bucket().as_str()
        );
        groups.entry(key).or_default().extend(e.gpu_mem_peak_mb);
    }
    let stored = s.psql(
        "SELECT day || '|' || business_line || '|' || model_name || '|' || model_version || '|' || input_bucket || '|' || output_bucket, \
         coalesce(gpu_mem_p50_mb::text, ''), coalesce(gpu_mem_p99_mb::text, ''), coalesce(gpu_mem_max_mb::text, ''), coalesce(inferlog_count(gpu_mem_hist), 0) \
         FROM daily_aggregates ORDER BY 1",
    );
    let mut with_gpu = 0;
    for row in stored.lines() {
        let f: Vec<&str> = row.split('\t').collect();
        let values = groups.get_mut(f[0]).unwrap_or_else(|| panic!("unexpected group {}", f[0]));
        assert_eq!(f[4], values.len().to_string(), "{}: histogram count", f[0]);
        if values.is_empty() {
            assert_eq!((f[1], f[2], f[3]), ("", "", ""), "{}: no request reported GPU memory: NULL", f[0]);
            continue;
        }
        values.sort_by(f64::total_cmp);
        let rank = |q: f64| values[((q * values.len() as f64) as usize).min(values.len() - 1)];
        let got = |i: usize| f[i].parse::<f64>().unwrap_or_else(|e| panic!("{row}: {e}"));
        assert!(close(got(1), rank(0.5)) && close(got(2), rank(0.99)), "{}: p50 {} p99 {}, exact {} {}", f[0], f[1], f[2], rank(0.5), rank(0.99));
        assert!(close(got(3), values[values.len() - 1]), "{}: max", f[0]);
        with_gpu += 1;
    }
    assert_eq!(stored.lines().count(), groups.len(), "every group stored, and nothing else");
    assert!(with_gpu > groups.len() / 2, "most groups report GPU memory: {with_gpu} of {}", groups.len());
}
