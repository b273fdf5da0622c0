//! The ingest crate's error type, with the context an operator needs and
//! the class the pipeline acts on.

use inferlog_schema::{ErrorClass, SchemaError};
use inferlog_store::error::clickhouse_class;
use inferlog_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("config: {0}")]
    Config(String),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("clickhouse {operation} on {table}: {source}")]
    ClickHouse { operation: &'static str, table: String, source: clickhouse::error::Error },
    #[error("kafka {operation}: {source}")]
    Kafka { operation: &'static str, source: rdkafka::error::KafkaError },
    #[error("kafka at {brokers} ({security}) refused inferlog: {reason} [{code:?}]; nothing was committed")]
    KafkaRefused { brokers: String, security: String, code: rdkafka::error::RDKafkaErrorCode, reason: String },
    #[error("dlq produce of {topic}/{partition}@{offset} to {dlq_topic}: {source}")]
    DlqProduce { dlq_topic: String, topic: String, partition: i32, offset: i64, source: rdkafka::error::KafkaError },
    #[error("not drained: {0}")]
    NotDrained(String),
    #[error("shutdown: the final flush did not finish within {0:?}; uncommitted messages will be re-read on restart")]
    ShutdownTimeout(std::time::Duration),
}

impl IngestError {
    /// Retry: the store or broker may come back (exit 75 if it ends the
    /// run). Fail: permanent, exit 2.
    /// (Bad events are never errors: they are rejections, sent to the DLQ.)
    pub fn class(&self) -> ErrorClass {
        match self {
            IngestError::ClickHouse { source, .. } => clickhouse_class(source),
            IngestError::Kafka { .. } | IngestError::DlqProduce { .. } | IngestError::NotDrained(_) | IngestError::ShutdownTimeout(_) => {
                ErrorClass::Retry
            }
            // The schema crate classifies its own errors.
            IngestError::Schema(e) => e.class(),
            IngestError::Store(e) => e.class(),
            IngestError::Config(_) | IngestError::KafkaRefused { .. } => ErrorClass::Fail,
        }
    }
}

impl inferlog_schema::Classified for IngestError {
    fn class(&self) -> ErrorClass {
        IngestError::class(self)
    }
}
