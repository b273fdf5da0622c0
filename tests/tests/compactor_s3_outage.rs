//! The cold store goes away: with the S3 server stopped, the compactor
//! drops no partition, records where each day stopped, reports the failure
//! (exit 75, transient: the object store named in the log); once the server is back,
//! the next pass completes. And the server goes away between archiving and
//! verification: the day stays unreleased, and once the server is back it
//! finishes with the very objects archived before the outage. Its own test
//! binary, because stopping the shared S3 server fails every other test
//! using it; the tests here take turns.

use std::sync::Mutex;
use std::time::Duration;

use inferlog_tests::pipeline::{services, OnDrop};
use inferlog_tests::tiers::{day_string, today, TierScenario};

/// One S3 outage at a time.
static S3: Mutex<()> = Mutex::new(());

#[test]
fn with_the_s3_server_stopped_no_partition_is_dropped_and_the_next_pass_completes() {
    let _turn = S3.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let s = TierScenario::new("cmp_s3down", "");
    let old = today() - 9; // past the hot retention: would be released
    let events = s.seed(6_000, 2, old, 31);
    let before = s.hot_days();
    assert_eq!(before.len(), 2);

    let guard = OnDrop("start-s3");
    services("stop-s3");
    let (code, _) = s.run("inferlog-compactor", &["--once"], "down.log");
    let log = s.log("down.log");
    assert_eq!(code, 75, "an unreachable store is transient (exit 75): {log}");
    assert!(log.contains("day not completed in this pass") && log.contains("parquet"), "{log}");
    assert_eq!(s.hot_days(), before, "no partition dropped without a verified archive");
    assert_eq!(
        s.psql("SELECT day, state FROM compactor_days ORDER BY day"),
        format!("{}\tarchiving\n{}\tarchiving", day_string(old - 1), day_string(old)),
        "each day recorded where it stopped"
    );
    assert!(!s.psql("SELECT last_error FROM compactor_days").is_empty(), "the failure is recorded on the day");
    assert_eq!(s.psql("SELECT count(*) FROM cold_manifest"), "0");
    assert_eq!(s.psql("SELECT count(*) FROM retention_audit"), "0");

    drop(guard); // the server comes back
    let (code, _) = s.run("inferlog-compactor", &["--once"], "up.log");
    assert_eq!(code, 0, "{}", s.log("up.log"));
    assert_eq!(
        s.psql("SELECT day, state, last_error IS NULL FROM compactor_days ORDER BY day"),
        format!("{}\treleased\tt\n{}\treleased\tt", day_string(old - 1), day_string(old))
    );
    assert!(s.hot_days().is_empty(), "released once archived and verified");
    assert_eq!(s.psql("SELECT sum(rows) FROM cold_manifest"), events.len().to_string());
    assert_eq!(s.s3_objects().len(), 2);
    assert_eq!(
        s.psql("SELECT count(*), sum(rows) FROM retention_audit WHERE tier = 'hot' AND action = 'drop_partition'"),
        format!("2\t{}", events.len())
    );
}

#[test]
fn an_outage_between_archive_and_verify_keeps_the_day_and_finishes_with_the_same_objects() {
    let _turn = S3.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let s = TierScenario::new("cmp_s3_verify", "");
    let old = today() - 9; // past the hot retention: would be released
    let events = s.seed(8_000, 1, old, 37);
    let before = s.hot_days();

    // Archived, not yet verified: the compactor stops there (and is killed).
    let mut child = s.spawn("inferlog-compactor", &["--once"], "paused.log", &[("INFERLOG_COMPACTOR_PAUSE_AFTER", "archived")]);
    if let Some(status) = inferlog_tests::wait_paused(&mut child, || s.log("paused.log"), Duration::from_secs(120)) {
        panic!("compactor exited ({status}) before archiving: {}", s.log("paused.log"));
    }
    let archived = s.s3_digests();
    assert_eq!(archived.len(), 1, "one object for the day: {archived:?}");

    let guard = OnDrop("start-s3");
    services("stop-s3");
    child.kill().expect("kill -9");
    let _ = child.wait();
    let (code, _) = s.run("inferlog-compactor", &["--once"], "down.log");
    assert_eq!(code, 75, "S3 down is transient (exit 75): {}", s.log("down.log"));
    assert_eq!(s.hot_days(), before, "unverified: the day stays hot");
    assert_eq!(s.psql("SELECT state FROM compactor_days"), "archived", "the day waits where it stopped");
    assert!(!s.psql("SELECT last_error FROM compactor_days").is_empty(), "the failure is recorded on the day");

    drop(guard); // the server comes back, with its objects (on disk)
    let (code, _) = s.run("inferlog-compactor", &["--once"], "up.log");
    assert_eq!(code, 0, "{}", s.log("up.log"));
    assert_eq!(s.psql("SELECT day, state FROM compactor_days"), format!("{}\treleased", day_string(old)));
    assert_eq!(s.s3_digests(), archived, "the same keys, byte-identical");
    assert!(s.hot_days().is_empty(), "released once verified");
    assert_eq!(s.psql("SELECT sum(rows) FROM cold_manifest"), events.len().to_string());
}
