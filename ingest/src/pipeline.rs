//! The ingest loop. In: Kafka messages, each stamped with the rebalance
//! generation it was received under. Out: hot rows in ClickHouse, rejects
//! in the DLQ, committed offsets. One batch at a time:
//!
//! 1. the messages librdkafka has ready are validated and normalized
//!    together ([`crate::normalize`], on a small thread pool), then taken
//!    one by one in offset order, each after the rebalance events that
//!    came before it ([`crate::partitions`]): a message of a partition
//!    this member does not own is dropped; one whose offset an earlier
//!    reader handled (the replay log) or whose request was just stored (a
//!    producer retry) is skipped; the same request id with other content
//!    is rejected (`request_id.conflict`);
//! 2. when the batch is full, old, or the source has been read to its end,
//!    it is handed to the [`crate::writer`] task, which writes it while the
//!    next batch is read; only once that returned are its offsets committed.
//!
//! One batch is written while one fills. A wait longer than a second (a
//! slow or failing ClickHouse, a partition start) pauses every partition
//! and keeps polling the consumer, so the group keeps this member however
//! long the outage, and memory stays two batches plus librdkafka's bounded
//! prefetch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferlog_schema::{Contract, ReasonCode, Rejection, UserIdHasher};
use inferlog_store::retry::{self, Retryable};
use rdkafka::consumer::Consumer as _;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::TopicPartitionList;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::batch::{Batch, PartitionKey, PartitionMap, RecentIds, Seen};
use crate::broker::Broker;
use crate::clickhouse_sink::{table_partition, ClickHouseSink};
use crate::config::Config;
use crate::dlq::{now_ms, Dlq, Reject};
use crate::error::IngestError;
use crate::metrics::{self, Metrics};
use crate::normalize::{self, Input, Normalizer, Outcome};
use crate::offsets::{Delivery, DrainState};
use crate::partitions::{self, Partitions, Status};
use crate::redact::{Redacted, Redactor};
use crate::source::{self, Consumer, FlushGate, RebalanceEvent, RebalanceLog};
use crate::writer::Writer;

/// How the daemon should stop.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Drain, commit and exit after this long without a new message.
    pub exit_when_idle: Option<Duration>,
}

/// What one run did, for the exit log line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub messages: u64,
    pub rows: u64,
    pub rejects: u64,
    pub duplicates: u64,
}

/// With no message for this long, the source counts as read to its end.
const CAUGHT_UP_AFTER: Duration = Duration::from_millis(100);
/// With `--exit-when-idle`, how long past the idle time a member waits for its first partition.
const NO_ASSIGNMENT_GRACE: Duration = Duration::from_secs(30);
/// With `--exit-when-idle`, how long past the idle time ingest waits for partitions behind their end yet silent.
const NOT_DRAINED_LIMIT: Duration = Duration::from_secs(300);
/// With `--exit-when-idle`, how often the drain check asks the broker.
const DRAIN_CHECK_EVERY: Duration = Duration::from_secs(1);
/// A wait longer than this pauses the partitions and serves the consumer.
const PAUSE_AFTER: Duration = Duration::from_secs(1);
/// Longest a commit may take outside a shutdown (then it counts as failed).
const COMMIT_LIMIT: Duration = Duration::from_secs(30);

/// The batch the writer task is making durable.
struct InFlight {
    batch: Written,
    task: JoinHandle<Result<(), IngestError>>,
}

/// What the pipeline keeps of a batch it handed to the writer.
struct Written {
    offsets: PartitionMap<(i64, i64)>,
    buffered: usize,
    rejects: usize,
    started: Instant,
}

/// A topic's shared name and its per-topic metrics, looked up once.
type TopicEntry = (Arc<str>, prometheus::IntCounter);

struct Pipeline {
    config: Config,
    normalizer: Normalizer,
    redactor: Redactor,
    writer: Writer,
    in_flight: Option<InFlight>,
    gate: Arc<FlushGate>,
    consumer: Arc<Consumer>,
    broker: Broker,
    rebalances: Arc<RebalanceLog>,
    fatal: Arc<source::FatalError>,
    metrics: Metrics,
    partitions: Partitions,
    topics: HashMap<String, TopicEntry>,
    recent: RecentIds,
    batch: Batch,
    summary: Summary,
    assigned_once: bool,
    /// The batch filling now began when the one before it was full: when
    /// the source goes quiet it is a backlog's tail, flushed whatever its size.
    after_full: bool,
    /// Messages that arrived while a wait served the consumer, with their generation.
    carry: Vec<(OwnedMessage, u64)>,
    /// Test hook: hold the next chunk until a revocation arrives.
    hold_chunk: bool,
    /// The last rebalance generation applied.
    applied: u64,
}

/// Runs until `shutdown` flips to true (then flushes and commits) or, with
/// `exit_when_idle`, until the topics are drained.
pub async fn run(config: Config, options: RunOptions, metrics: Metrics, mut shutdown: watch::Receiver<bool>) -> Result<Summary, IngestError> {
    let contract = Contract::new(&config.schema)?;
    let hasher = UserIdHasher::from_env(config.schema.hash_key_id.as_deref())?;
    let redactor = Redactor::new(config.kafka.dlq_payload, hasher.clone());
    let normalizer = Normalizer::new(contract, hasher, config.ingest.normalize_threads)?;
    let unprepared = ClickHouseSink::new(&config.clickhouse)?;
    let backoff = (config.ingest.retry_initial_backoff, config.ingest.retry_max_backoff);
    // ClickHouse may still be starting: wait for it, until a shutdown; a
    // refusal (credentials, rights) or a drifted table ends the run.
    let mut attempt = 0;
    let (sink, _features) = (|| unprepared.prepared())
        .retry(retry::backoff(backoff.0, backoff.1))
        .sleep(retry::ShutdownSleeper::new(shutdown.clone()))
        .when(|e| e.retry_in_place() && !*shutdown.borrow())
        .notify(|e, wait| {
            attempt += 1;
            metrics::insert_failed(&metrics, e, attempt, wait);
        })
        .await?;
    let source::Subscription { consumer, rebalances, gate, fatal } = source::subscribe(&config.kafka, &metrics)?;
    let dlq = Dlq::new(&config.kafka, metrics.clone())?;
    dlq.check_topic().await?;
    let lag = crate::lag::spawn(consumer.clone(), metrics.clone(), shutdown.clone());
    let mut p = Pipeline {
        recent: RecentIds::new(config.ingest.dedup_window),
        writer: Writer::new(sink, dlq, config.ingest.clone(), metrics.clone(), shutdown.clone()),
        broker: Broker::new(consumer.clone(), config.kafka.clone(), backoff, shutdown.clone(), metrics.clone()),
        config,
        normalizer,
        redactor,
        in_flight: None,
        gate,
        consumer,
        rebalances,
        fatal,
        metrics,
        partitions: Partitions::default(),
        topics: HashMap::new(),
        batch: Batch::default(),
        summary: Summary::default(),
        assigned_once: false,
        after_full: false,
        carry: Vec::new(),
        hold_chunk: crate::hooks::hold_chunk_until_revoked(),
        applied: 0,
    };
    tracing::info!(topics = ?p.config.kafka.topics, group = %p.config.kafka.group_id, assignor = %p.config.kafka.assignor, "ingest started");
    let result = p.consume(&options, &mut shutdown).await;
    lag.abort();
    let _ = lag.await;
    let deadline = p.writer.start_deadline().unwrap_or_else(Instant::now);
    // Stop fetching, then make what was read durable and commit it within
    // the shutdown budget. Without the commit the messages are re-read, and
    // the replay log skips what landed.
    let result = match result {
        Ok(()) => {
            let budget = deadline.saturating_duration_since(Instant::now());
            let last = async {
                p.flush().await?;
                p.finish_in_flight().await
            };
            tokio::time::timeout(budget, last).await.unwrap_or(Err(IngestError::ShutdownTimeout(p.config.ingest.shutdown_timeout)))
        }
        Err(e) => Err(e),
    };
    if let Some(in_flight) = p.in_flight.take() {
        // Not durable: nothing of it is committed, it is read again on restart.
        in_flight.task.abort();
        let _ = in_flight.task.await;
    }
    let summary = p.summary.clone();
    p.close(deadline).await;
    result.map(|()| summary)
}

impl Pipeline {
    async fn consume(&mut self, options: &RunOptions, shutdown: &mut watch::Receiver<bool>) -> Result<(), IngestError> {
        let started = Instant::now();
        let mut last_message = Instant::now();
        let mut last_drain_check = Instant::now() - DRAIN_CHECK_EVERY;
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        let consumer = self.consumer.clone();
        loop {
            let flush_at = self.batch.flush_due(self.config.ingest.batch_max_age);
            let caught_up_rows = self.config.ingest.flush_when_caught_up_rows;
            let flush_when_caught_up = !self.batch.is_empty() && ((caught_up_rows > 0 && self.batch.rows >= caught_up_rows) || self.after_full);
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(()),
                // The batch in flight is durable: commit it now, not at the next hand-over.
                written = written(&mut self.in_flight), if self.in_flight.is_some() => {
                    if let Some(InFlight { batch, .. }) = self.in_flight.take() {
                        self.committed(batch, written.map_err(|e| IngestError::join("writer", e)).and_then(|r| r)).await?;
                    }
                }
                _ = async { tokio::time::sleep_until(flush_at.unwrap_or_else(Instant::now).into()).await }, if flush_at.is_some() => {
                    self.apply_rebalances()?;
                    self.after_full = false;
                    self.flush().await?;
                }
                // Re-armed on every pass, so it fires only after CAUGHT_UP_AFTER without a message.
                _ = tokio::time::sleep(CAUGHT_UP_AFTER), if flush_when_caught_up => {
                    self.apply_rebalances()?;
                    metrics::caught_up_flush(&self.metrics, self.batch.rows);
                    self.after_full = false;
                    self.flush().await?;
                }
                message = consumer.recv() => {
                    last_message = Instant::now();
                    // Take what librdkafka already has, up to a chunk, without going back
                    // through select! per message (recv is cancel-safe), each with its generation.
                    let mut messages = Vec::with_capacity(normalize::CHUNK);
                    let mut next = Some(message);
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
                    if self.hold_chunk && self.summary.rows > 0 {
                        self.hold_chunk = false;
                        crate::hooks::hold_until_revoked(&consumer, &self.rebalances, &mut messages).await;
                    }
                    self.handle_chunk(&messages).await?;
                    drop(messages);
                    self.handle_carried().await?;
                    metrics::inflight(&self.metrics, self.buffered_rows());
                }
                _ = ticker.tick() => {
                    self.check_fatal()?;
                    self.apply_rebalances()?;
                    if let Some(idle) = options.exit_when_idle {
                        let grace = if self.assigned_once { Duration::ZERO } else { NO_ASSIGNMENT_GRACE };
                        let quiet = self.batch.is_empty() && self.in_flight.is_none() && last_message.elapsed() >= idle;
                        if quiet && started.elapsed() >= idle + grace && last_drain_check.elapsed() >= DRAIN_CHECK_EVERY {
                            last_drain_check = Instant::now();
                            if self.drained(idle, grace, last_message.elapsed()).await? {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        }
    }

    /// With `--exit-when-idle`: whether every partition is read to its end
    /// and committed (exit 0), or an error when this member never got a
    /// partition or partitions stay behind yet silent (exit 75).
    async fn drained(&mut self, idle: Duration, grace: Duration, silent: Duration) -> Result<bool, IngestError> {
        let kafka = &self.config.kafka;
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

    /// Stops on a permanent broker error (authentication, TLS) that
    /// librdkafka's error callback reported.
    fn check_fatal(&self) -> Result<(), IngestError> {
        match self.fatal.get() {
            None => Ok(()),
            Some((code, reason)) => Err(self.broker.refused(code, reason)),
        }
    }

    /// A consume error: permanent ones (authorization, an unknown topic)
    /// stop ingest; the rest (a broker restarting, a leader moving) are
    /// waited out: librdkafka retries, and nothing past what is durable is
    /// committed meanwhile.
    fn waited_out(&self, source: rdkafka::error::KafkaError) -> Result<(), IngestError> {
        use rdkafka::error::RDKafkaErrorCode as Code;
        match source.rdkafka_error_code() {
            Some(code) if source::is_permanent(code) || matches!(code, Code::UnknownTopicOrPartition | Code::UnknownTopic) => {
                Err(self.broker.refused(code, source.to_string()))
            }
            _ => {
                metrics::consume_error(&self.metrics);
                tracing::warn!(error = %source, "kafka consume error: waiting for the broker (nothing is committed past what is durable)");
                Ok(())
            }
        }
    }

    /// Applies every rebalance event received so far (between chunks).
    fn apply_rebalances(&mut self) -> Result<(), IngestError> {
        self.apply_through(u64::MAX)
    }

    /// Applies the rebalance events that came before a message received
    /// under `generation`.
    fn apply_through(&mut self, generation: u64) -> Result<(), IngestError> {
        // Asked for every message: nothing new costs one atomic load.
        let through = generation.min(self.rebalances.generation());
        if through <= self.applied {
            return Ok(());
        }
        self.applied = through;
        for event in self.rebalances.take_through(through) {
            match event {
                RebalanceEvent::Revoked(list) => {
                    metrics::rebalanced(&self.metrics, "revoke", &list);
                    self.batch.drop_partitions(&list);
                    let keys: Vec<PartitionKey> = list.iter().map(|(t, p)| (self.topic(t).0, *p)).collect();
                    self.partitions.revoke(&keys);
                }
                RebalanceEvent::Assigned(list) => {
                    metrics::rebalanced(&self.metrics, "assign", &list);
                    // A partition paused during a wait and assigned again
                    // after it stays paused in librdkafka: never here.
                    let mut tpl = TopicPartitionList::with_capacity(list.len());
                    for (t, p) in &list {
                        tpl.add_partition(t, *p);
                    }
                    let _ = self.consumer.resume(&tpl);
                    let keys: Vec<PartitionKey> = list.iter().map(|(t, p)| (self.topic(t).0, *p)).collect();
                    self.partitions.assign(&keys)?;
                    // An empty assignment is not one to drain.
                    self.assigned_once |= !list.is_empty();
                }
            }
        }
        metrics::inflight(&self.metrics, self.buffered_rows());
        Ok(())
    }

    /// The shared name of a topic and its per-topic metrics.
    fn topic(&mut self, name: &str) -> TopicEntry {
        if let Some(t) = self.topics.get(name) {
            return t.clone();
        }
        let t = (Arc::from(name), metrics::messages_counter(&self.metrics, name));
        self.topics.insert(name.to_owned(), t.clone());
        t
    }

    /// Normalizes a chunk of messages together, then takes them one by one
    /// in order, each after the rebalance events received before it; a
    /// batch that fills up on the way is handed to the writer.
    async fn handle_chunk<M: Message>(&mut self, messages: &[(M, u64)]) -> Result<(), IngestError> {
        let received_ms = now_ms();
        let topics: Vec<TopicEntry> = messages.iter().map(|(m, _)| self.topic(m.topic())).collect();
        let mut inputs = Vec::with_capacity(messages.len());
        for ((m, _), (topic, _)) in messages.iter().zip(&topics) {
            let partition = table_partition(topic, m.partition())?;
            inputs.push(Input { payload: m.payload().unwrap_or_default(), topic, partition, offset: m.offset() });
        }
        let pieces = self.normalizer.normalize(&inputs, received_ms);
        drop(inputs);
        let mut messages = messages.iter().zip(topics);
        let mut skews = crate::skew::Samples::default();
        for piece in pieces {
            for outcome in piece.outcomes {
                let Some(((message, generation), topic)) = messages.next() else { break };
                self.apply_through(*generation)?;
                self.handle(message, topic, outcome, &piece.bytes, received_ms, &mut skews).await?;
                if self.batch.is_full(self.config.ingest.batch_max_rows, self.config.ingest.batch_max_bytes) {
                    self.after_full = true;
                    self.flush().await?;
                }
            }
        }
        skews.flush();
        Ok(())
    }

    /// Handles what arrived while a wait served the consumer (normally
    /// nothing: the partitions were paused).
    async fn handle_carried(&mut self) -> Result<(), IngestError> {
        while !self.carry.is_empty() {
            let carried = std::mem::take(&mut self.carry);
            self.handle_chunk(&carried).await?;
        }
        Ok(())
    }

    /// Takes one message whose payload normalized to `outcome` (a row
    /// encoded in `encoded`, or a rejection).
    async fn handle<M: Message>(
        &mut self,
        message: &M,
        (topic, consumed): TopicEntry,
        outcome: Outcome,
        encoded: &[u8],
        received_ms: i64,
        skews: &mut crate::skew::Samples,
    ) -> Result<(), IngestError> {
        let (partition, offset) = (message.partition(), message.offset());
        let key: PartitionKey = (topic.clone(), partition);
        // One lookup for a started partition, the common case.
        let mut state = match self.partitions.state(&key) {
            Some(state) => state,
            None => match self.partitions.status(&key) {
                Status::NotOwned => {
                    metrics::unowned_message(&self.metrics, &topic, partition, offset);
                    return Ok(());
                }
                // Never started while stopping: it is left to the next run.
                Status::NotStarted if *self.writer.shutdown.borrow() => return Ok(()),
                Status::NotStarted | Status::Started => {
                    let task = tokio::spawn(partitions::lookup_start(self.broker.clone(), self.writer.clone(), self.metrics.clone(), key.clone()));
                    match self.serve_while(task, "partition start").await? {
                        Ok(state) => self.partitions.started(&key, state),
                        Err(error) if *self.writer.shutdown.borrow() => {
                            tracing::info!(%error, topic = %key.0, partition, "stopping before the partition started");
                            return Ok(());
                        }
                        Err(error) => return Err(error),
                    }
                    // Revoked while it started (the wait served the consumer): not owned now.
                    match self.partitions.state(&key) {
                        Some(state) => state,
                        None => return Ok(()),
                    }
                }
            },
        };
        match state.classify(offset) {
            Delivery::Next => {}
            // Before the commit point: delivered again (a seek or an offset reset).
            Delivery::Again => return Ok(()),
            Delivery::Gap => {
                let task = tokio::spawn(partitions::log_start(self.broker.clone(), key.clone()));
                let log_start = self.serve_while(task, "log start lookup").await??;
                state = match self.partitions.state(&key) {
                    Some(state) => state,
                    None => return Ok(()),
                };
                partitions::account_gap(&self.metrics, &key, state, offset, log_start);
            }
        }
        state.advanced_to(offset);
        self.summary.messages += 1;
        consumed.inc();
        if state.already_stored(offset) {
            metrics::duplicate_skipped(&self.metrics, "replay");
            self.summary.duplicates += 1;
            self.batch.push_skipped(key, offset);
            return Ok(());
        }
        let kafka_ms = crate::skew::kafka_ms(message.timestamp());
        let rejection = match outcome {
            Outcome::Row { day, timestamp_ms, fingerprint, content, range, dropped_fields } => {
                if dropped_fields > 0 {
                    metrics::fields_dropped(&self.metrics, dropped_fields);
                }
                if let Some(kafka_ms) = kafka_ms {
                    let metrics = &self.metrics;
                    skews.observe(&topic, || metrics::skew_histogram(metrics, &topic), crate::skew::seconds(timestamp_ms, kafka_ms));
                }
                let stored = self.recent.get(fingerprint).or_else(|| self.batch.request_ids.get(&fingerprint).copied());
                match Seen::of(stored, content) {
                    Seen::New => {
                        self.batch.push_row(day, &encoded[range], (fingerprint, content), key, offset);
                        return Ok(());
                    }
                    Seen::Retry => {
                        metrics::duplicate_skipped(&self.metrics, "request_id");
                        self.summary.duplicates += 1;
                        self.batch.push_skipped(key, offset);
                        return Ok(());
                    }
                    Seen::Conflict => Rejection::new(
                        ReasonCode::RequestIdConflict,
                        "request_id",
                        "a different event with this request_id was already stored (ids must be unique per request; a retry must resend the same event)",
                    ),
                }
            }
            Outcome::Rejected(rejection) => crate::skew::explain(rejection, kafka_ms, received_ms),
        };
        metrics::event_rejected(&self.metrics, rejection.reason.as_str());
        let Redacted { payload, key: source_key, original } = self.redactor.redact(message.payload().unwrap_or_default(), message.key());
        let reject = Reject { payload, key: source_key, original, rejection, topic, partition, offset, received_ms };
        self.batch.push_reject(reject, key);
        Ok(())
    }

    /// Waits for `task`. Past [`PAUSE_AFTER`] every assigned partition is
    /// paused (librdkafka purges what it prefetched and resumes from the
    /// last message handed out) and the consumer is polled meanwhile:
    /// rebalance callbacks run and `max.poll.interval.ms` is met, so a long
    /// outage does not churn the group. What arrives anyway is kept for later.
    async fn serve_while<T>(&mut self, task: JoinHandle<T>, what: &'static str) -> Result<T, IngestError> {
        self.serve_while_after(task, what, PAUSE_AFTER).await
    }

    /// [`Pipeline::serve_while`], pausing after `pause_after`.
    async fn serve_while_after<T>(&mut self, mut task: JoinHandle<T>, what: &'static str, pause_after: Duration) -> Result<T, IngestError> {
        if let Ok(done) = tokio::time::timeout(pause_after, &mut task).await {
            return done.map_err(|e| IngestError::join(what, e));
        }
        metrics::paused(&self.metrics, what);
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

    /// Hands the batch to the writer task, once the batch before it is
    /// durable and committed.
    async fn flush(&mut self) -> Result<(), IngestError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.finish_in_flight().await?;
        if self.consumer.assignment_lost() {
            // The group session timed out: another member may own the
            // partitions and have looked up what is stored. This batch's
            // messages are read again by whoever owns them next.
            tracing::warn!(rows = self.batch.rows, "group session lost: the unwritten batch is dropped, its messages are read again");
            metrics::session_lost(&self.metrics);
            self.batch = self.batch.emptied();
            self.partitions.forget_states();
            return Ok(());
        }
        let next = Batch::sized_like(&self.batch, self.config.ingest.batch_max_bytes);
        let mut batch = std::mem::replace(&mut self.batch, next);
        // Ids of the batch in flight count as stored (if the write fails,
        // the daemon exits without committing and both are read again).
        self.recent.extend(std::mem::take(&mut batch.request_ids));
        let offsets = batch.offsets.clone();
        let durable: Vec<(String, i32, i64)> = offsets.iter().map(|((t, p), (_, last))| (t.to_string(), *p, last + 1)).collect();
        let (buffered, rejects) = (batch.rows, batch.rejects.len());
        let written = Written { offsets, buffered, rejects, started: Instant::now() };
        let (writer, gate) = (self.writer.clone(), self.gate.clone());
        let guard = gate.enter();
        let task = tokio::spawn(async move {
            // The rows are freed here, off the pipeline's thread.
            let result = writer.write(batch).await;
            if result.is_ok() {
                gate.set_durable(durable);
            }
            drop(guard);
            result
        });
        self.in_flight = Some(InFlight { batch: written, task });
        Ok(())
    }

    fn buffered_rows(&self) -> usize {
        self.batch.rows + self.in_flight.as_ref().map_or(0, |f| f.batch.buffered)
    }

    /// Waits for the batch in flight (serving the consumer), then commits it.
    async fn finish_in_flight(&mut self) -> Result<(), IngestError> {
        let Some(InFlight { batch, task }) = self.in_flight.take() else { return Ok(()) };
        let result = self.serve_while(task, "writer").await.and_then(|r| r);
        self.committed(batch, result).await
    }

    /// A batch was written (`result`): on success the offsets of the
    /// partitions still owned are committed.
    async fn committed(&mut self, batch: Written, result: Result<(), IngestError>) -> Result<(), IngestError> {
        result?;
        let Written { offsets, buffered, rejects, started } = batch;
        self.commit(&offsets).await?;
        let stored = buffered - rejects;
        self.summary.rows += stored as u64;
        self.summary.rejects += rejects as u64;
        metrics::batch_flushed(&self.metrics, stored, rejects, started.elapsed());
        metrics::inflight(&self.metrics, self.buffered_rows());
        Ok(())
    }

    /// Commits the offsets of the partitions still owned. A failure loses
    /// nothing (the next batch's commit covers it, and the partition's
    /// next reader skips durable rows by the replay log); at shutdown, the
    /// last commit is retried within the budget while the consumer is
    /// served (a rebalance in progress refuses commits until it completes),
    /// and a failure then ends the run with exit 75.
    async fn commit(&mut self, offsets: &PartitionMap<(i64, i64)>) -> Result<(), IngestError> {
        let mut wait = Duration::from_millis(200);
        loop {
            let owned: Vec<(String, i32, i64)> =
                offsets.iter().filter(|(key, _)| self.partitions.owns(key)).map(|((t, p), (_, last))| (t.to_string(), *p, last + 1)).collect();
            let Some(left) = self.writer.remaining_budget() else {
                let _ = self.broker.commit(owned, COMMIT_LIMIT).await;
                return Ok(());
            };
            let Err(e) = self.broker.commit(owned, left).await else { return Ok(()) };
            let left = self.writer.remaining_budget().unwrap_or_default();
            if left < wait * 2 {
                return Err(IngestError::FinalCommit(e));
            }
            let pause = tokio::spawn(tokio::time::sleep(wait));
            self.serve_while_after(pause, "final commit", Duration::ZERO).await?;
            self.apply_rebalances()?;
            wait *= 2;
        }
    }

    /// Ends the run within the shutdown budget: pending done marks and
    /// DLQ messages, then the consumer leaves the group. Each step is
    /// bounded; the process exits whatever the broker does.
    async fn close(self, deadline: Instant) {
        let remaining = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        self.gate.closing();
        let _ = tokio::time::timeout(remaining(), self.writer.mark_done()).await;
        let dlq = self.writer.dlq.clone();
        let wait = remaining().min(Duration::from_secs(5));
        let _ = tokio::time::timeout(wait, tokio::task::spawn_blocking(move || dlq.flush(wait))).await;
        let consumer = self.consumer;
        drop(self.broker);
        let leave = tokio::task::spawn_blocking(move || {
            consumer.unsubscribe();
            drop(consumer);
        });
        let _ = tokio::time::timeout(remaining(), leave).await;
    }
}

/// Waits for the writer task of the batch in flight (forever if none).
async fn written(in_flight: &mut Option<InFlight>) -> Result<Result<(), IngestError>, tokio::task::JoinError> {
    match in_flight {
        Some(f) => (&mut f.task).await,
        None => std::future::pending().await,
    }
}
