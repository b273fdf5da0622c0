//! Mergeable latency histograms of the aggregates tier.
//!
//! In: durations in milliseconds. Out: a histogram that answers any
//! quantile within [`RELATIVE_ERROR`] of the exact floor-rank value, and
//! that merges with another by adding bucket counts, so a quantile over 30
//! days is the quantile of 30 merged daily histograms.
//!
//! The mapping is DDSketch's logarithmic one: with
//! γ = (1 + α) / (1 − α), bucket `i` holds the values in (γ^(i−1), γ^i]
//! and answers 2·γ^i / (γ + 1), which is within α of every value in it.
//! Zero (and any non-positive value) has its own count and answers 0.
//! Positive values under [`MIN_VALUE`] count in [`MIN_VALUE`]'s bucket, and
//! values past γ^[`MAX_INDEX`] (about 10^282) in the top bucket.
//!
//! Postgres stores a histogram as `bigint[]`, see [`Histogram::encode`]:
//! `{first bucket index, zero count, count of the first bucket, count of
//! the next, …}`. The catalog migration defines `inferlog_merge` and
//! `inferlog_quantile` on that form with the same constants; this module is
//! the reference they are tested against.

/// α: the largest relative error of any quantile.
pub const RELATIVE_ERROR: f64 = 0.01;

/// γ = (1 + α) / (1 − α), the ratio of a bucket's upper to lower bound.
pub const GAMMA: f64 = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR);

/// The smallest duration kept apart from its neighbours: 1 µs.
pub const MIN_VALUE: f64 = 0.001;

/// The highest bucket index (values above γ^32767 ms count there).
pub const MAX_INDEX: i32 = 32767;

/// The bucket index of a positive `value`: the `i` with γ^(i−1) < value ≤ γ^i.
pub fn bucket(value: f64) -> i32 {
    ((value.max(MIN_VALUE).ln() / GAMMA.ln()).ceil() as i32).min(MAX_INDEX)
}

/// The value bucket `index` answers: within α of everything in it.
pub fn bucket_value(index: i32) -> f64 {
    2.0 * GAMMA.powi(index) / (GAMMA + 1.0)
}

/// A histogram that does not decode: the encoded array and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an inferlog histogram ({reason}): {encoded:?}")]
pub struct DecodeError {
    pub encoded: Vec<i64>,
    pub reason: &'static str,
}

/// Counts per logarithmic bucket, plus the zeros. Serialized in its
/// Postgres form ([`Histogram::encode`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "Vec<i64>", try_from = "Vec<i64>")]
pub struct Histogram {
    zeros: u64,
    /// The index of `counts[0]`.
    offset: i32,
    counts: Vec<u64>,
}

/// `a += b` merges `b` into `a` (so a struct of totals and histograms
/// derives its field-wise `+=`).
impl std::ops::AddAssign for Histogram {
    fn add_assign(&mut self, other: Histogram) {
        self.merge(&other);
    }
}

impl From<Histogram> for Vec<i64> {
    fn from(h: Histogram) -> Vec<i64> {
        h.encode()
    }
}

impl TryFrom<Vec<i64>> for Histogram {
    type Error = DecodeError;

    fn try_from(encoded: Vec<i64>) -> Result<Histogram, DecodeError> {
        Histogram::decode(&encoded)
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram::default()
    }

    /// Counts one value.
    pub fn add(&mut self, value: f64) {
        if value > 0.0 {
            self.add_bucket(Some(bucket(value)), 1);
        } else {
            self.add_bucket(None, 1);
        }
    }

    /// Counts `n` values of bucket `index` (`None`: zeros).
    pub fn add_bucket(&mut self, index: Option<i32>, n: u64) {
        let Some(index) = index else {
            self.zeros += n;
            return;
        };
        if self.counts.is_empty() {
            self.offset = index;
            self.counts.push(0);
        } else if index < self.offset {
            let grow = (self.offset - index) as usize;
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = index;
        } else if (index - self.offset) as usize >= self.counts.len() {
            self.counts.resize((index - self.offset) as usize + 1, 0);
        }
        self.counts[(index - self.offset) as usize] += n;
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        self.zeros += other.zeros;
        for (i, &n) in other.counts.iter().enumerate() {
            if n > 0 {
                self.add_bucket(Some(other.offset + i as i32), n);
            }
        }
    }

    /// How many values were counted.
    pub fn count(&self) -> u64 {
        self.zeros + self.counts.iter().sum::<u64>()
    }

    /// How many values lie above `value`'s bucket: the values greater than
    /// `value`, up to the values sharing its bucket (within α of it).
    pub fn count_above(&self, value: f64) -> u64 {
        if value <= 0.0 {
            return self.counts.iter().sum();
        }
        let first = bucket(value) + 1 - self.offset;
        self.counts.iter().skip(first.max(0) as usize).sum()
    }

    /// The floor-rank `q`-quantile (the value at 0-based position
    /// floor(q·n), as the exact aggregates define it), within α; `None`
    /// when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64) as u64).min(n - 1);
        if rank < self.zeros {
            return Some(0.0);
        }
        let mut seen = self.zeros;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if rank < seen {
                return Some(bucket_value(self.offset + i as i32));
            }
        }
        None
    }

    /// The Postgres form: `[offset, zeros, counts…]`, trailing and leading
    /// empty buckets trimmed.
    pub fn encode(&self) -> Vec<i64> {
        let first = self.counts.iter().position(|&c| c > 0).unwrap_or(0);
        let last = self.counts.iter().rposition(|&c| c > 0).map_or(first, |l| l + 1);
        let mut out = Vec::with_capacity(2 + last - first);
        out.push(i64::from(self.offset) + first as i64);
        out.push(self.zeros as i64);
        out.extend(self.counts[first..last].iter().map(|&c| c as i64));
        out
    }

    /// Reads [`Histogram::encode`]'s form back.
    pub fn decode(encoded: &[i64]) -> Result<Histogram, DecodeError> {
        let fail = |reason| DecodeError { encoded: encoded.to_vec(), reason };
        let [offset, zeros, counts @ ..] = encoded else { return Err(fail("fewer than two elements")) };
        let offset = i32::try_from(*offset).map_err(|_| fail("offset out of range"))?;
        if *zeros < 0 || counts.iter().any(|&c| c < 0) {
            return Err(fail("a negative count"));
        }
        Ok(Histogram { zeros: *zeros as u64, offset, counts: counts.iter().map(|&c| c as u64).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn exact(values: &mut [f64], q: f64) -> f64 {
        values.sort_by(f64::total_cmp);
        values[((q * values.len() as f64) as usize).min(values.len() - 1)]
    }

    #[test]
    fn a_bucket_holds_values_above_its_lower_and_up_to_its_upper_bound() {
        for i in [-300, -1, 0, 1, 42, 660] {
            let upper = GAMMA.powi(i);
            assert_eq!(bucket(upper * (1.0 - 1e-12)), i, "just under γ^{i}");
            assert_eq!(bucket(upper * (1.0 + 1e-9)), i + 1, "just over γ^{i}");
            let v = bucket_value(i);
            assert!(((v - upper) / upper).abs() <= RELATIVE_ERROR + 1e-12);
            let lower = GAMMA.powi(i - 1);
            assert!(((v - lower) / lower).abs() <= RELATIVE_ERROR + 1e-12);
        }
        assert_eq!(bucket(1e-9), bucket(MIN_VALUE));
        assert_eq!(bucket(f64::MAX), MAX_INDEX);
    }

    #[test]
    fn values_above_a_value_are_counted_from_the_next_bucket() {
        let mut h = Histogram::new();
        for v in [0.0, 0.0, 1.0, 10.0, 10.05, 11.0, 500.0] {
            h.add(v);
        }
        assert_eq!(h.count_above(0.0), 5, "every positive value");
        assert_eq!(h.count_above(-1.0), 5);
        assert_eq!(h.count_above(10.0), 2, "10.05 shares 10's bucket; 11 and 500 are above it");
        assert_eq!(h.count_above(bucket_value(bucket(11.0))), 1, "a quantile's answer counts its own bucket as not above");
        assert_eq!(h.count_above(1000.0), 0);
        assert_eq!(h.count_above(0.5), 5, "below the lowest bucket: all positive values");
    }

    #[test]
    fn zeros_and_empty_histograms() {
        let mut h = Histogram::new();
        assert_eq!(h.quantile(0.5), None);
        assert_eq!(h.encode(), vec![0, 0]);
        h.add(0.0);
        h.add(0.0);
        h.add(10.0);
        assert_eq!(h.quantile(0.5), Some(0.0));
        assert!((h.quantile(0.99).expect("value") - 10.0).abs() / 10.0 <= RELATIVE_ERROR);
        assert_eq!(Histogram::decode(&h.encode()), Ok(h));
        assert!(Histogram::decode(&[1]).is_err());
        assert!(Histogram::decode(&[1, 0, -3]).is_err());
    }

    proptest! {
        #[test]
        fn every_quantile_of_a_merge_is_within_alpha(
            days in prop::collection::vec(prop::collection::vec(prop_oneof![Just(0.0), 1e-3..1.0f64, 1.0..600_000.0f64], 1..300), 1..6),
            q in 0.0..=1.0f64,
        ) {
            let mut merged = Histogram::new();
            let mut all = Vec::new();
            for day in &days {
                let mut h = Histogram::new();
                for &v in day {
                    h.add(v);
                }
                // Through the Postgres form and back, as a stored day is read.
                merged.merge(&Histogram::decode(&h.encode()).expect("round trip"));
                all.extend_from_slice(day);
            }
            prop_assert_eq!(merged.count(), all.len() as u64);
            let want = exact(&mut all, q);
            let got = merged.quantile(q).expect("not empty");
            if want == 0.0 {
                prop_assert_eq!(got, 0.0);
            } else {
                prop_assert!(((got - want) / want).abs() <= RELATIVE_ERROR + 1e-12, "q={} want {} got {}", q, want, got);
            }
        }
    }
}
