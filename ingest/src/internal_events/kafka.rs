//! Events of the Kafka side: consuming, rebalancing, committing, waiting.

use super::InternalEvent;
use crate::metrics::Metrics;

/// An offset commit failed or timed out; nothing is lost.
#[derive(Debug)]
pub struct CommitFailed<'a> {
    pub error: &'a str,
}

impl InternalEvent for CommitFailed<'_> {
    fn emit(self, m: &Metrics) {
        m.commit_failures.inc();
        tracing::warn!(error = self.error, "offset commit failed; the rows are durable and the partition's next reader skips them by the replay log");
    }
}

/// A transient consume error, waited out (the caller logs it with its context).
#[derive(Debug)]
pub struct ConsumeError;

impl InternalEvent for ConsumeError {
    fn emit(self, m: &Metrics) {
        m.consume_errors.inc();
    }
}

/// A message of a partition this member does not own was dropped for its owner.
#[derive(Debug)]
pub struct UnownedMessage<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

impl InternalEvent for UnownedMessage<'_> {
    fn emit(self, m: &Metrics) {
        m.unowned.inc();
        tracing::debug!(
            topic = self.topic,
            partition = self.partition,
            offset = self.offset,
            "message of a partition this member does not own: dropped for its owner"
        );
    }
}

/// A wait began with every partition paused.
#[derive(Debug)]
pub struct Paused {
    pub what: &'static str,
}

impl InternalEvent for Paused {
    fn emit(self, m: &Metrics) {
        m.pauses.inc();
        tracing::info!(what = self.what, "waiting with the partitions paused (the group keeps this member)");
    }
}

/// The group session timed out before a batch was written; it is dropped.
#[derive(Debug)]
pub struct SessionLost {
    pub rows: usize,
}

impl InternalEvent for SessionLost {
    fn emit(self, m: &Metrics) {
        m.session_lost.inc();
        tracing::warn!(rows = self.rows, "group session lost: the unwritten batch is dropped, its messages are read again");
    }
}

/// The source has nothing more for now and the batch is big enough to insert.
#[derive(Debug)]
pub struct CaughtUpFlush {
    pub rows: usize,
}

impl InternalEvent for CaughtUpFlush {
    fn emit(self, m: &Metrics) {
        m.caught_up_flushes.inc();
        tracing::debug!(rows = self.rows, "source read to its end: flushing without waiting for batch_max_age");
    }
}

/// The group assigned (`revoked: false`) or revoked partitions.
#[derive(Debug)]
pub struct Rebalanced<'a> {
    pub revoked: bool,
    pub partitions: &'a [(String, i32)],
}

impl InternalEvent for Rebalanced<'_> {
    fn emit(self, m: &Metrics) {
        let kind = if self.revoked { "revoke" } else { "assign" };
        m.rebalances.with_label_values(&[kind]).inc();
        if self.revoked {
            for (topic, partition) in self.partitions {
                let _ = m.consumer_lag.remove_label_values(&[topic, &partition.to_string()]);
            }
        }
        tracing::info!(kind, partitions = ?self.partitions, "rebalance");
    }
}

/// Offsets below the broker's log start that ingest never read: one gap
/// with outcome "lost", and the number of offsets in it.
#[derive(Debug)]
pub struct OffsetsLost {
    pub offsets: i64,
}

impl InternalEvent for OffsetsLost {
    fn emit(self, m: &Metrics) {
        m.offset_gaps.with_label_values(&["lost"]).inc();
        m.offsets_lost.inc_by(self.offsets.max(0) as u64);
    }
}

/// A gap in a partition's offsets with nothing to read (transaction
/// markers, compacted records).
#[derive(Debug)]
pub struct OffsetsSkipped;

impl InternalEvent for OffsetsSkipped {
    fn emit(self, m: &Metrics) {
        m.offset_gaps.with_label_values(&["skipped"]).inc();
    }
}

/// A partition's lag behind its high watermark, as the broker reports it.
#[derive(Debug)]
pub struct ConsumerLag<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub lag: i64,
}

impl InternalEvent for ConsumerLag<'_> {
    fn emit(self, m: &Metrics) {
        m.consumer_lag.with_label_values(&[self.topic, &self.partition.to_string()]).set(self.lag.max(0));
    }
}
