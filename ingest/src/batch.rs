//! The batching stage. In: normalized rows and rejects, each with its Kafka
//! coordinates. Out: a batch that is full (rows, bytes) or old enough to
//! flush, grouped by UTC day so each day is one atomic INSERT, with the
//! offset to commit per partition once it is durable.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nohash_hasher::IntSet;

use crate::clickhouse_sink::HotRow;
use crate::dlq::Reject;

/// A topic partition.
pub type PartitionKey = (Arc<str>, i32);

/// What is buffered and not yet durable.
#[derive(Debug, Default)]
pub struct Batch {
    pub days: BTreeMap<u16, Vec<HotRow>>,
    pub rejects: Vec<Reject>,
    /// Highest offset handled per partition (stored, rejected or skipped).
    pub offsets: HashMap<PartitionKey, i64>,
    /// Fingerprints of the request ids in this batch (already hashes: the
    /// set does not hash them again).
    pub request_ids: IntSet<u64>,
    pub rows: usize,
    pub bytes: usize,
    pub started: Option<Instant>,
    /// Capacity a new day's row vector starts with: the largest day of the
    /// batch before, so a steady stream fills its vectors without
    /// reallocating (copying rows of a few hundred bytes) on the way.
    day_capacity: usize,
}

impl Batch {
    /// An empty batch whose day vectors start at the size of the largest
    /// day of `previous` (at most `max_rows`).
    pub fn sized_like(previous: &Batch, max_rows: usize) -> Batch {
        let day_capacity = previous.days.values().map(Vec::len).max().unwrap_or(0).min(max_rows);
        Batch { day_capacity, ..Batch::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    fn touch(&mut self, key: PartitionKey, offset: i64, bytes: usize) {
        self.started.get_or_insert_with(Instant::now);
        self.bytes += bytes;
        let entry = self.offsets.entry(key).or_insert(offset);
        *entry = (*entry).max(offset);
    }

    pub fn push_row(&mut self, row: HotRow, fingerprint: u64, key: PartitionKey, offset: i64) {
        let bytes = row.size_hint();
        self.touch(key, offset, bytes);
        self.request_ids.insert(fingerprint);
        self.rows += 1;
        let capacity = self.day_capacity;
        self.days.entry(row.day).or_insert_with(|| Vec::with_capacity(capacity)).push(row);
    }

    pub fn push_reject(&mut self, reject: Reject, key: PartitionKey) {
        let bytes = reject.payload.len() + 128;
        self.touch(key, reject.offset, bytes);
        self.rows += 1;
        self.rejects.push(reject);
    }

    /// A message that needs no write (already stored, or a producer retry)
    /// still moves the partition's commit point.
    pub fn push_skipped(&mut self, key: PartitionKey, offset: i64) {
        self.touch(key, offset, 0);
    }

    pub fn is_full(&self, max_rows: usize, max_bytes: usize) -> bool {
        self.rows >= max_rows || self.bytes >= max_bytes
    }

    pub fn flush_due(&self, max_age: Duration) -> Option<Instant> {
        self.started.map(|s| s + max_age)
    }

    /// Forgets everything of partitions the group took away: their new
    /// owner re-reads it from the last commit.
    pub fn drop_partitions(&mut self, revoked: &[(String, i32)]) {
        let gone = |topic: &str, partition: i32| revoked.iter().any(|(t, p)| t == topic && *p == partition);
        if !self.offsets.keys().any(|(t, p)| gone(t, *p)) {
            return;
        }
        for rows in self.days.values_mut() {
            rows.retain(|r| !gone(&r.kafka_topic, i32::from(r.kafka_partition)));
        }
        self.days.retain(|_, rows| !rows.is_empty());
        self.rejects.retain(|r| !gone(&r.topic, r.partition));
        self.offsets.retain(|(t, p), _| !gone(t, *p));
        // Fingerprints are only a duplicate filter: rebuild from what is left.
        self.request_ids.clear();
        let rows: Vec<u64> = self.days.values().flatten().map(|r| fingerprint(&r.request_id)).collect();
        self.request_ids.extend(rows);
        self.rows = self.days.values().map(Vec::len).sum::<usize>() + self.rejects.len();
        if self.offsets.is_empty() {
            *self = Batch { day_capacity: self.day_capacity, ..Batch::default() };
        }
    }
}

/// A 64-bit fingerprint of a request id (SipHash with fixed keys: stable
/// across restarts; a false match needs a 2^-64 collision).
pub fn fingerprint(request_id: &str) -> u64 {
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(request_id)
}

/// The last `capacity` request ids made durable, to drop producer retries.
#[derive(Debug)]
pub struct RecentIds {
    set: IntSet<u64>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl RecentIds {
    pub fn new(capacity: usize) -> RecentIds {
        RecentIds { set: IntSet::with_capacity_and_hasher(capacity.min(1 << 20), Default::default()), order: VecDeque::new(), capacity }
    }

    pub fn contains(&self, fingerprint: u64) -> bool {
        self.set.contains(&fingerprint)
    }

    pub fn extend(&mut self, fingerprints: impl IntoIterator<Item = u64>) {
        if self.capacity == 0 {
            return;
        }
        for f in fingerprints {
            if self.set.insert(f) {
                self.order.push_back(f);
                if self.order.len() > self.capacity {
                    if let Some(old) = self.order.pop_front() {
                        self.set.remove(&old);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_ids_forget_the_oldest() {
        let mut ids = RecentIds::new(2);
        ids.extend([1, 2, 3]);
        assert!(!ids.contains(1) && ids.contains(2) && ids.contains(3));
        assert_eq!(fingerprint("req-1"), fingerprint("req-1"));
        assert_ne!(fingerprint("req-1"), fingerprint("req-2"));
    }
}
