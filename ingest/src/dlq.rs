//! The dead-letter stage. In: rejected messages (original bytes and the
//! rejection). Out: one DLQ message each, acknowledged by the broker, with
//! headers that say why and where from. A produce failure is retried and
//! blocks the offset commit; a reject is never dropped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inferlog_schema::timestamp::format_rfc3339_ms;
use inferlog_schema::Rejection;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::config::KafkaConfig;
use crate::error::IngestError;

/// Header names on every DLQ message.
pub mod headers {
    pub const REASON: &str = "inferlog.reason";
    pub const FIELD: &str = "inferlog.field";
    pub const MESSAGE: &str = "inferlog.message";
    pub const SOURCE_TOPIC: &str = "inferlog.source.topic";
    pub const SOURCE_PARTITION: &str = "inferlog.source.partition";
    pub const SOURCE_OFFSET: &str = "inferlog.source.offset";
    pub const SOURCE_KEY: &str = "inferlog.source.key";
    pub const TIME: &str = "inferlog.time";
}

/// A rejected message waiting for the DLQ.
#[derive(Debug, Clone)]
pub struct Reject {
    pub payload: Vec<u8>,
    pub key: Option<Vec<u8>>,
    pub rejection: Rejection,
    pub topic: std::sync::Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub received_ms: i64,
}

/// The DLQ producer.
pub struct Dlq {
    producer: FutureProducer,
    topic: String,
}

impl std::fmt::Debug for Dlq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dlq").field("topic", &self.topic).finish_non_exhaustive()
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Dlq {
    pub fn new(kafka: &KafkaConfig) -> Result<Dlq, IngestError> {
        let producer: FutureProducer = crate::source::client_config(kafka)?
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "60000")
            .create()
            .map_err(|source| IngestError::Kafka { operation: "create DLQ producer", source })?;
        Ok(Dlq { producer, topic: kafka.dlq_topic.clone() })
    }

    /// Produces every reject and waits until the broker acknowledged each.
    /// Returns the rejects that failed, with the first error.
    pub async fn send_all<'a>(&self, rejects: &[&'a Reject]) -> Result<(), (Vec<&'a Reject>, IngestError)> {
        let mut pending = Vec::with_capacity(rejects.len());
        for &r in rejects {
            let partition = r.partition.to_string();
            let offset = r.offset.to_string();
            let time = format_rfc3339_ms(r.received_ms);
            let key = format!("{}/{}/{}", r.topic, r.partition, r.offset);
            let mut h = OwnedHeaders::new_with_capacity(8)
                .insert(Header { key: headers::REASON, value: Some(r.rejection.reason.as_str()) })
                .insert(Header { key: headers::FIELD, value: Some(r.rejection.field.as_str()) })
                .insert(Header { key: headers::MESSAGE, value: Some(r.rejection.message.as_str()) })
                .insert(Header { key: headers::SOURCE_TOPIC, value: Some(&*r.topic) })
                .insert(Header { key: headers::SOURCE_PARTITION, value: Some(&partition) })
                .insert(Header { key: headers::SOURCE_OFFSET, value: Some(&offset) })
                .insert(Header { key: headers::TIME, value: Some(&time) });
            if let Some(k) = &r.key {
                h = h.insert(Header { key: headers::SOURCE_KEY, value: Some(k.as_slice()) });
            }
            let mut record = FutureRecord::to(&self.topic).payload(&r.payload).key(&key).headers(h);
            // Enqueue; when librdkafka's queue is full, wait for room.
            let future = loop {
                match self.producer.send_result(record) {
                    Ok(f) => break f,
                    Err((rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err((source, _)) => return Err((vec![r], self.error(r, source))),
                }
            };
            pending.push((r, future));
        }
        let mut failed = Vec::new();
        let mut first_error = None;
        for (r, future) in pending {
            let outcome = match future.await {
                Ok(Ok(_)) => continue,
                Ok(Err((source, _))) => source,
                Err(_canceled) => rdkafka::error::KafkaError::Canceled,
            };
            first_error.get_or_insert_with(|| self.error(r, outcome));
            failed.push(r);
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err((failed, e)),
        }
    }

    fn error(&self, r: &Reject, source: rdkafka::error::KafkaError) -> IngestError {
        IngestError::DlqProduce {
            dlq_topic: self.topic.clone(),
            topic: r.topic.to_string(),
            partition: r.partition,
            offset: r.offset,
            source,
        }
    }

    /// Waits for anything still queued (at shutdown).
    pub fn flush(&self, timeout: Duration) {
        use rdkafka::producer::Producer as _;
        let _ = self.producer.flush(Timeout::After(timeout));
    }
}
