//! The label values of the live service metrics, capped. In: a hot row (on
//! the normalizing threads). Out: its [`Observation`]: the series it counts
//! under (model name, model version, business line, request type, each
//! past its cap folded into `other`), its error code's index (capped the
//! same way), which labels overflowed, its user bucket and its figures.
//!
//! A series is found by a 64-bit hash of its raw label values, first in
//! the caller's cache (one per chunk of messages), then under a read lock;
//! only a series never seen before takes the write lock. Two raw tuples
//! sharing a 64-bit hash would share a series: with thousands of series
//! the odds are below 1 in 10^11, and only a metric's labels would suffer.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher as _;
use std::sync::{Arc, RwLock};

use inferlog_store::model::rows::HotRow;
use inferlog_store::ServiceMetricsConfig;
use nohash_hasher::IntMap;

use super::tally::{Observation, DURATIONS, NO_USER_BUCKET};

/// The value a label takes past its cap.
pub const OTHER: &str = "other";

/// The value of `request_type` on an event without one.
pub const NO_REQUEST_TYPE: &str = "unknown";

/// The series labels, in this order, then the error code: the names
/// Prometheus sees, and the order of [`Interner`]'s caps and overflow bits.
pub const LABELS: [&str; 5] = ["model_name", "model_version", "business_line", "request_type", "error_code"];

/// Bit of `error_code` in an overflow mask.
const CODE_BIT: u8 = 1 << 4;

/// The caller's cache of series already looked up (one per chunk: no lock).
#[derive(Debug, Default)]
pub struct Cache {
    series: IntMap<u64, (u32, u8)>,
    codes: HashMap<i32, (u16, bool)>,
}

/// Every series and error code seen so far, capped. Shared by the
/// normalizing threads (which intern) and the exporter (which renders).
#[derive(Debug)]
pub struct Interner {
    caps: [usize; 5],
    user_buckets: u16,
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Raw label values' hash → series id and the labels that overflowed.
    by_hash: IntMap<u64, (u32, u8)>,
    /// Capped label values → series id (overflowing tuples share one).
    by_labels: HashMap<[Arc<str>; 4], u32>,
    /// Series id → its capped label values.
    series: Vec<[Arc<str>; 4]>,
    /// Values admitted per label (at most its cap each).
    admitted: [HashSet<Arc<str>>; 4],
    /// Error code → index and whether it overflowed.
    codes: HashMap<i32, (u16, bool)>,
    /// Index → the code's label value.
    code_labels: Vec<Arc<str>>,
}

impl Interner {
    pub fn new(config: &ServiceMetricsConfig) -> Interner {
        let c = config;
        let mut inner = Inner::default();
        // Code 0 (success) is always index 0 and never overflows.
        inner.codes.insert(0, (0, false));
        inner.code_labels.push(Arc::from("0"));
        Interner {
            caps: [c.max_models, c.max_model_versions, c.max_business_lines, c.max_request_types, c.max_error_codes],
            user_buckets: c.user_buckets,
            inner: RwLock::new(inner),
        }
    }

    /// Buckets of the hashed user id on the token counter (0: no label).
    pub fn user_buckets(&self) -> u16 {
        self.user_buckets
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// What `row` adds to the service metrics.
    pub fn observe(&self, row: &HotRow, cache: &mut Cache) -> Observation {
        let request_type = row.request_type.as_deref().unwrap_or(NO_REQUEST_TYPE);
        let (series, mut overflow) = self.series(cache, [&row.model_name, &row.model_version, &row.business_line, request_type]);
        let (code, code_overflow) = self.code(cache, row.error_code);
        if code_overflow {
            overflow |= CODE_BIT;
        }
        // With buckets on, an event without a user counts in bucket `n` (`none`).
        let user_bucket = match (self.user_buckets, row.user_id_hash.as_deref()) {
            (0, _) => NO_USER_BUCKET,
            (n, None) => n,
            (n, Some(hash)) => user_bucket(hash, n),
        };
        let ms = [row.total_latency_ms, nan_if_none(row.ttft_ms), nan_if_none(row.tpot_ms)];
        let stages = [nan_if_none(row.queue_wait_ms), nan_if_none(row.prefill_time_ms), nan_if_none(row.decode_time_ms)];
        let mut seconds = [f64::NAN; DURATIONS];
        for (s, v) in seconds.iter_mut().zip(ms.into_iter().chain(stages)) {
            *s = v / 1000.0;
        }
        Observation {
            series,
            code,
            overflow,
            user_bucket,
            tokens: [row.input_tokens, row.output_tokens, row.cache_prefix_tokens.unwrap_or(0)],
            seconds,
        }
    }

    fn series(&self, cache: &mut Cache, values: [&str; 4]) -> (u32, u8) {
        let hash = foldhash::fast::FixedState::with_seed(0x5e71_e5a1).hash_one(values);
        if let Some(&found) = cache.series.get(&hash) {
            return found;
        }
        let known = self.read().by_hash.get(&hash).copied();
        let found = known.unwrap_or_else(|| self.write().intern(hash, values, &self.caps));
        cache.series.insert(hash, found);
        found
    }

    fn code(&self, cache: &mut Cache, code: i32) -> (u16, bool) {
        if code == 0 {
            return (0, false);
        }
        if let Some(&found) = cache.codes.get(&code) {
            return found;
        }
        let known = self.read().codes.get(&code).copied();
        let found = known.unwrap_or_else(|| self.write().intern_code(code, self.caps[4]));
        cache.codes.insert(code, found);
        found
    }

    /// The capped label values of every series, by id.
    pub fn series_labels(&self) -> Vec<[Arc<str>; 4]> {
        self.read().series.clone()
    }

    /// The label value of every error code index.
    pub fn code_labels(&self) -> Vec<Arc<str>> {
        self.read().code_labels.clone()
    }
}

impl Inner {
    /// Interns a series first seen (another thread may have just done it).
    fn intern(&mut self, hash: u64, values: [&str; 4], caps: &[usize; 5]) -> (u32, u8) {
        if let Some(&found) = self.by_hash.get(&hash) {
            return found;
        }
        let mut overflow = 0u8;
        let capped: [Arc<str>; 4] = std::array::from_fn(|i| {
            let admitted = &mut self.admitted[i];
            if let Some(v) = admitted.get(values[i]) {
                return v.clone();
            }
            if admitted.len() < caps[i] {
                let v: Arc<str> = Arc::from(values[i]);
                admitted.insert(v.clone());
                return v;
            }
            overflow |= 1 << i;
            Arc::from(OTHER)
        });
        let next = self.series.len() as u32;
        let id = *self.by_labels.entry(capped.clone()).or_insert(next);
        if id == next {
            self.series.push(capped);
        }
        self.by_hash.insert(hash, (id, overflow));
        (id, overflow)
    }

    fn intern_code(&mut self, code: i32, cap: usize) -> (u16, bool) {
        if let Some(&found) = self.codes.get(&code) {
            return found;
        }
        // Index 0 is success; the cap counts the other codes.
        let found = if self.code_labels.len() <= cap {
            self.code_labels.push(Arc::from(code.to_string()));
            ((self.code_labels.len() - 1) as u16, false)
        } else {
            (self.other_code(), true)
        };
        self.codes.insert(code, found);
        found
    }

    /// The index of `other` among the codes, added once.
    fn other_code(&mut self) -> u16 {
        if let Some(i) = self.code_labels.iter().position(|l| &**l == OTHER) {
            return i as u16;
        }
        self.code_labels.push(Arc::from(OTHER));
        (self.code_labels.len() - 1) as u16
    }
}

fn nan_if_none(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

/// The bucket of a hashed user id (`key_id:hex`): its first 16 hex digits
/// modulo `buckets`. The hash is keyed, so a bucket says nothing about who
/// is in it; a key rotation moves every user to another bucket.
pub fn user_bucket(hash: &str, buckets: u16) -> u16 {
    let hex = hash.rsplit(':').next().unwrap_or(hash);
    let n = hex.get(..16).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or(0);
    (n % u64::from(buckets.max(1))) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interner(caps: usize) -> Interner {
        let c = ServiceMetricsConfig {
            max_models: caps,
            max_model_versions: caps,
            max_business_lines: caps,
            max_request_types: caps,
            max_error_codes: caps,
            ..ServiceMetricsConfig::default()
        };
        Interner::new(&c)
    }

    #[test]
    fn values_past_a_cap_fold_into_other_and_say_which_label_overflowed() {
        let i = interner(2);
        let mut cache = Cache::default();
        let a = i.series(&mut cache, ["m1", "v1", "search", "chat"]);
        let b = i.series(&mut cache, ["m2", "v1", "search", "chat"]);
        let c = i.series(&mut cache, ["m3", "v1", "search", "chat"]);
        let d = i.series(&mut cache, ["m4", "v1", "search", "chat"]);
        assert_eq!((a, b), ((0, 0), (1, 0)));
        assert_eq!(c, (2, 0b0001), "the third model is past a cap of 2");
        assert_eq!(d, c, "every model past the cap shares the `other` series");
        let labels = i.series_labels();
        assert_eq!(&*labels[2][0], OTHER);
        assert_eq!(&*labels[2][1], "v1");
        // A fresh cache finds the same ids under the lock.
        assert_eq!(i.series(&mut Cache::default(), ["m3", "v1", "search", "chat"]), c);
        assert_eq!(i.series(&mut Cache::default(), ["m1", "v1", "search", "chat"]), a);

        assert_eq!(i.code(&mut cache, 0), (0, false));
        assert_eq!(i.code(&mut cache, 500), (1, false));
        assert_eq!(i.code(&mut cache, 429), (2, false));
        let other = i.code(&mut cache, 503);
        assert!(other.1, "a third error code is past a cap of 2");
        assert_eq!(i.code(&mut cache, 504), other);
        assert_eq!(&*i.code_labels()[usize::from(other.0)], OTHER);
        assert_eq!(i.code_labels()[..3].iter().map(|l| &**l).collect::<Vec<_>>(), ["0", "500", "429"]);
    }

    #[test]
    fn user_buckets_spread_keyed_hashes_and_are_stable() {
        let hashes: Vec<String> = (0..10_000u64).map(|i| format!("k1:{:016x}{:048x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15), 0)).collect();
        let mut counts = [0u32; 100];
        for h in &hashes {
            counts[usize::from(user_bucket(h, 100))] += 1;
        }
        assert!(counts.iter().all(|&c| c > 50), "every bucket is used: {counts:?}");
        assert_eq!(user_bucket(&hashes[7], 100), user_bucket(&hashes[7], 100));
        assert_eq!(user_bucket("k1:00000000000000ff", 100), 255 % 100);
    }
}
