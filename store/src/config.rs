//! The config tables of the stores every component shares: `[clickhouse]`,
//! `[postgres]`, `[cold]` and `[retention]`; and the daemons' own
//! `[ingest]`, `[service_metrics]` (ingest's live metrics), `[compactor]`
//! and `[sampling]` (the compactor's archive), so that every table's type (with
//! [`crate::kafka`], [`crate::cost`], [`crate::budget`] and the schema's
//! `[schema]`) is in reach without building a daemon: the example config
//! is generated from them. Secrets (passwords, the S3
//! secret key) come from the environment or files named here, never from
//! values in the file or the command line.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::model::keep_field::{FieldKind, KeepField};
use crate::policy::Policy;

/// Reads a secret from `env`, else from `file`, else none.
fn secret(env: &str, file: Option<&PathBuf>, what: &str) -> Result<Option<String>, StoreError> {
    if let Ok(value) = std::env::var(env) {
        return Ok(Some(value));
    }
    match file {
        Some(path) => std::fs::read_to_string(path)
            .map(|p| Some(p.trim_end_matches(['\n', '\r']).to_owned()))
            .map_err(|e| StoreError::Config(format!("cannot read {what} {}: {e}", path.display()))),
        None => Ok(None),
    }
}

/// A ClickHouse database or table name (it is spliced into DDL).
pub fn identifier(value: &str, what: &str) -> Result<(), StoreError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !value.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(StoreError::Config(format!("{what} = {value:?} must be an identifier of [A-Za-z0-9_]")))
    }
}

/// The `[clickhouse]` table: the hot tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClickHouseConfig {
    /// HTTP interface. Default: "http://127.0.0.1:8123".
    pub url: String,
    /// Database, created if missing. Default: "inferlog".
    pub database: String,
    /// Table of hot rows, created if missing. Default: "inference_logs".
    pub table: String,
    /// Table of rejected messages (reason, field, source offset), created if missing. Default: "inference_rejects".
    pub rejects_table: String,
    /// User. Default: "default". The password comes from INFERLOG_CLICKHOUSE_PASSWORD or `password_file`.
    pub user: String,
    /// File holding the password. Default: none.
    pub password_file: Option<PathBuf>,
    /// How long ingest waits for one INSERT to be sent and answered; past
    /// it the attempt has failed, and its retry first ends it on the
    /// server and checks whether it landed. Default: "60s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub request_timeout: Duration,
    /// Make each hot-table part durable on disk (fsync) before ClickHouse
    /// acknowledges the insert, so a host power loss cannot take a part
    /// whose offset ingest then committed. Applied where the server has
    /// the MergeTree setting `fsync_after_insert` (21.x on; 18.16 has
    /// none: docs/operations.md, failure model). Default: true.
    pub fsync_after_insert: bool,
    /// The ClickHouse cluster (its `remote_servers` name) the hot tier
    /// lives on: ingest creates each table `ON CLUSTER` as a replicated
    /// `<table>_local` per shard and a `Distributed` `<table>` over them,
    /// and writes each Kafka partition's rows to its shard's local table;
    /// readers read `<table>` at `url` (any server of the cluster). None:
    /// one server at `url`. Default: none.
    pub cluster: Option<String>,
    /// The cluster's shards, with `cluster`: each shard's replicas and the
    /// Kafka partitions it stores (docs/scaling.md). Default: none.
    pub shards: Vec<ShardConfig>,
    /// Replicas of its shard an INSERT must reach before ingest takes it as
    /// written and commits its offsets, with `cluster`; 0: a majority of
    /// the shard's replicas. Default: 0.
    pub insert_quorum: u32,
}

/// One shard of `[clickhouse] cluster`, as `[[clickhouse.shards]]`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ShardConfig {
    /// The HTTP URL of each replica of the shard; ingest writes to the
    /// first that answers. Default: none.
    pub replicas: Vec<String>,
    /// The Kafka partitions (of every topic ingest reads) whose rows this
    /// shard stores: a partition's rows, its retries and its replay
    /// lookups always meet the same shard. A partition stays on its shard
    /// for good; one no shard lists is refused when it is assigned.
    /// Default: none.
    pub partitions: Vec<u16>,
}

impl Default for ClickHouseConfig {
    fn default() -> Self {
        ClickHouseConfig {
            url: "http://127.0.0.1:8123".into(),
            database: "inferlog".into(),
            table: "inference_logs".into(),
            rejects_table: "inference_rejects".into(),
            user: "default".into(),
            password_file: None,
            request_timeout: Duration::from_secs(60),
            fsync_after_insert: true,
            cluster: None,
            shards: Vec::new(),
            insert_quorum: 0,
        }
    }
}

/// Environment variable holding the ClickHouse password.
pub const CLICKHOUSE_PASSWORD_ENV: &str = "INFERLOG_CLICKHOUSE_PASSWORD";

impl ClickHouseConfig {
    /// The password from `INFERLOG_CLICKHOUSE_PASSWORD`, else `password_file`, else none.
    pub fn password(&self) -> Result<Option<String>, StoreError> {
        secret(CLICKHOUSE_PASSWORD_ENV, self.password_file.as_ref(), "clickhouse.password_file")
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        identifier(&self.database, "clickhouse.database")?;
        identifier(&self.table, "clickhouse.table")?;
        identifier(&self.rejects_table, "clickhouse.rejects_table")?;
        let Some(cluster) = &self.cluster else {
            if !self.shards.is_empty() {
                return Err(StoreError::Config("clickhouse.shards is set without clickhouse.cluster".into()));
            }
            return Ok(());
        };
        identifier(cluster, "clickhouse.cluster")?;
        if self.shards.is_empty() {
            return Err(StoreError::Config(format!("clickhouse.cluster = {cluster:?} needs its [[clickhouse.shards]]")));
        }
        let mut owner: HashMap<u16, usize> = HashMap::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let n = i + 1;
            if shard.replicas.is_empty() {
                return Err(StoreError::Config(format!("clickhouse.shards[{n}] lists no replicas")));
            }
            if self.insert_quorum as usize > shard.replicas.len() {
                return Err(StoreError::Config(format!(
                    "clickhouse.insert_quorum = {} is more than the {} replicas of clickhouse.shards[{n}]",
                    self.insert_quorum,
                    shard.replicas.len()
                )));
            }
            for p in &shard.partitions {
                if let Some(other) = owner.insert(*p, n) {
                    return Err(StoreError::Config(format!("Kafka partition {p} is in clickhouse.shards[{other}] and clickhouse.shards[{n}]")));
                }
            }
        }
        Ok(())
    }

    /// The shard (0-based) storing Kafka partition `partition`; always 0
    /// on one server; `None` on a cluster whose shards do not list it.
    pub fn shard_of(&self, partition: u16) -> Option<usize> {
        if self.cluster.is_none() {
            return Some(0);
        }
        self.shards.iter().position(|s| s.partitions.contains(&partition))
    }

    /// Replicas an INSERT into `shard` must reach: `insert_quorum`, else a
    /// majority of the shard's replicas.
    pub fn quorum(&self, shard: usize) -> usize {
        let replicas = self.shards.get(shard).map_or(1, |s| s.replicas.len());
        if self.insert_quorum > 0 {
            self.insert_quorum as usize
        } else {
            replicas / 2 + 1
        }
    }

    /// Replicas of `shard` that must answer, and agree, before a day read
    /// from it counts: enough that any of them shares every insert's
    /// quorum (read + write quorum > replicas), so they cannot all miss
    /// a row that was acknowledged. With the default majority quorum a
    /// shard of two replicas needs one answer; with `insert_quorum = 1`,
    /// both.
    pub fn read_quorum(&self, shard: usize) -> usize {
        let replicas = self.shards.get(shard).map_or(1, |s| s.replicas.len());
        replicas + 1 - self.quorum(shard).min(replicas)
    }

    /// A client for this server (not bound to a database).
    pub fn client(&self) -> Result<clickhouse::Client, StoreError> {
        self.client_at(&self.url)
    }

    /// A client for the server at `url` (a replica of a shard), with this
    /// config's user and password.
    pub fn client_at(&self, url: &str) -> Result<clickhouse::Client, StoreError> {
        let mut client = clickhouse::Client::default()
            .with_url(url)
            .with_user(&self.user)
            // 18.16 does not send the column types the validation needs.
            .with_validation(false)
            .with_compression(clickhouse::Compression::None);
        if let Some(password) = self.password()? {
            client = client.with_password(password);
        }
        Ok(client)
    }
}

/// The `[postgres]` table: the aggregates tier and the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// Connection URL without the password. Default: "postgres://postgres@127.0.0.1:5432/inferlog".
    pub url: String,
    /// Schema holding inferlog's tables, created if missing. Default: "public".
    pub schema: String,
    /// File holding the password; INFERLOG_POSTGRES_PASSWORD takes precedence. Default: none.
    pub password_file: Option<PathBuf>,
    /// Connections per process. Default: 4.
    pub max_connections: u32,
    /// How long to wait for a connection. Default: "10s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub connect_timeout: Duration,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: "postgres://postgres@127.0.0.1:5432/inferlog".into(),
            schema: "public".into(),
            password_file: None,
            max_connections: 4,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Environment variable holding the Postgres password.
pub const POSTGRES_PASSWORD_ENV: &str = "INFERLOG_POSTGRES_PASSWORD";

impl PostgresConfig {
    pub fn password(&self) -> Result<Option<String>, StoreError> {
        secret(POSTGRES_PASSWORD_ENV, self.password_file.as_ref(), "postgres.password_file")
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        identifier(&self.schema, "postgres.schema")?;
        if !(self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")) {
            return Err(StoreError::Config(format!("postgres.url {:?} must start with postgres://", self.url)));
        }
        if self.max_connections < 2 {
            return Err(StoreError::Config("postgres.max_connections must be at least 2 (one holds the day lock)".into()));
        }
        Ok(())
    }
}

/// The `[cold]` table: where Parquet archives go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ColdConfig {
    /// `s3://bucket/prefix/` or `file:///absolute/dir/`. Default: "file:///var/lib/inferlog/cold/".
    pub url: String,
    /// S3 endpoint for S3-compatible servers (MinIO, SeaweedFS, Garage, Ceph); empty means AWS. Default: "".
    pub endpoint: String,
    /// S3 region. Default: "us-east-1".
    pub region: String,
    /// Allow plain-HTTP endpoints (a loopback test server). Default: false.
    pub allow_http: bool,
    /// S3 access key id; AWS_ACCESS_KEY_ID takes precedence. Default: none.
    pub access_key_id: Option<String>,
    /// File holding the S3 secret key; AWS_SECRET_ACCESS_KEY takes precedence. Default: none.
    pub secret_access_key_file: Option<PathBuf>,
    /// Rows per Parquet row group: the unit a scan reads or skips. Default: 262144.
    pub row_group_rows: usize,
    /// Rows per object; a larger day is split into `part-NNNN` objects. Default: 4000000.
    pub object_max_rows: u64,
    /// ZSTD level of the Parquet pages (1-22); on generated days level 1 was both faster and smaller than 3. Default: 1.
    pub zstd_level: i32,
    /// Parts of a multipart upload sent at once. Default: 4.
    pub upload_concurrency: usize,
    /// Sign each S3 request's body (SigV4 payload hash). Off, the body is sent
    /// as UNSIGNED-PAYLOAD, which S3 accepts: every object is read back and
    /// checked against its SHA-256 before a day may leave the hot tier, which
    /// covers what signing the payload would, without a second hash pass
    /// over every byte written. Default: false.
    pub sign_payload: bool,
}

impl Default for ColdConfig {
    fn default() -> Self {
        ColdConfig {
            url: "file:///var/lib/inferlog/cold/".into(),
            endpoint: String::new(),
            region: "us-east-1".into(),
            allow_http: false,
            access_key_id: None,
            secret_access_key_file: None,
            row_group_rows: 262_144,
            object_max_rows: 4_000_000,
            zstd_level: 1,
            upload_concurrency: 4,
            sign_payload: false,
        }
    }
}

impl ColdConfig {
    /// The S3 secret key from AWS_SECRET_ACCESS_KEY, else `secret_access_key_file`.
    pub fn secret_access_key(&self) -> Result<Option<String>, StoreError> {
        secret("AWS_SECRET_ACCESS_KEY", self.secret_access_key_file.as_ref(), "cold.secret_access_key_file")
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        ColdLocation::parse(&self.url)?;
        if !(1024..=16_777_216).contains(&self.row_group_rows) {
            return Err(StoreError::Config("cold.row_group_rows must be 1024..=16777216".into()));
        }
        if self.object_max_rows < self.row_group_rows as u64 {
            return Err(StoreError::Config("cold.object_max_rows must be at least cold.row_group_rows".into()));
        }
        if !(1..=22).contains(&self.zstd_level) || self.upload_concurrency == 0 {
            return Err(StoreError::Config("cold.zstd_level must be 1..=22 and cold.upload_concurrency > 0".into()));
        }
        Ok(())
    }
}

/// The `[retention]` table: how long each tier keeps a day. Each is a
/// number of days or "forever".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Raw rows in ClickHouse. Default: 7.
    pub hot_days: Policy,
    /// Daily aggregates in Postgres. Default: 365.
    pub aggregate_days: Policy,
    /// Parquet objects in the cold store. Default: 365.
    pub cold_days: Policy,
    /// How often `inferlog-retention enforce --daemon` enforces. Default: "1h".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub interval: Duration,
    /// Address of `/metrics` and `/healthz` of `inferlog-retention enforce --daemon`; empty disables them. Default: "127.0.0.1:9466".
    pub metrics_addr: String,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            hot_days: Policy::Days(7),
            aggregate_days: Policy::Days(365),
            cold_days: Policy::Days(365),
            interval: Duration::from_secs(3600),
            metrics_addr: "127.0.0.1:9466".into(),
        }
    }
}

impl RetentionConfig {
    /// Ingest rejects events older than `max_event_age`; if that were longer
    /// than the hot retention, a late event could land in a day already
    /// archived and released, and be lost to the archive.
    ///
    /// The archive and the aggregates must outlive the hot rows: a day is
    /// released from the hot tier only once both hold it, so a shorter
    /// `cold_days` or `aggregate_days` would delete them while the day is
    /// still hot, and the day could then never be released.
    pub fn validate(&self, max_event_age: Duration) -> Result<(), StoreError> {
        for (name, policy) in [("cold_days", self.cold_days), ("aggregate_days", self.aggregate_days)] {
            if !policy.outlives(self.hot_days) {
                return Err(StoreError::Config(format!(
                    "retention.{name} ({policy}) must be at least retention.hot_days ({}): a day still in the hot tier would lose its {} and could never be released",
                    self.hot_days,
                    if name == "cold_days" { "archive" } else { "aggregates" }
                )));
            }
        }
        if let Policy::Days(days) = self.hot_days {
            if max_event_age > Duration::from_secs(u64::from(days) * 86_400) {
                return Err(StoreError::Config(format!(
                    "schema.max_event_age ({}) must not exceed retention.hot_days ({days}): a late event would land in a day already released from the hot tier",
                    humantime::format_duration(max_event_age)
                )));
            }
        }
        Ok(())
    }
}

/// Where the archive lives, parsed from `cold.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColdLocation {
    S3 { bucket: String, prefix: String },
    Local { dir: std::path::PathBuf },
}

impl ColdLocation {
    pub fn parse(url: &str) -> Result<ColdLocation, StoreError> {
        let parsed = url::Url::parse(url).map_err(|e| StoreError::Config(format!("cold.url {url:?}: {e}")))?;
        match parsed.scheme() {
            "s3" => {
                let bucket = parsed.host_str().unwrap_or_default().to_owned();
                if bucket.is_empty() {
                    return Err(StoreError::Config(format!("cold.url {url:?}: no bucket")));
                }
                let prefix = parsed.path().trim_matches('/').to_owned();
                Ok(ColdLocation::S3 { bucket, prefix })
            }
            "file" => {
                let dir = parsed.to_file_path().map_err(|()| StoreError::Config(format!("cold.url {url:?}: not an absolute file path")))?;
                Ok(ColdLocation::Local { dir })
            }
            other => Err(StoreError::Config(format!("cold.url {url:?}: scheme {other} is not s3 or file"))),
        }
    }
}

/// The `[ingest]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Flush when the batch holds this many rows and rejects. Every insert
    /// writes a part per day it holds, so a larger batch makes fewer, larger
    /// parts for ClickHouse to write and merge; ingest holds up to two
    /// batches' bytes (one filling, one being written). Default: 200000.
    pub batch_max_rows: usize,
    /// Flush when the batch holds this many bytes: rows as encoded for
    /// ClickHouse (about 330 bytes each) and rejected payloads. Default: 67108864 (64 MiB).
    pub batch_max_bytes: usize,
    /// Flush a batch at the latest this long after its first message. Default: "1s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub batch_max_age: Duration,
    /// A batch of at least this many rows and rejects is flushed as soon as
    /// the source has had nothing new for 100ms (a backlog or a burst has
    /// been read to its end) instead of waiting out `batch_max_age`; 0 turns
    /// this off. Smaller batches still wait, so a trickle of events never
    /// becomes a trickle of small inserts. The exception is the tail of a
    /// backlog: the batch right after a full one is flushed when the source
    /// goes quiet, whatever its size. Default: 10000.
    pub flush_when_caught_up_rows: usize,
    /// How many recent request ids are remembered to drop producer retries. Default: 1000000.
    pub dedup_window: usize,
    /// First retry delay after a failed insert or produce; doubles up to `retry_max_backoff`. Default: "200ms".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_initial_backoff: Duration,
    /// Longest retry delay. Default: "10s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_max_backoff: Duration,
    /// On SIGTERM/SIGINT, how long the final flush and commit may take before exiting non-zero. Default: "30s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub shutdown_timeout: Duration,
    /// Address of `/metrics` and `/healthz`; empty disables them. Default: "127.0.0.1:9464".
    pub metrics_addr: String,
    /// Tokio worker threads: the pipeline and the writer task run on them,
    /// broker round trips run on blocking threads beside them. Default: 2.
    pub worker_threads: usize,
    /// Threads that validate and normalize the messages librdkafka has
    /// ready, a chunk at a time, while the pipeline waits; 1 normalizes on
    /// the pipeline's own thread. Default: 2.
    pub normalize_threads: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            batch_max_rows: 200_000,
            batch_max_bytes: 64 * 1024 * 1024,
            batch_max_age: Duration::from_secs(1),
            flush_when_caught_up_rows: 10_000,
            dedup_window: 1_000_000,
            retry_initial_backoff: Duration::from_millis(200),
            retry_max_backoff: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            metrics_addr: "127.0.0.1:9464".into(),
            worker_threads: 2,
            normalize_threads: 2,
        }
    }
}

/// The `[otlp]` table: which spans of a topic encoded as OTLP
/// (`kafka.encodings`) are inference requests, and how their attributes
/// map to the contract's fields (docs/contract.md, "OTLP spans").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// A span with one of these names is an inference request. Default:
    /// ["llm_request"] (vLLM's request span).
    pub span_names: Vec<String>,
    /// A span carrying one of these attributes is an inference request.
    /// Default: the token counts of vLLM, the GenAI conventions and the
    /// older `llm.*` names ("gen_ai.usage.input_tokens",
    /// "gen_ai.usage.output_tokens", "gen_ai.usage.prompt_tokens",
    /// "gen_ai.usage.completion_tokens", "llm.token_count.prompt",
    /// "llm.token_count.completion", "llm.usage.prompt_tokens",
    /// "llm.usage.completion_tokens"). Other spans are counted and skipped.
    pub match_attributes: Vec<String>,
    /// The span or resource attribute that names the business line (the
    /// span's own first). Default: "inferlog.business_line".
    pub business_line_attribute: String,
    /// `error_code` of a span whose status is ERROR and that names no code
    /// (`inferlog.error_code`, or an `error.type` that is a name of the
    /// error dictionary). Default: 1004 (engine_error).
    pub error_code: i32,
    /// `error_stage` of such a span when it names none
    /// (`inferlog.error_stage`): where the span saw the error. Default: "gateway".
    pub error_stage: String,
    /// More attributes to read, by attribute name (span or resource): the
    /// contract field each fills, or one of its unit forms
    /// ("queue_wait_s"). They take precedence over the built-in table.
    /// Default: {}.
    pub attributes: BTreeMap<String, String>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            span_names: vec!["llm_request".into()],
            match_attributes: [
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "gen_ai.usage.prompt_tokens",
                "gen_ai.usage.completion_tokens",
                "llm.token_count.prompt",
                "llm.token_count.completion",
                "llm.usage.prompt_tokens",
                "llm.usage.completion_tokens",
            ]
            .map(String::from)
            .to_vec(),
            business_line_attribute: "inferlog.business_line".into(),
            error_code: 1004,
            error_stage: "gateway".into(),
            attributes: BTreeMap::new(),
        }
    }
}

impl OtlpConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.span_names.is_empty() && self.match_attributes.is_empty() {
            return Err(StoreError::Config("otlp.span_names and otlp.match_attributes are both empty: no span would be an inference request".into()));
        }
        if self.business_line_attribute.trim().is_empty() {
            return Err(StoreError::Config("otlp.business_line_attribute must be set".into()));
        }
        if inferlog_schema::ErrorStage::parse(&self.error_stage).is_none() {
            return Err(StoreError::Config(format!("otlp.error_stage {:?}: one of gateway, queue, prefill, decode, postprocess", self.error_stage)));
        }
        if self.error_code == 0 {
            return Err(StoreError::Config("otlp.error_code must not be 0 (0 means success)".into()));
        }
        if let Some((attribute, field)) = self.attributes.iter().find(|(_, field)| !inferlog_schema::contract::accepts_name(field)) {
            return Err(StoreError::Config(format!(
                "otlp.attributes.{attribute:?} = {field:?}: not a field of the contract (or a unit form of one)"
            )));
        }
        Ok(())
    }
}

/// The `[service_metrics]` table: the live service metrics ingest exports
/// on `/metrics` from every stored event (request duration, TTFT, TPOT,
/// queue, prefill and decode histograms; requests by status and error
/// code; tokens by type), labelled by model, version, business line and
/// request type. Every label has a cap on its distinct values: a value past
/// it counts under `other`, and `inferlog_service_label_overflow_total`
/// says how often. See docs/contract.md, "Live service metrics".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceMetricsConfig {
    /// Export the service metrics. Default: true.
    pub enabled: bool,
    /// Label the token counter with a bucket of the hashed user id (the
    /// only user dimension Prometheus sees), this many buckets; 0 turns the
    /// label off. Default: 0.
    pub user_buckets: u16,
    /// Distinct `model_name` values at most. Default: 50.
    pub max_models: usize,
    /// Distinct `model_version` values at most. Default: 100.
    pub max_model_versions: usize,
    /// Distinct `business_line` values at most. Default: 50.
    pub max_business_lines: usize,
    /// Distinct `request_type` values at most. Default: 20.
    pub max_request_types: usize,
    /// Distinct `error_code` values at most. Default: 50.
    pub max_error_codes: usize,
}

impl Default for ServiceMetricsConfig {
    fn default() -> Self {
        ServiceMetricsConfig {
            enabled: true,
            user_buckets: 0,
            max_models: 50,
            max_model_versions: 100,
            max_business_lines: 50,
            max_request_types: 20,
            max_error_codes: 50,
        }
    }
}

impl ServiceMetricsConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        let caps = [self.max_models, self.max_model_versions, self.max_business_lines, self.max_request_types, self.max_error_codes];
        if caps.iter().any(|&c| c == 0 || c > 10_000) {
            return Err(StoreError::Config("service_metrics.max_* must be 1..=10000 (a cap of distinct label values)".into()));
        }
        if self.user_buckets > 1000 {
            return Err(StoreError::Config(format!("service_metrics.user_buckets = {} must be at most 1000", self.user_buckets)));
        }
        Ok(())
    }
}

/// The `[compactor]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CompactorConfig {
    /// Time between two passes of the daemon. Default: "5m".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub interval: Duration,
    /// A UTC day is closed, and compacted, once it ended this long ago.
    /// Rows arriving later still land in ClickHouse; the next pass sees the
    /// day's fingerprint change and archives and aggregates it again. Default: "1h".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub lateness: Duration,
    /// Address of `/metrics` and `/healthz`; empty disables them. Default: "127.0.0.1:9465".
    pub metrics_addr: String,
    /// ClickHouse's memory for sorting one day before spilling to disk, in bytes. Default: 1073741824.
    pub sort_memory_bytes: u64,
}

impl Default for CompactorConfig {
    fn default() -> Self {
        CompactorConfig {
            interval: Duration::from_secs(300),
            lateness: Duration::from_secs(3600),
            metrics_addr: "127.0.0.1:9465".into(),
            sort_memory_bytes: 1 << 30,
        }
    }
}

/// The `[sampling]` table: which rows of a day the archive keeps. Off by
/// default. The hot tier keeps every row and the aggregates count every
/// row; sampling applies when a day is archived. Kept always: errors,
/// truncated outputs, slow requests and long ones (by the thresholds of
/// their group); the rest of each stratum (business line × model ×
/// version × input bucket × hour) at `base_rate`, at least
/// `min_per_stratum` rows, with weights that add up to the stratum's
/// exact row count. See docs/contract.md, "Sampled archive".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    /// Sample the archive. Default: false.
    pub enabled: bool,
    /// Share of a stratum's ordinary rows (no error, not truncated, not slow,
    /// not long) the archive keeps, 0 < rate <= 1. Default: 0.1.
    pub base_rate: f64,
    /// Ordinary rows kept per stratum at least, its tail rows aside (all of
    /// them if it has fewer): the smallest hashes. Default: 20.
    pub min_per_stratum: u64,
    /// The quantile of a group's history above which a request is `slow`. Default: 0.99.
    pub quantile: f64,
    /// Days of aggregates before the archived day the thresholds are derived from. Default: 7.
    pub history_days: u32,
    /// Requests a group's history must hold for its thresholds to come
    /// from it; a group with fewer uses the static thresholds. Default: 200.
    pub min_history_rows: u64,
    /// Static threshold of total latency (ms) for a group without history. Default: 30000.0.
    pub slow_total_latency_ms: f64,
    /// Static threshold of time to first token (ms) for a group without history. Default: 5000.0.
    pub slow_ttft_ms: f64,
    /// A request with more output tokens is `long` (the aggregates keep no
    /// token histograms, so this one is static). Default: 4096.
    pub long_output_tokens: u32,
    /// A request with more input tokens is `long`. Default: 32768.
    pub long_input_tokens: u32,
    /// Seed of the hash of `request_id` that picks the ordinary rows kept:
    /// the same seed keeps the same rows. Default: 0.
    pub seed: u64,
    /// More rows to keep whole, weight 1, each rule under its own
    /// `sample_reason`: a row meeting every condition of a rule is kept
    /// (after the built-in reasons; the first matching rule names it), e.g.
    /// `[[sampling.keep]]` `reason = "cache_miss_long"`, `when = [{ field =
    /// "cache_hit", op = "eq", value = false }, { field = "input_tokens", op
    /// = "gt", value = 8000 }]`. Default: none.
    pub keep: Vec<KeepRule>,
}

/// A rule of `[[sampling.keep]]`: rows meeting all of `when` are kept whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeepRule {
    /// The `sample_reason` of the rows it keeps: 1 to 32 of `[a-z0-9_]`,
    /// not a built-in reason (error, truncated, slow, long, sampled, all).
    pub reason: String,
    /// The conditions, all of which a row meets (at least one).
    pub when: Vec<Condition>,
}

/// One condition over a field of the contract: `field op value`. A row
/// without the (optional) field does not meet it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Numbers: input_tokens, output_tokens, total_latency_ms, error_code,
    /// queue_wait_ms, prefill_time_ms, decode_time_ms, ttft_ms, tpot_ms,
    /// gpu_id, batch_size, cache_prefix_tokens, gpu_mem_peak_mb; true or
    /// false: cache_hit, truncated; text: business_line, model_name,
    /// model_version, request_type, tenant, error_stage.
    pub field: String,
    /// One of eq, ne, gt, ge, lt, le (text and true/false: eq, ne).
    pub op: CompareOp,
    pub value: ConditionValue,
}

/// How a [`Condition`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CompareOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

/// The value a [`Condition`] compares with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ConditionValue {
    Bool(bool),
    Number(f64),
    Text(String),
}

/// The reasons the compactor gives itself.
pub const BUILT_IN_REASONS: [&str; 6] = ["error", "truncated", "slow", "long", "sampled", "all"];

impl KeepRule {
    pub fn validate(&self) -> Result<(), StoreError> {
        let name = &self.reason;
        let bad = |why: String| StoreError::Config(format!("sampling.keep reason {name:?}: {why}"));
        if name.is_empty() || name.len() > 32 || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
            return Err(bad("must be 1 to 32 of [a-z0-9_]".into()));
        }
        if BUILT_IN_REASONS.contains(&name.as_str()) {
            return Err(bad("is a built-in reason".into()));
        }
        if self.when.is_empty() {
            return Err(bad("needs at least one condition in `when`".into()));
        }
        for c in &self.when {
            let field = c.field.as_str();
            let Some(kind) = KeepField::parse(field).map(KeepField::kind) else {
                return Err(bad(format!("field {field:?} is not one a rule can test (see the example config)")));
            };
            let ordered = !matches!(c.op, CompareOp::Eq | CompareOp::Ne);
            let fits = match &c.value {
                ConditionValue::Number(v) => kind == FieldKind::Number && v.is_finite(),
                ConditionValue::Bool(_) => kind == FieldKind::Bool && !ordered,
                ConditionValue::Text(_) => kind == FieldKind::Text && !ordered,
            };
            if !fits {
                return Err(bad(format!(
                    "field {field:?}: op {:?} with value {:?} does not fit its kind (numbers: any op; true/false and text: eq, ne)",
                    c.op, c.value
                )));
            }
        }
        Ok(())
    }
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            enabled: false,
            base_rate: 0.1,
            min_per_stratum: 20,
            quantile: 0.99,
            history_days: 7,
            min_history_rows: 200,
            slow_total_latency_ms: 30_000.0,
            slow_ttft_ms: 5_000.0,
            long_output_tokens: 4096,
            long_input_tokens: 32_768,
            seed: 0,
            keep: Vec::new(),
        }
    }
}

impl SamplingConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        if !(self.base_rate > 0.0 && self.base_rate <= 1.0) {
            return Err(StoreError::Config(format!("sampling.base_rate = {} must be in (0, 1]", self.base_rate)));
        }
        if !(self.quantile > 0.0 && self.quantile < 1.0) {
            return Err(StoreError::Config(format!("sampling.quantile = {} must be in (0, 1)", self.quantile)));
        }
        if !(self.slow_total_latency_ms > 0.0 && self.slow_ttft_ms > 0.0) {
            return Err(StoreError::Config("sampling.slow_total_latency_ms and sampling.slow_ttft_ms must be > 0".into()));
        }
        if self.history_days > 366 {
            return Err(StoreError::Config(format!("sampling.history_days = {} must be at most 366", self.history_days)));
        }
        for (i, rule) in self.keep.iter().enumerate() {
            rule.validate()?;
            if self.keep[..i].iter().any(|r| r.reason == rule.reason) {
                return Err(StoreError::Config(format!("sampling.keep reason {:?} is given twice", rule.reason)));
            }
            if i >= 32 {
                return Err(StoreError::Config("sampling.keep: at most 32 rules".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_maps_each_partition_to_one_shard_and_a_majority_quorum() {
        let shard = |replicas: usize, partitions: Vec<u16>| ShardConfig {
            replicas: (0..replicas).map(|r| format!("http://ch-{r}:8123")).collect(),
            partitions,
        };
        let mut c =
            ClickHouseConfig { cluster: Some("c".into()), shards: vec![shard(2, vec![0, 2]), shard(3, vec![1])], ..ClickHouseConfig::default() };
        c.validate().expect("valid");
        assert_eq!((c.shard_of(0), c.shard_of(2), c.shard_of(1), c.shard_of(3)), (Some(0), Some(0), Some(1), None));
        assert_eq!((c.quorum(0), c.quorum(1)), (2, 2), "a majority of 2 and of 3");
        assert_eq!((c.read_quorum(0), c.read_quorum(1)), (1, 2), "any 1 of 2 holds what 2 acknowledged; 2 of 3 meet any 2");
        c.insert_quorum = 1;
        assert_eq!((c.read_quorum(0), c.read_quorum(1)), (2, 3), "a row on one replica: every replica must answer");
        c.insert_quorum = 0;
        assert_eq!(ClickHouseConfig::default().shard_of(7), Some(0), "one server holds every partition");

        c.shards[1].partitions.push(2);
        let e = c.validate().expect_err("partition 2 twice");
        assert!(e.to_string().contains("Kafka partition 2 is in clickhouse.shards[1] and clickhouse.shards[2]"), "{e}");
        c.shards[1].partitions.pop();
        c.insert_quorum = 3;
        assert!(c.validate().expect_err("3 of 2").to_string().contains("clickhouse.insert_quorum = 3"));
        c.insert_quorum = 0;
        c.shards[0].replicas.clear();
        assert!(c.validate().expect_err("no replicas").to_string().contains("clickhouse.shards[1] lists no replicas"));
        let no_cluster = ClickHouseConfig { shards: vec![shard(1, vec![0])], ..ClickHouseConfig::default() };
        assert!(no_cluster.validate().expect_err("shards alone").to_string().contains("without clickhouse.cluster"));
        let no_shards = ClickHouseConfig { cluster: Some("c".into()), ..ClickHouseConfig::default() };
        assert!(no_shards.validate().expect_err("cluster alone").to_string().contains("needs its [[clickhouse.shards]]"));
    }

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        ClickHouseConfig::default().validate().expect("defaults");
        PostgresConfig::default().validate().expect("defaults");
        ColdConfig::default().validate().expect("defaults");
        RetentionConfig::default().validate(Duration::from_secs(7 * 86_400)).expect("defaults");
        let late = RetentionConfig::default().validate(Duration::from_secs(8 * 86_400)).expect_err("8d > 7d");
        assert!(late.to_string().contains("max_event_age"), "{late}");
        let week = Duration::from_secs(7 * 86_400);
        let short = RetentionConfig { cold_days: Policy::Days(6), ..RetentionConfig::default() }.validate(week).expect_err("6 < 7");
        assert!(short.to_string().contains("retention.cold_days (6d)") && short.to_string().contains("hot_days (7d)"), "{short}");
        let short = RetentionConfig { aggregate_days: Policy::Days(3), ..RetentionConfig::default() }.validate(week).expect_err("3 < 7");
        assert!(short.to_string().contains("retention.aggregate_days (3d)"), "{short}");
        let forever = RetentionConfig { hot_days: Policy::Forever, ..RetentionConfig::default() }.validate(week).expect_err("365 < forever");
        assert!(forever.to_string().contains("retention.cold_days"), "{forever}");
        RetentionConfig { hot_days: Policy::Days(7), cold_days: Policy::Days(7), aggregate_days: Policy::Forever, ..RetentionConfig::default() }
            .validate(week)
            .expect("equal and forever outlive 7 days");
        let bad = PostgresConfig { schema: "a;b".into(), ..PostgresConfig::default() }.validate().expect_err("identifier");
        assert!(bad.to_string().contains("postgres.schema"), "{bad}");
        let bad = ColdConfig { url: "ftp://x/".into(), ..ColdConfig::default() }.validate().expect_err("scheme");
        assert!(bad.to_string().contains("ftp"), "{bad}");
        SamplingConfig::default().validate().expect("defaults");
        ServiceMetricsConfig::default().validate().expect("defaults");
        let rule: SamplingConfig = toml::from_str(
            "[[keep]]\nreason = \"cache_miss_long\"\nwhen = [{ field = \"cache_hit\", op = \"eq\", value = false }, { field = \"input_tokens\", op = \"gt\", value = 8000 }]\n",
        )
        .expect("a keep rule");
        rule.validate().expect("valid");
        assert_eq!(rule.keep[0].when[1].value, ConditionValue::Number(8000.0));
        for (toml, why) in [
            ("reason = \"slow\"\nwhen = [{ field = \"ttft_ms\", op = \"gt\", value = 1 }]", "built-in"),
            ("reason = \"x\"\nwhen = []", "at least one condition"),
            ("reason = \"x\"\nwhen = [{ field = \"prompt\", op = \"eq\", value = \"a\" }]", "not one a rule can test"),
            ("reason = \"x\"\nwhen = [{ field = \"cache_hit\", op = \"gt\", value = true }]", "does not fit"),
            ("reason = \"x\"\nwhen = [{ field = \"input_tokens\", op = \"eq\", value = \"8\" }]", "does not fit"),
            ("reason = \"Bad Name\"\nwhen = [{ field = \"ttft_ms\", op = \"gt\", value = 1 }]", "[a-z0-9_]"),
        ] {
            let rule: KeepRule = toml::from_str(toml).expect(toml);
            let e = rule.validate().expect_err(toml);
            assert!(e.to_string().contains(why) && e.to_string().contains("sampling.keep"), "{toml}: {e}");
        }
        let bad = ServiceMetricsConfig { max_models: 0, ..ServiceMetricsConfig::default() }.validate().expect_err("cap 0");
        assert!(bad.to_string().contains("service_metrics.max_"), "{bad}");
        let bad = SamplingConfig { base_rate: 0.0, ..SamplingConfig::default() }.validate().expect_err("rate 0");
        assert!(bad.to_string().contains("sampling.base_rate"), "{bad}");
        let bad = SamplingConfig { quantile: 1.0, ..SamplingConfig::default() }.validate().expect_err("q 1");
        assert!(bad.to_string().contains("sampling.quantile"), "{bad}");
    }
}
