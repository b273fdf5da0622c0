//! The DLQ never blocks the commit forever, never loses a reject, and its
//! failures are told apart, against the real broker:
//!
//! - the DLQ fails while ingest runs (an operator set its topic's
//!   `max.message.bytes` below what any reject needs): the rejects pending
//!   then are retried, nothing past them is committed, and every one
//!   reaches the DLQ, whole, once the topic is fixed;
//! - a producer key of 2 MiB on an invalid event: cut to fit (its size and
//!   SHA-256 in headers), delivered, committed;
//! - the DLQ topic deleted while ingest runs: exit 2 naming it, nothing
//!   committed past the pending rejects, all of them delivered by the run
//!   after the topic is back.
//!
//! (A DLQ whose writes the broker refuses to inferlog's user is in
//! `kafka_security.rs`, on the SASL listener.)

use std::collections::HashSet;
use std::time::Duration;

use inferlog_tests::{committed, generate, kafkatool, read_topic, sigterm, valid_count, wait_for, write_jsonl, Scenario};

/// Source offsets of the DLQ messages read by `read_topic`.
fn sources(dlq: &[serde_json::Value]) -> HashSet<i64> {
    dlq.iter().map(|m| m["headers"]["inferlog.source.offset"].as_str().expect("offset").parse().expect("number")).collect()
}

#[test]
fn a_dlq_failing_while_ingest_runs_blocks_the_commit_and_then_takes_every_reject() {
    let s = Scenario::static_assignment("dlqfail", 1, "");
    let first = generate(1_000, 0.05, 2701, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &first));
    let mut ingest = s.spawn_ingest(None, "ingest.log");
    let first_rejects = (first.len() - valid_count(&first)) as usize;
    wait_for(Duration::from_secs(60), || read_topic(&s.dlq).len() == first_rejects, || s.log("ingest.log"));

    // The DLQ now takes no message at all (not even one cut to its headers):
    // every produce fails while ingest runs.
    kafkatool(&["alter-config", "--topic", &s.dlq, "max.message.bytes=10"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let second = generate(2_000, 0.05, 2702, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(dir.path(), &second));
    let total = (first.len() + second.len()) as i64;
    let valid = (valid_count(&first) + valid_count(&second)) as u64;
    wait_for(Duration::from_secs(90), || s.log("ingest.log").contains("dlq produce of"), || s.log("ingest.log"));
    wait_for(Duration::from_secs(60), || s.hot_count().0 == valid, || s.log("ingest.log"));
    assert!(ingest.try_wait().expect("try_wait").is_none(), "a failing DLQ is waited out: {}", s.log("ingest.log"));
    assert!(committed(&s.topic, &s.group)[0] <= first.len() as i64, "nothing of the second lot committed while its rejects are pending");
    assert!(read_topic(&s.dlq).len() == first_rejects, "none of the second lot's rejects reached the DLQ yet");

    // The topic is fixed: every pending reject arrives, and the commit reaches the end.
    kafkatool(&["alter-config", "--topic", &s.dlq, "max.message.bytes=1048588"]);
    let rejects = total as usize - valid as usize;
    wait_for(Duration::from_secs(120), || sources(&read_topic(&s.dlq)).len() == rejects, || s.log("ingest.log"));
    wait_for(Duration::from_secs(60), || committed(&s.topic, &s.group) == vec![total], || format!("{:?}", committed(&s.topic, &s.group)));
    assert!(sigterm(&mut ingest, Duration::from_secs(60)).success(), "{}", s.log("ingest.log"));
    assert_eq!(s.hot_count(), (valid, valid));
    assert_eq!(s.rejects_logged(), (rejects as u64, rejects as u64), "each reject logged once, after the DLQ took it");
    // Whole: each DLQ message holds the bytes of a produced invalid event.
    let all: Vec<_> = first.iter().chain(&second).cloned().collect();
    let expected = inferlog_tests::expected_reasons(&all);
    for m in read_topic(&s.dlq) {
        assert!(expected.contains_key(inferlog_tests::original_sha256(&m)), "from a produced event: {m}");
        assert!(m["headers"].get("inferlog.truncated").is_none(), "whole, not a cut: {m}");
    }
}

#[test]
fn a_two_mib_producer_key_on_an_invalid_event_reaches_the_dlq_cut_to_fit() {
    let s = Scenario::static_assignment("bigkey", 1, "");
    kafkatool(&["alter-config", "--topic", &s.topic, "max.message.bytes=4000000"]);
    let file = s.dir.path().join("bigkey.jsonl");
    std::fs::write(&file, "{\"request_id\": 7}\n{not json\n").expect("write");
    kafkatool(&["produce", "--topic", &s.topic, "--key-bytes", "2097152", file.to_str().expect("path")]);
    // Behind it, a valid event: the partition must not stall.
    let events = generate(10, 0.0, 2703, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &events));
    let (code, _, log) = s.run_ingest(Some("6s"), "ingest.log", &[], Duration::from_secs(120));
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(committed(&s.topic, &s.group), vec![12], "committed past the oversized keys");
    assert_eq!(s.hot_count(), (10, 10));
    let dlq = read_topic(&s.dlq);
    assert_eq!(sources(&dlq), HashSet::from([0, 1]), "{dlq:?}");
    for m in &dlq {
        let h = &m["headers"];
        assert_eq!(h["inferlog.source.key.truncated"].as_str(), Some("true"), "{m}");
        assert_eq!(h["inferlog.source.key.bytes"].as_str(), Some("2097152"), "{m}");
        let key = vec![b'k'; 2_097_152];
        assert_eq!(h["inferlog.source.key.sha256"].as_str(), Some(inferlog_tests::sha256_hex(&key).as_str()), "{m}");
    }
}

#[test]
fn a_dlq_topic_deleted_while_ingest_runs_exits_2_naming_it_and_loses_no_reject() {
    let s = Scenario::static_assignment("dlqgone", 1, "");
    let first = generate(500, 0.05, 2704, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &first));
    let mut ingest = s.spawn_ingest(None, "ingest.log");
    let first_rejects = first.len() - valid_count(&first);
    wait_for(Duration::from_secs(60), || read_topic(&s.dlq).len() == first_rejects, || s.log("ingest.log"));
    wait_for(Duration::from_secs(30), || committed(&s.topic, &s.group) == vec![first.len() as i64], || s.log("ingest.log"));

    kafkatool(&["delete-topics", &s.dlq]);
    let dir = tempfile::tempdir().expect("tempdir");
    let second = generate(500, 0.05, 2705, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(dir.path(), &second));
    let status = inferlog_tests::wait_with_limit(&mut ingest, Duration::from_secs(180));
    let log = s.log("ingest.log");
    assert_eq!(status.code(), Some(2), "a deleted DLQ is permanent: {log}");
    let error = log.lines().find(|l| l.contains("ingest failed")).unwrap_or_else(|| panic!("an error line: {log}"));
    assert!(error.contains(&s.dlq) && error.contains("does not exist"), "names the DLQ topic: {error}");
    assert_eq!(committed(&s.topic, &s.group), vec![first.len() as i64], "nothing of the second lot committed");

    // The topic is back: the next run delivers every pending reject.
    inferlog_tests::create_topics(1, &[&s.dlq]);
    s.drain("after.log");
    let second_rejects: HashSet<i64> = (0..second.len()).filter(|i| second[*i].expected.is_some()).map(|i| (first.len() + i) as i64).collect();
    assert!(!second_rejects.is_empty());
    assert_eq!(sources(&read_topic(&s.dlq)), second_rejects, "every reject of the second lot reached the new DLQ");
    let valid = (valid_count(&first) + valid_count(&second)) as u64;
    assert_eq!(s.hot_count(), (valid, valid));
}
