//! The fault matrix: inputs × writers × faults × hot tiers on the real services, each
//! cell a Jepsen-style run. A workload whose every write is known
//! ([`Workload`]: events around the last UTC midnight, so an OTLP message's
//! spans go to two day inserts, one in seven refused as `error_code.unknown`);
//! a fault injected while the writer runs, through the fault proxy in front
//! of ClickHouse ([`FaultProxy`]) or by `kill -9`; and a checker that
//! compares the final state with the workload, never with inferlog's
//! counters, on a hot table no merge can collapse: every valid event stored
//! once, every invalid one in the DLQ (by its source coordinates), offsets
//! committed to the end, and for `dlq replay` the ledger equal to what the
//! hot table holds.
//!
//! - inputs: `json`, `otlp_proto`, `otlp_json`;
//! - writers: the ingest daemon with two members of one group; `dlq replay`
//!   after the config fix that makes the refused events valid;
//! - faults: `kill -9` at a seeded random moment; a ClickHouse outage (every
//!   request blackholed) longer than `max.poll.interval.ms` with a member
//!   joining during it; the second of two concurrent day inserts refused,
//!   then accepted; the answer to an insert lost after the server stored it;
//!   a day released while the writer adds rows to it (the workload eight
//!   days old, the compactor held between its check of the day's rows and
//!   the drop while the writer starts; the final state is then the hot
//!   table and the archive, read with pyarrow);
//! - hot tiers: the single server; the local cluster (2 shards × 2
//!   replicas), the proxy in front of the replica shard 1's inserts go to.
//!
//! Each cell prints one line (`cell input=… writer=… fault=… tier=… seed=…
//! stored=… duplicates=… missing=… dlq=… seconds=…`), and appends it to
//! `$INFERLOG_MATRIX_REPORT` when set. `.ci/run` runs the cells of
//! [`CI_CELLS`], in which every input, writer, fault and tier appears;
//! `deploy/local/faults.sh` runs the whole matrix with a seed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use inferlog_tests::faults::{Fault, FaultProxy, Rule};
use inferlog_tests::otlp::{Input, Workload, UNKNOWN_CODE};
use inferlog_tests::{committed, log_ends, read_topic_values, test_rng, try_clickhouse_at, wait_for, wait_with_limit, Scenario};
use rand::Rng as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    Ingest,
    Replay,
}

/// The hot tier: the single server, or the local cluster (2 shards × 2
/// replicas, the proxy in front of shard 1's first replica, where its
/// inserts go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Single,
    Cluster,
}

impl Tier {
    const ALL: [Tier; 2] = [Tier::Single, Tier::Cluster];
    fn name(self) -> &'static str {
        match self {
            Tier::Single => "single",
            Tier::Cluster => "cluster",
        }
    }

    /// Where the checker reads the hot table (on the cluster, its `Distributed` table).
    fn url(self) -> String {
        match self {
            Tier::Single => inferlog_tests::clickhouse_url(),
            Tier::Cluster => CLUSTER_URL.into(),
        }
    }
}

/// Shard 1's first replica of the local cluster (`services.sh up --cluster`).
const CLUSTER_URL: &str = "http://127.0.0.1:8131";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultKind {
    Kill9,
    Outage,
    DayInsertRefused,
    AnswerLost,
    ReleaseRace,
}

impl Writer {
    const ALL: [Writer; 2] = [Writer::Ingest, Writer::Replay];
    fn name(self) -> &'static str {
        match self {
            Writer::Ingest => "ingest",
            Writer::Replay => "dlq_replay",
        }
    }
}

impl FaultKind {
    const ALL: [FaultKind; 5] = [FaultKind::Kill9, FaultKind::Outage, FaultKind::DayInsertRefused, FaultKind::AnswerLost, FaultKind::ReleaseRace];
    fn name(self) -> &'static str {
        match self {
            FaultKind::Kill9 => "kill9",
            FaultKind::Outage => "outage",
            FaultKind::DayInsertRefused => "day_insert_refused",
            FaultKind::AnswerLost => "answer_lost",
            FaultKind::ReleaseRace => "release_race",
        }
    }
}

/// The cells `.ci/run` runs: each input, writer, fault and tier at least once.
const CI_CELLS: [(Input, Writer, FaultKind, Tier); 10] = [
    (Input::OtlpProto, Writer::Ingest, FaultKind::DayInsertRefused, Tier::Single),
    (Input::OtlpJson, Writer::Ingest, FaultKind::AnswerLost, Tier::Single),
    (Input::Json, Writer::Ingest, FaultKind::Kill9, Tier::Single),
    (Input::Json, Writer::Ingest, FaultKind::Outage, Tier::Single),
    (Input::OtlpProto, Writer::Replay, FaultKind::Kill9, Tier::Single),
    (Input::OtlpJson, Writer::Replay, FaultKind::DayInsertRefused, Tier::Single),
    (Input::OtlpProto, Writer::Ingest, FaultKind::DayInsertRefused, Tier::Cluster),
    (Input::OtlpJson, Writer::Replay, FaultKind::AnswerLost, Tier::Cluster),
    (Input::OtlpProto, Writer::Ingest, FaultKind::ReleaseRace, Tier::Cluster),
    (Input::Json, Writer::Replay, FaultKind::ReleaseRace, Tier::Single),
];

/// Partitions of a cell's topic: one a member, one a shard on the cluster.
const PARTITIONS: usize = 2;

/// Spans a message of an OTLP workload.
const PER_MESSAGE: usize = 20;
/// One event in this many is refused (`error_code.unknown`).
const INVALID_EVERY: usize = 7;

/// What the checker found.
#[derive(Debug, Default)]
struct Outcome {
    stored: usize,
    duplicates: usize,
    missing: usize,
    unexpected: usize,
    dlq: usize,
    dlq_missing: usize,
    ledger: Option<(usize, usize)>,
    uncommitted: Vec<(i64, i64)>,
}

/// One cell's run: the scenario, the proxy inferlog talks to ClickHouse
/// through, the workload.
struct Cell {
    s: Scenario,
    tier: Tier,
    fault: FaultKind,
    /// The config whose ClickHouse is the proxy (`s.config` reaches it directly).
    proxied: std::path::PathBuf,
    proxy: FaultProxy,
    workload: Workload,
    name: String,
    seed: u64,
    rng: rand::rngs::StdRng,
    started: Instant,
    /// What happened that the checker does not count (a member fenced).
    notes: Vec<String>,
}

impl Cell {
    fn new(input: Input, writer: Writer, fault: FaultKind, tier: Tier) -> Cell {
        inferlog_tests::clear_of_midnight();
        let name = format!("cell input={} writer={} fault={} tier={}", input.encoding(), writer.name(), fault.name(), tier.name());
        let (rng, seed) = test_rng(&name);
        let encodings = if input == Input::Json { String::new() } else { format!("encodings = {{ \"TOPIC\" = \"{}\" }}\n", input.encoding()) };
        // A short poll interval: the outage outlasts it.
        let kafka = format!("{encodings}options = {{ \"max.poll.interval.ms\" = \"8000\" }}\n");
        let s = Scenario::with_kafka("matrix", PARTITIONS as u32, &kafka, "batch_max_rows = 2000\n");
        let config = std::fs::read_to_string(&s.config).expect("config").replace("\"TOPIC\"", &format!("\"{}\"", s.topic));
        let single = format!("url = \"{}\"\n", inferlog_tests::clickhouse_url());
        // The compactor reads a day of several parts with FINAL, which a
        // plain MergeTree refuses: a release cell writes ingest's own table
        // and ends with every row in the archive, where nothing collapses.
        let release = fault == FaultKind::ReleaseRace;
        let (direct, proxy) = match tier {
            Tier::Single => {
                if !release {
                    s.create_plain_hot_table();
                }
                (config, FaultProxy::clickhouse())
            }
            Tier::Cluster => {
                // Kafka partition 0 on shard 1, 1 on shard 2; a quorum of both replicas.
                let cluster = format!("url = \"{CLUSTER_URL}\"\ncluster = \"inferlog\"\nrequest_timeout = \"10s\"\n");
                let shards = "[[clickhouse.shards]]\nreplicas = [\"http://127.0.0.1:8131\", \"http://127.0.0.1:8132\"]\npartitions = [0]\n\
                              [[clickhouse.shards]]\nreplicas = [\"http://127.0.0.1:8133\", \"http://127.0.0.1:8134\"]\npartitions = [1]\n";
                if !release {
                    create_plain_cluster_table(&s.table);
                }
                (config.replacen(&single, &cluster, 1) + shards, FaultProxy::start("127.0.0.1:8131"))
            }
        };
        // The catalog and the archive: ingest takes a day's lock there for a
        // day at the hot policy's edge, dlq replay keeps its ledger and looks
        // released days up, the compactor archives and releases.
        let direct = direct + &tiers_sections(&s);
        std::fs::write(&s.config, &direct).expect("config");
        let proxied = s.dir.path().join("proxied.toml");
        let mut through = match tier {
            Tier::Single => direct.replacen(&single, &format!("url = \"{}\"\n", proxy.url()), 1),
            Tier::Cluster => direct.replace(CLUSTER_URL, &proxy.url()),
        };
        if release {
            // The writers take events of days past the 7-day hot policy (the
            // compactor, on the direct config, refuses such an age): days of
            // real time fit in a test.
            through.push_str("\n[schema]\nmax_event_age = \"30d\"\n");
        }
        std::fs::write(&proxied, through).expect("config");
        let count = if input == Input::Json { 3_000 } else { 6_000 };
        let today = inferlog_tests::now_ms().div_euclid(86_400_000);
        // A release cell's midnight is eight days ago: both days past the policy.
        let day = if release { today - 8 } else { today };
        let workload = Workload::around(day, input, count, PER_MESSAGE, INVALID_EVERY, seed, &s.table);
        Cell { s, tier, fault, proxied, proxy, workload, name, seed, rng, started: Instant::now(), notes: Vec::new() }
    }

    /// The hot table's INSERTs (not the replay log's or the rejects
    /// log's); on the cluster, into the shard-local table.
    fn hot_insert(&self) -> String {
        match self.tier {
            Tier::Single => format!("INSERT INTO inferlog_test.{} (", self.s.table),
            Tier::Cluster => format!("INSERT INTO inferlog_test.{} (", inferlog_store::model::tables::local_table(&self.s.table)),
        }
    }

    /// A short request timeout: a blackholed request fails in seconds.
    const TIMEOUT: (&'static str, &'static str) = ("INFERLOG_CLICKHOUSE__REQUEST_TIMEOUT", "5s");

    /// A member talking to ClickHouse directly, not through the proxy.
    fn spawn_direct(&self, log: &str, idle: Option<&str>) -> Child {
        self.s.spawn_ingest_with(idle, log, &[Self::TIMEOUT])
    }

    fn spawn(&self, log: &str, idle: Option<&str>) -> Child {
        self.s.spawn_ingest_on(&self.proxied, idle, log, &[Self::TIMEOUT])
    }

    fn logs(&self) -> String {
        ["a.log", "b.log", "b2.log", "a2.log", "replay.log", "compactor-1.log", "compactor-2.log", "compactor-3.log", "compactor-4.log"]
            .iter()
            .map(|l| format!("--- {l}\n{}", self.s.log(l)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the first INSERT into the hot table went through the proxy.
    fn wait_first_insert(&self) {
        let insert = self.hot_insert();
        wait_for(Duration::from_secs(60), || self.proxy.seen(&insert) >= 1, || self.logs());
    }

    /// The ingest daemon, two members, with `fault` injected while they run.
    fn ingest(&mut self, fault: FaultKind) {
        let insert = self.hot_insert();
        match fault {
            FaultKind::DayInsertRefused => self.proxy.add(Rule::nth(&insert, 2, Fault::Reset { after: Duration::from_secs(1) })),
            FaultKind::AnswerLost => {
                self.proxy.add(Rule::nth(&insert, 1, Fault::LoseAnswer));
                self.proxy.add(Rule::nth(&insert, 4, Fault::LoseAnswer));
            }
            FaultKind::Kill9 | FaultKind::Outage | FaultKind::ReleaseRace => {}
        }
        self.workload.produce(self.s.dir.path(), &self.s.topic, PARTITIONS);
        let mut a = self.spawn("a.log", Some("8s"));
        // The second member joins once the first is writing: the first
        // batch's two day inserts are the first member's.
        self.wait_first_insert();
        let mut b = match fault {
            FaultKind::Outage => {
                // The first member's path to ClickHouse is cut (every request
                // blackholed) for twice max.poll.interval.ms, and a member with
                // its own path joins meanwhile: a rebalance whose revocation
                // waits on a write that cannot end, until the group removes
                // the first member and gives its partitions to the second.
                self.proxy.add(Rule { pattern: String::new(), skip: 0, times: usize::MAX, fault: Fault::Blackhole });
                std::thread::sleep(Duration::from_secs(1));
                let b = self.spawn_direct("b.log", Some("8s"));
                std::thread::sleep(Duration::from_secs(16));
                self.proxy.clear();
                b
            }
            FaultKind::Kill9 => {
                let b = self.spawn("b.log", Some("8s"));
                let after = Duration::from_millis(self.rng.gen_range(200..3_000));
                std::thread::sleep(after);
                a.kill().expect("kill -9");
                let _ = a.wait();
                a = self.spawn("a2.log", Some("8s"));
                b
            }
            _ => self.spawn("b.log", Some("8s")),
        };
        let status = wait_with_limit(&mut a, Duration::from_secs(300));
        // Fenced (its revocation outlived the group's patience): exit 75, restarted below.
        let fenced = fault == FaultKind::Outage && status.code() == Some(75);
        assert!(status.success() || fenced, "{}: the first member exited {status}: {}", self.name, self.logs());
        if fenced {
            self.notes.push("fenced".into());
        }
        let status = wait_with_limit(&mut b, Duration::from_secs(300));
        assert!(status.success(), "{}: the second member exited {status}: {}", self.name, self.logs());
        // A member may leave before the other drained: one more pass drains the rest.
        let mut last = self.spawn("a2.log", Some("6s"));
        let status = wait_with_limit(&mut last, Duration::from_secs(300));
        assert!(status.success(), "{}: the last pass exited {status}: {}", self.name, self.logs());
    }

    /// The config `dlq replay` runs with: the unknown code known.
    fn fixed_config(&self) -> std::path::PathBuf {
        let fixed = self.s.dir.path().join("fixed.toml");
        let base = std::fs::read_to_string(&self.proxied).expect("config");
        std::fs::write(&fixed, format!("{base}\n[schema.error_codes]\n\"{UNKNOWN_CODE}\" = \"kv_cache_evicted\"\n")).expect("write config");
        fixed
    }

    fn schema(&self) -> String {
        self.s.table.to_ascii_lowercase()
    }

    fn replay_command(&self, fixed: &std::path::Path) -> Command {
        let mut cmd = Command::new(inferlog_tests::bin("inferlog-ingest"));
        cmd.arg("--config").arg(fixed).args(["dlq", "replay", "--format", "json", "--batch", "200"]);
        cmd.env("INFERLOG_HASH_KEY_FILE", self.s.dir.path().join("hash.key")).env_remove("INFERLOG_HASH_KEY").env_remove("INFERLOG_CONFIG");
        cmd.env(Self::TIMEOUT.0, Self::TIMEOUT.1);
        // The archive, where a released day's rows are looked up.
        cmd.env("AWS_SECRET_ACCESS_KEY", inferlog_tests::tiers::s3_secret()).env_remove("AWS_ACCESS_KEY_ID");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.s.dir.path().join("replay.log")).expect("log file");
        cmd.stderr(log).stdout(std::process::Stdio::null());
        cmd
    }

    /// Ingest without faults fills the DLQ; then `dlq replay` with the fix,
    /// with `fault` injected while it runs, and again to its end.
    fn replay(&mut self, fault: FaultKind) {
        self.workload.produce(self.s.dir.path(), &self.s.topic, PARTITIONS);
        let mut a = self.spawn("a.log", Some("6s"));
        let status = wait_with_limit(&mut a, Duration::from_secs(300));
        assert!(status.success(), "{}: ingest exited {status}: {}", self.name, self.logs());
        let fixed = self.fixed_config();
        let insert = self.hot_insert();
        let seen = self.proxy.seen(&insert);
        match fault {
            FaultKind::DayInsertRefused => self.proxy.add(Rule::nth(&insert, 2, Fault::Reset { after: Duration::from_millis(300) })),
            FaultKind::AnswerLost => self.proxy.add(Rule::nth(&insert, 1, Fault::LoseAnswer)),
            FaultKind::Kill9 | FaultKind::Outage | FaultKind::ReleaseRace => {}
        }
        let mut replay = self.replay_command(&fixed).spawn().expect("dlq replay");
        match fault {
            FaultKind::Kill9 => {
                wait_for(Duration::from_secs(60), || self.proxy.seen(&insert) > seen || replay.try_wait().ok().flatten().is_some(), || self.logs());
                std::thread::sleep(Duration::from_millis(self.rng.gen_range(0..1_500)));
                let _ = replay.kill();
                let _ = replay.wait();
            }
            FaultKind::Outage => {
                wait_for(Duration::from_secs(60), || self.proxy.seen(&insert) > seen, || self.logs());
                self.proxy.add(Rule { pattern: String::new(), skip: 0, times: usize::MAX, fault: Fault::Blackhole });
                std::thread::sleep(Duration::from_secs(10));
                self.proxy.clear();
                let status = wait_with_limit(&mut replay, Duration::from_secs(300));
                // A lookup that outlived request_timeout ends the run as transient (75): run again.
                assert!(status.success() || status.code() == Some(75), "{}: the replay exited {status}: {}", self.name, self.logs());
            }
            _ => {
                let status = wait_with_limit(&mut replay, Duration::from_secs(300));
                assert!(status.success(), "{}: the replay exited {status}: {}", self.name, self.logs());
            }
        }
        // The run after: finishes what a killed one left, stores nothing twice.
        let status = self.replay_command(&fixed).status().expect("dlq replay");
        assert!(status.success(), "{}: the second replay exited {status}: {}", self.name, self.logs());
    }

    /// `inferlog-compactor --once` on the direct config; with `hold`, it
    /// holds in its first release, between the check of the day's rows
    /// and the drop, until `hold` exists.
    fn compactor(&self, log: &str, hold: Option<&std::path::Path>) -> Child {
        let mut cmd = Command::new(inferlog_tests::bin("inferlog-compactor"));
        cmd.arg("--config").arg(&self.s.config).arg("--once");
        cmd.env("AWS_SECRET_ACCESS_KEY", inferlog_tests::tiers::s3_secret()).env_remove("AWS_ACCESS_KEY_ID").env_remove("INFERLOG_CONFIG");
        if let Some(resume) = hold {
            cmd.env("INFERLOG_COMPACTOR_PAUSE_AFTER", "release-checked").env("INFERLOG_TEST_RESUME_FILE", resume);
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.s.dir.path().join(log)).expect("log file");
        cmd.stdout(std::process::Stdio::null()).stderr(log);
        cmd.spawn().expect("inferlog-compactor")
    }

    /// A day released while `writer` adds rows to it: the workload's days
    /// (eight and nine days ago, past the hot policy) stored (for the
    /// replay: its valid events), archived; the compactor held in its first
    /// release between the check and the drop; the writer started (ingest
    /// on the workload's second half, or the replay of the refused events)
    /// until its rows went in or it waits for the release; the release
    /// resumed. Then the compactor again until every day is released and
    /// its late rows archived as supplements.
    fn release_race(&mut self, writer: Writer) {
        let (dir, topic) = (self.s.dir.path().to_path_buf(), self.s.topic.clone());
        let parts = if writer == Writer::Ingest { 2 } else { 1 };
        self.workload.produce_part(&dir, &topic, PARTITIONS, 0, parts);
        let mut a = self.spawn("a.log", Some("6s"));
        let status = wait_with_limit(&mut a, Duration::from_secs(300));
        assert!(status.success(), "{}: ingest exited {status}: {}", self.name, self.logs());
        let resume = dir.join("resume");
        let mut compactor = self.compactor("compactor-1.log", Some(&resume));
        wait_for(
            Duration::from_secs(120),
            || self.s.log("compactor-1.log").contains("held here until") || compactor.try_wait().ok().flatten().is_some(),
            || self.logs(),
        );
        assert!(compactor.try_wait().expect("wait").is_none(), "{}: the compactor ended before its release: {}", self.name, self.logs());
        let insert = self.hot_insert();
        let seen = self.proxy.seen(&insert);
        let (mut w, log, waiting) = match writer {
            Writer::Ingest => {
                self.workload.produce_part(&dir, &topic, PARTITIONS, 1, 2);
                (self.spawn("b.log", Some("6s")), "b.log", "is being released")
            }
            Writer::Replay => {
                let fixed = self.fixed_config();
                (self.replay_command(&fixed).spawn().expect("dlq replay"), "replay.log", "a release holds one of this chunk's days")
            }
        };
        // Until both days' rows went in, or the writer waits for the release.
        wait_for(
            Duration::from_secs(120),
            || self.proxy.seen(&insert) >= seen + 2 || self.s.log(log).contains(waiting) || w.try_wait().ok().flatten().is_some(),
            || self.logs(),
        );
        assert!(
            self.proxy.seen(&insert) > seen || self.s.log(log).contains(waiting),
            "{}: the writer wrote nothing while the release was held: {}",
            self.name,
            self.logs()
        );
        if self.s.log(log).contains(waiting) {
            self.notes.push("waited".into());
        }
        std::fs::write(&resume, "").expect("resume the compactor");
        // A day whose rows changed under it fails this pass (exit 75) and is archived again by the next.
        let status = wait_with_limit(&mut compactor, Duration::from_secs(300));
        assert!(status.success() || status.code() == Some(75), "{}: the compactor exited {status}: {}", self.name, self.logs());
        let status = wait_with_limit(&mut w, Duration::from_secs(300));
        assert!(status.success(), "{}: the writer exited {status}: {}", self.name, self.logs());
        if writer == Writer::Replay {
            let status = self.replay_command(&self.fixed_config()).status().expect("dlq replay");
            assert!(status.success(), "{}: the second replay exited {status}: {}", self.name, self.logs());
        }
        // Passes until no hot row is left (a pass archives what the one before left changed).
        let hot = format!("SELECT count() FROM {}", self.s.qualified_table());
        let mut pass = 2;
        while try_clickhouse_at(&self.tier.url(), &hot).unwrap_or_else(|e| panic!("{e}")).trim() != "0" {
            assert!(pass <= 4, "{}: hot rows left after {} compactor passes: {}", self.name, pass - 1, self.logs());
            let log = format!("compactor-{pass}.log");
            let status = wait_with_limit(&mut self.compactor(&log, None), Duration::from_secs(300));
            assert!(status.success(), "{}: compactor pass {pass} exited {status}: {}", self.name, self.logs());
            pass += 1;
        }
        let unreleased = self.psql("SELECT count(*) FROM compactor_days WHERE state <> 'released'");
        assert_eq!(unreleased, "0", "{}: every day released: {}", self.name, self.psql("SELECT day, state, last_error FROM compactor_days"));
    }

    /// Request ids in the archive objects the manifest lists, with their
    /// counts (read with pyarrow, not inferlog).
    fn archived(&self) -> BTreeMap<String, usize> {
        let manifest: BTreeSet<String> = self.psql("SELECT object_key FROM cold_manifest").lines().map(str::to_owned).collect();
        let objects = inferlog_tests::tiers::read_archive_at(&format!("{}/", self.schema()), 0);
        let mut ids = BTreeMap::new();
        for object in objects.as_array().into_iter().flatten() {
            let key = object["key"].as_str().unwrap_or_default();
            if !manifest.iter().any(|m| m == key || key.ends_with(m.as_str())) {
                continue;
            }
            for id in object["request_ids"].as_array().into_iter().flatten().filter_map(|v| v.as_str()) {
                *ids.entry(id.to_owned()).or_default() += 1;
            }
        }
        ids
    }

    /// Compares the final state with the workload.
    fn check(&self, writer: Writer) -> Outcome {
        let mut expected = self.workload.valid_ids();
        let invalid = self.workload.invalid_ids();
        if writer == Writer::Replay {
            expected.extend(invalid.iter().cloned());
        }
        let sql = format!("SELECT request_id, count() FROM {} GROUP BY request_id FORMAT TSV", self.s.qualified_table());
        let rows = try_clickhouse_at(&self.tier.url(), &sql).unwrap_or_else(|e| panic!("{e}"));
        let mut stored: BTreeMap<String, usize> =
            rows.lines().filter_map(|l| l.split_once('\t')).map(|(id, n)| (id.to_owned(), n.parse().expect("count"))).collect();
        if self.fault == FaultKind::ReleaseRace {
            for (id, n) in self.archived() {
                *stored.entry(id).or_default() += n;
            }
        }
        let mut out = Outcome {
            stored: stored.values().sum(),
            duplicates: stored.values().map(|n| n - 1).sum(),
            missing: expected.iter().filter(|id| !stored.contains_key(*id)).count(),
            unexpected: stored.keys().filter(|id| !expected.contains(*id)).count(),
            ..Outcome::default()
        };
        // The DLQ, by source coordinates (a reject sent again after a kill counts once).
        let mut in_dlq: BTreeSet<String> = BTreeSet::new();
        let mut sources = BTreeSet::new();
        for m in read_topic_values(&self.s.dlq) {
            let h = &m["headers"];
            sources.insert(format!("{}/{}/{}", h["inferlog.source.partition"], h["inferlog.source.offset"], h["inferlog.source.span_index"]));
            let value: serde_json::Value = serde_json::from_str(m["value"].as_str().unwrap_or("{}")).unwrap_or_default();
            if let Some(id) = value["request_id"].as_str() {
                in_dlq.insert(id.to_owned());
            }
        }
        out.dlq = sources.len();
        out.dlq_missing = invalid.iter().filter(|id| !in_dlq.contains(*id)).count();
        let ends = log_ends(&self.s.topic);
        let done = committed(&self.s.topic, &self.s.group);
        // A partition the producer left empty has nothing to commit (no offset: -1001).
        out.uncommitted = ends.iter().zip(&done).filter(|(end, c)| end != c && !(**end == 0 && **c < 0)).map(|(e, c)| (*e, *c)).collect();
        if writer == Writer::Replay {
            let stored_ledger = self.psql("SELECT count(*) FROM dlq_replayed WHERE state = 'stored'");
            let pending = self.psql("SELECT count(*) FROM dlq_replayed WHERE state = 'pending'");
            out.ledger = Some((stored_ledger.parse().expect("count"), pending.parse().expect("count")));
        }
        out
    }

    fn psql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([&inferlog_tests::tiers::postgres_url(), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!("SET search_path TO \"{}\"; {sql}", self.schema()))
            .output()
            .expect("psql");
        assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn report(&self, o: &Outcome) {
        let line = format!(
            "{} seed={} stored={} duplicates={} missing={} unexpected={} dlq={} dlq_missing={} ledger={} seconds={:.1}{}",
            self.name,
            self.seed,
            o.stored,
            o.duplicates,
            o.missing,
            o.unexpected,
            o.dlq,
            o.dlq_missing,
            o.ledger.map_or_else(|| "-".to_owned(), |(s, p)| format!("{s}/{p}pending")),
            self.started.elapsed().as_secs_f64(),
            self.notes.iter().map(|n| format!(" {n}")).collect::<String>()
        );
        report_line(&line);
    }
}

/// Prints a cell's line and appends it to `$INFERLOG_MATRIX_REPORT` when set.
fn report_line(line: &str) {
    #[allow(clippy::print_stdout)] // the cell's line is the matrix's output
    {
        println!("{line}");
    }
    if let Some(path) = std::env::var_os("INFERLOG_MATRIX_REPORT") {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("matrix report");
        writeln!(f, "{line}").expect("write the matrix report");
    }
}

/// The `[postgres]`, `[cold]` and `[compactor]` tables of a cell's config.
fn tiers_sections(s: &Scenario) -> String {
    let schema = s.table.to_ascii_lowercase();
    format!(
        "\n[postgres]\nurl = \"{}\"\nschema = \"{schema}\"\n\n[cold]\nurl = \"s3://inferlog-cold/{schema}/\"\nendpoint = \"{}\"\nallow_http = true\naccess_key_id = \"inferlog\"\n\n[compactor]\nmetrics_addr = \"\"\nlateness = \"1s\"\n",
        inferlog_tests::tiers::postgres_url(),
        inferlog_tests::tiers::s3_endpoint()
    )
}

/// The hot table on the cluster as ingest makes it, but on a plain
/// `ReplicatedMergeTree`: no merge can collapse a duplicate.
fn create_plain_cluster_table(table: &str) {
    let on = |sql: &str| try_clickhouse_at(CLUSTER_URL, sql).unwrap_or_else(|e| panic!("{e}"));
    let version = inferlog_store::hot::parse_version(&on("SELECT version()"));
    on("CREATE DATABASE IF NOT EXISTS inferlog_test ON CLUSTER inferlog");
    let plain = inferlog_store::model::tables::Shape { engine: "MergeTree()", ..inferlog_store::model::tables::HOT };
    for statement in plain.cluster_ddl("inferlog_test", table, "inferlog", version) {
        on(&statement);
    }
}

/// Runs one cell and asserts its guarantee.
fn run(input: Input, writer: Writer, fault: FaultKind, tier: Tier) {
    let mut cell = Cell::new(input, writer, fault, tier);
    match (writer, fault) {
        (_, FaultKind::ReleaseRace) => cell.release_race(writer),
        (Writer::Ingest, _) => cell.ingest(fault),
        (Writer::Replay, _) => cell.replay(fault),
    }
    let fired = cell.proxy.fired();
    let o = cell.check(writer);
    cell.report(&o);
    let context = || format!("{}: {o:?}\nfaults: {fired:?}\n{}", cell.name, cell.logs());
    if matches!(fault, FaultKind::DayInsertRefused | FaultKind::AnswerLost | FaultKind::Outage) {
        assert!(!fired.is_empty(), "the fault happened while the writer ran: {}", context());
    }
    assert_eq!((o.duplicates, o.missing, o.unexpected), (0, 0, 0), "every valid event stored once: {}", context());
    assert_eq!(o.dlq_missing, 0, "every invalid event in the DLQ: {}", context());
    assert_eq!(o.dlq, cell.workload.invalid_ids().len(), "each reject in the DLQ once by its source: {}", context());
    assert!(o.uncommitted.is_empty(), "offsets committed to the end: {}", context());
    if let Some((stored, pending)) = o.ledger {
        assert_eq!((stored, pending), (cell.workload.invalid_ids().len(), 0), "the ledger equals what the hot table holds: {}", context());
    }
}

#[test]
fn ci_cells_of_the_fault_matrix() {
    for (input, writer, fault, tier) in CI_CELLS {
        run(input, writer, fault, tier);
    }
}

/// Every cell: `deploy/local/faults.sh` runs it (`--ignored`).
#[test]
#[ignore = "the whole matrix takes about half an hour: deploy/local/faults.sh"]
fn the_whole_matrix() {
    let only = std::env::var("INFERLOG_MATRIX_CELLS").unwrap_or_default();
    let mut failed = Vec::new();
    for tier in Tier::ALL {
        for input in Input::ALL {
            for writer in Writer::ALL {
                for fault in FaultKind::ALL {
                    let name = format!("{}/{}/{}/{}", input.encoding(), writer.name(), fault.name(), tier.name());
                    if (only.is_empty() || only.split(',').any(|c| name.contains(c)))
                        && std::panic::catch_unwind(|| run(input, writer, fault, tier)).is_err()
                    {
                        report_line(&format!("cell {name} FAILED (its assertion is in the test's output)"));
                        failed.push(name);
                    }
                }
            }
        }
    }
    assert!(failed.is_empty(), "cells that did not hold: {failed:?}");
}
