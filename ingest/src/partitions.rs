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
use crate::clickhouse_sink::{table_partition, ClickHouseSink};
use crate::error::IngestError;
use crate::metrics::{self, Metrics};
use crate::offsets::PartitionState;
use crate::writer::Writer;

/// The partitions this member owns, each with its state once started
/// (one map, so a message costs one lookup to learn both).
#[derive(Debug, Default)]
pub struct Partitions {
    owned: PartitionMap<Option<PartitionState>>,
}

/// What this member knows of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    NotOwned,
    NotStarted,
    Started,
}

impl Partitions {
    /// The group gave these partitions to this member. A partition number
    /// the tables cannot hold is refused (exit 2) rather than cast.
    pub fn assign(&mut self, list: &[PartitionKey]) -> Result<(), IngestError> {
        for (topic, partition) in list {
            table_partition(topic, *partition)?;
            self.owned.entry((topic.clone(), *partition)).or_insert(None);
        }
        Ok(())
    }

    /// The group took these partitions away: their state goes with them.
    pub fn revoke(&mut self, list: &[PartitionKey]) {
        for key in list {
            self.owned.remove(key);
        }
    }

    pub fn owns(&self, key: &PartitionKey) -> bool {
        self.owned.contains_key(key)
    }

    pub fn status(&self, key: &PartitionKey) -> Status {
        match self.owned.get(key) {
            None => Status::NotOwned,
            Some(None) => Status::NotStarted,
            Some(Some(_)) => Status::Started,
        }
    }

    pub fn state(&mut self, key: &PartitionKey) -> Option<&mut PartitionState> {
        self.owned.get_mut(key).and_then(Option::as_mut)
    }

    /// A started partition's state, if it is.
    pub fn started_state(&self, key: &PartitionKey) -> Option<&PartitionState> {
        self.owned.get(key).and_then(Option::as_ref)
    }

    /// A partition's state once started, kept only while it is owned.
    pub fn started(&mut self, key: &PartitionKey, state: PartitionState) {
        if let Some(slot) = self.owned.get_mut(key) {
            *slot = Some(state);
        }
    }

    /// The group session was lost: every partition is read again from its
    /// commit by whoever owns it next (the revocation that follows ends
    /// the ownership).
    pub fn forget_states(&mut self) {
        self.owned.values_mut().for_each(|s| *s = None);
    }
}

/// Where an owned partition resumes: its committed offset (the log start
/// when none, or when retention deleted past the commit: counted as lost),
/// and the offsets past it an earlier reader already handled, from the
/// replay log. Runs as its own task; the pipeline serves the consumer meanwhile.
pub async fn lookup_start(broker: Broker, writer: Writer, metrics: Metrics, key: PartitionKey) -> Result<PartitionState, IngestError> {
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
        metrics::offsets_lost(&metrics, lost);
    }
    let expected = committed.unwrap_or(low).max(low);
    let started = std::time::Instant::now();
    let replay = writer
        .retry("replay filter", |sink: ClickHouseSink, _| {
            let topic = topic.clone();
            async move { sink.stored_ranges(&topic, partition, expected).await }
        })
        .await?;
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
        metrics::offsets_lost(metrics, outcome.lost);
    }
    if outcome.skipped > 0 {
        tracing::debug!(%topic, partition, expected, got, skipped = outcome.skipped, "offsets the broker does not deliver (transaction markers, compaction)");
        metrics::offset_gap(metrics, "skipped");
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
        p.assign(&[key(0), key(1)]).expect("assign");
        assert!(p.owns(&key(0)) && p.owns(&key(1)) && !p.owns(&key(2)));
        assert_eq!(p.status(&key(1)), Status::NotStarted);
        p.started(&key(1), PartitionState::default());
        p.started(&key(2), PartitionState::default());
        assert_eq!(p.status(&key(1)), Status::Started);
        assert!(p.state(&key(1)).is_some());
        assert_eq!(p.status(&key(2)), Status::NotOwned, "a partition not owned is never started");
        p.forget_states();
        assert_eq!(p.status(&key(1)), Status::NotStarted, "still owned, started again on its next message");
        p.revoke(&[key(1)]);
        assert!(!p.owns(&key(1)) && p.state(&key(1)).is_none());
        assert!(p.assign(&[key(70_000)]).is_err(), "beyond UInt16");
        assert!(!p.owns(&key(70_000)));
    }
}
