//! Offset bookkeeping. In: the offsets a partition delivers, the group's
//! committed offsets and the broker's watermarks. Out: what to do with each
//! message (handle it, drop a re-delivery, account for a gap) and whether
//! the subscribed partitions are read to their end.
//!
//! Apache Kafka delivers every offset it holds, in order, from any position.
//! An offset past the expected one is therefore a gap the broker made on
//! purpose: transaction markers, compaction, or retention deleting what
//! nobody had read yet. Only the last loses data; it is counted, never
//! hidden.

use std::collections::HashSet;

/// Per-partition state of the current assignment.
#[derive(Debug, Default)]
pub struct PartitionState {
    /// Offsets at or past the committed one that are already stored.
    pub replay: HashSet<i64>,
    /// The next offset this partition must deliver: the committed offset at
    /// first, then the last handled offset + 1.
    pub expected: i64,
}

/// What a delivered offset means for its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The expected offset: handle it.
    Next,
    /// Before the expected one (re-delivered after a seek or a reset): drop it.
    Again,
    /// Past the expected one: the broker holds nothing in between for this
    /// consumer (markers, compaction) or deleted it (retention). Look up
    /// the log start, call [`PartitionState::gap`], then handle it.
    Gap,
}

/// A gap, accounted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapOutcome {
    /// Offsets below the broker's log start that were never read.
    pub lost: i64,
    /// Offsets the broker never hands to a consumer (markers, compacted).
    pub skipped: i64,
}

impl PartitionState {
    pub fn new(replay: HashSet<i64>, expected: i64) -> PartitionState {
        PartitionState { replay, expected }
    }

    pub fn classify(&self, offset: i64) -> Delivery {
        match offset.cmp(&self.expected) {
            std::cmp::Ordering::Equal => Delivery::Next,
            std::cmp::Ordering::Less => Delivery::Again,
            std::cmp::Ordering::Greater => Delivery::Gap,
        }
    }

    /// `got` arrived past `expected` while the log starts at `log_start`:
    /// what below the log start was never read is lost, the rest was never
    /// there for a consumer.
    pub fn gap(&self, got: i64, log_start: i64) -> GapOutcome {
        let lost = (log_start.min(got) - self.expected).max(0);
        GapOutcome { lost, skipped: got - self.expected - lost }
    }

    /// Whether `offset` was stored before this member read it (a replay
    /// after a crash or a rebalance), forgetting it. Asked for every
    /// message: the set is empty but for the first batch after a takeover,
    /// and an empty one costs no hash.
    pub fn already_stored(&mut self, offset: i64) -> bool {
        !self.replay.is_empty() && self.replay.remove(&offset)
    }

    /// The offset was handled (stored, rejected or skipped as a replay).
    pub fn advanced_to(&mut self, offset: i64) {
        self.expected = offset + 1;
    }
}

/// One partition of the subscribed topics at a drain check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionEnd {
    pub topic: String,
    pub partition: i32,
    /// The broker's log start.
    pub low: i64,
    /// The high watermark: the offset the next message will get.
    pub high: i64,
    /// The group's committed offset, if any.
    pub committed: Option<i64>,
    /// Whether this member holds the partition.
    pub assigned: bool,
    /// This member's fetch position in it (next offset it hands out), once known.
    pub position: Option<i64>,
}

impl PartitionEnd {
    /// Read to its end by the group: what the group committed (or the log
    /// start, when retention deleted past it) reaches the high watermark.
    pub fn drained(&self) -> bool {
        self.committed.unwrap_or(i64::MIN).max(self.low) >= self.high
    }
}

/// Whether every partition of the subscribed topics is read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainState {
    Drained,
    /// Some are behind: `held` by this member, `others` by other members
    /// of the group (or by nobody yet).
    Behind {
        held: Vec<(String, i32, i64)>,
        others: Vec<(String, i32, i64)>,
    },
}

/// The drain state of `ends` (an empty list is not drained: nothing was seen).
pub fn drain_state(ends: &[PartitionEnd]) -> DrainState {
    let (mut held, mut others) = (Vec::new(), Vec::new());
    for e in ends.iter().filter(|e| !e.drained()) {
        let behind = e.high - e.committed.unwrap_or(i64::MIN).max(e.low);
        let entry = (e.topic.clone(), e.partition, behind);
        if e.assigned {
            held.push(entry)
        } else {
            others.push(entry)
        }
    }
    if held.is_empty() && others.is_empty() && !ends.is_empty() {
        DrainState::Drained
    } else {
        DrainState::Behind { held, others }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored offset is skipped once; anything else, and any offset of
    /// a partition with nothing stored, is not.
    #[test]
    fn a_stored_offset_is_a_replay_once() {
        let mut s = PartitionState::new(HashSet::from([11, 12]), 10);
        assert!(!s.already_stored(10));
        assert!(s.already_stored(11));
        assert!(!s.already_stored(11));
        assert!(s.already_stored(12));
        assert!(!PartitionState::new(HashSet::new(), 10).already_stored(10));
    }

    #[test]
    fn offsets_are_next_again_or_a_gap() {
        let mut s = PartitionState::new(HashSet::new(), 10);
        assert_eq!(s.classify(10), Delivery::Next);
        assert_eq!(s.classify(9), Delivery::Again);
        assert_eq!(s.classify(12), Delivery::Gap);
        s.advanced_to(12);
        assert_eq!(s.classify(13), Delivery::Next);
    }

    #[test]
    fn only_offsets_below_the_log_start_count_as_lost() {
        let s = PartitionState::new(HashSet::new(), 500);
        assert_eq!(s.gap(800, 700), GapOutcome { lost: 200, skipped: 100 }, "retention deleted 500..700; 700..800 were markers");
        assert_eq!(s.gap(502, 0), GapOutcome { lost: 0, skipped: 2 }, "a transaction marker");
        assert_eq!(s.gap(900, 900), GapOutcome { lost: 400, skipped: 0 });
    }

    fn end(partition: i32, low: i64, high: i64, committed: Option<i64>, assigned: bool) -> PartitionEnd {
        PartitionEnd { topic: "t".to_owned(), partition, low, high, committed, assigned, position: None }
    }

    #[test]
    fn drained_means_every_partition_committed_to_its_end() {
        assert_eq!(
            drain_state(&[end(0, 0, 10, Some(10), true), end(1, 0, 0, None, false)]),
            DrainState::Drained,
            "an empty partition has nothing to read"
        );
        assert_eq!(drain_state(&[end(0, 50, 50, Some(3), false)]), DrainState::Drained, "retention deleted everything");
        assert_eq!(
            drain_state(&[end(0, 0, 10, Some(4), true), end(1, 0, 7, None, false)]),
            DrainState::Behind { held: vec![("t".to_owned(), 0, 6)], others: vec![("t".to_owned(), 1, 7)] }
        );
        assert!(matches!(drain_state(&[]), DrainState::Behind { .. }), "no partitions seen is not drained");
    }
}
