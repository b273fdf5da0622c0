//! The Kafka stage. In: the source topics, as a member of the consumer
//! group. Out: messages in partition order, plus the rebalance events the
//! pipeline must act on (revoked partitions lose their uncommitted work).
//!
//! Auto-commit is off: the pipeline commits a partition's offset only after
//! everything before it is durable (rows in ClickHouse, rejects in the DLQ).

use std::sync::{Arc, Condvar, Mutex};

use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::ClientContext;

use crate::config::{Assignment, KafkaConfig};
use crate::error::IngestError;

/// Partitions the group took from or gave to this member since the
/// pipeline last looked. Filled by librdkafka's rebalance callbacks, which
/// run inside the pipeline's `recv()`.
#[derive(Debug, Default)]
pub struct RebalanceLog {
    events: Mutex<Vec<RebalanceEvent>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

impl RebalanceLog {
    pub fn take(&self) -> Vec<RebalanceEvent> {
        self.events.lock().map(|mut e| std::mem::take(&mut *e)).unwrap_or_default()
    }

    fn push(&self, event: RebalanceEvent) {
        if let Ok(mut e) = self.events.lock() {
            e.push(event);
        }
    }
}

/// Whether a batch is being written. A revocation waits until it is not:
/// rows read from a partition must be durable before the partition's next
/// owner looks up which of its offsets are already stored.
#[derive(Debug, Default)]
pub struct FlushGate {
    busy: Mutex<bool>,
    idle: Condvar,
}

impl FlushGate {
    /// Marks a batch in flight until the returned guard is dropped (the
    /// write finished, failed, or its task was aborted).
    pub fn enter(self: &Arc<Self>) -> FlushGuard {
        if let Ok(mut busy) = self.busy.lock() {
            *busy = true;
        }
        FlushGuard(self.clone())
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
        }
        while *busy {
            busy = match self.idle.wait(busy) {
                Ok(b) => b,
                Err(_) => return,
            };
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

    fn set(&self, code: RDKafkaErrorCode, reason: &str) {
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
/// revocation until the batch in flight is durable, and keeps the first
/// permanent broker error.
#[derive(Debug, Clone, Default)]
pub struct IngestContext {
    pub rebalances: Arc<RebalanceLog>,
    pub gate: Arc<FlushGate>,
    pub fatal: Arc<FatalError>,
}

impl ClientContext for IngestContext {
    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(code) if is_permanent(code) => {
                tracing::error!(error = %error, reason, "kafka: permanent error");
                self.fatal.set(code, reason);
            }
            // Broker down or restarting, a leader moving: librdkafka
            // reconnects by itself; nothing is committed meanwhile.
            _ => tracing::warn!(error = %error, reason, "kafka: waiting for the broker"),
        }
    }
}

fn partitions(tpl: &rdkafka::TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.gate.wait_idle();
            self.rebalances.push(RebalanceEvent::Revoked(partitions(tpl)));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.rebalances.push(RebalanceEvent::Assigned(partitions(tpl)));
        }
    }
}

pub type Consumer = StreamConsumer<IngestContext>;

pub use inferlog_store::kafka::client_config;

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

/// A group member subscribed to the source topics.
pub fn subscribe(kafka: &KafkaConfig) -> Result<Subscription, IngestError> {
    use rdkafka::consumer::Consumer as _;
    let context = IngestContext::default();
    let (rebalances, gate, fatal) = (context.rebalances.clone(), context.gate.clone(), context.fatal.clone());
    let mut config = client_config(kafka)?;
    config
        .set("group.id", &kafka.group_id)
        .set("partition.assignment.strategy", &kafka.assignor)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", kafka.session_timeout.as_millis().to_string())
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

    let consumer: Consumer = config.create_with_context(context).map_err(|source| IngestError::Kafka { operation: "create consumer", source })?;
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
                    .map_err(|source| IngestError::Kafka { operation: "fetch metadata", source })?;
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
            let tpl = tokio::task::block_in_place(|| committed_or_earliest(&consumer, &tpl))?;
            consumer.assign(&tpl).map_err(|source| IngestError::Kafka { operation: "assign", source })?;
            rebalances.push(RebalanceEvent::Assigned(assigned));
        }
    }
    Ok(Subscription { consumer: Arc::new(consumer), rebalances, gate, fatal })
}

/// `tpl` with each partition's committed offset, or the log start where
/// the group has none. Retries while the coordinator is not available
/// (up to two minutes), logged at WARN.
fn committed_or_earliest(consumer: &Consumer, tpl: &rdkafka::TopicPartitionList) -> Result<rdkafka::TopicPartitionList, IngestError> {
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
    let committed = lookup
        .retry(retry::backoff_for(Duration::from_millis(200), Duration::from_secs(5), Duration::from_secs(120)))
        .notify(|error, _| tracing::warn!(%error, "kafka: waiting for the group coordinator to read the committed offsets"))
        .call()
        .map_err(|source| IngestError::Kafka { operation: "committed offset lookup", source })?;
    let mut resolved = rdkafka::TopicPartitionList::new();
    for e in committed.elements() {
        let offset = match e.offset().to_raw().filter(|o| *o >= 0) {
            Some(o) => rdkafka::Offset::Offset(o),
            None => rdkafka::Offset::Beginning,
        };
        resolved.add_partition_offset(e.topic(), e.partition(), offset).map_err(|source| IngestError::Kafka { operation: "assign", source })?;
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(log.take(), [a.clone(), r]);
        assert!(log.take().is_empty());
        log.push(a.clone());
        assert_eq!(log.take(), [a]);
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
