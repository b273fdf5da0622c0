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
//! - `dlq inspect` counts what the DLQ holds as an independent reader does;
//! - `dlq replay` stores what a config fix makes valid, once, whatever
//!   kills, races and releases meet it.
//!
//! (A DLQ whose writes the broker refuses to inferlog's user is in
//! `kafka_security.rs`, on the SASL listener.)

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use inferlog_schema::generate::{GeneratedEvent, Generator, GeneratorConfig};
use inferlog_schema::timestamp::MS_PER_DAY;
use inferlog_schema::ReasonCode;
use inferlog_tests::{clickhouse, committed, generate, kafkatool, read_topic, replay_line, sigterm, valid_count, wait_for, write_jsonl, Scenario};
use rand::Rng as _;

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
    // `original` keeps the key as received (`redacted` keeps its keyed hash, which always fits).
    let s = Scenario::with_kafka("bigkey", 1, "assignment = \"static\"\ndlq_payload = \"original\"\n", "");
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

/// The code a producer team shipped before the dictionary knew it.
const NEW_CODE: &str = "2001";

/// Rewrites every `every`-th valid event to carry [`NEW_CODE`] (which the
/// contract then refuses, `error_code.unknown`); their request ids.
fn plant_new_code(events: &mut [GeneratedEvent], every: usize) -> HashSet<String> {
    let mut planted = HashSet::new();
    for e in events.iter_mut().filter(|e| e.expected.is_none()).step_by(every) {
        let mut doc: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&e.line).expect("a generated event is a JSON object");
        let Some(id) = doc.get("request_id").and_then(|v| v.as_str()).map(str::to_owned) else { continue };
        if !doc.contains_key("error_code") {
            continue;
        }
        doc.insert("error_code".into(), serde_json::json!(2001));
        doc.insert("error_stage".into(), serde_json::json!("decode"));
        e.line = serde_json::to_vec(&doc).expect("json");
        e.expected = Some(ReasonCode::ErrorCodeUnknown);
        planted.insert(id);
    }
    planted
}

/// A run whose DLQ holds planted [`NEW_CODE`] events, and the config that
/// knows the code (plus `extra` tables).
struct Planted {
    s: Scenario,
    events: Vec<GeneratedEvent>,
    planted: HashSet<String>,
    fixed: std::path::PathBuf,
    schema: String,
}

/// `schema` is added to the config of every run (`[schema]` keys), `extra`
/// to the fixed one's. The hot table is a plain `MergeTree` (a duplicate
/// stays visible) unless `extra` configures the compactor, which needs
/// ingest's own.
fn planted_run(name: &str, events: Vec<GeneratedEvent>, every: usize, schema: &str, extra: &str) -> Planted {
    let s = Scenario::new(name, 2, "");
    if !extra.contains("[compactor]") {
        s.create_plain_hot_table();
    }
    let base = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &s.config,
        format!(
            "{base}
[schema]
{schema}
"
        ),
    )
    .expect("write config");
    let mut events = events;
    let planted = plant_new_code(&mut events, every);
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &events));
    let (code, _, log) = s.run_ingest(Some("5s"), "ingest.log", &[], Duration::from_secs(120));
    assert_eq!(code, Some(0), "{log}");
    let schema = s.table.to_ascii_lowercase();
    let fixed = s.dir.path().join("fixed.toml");
    let base = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &fixed,
        format!(
            "{base}\n[postgres]\nurl = \"{}\"\nschema = \"{schema}\"\n\n[schema.error_codes]\n\"{NEW_CODE}\" = \"kv_cache_evicted\"\n\n{extra}\n",
            inferlog_tests::tiers::postgres_url()
        ),
    )
    .expect("write config");
    Planted { s, events, planted, fixed, schema }
}

impl Planted {
    fn command(&self, args: &[&str], env: &[(&str, &str)], log: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(inferlog_tests::bin("inferlog-ingest"));
        cmd.arg("--config").arg(&self.fixed).args(["dlq", "replay", "--format", "json"]).args(args);
        cmd.env("INFERLOG_HASH_KEY_FILE", self.s.dir.path().join("hash.key")).env_remove("INFERLOG_HASH_KEY").env_remove("INFERLOG_CONFIG");
        // The archive, where a released day's request ids are looked up.
        cmd.env("AWS_SECRET_ACCESS_KEY", inferlog_tests::tiers::s3_secret()).env_remove("AWS_ACCESS_KEY_ID");
        cmd.envs(env.iter().copied());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.s.dir.path().join(log)).expect("log file");
        cmd.stderr(log);
        cmd
    }

    /// Runs a replay to its end: its exit code and its JSON summary.
    fn replay(&self, args: &[&str], log: &str) -> (Option<i32>, serde_json::Value) {
        let out = self.command(args, &[], log).output().expect("run dlq replay");
        let summary = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.s.log(log)));
        (out.status.code(), summary)
    }

    fn psql(&self, sql: &str) -> String {
        let out = std::process::Command::new("psql")
            .args([&inferlog_tests::tiers::postgres_url(), "-X", "-q", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!("SET search_path TO \"{}\"; {sql}", self.schema))
            .output()
            .expect("psql");
        assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }

    fn valid_now(&self) -> u64 {
        valid_count(&self.events) as u64 + self.planted.len() as u64
    }
}

/// `[cold]` (a prefix of its own) and `[compactor]` tables, for a planted
/// run whose days go on to the compactor and retention.
fn tiers_extra(name: &str) -> String {
    let id = inferlog_tests::unique(name).to_ascii_lowercase();
    format!(
        "[cold]\nurl = \"s3://inferlog-cold/{id}/\"\nendpoint = \"{}\"\nallow_http = true\naccess_key_id = \"inferlog\"\n\n[compactor]\nmetrics_addr = \"\"\nlateness = \"1s\"\n",
        inferlog_tests::tiers::s3_endpoint()
    )
}

/// Runs `binary` of the tiers on `config` with the S3 secret: its exit
/// code, stdout and stderr (also written to `log` in the run's directory).
fn run_tier(p: &Planted, config: &std::path::Path, binary: &str, args: &[&str], log: &str) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(inferlog_tests::bin(binary))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("AWS_SECRET_ACCESS_KEY", inferlog_tests::tiers::s3_secret())
        .env_remove("AWS_ACCESS_KEY_ID")
        .output()
        .expect("run");
    std::fs::write(p.s.dir.path().join(log), &out.stderr).expect("log");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Test 1 and 3 of issue 33: 5% of the valid events carry a code the
/// dictionary lacks; the code is added; a dry run counts exactly what the
/// real run then stores; the replay stores each of them once, under its
/// original coordinates, and leaves the rest of the DLQ as it was (the
/// generator's own unknown code, 4242, stays invalid); a second replay
/// stores nothing. Produced = hot + still invalid in the DLQ, exactly.
#[test]
fn a_replay_after_the_fix_stores_each_refused_event_once_and_the_rest_stays() {
    let p = planted_run("replay", generate(4_000, 0.03, 3301, 2), 20, "", "");
    let (s, planted) = (&p.s, &p.planted);
    let live = valid_count(&p.events) as u64;
    assert_eq!(s.hot_count(), (live, live), "before: the planted events are refused");
    let dlq_before = read_topic(&s.dlq);
    let generators_unknown = p.events.iter().filter(|e| e.expected == Some(ReasonCode::ErrorCodeUnknown)).count() as u64 - planted.len() as u64;
    assert!(planted.len() > 150 && generators_unknown > 0, "planted {}, the generator's {generators_unknown}", planted.len());

    let prom = s.dir.path().join("replay.prom");
    let prom_arg = prom.to_str().expect("utf-8 path");
    let (code, dry) = p.replay(&["--reason", "error_code.unknown", "--dry-run", "--metrics-file", prom_arg], "dry.log");
    assert!(!prom.exists(), "a dry run writes no metrics");
    assert_eq!(code, Some(1), "the generator's code 4242 is still unknown: {dry}");
    assert_eq!(replay_line(&dry, "error_code.unknown"), (planted.len() as u64 + generators_unknown, planted.len() as u64, 0, generators_unknown, 0));
    assert_eq!(s.hot_count(), (live, live), "a dry run changes nothing");

    let (code, real) = p.replay(&["--reason", "error_code.unknown", "--metrics-file", prom_arg], "real.log");
    assert_eq!(code, Some(1), "{real}");
    // The run's figures for Prometheus: valid exposition format (promtool,
    // Prometheus' own checker), and the counts the planting says.
    let text = std::fs::read_to_string(&prom).expect("the metrics file");
    let mut check = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), text.as_bytes()).expect("to promtool");
    let checked = check.wait_with_output().expect("promtool");
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let series = |outcome: &str| {
        let name = format!("inferlog_dlq_replay_events{{dlq_topic=\"{}\",outcome=\"{outcome}\",reason=\"error_code.unknown\"}}", s.dlq);
        text.lines().find_map(|l| l.strip_prefix(name.as_str()).and_then(|v| v.trim().parse::<f64>().ok())).map(|v| v as u64)
    };
    assert_eq!((series("replayed"), series("still_invalid")), (Some(planted.len() as u64), Some(generators_unknown)), "{text}");
    assert_eq!(real["by_reason"], dry["by_reason"], "the dry run counted what the real run stored");
    assert_eq!(s.hot_count(), (p.valid_now(), p.valid_now()), "each planted event stored once (a plain MergeTree)");
    // Under its original coordinates, as the DLQ headers give them.
    let coordinates: HashSet<String> = dlq_before
        .iter()
        .filter(|m| m["headers"]["inferlog.reason"] == "error_code.unknown")
        .map(|m| {
            format!(
                "{}/{}",
                m["headers"]["inferlog.source.partition"].as_str().unwrap_or(""),
                m["headers"]["inferlog.source.offset"].as_str().unwrap_or("")
            )
        })
        .collect();
    let stored = clickhouse(&format!(
        "SELECT request_id, concat(toString(kafka_partition), '/', toString(kafka_offset)), error_code FROM {} WHERE error_code = {NEW_CODE}",
        s.qualified_table()
    ));
    let rows: Vec<Vec<&str>> = stored.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), planted.len());
    assert!(rows.iter().all(|r| planted.contains(r[0]) && coordinates.contains(r[1])), "{stored}");
    assert_eq!(read_topic(&s.dlq).len(), dlq_before.len(), "nothing produced to the DLQ");
    // The DLQ held each user id as its keyed hash (redacted); the replayed
    // row carries exactly what live ingest stores for the plaintext: the
    // contract's own normalizing of the events as produced says which.
    let originals: Vec<GeneratedEvent> = p.events.iter().filter(|e| e.expected == Some(ReasonCode::ErrorCodeUnknown)).cloned().collect();
    let file = s.dir.path().join("planted.jsonl");
    std::fs::write(&file, originals.iter().flat_map(|e| e.line.iter().copied().chain([b'\n'])).collect::<Vec<u8>>()).expect("write");
    let out = std::process::Command::new(inferlog_tests::bin("inferlog-schema"))
        .arg("--config")
        .arg(&p.fixed)
        .arg("normalize")
        .arg(&file)
        .env("INFERLOG_HASH_KEY_FILE", s.dir.path().join("hash.key"))
        .env_remove("INFERLOG_HASH_KEY")
        .output()
        .expect("inferlog-schema normalize");
    let expected: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["error_code"] == 2001)
        .map(|e| (e["request_id"].as_str().unwrap_or("").to_owned(), e["user_id"].as_str().unwrap_or("").to_owned()))
        .collect();
    let hashes: BTreeMap<String, String> =
        // Each hash after a marker: the answer is trimmed, and a last row without one would lose its tab.
        clickhouse(&format!("SELECT request_id, concat('h:', ifNull(user_id_hash, '')) FROM {} WHERE error_code = {NEW_CODE}", s.qualified_table()))
            .lines()
            .filter_map(|l| l.split_once("\th:").map(|(a, b)| (a.to_owned(), b.to_owned())))
            .collect();
    assert_eq!(expected.len(), planted.len(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(expected.values().filter(|h| !h.is_empty()).count() > planted.len() / 2, "most events carry a user id");
    assert_eq!(hashes, expected, "user ids as live ingest stores them");

    // Twice: nothing more. Everything: the rest is still invalid, and it adds up.
    let (_, again) = p.replay(&["--reason", "error_code.unknown"], "again.log");
    assert_eq!(
        replay_line(&again, "error_code.unknown"),
        (planted.len() as u64 + generators_unknown, 0, planted.len() as u64, generators_unknown, 0)
    );
    let (_, all) = p.replay(&["--dry-run"], "all.log");
    let unresolved = all["still_invalid"].as_u64().expect("n") + all["refused"].as_u64().expect("n");
    assert_eq!(all["replayed"], 0, "{all}");
    assert_eq!(s.hot_count().0 + unresolved, p.events.len() as u64, "produced = hot + still invalid in the DLQ: {all}");
    assert_eq!(all["selected"].as_u64(), Some(dlq_before.len() as u64));
    // The PII the contract refused was masked in the DLQ: refused, never stored.
    assert!(replay_line(&all, "pii.detected").4 > 0, "{all}");
    assert_eq!(
        p.psql("SELECT dry_run, rows FROM retention_audit WHERE tier = 'dlq' AND action = 'replay' ORDER BY id"),
        format!("t\t{n}\nf\t{n}\nf\t0\nt\t0", n = planted.len()),
        "one audit row per run"
    );
    assert_eq!(p.psql("SELECT state, count(*) FROM dlq_replayed GROUP BY state"), format!("stored\t{}", planted.len()));
}

/// Test 2 of issue 33: a replay killed right after a chunk's rows landed
/// (before its ledger entry), one killed at a random moment, then two
/// replays at once: every planted event stored exactly once.
#[test]
fn killed_and_racing_replays_store_each_event_once() {
    let p = planted_run("replaykill", generate(6_000, 0.0, 3302, 2), 8, "", "");
    let (s, planted) = (&p.s, &p.planted);
    let live = valid_count(&p.events) as u64;
    let args = ["--reason", "error_code.unknown", "--batch", "40"];

    // Killed between the INSERT and the ledger.
    let mut child = p
        .command(&args, &[("INFERLOG_INGEST_TEST_PAUSE_AFTER", "replay-inserted")], "paused.log")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    if let Some(status) = inferlog_tests::wait_paused(&mut child, || s.log("paused.log"), Duration::from_secs(120)) {
        panic!("replay exited ({status}) before pausing: {}", s.log("paused.log"));
    }
    child.kill().expect("kill -9");
    let _ = child.wait();
    assert_eq!(s.hot_count().0, live + 40, "the first chunk landed");
    assert_eq!(p.psql("SELECT state, count(*) FROM dlq_replayed GROUP BY state"), "pending\t40");

    // Killed at a random moment while chunks land.
    let (mut rng, seed) = inferlog_tests::test_rng("replay kill");
    let mut child =
        p.command(&args, &[("INFERLOG_INGEST_TEST_SLOW_WRITE_MS", "60")], "random.log").stdout(std::process::Stdio::null()).spawn().expect("spawn");
    let target = live + 40 + rng.gen_range(40..planted.len() as u64 / 2);
    wait_for(Duration::from_secs(120), || s.hot_count().0 >= target, || format!("{target} rows (seed {seed}): {}", s.log("random.log")));
    std::thread::sleep(Duration::from_millis(rng.gen_range(0..100)));
    child.kill().expect("kill -9");
    let _ = child.wait();
    let after_kill = s.hot_count().0;
    assert!(after_kill < p.valid_now(), "killed mid-replay (seed {seed}): {after_kill}");

    // Two at once, to the end.
    let racing: Vec<std::process::Child> =
        (0..2).map(|i| p.command(&args, &[], &format!("race-{i}.log")).stdout(std::process::Stdio::null()).spawn().expect("spawn")).collect();
    for (i, mut child) in racing.into_iter().enumerate() {
        let status = inferlog_tests::wait_with_limit(&mut child, Duration::from_secs(180));
        assert_eq!(status.code(), Some(0), "race {i}: {}", s.log(&format!("race-{i}.log")));
    }
    assert_eq!(s.hot_count(), (p.valid_now(), p.valid_now()), "each event once after two kills and a race (seed {seed})");
    assert_eq!(p.psql("SELECT state, count(*) FROM dlq_replayed GROUP BY state"), format!("stored\t{}", planted.len()));
    let resolved = s.log("random.log");
    assert!(resolved.contains("resolved an interrupted replay") && resolved.contains("landed=40 never_landed=0"), "{resolved}");
}

/// A planted run of 1,500 events of one day ten days ago, past the 7-day
/// hot policy (ingest and replay take such an age here, `max_event_age`
/// 30 days, only to fit days of real time into a test), with the config
/// the compactor and retention run on: the fixed one without that age,
/// which they refuse beyond the hot policy.
fn released_day_run(name: &str, seed: u64) -> (Planted, String, std::path::PathBuf) {
    let day = inferlog_tests::tiers::today() - 10;
    let end_ms = (i64::from(day) + 1) * MS_PER_DAY - 60_000;
    let events: Vec<GeneratedEvent> = Generator::new(GeneratorConfig { seed, days: 1, end_ms, invalid_ratio: 0.0 }).take(1_500).collect();
    let extra = tiers_extra(name);
    let p = planted_run(name, events, 25, "max_event_age = \"30d\"", &extra);
    let tiers = p.s.dir.path().join("tiers.toml");
    let fixed = std::fs::read_to_string(&p.fixed).expect("config");
    std::fs::write(&tiers, fixed.replace("max_event_age = \"30d\"", "")).expect("write config");
    (p, extra, tiers)
}

/// Test 4 of issue 33: a refused event of a day the compactor already
/// archived and released is replayed through the late-row path: archived
/// as a supplement, verified, the hot partition dropped again, and the
/// retention audit clean.
#[test]
fn a_replayed_event_of_a_released_day_ends_in_the_archive() {
    // An event refused within the day meets its replay after the day's release.
    let (p, _, tiers) = released_day_run("replayold", 3303);
    let s = &p.s;
    let live = valid_count(&p.events) as u64;
    let run = |binary: &str, args: &[&str], log: &str| run_tier(&p, &tiers, binary, args, log);
    let (code, _, log) = run("inferlog-compactor", &["--once"], "compactor-1.log");
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(p.psql("SELECT state, hot_rows FROM compactor_days"), format!("released\t{live}"), "{log}");
    assert_eq!(s.hot_count().0, 0, "released");

    let (code, summary) = p.replay(&[], "replay.log");
    assert_eq!(code, Some(0), "{summary}");
    assert_eq!((summary["replayed"].as_u64(), summary["late_rows"].as_u64()), (Some(p.planted.len() as u64), Some(p.planted.len() as u64)));
    assert_eq!(s.hot_count().0, p.planted.len() as u64, "late rows wait in the hot tier for the compactor");

    let (code, _, log) = run("inferlog-compactor", &["--once"], "compactor-2.log");
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.hot_count().0, 0, "archived as a supplement, then dropped");
    let archived = p.psql("SELECT sum(rows) FROM cold_manifest");
    assert_eq!(archived, p.valid_now().to_string(), "the archive holds every event once");
    assert_eq!(p.psql("SELECT count(*) FROM cold_manifest WHERE object_key LIKE '%late-%'"), "1");
    // A retention pass (it also sets the test DLQ topic's retention to the policy's), then its audit.
    let (code, out, log) = run("inferlog-retention", &["enforce"], "enforce.log");
    assert_eq!(code, Some(0), "{out}{log}");
    let (code, out, log) = run("inferlog-retention", &["audit", "--format", "json"], "audit.log");
    assert_eq!(code, Some(0), "the audit is clean: {out}{log}");
    // And a second replay, with the day released again, stores nothing.
    let (_, again) = p.replay(&[], "again.log");
    assert_eq!((again["replayed"].as_u64(), again["already_stored"].as_u64()), (Some(0), Some(p.planted.len() as u64)));
}

/// Defect 4 of issue 56: `dlq replay` looks the request ids of a released
/// day up in the archive, not in the hot table only. Ten planted events
/// were sent again corrected (the same request id, a known code) and
/// stored live; their day is archived and released; the replay takes the
/// ten as conflicts (`request_id.conflict`), stores the other planted
/// events once, and the archive then holds every request id once. Without
/// the lookup the ten are stored a second time, as late rows the compactor
/// archives as a supplement.
#[test]
fn a_replay_into_a_released_day_looks_its_request_ids_up_in_the_archive() {
    let (p, extra, tiers) = released_day_run("replaycold", 3306);
    let s = &p.s;
    let corrected: Vec<GeneratedEvent> = p
        .events
        .iter()
        .filter(|e| e.expected == Some(ReasonCode::ErrorCodeUnknown))
        .take(10)
        .map(|e| {
            let mut doc: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&e.line).expect("json");
            doc.insert("error_code".into(), serde_json::json!(0));
            doc.remove("error_stage");
            GeneratedEvent { line: serde_json::to_vec(&doc).expect("json"), expected: None }
        })
        .collect();
    assert_eq!(corrected.len(), 10);
    let dir = s.dir.path().join("corrected");
    std::fs::create_dir_all(&dir).expect("dir");
    inferlog_tests::produce(&s.topic, &write_jsonl(&dir, &corrected));
    let (code, _, log) = s.run_ingest(Some("5s"), "ingest-corrected.log", &[], Duration::from_secs(120));
    assert_eq!(code, Some(0), "{log}");
    let live = valid_count(&p.events) as u64 + 10;
    assert_eq!(s.hot_count().0, live, "the corrected copies stored live");
    let run = |binary: &str, args: &[&str], log: &str| run_tier(&p, &tiers, binary, args, log);
    let (code, _, log) = run("inferlog-compactor", &["--once"], "compactor-1.log");
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(p.psql("SELECT state, hot_rows FROM compactor_days"), format!("released\t{live}"), "{log}");

    let (code, summary) = p.replay(&[], "replay.log");
    assert_eq!(code, Some(1), "still invalid events: exit 1 {summary}");
    let planted = p.planted.len() as u64;
    assert_eq!((summary["replayed"].as_u64(), summary["still_invalid"].as_u64()), (Some(planted - 10), Some(10)), "{summary}");
    let (code, _, log) = run("inferlog-compactor", &["--once"], "compactor-2.log");
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.hot_count().0, 0, "the late rows archived as a supplement, then dropped");
    // Every request id once in the archive, read with pyarrow.
    let prefix = extra.split("s3://inferlog-cold/").nth(1).and_then(|r| r.split('/').next()).expect("prefix");
    let objects = inferlog_tests::tiers::read_archive_at(&format!("{prefix}/"), 0);
    let mut ids: BTreeMap<String, u32> = BTreeMap::new();
    for id in objects.as_array().into_iter().flatten().flat_map(|o| o["request_ids"].as_array().cloned().unwrap_or_default()) {
        *ids.entry(id.as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    let twice: Vec<&String> = ids.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id).collect();
    assert!(twice.is_empty(), "request ids archived twice: {twice:?}");
    assert_eq!(ids.len() as u64, valid_count(&p.events) as u64 + planted, "every event archived");
}

/// The replay ledger leaves with the DLQ messages it stands for: retention
/// keeps every stored entry while the DLQ topic still holds a message
/// older than it (the entries were written two hours ago, the DLQ's
/// oldest message is three hours old), deletes them once the topic holds none
/// (an audit row first, the audit clean after), never touches a pending
/// entry, and the audit reports an entry older than a recorded deletion.
#[test]
fn retention_prunes_the_replay_ledger_once_the_dlq_no_longer_holds_its_messages() {
    let extra = tiers_extra("ledger");
    let p = planted_run("ledger", generate(1_500, 0.0, 3304, 1), 25, "", &extra);
    let s = &p.s;
    let (code, summary) = p.replay(&[], "replay.log");
    assert_eq!((code, summary["replayed"].as_u64()), (Some(0), Some(p.planted.len() as u64)), "{summary}");
    let stored = p.planted.len();
    assert!(stored > 10, "the run plants enough events: {stored}");

    // Two hours pass: the entries were written then. A killed replay's pending entry of then, too.
    p.psql("UPDATE dlq_replayed SET at = now() - interval '2 hours'");
    p.psql("INSERT INTO dlq_replayed VALUES ('killed', 0, 7, 0, 0, 'pending', 'killed-run', now() - interval '2 hours')");
    // The DLQ still holds a message refused three hours ago (first in its
    // partition, as the oldest is): the entries of two hours ago may be its.
    kafkatool(&["delete-records", "--topic", &s.dlq]);
    let old = s.dir.path().join("old.jsonl");
    std::fs::write(&old, "{\"request_id\":\"an-old-reject\"}\n").expect("write");
    let three_hours_ago = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64 - 3 * 3_600_000;
    kafkatool(&["produce", "--topic", &s.dlq, "--timestamp-ms", &three_hours_ago.to_string(), old.to_str().expect("utf-8")]);
    let run = |args: &[&str], log: &str| {
        let (code, out, err) = run_tier(&p, &p.fixed, "inferlog-retention", args, log);
        (code, format!("{out}{err}"))
    };
    let ledger = || p.psql("SELECT state, count(*) FROM dlq_replayed GROUP BY state ORDER BY state");
    let (code, out) = run(&["enforce"], "enforce-1.log");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(ledger(), format!("pending\t1\nstored\t{stored}"), "the DLQ still holds an older message: every entry stays\n{out}");

    // That message expires too (DeleteRecords, as retention.ms would).
    kafkatool(&["delete-records", "--topic", &s.dlq]);
    let (code, out) = run(&["enforce"], "enforce-2.log");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(ledger(), "pending\t1", "the stored entries are gone, the pending one stays\n{out}");
    assert_eq!(
        p.psql("SELECT action, rows, NOT dry_run FROM retention_audit WHERE tier = 'dlq_ledger'"),
        format!("delete_entries\t{stored}\tt"),
        "one audit row for the deletion"
    );
    let (code, out) = run(&["audit", "--format", "json"], "audit-1.log");
    assert_eq!(code, Some(0), "the audit is clean: {out}");

    // An entry older than the recorded deletion is a violation the audit names.
    p.psql("INSERT INTO dlq_replayed VALUES ('left', 0, 9, 0, 0, 'stored', 'left-run', now() - interval '3 hours')");
    let (code, out) = run(&["audit", "--format", "json"], "audit-2.log");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("\"dlq_ledger\"") && out.contains("deleted.still_present"), "{out}");
}

/// Issue 57: every kind of reject a broken producer sends (JSON cut after
/// its `user_id`, a logger's plain-text line, a key given twice, a
/// malformed OTLP protobuf, a key that is the user id, a producer header
/// holding it, a readable reject whose `user_id` is blank-padded) leaves no
/// planted id in any DLQ message's value, key or headers. What the
/// contract could not read keeps no payload (its size and SHA-256 named);
/// the readable reject holds the digest live ingest would store (trimmed);
/// only the header the config lists is carried. Then `audit --user-ids`
/// finds the users' digests in the keys (the `inferlog.source.key` header)
/// and payloads it searched, and says so.
#[test]
fn no_reject_keeps_a_planted_id_in_its_value_key_or_headers() {
    let s = Scenario::new("privacy", 1, "");
    let otlp = format!("{}-otlp", s.topic);
    inferlog_tests::create_topics(1, &[&otlp]);
    let config = std::fs::read_to_string(&s.config).expect("config").replace(
        &format!("topics = [\"{}\"]\n", s.topic),
        &format!("topics = [\"{}\", \"{otlp}\"]\nencodings = {{ \"{otlp}\" = \"otlp_proto\" }}\ndlq_headers = [\"x-trace\"]\n", s.topic),
    );
    std::fs::write(&s.config, config).expect("config");
    let planted: Vec<String> = (1..=7).map(|i| format!("planted-user-{i}")).collect();
    let now = inferlog_tests::now_ms();
    let event = |id: &str, extra: &str| {
        format!(
            "{{\"request_id\":\"{id}\",\"timestamp\":{now},\"model_name\":\"m\",\"model_version\":\"v1\",\"input_tokens\":3,\
             \"output_tokens\":4,\"total_latency_ms\":12.5{extra}}}"
        )
    };
    let json_records = [
        // Cut after its user_id, keyed by it.
        serde_json::json!({"value": format!("{{\"request_id\":\"p-1\",\"user_id\":\"{}\",\"model_na", planted[0]), "key": planted[0]}),
        // A logger's line, the id in a header too (not listed: never carried) and a listed header.
        serde_json::json!({"value": format!("2026-12-06 ERROR request p-2 of {} timed out", planted[1]),
                           "headers": {"x-user": planted[1], "x-trace": "trace-2"}}),
        // The key given twice: the contract refuses it (json.malformed).
        serde_json::json!({"value": event("p-3", &format!(",\"error_code\":0,\"user_id\":\"x\",\"user_id\":\"{}\"", planted[2]))}),
        // Readable, refused for its code, its id blank-padded; keyed by the id.
        serde_json::json!({"value": event("p-4", &format!(",\"error_code\":4242,\"error_stage\":\"decode\",\"user_id\":\"  {}  \"", planted[3])),
                           "key": format!(" {} ", planted[3])}),
        // A user_id the contract refuses (a number), beside the planted one in a nested object.
        serde_json::json!({"value": event("p-5", &format!(",\"error_code\":0,\"user_id\":5,\"tags\":{{\"user_id\":\"{}\"}}", planted[4]))}),
        // Valid: stored, never in the DLQ.
        serde_json::json!({"value": event("p-6", &format!(",\"error_code\":0,\"user_id\":\"{}\"", planted[5])), "key": planted[5]}),
    ];
    let file = s.dir.path().join("records.jsonl");
    std::fs::write(&file, json_records.iter().map(|r| r.to_string() + "\n").collect::<String>()).expect("write");
    kafkatool(&["produce-records", "--topic", &s.topic, file.to_str().expect("path")]);
    // Not OTLP protobuf, the id inside; keyed by it.
    let mut malformed = vec![0xff, 0xff, 0xff, 0x0a];
    malformed.extend_from_slice(planted[6].as_bytes());
    let file = s.dir.path().join("otlp.jsonl");
    let record = serde_json::json!({"value_hex": hex::encode(&malformed), "key": planted[6], "headers": {"x-user": planted[6]}});
    std::fs::write(&file, record.to_string() + "\n").expect("write");
    kafkatool(&["produce-records", "--topic", &otlp, file.to_str().expect("path")]);

    let (code, _, log) = s.run_ingest(Some("5s"), "ingest.log", &[], Duration::from_secs(120));
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(s.hot_count(), (1, 1), "only the valid event stored");
    let dlq = inferlog_tests::read_topic_values(&s.dlq);
    assert_eq!(dlq.len(), 6, "every reject once: {dlq:?}");
    for m in &dlq {
        let text = m.to_string();
        for id in &planted {
            assert!(!text.contains(id.as_str()), "{id} in a DLQ message (value, key or headers): {text}");
        }
        assert!(m["headers"].get("inferlog.header.x-user").is_none(), "an unlisted header is never carried: {m}");
    }
    let by_reason = |reason: &str| dlq.iter().filter(|m| m["headers"]["inferlog.reason"] == reason).collect::<Vec<_>>();
    // What the contract could not read: no payload, the original named.
    for m in by_reason("json.malformed").into_iter().chain(by_reason("otlp.malformed")) {
        assert_eq!((m["headers"]["inferlog.payload"].as_str(), m["bytes"].as_u64()), (Some("none"), Some(0)), "{m}");
        assert!(m["headers"]["inferlog.original.sha256"].as_str().is_some_and(|h| h.len() == 64), "{m}");
    }
    assert_eq!(by_reason("json.malformed").len() + by_reason("otlp.malformed").len(), 4);
    let logged = dlq.iter().find(|m| m["headers"]["inferlog.header.x-trace"].as_str().is_some()).expect("the listed header carried");
    assert_eq!(logged["headers"]["inferlog.header.x-trace"], "trace-2");
    // The readable reject holds what live ingest stores for the trimmed id.
    let hasher = inferlog_schema::UserIdHasher::new(b"integration-test-hash-key-0123456789", None, "test").expect("hasher");
    let readable = by_reason("error_code.unknown");
    assert_eq!(readable.len(), 1);
    let value: serde_json::Value = serde_json::from_str(readable[0]["value"].as_str().expect("value")).expect("JSON");
    assert_eq!(value["user_id"], hasher.hash(&planted[3]), "the contract's trim, then the keyed hash");
    assert_eq!(readable[0]["headers"]["inferlog.source.key"], hasher.hash(&planted[3]), "the producer's key as the user's digest");
    let refused = dlq
        .iter()
        .find(|m| m["headers"]["inferlog.field"] == "user_id" && m["headers"]["inferlog.reason"] == "field.type")
        .expect("the numeric user_id reject");
    let value: serde_json::Value = serde_json::from_str(refused["value"].as_str().expect("value")).expect("JSON");
    assert_eq!(value["user_id"], "inferlog.refused:field.type", "{refused}");

    // The audit finds the users' digests where the DLQ keeps them: keys and payloads.
    let ids = s.dir.path().join("users.txt");
    std::fs::write(&ids, planted.join("\n") + "\n").expect("write");
    let tiers = s.dir.path().join("tiers.toml");
    let schema = s.table.to_ascii_lowercase();
    let base = std::fs::read_to_string(&s.config).expect("config");
    std::fs::write(
        &tiers,
        format!("{base}\n[postgres]\nurl = \"{}\"\nschema = \"{schema}\"\n\n{}", inferlog_tests::tiers::postgres_url(), tiers_extra("privacy")),
    )
    .expect("write");
    let retention = |args: &[&str]| {
        std::process::Command::new(inferlog_tests::bin("inferlog-retention"))
            .arg("--config")
            .arg(&tiers)
            .args(args)
            .env("INFERLOG_HASH_KEY_FILE", s.dir.path().join("hash.key"))
            .env("AWS_SECRET_ACCESS_KEY", inferlog_tests::tiers::s3_secret())
            .output()
            .expect("inferlog-retention")
    };
    let out = retention(&["audit", "--user-ids", ids.to_str().expect("path"), "--format", "json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
    let searched = &report["dlq_searched"];
    assert_eq!((searched["messages"].as_u64(), searched["plaintext_ids"].as_u64()), (Some(6), Some(7)), "{report}");
    let partitions = report["dlq"].as_array().expect("dlq partitions");
    let total = |field: &str| partitions.iter().map(|p| p[field].as_u64().unwrap_or(0)).sum::<u64>();
    // The producer keys (header inferlog.source.key) of the cut JSON, the
    // readable reject and the protobuf; the payloads of the readable reject
    // and of the one whose nested user_id was hashed.
    assert_eq!((total("messages"), total("in_headers"), total("in_payload")), (4, 3, 2), "{report}");
    for id in &planted {
        assert!(!stdout.contains(id.as_str()), "the report never shows a plaintext id");
    }
    // Erase's receipt: the hot row removed; the DLQ searched the same way, and named.
    let out = retention(&["erase", "--user-ids", ids.to_str().expect("path")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let receipt: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(receipt["hot"]["rows_removed"].as_u64(), Some(1), "{receipt}");
    assert_eq!(receipt["dlq"]["searched"], report["dlq_searched"], "{receipt}");
    let in_headers: u64 = receipt["dlq"]["partitions"].as_array().expect("partitions").iter().map(|p| p["in_headers"].as_u64().unwrap_or(0)).sum();
    assert_eq!(in_headers, 3, "{receipt}");
    assert!(!stdout.contains("planted-user-"), "the receipt never shows a plaintext id");
}
