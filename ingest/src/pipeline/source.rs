//! The source stage. In: the Kafka consumer of the group subscription
//! ([`crate::source`]) and its rebalance log. Out: chunks of messages,
//! each stamped with the rebalance generation it was received under; the
//! rebalance events before each message applied (revoked partitions
//! handed back, so the batch drops their rows); and for each message,
//! whether this member takes it ([`Admitted`]): its partition owned and
//! started (the committed offset and what an earlier reader stored, looked
//! up while the consumer is served), its offset new.
//!
//! It owns the consumer, which partitions this member owns and where each
//! stands ([`Partitions`]), what arrived during a wait, and the waits: past
//! [`PAUSE_AFTER`] every partition is paused and the consumer polled, so
//! the group keeps this member however long a write, a start or a commit
//! takes. With `--exit-when-idle` it answers whether every partition is
//! read to its end and committed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::TopicPartitionList;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::batcher::Admitted;
use crate::batch::PartitionKey;
use crate::broker::Broker;
use crate::config::KafkaConfig;
use crate::error::IngestError;
use crate::internal_events::{ConsumeError, InternalEvent, Paused, Rebalanced, UnownedMessage};
use crate::metrics::Metrics;
use crate::normalize;
use crate::offsets::{Delivery, DrainState};
use crate::partitions::{self, Partitions, Status};
use crate::sink::{ClickHouseSink, RetryPolicy};
use crate::source::{self, Consumer, FatalError, RebalanceEvent, RebalanceLog};

/// A wait longer than this pauses the partitions and serves the consumer.
const PAUSE_AFTER: Duration = Duration::from_secs(1);
/// With `--exit-when-idle`, how long past the idle time ingest waits for partitions behind their end yet silent.
const NOT_DRAINED_LIMIT: Duration = Duration::from_secs(300);

/// A topic's shared name and its per-topic message counter, looked up once.
pub(super) type TopicEntry = (Arc<str>, prometheus::IntCounter);

/// The source stage: the consumer and the partitions this member owns.
pub(super) struct Source {
    consumer: Arc<Consumer>,
    rebalances: Arc<RebalanceLog>,
    fatal: Arc<FatalError>,
    broker: Broker,
    kafka: Arc<KafkaConfig>,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
    /// Where a partition's start looks up what an earlier reader stored.
    sink: ClickHouseSink,
    policy: RetryPolicy,
    partitions: Partitions,
    topics: HashMap<String, TopicEntry>,
    /// This member was given a partition at least once.
    assigned_once: bool,
    /// Messages that arrived while a wait served the consumer, with their generation.
    carry: Vec<(OwnedMessage, u64)>,
    /// Test hook: hold the next chunk until a revocation arrives.
    hold_chunk: bool,
    /// The last rebalance generation applied.
    applied: u64,
    /// Messages taken from owned partitions (stored ones included).
    pub messages: u64,
}

/// What the source stage is built from.
pub(super) struct Parts {
    pub subscription: source::Subscription,
    pub broker: Broker,
    pub kafka: KafkaConfig,
    pub metrics: Metrics,
    pub shutdown: watch::Receiver<bool>,
    pub sink: ClickHouseSink,
    pub policy: RetryPolicy,
}

impl Source {
    pub fn new(parts: Parts) -> Source {
        let Parts { subscription, broker, kafka, metrics, shutdown, sink, policy } = parts;
        Source {
            consumer: subscription.consumer,
            rebalances: subscription.rebalances,
            fatal: subscription.fatal,
            broker,
            kafka: Arc::new(kafka),
            metrics,
            shutdown,
            sink,
            policy,
            partitions: Partitions::default(),
            topics: HashMap::new(),
            assigned_once: false,
            carry: Vec::new(),
            hold_chunk: crate::hooks::hold_chunk_until_revoked(),
            applied: 0,
            messages: 0,
        }
    }

    /// The consumer, for the supervisor's `recv` (its messages borrow it).
    pub fn consumer(&self) -> Arc<Consumer> {
        self.consumer.clone()
    }

    /// Whether a partition was ever assigned to this member.
    pub fn assigned_once(&self) -> bool {
        self.assigned_once
    }

    /// Takes what librdkafka already has after `first`, up to a chunk,
    /// without going back through the supervisor's select per message
    /// (recv is cancel-safe), each with its generation; a consume error
    /// ends the chunk (and ends the run when it is permanent).
    pub async fn chunk<'c>(
        &mut self,
        consumer: &'c Consumer,
        first: KafkaResult<BorrowedMessage<'c>>,
        committed_rows: u64,
    ) -> Result<Vec<(BorrowedMessage<'c>, u64)>, IngestError> {
        let mut messages = Vec::with_capacity(normalize::CHUNK);
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Ok(message) => messages.push((message, self.rebalances.generation())),
                Err(e) => {
                    self.waited_out(e)?;
                    break;
                }
            }
            if messages.len() < normalize::CHUNK {
                next = futures_util::FutureExt::now_or_never(consumer.recv());
            }
        }
        if self.hold_chunk && committed_rows > 0 {
            self.hold_chunk = false;
            crate::hooks::hold_until_revoked(consumer, &self.rebalances, &mut messages).await;
        }
        Ok(messages)
    }

    /// What arrived while a wait served the consumer (normally nothing:
    /// the partitions were paused).
    pub fn take_carried(&mut self) -> Vec<(OwnedMessage, u64)> {
        std::mem::take(&mut self.carry)
    }

    /// Applies the rebalance events that came before a message received
    /// under `generation` (`u64::MAX`: all received so far); the
    /// partitions they revoked, whose rows the batch must drop.
    pub fn apply_through(&mut self, generation: u64) -> Result<Vec<(String, i32)>, IngestError> {
        // Asked for every message: nothing new costs one atomic load.
        let through = generation.min(self.rebalances.generation());
        let mut revoked = Vec::new();
        if through <= self.applied {
            return Ok(revoked);
        }
        self.applied = through;
        for (generation, event) in self.rebalances.take_through(through) {
            match event {
                RebalanceEvent::Revoked(list) => {
                    Rebalanced { revoked: true, partitions: &list }.emit(&self.metrics);
                    let keys: Vec<PartitionKey> = list.iter().map(|(t, p)| (self.topic(t).0, *p)).collect();
                    self.partitions.revoke(&keys);
                    revoked.extend(list);
                }
                RebalanceEvent::Assigned(list) => {
                    Rebalanced { revoked: false, partitions: &list }.emit(&self.metrics);
                    // A partition paused during a wait and assigned again
                    // after it stays paused in librdkafka: never here.
                    let mut tpl = TopicPartitionList::with_capacity(list.len());
                    for (t, p) in &list {
                        tpl.add_partition(t, *p);
                    }
                    let _ = self.consumer.resume(&tpl);
                    let keys: Vec<PartitionKey> = list.iter().map(|(t, p)| (self.topic(t).0, *p)).collect();
                    self.partitions.assign(&keys, generation)?;
                    // An empty assignment is not one to drain.
                    self.assigned_once |= !list.is_empty();
                }
            }
        }
        Ok(revoked)
    }

    /// The shared name of a topic and its message counter.
    pub fn topic(&mut self, name: &str) -> TopicEntry {
        if let Some(t) = self.topics.get(name) {
            return t.clone();
        }
        let t = (Arc::from(name), self.metrics.messages_counter(name));
        self.topics.insert(name.to_owned(), t.clone());
        t
    }

    /// Whether this member owns `key` (the only partitions it commits).
    pub fn owns(&self, key: &PartitionKey) -> bool {
        self.partitions.owns(key)
    }

    /// Whether librdkafka lost the group session (another member may own
    /// the partitions now).
    pub fn assignment_lost(&self) -> bool {
        self.consumer.assignment_lost()
    }

    /// Test hook: with a full batch, waits until the session is lost.
    pub async fn hold_until_session_lost(&self) {
        crate::hooks::hold_until_session_lost(&self.consumer).await;
    }

    /// The group session was lost: every partition's queued messages are
    /// dropped until the revocation arrives.
    pub fn lose_all(&mut self) {
        self.partitions.lose_all();
    }

    /// Decides on one message, received under rebalance generation
    /// `received`: `None` when it is not this member's to take (its
    /// partition not owned, revoked while it started, or the offset
    /// delivered again), else whether an earlier reader stored it. The
    /// first message of a partition starts it; a gap in its offsets is
    /// accounted (lost to retention, or nothing to read).
    pub async fn admit<M: Message>(&mut self, message: &M, received: u64, (topic, consumed): &TopicEntry) -> Result<Option<Admitted>, IngestError> {
        let (partition, offset) = (message.partition(), message.offset());
        let key: PartitionKey = (topic.clone(), partition);
        // One lookup for a started partition, the common case.
        let mut state = match self.partitions.state(&key, received) {
            Some(state) => state,
            None => match self.partitions.status(&key, received) {
                Status::NotOwned | Status::Lost => {
                    UnownedMessage { topic, partition, offset }.emit(&self.metrics);
                    return Ok(None);
                }
                // Never started while stopping: it is left to the next run.
                Status::NotStarted if *self.shutdown.borrow() => return Ok(None),
                Status::NotStarted | Status::Started => {
                    let start =
                        partitions::lookup_start(self.broker.clone(), self.sink.clone(), self.policy.clone(), self.metrics.clone(), key.clone());
                    match self.serve_while(tokio::spawn(start), "partition start").await? {
                        Ok(state) => self.partitions.started(&key, state),
                        Err(error) if *self.shutdown.borrow() => {
                            tracing::info!(%error, topic = %key.0, partition, "stopping before the partition started");
                            return Ok(None);
                        }
                        Err(error) => return Err(error),
                    }
                    // Revoked or lost while it started (the wait served the consumer): not owned now.
                    match self.partitions.state(&key, received) {
                        Some(state) => state,
                        None => return Ok(None),
                    }
                }
            },
        };
        match state.classify(offset) {
            Delivery::Next => {}
            // Before the commit point: delivered again (a seek or an offset reset).
            Delivery::Again => return Ok(None),
            Delivery::Gap => {
                let task = tokio::spawn(partitions::log_start(self.broker.clone(), key.clone()));
                let log_start = self.serve_while(task, "log start lookup").await??;
                state = match self.partitions.state(&key, received) {
                    Some(state) => state,
                    None => return Ok(None),
                };
                partitions::account_gap(&self.metrics, &key, state, offset, log_start);
            }
        }
        state.advanced_to(offset);
        self.messages += 1;
        consumed.inc();
        if state.already_stored(offset) {
            return Ok(Some(Admitted::Stored));
        }
        // Only some rows of this message known stored (a crash between two
        // days' inserts of its spans): those are skipped, the rest written.
        Ok(Some(Admitted::Take { stored_spans: state.stored_spans(offset) }))
    }

    /// Stops on a permanent broker error (authentication, TLS) that
    /// librdkafka's error callback reported.
    pub fn check_fatal(&self) -> Result<(), IngestError> {
        match self.fatal.get() {
            None => Ok(()),
            Some((code, reason)) => Err(self.broker.refused(code, reason)),
        }
    }

    /// With `--exit-when-idle`: whether every partition is read to its end
    /// and committed (exit 0), or an error when this member never got a
    /// partition or partitions stay behind yet silent (exit 75).
    pub async fn drained(&mut self, idle: Duration, grace: Duration, silent: Duration) -> Result<bool, IngestError> {
        let kafka = &self.kafka;
        if !self.assigned_once {
            return Err(IngestError::NotDrained(format!(
                "group {} gave this member no partition of {:?} within {}; another member holds them all, or the group is still rebalancing",
                kafka.group_id,
                kafka.topics,
                humantime::format_duration(idle + grace)
            )));
        }
        match crate::drain::state(&self.consumer, kafka.topics.clone(), kafka.partitions.clone(), &self.partitions).await? {
            Some(DrainState::Drained) => {
                tracing::info!(idle = %humantime::format_duration(idle), "every partition read to its end and committed: drained");
                Ok(true)
            }
            Some(DrainState::Behind { held, others }) if silent >= idle + NOT_DRAINED_LIMIT => Err(IngestError::NotDrained(format!(
                "nothing arrived for {} while partitions are behind their end: held here {held:?}, by others {others:?}",
                humantime::format_duration(silent)
            ))),
            Some(DrainState::Behind { held, others }) => {
                tracing::info!(?held, ?others, "not drained yet: partitions behind their end (held here, or by other members)");
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// A consume error: permanent ones (authorization, an unknown topic)
    /// stop ingest; the rest (a broker restarting, a leader moving) are
    /// waited out: librdkafka retries, and nothing past what is durable is
    /// committed meanwhile.
    pub fn waited_out(&self, source: rdkafka::error::KafkaError) -> Result<(), IngestError> {
        use rdkafka::error::RDKafkaErrorCode as Code;
        match source.rdkafka_error_code() {
            Some(code) if source::is_permanent(code) || matches!(code, Code::UnknownTopicOrPartition | Code::UnknownTopic) => {
                Err(self.broker.refused(code, source.to_string()))
            }
            _ => {
                ConsumeError.emit(&self.metrics);
                tracing::warn!(error = %source, "kafka consume error: waiting for the broker (nothing is committed past what is durable)");
                Ok(())
            }
        }
    }

    /// Waits for `task`. Past [`PAUSE_AFTER`] every assigned partition is
    /// paused (librdkafka purges what it prefetched and resumes from the
    /// last message handed out) and the consumer is polled meanwhile:
    /// rebalance callbacks run and `max.poll.interval.ms` is met, so a long
    /// outage does not churn the group. What arrives anyway is kept for later.
    pub async fn serve_while<T>(&mut self, task: JoinHandle<T>, what: &'static str) -> Result<T, IngestError> {
        self.serve_while_after(task, what, PAUSE_AFTER).await
    }

    /// [`Source::serve_while`], pausing after `pause_after`.
    pub async fn serve_while_after<T>(&mut self, mut task: JoinHandle<T>, what: &'static str, pause_after: Duration) -> Result<T, IngestError> {
        if let Ok(done) = tokio::time::timeout(pause_after, &mut task).await {
            return done.map_err(|e| IngestError::join(what, e));
        }
        Paused { what }.emit(&self.metrics);
        let consumer = self.consumer.clone();
        let mut paused_at = None;
        // Every partition paused: librdkafka keeps a partition paused across
        // its revocation and a later assignment, so all are resumed at the end.
        let mut paused = TopicPartitionList::new();
        let mut recheck = tokio::time::interval(Duration::from_millis(500));
        let done = loop {
            // A new assignment meanwhile is paused too.
            if paused_at != Some(self.rebalances.generation()) {
                paused_at = Some(self.rebalances.generation());
                if let Ok(assignment) = consumer.assignment() {
                    let _ = consumer.pause(&assignment);
                    for e in assignment.elements() {
                        if paused.find_partition(e.topic(), e.partition()).is_none() {
                            paused.add_partition(e.topic(), e.partition());
                        }
                    }
                }
            }
            tokio::select! {
                biased;
                done = &mut task => break done,
                message = consumer.recv() => match message {
                    Ok(m) => self.carry.push((m.detach(), self.rebalances.generation())),
                    Err(e) => self.waited_out(e)?,
                },
                _ = recheck.tick() => {}
            }
        };
        let _ = consumer.resume(&paused);
        if let Ok(assignment) = consumer.assignment() {
            let _ = consumer.resume(&assignment);
        }
        done.map_err(|e| IngestError::join(what, e))
    }

    /// Leaves the group (within `limit`; the process exits whatever the
    /// broker does).
    pub async fn leave(self, limit: Duration) {
        let consumer = self.consumer;
        drop(self.broker);
        let leave = tokio::task::spawn_blocking(move || {
            consumer.unsubscribe();
            drop(consumer);
        });
        let _ = tokio::time::timeout(limit, leave).await;
    }
}
