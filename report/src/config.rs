//! Configuration of `inferlog-report`: the shared `[clickhouse]`,
//! `[postgres]`, `[cold]` (days only the archive holds), `[schema]` (the
//! error dictionary), `[cost]` and `[budgets]` tables, with `INFERLOG_<TABLE>__<KEY>` overrides,
//! validated once. Other commands' tables are ignored.

use std::path::Path;

use inferlog_schema::config::{load_config_value, section};
use inferlog_schema::ContractConfig;
use inferlog_store::budget::BudgetsConfig;
use inferlog_store::cost::CostConfig;
use inferlog_store::{ClickHouseConfig, ColdConfig, PostgresConfig};

use crate::error::ReportError;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    pub clickhouse: ClickHouseConfig,
    pub postgres: PostgresConfig,
    pub cold: ColdConfig,
    pub schema: ContractConfig,
    pub cost: CostConfig,
    pub budgets: BudgetsConfig,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ReportError> {
        let bad = |e: inferlog_schema::SchemaError| ReportError::Config(e.to_string());
        let root = load_config_value(Some(path), std::env::vars()).map_err(bad)?;
        let config = Config {
            clickhouse: section(&root, "clickhouse").map_err(bad)?,
            postgres: section(&root, "postgres").map_err(bad)?,
            cold: section(&root, "cold").map_err(bad)?,
            schema: section(&root, "schema").map_err(bad)?,
            cost: section(&root, "cost").map_err(bad)?,
            budgets: section(&root, "budgets").map_err(bad)?,
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ReportError> {
        self.clickhouse.validate()?;
        self.postgres.validate()?;
        self.cold.validate()?;
        self.schema.validate().map_err(|e| ReportError::Config(e.to_string()))?;
        self.cost.validate()?;
        self.budgets.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_validated_and_unknown_keys_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[budgets.lines.search]\nmonthly_usd = 100.0\nmonthly_tokens = 5\n").expect("write");
        let err = Config::load(&path).expect_err("both units");
        assert!(err.to_string().contains("budgets.lines.search"), "{err}");
        std::fs::write(&path, "[budgets]\ndefault_facter = 1.5\n").expect("write");
        assert!(Config::load(&path).expect_err("typo").to_string().contains("default_facter"));
        std::fs::write(&path, "[budgets.lines.search]\nmonthly_usd = 100.0\n[compactor]\ninterval = \"1m\"\n").expect("write");
        assert_eq!(Config::load(&path).expect("valid").budgets.lines.len(), 1);
    }
}
