//! Events of the write side: inserts failing, batches made durable, the
//! buffers they reuse.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::InternalEvent;
use crate::error::IngestError;
use crate::metrics::Metrics;

/// A write failed and is retried after `backoff`; `/healthz` answers 503
/// until a batch is durable again.
#[derive(Debug)]
pub struct InsertFailed<'a> {
    pub what: &'static str,
    pub error: &'a IngestError,
    pub attempt: u32,
    pub backoff: Duration,
}

impl InternalEvent for InsertFailed<'_> {
    fn emit(self, m: &Metrics) {
        m.insert_errors.inc();
        m.healthy.store(false, Ordering::Relaxed);
        tracing::warn!(what = self.what, error = %self.error, attempt = self.attempt, backoff_ms = self.backoff.as_millis() as u64, "write failed; retrying");
    }
}

/// A batch became durable and its offsets were committed.
#[derive(Debug)]
pub struct BatchFlushed {
    pub rows: usize,
    pub rejects: usize,
    pub elapsed: Duration,
}

impl InternalEvent for BatchFlushed {
    fn emit(self, m: &Metrics) {
        m.rows_inserted.inc_by(self.rows as u64);
        m.dlq_produced.inc_by(self.rejects as u64);
        m.batch_rows.observe((self.rows + self.rejects) as f64);
        m.flush_seconds.observe(self.elapsed.as_secs_f64());
        m.healthy.store(true, Ordering::Relaxed);
        tracing::debug!(rows = self.rows, rejects = self.rejects, elapsed_ms = self.elapsed.as_millis() as u64, "batch flushed and committed");
    }
}

/// Row buffers batches took back from the pool since the last count.
#[derive(Debug)]
pub struct BuffersReused {
    pub buffers: u64,
}

impl InternalEvent for BuffersReused {
    fn emit(self, m: &Metrics) {
        m.buffers_reused.inc_by(self.buffers);
    }
}

/// Rows and rejects buffered now, not yet durable.
#[derive(Debug)]
pub struct InFlightRows {
    pub rows: usize,
}

impl InternalEvent for InFlightRows {
    fn emit(self, m: &Metrics) {
        m.inflight_rows.set(self.rows as i64);
    }
}
