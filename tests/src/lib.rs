//! Shared helpers of the integration tests. They talk to the real services
//! that `deploy/local/services.sh up` starts (addresses from the
//! environment, loopback by default), run the real binaries as child
//! processes (so `kill -9` is a real crash), and use the independent
//! Python Kafka client (`deploy/local/kafkatool.py`) to produce and read.
//!
//! Every test names its own topics, consumer group and tables, so tests can
//! run in parallel against one stack.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use inferlog_schema::generate::{GeneratedEvent, Generator, GeneratorConfig};
use inferlog_schema::timestamp::MS_PER_DAY;
use inferlog_schema::ReasonCode;
use sha2::{Digest, Sha256};

pub mod boards;
pub mod expected;
pub mod faults;
pub mod otlp;
pub mod pipeline;
pub mod prometheus;
pub mod seed;
pub mod tiers;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

pub fn clickhouse_url() -> String {
    std::env::var("INFERLOG_TEST_CLICKHOUSE_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into())
}

pub fn kafka_brokers() -> String {
    std::env::var("INFERLOG_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Where the binaries under test are (`deploy/local/test.sh` builds them in release).
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("INFERLOG_BIN_DIR").map_or_else(|| repo_root().join("target/release"), PathBuf::from);
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: build it first (deploy/local/test.sh does)", path.display());
    path
}

/// A name no other test (or earlier run) uses: `prefix_<pid>_<ms>_<n>`.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis()) % 100_000_000;
    format!("{prefix}_{}_{ms}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Waits, if need be, until the clock is clear of UTC midnight: from five
/// minutes before it to two minutes after. A test places its events by
/// "today", runs binaries that close "yesterday" by the wall clock and
/// generates events ending a minute ago; one that starts in that window
/// would see the day change under it. Called where a scenario starts.
pub fn clear_of_midnight() {
    const BEFORE_MS: i64 = 5 * 60_000;
    const AFTER_MS: i64 = 2 * 60_000;
    let near = || !(AFTER_MS..MS_PER_DAY - BEFORE_MS).contains(&now_ms().rem_euclid(MS_PER_DAY));
    if near() {
        wait_for(Duration::from_millis((BEFORE_MS + AFTER_MS + 60_000) as u64), || !near(), || "the clock did not move past midnight".into());
    }
}

/// One reason's line of a `dlq replay --format json` summary: (selected,
/// replayed, already stored, still invalid, refused).
pub fn replay_line(summary: &serde_json::Value, reason: &str) -> (u64, u64, u64, u64, u64) {
    let lines = summary["by_reason"].as_array().expect("by_reason");
    let l = lines.iter().find(|l| l["reason"] == reason).unwrap_or_else(|| panic!("no {reason} in {summary}"));
    let n = |k: &str| l[k].as_u64().expect("count");
    (n("selected"), n("replayed"), n("already_stored"), n("still_invalid"), n("refused"))
}

/// Generated events ending now (so they pass ingest's time bounds), over `days` ≤ 7.
pub fn generate(count: usize, invalid_ratio: f64, seed: u64, days: u32) -> Vec<GeneratedEvent> {
    clear_of_midnight();
    // End a minute ago: nothing is "in the future" when ingest reads it.
    let end_ms = now_ms() - 60_000;
    Generator::new(GeneratorConfig { seed, days, end_ms, invalid_ratio }).take(count).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes events as JSONL into `dir`, returns the path.
pub fn write_jsonl(dir: &Path, events: &[GeneratedEvent]) -> PathBuf {
    let path = dir.join("events.jsonl");
    let mut bytes = Vec::with_capacity(events.len() * 600);
    for e in events {
        bytes.extend_from_slice(&e.line);
        bytes.push(b'\n');
    }
    std::fs::write(&path, bytes).expect("write events");
    path
}

pub fn kafkatool(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(repo_root().join("deploy/local/kafkatool.py"))
        .arg("--brokers")
        .arg(kafka_brokers())
        .args(args)
        .output()
        .expect("run kafkatool.py");
    assert!(out.status.success(), "kafkatool {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn create_topics(partitions: u32, topics: &[&str]) {
    let mut args = vec!["create-topics", "--partitions"];
    let p = partitions.to_string();
    args.push(&p);
    args.extend_from_slice(topics);
    kafkatool(&args);
}

/// The group's committed offset per partition (-1001: none).
pub fn committed(topic: &str, group: &str) -> Vec<i64> {
    let answer: HashMap<String, i64> =
        serde_json::from_str(&kafkatool(&["committed", "--topic", topic, "--group", group])).expect("kafkatool committed prints JSON");
    let mut offsets: Vec<(i32, i64)> = answer.into_iter().map(|(p, o)| (p.parse().expect("partition"), o)).collect();
    offsets.sort_unstable();
    offsets.into_iter().map(|(_, o)| o).collect()
}

/// The log start and end offsets per partition.
fn watermarks(topic: &str) -> Vec<(i64, i64)> {
    let answer: HashMap<String, (i64, i64)> =
        serde_json::from_str(&kafkatool(&["watermarks", "--topic", topic])).expect("kafkatool watermarks prints JSON");
    let mut marks: Vec<(i32, (i64, i64))> = answer.into_iter().map(|(p, marks)| (p.parse().expect("partition"), marks)).collect();
    marks.sort_unstable();
    marks.into_iter().map(|(_, marks)| marks).collect()
}

/// The log start offset per partition.
pub fn log_starts(topic: &str) -> Vec<i64> {
    watermarks(topic).into_iter().map(|(low, _)| low).collect()
}

/// The log end offset (the next offset written) per partition.
pub fn log_ends(topic: &str) -> Vec<i64> {
    watermarks(topic).into_iter().map(|(_, high)| high).collect()
}

/// Polls `done` every 200 ms until it is true; fails with `what()` past `limit`.
/// The random source of a test that draws faults or kill moments: seeded
/// from `INFERLOG_TEST_SEED` when set (a replay), else from the clock; the
/// seed is printed either way, so any run can be replayed.
pub fn test_rng(test: &str) -> (rand::rngs::StdRng, u64) {
    use rand::SeedableRng as _;
    let seed = std::env::var("INFERLOG_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(now_ms() as u64);
    #[allow(clippy::print_stderr)] // the seed belongs in the test's output
    {
        eprintln!("{test}: seed {seed} (replay with INFERLOG_TEST_SEED={seed})");
    }
    (rand::rngs::StdRng::seed_from_u64(seed), seed)
}

pub fn wait_for(limit: Duration, mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {}", what());
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn produce(topic: &str, file: &Path) {
    kafkatool(&["produce", "--topic", topic, file.to_str().expect("utf-8 path")]);
}

/// Every message of a topic (read until idle, never by watermark).
pub fn read_topic(topic: &str) -> Vec<serde_json::Value> {
    kafkatool(&["read", "--topic", topic, "--idle", "4"]).lines().map(|l| serde_json::from_str(l).expect("kafkatool prints JSON lines")).collect()
}

/// Every message of a topic with its whole payload as text (`value`).
pub fn read_topic_values(topic: &str) -> Vec<serde_json::Value> {
    kafkatool(&["read", "--topic", topic, "--idle", "4", "--value-bytes", "100000000"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("kafkatool prints JSON lines"))
        .collect()
}

/// The SHA-256 of the message a DLQ message was made from: its
/// `inferlog.original.sha256` header when the DLQ holds a redacted or cut
/// payload, else the payload's own.
pub fn original_sha256(m: &serde_json::Value) -> &str {
    m["headers"]["inferlog.original.sha256"].as_str().or_else(|| m["sha256"].as_str()).expect("sha256")
}

/// The source `partition/offset` of each DLQ message read by [`read_topic`]
/// (a reject sent twice, after a crash, counts once).
pub fn dlq_sources(messages: &[serde_json::Value]) -> HashSet<String> {
    messages.iter().map(|m| format!("{}/{}", m["headers"]["inferlog.source.partition"], m["headers"]["inferlog.source.offset"])).collect()
}

/// Runs a query on ClickHouse over HTTP: the trimmed TSV answer, or the error text.
pub fn try_clickhouse(sql: &str) -> Result<String, String> {
    try_clickhouse_at(&clickhouse_url(), sql)
}

/// [`try_clickhouse`] on the server at `url` (a node of the local cluster).
pub fn try_clickhouse_at(url: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("curl").args(["-sS", "--fail-with-body", "--data-binary", sql, url]).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("clickhouse {sql:?}: {text}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Runs a query on ClickHouse over HTTP and returns the trimmed TSV answer.
pub fn clickhouse(sql: &str) -> String {
    try_clickhouse(sql).unwrap_or_else(|e| panic!("{e}"))
}

pub fn clickhouse_u64(sql: &str) -> u64 {
    clickhouse(sql).parse().unwrap_or_else(|e| panic!("{sql}: not a number: {e}"))
}

/// The names one test uses, and the config file pointing at them.
#[derive(Debug)]
pub struct Scenario {
    pub dir: tempfile::TempDir,
    pub topic: String,
    pub dlq: String,
    pub group: String,
    pub table: String,
    pub rejects_table: String,
    pub config: PathBuf,
}

impl Scenario {
    /// Fresh topics (with `partitions`), group and tables, and a config file.
    pub fn new(name: &str, partitions: u32, extra_ingest: &str) -> Scenario {
        Scenario::with_kafka(name, partitions, "", extra_ingest)
    }

    /// Static partition assignment instead of the consumer group: for the
    /// crash tests, which restart the killed process at once (a restarted
    /// group member would wait out its dead predecessor's session timeout).
    pub fn static_assignment(name: &str, partitions: u32, extra_ingest: &str) -> Scenario {
        Scenario::with_kafka(name, partitions, "assignment = \"static\"\n", extra_ingest)
    }

    /// Like [`Scenario::new`], with `extra_kafka` appended to the `[kafka]` table.
    pub fn with_kafka(name: &str, partitions: u32, extra_kafka: &str, extra_ingest: &str) -> Scenario {
        let default_age = if extra_ingest.contains("batch_max_age") { "" } else { "batch_max_age = \"1s\"\n" };
        let default_metrics = if extra_ingest.contains("metrics_addr") { "" } else { "metrics_addr = \"\"\n" };
        let id = unique(name);
        let dir = tempfile::Builder::new().prefix(&format!("inferlog-{id}-")).tempdir().expect("temp dir");
        let s = Scenario {
            topic: format!("{id}-events"),
            dlq: format!("{id}-dlq"),
            group: format!("{id}-group"),
            table: format!("{id}_logs"),
            rejects_table: format!("{id}_rejects"),
            config: dir.path().join("inferlog.toml"),
            dir,
        };
        let toml = format!(
            "[kafka]\nbrokers = \"{}\"\ntopics = [\"{}\"]\ngroup_id = \"{}\"\ndlq_topic = \"{}\"\nsession_timeout = \"6s\"\n{extra_kafka}\n\
             [clickhouse]\nurl = \"{}\"\ndatabase = \"inferlog_test\"\ntable = \"{}\"\nrejects_table = \"{}\"\n\n\
             [ingest]\nretry_max_backoff = \"2s\"\n{default_metrics}{default_age}{extra_ingest}\n",
            kafka_brokers(),
            s.topic,
            s.group,
            s.dlq,
            clickhouse_url(),
            s.table,
            s.rejects_table
        );
        std::fs::write(&s.config, toml).expect("write config");
        std::fs::write(s.dir.path().join("hash.key"), "integration-test-hash-key-0123456789").expect("write key");
        create_topics(partitions, &[&s.topic, &s.dlq]);
        s
    }

    /// Generates `count` events (see [`generate`]), writes them to this
    /// scenario's directory and produces them to its topic.
    pub fn produce_generated(&self, count: usize, invalid_ratio: f64, seed: u64) -> Vec<GeneratedEvent> {
        let events = generate(count, invalid_ratio, seed, 3);
        let file = write_jsonl(self.dir.path(), &events);
        produce(&self.topic, &file);
        events
    }

    pub fn qualified_table(&self) -> String {
        format!("inferlog_test.{}", self.table)
    }

    /// Starts `inferlog-ingest` on this scenario; stderr goes to `log`.
    pub fn spawn_ingest(&self, exit_when_idle: Option<&str>, log: &str) -> Child {
        self.spawn_ingest_with(exit_when_idle, log, &[])
    }

    /// Like [`Scenario::spawn_ingest`], with extra environment (config overrides).
    pub fn spawn_ingest_with(&self, exit_when_idle: Option<&str>, log: &str, env: &[(&str, &str)]) -> Child {
        self.spawn_ingest_on(&self.config, exit_when_idle, log, env)
    }

    /// Like [`Scenario::spawn_ingest_with`], on another config file.
    pub fn spawn_ingest_on(&self, config: &Path, exit_when_idle: Option<&str>, log: &str, env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new(bin("inferlog-ingest"));
        cmd.envs(env.iter().copied());
        cmd.arg("--config").arg(config);
        if let Some(idle) = exit_when_idle {
            cmd.args(["--exit-when-idle", idle]);
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(log)).expect("log file");
        cmd.env("INFERLOG_HASH_KEY_FILE", self.dir.path().join("hash.key"))
            .env_remove("INFERLOG_HASH_KEY")
            .env_remove("INFERLOG_CONFIG")
            .stdout(Stdio::null())
            .stderr(log);
        cmd.spawn().expect("spawn inferlog-ingest")
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// Runs ingest until it drains the topic; asserts a clean exit.
    pub fn drain(&self, log: &str) {
        let status = self.spawn_ingest(Some("8s"), log).wait().expect("wait for ingest");
        assert!(status.success(), "ingest exited with {status}: {}", self.log(log));
    }

    /// `count()` and `uniqExact(request_id)` of the hot table; (0, 0) until ingest has created it.
    pub fn hot_count(&self) -> (u64, u64) {
        let answer = match try_clickhouse(&format!("SELECT count(), uniqExact(request_id) FROM {}", self.qualified_table())) {
            Ok(answer) => answer,
            Err(e) if e.contains("Code: 60") || e.contains("Code: 81") => return (0, 0),
            Err(e) => panic!("{e}"),
        };
        let mut parts = answer.split('\t').map(|p| p.parse::<u64>().expect("number"));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }
}

impl Scenario {
    /// Creates this scenario's hot table before ingest does, with ingest's
    /// columns but a plain `MergeTree`: no merge can collapse a duplicate,
    /// so `count()` against the produced events proves exactly once.
    pub fn create_plain_hot_table(&self) {
        create_plain_hot_table("inferlog_test", &self.table);
    }

    /// Runs ingest with `env` until it exits (or fails past `limit`):
    /// its exit code, how long it took, and its log.
    pub fn run_ingest(&self, exit_when_idle: Option<&str>, log: &str, env: &[(&str, &str)], limit: Duration) -> (Option<i32>, Duration, String) {
        let started = Instant::now();
        let mut child = self.spawn_ingest_with(exit_when_idle, log, env);
        let status = wait_with_limit(&mut child, limit);
        (status.code(), started.elapsed(), self.log(log))
    }

    /// Rows and distinct (partition, offset) of the rejects log.
    pub fn rejects_logged(&self) -> (u64, u64) {
        let sql = format!("SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM inferlog_test.{}", self.rejects_table);
        let answer = try_clickhouse(&sql).unwrap_or_else(|_| "0\t0".into());
        let mut parts = answer.split('\t').map(|p| p.parse::<u64>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }
}

/// `database.table` with the hot table's columns (`inferlog_store::model::tables::HOT`)
/// on a plain `MergeTree`, so a duplicate stays visible to `count()`.
pub fn create_plain_hot_table(database: &str, table: &str) {
    let version = inferlog_store::hot::parse_version(&clickhouse("SELECT version()"));
    let shape = inferlog_store::model::tables::Shape { engine: "MergeTree()", ..inferlog_store::model::tables::HOT };
    clickhouse(&format!("CREATE DATABASE IF NOT EXISTS {database}"));
    clickhouse(&shape.ddl(database, table, version));
}

/// The value of the first metric line of `/metrics` at `addr` starting with `line_start`.
pub fn metric(addr: &str, line_start: &str) -> Option<f64> {
    http_get(addr, "/metrics").lines().find_map(|l| l.strip_prefix(line_start).and_then(|v| v.trim().parse::<f64>().ok()))
}

/// A loopback `host:port` free right now, for a daemon's /metrics and /healthz.
pub fn free_loopback_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    format!("127.0.0.1:{port}")
}

/// `GET http://ADDR/PATH` with curl: the status line, headers and body.
pub fn http_get(addr: &str, path: &str) -> String {
    let out = Command::new("curl").args(["-sS", "-i", &format!("http://{addr}{path}")]).output().expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sends SIGTERM to `child` and waits for it up to `limit` (see [`wait_with_limit`]).
/// A `/proc/<pid>/status` figure in KiB (`field`: `VmRSS:`, the resident
/// memory now; `VmHWM:`, its peak); 0 once the process is gone.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

pub fn sigterm(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let term = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill -TERM");
    assert!(term.success(), "kill -TERM {}", child.id());
    wait_with_limit(child, limit)
}

/// Waits until `log()` shows that `child` stopped at its test hook's pause
/// point (`INFERLOG_*_PAUSE_AFTER`): `None` once paused, or the exit status
/// if it ended first. Fails past `limit`.
pub fn wait_paused(child: &mut Child, log: impl Fn() -> String, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while !log().contains("pausing here until killed") {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        assert!(start.elapsed() < limit, "never paused within {limit:?}: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Waits for `child` up to `limit`, killing it (and failing) past that.
pub fn wait_with_limit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Expected reason by SHA-256 of the message bytes, for the invalid events.
pub fn expected_reasons(events: &[GeneratedEvent]) -> HashMap<String, ReasonCode> {
    events.iter().filter_map(|e| e.expected.map(|r| (sha256_hex(&e.line), r))).collect()
}

pub fn valid_count(events: &[GeneratedEvent]) -> usize {
    events.iter().filter(|e| e.expected.is_none()).count()
}
