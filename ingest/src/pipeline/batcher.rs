//! The batch stage. In: each message the source stage admitted ([`Admitted`]:
//! its partition owned and started, what of it an earlier reader stored),
//! with the outcomes it normalized to. Out: the batch it fills, in offset
//! order: new rows, skipped replays and producer retries (they still move
//! the commit point), and rejects redacted for the DLQ; cut when full, old
//! or caught up ([`Batcher::cut`]) into the batch for the write stage and
//! what the commit stage keeps of it ([`Written`]).
//!
//! It owns the batch filling now, the dedup window of request ids made
//! durable ([`RecentIds`]: a producer's retry of a stored event is skipped,
//! another event under its id is rejected as `request_id.conflict`), the
//! redactor, and its count of duplicates. It needs no server: its tests
//! feed it messages and outcomes in process.

use std::time::{Duration, Instant};

use inferlog_schema::{ReasonCode, Rejection};
use rdkafka::message::Message;

use crate::batch::{Batch, PartitionKey, PartitionMap};
use crate::config::IngestConfig;
use crate::dedup::{RecentIds, Seen};
use crate::dlq::{Reject, SpanRef};
use crate::internal_events::{DuplicateSkipped, EventRejected, FieldsDropped, InternalEvent, SpansSkipped};
use crate::metrics::Metrics;
use crate::normalize::{Outcome, Span};
use crate::redact::{Redacted, Redactor};
use crate::service_metrics::Tally;
use crate::skew::Samples;

/// What the source stage decided about a message of a partition this
/// member owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Admitted {
    /// An earlier reader handled it whole (the replay log): skipped.
    Stored,
    /// To take; `stored_spans`: the spans of it an earlier reader stored (a
    /// crash between two days' inserts of its spans), skipped.
    Take { stored_spans: Option<Vec<u32>> },
}

/// One message's outcomes, as the normalizer left them.
pub(super) struct Normalized<'p, I> {
    /// One per event: a row encoded in `encoded`, or a rejection.
    pub outcomes: I,
    /// Spans of an OTLP message that were not inference requests.
    pub skipped_spans: u32,
    /// The bytes of the rows of its normalized piece.
    pub encoded: &'p [u8],
}

/// What the messages of one chunk share.
pub(super) struct Received<'s> {
    /// When the chunk was received, epoch ms.
    pub at_ms: i64,
    /// Event clocks against Kafka's, per topic.
    pub skews: &'s mut Samples,
}

/// What the pipeline keeps of a batch it handed to the write stage.
#[derive(Debug)]
pub(super) struct Written {
    /// First and last offset per partition: last + 1 is committed.
    pub offsets: PartitionMap<(i64, i64)>,
    /// Rows and rejects it holds.
    pub buffered: usize,
    pub rejects: usize,
    /// What its rows add to the service metrics, once durable.
    pub tallies: PartitionMap<Tally>,
    pub started: Instant,
}

/// The batch stage: the batch filling now and the dedup window.
pub(super) struct Batcher {
    batch: Batch,
    recent: RecentIds,
    redactor: Redactor,
    metrics: Metrics,
    max_rows: usize,
    max_bytes: usize,
    max_age: Duration,
    caught_up_rows: usize,
    /// The batch filling now began when the one before it was full: when
    /// the source goes quiet it is a backlog's tail, flushed whatever its size.
    after_full: bool,
    /// Events skipped as already stored (replays and producer retries).
    pub duplicates: u64,
}

impl Batcher {
    pub fn new(config: &IngestConfig, redactor: Redactor, metrics: Metrics) -> Batcher {
        Batcher {
            batch: Batch::default(),
            recent: RecentIds::new(config.dedup_window),
            redactor,
            metrics,
            max_rows: config.batch_max_rows,
            max_bytes: config.batch_max_bytes,
            max_age: config.batch_max_age,
            caught_up_rows: config.flush_when_caught_up_rows,
            after_full: false,
            duplicates: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Rows and rejects in the batch filling now.
    pub fn rows(&self) -> usize {
        self.batch.rows
    }

    /// Whether the batch is full by rows or bytes (the next message waits
    /// for a flush); if so, the batch after it is a backlog's tail
    /// ([`Batcher::caught_up_due`]).
    pub fn check_full(&mut self) -> bool {
        let full = self.batch.is_full(self.max_rows, self.max_bytes);
        self.after_full |= full;
        full
    }

    /// When the batch is old enough to flush, if it holds anything.
    pub fn flush_due(&self) -> Option<Instant> {
        self.batch.flush_due(self.max_age)
    }

    /// Whether the batch is flushed once the source goes quiet: it is big
    /// enough, or the tail of a backlog.
    pub fn caught_up_due(&self) -> bool {
        !self.batch.is_empty() && ((self.caught_up_rows > 0 && self.batch.rows >= self.caught_up_rows) || self.after_full)
    }

    /// The flush about to happen was not because the batch was full.
    pub fn flushing_unfull(&mut self) {
        self.after_full = false;
    }

    /// Whether this batch began right after a full one.
    pub fn after_full(&self) -> bool {
        self.after_full
    }

    /// Takes the rows and rejects of revoked partitions out of the batch:
    /// their next owner reads them again.
    pub fn drop_partitions(&mut self, revoked: &[(String, i32)]) {
        self.batch.drop_partitions(revoked);
    }

    /// Drops the whole batch unwritten (the group session was lost: every
    /// message in it is read again by the partitions' next owner).
    pub fn drop_all(&mut self) {
        self.batch = self.batch.emptied();
    }

    /// Cuts the batch for the write stage. Its request ids count as stored
    /// from now on (if the write fails, the daemon exits without
    /// committing, and both batches are read again).
    pub fn cut(&mut self) -> (Batch, Written) {
        let next = Batch::sized_like(&self.batch, self.max_bytes);
        let mut batch = std::mem::replace(&mut self.batch, next);
        self.recent.extend(std::mem::take(&mut batch.request_ids));
        let written = Written {
            offsets: batch.offsets.clone(),
            buffered: batch.rows,
            rejects: batch.rejects.len(),
            tallies: std::mem::take(&mut batch.tallies),
            started: Instant::now(),
        };
        (batch, written)
    }

    /// Takes one admitted message of partition `key` into the batch: each
    /// of its events a row, a skipped replay or retry, or a reject; a
    /// message none of whose events is taken still moves the commit point.
    /// `respan` rebuilds a span's ids and event for a later conflict.
    pub fn take_message<M: Message>(
        &mut self,
        message: &M,
        key: &PartitionKey,
        admitted: Admitted,
        normalized: Normalized<'_, impl Iterator<Item = Outcome>>,
        received: &mut Received<'_>,
        respan: &dyn Fn(u32) -> Option<Span>,
    ) {
        let offset = message.offset();
        let stored_spans = match admitted {
            Admitted::Stored => {
                self.duplicate("replay");
                self.batch.push_skipped(key.clone(), offset);
                return;
            }
            Admitted::Take { stored_spans } => stored_spans,
        };
        if normalized.skipped_spans > 0 {
            SpansSkipped { topic: &key.0, count: normalized.skipped_spans }.emit(&self.metrics);
        }
        let kafka_ms = crate::skew::kafka_ms(message.timestamp());
        let mut taken = false;
        for outcome in normalized.outcomes {
            if stored_spans.as_ref().is_some_and(|stored| stored.binary_search(&outcome.index()).is_ok()) {
                self.duplicate("replay");
                continue;
            }
            taken = true;
            self.take(message, key, outcome, normalized.encoded, kafka_ms, received, respan);
        }
        if !taken {
            // Every span was skipped: the message still moves the commit point.
            self.batch.push_skipped(key.clone(), offset);
        }
    }

    fn duplicate(&mut self, kind: &'static str) {
        DuplicateSkipped { kind }.emit(&self.metrics);
        self.duplicates += 1;
    }

    /// Takes one event of a message: a new row, a skipped retry, or a reject.
    #[allow(clippy::too_many_arguments)] // one event, its message and the chunk's shared state
    fn take<M: Message>(
        &mut self,
        message: &M,
        key: &PartitionKey,
        outcome: Outcome,
        encoded: &[u8],
        kafka_ms: Option<i64>,
        received: &mut Received<'_>,
        respan: &dyn Fn(u32) -> Option<Span>,
    ) {
        let (topic, partition, offset) = (&key.0, message.partition(), message.offset());
        let index = outcome.index();
        let (rejection, span) = match outcome {
            Outcome::Row { day, timestamp_ms, fingerprint, content, range, dropped_fields, observation, span } => {
                if dropped_fields > 0 {
                    FieldsDropped { count: dropped_fields }.emit(&self.metrics);
                }
                if let Some(kafka_ms) = kafka_ms {
                    let metrics = &self.metrics;
                    received.skews.observe(topic, || metrics.skew_histogram(topic), crate::skew::seconds(timestamp_ms, kafka_ms));
                }
                let stored = self.recent.get(fingerprint).or_else(|| self.batch.request_ids.get(&fingerprint).copied());
                match Seen::of(stored, content) {
                    Seen::New => {
                        if let Some(o) = &observation {
                            self.batch.observe(key, o);
                        }
                        self.batch.push_row(day, &encoded[range], (fingerprint, content), key.clone(), (offset, index));
                        return;
                    }
                    Seen::Retry => {
                        self.duplicate("request_id");
                        self.batch.push_skipped(key.clone(), offset);
                        return;
                    }
                    Seen::Conflict => {
                        let rejection = Rejection::new(
                            ReasonCode::RequestIdConflict,
                            "request_id",
                            "a different event with this request_id was already stored (ids must be unique per request; a retry must resend the same event)",
                        );
                        // A span's ids and event are written again from the message.
                        (rejection, span.and_then(respan).map(Box::new))
                    }
                }
            }
            Outcome::Rejected(rejection, span) => (crate::skew::explain(rejection, kafka_ms, received.at_ms), span),
        };
        EventRejected { reason: rejection.reason.as_str() }.emit(&self.metrics);
        // A span's reject keeps the event it mapped to, not the whole message.
        let payload = span.as_ref().map_or_else(|| message.payload().unwrap_or_default(), |s| s.event.as_slice());
        let Redacted { payload, key: source_key, original } = self.redactor.redact(payload, message.key(), rejection.reason);
        let headers = self.redactor.carried(message.headers());
        let span = span.map(|s| SpanRef { index: s.index, trace_id: s.trace_id, span_id: s.span_id });
        let received_ms = received.at_ms;
        let reject = Reject { payload, key: source_key, headers, original, rejection, topic: topic.clone(), partition, offset, received_ms, span };
        self.batch.push_reject(reject, key.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use inferlog_schema::generate::{Generator, GeneratorConfig};
    use inferlog_schema::{Contract, ContractConfig, UserIdHasher};
    use inferlog_store::kafka::{DlqPayload, TopicEncoding};
    use rdkafka::message::{OwnedMessage, Timestamp};

    use super::*;
    use crate::config::OtlpConfig;
    use crate::normalize::{Input, Normalizer};

    const NOW_MS: i64 = 1_793_491_200_000;

    /// The batch stage with a real normalizer in front of it, and no server.
    struct Harness {
        normalizer: Normalizer,
        batcher: Batcher,
        topic: Arc<str>,
    }

    impl Harness {
        fn new(config: IngestConfig) -> Harness {
            let hasher = UserIdHasher::new(b"batcher-test-key-0123456789abcdef", None, "test").expect("key");
            let contract = Contract::new(&ContractConfig::default()).expect("default contract");
            let normalizer = Normalizer::new(contract, hasher.clone(), &OtlpConfig::default(), 1, None).expect("normalizer");
            let batcher = Batcher::new(&config, Redactor::new(DlqPayload::Redacted, hasher), Metrics::new());
            Harness { normalizer, batcher, topic: Arc::from("events") }
        }

        /// Normalizes `payload` as the message at `offset` of `partition`
        /// and hands it to the batch stage as the source admitted it.
        fn take(&mut self, partition: i32, offset: i64, payload: &[u8], admitted: Admitted) {
            let input = Input { payload, topic: &self.topic, partition: partition as u16, offset, encoding: TopicEncoding::Json };
            let pieces = self.normalizer.normalize(&[input], NOW_MS);
            let piece = pieces.into_iter().next().expect("one piece");
            let message = OwnedMessage::new(
                Some(payload.to_vec()),
                Some(b"key".to_vec()),
                self.topic.to_string(),
                Timestamp::CreateTime(NOW_MS),
                partition,
                offset,
                None,
            );
            let mut skews = crate::skew::Samples::default();
            let normalized = Normalized { outcomes: piece.outcomes.into_iter(), skipped_spans: 0, encoded: &piece.bytes };
            let key = (self.topic.clone(), partition);
            self.batcher.take_message(&message, &key, admitted, normalized, &mut Received { at_ms: NOW_MS, skews: &mut skews }, &|_| None);
        }
    }

    fn take() -> Admitted {
        Admitted::Take { stored_spans: None }
    }

    /// `n` valid events, one JSON line each.
    fn events(n: usize) -> Vec<Vec<u8>> {
        let config = GeneratorConfig { seed: 11, days: 1, end_ms: NOW_MS, invalid_ratio: 0.0 };
        Generator::new(config).take(n).map(|e| e.line).collect()
    }

    /// The same request with other content: its output tokens plus one.
    fn changed(event: &[u8]) -> Vec<u8> {
        let mut value: serde_json::Value = serde_json::from_slice(event).expect("json");
        let object = value.as_object_mut().expect("object");
        let field = object.keys().find(|k| k.ends_with("output_tokens")).cloned().expect("output tokens");
        let tokens = object[&field].as_u64().expect("a count");
        object.insert(field, serde_json::json!(tokens + 1));
        serde_json::to_vec(&value).expect("json")
    }

    fn rows_of(batch: &Batch) -> usize {
        batch.days.values().flat_map(|d| d.values()).map(|r| r.fingerprints.len()).sum()
    }

    /// A producer's retry (same id, same event) is skipped but moves the
    /// commit point; another event under a stored id is rejected as
    /// `request_id.conflict`, redacted; both hold across a cut, when the
    /// ids count as stored.
    #[test]
    fn a_retry_is_skipped_and_another_event_under_its_id_is_a_conflict() {
        let mut h = Harness::new(IngestConfig::default());
        let events = events(5);
        for (offset, event) in events.iter().enumerate() {
            h.take(0, offset as i64, event, take());
        }
        h.take(0, 5, &events[1], take());
        h.take(0, 6, &changed(&events[2]), take());
        let (batch, written) = h.batcher.cut();
        assert_eq!(rows_of(&batch), 5, "the five events, the retry not again");
        assert_eq!(batch.rejects.len(), 1);
        let reject = &batch.rejects[0];
        assert_eq!((reject.rejection.reason, reject.rejection.field.as_str(), reject.offset), (ReasonCode::RequestIdConflict, "request_id", 6));
        assert!(reject.original.is_some(), "redacted: the DLQ keeps the original's size and hash, not its bytes");
        assert_eq!(batch.offsets[&(h.topic.clone(), 0)], (0, 6), "the retry and the conflict move the commit point");
        assert_eq!((written.buffered, written.rejects), (6, 1));
        assert_eq!(h.batcher.duplicates, 1);
        // The next batch: the ids of the one handed over count as stored.
        h.take(0, 7, &events[0], take());
        h.take(0, 8, &changed(&events[4]), take());
        let (batch, _) = h.batcher.cut();
        assert_eq!(rows_of(&batch), 0);
        assert_eq!(batch.rejects.iter().map(|r| (r.offset, r.rejection.reason)).collect::<Vec<_>>(), [(8, ReasonCode::RequestIdConflict)]);
        assert_eq!(h.batcher.duplicates, 2);
    }

    /// A message an earlier reader stored is skipped whole, and one whose
    /// spans were partly stored keeps the others; both move the commit point.
    #[test]
    fn what_an_earlier_reader_stored_is_skipped_and_moves_the_commit_point() {
        let mut h = Harness::new(IngestConfig::default());
        let events = events(3);
        h.take(2, 40, &events[0], Admitted::Stored);
        h.take(2, 41, &events[1], take());
        // A JSON event is span 0: stored spans [0] skip it.
        h.take(2, 42, &events[2], Admitted::Take { stored_spans: Some(vec![0]) });
        let (batch, written) = h.batcher.cut();
        assert_eq!(rows_of(&batch), 1);
        assert_eq!(batch.offsets[&(h.topic.clone(), 2)], (40, 42));
        assert_eq!(written.offsets[&(h.topic.clone(), 2)], (40, 42));
        assert_eq!(h.batcher.duplicates, 2);
    }

    /// A revoked partition's rows and offsets leave the batch; the other
    /// partition's stay and are what the commit stage gets.
    #[test]
    fn a_revoked_partition_leaves_the_batch() {
        let mut h = Harness::new(IngestConfig::default());
        let events = events(4);
        h.take(0, 0, &events[0], take());
        h.take(1, 0, &events[1], take());
        h.take(0, 1, &events[2], take());
        h.take(1, 1, &events[3], take());
        h.batcher.drop_partitions(&[("events".to_owned(), 1)]);
        let (batch, written) = h.batcher.cut();
        assert_eq!(rows_of(&batch), 2);
        assert_eq!(written.offsets.keys().cloned().collect::<Vec<_>>(), [(h.topic.clone(), 0)]);
        assert_eq!(written.buffered, 2);
    }

    /// A batch full by rows calls for a flush, and the batch after it is a
    /// backlog's tail, flushed when the source goes quiet whatever its
    /// size, until a flush that was not for fullness.
    #[test]
    fn the_batch_after_a_full_one_is_flushed_when_the_source_is_quiet() {
        let config = IngestConfig { batch_max_rows: 3, flush_when_caught_up_rows: 100, ..IngestConfig::default() };
        let mut h = Harness::new(config);
        let events = events(5);
        for (offset, event) in events.iter().take(2).enumerate() {
            h.take(0, offset as i64, event, take());
            assert!(!h.batcher.check_full());
        }
        assert!(!h.batcher.caught_up_due(), "2 rows: below flush_when_caught_up_rows");
        h.take(0, 2, &events[2], take());
        assert!(h.batcher.check_full());
        let _ = h.batcher.cut();
        assert!(!h.batcher.caught_up_due(), "nothing to flush");
        h.take(0, 3, &events[3], take());
        assert!(h.batcher.caught_up_due(), "the tail of a backlog");
        h.batcher.flushing_unfull();
        let _ = h.batcher.cut();
        h.take(0, 4, &events[4], take());
        assert!(!h.batcher.caught_up_due(), "a trickle waits for batch_max_age");
        assert!(h.batcher.flush_due().is_some());
    }
}
