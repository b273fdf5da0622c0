//! The report's error type. Every error is a usage, config or store
//! problem the report cannot answer through: exit 2.

use inferlog_schema::ErrorClass;
use inferlog_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("config: {0}")]
    Config(String),
    #[error("usage: {0}")]
    Usage(String),
    /// A stored value the report cannot read (a histogram that does not decode).
    #[error("stored data: {0}")]
    Data(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ReportError {
    /// Always [`ErrorClass::Fail`] (exit 2): a report that cannot be
    /// computed is not worth retrying silently.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Fail
    }
}

impl inferlog_schema::Classified for ReportError {
    fn class(&self) -> ErrorClass {
        ReportError::class(self)
    }
}

/// A config file that does not load: the table and the reason, as a config error.
impl From<inferlog_schema::SchemaError> for ReportError {
    fn from(e: inferlog_schema::SchemaError) -> ReportError {
        ReportError::Config(e.to_string())
    }
}
