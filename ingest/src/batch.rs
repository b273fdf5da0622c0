//! The batching stage. In: rows already encoded as RowBinary and rejects,
//! each with its Kafka coordinates. Out: a batch that is full (rows, bytes)
//! or old enough to flush, grouped by UTC day so each day is one atomic
//! INSERT, with the offset to commit per partition once it is durable.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use nohash_hasher::IntSet;

use crate::clickhouse_sink::EncodedRows;
use crate::dlq::Reject;

/// A topic partition.
pub type PartitionKey = (Arc<str>, i32);

/// A map by topic partition. Looked up for every message, so hashed with
/// foldhash instead of SipHash: its keys come from the group's assignment,
/// not from anything a producer chooses.
pub type PartitionMap<V> = HashMap<PartitionKey, V, foldhash::fast::RandomState>;

/// The encoded rows of one day from one partition, in offset order.
#[derive(Debug, Default)]
pub struct Rows {
    pub bytes: BytesMut,
    pub first_offset: i64,
    /// Request-id fingerprint of each row.
    pub fingerprints: Vec<u64>,
}

/// What is buffered and not yet durable.
#[derive(Debug, Default)]
pub struct Batch {
    /// Rows per UTC day, then per partition (so a revoked partition's rows
    /// come out whole, and a day's chunks are sent as they are).
    pub days: BTreeMap<u16, BTreeMap<PartitionKey, Rows>>,
    pub rejects: Vec<Reject>,
    /// Highest offset handled per partition (stored, rejected or skipped).
    pub offsets: PartitionMap<i64>,
    /// Fingerprints of the request ids in this batch (already hashes: the
    /// set does not hash them again).
    pub request_ids: IntSet<u64>,
    pub rows: usize,
    /// Encoded rows and reject payloads, in bytes.
    pub bytes: usize,
    pub started: Option<Instant>,
    /// Bytes a new day-and-partition buffer starts with: the largest of the
    /// batch before, so a steady stream fills its buffers without
    /// reallocating (copying) them on the way.
    group_capacity: usize,
    /// Where new buffers come from and written ones go back to.
    pool: BufferPool,
}

/// Row buffers handed back by the writer once their rows are durable, for
/// the batches that follow: a steady stream writes into memory it already
/// has instead of mapping (and page-faulting) a batch's worth of fresh
/// memory every time (see [`crate::memory`] for why large blocks are
/// fresh mappings).
#[derive(Debug, Clone, Default)]
pub struct BufferPool {
    free: Arc<Mutex<Vec<BytesMut>>>,
}

impl BufferPool {
    fn free(&self) -> std::sync::MutexGuard<'_, Vec<BytesMut>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty buffer: a written one if there is one (it keeps its size),
    /// otherwise a new one of `capacity` bytes.
    fn take(&self, capacity: usize) -> BytesMut {
        self.free().pop().unwrap_or_else(|| BytesMut::with_capacity(capacity))
    }

    /// Takes back the buffers of written rows that nothing else holds,
    /// while the pool holds less than `max_bytes`; the rest are freed.
    pub fn put(&self, rows: EncodedRows, max_bytes: usize) {
        let mut free = self.free();
        let mut held: usize = free.iter().map(BytesMut::capacity).sum();
        for chunk in rows.chunks {
            let Ok(mut buffer) = chunk.try_into_mut() else { continue };
            if held + buffer.capacity() > max_bytes {
                break;
            }
            buffer.clear();
            held += buffer.capacity();
            free.push(buffer);
        }
    }

    /// Buffers held, and their bytes.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let free = self.free();
        (free.len(), free.iter().map(BytesMut::capacity).sum())
    }
}

impl Batch {
    /// An empty batch whose buffers start at the size of the largest of
    /// `previous` (at most `max_bytes`).
    pub fn sized_like(previous: &Batch, max_bytes: usize) -> Batch {
        let group_capacity = previous.days.values().flat_map(BTreeMap::values).map(|r| r.bytes.len()).max().unwrap_or(0).min(max_bytes);
        Batch { group_capacity, ..previous.emptied() }
    }

    /// An empty batch with the same buffer pool.
    pub fn emptied(&self) -> Batch {
        Batch { group_capacity: self.group_capacity, pool: self.pool.clone(), ..Batch::default() }
    }

    /// Where this batch's buffers go back to once written.
    pub fn pool(&self) -> BufferPool {
        self.pool.clone()
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

    /// Adds one row of `day`, RowBinary-encoded.
    pub fn push_row(&mut self, day: u16, encoded: &[u8], fingerprint: u64, key: PartitionKey, offset: i64) {
        self.touch(key.clone(), offset, encoded.len());
        self.request_ids.insert(fingerprint);
        self.rows += 1;
        let (capacity, pool) = (self.group_capacity, &self.pool);
        let rows = self.days.entry(day).or_default().entry(key).or_insert_with(|| Rows {
            bytes: pool.take(capacity),
            first_offset: offset,
            fingerprints: Vec::new(),
        });
        rows.bytes.extend_from_slice(encoded);
        rows.fingerprints.push(fingerprint);
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

    /// Hands the rows over as one INSERT per day, in day order, without
    /// copying them: each day-and-partition buffer becomes one chunk.
    pub fn take_days(&mut self) -> Vec<(u16, EncodedRows)> {
        std::mem::take(&mut self.days)
            .into_iter()
            .filter_map(|(day, groups)| {
                let ((topic, partition), first) = groups.iter().next().map(|(key, rows)| (key.clone(), rows.first_offset))?;
                let rows = groups.values().map(|r| r.fingerprints.len()).sum();
                let chunks = groups.into_values().map(|r| r.bytes.freeze()).collect();
                Some((day, EncodedRows { chunks, first: (topic, partition as u16, first as u64), rows }))
            })
            .collect()
    }

    /// Forgets everything of partitions the group took away: their new
    /// owner re-reads it from the last commit.
    pub fn drop_partitions(&mut self, revoked: &[(String, i32)]) {
        let gone = |topic: &str, partition: i32| revoked.iter().any(|(t, p)| t == topic && *p == partition);
        if !self.offsets.keys().any(|(t, p)| gone(t, *p)) {
            return;
        }
        for groups in self.days.values_mut() {
            groups.retain(|(t, p), _| !gone(t, *p));
        }
        self.days.retain(|_, groups| !groups.is_empty());
        self.rejects.retain(|r| !gone(&r.topic, r.partition));
        self.offsets.retain(|(t, p), _| !gone(t, *p));
        // Fingerprints are only a duplicate filter: rebuild from what is left.
        let rows = || self.days.values().flat_map(BTreeMap::values);
        let kept: IntSet<u64> = rows().flat_map(|r| r.fingerprints.iter().copied()).collect();
        self.rows = rows().map(|r| r.fingerprints.len()).sum::<usize>() + self.rejects.len();
        self.request_ids = kept;
        if self.offsets.is_empty() {
            *self = self.emptied();
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
    use bytes::Bytes;

    fn key(partition: i32) -> PartitionKey {
        (Arc::from("events"), partition)
    }

    #[test]
    fn rows_are_grouped_by_day_then_partition_and_handed_over_uncopied() {
        let mut batch = Batch::default();
        batch.push_row(20_000, b"a1", 1, key(1), 10);
        batch.push_row(20_001, b"b0", 2, key(0), 5);
        batch.push_row(20_000, b"a0", 3, key(0), 4);
        batch.push_row(20_000, b"A1", 4, key(1), 11);
        batch.push_skipped(key(2), 7);
        assert_eq!((batch.rows, batch.bytes), (4, 8));
        assert_eq!(batch.offsets[&key(1)], 11);
        assert_eq!(batch.offsets[&key(2)], 7, "a skipped message moves the commit point");
        let next = Batch::sized_like(&batch, 1 << 20);
        assert_eq!(next.group_capacity, 4, "the largest buffer of the batch before");

        let days = batch.take_days();
        assert_eq!(days.len(), 2);
        let (day, rows) = &days[0];
        assert_eq!(*day, 20_000);
        assert_eq!(rows.rows, 3);
        assert_eq!(rows.chunks, vec![Bytes::from_static(b"a0"), Bytes::from_static(b"a1A1")], "partition order, offset order within");
        assert_eq!(rows.first, (Arc::from("events"), 0, 4));
        assert_eq!(days[1].1.first, (Arc::from("events"), 0, 5));
        assert!(batch.days.is_empty());
    }

    #[test]
    fn written_buffers_are_written_into_again_up_to_the_bound() {
        let mut batch = Batch::default();
        batch.push_row(20_000, b"a0", 1, key(0), 1);
        batch.push_row(20_000, b"b0", 2, key(1), 1);
        let pool = batch.pool();
        let (_, rows) = batch.take_days().remove(0);
        let reusable = rows.chunks[0].as_ptr();
        // A retry still holding a buffer keeps it: the pool takes only what nothing else holds.
        let still_held = rows.chunks[1].clone();
        pool.put(rows, 1 << 20);
        assert_eq!(pool.held().0, 1);

        let mut next = Batch::sized_like(&batch, 1 << 20);
        next.push_row(20_001, b"c", 3, key(0), 2);
        assert_eq!(pool.held(), (0, 0), "the new batch took the written buffer");
        let (_, rows) = next.take_days().remove(0);
        assert_eq!(rows.chunks, vec![Bytes::from_static(b"c")], "the old rows are gone from it");
        assert_eq!(rows.chunks[0].as_ptr(), reusable, "the same memory, not a new buffer");
        assert_eq!(still_held, Bytes::from_static(b"b0"));

        pool.put(rows, 0);
        assert_eq!(pool.held(), (0, 0), "past the bound a buffer is freed");
    }

    #[test]
    fn a_revoked_partition_leaves_the_batch_whole() {
        let mut batch = Batch::default();
        batch.push_row(20_000, b"x", 1, key(0), 1);
        batch.push_row(20_000, b"y", 2, key(1), 1);
        batch.push_row(20_001, b"z", 3, key(1), 2);
        batch.drop_partitions(&[("events".into(), 1)]);
        assert_eq!(batch.rows, 1);
        assert_eq!(batch.request_ids.iter().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(batch.days.len(), 1);
        assert!(!batch.offsets.contains_key(&key(1)));
        batch.drop_partitions(&[("events".into(), 0)]);
        assert!(batch.is_empty() && batch.days.is_empty() && batch.rows == 0);
    }

    #[test]
    fn recent_ids_forget_the_oldest() {
        let mut ids = RecentIds::new(2);
        ids.extend([1, 2, 3]);
        assert!(!ids.contains(1) && ids.contains(2) && ids.contains(3));
        assert_eq!(fingerprint("req-1"), fingerprint("req-1"));
        assert_ne!(fingerprint("req-1"), fingerprint("req-2"));
    }
}
