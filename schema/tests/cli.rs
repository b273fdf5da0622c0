//! The `inferlog-schema` command as producers and operators use it: output
//! formats, exit codes (0 / 1 / 2) and the hash-key rules.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_inferlog-schema");
const END: &str = "2026-11-01T00:00:00Z";

fn run(args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("INFERLOG_HASH_KEY").env_remove("INFERLOG_HASH_KEY_FILE").env_remove("INFERLOG_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn inferlog-schema");
    let mut pipe = child.stdin.take().expect("stdin");
    let input = stdin.unwrap_or_default().to_vec();
    // Feed stdin from a thread: the child's output may fill its pipe first.
    let writer = std::thread::spawn(move || pipe.write_all(&input));
    let output = child.wait_with_output().expect("wait");
    match writer.join().expect("writer thread") {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {e}"),
        _ => {}
    }
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn generate(count: &str, ratio: &str) -> Vec<u8> {
    let out = run(&["generate", "--count", count, "--seed", "5", "--days", "3", "--end", END, "--invalid-ratio", ratio], None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    out.stdout
}

#[test]
fn check_reports_each_bad_line_and_a_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("events.jsonl");
    let mut lines = generate("3", "0");
    lines.extend_from_slice(b"{\"request_id\": \"x\"\n\n[1]\n");
    std::fs::write(&path, &lines).expect("write");
    let file = path.to_str().expect("utf-8 path");
    let out = run(&["check", file], None, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let expected = format!(
        "{file}:4: json.malformed: -: EOF while parsing an object at line 1 column 18\n{file}:6: json.not_object: -: the event must be a JSON object\nchecked 5 events: 3 valid, 2 invalid\n"
    );
    assert_eq!(stdout, expected);
}

#[test]
fn check_passes_clean_input_from_stdin_and_applies_now() {
    let events = generate("200", "0");
    let out = run(&["check", "-"], Some(&events), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(text(&out.stdout), "checked 200 events: 200 valid, 0 invalid\n");
    // A week later the same events are past the 7-day hot retention.
    let later = run(&["check", "--now", "2026-11-10T00:00:00Z", "-"], Some(&events), &[]);
    assert_eq!(later.status.code(), Some(1));
    assert!(text(&later.stdout).contains("timestamp.out_of_range: timestamp:"));
}

#[test]
fn check_json_gives_one_object_per_finding_and_a_summary() {
    let events = generate("2000", "0.05");
    let out = run(&["check", "--format", "json", "-"], Some(&events), &[]);
    assert_eq!(out.status.code(), Some(1));
    let objects: Vec<serde_json::Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("each line is JSON")).collect();
    let (summary, findings) = objects.split_last().expect("a summary");
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["checked"], 2000);
    assert_eq!(summary["invalid"].as_u64(), Some(findings.len() as u64));
    assert!(findings.len() > 50);
    for f in findings {
        assert_eq!(f["type"], "finding");
        assert!(inferlog_schema::ReasonCode::from_str_code(f["reason"].as_str().expect("reason")).is_some(), "{f}");
        assert!(f["line"].as_u64().is_some() && f["field"].is_string() && f["message"].is_string());
    }
}

#[test]
fn usage_and_io_errors_exit_2() {
    let missing = run(&["check", "/nonexistent/events.jsonl"], None, &[]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).contains("cannot open /nonexistent/events.jsonl"));
    assert_eq!(run(&["check", "--now", "2025-06-14 10:00:00", "-"], Some(b""), &[]).status.code(), Some(2));
    assert_eq!(run(&["frobnicate"], None, &[]).status.code(), Some(2));
    assert_eq!(run(&["generate", "--count", "1", "--invalid-ratio", "2"], None, &[]).status.code(), Some(2));
    let bad_config = run(&["check", "-"], Some(b""), &[("INFERLOG_SCHEMA__MAX_EVENT_BYTES", "1")]);
    assert_eq!(bad_config.status.code(), Some(2));
    assert!(text(&bad_config.stderr).contains("max_event_bytes"));
}

#[test]
fn normalize_refuses_to_run_without_a_key() {
    let events = generate("5", "0");
    let out = run(&["normalize", "-"], Some(&events), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing is printed without a key");
    assert!(text(&out.stderr).contains("INFERLOG_HASH_KEY_FILE"));
}

#[test]
fn normalize_hashes_user_ids_with_a_key_from_a_file_and_never_prints_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("hash.key");
    std::fs::write(&key_file, "cli-test-secret-key-material\n").expect("write key");
    let events = generate("300", "0.1");
    let out = run(&["normalize", "-"], Some(&events), &[("INFERLOG_HASH_KEY_FILE", key_file.to_str().expect("path"))]);
    assert_eq!(out.status.code(), Some(1), "some events were invalid");
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(!stdout.contains("\"u-0") && !stdout.contains("cli-test-secret") && !stderr.contains("cli-test-secret"));
    let stored: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert!(stored.len() > 200);
    assert!(stored.iter().filter_map(|e| e["user_id"].as_str()).all(|u| u.len() == 8 + 1 + 64));
    assert!(stderr.contains("checked 300 events"));
    // The normalized output is valid input that normalizes to itself.
    let again = run(&["normalize", "-"], Some(stdout.as_bytes()), &[("INFERLOG_HASH_KEY", "cli-test-secret-key-material")]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), stdout);
}

#[test]
fn json_schema_is_compatible_with_the_published_v1() {
    let out = run(&["json-schema"], None, &[]);
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(schema["x-schema-version"], 1);
    assert!(schema["properties"]["decode_time_us"].is_object());
    let published = concat!(env!("CARGO_MANIFEST_DIR"), "/contract/v1.json");
    let compat = run(&["compat", published], None, &[]);
    assert_eq!(compat.status.code(), Some(0), "{}", text(&compat.stdout));
}

#[test]
fn compat_fails_on_a_breaking_change() {
    let published = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/contract/v1.json")).expect("read");
    let mut old: serde_json::Value = serde_json::from_str(&published).expect("JSON");
    // Producers written against a contract that had a field we no longer know.
    old["properties"]["prompt_template"] = serde_json::json!({"type": "string"});
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.json");
    std::fs::write(&path, old.to_string()).expect("write");
    let out = run(&["compat", path.to_str().expect("path")], None, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("breaking: prompt_template: field removed"), "{}", text(&out.stdout));
    let not_schema = dir.path().join("x.json");
    std::fs::write(&not_schema, "[]").expect("write");
    assert_eq!(run(&["compat", not_schema.to_str().expect("path")], None, &[]).status.code(), Some(2));
}

#[test]
fn generate_is_deterministic_for_a_seed_and_end() {
    assert_eq!(generate("100", "0.1"), generate("100", "0.1"));
    let lines = generate("100", "0");
    assert_eq!(lines.iter().filter(|b| **b == b'\n').count(), 100);
}
