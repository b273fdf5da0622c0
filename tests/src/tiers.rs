//! Helpers for the tests of the tiers after ingest (compactor, retention):
//! a scenario with its own hot table, Postgres schema and cold prefix; the
//! real binaries as child processes; Postgres through `psql` and the cold
//! store through Python (boto3, pyarrow), independent of inferlog's code.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use inferlog_schema::timestamp::MS_PER_DAY;
use inferlog_schema::InferenceEvent;

use crate::{bin, clickhouse, clickhouse_url, repo_root, unique};

pub fn s3_endpoint() -> String {
    std::env::var("INFERLOG_TEST_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:9303".into())
}

/// The local S3 server's secret key (access key `inferlog`): the file
/// `services.sh` writes, or `INFERLOG_TEST_S3_SECRET`.
pub fn s3_secret() -> String {
    std::env::var("INFERLOG_TEST_S3_SECRET").unwrap_or_else(|_| {
        std::fs::read_to_string(repo_root().join(".inferlog/local/s3.secret")).map_or_else(|_| "inferlog-local".into(), |s| s.trim().to_owned())
    })
}

/// The tests' own database, which `deploy/local/test.sh` recreates empty
/// before each run (`services.sh up --tests` creates it).
pub fn postgres_url() -> String {
    std::env::var("INFERLOG_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/inferlog_test".into())
}

/// Today's UTC day number.
pub fn today() -> i32 {
    (crate::now_ms() / MS_PER_DAY) as i32
}

pub fn day_string(day: i32) -> String {
    inferlog_schema::timestamp::utc_day(i64::from(day) * MS_PER_DAY)
}

/// One test's hot table, Postgres schema and cold prefix, and the config naming them.
#[derive(Debug)]
pub struct TierScenario {
    pub dir: tempfile::TempDir,
    pub id: String,
    pub table: String,
    pub schema: String,
    pub prefix: String,
    pub config: PathBuf,
}

impl TierScenario {
    /// `extra` is appended to the config file (more tables).
    pub fn new(name: &str, extra: &str) -> TierScenario {
        TierScenario::with(name, "", extra)
    }

    /// Like [`TierScenario::new`], with `cold_extra` added to the `[cold]` table.
    pub fn with(name: &str, cold_extra: &str, extra: &str) -> TierScenario {
        crate::clear_of_midnight();
        let id = unique(name).to_ascii_lowercase();
        let dir = tempfile::Builder::new().prefix(&format!("inferlog-{id}-")).tempdir().expect("temp dir");
        let s = TierScenario {
            table: format!("{id}_logs"),
            schema: id.clone(),
            prefix: format!("{id}/"),
            config: dir.path().join("inferlog.toml"),
            id,
            dir,
        };
        let toml = format!(
            "[clickhouse]\nurl = \"{}\"\ndatabase = \"inferlog_test\"\ntable = \"{}\"\nrejects_table = \"{}_rejects\"\n\n\
             [postgres]\nurl = \"{}\"\nschema = \"{}\"\n\n\
             [cold]\nurl = \"s3://inferlog-cold/{}\"\nendpoint = \"{}\"\nallow_http = true\naccess_key_id = \"inferlog\"\n{cold_extra}\n\
             [compactor]\nmetrics_addr = \"\"\nlateness = \"1s\"\n\n{extra}\n",
            clickhouse_url(),
            s.table,
            s.id,
            postgres_url(),
            s.schema,
            s.prefix,
            s3_endpoint()
        );
        std::fs::write(&s.config, toml).expect("write config");
        s
    }

    pub fn qualified_table(&self) -> String {
        format!("inferlog_test.{}", self.table)
    }

    /// This scenario's rejects log, `database.table`.
    pub fn rejects_table(&self) -> String {
        format!("inferlog_test.{}_rejects", self.id)
    }

    /// Seeds `count` valid events over `days` days, the last one `last_day`, into this scenario's hot table.
    pub fn seed(&self, count: usize, days: u32, last_day: i32, seed: u64) -> Vec<InferenceEvent> {
        let events = Self::events(count, days, last_day, seed);
        self.insert(&events);
        events
    }

    /// `count` valid generated events over `days` days, the last one `last_day`.
    pub fn events(count: usize, days: u32, last_day: i32, seed: u64) -> Vec<InferenceEvent> {
        crate::seed::seeded_events(count, days, (i64::from(last_day) + 1) * MS_PER_DAY, seed)
    }

    /// Inserts `events` into this scenario's hot table, as ingest would.
    pub fn insert(&self, events: &[InferenceEvent]) {
        crate::seed::insert_hot(&clickhouse_url(), "inferlog_test", &self.table, events);
    }

    /// A command running `binary` on this scenario's config, stderr to `log`.
    pub fn command(&self, binary: &str, args: &[&str], log: &str, env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(bin(binary));
        cmd.arg("--config").arg(&self.config).args(args);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(log)).expect("log file");
        cmd.env("AWS_SECRET_ACCESS_KEY", s3_secret())
            .env_remove("AWS_ACCESS_KEY_ID")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log);
        cmd
    }

    pub fn spawn(&self, binary: &str, args: &[&str], log: &str, env: &[(&str, &str)]) -> Child {
        self.command(binary, args, log, env).spawn().expect("spawn")
    }

    /// Runs `binary args` with the test hook `env` = `step`, waits until it
    /// pauses there and kills it with SIGKILL (panics if it exits first).
    pub fn kill_at(&self, binary: &str, args: &[&str], env: &str, step: &str, log: &str) {
        let mut child = self.paused_at(binary, args, (env, step), log, std::time::Duration::from_secs(120));
        child.kill().expect("kill -9");
        let _ = child.wait();
    }

    /// Runs `binary args` with the test hook `env` = `step` and waits until
    /// it pauses there (panics if it exits first, or after `limit`); the
    /// paused process, to kill or let go.
    pub fn paused_at(&self, binary: &str, args: &[&str], (env, step): (&str, &str), log: &str, limit: std::time::Duration) -> Child {
        let mut child = self.spawn(binary, args, log, &[(env, step)]);
        if let Some(status) = crate::wait_paused(&mut child, || self.log(log), limit) {
            panic!("{binary} exited ({status}) before reaching {step}: {}", self.log(log));
        }
        child
    }

    /// Starts `inferlog-compactor --once` once per log of `logs` and, at a
    /// moment drawn from `rng` (0 to 3 s later, printed), `kill -9`s
    /// `victim` while they run; returns them, running.
    #[allow(clippy::print_stderr)] // the moment, to replay a failure
    pub fn compactors_while_killing(&self, victim: &mut Child, logs: &[&str], rng: &mut impl rand::Rng) -> Vec<Child> {
        let others = logs.iter().map(|log| self.spawn("inferlog-compactor", &["--once"], log, &[])).collect();
        let kill_after = std::time::Duration::from_millis(rng.gen_range(0..3_000));
        eprintln!("killed {kill_after:?} after {logs:?} started");
        std::thread::sleep(kill_after);
        victim.kill().expect("kill -9");
        let _ = victim.wait();
        others
    }

    /// Runs `binary` to completion: its exit code and stdout.
    pub fn run(&self, binary: &str, args: &[&str], log: &str) -> (i32, String) {
        let out: Output = self.command(binary, args, log, &[]).output().expect("run");
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// Replaces `from` with `to` in this scenario's config file.
    pub fn rewrite_config(&self, from: &str, to: &str) {
        let text = std::fs::read_to_string(&self.config).expect("read config");
        assert!(text.contains(from), "the config has no {from:?}");
        std::fs::write(&self.config, text.replace(from, to)).expect("write config");
    }

    /// Runs SQL in this scenario's Postgres schema; rows as tab-separated lines.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([&postgres_url(), "-X", "-q", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!("SET search_path TO \"{}\"; {sql}", self.schema))
            .output()
            .expect("psql");
        assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }

    /// The objects under this scenario's prefix as (key, size), read with boto3.
    pub fn s3_objects(&self) -> Vec<(String, u64)> {
        let script = "import sys, boto3\n\
            s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='inferlog', aws_secret_access_key=sys.argv[3])\n\
            for page in s3.get_paginator('list_objects_v2').paginate(Bucket='inferlog-cold', Prefix=sys.argv[2]):\n\
            \x20   for o in page.get('Contents', []): print(o['Key'], o['Size'])\n";
        let out = Command::new("python3").args(["-c", script, &s3_endpoint(), &self.prefix, &s3_secret()]).output().expect("python3");
        assert!(out.status.success(), "listing s3: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.rsplit_once(' ').map(|(k, s)| (k.to_owned(), s.parse().unwrap_or(0)))).collect()
    }

    /// Writes `bytes` under `key` in the cold bucket, with boto3 (as another tool would).
    pub fn s3_put(&self, key: &str, bytes: &[u8]) {
        use std::io::Write as _;
        let script = "import sys, boto3\n\
            s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='inferlog', aws_secret_access_key=sys.argv[3])\n\
            s3.put_object(Bucket='inferlog-cold', Key=sys.argv[2], Body=sys.stdin.buffer.read())\n";
        let mut child = Command::new("python3")
            .args(["-c", script, &s3_endpoint(), key, &s3_secret()])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        child.stdin.take().expect("stdin").write_all(bytes).expect("write body");
        let out = child.wait_with_output().expect("python3");
        assert!(out.status.success(), "writing s3: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Reads every archive object with pyarrow (`tests/scripts/read_archive.py`).
    pub fn read_archive(&self, sample: usize) -> serde_json::Value {
        read_archive_at(&self.prefix, sample)
    }

    /// SHA-256 of every object under this scenario's prefix, by key, read with boto3.
    pub fn s3_digests(&self) -> std::collections::BTreeMap<String, String> {
        let script = "import sys, hashlib, boto3\n\
            s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='inferlog', aws_secret_access_key=sys.argv[3])\n\
            for page in s3.get_paginator('list_objects_v2').paginate(Bucket='inferlog-cold', Prefix=sys.argv[2]):\n\
            \x20   for o in page.get('Contents', []):\n\
            \x20       body = s3.get_object(Bucket='inferlog-cold', Key=o['Key'])['Body'].read()\n\
            \x20       print(o['Key'], hashlib.sha256(body).hexdigest())\n";
        let out = Command::new("python3").args(["-c", script, &s3_endpoint(), &self.prefix, &s3_secret()]).output().expect("python3");
        assert!(out.status.success(), "reading s3: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.rsplit_once(' ').map(|(k, d)| (k.to_owned(), d.to_owned()))).collect()
    }

    /// Hot rows per day: (day, rows).
    pub fn hot_days(&self) -> Vec<(String, u64)> {
        clickhouse(&format!("SELECT toString(day), count() FROM {} GROUP BY day ORDER BY day", self.qualified_table()))
            .lines()
            .filter_map(|l| l.split_once('\t').map(|(d, n)| (d.to_owned(), n.parse().unwrap_or(0))))
            .collect()
    }

    /// Everything the compactor leaves behind, without times, ids or this
    /// scenario's names: for comparing two runs.
    pub fn end_state(&self) -> String {
        let strip = |s: String| s.replace(&self.prefix, "<prefix>/").replace(&self.qualified_table(), "<table>");
        let mut state = String::new();
        state += &self.psql("SELECT day, state, hot_rows, fingerprint, objects, bytes, last_error FROM compactor_days ORDER BY day");
        state += "\n--manifest\n";
        state += &self.psql("SELECT object_key, day, rows, bytes, sha256, schema_version FROM cold_manifest ORDER BY object_key");
        state += "\n--aggregates\n";
        state += &self.psql("SELECT md5(string_agg(t::text, '|' ORDER BY t::text)), count(*) FROM (SELECT * FROM daily_aggregates) s, LATERAL (SELECT (s.day, s.business_line, s.model_name, s.model_version, s.input_bucket, s.output_bucket, s.requests, s.errors, s.input_tokens, s.output_tokens, s.cache_hits, s.cache_prefix_tokens, s.total_latency_p50_ms, s.total_latency_p99_ms, s.ttft_p95_ms, s.decode_p99_ms, s.total_latency_hist, s.decode_hist) AS t) x");
        state += "\n--series\n";
        state += &self.psql("SELECT md5(string_agg(s::text, '|' ORDER BY s::text)), count(*) FROM daily_series s");
        state += "\n--waste\n";
        state += &self.psql("SELECT md5(string_agg(s::text, '|' ORDER BY s::text)), count(*) FROM daily_waste s");
        state += &self.psql("SELECT md5(string_agg(s::text, '|' ORDER BY s::text)), count(*) FROM daily_outputs s");
        state += "\n--hourly\n";
        state += &self.psql("SELECT md5(string_agg(t::text, '|' ORDER BY t::text)), count(*) FROM (SELECT * FROM hourly_aggregates) s, LATERAL (SELECT (s.hour, s.day, s.business_line, s.model_name, s.model_version, s.requests, s.errors, s.input_tokens, s.output_tokens, s.cache_prefix_tokens, s.cost_usd, s.peak_minute, s.peak_minute_requests, s.peak_minute_tokens, s.total_latency_hist, s.decode_hist) AS t) x");
        state += "\n--errors\n";
        state += &self.psql("SELECT md5(string_agg(t::text, '|' ORDER BY t::text)), count(*), sum(s.errors) FROM daily_errors s, LATERAL (SELECT (s.day, s.business_line, s.model_name, s.model_version, s.input_bucket, s.error_code, s.error_name, s.error_stage, s.errors) AS t) x");
        state += "\n--audit\n";
        state +=
            &self.psql("SELECT tier, unit, action, rows, bytes, policy, dry_run, actor, detail FROM retention_audit ORDER BY tier, unit, action");
        state += "\n--objects\n";
        for (key, size) in self.s3_objects() {
            state += &format!("{key} {size}\n");
        }
        state += "--hot\n";
        for (day, rows) in self.hot_days() {
            state += &format!("{day} {rows}\n");
        }
        strip(state)
    }
}

/// Every archive object under `prefix` of the test bucket, read with
/// pyarrow (`tests/scripts/read_archive.py`): key, rows, request ids, a
/// sample of `sample` rows, …
pub fn read_archive_at(prefix: &str, sample: usize) -> serde_json::Value {
    let script = repo_root().join("tests/scripts/read_archive.py");
    let out = Command::new("python3").arg(script).args([&s3_endpoint(), "inferlog-cold", prefix, &sample.to_string()]).output().expect("python3");
    assert!(out.status.success(), "read_archive.py: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}
