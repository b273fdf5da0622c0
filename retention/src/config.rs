//! Configuration of `inferlog-retention`: the shared `[retention]`
//! policies and the stores of every tier, plus `[kafka]` for the DLQ topic
//! whose retention the audit checks.

use std::path::Path;

use inferlog_schema::config::{load_config_value, section};
use inferlog_schema::ContractConfig;
use inferlog_store::kafka::KafkaConfig;
use inferlog_store::{ClickHouseConfig, ColdConfig, PostgresConfig, RetentionConfig, StoreError};

use crate::error::RetentionError;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub schema: ContractConfig,
    pub kafka: KafkaConfig,
    pub clickhouse: ClickHouseConfig,
    pub postgres: PostgresConfig,
    pub cold: ColdConfig,
    pub retention: RetentionConfig,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, RetentionError> {
        let bad = |e: inferlog_schema::SchemaError| RetentionError::Config(e.to_string());
        let root = load_config_value(Some(path), std::env::vars()).map_err(bad)?;
        let config = Config {
            schema: section(&root, "schema").map_err(bad)?,
            kafka: section(&root, "kafka").map_err(bad)?,
            clickhouse: section(&root, "clickhouse").map_err(bad)?,
            postgres: section(&root, "postgres").map_err(bad)?,
            cold: section(&root, "cold").map_err(bad)?,
            retention: section(&root, "retention").map_err(bad)?,
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), RetentionError> {
        let bad = |e: StoreError| RetentionError::Config(e.to_string());
        self.schema.validate().map_err(|e| RetentionError::Config(e.to_string()))?;
        self.clickhouse.validate().map_err(bad)?;
        self.postgres.validate().map_err(bad)?;
        self.cold.validate().map_err(bad)?;
        // The Kafka security table is checked (password readable) at start-up.
        self.kafka.security.resolve().map_err(|e| RetentionError::Config(e.to_string()))?;
        self.retention.validate(self.schema.max_event_age).map_err(bad)?;
        if self.retention.interval.is_zero() {
            return Err(RetentionError::Config("retention.interval must be > 0".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_policies_parse() {
        Config::default().validate().expect("defaults");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[retention]\nhot_days = 7\naggregate_days = \"forever\"\ncold_days = 30\n").expect("write");
        let config = Config::load(&path).expect("valid");
        assert_eq!(config.retention.aggregate_days, inferlog_store::Policy::Forever);
        std::fs::write(&path, "[retention]\nhot_dayz = 7\n").expect("write");
        assert!(Config::load(&path).expect_err("unknown key").to_string().contains("hot_dayz"));
    }
}
