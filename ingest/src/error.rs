//! The ingest crate's error type, with the context an operator needs and
//! the class the pipeline acts on.

use inferlog_schema::{ErrorClass, SchemaError};
use inferlog_store::error::clickhouse_class;
use inferlog_store::StoreError;

/// Exit code of a panicked task (EX_SOFTWARE): a bug, not the environment;
/// systemd restarts it (only 2 is left alone), and nothing was committed
/// past what is durable.
pub const EXIT_PANIC: u8 = inferlog_schema::error::exit::BUG;

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
    /// An existing table differs from what ingest writes in a way no
    /// insert survives: fix the table (or the config) and start again.
    #[error("clickhouse table {table} ({what}) differs from what ingest writes: {drift}; nothing was written or committed")]
    TableDrift { table: String, what: &'static str, drift: String },
    #[error("kafka {operation}: {source}")]
    Kafka { operation: &'static str, source: rdkafka::error::KafkaError },
    #[error("kafka at {brokers} ({security}) refused inferlog: {reason} [{code:?}]; nothing was committed")]
    KafkaRefused { brokers: String, security: String, code: rdkafka::error::RDKafkaErrorCode, reason: String },
    /// A transient produce failure (retried; blocks the commit).
    #[error("dlq produce of {topic}/{partition}@{offset} to {dlq_topic}: {source}")]
    DlqProduce { dlq_topic: String, topic: String, partition: i32, offset: i64, source: rdkafka::error::KafkaError },
    /// The DLQ topic does not exist and the broker will not create it.
    #[error("the DLQ topic {dlq_topic} does not exist ({reason}); create it (retention.ms no longer than the hot policy) and start again; nothing was committed past what is durable")]
    DlqMissing { dlq_topic: String, reason: String },
    /// The broker refuses inferlog's writes to the DLQ (authorization,
    /// authentication): permanent until an operator grants them.
    #[error("the broker refuses writes to the DLQ topic {dlq_topic}: {reason} [{code:?}]; nothing was committed past what is durable")]
    DlqRefused { dlq_topic: String, code: rdkafka::error::RDKafkaErrorCode, reason: String },
    /// The idempotent DLQ producer is in a fatal state: only a new
    /// producer (a restart) can go on.
    #[error("the DLQ producer is in a fatal state: {reason}; restarting resumes from the last commit")]
    DlqFatal { reason: String },
    /// A release of the day holds its lock ([`crate::late_days`]): the
    /// insert waits for it to end, then lands as late rows.
    #[error("day {day} is being released from the hot tier; its rows wait for the release to end, then land as late rows the compactor archives as a supplement")]
    DayReleasing { day: String },
    #[error("not drained: {0}")]
    NotDrained(String),
    /// A revocation has waited on this batch so long that the group may
    /// have handed its partitions to another member: no attempt starts
    /// any more, and the run ends (exit 75; a restart rejoins the group).
    /// See [`crate::source::FlushGate::fenced`].
    #[error("fenced: a revocation waited {waited:?} on the batch in flight, past {fence:?}, after which the group may have given its partitions to another member; nothing was committed past what is durable, and their next owner writes the rest")]
    Fenced { waited: std::time::Duration, fence: std::time::Duration },
    #[error("shutdown: the final flush did not finish within {0:?}; uncommitted messages will be re-read on restart")]
    ShutdownTimeout(std::time::Duration),
    #[error("shutdown: the final commit did not go through ({0}); the rows are durable and the next run skips them by the replay log")]
    FinalCommit(String),
    /// A task panicked: a bug. Nothing past what is durable was committed.
    #[error("the {task} task panicked: {message}; nothing was committed past what is durable")]
    Panic { task: &'static str, message: String },
}

impl IngestError {
    /// Retry: the store or broker may come back (exit 75 if it ends the
    /// run). Fail: permanent, exit 2.
    /// (Bad events are never errors: they are rejections, sent to the DLQ.)
    pub fn class(&self) -> ErrorClass {
        match self {
            IngestError::ClickHouse { source, .. } => clickhouse_class(source),
            IngestError::Kafka { .. }
            | IngestError::DlqProduce { .. }
            | IngestError::DlqFatal { .. }
            | IngestError::NotDrained(_)
            | IngestError::DayReleasing { .. }
            | IngestError::Fenced { .. }
            | IngestError::ShutdownTimeout(_)
            | IngestError::FinalCommit(_)
            | IngestError::Panic { .. } => ErrorClass::Retry,
            // The schema crate classifies its own errors.
            IngestError::Schema(e) => e.class(),
            IngestError::Store(e) => e.class(),
            IngestError::Config(_)
            | IngestError::KafkaRefused { .. }
            | IngestError::TableDrift { .. }
            | IngestError::DlqMissing { .. }
            | IngestError::DlqRefused { .. } => ErrorClass::Fail,
        }
    }

    /// Whether waiting and trying the same call again can succeed; a fatal
    /// producer or a panic ends the run instead (and a restart recovers).
    pub fn retry_in_place(&self) -> bool {
        self.class() == ErrorClass::Retry && !matches!(self, IngestError::DlqFatal { .. } | IngestError::Panic { .. } | IngestError::Fenced { .. })
    }

    /// The process exit code of a run that ended on this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            IngestError::Panic { .. } => EXIT_PANIC,
            _ => self.class().exit_code(),
        }
    }

    /// A task that did not return: a panic (with its message) or a cancel.
    pub fn join(task: &'static str, e: tokio::task::JoinError) -> IngestError {
        let message = if e.is_panic() {
            let payload = e.into_panic();
            payload.downcast_ref::<&str>().map(|s| (*s).to_owned()).or_else(|| payload.downcast_ref::<String>().cloned()).unwrap_or_default()
        } else {
            "cancelled".to_owned()
        };
        IngestError::Panic { task, message }
    }
}

impl inferlog_schema::Classified for IngestError {
    fn class(&self) -> ErrorClass {
        IngestError::class(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicked_task_exits_70_and_is_not_retried_in_place() {
        let joined = tokio::spawn(async { panic!("boom") }).await.expect_err("panicked");
        let e = IngestError::join("writer", joined);
        assert_eq!(e.exit_code(), EXIT_PANIC);
        assert!(!e.retry_in_place());
        assert!(e.to_string().contains("writer task panicked: boom"), "{e}");
        let drift = IngestError::TableDrift { table: "d.t".into(), what: "hot rows", drift: "column x is UInt32, inferlog writes Int32".into() };
        assert_eq!(drift.exit_code(), inferlog_schema::error::exit::PERMANENT);
        assert!(IngestError::DlqProduce {
            dlq_topic: "d".into(),
            topic: "t".into(),
            partition: 0,
            offset: 1,
            source: rdkafka::error::KafkaError::Canceled
        }
        .retry_in_place());
        assert!(!IngestError::DlqFatal { reason: "x".into() }.retry_in_place());
        assert_eq!(IngestError::DlqFatal { reason: "x".into() }.exit_code(), inferlog_schema::error::exit::TRANSIENT);
    }
}
