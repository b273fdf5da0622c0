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
//!
//! Each stage is a type that owns its state, as Quickwit's indexing
//! pipeline is laid out: `source` (the consumer, the partitions owned,
//! the waits that keep the group), the normalizer ([`crate::normalize`]),
//! `batcher` (the batch and the dedup window), `write` (the writer task,
//! one batch in flight) and `commit` (offsets, at shutdown within the
//! budget). This file is the supervisor: it builds them, runs the loop
//! ([`run`]: consume, flush, drain, shut down) and carries each stage's
//! output to the next; the queue between batcher and writer holds one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inferlog_schema::{Contract, UserIdHasher};
use inferlog_store::retry::{self, Retryable};
use rdkafka::message::Message;
use tokio::sync::watch;

use crate::broker::Broker;
use crate::config::Config;
use crate::dlq::{now_ms, Dlq};
use crate::error::IngestError;
use crate::internal_events::{CaughtUpFlush, InFlightRows, InsertFailed, InternalEvent, SessionLost};
use crate::late_days::LateDays;
use crate::metrics::Metrics;
use crate::normalize::{Input, Normalizer};
use crate::redact::Redactor;
use crate::service_metrics::{Interner, ServiceMetrics};
use crate::sink::{table_partition, ClickHouseSink};
use crate::writer::Writer;

mod batcher;
mod commit;
mod source;
mod write;

use batcher::{Batcher, Normalized, Received};
use commit::{Commit, Neighbours};
use source::{Source, TopicEntry};
use write::{InFlight, Write};

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
/// With `--exit-when-idle`, how often the drain check asks the broker.
const DRAIN_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The supervisor: the stages, and what it needs to carry between them.
struct Pipeline {
    config: Config,
    metrics: Metrics,
    source: Source,
    normalizer: Normalizer,
    batcher: Batcher,
    write: Write,
    commit: Commit<Broker>,
}

/// Runs until `shutdown` flips to true (then flushes and commits) or, with
/// `exit_when_idle`, until the topics are drained.
pub async fn run(config: Config, options: RunOptions, metrics: Metrics, mut shutdown: watch::Receiver<bool>) -> Result<Summary, IngestError> {
    let contract = Contract::new(&config.schema)?;
    let hasher = UserIdHasher::from_env(config.schema.hash_key_id.as_deref())?;
    let redactor = Redactor::new(config.kafka.dlq_payload, hasher.clone()).carrying(config.kafka.dlq_headers.clone());
    let interner = config.service_metrics.enabled.then(|| Arc::new(Interner::new(&config.service_metrics)));
    let service = interner.clone().map(ServiceMetrics::new);
    if let Some(service) = &service {
        // Registered once per registry (a second run in one process reuses it).
        if let Err(e) = metrics.registry.register(Box::new(service.clone())) {
            tracing::warn!(error = %e, "service metrics not registered");
        }
    }
    let normalizer = Normalizer::new(contract, hasher, &config.otlp, config.ingest.normalize_threads, interner)?;
    let unprepared = ClickHouseSink::new(&config.clickhouse)?;
    let backoff = (config.ingest.retry_initial_backoff, config.ingest.retry_max_backoff);
    // ClickHouse may still be starting: wait for it, until a shutdown; a
    // refusal (credentials, rights) or a drifted table ends the run.
    let mut attempt = 0;
    let (sink, _features) = (|| unprepared.prepared())
        .retry(retry::backoff(backoff.0, backoff.1))
        .sleep(retry::ShutdownSleeper::new(shutdown.clone()))
        .when(|e| e.retry_in_place() && !*shutdown.borrow())
        .notify(|error, backoff| {
            attempt += 1;
            InsertFailed { what: "prepare the tables", error, attempt, backoff }.emit(&metrics);
        })
        .await?;
    let fence = crate::source::fence_after(&config.kafka, config.clickhouse.request_timeout);
    let subscription = crate::source::subscribe(&config.kafka, fence, &metrics)?;
    let dlq = Dlq::new(&config.kafka, metrics.clone())?;
    dlq.check_topic().await?;
    let (consumer, gate) = (subscription.consumer.clone(), subscription.gate.clone());
    let lag = crate::lag::spawn(consumer.clone(), metrics.clone(), shutdown.clone());
    let late = LateDays::new(config.retention.hot_days, config.postgres.clone());
    let writer = Writer::new(sink, dlq, config.ingest.clone(), metrics.clone(), shutdown.clone(), gate.clone(), late);
    let broker = Broker::new(consumer, config.kafka.clone(), backoff, shutdown.clone(), metrics.clone());
    let budget = writer.budget().clone();
    let source = Source::new(source::Parts {
        subscription,
        broker: broker.clone(),
        kafka: config.kafka.clone(),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        sink: writer.sink.clone(),
        policy: writer.policy().clone(),
    });
    let mut p = Pipeline {
        batcher: Batcher::new(&config.ingest, redactor, metrics.clone()),
        write: Write::new(writer, gate),
        commit: Commit::new(broker, budget, service, metrics.clone()),
        source,
        normalizer,
        metrics,
        config,
    };
    tracing::info!(topics = ?p.config.kafka.topics, group = %p.config.kafka.group_id, assignor = %p.config.kafka.assignor, "ingest started");
    let result = p.consume(&options, &mut shutdown).await;
    lag.abort();
    let _ = lag.await;
    let deadline = p.write.writer().start_deadline().unwrap_or_else(Instant::now);
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
    p.write.abandon().await;
    let summary = p.summary();
    p.close(deadline).await;
    result.map(|()| summary)
}

impl Pipeline {
    async fn consume(&mut self, options: &RunOptions, shutdown: &mut watch::Receiver<bool>) -> Result<(), IngestError> {
        let started = Instant::now();
        let mut last_message = Instant::now();
        let mut last_drain_check = Instant::now() - DRAIN_CHECK_EVERY;
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        let consumer = self.source.consumer();
        loop {
            let flush_at = self.batcher.flush_due();
            let flush_when_caught_up = self.batcher.caught_up_due();
            let busy = self.write.is_busy();
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(()),
                // The batch in flight is durable: commit it now, not at the next hand-over.
                written = self.write.written(), if busy => {
                    if let Some(InFlight { batch, .. }) = self.write.take() {
                        self.committed(batch, written.map_err(|e| IngestError::join("writer", e)).and_then(|r| r)).await?;
                    }
                }
                _ = async { tokio::time::sleep_until(flush_at.unwrap_or_else(Instant::now).into()).await }, if flush_at.is_some() => {
                    self.apply_rebalances()?;
                    self.batcher.flushing_unfull();
                    self.flush().await?;
                }
                // Re-armed on every pass, so it fires only after CAUGHT_UP_AFTER without a message.
                _ = tokio::time::sleep(CAUGHT_UP_AFTER), if flush_when_caught_up => {
                    self.apply_rebalances()?;
                    CaughtUpFlush { rows: self.batcher.rows() }.emit(&self.metrics);
                    self.batcher.flushing_unfull();
                    self.flush().await?;
                }
                message = consumer.recv() => {
                    last_message = Instant::now();
                    let messages = self.source.chunk(&consumer, message, self.commit.rows).await?;
                    self.handle_chunk(&messages).await?;
                    drop(messages);
                    self.handle_carried().await?;
                    self.inflight();
                }
                _ = ticker.tick() => {
                    self.source.check_fatal()?;
                    self.apply_rebalances()?;
                    if let Some(idle) = options.exit_when_idle {
                        let grace = if self.source.assigned_once() { Duration::ZERO } else { NO_ASSIGNMENT_GRACE };
                        let quiet = self.batcher.is_empty() && !self.write.is_busy() && last_message.elapsed() >= idle;
                        if quiet && started.elapsed() >= idle + grace && last_drain_check.elapsed() >= DRAIN_CHECK_EVERY {
                            last_drain_check = Instant::now();
                            if self.source.drained(idle, grace, last_message.elapsed()).await? {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        }
    }

    /// What the run did, from each stage's counts.
    fn summary(&self) -> Summary {
        Summary { messages: self.source.messages, rows: self.commit.rows, rejects: self.commit.rejects, duplicates: self.batcher.duplicates }
    }

    /// Rows and rejects buffered and not yet durable, to the gauge.
    fn inflight(&self) {
        InFlightRows { rows: self.batcher.rows() + self.write.buffered() }.emit(&self.metrics);
    }

    /// Applies every rebalance event received so far (between chunks).
    fn apply_rebalances(&mut self) -> Result<(), IngestError> {
        self.apply_through(u64::MAX)?;
        self.inflight();
        Ok(())
    }

    /// Applies the rebalance events that came before a message received
    /// under `generation`: revoked partitions leave the batch.
    fn apply_through(&mut self, generation: u64) -> Result<(), IngestError> {
        let revoked = self.source.apply_through(generation)?;
        if !revoked.is_empty() {
            self.batcher.drop_partitions(&revoked);
        }
        Ok(())
    }

    /// Normalizes a chunk of messages together, then takes them one by one
    /// in order, each after the rebalance events received before it; a
    /// batch that fills up on the way is handed to the write stage.
    async fn handle_chunk<M: Message>(&mut self, messages: &[(M, u64)]) -> Result<(), IngestError> {
        let received_ms = now_ms();
        let topics: Vec<TopicEntry> = messages.iter().map(|(m, _)| self.source.topic(m.topic())).collect();
        let mut inputs = Vec::with_capacity(messages.len());
        for ((m, _), (topic, _)) in messages.iter().zip(&topics) {
            let partition = table_partition(topic, m.partition())?;
            let encoding = self.config.kafka.encoding(topic);
            inputs.push(Input { payload: m.payload().unwrap_or_default(), topic, partition, offset: m.offset(), encoding });
        }
        let pieces = self.normalizer.normalize(&inputs, received_ms);
        drop(inputs);
        let mut messages = messages.iter().zip(topics);
        let mut skews = crate::skew::Samples::default();
        for piece in pieces {
            let mut outcomes = piece.outcomes.into_iter();
            let mut start = 0;
            for end in piece.messages {
                let Some(((message, generation), topic)) = messages.next() else { break };
                let mut events = outcomes.by_ref().take((end.end - start) as usize);
                start = end.end;
                self.apply_through(*generation)?;
                if let Some(admitted) = self.source.admit(message, *generation, &topic).await? {
                    let key = (topic.0.clone(), message.partition());
                    let (normalizer, kafka) = (&self.normalizer, &self.config.kafka);
                    let payload = message.payload().unwrap_or_default();
                    // Only a later conflict rebuilds a span: its topic's encoding is looked up then.
                    let respan = |index| normalizer.span(payload, kafka.encoding(&topic.0), index);
                    let normalized = Normalized { outcomes: events.by_ref(), skipped_spans: end.skipped_spans, encoded: &piece.bytes };
                    let mut received = Received { at_ms: received_ms, skews: &mut skews };
                    self.batcher.take_message(message, &key, admitted, normalized, &mut received, &respan);
                }
                // A message not taken (not owned, delivered again) leaves
                // its outcomes here: they are its own, never the next message's.
                events.for_each(drop);
                if self.batcher.check_full() {
                    self.flush().await?;
                }
            }
        }
        skews.flush();
        Ok(())
    }

    /// Handles what arrived while a wait served the consumer.
    async fn handle_carried(&mut self) -> Result<(), IngestError> {
        loop {
            let carried = self.source.take_carried();
            if carried.is_empty() {
                return Ok(());
            }
            self.handle_chunk(&carried).await?;
        }
    }

    /// Hands the batch to the write stage, once the batch before it is
    /// durable and committed.
    async fn flush(&mut self) -> Result<(), IngestError> {
        if self.batcher.is_empty() {
            return Ok(());
        }
        self.finish_in_flight().await?;
        // Revocations that arrived while the batch filled (a wait served
        // the consumer) take their partitions' rows out first: the
        // revocation callback has returned, so their next owner may
        // already have looked up what is stored.
        self.apply_rebalances()?;
        if self.batcher.is_empty() {
            return Ok(());
        }
        if self.batcher.after_full() && self.commit.rows > 0 {
            self.source.hold_until_session_lost().await;
        }
        if self.source.assignment_lost() {
            // The group session timed out: another member may own the
            // partitions and have looked up what is stored. This batch's
            // messages are read again by whoever owns them next, and so
            // are those still queued here before the revocation.
            SessionLost { rows: self.batcher.rows() }.emit(&self.metrics);
            self.batcher.drop_all();
            self.source.lose_all();
            return Ok(());
        }
        let (batch, written) = self.batcher.cut();
        self.write.hand_over(batch, written);
        Ok(())
    }

    /// Waits for the batch in flight (serving the consumer), then commits it.
    async fn finish_in_flight(&mut self) -> Result<(), IngestError> {
        let Some(InFlight { batch, task }) = self.write.take() else { return Ok(()) };
        let result = self.source.serve_while(task, "writer").await.and_then(|r| r);
        self.committed(batch, result).await
    }

    /// The commit stage takes a finished batch.
    async fn committed(&mut self, batch: batcher::Written, result: Result<(), IngestError>) -> Result<(), IngestError> {
        let mut around = Around { source: &mut self.source, batcher: &mut self.batcher };
        self.commit.committed(batch, result, &mut around).await?;
        self.inflight();
        Ok(())
    }

    /// Ends the run within the shutdown budget: pending done marks and
    /// DLQ messages, then the consumer leaves the group. Each step is
    /// bounded; the process exits whatever the broker does.
    async fn close(self, deadline: Instant) {
        let remaining = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let _ = tokio::time::timeout(remaining(), self.write.close()).await;
        let dlq = self.write.writer().dlq.clone();
        let wait = remaining().min(Duration::from_secs(5));
        let _ = tokio::time::timeout(wait, tokio::task::spawn_blocking(move || dlq.flush(wait))).await;
        // The commit stage's broker shares the consumer: dropped first, so
        // leaving the group closes it.
        let Pipeline { source, commit, write, .. } = self;
        drop(commit);
        drop(write);
        source.leave(remaining()).await;
    }
}

/// The source and batch stages as the commit stage sees them while it
/// retries the last commit.
struct Around<'a> {
    source: &'a mut Source,
    batcher: &'a mut Batcher,
}

impl Neighbours for Around<'_> {
    fn owns(&self, key: &crate::batch::PartitionKey) -> bool {
        self.source.owns(key)
    }

    async fn pause(&mut self, wait: Duration) -> Result<(), IngestError> {
        let pause = tokio::spawn(tokio::time::sleep(wait));
        self.source.serve_while_after(pause, "final commit", Duration::ZERO).await?;
        let revoked = self.source.apply_through(u64::MAX)?;
        self.batcher.drop_partitions(&revoked);
        Ok(())
    }
}
