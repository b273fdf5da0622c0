//! The Kafka stage. In: the source topics, as a member of the consumer
//! group. Out: messages in partition order, plus the rebalance events the
//! pipeline must act on (revoked partitions lose their uncommitted work).
//!
//! Auto-commit is off: the pipeline commits a partition's offset only after
//! everything before it is durable (rows in ClickHouse, rejects in the DLQ).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;

use crate::config::{Assignment, KafkaConfig};
use crate::error::IngestError;
use crate::internal_events::{CommitFailed, InternalEvent};
use crate::metrics::Metrics;

/// Partitions the group took from or gave to this member since the
/// pipeline last looked. Filled by librdkafka's rebalance callbacks, which
/// run inside the pipeline's `recv()`. Every event bumps a generation: the
/// pipeline stamps each message with the generation it was received under
/// and applies an event only after the messages received before it, so a
/// message fetched before a revocation is handled (and then dropped with
/// the partition) under the assignment it was fetched in.
#[derive(Debug, Default)]
pub struct RebalanceLog {
    events: Mutex<VecDeque<(u64, RebalanceEvent)>>,
    generation: AtomicU64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

impl RebalanceLog {
    /// The generation now: a message received now belongs to it.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every event not taken yet, each with its generation.
    pub fn take(&self) -> Vec<(u64, RebalanceEvent)> {
        self.take_through(u64::MAX)
    }

    /// The events up to generation `generation` (those that happened
    /// before a message stamped with it was received), in order, each
    /// with its own generation.
    pub fn take_through(&self, generation: u64) -> Vec<(u64, RebalanceEvent)> {
        let Ok(mut events) = self.events.lock() else { return Vec::new() };
        let mut taken = Vec::new();
        while events.front().is_some_and(|(g, _)| *g <= generation) {
            if let Some(event) = events.pop_front() {
                taken.push(event);
            }
        }
        taken
    }

    /// Whether a revocation is waiting that came after generation `generation`.
    pub fn revoked_after(&self, generation: u64) -> bool {
        self.events.lock().is_ok_and(|events| events.iter().any(|(g, e)| *g > generation && matches!(e, RebalanceEvent::Revoked(_))))
    }

    pub fn push(&self, event: RebalanceEvent) {
        if let Ok(mut events) = self.events.lock() {
            let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            events.push_back((generation, event));
        }
    }
}

/// Whether a batch is being written, and the offsets of the last batch
/// made durable. A revocation waits until no batch is in flight: rows read
/// from a partition must be durable before the partition's next owner
/// looks up which of its offsets are already stored; then it commits the
/// revoked partitions' durable offsets itself, so the next owner starts
/// past them instead of filtering them out.
#[derive(Debug, Default)]
pub struct FlushGate {
    busy: Mutex<bool>,
    idle: Condvar,
    /// Next offset to commit per partition, of the last batch written.
    durable: Mutex<Vec<(String, i32, i64)>>,
    /// The consumer is leaving at shutdown: the pipeline committed what
    /// it could; a revocation now commits nothing more (and never waits
    /// on a broker that is away).
    closing: std::sync::atomic::AtomicBool,
    /// Since when a revocation waits for the batch in flight.
    revoking_since: Mutex<Option<std::time::Instant>>,
    /// How long a revocation may wait before the batch in flight starts no
    /// more attempts ([`FlushGate::fenced`]); `None`: never (unit tests).
    fence: Option<std::time::Duration>,
}

impl FlushGate {
    /// A gate whose batches are fenced `fence` after a revocation started
    /// waiting on them ([`fence_after`]).
    pub fn with_fence(fence: std::time::Duration) -> FlushGate {
        FlushGate { fence: Some(fence), ..FlushGate::default() }
    }

    /// `Err` once a revocation has waited on the batch in flight past the
    /// fence. A member blocked in its revocation callback cannot poll, so
    /// the group removes it `max.poll.interval.ms` after its last poll and
    /// hands its partitions to another member, which then waits only for
    /// the inserts running at the moment it looks. The writer asks this
    /// before every attempt: none starts after the fence, and one started
    /// before it ends (`request_timeout`) before the group can have moved
    /// the partitions.
    pub fn fenced(&self) -> Result<(), IngestError> {
        let (Some(fence), Ok(since)) = (self.fence, self.revoking_since.lock()) else { return Ok(()) };
        match *since {
            Some(since) if since.elapsed() >= fence => Err(IngestError::Fenced { waited: since.elapsed(), fence }),
            _ => Ok(()),
        }
    }

    /// Marks a batch in flight until the returned guard is dropped (the
    /// write finished, failed, or its task was aborted).
    pub fn enter(self: &Arc<Self>) -> FlushGuard {
        if let Ok(mut busy) = self.busy.lock() {
            *busy = true;
        }
        FlushGuard(self.clone())
    }

    /// The pipeline is shutting down (see `closing`).
    pub fn closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// The batch in flight is durable: these offsets may be committed.
    pub fn set_durable(&self, offsets: Vec<(String, i32, i64)>) {
        if let Ok(mut durable) = self.durable.lock() {
            *durable = offsets;
        }
    }

    /// The durable offsets of `partitions`, to commit at their revocation.
    fn durable_of(&self, partitions: &[(String, i32)]) -> Vec<(String, i32, i64)> {
        if self.closing.load(Ordering::Acquire) {
            return Vec::new();
        }
        let Ok(durable) = self.durable.lock() else { return Vec::new() };
        durable.iter().filter(|(t, p, _)| partitions.iter().any(|(rt, rp)| rt == t && rp == p)).cloned().collect()
    }

    /// Blocks the calling thread until no batch is in flight. The caller is
    /// librdkafka's rebalance callback, run inside the pipeline's `recv()`
    /// on a tokio worker: that worker is handed over first
    /// (`block_in_place`), so the writer task it waits for can run even on
    /// a runtime with a single worker (tested with `worker_threads = 1`).
    fn wait_idle(&self) {
        let on_worker = tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if on_worker {
            tokio::task::block_in_place(|| self.wait_idle_here());
        } else {
            self.wait_idle_here();
        }
    }

    fn wait_idle_here(&self) {
        let Ok(mut busy) = self.busy.lock() else { return };
        if *busy {
            tracing::info!("rebalance: waiting for the batch in flight to be durable");
            if let Ok(mut since) = self.revoking_since.lock() {
                *since = Some(std::time::Instant::now());
            }
        }
        while *busy {
            busy = match self.idle.wait(busy) {
                Ok(b) => b,
                Err(_) => break,
            };
        }
        if let Ok(mut since) = self.revoking_since.lock() {
            *since = None;
        }
    }
}

/// See [`FlushGate::enter`].
#[derive(Debug)]
pub struct FlushGuard(Arc<FlushGate>);

impl Drop for FlushGuard {
    fn drop(&mut self) {
        if let Ok(mut busy) = self.0.busy.lock() {
            *busy = false;
        }
        self.0.idle.notify_all();
    }
}

/// A broker error ingest cannot wait out (authentication or TLS failure),
/// reported by librdkafka's error callback; the pipeline stops on it.
#[derive(Debug, Default)]
pub struct FatalError {
    first: Mutex<Option<(RDKafkaErrorCode, String)>>,
}

impl FatalError {
    pub fn get(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.first.lock().ok().and_then(|f| f.clone())
    }

    pub(crate) fn set(&self, code: RDKafkaErrorCode, reason: &str) {
        if let Ok(mut first) = self.first.lock() {
            first.get_or_insert_with(|| (code, reason.to_owned()));
        }
    }
}

/// Whether a client-level error is permanent: retrying the same
/// credentials or certificate cannot succeed.
pub fn is_permanent(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::Fatal
    )
}

/// The consumer's context: records rebalances for the pipeline, holds a
/// revocation until the batch in flight is durable (then commits the
/// revoked partitions' durable offsets), and keeps the first permanent
/// broker error.
#[derive(Debug, Clone)]
pub struct IngestContext {
    pub rebalances: Arc<RebalanceLog>,
    pub gate: Arc<FlushGate>,
    pub fatal: Arc<FatalError>,
    metrics: Metrics,
}

impl ClientContext for IngestContext {
    fn error(&self, error: KafkaError, reason: &str) {
        client_error(&self.fatal, "consumer", error, reason);
    }
}

/// librdkafka's error callback of a client (`who`): a permanent error is
/// logged at ERROR and kept in `fatal` for the caller to stop on; the rest
/// (a broker down or restarting, a leader moving) are waited out, since
/// librdkafka reconnects by itself and nothing is committed meanwhile.
pub fn client_error(fatal: &FatalError, who: &'static str, error: KafkaError, reason: &str) {
    match error.rdkafka_error_code() {
        Some(code) if is_permanent(code) => {
            tracing::error!(who, error = %error, reason, "kafka: permanent error");
            fatal.set(code, reason);
        }
        _ => tracing::warn!(who, error = %error, reason, "kafka: waiting for the broker"),
    }
}

fn partitions(tpl: &rdkafka::TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.gate.wait_idle();
            let revoked = partitions(tpl);
            let durable = self.gate.durable_of(&revoked);
            // A lost assignment (the session timed out) is no longer ours to commit.
            if !durable.is_empty() && !rdkafka::consumer::Consumer::assignment_lost(consumer) {
                // Committed before the partitions go: their next owner
                // starts past the batch instead of filtering it out.
                if let Err(error) = crate::offset_commit::commit(consumer, &durable) {
                    CommitFailed { error: &error.to_string() }.emit(&self.metrics);
                }
            }
            self.rebalances.push(RebalanceEvent::Revoked(revoked));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.rebalances.push(RebalanceEvent::Assigned(partitions(tpl)));
        }
    }
}

pub type Consumer = StreamConsumer<IngestContext>;

/// How long a revocation may wait for the batch in flight before its
/// writer is fenced: `max.poll.interval.ms` (librdkafka's default 300 s
/// unless `kafka.options` sets it) less one `request_timeout` (an attempt
/// started before the fence has ended by then), at most half the
/// interval, and a second of margin. An attempt started before the fence
/// and still running when the partitions' next owner looks is waited out
/// by it ([`crate::sink::in_flight`]), so a `request_timeout` longer than the
/// interval needs no longer margin; subtracting it whole left a fence of
/// zero, and a member whose revocation waited a millisecond was fenced.
pub fn fence_after(kafka: &KafkaConfig, request_timeout: std::time::Duration) -> std::time::Duration {
    let max_poll = kafka.options.get("max.poll.interval.ms").and_then(|v| v.parse::<u64>().ok()).unwrap_or(300_000);
    let max_poll = std::time::Duration::from_millis(max_poll);
    max_poll.saturating_sub(request_timeout.min(max_poll / 2) + std::time::Duration::from_secs(1))
}

/// librdkafka's config of every client ingest makes (consumer, DLQ
/// producer and admin): [`inferlog_store::kafka::client_properties`].
pub fn client_config(kafka: &KafkaConfig) -> Result<ClientConfig, IngestError> {
    Ok(inferlog_store::kafka::client_properties(kafka)?.into_iter().collect())
}

/// A consumer of the source topics, with what its rebalance callbacks share
/// with the pipeline.
pub struct Subscription {
    pub consumer: Arc<Consumer>,
    pub rebalances: Arc<RebalanceLog>,
    pub gate: Arc<FlushGate>,
    pub fatal: Arc<FatalError>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("rebalances", &self.rebalances).field("gate", &self.gate).finish_non_exhaustive()
    }
}

/// A group member subscribed to the source topics; its batches are fenced
/// `fence` after a revocation started waiting on them ([`fence_after`]).
pub fn subscribe(kafka: &KafkaConfig, fence: std::time::Duration, metrics: &Metrics) -> Result<Subscription, IngestError> {
    use rdkafka::consumer::Consumer as _;
    let gate = Arc::new(FlushGate::with_fence(fence));
    let context = IngestContext { rebalances: Arc::default(), gate, fatal: Arc::default(), metrics: metrics.clone() };
    let (rebalances, gate, fatal) = (context.rebalances.clone(), context.gate.clone(), context.fatal.clone());
    let mut config = client_config(kafka)?;
    config
        .set("group.id", &kafka.group_id)
        .set("partition.assignment.strategy", &kafka.assignor)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", kafka.session_timeout_ms())
        .set("heartbeat.interval.ms", (kafka.session_timeout.as_millis() / 4).max(100).to_string())
        .set("queued.max.messages.kbytes", kafka.prefetch_max_kbytes.to_string())
        // With the prefetch queue full, librdkafka pauses a partition's
        // fetches this long (default 1 s). Ingest empties the queue (8 MiB by default) in about
        // 0.15 s, so the default left it without input for most of a second
        // every few batches (runs of the benchmark at 2.2 s and at 2.9 s).
        .set("fetch.queue.backoff.ms", "50")
        .set("fetch.wait.max.ms", kafka.fetch_max_wait.as_millis().max(1).to_string())
        .set("fetch.max.bytes", (16 * 1024 * 1024).to_string())
        .set("max.partition.fetch.bytes", (4 * 1024 * 1024).to_string());

    // librdkafka refuses a bad property or value here: a configuration error.
    let consumer: Consumer =
        config.create_with_context(context).map_err(|e| IngestError::Config(format!("kafka consumer: {e} (check kafka.options)")))?;
    match kafka.assignment {
        Assignment::Group => {
            let topics: Vec<&str> = kafka.topics.iter().map(String::as_str).collect();
            consumer.subscribe(&topics).map_err(|source| IngestError::Kafka { operation: "subscribe", source })?;
        }
        Assignment::Static => {
            // Resume every partition from its committed offset (librdkafka
            // fetches it for Offset::Stored), earliest when none.
            let mut tpl = rdkafka::TopicPartitionList::new();
            let mut assigned = Vec::new();
            for topic in &kafka.topics {
                let metadata = consumer
                    .fetch_metadata(Some(topic), std::time::Duration::from_secs(10))
                    .map_err(|source| refused_or(&consumer, kafka, "fetch metadata", source))?;
                for t in metadata.topics() {
                    for p in t.partitions() {
                        if kafka.partitions.is_empty() || kafka.partitions.contains(&p.id()) {
                            tpl.add_partition_offset(topic, p.id(), rdkafka::Offset::Stored)
                                .map_err(|source| IngestError::Kafka { operation: "assign", source })?;
                            assigned.push((topic.clone(), p.id()));
                        }
                    }
                }
            }
            if assigned.is_empty() {
                return Err(IngestError::Config(format!("no partitions to read in {:?} (kafka.partitions = {:?})", kafka.topics, kafka.partitions)));
            }
            // Resolve the committed offsets here, waiting for the group
            // coordinator: librdkafka gives up on Offset::Stored when the
            // coordinator is not ready (a broker that just started), and
            // the partitions then never fetch.
            let tpl = tokio::task::block_in_place(|| committed_or_earliest(&consumer, &tpl))
                .map_err(|source| refused_or(&consumer, kafka, "committed offset lookup", source))?;
            consumer.assign(&tpl).map_err(|source| IngestError::Kafka { operation: "assign", source })?;
            rebalances.push(RebalanceEvent::Assigned(assigned));
        }
    }
    Ok(Subscription { consumer: Arc::new(consumer), rebalances, gate, fatal })
}

/// A broker call made before the pipeline polls the consumer failed. If
/// the broker refused the credentials, the certificate or the user's
/// rights, that is permanent (exit 2): the refusal is in the error itself
/// or among the errors librdkafka queued meanwhile (read here, since
/// nothing else polls the consumer yet). Otherwise it is transient.
fn refused_or(consumer: &Consumer, kafka: &KafkaConfig, operation: &'static str, source: KafkaError) -> IngestError {
    let refused = |code: RDKafkaErrorCode, reason: String| IngestError::KafkaRefused {
        brokers: kafka.brokers.clone(),
        security: kafka.security.describe(),
        code,
        reason,
    };
    if let Some(code) = source.rdkafka_error_code().filter(|c| is_permanent(*c)) {
        return refused(code, source.to_string());
    }
    // The refusal reaches the error callback on librdkafka's own thread, or
    // waits in the consumer queue (served here, since nothing else polls
    // it yet): look for either, for up to two seconds.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
    tokio::task::block_in_place(|| loop {
        if let Some((code, reason)) = rdkafka::consumer::Consumer::context(consumer).fatal.get() {
            return refused(code, reason);
        }
        while let Some(event) = futures_util::FutureExt::now_or_never(consumer.recv()) {
            if let Err(e) = event {
                if let Some(code) = e.rdkafka_error_code().filter(|c| is_permanent(*c)) {
                    return refused(code, e.to_string());
                }
            }
        }
        if std::time::Instant::now() >= give_up {
            return IngestError::Kafka { operation, source };
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    })
}

/// `tpl` with each partition's committed offset, or the log start where
/// the group has none. Retries while the coordinator is not available
/// (up to two minutes), logged at WARN; not a refusal.
fn committed_or_earliest(consumer: &Consumer, tpl: &rdkafka::TopicPartitionList) -> Result<rdkafka::TopicPartitionList, KafkaError> {
    use inferlog_store::retry::{self, BlockingRetryable};
    use rdkafka::consumer::Consumer as _;
    use std::time::Duration;
    let lookup = || {
        // A partition's own error (the coordinator loading) counts as the call's.
        consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)).and_then(|committed| {
            match committed.elements().iter().find_map(|e| e.error().err()) {
                Some(e) => Err(e),
                None => Ok(committed),
            }
        })
    };
    // A refusal (credentials, rights) is not waited out.
    let waitable = |e: &KafkaError| !e.rdkafka_error_code().is_some_and(is_permanent) && consumer.context().fatal.get().is_none();
    let committed = lookup
        .retry(retry::backoff_for(Duration::from_millis(200), Duration::from_secs(5), Duration::from_secs(120)))
        .when(waitable)
        .notify(|error, _| tracing::warn!(%error, "kafka: waiting for the group coordinator to read the committed offsets"))
        .call()?;
    let mut resolved = rdkafka::TopicPartitionList::new();
    for e in committed.elements() {
        let offset = match e.offset().to_raw().filter(|o| *o >= 0) {
            Some(o) => rdkafka::Offset::Offset(o),
            None => rdkafka::Offset::Beginning,
        };
        resolved.add_partition_offset(e.topic(), e.partition(), offset)?;
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_leaves_a_short_poll_interval_half_of_itself() {
        let with = |max_poll: &str| {
            let mut kafka = KafkaConfig::default();
            kafka.options.insert("max.poll.interval.ms".into(), max_poll.into());
            kafka
        };
        let secs = std::time::Duration::from_secs;
        assert_eq!(fence_after(&KafkaConfig::default(), secs(60)), secs(239), "300 s less a request and a second");
        assert_eq!(fence_after(&with("8000"), secs(60)), secs(3), "never zero: half of 8 s, less a second");
        assert_eq!(fence_after(&with("8000"), secs(2)), secs(5));
    }
    use std::sync::mpsc;
    use std::time::Duration;

    /// Every event pushed is taken once, in order, and nothing is taken twice.
    #[test]
    fn rebalance_log_hands_each_event_over_once() {
        let log = RebalanceLog::default();
        assert!(log.take().is_empty());
        let a = RebalanceEvent::Assigned(vec![("t".into(), 0)]);
        let r = RebalanceEvent::Revoked(vec![("t".into(), 0)]);
        log.push(a.clone());
        log.push(r.clone());
        assert_eq!(log.take(), [(1, a.clone()), (2, r)]);
        assert!(log.take().is_empty());
        log.push(a.clone());
        assert_eq!(log.take(), [(3, a)]);
        assert!(log.take().is_empty());
    }

    #[test]
    fn a_revocation_waits_until_the_batch_in_flight_is_written() {
        let gate = Arc::new(FlushGate::default());
        gate.wait_idle(); // nothing in flight: returns at once
        let guard = gate.enter();
        let (done, waited) = mpsc::channel();
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.wait_idle();
                let _ = done.send(());
            })
        };
        assert!(waited.recv_timeout(Duration::from_millis(300)).is_err(), "the revocation must wait while a batch is in flight");
        drop(guard);
        assert!(waited.recv_timeout(Duration::from_secs(5)).is_ok(), "the revocation goes on once the batch is durable");
        waiter.join().expect("waiter thread");
    }

    /// The rebalance callback runs inside `recv()` on a tokio worker; with a
    /// single worker, blocking it outright would starve the writer task it
    /// waits for (a deadlock).
    #[test]
    fn a_revocation_on_the_only_worker_lets_the_writer_finish() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let gate = Arc::new(FlushGate::default());
        let (done, finished) = mpsc::channel();
        runtime.spawn({
            let gate = gate.clone();
            async move {
                let guard = gate.enter();
                let writer = tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    drop(guard);
                });
                gate.wait_idle(); // as the rebalance callback does
                let _ = writer.await;
                let _ = done.send(());
            }
        });
        let outcome = finished.recv_timeout(Duration::from_secs(20));
        runtime.shutdown_background();
        assert!(outcome.is_ok(), "the revocation deadlocked the only worker");
    }
}
