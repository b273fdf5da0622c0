//! ingest and retention through the broker's authenticated listener
//! (SASL_SSL, SCRAM-SHA-512, the CA `services.sh` generated): a full run
//! with exact totals; a wrong password (with group or static assignment)
//! and an untrusted certificate each stop ingest with exit 2 within 30 s,
//! naming broker, mechanism and cause, with nothing committed; a user the
//! broker lets read but not write the DLQ stops with exit 2 naming the DLQ,
//! the rows before it stored and nothing committed past its rejects;
//! retention's admin client reads the DLQ's retention through the same
//! listener.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use inferlog_tests::tiers::TierScenario;
use inferlog_tests::{committed, read_topic, repo_root, valid_count, wait_with_limit, Scenario};

fn sasl_brokers() -> String {
    std::env::var("INFERLOG_TEST_KAFKA_SASL_BROKERS").unwrap_or_else(|_| "127.0.0.1:9094".into())
}

fn local_file(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env).map_or_else(|| repo_root().join(".inferlog/local").join(default), PathBuf::from)
}

/// The `[kafka.security]` table of the local SASL_SSL listener; `ca_file`
/// empty means the system's CAs, which do not trust the local one.
fn security(ca_file: Option<PathBuf>) -> String {
    let ca = ca_file.map(|p| p.display().to_string()).unwrap_or_default();
    let password = local_file("INFERLOG_TEST_KAFKA_PASSWORD_FILE", "kafka.password");
    assert!(password.exists(), "{} is missing: run deploy/local/services.sh up", password.display());
    format!(
        "security = {{ protocol = \"sasl_ssl\", sasl_mechanism = \"SCRAM-SHA-512\", username = \"inferlog\", password_file = \"{}\", ca_file = \"{ca}\" }}\n",
        password.display()
    )
}

fn local_ca() -> PathBuf {
    local_file("INFERLOG_TEST_KAFKA_CA", "kafka-tls/ca.crt")
}

#[test]
fn a_full_run_over_sasl_ssl_stores_every_event_exactly_once() {
    let s = Scenario::with_kafka("sasl_ok", 4, &security(Some(local_ca())), "");
    let events = s.produce_generated(20_000, 0.02, 1301);
    let valid = valid_count(&events) as u64;
    let brokers = sasl_brokers();
    let mut ingest = s.spawn_ingest_with(Some("6s"), "ingest.log", &[("INFERLOG_KAFKA__BROKERS", brokers.as_str())]);
    let status = wait_with_limit(&mut ingest, Duration::from_secs(180));
    let log = s.log("ingest.log");
    assert!(status.success(), "ingest over SASL_SSL: {log}");
    assert_eq!(s.hot_count(), (valid, valid), "{log}");
    assert_eq!(read_topic(&s.dlq).len(), events.len() - valid as usize, "every reject in the DLQ (produced over SASL_SSL)");
    assert!(committed(&s.topic, &s.group).iter().all(|&o| o >= 0), "offsets committed over SASL_SSL");
    let password = std::fs::read_to_string(local_file("INFERLOG_TEST_KAFKA_PASSWORD_FILE", "kafka.password")).expect("password file");
    assert!(!log.contains(password.trim()), "the password is never logged");
}

/// Runs ingest against the SASL_SSL listener with `env`, expecting exit 2
/// within 30 s; returns its log.
fn refused(name: &str, ca_file: Option<PathBuf>, env: &[(&str, &str)]) -> String {
    refused_with(name, &security(ca_file), env)
}

fn refused_with(name: &str, kafka: &str, env: &[(&str, &str)]) -> String {
    let s = Scenario::with_kafka(name, 2, kafka, "");
    s.produce_generated(500, 0.0, 1302);
    let brokers = sasl_brokers();
    let mut env = env.to_vec();
    env.push(("INFERLOG_KAFKA__BROKERS", brokers.as_str()));
    let started = Instant::now();
    let mut ingest = s.spawn_ingest_with(None, "ingest.log", &env);
    let status = wait_with_limit(&mut ingest, Duration::from_secs(60));
    let took = started.elapsed();
    let log = s.log("ingest.log");
    assert_eq!(status.code(), Some(2), "a permanent error exits 2: {log}");
    assert!(took < Duration::from_secs(30), "exit within 30 s, took {took:?}: {log}");
    let error = log.lines().find(|l| l.contains("ingest failed")).unwrap_or_else(|| panic!("an error line: {log}"));
    assert!(error.contains(&brokers) && error.contains("SASL_SSL SCRAM-SHA-512"), "names broker and mechanism: {error}");
    assert_eq!(s.hot_count(), (0, 0));
    assert!(committed(&s.topic, &s.group).iter().all(|&o| o < 0), "nothing committed");
    error.to_owned()
}

#[test]
fn a_wrong_password_exits_2_naming_broker_mechanism_and_cause() {
    let error = refused("sasl_badpw", Some(local_ca()), &[("INFERLOG_KAFKA_PASSWORD", "not-the-password")]);
    assert!(error.to_lowercase().contains("authentication"), "names the cause: {error}");
    assert!(!error.contains("not-the-password"), "the password is never logged: {error}");
}

/// Static assignment asks the broker for metadata and committed offsets
/// before anything polls the consumer: a refused password found there is
/// permanent too (exit 2), not a broker to wait for (75).
#[test]
fn a_wrong_password_with_static_assignment_exits_2() {
    let kafka = format!("{}assignment = \"static\"\n", security(Some(local_ca())));
    let error = refused_with("sasl_static", &kafka, &[("INFERLOG_KAFKA_PASSWORD", "not-the-password")]);
    assert!(error.to_lowercase().contains("authentication"), "names the cause: {error}");
}

/// `inferlog-nodlq` may read everything but not write topics named
/// `nodlq-*` (ACLs set by `services.sh`): its first reject stops ingest
/// with exit 2 naming the DLQ, after the rows before it were stored, and
/// nothing is committed past the reject.
#[test]
fn a_dlq_the_broker_will_not_let_inferlog_write_exits_2_naming_it() {
    let s =
        Scenario::with_kafka("sasl_nodlq", 1, &security(Some(local_ca())).replace("username = \"inferlog\"", "username = \"inferlog-nodlq\""), "");
    let dlq = format!("nodlq-{}", s.dlq);
    inferlog_tests::create_topics(1, &[&dlq]);
    let events = s.produce_generated(2_000, 0.05, 1303);
    let brokers = sasl_brokers();
    let env = [("INFERLOG_KAFKA__BROKERS", brokers.as_str()), ("INFERLOG_KAFKA__DLQ_TOPIC", dlq.as_str())];
    let started = Instant::now();
    let mut ingest = s.spawn_ingest_with(None, "ingest.log", &env);
    let status = wait_with_limit(&mut ingest, Duration::from_secs(120));
    let log = s.log("ingest.log");
    assert_eq!(status.code(), Some(2), "refused writes to the DLQ are permanent: {log}");
    assert!(started.elapsed() < Duration::from_secs(60), "within seconds of the first reject: {log}");
    let error = log.lines().find(|l| l.contains("ingest failed")).unwrap_or_else(|| panic!("an error line: {log}"));
    assert!(error.contains(&dlq) && error.contains("refuses writes"), "names the DLQ and the refusal: {error}");
    let first_reject = events.iter().position(|e| e.expected.is_some()).expect("a reject") as i64;
    assert!(committed(&s.topic, &s.group).iter().all(|&o| o <= first_reject), "nothing committed past the first reject");
    assert!(read_topic(&dlq).is_empty(), "the broker took nothing");
}

/// `inferlog-nodescribe` may write topics named `nodesc-*` but not read
/// their configs (DescribeConfigs denied, ACLs set by `services.sh`). Its
/// DLQ takes 2,000 bytes a message; 100 rejects of about 3.5 KB are among
/// 3,000 events. Without the topic's limit, the broker's refusal
/// (MESSAGE_TOO_LARGE) is the answer: each reject is cut deeper until it
/// fits, every one reaches the DLQ once, and the commit reaches the end.
/// (Before the fix, the cut assumed the producer's 1,000,000 bytes, sent
/// each reject whole again and again, and the commit stalled for good.)
#[test]
fn a_dlq_smaller_than_a_reject_whose_limit_inferlog_cannot_read_takes_every_reject_cut() {
    let kafka = security(Some(local_ca())).replace("username = \"inferlog\"", "username = \"inferlog-nodescribe\"");
    let s = Scenario::with_kafka("sasl_nodesc", 1, &kafka, "");
    let dlq = format!("nodesc-{}", s.dlq);
    inferlog_tests::kafkatool(&["create-topics", "--partitions", "1", "--config", "max.message.bytes=2000", &dlq]);
    let valid = inferlog_tests::generate(2_900, 0.0, 1304, 1);
    let mut lines = Vec::with_capacity(3_000);
    let mut big = std::collections::BTreeSet::new();
    let mut valid_events = valid.iter();
    for i in 0..3_000i64 {
        if i % 30 == 29 {
            // A valid event but for a tenant far past its 128 characters: about 3.5 KB.
            let mut event: serde_json::Value = serde_json::from_slice(&valid[i as usize % 100].line).expect("json");
            event["request_id"] = format!("big-{i}").into();
            // An alias of the id would now disagree with it (units.conflict).
            event.as_object_mut().expect("an object").remove("gen_ai.response.id");
            event["tenant"] = "t".repeat(3_400).into();
            lines.push(event.to_string());
            big.insert(i);
        } else {
            lines.push(String::from_utf8(valid_events.next().expect("enough events").line.clone()).expect("utf-8"));
        }
    }
    let file = s.dir.path().join("events.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").expect("write");
    inferlog_tests::produce(&s.topic, &file);
    let brokers = sasl_brokers();
    let env = [("INFERLOG_KAFKA__BROKERS", brokers.as_str()), ("INFERLOG_KAFKA__DLQ_TOPIC", dlq.as_str())];
    let mut ingest = s.spawn_ingest_with(Some("6s"), "ingest.log", &env);
    let status = wait_with_limit(&mut ingest, Duration::from_secs(180));
    let log = s.log("ingest.log");
    assert!(status.success(), "every reject fits once cut: {log}");
    assert_eq!(s.hot_count(), (2_900, 2_900), "{log}");
    assert_eq!(committed(&s.topic, &s.group), vec![3_000], "committed to the end");
    let messages = read_topic(&dlq);
    let sources: Vec<i64> =
        messages.iter().map(|m| m["headers"]["inferlog.source.offset"].as_str().expect("offset").parse().expect("number")).collect();
    assert_eq!(sources.len(), 100, "each reject once: {sources:?}");
    assert_eq!(sources.iter().copied().collect::<std::collections::BTreeSet<i64>>(), big, "the big rejects, by their offsets");
    for m in &messages {
        assert_eq!(m["headers"]["inferlog.truncated"].as_str(), Some("true"), "cut to fit: {m}");
        assert_eq!(m["headers"]["inferlog.field"].as_str(), Some("tenant"), "refused for its tenant: {m}");
    }
}

#[test]
fn an_untrusted_broker_certificate_exits_2_naming_the_cause() {
    let error = refused("sasl_badca", None, &[]);
    assert!(error.contains("certificate verify failed") || error.to_lowercase().contains("ssl"), "names the cause: {error}");
}

#[test]
fn retention_reads_the_dlq_retention_over_sasl_ssl() {
    let id = inferlog_tests::unique("sasl_ret");
    let dlq = format!("{id}-dlq");
    inferlog_tests::kafkatool(&["create-topics", "--partitions", "1", "--config", "retention.ms=86400000", "--config", "segment.ms=3600000", &dlq]);
    let s = TierScenario::new(
        "sasl_ret",
        &format!("[kafka]\nbrokers = \"{}\"\ndlq_topic = \"{dlq}\"\n{}\n[retention]\nhot_days = 7\n", sasl_brokers(), security(Some(local_ca()))),
    );
    let (code, report) = s.run("inferlog-retention", &["audit", "--format", "json"], "audit.log");
    assert_eq!(code, 0, "{report}\n{}", s.log("audit.log"));
    let report: serde_json::Value = serde_json::from_str(&report).expect("JSON report");
    assert_eq!(report["dlq"]["retention_ms"], 86_400_000, "{report}");
}
