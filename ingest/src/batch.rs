//! The batching stage. In: rows already encoded as RowBinary and rejects,
//! each with its Kafka coordinates. Out: a batch that is full (rows, bytes)
//! or old enough to flush, grouped by UTC day so each day is one atomic
//! INSERT, with the offset to commit per partition once it is durable.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use nohash_hasher::IntMap;

use crate::dlq::Reject;
use crate::error::IngestError;
use crate::service_metrics::{Observation, Tally};
use crate::sink::{reject_day, Coverage, EncodedRows, FirstRow};

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
    /// The first row's offset and index in its message.
    pub first: (i64, u32),
    /// Request-id fingerprint and content hash of each row.
    pub fingerprints: Vec<(u64, u64)>,
    /// Where each row ends in `bytes` ([`crate::sort`] reorders them).
    pub ends: Vec<u32>,
}

/// What is buffered and not yet durable.
#[derive(Debug, Default)]
pub struct Batch {
    /// Rows per UTC day, then per partition (so a revoked partition's rows
    /// come out whole, and a day's chunks are sent as they are).
    pub days: BTreeMap<u16, BTreeMap<PartitionKey, Rows>>,
    pub rejects: Vec<Reject>,
    /// First and last offset handled per partition (stored, rejected or
    /// skipped): the range the replay log records, and last + 1 is committed.
    pub offsets: PartitionMap<(i64, i64)>,
    /// Fingerprints of the request ids in this batch, with the content
    /// hash of their rows (already hashes: the map does not hash them again).
    pub request_ids: IntMap<u64, u64>,
    /// What the stored rows add to the service metrics, per partition (a
    /// revoked partition's part goes with its rows).
    pub tallies: PartitionMap<Tally>,
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
    /// Buffers taken from `free` since [`BufferPool::take_reused`] last read it.
    reused: Arc<AtomicU64>,
}

impl BufferPool {
    fn free(&self) -> std::sync::MutexGuard<'_, Vec<BytesMut>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty buffer: a written one if there is one (it keeps its size),
    /// otherwise a new one of `capacity` bytes.
    fn take(&self, capacity: usize) -> BytesMut {
        match self.free().pop() {
            Some(buffer) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                buffer
            }
            None => BytesMut::with_capacity(capacity),
        }
    }

    /// Buffers taken back from the written ones since the last call.
    pub fn take_reused(&self) -> u64 {
        self.reused.swap(0, Ordering::Relaxed)
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
        let entry = self.offsets.entry(key).or_insert((offset, offset));
        entry.1 = entry.1.max(offset);
    }

    /// Adds one row of `day`, RowBinary-encoded, whose request id has
    /// `fingerprint` and whose content hashes to `content`, the event at
    /// `index` of the message at `offset`.
    pub fn push_row(&mut self, day: u16, encoded: &[u8], (fingerprint, content): (u64, u64), key: PartitionKey, (offset, index): (i64, u32)) {
        self.touch(key.clone(), offset, encoded.len());
        self.request_ids.insert(fingerprint, content);
        self.rows += 1;
        let (capacity, pool) = (self.group_capacity, &self.pool);
        let rows = self.days.entry(day).or_default().entry(key).or_insert_with(|| Rows {
            bytes: pool.take(capacity),
            first: (offset, index),
            fingerprints: Vec::new(),
            ends: Vec::new(),
        });
        rows.bytes.extend_from_slice(encoded);
        rows.fingerprints.push((fingerprint, content));
        // A buffer past 4 GiB (batch_max_bytes is far below) leaves its insert unsorted.
        rows.ends.push(u32::try_from(rows.bytes.len()).unwrap_or(u32::MAX));
    }

    pub fn push_reject(&mut self, reject: Reject, key: PartitionKey) {
        let bytes = reject.payload.len() + 128;
        self.touch(key, reject.offset, bytes);
        self.rows += 1;
        self.rejects.push(reject);
    }

    /// A message that needs no write (already stored, or a producer retry)
    /// still moves the partition's commit point.
    /// Counts a row just pushed in the service metrics of its partition.
    pub fn observe(&mut self, key: &PartitionKey, observation: &Observation) {
        match self.tallies.get_mut(key) {
            Some(tally) => tally.observe(observation),
            None => self.tallies.entry(key.clone()).or_default().observe(observation),
        }
    }

    pub fn push_skipped(&mut self, key: PartitionKey, offset: i64) {
        self.touch(key, offset, 0);
    }

    pub fn is_full(&self, max_rows: usize, max_bytes: usize) -> bool {
        self.rows >= max_rows || self.bytes >= max_bytes
    }

    pub fn flush_due(&self, max_age: Duration) -> Option<Instant> {
        self.started.map(|s| s + max_age)
    }

    /// Hands the rows over as one INSERT per day and shard (`shard_of` a
    /// partition), in day order, without copying them: each
    /// day-and-partition buffer becomes one chunk.
    pub fn take_days<F>(&mut self, shard_of: F) -> Result<Vec<(u16, EncodedRows)>, IngestError>
    where
        F: Fn(&str, i32) -> Result<usize, IngestError>,
    {
        let mut out = Vec::new();
        for (day, groups) in std::mem::take(&mut self.days) {
            let mut shards: BTreeMap<usize, EncodedRows> = BTreeMap::new();
            for ((topic, partition), rows) in groups {
                let shard = shard_of(&topic, partition)?;
                let insert = shards.entry(shard).or_insert_with(|| EncodedRows {
                    chunks: Vec::new(),
                    ends: Vec::new(),
                    first: FirstRow { day, topic: topic.clone(), partition, offset: rows.first.0, index: rows.first.1 },
                    rows: 0,
                    shard,
                    order: None,
                });
                insert.rows += rows.fingerprints.len();
                insert.chunks.push(rows.bytes.freeze());
                insert.ends.push(rows.ends);
            }
            out.extend(shards.into_values().map(|rows| (day, rows)));
        }
        Ok(out)
    }

    /// What the batch covers per partition: the offsets it handled, the
    /// days its rows go to and the days its rejects are logged under. The
    /// replay log records it before the batch is written.
    pub fn coverage(&self) -> Vec<Coverage> {
        let mut coverage: Vec<Coverage> = self
            .offsets
            .iter()
            .map(|((topic, partition), (first, last))| Coverage {
                topic: topic.clone(),
                partition: *partition,
                first: *first,
                last: *last,
                row_days: Vec::new(),
                reject_days: Vec::new(),
            })
            .collect();
        coverage.sort_unstable_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        let find = |coverage: &mut Vec<Coverage>, topic: &str, partition: i32| {
            coverage.binary_search_by(|c| (&*c.topic, c.partition).cmp(&(topic, partition))).ok()
        };
        for (day, groups) in &self.days {
            for (topic, partition) in groups.keys() {
                if let Some(i) = find(&mut coverage, topic, *partition) {
                    coverage[i].row_days.push(*day);
                }
            }
        }
        for r in &self.rejects {
            let day = reject_day(r.received_ms);
            if let Some(i) = find(&mut coverage, &r.topic, r.partition) {
                if !coverage[i].reject_days.contains(&day) {
                    coverage[i].reject_days.push(day);
                }
            }
        }
        coverage
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
        self.tallies.retain(|(t, p), _| !gone(t, *p));
        // Fingerprints are only a duplicate filter: rebuild from what is left.
        let rows = || self.days.values().flat_map(BTreeMap::values);
        let kept: IntMap<u64, u64> = rows().flat_map(|r| r.fingerprints.iter().copied()).collect();
        self.rows = rows().map(|r| r.fingerprints.len()).sum::<usize>() + self.rejects.len();
        self.request_ids = kept;
        if self.offsets.is_empty() {
            *self = self.emptied();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn one_server(_: &str, _: i32) -> Result<usize, IngestError> {
        Ok(0)
    }

    fn key(partition: i32) -> PartitionKey {
        (Arc::from("events"), partition)
    }

    #[test]
    fn rows_are_grouped_by_day_then_partition_and_handed_over_uncopied() {
        let mut batch = Batch::default();
        batch.push_row(20_000, b"a1", (1, 0), key(1), (10, 0));
        batch.push_row(20_001, b"b0", (2, 0), key(0), (5, 0));
        batch.push_row(20_000, b"a0", (3, 0), key(0), (4, 0));
        batch.push_row(20_000, b"A1", (4, 0), key(1), (11, 0));
        batch.push_skipped(key(2), 7);
        assert_eq!((batch.rows, batch.bytes), (4, 8));
        assert_eq!(batch.offsets[&key(1)], (10, 11));
        assert_eq!(batch.offsets[&key(2)], (7, 7), "a skipped message moves the commit point");
        let next = Batch::sized_like(&batch, 1 << 20);
        assert_eq!(next.group_capacity, 4, "the largest buffer of the batch before");

        let days = batch.take_days(one_server).expect("one shard");
        assert_eq!(days.len(), 2);
        let (day, rows) = &days[0];
        assert_eq!(*day, 20_000);
        assert_eq!(rows.rows, 3);
        assert_eq!(rows.chunks, vec![Bytes::from_static(b"a0"), Bytes::from_static(b"a1A1")], "partition order, offset order within");
        assert_eq!(rows.first, FirstRow { day: 20_000, topic: Arc::from("events"), partition: 0, offset: 4, index: 0 });
        assert_eq!(days[1].1.first, FirstRow { day: 20_001, topic: Arc::from("events"), partition: 0, offset: 5, index: 0 });
        assert!(batch.days.is_empty());
    }

    #[test]
    fn a_days_rows_split_into_one_insert_per_shard_of_their_partitions() {
        let mut batch = Batch::default();
        for (partition, offset) in [(0, 1), (1, 2), (2, 3), (3, 4), (2, 5)] {
            batch.push_row(20_000, format!("p{partition}o{offset}").as_bytes(), (offset as u64, 0), key(partition), (offset, 0));
        }
        // Partitions 0 and 2 on the first shard, 1 and 3 on the second.
        let days = batch.take_days(|_, p| Ok(usize::try_from(p % 2).expect("small"))).expect("mapped");
        let shards: Vec<(usize, usize, Vec<Bytes>)> = days.into_iter().map(|(_, r)| (r.shard, r.rows, r.chunks)).collect();
        assert_eq!(
            shards,
            vec![
                (0, 3, vec![Bytes::from_static(b"p0o1"), Bytes::from_static(b"p2o3p2o5")]),
                (1, 2, vec![Bytes::from_static(b"p1o2"), Bytes::from_static(b"p3o4")]),
            ]
        );
        let mut unmapped = Batch::default();
        unmapped.push_row(20_000, b"x", (9, 0), key(7), (1, 0));
        let refused = unmapped.take_days(|_, p| Err(IngestError::Config(format!("partition {p} is in no shard"))));
        assert!(refused.is_err_and(|e| e.to_string().contains("partition 7")));
    }

    #[test]
    fn coverage_names_each_partitions_offsets_and_days() {
        let mut batch = Batch::default();
        batch.push_row(20_000, b"a", (1, 0), key(1), (10, 0));
        batch.push_row(20_002, b"b", (2, 0), key(1), (12, 0));
        batch.push_skipped(key(0), 3);
        let reject = |offset: i64, received_ms: i64| Reject {
            payload: b"{".to_vec(),
            key: None,
            headers: Vec::new(),
            original: None,
            rejection: inferlog_schema::Rejection::new(inferlog_schema::ReasonCode::JsonMalformed, "", "x"),
            topic: Arc::from("events"),
            partition: 1,
            offset,
            received_ms,
            span: None,
        };
        batch.push_reject(reject(11, 20_005 * 86_400_000 + 5), key(1));
        batch.push_reject(reject(13, 20_005 * 86_400_000 + 9), key(1));
        let coverage = batch.coverage();
        assert_eq!(
            coverage,
            vec![
                Coverage { topic: Arc::from("events"), partition: 0, first: 3, last: 3, row_days: vec![], reject_days: vec![] },
                Coverage { topic: Arc::from("events"), partition: 1, first: 10, last: 13, row_days: vec![20_000, 20_002], reject_days: vec![20_005] },
            ]
        );
    }

    #[test]
    fn written_buffers_are_written_into_again_up_to_the_bound() {
        let mut batch = Batch::default();
        batch.push_row(20_000, b"a0", (1, 0), key(0), (1, 0));
        batch.push_row(20_000, b"b0", (2, 0), key(1), (1, 0));
        let pool = batch.pool();
        let (_, rows) = batch.take_days(one_server).expect("one shard").remove(0);
        let reusable = rows.chunks[0].as_ptr();
        // A retry still holding a buffer keeps it: the pool takes only what nothing else holds.
        let still_held = rows.chunks[1].clone();
        pool.put(rows, 1 << 20);
        assert_eq!(pool.held().0, 1);

        let mut next = Batch::sized_like(&batch, 1 << 20);
        next.push_row(20_001, b"c", (3, 0), key(0), (2, 0));
        assert_eq!(pool.held(), (0, 0), "the new batch took the written buffer");
        let (_, rows) = next.take_days(one_server).expect("one shard").remove(0);
        assert_eq!(rows.chunks, vec![Bytes::from_static(b"c")], "the old rows are gone from it");
        assert_eq!(rows.chunks[0].as_ptr(), reusable, "the same memory, not a new buffer");
        assert_eq!(still_held, Bytes::from_static(b"b0"));

        pool.put(rows, 0);
        assert_eq!(pool.held(), (0, 0), "past the bound a buffer is freed");
    }

    #[test]
    fn a_revoked_partition_leaves_the_batch_whole() {
        let mut batch = Batch::default();
        batch.push_row(20_000, b"x", (1, 10), key(0), (1, 0));
        batch.push_row(20_000, b"y", (2, 20), key(1), (1, 0));
        batch.push_row(20_001, b"z", (3, 30), key(1), (2, 0));
        batch.drop_partitions(&[("events".into(), 1)]);
        assert_eq!(batch.rows, 1);
        assert_eq!(batch.request_ids.iter().map(|(f, c)| (*f, *c)).collect::<Vec<_>>(), [(1, 10)]);
        assert_eq!(batch.days.len(), 1);
        assert!(!batch.offsets.contains_key(&key(1)));
        batch.drop_partitions(&[("events".into(), 0)]);
        assert!(batch.is_empty() && batch.days.is_empty() && batch.rows == 0);
    }
}
