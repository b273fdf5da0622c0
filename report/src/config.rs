//! Configuration of `inferlog-report`: the shared `[clickhouse]`,
//! `[postgres]`, `[cold]` (days only the archive holds), `[schema]` (the
//! error dictionary), `[cost]` and `[budgets]` tables, with `INFERLOG_<TABLE>__<KEY>` overrides,
//! validated once. Other commands' tables are ignored.

use inferlog_schema::ContractConfig;
use inferlog_store::budget::BudgetsConfig;
use inferlog_store::cost::CostConfig;
use inferlog_store::{ClickHouseConfig, ColdConfig, PostgresConfig};

use crate::error::ReportError;

inferlog_schema::binary_config! {
    /// Everything `inferlog-report` reads from the config file.
    pub struct Config: ReportError {
        clickhouse: ClickHouseConfig,
        postgres: PostgresConfig,
        cold: ColdConfig,
        schema: ContractConfig,
        cost: CostConfig,
        budgets: BudgetsConfig,
    }
}

impl Config {
    /// The one validation step: each table's own checks.
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
