//! What ingest does with a hot table an operator changed, with refusals at
//! start-up, with a bug, and with events that cannot be taken as they are:
//! each against the real broker and ClickHouse.
//!
//! - a column added to the hot table while ingest runs: every row still
//!   stored, with the column's default;
//! - a column whose type changed: exit 2 within seconds naming it and both
//!   types, nothing stored, nothing committed;
//! - ClickHouse refusing the password or the right to create the tables,
//!   and a `kafka.options` librdkafka refuses: exit 2 within seconds;
//! - a writer task that panics after its rows landed: exit 70 (restarted
//!   by systemd), nothing committed, and the restart stores every event
//!   once (on a table no merge can collapse a duplicate in);
//! - two different events under one `request_id`: the second goes to the
//!   DLQ as `request_id.conflict`, an identical retry is a counted duplicate;
//! - events stamped by a clock hours off: the skew histogram shows it, and
//!   a refused event's DLQ message names clock skew as the cause.

use std::time::Duration;

use inferlog_tests::{
    clickhouse, clickhouse_u64, committed, free_loopback_addr, generate, metric, read_topic, sigterm, valid_count, wait_for, write_jsonl, Scenario,
};
use serde_json::Value;

/// A refusal is permanent: exit 2, well within the time a retry loop would take.
const REFUSAL_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_column_added_to_the_hot_table_while_ingest_runs_leaves_every_row_stored() {
    let s = Scenario::new("added_column", 2, "batch_max_rows = 500\n");
    let first = generate(2_000, 0.0, 2601, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &first));
    let mut ingest = s.spawn_ingest(None, "ingest.log");
    wait_for(Duration::from_secs(60), || s.hot_count().0 == 2_000, || s.log("ingest.log"));

    // The operator adds a column; ingest keeps running and more events come.
    clickhouse(&format!("ALTER TABLE {} ADD COLUMN region String DEFAULT 'eu-west'", s.qualified_table()));
    let dir = tempfile::tempdir().expect("tempdir");
    let second = generate(3_000, 0.0, 2602, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(dir.path(), &second));
    wait_for(Duration::from_secs(60), || s.hot_count().0 == 5_000, || format!("{:?}\n{}", s.hot_count(), s.log("ingest.log")));
    assert!(sigterm(&mut ingest, Duration::from_secs(60)).success(), "{}", s.log("ingest.log"));
    assert!(!s.log("ingest.log").contains("write failed"), "no insert failed: {}", s.log("ingest.log"));

    // Every row, correct: figures computed from the produced events.
    let all: Vec<_> = first.iter().chain(&second).cloned().collect();
    let tokens: u64 = inferlog_tests::pipeline::normalized(&all).iter().map(|e| u64::from(e.input_tokens)).sum();
    let t = s.qualified_table();
    assert_eq!(clickhouse_u64(&format!("SELECT sum(toUInt64(input_tokens)) FROM {t}")), tokens);
    assert_eq!(clickhouse_u64(&format!("SELECT countIf(region = 'eu-west') FROM {t}")), 5_000, "the new column took its default");

    // A start with the column in place logs it once, and goes on.
    s.drain("again.log");
    let again = s.log("again.log");
    assert_eq!(again.matches("columns ingest does not write").count(), 1, "{again}");
    assert!(again.contains("region"), "{again}");
}

#[test]
fn a_column_whose_type_changed_stops_ingest_with_exit_2_naming_it() {
    let s = Scenario::new("retyped", 2, "");
    // The table as ingest makes it, then a type of the same width.
    s.drain("create.log");
    clickhouse(&format!("ALTER TABLE {} MODIFY COLUMN error_code UInt32", s.qualified_table()));
    s.produce_generated(1_000, 0.0, 2603);
    let (code, took, log) = s.run_ingest(None, "ingest.log", &[], Duration::from_secs(120));
    assert_eq!(code, Some(2), "{log}");
    assert!(took < REFUSAL_LIMIT, "within seconds, took {took:?}: {log}");
    let error = log.lines().find(|l| l.contains("ingest failed")).unwrap_or_else(|| panic!("an error line: {log}"));
    assert!(error.contains("error_code") && error.contains("UInt32") && error.contains("Int32"), "names the column and both types: {error}");
    assert_eq!(s.hot_count(), (0, 0), "nothing stored");
    assert!(committed(&s.topic, &s.group).iter().all(|o| *o < 0), "nothing committed");
}

#[test]
fn clickhouse_refusing_the_password_or_the_create_right_exits_2_within_seconds() {
    for (name, env, says) in [
        ("badpw", ("INFERLOG_CLICKHOUSE_PASSWORD", "not-the-password"), "Code: 193"),
        ("readonly", ("INFERLOG_CLICKHOUSE__USER", "inferlog_readonly"), "Code: 164"),
    ] {
        let s = Scenario::new(&format!("ch_{name}"), 1, "");
        s.produce_generated(100, 0.0, 2604);
        let (code, took, log) = s.run_ingest(None, "ingest.log", &[env], Duration::from_secs(120));
        assert_eq!(code, Some(2), "{name}: {log}");
        assert!(took < REFUSAL_LIMIT, "{name}: within seconds, took {took:?}: {log}");
        let error = log.lines().find(|l| l.contains("ingest failed")).unwrap_or_else(|| panic!("{name}: an error line: {log}"));
        assert!(error.contains("clickhouse") && error.contains(says), "{name}: names ClickHouse and its answer: {error}");
        assert!(!log.contains("not-the-password"), "the password is never logged");
        assert!(committed(&s.topic, &s.group).iter().all(|o| *o < 0), "{name}: nothing committed");
    }
}

#[test]
fn a_kafka_option_librdkafka_refuses_exits_2_in_either_assignment() {
    for assignment in ["group", "static"] {
        let kafka = format!("assignment = \"{assignment}\"\noptions = {{ \"fetch.wait.max.ms\" = \"soon\" }}\n");
        let s = Scenario::with_kafka(&format!("badopt_{assignment}"), 1, &kafka, "");
        let (code, took, log) = s.run_ingest(None, "ingest.log", &[], Duration::from_secs(120));
        assert_eq!(code, Some(2), "{assignment}: {log}");
        assert!(took < REFUSAL_LIMIT, "{assignment}: took {took:?}");
        assert!(log.contains("fetch.wait.max.ms") && log.contains("kafka.options"), "{assignment}: names the option: {log}");
    }
}

/// The writer panics right after a batch's rows landed, before its rejects
/// and its commit: exit 70, not 2 (systemd restarts it). The restart reads
/// the batch again and its replay-log intent makes it skip what landed:
/// on a table that cannot merge, every event is stored exactly once.
#[test]
fn a_panicked_writer_exits_70_and_the_restart_stores_every_event_once() {
    let s = Scenario::new("panic", 4, "batch_max_rows = 3000\n");
    s.create_plain_hot_table();
    let events = s.produce_generated(10_000, 0.02, 2605);
    let valid = valid_count(&events) as u64;
    let (code, _, log) = s.run_ingest(None, "panic.log", &[("INFERLOG_INGEST_TEST_PANIC", "writer")], Duration::from_secs(120));
    assert_eq!(code, Some(70), "a panic is a bug: exit 70: {log}");
    assert!(log.contains("writer task panicked"), "{log}");
    let landed = s.hot_count().0;
    assert!(landed > 0, "the panic came after rows landed");
    assert!(committed(&s.topic, &s.group).iter().all(|o| *o < 0), "nothing committed");
    s.drain("after.log");
    assert_eq!(s.hot_count(), (valid, valid), "every event once, on a table no merge collapses: {}", s.log("after.log"));
    assert!(s.log("after.log").contains("replaying: skipping stored offsets"), "the restart skipped what landed: {}", s.log("after.log"));
    assert_eq!(s.rejects_logged(), (events.len() as u64 - valid, events.len() as u64 - valid), "each reject logged once");
}

#[test]
fn a_different_event_under_a_stored_request_id_goes_to_the_dlq_as_a_conflict() {
    let s = Scenario::new("conflict", 1, "");
    let events = generate(200, 0.0, 2606, 1);
    let mut lines: Vec<Vec<u8>> = events.iter().map(|e| e.line.clone()).collect();
    // Every tenth event twice more: once identical (a producer retry), once with other content.
    let mut conflicts = Vec::new();
    for e in events.iter().step_by(10) {
        lines.push(e.line.clone());
        let mut changed: Value = serde_json::from_slice(&e.line).expect("json");
        changed["total_latency_ms"] = Value::from(changed["total_latency_ms"].as_f64().expect("total_latency_ms") + 1.0);
        let changed = serde_json::to_vec(&changed).expect("json");
        conflicts.push(inferlog_tests::sha256_hex(&changed));
        lines.push(changed);
    }
    let file = s.dir.path().join("conflicts.jsonl");
    std::fs::write(&file, lines.join(&b'\n')).expect("write");
    inferlog_tests::produce(&s.topic, &file);
    s.drain("ingest.log");
    assert_eq!(s.hot_count(), (200, 200), "each request once, the first version");
    let dlq = read_topic(&s.dlq);
    assert_eq!(dlq.len(), conflicts.len(), "one DLQ message per conflicting event: {dlq:?}");
    for m in &dlq {
        assert_eq!(m["headers"]["inferlog.reason"].as_str(), Some("request_id.conflict"), "{m}");
        assert!(conflicts.contains(&inferlog_tests::original_sha256(m).to_owned()), "the changed event, not the retry: {m}");
    }
    let log = s.log("ingest.log");
    assert!(log.contains(&format!("duplicates={}", conflicts.len())), "the identical retries are counted duplicates: {log}");
}

#[test]
fn an_event_clock_hours_off_shows_in_the_skew_histogram_and_names_the_cause() {
    let addr = free_loopback_addr();
    let s = Scenario::new("skew", 1, &format!("metrics_addr = \"{addr}\"\n"));
    let now = inferlog_tests::now_ms();
    let stamp = |ms: i64| inferlog_schema::timestamp::format_rfc3339_ms(ms);
    let mut lines = Vec::new();
    for (i, e) in generate(300, 0.0, 2607, 1).iter().enumerate() {
        let mut v: Value = serde_json::from_slice(&e.line).expect("json");
        // 100 stamped two hours behind (accepted), 100 eight hours ahead (refused), 100 on time.
        v["timestamp"] = Value::from(match i % 3 {
            0 => stamp(now - 2 * 3_600_000),
            1 => stamp(now + 8 * 3_600_000),
            _ => stamp(now - 1_000),
        });
        lines.push(serde_json::to_vec(&v).expect("json"));
    }
    let file = s.dir.path().join("skew.jsonl");
    std::fs::write(&file, lines.join(&b'\n')).expect("write");
    inferlog_tests::produce(&s.topic, &file);
    let mut ingest = s.spawn_ingest(None, "ingest.log");
    wait_for(Duration::from_secs(60), || s.hot_count().0 == 200, || s.log("ingest.log"));
    let bucket = |le: &str| metric(&addr, &format!("inferlog_ingest_event_clock_skew_seconds_bucket{{topic=\"{}\",le=\"{le}\"}} ", s.topic));
    wait_for(Duration::from_secs(30), || bucket("+Inf") == Some(200.0), || inferlog_tests::http_get(&addr, "/metrics"));
    assert_eq!(bucket("-3600"), Some(100.0), "the two-hours-behind clock is in the histogram");
    assert_eq!(bucket("-600"), Some(100.0), "and nothing else is that far off");
    assert!(sigterm(&mut ingest, Duration::from_secs(60)).success());
    let dlq = read_topic(&s.dlq);
    assert_eq!(dlq.len(), 100, "the events eight hours ahead are refused");
    for m in &dlq {
        let message = m["headers"]["inferlog.message"].as_str().expect("message");
        assert_eq!(m["headers"]["inferlog.reason"].as_str(), Some("timestamp.out_of_range"), "{m}");
        assert!(message.contains("clock skew") && message.contains("ahead of"), "names the cause: {message}");
    }
}
