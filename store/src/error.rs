//! The store crate's error type: which store, which operation, which unit
//! (table, day, object key), and the class the caller acts on.

use inferlog_schema::{ErrorClass, SchemaError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("config: {0}")]
    Config(String),
    /// A cluster's replica did not confirm a change (it still holds what was
    /// dropped, or it does not answer): transient, the change is repeated.
    #[error("not confirmed on the cluster: {0}")]
    Unconfirmed(String),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error("clickhouse {operation} on {table}: {source}")]
    ClickHouse { operation: &'static str, table: String, source: clickhouse::error::Error },
    #[error("postgres {operation}: {source}")]
    Postgres { operation: &'static str, source: sqlx::Error },
    #[error("postgres migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("object store {operation} of {key}: {source}")]
    ObjectStore { operation: &'static str, key: String, source: object_store::Error },
    #[error("metrics server on {addr}: {source}")]
    Metrics { addr: String, source: std::io::Error },
    /// An archive object that could not be read as Parquet (a read from
    /// the store that failed is one too): transient, read again.
    #[error("archive object {key}: {operation}: {source}")]
    Parquet { operation: &'static str, key: String, source: parquet::errors::ParquetError },
}

impl StoreError {
    pub fn clickhouse(operation: &'static str, table: impl Into<String>) -> impl FnOnce(clickhouse::error::Error) -> StoreError {
        let table = table.into();
        move |source| StoreError::ClickHouse { operation, table, source }
    }

    pub fn postgres(operation: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
        move |source| StoreError::Postgres { operation, source }
    }

    pub fn object(operation: &'static str, key: impl std::fmt::Display) -> impl FnOnce(object_store::Error) -> StoreError {
        let key = key.to_string();
        move |source| StoreError::ObjectStore { operation, key, source }
    }

    /// Retry: the store may come back (a later pass, a retried write).
    /// Fail: configuration or schema is wrong; exit 2.
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::ClickHouse { source, .. } => clickhouse_class(source),
            StoreError::Postgres { source, .. } => match source {
                sqlx::Error::Configuration(_) | sqlx::Error::ColumnNotFound(_) | sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
                    ErrorClass::Fail
                }
                // 42xxx: syntax error or access rule violation (undefined
                // table, permission denied); 28xxx: authentication.
                sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("42") || c.starts_with("28")) => ErrorClass::Fail,
                _ => ErrorClass::Retry,
            },
            StoreError::ObjectStore { source, .. } => match source {
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
                | object_store::Error::NotImplemented { .. }
                | object_store::Error::UnknownConfigurationKey { .. } => ErrorClass::Fail,
                _ => ErrorClass::Retry,
            },
            StoreError::Schema(e) => e.class(),
            StoreError::Unconfirmed(_) | StoreError::Parquet { .. } => ErrorClass::Retry,
            StoreError::Config(_) | StoreError::Migrate(_) | StoreError::Metrics { .. } => ErrorClass::Fail,
        }
    }
}

/// ClickHouse error codes that no retry can fix: the schema or the
/// credentials are wrong (unknown table/database/column, type mismatch,
/// unparsable data, syntax, an unknown setting), or the user may not do it
/// (authentication: 192-194, 516; permissions: 164 readonly, 291, 497).
/// 33 (cannot read all data) and 117 (incorrect data) are what a table
/// whose columns differ from the rows sent answers: the same rows fail the
/// same way every time.
const PERMANENT_CODES: [u32; 25] = [6, 16, 26, 27, 33, 36, 41, 43, 44, 47, 48, 53, 60, 62, 70, 81, 115, 117, 164, 192, 193, 194, 291, 497, 516];

/// Anything but a known-permanent server error is retried: network
/// failures, timeouts, overload, and whatever a server says while it shuts
/// down or starts.
pub fn clickhouse_class(error: &clickhouse::error::Error) -> ErrorClass {
    match clickhouse_code(error) {
        Some(code) if PERMANENT_CODES.contains(&code) => ErrorClass::Fail,
        _ => ErrorClass::Retry,
    }
}

/// The server's error code (`Code: N` of its answer), if it answered one.
pub fn clickhouse_code(error: &clickhouse::error::Error) -> Option<u32> {
    match error {
        clickhouse::error::Error::BadResponse(text) => text
            .split("Code: ")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|digits| digits.parse::<u32>().ok()),
        _ => None,
    }
}

impl inferlog_schema::Classified for StoreError {
    fn class(&self) -> ErrorClass {
        StoreError::class(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class_of(text: &str) -> ErrorClass {
        clickhouse_class(&clickhouse::error::Error::BadResponse(text.to_owned()))
    }

    #[test]
    fn permanent_server_errors_fail_and_transient_ones_retry() {
        assert_eq!(class_of("Code: 60, e.displayText() = DB::Exception: Table default.x doesn't exist."), ErrorClass::Fail);
        assert_eq!(class_of("Code: 252, e.displayText() = DB::Exception: Too many parts"), ErrorClass::Retry);
        assert_eq!(class_of("502 Bad Gateway"), ErrorClass::Retry);
        assert_eq!(class_of("Code: 394, e.displayText() = DB::Exception: Query was cancelled"), ErrorClass::Retry);
        assert_eq!(class_of("Code: 516, e.displayText() = DB::Exception: default: Authentication failed"), ErrorClass::Fail);
        assert_eq!(class_of("Code: 33, e.displayText() = DB::Exception: Cannot read all data. Bytes read: 3. Bytes expected: 8."), ErrorClass::Fail);
        assert_eq!(class_of("Code: 164, e.displayText() = DB::Exception: Cannot execute query in readonly mode"), ErrorClass::Fail);
        assert_eq!(class_of("Code: 497. DB::Exception: ro: Not enough privileges."), ErrorClass::Fail);
    }
}
