//! The dead-letter stage. In: rejected messages (original bytes and the
//! rejection). Out: one DLQ message each, acknowledged by the broker, with
//! headers that say why and where from. A transient produce failure is
//! retried and blocks the offset commit; a reject is never dropped: one
//! larger than the DLQ takes is written truncated (its payload, and a
//! producer's oversized key or a long message header), with headers that
//! say so.
//!
//! Failures are classified by what the broker said: a DLQ topic that does
//! not exist (checked at start and after any failure) or writes the
//! broker refuses (authorization, authentication) are permanent (exit 2);
//! a producer in a fatal state ends the run (exit 75: a restart makes a
//! new producer); anything else (a broker away, too few in-sync replicas,
//! a timeout) is waited out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
use crate::internal_events::{DlqTruncated, InternalEvent};
use crate::metrics::Metrics;
use crate::source::{is_permanent, FatalError};

/// The DLQ producer's context: librdkafka's error callback, logged, with
/// the first permanent or fatal error kept for the failure that follows.
#[derive(Debug, Default, Clone)]
pub struct DlqContext {
    fatal: Arc<FatalError>,
}

impl rdkafka::ClientContext for DlqContext {
    fn error(&self, error: KafkaError, reason: &str) {
        crate::source::client_error(&self.fatal, "DLQ producer", error, reason);
    }
}

type Producer = FutureProducer<DlqContext>;

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
    /// "true" when the producer's key was cut to fit (its size and SHA-256 follow).
    pub const SOURCE_KEY_TRUNCATED: &str = "inferlog.source.key.truncated";
    pub const SOURCE_KEY_BYTES: &str = "inferlog.source.key.bytes";
    pub const SOURCE_KEY_SHA256: &str = "inferlog.source.key.sha256";
    /// The size of the original message, when truncated.
    pub const ORIGINAL_BYTES: &str = "inferlog.original.bytes";
    /// Hex SHA-256 of the original message, when truncated.
    pub const ORIGINAL_SHA256: &str = "inferlog.original.sha256";
    /// "redacted" when the payload is not the original message, "none"
    /// when no payload is kept (an unreadable reject under `[kafka]
    /// dlq_payload = "redacted"`); the original's size and SHA-256 follow.
    pub const PAYLOAD: &str = "inferlog.payload";
    /// For a refused span of an OTLP message: its index among the
    /// message's spans, and its trace and span ids (hex).
    pub const SOURCE_SPAN_INDEX: &str = "inferlog.source.span_index";
    pub const TRACE_ID: &str = "inferlog.trace_id";
    pub const SPAN_ID: &str = "inferlog.span_id";
    /// The prefix of a producer header carried (`[kafka] dlq_headers`).
    pub const CARRIED: &str = "inferlog.header.";
}

/// A refused span's place in its OTLP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanRef {
    pub index: u32,
    pub trace_id: String,
    pub span_id: String,
}

/// A rejected message waiting for the DLQ.
#[derive(Debug, Clone)]
pub struct Reject {
    /// What the DLQ keeps ([`crate::redact`]).
    pub payload: Vec<u8>,
    pub key: Option<Vec<u8>>,
    /// Producer headers carried (`[kafka] dlq_headers`), as [`headers::CARRIED`]`<name>`.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The original's size and SHA-256, when `payload` is not the original.
    pub original: Option<crate::redact::Original>,
    pub rejection: Rejection,
    pub topic: std::sync::Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub received_ms: i64,
    /// Set for a span of an OTLP message: the payload is then the event
    /// the span mapped to, not the message.
    pub span: Option<SpanRef>,
}

/// librdkafka's largest message (`message.max.bytes`), set explicitly.
const PRODUCER_MAX_BYTES: usize = 1_000_000;

/// Room kept in a truncated message for its key, headers and the record
/// and batch framing.
const FRAMING_BYTES: usize = 1024;

/// What a truncated message keeps of the producer's key and of the
/// rejection's message header, at most.
const HEADER_KEEP: usize = 1024;

/// The smallest limit a refusal teaches: below it nothing but the framing fits.
const MIN_LIMIT: usize = FRAMING_BYTES + 64;

/// Refusals one reject may meet while it is cut deeper: each halves what
/// is sent, so 1,000,000 bytes reach [`MIN_LIMIT`] in fewer.
const MAX_CUTS: usize = 12;

/// What `r` takes whole, as [`Dlq::fit`] counts it.
fn whole_bytes(r: &Reject) -> usize {
    FRAMING_BYTES + r.rejection.message.len() + r.rejection.field.len() + r.key.as_ref().map_or(0, Vec::len) + r.payload.len()
}

/// A reject too large for the DLQ, written truncated: how it was cut.
#[derive(Debug, Clone)]
struct Truncation {
    keep: usize,
    /// What the cut message takes, as [`Dlq::fit`] counts it.
    bytes: usize,
    original_bytes: String,
    original_sha256: String,
    /// The producer's key, cut: (bytes kept, its size, its SHA-256).
    key: Option<(usize, String, String)>,
    /// Bytes kept of the rejection's message header.
    message_keep: usize,
}

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary.
fn prefix(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What happened to one reject in [`Dlq::send_all`].
type Sent<'a> = (&'a Reject, Option<Truncation>, rdkafka::producer::DeliveryFuture);

/// The DLQ producer.
pub struct Dlq {
    producer: Producer,
    context: DlqContext,
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
        let context = DlqContext::default();
        let mut config = crate::source::client_config(kafka)?;
        config.set("acks", "all").set("enable.idempotence", "true").set("message.max.bytes", PRODUCER_MAX_BYTES.to_string());
        // Defaults `kafka.options` may override.
        for (key, value) in [("linger.ms", "5"), ("message.timeout.ms", "60000")] {
            if !kafka.options.contains_key(key) {
                config.set(key, value);
            }
        }
        let producer: Producer =
            config.create_with_context(context.clone()).map_err(|e| IngestError::Config(format!("kafka DLQ producer: {e} (check kafka.options)")))?;
        Ok(Dlq { producer, context, topic: kafka.dlq_topic.clone(), admin, limit: AtomicUsize::new(0), metrics })
    }

    /// Checks at start that the DLQ topic exists, or that the broker
    /// creates topics on first use (`auto.create.topics.enable`); a missing
    /// DLQ is [`IngestError::DlqMissing`] (exit 2) before anything is read.
    pub async fn check_topic(&self) -> Result<(), IngestError> {
        match self.topic_exists().await {
            Some(true) => Ok(()),
            Some(false) => match self.broker_creates_topics().await {
                Some(true) => {
                    tracing::warn!(dlq = %self.topic, "the DLQ topic does not exist; the broker creates it on first use with its defaults (set its retention.ms to the hot policy)");
                    Ok(())
                }
                _ => Err(IngestError::DlqMissing { dlq_topic: self.topic.clone(), reason: "the broker does not create topics on first use".into() }),
            },
            // The broker did not answer: the produce retries will wait for it.
            None => Ok(()),
        }
    }

    /// Whether the DLQ topic exists, if the broker answers.
    async fn topic_exists(&self) -> Option<bool> {
        use rdkafka::producer::Producer as _;
        let producer = self.producer.clone();
        let topic = self.topic.clone();
        let metadata = tokio::task::spawn_blocking(move || producer.client().fetch_metadata(Some(&topic), Duration::from_secs(10))).await.ok()?;
        let metadata = metadata.ok()?;
        let t = metadata.topics().iter().find(|t| t.name() == self.topic)?;
        match t.error() {
            None => Some(!t.partitions().is_empty()),
            Some(e) => {
                let code = RDKafkaErrorCode::from(e);
                Some(!matches!(code, RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic))
            }
        }
    }

    /// The broker's `auto.create.topics.enable`, if it tells.
    async fn broker_creates_topics(&self) -> Option<bool> {
        use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
        use rdkafka::producer::Producer as _;
        let producer = self.producer.clone();
        let metadata = tokio::task::spawn_blocking(move || producer.client().fetch_metadata(None, Duration::from_secs(10))).await.ok()?.ok()?;
        let broker = metadata.brokers().first()?.id();
        let client: AdminClient<rdkafka::client::DefaultClientContext> = self.admin.create().ok()?;
        let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
        let results = tokio::time::timeout(Duration::from_secs(15), client.describe_configs([&ResourceSpecifier::Broker(broker)], &options))
            .await
            .ok()?
            .ok()?;
        let entry = results.into_iter().next()?.ok()?;
        entry.entry_map().get("auto.create.topics.enable")?.value.as_deref().map(|v| v == "true")
    }

    /// Produces every reject and waits until the broker acknowledged each.
    /// Returns the rejects not acknowledged (every one after an enqueue
    /// error too), with the first error, classified: the caller retries
    /// transient ones and commits nothing meanwhile. A reject larger than
    /// the DLQ takes is written truncated ([`headers::TRUNCATED`]), never
    /// dropped.
    pub async fn send_all<'a>(&self, rejects: &[&'a Reject]) -> Result<(), (Vec<&'a Reject>, IngestError)> {
        let mut sent: Vec<Sent<'a>> = Vec::with_capacity(rejects.len());
        let mut failed = Vec::new();
        let mut first_error = None;
        for (i, &r) in rejects.iter().enumerate() {
            // Cut at once to a limit a refusal already taught.
            let known = if self.limit.load(Ordering::Relaxed) > 0 { self.fit(r).await.unwrap_or(None) } else { None };
            let enqueued = match self.enqueue(r, known.as_ref()).await {
                Err(e) if too_large(&e) => match self.fit(r).await {
                    Ok(t) => self.enqueue(r, t.as_ref()).await.map(|future| (t, future)),
                    Err(()) => Err(e),
                },
                other => other.map(|future| (known, future)),
            };
            match enqueued {
                Ok((t, future)) => sent.push((r, t, future)),
                Err(e) => {
                    // Not produced, and neither is anything after it.
                    first_error.get_or_insert((r, e));
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
                        DlqTruncated { topic: &r.topic, partition: r.partition, offset: r.offset, bytes: r.payload.len(), kept: t.keep }
                            .emit(&self.metrics);
                    }
                }
                Err(e) if too_large(&e) => refused_as_too_large.push((r, e)),
                Err(e) => {
                    first_error.get_or_insert((r, e));
                    failed.push(r);
                }
            }
        }
        // Refused by the broker (the topic's max.message.bytes, which the
        // broker may not let inferlog read): once more, one at a time, each
        // cut deeper on every refusal until the broker takes it.
        for (r, e) in refused_as_too_large {
            if let Err(e) = self.send_cut(r, e).await {
                first_error.get_or_insert((r, e));
                failed.push(r);
            }
        }
        match first_error {
            None => Ok(()),
            Some((r, e)) => {
                // The topic's limit may change before the retry (an operator
                // fixing it): ask the broker again then.
                self.limit.store(0, Ordering::Relaxed);
                Err((failed, self.classify(r, e).await))
            }
        }
    }

    /// What a failed produce means: permanent (the DLQ is gone, or the
    /// broker refuses inferlog's writes), fatal (the idempotent producer
    /// cannot go on), or transient (waited out).
    async fn classify(&self, r: &Reject, source: KafkaError) -> IngestError {
        use rdkafka::producer::Producer as _;
        if let Some((_, reason)) = self.producer.client().fatal_error() {
            return IngestError::DlqFatal { reason };
        }
        let code = source.rdkafka_error_code().or_else(|| self.context.fatal.get().map(|(c, _)| c));
        if let Some(code) = code.filter(|c| is_permanent(*c)) {
            let reason = self.context.fatal.get().map_or_else(|| source.to_string(), |(_, reason)| format!("{source}: {reason}"));
            return IngestError::DlqRefused { dlq_topic: self.topic.clone(), code, reason };
        }
        // Any other failure may be a topic deleted under us: ask.
        if self.topic_exists().await == Some(false) && self.broker_creates_topics().await != Some(true) {
            return IngestError::DlqMissing { dlq_topic: self.topic.clone(), reason: format!("deleted while ingest ran ({source})") };
        }
        IngestError::DlqProduce { dlq_topic: self.topic.clone(), topic: r.topic.to_string(), partition: r.partition, offset: r.offset, source }
    }

    /// Enqueues one reject (whole, or cut as `truncation` says), waiting
    /// for room while librdkafka's queue is full.
    async fn enqueue(&self, r: &Reject, truncation: Option<&Truncation>) -> Result<rdkafka::producer::DeliveryFuture, KafkaError> {
        let partition = r.partition.to_string();
        let offset = r.offset.to_string();
        let time = format_rfc3339_ms(r.received_ms);
        let key = match &r.span {
            None => format!("{}/{}/{}", r.topic, r.partition, r.offset),
            Some(span) => format!("{}/{}/{}/{}", r.topic, r.partition, r.offset, span.index),
        };
        let span_index = r.span.as_ref().map(|s| s.index.to_string());
        let message = truncation.map_or(r.rejection.message.as_str(), |t| prefix(&r.rejection.message, t.message_keep));
        let mut h = OwnedHeaders::new_with_capacity(17)
            .insert(Header { key: headers::REASON, value: Some(r.rejection.reason.as_str()) })
            .insert(Header { key: headers::FIELD, value: Some(r.rejection.field.as_str()) })
            .insert(Header { key: headers::MESSAGE, value: Some(message) })
            .insert(Header { key: headers::SOURCE_TOPIC, value: Some(&*r.topic) })
            .insert(Header { key: headers::SOURCE_PARTITION, value: Some(&partition) })
            .insert(Header { key: headers::SOURCE_OFFSET, value: Some(&offset) })
            .insert(Header { key: headers::TIME, value: Some(&time) });
        if let (Some(span), Some(index)) = (&r.span, &span_index) {
            h = h
                .insert(Header { key: headers::SOURCE_SPAN_INDEX, value: Some(index) })
                .insert(Header { key: headers::TRACE_ID, value: Some(&span.trace_id) })
                .insert(Header { key: headers::SPAN_ID, value: Some(&span.span_id) });
        }
        if let Some(k) = &r.key {
            match truncation.and_then(|t| t.key.as_ref()) {
                None => h = h.insert(Header { key: headers::SOURCE_KEY, value: Some(k.as_slice()) }),
                Some((keep, bytes, sha256)) => {
                    h = h
                        .insert(Header { key: headers::SOURCE_KEY, value: Some(&k[..*keep]) })
                        .insert(Header { key: headers::SOURCE_KEY_TRUNCATED, value: Some("true") })
                        .insert(Header { key: headers::SOURCE_KEY_BYTES, value: Some(bytes) })
                        .insert(Header { key: headers::SOURCE_KEY_SHA256, value: Some(sha256) });
                }
            }
        }
        let carried: Vec<String> = r.headers.iter().map(|(name, _)| format!("{}{name}", headers::CARRIED)).collect();
        for ((_, value), name) in r.headers.iter().zip(&carried) {
            h = h.insert(Header { key: name.as_str(), value: Some(value.as_slice()) });
        }
        if let Some(o) = &r.original {
            // "none": an unreadable reject, whose payload is not kept (crate::redact).
            let kept = if r.payload.is_empty() { "none" } else { "redacted" };
            h = h
                .insert(Header { key: headers::PAYLOAD, value: Some(kept) })
                .insert(Header { key: headers::ORIGINAL_BYTES, value: Some(&o.bytes.to_string()) })
                .insert(Header { key: headers::ORIGINAL_SHA256, value: Some(&o.sha256) });
        }
        let payload = match truncation {
            Some(t) if t.keep < r.payload.len() => {
                h = h.insert(Header { key: headers::TRUNCATED, value: Some("true") });
                // A redacted payload's headers already name the original.
                if r.original.is_none() {
                    h = h
                        .insert(Header { key: headers::ORIGINAL_BYTES, value: Some(&t.original_bytes) })
                        .insert(Header { key: headers::ORIGINAL_SHA256, value: Some(&t.original_sha256) });
                }
                &r.payload[..t.keep]
            }
            _ => r.payload.as_slice(),
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

    /// How `r` fits the DLQ: cut to the smaller of the producer's and the
    /// topic's `max.message.bytes` (asked of the broker once), less room
    /// for the framing. A producer's key or a message header that alone
    /// leaves no room is cut too (to [`HEADER_KEEP`] bytes, its size and
    /// SHA-256 in headers), so every reject fits: it never blocks the
    /// commit. (The broker refuses a whole record batch that is too large,
    /// so a small reject batched with a large one is refused too: it is
    /// sent again whole.) `Err`: the topic takes less than the headers
    /// alone (a misconfigured DLQ): nothing is cut to nothing; the send
    /// fails and is retried until the topic is fixed.
    async fn fit(&self, r: &Reject) -> Result<Option<Truncation>, ()> {
        if self.limit.load(Ordering::Relaxed) == 0 {
            let topic_limit = self.topic_max_message_bytes().await;
            let limit = topic_limit.map_or(PRODUCER_MAX_BYTES, |t| t.min(PRODUCER_MAX_BYTES));
            let _ = self.limit.compare_exchange(0, limit, Ordering::Relaxed, Ordering::Relaxed);
        }
        let limit = self.limit.load(Ordering::Relaxed);
        let key_len = r.key.as_ref().map_or(0, Vec::len);
        let message_len = r.rejection.message.len();
        if whole_bytes(r) <= limit {
            return Ok(None);
        }
        // Headers first: a producer's key or a message that alone takes
        // more than a small share of the limit is cut.
        let cut_headers = FRAMING_BYTES + message_len + key_len > limit / 2;
        let key = r
            .key
            .as_ref()
            .filter(|k| cut_headers && k.len() > HEADER_KEEP)
            .map(|k| (HEADER_KEEP, k.len().to_string(), hex::encode(sha2::Sha256::digest(k))));
        let message_keep = if cut_headers { HEADER_KEEP.min(message_len) } else { message_len };
        let headers =
            FRAMING_BYTES + message_keep + r.rejection.field.len().min(HEADER_KEEP) + key.as_ref().map_or(key_len, |(keep, _, _)| *keep + 160);
        let keep = limit.saturating_sub(headers).min(r.payload.len());
        if keep == 0 && !r.payload.is_empty() {
            return Err(());
        }
        Ok(Some(Truncation {
            keep,
            bytes: headers + keep,
            original_bytes: r.payload.len().to_string(),
            original_sha256: hex::encode(sha2::Sha256::digest(&r.payload)),
            key,
            message_keep,
        }))
    }

    /// Sends `r` alone, cut to the limit known so far; each time the
    /// broker refuses it as too large, the limit becomes half of what was
    /// sent and `r` is cut again. The broker's refusal is itself the
    /// answer: without it, a DLQ whose `max.message.bytes` the broker does
    /// not let inferlog read (DescribeConfigs denied) would be sent the
    /// same refused message until the shutdown budget ran out. `Err`:
    /// another failure, or nothing fits (the headers alone are too large).
    async fn send_cut(&self, r: &Reject, mut refusal: KafkaError) -> Result<(), KafkaError> {
        for _ in 0..MAX_CUTS {
            let Ok(t) = self.fit(r).await else { return Err(refusal) };
            let sent = t.as_ref().map_or_else(|| whole_bytes(r), |t| t.bytes);
            let outcome = match self.enqueue(r, t.as_ref()).await {
                Ok(future) => delivered(future).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => {
                    if let Some(t) = &t {
                        DlqTruncated { topic: &r.topic, partition: r.partition, offset: r.offset, bytes: r.payload.len(), kept: t.keep }
                            .emit(&self.metrics);
                    }
                    return Ok(());
                }
                Err(e) if too_large(&e) && sent > MIN_LIMIT => {
                    let limit = (sent / 2).max(MIN_LIMIT);
                    tracing::info!(dlq = %self.topic, sent_bytes = sent, limit, "the broker refused a reject as too large; cutting it deeper");
                    self.limit.fetch_min(limit, Ordering::Relaxed);
                    refusal = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(refusal)
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

    /// Waits for anything still queued (at shutdown).
    pub fn flush(&self, timeout: Duration) {
        use rdkafka::producer::Producer as _;
        let _ = self.producer.flush(Timeout::After(timeout));
    }
}
