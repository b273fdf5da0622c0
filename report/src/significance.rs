//! Whether a difference between two sets of requests is larger than their
//! counts can explain. In: counts or histograms of two samples (A, B). Out:
//! a z statistic (`None` when the counts are too few for the normal
//! approximation) and a [`Shift`].
//!
//! - Shares (error shares): the pooled two-proportion z-test.
//! - Quantiles (p50, p99 of a latency): Mood's quantile test (Brown–Mood),
//!   which works on histograms: the pooled sample's q-quantile splits both
//!   samples, and the shares above it are compared with the two-proportion
//!   test. Under "same distribution", both shares are about 1 − q.
//! - Paired requests (shadow traffic): the sign test on the pairs that
//!   differ (for errors, McNemar's test, which is the same test).
//!
//! A view marks dozens of cells, so a mark needs |z| ≥ [`Z_CRITICAL`]
//! (two-sided α = 0.001): about one false mark in a thousand cells.

use inferlog_schema::histogram::{bucket, bucket_value, Histogram};

/// |z| at two-sided α = 0.001.
pub const Z_CRITICAL: f64 = 3.29;

/// The smallest expected count on each side for the normal approximation.
const MIN_EXPECTED: f64 = 5.0;

/// How B differs from A.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shift {
    /// B's figure is higher, beyond what the counts explain.
    Higher,
    /// B's figure is lower, beyond what the counts explain.
    Lower,
    /// Within what the counts explain.
    Same,
    /// Too few requests to tell.
    TooFew,
}

impl Shift {
    pub fn of(z: Option<f64>) -> Shift {
        match z {
            None => Shift::TooFew,
            Some(z) if z >= Z_CRITICAL => Shift::Higher,
            Some(z) if z <= -Z_CRITICAL => Shift::Lower,
            Some(_) => Shift::Same,
        }
    }
}

/// z of B's share `x_b / n_b` against A's `x_a / n_a` (pooled variance);
/// `None` when either side expects fewer than 5 hits or misses.
pub fn proportions(x_a: u64, n_a: u64, x_b: u64, n_b: u64) -> Option<f64> {
    if n_a == 0 || n_b == 0 {
        return None;
    }
    let (na, nb) = (n_a as f64, n_b as f64);
    let pooled = (x_a + x_b) as f64 / (na + nb);
    let enough = [na, nb].iter().all(|n| n * pooled >= MIN_EXPECTED && n * (1.0 - pooled) >= MIN_EXPECTED);
    if !enough {
        return None;
    }
    let se = (pooled * (1.0 - pooled) * (1.0 / na + 1.0 / nb)).sqrt();
    Some((x_b as f64 / nb - x_a as f64 / na) / se)
}

/// Mood's quantile test: z of B's share above the pooled `q`-quantile
/// against A's (positive: B is higher at that quantile).
///
/// A histogram cannot split the bucket the quantile falls in, so the split
/// is either just above that bucket or just below it, whichever leaves the
/// pooled share above it closer to 1 − q and some requests on both sides
/// (with many requests in one bucket, as when a whole tail moved to one
/// value, "above" alone may hold none of them). The choice looks at the
/// pooled sample only, as the test's split does.
pub fn quantile_shift(a: &Histogram, b: &Histogram, q: f64) -> Option<f64> {
    let mut pooled = a.clone();
    pooled.merge(b);
    let quantile = pooled.quantile(q)?;
    let target = (1.0 - q) * pooled.count() as f64;
    // Just below the quantile's bucket: the answer of the bucket before it (zeros: below everything).
    let below = if quantile > 0.0 { bucket_value(bucket(quantile) - 1) } else { -1.0 };
    let n = pooled.count();
    let distance = |split: &f64| (pooled.count_above(*split) as f64 - target).abs();
    // A split with nothing above it (or nothing below) tests nothing; of equals, the lower split.
    let split =
        [below, quantile].into_iter().filter(|x| (1..n).contains(&pooled.count_above(*x))).min_by(|x, y| distance(x).total_cmp(&distance(y)))?;
    proportions(a.count_above(split), a.count(), b.count_above(split), b.count())
}

/// The sign test: z of `higher` pairs (B above A) against `lower` ones;
/// `None` under 10 differing pairs.
pub fn sign_test(higher: u64, lower: u64) -> Option<f64> {
    let n = higher + lower;
    (n >= 2 * MIN_EXPECTED as u64).then(|| (higher as f64 - lower as f64) / (n as f64).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportions_follow_the_textbook_z() {
        // 120/1000 against 80/1000: pooled 0.1, se = sqrt(0.1·0.9·0.002) = 0.013416…
        let z = proportions(80, 1000, 120, 1000).expect("enough");
        assert!((z - 0.04 / (0.1_f64 * 0.9 * 0.002).sqrt()).abs() < 1e-9, "{z}");
        assert_eq!(Shift::of(Some(z)), Shift::Same, "z = 2.98 is below 3.29");
        assert_eq!(Shift::of(proportions(80, 2000, 160, 2000)), Shift::Higher);
        assert_eq!(Shift::of(proportions(160, 2000, 80, 2000)), Shift::Lower);
        assert_eq!(proportions(1, 40, 2, 40), None, "3 hits in 80: too few expected");
        assert_eq!(Shift::of(None), Shift::TooFew);
    }

    #[test]
    fn a_slower_tail_shifts_the_upper_quantile_only() {
        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        for i in 0..10_000 {
            let v = 100.0 + f64::from(i % 100);
            a.add(v);
            // B: the same body, but its slowest 3% take 10 s.
            b.add(if i % 100 >= 97 { 10_000.0 } else { v });
        }
        assert_eq!(Shift::of(quantile_shift(&a, &b, 0.99)), Shift::Higher);
        assert_eq!(Shift::of(quantile_shift(&b, &a, 0.99)), Shift::Lower);
        assert_eq!(Shift::of(quantile_shift(&a, &b, 0.5)), Shift::Same);
        assert_eq!(Shift::of(quantile_shift(&a, &a.clone(), 0.99)), Shift::Same);
        assert_eq!(quantile_shift(&Histogram::new(), &b, 0.5), None);
    }

    #[test]
    fn the_sign_test_needs_ten_differing_pairs() {
        assert_eq!(sign_test(5, 4), None);
        assert_eq!(sign_test(100, 0), Some(10.0));
        assert_eq!(Shift::of(sign_test(60, 40)), Shift::Same, "z = 2");
    }
}
