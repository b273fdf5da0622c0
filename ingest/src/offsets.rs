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

use std::collections::BTreeMap;

/// Offsets already handled by an earlier reader of a partition (stored,
/// rejected or skipped), as sorted, disjoint inclusive ranges: what the
/// replay log and the tables say, in memory proportional to the number of
/// batches, not of rows.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoredRanges {
    ranges: Vec<(i64, i64)>,
    /// The first range that may still hold an offset asked for (offsets
    /// are asked for in ascending order).
    next: usize,
    /// Offsets of which only some rows may be stored, with the indexes in
    /// their message of those that are: an OTLP message whose spans went
    /// to several days' inserts, cut by a crash between them. Found only
    /// in the one batch per partition a reader died writing, so small.
    spans: BTreeMap<i64, Vec<u32>>,
}

impl StoredRanges {
    /// Sorts and merges ranges that overlap or touch.
    pub fn new(mut ranges: Vec<(i64, i64)>) -> StoredRanges {
        ranges.retain(|(first, last)| first <= last);
        ranges.sort_unstable();
        let mut merged: Vec<(i64, i64)> = Vec::with_capacity(ranges.len());
        for (first, last) in ranges {
            match merged.last_mut() {
                Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
                _ => merged.push((first, last)),
            }
        }
        StoredRanges { ranges: merged, next: 0, spans: BTreeMap::new() }
    }

    /// With `spans`: offsets whose stored rows are known by their index in
    /// the message (each list sorted), not as whole messages.
    pub fn with_spans(mut self, spans: BTreeMap<i64, Vec<u32>>) -> StoredRanges {
        self.spans = spans;
        self
    }

    /// The ranges, merged.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.ranges
    }

    /// How many offsets the ranges hold, and the offsets known by their rows.
    pub fn offsets(&self) -> u64 {
        self.ranges.iter().map(|(f, l)| (l - f + 1) as u64).sum::<u64>() + self.spans.len() as u64
    }

    /// Whether nothing is known stored.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.spans.is_empty()
    }

    /// Whether `offset` lies in a range, for offsets asked in ascending
    /// order (as a partition delivers them): amortised O(1).
    fn contains_ascending(&mut self, offset: i64) -> bool {
        while self.ranges.get(self.next).is_some_and(|(_, last)| *last < offset) {
            self.next += 1;
        }
        self.ranges.get(self.next).is_some_and(|(first, _)| *first <= offset)
    }

    /// Whether no range lies ahead any more.
    fn exhausted(&self) -> bool {
        self.next >= self.ranges.len()
    }
}

/// Builds [`StoredRanges`] from offsets streamed in ascending order.
#[derive(Debug, Default)]
pub struct RangeBuilder {
    ranges: Vec<(i64, i64)>,
}

impl RangeBuilder {
    pub fn push(&mut self, offset: i64) {
        self.push_range(offset, offset);
    }

    /// Adds `first..=last`, pushed in order of `first`: a range that
    /// touches or overlaps the last one extends it.
    pub fn push_range(&mut self, first: i64, last: i64) {
        match self.ranges.last_mut() {
            Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
            _ => self.ranges.push((first, last)),
        }
    }

    /// Ranges held so far.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn finish(self) -> Vec<(i64, i64)> {
        self.ranges
    }
}

/// Per-partition state of the current assignment.
#[derive(Debug, Default)]
pub struct PartitionState {
    /// Offsets at or past the committed one that are already handled.
    pub replay: StoredRanges,
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
    pub fn new(replay: StoredRanges, expected: i64) -> PartitionState {
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

    /// Whether `offset` was handled before this member read it (a replay
    /// after a crash or a rebalance). Asked for every message, in offset
    /// order: past the last range it costs one comparison.
    pub fn already_stored(&mut self, offset: i64) -> bool {
        !self.replay.exhausted() && self.replay.contains_ascending(offset)
    }

    /// The indexes (sorted) of `offset`'s rows an earlier reader stored,
    /// when only those are known: the message's other rows still need
    /// writing. Each offset's list is handed out once.
    pub fn stored_spans(&mut self, offset: i64) -> Option<Vec<u32>> {
        if self.replay.spans.is_empty() {
            return None;
        }
        self.replay.spans.remove(&offset)
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

    /// An offset known by its stored rows is not stored whole: its rows'
    /// indexes come out once, for that offset only.
    #[test]
    fn an_offset_known_by_its_rows_hands_out_their_indexes_once() {
        let spans = BTreeMap::from([(14, vec![0, 2, 7])]);
        let mut s = PartitionState::new(StoredRanges::new(vec![(11, 12)]).with_spans(spans), 10);
        assert_eq!(s.replay.offsets(), 3);
        assert!(!s.already_stored(14));
        assert_eq!(s.stored_spans(13), None);
        assert_eq!(s.stored_spans(14), Some(vec![0, 2, 7]));
        assert_eq!(s.stored_spans(14), None, "handed out once");
    }

    /// Offsets asked in ascending order are stored exactly where a range
    /// holds them; any offset of a partition with nothing stored is not.
    #[test]
    fn a_stored_offset_is_found_in_its_range() {
        let mut s = PartitionState::new(StoredRanges::new(vec![(11, 12), (20, 25), (30, 30)]), 10);
        let stored: Vec<i64> = (10..40).filter(|o| s.already_stored(*o)).collect();
        assert_eq!(stored, [11, 12, 20, 21, 22, 23, 24, 25, 30]);
        assert!(!PartitionState::new(StoredRanges::default(), 10).already_stored(10));
    }

    #[test]
    fn ranges_are_sorted_and_merged_where_they_overlap_or_touch() {
        let r = StoredRanges::new(vec![(20, 25), (5, 9), (10, 12), (24, 30), (40, 39), (50, 50)]);
        assert_eq!(r.ranges(), [(5, 12), (20, 30), (50, 50)]);
        assert_eq!(r.offsets(), 8 + 11 + 1);
        let mut b = RangeBuilder::default();
        for o in [3, 4, 5, 7, 8, 8, 12] {
            b.push(o);
        }
        assert_eq!(b.finish(), [(3, 5), (7, 8), (12, 12)]);
    }

    #[test]
    fn offsets_are_next_again_or_a_gap() {
        let mut s = PartitionState::new(StoredRanges::default(), 10);
        assert_eq!(s.classify(10), Delivery::Next);
        assert_eq!(s.classify(9), Delivery::Again);
        assert_eq!(s.classify(12), Delivery::Gap);
        s.advanced_to(12);
        assert_eq!(s.classify(13), Delivery::Next);
    }

    #[test]
    fn only_offsets_below_the_log_start_count_as_lost() {
        let s = PartitionState::new(StoredRanges::default(), 500);
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
