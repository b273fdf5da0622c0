//! ClickHouse stopped for 30 seconds in the middle of a run: ingest retries
//! with backoff, keeps its memory bounded, resumes by itself when
//! ClickHouse is back, and loses or duplicates nothing.
//!
//! This stops the shared ClickHouse server, so it lives alone in its test
//! binary (cargo runs test binaries one after another).

use std::time::Duration;

use inferlog_tests::pipeline::{services, OnDrop};
use inferlog_tests::{valid_count, wait_with_limit, Scenario};

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[test]
fn clickhouse_down_for_30_seconds_loses_nothing_and_recovers() {
    let s = Scenario::static_assignment("outage", 8, "batch_max_rows = 5000\n");
    let events = inferlog_tests::generate(200_000, 0.01, 505, 3);
    let (first, second) = events.split_at(100_000);
    let valid = valid_count(&events) as u64;
    let first_file = inferlog_tests::write_jsonl(s.dir.path(), first);
    inferlog_tests::produce(&s.topic, &first_file);

    let mut child = s.spawn_ingest(Some("15s"), "ingest.log");
    inferlog_tests::wait_for(Duration::from_secs(120), || s.hot_count().0 >= 5_000, || s.log("ingest.log"));
    let _restart = OnDrop("start-clickhouse");
    services("stop-clickhouse");
    // The second half arrives while ClickHouse is away: work is waiting for
    // the whole outage, however fast the first half went.
    let second_dir = tempfile::tempdir().expect("tempdir");
    let second_file = inferlog_tests::write_jsonl(second_dir.path(), second);
    inferlog_tests::produce(&s.topic, &second_file);
    let mut peak_during_outage = 0;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        peak_during_outage = peak_during_outage.max(rss_kib(child.id(), "VmRSS:"));
    }
    assert!(child.try_wait().expect("try_wait").is_none(), "ingest keeps running while ClickHouse is down: {}", s.log("ingest.log"));
    services("start-clickhouse");
    let at_restart = s.hot_count().0;
    assert!(at_restart < valid, "the outage hit mid-run ({at_restart} of {valid} rows stored before it)");
    let high_water = rss_kib(child.id(), "VmHWM:");
    let status = wait_with_limit(&mut child, Duration::from_secs(600));
    let log = s.log("ingest.log");
    assert!(status.success(), "ingest: {log}");
    assert!(log.contains("write failed; retrying"), "the outage was noticed and retried");
    assert_eq!(s.hot_count(), (valid, valid));
    // Backpressure: a 30 s outage with 180,000 events waiting does not grow memory without bound.
    assert!(high_water > 0 && high_water < 300 * 1024, "peak RSS {high_water} KiB (during outage {peak_during_outage} KiB)");
}
