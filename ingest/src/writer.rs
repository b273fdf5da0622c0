//! The writer stage. In: one full batch, handed over by the pipeline. Out:
//! its rows in ClickHouse (one INSERT per UTC day), then its rejects in the
//! DLQ and in the rejects log; the pipeline commits the batch's offsets
//! only after this returned Ok. Refused spans of OTLP messages reach the
//! DLQ before the rows: their message may also have stored rows, and the
//! replay filter takes a message with stored rows as handled.
//!
//! It runs as its own task while the pipeline reads and normalizes the
//! next batch, one batch in flight at a time (a queue of one: the pipeline
//! waits for it before handing over another), so memory holds at most two
//! batches plus librdkafka's bounded prefetch. While a batch is in flight a
//! rebalance waits for it ([`crate::source::FlushGate`]), so a partition
//! changes owner only when what was read from it is durable.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::{stream, StreamExt as _, TryStreamExt as _};
use inferlog_store::model::rows::RejectRow;
use tokio::sync::watch;

use crate::batch::{Batch, BufferPool};
use crate::config::IngestConfig;
use crate::dlq::{now_ms, Dlq, Reject};
use crate::error::IngestError;
use crate::internal_events::{BuffersReused, InternalEvent};
use crate::late_days::LateDays;
use crate::metrics::Metrics;
use crate::sink::{reject_day, table_partition, ClickHouseSink, Coverage, EncodedRows, RetryPolicy, ShutdownBudget};
use crate::sort::Order;
use crate::source::FlushGate;

/// Days of one batch inserted at once. Each day is its own INSERT (its
/// own part, its own retry), and ClickHouse runs an INSERT on one thread:
/// two at a time keep a second core busy while one day's part is sorted
/// and written, above all for the last batch of a backlog, which nothing
/// else overlaps.
const DAYS_AT_ONCE: usize = 2;

/// Everything a batch write needs; cheap to clone into the writer task.
#[derive(Debug, Clone)]
pub struct Writer {
    pub sink: ClickHouseSink,
    pub dlq: Arc<Dlq>,
    pub config: IngestConfig,
    pub metrics: Metrics,
    /// The sink's retry policy, with the shutdown budget and the rebalance
    /// fence every attempt checks first ([`FlushGate::fenced`]).
    policy: RetryPolicy,
    budget: ShutdownBudget,
    /// The coverage of the last batch made durable, marked done in the
    /// replay log with the next batch's intents.
    done: Arc<Mutex<Vec<Coverage>>>,
    /// The day locks of inserts a release may meet ([`LateDays`]).
    late: Arc<LateDays>,
}

impl Writer {
    /// A writer that starts no attempt once `gate` says a revocation has
    /// waited on its batch past the fence.
    pub fn new(
        sink: ClickHouseSink,
        dlq: Dlq,
        config: IngestConfig,
        metrics: Metrics,
        shutdown: watch::Receiver<bool>,
        gate: Arc<FlushGate>,
        late: LateDays,
    ) -> Writer {
        let budget = ShutdownBudget::new(config.shutdown_timeout, shutdown);
        let retry = RetryPolicy::daemon((config.retry_initial_backoff, config.retry_max_backoff), budget.clone(), gate, metrics.clone());
        Writer { sink, dlq: Arc::new(dlq), config, metrics, policy: retry, budget, done: Arc::default(), late: Arc::new(late) }
    }

    /// Starts the shutdown budget (`shutdown_timeout`) if it has not started.
    pub fn start_deadline(&self) -> Option<Instant> {
        self.budget.start()
    }

    /// Marks the last durable batch done in the replay log (at shutdown;
    /// best effort: without it the next reader checks that batch row by row).
    pub async fn mark_done(&self) {
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()));
        if done.is_empty() {
            return;
        }
        if let Err(error) = self.sink.log_coverage(&[], &done, now_ms()).await {
            tracing::info!(%error, "could not mark the last batch done in the replay log; its next reader checks it row by row");
        }
    }

    /// The shutdown budget this writer's retries keep to.
    pub fn budget(&self) -> &ShutdownBudget {
        &self.budget
    }

    /// The sink's retry policy this writer's calls go through.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// A ClickHouse call under the sink's retry policy; `op` learns
    /// whether this is a retry (an insert then deduplicates against what
    /// may have landed).
    pub async fn retry<T, F, Fut>(&self, what: &'static str, mut op: F) -> Result<T, IngestError>
    where
        F: FnMut(ClickHouseSink, bool) -> Fut,
        Fut: std::future::Future<Output = Result<T, IngestError>>,
    {
        self.policy.run(what, |retry| op(self.sink.clone(), retry)).await
    }

    /// Inserts one day's rows (retried; a retry first checks whether the
    /// attempt before landed), then hands their buffers to `pool`. A day a
    /// release may meet is inserted under its shared lock, taken by the
    /// first attempt that needs it and held to the last ([`LateDays`]):
    /// the check of a retry never misses rows an earlier attempt landed
    /// because a release dropped them in between.
    async fn insert_day(&self, mut rows: EncodedRows, pool: &BufferPool) -> Result<(), IngestError> {
        // The table's order (crate::sort), computed off the async workers:
        // tens of milliseconds for a 200,000-row batch. Without it the
        // chunks go as they are.
        let (chunks, ends) = (rows.chunks.clone(), std::mem::take(&mut rows.ends));
        rows.order = tokio::task::spawn_blocking(move || Order::of(&chunks, &ends).map(Arc::new)).await.ok().flatten();
        let rows = Arc::new(rows);
        let id = self.sink.insert_id();
        let day = i32::from(rows.first.day);
        let held = tokio::sync::Mutex::new(None);
        // Each attempt holds its own reference, dropped with it: once the
        // last ends, `rows` is the only one and its buffers go back.
        let inserted = self
            .retry("insert rows", |sink, retry| {
                let (rows, id, held) = (rows.clone(), &id, &held);
                async move {
                    let mut held = held.lock().await;
                    if held.is_none() {
                        *held = self.late.hold(day, now_ms()).await?;
                    }
                    sink.insert_rows(&rows, id, retry).await
                }
            })
            .await;
        if let Some(lock) = held.into_inner() {
            lock.unlock().await;
        }
        inserted?;
        // Written: its buffers serve the batches that follow. One batch
        // fills meanwhile, so the pool keeps at most another batch's worth.
        if let Ok(rows) = Arc::try_unwrap(rows) {
            pool.put(rows, self.config.batch_max_bytes);
        }
        Ok(())
    }

    /// Makes the batch durable: its coverage in the replay log (with the
    /// done marks of the batch before), rows per day ([`DAYS_AT_ONCE`] at a
    /// time), then rejects to the DLQ (a transient produce failure is
    /// retried and blocks the commit, never drops a reject), then their
    /// log, one INSERT per day. The first error that is not retried ends
    /// the write and abandons a day still in flight, as a crash would:
    /// nothing is committed, and the replay log's intent makes the next
    /// reader skip whatever of it landed.
    pub async fn write(&self, mut batch: Batch) -> Result<(), IngestError> {
        crate::hooks::slow_write().await;
        let coverage = batch.coverage();
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()));
        let (intents, marks) = (&coverage, &done);
        self.retry("log the batch in the replay log", move |sink, _| async move { sink.log_coverage(intents, marks, now_ms()).await }).await?;
        let span_rejects: Vec<&Reject> = batch.rejects.iter().filter(|r| r.span.is_some()).collect();
        self.send_to_dlq(span_rejects).await?;
        let pool = batch.pool();
        BuffersReused { buffers: pool.take_reused() }.emit(&self.metrics);
        stream::iter(batch.take_days(|topic, partition| self.sink.shard_of(topic, partition))?)
            .map(|(_day, rows)| self.insert_day(rows, &pool))
            .buffer_unordered(DAYS_AT_ONCE)
            .try_for_each(|()| std::future::ready(Ok(())))
            .await?;
        crate::hooks::panic_point("writer");
        self.send_to_dlq(batch.rejects.iter().filter(|r| r.span.is_none()).collect()).await?;
        if !batch.rejects.is_empty() {
            self.log_rejects(&batch.rejects).await?;
        }
        // Durable: the next batch's replay-log insert marks this one done.
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = coverage;
        Ok(())
    }

    /// Rejects to the DLQ.
    async fn send_to_dlq(&self, rejects: Vec<&Reject>) -> Result<(), IngestError> {
        if rejects.is_empty() {
            return Ok(());
        }
        // A failed send leaves the rejects it could not deliver pending.
        let pending: Mutex<Vec<&Reject>> = Mutex::new(rejects);
        self.policy
            .run("send rejects to the DLQ", |_| async {
                let to_send = std::mem::take(&mut *pending.lock().unwrap_or_else(|p| p.into_inner()));
                self.dlq.send_all(&to_send).await.map_err(|(failed, error)| {
                    *pending.lock().unwrap_or_else(|p| p.into_inner()) = failed;
                    error
                })
            })
            .await
    }

    /// Rejects to their log, one INSERT per day received (and shard).
    async fn log_rejects(&self, rejects: &[Reject]) -> Result<(), IngestError> {
        let mut days: BTreeMap<(usize, u16), Vec<RejectRow>> = BTreeMap::new();
        for r in rejects {
            let row = RejectRow {
                day: reject_day(r.received_ms),
                received_at: (r.received_ms / 1000) as u32,
                reason: r.rejection.reason.as_str(),
                field: r.rejection.field.clone(),
                message: r.rejection.message.clone(),
                kafka_topic: r.topic.to_string(),
                kafka_partition: table_partition(&r.topic, r.partition)?,
                kafka_offset: r.offset as u64,
                // The size received, not what the DLQ keeps of it.
                bytes: r.original.as_ref().map_or(r.payload.len(), |o| o.bytes) as u32,
            };
            days.entry((self.sink.shard_of(&r.topic, r.partition)?, row.day)).or_default().push(row);
        }
        for ((shard, _), rows) in days {
            let rows = Arc::new(rows);
            let id = self.sink.insert_id();
            self.retry("log rejects", |sink, retry| {
                let (rows, id) = (rows.clone(), &id);
                async move { sink.insert_rejects(shard, &rows, id, retry).await }
            })
            .await?;
        }
        Ok(())
    }
}
