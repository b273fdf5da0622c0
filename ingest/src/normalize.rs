//! The normalizing stage. In: the payloads of a run of Kafka messages that
//! librdkafka had ready, with their coordinates and the time they were
//! received. Out: for each, in the same order, its hot row encoded as
//! RowBinary (with its UTC day, its event time, its request-id fingerprint
//! and the hash of its content, and what it adds to the live service
//! metrics) or its rejection (`inferlog-schema`). A message of an OTLP
//! topic gives one such outcome per inference span ([`crate::otlp`]), each
//! with the span's index and ids, and a count of the other spans.
//!
//! Validation and encoding are most of ingest's CPU. They are pure, so a
//! chunk is spread over `ingest.normalize_threads` threads while the
//! pipeline waits; what is then skipped (replays, producer retries),
//! batched or rejected is decided by the pipeline, message by message, in
//! offset order.

use std::ops::Range;
use std::sync::Arc;

use inferlog_schema::{Contract, Fields, Normalized, Rejection, UserIdHasher};
use inferlog_store::config::OtlpConfig;
use inferlog_store::kafka::TopicEncoding;
use inferlog_store::model::rows::HotRow;
use rayon::prelude::*;

use crate::dedup::fingerprint;
use crate::error::IngestError;
use crate::otlp::{self, Mapped, Mapper};
use crate::service_metrics::{Cache, Interner, Observation};

/// The most messages normalized together: a few milliseconds of work, so
/// the pipeline's other duties (commits, rebalances, timers) wait no longer.
pub const CHUNK: usize = 2048;

/// Messages one thread takes at a time: their rows share one buffer.
const PIECE: usize = 128;

/// About what one event's row takes, encoded (most are 250 to 400 bytes).
const ROW_BYTES: usize = 384;

/// Below this many messages a chunk is normalized on the calling thread:
/// handing it to the pool would cost more than it saves.
const PARALLEL_FROM: usize = 64;

/// One message to normalize.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub payload: &'a [u8],
    pub topic: &'a Arc<str>,
    /// As the tables store it (checked when the partition was assigned).
    pub partition: u16,
    pub offset: i64,
    pub encoding: TopicEncoding,
}

/// Where a refused event came from in an OTLP message, and the event the
/// span mapped to (what the DLQ keeps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub index: u32,
    /// Hex, as OTLP/JSON writes them.
    pub trace_id: String,
    pub span_id: String,
    /// The event it mapped to, as JSON.
    pub event: Vec<u8>,
}

/// What one event (a JSON message, or an inference span) became.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A valid event: its row is `range` of its piece's bytes.
    Row {
        day: u16,
        /// The event's own time, epoch ms.
        timestamp_ms: i64,
        fingerprint: u64,
        /// Hash of the row's event bytes (not its Kafka coordinates): equal
        /// for two retries of one request, different for two requests
        /// sharing an id.
        content: u64,
        range: Range<usize>,
        dropped_fields: usize,
        /// What it adds to the service metrics (when they are on).
        observation: Option<Observation>,
        /// A span's index in its message (its ids and event are written
        /// only if the row is refused later: [`Normalizer::span`]).
        span: Option<u32>,
    },
    /// Refused; for a span, with the span (a message of an OTLP topic
    /// refused whole, `otlp.malformed`, has none).
    Rejected(Rejection, Option<Box<Span>>),
}

impl Outcome {
    /// Its index in its message: the span's, 0 for a JSON event.
    pub fn index(&self) -> u32 {
        match self {
            Outcome::Row { span, .. } => span.unwrap_or(0),
            Outcome::Rejected(_, span) => span.as_ref().map_or(0, |s| s.index),
        }
    }
}

/// Where one message's outcomes end in its piece, and how many of its
/// spans were not inference requests (always 0 for a JSON message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageEnd {
    pub end: u32,
    pub skipped_spans: u32,
}

/// Consecutive messages' outcomes, and the bytes their rows are encoded in.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Piece {
    pub bytes: Vec<u8>,
    pub outcomes: Vec<Outcome>,
    /// One per message, in order: its outcomes are those before `end`
    /// (and after the previous message's).
    pub messages: Vec<MessageEnd>,
}

/// The contract, the user-id hasher and the threads that apply them.
#[derive(Debug)]
pub struct Normalizer {
    contract: Contract,
    hasher: UserIdHasher,
    pool: Option<rayon::ThreadPool>,
    /// The service metrics' labels, when they are on.
    observer: Option<Arc<Interner>>,
    /// Spans to events, for OTLP topics.
    mapper: Mapper,
}

impl Normalizer {
    /// `threads` > 1 starts a pool of that many threads (named
    /// `normalize-N`); 1 normalizes on the caller's thread. With
    /// `observer`, each row also gets its service metrics' observation.
    pub fn new(
        contract: Contract,
        hasher: UserIdHasher,
        otlp: &OtlpConfig,
        threads: usize,
        observer: Option<Arc<Interner>>,
    ) -> Result<Normalizer, IngestError> {
        let pool = if threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("normalize-{i}"))
                .build()
                .map_err(|e| IngestError::Config(format!("cannot start {threads} normalize threads: {e}")))?;
            Some(pool)
        } else {
            None
        };
        let mapper = Mapper::new(otlp.clone(), contract.dictionary());
        Ok(Normalizer { contract, hasher, pool, observer, mapper })
    }

    /// Normalizes and encodes every message, as received at `received_ms`;
    /// the pieces hold the outcomes in input order. Blocks the calling
    /// thread until the whole chunk is done.
    pub fn normalize(&self, inputs: &[Input<'_>], received_ms: i64) -> Vec<Piece> {
        let piece = |inputs: &[Input<'_>]| self.piece(inputs, received_ms);
        match &self.pool {
            Some(pool) if inputs.len() >= PARALLEL_FROM => pool.install(|| inputs.par_chunks(PIECE).map(piece).collect()),
            _ => inputs.chunks(PIECE).map(piece).collect(),
        }
    }

    /// One DLQ message again, validated as if received at `received_ms`
    /// (its rejection time) and stored at `ingested_at`: with `span`, the
    /// event a refused span mapped to, at that index of its message;
    /// without, the message in `input.encoding`.
    pub fn replayed(&self, input: &Input<'_>, span: Option<u32>, received_ms: i64, ingested_at: u32) -> Piece {
        let Some(index) = span else {
            return self.piece_at(std::slice::from_ref(input), received_ms, ingested_at);
        };
        let mut piece = Piece::default();
        let outcome = self.event(input.payload, input, Some(index), received_ms, ingested_at, &mut Cache::default(), &mut piece.bytes);
        piece.outcomes.push(match outcome {
            Ok(row) => row,
            Err(rejection) => {
                let span = Span { index, trace_id: String::new(), span_id: String::new(), event: input.payload.to_vec() };
                Outcome::Rejected(rejection, Some(Box::new(span)))
            }
        });
        piece.messages.push(MessageEnd { end: 1, skipped_spans: 0 });
        piece
    }

    fn piece(&self, inputs: &[Input<'_>], received_ms: i64) -> Piece {
        self.piece_at(inputs, received_ms, (received_ms / 1000) as u32)
    }

    fn piece_at(&self, inputs: &[Input<'_>], received_ms: i64, ingested_at: u32) -> Piece {
        let mut piece = Piece {
            bytes: Vec::with_capacity(inputs.len() * ROW_BYTES),
            outcomes: Vec::with_capacity(inputs.len()),
            messages: Vec::with_capacity(inputs.len()),
        };
        let mut cache = Cache::default();
        for input in inputs {
            let mut skipped_spans = 0;
            if input.encoding.is_otlp() {
                skipped_spans = self.spans(input, received_ms, ingested_at, &mut cache, &mut piece);
            } else {
                let outcome = self.event(input.payload, input, None, received_ms, ingested_at, &mut cache, &mut piece.bytes);
                piece.outcomes.push(outcome.unwrap_or_else(|rejection| Outcome::Rejected(rejection, None)));
            }
            piece.messages.push(MessageEnd { end: piece.outcomes.len() as u32, skipped_spans });
        }
        piece
    }

    /// Validates and encodes one event: a JSON message's, or the one at
    /// `span` of its message.
    #[allow(clippy::too_many_arguments)] // one event's coordinates and the piece's buffers
    fn event(
        &self,
        payload: &[u8],
        input: &Input<'_>,
        span: Option<u32>,
        received_ms: i64,
        ingested_at: u32,
        cache: &mut Cache,
        bytes: &mut Vec<u8>,
    ) -> Result<Outcome, Rejection> {
        let normalized = self.contract.normalize(payload, Some(received_ms), &self.hasher)?;
        Ok(self.row(normalized, input, span, ingested_at, cache, bytes))
    }

    /// Encodes a valid event: a JSON message's, or the one at `span` of its message.
    fn row(&self, normalized: Normalized, input: &Input<'_>, span: Option<u32>, ingested_at: u32, cache: &mut Cache, bytes: &mut Vec<u8>) -> Outcome {
        let fingerprint = fingerprint(&normalized.event.request_id);
        let timestamp_ms = normalized.event.timestamp_ms;
        let mut row = HotRow::new(normalized.event, input.topic.clone(), input.partition, input.offset, ingested_at);
        row.kafka_index = span.unwrap_or(0);
        let start = bytes.len();
        let event = row.encode(bytes);
        let content = content_hash(&bytes[start..start + event]);
        let observation = self.observer.as_ref().map(|o| o.observe(&row, cache));
        Outcome::Row {
            day: row.day,
            timestamp_ms,
            fingerprint,
            content,
            range: start..bytes.len(),
            dropped_fields: normalized.dropped_fields.len(),
            observation,
            span,
        }
    }

    /// An OTLP message: one outcome per inference span, in message order;
    /// returns how many spans were skipped. Each span's fields go to the
    /// contract as they are
    /// ([`MappedEvent::fields`](crate::otlp::MappedEvent::fields)); its
    /// JSON and hex ids are written only for a reject.
    fn spans(&self, input: &Input<'_>, received_ms: i64, ingested_at: u32, cache: &mut Cache, piece: &mut Piece) -> u32 {
        let max_event_bytes = self.contract.config().max_event_bytes;
        let decoded = otlp::decode(input.payload, input.encoding, |traces| {
            // Room for every span's row at once: a piece sized by its
            // messages would grow, and copy, many times over.
            piece.outcomes.reserve(traces.spans.len());
            piece.bytes.reserve(traces.spans.len() * ROW_BYTES);
            let mut skipped = 0;
            for s in otlp::spans(traces) {
                let Mapped::Event(event) = self.mapper.map(&s) else {
                    skipped += 1;
                    continue;
                };
                // The JSON only where the fields cannot stand in for it.
                let mut fields = Fields::default();
                let (normalized, json) = if event.fields(max_event_bytes, &mut fields) {
                    (self.contract.normalize_fields(&mut fields, Some(received_ms), &self.hasher), None)
                } else {
                    let json = event.json();
                    (self.contract.normalize(&json, Some(received_ms), &self.hasher), Some(json))
                };
                let outcome = match normalized {
                    Ok(normalized) => self.row(normalized, input, Some(s.index), ingested_at, cache, &mut piece.bytes),
                    Err(rejection) => Outcome::Rejected(rejection, Some(Box::new(refused(&s, json.unwrap_or_else(|| event.json()))))),
                };
                piece.outcomes.push(outcome);
            }
            skipped
        });
        decoded.unwrap_or_else(|rejection| {
            piece.outcomes.push(Outcome::Rejected(rejection, None));
            0
        })
    }

    /// Span `index` of an OTLP message, as a refusal keeps it (`None` if
    /// the message holds no such inference span).
    pub fn span(&self, payload: &[u8], encoding: TopicEncoding, index: u32) -> Option<Span> {
        otlp::decode(payload, encoding, |traces| {
            let s = otlp::spans(traces).find(|s| s.index == index)?;
            match self.mapper.map(&s) {
                Mapped::Event(event) => Some(refused(&s, event.json())),
                Mapped::Skipped => None,
            }
        })
        .ok()
        .flatten()
    }
}

/// A refused span: its place, its ids and the event it mapped to.
fn refused(s: &otlp::ResourceSpan<'_>, event: Vec<u8>) -> Span {
    Span { index: s.index, trace_id: hex::encode(s.span.trace_id), span_id: hex::encode(s.span.span_id), event }
}

/// A fixed-seed hash of a row's event bytes (the same in every process).
fn content_hash(event: &[u8]) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::fast::FixedState::with_seed(0x1f3a_5c7e_9b2d_4e6f).hash_one(event)
}

#[cfg(test)]
mod tests {
    use inferlog_schema::generate::{Generator, GeneratorConfig};
    use inferlog_schema::ContractConfig;

    use super::*;

    fn normalizer(threads: usize) -> Normalizer {
        let contract = Contract::new(&ContractConfig::default()).expect("default contract");
        let hasher = UserIdHasher::new(b"normalize-test-key-0123456789abcdef", None, "test").expect("key");
        Normalizer::new(contract, hasher, &OtlpConfig::default(), threads, None).expect("pool")
    }

    /// Outcomes in input order, each row with its own bytes.
    fn flat(pieces: &[Piece]) -> Vec<(Outcome, Vec<u8>)> {
        pieces
            .iter()
            .flat_map(|p| {
                p.outcomes.iter().map(|o| {
                    let bytes = match o {
                        Outcome::Row { range, .. } => p.bytes[range.clone()].to_vec(),
                        Outcome::Rejected(..) => Vec::new(),
                    };
                    let o = match o {
                        Outcome::Row { day, timestamp_ms, fingerprint, content, dropped_fields, observation, .. } => Outcome::Row {
                            day: *day,
                            timestamp_ms: *timestamp_ms,
                            fingerprint: *fingerprint,
                            content: *content,
                            range: 0..0,
                            dropped_fields: *dropped_fields,
                            observation: *observation,
                            span: None,
                        },
                        other => other.clone(),
                    };
                    (o, bytes)
                })
            })
            .collect()
    }

    /// The pool gives, in order, exactly what one thread gives, rejects
    /// included (10% of the generated events are broken on purpose), and
    /// each row is the event's hot row, encoded.
    #[test]
    fn parallel_chunks_match_the_sequential_result_in_order() {
        let config = GeneratorConfig { seed: 7, days: 1, end_ms: 1_793_491_200_000, invalid_ratio: 0.1 };
        let lines: Vec<Vec<u8>> = Generator::new(config).take(CHUNK + 17).map(|e| e.line).collect();
        let topic: Arc<str> = Arc::from("events");
        let inputs: Vec<Input<'_>> = lines
            .iter()
            .enumerate()
            .map(|(i, l)| Input { payload: l, topic: &topic, partition: 3, offset: i as i64, encoding: TopicEncoding::Json })
            .collect();
        let received_ms = 1_793_491_200_000;
        let sequential = flat(&normalizer(1).normalize(&inputs, received_ms));
        let parallel = flat(&normalizer(3).normalize(&inputs, received_ms));
        assert_eq!(sequential.len(), inputs.len());
        assert!(sequential.iter().any(|(o, _)| matches!(o, Outcome::Rejected(..))), "rejects are exercised");
        assert_eq!(parallel, sequential);
        // A short chunk takes the calling thread's path and agrees too.
        assert_eq!(flat(&normalizer(3).normalize(&inputs[..5], received_ms)), sequential[..5].to_vec());

        let contract = Contract::new(&ContractConfig::default()).expect("default contract");
        let hasher = UserIdHasher::new(b"normalize-test-key-0123456789abcdef", None, "test").expect("key");
        for (i, (outcome, bytes)) in sequential.iter().enumerate() {
            match (outcome, contract.normalize(&lines[i], Some(received_ms), &hasher)) {
                (Outcome::Row { day, fingerprint: f, dropped_fields, timestamp_ms, .. }, Ok(normalized)) => {
                    assert_eq!(*f, fingerprint(&normalized.event.request_id));
                    assert_eq!(*timestamp_ms, normalized.event.timestamp_ms);
                    assert_eq!(*dropped_fields, normalized.dropped_fields.len());
                    let row = HotRow::new(normalized.event, topic.clone(), 3, i as i64, (received_ms / 1000) as u32);
                    assert_eq!(*day, row.day);
                    let mut want = Vec::new();
                    row.encode(&mut want);
                    assert_eq!(*bytes, want, "message {i}");
                }
                (Outcome::Rejected(r, None), Err(want)) => assert_eq!(*r, want),
                (got, want) => panic!("message {i}: {got:?} against {want:?}"),
            }
        }
    }

    /// Two copies of one request read at different offsets share a content
    /// hash; a changed field gives another.
    #[test]
    fn retries_share_a_content_hash_and_other_content_does_not() {
        let n = normalizer(1);
        let topic: Arc<str> = Arc::from("events");
        let line = br#"{"request_id":"r-1","timestamp":"2026-11-29T23:00:00Z","business_line":"search","model_name":"m","model_version":"v1","input_tokens":10,"output_tokens":5,"total_latency_ms":120.5,"error_code":0}"#;
        let other = br#"{"request_id":"r-1","timestamp":"2026-11-29T23:00:00Z","business_line":"search","model_name":"m","model_version":"v1","input_tokens":11,"output_tokens":5,"total_latency_ms":120.5,"error_code":0}"#;
        let inputs = [
            Input { payload: line, topic: &topic, partition: 0, offset: 1, encoding: TopicEncoding::Json },
            Input { payload: line, topic: &topic, partition: 2, offset: 90, encoding: TopicEncoding::Json },
            Input { payload: other, topic: &topic, partition: 0, offset: 2, encoding: TopicEncoding::Json },
        ];
        let contents: Vec<u64> = flat(&n.normalize(&inputs, 1_796_000_000_000))
            .into_iter()
            .map(|(o, _)| match o {
                Outcome::Row { content, .. } => content,
                Outcome::Rejected(r, _) => panic!("{r:?}"),
            })
            .collect();
        assert_eq!(contents[0], contents[1], "a retry at another offset");
        assert_ne!(contents[0], contents[2], "another request under the same id");
    }

    /// An OTLP message: each inference span one outcome, in span order,
    /// with its index in the row and its ids on a refusal; other spans
    /// counted; a message that is not OTLP refused whole; a JSON message
    /// one outcome with index 0.
    #[test]
    fn an_otlp_message_gives_one_outcome_per_inference_span() {
        use opentelemetry_proto::tonic::common::v1::{any_value::Value as V, AnyValue, KeyValue};
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as OtlpSpan, TracesData};
        use prost::Message as _;
        let kv = |k: &str, v: V| KeyValue { key: k.into(), value: Some(AnyValue { value: Some(v) }), ..KeyValue::default() };
        let end = 1_796_000_000_000_000_000u64;
        let request = |id: &str, tokens: i64| OtlpSpan {
            name: "llm_request".into(),
            trace_id: vec![7; 16],
            span_id: vec![tokens as u8; 8],
            end_time_unix_nano: end,
            attributes: vec![
                kv("gen_ai.request.id", V::StringValue(id.into())),
                kv("gen_ai.response.model", V::StringValue("m".into())),
                kv("inferlog.model_version", V::StringValue("v1".into())),
                kv("gen_ai.usage.prompt_tokens", V::IntValue(tokens)),
                kv("gen_ai.usage.completion_tokens", V::IntValue(3)),
                kv("gen_ai.latency.e2e", V::DoubleValue(0.5)),
            ],
            ..OtlpSpan::default()
        };
        let other = OtlpSpan { name: "GET /v1/models".into(), ..OtlpSpan::default() };
        let traces = TracesData {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![other.clone(), request("a", 10), request("b", -1), other, request("c", 12)],
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        let proto = traces.encode_to_vec();
        let topic: Arc<str> = Arc::from("spans");
        let json_line = br#"{"request_id":"j","timestamp":"2026-11-29T23:00:00Z","model_name":"m","model_version":"v1","input_tokens":1,"output_tokens":1,"total_latency_ms":1,"error_code":0}"#;
        let inputs = [
            Input { payload: &proto, topic: &topic, partition: 1, offset: 40, encoding: TopicEncoding::OtlpProto },
            Input { payload: b"not protobuf \xff", topic: &topic, partition: 1, offset: 41, encoding: TopicEncoding::OtlpProto },
            Input { payload: json_line, topic: &topic, partition: 1, offset: 42, encoding: TopicEncoding::Json },
        ];
        let piece = normalizer(1).normalize(&inputs, 1_796_000_001_000).remove(0);
        let ends: Vec<(u32, u32)> = piece.messages.iter().map(|m| (m.end, m.skipped_spans)).collect();
        assert_eq!(ends, vec![(3, 2), (4, 0), (5, 0)]);
        let index_of = |range: &Range<usize>| {
            // kafka_index sits before ingested_at, the row's last 8 bytes.
            let row = &piece.bytes[range.clone()];
            u32::from_le_bytes(row[row.len() - 8..row.len() - 4].try_into().expect("4 bytes"))
        };
        match &piece.outcomes[..3] {
            [Outcome::Row { range: a, span: Some(sa), .. }, Outcome::Rejected(r, Some(sb)), Outcome::Row { range: c, span: Some(sc), .. }] => {
                assert_eq!((index_of(a), *sa, index_of(c), *sc), (1, 1, 4, 4));
                assert_eq!((r.reason, r.field.as_str(), sb.index), (inferlog_schema::ReasonCode::FieldRange, "input_tokens", 2));
                assert_eq!((sb.trace_id.as_str(), sb.span_id.as_str()), ("07070707070707070707070707070707", "ffffffffffffffff"));
                assert!(String::from_utf8_lossy(&sb.event).contains("\"input_tokens\":-1"), "the DLQ keeps the span's event");
                // A row's span is refused later (a conflict): written again
                // from the message, as a reject keeps it.
                let n = normalizer(1);
                let later = n.span(&proto, TopicEncoding::OtlpProto, 4).expect("span 4");
                let again: serde_json::Value = serde_json::from_slice(&later.event).expect("span 4's event");
                assert_eq!((again["request_id"].as_str(), again["input_tokens"].as_i64()), (Some("c"), Some(12)), "{again}");
                assert_eq!((later.index, later.span_id.as_str()), (4, "0c0c0c0c0c0c0c0c"));
                assert_eq!(n.span(&proto, TopicEncoding::OtlpProto, 2).as_ref(), Some(&**sb), "the same as a reject's");
                assert_eq!(n.span(&proto, TopicEncoding::OtlpProto, 0), None, "not an inference span");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&piece.outcomes[3], Outcome::Rejected(r, None) if r.reason == inferlog_schema::ReasonCode::OtlpMalformed));
        assert!(matches!(&piece.outcomes[4], Outcome::Row { range, span: None, .. } if index_of(range) == 0));
    }

    #[test]
    fn one_thread_needs_no_pool() {
        assert!(normalizer(1).pool.is_none());
        assert!(normalizer(2).pool.is_some());
    }
}
