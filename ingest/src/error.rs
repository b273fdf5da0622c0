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
            IngestError::Config(_) | IngestError::Schema(_) | IngestError::Metrics { .. } | IngestError::ShutdownTimeout(_) => {
                ErrorClass::Fail
            }
        }
    }
}

/// ClickHouse error codes that pass by themselves: overload, timeouts,
/// network trouble, a replica or disk briefly read-only, too many parts.
const TRANSIENT_CODES: [u32; 12] = [159, 164, 202, 209, 210, 241, 242, 252, 285, 319, 425, 1000];

/// Network failures and transient server codes are retried; anything else
/// the server answers (unknown table, syntax, type mismatch) will not get
/// better by retrying and stops the daemon without committing.
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
                Some(code) if !TRANSIENT_CODES.contains(&code) => ErrorClass::Fail,
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
    }
}
