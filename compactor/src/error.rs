//! The compactor's error type: which day, which object, what went wrong,
//! and what the caller does about it.

use inferlog_schema::ErrorClass;
use inferlog_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum CompactorError {
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("parquet {operation} of {key}: {source}")]
    Parquet { operation: &'static str, key: String, source: parquet::errors::ParquetError },
    #[error("archive of {day}: {message}")]
    Archive { day: String, message: String },
    /// The archive read back does not match ClickHouse: never released.
    #[error("verification of {day} failed: {key}: {message}")]
    Verification { day: String, key: String, message: String },
    /// The day's aggregates cannot be put together (two groups share a hash).
    #[error("aggregates of {day}: {message}")]
    Aggregate { day: String, message: String },
    /// Another process holds the day's lock (a compactor publishing it).
    #[error("day {day} is locked by another process; try again")]
    Busy { day: String },
    #[error("day {day}: the hot rows changed while it was being {step} ({message}); it is redone on the next pass")]
    RowsChanged { day: String, step: &'static str, message: String },
    /// A DLQ replay was killed between storing rows of the day and
    /// recording them: the day stays hot until a replay resolves them.
    #[error("day {day}: {rows} rows of an interrupted DLQ replay are unresolved; it stays hot until `inferlog-ingest dlq replay` runs again")]
    ReplayPending { day: String, rows: u64 },
    /// Units of a day archived in units were still held by other
    /// compactors when `[compactor] unit_wait` ran out.
    #[error("day {day}: {verified} of {units} units verified; the others are still held by other compactors")]
    UnitsHeld { day: String, verified: u32, units: u32 },
}

impl CompactorError {
    /// Retry: a store is unreachable or rows changed; the next pass redoes
    /// the day from its recorded state. Reject: the archive does not match
    /// (the day is kept hot and reported; exit 1). Fail: configuration.
    pub fn class(&self) -> ErrorClass {
        match self {
            CompactorError::Store(e) => e.class(),
            CompactorError::Parquet { .. }
            | CompactorError::Archive { .. }
            | CompactorError::RowsChanged { .. }
            | CompactorError::Busy { .. }
            | CompactorError::ReplayPending { .. }
            | CompactorError::UnitsHeld { .. } => ErrorClass::Retry,
            CompactorError::Verification { .. } | CompactorError::Aggregate { .. } => ErrorClass::Reject,
            CompactorError::Config(_) => ErrorClass::Fail,
        }
    }
}

impl inferlog_schema::Classified for CompactorError {
    fn class(&self) -> ErrorClass {
        CompactorError::class(self)
    }
}

/// A config file that does not load: the store's config error, with its class.
impl From<inferlog_schema::SchemaError> for CompactorError {
    fn from(e: inferlog_schema::SchemaError) -> CompactorError {
        CompactorError::Store(StoreError::from(e))
    }
}
