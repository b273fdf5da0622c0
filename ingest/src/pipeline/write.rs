//! The write stage. In: a batch the batch stage cut, handed over once the
//! one before it is durable and committed. Out: the batch written by the
//! [`Writer`] on a task of its own while the next one fills (a queue of
//! one), and once that task returned, the batch's [`Written`] record with
//! the result, for the commit stage.
//!
//! It owns the writer and the batch in flight. While one is in flight a
//! rebalance waits for it ([`FlushGate`]), and once it is durable the gate
//! learns its offsets, so a revocation can commit them itself.

use std::sync::Arc;

use tokio::task::{JoinError, JoinHandle};

use super::batcher::Written;
use crate::batch::Batch;
use crate::error::IngestError;
use crate::source::FlushGate;
use crate::writer::Writer;

/// The batch the writer task is making durable.
pub(super) struct InFlight {
    pub batch: Written,
    pub task: JoinHandle<Result<(), IngestError>>,
}

/// The write stage: the writer and at most one batch in flight.
pub(super) struct Write {
    writer: Writer,
    gate: Arc<FlushGate>,
    in_flight: Option<InFlight>,
}

impl Write {
    pub fn new(writer: Writer, gate: Arc<FlushGate>) -> Write {
        Write { writer, gate, in_flight: None }
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    pub fn is_busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Rows and rejects in flight, not yet durable.
    pub fn buffered(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |f| f.batch.buffered)
    }

    /// Starts writing `batch` on its own task. The supervisor hands over a
    /// batch only once the one before it was taken ([`Write::take`]).
    pub fn hand_over(&mut self, batch: Batch, written: Written) {
        debug_assert!(self.in_flight.is_none(), "one batch in flight at a time");
        let durable: Vec<(String, i32, i64)> = written.offsets.iter().map(|((t, p), (_, last))| (t.to_string(), *p, last + 1)).collect();
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
    }

    /// The batch in flight, to wait for and commit.
    pub fn take(&mut self) -> Option<InFlight> {
        self.in_flight.take()
    }

    /// Waits for the writer task of the batch in flight (forever if none).
    pub async fn written(&mut self) -> Result<Result<(), IngestError>, JoinError> {
        match &mut self.in_flight {
            Some(f) => (&mut f.task).await,
            None => std::future::pending().await,
        }
    }

    /// Abandons the batch in flight: nothing of it is committed, it is read
    /// again on restart (the replay log skips what of it landed).
    pub async fn abandon(&mut self) {
        if let Some(in_flight) = self.in_flight.take() {
            in_flight.task.abort();
            let _ = in_flight.task.await;
        }
    }

    /// At shutdown: a revocation now commits nothing more, and the last
    /// durable batch is marked done in the replay log (best effort).
    pub async fn close(&self) {
        self.gate.closing();
        self.writer.mark_done().await;
    }
}
