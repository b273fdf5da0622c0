//! ClickHouse stopped in the middle of a run: ingest retries with backoff,
//! keeps its memory bounded, resumes by itself when ClickHouse is back, and
//! loses or duplicates nothing; and two group members waiting out an
//! outage three times `max.poll.interval.ms` stay in the group (their
//! partitions paused while they poll), with no rebalance at all.
//!
//! This stops the shared ClickHouse server, so it lives alone in its test
//! binary (cargo runs test binaries one after another), and its tests take
//! turns.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use inferlog_tests::pipeline::{services, OnDrop};
use inferlog_tests::{sigterm, valid_count, wait_for, wait_with_limit, write_jsonl, Scenario};

/// One outage at a time.
static CLICKHOUSE: Mutex<()> = Mutex::new(());

#[test]
fn clickhouse_down_for_30_seconds_loses_nothing_and_recovers() {
    let _turn = CLICKHOUSE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
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
        peak_during_outage = peak_during_outage.max(inferlog_tests::status_kib(child.id(), "VmRSS:"));
    }
    assert!(child.try_wait().expect("try_wait").is_none(), "ingest keeps running while ClickHouse is down: {}", s.log("ingest.log"));
    services("start-clickhouse");
    let at_restart = s.hot_count().0;
    assert!(at_restart < valid, "the outage hit mid-run ({at_restart} of {valid} rows stored before it)");
    let high_water = inferlog_tests::status_kib(child.id(), "VmHWM:");
    let status = wait_with_limit(&mut child, Duration::from_secs(600));
    let log = s.log("ingest.log");
    assert!(status.success(), "ingest: {log}");
    assert!(log.contains("write failed; retrying"), "the outage was noticed and retried");
    assert_eq!(s.hot_count(), (valid, valid));
    // Backpressure: a 30 s outage with 180,000 events waiting does not grow memory without bound.
    assert!(high_water > 0 && high_water < 300 * 1024, "peak RSS {high_water} KiB (during outage {peak_during_outage} KiB)");
}

/// Two members of a group wait out a ClickHouse outage three times their
/// `max.poll.interval.ms` (8 s) long. Waiting on a write pauses their
/// partitions and keeps polling, so neither is thrown out of the group:
/// no revocation in either log from the outage on, both alive, and every
/// event stored once on a table no merge collapses.
#[test]
fn two_members_through_an_outage_longer_than_the_poll_interval_stay_in_the_group() {
    let _turn = CLICKHOUSE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let s = Scenario::with_kafka("poll_outage", 8, "options = { \"max.poll.interval.ms\" = \"8000\" }\n", "batch_max_rows = 2000\n");
    s.create_plain_hot_table();
    let events = inferlog_tests::generate(60_000, 0.01, 2951, 3);
    let (first, second) = events.split_at(20_000);
    let valid = valid_count(&events) as u64;
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), first));
    let mut a = s.spawn_ingest(None, "a.log");
    let mut b = s.spawn_ingest(None, "b.log");
    wait_for(
        Duration::from_secs(120),
        || s.hot_count().0 == valid_count(first) as u64,
        || format!("{:?}\nA: {}\nB: {}", s.hot_count(), s.log("a.log"), s.log("b.log")),
    );
    // Both hold partitions, and the group is settled (no rebalance for a while).
    let assigned = |log: &str| s.log(log).lines().filter(|l| l.contains("\"assign\"") && l.contains(&s.topic)).count();
    wait_for(
        Duration::from_secs(90),
        || assigned("a.log") >= 1 && assigned("b.log") >= 1,
        || format!("both members hold partitions:\nA: {}\nB: {}", s.log("a.log"), s.log("b.log")),
    );
    let revokes = |log: &str| s.log(log).matches("\"revoke\"").count();
    let mut settled = (revokes("a.log"), revokes("b.log"), Instant::now());
    wait_for(
        Duration::from_secs(60),
        || {
            let now = (revokes("a.log"), revokes("b.log"));
            if now != (settled.0, settled.1) {
                settled = (now.0, now.1, Instant::now());
            }
            settled.2.elapsed() > Duration::from_secs(5)
        },
        || "the group settles".to_owned(),
    );
    let before = (revokes("a.log"), revokes("b.log"));

    let restart = OnDrop("start-clickhouse");
    services("stop-clickhouse");
    let dir = tempfile::tempdir().expect("tempdir");
    inferlog_tests::produce(&s.topic, &write_jsonl(dir.path(), second));
    // The outage: three poll intervals, both members alive throughout.
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(24) {
        for (child, log) in [(&mut a, "a.log"), (&mut b, "b.log")] {
            assert!(child.try_wait().expect("try_wait").is_none(), "{log} exited during the outage: {}", s.log(log));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(restart);
    wait_for(Duration::from_secs(180), || s.hot_count().0 >= valid, || format!("{:?}\nA: {}\nB: {}", s.hot_count(), s.log("a.log"), s.log("b.log")));
    for (child, log) in [(&mut a, "a.log"), (&mut b, "b.log")] {
        assert!(sigterm(child, Duration::from_secs(60)).success(), "{log}: {}", s.log(log));
    }
    let (a_log, b_log) = (s.log("a.log"), s.log("b.log"));
    assert_eq!((revokes("a.log"), revokes("b.log")), before, "no rebalance from the outage on:\nA: {a_log}\nB: {b_log}");
    assert!(!a_log.contains("MAXPOLL") && !b_log.contains("MAXPOLL"), "nobody exceeded max.poll.interval.ms");
    assert!(
        a_log.contains("waiting with the partitions paused") && b_log.contains("waiting with the partitions paused"),
        "both waited with their partitions paused:\nA: {a_log}\nB: {b_log}"
    );
    assert_eq!(s.hot_count(), (valid, valid), "every event once, on a table no merge collapses");
}
