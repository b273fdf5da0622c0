//! The `[postgres]` table: the aggregates' database.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{identifier, secret, POSTGRES_PASSWORD_ENV};
use crate::error::StoreError;

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

impl PostgresConfig {
    /// The password from `INFERLOG_POSTGRES_PASSWORD`, else `password_file`, else none.
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
