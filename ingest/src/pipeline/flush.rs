//! Flush and commit. In: the batch the pipeline filled. Out: the batch
//! handed to the writer task once the one before it is durable, its
//! offsets committed once it is, and at shutdown the last batch written,
//! committed and the group left within the deadline.

use super::*;

impl Pipeline {
    /// Hands the batch to the writer task, once the batch before it is
    /// durable and committed.
    pub(super) async fn flush(&mut self) -> Result<(), IngestError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.finish_in_flight().await?;
        // Revocations that arrived while the batch filled (a wait served
        // the consumer) take their partitions' rows out first: the
        // revocation callback has returned, so their next owner may
        // already have looked up what is stored.
        self.apply_rebalances()?;
        if self.batch.is_empty() {
            return Ok(());
        }
        if self.after_full && self.summary.rows > 0 {
            crate::hooks::hold_until_session_lost(&self.consumer).await;
        }
        if self.consumer.assignment_lost() {
            // The group session timed out: another member may own the
            // partitions and have looked up what is stored. This batch's
            // messages are read again by whoever owns them next, and so
            // are those still queued here before the revocation.
            tracing::warn!(rows = self.batch.rows, "group session lost: the unwritten batch is dropped, its messages are read again");
            metrics::session_lost(&self.metrics);
            self.batch = self.batch.emptied();
            self.partitions.lose_all();
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
        let tallies = std::mem::take(&mut batch.tallies);
        let written = Written { offsets, buffered, rejects, tallies, started: Instant::now() };
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

    pub(super) fn buffered_rows(&self) -> usize {
        self.batch.rows + self.in_flight.as_ref().map_or(0, |f| f.batch.buffered)
    }

    /// Waits for the batch in flight (serving the consumer), then commits it.
    pub(super) async fn finish_in_flight(&mut self) -> Result<(), IngestError> {
        let Some(InFlight { batch, task }) = self.in_flight.take() else { return Ok(()) };
        let result = self.serve_while(task, "writer").await.and_then(|r| r);
        self.committed(batch, result).await
    }

    /// A batch was written (`result`): on success the offsets of the
    /// partitions still owned are committed.
    pub(super) async fn committed(&mut self, batch: Written, result: Result<(), IngestError>) -> Result<(), IngestError> {
        result?;
        let Written { offsets, buffered, rejects, tallies, started } = batch;
        // Durable: its events count in the service metrics (before the
        // rows-inserted counter, so a scrape that sees one sees the other).
        if let Some(service) = &self.service {
            service.add(tallies.values());
        }
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
    pub(super) async fn commit(&mut self, offsets: &PartitionMap<(i64, i64)>) -> Result<(), IngestError> {
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
    pub(super) async fn close(self, deadline: Instant) {
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
