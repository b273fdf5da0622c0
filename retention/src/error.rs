//! The retention crate's error type.

use inferlog_schema::ErrorClass;
use inferlog_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error("config: {0}")]
    Config(String),
    /// A tier could not be reached or read: the command exits with the error's class (75 unreachable, 2 misconfigured), never passes silently.
    #[error("{tier} tier: {source}")]
    Tier { tier: &'static str, source: StoreError },
    /// Reading or writing a cold object (erasure): the compactor's error and its class.
    #[error("cold tier: {0}")]
    Cold(#[from] inferlog_compactor::CompactorError),
    /// The audit could not see all of a tier (a cluster replica that does
    /// not answer): it exits 2 naming it rather than pass what it did not see.
    #[error("cannot audit: {0}")]
    Unaudited(String),
    /// The work is not finished (a lock held elsewhere, a mutation still running): running again finishes it.
    #[error("{0}")]
    Incomplete(String),
}

impl RetentionError {
    pub fn class(&self) -> ErrorClass {
        match self {
            RetentionError::Config(_) | RetentionError::Unaudited(_) => ErrorClass::Fail,
            RetentionError::Tier { source, .. } => source.class(),
            RetentionError::Cold(e) => e.class(),
            RetentionError::Incomplete(_) => ErrorClass::Retry,
        }
    }

    pub fn tier(tier: &'static str) -> impl FnOnce(StoreError) -> RetentionError {
        move |source| RetentionError::Tier { tier, source }
    }
}

impl inferlog_schema::Classified for RetentionError {
    fn class(&self) -> ErrorClass {
        RetentionError::class(self)
    }
}

/// A config file that does not load: the table and the reason, as a config error.
impl From<inferlog_schema::SchemaError> for RetentionError {
    fn from(e: inferlog_schema::SchemaError) -> RetentionError {
        RetentionError::Config(e.to_string())
    }
}
