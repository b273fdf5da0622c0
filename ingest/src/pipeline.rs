//! The ingest loop. In: Kafka messages. Out: hot rows in ClickHouse, rejects
//! in the DLQ, committed offsets. One batch at a time:
//!
//! 1. the messages librdkafka has ready are validated and normalized
//!    together ([`crate::normalize`], on a small thread pool), then taken
//!    one by one in offset order: a message whose offset is already stored
//!    (a replay after a crash or a rebalance) or whose request_id was just
//!    stored (a producer retry) is skipped;
//! 2. when the batch is full, old, or the source has been read to its end,
//!    it is handed to the [`crate::writer`] task, which inserts its rows one
//!    UTC day per INSERT and produces and logs its rejects while the next
//!    batch is read; only once that returned are its offsets committed.
//!
//! One batch is written while one fills: a full batch waits for the one in
//! flight, and nothing more is fetched beyond librdkafka's bounded prefetch,
//! so memory stays bounded however long ClickHouse is away.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferlog_schema::{Contract, UserIdHasher};
use inferlog_store::retry::{self, Retryable};
use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::batch::{Batch, PartitionKey, PartitionMap, RecentIds};
use crate::clickhouse_sink::ClickHouseSink;
use crate::config::Config;
use crate::dlq::{now_ms, Dlq, Reject};
use crate::error::IngestError;
use crate::metrics::{self, Metrics};
use crate::normalize::{self, Input, Normalizer, Outcome};
use crate::offsets::{self, Delivery, DrainState, PartitionEnd, PartitionState};
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

/// With no message for this long, the source counts as read to its end
/// (`ingest.flush_when_caught_up_rows`). Several of librdkafka's fetch waits.
const CAUGHT_UP_AFTER: Duration = Duration::from_millis(100);

/// With `--exit-when-idle`, how long past the idle time a member waits for
/// its first partition (joining a group takes a few seconds).
const NO_ASSIGNMENT_GRACE: Duration = Duration::from_secs(30);

/// With `--exit-when-idle`, how long past the idle time ingest waits for
/// partitions that are behind their end yet deliver nothing, before it
/// exits 75 naming them (a wait, never a hang).
const NOT_DRAINED_LIMIT: Duration = Duration::from_secs(300);

/// With `--exit-when-idle`, how often the drain check asks the broker.
const DRAIN_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Waits for the writer task of the batch in flight (forever if none) and
/// returns its outcome; what to commit stays in `in_flight`.
async fn written(in_flight: &mut Option<InFlight>) -> Result<Result<(), IngestError>, tokio::task::JoinError> {
    match in_flight {
        Some(f) => (&mut f.task).await,
        None => std::future::pending().await,
    }
}

/// Runs a blocking call of the consumer (broker round trips) off the async
/// workers; `what` names the call if its task panics.
async fn on_consumer<T: Send + 'static>(
    consumer: &Arc<Consumer>,
    what: &'static str,
    call: impl FnOnce(&Consumer) -> T + Send + 'static,
) -> Result<T, IngestError> {
    let consumer = consumer.clone();
    tokio::task::spawn_blocking(move || call(&consumer)).await.map_err(|e| IngestError::Config(format!("{what} task: {e}")))
}

/// The batch the writer task is making durable. The task owns its rows
/// (and frees them on its own thread); the pipeline keeps what it commits
/// and counts.
struct InFlight {
    /// Highest offset handled per partition: committed + 1 once durable.
    offsets: PartitionMap<i64>,
    /// Rows and rejects, as counted by the batch.
    buffered: usize,
    rejects: usize,
    task: tokio::task::JoinHandle<Result<(), IngestError>>,
    started: Instant,
}

struct Pipeline {
    config: Config,
    normalizer: Normalizer,
    writer: Writer,
    in_flight: Option<InFlight>,
    gate: Arc<FlushGate>,
    consumer: Arc<Consumer>,
    rebalances: Arc<RebalanceLog>,
    fatal: Arc<source::FatalError>,
    metrics: Metrics,
    partitions: PartitionMap<PartitionState>,
    topics: HashMap<String, (Arc<str>, prometheus::IntCounter)>,
    recent: RecentIds,
    batch: Batch,
    summary: Summary,
    assigned_once: bool,
    /// The batch filling now began when the one before it was full: the
    /// source had a backlog, and when it goes quiet this batch is its tail,
    /// flushed whatever its size.
    after_full: bool,
}

/// Runs until `shutdown` flips to true (then flushes and commits) or, with
/// `exit_when_idle`, until the topics are drained.
pub async fn run(config: Config, options: RunOptions, metrics: Metrics, mut shutdown: watch::Receiver<bool>) -> Result<Summary, IngestError> {
    let contract = Contract::new(&config.schema)?;
    let hasher = UserIdHasher::from_env(config.schema.hash_key_id.as_deref())?;
    let normalizer = Normalizer::new(contract, hasher, config.ingest.normalize_threads)?;
    let sink = ClickHouseSink::new(&config.clickhouse)?;
    // ClickHouse may still be starting: wait for it, until a shutdown.
    let mut attempt = 0;
    (|| sink.ensure_schema())
        .retry(retry::backoff(config.ingest.retry_initial_backoff, config.ingest.retry_max_backoff))
        .sleep(retry::ShutdownSleeper::new(shutdown.clone()))
        .when(|_| !*shutdown.borrow())
        .notify(|e, wait| {
            attempt += 1;
            metrics::insert_failed(&metrics, e, attempt, wait);
        })
        .await?;
    let source::Subscription { consumer, rebalances, gate, fatal } = source::subscribe(&config.kafka)?;
    let dlq = Dlq::new(&config.kafka, metrics.clone())?;
    let mut p = Pipeline {
        recent: RecentIds::new(config.ingest.dedup_window),
        writer: Writer::new(sink, dlq, config.ingest.clone(), metrics.clone(), shutdown.clone()),
        config,
        normalizer,
        in_flight: None,
        gate,
        consumer,
        rebalances,
        fatal,
        metrics,
        partitions: PartitionMap::default(),
        topics: HashMap::new(),
        batch: Batch::default(),
        summary: Summary::default(),
        assigned_once: false,
        after_full: false,
    };
    tracing::info!(topics = ?p.config.kafka.topics, group = %p.config.kafka.group_id, "ingest started");
    let result = p.consume(&options, &mut shutdown).await;
    if let Err(e) = result {
        // Nothing more is committed: what was read is re-read on restart.
        if let Some(in_flight) = p.in_flight.take() {
            in_flight.task.abort();
            let _ = in_flight.task.await;
        }
        p.consumer.unsubscribe();
        return Err(e);
    }
    // Stop fetching, then make what was read durable and commit it within
    // the shutdown budget. Without the commit the messages are re-read.
    p.writer.start_deadline();
    let mut final_flush = p.flush().await;
    if final_flush.is_ok() {
        final_flush = p.finish_in_flight().await;
    }
    p.writer.dlq.flush(Duration::from_secs(5));
    p.consumer.unsubscribe();
    final_flush?;
    Ok(p.summary)
}

impl Pipeline {
    async fn consume(&mut self, options: &RunOptions, shutdown: &mut watch::Receiver<bool>) -> Result<(), IngestError> {
        let started = Instant::now();
        let mut last_message = Instant::now();
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        let mut last_drain_check = Instant::now() - DRAIN_CHECK_EVERY;
        let mut lag_ticker = tokio::time::interval_at((Instant::now() + Duration::from_secs(2)).into(), Duration::from_secs(5));
        // After a long flush, one check rather than a burst.
        lag_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let consumer = self.consumer.clone();
        loop {
            let flush_at = self.batch.flush_due(self.config.ingest.batch_max_age);
            let caught_up_rows = self.config.ingest.flush_when_caught_up_rows;
            let flush_when_caught_up = !self.batch.is_empty() && ((caught_up_rows > 0 && self.batch.rows >= caught_up_rows) || self.after_full);
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(()),
                // The batch in flight is durable: commit it now, not at the next hand-over.
                written = written(&mut self.in_flight), if self.in_flight.is_some() => self.committed(written).await?,
                _ = async { tokio::time::sleep_until(flush_at.unwrap_or_else(Instant::now).into()).await }, if flush_at.is_some() => {
                    self.after_full = false;
                    self.flush().await?;
                }
                // Re-armed on every pass of the loop, so it fires only after
                // CAUGHT_UP_AFTER without a message: the end of what there was to read.
                _ = tokio::time::sleep(CAUGHT_UP_AFTER), if flush_when_caught_up => {
                    metrics::caught_up_flush(&self.metrics, self.batch.rows);
                    self.after_full = false;
                    self.flush().await?;
                }
                message = consumer.recv() => {
                    last_message = Instant::now();
                    // Take what librdkafka already has, up to a chunk, without
                    // going back through select! per message (recv is cancel-safe).
                    let mut messages = Vec::with_capacity(normalize::CHUNK);
                    let mut error = None;
                    let mut next = Some(message);
                    while let Some(message) = next.take() {
                        match message {
                            Ok(message) => messages.push(message),
                            Err(source) => {
                                error = Some(source);
                                break;
                            }
                        }
                        if messages.len() < normalize::CHUNK {
                            next = futures_util::FutureExt::now_or_never(consumer.recv());
                        }
                    }
                    self.handle_chunk(&messages).await?;
                    drop(messages);
                    if let Some(source) = error {
                        self.consume_error(source)?;
                    }
                    // The gauge counts what was just read, not what the last tick saw.
                    metrics::inflight(&self.metrics, self.buffered_rows());
                }
                _ = ticker.tick() => {
                    self.check_fatal()?;
                    self.apply_rebalances();
                    if let Some(idle) = options.exit_when_idle {
                        // Idle counts from the first assignment (joining a group takes a while).
                        let grace = if self.assigned_once { Duration::ZERO } else { NO_ASSIGNMENT_GRACE };
                        let quiet = self.batch.is_empty() && self.in_flight.is_none() && last_message.elapsed() >= idle;
                        if quiet && started.elapsed() >= idle + grace && last_drain_check.elapsed() >= DRAIN_CHECK_EVERY {
                            last_drain_check = Instant::now();
                            if !self.assigned_once {
                                return Err(IngestError::NotDrained(format!(
                                    "group {} gave this member no partition of {:?} within {}; another member holds them all, or the group is still rebalancing",
                                    self.config.kafka.group_id,
                                    self.config.kafka.topics,
                                    humantime::format_duration(idle + grace)
                                )));
                            }
                            match self.drain_state().await? {
                                Some(DrainState::Drained) => {
                                    tracing::info!(idle = %humantime::format_duration(idle), "every partition read to its end and committed: drained");
                                    return Ok(());
                                }
                                Some(DrainState::Behind { held, others }) => {
                                    if last_message.elapsed() >= idle + NOT_DRAINED_LIMIT {
                                        return Err(IngestError::NotDrained(format!(
                                            "nothing arrived for {} while partitions are behind their end: held here {held:?}, by others {others:?}",
                                            humantime::format_duration(last_message.elapsed())
                                        )));
                                    }
                                    tracing::info!(?held, ?others, "not drained yet: partitions behind their end (held here, or by other members)");
                                }
                                None => {}
                            }
                        }
                    }
                }
                _ = lag_ticker.tick() => {
                    self.report_lag().await?;
                }
            }
        }
    }

    /// Stops on a permanent broker error (authentication, TLS) that
    /// librdkafka's error callback reported.
    fn check_fatal(&self) -> Result<(), IngestError> {
        match self.fatal.get() {
            None => Ok(()),
            Some((code, reason)) => Err(self.refused(code, reason)),
        }
    }

    fn refused(&self, code: rdkafka::error::RDKafkaErrorCode, reason: String) -> IngestError {
        let kafka = &self.config.kafka;
        IngestError::KafkaRefused { brokers: kafka.brokers.clone(), security: kafka.security.describe(), code, reason }
    }

    /// A consume error: permanent ones (authorization, an unknown topic)
    /// stop ingest; the rest (a broker restarting, a leader moving) are
    /// waited out: librdkafka retries, and nothing past what is durable is
    /// committed meanwhile.
    fn consume_error(&mut self, source: rdkafka::error::KafkaError) -> Result<(), IngestError> {
        use rdkafka::error::RDKafkaErrorCode as Code;
        match source.rdkafka_error_code() {
            Some(code) if source::is_permanent(code) || matches!(code, Code::UnknownTopicOrPartition | Code::UnknownTopic) => {
                Err(self.refused(code, source.to_string()))
            }
            _ => {
                metrics::consume_error(&self.metrics);
                tracing::warn!(error = %source, "kafka consume error: waiting for the broker (nothing is committed past what is durable)");
                Ok(())
            }
        }
    }

    fn apply_rebalances(&mut self) {
        for event in self.rebalances.take() {
            match event {
                RebalanceEvent::Revoked(list) => {
                    metrics::rebalanced(&self.metrics, "revoke", &list);
                    self.batch.drop_partitions(&list);
                    self.partitions.retain(|(t, p), _| !list.iter().any(|(rt, rp)| **t == **rt && p == rp));
                }
                RebalanceEvent::Assigned(list) => {
                    metrics::rebalanced(&self.metrics, "assign", &list);
                    // An empty assignment is not one to drain.
                    self.assigned_once |= !list.is_empty();
                }
            }
        }
        metrics::inflight(&self.metrics, self.buffered_rows());
    }

    /// The shared name of a topic and its consumed-messages counter.
    fn topic(&mut self, name: &str) -> (Arc<str>, prometheus::IntCounter) {
        if let Some(t) = self.topics.get(name) {
            return t.clone();
        }
        let t = (Arc::from(name), metrics::messages_counter(&self.metrics, name));
        self.topics.insert(name.to_owned(), t.clone());
        t
    }

    /// Normalizes a chunk of messages together, then takes them one by one
    /// in order; a batch that fills up on the way is handed to the writer.
    async fn handle_chunk(&mut self, messages: &[rdkafka::message::BorrowedMessage<'_>]) -> Result<(), IngestError> {
        let received_ms = now_ms();
        // Each message's topic name and consumed counter, looked up once.
        let topics: Vec<(Arc<str>, prometheus::IntCounter)> = messages.iter().map(|m| self.topic(m.topic())).collect();
        let inputs: Vec<Input<'_>> = messages
            .iter()
            .zip(&topics)
            .map(|(m, (topic, _))| Input { payload: m.payload().unwrap_or_default(), topic, partition: m.partition(), offset: m.offset() })
            .collect();
        let pieces = self.normalizer.normalize(&inputs, received_ms);
        let mut messages = messages.iter().zip(topics);
        for piece in pieces {
            for outcome in piece.outcomes {
                let Some((message, topic)) = messages.next() else { break };
                self.apply_rebalances();
                self.handle(message, topic, outcome, &piece.bytes, received_ms).await?;
                if self.batch.is_full(self.config.ingest.batch_max_rows, self.config.ingest.batch_max_bytes) {
                    self.after_full = true;
                    self.flush().await?;
                }
            }
        }
        Ok(())
    }

    /// Takes one message whose payload normalized to `outcome` (a row
    /// encoded in `encoded`, or a rejection).
    async fn handle(
        &mut self,
        message: &rdkafka::message::BorrowedMessage<'_>,
        (topic, consumed): (Arc<str>, prometheus::IntCounter),
        outcome: Outcome,
        encoded: &[u8],
        received_ms: i64,
    ) -> Result<(), IngestError> {
        let (partition, offset) = (message.partition(), message.offset());
        let key: PartitionKey = (topic.clone(), partition);

        if !self.partitions.contains_key(&key) {
            match self.start_partition(&key).await {
                Ok(()) => {}
                // Stopping (a SIGTERM while the broker is away): nothing of
                // this partition is buffered, so it is left to the next run.
                Err(error) if *self.writer.shutdown.borrow() => {
                    tracing::info!(%error, topic = %key.0, partition = key.1, "stopping before the partition started");
                    return Ok(());
                }
                Err(error) => return Err(error),
            }
        }
        // One map lookup per message; only a gap (rare) looks it up again.
        let mut state = match self.partitions.get_mut(&key) {
            Some(state) => state,
            None => return Ok(()),
        };
        match state.classify(offset) {
            Delivery::Next => {}
            // Before the commit point: delivered again (a seek or an offset reset).
            Delivery::Again => return Ok(()),
            Delivery::Gap => {
                self.gap(&key, offset).await?;
                state = match self.partitions.get_mut(&key) {
                    Some(state) => state,
                    None => return Ok(()),
                };
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

        match outcome {
            Outcome::Row { day, fingerprint: id, range, dropped_fields } => {
                if dropped_fields > 0 {
                    metrics::fields_dropped(&self.metrics, dropped_fields);
                }
                if self.recent.contains(id) || self.batch.request_ids.contains(&id) {
                    metrics::duplicate_skipped(&self.metrics, "request_id");
                    self.summary.duplicates += 1;
                    self.batch.push_skipped(key, offset);
                    return Ok(());
                }
                self.batch.push_row(day, &encoded[range], id, key, offset);
            }
            Outcome::Rejected(rejection) => {
                metrics::event_rejected(&self.metrics, rejection.reason.as_str());
                let payload = message.payload().unwrap_or_default().to_vec();
                let reject = Reject { payload, key: message.key().map(<[u8]>::to_vec), rejection, topic, partition, offset, received_ms };
                self.batch.push_reject(reject, key);
            }
        }
        Ok(())
    }

    /// Starts the state of a partition this member just got: the committed
    /// offset (where reading must resume), the broker's low watermark, and
    /// which offsets past the commit a previous owner already stored.
    async fn start_partition(&mut self, key: &PartitionKey) -> Result<(), IngestError> {
        let (topic, partition) = (&key.0, key.1);
        let t = topic.to_string();
        let positions = self
            .broker_call("committed offset lookup", move |consumer| {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&t, partition);
                let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
                let committed = committed.find_partition(&t, partition).and_then(|p| p.offset().to_raw()).filter(|o| *o >= 0);
                let (low, _high) = consumer.fetch_watermarks(&t, partition, Duration::from_secs(10))?;
                Ok((committed, low))
            })
            .await?;
        let (committed, low) = positions;
        if let Some(committed) = committed.filter(|c| *c < low) {
            // The broker deleted (retention) what the group had not read yet.
            let lost = low - committed;
            tracing::error!(%topic, partition, committed, log_start = low, lost, "offsets are gone from the broker (retention); continuing from the log start");
            metrics::offsets_lost(&self.metrics, lost);
        }
        let expected = committed.unwrap_or(low).max(low);
        let replay = self
            .writer
            .retry("replay filter", |sink: ClickHouseSink, _| {
                let topic = topic.clone();
                async move { sink.stored_offsets(&topic, partition, expected).await }
            })
            .await?;
        if !replay.is_empty() {
            tracing::info!(%topic, partition, from = expected, already_stored = replay.len(), "replaying: skipping stored offsets");
        }
        self.partitions.insert(key.clone(), PartitionState::new(replay, expected));
        Ok(())
    }

    /// A broker round trip (off the async workers), retried with backoff
    /// while the broker is away or busy (restarting, a leader moving, the
    /// coordinator loading): logged at WARN, never the end of the run. A
    /// permanent refusal ends it (exit 2); so does a shutdown meanwhile.
    async fn broker_call<T: Send + 'static>(
        &self,
        what: &'static str,
        call: impl Fn(&Consumer) -> rdkafka::error::KafkaResult<T> + Send + Sync + 'static,
    ) -> Result<T, IngestError> {
        let call = Arc::new(call);
        let shutdown = self.writer.shutdown.clone();
        let permanent = |source: &rdkafka::error::KafkaError| source.rdkafka_error_code().filter(|c| source::is_permanent(*c));
        let result = (|| {
            let attempt = call.clone();
            async move {
                on_consumer(&self.consumer, what, move |consumer| attempt(consumer))
                    .await?
                    .map_err(|source| IngestError::Kafka { operation: what, source })
            }
        })
        .retry(retry::backoff(self.config.ingest.retry_initial_backoff, self.config.ingest.retry_max_backoff))
        .sleep(retry::ShutdownSleeper::new(shutdown.clone()))
        .when(|e| matches!(e, IngestError::Kafka { source, .. } if permanent(source).is_none()) && !*shutdown.borrow())
        .notify(|e, wait| {
            metrics::consume_error(&self.metrics);
            tracing::warn!(what, error = %e, backoff_ms = wait.as_millis() as u64, "kafka: waiting for the broker");
        })
        .await;
        result.map_err(|e| match &e {
            IngestError::Kafka { source, .. } => match permanent(source) {
                Some(code) => self.refused(code, source.to_string()),
                None => e,
            },
            _ => e,
        })
    }

    /// The broker delivered `got` past the expected offset of `key`:
    /// counts what retention deleted before ingest read it (below the log
    /// start) and what the broker never hands out (transaction markers,
    /// compacted records). Reading goes on from `got` either way.
    async fn gap(&mut self, key: &PartitionKey, got: i64) -> Result<(), IngestError> {
        let (topic, partition) = (key.0.to_string(), key.1);
        let t = topic.clone();
        let (log_start, _) =
            self.broker_call("log start lookup", move |consumer| consumer.fetch_watermarks(&t, partition, Duration::from_secs(10))).await?;
        let Some(state) = self.partitions.get(key) else { return Ok(()) };
        let expected = state.expected;
        let outcome = state.gap(got, log_start);
        if outcome.lost > 0 {
            tracing::error!(%topic, partition, expected, got, log_start, lost = outcome.lost, "offsets are gone from the broker (retention) before ingest read them");
            metrics::offsets_lost(&self.metrics, outcome.lost);
        }
        if outcome.skipped > 0 {
            tracing::debug!(%topic, partition, expected, got, skipped = outcome.skipped, "offsets the broker does not deliver (transaction markers, compaction)");
            metrics::offset_gap(&self.metrics, "skipped");
        }
        Ok(())
    }

    /// Hands the batch to the writer task, once the batch before it is
    /// durable and committed.
    async fn flush(&mut self) -> Result<(), IngestError> {
        self.apply_rebalances();
        if self.batch.is_empty() {
            return Ok(());
        }
        self.finish_in_flight().await?;
        if self.consumer.assignment_lost() {
            // librdkafka's group session timed out (the coordinator was
            // unreachable for session_timeout): the partitions may have a new
            // owner that already looked up what is stored. Writing this batch
            // now could store its rows twice; its messages are read again by
            // whoever owns the partitions next. The revocation that follows
            // drops the partitions' state.
            tracing::warn!(rows = self.batch.rows, "group session lost: the unwritten batch is dropped, its messages are read again");
            metrics::session_lost(&self.metrics);
            self.batch = self.batch.emptied();
            self.partitions.clear();
            return Ok(());
        }
        let next = Batch::sized_like(&self.batch, self.config.ingest.batch_max_bytes);
        let mut batch = std::mem::replace(&mut self.batch, next);
        // Ids of the batch in flight count as stored: a producer retry read
        // while it is written is dropped (if the write fails, the daemon
        // exits without committing and both are read again).
        self.recent.extend(std::mem::take(&mut batch.request_ids));
        let offsets = batch.offsets.clone();
        let (buffered, rejects) = (batch.rows, batch.rejects.len());
        let (writer, guard) = (self.writer.clone(), self.gate.enter());
        let task = tokio::spawn(async move {
            // The rows are freed here, off the pipeline's thread.
            let result = writer.write(batch).await;
            drop(guard);
            result
        });
        self.in_flight = Some(InFlight { offsets, buffered, rejects, task, started: Instant::now() });
        Ok(())
    }

    /// Rows and rejects read but not yet durable: the filling batch and the one being written.
    fn buffered_rows(&self) -> usize {
        self.batch.rows + self.in_flight.as_ref().map_or(0, |f| f.buffered)
    }

    /// Waits for the batch in flight, then commits its offsets.
    async fn finish_in_flight(&mut self) -> Result<(), IngestError> {
        if self.in_flight.is_none() {
            return Ok(());
        }
        let result = written(&mut self.in_flight).await;
        self.committed(result).await
    }

    /// The batch in flight was written (`result`): on success its offsets
    /// are committed.
    async fn committed(&mut self, result: Result<Result<(), IngestError>, tokio::task::JoinError>) -> Result<(), IngestError> {
        let Some(InFlight { offsets, buffered, rejects, started, .. }) = self.in_flight.take() else { return Ok(()) };
        let stored = buffered - rejects;
        result.map_err(|e| IngestError::Config(format!("writer task: {e}")))??;
        self.commit(&offsets).await?;
        self.summary.rows += stored as u64;
        self.summary.rejects += rejects as u64;
        metrics::batch_flushed(&self.metrics, stored, rejects, started.elapsed());
        metrics::inflight(&self.metrics, self.buffered_rows());
        Ok(())
    }

    /// Commits offset + 1 of every partition in the batch that this member
    /// still owns. A failed or skipped commit (say, around a rebalance) loses
    /// nothing: the rows are durable and a replay skips them.
    async fn commit(&self, offsets: &PartitionMap<i64>) -> Result<(), IngestError> {
        let mut tpl = TopicPartitionList::with_capacity(offsets.len());
        for ((topic, partition), offset) in offsets.iter().filter(|(key, _)| self.partitions.contains_key(*key)) {
            if let Err(e) = tpl.add_partition_offset(topic, *partition, Offset::Offset(offset + 1)) {
                tracing::warn!(%topic, partition, error = %e, "cannot build commit");
            }
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        // A broker round trip: off the async workers.
        if let Err(error) = on_consumer(&self.consumer, "commit", move |consumer| consumer.commit(&tpl, CommitMode::Sync)).await? {
            tracing::warn!(%error, "offset commit failed; durable rows will be skipped on replay");
        }
        Ok(())
    }

    /// Reports each assigned partition's consumer lag.
    async fn report_lag(&mut self) -> Result<(), IngestError> {
        let lags = on_consumer(&self.consumer, "lag check", |consumer| {
            let (Ok(assignment), Ok(positions)) = (consumer.assignment(), consumer.position()) else { return Vec::new() };
            let mut lags = Vec::with_capacity(assignment.count());
            for e in assignment.elements() {
                let (topic, partition) = (e.topic(), e.partition());
                let Ok((_, high)) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(1)) else { continue };
                let position = positions.find_partition(topic, partition).and_then(|p| p.offset().to_raw()).filter(|o| *o >= 0);
                lags.push((topic.to_owned(), partition, high - position.unwrap_or(high)));
            }
            lags
        })
        .await?;
        for (topic, partition, lag) in lags {
            metrics::consumer_lag(&self.metrics, &topic, partition, lag);
        }
        Ok(())
    }

    /// Whether every partition of the subscribed topics (of
    /// `kafka.partitions` with static assignment) is read to its end by
    /// the group. Called only with nothing buffered or in flight, so every
    /// offset this member handled is durable: a partition it holds whose
    /// commit is behind what it handled is committed first. `None`: the
    /// broker did not answer (a restart, the coordinator loading); not
    /// drained.
    async fn drain_state(&mut self) -> Result<Option<DrainState>, IngestError> {
        let (topics, only) = (self.config.kafka.topics.clone(), self.config.kafka.partitions.clone());
        let looked_up = on_consumer(&self.consumer, "drain check", move |consumer| partition_ends(consumer, &topics, &only)).await?;
        let mut ends = match looked_up {
            Ok(ends) => ends,
            Err(error) => {
                tracing::info!(%error, "cannot confirm the topics are drained yet; waiting for the broker");
                return Ok(None);
            }
        };
        let mut tpl = TopicPartitionList::new();
        for e in ends.iter_mut().filter(|e| e.assigned) {
            let key: PartitionKey = (self.topic(&e.topic).0, e.partition);
            let Some(state) = self.partitions.get(&key) else { continue };
            // Every offset handled is durable. The fetch position can be
            // past it when the broker skipped offsets it never delivers
            // (transaction markers), which nothing else would commit.
            let handled = state.expected.max(e.position.unwrap_or(i64::MIN));
            if e.committed.is_none_or(|c| c < handled) && tpl.add_partition_offset(&e.topic, e.partition, Offset::Offset(handled)).is_ok() {
                e.committed = Some(handled);
            }
        }
        if tpl.count() > 0 {
            if let Err(error) = on_consumer(&self.consumer, "commit", move |consumer| consumer.commit(&tpl, CommitMode::Sync)).await? {
                tracing::info!(%error, "offset commit at the drain check failed; checking again");
                return Ok(None);
            }
        }
        Ok(Some(offsets::drain_state(&ends)))
    }
}

/// The end of every partition of `topics` (only `only` when not empty): log
/// start, high watermark, the group's commit, and this member's position
/// where it holds the partition. Blocking (broker round trips).
fn partition_ends(consumer: &Consumer, topics: &[String], only: &[i32]) -> rdkafka::error::KafkaResult<Vec<PartitionEnd>> {
    let timeout = Duration::from_secs(10);
    let assignment = consumer.assignment()?;
    let positions = consumer.position()?;
    let mut ends = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        for t in metadata.topics() {
            if let Some(error) = t.error() {
                return Err(rdkafka::error::KafkaError::MetadataFetch(error.into()));
            }
            for p in t.partitions().iter().filter(|p| only.is_empty() || only.contains(&p.id())) {
                let (low, high) = consumer.fetch_watermarks(topic, p.id(), timeout)?;
                let assigned = assignment.find_partition(topic, p.id()).is_some();
                let position = positions.find_partition(topic, p.id()).and_then(|e| e.offset().to_raw()).filter(|o| *o >= 0);
                tpl.add_partition(topic, p.id());
                ends.push(PartitionEnd { topic: topic.clone(), partition: p.id(), low, high, committed: None, assigned, position });
            }
        }
    }
    let committed = consumer.committed_offsets(tpl, timeout)?;
    for e in &mut ends {
        e.committed = committed.find_partition(&e.topic, e.partition).and_then(|c| c.offset().to_raw()).filter(|o| *o >= 0);
    }
    Ok(ends)
}
