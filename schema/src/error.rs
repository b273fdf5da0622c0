//! The crate's error type for everything that is not a rejected event:
//! configuration, hash keys and files. A rejected event is a
//! [`crate::Rejection`], which is data, not an error of the program.

use std::path::PathBuf;

/// What the caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Transient: try the same thing again later.
    Retry,
    /// The input is bad: reject it (to the DLQ, or a non-zero exit).
    Reject,
    /// Configuration or environment is wrong: stop with exit code 2.
    Fail,
}

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("no user-id hash key: set INFERLOG_HASH_KEY_FILE (a file) or INFERLOG_HASH_KEY; user ids are never stored in plaintext or under an unkeyed hash")]
    HashKeyMissing,
    #[error("cannot read the hash key file {path}: {source}")]
    HashKeyUnreadable { path: PathBuf, source: std::io::Error },
    #[error("the hash key from {origin} is {len} bytes; at least {min} are required")]
    HashKeyTooShort { origin: &'static str, len: usize, min: usize },
    #[error("invalid hash key id {key_id:?}: 1-32 characters of [A-Za-z0-9_-]")]
    HashKeyId { key_id: String },
    #[error("cannot read config file {path}: {source}")]
    ConfigUnreadable { path: PathBuf, source: std::io::Error },
    #[error("invalid config {origin}: {message}")]
    ConfigInvalid { origin: String, message: String },
}

impl SchemaError {
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Fail
    }
}
