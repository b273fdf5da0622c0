//! Configuration of `inferlog-compactor`: its own `[compactor]` table plus
//! the shared `[schema]`, `[clickhouse]`, `[postgres]`, `[cold]`,
//! `[retention]`, `[cost]`, `[budgets]` and `[sampling]` tables, with `INFERLOG_<TABLE>__<KEY>` overrides, validated once.

use std::net::SocketAddr;

use inferlog_schema::ContractConfig;
use inferlog_store::budget::BudgetsConfig;
pub use inferlog_store::config::CompactorConfig;
use inferlog_store::cost::CostConfig;
use inferlog_store::{ClickHouseConfig, ColdConfig, PostgresConfig, RetentionConfig, SamplingConfig};

use crate::error::CompactorError;

inferlog_schema::binary_config! {
    /// Everything the compactor reads from the config file.
    pub struct Config: CompactorError {
        schema: ContractConfig,
        clickhouse: ClickHouseConfig,
        postgres: PostgresConfig,
        cold: ColdConfig,
        retention: RetentionConfig,
        cost: CostConfig,
        budgets: BudgetsConfig,
        compactor: CompactorConfig,
        sampling: SamplingConfig,
    }
}

impl Config {
    /// The one validation step: each table's own checks, then the compactor's.
    pub fn validate(&self) -> Result<(), CompactorError> {
        self.schema.validate()?;
        self.clickhouse.validate()?;
        self.postgres.validate()?;
        self.cold.validate()?;
        self.retention.validate(self.schema.max_event_age)?;
        self.cost.validate()?;
        self.budgets.validate()?;
        self.sampling.validate()?;
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
