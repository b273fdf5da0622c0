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
//! This file is the loop ([`run`]: consume, flush, drain, shut down); its
//! steps are `message` (messages into the batch), `flush` (the batch to
//! the writer, offsets committed) and `wait` (waits that keep serving
//! the consumer, and the drain check).

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
use crate::dlq::{now_ms, Dlq, Reject, SpanRef};
use crate::error::IngestError;
use crate::late_days::LateDays;
use crate::metrics::{self, Metrics};
use crate::normalize::{self, Input, Normalizer, Outcome};
use crate::offsets::{Delivery, DrainState};
use crate::partitions::{self, Partitions, Status};
use crate::redact::{Redacted, Redactor};
use crate::service_metrics::{Interner, ServiceMetrics, Tally};
use crate::source::{self, Consumer, FlushGate, RebalanceEvent, RebalanceLog};
use crate::writer::Writer;

mod flush;
mod message;
mod wait;

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
    /// What its rows add to the service metrics, once durable.
    tallies: PartitionMap<Tally>,
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
    /// The live service metrics (absent when `service_metrics.enabled` is false).
    service: Option<ServiceMetrics>,
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
        .notify(|e, wait| {
            attempt += 1;
            metrics::insert_failed(&metrics, e, attempt, wait);
        })
        .await?;
    let fence = source::fence_after(&config.kafka, config.clickhouse.request_timeout);
    let source::Subscription { consumer, rebalances, gate, fatal } = source::subscribe(&config.kafka, fence, &metrics)?;
    let dlq = Dlq::new(&config.kafka, metrics.clone())?;
    dlq.check_topic().await?;
    let lag = crate::lag::spawn(consumer.clone(), metrics.clone(), shutdown.clone());
    let mut p = Pipeline {
        recent: RecentIds::new(config.ingest.dedup_window),
        writer: Writer::new(
            sink,
            dlq,
            config.ingest.clone(),
            metrics.clone(),
            shutdown.clone(),
            gate.clone(),
            LateDays::new(config.retention.hot_days, config.postgres.clone()),
        ),
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
        service,
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

    /// Stops on a permanent broker error (authentication, TLS) that
    /// librdkafka's error callback reported.
    fn check_fatal(&self) -> Result<(), IngestError> {
        match self.fatal.get() {
            None => Ok(()),
            Some((code, reason)) => Err(self.broker.refused(code, reason)),
        }
    }
}

/// Waits for the writer task of the batch in flight (forever if none).
async fn written(in_flight: &mut Option<InFlight>) -> Result<Result<(), IngestError>, tokio::task::JoinError> {
    match in_flight {
        Some(f) => (&mut f.task).await,
        None => std::future::pending().await,
    }
}
