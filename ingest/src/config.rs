//! Configuration of `inferlog-ingest`: the `[kafka]`, `[clickhouse]`,
//! `[ingest]`, `[service_metrics]` and `[otlp]` tables of the inferlog config file (plus `[schema]`, owned by
//! the schema crate), with `INFERLOG_<TABLE>__<KEY>` overrides. Secrets
//! (the ClickHouse password, the hash key) come from the environment or
//! files, never from this file's values or the command line.

use std::net::SocketAddr;

use inferlog_schema::ContractConfig;
pub use inferlog_store::config::{
    ClickHouseConfig, ColdConfig, IngestConfig, OtlpConfig, PostgresConfig, RetentionConfig, ServiceMetricsConfig, CLICKHOUSE_PASSWORD_ENV,
};
pub use inferlog_store::kafka::{
    Assignment, ClientSecurity, KafkaConfig, KafkaSecurity, Secret, SecurityProtocol, TopicEncoding, KAFKA_PASSWORD_ENV, SECRET_OPTIONS,
};

use crate::error::IngestError;

inferlog_schema::binary_config! {
    /// Everything `inferlog-ingest` reads from the config file, validated.
    pub struct Config: IngestError {
        schema: ContractConfig,
        kafka: KafkaConfig,
        clickhouse: ClickHouseConfig,
        ingest: IngestConfig,
        service_metrics: ServiceMetricsConfig,
        otlp: OtlpConfig,
        /// Read for `dlq inspect`, which compares the DLQ's oldest message with
        /// `hot_days`; validated by the retention and compactor daemons.
        retention: RetentionConfig,
        /// The catalog, for `dlq replay` (its ledger, lock and audit rows);
        /// the daemon connects to it only for a day at the hot policy's edge
        /// ([`crate::late_days`]).
        postgres: PostgresConfig,
        /// The archive, for `dlq replay` of a day already released from the
        /// hot tier (its rows are looked up there); the daemon never reads it.
        cold: ColdConfig,
    }
}

impl Config {
    /// The one validation step: each table's own checks, then what ties them.
    pub fn validate(&self) -> Result<(), IngestError> {
        self.schema.validate()?;
        let k = &self.kafka;
        if k.brokers.trim().is_empty() || k.topics.is_empty() || k.group_id.is_empty() || k.dlq_topic.is_empty() {
            return Err(IngestError::Config("kafka.brokers, topics, group_id and dlq_topic must be set".into()));
        }
        if k.topics.contains(&k.dlq_topic) {
            return Err(IngestError::Config("kafka.dlq_topic must not be one of kafka.topics".into()));
        }
        if self.ingest.worker_threads == 0 || self.ingest.normalize_threads == 0 {
            return Err(IngestError::Config("ingest.worker_threads and ingest.normalize_threads must be at least 1".into()));
        }
        if !["cooperative-sticky", "range", "roundrobin"].contains(&k.assignor.as_str()) {
            return Err(IngestError::Config(format!("kafka.assignor {:?}: one of cooperative-sticky, range, roundrobin", k.assignor)));
        }
        if let Some(secret) = k.options.keys().find(|o| SECRET_OPTIONS.contains(&o.as_str()) || *o == "security.protocol") {
            return Err(IngestError::Config(format!(
                "kafka.options.{secret:?}: security settings and secrets belong in [kafka.security] (the password in {KAFKA_PASSWORD_ENV} or a file)"
            )));
        }
        if let Some(topic) = k.encodings.keys().find(|t| !k.topics.contains(t)) {
            return Err(IngestError::Config(format!("kafka.encodings.{topic:?}: not one of kafka.topics")));
        }
        k.security.resolve()?;
        self.clickhouse.validate()?;
        self.service_metrics.validate()?;
        self.otlp.validate()?;
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
        let config = Config { kafka: options, ..Config::default() };
        let e = config.validate().expect_err("secrets are refused in kafka.options");
        assert!(e.to_string().contains("sasl.password") && !e.to_string().contains("\"x\""), "{e}");
    }

    #[test]
    fn defaults_are_valid_and_unknown_keys_are_refused() {
        Config::default().validate().expect("defaults are valid");
        let no_normalizer = Config { ingest: IngestConfig { normalize_threads: 0, ..IngestConfig::default() }, ..Config::default() };
        let e = no_normalizer.validate().expect_err("no thread to normalize on");
        assert!(e.to_string().contains("normalize_threads"), "{e}");
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
        std::fs::write(&path, "[kafka]\ntopics = [\"a\"]\nencodings = { b = \"otlp_proto\" }\n").expect("write");
        let e = Config::load(&path).expect_err("an encoding for a topic not read");
        assert!(e.to_string().contains("kafka.encodings.\"b\""), "{e}");
        std::fs::write(
            &path,
            "[kafka]\ntopics = [\"a\", \"b\"]\nencodings = { b = \"otlp_json\" }\n[otlp]\nattributes = { \"x.y\" = \"queue_wait_s\" }\n",
        )
        .expect("write");
        let config = Config::load(&path).expect("valid");
        assert_eq!((config.kafka.encoding("a"), config.kafka.encoding("b")), (TopicEncoding::Json, TopicEncoding::OtlpJson));
        std::fs::write(&path, "[otlp]\nattributes = { \"x.y\" = \"queue_seconds\" }\n").expect("write");
        let e = Config::load(&path).expect_err("not a contract name");
        assert!(e.to_string().contains("queue_seconds"), "{e}");
        std::fs::write(&path, "[ingest]\nbatch_max_age = \"500ms\"\n[compactor]\nanything = 1\n").expect("write");
        assert_eq!(Config::load(&path).expect("other tables are other commands'").ingest.batch_max_age, std::time::Duration::from_millis(500));
    }
}
