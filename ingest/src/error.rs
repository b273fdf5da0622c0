//! The ingest crate's error type, with the context an operator needs and
//! the class the pipeline acts on.

use inferlog_schema::{ErrorClass, SchemaError};

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error("clickhouse {operation} on {table}: {source}")]
    ClickHouse { operation: &'static str, table: String, source: clickhouse::error::Error },
    #[error("kafka {operation}: {source}")]
    Kafka { operation: &'static str, source: rdkafka::error::KafkaError },
    #[error("dlq produce of {topic}/{partition}@{offset} to {dlq_topic}: {source}")]
    DlqProduce { dlq_topic: String, topic: String, partition: i32, offset: i64, source: rdkafka::error::KafkaError },
    #[error("metrics server on {addr}: {source}")]
    Metrics { addr: String, source: std::io::Error },
    #[error("shutdown: the final flush did not finish within {0:?}; uncommitted messages will be re-read on restart")]
    ShutdownTimeout(std::time::Duration),
}

impl IngestError {
    /// Retry: the store or broker may come back. Fail: exit with code 2.
    /// (Bad events are never errors: they are rejections, sent to the DLQ.)
    pub fn class(&self) -> ErrorClass {
        match self {
            IngestError::ClickHouse { source, .. } => clickhouse_class(source),
            IngestError::Kafka { .. } | IngestError::DlqProduce { .. } => ErrorClass::Retry,
            // The schema crate classifies its own errors.
            IngestError::Schema(e) => e.class(),
            IngestError::Config(_) | IngestError::Metrics { .. } | IngestError::ShutdownTimeout(_) => ErrorClass::Fail,
        }
    }
}

/// ClickHouse error codes that no retry can fix: the schema or the
/// credentials are wrong (unknown table/database/column, type mismatch,
/// unparsable data, syntax, authentication).
const PERMANENT_CODES: [u32; 20] = [6, 16, 26, 27, 36, 41, 43, 44, 47, 48, 53, 60, 62, 70, 81, 192, 193, 194, 497, 516];

/// Anything but a known-permanent server error is retried: network
/// failures, timeouts, overload, and whatever a server says while it shuts
/// down or starts. Permanent ones stop the daemon without committing.
fn clickhouse_class(error: &clickhouse::error::Error) -> ErrorClass {
    use clickhouse::error::Error;
    match error {
        Error::BadResponse(text) => {
            let code = text
                .split("Code: ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|digits| digits.parse::<u32>().ok());
            match code {
                Some(code) if PERMANENT_CODES.contains(&code) => ErrorClass::Fail,
                _ => ErrorClass::Retry,
            }
        }
        _ => ErrorClass::Retry,
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
    }
}
