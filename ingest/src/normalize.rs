//! The normalizing stage. In: the payloads of a run of Kafka messages that
//! librdkafka had ready, with the time they were received. Out: each one's
//! normalized event or rejection (`inferlog-schema`), in the same order.
//!
//! Validation is most of ingest's CPU. It is pure, so a chunk is spread
//! over `ingest.normalize_threads` threads while the pipeline waits; what
//! is then skipped (replays, producer retries), batched or rejected is
//! decided by the pipeline, message by message, in offset order.

use inferlog_schema::{Contract, Normalized, Rejection, UserIdHasher};
use rayon::prelude::*;

use crate::error::IngestError;

/// The most messages normalized together: a few milliseconds of work, so
/// the pipeline's other duties (commits, rebalances, timers) wait no longer.
pub const CHUNK: usize = 2048;

/// Below this many payloads a chunk is normalized on the calling thread:
/// handing it to the pool would cost more than it saves.
const PARALLEL_FROM: usize = 64;

/// The contract, the user-id hasher and the threads that apply them.
#[derive(Debug)]
pub struct Normalizer {
    contract: Contract,
    hasher: UserIdHasher,
    pool: Option<rayon::ThreadPool>,
}

impl Normalizer {
    /// `threads` > 1 starts a pool of that many threads (named
    /// `normalize-N`); 1 normalizes on the caller's thread.
    pub fn new(contract: Contract, hasher: UserIdHasher, threads: usize) -> Result<Normalizer, IngestError> {
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
        Ok(Normalizer { contract, hasher, pool })
    }

    /// Normalizes every payload, as received at `received_ms`. Blocks the
    /// calling thread until the whole chunk is done.
    pub fn normalize(&self, payloads: &[&[u8]], received_ms: i64) -> Vec<Result<Normalized, Rejection>> {
        let one = |payload: &&[u8]| self.contract.normalize(payload, Some(received_ms), &self.hasher);
        match &self.pool {
            Some(pool) if payloads.len() >= PARALLEL_FROM => pool.install(|| payloads.par_iter().map(one).collect()),
            _ => payloads.iter().map(one).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use inferlog_schema::generate::{Generator, GeneratorConfig};
    use inferlog_schema::ContractConfig;

    use super::*;

    fn normalizer(threads: usize) -> Normalizer {
        let contract = Contract::new(&ContractConfig::default()).expect("default contract");
        let hasher = UserIdHasher::new(b"normalize-test-key-0123456789abcdef", None, "test").expect("key");
        Normalizer::new(contract, hasher, threads).expect("pool")
    }

    /// The pool gives, in order, exactly what one thread gives, rejects
    /// included (10% of the generated events are broken on purpose).
    #[test]
    fn parallel_chunks_match_the_sequential_result_in_order() {
        let config = GeneratorConfig { seed: 7, days: 1, end_ms: 1_793_491_200_000, invalid_ratio: 0.1 };
        let lines: Vec<Vec<u8>> = Generator::new(config).take(CHUNK + 17).map(|e| e.line).collect();
        let payloads: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        let received_ms = 1_793_491_200_000;
        let sequential = normalizer(1).normalize(&payloads, received_ms);
        let parallel = normalizer(3).normalize(&payloads, received_ms);
        assert_eq!(sequential.len(), payloads.len());
        assert!(sequential.iter().any(Result::is_err) && sequential.iter().any(Result::is_ok), "both outcomes are exercised");
        assert_eq!(parallel, sequential);
        // A short chunk takes the calling thread's path and agrees too.
        assert_eq!(normalizer(3).normalize(&payloads[..5], received_ms), sequential[..5].to_vec());
    }

    #[test]
    fn one_thread_needs_no_pool() {
        assert!(normalizer(1).pool.is_none());
        assert!(normalizer(2).pool.is_some());
    }
}
