//! The dead-letter stage. In: rejected messages (original bytes and the
//! rejection). Out: one DLQ message each, acknowledged by the broker, with
//! headers that say why and where from. A produce failure is retried and
//! blocks the offset commit; a reject is never dropped: one larger than the
//! DLQ takes is written truncated, with headers that say so.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inferlog_schema::timestamp::format_rfc3339_ms;
use inferlog_schema::Rejection;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use sha2::Digest as _;

use crate::config::KafkaConfig;
use crate::error::IngestError;
use crate::metrics::{self, Metrics};

/// Waits for the broker's acknowledgement of one message.
async fn delivered(future: rdkafka::producer::DeliveryFuture) -> Result<(), KafkaError> {
    match future.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(e),
        Err(_canceled) => Err(KafkaError::Canceled),
    }
}

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
    /// "true" when the payload is the first bytes of a reject too large for the DLQ.
    pub const TRUNCATED: &str = "inferlog.truncated";
    /// The size of the original message, when truncated.
    pub const ORIGINAL_BYTES: &str = "inferlog.original.bytes";
    /// Hex SHA-256 of the original message, when truncated.
    pub const ORIGINAL_SHA256: &str = "inferlog.original.sha256";
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

/// librdkafka's largest message (`message.max.bytes`), set explicitly.
const PRODUCER_MAX_BYTES: usize = 1_000_000;

/// Room kept in a truncated message for its key, headers and the record
/// and batch framing.
const FRAMING_BYTES: usize = 1024;

/// A reject too large for the DLQ, written truncated: how it was cut.
#[derive(Debug, Clone)]
struct Truncation {
    keep: usize,
    original_bytes: String,
    original_sha256: String,
}

/// What happened to one reject in [`Dlq::send_all`].
type Sent<'a> = (&'a Reject, Option<Truncation>, rdkafka::producer::DeliveryFuture);

/// The DLQ producer.
pub struct Dlq {
    producer: FutureProducer,
    topic: String,
    admin: rdkafka::ClientConfig,
    /// The largest message the DLQ takes, once a reject was refused as too
    /// large (0: not looked up yet).
    limit: AtomicUsize,
    metrics: Metrics,
}

impl std::fmt::Debug for Dlq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dlq").field("topic", &self.topic).field("limit", &self.limit).finish_non_exhaustive()
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn too_large(e: &KafkaError) -> bool {
    matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::MessageSizeTooLarge))
}

impl Dlq {
    pub fn new(kafka: &KafkaConfig, metrics: Metrics) -> Result<Dlq, IngestError> {
        let admin = crate::source::client_config(kafka)?;
        let producer: FutureProducer = crate::source::client_config(kafka)?
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "60000")
            .set("message.max.bytes", PRODUCER_MAX_BYTES.to_string())
            .create()
            .map_err(|source| IngestError::Kafka { operation: "create DLQ producer", source })?;
        Ok(Dlq { producer, topic: kafka.dlq_topic.clone(), admin, limit: AtomicUsize::new(0), metrics })
    }

    /// Produces every reject and waits until the broker acknowledged each.
    /// Returns the rejects not acknowledged (every one after an enqueue
    /// error too), with the first error: the caller retries them and
    /// commits nothing meanwhile. A reject larger than the DLQ takes is
    /// written truncated ([`headers::TRUNCATED`]), never dropped.
    pub async fn send_all<'a>(&self, rejects: &[&'a Reject]) -> Result<(), (Vec<&'a Reject>, IngestError)> {
        let mut sent: Vec<Sent<'a>> = Vec::with_capacity(rejects.len());
        let mut failed = Vec::new();
        let mut first_error = None;
        for (i, &r) in rejects.iter().enumerate() {
            match self.enqueue(r, None).await {
                Ok(future) => sent.push((r, None, future)),
                Err(e) if too_large(&e) => match self.fit(r).await {
                    Ok(t) => match self.enqueue(r, t.as_ref()).await {
                        Ok(future) => sent.push((r, t, future)),
                        Err(e) => {
                            first_error.get_or_insert_with(|| self.error(r, e));
                            failed.extend_from_slice(&rejects[i..]);
                            break;
                        }
                    },
                    Err(()) => {
                        first_error.get_or_insert_with(|| self.error(r, e));
                        failed.extend_from_slice(&rejects[i..]);
                        break;
                    }
                },
                Err(e) => {
                    // Not produced, and neither is anything after it.
                    first_error.get_or_insert_with(|| self.error(r, e));
                    failed.extend_from_slice(&rejects[i..]);
                    break;
                }
            }
        }
        let mut refused_as_too_large = Vec::new();
        for (r, truncation, future) in sent {
            match delivered(future).await {
                Ok(()) => {
                    if let Some(t) = truncation {
                        metrics::dlq_truncated(&self.metrics, r, t.keep);
                    }
                }
                Err(e) if too_large(&e) => {
                    if let Some(t) = &truncation {
                        self.cut_deeper(t);
                    }
                    refused_as_too_large.push((r, e));
                }
                Err(e) => {
                    first_error.get_or_insert_with(|| self.error(r, e));
                    failed.push(r);
                }
            }
        }
        // Refused by the broker (the topic's max.message.bytes): once more,
        // one at a time, cut to fit if it must be.
        for (r, e) in refused_as_too_large {
            let Ok(t) = self.fit(r).await else {
                first_error.get_or_insert_with(|| self.error(r, e));
                failed.push(r);
                continue;
            };
            let outcome = match self.enqueue(r, t.as_ref()).await {
                Ok(future) => delivered(future).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => {
                    if let Some(t) = &t {
                        metrics::dlq_truncated(&self.metrics, r, t.keep);
                    }
                }
                Err(e) => {
                    if let (true, Some(t)) = (too_large(&e), &t) {
                        self.cut_deeper(t);
                    }
                    first_error.get_or_insert_with(|| self.error(r, e));
                    failed.push(r);
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err((failed, e)),
        }
    }

    /// Enqueues one reject (whole, or cut as `truncation` says), waiting
    /// for room while librdkafka's queue is full.
    async fn enqueue(&self, r: &Reject, truncation: Option<&Truncation>) -> Result<rdkafka::producer::DeliveryFuture, KafkaError> {
        let partition = r.partition.to_string();
        let offset = r.offset.to_string();
        let time = format_rfc3339_ms(r.received_ms);
        let key = format!("{}/{}/{}", r.topic, r.partition, r.offset);
        let mut h = OwnedHeaders::new_with_capacity(11)
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
        let payload = match truncation {
            None => r.payload.as_slice(),
            Some(t) => {
                h = h
                    .insert(Header { key: headers::TRUNCATED, value: Some("true") })
                    .insert(Header { key: headers::ORIGINAL_BYTES, value: Some(&t.original_bytes) })
                    .insert(Header { key: headers::ORIGINAL_SHA256, value: Some(&t.original_sha256) });
                &r.payload[..t.keep]
            }
        };
        let mut record = FutureRecord::to(&self.topic).payload(payload).key(&key).headers(h);
        loop {
            match self.producer.send_result(record) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((source, _)) => return Err(source),
            }
        }
    }

    /// How `r` fits the DLQ: whole, or cut to the smaller of the producer's
    /// and the topic's `max.message.bytes` (asked of the broker once), less
    /// room for the framing. (The broker refuses a whole record batch that
    /// is too large, so a small reject batched with a large one is refused
    /// too: it is sent again whole.) `Err`: there is nothing left to cut.
    async fn fit(&self, r: &Reject) -> Result<Option<Truncation>, ()> {
        if self.limit.load(Ordering::Relaxed) == 0 {
            let topic_limit = self.topic_max_message_bytes().await;
            let limit = topic_limit.map_or(PRODUCER_MAX_BYTES, |t| t.min(PRODUCER_MAX_BYTES));
            let _ = self.limit.compare_exchange(0, limit, Ordering::Relaxed, Ordering::Relaxed);
        }
        let framing = FRAMING_BYTES + r.rejection.message.len() + r.rejection.field.len() + r.key.as_ref().map_or(0, Vec::len);
        let keep = self.limit.load(Ordering::Relaxed).saturating_sub(framing);
        if r.payload.len() <= keep {
            return Ok(None);
        }
        if keep == 0 {
            return Err(());
        }
        Ok(Some(Truncation { keep, original_bytes: r.payload.len().to_string(), original_sha256: hex::encode(sha2::Sha256::digest(&r.payload)) }))
    }

    /// A cut of `t.keep` bytes was still too large: the next is half as long.
    fn cut_deeper(&self, t: &Truncation) {
        self.limit.fetch_min(t.keep / 2 + FRAMING_BYTES, Ordering::Relaxed);
    }

    /// The DLQ topic's `max.message.bytes`, if the broker tells.
    async fn topic_max_message_bytes(&self) -> Option<usize> {
        use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
        let client: AdminClient<rdkafka::client::DefaultClientContext> = self.admin.create().ok()?;
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
        let resource = ResourceSpecifier::Topic(&self.topic);
        let results = tokio::time::timeout(Duration::from_secs(15), client.describe_configs([&resource], &options)).await.ok()?.ok()?;
        let entry = results.into_iter().next()?.ok()?;
        let limit = entry.entry_map().get("max.message.bytes")?.value.clone()?.parse().ok();
        tracing::info!(dlq = %self.topic, max_message_bytes = ?limit, "a reject exceeds the DLQ's message size; cutting such rejects to fit");
        limit
    }

    fn error(&self, r: &Reject, source: rdkafka::error::KafkaError) -> IngestError {
        IngestError::DlqProduce { dlq_topic: self.topic.clone(), topic: r.topic.to_string(), partition: r.partition, offset: r.offset, source }
    }

    /// Waits for anything still queued (at shutdown).
    pub fn flush(&self, timeout: Duration) {
        use rdkafka::producer::Producer as _;
        let _ = self.producer.flush(Timeout::After(timeout));
    }
}
