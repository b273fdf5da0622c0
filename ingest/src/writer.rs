//! The writer stage. In: one full batch, handed over by the pipeline. Out:
//! its rows in ClickHouse (one INSERT per UTC day), then its rejects in the
//! DLQ and in the rejects log; the pipeline commits the batch's offsets
//! only after this returned Ok.
//!
//! It runs as its own task while the pipeline reads and normalizes the
//! next batch, one batch in flight at a time (a queue of one: the pipeline
//! waits for it before handing over another), so memory holds at most two
//! batches plus librdkafka's bounded prefetch. While a batch is in flight a
//! rebalance waits for it ([`crate::source::FlushGate`]), so a partition
//! changes owner only when what was read from it is durable.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inferlog_schema::ErrorClass;
use tokio::sync::watch;

use crate::batch::Batch;
use crate::clickhouse_sink::{ClickHouseSink, RejectRow};
use crate::config::IngestConfig;
use crate::dlq::{Dlq, Reject};
use crate::error::IngestError;
use crate::metrics::{self, Metrics};

/// Everything a batch write needs; cheap to clone into the writer task.
#[derive(Debug, Clone)]
pub struct Writer {
    pub sink: ClickHouseSink,
    pub dlq: Arc<Dlq>,
    pub config: IngestConfig,
    pub metrics: Metrics,
    pub shutdown: watch::Receiver<bool>,
    /// Set at SIGTERM: retries stop at this instant.
    deadline: Arc<Mutex<Option<Instant>>>,
}

impl Writer {
    pub fn new(sink: ClickHouseSink, dlq: Dlq, config: IngestConfig, metrics: Metrics, shutdown: watch::Receiver<bool>) -> Writer {
        Writer { sink, dlq: Arc::new(dlq), config, metrics, shutdown, deadline: Arc::new(Mutex::new(None)) }
    }

    /// Starts the shutdown budget (`shutdown_timeout`) if it has not started.
    pub fn start_deadline(&self) -> Option<Instant> {
        let mut deadline = self.deadline.lock().ok()?;
        Some(*deadline.get_or_insert_with(|| Instant::now() + self.config.shutdown_timeout))
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline.lock().ok().and_then(|d| *d)
    }

    /// Sleeps one backoff step, or returns an error once a SIGTERM's
    /// shutdown budget is spent (the daemon then exits without committing,
    /// and the uncommitted messages are re-read on restart).
    async fn backoff(&self, error: &IngestError, attempt: u32, backoff: Duration) -> Result<(), IngestError> {
        metrics::insert_failed(&self.metrics, error, attempt, backoff);
        let deadline = if *self.shutdown.borrow() { self.start_deadline() } else { self.deadline() };
        if let Some(deadline) = deadline {
            if Instant::now() + backoff > deadline {
                return Err(IngestError::ShutdownTimeout(self.config.shutdown_timeout));
            }
        }
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            // A SIGTERM cuts the wait short so the deadline starts now.
            _ = shutdown.changed(), if deadline.is_none() => {}
        }
        Ok(())
    }

    /// Retries `op` with exponential backoff while its errors are transient.
    pub async fn retry<T, F, Fut>(&self, what: &'static str, mut op: F) -> Result<T, IngestError>
    where
        F: FnMut(ClickHouseSink, bool) -> Fut,
        Fut: std::future::Future<Output = Result<T, IngestError>>,
    {
        let mut backoff = self.config.retry_initial_backoff;
        let mut attempt = 0;
        loop {
            match op(self.sink.clone(), attempt > 0).await {
                Ok(v) => return Ok(v),
                Err(e) if e.class() == ErrorClass::Retry => {
                    attempt += 1;
                    tracing::debug!(what, attempt, "retrying");
                    self.backoff(&e, attempt, backoff).await?;
                    backoff = (backoff * 2).min(self.config.retry_max_backoff);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Makes the batch durable: rows per day, then rejects to the DLQ (a
    /// produce failure is retried and blocks the commit, never drops a
    /// reject), then their log.
    pub async fn write(&self, batch: Arc<Batch>) -> Result<(), IngestError> {
        for &day in batch.days.keys() {
            let b = batch.clone();
            self.retry("insert rows", move |sink, retry| {
                let b = b.clone();
                async move { sink.insert_rows(&b.days[&day], retry).await }
            })
            .await?;
        }
        if batch.rejects.is_empty() {
            return Ok(());
        }
        let mut pending: Vec<&Reject> = batch.rejects.iter().collect();
        let mut backoff = self.config.retry_initial_backoff;
        let mut attempt = 0;
        while !pending.is_empty() {
            match self.dlq.send_all(&pending).await {
                Ok(()) => pending.clear(),
                Err((failed, error)) => {
                    attempt += 1;
                    pending = failed;
                    self.backoff(&error, attempt, backoff).await?;
                    backoff = (backoff * 2).min(self.config.retry_max_backoff);
                }
            }
        }
        let log: Vec<RejectRow> = batch
            .rejects
            .iter()
            .map(|r| RejectRow {
                day: r.received_ms.div_euclid(inferlog_schema::timestamp::MS_PER_DAY) as u16,
                received_at: (r.received_ms / 1000) as u32,
                reason: r.rejection.reason.as_str(),
                field: r.rejection.field.clone(),
                message: r.rejection.message.clone(),
                kafka_topic: r.topic.to_string(),
                kafka_partition: r.partition as u16,
                kafka_offset: r.offset as u64,
                bytes: r.payload.len() as u32,
            })
            .collect();
        let log = Arc::new(log);
        self.retry("log rejects", move |sink, retry| {
            let log = log.clone();
            async move { sink.insert_rejects(&log, retry).await }
        })
        .await
    }
}
