//! Test hooks of the ingest daemon. In: `INFERLOG_INGEST_TEST_*`
//! variables. Out: a fault at a precise point, for the integration tests.
//! Compiled to nothing without the `inferlog-store/test-hooks` feature,
//! and a release binary refuses to start with any of them set.

use std::time::{Duration, Instant};

use inferlog_store::test_hooks::BUILT_IN;
use rdkafka::message::BorrowedMessage;

use crate::source::{Consumer, RebalanceLog};

/// `writer` panics the writer task right after a batch's rows landed
/// (before its rejects and its commit); `blocking` panics a blocking
/// broker call.
pub const PANIC: &str = "INFERLOG_INGEST_TEST_PANIC";

/// `revoke` holds the first chunk read after the first batch was written
/// open (still polling the consumer) until a revocation arrives, so
/// messages of a revoked partition are in hand when it is revoked.
pub const HOLD_CHUNK: &str = "INFERLOG_INGEST_TEST_HOLD_CHUNK";

/// Milliseconds the writer waits before each batch: a batch is in
/// flight for that long, so a revocation meets one (`dlq replay`: before
/// each chunk's INSERT).
pub const SLOW_WRITE: &str = "INFERLOG_INGEST_TEST_SLOW_WRITE_MS";

/// `replay-inserted` stops `dlq replay` dead right after a chunk's rows
/// landed, before the ledger records them (a test then kills it).
pub const PAUSE_AFTER: &str = "INFERLOG_INGEST_TEST_PAUSE_AFTER";

pub const ALL: [&str; 4] = [PANIC, HOLD_CHUNK, SLOW_WRITE, PAUSE_AFTER];

fn set_to(env: &str, value: &str) -> bool {
    BUILT_IN && std::env::var(env).is_ok_and(|v| v == value)
}

/// Panics here when [`PANIC`] names `step`.
pub fn panic_point(step: &str) {
    if set_to(PANIC, step) {
        panic!("test hook {PANIC}={step}");
    }
}

/// With [`SLOW_WRITE`]: waits that long.
pub async fn slow_write() {
    if BUILT_IN {
        if let Some(ms) = std::env::var(SLOW_WRITE).ok().and_then(|v| v.parse::<u64>().ok()) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// Whether [`HOLD_CHUNK`] asks to hold a chunk until a revocation.
pub fn hold_chunk_until_revoked() -> bool {
    set_to(HOLD_CHUNK, "revoke")
}

/// An error naming the first hook set in a build without them.
pub fn refuse_unless_built_in() -> Result<(), String> {
    ALL.iter().try_for_each(|env| inferlog_store::test_hooks::refuse_unless_built_in(env))
}

/// With [`HOLD_CHUNK`]: keeps receiving into `messages` (each with its
/// generation) until a revocation arrives after the first of them, or two
/// minutes pass. The messages of the revoked partitions are then in hand,
/// unprocessed, when the revocation is.
pub async fn hold_until_revoked<'c>(consumer: &'c Consumer, rebalances: &RebalanceLog, messages: &mut Vec<(BorrowedMessage<'c>, u64)>) {
    let since = messages.first().map_or(rebalances.generation(), |(_, g)| *g);
    tracing::warn!(messages = messages.len(), "{HOLD_CHUNK}: holding a chunk until a revocation arrives");
    let give_up = Instant::now() + Duration::from_secs(120);
    while !rebalances.revoked_after(since) && Instant::now() < give_up {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await {
            messages.push((m, rebalances.generation()));
        }
    }
    let held = messages.iter().filter(|(_, g)| *g <= since).count();
    tracing::warn!(
        held,
        messages = messages.len(),
        revoked = rebalances.revoked_after(since),
        "{HOLD_CHUNK}: a revocation arrived with messages in hand"
    );
}
