//! The dedup window. In: the request ids of each batch handed to the
//! writer, with the content hash of their rows; then each new row's id.
//! Out: whether that row is new, a producer's retry of a stored event
//! (dropped), or another event under a stored id (a conflict, rejected).

use std::hash::BuildHasher;

use hashbrown::HashTable;

/// A 64-bit fingerprint of a request id (SipHash with fixed keys: stable
/// across restarts; a false match needs a 2^-64 collision).
pub fn fingerprint(request_id: &str) -> u64 {
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(request_id)
}

/// The last `capacity` request ids made durable, with the content hash of
/// their rows: a producer retry (same id, same content) is dropped, the
/// same id with other content is a conflict.
///
/// Kept as a ring of (fingerprint, content) in the order the ids were
/// made durable, and an index of ring positions by fingerprint (already a
/// hash: the index uses it as it is). 16 bytes an id in the ring and 4 in
/// the index: about 26 MB for the default million, where a map and a
/// queue of the ids took 42, memory the batches can use instead.
#[derive(Debug)]
pub struct RecentIds {
    ring: Vec<(u64, u64)>,
    /// The oldest id's position once the ring is full: the next to go.
    oldest: usize,
    index: HashTable<u32>,
    capacity: usize,
}

impl RecentIds {
    /// A window of `capacity` ids (at most 2^32: positions are `u32`).
    pub fn new(capacity: usize) -> RecentIds {
        let capacity = capacity.min(u32::MAX as usize);
        let start = capacity.min(1 << 20);
        RecentIds { ring: Vec::with_capacity(start), oldest: 0, index: HashTable::with_capacity(start), capacity }
    }

    fn position(&self, fingerprint: u64) -> Option<usize> {
        self.index.find(fingerprint, |&i| self.ring[i as usize].0 == fingerprint).map(|&i| i as usize)
    }

    /// The content hash stored under this request-id fingerprint, if any.
    pub fn get(&self, fingerprint: u64) -> Option<u64> {
        self.position(fingerprint).map(|i| self.ring[i].1)
    }

    /// Remembers ids just made durable; an id already remembered takes the
    /// new content and keeps its place.
    pub fn extend(&mut self, ids: impl IntoIterator<Item = (u64, u64)>) {
        if self.capacity == 0 {
            return;
        }
        for (f, content) in ids {
            if let Some(i) = self.position(f) {
                self.ring[i].1 = content;
                continue;
            }
            let i = if self.ring.len() < self.capacity {
                self.ring.push((f, content));
                self.ring.len() - 1
            } else {
                let i = self.oldest;
                let old = self.ring[i].0;
                if let Ok(entry) = self.index.find_entry(old, |&j| j as usize == i) {
                    entry.remove();
                }
                self.ring[i] = (f, content);
                self.oldest = (i + 1) % self.capacity;
                i
            };
            let ring = &self.ring;
            self.index.insert_unique(f, i as u32, |&j| ring[j as usize].0);
        }
    }
}

/// What a request id already seen means for a new row with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not seen within the window: store it.
    New,
    /// The same id with the same content: a producer retry, dropped.
    Retry,
    /// The same id with other content: a conflict, rejected.
    Conflict,
}

impl Seen {
    pub fn of(stored: Option<u64>, content: u64) -> Seen {
        match stored {
            None => Seen::New,
            Some(c) if c == content => Seen::Retry,
            Some(_) => Seen::Conflict,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn recent_ids_forget_the_oldest_and_tell_a_retry_from_a_conflict() {
        let mut ids = RecentIds::new(2);
        ids.extend([(1, 10), (2, 20), (3, 30)]);
        assert_eq!((ids.get(1), ids.get(2), ids.get(3)), (None, Some(20), Some(30)));
        assert_eq!(Seen::of(ids.get(1), 10), Seen::New);
        assert_eq!(Seen::of(ids.get(2), 20), Seen::Retry);
        assert_eq!(Seen::of(ids.get(3), 31), Seen::Conflict);
        assert_eq!(fingerprint("req-1"), fingerprint("req-1"));
        assert_ne!(fingerprint("req-1"), fingerprint("req-2"));
    }

    /// The window against the plainest model of it (a map and a queue of
    /// the ids in arrival order), over random ids, repeats and windows. A
    /// failure names its seed.
    #[test]
    fn recent_ids_remember_exactly_the_last_window() {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
        let mut state = seed;
        let mut next = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        for capacity in [0, 1, 2, 7, 64, 1000] {
            let mut ids = RecentIds::new(capacity);
            let (mut model, mut order) = (HashMap::<u64, u64>::new(), std::collections::VecDeque::new());
            for _ in 0..20 {
                // Ids from a small range, so repeats (retries and conflicts) are common.
                let batch: Vec<(u64, u64)> = (0..next(300)).map(|_| (next(2 * capacity as u64 + 10), next(3))).collect();
                ids.extend(batch.iter().copied());
                for (f, content) in batch {
                    if capacity > 0 && model.insert(f, content).is_none() {
                        order.push_back(f);
                        if order.len() > capacity {
                            model.remove(&order.pop_front().expect("not empty"));
                        }
                    }
                }
                for f in 0..2 * capacity as u64 + 10 {
                    assert_eq!(ids.get(f), model.get(&f).copied(), "seed {seed}, window {capacity}, id {f}");
                }
            }
        }
    }
}
