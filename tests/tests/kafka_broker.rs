//! ingest while the Apache Kafka broker fails under it: killed (`kill -9`)
//! mid-run and restarted 30 s later; stopped cleanly and restarted while
//! the group rebalances; down when ingest is told to stop (SIGTERM); and
//! messages the broker deleted (retention) before ingest read them. ingest never exits for any of these, and the
//! totals are exact (hot rows + DLQ = produced, less what the broker
//! deleted, which is counted). Its own test binary, because stopping the
//! shared broker would fail every other test running beside it; the tests
//! here take turns.

use std::sync::Mutex;
use std::time::Duration;

use inferlog_tests::pipeline::{services, OnDrop};
use inferlog_tests::{
    free_loopback_addr, generate, http_get, kafkatool, log_starts, read_topic, sigterm, valid_count, wait_for, write_jsonl, Scenario,
};

/// One broker fault at a time.
static BROKER: Mutex<()> = Mutex::new(());

fn metric(addr: &str, line_start: &str) -> Option<u64> {
    http_get(addr, "/metrics").lines().find_map(|l| l.strip_prefix(line_start).and_then(|v| v.trim().parse::<f64>().ok()).map(|v| v as u64))
}

#[test]
fn a_broker_killed_mid_run_and_restarted_30s_later_loses_and_doubles_nothing() {
    let _turn = BROKER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let addr = free_loopback_addr();
    // Small batches, and the kill at the first one stored: mid-run.
    let s = Scenario::new("broker_kill", 4, &format!("metrics_addr = \"{addr}\"\nbatch_max_rows = 1000\n"));
    let events = s.produce_generated(100_000, 0.01, 1401);
    let valid = valid_count(&events) as u64;
    let mut ingest = s.spawn_ingest(None, "ingest.log");
    wait_for(Duration::from_secs(120), || s.hot_count().0 > 0, || s.log("ingest.log"));

    let restart = OnDrop("start-kafka");
    services("kill-kafka");
    let at_kill = s.hot_count().0;
    // Down for 30 s: ingest waits (no exit) and commits nothing it has not stored.
    let down = std::time::Instant::now();
    while down.elapsed() < Duration::from_secs(30) {
        assert!(ingest.try_wait().expect("try_wait").is_none(), "ingest exited while the broker was down: {}", s.log("ingest.log"));
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(restart); // starts the broker again
    wait_for(Duration::from_secs(180), || s.hot_count().0 >= valid, || format!("{:?} of {valid}: {}", s.hot_count(), s.log("ingest.log")));
    let status = sigterm(&mut ingest, Duration::from_secs(60));
    let log = s.log("ingest.log");
    assert!(status.success(), "ingest kept running and stops cleanly: {log}");
    assert!(at_kill < valid, "the broker died mid-run ({at_kill} of {valid} stored)");
    assert_eq!(s.hot_count(), (valid, valid), "{log}");
    let dlq = read_topic(&s.dlq);
    assert_eq!(inferlog_tests::dlq_sources(&dlq).len(), events.len() - valid as usize, "every reject in the DLQ once");
}

#[test]
fn a_clean_broker_restart_during_a_rebalance_loses_and_doubles_nothing() {
    let _turn = BROKER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let s = Scenario::new("broker_rebalance", 8, "batch_max_rows = 5000\n");
    let events = s.produce_generated(60_000, 0.01, 1402);
    let valid = valid_count(&events) as u64;
    let mut a = s.spawn_ingest(None, "a.log");
    wait_for(Duration::from_secs(120), || s.hot_count().0 >= valid / 5, || s.log("a.log"));
    // B joins: the group rebalances, and the broker restarts while it does.
    let mut b = s.spawn_ingest(None, "b.log");
    wait_for(Duration::from_secs(60), || s.log("a.log").contains("\"revoke\""), || s.log("a.log"));
    let restart = OnDrop("start-kafka");
    services("stop-kafka");
    drop(restart);
    wait_for(
        Duration::from_secs(240),
        || s.hot_count().0 >= valid,
        || format!("{:?} of {valid}:\nA: {}\nB: {}", s.hot_count(), s.log("a.log"), s.log("b.log")),
    );
    for (child, name) in [(&mut a, "a.log"), (&mut b, "b.log")] {
        let status = sigterm(child, Duration::from_secs(60));
        assert!(status.success(), "{name}: {}", s.log(name));
    }
    let story = |name: &str| {
        let keep = ["revoke", "assign", "lost", "session", "replaying", "commit failed", "rebalance", "waiting", "flush"];
        s.log(name).lines().filter(|l| keep.iter().any(|k| l.contains(k))).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(s.hot_count(), (valid, valid), "duplicated rows\nA: {}\nB: {}", story("a.log"), story("b.log"));
    assert_eq!(inferlog_tests::dlq_sources(&read_topic(&s.dlq)).len(), events.len() - valid as usize);
}

#[test]
fn messages_the_broker_deleted_before_ingest_read_them_are_counted_and_the_rest_stored() {
    let _turn = BROKER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let addr = free_loopback_addr();
    let s = Scenario::new("broker_deleted", 1, &format!("metrics_addr = \"{addr}\"\n"));
    // A group that read nothing yet: its committed offset is 0.
    kafkatool(&["commit", "--topic", &s.topic, "--group", &s.group, "--offset", "0"]);
    kafkatool(&["alter-config", "--topic", &s.topic, "retention.ms=3000", "segment.ms=500"]);
    let old = generate(1_000, 0.0, 1403, 1);
    let old_file = write_jsonl(s.dir.path(), &old);
    let old_copy = s.dir.path().join("old.jsonl");
    std::fs::rename(&old_file, &old_copy).expect("rename");
    inferlog_tests::produce(&s.topic, &old_copy);
    // The broker deletes them (retention) before ingest runs.
    wait_for(Duration::from_secs(90), || log_starts(&s.topic) == vec![1_000], || format!("log start {:?}", log_starts(&s.topic)));
    kafkatool(&["alter-config", "--topic", &s.topic, "retention.ms=3600000"]);
    let events = s.produce_generated(5_000, 0.02, 1404);
    let valid = valid_count(&events) as u64;

    let mut ingest = s.spawn_ingest(None, "ingest.log");
    wait_for(Duration::from_secs(120), || s.hot_count().0 >= valid, || s.log("ingest.log"));
    wait_for(Duration::from_secs(30), || metric(&addr, "inferlog_ingest_offsets_lost_total ") == Some(1_000), || http_get(&addr, "/metrics"));
    assert_eq!(metric(&addr, "inferlog_ingest_offset_gaps_total{outcome=\"lost\"} "), Some(1), "one gap, counted");
    let status = sigterm(&mut ingest, Duration::from_secs(60));
    let log = s.log("ingest.log");
    assert!(status.success(), "ingest does not stop for deleted offsets: {log}");
    assert!(log.contains("offsets are gone from the broker"), "logged: {log}");
    assert_eq!(s.hot_count(), (valid, valid), "everything still readable is stored: {log}");
    assert_eq!(read_topic(&s.dlq).len(), events.len() - valid as usize);
}

/// SIGTERM while the broker is down, with everything read still buffered:
/// ingest writes the rows, cannot deliver the rejects or commit, and exits
/// within systemd's `TimeoutStopSec` (45 s) instead of waiting on the
/// broker; nothing is lost: once the broker is back, a run stores the rest
/// (skipping what landed) and delivers every reject.
#[test]
fn sigterm_with_the_broker_down_exits_within_the_budget_and_loses_nothing() {
    let _turn = BROKER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let addr = free_loopback_addr();
    let s = Scenario::static_assignment("broker_down_term", 4, &format!("metrics_addr = \"{addr}\"\nbatch_max_age = \"60s\"\n"));
    let events = s.produce_generated(5_000, 0.02, 1405);
    let valid = valid_count(&events) as u64;
    let mut ingest = s.spawn_ingest(None, "ingest.log");
    let all_read = format!("inferlog_ingest_messages_total{{topic=\"{}\"}} ", s.topic);
    wait_for(Duration::from_secs(60), || metric(&addr, &all_read) == Some(5_000), || s.log("ingest.log"));
    assert_eq!(s.hot_count().0, 0, "everything read is still buffered");

    let restart = OnDrop("start-kafka");
    services("kill-kafka");
    let stopping = std::time::Instant::now();
    let status = inferlog_tests::sigterm(&mut ingest, Duration::from_secs(90));
    let took = stopping.elapsed();
    let log = s.log("ingest.log");
    assert!(took < Duration::from_secs(45), "exits within TimeoutStopSec (45 s), took {took:?}: {log}");
    assert_ne!(status.code(), Some(2), "the broker being away is not permanent: {log}");
    assert_eq!(s.hot_count().0, valid, "the rows were made durable before the exit: {log}");

    drop(restart); // the broker comes back
    s.drain("after.log");
    assert_eq!(s.hot_count(), (valid, valid), "{}", s.log("after.log"));
    assert_eq!(inferlog_tests::dlq_sources(&read_topic(&s.dlq)).len(), events.len() - valid as usize, "every reject in the DLQ");
}
