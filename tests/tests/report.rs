//! `inferlog-report` against the real ClickHouse, Postgres and S3 server:
//! a range spanning released days (answered by the Postgres aggregates) and
//! hot days (answered by ClickHouse), every figure computed here again from
//! the generated events; the same question answered by both tiers; and the
//! HTML page in a real headless Chromium (`tests/scripts/browser_check.py`).

use std::collections::BTreeMap;
use std::process::Command;

use inferlog_schema::timestamp::MS_PER_DAY;
use inferlog_schema::{ErrorStage, InferenceEvent};
use inferlog_tests::boards;
use inferlog_tests::tiers::{day_string, today, TierScenario};
use inferlog_tests::{clickhouse, repo_root};
use serde_json::Value;

/// One price for every model (USD per million uncached input, cached input, output tokens).
const PRICES: &str = "[[cost.prices]]\nmodel = \"*\"\neffective_from = \"2020-01-01\"\n\
    input_usd_per_mtok = 0.5\ncached_input_usd_per_mtok = 0.1\noutput_usd_per_mtok = 1.5\n\n\
    [retention]\nhot_days = 2\n\n[schema]\nmax_event_age = \"2d\"\n";

fn cost_of(e: &InferenceEvent) -> f64 {
    let cached = f64::from(e.cache_prefix_tokens.unwrap_or(0).min(e.input_tokens));
    ((f64::from(e.input_tokens) - cached) * 0.5 + cached * 0.1 + f64::from(e.output_tokens) * 1.5) / 1e6
}

fn day_of(e: &InferenceEvent) -> i32 {
    e.timestamp_ms.div_euclid(MS_PER_DAY) as i32
}

fn input_bucket(e: &InferenceEvent) -> &'static str {
    e.input_bucket().as_str()
}

/// The floor-rank quantile (0-based position floor(q·n)) of `values`.
fn exact(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((q * values.len() as f64) as usize).min(values.len() - 1)]
}

/// Within the histograms' 1% (plus the half unit a rounded figure may lose).
fn within_1pct(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 0.01 * want.abs() + 0.5e-9, "{what}: report {got}, exact {want}");
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{what}: report {got}, expected {want}");
}

/// Runs the report; (exit code, stdout).
fn report(s: &TierScenario, args: &[&str], log: &str) -> (i32, String) {
    s.run("inferlog-report", args, log)
}

fn report_json(s: &TierScenario, args: &[&str], log: &str) -> Value {
    let mut all = vec!["--format", "json"];
    all.extend_from_slice(args);
    let (code, out) = report(s, &all, log);
    assert!(code == 0 || code == 1, "exit {code}: {}", s.log(log));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The document's notes.
fn notes_of(doc: &Value) -> Vec<&str> {
    doc["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).collect()
}

/// A `latency` row's group: (business line, input bucket, output bucket).
fn latency_group(row: &Value) -> (String, String, String) {
    let text = |k: &str| row[k].as_str().unwrap_or("").to_owned();
    (text("business_line"), text("input_bucket"), text("output_bucket"))
}

fn rows<'a>(doc: &'a Value, table: &str) -> &'a Vec<Value> {
    doc["tables"][table]["rows"].as_array().unwrap_or_else(|| panic!("no table {table}: {doc}"))
}

fn metric(doc: &Value, key: &str) -> Value {
    rows(doc, "overview").iter().find(|r| r["metric"] == key).unwrap_or_else(|| panic!("no metric {key}"))["current"].clone()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn tiers(doc: &Value) -> Vec<(String, String)> {
    doc["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .map(|t| (t["day"].as_str().unwrap_or("").to_owned(), t["tier"].as_str().unwrap_or("").to_owned()))
        .collect()
}

/// Six days of traffic ending yesterday, compacted with a 2-day hot policy:
/// the four older days are released (aggregates only), the last two stay hot.
/// On the last day, 20% of one line's 1k-2k requests fail with
/// context_length_exceeded, so the errors view has a jump to find.
fn scenario(name: &str, count: usize, seed: u64) -> (TierScenario, Vec<InferenceEvent>, i32) {
    scenario_with(name, count, 6, seed, |_, _| {})
}

/// [`scenario`] over `days` days, with `plant` changing the events (given the day `t`) before they are stored.
fn scenario_with(
    name: &str,
    count: usize,
    days: u32,
    seed: u64,
    plant: impl FnOnce(&mut Vec<InferenceEvent>, i32),
) -> (TierScenario, Vec<InferenceEvent>, i32) {
    // The scenario first: it waits, if need be, until the clock is clear of midnight.
    let s = TierScenario::new(name, PRICES);
    let t = today();
    let mut events = TierScenario::events(count, days, t - 1, seed);
    plant(&mut events, t);
    let mut flipped = 0;
    for e in events.iter_mut().filter(|e| day_of(e) == t - 1 && e.business_line == "chat-assistant" && input_bucket(e) == "1k-2k") {
        flipped += 1;
        if flipped % 5 == 0 {
            e.error_code = 1002;
            e.error_stage = Some(ErrorStage::Prefill);
        }
    }
    s.insert(&events);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "{}", s.log("compactor.log"));
    let hot: Vec<String> = s.hot_days().into_iter().map(|(d, _)| d).collect();
    assert_eq!(hot, vec![day_string(t - 2), day_string(t - 1)], "the older days were released");
    (s, events, t)
}

#[test]
fn views_over_both_tiers_equal_independent_figures() {
    let (s, events, t) = scenario("report_views", 24_000, 61);
    let (from, to) = (day_string(t - 6), day_string(t - 1));
    let range = ["--from", from.as_str(), "--to", to.as_str()];
    let in_range: Vec<&InferenceEvent> = events.iter().collect();

    // Overview: which tier answered which day, and the headline figures.
    let doc = report_json(&s, &[&range[..], &["overview"]].concat(), "overview.log");
    let mut expected_tiers: Vec<(String, String)> = (t - 12..=t - 7).map(|d| (day_string(d), "none".to_owned())).collect();
    expected_tiers.extend((t - 6..=t - 3).map(|d| (day_string(d), "aggregates".to_owned())));
    expected_tiers.extend((t - 2..=t - 1).map(|d| (day_string(d), "hot".to_owned())));
    assert_eq!(tiers(&doc), expected_tiers, "released days from Postgres, hot days from ClickHouse, the previous week from nowhere");
    let requests = in_range.len() as f64;
    let errors = in_range.iter().filter(|e| e.error_code != 0).count() as f64;
    assert_eq!(f(&metric(&doc, "requests")), requests);
    close(f(&metric(&doc, "success_rate")), 1.0 - errors / requests, "success rate");
    close(f(&metric(&doc, "cost_usd")), in_range.iter().map(|e| cost_of(e)).sum(), "cost");
    let tokens: u64 = in_range.iter().map(|e| u64::from(e.input_tokens + e.output_tokens)).sum();
    close(f(&metric(&doc, "tokens_per_minute")), tokens as f64 / (6.0 * 1440.0), "tokens per minute");
    let length = in_range.iter().filter(|e| e.error_code == 1002).count() as f64;
    close(f(&metric(&doc, "error_share.context_length_exceeded")), length / requests, "length-exceeded share");
    for (key, q, pick) in [
        ("p99_ttft_ms", 0.99, (|e: &InferenceEvent| e.ttft_ms) as fn(&InferenceEvent) -> Option<f64>),
        ("p50_ttft_ms", 0.5, |e: &InferenceEvent| e.ttft_ms),
        ("p95_tpot_ms", 0.95, |e: &InferenceEvent| e.tpot_ms),
        ("p99_total_ms", 0.99, |e: &InferenceEvent| Some(e.total_latency_ms)),
    ] {
        let mut values: Vec<f64> = in_range.iter().filter_map(|e| pick(e)).collect();
        within_1pct(f(&metric(&doc, key)), exact(&mut values, q), key);
    }
    let previous = rows(&doc, "overview").iter().find(|r| r["metric"] == "requests").expect("requests")["previous"].clone();
    assert_eq!(previous, 0, "the week before holds nothing");

    // Latency: every group in bucket order, its count exact and its p99 within 1%.
    let doc = report_json(&s, &[&range[..], &["latency"]].concat(), "latency.log");
    let mut groups: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for e in &in_range {
        groups
            .entry((e.business_line.clone(), input_bucket(e).to_owned(), e.output_bucket().as_str().to_owned()))
            .or_default()
            .push(e.total_latency_ms);
    }
    let latency = rows(&doc, "latency");
    assert_eq!(latency.len(), groups.len(), "one row per business line x input x output bucket");
    for row in latency {
        let key = latency_group(row);
        let values = groups.get_mut(&key).unwrap_or_else(|| panic!("unexpected group {key:?}"));
        assert_eq!(row["requests"], values.len(), "{key:?}");
        within_1pct(f(&row["total_p99_ms"]), exact(values, 0.99), &format!("{key:?} total p99"));
        assert!(["queue", "prefill", "decode"].contains(&row["dominant_stage"].as_str().unwrap_or("")), "{row}");
    }
    let order: Vec<&str> = rows(&doc, "latency_by_input_bucket").iter().map(|r| r["input_bucket"].as_str().unwrap_or("")).collect();
    let mut natural = order.clone();
    natural.sort_by_key(|b| inferlog_schema::InputBucket::ALL.iter().position(|x| x.as_str() == *b));
    assert_eq!(order, natural, "buckets in their natural order, never alphabetical");
    let (code, text) = report(&s, &[&range[..], &["latency"]].concat(), "latency-text.log");
    assert_eq!(code, 0, "{}", s.log("latency-text.log"));
    assert!(
        text.contains(&format!(
            "answered by hot: {}..{}; aggregates: {}..{}",
            day_string(t - 2),
            day_string(t - 1),
            day_string(t - 6),
            day_string(t - 3)
        )),
        "{text}"
    );

    // Cost: per business line; top users from the hot days only.
    let doc = report_json(&s, &[&range[..], &["cost"]].concat(), "cost.log");
    let mut by_line: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for e in &in_range {
        let c = by_line.entry(e.business_line.clone()).or_default();
        c.0 += cost_of(e);
        c.1 += u64::from(e.output_tokens);
    }
    let lines = rows(&doc, "cost_by_business_line");
    assert_eq!(lines.len(), by_line.len());
    for row in lines {
        let (cost, output) = by_line[row["business_line"].as_str().unwrap_or("")];
        close(f(&row["cost_usd"]), cost, "cost by line");
        assert_eq!(row["output_tokens"], output);
    }
    let costs: Vec<f64> = lines.iter().map(|r| f(&r["cost_usd"])).collect();
    assert!(costs.windows(2).all(|w| w[0] >= w[1]), "highest cost first: {costs:?}");
    let mut users: BTreeMap<&str, u64> = BTreeMap::new();
    for e in in_range.iter().filter(|e| day_of(e) >= t - 2) {
        if let Some(u) = &e.user_id_hash {
            *users.entry(u.as_str()).or_default() += u64::from(e.input_tokens + e.output_tokens);
        }
    }
    let top = users.values().max().copied().expect("users");
    assert_eq!(rows(&doc, "top_users")[0]["tokens"], top, "top user by tokens over the hot days");
    assert!(doc["notes"].to_string().contains("top users cover the hot days only"), "{}", doc["notes"]);

    // Cache: hits per model version.
    let doc = report_json(&s, &[&range[..], &["cache"]].concat(), "cache.log");
    for row in rows(&doc, "cache") {
        let of_version = |e: &&&InferenceEvent| {
            e.model_name == row["model_name"].as_str().unwrap_or("") && e.model_version == row["model_version"].as_str().unwrap_or("")
        };
        assert_eq!(row["cache_hits"], in_range.iter().filter(of_version).filter(|e| e.cache_hit == Some(true)).count());
        let mut prefixes: Vec<f64> = in_range.iter().filter(of_version).filter_map(|e| e.cache_prefix_tokens.map(f64::from)).collect();
        if !prefixes.is_empty() {
            let want = exact(&mut prefixes, 0.5);
            assert!((f(&row["prefix_p50_tokens"]) - want).abs() <= 0.01 * want + 0.5, "{row}: exact p50 {want}");
        }
    }

    // Errors: the last day against the one before; the injected jump comes first.
    let last = day_string(t - 1);
    let doc = report_json(&s, &["--from", &last, "--to", &last, "errors"], "errors.log");
    let first = &rows(&doc, "errors")[0];
    assert_eq!(
        (first["code"].as_str(), first["business_line"].as_str(), first["input_bucket"].as_str()),
        (Some("1002"), Some("chat-assistant"), Some("1k-2k")),
        "{first}"
    );
    assert_eq!(first["rising"], "RISING");
    let line_bucket = |d: i32| events.iter().filter(move |e| day_of(e) == d && e.business_line == "chat-assistant" && input_bucket(e) == "1k-2k");
    let share = |d: i32| {
        line_bucket(d).filter(|e| e.error_code == 1002 && e.error_stage == Some(ErrorStage::Prefill)).count() as f64 / line_bucket(d).count() as f64
    };
    close(f(&first["share"]), share(t - 1), "share on the last day");
    close(f(&first["previous_share"]), share(t - 2), "share the day before");
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| day_of(e) == t - 1 && e.error_code != 0) {
        let stage = e.error_stage.map_or("-", |s| s.as_str());
        *counts.entry(format!("{}|{stage}|{}|{}", e.error_code, e.business_line, input_bucket(e))).or_default() += 1;
    }
    let reported: BTreeMap<String, u64> = rows(&doc, "errors")
        .iter()
        .filter(|r| r["errors"] != 0)
        .map(|r| {
            let k = format!(
                "{}|{}|{}|{}",
                r["code"].as_str().unwrap_or(""),
                r["stage"].as_str().unwrap_or(""),
                r["business_line"].as_str().unwrap_or(""),
                r["input_bucket"].as_str().unwrap_or("")
            );
            (k, r["errors"].as_u64().unwrap_or(0))
        })
        .collect();
    assert_eq!(reported, counts, "errors by code x stage x line x input bucket");

    // Capacity: requests per hour of day, tokens per day, the busiest minute.
    let doc = report_json(&s, &[&range[..], &["capacity"]].concat(), "capacity.log");
    let mut by_hour = [0u64; 24];
    let mut minutes: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for e in &in_range {
        by_hour[(e.timestamp_ms.div_euclid(3_600_000) % 24) as usize] += 1;
        *minutes.entry((format!("{}|{}|{}", e.business_line, e.model_name, e.model_version), e.timestamp_ms.div_euclid(60_000))).or_default() += 1;
    }
    let reported: Vec<u64> = rows(&doc, "by_hour_of_day").iter().map(|r| r["requests"].as_u64().unwrap_or(0)).collect();
    assert_eq!(reported, by_hour.to_vec());
    assert_eq!(rows(&doc, "busiest_minutes")[0]["requests"], minutes.values().max().copied().unwrap_or(0));
    for row in rows(&doc, "daily_tokens") {
        let day = inferlog_store::parse_day(row["day"].as_str().unwrap_or("")).expect("day");
        let want: u64 = in_range.iter().filter(|e| day_of(e) == day).map(|e| u64::from(e.input_tokens + e.output_tokens)).sum();
        assert_eq!(row["tokens"], want, "{row}");
    }

    // CSV: each table under its name, raw values.
    let (code, csv) = report(&s, &["--format", "csv", "--from", &from, "--to", &to, "cost"], "csv.log");
    assert_eq!(code, 0, "{}", s.log("csv.log"));
    assert!(csv.starts_with("# cost_by_business_line: "), "{csv}");
    assert!(csv.contains("\nbusiness_line,requests,input_tokens,cached_input_tokens,output_tokens,cost_usd,cost_share,unpriced_requests\n"), "{csv}");

    // Thresholds: crossed (exit 1, named), not crossed (exit 0), unknown metric (exit 2).
    let p99 = f(&metric(&report_json(&s, &[&range[..], &["overview"]].concat(), "o2.log"), "p99_ttft_ms"));
    let crossed = format!("p99_ttft_ms>{}", (p99 / 2.0).floor());
    let (code, out) = report(&s, &["--from", &from, "--to", &to, "--fail-if", &crossed, "overview"], "fail.log");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("ALERT: threshold {crossed}: p99_ttft_ms is")), "{out}");
    let (code, _) = report(&s, &["--from", &from, "--to", &to, "--fail-if", &format!("p99_ttft_ms>{}", p99 * 2.0), "overview"], "pass.log");
    assert_eq!(code, 0, "{}", s.log("pass.log"));
    let (code, _) = report(&s, &["--from", &from, "--to", &to, "--fail-if", "p99_ttfb_ms>1", "overview"], "bad.log");
    assert_eq!(code, 2);
    assert!(s.log("bad.log").contains("unknown metric \"p99_ttfb_ms\""), "{}", s.log("bad.log"));
    let (code, _) = report(&s, &["--from", &to, "--to", &from, "overview"], "reversed.log");
    assert_eq!(code, 2, "a reversed range is a usage error");
}

/// Every number of `a` equals `b`'s (floats to 1e-9), except the tables named.
fn assert_same_tables(a: &Value, b: &Value, except: &[&str]) {
    let (ta, tb) = (a["tables"].as_object().expect("tables"), b["tables"].as_object().expect("tables"));
    assert_eq!(ta.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>());
    for (name, table) in ta.iter().filter(|(n, _)| !except.contains(&n.as_str())) {
        let (ra, rb) = (table["rows"].as_array().expect("rows"), tb[name]["rows"].as_array().expect("rows"));
        assert_eq!(ra.len(), rb.len(), "{name}: rows");
        for (x, y) in ra.iter().zip(rb) {
            for (k, v) in x.as_object().expect("row") {
                match (v.as_f64(), y[k].as_f64()) {
                    (Some(p), Some(q)) => close(p, q, &format!("{name}.{k} in {x} vs {y}")),
                    _ => assert_eq!(v, &y[k], "{name}.{k}: {x} vs {y}"),
                }
            }
        }
    }
}

#[test]
fn the_same_question_gets_the_same_answer_from_either_tier() {
    let (s, _, t) = scenario("report_tiers", 12_000, 62);
    let (from, to) = (day_string(t - 2), day_string(t - 1));
    let args = ["--from", from.as_str(), "--to", to.as_str(), "page"];
    let hot = report_json(&s, &args, "hot.log");
    assert!(tiers(&hot).iter().filter(|(d, _)| *d >= from).all(|(_, tier)| tier == "hot"), "{:?}", tiers(&hot));
    // The compactor aggregated both hot days already; take their hot rows away.
    for d in [&from, &to] {
        clickhouse(&format!("ALTER TABLE {} DROP PARTITION '{d}'", s.qualified_table()));
    }
    let aggregates = report_json(&s, &args, "aggregates.log");
    assert!(tiers(&aggregates).iter().filter(|(d, _)| *d >= from).all(|(_, tier)| tier == "aggregates"), "{:?}", tiers(&aggregates));
    // The aggregates keep waste per line and request type but no prompts:
    // only the prompts' table counts the hot days alone (and says so).
    // Nor request types or callers: those tables count the hot days only.
    assert_same_tables(&hot, &aggregates, &["waste_prompts", "spike_callers", "compare_request_types"]);
    assert!(rows(&hot, "waste").iter().any(|r| f(&r["repeats"]) > 0.0), "the hot days' waste: {hot}");
    assert!(!rows(&aggregates, "waste_outputs").is_empty(), "{aggregates}");
    let notes = aggregates["notes"].as_array().expect("notes");
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with("waste_prompts:") && n.contains(&to))), "{notes:?}");
    for view in ["latency", "cache", "capacity"] {
        let a = report_json(&s, &["--from", &from, "--to", &to, view], &format!("{view}-agg.log"));
        assert!(!rows(&a, a["tables"].as_object().expect("tables").keys().next().expect("a table")).is_empty(), "{view}: {a}");
    }
}

#[test]
fn the_page_loads_in_chromium_without_network_and_shows_the_data() {
    // Repeated prompts and answers cut at max_tokens, for the waste charts.
    let (s, events, t) = scenario_with("report_page", 8_000, 6, 63, |events, _| {
        for e in events.iter_mut() {
            let coin = fnv(&e.request_id);
            e.prompt_hash = Some(if coin.is_multiple_of(3) { format!("k:tpl-{}", coin / 3 % 5) } else { format!("k:u-{}", e.request_id) });
            if (coin / 7).is_multiple_of(4) {
                e.max_tokens = Some(256);
                e.output_tokens = e.output_tokens.min(256);
            }
        }
    });
    let (from, to) = (day_string(t - 6), day_string(t - 1));
    let html = s.dir.path().join("page.html");
    let html_arg = html.to_str().expect("utf-8").to_owned();
    let doc = report_json(&s, &["--from", &from, "--to", &to, "--html", &html_arg, "page"], "page.log");
    let shot = s.dir.path().join("page.png");
    let out = Command::new("python3").arg(repo_root().join("tests/scripts/browser_check.py")).args([&html, &shot]).output().expect("python3");
    assert!(out.status.success(), "browser_check.py: {}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).expect("browser report");

    for key in ["console_errors", "exceptions", "log_errors"] {
        assert_eq!(seen[key], serde_json::json!([]), "{key}");
    }
    let page_url = format!("file://{}", html.display());
    let requests: Vec<&str> = seen["requests"].as_array().expect("requests").iter().filter_map(Value::as_str).collect();
    assert!(requests.iter().all(|u| *u == page_url || u.starts_with("data:")), "no request beyond the file itself: {requests:?}");
    assert_eq!(seen["scripts"], 0, "no script runs on the page");
    let shot_stats = &seen["screenshot"];
    assert!(shot_stats["colours"].as_u64().unwrap_or(0) > 20 && f(&shot_stats["nonwhite_share"]) > 0.02, "a blank screenshot: {shot_stats}");
    assert!(std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0) > 10_000, "screenshot written");

    let charts = seen["charts"].as_array().expect("charts");
    let ids: Vec<&str> = charts.iter().filter_map(|c| c["chart"].as_str()).collect();
    for id in [
        "requests",
        "tokens",
        "ttft",
        "tpot",
        "latency_by_input_bucket",
        "stages",
        "compare_ttft",
        "compare_total",
        "knee",
        "cost_by_business_line",
        "spikes",
        "waste",
        "waste_outputs",
        "cache",
        "errors",
    ] {
        assert!(ids.contains(&id), "chart {id} in {ids:?}");
    }
    for c in charts {
        assert!(c["drawn"].as_u64().unwrap_or(0) > 0, "chart without data: {c}");
        assert_eq!(c["drawn"], c["declared"], "{c}");
    }

    // Every figure shown is the JSON's, and shows it.
    let figures = seen["figures"].as_array().expect("figures");
    assert!(figures.len() > 100, "{} figures", figures.len());
    for fig in figures {
        let path = fig["figure"].as_str().unwrap_or("");
        let parts: Vec<&str> = path.splitn(3, '.').collect();
        let cell = &doc["tables"][parts[0]]["rows"][parts[1].parse::<usize>().expect("row")][parts[2]];
        let value = fig["value"].as_str().unwrap_or("");
        assert_eq!(if cell.is_null() { "null".to_owned() } else { cell.to_string() }, value, "{path}");
        let text = fig["text"].as_str().unwrap_or("");
        if let Some(v) = cell.as_f64() {
            let digits: String = text.chars().filter(|c| c.is_ascii_digit() || *c == '.' || *c == '-').collect();
            let shown: f64 = digits.parse().unwrap_or_else(|_| panic!("{path}: {text:?} shows no number"));
            let scale = if text.ends_with('%') || text.ends_with(" pt") { 100.0 } else { 1.0 };
            assert!(
                (shown - v * scale).abs() <= 0.5 * 10f64.powi(-(digits.split('.').nth(1).map_or(0, str::len) as i32)) + 1e-9,
                "{path}: {text:?} vs {v}"
            );
        } else {
            assert_eq!(text, "-", "{path}");
        }
    }

    // The figures on the cards equal those computed from the raw events.
    let card = |metric: &str| {
        let r = rows(&doc, "overview").iter().position(|r| r["metric"] == metric).expect("metric");
        let path = format!("overview.{r}.current");
        figures.iter().find(|f| f["figure"] == path.as_str()).unwrap_or_else(|| panic!("no card {metric}"))["text"].as_str().unwrap_or("").to_owned()
    };
    assert_eq!(card("requests"), events.len().to_string());
    let ok = events.iter().filter(|e| e.error_code == 0).count() as f64 / events.len() as f64;
    assert_eq!(card("success_rate"), format!("{:.2}%", ok * 100.0));
    assert_eq!(card("cost_usd"), format!("${:.4}", events.iter().map(cost_of).sum::<f64>()));
    let mut ttft: Vec<f64> = events.iter().filter_map(|e| e.ttft_ms).collect();
    let shown: f64 = card("p99_ttft_ms").parse().expect("ms");
    within_1pct(shown, exact(&mut ttft, 0.99), "p99 TTFT card (0.05 ms of rounding aside)");
    let page = std::fs::read_to_string(&html).expect("page");
    assert!(page.contains(&format!(
        "answered by hot: {}..{}; aggregates: {}..{}",
        day_string(t - 2),
        day_string(t - 1),
        day_string(t - 6),
        day_string(t - 3)
    )));
}

#[test]
fn an_unreachable_hot_tier_leaves_the_aggregates_answering() {
    let (s, events, t) = scenario("report_no_hot", 6_000, 64);
    // Nothing listens on port 1: ClickHouse "is down" for this report only.
    s.rewrite_config(&inferlog_tests::clickhouse_url(), "http://127.0.0.1:1");
    let (from, to) = (day_string(t - 6), day_string(t));
    let (code, out) = report(&s, &["--format", "json", "--from", &from, "--to", &to, "latency"], "no-hot.log");
    assert_eq!(code, 0, "{}", s.log("no-hot.log"));
    let doc: Value = serde_json::from_str(&out).expect("json");
    let mut expected: Vec<(String, String)> = (t - 6..=t - 1).map(|d| (day_string(d), "aggregates".to_owned())).collect();
    expected.push((day_string(t), "none".to_owned()));
    assert_eq!(tiers(&doc), expected, "every aggregated day, hot or not, is answered by Postgres; today by nobody");
    let requests: u64 = rows(&doc, "latency").iter().map(|r| r["requests"].as_u64().unwrap_or(0)).sum();
    assert_eq!(requests, events.len() as u64);
    let notes = doc["notes"].to_string();
    assert!(notes.contains("the hot tier did not answer"), "{notes}");
    assert!(notes.contains(&format!("no tier holds {}", day_string(t))), "{notes}");
    assert!(s.log("no-hot.log").contains("the hot tier is unreachable"), "{}", s.log("no-hot.log"));
}

/// A day the compactor releases while a report reads it: the report had
/// listed it as hot, then the partition was dropped before its rows were
/// read. It is answered by the aggregates (which hold it before it is
/// released), never shown as a day without traffic.
#[test]
fn a_day_released_while_the_report_reads_it_is_answered_by_the_aggregates() {
    let (s, events, t) = scenario("report_released", 6_000, 65);
    let resume = s.dir.path().join("resume");
    let (from, to) = (day_string(t - 6), day_string(t - 1));
    let resume_text = resume.to_string_lossy().into_owned();
    let child = s.spawn(
        "inferlog-report",
        &["--format", "json", "--from", &from, "--to", &to, "overview"],
        "held.log",
        &[("INFERLOG_REPORT_HOLD_AFTER", "routed"), (inferlog_store::test_hooks::RESUME_FILE_ENV, &resume_text)],
    );
    inferlog_tests::wait_for(std::time::Duration::from_secs(60), || s.log("held.log").contains("held here until"), || s.log("held.log"));

    // Meanwhile the hot policy shrinks to one day and the compactor releases t-2.
    s.rewrite_config("hot_days = 2", "hot_days = 1");
    s.rewrite_config("max_event_age = \"2d\"", "max_event_age = \"1d\"");
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor-1d.log");
    assert_eq!(code, 0, "{}", s.log("compactor-1d.log"));
    let hot: Vec<String> = s.hot_days().into_iter().map(|(d, _)| d).collect();
    assert_eq!(hot, vec![day_string(t - 1)], "t-2 was released while the report held its routes");

    std::fs::write(&resume, "").expect("resume");
    let out = child.wait_with_output().expect("report");
    assert_eq!(out.status.code(), Some(0), "{}", s.log("held.log"));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    let answered: Vec<(String, String)> = tiers(&doc).into_iter().filter(|(d, _)| *d >= from).collect();
    let mut expected: Vec<(String, String)> = (t - 6..=t - 2).map(|d| (day_string(d), "aggregates".to_owned())).collect();
    expected.push((day_string(t - 1), "hot".to_owned()));
    assert_eq!(answered, expected, "the released day is answered by the aggregates");
    assert_eq!(f(&metric(&doc, "requests")), events.len() as f64, "every request of the range, none lost with the drop");
    let notes = doc["notes"].to_string();
    assert!(notes.contains(&format!("{} released from the hot tier while the report read it", day_string(t - 2))), "{notes}");
}

/// Version B of one model is three times slower to the first token on
/// long inputs (8k tokens and more) and the same elsewhere; on the hot days,
/// some of A's requests were also served by B (shadow traffic), 50 ms
/// slower in total. `compare` must mark the long buckets and only them,
/// count every pair, and agree with the events on every count and p99.
#[test]
fn compare_marks_the_version_slower_on_long_inputs_and_compares_its_shadow_pairs() {
    const MODEL: &str = "llama-3.1-70b-instruct";
    const A: &str = "2024-07-23";
    const B: &str = "2024-09-25";
    let long = |e: &InferenceEvent| ["8k-32k", "32k+"].contains(&input_bucket(e));
    let mut shadowed = 0u64;
    let (s, events, t) = scenario_with("report_compare", 24_000, 6, 71, |events, t| {
        // Long inputs are rare in generated traffic: a quarter of the model's requests become 9k-29k tokens long.
        for (i, e) in events.iter_mut().filter(|e| e.model_name == MODEL).enumerate().filter(|(i, _)| i % 4 == 0) {
            e.input_tokens = 9_000 + (i as u32 * 37) % 20_000;
        }
        for e in events.iter_mut().filter(|e| e.model_name == MODEL && e.model_version == B && long(e)) {
            let ttft = e.ttft_ms.unwrap_or(0.0);
            e.ttft_ms = Some(3.0 * ttft);
            e.total_latency_ms += 2.0 * ttft;
        }
        let mut shadows = Vec::new();
        for e in events.iter().filter(|e| e.model_name == MODEL && e.model_version == A && day_of(e) >= t - 2).step_by(4) {
            let mut b = e.clone();
            b.model_version = B.into();
            b.total_latency_ms += 50.0;
            shadows.push(b);
        }
        shadowed = shadows.len() as u64;
        events.extend(shadows);
    });
    let (from, to) = (day_string(t - 6), day_string(t - 1));
    let doc = report_json(&s, &["--from", &from, "--to", &to, "compare", "--model", MODEL, "--a", A, "--b", B], "compare.log");

    // Independent figures per (input, output) row, "all" included: per version (requests, errors, TTFTs).
    type Side = (u64, u64, Vec<f64>);
    let mut by_row: BTreeMap<(String, String), [Side; 2]> = BTreeMap::new();
    for e in events.iter().filter(|e| e.model_name == MODEL) {
        let side = match e.model_version.as_str() {
            A => 0,
            B => 1,
            _ => continue,
        };
        let (i, o) = (input_bucket(e).to_owned(), e.output_bucket().as_str().to_owned());
        for key in [("all".to_owned(), "all".to_owned()), (i.clone(), "all".to_owned()), (i, o)] {
            let entry = &mut by_row.entry(key).or_default()[side];
            entry.0 += 1;
            entry.1 += u64::from(e.error_code != 0);
            entry.2.extend(e.ttft_ms);
        }
    }
    // Per request type: the hot days only (the aggregates keep no request type).
    let mut by_type: BTreeMap<String, [Side; 2]> = BTreeMap::new();
    for e in events.iter().filter(|e| e.model_name == MODEL && day_of(e) >= t - 2) {
        let Some(side) = [A, B].iter().position(|v| *v == e.model_version) else { continue };
        let entry = &mut by_type.entry(e.request_type.clone().unwrap_or_else(|| "-".into())).or_default()[side];
        entry.0 += 1;
        entry.1 += u64::from(e.error_code != 0);
        entry.2.extend(e.ttft_ms);
    }
    let types = rows(&doc, "compare_request_types");
    assert_eq!(types.len(), by_type.len(), "{types:?}");
    for row in types {
        let name = row["request_type"].as_str().unwrap_or("");
        let sides = by_type.get_mut(name).unwrap_or_else(|| panic!("unexpected request type {name}"));
        for (i, suffix) in ["a", "b"].iter().enumerate() {
            let (n, errors, ttft) = &mut sides[i];
            assert_eq!(row[format!("requests_{suffix}")], *n, "{name} requests {suffix}");
            close(f(&row[format!("error_share_{suffix}")]), *errors as f64 / *n as f64, &format!("{name} errors {suffix}"));
            within_1pct(f(&row[format!("ttft_p99_ms_{suffix}")]), exact(ttft, 0.99), &format!("{name} TTFT p99 {suffix}"));
        }
    }
    let notes = doc["notes"].as_array().expect("notes");
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with("by request type: the 2 of the range's 6 days"))), "{notes:?}");

    let table = rows(&doc, "compare");
    assert_eq!(table.len(), by_row.len(), "one row per input x output bucket both versions served, plus the totals");
    for row in table {
        let key = (row["input_bucket"].as_str().unwrap_or("").to_owned(), row["output_bucket"].as_str().unwrap_or("").to_owned());
        let sides = by_row.get_mut(&key).unwrap_or_else(|| panic!("unexpected row {key:?}"));
        for (i, suffix) in ["a", "b"].iter().enumerate() {
            let (n, errors, ttft) = &mut sides[i];
            assert_eq!(row[format!("requests_{suffix}")], *n, "{key:?} requests {suffix}");
            if *n > 0 {
                close(f(&row[format!("error_share_{suffix}")]), *errors as f64 / *n as f64, &format!("{key:?} errors {suffix}"));
            }
            if !ttft.is_empty() {
                within_1pct(f(&row[format!("ttft_p99_ms_{suffix}")]), exact(ttft, 0.99), &format!("{key:?} TTFT p99 {suffix}"));
            }
        }
        let mark = row["ttft_b_vs_a"].as_str().unwrap_or("?");
        let (n_a, n_b) = (sides[0].0, sides[1].0);
        if key.1 != "all" || key.0 == "all" {
            continue;
        }
        if ["8k-32k", "32k+"].contains(&key.0.as_str()) {
            if n_a.min(n_b) >= 300 {
                assert!(mark.contains("slower p99") && mark.contains("slower p50"), "{key:?} ({n_a} vs {n_b}): {mark:?}");
            }
            assert!(!mark.contains("faster"), "{key:?}: {mark:?}");
        } else {
            assert!(mark.is_empty() || mark == "too few", "{key:?} is not slower ({n_a} vs {n_b}): {mark:?}");
        }
    }
    let long_row = table.iter().find(|r| r["input_bucket"] == "8k-32k" && r["output_bucket"] == "all").expect("8k-32k row");
    assert!(long_row["requests_a"].as_u64().unwrap_or(0) >= 300, "the traffic has long inputs to compare: {long_row}");

    // The pairs: every shadowed request of the hot days, B 50 ms slower where both succeeded.
    let pairs = rows(&doc, "compare_pairs");
    let total = pairs.iter().find(|r| r["measure"] == "total").expect("total");
    let shadow_ok = events.iter().filter(|e| e.model_name == MODEL && e.model_version == B && day_of(e) >= t - 2 && e.error_code == 0).count();
    assert_eq!(pairs.iter().find(|r| r["measure"].as_str().is_some_and(|m| m.starts_with("errors"))).expect("errors")["pairs"], shadowed);
    assert!(total["pairs"].as_u64().unwrap_or(0) > 0 && total["pairs"].as_u64().unwrap_or(0) <= shadow_ok as u64, "{total}");
    assert_eq!(total["b_higher"], total["pairs"], "every pair is slower on B: {total}");
    close(f(&total["median_b_minus_a_ms"]), 50.0, "median difference");
    assert_eq!(total["b_vs_a"], "slower");
    let (code, text) = report(&s, &["--from", &from, "--to", &to, "compare", "--model", MODEL, "--a", A, "--b", B], "compare-text.log");
    assert_eq!(code, 0, "{}", s.log("compare-text.log"));
    assert!(text.contains("Mood's quantile test"), "the text names its test: {text}");
}

/// `ms` more in the queue: the request's TTFT and total latency grow with it.
fn queue_longer(e: &mut InferenceEvent, ms: f64) {
    e.queue_wait_ms = Some(e.queue_wait_ms.unwrap_or(0.0) + ms);
    e.ttft_ms = e.ttft_ms.map(|v| v + ms);
    e.total_latency_ms += ms;
}

/// The diagnosis path of a `diagnose` document, required to pass the
/// success rate and stop at a worse TTFT p99; its TTFT step.
fn ttft_step(doc: &Value) -> Value {
    let path = rows(doc, "diagnosis");
    let steps: Vec<(&str, &str)> = path.iter().map(|r| (r["step"].as_str().unwrap_or(""), r["verdict"].as_str().unwrap_or(""))).collect();
    assert_eq!(steps, [("success rate", "fine"), ("TTFT p99", "worse")], "{path:?}");
    path[1].clone()
}

/// How many more of `current` lie above `split` than `before`'s share
/// above it predicts: a range's excess tail, computed from the events.
fn excess_above(split: f64, before: &[f64], current: &[f64]) -> f64 {
    let above = |v: &[f64]| v.iter().filter(|x| **x > split).count() as f64;
    above(current) - current.len() as f64 * above(before) / before.len() as f64
}

/// In the last three days, requests of 8k-32k input tokens wait 3 s more
/// in the queue. `diagnose` must pass the success rate, stop at TTFT p99,
/// and name that input bucket and the queue, with the p99s and the share
/// explained computed again from the events.
#[test]
fn diagnose_stops_at_ttft_and_names_the_input_bucket_that_queues() {
    let (s, events, t) = scenario_with("report_diagnose", 24_000, 6, 73, |events, t| {
        for e in events.iter_mut().filter(|e| day_of(e) >= t - 3 && input_bucket(e) == "8k-32k" && e.ttft_ms.is_some()) {
            queue_longer(e, 3000.0);
        }
    });
    let (from, to) = (day_string(t - 3), day_string(t - 1));
    let doc = report_json(&s, &["--from", &from, "--to", &to, "diagnose"], "diagnose.log");
    let ttft = &ttft_step(&doc);
    assert_eq!((ttft["dimension"].as_str(), ttft["value"].as_str()), (Some("input bucket"), Some("8k-32k")), "{ttft}");
    assert!(ttft["stage"].as_str().is_some_and(|s| s.starts_with("queue p99")), "{ttft}");

    let now = |e: &&InferenceEvent| day_of(e) >= t - 3;
    let ttfts = |keep: &dyn Fn(&&InferenceEvent) -> bool| events.iter().filter(keep).filter_map(|e| e.ttft_ms).collect::<Vec<f64>>();
    let mut before = ttfts(&|e| !now(e));
    let mut current = ttfts(&now);
    let split = exact(&mut before, 0.99);
    within_1pct(f(&ttft["previous"]), split, "previous TTFT p99");
    within_1pct(f(&ttft["current"]), exact(&mut current, 0.99), "current TTFT p99");
    // The excess tail above the previous p99, and the 8k-32k bucket's part of it.
    let excess = excess_above(split, &before, &current);
    let bucket = |e: &&InferenceEvent| input_bucket(e) == "8k-32k";
    let (b_now, b_before) = (ttfts(&|e| now(e) && bucket(e)), ttfts(&|e| !now(e) && bucket(e)));
    let part = excess_above(split, &b_before, &b_now);
    let explains = f(&ttft["explains"]);
    assert!((explains - part / excess).abs() < 0.05, "explains {explains}, from the events {}", part / excess);
    let dims = rows(&doc, "diagnosis_dimensions");
    assert_eq!(dims[0]["dimension"], "input bucket", "the input bucket explains most: {dims:?}");
    assert!(dims.iter().any(|d| d["dimension"] == "business line" && f(&d["explains"]) < explains), "{dims:?}");
    // The previous range is the aggregates': no GPU to name, and a note says so.
    assert!(!dims.iter().any(|d| d["dimension"] == "GPU"), "{dims:?}");
    let notes = notes_of(&doc);
    assert!(notes.iter().any(|n| n.contains("GPU is no dimension") && n.contains(&from)), "{notes:?}");
}

/// Yesterday the requests served by one GPU wait 3 s more in its queue.
/// `diagnose` for yesterday against the day before (both hot) must stop at
/// TTFT p99 and name that GPU and the queue, with the share explained
/// computed again from the events.
#[test]
fn diagnose_names_the_gpu_whose_queue_grew() {
    const GPU: u32 = 7;
    let (s, events, t) = scenario_with("report_diagnose_gpu", 36_000, 6, 79, |events, t| {
        for e in events.iter_mut().filter(|e| day_of(e) == t - 1 && e.gpu_id == Some(GPU) && e.ttft_ms.is_some()) {
            queue_longer(e, 3000.0);
        }
    });
    let day = day_string(t - 1);
    let doc = report_json(&s, &["--from", &day, "--to", &day, "diagnose"], "diagnose.log");
    assert!(tiers(&doc).iter().all(|(_, tier)| tier == "hot"), "both days hot: {:?}", tiers(&doc));
    let ttft = &ttft_step(&doc);
    assert_eq!((ttft["dimension"].as_str(), ttft["value"].as_str()), (Some("GPU"), Some("gpu 7")), "{ttft}");
    assert!(ttft["stage"].as_str().is_some_and(|s| s.starts_with("queue p99")), "{ttft}");

    let ttfts = |keep: &dyn Fn(&&InferenceEvent) -> bool| events.iter().filter(keep).filter_map(|e| e.ttft_ms).collect::<Vec<f64>>();
    let (mut before, current) = (ttfts(&|e| day_of(e) == t - 2), ttfts(&|e| day_of(e) == t - 1));
    let split = exact(&mut before, 0.99);
    let excess = excess_above(split, &before, &current);
    let on_gpu = |d: i32| ttfts(&|e| day_of(e) == d && e.gpu_id == Some(GPU));
    let part = excess_above(split, &on_gpu(t - 2), &on_gpu(t - 1));
    let explains = f(&ttft["explains"]);
    assert!((explains - part / excess).abs() < 0.05, "explains {explains}, from the events {}", part / excess);
    let notes = notes_of(&doc);
    assert!(!notes.iter().any(|n| n.contains("GPU is no dimension")), "{notes:?}");
}

/// Repeated prompts, long outputs and answers cut at max_tokens planted
/// in generated traffic: a third of `search`'s requests send one of seven
/// templates from three callers (the cron-job pattern), the rest of the
/// prompts are unique, a fifth carry none; 30% of requests set
/// `max_tokens` 256 and longer answers are cut there; 2% of `summarize`
/// answers run 20 times long. `waste` over a released day and the two hot
/// days must count all three (the released one from what the aggregates
/// kept, its prompts unlisted, and say so), with every figure computed
/// here again from the events.
#[test]
fn waste_finds_repeated_prompts_their_callers_and_answers_cut_at_max_tokens() {
    let (s, events, t) = scenario_with("report_waste", 16_000, 6, 83, |events, _| {
        for e in events.iter_mut() {
            let coin = fnv(&e.request_id);
            e.prompt_hash = match coin % 15 {
                0..3 => None,
                3..8 if e.business_line == "search" => {
                    e.user_id_hash = Some(format!("k:caller-{}", coin / 15 % 3));
                    Some(format!("k:tpl-{}", coin / 45 % 7))
                }
                _ => Some(format!("k:u-{}", e.request_id)),
            };
            if coin / 1000 % 10 < 3 {
                e.max_tokens = Some(256);
                e.output_tokens = e.output_tokens.min(256);
            }
            if e.request_type.as_deref() == Some("summarize") && (coin / 7).is_multiple_of(50) {
                e.output_tokens = e.output_tokens.saturating_mul(20).max(4000);
                e.max_tokens = None;
            }
        }
    });
    let (from, to) = (day_string(t - 3), day_string(t - 1));
    let doc = report_json(&s, &["--from", &from, "--to", &to, "waste", "--top", "5"], "waste.log");
    let notes = notes_of(&doc);
    // The released day counts from what the aggregates kept of it; only its prompts are not listed.
    assert!(notes.iter().any(|n| n.starts_with("waste_prompts:") && n.contains(&from)), "the released day's prompts: {notes:?}");
    assert!(!notes.iter().any(|n| n.contains("not counted")), "every day counted: {notes:?}");

    let hot: Vec<&InferenceEvent> = events.iter().filter(|e| day_of(e) >= t - 2).collect();
    let range: Vec<&InferenceEvent> = events.iter().filter(|e| (t - 3..=t - 1).contains(&day_of(e))).collect();
    let uncached = |e: &InferenceEvent| u64::from(e.input_tokens - e.cache_prefix_tokens.unwrap_or(0).min(e.input_tokens));
    let tokens = |e: &InferenceEvent| u64::from(e.input_tokens) + u64::from(e.output_tokens);
    // Per line, day and prompt: its requests, the earliest first.
    let mut prompts: BTreeMap<(&str, i32, &str), Vec<&InferenceEvent>> = BTreeMap::new();
    for e in &range {
        if let Some(p) = &e.prompt_hash {
            prompts.entry((e.business_line.as_str(), day_of(e), p.as_str())).or_default().push(e);
        }
    }
    // (requests, hashed, repeats, repeat tokens, cache-saved prefill, input tokens)
    let mut lines: BTreeMap<&str, [u64; 6]> = BTreeMap::new();
    for e in &range {
        let l = lines.entry(e.business_line.as_str()).or_default();
        l[0] += 1;
        l[1] += u64::from(e.prompt_hash.is_some());
        l[5] += u64::from(e.input_tokens);
    }
    let mut by_prompt: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    for ((line, day, prompt), requests) in prompts.iter_mut() {
        requests.sort_by_key(|e| (e.timestamp_ms, tokens(e), uncached(e)));
        let repeats = &requests[1..];
        let l = lines.get_mut(line).expect("line");
        l[2] += repeats.len() as u64;
        l[3] += repeats.iter().map(|e| tokens(e)).sum::<u64>();
        l[4] += repeats.iter().map(|e| uncached(e)).sum::<u64>();
        if *day < t - 2 {
            continue; // the aggregates keep no prompts
        }
        let p = by_prompt.entry((line, prompt)).or_default();
        p.0 += repeats.len() as u64;
        p.1 += repeats.iter().map(|e| tokens(e)).sum::<u64>();
    }
    let table = rows(&doc, "waste");
    for (line, [requests, hashed, repeats, repeat_tokens, saved, input]) in &lines {
        let row = table.iter().find(|r| r["business_line"] == *line).unwrap_or_else(|| panic!("no line {line}: {table:?}"));
        assert_eq!((f(&row["requests"]) as u64, f(&row["repeats"]) as u64), (*requests, *repeats), "{line}");
        close(f(&row["hashed_share"]), *hashed as f64 / *requests as f64, "hashed share");
        assert_eq!((f(&row["repeat_tokens"]) as u64, f(&row["cache_saved_prefill_tokens"]) as u64), (*repeat_tokens, *saved), "{line}");
        close(f(&row["cache_saved_share"]), *saved as f64 / *input as f64, "cache-saved share");
    }
    assert!(lines["search"][2] * 4 > lines["search"][1], "the planted templates make search's repeats: {:?}", lines["search"]);
    assert_eq!(table[0]["business_line"], "search", "the most tokens on repeats first: {table:?}");

    // The top prompts: the templates, each with its three callers.
    let mut ranked: Vec<_> = by_prompt.iter().filter(|(_, p)| p.0 > 0).collect();
    ranked.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(b.0)));
    let top = rows(&doc, "waste_prompts");
    assert_eq!(top.len(), 5);
    for (row, ((line, prompt), (repeats, repeat_tokens))) in top.iter().zip(&ranked) {
        assert_eq!((row["business_line"].as_str(), row["prompt_hash"].as_str()), (Some(*line), Some(*prompt)), "{top:?}");
        assert_eq!((f(&row["repeats"]) as u64, f(&row["repeat_tokens"]) as u64), (*repeats, *repeat_tokens), "{prompt}");
        assert!(prompt.starts_with("k:tpl-") && f(&row["callers"]) == 3.0, "{row}");
    }

    // Output lengths per request type: p50, long outputs, answers cut at max_tokens.
    let mut types: BTreeMap<&str, Vec<&InferenceEvent>> = BTreeMap::new();
    for e in &range {
        types.entry(e.request_type.as_deref().unwrap_or("-")).or_default().push(e);
    }
    let outputs = rows(&doc, "waste_outputs");
    for (name, list) in &types {
        let row = outputs.iter().find(|r| r["request_type"] == *name).unwrap_or_else(|| panic!("no type {name}"));
        let mut lengths: Vec<f64> = list.iter().map(|e| f64::from(e.output_tokens)).collect();
        let p50 = exact(&mut lengths, 0.5);
        // Within the histogram's 1%, shown rounded to a token.
        let shown = f(&row["output_p50_tokens"]);
        assert!((shown - p50).abs() <= 0.01 * p50 + 0.5, "{name}: output p50 {shown}, exact {p50}");
        // Long: above 4 × p50, up to the values within the p50's and the bound's buckets of it.
        let bound = 4.0 * p50;
        let above = lengths.iter().filter(|v| **v > bound * 1.04).count() as f64;
        let near = lengths.iter().filter(|v| (bound * 0.96..=bound * 1.04).contains(*v)).count() as f64;
        let long = f(&row["long_requests"]);
        assert!(long >= above && long <= above + near, "{name}: long {long}, events {above} (+{near} at the bound)");
        let limited: Vec<&&InferenceEvent> = list.iter().filter(|e| e.max_tokens.is_some()).collect();
        let cut: Vec<&&InferenceEvent> = limited.iter().copied().filter(|e| Some(e.output_tokens) >= e.max_tokens).collect();
        assert_eq!(f(&row["at_limit"]) as usize, cut.len(), "{name}");
        assert_eq!(f(&row["at_limit_output_tokens"]) as u64, cut.iter().map(|e| u64::from(e.output_tokens)).sum::<u64>(), "{name}");
        close(f(&row["limited_share"]), limited.len() as f64 / list.len() as f64, "limited share");
    }
    let summarize = outputs.iter().find(|r| r["request_type"] == "summarize").expect("summarize");
    assert!(f(&summarize["long_share"]) > 0.01, "the planted long answers: {summarize}");

    // Waste is kept per business line: with --model the released day is named, not counted.
    let model = hot[0].model_name.clone();
    let doc = report_json(&s, &["--from", &from, "--to", &to, "--model", &model, "waste"], "waste-model.log");
    let notes = notes_of(&doc);
    assert!(notes.iter().any(|n| n.contains(&from) && n.contains("not per model") && n.ends_with("not counted")), "{notes:?}");
    let requests: f64 = rows(&doc, "waste").iter().filter(|r| r["business_line"] != "all").map(|r| f(&r["requests"])).sum();
    assert_eq!(requests as usize, hot.iter().filter(|e| e.model_name == model).count(), "the hot days' requests of the model");
    // A day aggregated before waste was kept: named, not counted.
    s.psql(&format!("DELETE FROM daily_waste WHERE day = '{from}'; DELETE FROM daily_outputs WHERE day = '{from}'"));
    let doc = report_json(&s, &["--from", &from, "--to", &to, "waste"], "waste-before.log");
    let notes = notes_of(&doc);
    assert!(notes.iter().any(|n| n.contains(&from) && n.contains("before their waste was kept")), "{notes:?}");
    let requests: f64 = rows(&doc, "waste").iter().filter(|r| r["business_line"] != "all").map(|r| f(&r["requests"])).sum();
    assert_eq!(requests as usize, hot.len(), "the hot days' requests");
}

/// The seeds' runaway cron job: 29 days of traffic; at 14:00 yesterday a
/// quarter of `search`'s requests come from one caller whose prompts are
/// 8 times longer than its own the day before, with no more requests than
/// usual. `spikes --hour` must flag the line against the same hour of the
/// four weeks before (27 days from the aggregates; tokens grown 1.5x and
/// 1.5x faster than the requests) and the caller against its hour the hot
/// day before, `--fail-if spiking_callers>0` must exit 1,
/// and every figure and flag must be what the events give.
#[test]
fn spikes_flags_the_runaway_caller_and_its_line_against_their_baselines() {
    const HOUR: i64 = 14;
    let in_hour = |e: &InferenceEvent, day: i32| day_of(e) == day && e.timestamp_ms.div_euclid(3_600_000) % 24 == HOUR;
    let (s, events, t) = scenario_with("report_spikes", 90_000, 29, 89, |events, t| {
        for e in events.iter_mut().filter(|e| e.business_line == "search" && fnv(&e.request_id).is_multiple_of(4)) {
            if in_hour(e, t - 2) || in_hour(e, t - 1) {
                e.user_id_hash = Some("k:cron".to_owned());
            }
            if in_hour(e, t - 1) {
                e.input_tokens = e.input_tokens.saturating_mul(8);
            }
        }
    });
    let hour = i64::from(t - 1) * 24 + HOUR;
    let at = format!("{}T{HOUR:02}", day_string(t - 1));
    let (code, out) = report(&s, &["--format", "json", "--top-users", "50", "--fail-if", "spiking_callers>0", "spikes", "--hour", &at], "spikes.log");
    assert_eq!(code, 1, "a spiking caller fails the run: {}", s.log("spikes.log"));
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(doc["alerts"].as_array().is_some_and(|a| a.iter().any(|a| a.as_str().is_some_and(|a| a.contains("spiking_callers")))), "{doc}");

    let tokens = |e: &InferenceEvent| f64::from(e.input_tokens) + f64::from(e.output_tokens);
    let load = |keep: &dyn Fn(&InferenceEvent) -> bool, h: i64| {
        let of_hour: Vec<&InferenceEvent> = events.iter().filter(|e| e.timestamp_ms.div_euclid(3_600_000) == h && keep(e)).collect();
        (of_hour.len() as f64, of_hour.iter().map(|e| tokens(e)).sum::<f64>())
    };
    // Lines: the hour against the mean of the same hour 1..4 weeks before.
    let mut line_requests = BTreeMap::new();
    let table = rows(&doc, "spikes");
    let lines: std::collections::BTreeSet<&str> = events.iter().map(|e| e.business_line.as_str()).collect();
    for line in lines {
        let of_line = |e: &InferenceEvent| e.business_line == line;
        let (requests, tok) = load(&of_line, hour);
        let weeks: Vec<(f64, f64)> = (1..=4).map(|w| load(&of_line, hour - w * 168)).collect();
        let (b_requests, b_tokens) = (weeks.iter().map(|w| w.0).sum::<f64>() / 4.0, weeks.iter().map(|w| w.1).sum::<f64>() / 4.0);
        let row = table.iter().find(|r| r["business_line"] == line).unwrap_or_else(|| panic!("no line {line}: {table:?}"));
        assert_eq!((f(&row["tokens"]), f(&row["requests"]), f(&row["weeks"])), (tok, requests, 4.0), "{line}");
        assert_eq!((f(&row["baseline_tokens"]), f(&row["baseline_requests"])), (b_tokens.round(), b_requests.round()), "{line}");
        close(f(&row["token_ratio"]), tok / b_tokens, "token ratio");
        let flagged = tok >= 1.5 * b_tokens && tok / b_tokens >= 1.5 * (requests / b_requests);
        assert_eq!(row["flag"] == "spike", flagged, "{line}: {row}");
        line_requests.insert(line, (requests, b_requests, tok));
    }
    assert_eq!(table[0]["business_line"], "search", "the planted line first: {table:?}");
    assert_eq!(table[0]["flag"], "spike", "{table:?}");

    // Callers: the hour against the same hour the hot day before.
    let callers = rows(&doc, "spike_callers");
    let mut flagged = Vec::new();
    let mut keys: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e.timestamp_ms.div_euclid(3_600_000) == hour)
        .filter_map(|e| Some((e.business_line.as_str(), e.user_id_hash.as_deref()?)))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for (line, caller) in keys {
        let of_caller = |e: &InferenceEvent| e.business_line == line && e.user_id_hash.as_deref() == Some(caller);
        let ((requests_of_caller, tok), (_, base)) = (load(&of_caller, hour), load(&of_caller, hour - 24));
        let (requests, b_requests, line_tokens) = line_requests[line];
        let ratio = if base > 0.0 { tok / base } else { f64::INFINITY };
        if requests_of_caller >= 5.0 && ratio >= 1.5 && tok - base >= 0.05 * line_tokens && ratio >= 1.5 * (requests / b_requests) {
            // Shown as the key id and the first 12 hex digits.
            let short = caller.split_once(':').map_or(caller.to_owned(), |(key, hex)| format!("{key}:{}", &hex[..hex.len().min(12)]));
            flagged.push(format!("{line} {short}"));
        }
        if caller == "k:cron" {
            let row = callers.iter().find(|r| r["caller"] == "k:cron").unwrap_or_else(|| panic!("the cron caller: {callers:?}"));
            assert_eq!((f(&row["tokens"]), f(&row["baseline_tokens"]), f(&row["days"])), (tok, base.round(), 1.0), "{row}");
        }
    }
    let mut shown: Vec<String> = callers
        .iter()
        .filter(|r| r["flag"] == "spike")
        .map(|r| format!("{} {}", r["business_line"].as_str().unwrap_or(""), r["caller"].as_str().unwrap_or("")))
        .collect();
    shown.sort();
    flagged.sort();
    assert_eq!(shown, flagged, "flagged callers");
    assert!(flagged.contains(&"search k:cron".to_owned()), "the planted caller: {flagged:?}");
    assert_eq!(callers[0]["caller"], "k:cron", "the largest excess first: {callers:?}");
}

/// FNV-1a of `text`: a deterministic coin for thinning events.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Fourteen days of traffic growing 4% a day (earlier days thinned). In
/// the hours whose busiest minute (fleet-wide) is in the top fifth, 5% of
/// the requests wait 8 s more before their first token, so those hours'
/// p99 TTFT is far past the 5 s asked for (the generated traffic's own
/// p99 is about 3 s). `capacity --forecast` must find the exact
/// per-minute load, the knee between the clean and the slow hours, the
/// growth, the expected peak and the days until the knee, each computed
/// again here from the events (12 days from the aggregates, 2 hot).
#[test]
fn capacity_forecast_finds_the_knee_and_when_the_load_reaches_it() {
    const GROWTH: f64 = 0.04;
    let mut slow_from = 0;
    let (s, events, t) = scenario_with("report_forecast", 60_000, 14, 79, |events, t| {
        events.retain(|e| (fnv(&e.request_id) % 10_000) as f64 / 10_000.0 < (-GROWTH * f64::from(t - 1 - day_of(e))).exp());
        let mut per_minute: BTreeMap<i64, u64> = BTreeMap::new();
        for e in events.iter() {
            *per_minute.entry(e.timestamp_ms.div_euclid(60_000)).or_default() += 1;
        }
        let mut busiest: BTreeMap<i64, u64> = BTreeMap::new();
        for (m, n) in &per_minute {
            let b = busiest.entry(m.div_euclid(60)).or_default();
            *b = (*b).max(*n);
        }
        let mut loads: Vec<u64> = busiest.values().copied().collect();
        loads.sort_unstable();
        slow_from = loads[loads.len() * 4 / 5];
        let mut seen = 0;
        for e in events.iter_mut().filter(|e| busiest[&e.timestamp_ms.div_euclid(3_600_000)] >= slow_from) {
            seen += 1;
            if seen % 20 == 0 {
                if let Some(ttft) = e.ttft_ms.as_mut() {
                    *ttft += 8000.0;
                    e.total_latency_ms += 8000.0;
                }
            }
        }
    });
    let (from, to) = (day_string(t - 14), day_string(t - 1));
    let doc = report_json(&s, &["--from", &from, "--to", &to, "capacity", "--forecast", "--knee-ttft-ms", "5000"], "forecast.log");
    let scope = |table: &str| rows(&doc, table).iter().find(|r| r["scope"] == "fleet").unwrap_or_else(|| panic!("no fleet row in {table}")).clone();

    // The fleet's load of every minute of the 14 days (a minute without requests is 0).
    let mut per_minute: BTreeMap<i64, u64> = (i64::from(t - 14) * 1440..i64::from(t) * 1440).map(|m| (m, 0)).collect();
    for e in &events {
        *per_minute.get_mut(&e.timestamp_ms.div_euclid(60_000)).expect("a minute of the range") += 1;
    }
    let mut loads: Vec<u64> = per_minute.values().copied().collect();
    loads.sort_unstable();
    let p99 = loads[(0.99 * loads.len() as f64) as usize] as f64;
    let load = scope("minute_load");
    assert_eq!(load["minutes"], 14 * 1440);
    assert_eq!(f(&load["p99_requests_per_minute"]), p99);
    assert_eq!(f(&load["max_requests_per_minute"]), *loads.last().expect("minutes") as f64, "the busiest minute, summed over the series");

    // The knee: hours in ten equal-count bins by their busiest minute; each bin's exact p99 TTFT.
    let mut hours: BTreeMap<i64, (u64, Vec<f64>)> = BTreeMap::new();
    for (m, n) in &per_minute {
        let h = hours.entry(m.div_euclid(60)).or_default();
        h.0 = h.0.max(*n);
    }
    for e in &events {
        hours.get_mut(&e.timestamp_ms.div_euclid(3_600_000)).expect("an hour").1.extend(e.ttft_ms);
    }
    let mut by_load: Vec<(u64, Vec<f64>)> = hours.into_values().filter(|(_, v)| !v.is_empty()).collect();
    by_load.sort_by_key(|(l, _)| *l);
    let size = by_load.len().div_ceil(10);
    let curve: Vec<(f64, f64)> = by_load
        .chunks(size)
        .map(|bin| {
            let mut all: Vec<f64> = bin.iter().flat_map(|(_, v)| v.iter().copied()).collect();
            (bin.iter().map(|(l, _)| *l as f64).sum::<f64>() / bin.len() as f64, exact(&mut all, 0.99))
        })
        .collect();
    let i = curve.iter().position(|(_, p)| *p >= 5000.0).expect("the slow hours cross 5 s");
    assert!(i > 0, "the lowest bin is clean: {curve:?}");
    let ((x0, y0), (x1, y1)) = (curve[i - 1], curve[i]);
    let knee = x0 + (5000.0 - y0) * (x1 - x0) / (y1 - y0);
    let reported = scope("knee");
    assert!(reported["knee"].as_str().is_some_and(|k| k.starts_with("crosses at")), "{reported}");
    let got = f(&reported["knee_requests_per_minute"]);
    assert!((got - knee).abs() <= 0.03 * knee, "knee {got}, from the events {knee} (curve {curve:?})");
    assert!(got <= slow_from as f64 + 0.5, "the knee is at or below the load where the slow hours start ({slow_from}): {got}");

    // Growth, the next 7 days' peak and the days until the knee.
    let mut daily: BTreeMap<i32, u64> = BTreeMap::new();
    for e in &events {
        *daily.entry(day_of(e)).or_default() += 1;
    }
    let points: Vec<(f64, f64)> = daily.iter().map(|(d, n)| (f64::from(*d), (*n as f64).ln())).collect();
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / 14.0, points.iter().map(|p| p.1).sum::<f64>() / 14.0);
    let rate = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / points.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>();
    assert!((rate - GROWTH).abs() < 0.01, "the planted growth is what the events show: {rate}");
    let forecast = scope("forecast");
    close(f(&forecast["daily_growth"]), rate.exp() - 1.0, "daily growth");
    let to_today = f64::from(t) - mx;
    close(f(&forecast["expected_peak_requests_per_minute"]), p99 * (rate * (to_today + 7.0)).exp(), "expected peak");
    let until = ((knee / (p99 * (rate * to_today).exp())).ln() / rate).max(0.0);
    let reported_until = f(&forecast["days_until_knee"]);
    assert!((reported_until - until).abs() <= 0.03 / rate + 1e-9, "days until the knee {reported_until}, from the events {until}");
}

/// `inferlog-report … | head`: a reader that stops early is no error (the
/// demo pipes views into `head` under `set -o pipefail`). The page's JSON
/// is far larger than a pipe's buffer, so the report's write meets a
/// closed pipe.
#[test]
fn a_reader_that_stops_early_is_no_error() {
    let (s, _, t) = scenario("report_pipe", 4_000, 67);
    let (from, to) = (day_string(t - 6), day_string(t - 1));
    let mut child = s.spawn("inferlog-report", &["--format", "json", "--from", &from, "--to", &to, "page"], "pipe.log", &[]);
    drop(child.stdout.take());
    let status = child.wait().expect("wait");
    assert!(matches!(status.code(), Some(0 | 1)), "exit {status}: {}", s.log("pipe.log"));
    assert!(!s.log("pipe.log").contains("panicked"), "{}", s.log("pipe.log"));
}

/// Rows of TSV as cells.
fn tsv(text: &str) -> Vec<Vec<String>> {
    text.lines().filter(|l| !l.is_empty()).map(|l| l.split('\t').map(str::to_owned).collect()).collect()
}

fn num(cell: &str) -> f64 {
    cell.parse().unwrap_or_else(|e| panic!("{cell:?}: {e}"))
}

/// The same rows (in any order: ties may sort either way), numbers equal
/// to 1e-9 (servers print floats to different digits).
fn same_rows(a: &[Vec<String>], b: &[Vec<String>], what: &str) {
    let key = |r: &Vec<String>| r.iter().map(|c| c.parse::<f64>().map_or(c.clone(), |v| format!("{:.6e}", v))).collect::<Vec<_>>();
    let (mut a, mut b): (Vec<_>, Vec<_>) = (a.iter().map(key).collect(), b.iter().map(key).collect());
    a.sort();
    b.sort();
    assert_eq!(a, b, "{what}: ClickHouse 18.16 and current ClickHouse disagree");
}

/// The boards' SQL (the History board's, and the Service board's GPU
/// panel) with the datasources' macros expanded for the scenario's days,
/// as Grafana would send it: on the local ClickHouse 18.16 and Postgres,
/// and on current ClickHouse (chdb, the hot rows copied). Each answers what
/// `inferlog-report` answers for the same days, and what the events say.
#[test]
fn the_boards_sql_answers_what_the_report_answers_on_both_clickhouses() {
    let (s, events, t) = scenario("report_boards", 12_000, 67);
    let (hot, all) = (boards::Days { from: t - 2, to: t - 1 }, boards::Days { from: t - 6, to: t - 1 });
    let (hot_from, hot_to, all_from) = (day_string(t - 2), day_string(t - 1), day_string(t - 6));
    let queries = boards::all_queries();
    let panel = |title: &str| queries.iter().find(|q| q.panel == title).unwrap_or_else(|| panic!("no panel {title}")).clone();
    let table = s.qualified_table();
    let hot_events: Vec<&InferenceEvent> = events.iter().filter(|e| day_of(e) >= t - 2).collect();
    let sql_panels: Vec<&boards::Query> = queries.iter().filter(|q| q.datasource != boards::PROMETHEUS).collect();
    assert_eq!(sql_panels.len(), 5, "{sql_panels:?}");

    // Slow groups: each group's requests and exact p99 from the events; the
    // report's figures (from its histograms) within their 1%.
    let slow = boards::clickhouse_sql(&panel("Slow groups: p99 by input × output bucket").text, hot, &table);
    let got: BTreeMap<(String, String, String), (u64, f64)> =
        tsv(&clickhouse(&slow)).into_iter().map(|r| ((r[0].clone(), r[1].clone(), r[2].clone()), (num(&r[3]) as u64, num(&r[4])))).collect();
    let mut groups: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for e in &hot_events {
        groups
            .entry((e.business_line.clone(), input_bucket(e).to_owned(), e.output_bucket().as_str().to_owned()))
            .or_default()
            .push(e.total_latency_ms);
    }
    let want: BTreeMap<(String, String, String), (u64, f64)> =
        groups.iter_mut().map(|(k, v)| (k.clone(), (v.len() as u64, exact(v, 0.99)))).collect();
    assert_eq!(got, want, "slow groups against the events");
    let doc = report_json(&s, &["--from", &hot_from, "--to", &hot_to, "latency"], "boards-latency.log");
    let latency = rows(&doc, "latency");
    assert_eq!(latency.len(), got.len(), "the report's groups");
    for row in latency {
        let key = latency_group(row);
        let (requests, p99) = got[&key];
        assert_eq!(row["requests"], requests, "{key:?}");
        within_1pct(f(&row["total_p99_ms"]), p99, &format!("{key:?} p99, report against the board"));
    }

    // Errors by code and stage: the events', and the report's summed over line and bucket.
    let errors = boards::clickhouse_sql(&panel("Errors by code and stage").text, hot, &table);
    let got: BTreeMap<(String, String), u64> =
        tsv(&clickhouse(&errors)).into_iter().map(|r| ((r[0].clone(), r[1].clone()), num(&r[2]) as u64)).collect();
    let mut want: BTreeMap<(String, String), u64> = BTreeMap::new();
    for e in hot_events.iter().filter(|e| e.error_code != 0) {
        *want.entry((e.error_code.to_string(), e.error_stage.map_or("", |st| st.as_str()).to_owned())).or_default() += 1;
    }
    assert!(!want.is_empty());
    assert_eq!(got, want, "errors by code and stage against the events");
    let doc = report_json(&s, &["--from", &hot_from, "--to", &hot_to, "errors"], "boards-errors.log");
    let mut from_report: BTreeMap<(String, String), u64> = BTreeMap::new();
    for row in rows(&doc, "errors") {
        let stage = row["stage"].as_str().filter(|st| *st != "-").unwrap_or("").to_owned();
        let code = row["code"].as_str().map_or_else(|| row["code"].to_string(), str::to_owned);
        *from_report.entry((code, stage)).or_default() += row["errors"].as_u64().expect("errors");
    }
    assert_eq!(from_report, got, "errors by code and stage, report against the board");

    // GPU memory peak per hour and model, from the events.
    let gpu = boards::clickhouse_sql(&panel("GPU memory peak by model (hot tier)").text, hot, &table);
    let got: BTreeMap<(i64, String), f64> = tsv(&clickhouse(&format!("SELECT toUnixTimestamp(time), model_name, peak_mb FROM ({gpu})")))
        .into_iter()
        .map(|r| ((num(&r[0]) as i64, r[1].clone()), num(&r[2])))
        .collect();
    let mut want: BTreeMap<(i64, String), f64> = BTreeMap::new();
    for e in &hot_events {
        if let Some(mb) = e.gpu_mem_peak_mb {
            let peak = want.entry((e.timestamp_ms.div_euclid(3_600_000) * 3600, e.model_name.clone())).or_insert(mb);
            *peak = peak.max(mb);
        }
    }
    assert!(!want.is_empty(), "the events carry GPU memory");
    assert_eq!(got, want, "GPU memory peaks against the events");

    // The same three statements on current ClickHouse, over a copy of the hot rows.
    let statements = vec![slow.clone(), errors.clone(), gpu.clone()];
    let (database, name) = table.split_once('.').expect("database.table");
    let structure = clickhouse(&format!("SELECT name, type FROM system.columns WHERE database = '{database}' AND table = '{name}'"))
        .lines()
        .map(|l| l.replacen('\t', " ", 1))
        .collect::<Vec<_>>()
        .join(", ");
    let data = s.dir.path().join("hot.tsv");
    std::fs::write(&data, clickhouse(&format!("SELECT * FROM {table} FORMAT TabSeparated")) + "\n").expect("hot rows");
    let listed = s.dir.path().join("statements.json");
    std::fs::write(&listed, serde_json::to_string(&statements).expect("json")).expect("statements");
    let out = Command::new("python3")
        .arg(repo_root().join("tests/scripts/chdb_queries.py"))
        .args([table.as_str(), &structure, inferlog_store::model::tables::HOT.order_by])
        .arg(&data)
        .arg(&listed)
        .output()
        .expect("python3");
    assert!(out.status.success(), "chdb: {}", String::from_utf8_lossy(&out.stderr));
    let answers: Vec<Vec<Vec<String>>> = serde_json::from_slice(&out.stdout).expect("chdb's answers");
    assert_eq!(answers.len(), statements.len());
    for (sql, answer) in statements.iter().zip(&answers) {
        assert!(!answer.is_empty(), "chdb answered nothing to {sql}");
        same_rows(&tsv(&clickhouse(sql)), answer, sql);
    }

    // Postgres: cost by line over all six days, from the aggregates; the
    // report (hot days from ClickHouse, the rest from the aggregates) and
    // the events agree.
    let cost = boards::postgres_sql(&panel("Cost and tokens by business line").text, all);
    let got: BTreeMap<String, (u64, f64)> = tsv(&s.psql(&cost)).into_iter().map(|r| (r[0].clone(), (num(&r[1]) as u64, num(&r[4])))).collect();
    let mut want: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for e in &events {
        let w = want.entry(e.business_line.clone()).or_default();
        w.0 += 1;
        w.1 += cost_of(e);
    }
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    let doc = report_json(&s, &["--from", &all_from, "--to", &hot_to, "cost"], "boards-cost.log");
    for row in rows(&doc, "cost_by_business_line") {
        let line = row["business_line"].as_str().expect("a line").to_owned();
        assert_eq!(row["requests"], got[&line].0, "{line}: requests, report against the board");
        close(f(&row["cost_usd"]), got[&line].1, &format!("{line}: cost, report against the board"));
        assert_eq!(got[&line].0, want[&line].0, "{line}: requests against the events");
        close(got[&line].1, want[&line].1, &format!("{line}: cost against the events"));
    }

    // Requests and tokens per hour, from the hourly aggregates: the events'
    // per hour, and the report's per hour of day.
    let hours = boards::postgres_sql(&panel("Requests and tokens per hour").text, all);
    let got: BTreeMap<i64, (u64, u64)> = tsv(&s.psql(&format!("SELECT extract(epoch FROM time)::bigint, requests, tokens FROM ({hours}) AS panel")))
        .into_iter()
        .map(|r| (num(&r[0]) as i64, (num(&r[1]) as u64, num(&r[2]) as u64)))
        .collect();
    let mut want: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
    for e in &events {
        let w = want.entry(e.timestamp_ms.div_euclid(3_600_000) * 3600).or_default();
        w.0 += 1;
        w.1 += u64::from(e.input_tokens + e.output_tokens);
    }
    assert_eq!(got, want, "requests and tokens per hour against the events");
    let doc = report_json(&s, &["--from", &all_from, "--to", &hot_to, "capacity"], "boards-capacity.log");
    let mut by_hour_of_day = [(0u64, 0u64); 24];
    for (hour, (requests, tokens)) in &got {
        let h = (hour.rem_euclid(86_400) / 3600) as usize;
        by_hour_of_day[h].0 += requests;
        by_hour_of_day[h].1 += tokens;
    }
    let report_hours = rows(&doc, "by_hour_of_day");
    assert_eq!(report_hours.len(), 24);
    for (h, row) in report_hours.iter().enumerate() {
        assert_eq!(
            (row["requests"].as_u64(), row["tokens"].as_u64()),
            (Some(by_hour_of_day[h].0), Some(by_hour_of_day[h].1)),
            "hour {h:02}: report against the board"
        );
    }
}
