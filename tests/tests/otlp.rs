//! OTLP from the real OpenTelemetry Collector (built by `services.sh` with
//! its own builder): spans emitted with the OpenTelemetry Python SDK as
//! vLLM's tracing and GenAI-instrumented gateways emit them
//! (tests/scripts/emit_spans.py, which also computes the rows they stand
//! for), through the Collector's OTLP receiver and Kafka exporter, in both
//! of its trace encodings, into ingest.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use inferlog_tests::{clickhouse, free_loopback_addr, metric, read_topic, read_topic_values, repo_root, sigterm, test_rng, wait_for, Scenario};
use rand::Rng;
use serde_json::Value;

/// A Collector of this test's own: OTLP/HTTP in on a free loopback port,
/// one Kafka exporter per (topic, encoding). Killed when dropped.
struct Collector {
    child: Child,
    endpoint: String,
}

impl Collector {
    fn start(dir: &Path, exports: &[(&str, &str)]) -> Collector {
        let out = Command::new(repo_root().join("deploy/local/services.sh")).arg("otelcol-bin").output().expect("services.sh otelcol-bin");
        assert!(out.status.success(), "services.sh otelcol-bin: {}", String::from_utf8_lossy(&out.stderr));
        let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let addr = free_loopback_addr();
        let mut exporters = String::new();
        let mut pipelines = String::new();
        for (i, (topic, encoding)) in exports.iter().enumerate() {
            exporters.push_str(&format!(
                "  kafka/{i}:\n    brokers: [\"{}\"]\n    traces: {{topic: \"{topic}\", encoding: {encoding}}}\n",
                inferlog_tests::kafka_brokers()
            ));
            pipelines.push_str(&format!("    traces/{i}:\n      receivers: [otlp]\n      processors: [batch]\n      exporters: [kafka/{i}]\n"));
        }
        // Batches of at most 200 spans: one Kafka message each, well under
        // the broker's 1 MB message limit.
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      http: {{endpoint: \"{addr}\"}}\n\
             processors:\n  batch: {{timeout: 200ms, send_batch_size: 200, send_batch_max_size: 200}}\n\
             exporters:\n{exporters}\
             service:\n  telemetry:\n    metrics: {{level: none}}\n  pipelines:\n{pipelines}"
        );
        let path = dir.join("otelcol.yaml");
        std::fs::write(&path, config).expect("write the Collector's config");
        let log = std::fs::File::create(dir.join("otelcol.log")).expect("Collector log");
        let child = Command::new(bin).arg("--config").arg(&path).stdout(Stdio::null()).stderr(log).spawn().expect("start the Collector");
        wait_for(
            Duration::from_secs(60),
            || std::net::TcpStream::connect(&addr).is_ok(),
            || format!("the Collector listening on {addr}: {}", std::fs::read_to_string(dir.join("otelcol.log")).unwrap_or_default()),
        );
        Collector { child, endpoint: format!("http://{addr}/v1/traces") }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What emit_spans.py says the spans stand for.
struct Expected {
    rows: Vec<serde_json::Map<String, Value>>,
    skipped: u64,
    /// (trace id, span id) → (reason, field).
    broken: HashMap<(String, String), (String, String)>,
}

fn emit(dir: &Path, endpoint: &str, seed: u64, counts: [usize; 3], extra: &[&str]) -> Expected {
    let out = dir.join("expected.json");
    let mut cmd = Command::new("python3");
    cmd.arg(repo_root().join("tests/scripts/emit_spans.py")).args(["--endpoint", endpoint, "--seed", &seed.to_string()]);
    for (flag, n) in ["--vllm", "--genai", "--unrelated"].iter().zip(counts) {
        cmd.arg(flag).arg(n.to_string());
    }
    cmd.args(extra);
    let status = cmd.arg("--out").arg(&out).status().expect("run emit_spans.py");
    assert!(status.success(), "emit_spans.py exited with {status}");
    let v: Value = serde_json::from_slice(&std::fs::read(&out).expect("expected.json")).expect("JSON");
    let text = |b: &Value, k: &str| b[k].as_str().expect("string").to_owned();
    Expected {
        rows: v["rows"].as_array().expect("rows").iter().map(|r| r.as_object().expect("object").clone()).collect(),
        skipped: v["skipped"].as_u64().expect("skipped"),
        broken: v["broken"]
            .as_array()
            .expect("broken")
            .iter()
            .map(|b| ((text(b, "trace_id"), text(b, "span_id")), (text(b, "reason"), text(b, "field"))))
            .collect(),
    }
}

/// Points `s`'s config at its topic as `encoding`.
fn set_encoding(s: &Scenario, encoding: &str) {
    let text = std::fs::read_to_string(&s.config).expect("config");
    let line = "session_timeout = \"6s\"\n";
    assert!(text.contains(line), "the scenario config has {line}");
    let text = text.replace(line, &format!("{line}encodings = {{ \"{}\" = \"{encoding}\" }}\n", s.topic));
    std::fs::write(&s.config, text).expect("write config");
}

/// (count, distinct span coordinates, distinct request ids) of the hot table.
fn exactness(s: &Scenario) -> (u64, u64, u64) {
    let answer = clickhouse(&format!(
        "SELECT count(), uniqExact(kafka_partition, kafka_offset, kafka_index), uniqExact(request_id) FROM {}",
        s.qualified_table()
    ));
    let v: Vec<u64> = answer.split('\t').map(|p| p.parse().expect("number")).collect();
    (v[0], v[1], v[2])
}

/// A stored value as a number (ClickHouse quotes 64-bit integers in JSON).
fn number(v: &Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// Every expected field of every expected row equals the stored one.
fn compare_rows(s: &Scenario, expected: &Expected) {
    let fields = "request_id, model_name, model_version, business_line, input_tokens, output_tokens, total_latency_ms, \
                  queue_wait_ms, ttft_ms, prefill_time_ms, decode_time_ms, timestamp_ms, error_code, error_stage, request_type, \
                  session_id, user_id_hash IS NOT NULL AS user";
    let stored: HashMap<String, serde_json::Map<String, Value>> =
        clickhouse(&format!("SELECT {fields} FROM {} FORMAT JSONEachRow", s.qualified_table()))
            .lines()
            .map(|l| {
                let row: serde_json::Map<String, Value> = serde_json::from_str(l).expect("JSONEachRow");
                (row["request_id"].as_str().expect("request_id").to_owned(), row)
            })
            .collect();
    assert_eq!(stored.len(), expected.rows.len(), "{}: stored rows against inference spans", s.topic);
    for want in &expected.rows {
        let id = want["request_id"].as_str().expect("request_id");
        let got = stored.get(id).unwrap_or_else(|| panic!("{}: no row for span {id}", s.topic));
        for (field, w) in want {
            let g = &got[field];
            let same = match (w, field.as_str()) {
                (Value::Bool(b), _) => number(g) == Some(f64::from(u8::from(*b))),
                (Value::Number(n), _) => {
                    let (w, g) = (n.as_f64().expect("number"), number(g).unwrap_or(f64::NAN));
                    (w - g).abs() <= 1e-9 * w.abs().max(1.0)
                }
                _ => g == w,
            };
            assert!(same, "{}: span {id}: {field} is {g}, the span says {w}", s.topic);
        }
    }
}

/// vLLM spans, GenAI spans, unrelated and broken spans, interleaved, into
/// one topic per encoding: each inference span is exactly one row with the
/// fields computed from its attributes; unrelated spans are counted, not
/// rows; broken spans reach the DLQ with their trace and span ids, while
/// the good spans of their message are stored.
#[test]
fn collector_spans_become_exactly_their_rows_in_both_encodings() {
    let (m_proto, m_json) = (free_loopback_addr(), free_loopback_addr());
    let proto = Scenario::new("otlp_proto", 2, &format!("metrics_addr = \"{m_proto}\"\n"));
    let json = Scenario::new("otlp_json", 2, &format!("metrics_addr = \"{m_json}\"\n"));
    set_encoding(&proto, "otlp_proto");
    set_encoding(&json, "otlp_json");
    proto.create_plain_hot_table();
    json.create_plain_hot_table();
    let collector = Collector::start(proto.dir.path(), &[(&proto.topic, "otlp_proto"), (&json.topic, "otlp_json")]);
    let (_, seed) = test_rng("otlp spans");
    let expected = emit(proto.dir.path(), &collector.endpoint, seed, [800, 300, 200], &["--broken"]);
    assert_eq!(expected.broken.len(), 5, "emit_spans.py breaks five spans");

    for (s, addr) in [(&proto, &m_proto), (&json, &m_json)] {
        let mut ingest = s.spawn_ingest(None, "ingest.log");
        let skipped_line = format!("inferlog_ingest_otlp_spans_skipped_total{{topic=\"{}\"}}", s.topic);
        wait_for(
            Duration::from_secs(120),
            || s.hot_count().0 >= expected.rows.len() as u64 && metric(addr, &skipped_line).unwrap_or(0.0) >= expected.skipped as f64,
            || {
                format!(
                    "{}: {} rows and {} skipped spans (seed {seed}); {:?}: {}",
                    s.topic,
                    expected.rows.len(),
                    expected.skipped,
                    s.hot_count(),
                    s.log("ingest.log")
                )
            },
        );
        assert_eq!(metric(addr, &skipped_line), Some(expected.skipped as f64), "{}: unrelated spans counted once each", s.topic);
        let status = sigterm(&mut ingest, Duration::from_secs(60));
        assert!(status.success(), "{}: ingest exited with {status}: {}", s.topic, s.log("ingest.log"));

        let n = expected.rows.len() as u64;
        assert_eq!(exactness(s), (n, n, n), "{}: count, span coordinates, request ids (seed {seed})", s.topic);
        compare_rows(s, &expected);

        let dlq = read_topic(&s.dlq);
        let header = |m: &Value, k: &str| m["headers"][k].as_str().unwrap_or_default().to_owned();
        let got: HashMap<(String, String), (String, String)> = dlq
            .iter()
            .map(|m| ((header(m, "inferlog.trace_id"), header(m, "inferlog.span_id")), (header(m, "inferlog.reason"), header(m, "inferlog.field"))))
            .collect();
        assert_eq!(got, expected.broken, "{}: the DLQ holds the broken spans, by trace and span id, with their reasons", s.topic);
        // One bad span never refuses its message's others: some broken
        // span shares its message (its coordinates) with stored rows.
        let shared = dlq.iter().filter(|m| {
            let sql = format!(
                "SELECT count() FROM {} WHERE kafka_partition = {} AND kafka_offset = {}",
                s.qualified_table(),
                header(m, "inferlog.source.partition"),
                header(m, "inferlog.source.offset")
            );
            inferlog_tests::clickhouse_u64(&sql) > 0
        });
        assert!(shared.count() > 0, "{}: no broken span shared a message with stored spans (seed {seed})", s.topic);
        // The DLQ keeps no personal data: the e-mail address sent as a session id is not in it.
        let values = read_topic_values(&s.dlq);
        assert_eq!(values.len(), dlq.len());
        for m in &values {
            assert!(!m["value"].as_str().unwrap_or_default().contains("alice@example.com"), "{}: personal data in the DLQ: {m}", s.topic);
        }
    }
}

/// `kill -9` of ingest at random moments while it stores the spans of the
/// Collector's messages (up to 200 spans to a message, batches of 500
/// rows: many inserts and commits, each kill between some insert and its
/// commit or inside one): afterwards every inference span is one row, on a
/// plain `MergeTree` where a duplicate would stay visible, and the next run
/// finds each message's spans stored by their coordinates.
#[test]
fn kill_dash_nine_mid_message_neither_loses_nor_duplicates_spans() {
    let s = Scenario::static_assignment("otlp_crash", 4, "batch_max_rows = 500\n");
    set_encoding(&s, "otlp_proto");
    s.create_plain_hot_table();
    let collector = Collector::start(s.dir.path(), &[(&s.topic, "otlp_proto")]);
    let (mut rng, seed) = test_rng("otlp kill -9 moments");
    let expected = emit(s.dir.path(), &collector.endpoint, seed, [16_000, 2_000, 2_000], &[]);
    let n = expected.rows.len() as u64;

    let mut progress = Vec::new();
    for kill in 0..3u64 {
        let log = format!("run-{kill}.log");
        let mut child = s.spawn_ingest(None, &log);
        let target = n * (kill + 1) / 8;
        wait_for(Duration::from_secs(120), || s.hot_count().0 >= target, || format!("{target} rows stored (seed {seed}): {}", s.log(&log)));
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..100)));
        child.kill().expect("kill -9");
        let _ = child.wait();
        progress.push(s.hot_count().0);
    }
    s.drain("final.log");
    let logs = || ["run-0.log", "run-1.log", "run-2.log", "final.log"].iter().map(|l| format!("== {l}\n{}", s.log(l))).collect::<String>();
    assert_eq!(exactness(&s), (n, n, n), "after kills at {progress:?} rows (seed {seed}): {}", logs());
    assert!(progress.iter().all(|&p| p > 0 && p < n), "every kill happened mid-ingest: {progress:?} of {n}");
    let stored: BTreeSet<String> = clickhouse(&format!("SELECT request_id FROM {}", s.qualified_table())).lines().map(str::to_owned).collect();
    let want: BTreeSet<String> = expected.rows.iter().map(|r| r["request_id"].as_str().expect("id").to_owned()).collect();
    assert!(stored == want, "stored request ids differ from the spans' (seed {seed})");
}

/// A message whose spans straddle midnight goes to two days' inserts; a
/// crash between them leaves one day's rows stored and the batch not
/// marked done. Made here after the fact on a fully stored topic: today's
/// partition dropped, every done mark deleted, a new group reading from the
/// start. The new reader writes exactly the missing spans: the replay
/// filter knows a message by the indexes of its stored rows, not by its
/// offset alone.
#[test]
fn a_message_half_stored_across_midnight_gets_exactly_its_missing_spans() {
    let s = Scenario::static_assignment("otlp_midnight", 2, "");
    set_encoding(&s, "otlp_proto");
    s.create_plain_hot_table();
    let collector = Collector::start(s.dir.path(), &[(&s.topic, "otlp_proto")]);
    let (_, seed) = test_rng("otlp midnight");
    let expected = emit(s.dir.path(), &collector.endpoint, seed, [1_200, 0, 100], &["--yesterday", "0.5"]);
    let n = expected.rows.len() as u64;
    s.drain("first.log");
    assert_eq!(exactness(&s), (n, n, n), "first reader (seed {seed})");
    let t = s.qualified_table();
    let straddling = inferlog_tests::clickhouse_u64(&format!(
        "SELECT count() FROM (SELECT kafka_partition, kafka_offset FROM {t} GROUP BY kafka_partition, kafka_offset HAVING uniqExact(day) = 2)"
    ));
    assert!(straddling > 0, "no message straddled midnight (seed {seed})");

    let today = clickhouse(&format!("SELECT toString(max(day)) FROM {t}"));
    clickhouse(&format!("ALTER TABLE {t} DROP PARTITION '{today}'"));
    let log = format!("{t}_offsets");
    clickhouse(&format!("ALTER TABLE {log} DELETE WHERE state = 1"));
    wait_for(
        Duration::from_secs(60),
        || inferlog_tests::clickhouse_u64(&format!("SELECT count() FROM {log} WHERE state = 1")) == 0,
        || "the done marks deleted".into(),
    );
    let left = s.hot_count().0;
    assert!(left > 0 && left < n, "yesterday's rows stay: {left} of {n}");
    let config = std::fs::read_to_string(&s.config).expect("config").replace(&s.group, &format!("{}-again", s.group));
    std::fs::write(&s.config, config).expect("config");
    s.drain("second.log");
    assert_eq!(exactness(&s), (n, n, n), "after the second reader (seed {seed}): {}", s.log("second.log"));
    let stored: BTreeSet<String> = clickhouse(&format!("SELECT request_id FROM {t}")).lines().map(str::to_owned).collect();
    let want: BTreeSet<String> = expected.rows.iter().map(|r| r["request_id"].as_str().expect("id").to_owned()).collect();
    assert!(stored == want, "stored request ids differ from the spans' (seed {seed})");
}

/// A span whose request id is already stored with other content is
/// refused as a conflict after its row was built: the DLQ still gets that
/// span's own ids and the event it mapped to (written again from the
/// message), the first version stays, an identical span is a duplicate.
#[test]
fn a_span_conflicting_with_a_stored_request_keeps_its_ids_and_event_in_the_dlq() {
    use inferlog_tests::otlp::{Input, Workload};
    let s = Scenario::new("otlp_conflict", 1, "");
    set_encoding(&s, "otlp_proto");
    let first = Workload::around_midnight(Input::OtlpProto, 30, 10, 0, 2612, "otlp-conflict");
    first.produce(s.dir.path(), &s.topic, 1);
    // Again, in one message of 10: every third request changed, the rest identical retries.
    let mut again = first.clone();
    for r in again.requests.iter_mut().step_by(3) {
        r.latency_ms += 250.0;
    }
    let changed: BTreeSet<usize> = (0..again.requests.len()).step_by(3).collect();
    again.per_message = 30;
    again.produce(s.dir.path(), &s.topic, 1);
    s.drain("ingest.log");
    assert_eq!(exactness(&s), (30, 30, 30), "each request once: {}", s.log("ingest.log"));
    let dlq = read_topic_values(&s.dlq);
    let mut refused = BTreeSet::new();
    for m in &dlq {
        assert_eq!(m["headers"]["inferlog.reason"].as_str(), Some("request_id.conflict"), "{m}");
        let value: Value = serde_json::from_str(m["value"].as_str().expect("a value")).expect("the span's event as JSON");
        let i = again.requests.iter().position(|r| value["request_id"] == r.request_id.as_str()).expect("a request of the workload");
        // The ids `Request::span` gives span i of the message, independently of inferlog.
        let mut trace_id = [0u8; 16];
        trace_id[..8].copy_from_slice(&(i as u64).to_be_bytes());
        assert_eq!(m["headers"]["inferlog.span_id"].as_str(), Some(hex::encode((i as u64 + 1).to_be_bytes()).as_str()), "{m}");
        assert_eq!(m["headers"]["inferlog.trace_id"].as_str(), Some(hex::encode(trace_id).as_str()), "{m}");
        assert_eq!(value["total_latency_s"].as_f64(), Some(again.requests[i].latency_ms / 1000.0), "the changed event: {value}");
        refused.insert(i);
    }
    assert_eq!((refused, dlq.len()), (changed.clone(), changed.len()), "one DLQ message per changed span");
    let stored = clickhouse(&format!("SELECT request_id, total_latency_ms FROM {} FORMAT TSV", s.qualified_table()));
    let stored: HashMap<&str, f64> = stored.lines().filter_map(|l| l.split_once('\t')).map(|(id, ms)| (id, ms.parse().expect("a latency"))).collect();
    for r in &first.requests {
        assert!((stored[r.request_id.as_str()] - r.latency_ms).abs() < 0.01, "{} keeps its first version: {stored:?}", r.request_id);
    }
}
