//! Configuration of `inferlog-compactor`: its own `[compactor]` table plus
//! the shared `[schema]`, `[clickhouse]`, `[postgres]`, `[cold]`,
//! `[retention]`, `[cost]` and `[budgets]` tables, with `INFERLOG_<TABLE>__<KEY>` overrides, validated once.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use inferlog_schema::config::{load_config_value, section};
use inferlog_schema::ContractConfig;
use inferlog_store::budget::BudgetsConfig;
use inferlog_store::cost::CostConfig;
use inferlog_store::{ClickHouseConfig, ColdConfig, PostgresConfig, RetentionConfig};
use serde::{Deserialize, Serialize};

use crate::error::CompactorError;

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

/// Everything the compactor reads from the config file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub schema: ContractConfig,
    pub clickhouse: ClickHouseConfig,
    pub postgres: PostgresConfig,
    pub cold: ColdConfig,
    pub retention: RetentionConfig,
    pub cost: CostConfig,
    pub budgets: BudgetsConfig,
    pub compactor: CompactorConfig,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, CompactorError> {
        let root = load_config_value(Some(path), std::env::vars()).map_err(inferlog_store::StoreError::from)?;
        let config = Config {
            schema: section(&root, "schema").map_err(inferlog_store::StoreError::from)?,
            clickhouse: section(&root, "clickhouse").map_err(inferlog_store::StoreError::from)?,
            postgres: section(&root, "postgres").map_err(inferlog_store::StoreError::from)?,
            cold: section(&root, "cold").map_err(inferlog_store::StoreError::from)?,
            retention: section(&root, "retention").map_err(inferlog_store::StoreError::from)?,
            cost: section(&root, "cost").map_err(inferlog_store::StoreError::from)?,
            budgets: section(&root, "budgets").map_err(inferlog_store::StoreError::from)?,
            compactor: section(&root, "compactor").map_err(inferlog_store::StoreError::from)?,
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), CompactorError> {
        self.schema.validate().map_err(inferlog_store::StoreError::from)?;
        self.clickhouse.validate()?;
        self.postgres.validate()?;
        self.cold.validate()?;
        self.retention.validate(self.schema.max_event_age)?;
        self.cost.validate()?;
        self.budgets.validate()?;
        let c = &self.compactor;
        if c.interval.is_zero() {
            return Err(CompactorError::Config("compactor.interval must be > 0".into()));
        }
        if !c.metrics_addr.is_empty() {
            c.metrics_addr.parse::<SocketAddr>().map_err(|e| CompactorError::Config(format!("compactor.metrics_addr {:?}: {e}", c.metrics_addr)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_unknown_keys_are_refused() {
        Config::default().validate().expect("defaults are valid");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[compactor]\nlatenes = \"1h\"\n").expect("write");
        let err = Config::load(&path).expect_err("unknown key");
        assert!(err.to_string().contains("latenes"), "{err}");
        std::fs::write(&path, "[schema]\nmax_event_age = \"30d\"\n[retention]\nhot_days = 7\n").expect("write");
        let err = Config::load(&path).expect_err("late events would outlive the hot tier");
        assert!(err.to_string().contains("max_event_age"), "{err}");
        std::fs::write(&path, "[retention]\nhot_days = \"forever\"\ncold_days = \"forever\"\naggregate_days = \"forever\"\n[cold]\nurl = \"s3://b/p/\"\n[ingest]\nx = 1\n").expect("write");
        let config = Config::load(&path).expect("other commands' tables are ignored");
        assert_eq!(config.retention.hot_days, inferlog_store::Policy::Forever);
    }
}
