//! The normalizing stage. In: the payloads of a run of Kafka messages that
//! librdkafka had ready, with their coordinates and the time they were
//! received. Out: for each, in the same order, its hot row encoded as
//! RowBinary (with its UTC day, its event time, its request-id fingerprint
//! and the hash of its content, and what it adds to the live service
//! metrics) or its rejection (`inferlog-schema`).
//!
//! Validation and encoding are most of ingest's CPU. They are pure, so a
//! chunk is spread over `ingest.normalize_threads` threads while the
//! pipeline waits; what is then skipped (replays, producer retries),
//! batched or rejected is decided by the pipeline, message by message, in
//! offset order.

use std::ops::Range;
use std::sync::Arc;

use inferlog_schema::{Contract, Rejection, UserIdHasher};
use inferlog_store::model::rows::HotRow;
use rayon::prelude::*;

use crate::batch::fingerprint;
use crate::error::IngestError;
use crate::service_metrics::{Cache, Interner, Observation};

/// The most messages normalized together: a few milliseconds of work, so
/// the pipeline's other duties (commits, rebalances, timers) wait no longer.
pub const CHUNK: usize = 2048;

/// Messages one thread takes at a time: their rows share one buffer.
const PIECE: usize = 128;

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
}

/// What one message became.
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
    },
    Rejected(Rejection),
}

/// Consecutive messages' outcomes, and the bytes their rows are encoded in.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Piece {
    pub bytes: Vec<u8>,
    pub outcomes: Vec<Outcome>,
}

/// The contract, the user-id hasher and the threads that apply them.
#[derive(Debug)]
pub struct Normalizer {
    contract: Contract,
    hasher: UserIdHasher,
    pool: Option<rayon::ThreadPool>,
    /// The service metrics' labels, when they are on.
    observer: Option<Arc<Interner>>,
}

impl Normalizer {
    /// `threads` > 1 starts a pool of that many threads (named
    /// `normalize-N`); 1 normalizes on the caller's thread. With
    /// `observer`, each row also gets its service metrics' observation.
    pub fn new(contract: Contract, hasher: UserIdHasher, threads: usize, observer: Option<Arc<Interner>>) -> Result<Normalizer, IngestError> {
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
        Ok(Normalizer { contract, hasher, pool, observer })
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

    fn piece(&self, inputs: &[Input<'_>], received_ms: i64) -> Piece {
        let mut piece = Piece { bytes: Vec::with_capacity(inputs.len() * 384), outcomes: Vec::with_capacity(inputs.len()) };
        let ingested_at = (received_ms / 1000) as u32;
        let mut cache = Cache::default();
        for input in inputs {
            let outcome = match self.contract.normalize(input.payload, Some(received_ms), &self.hasher) {
                Ok(normalized) => {
                    let fingerprint = fingerprint(&normalized.event.request_id);
                    let timestamp_ms = normalized.event.timestamp_ms;
                    let row = HotRow::new(normalized.event, input.topic.clone(), input.partition, input.offset, ingested_at);
                    let start = piece.bytes.len();
                    let event = row.encode(&mut piece.bytes);
                    let content = content_hash(&piece.bytes[start..start + event]);
                    let observation = self.observer.as_ref().map(|o| o.observe(&row, &mut cache));
                    Outcome::Row {
                        day: row.day,
                        timestamp_ms,
                        fingerprint,
                        content,
                        range: start..piece.bytes.len(),
                        dropped_fields: normalized.dropped_fields.len(),
                        observation,
                    }
                }
                Err(rejection) => Outcome::Rejected(rejection),
            };
            piece.outcomes.push(outcome);
        }
        piece
    }
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
        Normalizer::new(contract, hasher, threads, None).expect("pool")
    }

    /// Outcomes in input order, each row with its own bytes.
    fn flat(pieces: &[Piece]) -> Vec<(Outcome, Vec<u8>)> {
        pieces
            .iter()
            .flat_map(|p| {
                p.outcomes.iter().map(|o| {
                    let bytes = match o {
                        Outcome::Row { range, .. } => p.bytes[range.clone()].to_vec(),
                        Outcome::Rejected(_) => Vec::new(),
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
        let inputs: Vec<Input<'_>> =
            lines.iter().enumerate().map(|(i, l)| Input { payload: l, topic: &topic, partition: 3, offset: i as i64 }).collect();
        let received_ms = 1_793_491_200_000;
        let sequential = flat(&normalizer(1).normalize(&inputs, received_ms));
        let parallel = flat(&normalizer(3).normalize(&inputs, received_ms));
        assert_eq!(sequential.len(), inputs.len());
        assert!(sequential.iter().any(|(o, _)| matches!(o, Outcome::Rejected(_))), "rejects are exercised");
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
                (Outcome::Rejected(r), Err(want)) => assert_eq!(*r, want),
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
            Input { payload: line, topic: &topic, partition: 0, offset: 1 },
            Input { payload: line, topic: &topic, partition: 2, offset: 90 },
            Input { payload: other, topic: &topic, partition: 0, offset: 2 },
        ];
        let contents: Vec<u64> = flat(&n.normalize(&inputs, 1_796_000_000_000))
            .into_iter()
            .map(|(o, _)| match o {
                Outcome::Row { content, .. } => content,
                Outcome::Rejected(r) => panic!("{r:?}"),
            })
            .collect();
        assert_eq!(contents[0], contents[1], "a retry at another offset");
        assert_ne!(contents[0], contents[2], "another request under the same id");
    }

    #[test]
    fn one_thread_needs_no_pool() {
        assert!(normalizer(1).pool.is_none());
        assert!(normalizer(2).pool.is_some());
    }
}
