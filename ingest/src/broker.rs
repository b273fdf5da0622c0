//! Broker round trips of the pipeline. In: a call on the consumer
//! (committed offsets, watermarks, metadata, a commit). Out: its answer,
//! made off the async workers and retried with backoff while the broker
//! is away or busy (restarting, a leader moving, the coordinator
//! loading), logged at WARN; a permanent refusal (credentials, TLS,
//! rights) ends the run with exit 2, and so does nothing else.

use std::sync::Arc;
use std::time::Duration;

use inferlog_store::retry::{self, Retryable};
use tokio::sync::watch;

use crate::config::KafkaConfig;
use crate::error::IngestError;
use crate::internal_events::{CommitFailed, ConsumeError, InternalEvent};
use crate::metrics::Metrics;
use crate::source::{self, Consumer};

/// Runs a blocking call of the consumer off the async workers; `what`
/// names the call if its task panics.
pub async fn on_consumer<T: Send + 'static>(
    consumer: &Arc<Consumer>,
    what: &'static str,
    call: impl FnOnce(&Consumer) -> T + Send + 'static,
) -> Result<T, IngestError> {
    let consumer = consumer.clone();
    tokio::task::spawn_blocking(move || {
        crate::hooks::panic_point("blocking");
        call(&consumer)
    })
    .await
    .map_err(|e| IngestError::join(what, e))
}

/// The consumer with what a retried call needs; cheap to clone into a task.
#[derive(Clone)]
pub struct Broker {
    pub consumer: Arc<Consumer>,
    kafka: Arc<KafkaConfig>,
    backoff: (Duration, Duration),
    shutdown: watch::Receiver<bool>,
    metrics: Metrics,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").field("brokers", &self.kafka.brokers).finish_non_exhaustive()
    }
}

impl Broker {
    pub fn new(
        consumer: Arc<Consumer>,
        kafka: KafkaConfig,
        backoff: (Duration, Duration),
        shutdown: watch::Receiver<bool>,
        metrics: Metrics,
    ) -> Broker {
        Broker { consumer, kafka: Arc::new(kafka), backoff, shutdown, metrics }
    }

    /// The error for a permanent refusal, naming brokers and mechanism.
    /// How `topic`'s messages are encoded (`[kafka] encodings`).
    pub fn encoding(&self, topic: &str) -> inferlog_store::kafka::TopicEncoding {
        self.kafka.encoding(topic)
    }

    pub fn refused(&self, code: rdkafka::error::RDKafkaErrorCode, reason: String) -> IngestError {
        IngestError::KafkaRefused { brokers: self.kafka.brokers.clone(), security: self.kafka.security.describe(), code, reason }
    }

    /// Runs `call` off the async workers until it succeeds, waiting out a
    /// broker that is away; a permanent refusal ends it (exit 2), and so
    /// does a shutdown meanwhile (the last error).
    pub async fn call<T: Send + 'static>(
        &self,
        what: &'static str,
        call: impl Fn(&Consumer) -> rdkafka::error::KafkaResult<T> + Send + Sync + 'static,
    ) -> Result<T, IngestError> {
        let call = Arc::new(call);
        let shutdown = self.shutdown.clone();
        let permanent = |source: &rdkafka::error::KafkaError| source.rdkafka_error_code().filter(|c| source::is_permanent(*c));
        let result = (|| {
            let attempt = call.clone();
            async move {
                on_consumer(&self.consumer, what, move |consumer| attempt(consumer))
                    .await?
                    .map_err(|source| IngestError::Kafka { operation: what, source })
            }
        })
        .retry(retry::backoff(self.backoff.0, self.backoff.1))
        .sleep(retry::ShutdownSleeper::new(shutdown.clone()))
        .when(|e| matches!(e, IngestError::Kafka { source, .. } if permanent(source).is_none()) && !*shutdown.borrow())
        .notify(|e, wait| {
            ConsumeError.emit(&self.metrics);
            tracing::warn!(what, error = %e, backoff_ms = wait.as_millis() as u64, "kafka: waiting for the broker");
        })
        .await;
        result.map_err(|e| match &e {
            IngestError::Kafka { source, .. } => match permanent(source) {
                Some(code) => self.refused(code, source.to_string()),
                None => e,
            },
            _ => e,
        })
    }

    /// Commits `(topic, partition, next offset)` within `limit`. A failure
    /// is counted and returned; the caller decides whether it matters (it
    /// only does at shutdown: the rows are durable either way).
    pub async fn commit(&self, offsets: Vec<(String, i32, i64)>, limit: Duration) -> Result<(), String> {
        if offsets.is_empty() {
            return Ok(());
        }
        let call = on_consumer(&self.consumer, "commit", move |consumer| crate::offset_commit::commit(consumer, &offsets));
        let outcome = match tokio::time::timeout(limit, call).await {
            Ok(Ok(Ok(()))) => return Ok(()),
            Ok(Ok(Err(e))) => e.to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}", humantime::format_duration(limit)),
        };
        CommitFailed { error: &outcome }.emit(&self.metrics);
        Err(outcome)
    }
}
