//! Partition lifecycle. In: the group's assignments and revocations, and
//! the first message of each owned partition. Out: which partitions this
//! member owns (the only ones it writes), and for each one it has started,
//! where reading resumes and which offsets an earlier reader handled.
//!
//! Ownership comes only from the rebalance events: a message of a
//! partition this member does not own (revoked while its chunk was read)
//! is dropped, never written, and a partition is started only if owned.

use std::time::Duration;

use rdkafka::TopicPartitionList;

use crate::batch::{PartitionKey, PartitionMap};
use crate::broker::Broker;
use crate::error::IngestError;
use crate::internal_events::{InternalEvent, OffsetsLost, OffsetsSkipped};
use crate::metrics::Metrics;
use crate::offsets::PartitionState;
use crate::sink::{table_partition, ClickHouseSink, RetryPolicy};

/// The partitions this member owns, each with the rebalance generation
/// of its assignment and its state once started (one map, so a message
/// costs one lookup to learn both).
#[derive(Debug, Default)]
pub struct Partitions {
    owned: PartitionMap<Owned>,
}

#[derive(Debug)]
struct Owned {
    /// The generation of the assignment: a message received before it
    /// belongs to an earlier ownership (librdkafka fetches a new
    /// assignment again from the commit) and is dropped.
    since: u64,
    slot: Slot,
}

/// An owned partition: not started yet, started, or lost with the group
/// session and waiting for the revocation that ends the ownership.
#[derive(Debug)]
enum Slot {
    NotStarted,
    Started(PartitionState),
    Lost,
}

/// What this member knows of a partition, for a message received under a
/// given rebalance generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not owned, or owned by an assignment later than the message.
    NotOwned,
    NotStarted,
    Started,
    /// The group session was lost: the partition's messages still queued
    /// here are dropped (its next owner reads them again from the commit)
    /// until the revocation librdkafka queued behind them arrives.
    Lost,
}

impl Partitions {
    /// The group gave these partitions to this member at rebalance
    /// `generation`. A partition number the tables cannot hold is refused
    /// (exit 2) rather than cast. A partition lost with the session and
    /// assigned again starts afresh.
    pub fn assign(&mut self, list: &[PartitionKey], generation: u64) -> Result<(), IngestError> {
        for (topic, partition) in list {
            table_partition(topic, *partition)?;
            let owned = self.owned.entry((topic.clone(), *partition)).or_insert(Owned { since: generation, slot: Slot::NotStarted });
            if matches!(owned.slot, Slot::Lost) {
                *owned = Owned { since: generation, slot: Slot::NotStarted };
            }
        }
        Ok(())
    }

    /// The group took these partitions away: their state goes with them.
    pub fn revoke(&mut self, list: &[PartitionKey]) {
        for key in list {
            self.owned.remove(key);
        }
    }

    /// Whether this member owns the partition and may commit its offsets
    /// (not when it was lost with the session).
    pub fn owns(&self, key: &PartitionKey) -> bool {
        self.owned.get(key).is_some_and(|o| !matches!(o.slot, Slot::Lost))
    }

    /// The partition as a message received under `received` sees it.
    pub fn status(&self, key: &PartitionKey, received: u64) -> Status {
        match self.owned.get(key) {
            Some(o) if o.since > received => Status::NotOwned,
            None => Status::NotOwned,
            Some(Owned { slot: Slot::NotStarted, .. }) => Status::NotStarted,
            Some(Owned { slot: Slot::Started(_), .. }) => Status::Started,
            Some(Owned { slot: Slot::Lost, .. }) => Status::Lost,
        }
    }

    /// The started state a message received under `received` goes to.
    pub fn state(&mut self, key: &PartitionKey, received: u64) -> Option<&mut PartitionState> {
        match self.owned.get_mut(key) {
            Some(Owned { since, slot: Slot::Started(state) }) if *since <= received => Some(state),
            _ => None,
        }
    }

    /// A started partition's state, if it is.
    pub fn started_state(&self, key: &PartitionKey) -> Option<&PartitionState> {
        match self.owned.get(key) {
            Some(Owned { slot: Slot::Started(state), .. }) => Some(state),
            _ => None,
        }
    }

    /// A partition's state once started, kept only while it is owned and
    /// not lost (the session may be lost while its start was looked up).
    pub fn started(&mut self, key: &PartitionKey, state: PartitionState) {
        if let Some(owned @ Owned { slot: Slot::NotStarted, .. }) = self.owned.get_mut(key) {
            owned.slot = Slot::Started(state);
        }
    }

    /// The group session was lost: every partition is read again from its
    /// commit by whoever owns it next. Until the revocation arrives, the
    /// messages still queued here are dropped: starting a partition on one
    /// of them would resume past the dropped batch, from a message beyond
    /// the commit, and lose the batch as a gap.
    pub fn lose_all(&mut self) {
        self.owned.values_mut().for_each(|o| o.slot = Slot::Lost);
    }
}

/// Where an owned partition resumes: its committed offset (the log start
/// when none, or when retention deleted past the commit: counted as lost),
/// and the offsets past it an earlier reader already handled, from the
/// replay log. Runs as its own task; the pipeline serves the consumer meanwhile.
pub async fn lookup_start(
    broker: Broker,
    sink: ClickHouseSink,
    policy: RetryPolicy,
    metrics: Metrics,
    key: PartitionKey,
) -> Result<PartitionState, IngestError> {
    crate::hooks::slow_start_after_session_lost().await;
    let (topic, partition) = (key.0.clone(), key.1);
    let t = topic.to_string();
    let (committed, low) = broker
        .call("committed offset lookup", move |consumer| {
            use rdkafka::consumer::Consumer as _;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&t, partition);
            let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
            let committed = committed.find_partition(&t, partition).and_then(|p| p.offset().to_raw()).filter(|o| *o >= 0);
            let (low, _high) = consumer.fetch_watermarks(&t, partition, Duration::from_secs(10))?;
            Ok((committed, low))
        })
        .await?;
    if let Some(committed) = committed.filter(|c| *c < low) {
        // The broker deleted (retention) what the group had not read yet.
        let lost = low - committed;
        tracing::error!(%topic, partition, committed, log_start = low, lost, "offsets are gone from the broker (retention); continuing from the log start");
        OffsetsLost { offsets: lost }.emit(&metrics);
    }
    let expected = committed.unwrap_or(low).max(low);
    let started = std::time::Instant::now();
    let whole_messages = broker.encoding(&topic) == inferlog_store::kafka::TopicEncoding::Json;
    let replay = policy.run("replay filter", |_| sink.stored_ranges(&topic, partition, expected, whole_messages)).await?;
    if !replay.is_empty() {
        tracing::info!(
            %topic, partition, from = expected, already_stored = replay.offsets(), ranges = replay.ranges().len(),
            lookup_ms = started.elapsed().as_millis() as u64,
            "replaying: skipping stored offsets"
        );
    }
    Ok(PartitionState::new(replay, expected))
}

/// The broker's log start of a partition, for a gap.
pub async fn log_start(broker: Broker, key: PartitionKey) -> Result<i64, IngestError> {
    let (topic, partition) = (key.0.to_string(), key.1);
    let (low, _) = broker
        .call("log start lookup", move |consumer| {
            use rdkafka::consumer::Consumer as _;
            consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10))
        })
        .await?;
    Ok(low)
}

/// The broker delivered `got` past the expected offset of `key`: counts
/// what retention deleted before ingest read it (below the log start) and
/// what the broker never hands out (transaction markers, compacted
/// records). Reading goes on from `got` either way.
pub fn account_gap(metrics: &Metrics, key: &PartitionKey, state: &PartitionState, got: i64, log_start: i64) {
    let (topic, partition, expected) = (&key.0, key.1, state.expected);
    let outcome = state.gap(got, log_start);
    if outcome.lost > 0 {
        tracing::error!(%topic, partition, expected, got, log_start, lost = outcome.lost, "offsets are gone from the broker (retention) before ingest read them");
        OffsetsLost { offsets: outcome.lost }.emit(metrics);
    }
    if outcome.skipped > 0 {
        tracing::debug!(%topic, partition, expected, got, skipped = outcome.skipped, "offsets the broker does not deliver (transaction markers, compaction)");
        OffsetsSkipped.emit(metrics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(p: i32) -> PartitionKey {
        (Arc::from("events"), p)
    }

    /// Only owned partitions keep a state; a revocation ends both, and a
    /// partition the tables cannot hold is refused at its assignment.
    #[test]
    fn ownership_comes_from_assignments_and_revocations() {
        let mut p = Partitions::default();
        p.assign(&[key(0), key(1)], 1).expect("assign");
        assert!(p.owns(&key(0)) && p.owns(&key(1)) && !p.owns(&key(2)));
        assert_eq!(p.status(&key(1), 1), Status::NotStarted);
        p.started(&key(1), PartitionState::default());
        p.started(&key(2), PartitionState::default());
        assert_eq!(p.status(&key(1), 1), Status::Started);
        assert!(p.state(&key(1), 1).is_some());
        assert_eq!(p.status(&key(2), 1), Status::NotOwned, "a partition not owned is never started");
        p.revoke(&[key(1)]);
        assert!(!p.owns(&key(1)) && p.state(&key(1), 1).is_none());
        assert!(p.assign(&[key(70_000)], 2).is_err(), "beyond UInt16");
        assert!(!p.owns(&key(70_000)));
    }

    /// A message received before its partition's current assignment
    /// (revoked and assigned again meanwhile) belongs to the earlier
    /// ownership: the new one reads from the commit, so the message must
    /// neither start the partition past it nor go to its state.
    #[test]
    fn a_message_from_before_the_assignment_is_not_the_new_owners() {
        let mut p = Partitions::default();
        p.assign(&[key(0)], 1).expect("assign");
        p.started(&key(0), PartitionState::new(Default::default(), 0));
        p.revoke(&[key(0)]);
        p.assign(&[key(0)], 3).expect("assign again");
        assert_eq!(p.status(&key(0), 2), Status::NotOwned, "received under generation 2");
        assert_eq!(p.status(&key(0), 3), Status::NotStarted);
        p.started(&key(0), PartitionState::new(Default::default(), 500));
        assert!(p.state(&key(0), 2).is_none() && p.state(&key(0), 3).is_some());
        p.assign(&[key(0), key(1)], 5).expect("an incremental assignment");
        assert!(p.state(&key(0), 3).is_some(), "an assignment of others leaves this one as it was");
    }

    /// A lost session: no partition starts again on a message queued
    /// before the revocation (it would resume past the dropped batch), none
    /// is committed, and a new assignment starts each from its commit.
    #[test]
    fn a_partition_lost_with_the_session_waits_for_its_revocation() {
        let mut p = Partitions::default();
        p.assign(&[key(0), key(1)], 1).expect("assign");
        p.started(&key(0), PartitionState::new(Default::default(), 1000));
        p.lose_all();
        assert_eq!((p.status(&key(0), 1), p.status(&key(1), 1)), (Status::Lost, Status::Lost));
        assert!(p.state(&key(0), 1).is_none() && p.started_state(&key(0)).is_none(), "its state is gone");
        assert!(!p.owns(&key(0)) && !p.owns(&key(1)), "not ours to commit");
        p.started(&key(1), PartitionState::new(Default::default(), 2000));
        assert_eq!(p.status(&key(1), 1), Status::Lost, "a start looked up before the loss does not revive it");
        p.revoke(&[key(0)]);
        assert_eq!(p.status(&key(0), 1), Status::NotOwned);
        p.assign(&[key(0), key(1)], 4).expect("assign again");
        assert_eq!((p.status(&key(0), 4), p.status(&key(1), 4)), (Status::NotStarted, Status::NotStarted), "read again from the commit");
        assert_eq!(p.status(&key(1), 1), Status::NotOwned, "what was queued before stays dropped");
    }
}
