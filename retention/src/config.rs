//! Configuration of `inferlog-retention`: the shared `[retention]`
//! policies and the stores of every tier, plus `[kafka]` for the DLQ topic
//! whose retention the audit checks.

use inferlog_schema::ContractConfig;
use inferlog_store::kafka::KafkaConfig;
use inferlog_store::{ClickHouseConfig, ColdConfig, PostgresConfig, RetentionConfig, StoreError};

use crate::error::RetentionError;

inferlog_schema::binary_config! {
    /// Everything `inferlog-retention` reads from the config file.
    pub struct Config: RetentionError {
        schema: ContractConfig,
        kafka: KafkaConfig,
        clickhouse: ClickHouseConfig,
        postgres: PostgresConfig,
        cold: ColdConfig,
        retention: RetentionConfig,
    }
}

impl Config {
    /// The one validation step: each table's own checks, then retention's.
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
