//! Configuration of `inferlog-ingest`: the `[kafka]`, `[clickhouse]` and
//! `[ingest]` tables of the inferlog config file (plus `[schema]`, owned by
//! the schema crate), with `INFERLOG_<TABLE>__<KEY>` overrides. Secrets
//! (the ClickHouse password, the hash key) come from the environment or
//! files, never from this file's values or the command line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use inferlog_schema::config::{load_config_value, section};
use inferlog_schema::ContractConfig;
pub use inferlog_store::config::{ClickHouseConfig, CLICKHOUSE_PASSWORD_ENV};
use serde::{Deserialize, Serialize};

use crate::error::IngestError;

/// How a replica gets its partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Assignment {
    Group,
    Static,
}

/// The `[kafka]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers. Default: "127.0.0.1:9092".
    pub brokers: String,
    /// Topics to consume. Default: ["inference-events"].
    pub topics: Vec<String>,
    /// Consumer group; replicas with the same group share the partitions. Default: "inferlog-ingest".
    pub group_id: String,
    /// How partitions are shared between replicas: "group" (the consumer
    /// group assigns them and rebalances when replicas come and go) or
    /// "static" (this replica reads `partitions`, or every partition, with
    /// offsets still committed under `group_id`; for brokers whose group
    /// coordinator cannot be trusted to expire a crashed member). Default: "group".
    pub assignment: Assignment,
    /// With `assignment = "group"`: librdkafka's `partition.assignment.strategy`.
    /// "range" or "roundrobin" stop the whole group at every rebalance;
    /// "cooperative-sticky" moves only the partitions that change owner
    /// (tested, but one fresh-clone run drained nothing with it, so not yet
    /// the default). Every member of a group must use the same. Default: "range".
    pub assignor: String,
    /// With `assignment = "static"`: the partitions this replica reads; empty means all. Default: [].
    pub partitions: Vec<i32>,
    /// Dead-letter topic for rejected messages. Default: "inference-events-dlq".
    pub dlq_topic: String,
    /// How long the group waits for a silent member before reassigning its partitions. Default: "10s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub session_timeout: Duration,
    /// Longest a fetch waits at the broker for more data (librdkafka
    /// `fetch.wait.max.ms`). Short, because some Kafka-compatible brokers
    /// always wait the full time. Default: "20ms".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub fetch_max_wait: Duration,
    /// Upper bound of messages librdkafka prefetches, in KiB; bounds memory when ClickHouse is slow. Default: 8192.
    pub prefetch_max_kbytes: u32,
    /// How consumer, DLQ producer and admin client connect and authenticate
    /// (protocol, sasl_mechanism, username, password_file, ca_file; the
    /// password itself from INFERLOG_KAFKA_PASSWORD or password_file).
    /// Default: plaintext, no SASL, the system's CAs.
    pub security: KafkaSecurity,
    /// Extra librdkafka properties for consumer and producer (secrets are
    /// refused here: they belong in `security`). Default: none.
    pub options: BTreeMap<String, String>,
}

/// The protocol of the broker listener inferlog connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    fn librdkafka(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "plaintext",
            SecurityProtocol::Ssl => "ssl",
            SecurityProtocol::SaslPlaintext => "sasl_plaintext",
            SecurityProtocol::SaslSsl => "sasl_ssl",
        }
    }

    fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }

    fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

/// Environment variable holding the SASL password (wins over `password_file`).
pub const KAFKA_PASSWORD_ENV: &str = "INFERLOG_KAFKA_PASSWORD";

/// The `[kafka.security]` table. The password is never a value of this
/// file: it comes from `INFERLOG_KAFKA_PASSWORD` or `password_file`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSecurity {
    /// "plaintext", "ssl", "sasl_plaintext" or "sasl_ssl". Default: "plaintext".
    pub protocol: SecurityProtocol,
    /// SASL mechanism: "SCRAM-SHA-512", "SCRAM-SHA-256" or "PLAIN". Default: "SCRAM-SHA-512".
    pub sasl_mechanism: String,
    /// SASL user name. Default: "".
    pub username: String,
    /// File whose content (trimmed) is the SASL password, when `INFERLOG_KAFKA_PASSWORD` is unset. Default: "".
    pub password_file: String,
    /// PEM file of the CA that signed the brokers' certificates; empty means the system's CAs. Default: "".
    pub ca_file: String,
}

impl Default for KafkaSecurity {
    fn default() -> Self {
        KafkaSecurity {
            protocol: SecurityProtocol::Plaintext,
            sasl_mechanism: "SCRAM-SHA-512".into(),
            username: String::new(),
            password_file: String::new(),
            ca_file: String::new(),
        }
    }
}

/// A secret read at start-up: never printed, whatever prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The librdkafka properties of `[kafka.security]`, password resolved.
/// `Debug` shows the password as `<redacted>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSecurity {
    pub properties: Vec<(&'static str, String)>,
    pub password: Option<Secret>,
}

/// librdkafka properties that hold secrets: refused in `kafka.options`.
const SECRET_OPTIONS: [&str; 4] = ["sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret"];

impl KafkaSecurity {
    /// Checks the table and reads the password (environment first, then the file).
    pub fn resolve(&self) -> Result<ClientSecurity, IngestError> {
        let bad = |why: String| IngestError::Config(format!("kafka.security: {why}"));
        let mut properties = vec![("security.protocol", self.protocol.librdkafka().to_owned())];
        if self.protocol.tls() && !self.ca_file.is_empty() {
            if !Path::new(&self.ca_file).is_file() {
                return Err(bad(format!("ca_file {:?} is not a readable file", self.ca_file)));
            }
            properties.push(("ssl.ca.location", self.ca_file.clone()));
        }
        if !self.protocol.sasl() {
            return Ok(ClientSecurity { properties, password: None });
        }
        if !["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"].contains(&self.sasl_mechanism.as_str()) {
            return Err(bad(format!("sasl_mechanism {:?}: one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN", self.sasl_mechanism)));
        }
        if self.username.is_empty() {
            return Err(bad("username must be set for a SASL protocol".into()));
        }
        let password = match std::env::var(KAFKA_PASSWORD_ENV) {
            Ok(p) if !p.is_empty() => p,
            _ if self.password_file.is_empty() => {
                return Err(bad(format!("a SASL protocol needs a password: set {KAFKA_PASSWORD_ENV} or password_file")));
            }
            _ => std::fs::read_to_string(&self.password_file)
                .map_err(|e| bad(format!("password_file {:?}: {e}", self.password_file)))?
                .trim()
                .to_owned(),
        };
        if password.is_empty() {
            return Err(bad(format!("password_file {:?} is empty", self.password_file)));
        }
        properties.push(("sasl.mechanism", self.sasl_mechanism.clone()));
        properties.push(("sasl.username", self.username.clone()));
        Ok(ClientSecurity { properties, password: Some(Secret(password)) })
    }

    /// "SASL_SSL SCRAM-SHA-512" or "PLAINTEXT": for error messages.
    pub fn describe(&self) -> String {
        let protocol = self.protocol.librdkafka().to_ascii_uppercase();
        if self.protocol.sasl() {
            format!("{protocol} {}", self.sasl_mechanism)
        } else {
            protocol
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            topics: vec!["inference-events".into()],
            group_id: "inferlog-ingest".into(),
            assignment: Assignment::Group,
            assignor: "range".into(),
            partitions: Vec::new(),
            dlq_topic: "inference-events-dlq".into(),
            session_timeout: Duration::from_secs(10),
            fetch_max_wait: Duration::from_millis(20),
            prefetch_max_kbytes: 8 * 1024,
            security: KafkaSecurity::default(),
            options: BTreeMap::new(),
        }
    }
}

/// The `[ingest]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Flush when the batch holds this many rows and rejects. Default: 100000.
    pub batch_max_rows: usize,
    /// Flush when the batch holds this many payload bytes. Default: 33554432 (32 MiB).
    pub batch_max_bytes: usize,
    /// Flush a batch at the latest this long after its first message. Default: "1s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub batch_max_age: Duration,
    /// A batch of at least this many rows and rejects is flushed as soon as
    /// the source has had nothing new for 100ms (a backlog or a burst has
    /// been read to its end) instead of waiting out `batch_max_age`; 0 turns
    /// this off. Smaller batches still wait, so a trickle of events never
    /// becomes a trickle of small inserts. Default: 10000.
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
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            batch_max_rows: 100_000,
            batch_max_bytes: 32 * 1024 * 1024,
            batch_max_age: Duration::from_secs(1),
            flush_when_caught_up_rows: 10_000,
            dedup_window: 1_000_000,
            retry_initial_backoff: Duration::from_millis(200),
            retry_max_backoff: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            metrics_addr: "127.0.0.1:9464".into(),
            worker_threads: 2,
        }
    }
}

/// Everything `inferlog-ingest` reads from the config file, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub schema: ContractConfig,
    pub kafka: KafkaConfig,
    pub clickhouse: ClickHouseConfig,
    pub ingest: IngestConfig,
}

impl Config {
    /// Loads the file, applies environment overrides and validates once.
    pub fn load(path: &Path) -> Result<Config, IngestError> {
        let root = load_config_value(Some(path), std::env::vars())?;
        let config = Config {
            schema: section(&root, "schema")?,
            kafka: section(&root, "kafka")?,
            clickhouse: section(&root, "clickhouse")?,
            ingest: section(&root, "ingest")?,
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), IngestError> {
        self.schema.validate()?;
        let k = &self.kafka;
        if k.brokers.trim().is_empty() || k.topics.is_empty() || k.group_id.is_empty() || k.dlq_topic.is_empty() {
            return Err(IngestError::Config("kafka.brokers, topics, group_id and dlq_topic must be set".into()));
        }
        if k.topics.contains(&k.dlq_topic) {
            return Err(IngestError::Config("kafka.dlq_topic must not be one of kafka.topics".into()));
        }
        if self.ingest.worker_threads == 0 {
            return Err(IngestError::Config("ingest.worker_threads must be at least 1".into()));
        }
        if !["cooperative-sticky", "range", "roundrobin"].contains(&k.assignor.as_str()) {
            return Err(IngestError::Config(format!("kafka.assignor {:?}: one of cooperative-sticky, range, roundrobin", k.assignor)));
        }
        if let Some(secret) = k.options.keys().find(|o| SECRET_OPTIONS.contains(&o.as_str()) || *o == "security.protocol") {
            return Err(IngestError::Config(format!(
                "kafka.options.{secret:?}: security settings and secrets belong in [kafka.security] (the password in {KAFKA_PASSWORD_ENV} or a file)"
            )));
        }
        k.security.resolve()?;
        self.clickhouse.validate()?;
        let i = &self.ingest;
        // One INSERT must stay one ClickHouse block (max_insert_block_size,
        // 1048576 rows) to be atomic.
        if !(1..=1_000_000).contains(&i.batch_max_rows) {
            return Err(IngestError::Config("ingest.batch_max_rows must be 1..=1000000".into()));
        }
        if i.batch_max_bytes < 1024 || i.batch_max_age.is_zero() || i.retry_initial_backoff.is_zero() {
            return Err(IngestError::Config("ingest.batch_max_bytes >= 1024, batch_max_age and retry_initial_backoff > 0".into()));
        }
        if !i.metrics_addr.is_empty() {
            i.metrics_addr.parse::<SocketAddr>().map_err(|e| IngestError::Config(format!("ingest.metrics_addr {:?}: {e}", i.metrics_addr)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sasl_password_comes_from_a_file_and_never_shows_in_debug_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kafka.password");
        std::fs::write(&file, "s3cret-pass\n").expect("write");
        let security = KafkaSecurity {
            protocol: SecurityProtocol::SaslSsl,
            username: "inferlog".into(),
            password_file: file.display().to_string(),
            ..KafkaSecurity::default()
        };
        let resolved = security.resolve().expect("resolves");
        assert_eq!(resolved.password.as_ref().map(Secret::expose), Some("s3cret-pass"));
        let shown = format!("{resolved:?} {security:?}");
        assert!(!shown.contains("s3cret-pass") && shown.contains("<redacted>"), "{shown}");
        assert_eq!(security.describe(), "SASL_SSL SCRAM-SHA-512");

        let no_password = KafkaSecurity { password_file: String::new(), ..security.clone() };
        let e = no_password.resolve().expect_err("a SASL protocol needs a password");
        assert!(e.to_string().contains("INFERLOG_KAFKA_PASSWORD"), "{e}");
        let mut options = KafkaConfig::default();
        options.options.insert("sasl.password".into(), "x".into());
        let config =
            Config { schema: ContractConfig::default(), kafka: options, clickhouse: ClickHouseConfig::default(), ingest: IngestConfig::default() };
        let e = config.validate().expect_err("secrets are refused in kafka.options");
        assert!(e.to_string().contains("sasl.password") && !e.to_string().contains("\"x\""), "{e}");
    }

    #[test]
    fn defaults_are_valid_and_unknown_keys_are_refused() {
        let config = Config {
            schema: ContractConfig::default(),
            kafka: KafkaConfig::default(),
            clickhouse: ClickHouseConfig::default(),
            ingest: IngestConfig::default(),
        };
        config.validate().expect("defaults are valid");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[ingest]\nbatch_max_rowz = 5\n").expect("write");
        let unknown = Config::load(&path).expect_err("unknown key");
        assert!(unknown.to_string().contains("batch_max_rowz"), "{unknown}");
        std::fs::write(&path, "[clickhouse]\ntable = \"x; DROP\"\n").expect("write");
        let bad_table = Config::load(&path).expect_err("not an identifier");
        assert!(bad_table.to_string().contains("clickhouse.table"), "{bad_table}");
        std::fs::write(&path, "[kafka]\ntopics = [\"a\"]\ndlq_topic = \"a\"\n[compactor]\nanything = 1\n").expect("write");
        assert!(matches!(Config::load(&path), Err(IngestError::Config(_))), "DLQ equal to a source topic");
        std::fs::write(&path, "[ingest]\nbatch_max_age = \"500ms\"\n[compactor]\nanything = 1\n").expect("write");
        assert_eq!(Config::load(&path).expect("other tables are other commands'").ingest.batch_max_age, Duration::from_millis(500));
    }
}
