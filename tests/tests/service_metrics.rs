//! Ingest's live service metrics on the real stack: the Prometheus that
//! `deploy/local/services.sh` runs scrapes a real `inferlog-ingest`, and
//! what it computes from the scraped series agrees with ClickHouse's rows
//! and with figures computed from the produced events themselves; the alert
//! rules load in that Prometheus and evaluate.

use std::collections::{BTreeMap, HashMap};
use std::process::Child;
use std::time::Duration;

use inferlog_tests::boards;
use inferlog_tests::tiers::{today, TierScenario};

use inferlog_tests::prometheus::{api as prometheus, ms, query, samples, Target};
use inferlog_tests::{clickhouse, free_loopback_addr, produce, repo_root, sigterm, test_rng, wait_for, Scenario};

/// One event the test produces, and what it expects of it.
struct Event {
    line: String,
    json: String,
    total_ms: f64,
    ttft_ms: f64,
    tokens: [u64; 3],
    error_code: i32,
    request_type: &'static str,
}

const LINES: [&str; 3] = ["search", "ads", "assistant"];
const REQUEST_TYPES: [&str; 2] = ["chat", "summarize"];

/// Events of three lines, two models and two request types over the last
/// hour: 97% ordinary (100-900 ms, TTFT 20-90 ms), 3% slow (3-4.5 s, TTFT
/// 0.6-0.9 s), so each line's p99 lies well inside the buckets (2.5 s, 5 s]
/// and (0.5 s, 1 s], whatever the seed; 2% fail.
///
/// With `cover`, the first events take every combination of line, model,
/// request type and error code once, so every series the second phase
/// grows already exists: a series' first scrape is its starting point, and
/// increments before it are outside any `increase()` (Prometheus counts a
/// new series from its first sample).
fn events(rng: &mut impl rand::Rng, prefix: &str, count: usize, cover: bool) -> Vec<Event> {
    let now = inferlog_tests::now_ms();
    let combinations: Vec<(usize, usize, usize, i32)> =
        (0..LINES.len()).flat_map(|l| (0..2).flat_map(move |m| (0..2).flat_map(move |t| [0, 1001, 1003].map(|c| (l, m, t, c))))).collect();
    (0..count)
        .map(|i| {
            let planned = combinations.get(i).filter(|_| cover).copied();
            let (l, m, t) = planned.map_or_else(|| (rng.gen_range(0..LINES.len()), rng.gen_range(0..2), rng.gen_range(0..2)), |(l, m, t, _)| (l, m, t));
            let (line, model, request_type) = (LINES[l], ["llama-70b", "qwen-7b"][m], REQUEST_TYPES[t]);
            let slow = rng.gen_bool(0.03);
            let total_ms: f64 = if slow { rng.gen_range(3000.0..4500.0) } else { rng.gen_range(100.0..900.0) };
            let ttft_ms: f64 = if slow { rng.gen_range(600.0..900.0) } else { rng.gen_range(20.0..90.0) };
            let (input, output) = (rng.gen_range(10..4000u64), rng.gen_range(1..800u64));
            let cached = rng.gen_range(0..=input / 2);
            let random_code = if rng.gen_bool(0.02) { [1001, 1003][rng.gen_range(0..2)] } else { 0 };
            let error_code = planned.map_or(random_code, |(_, _, _, c)| c);
            let stage = if error_code != 0 { r#","error_stage":"decode""# } else { "" };
            let (tpot_ms, queue_ms): (f64, f64) = (rng.gen_range(10.0..40.0), rng.gen_range(0.0..50.0));
            let ts = now - 60_000 - rng.gen_range(0..3_000_000i64);
            let json = format!(
                r#"{{"request_id":"{prefix}-{i}","timestamp":{ts},"business_line":"{line}","model_name":"{model}","model_version":"v1","request_type":"{request_type}","input_tokens":{input},"output_tokens":{output},"cache_prefix_tokens":{cached},"total_latency_ms":{total_ms:.3},"ttft_ms":{ttft_ms:.3},"tpot_ms":{tpot_ms:.3},"queue_wait_ms":{queue_ms:.3},"error_code":{error_code}{stage}}}"#
            );
            Event {
                line: line.to_string(),
                json,
                total_ms: (total_ms * 1000.0).round() / 1000.0,
                ttft_ms: (ttft_ms * 1000.0).round() / 1000.0,
                tokens: [input, output, cached],
                error_code,
                request_type,
            }
        })
        .collect()
}

fn produce_events(s: &Scenario, name: &str, events: &[Event]) {
    let file = s.dir.path().join(name);
    let body: String = events.iter().map(|e| format!("{}\n", e.json)).collect();
    std::fs::write(&file, body).expect("write events");
    produce(&s.topic, &file);
}

/// A ClickHouse query's (business line, number) rows, collected.
fn by_line<C: FromIterator<(String, f64)>>(sql: &str) -> C {
    clickhouse(sql)
        .lines()
        .map(|l| {
            let (line, v) = l.split_once('\t').expect("two columns");
            (line.to_string(), v.parse().expect("a number"))
        })
        .collect()
}

/// The index of the `le` bucket `v` falls in.
fn bucket(bounds: &[f64], v: f64) -> usize {
    bounds.partition_point(|b| *b < v)
}

const DURATION_BOUNDS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const TTFT_BOUNDS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The value at rank ceil(q·n) of `values` (what quantileExact and the
/// histogram's rank both aim at).
fn exact_quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Ingest's service metrics, scraped by the real Prometheus every second:
/// the growth of the token and request counters between two scrapes
/// equals the sums of the rows stored between them, in ClickHouse and in
/// the produced events; `histogram_quantile(0.99, …)` of each line's
/// latency and TTFT lands in the bucket of the exact p99 (ClickHouse's
/// `quantileExact` over the stored rows); request types past their cap
/// count under `other`, and the overflow counter says how many.
#[test]
fn prometheus_scrapes_ingest_and_agrees_with_clickhouse() {
    let (mut rng, _seed) = test_rng("prometheus_scrapes_ingest_and_agrees_with_clickhouse");
    let addr = free_loopback_addr();
    let s = Scenario::new("svcmetrics", 4, &format!("metrics_addr = \"{addr}\"\nbatch_max_age = \"300ms\"\n"));
    // One request type admitted: the second counts under `other`.
    let config = std::fs::read_to_string(&s.config).expect("config") + "\n[service_metrics]\nmax_request_types = 1\n";
    std::fs::write(&s.config, config).expect("config");
    let run = s.group.clone();
    let _target = Target::add(&run, &addr);
    // The compactor and retention daemons, scraped beside ingest: the
    // Pipeline board reads all three.
    let (tiers, mut daemons, _tier_targets) = tier_daemons(&run);
    let inserted = format!("inferlog_ingest_rows_inserted_total{{run=\"{run}\"}}");
    let scraped = |n: usize| {
        let v = query(&inserted, &format!("{}", inferlog_tests::now_ms() as f64 / 1000.0));
        v.first().is_some_and(|(_, v)| *v as usize == n)
    };

    // Phase 1: every series the second phase uses (3 lines × 2 models ×
    // 2 request types × 3 codes) gets its first samples, and three
    // messages are rejected (the rejects and DLQ series of the Pipeline board).
    let first = events(&mut rng, "w", 1_200, true);
    let second = events(&mut rng, "m", 24_000, false);
    let mut ingest = s.spawn_ingest(None, "ingest.log");
    produce_events(&s, "first.jsonl", &first);
    let invalid = s.dir.path().join("invalid.jsonl");
    std::fs::write(&invalid, "{\"request_id\": 1}\nnot json\n{\"request_id\":\"x\",\"input_tokens\":-1}\n").expect("write rejects");
    produce(&s.topic, &invalid);
    let table = s.qualified_table();
    let count = || inferlog_tests::try_clickhouse(&format!("SELECT count() FROM {table}")).ok().and_then(|c| c.parse::<usize>().ok()).unwrap_or(0);
    wait_for(Duration::from_secs(120), || count() == first.len(), || format!("{} of {} rows stored: {}", count(), first.len(), s.log("ingest.log")));
    wait_for(Duration::from_secs(60), || scraped(first.len()), || format!("Prometheus never scraped {} rows inserted", first.len()));

    // Phase 2.
    produce_events(&s, "second.jsonl", &second);
    let total = first.len() + second.len();
    wait_for(Duration::from_secs(180), || count() == total, || format!("{} of {total} rows stored: {}", count(), s.log("ingest.log")));
    wait_for(Duration::from_secs(60), || scraped(total), || format!("Prometheus never scraped {total} rows inserted"));
    // The consumer-lag gauge is set on librdkafka's statistics interval:
    // the boards' queries are asked at a scrape that has it, ingest still up.
    let lag = format!("inferlog_ingest_consumer_lag{{run=\"{run}\"}}");
    wait_for(
        Duration::from_secs(60),
        || !query(&lag, &inferlog_tests::prometheus::now()).is_empty(),
        || format!("Prometheus never scraped {lag}: {}", s.log("ingest.log")),
    );
    let boards_at = inferlog_tests::prometheus::now();
    sigterm(&mut ingest, Duration::from_secs(30));

    // The scrape that saw the first phase whole, and the first that saw both.
    let history = samples(&inserted, "15m");
    let t0 = history.iter().rev().find(|(_, v)| *v as usize == first.len()).expect("a scrape of the first phase").0.clone();
    let t1 = history.iter().find(|(_, v)| *v as usize == total).expect("a scrape of both").0.clone();
    // The counters at t1 less the same counters at t0 (`offset`: the sample
    // at t0 itself): their exact growth, read alike by Prometheus 2.x and
    // 3.x. (`increase()` over a range starting on t0's sample would not
    // be: 2.x's ranges include their start, 3.x's exclude it and
    // extrapolate.) One process, so no counter reset in between.
    let offset = format!("{}ms", ms(&t1) - ms(&t0));
    let growth = |metric: &str, by: &str| {
        let series = format!("{metric}{{run=\"{run}\"}}");
        query(&format!("sum by ({by}) ({series}) - sum by ({by}) ({series} offset {offset})"), &t1)
    };

    let tokens = growth("inferlog_service_tokens_total", "type");
    let by_type: HashMap<String, f64> = tokens.into_iter().map(|(l, v)| (l["type"].clone(), v)).collect();
    let sql =
        format!("SELECT sum(input_tokens), sum(output_tokens), sum(ifNull(cache_prefix_tokens, 0)) FROM {table} WHERE startsWith(request_id, 'm-')");
    let from_clickhouse: Vec<u64> = clickhouse(&sql).split('\t').map(|v| v.parse().expect("a sum")).collect();
    let from_events: Vec<u64> = (0..3).map(|i| second.iter().map(|e| e.tokens[i]).sum()).collect();
    assert_eq!(from_clickhouse, from_events, "ClickHouse stored the second phase's tokens");
    for (i, kind) in ["input", "output", "cached"].iter().enumerate() {
        let got = by_type.get(*kind).copied().unwrap_or(f64::NAN);
        assert_eq!(got, from_clickhouse[i] as f64, "growth of {kind} tokens over [{t0}, {t1}] against ClickHouse's sum");
    }

    // Requests by status and error code grew by the second phase's counts.
    let requests = growth("inferlog_service_requests_total", "status, error_code");
    let mut want: BTreeMap<(String, String), f64> = BTreeMap::new();
    for e in &second {
        let status = if e.error_code == 0 { "ok" } else { "error" };
        *want.entry((status.to_string(), e.error_code.to_string())).or_default() += 1.0;
    }
    let got: BTreeMap<(String, String), f64> = requests.into_iter().map(|(l, v)| ((l["status"].clone(), l["error_code"].clone()), v)).collect();
    assert_eq!(got, want, "growth of requests by status and error code");
    let errors_in_clickhouse =
        inferlog_tests::clickhouse_u64(&format!("SELECT count() FROM {table} WHERE startsWith(request_id, 'm-') AND error_code != 0"));
    assert_eq!(got.iter().filter(|((s, _), _)| s == "error").map(|(_, v)| *v).sum::<f64>(), errors_in_clickhouse as f64);

    // p99 of each line: the histogram's estimate lands in the exact value's bucket.
    for (metric, column, bounds, of) in [
        ("inferlog_service_request_duration_seconds", "total_latency_ms", &DURATION_BOUNDS, (|e: &Event| e.total_ms) as fn(&Event) -> f64),
        ("inferlog_service_time_to_first_token_seconds", "ttft_ms", &TTFT_BOUNDS, |e: &Event| e.ttft_ms),
    ] {
        let estimates = query(&format!("histogram_quantile(0.99, sum by (business_line, le) ({metric}_bucket{{run=\"{run}\"}}))"), &t1);
        assert_eq!(estimates.len(), LINES.len(), "{metric}: one estimate per line: {estimates:?}");
        let exact: HashMap<String, f64> =
            by_line(&format!("SELECT business_line, quantileExact(0.99)({column}) / 1000 FROM {table} GROUP BY business_line"));
        for (labels, estimate) in estimates {
            let line = &labels["business_line"];
            let mut values: Vec<f64> = first.iter().chain(&second).filter(|e| &e.line == line).map(|e| of(e) / 1000.0).collect();
            let from_events = exact_quantile(&mut values, 0.99);
            let exact = exact[line];
            assert_eq!(bucket(bounds, exact), bucket(bounds, from_events), "{metric} {line}: ClickHouse's p99 {exact} and the events' {from_events}");
            assert_eq!(
                bucket(bounds, estimate),
                bucket(bounds, exact),
                "{metric} {line}: histogram_quantile {estimate} is not in the bucket of the exact p99 {exact}"
            );
        }
    }

    // Request types: one admitted, the other counted under `other`.
    let types = query(&format!("sum by (request_type) (inferlog_service_requests_total{{run=\"{run}\"}})"), &t1);
    let names: Vec<&str> = types.iter().map(|(l, _)| l["request_type"].as_str()).collect();
    assert_eq!(types.len(), 2, "one admitted type and `other`: {names:?}");
    let admitted = names.iter().find(|n| **n != "other").expect("an admitted type").to_string();
    let overflowed = first.iter().chain(&second).filter(|e| e.request_type != admitted).count();
    let overflow = query(&format!("inferlog_service_label_overflow_total{{run=\"{run}\",label=\"request_type\"}}"), &t1);
    assert_eq!(overflow.first().map(|(_, v)| *v), Some(overflowed as f64), "events of the type past the cap");
    let other = types.iter().find(|(l, _)| l["request_type"] == "other").map(|(_, v)| *v);
    assert_eq!(other, Some(overflowed as f64));

    // The Service and Pipeline boards: every PromQL query answers with
    // series while ingest runs (a metric or label named wrongly answers nothing).
    // Two only show what a fault makes: skips of stored offsets (a
    // restart mid-batch) and firing alerts; for those the query must be
    // valid. The requests of each line over [t0, t1], as the Service
    // board's table asks it of this run's series, equal ClickHouse's count.
    let fault_only = ["inferlog_ingest_duplicates_total", "ALERTS{"];
    let prometheus_queries: Vec<boards::Query> = boards::all_queries().into_iter().filter(|q| q.datasource == boards::PROMETHEUS).collect();
    assert!(prometheus_queries.len() >= 25, "{prometheus_queries:?}");
    for q in &prometheus_queries {
        let expr = boards::promql(&q.text, "1m", "5m");
        // Series the rules record (names with a colon) exist from the
        // rules' first evaluation after the run's samples, which may come
        // after t1: asked at the latest time, until they answer.
        if expr.contains("business_line:") || expr.contains("inferlog:") {
            let now = || inferlog_tests::prometheus::now();
            wait_for(Duration::from_secs(30), || !query(&expr, &now()).is_empty(), || format!("{} / {}: no series for {expr}", q.board, q.panel));
            continue;
        }
        let series = query(&expr, &boards_at);
        if fault_only.iter().any(|f| expr.contains(f)) {
            continue;
        }
        assert!(!series.is_empty(), "{} / {}: no series for {expr}", q.board, q.panel);
    }
    let per_line = prometheus_queries.iter().find(|q| q.panel == "Requests in the range by business line").expect("the requests table");
    let this_run = per_line.text.replace("inferlog_service_requests_total{", &format!("inferlog_service_requests_total{{run=\"{run}\","));
    let got: BTreeMap<String, f64> =
        query(&boards::promql(&this_run, "1m", &offset), &t1).into_iter().map(|(l, v)| (l["business_line"].clone(), v)).collect();
    let want: BTreeMap<String, f64> =
        by_line(&format!("SELECT business_line, count() FROM {table} WHERE startsWith(request_id, 'm-') GROUP BY business_line"));
    let mut from_events: BTreeMap<String, f64> = BTreeMap::new();
    for e in &second {
        *from_events.entry(e.line.clone()).or_default() += 1.0;
    }
    assert_eq!(want, from_events, "ClickHouse stored the second phase");
    assert_eq!(got, want, "{}: requests per line over [{t0}, {t1}] against ClickHouse's count", per_line.panel);
    for daemon in &mut daemons {
        sigterm(daemon, Duration::from_secs(30));
    }
    drop(tiers);
}

/// A compactor and a retention daemon over a tier scenario with two closed
/// days, a budget, and `/metrics` listed as scrape targets of run `run`;
/// returned once Prometheus scraped each one's first pass.
fn tier_daemons(run: &str) -> (TierScenario, Vec<Child>, Vec<Target>) {
    let (compactor, retention) = (free_loopback_addr(), free_loopback_addr());
    let tiers = TierScenario::new("svcmetrics_tiers", "[budgets.lines.chat-assistant]\nmonthly_usd = 100\n");
    let config = std::fs::read_to_string(&tiers.config).expect("config").replace(
        "[compactor]\nmetrics_addr = \"\"\n",
        &format!(
            "[retention]\nmetrics_addr = \"{retention}\"\ninterval = \"1h\"\n\n[compactor]\nmetrics_addr = \"{compactor}\"\ninterval = \"1h\"\n"
        ),
    );
    std::fs::write(&tiers.config, config).expect("config");
    tiers.seed(2_000, 1, today() - 2, 43);
    let daemons = vec![
        tiers.spawn("inferlog-compactor", &[], "compactor.log", &[]),
        tiers.spawn("inferlog-retention", &["enforce", "--daemon"], "retention.log", &[]),
    ];
    let targets = vec![Target::add(&format!("{run}-compactor"), &compactor), Target::add(&format!("{run}-retention"), &retention)];
    for (series, log) in [
        (format!("inferlog_compactor_days_total{{run=\"{run}-compactor\",state=\"aggregated\"}}"), "compactor.log"),
        (format!("inferlog_budget_used_ratio{{run=\"{run}-compactor\"}}"), "compactor.log"),
        (format!("inferlog_retention_last_success_timestamp_seconds{{run=\"{run}-retention\"}}"), "retention.log"),
    ] {
        wait_for(
            Duration::from_secs(120),
            || !query(&series, &inferlog_tests::prometheus::now()).is_empty(),
            || format!("Prometheus never scraped {series}: {}", tiers.log(log)),
        );
    }
    (tiers, daemons, targets)
}

/// The rule files (the pipeline's, the service's and its SLOs') are loaded by the
/// Prometheus services.sh runs, and every rule evaluates healthy against
/// the live series (a rule naming a metric or label wrongly would still
/// be "ok" but empty: promtool's unit tests, in deploy/check.sh, cover what
/// each one fires on).
#[test]
fn alert_rules_load_in_prometheus_and_evaluate() {
    let expected: Vec<String> = ["inferlog.rules.yml", "service.rules.yml", "slo.rules.yml"]
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(repo_root().join("deploy/prometheus").join(file)).expect("rules file");
            text.lines().filter_map(|l| l.trim().strip_prefix("- alert: ").map(str::to_string)).collect::<Vec<_>>()
        })
        .collect();
    assert!(expected.len() >= 23, "the three files' alerts: {expected:?}");
    let rules = || {
        let data = prometheus("rules", &[("type", "alert")]);
        let mut found: Vec<(String, String)> = data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| (r["name"].as_str().unwrap_or("").to_string(), r["health"].as_str().unwrap_or("").to_string()))
            .collect();
        found.sort();
        found
    };
    // Health is "unknown" until a rule's first evaluation (every second).
    wait_for(
        Duration::from_secs(30),
        || {
            let found = rules();
            found.len() == expected.len() && found.iter().all(|(_, h)| h != "unknown")
        },
        || format!("rules loaded: {:?}", rules()),
    );
    let found = rules();
    let mut names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
    let mut want: Vec<&str> = expected.iter().map(String::as_str).collect();
    names.sort();
    want.sort();
    assert_eq!(names, want);
    assert!(found.iter().all(|(_, h)| h == "ok"), "{found:?}");
}
