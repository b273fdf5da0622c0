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
//!   after the topic is back;
//! - `dlq inspect` counts what the DLQ holds as an independent reader does.
//!
//! (A DLQ whose writes the broker refuses to inferlog's user is in
//! `kafka_security.rs`, on the SASL listener.)

use std::collections::{BTreeMap, HashSet};
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

/// `dlq inspect` on a DLQ ingest filled from 2,000 events (10% refused, of
/// every reason) on two partitions, plus one message another producer wrote
/// there: its counts by reason × field × source topic equal those of the
/// DLQ's messages read by kafkatool, its counts by reason those the
/// generator planted, and the foreign message is counted apart.
#[test]
fn dlq_inspect_counts_what_the_dlq_holds_by_reason_field_and_topic() {
    let s = Scenario::new("dlqinspect", 2, "");
    let events = generate(2_000, 0.1, 2711, 2);
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &events));
    let (code, _, log) = s.run_ingest(Some("5s"), "ingest.log", &[], Duration::from_secs(120));
    assert_eq!(code, Some(0), "{log}");
    let foreign = s.dir.path().join("foreign.jsonl");
    std::fs::write(&foreign, "{\"not\": \"from inferlog\"}\n").expect("write");
    kafkatool(&["produce", "--topic", &s.dlq, foreign.to_str().expect("path")]);

    let dlq = read_topic(&s.dlq);
    let planted = inferlog_tests::expected_reasons(&events);
    assert_eq!(dlq.len(), planted.len() + 1, "every reject and the foreign message");
    let mut by_key: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for m in dlq.iter().filter(|m| m["headers"].get("inferlog.reason").is_some()) {
        let h = |name: &str| m["headers"][name].as_str().unwrap_or("").to_owned();
        *by_key.entry((h("inferlog.reason"), h("inferlog.field"), h("inferlog.source.topic"))).or_default() += 1;
    }
    let mut by_reason: BTreeMap<String, u64> = BTreeMap::new();
    planted.values().for_each(|r| *by_reason.entry(r.to_string()).or_default() += 1);

    let inspect = |extra: &[&str]| {
        let out = std::process::Command::new(inferlog_tests::bin("inferlog-ingest"))
            .arg("--config")
            .arg(&s.config)
            .args(["dlq", "inspect", "--format", "json"])
            .args(extra)
            .output()
            .expect("run inferlog-ingest dlq inspect");
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")
    };
    let summary = inspect(&[]);
    assert_eq!(
        (summary["read"].as_u64(), summary["messages"].as_u64(), summary["foreign"].as_u64()),
        (Some(dlq.len() as u64), Some(dlq.len() as u64), Some(1))
    );
    let mut got: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let mut got_reasons: BTreeMap<String, u64> = BTreeMap::new();
    for r in summary["by_reason"].as_array().expect("by_reason") {
        let t = |k: &str| r[k].as_str().expect("text").to_owned();
        got.insert((t("reason"), t("field"), t("source_topic")), r["messages"].as_u64().expect("count"));
        *got_reasons.entry(t("reason")).or_default() += r["messages"].as_u64().expect("count");
    }
    assert_eq!(got, by_key, "by reason × field × source topic, as kafkatool reads the DLQ");
    assert_eq!(got_reasons, by_reason, "by reason, as the generator planted them");
    let hours: u64 = summary["by_hour"].as_array().expect("by_hour").iter().map(|h| h["messages"].as_u64().expect("count")).sum();
    assert_eq!(hours, planted.len() as u64, "by hour: every message inferlog wrote");
    let samples = summary["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), by_reason.len(), "one sample per reason");
    assert!(samples.iter().all(|x| x["source"].as_str().is_some_and(|v| v.starts_with(&s.topic))), "{samples:?}");
    // A sample with a user id shows it as stored: hashed, which ingest's redaction did.
    let with_user: Vec<_> = samples.iter().filter(|x| x["payload"].as_str().is_some_and(|p| p.contains("\"user_id\":\""))).collect();
    assert!(!with_user.is_empty(), "the generator's events carry user ids");
    assert!(with_user.iter().all(|x| x["payload_kind"] == "redacted"), "{with_user:?}");
    assert_eq!(summary["exceeds_policy"], false, "{summary}");

    // A window after every rejection: every message read, none counted.
    let later = inspect(&["--from", "2999-01-01"]);
    assert_eq!((later["read"].as_u64(), later["messages"].as_u64()), (Some(dlq.len() as u64), Some(0)));
}
