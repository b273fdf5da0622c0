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

/// The exit codes of every inferlog command, one table (docs/contract.md).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// The work found problems: invalid events, retention violations, an
    /// archive that failed verification, a budget crossed.
    pub const PROBLEMS: u8 = 1;
    /// Permanent: usage, configuration, authentication, authorization, an
    /// unknown topic. Running again will not help; systemd does not restart.
    pub const PERMANENT: u8 = 2;
    /// Transient (EX_TEMPFAIL): a store or broker stayed unreachable past
    /// the retry budget, or a drain could not be confirmed. Run again later;
    /// systemd restarts.
    pub const TRANSIENT: u8 = 75;
    /// A bug (EX_SOFTWARE): a task panicked. Nothing past what is durable
    /// was committed; systemd restarts.
    pub const BUG: u8 = 70;
}

impl ErrorClass {
    /// The exit code of a command that ends on an error of this class.
    pub const fn exit_code(self) -> u8 {
        match self {
            ErrorClass::Retry => exit::TRANSIENT,
            ErrorClass::Reject => exit::PROBLEMS,
            ErrorClass::Fail => exit::PERMANENT,
        }
    }
}

/// An error that says what the caller should do about it.
pub trait Classified {
    fn class(&self) -> ErrorClass;
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

impl Classified for SchemaError {
    fn class(&self) -> ErrorClass {
        SchemaError::class(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_has_its_own_exit_code() {
        assert_eq!(
            [ErrorClass::Retry, ErrorClass::Reject, ErrorClass::Fail].map(ErrorClass::exit_code),
            [exit::TRANSIENT, exit::PROBLEMS, exit::PERMANENT]
        );
    }
}
