//! Test hooks of the ingest daemon. In: `INFERLOG_INGEST_TEST_*`
//! variables. Out: a fault at a precise point, for the integration tests.
//! Compiled to nothing without the `inferlog-store/test-hooks` feature,
//! and a release binary refuses to start with any of them set.

use std::sync::atomic::{AtomicBool, Ordering};
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
/// landed, before the ledger records them (a test then kills it);
/// `session-lost` holds the first batch that fills up after one was
/// written, not polling the consumer, until librdkafka declares the group
/// session lost (`max.poll.interval.ms` passed) with the rest of the
/// backlog still queued ahead of the revocation.
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

/// Whether the `session-lost` hold happened.
static HELD: AtomicBool = AtomicBool::new(false);

/// With [`PAUSE_AFTER`]`=session-lost`, once: waits without polling the
/// consumer until its assignment is lost, or two minutes pass.
pub async fn hold_until_session_lost(consumer: &Consumer) {
    if !set_to(PAUSE_AFTER, "session-lost") || HELD.swap(true, Ordering::AcqRel) {
        return;
    }
    use rdkafka::consumer::Consumer as _;
    tracing::warn!("{PAUSE_AFTER}: holding a full batch, not polling, until the group session is lost");
    let give_up = Instant::now() + Duration::from_secs(120);
    while !consumer.assignment_lost() && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(lost = consumer.assignment_lost(), "{PAUSE_AFTER}: done holding");
}

/// With [`PAUSE_AFTER`]`=session-lost`, once after the hold: the next
/// partition start takes 8 s, as a committed-offset lookup does while the
/// broker is down; the pipeline serves the consumer meanwhile, so the
/// revocation and the member's next assignment arrive during it.
pub async fn slow_start_after_session_lost() {
    static SLOWED: AtomicBool = AtomicBool::new(false);
    if HELD.load(Ordering::Acquire) && !SLOWED.swap(true, Ordering::AcqRel) {
        tracing::warn!("{PAUSE_AFTER}: a partition start after the loss takes 8 s");
        tokio::time::sleep(Duration::from_secs(8)).await;
    }
}
