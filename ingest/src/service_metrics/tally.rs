//! What stored events add to the service metrics. In: the
//! [`Observation`] of each event the pipeline stores, and later the
//! tallies of a batch once it is durable. Out: a [`Tally`] per partition of
//! the batch filling (so a revoked partition's part is dropped with its
//! rows), added into the exporter's totals only once the batch is durable:
//! an event counts once, when it is stored, never for a batch that was
//! dropped or read again.

/// Histograms per series, in this order.
pub const DURATIONS: usize = 6;

/// Most buckets a histogram has, `+Inf` included.
const MAX_BUCKETS: usize = 14;

/// Each histogram's name, help and upper bounds (seconds).
pub const HISTOGRAMS: [(&str, &str, &[f64]); DURATIONS] = [
    (
        "inferlog_service_request_duration_seconds",
        "End-to-end request latency (total_latency_ms) of stored events",
        &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
    ),
    (
        "inferlog_service_time_to_first_token_seconds",
        "Time to first token of stored events",
        &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
    ),
    (
        "inferlog_service_time_per_output_token_seconds",
        "Time per output token of stored events",
        &[0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5],
    ),
    ("inferlog_service_queue_seconds", "Time stored events waited in the queue", STAGE_BOUNDS),
    ("inferlog_service_prefill_seconds", "Prefill time of stored events", STAGE_BOUNDS),
    ("inferlog_service_decode_seconds", "Decode time of stored events", STAGE_BOUNDS),
];

const STAGE_BOUNDS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Token types, in the order of [`Observation::tokens`].
pub const TOKEN_TYPES: [&str; 3] = ["input", "output", "cached"];

/// [`Observation::user_bucket`] of an event without one.
pub const NO_USER_BUCKET: u16 = u16::MAX;

/// What one stored event adds: primitives only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Series id (capped labels).
    pub series: u32,
    /// Error code index (0: success, `status="ok"`).
    pub code: u16,
    /// Labels folded into `other`, one bit each in the order of `LABELS`.
    pub overflow: u8,
    pub user_bucket: u16,
    /// Input, output and cached (reused prefix) tokens.
    pub tokens: [u32; 3],
    /// Total, TTFT, TPOT, queue, prefill, decode; NaN when absent.
    pub seconds: [f64; DURATIONS],
}

/// One histogram: counts per bucket (not cumulative; the last is `+Inf`) and the sum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Hist {
    pub counts: [u64; MAX_BUCKETS],
    pub sum: f64,
}

impl Hist {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        // Prometheus buckets are `le`: v goes to the first bound >= v.
        self.counts[bounds.partition_point(|b| *b < v)] += 1;
        self.sum += v;
    }

    fn add(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
        self.sum += other.sum;
    }
}

/// One series' figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeriesTally {
    pub histograms: [Hist; DURATIONS],
    /// Requests per error code index (index 0: success).
    pub requests: Vec<u64>,
    pub tokens: [u64; 3],
    /// Tokens per user bucket (only with user buckets on).
    pub user_tokens: Vec<[u64; 3]>,
}

/// Figures per series, and how many events overflowed each label.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    pub series: Vec<SeriesTally>,
    pub overflow: [u64; 5],
}

impl Tally {
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    pub fn observe(&mut self, o: &Observation) {
        let id = o.series as usize;
        if self.series.len() <= id {
            self.series.resize_with(id + 1, SeriesTally::default);
        }
        let s = &mut self.series[id];
        for ((hist, (_, _, bounds)), v) in s.histograms.iter_mut().zip(HISTOGRAMS).zip(o.seconds) {
            if !v.is_nan() {
                hist.observe(bounds, v);
            }
        }
        let code = usize::from(o.code);
        if s.requests.len() <= code {
            s.requests.resize(code + 1, 0);
        }
        s.requests[code] += 1;
        for (t, n) in s.tokens.iter_mut().zip(o.tokens) {
            *t += u64::from(n);
        }
        if o.user_bucket != NO_USER_BUCKET {
            let b = usize::from(o.user_bucket);
            if s.user_tokens.len() <= b {
                s.user_tokens.resize(b + 1, [0; 3]);
            }
            for (t, n) in s.user_tokens[b].iter_mut().zip(o.tokens) {
                *t += u64::from(n);
            }
        }
        for (bit, count) in self.overflow.iter_mut().enumerate() {
            if o.overflow & (1 << bit) != 0 {
                *count += 1;
            }
        }
    }

    /// Adds `other`'s figures to these.
    pub fn add(&mut self, other: &Tally) {
        if self.series.len() < other.series.len() {
            self.series.resize_with(other.series.len(), SeriesTally::default);
        }
        for (a, b) in self.series.iter_mut().zip(&other.series) {
            for (h, o) in a.histograms.iter_mut().zip(&b.histograms) {
                h.add(o);
            }
            add_counts(&mut a.requests, &b.requests, |x, y| *x += y);
            for (t, n) in a.tokens.iter_mut().zip(b.tokens) {
                *t += n;
            }
            add_counts(&mut a.user_tokens, &b.user_tokens, |x, y| {
                for (t, n) in x.iter_mut().zip(y) {
                    *t += n;
                }
            });
        }
        for (a, b) in self.overflow.iter_mut().zip(other.overflow) {
            *a += b;
        }
    }
}

fn add_counts<T: Default + Clone + Copy>(into: &mut Vec<T>, from: &[T], add: impl Fn(&mut T, T)) {
    if into.len() < from.len() {
        into.resize(from.len(), T::default());
    }
    for (a, b) in into.iter_mut().zip(from) {
        add(a, *b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observation(series: u32, total_s: f64) -> Observation {
        let mut seconds = [f64::NAN; DURATIONS];
        seconds[0] = total_s;
        Observation { series, code: 0, overflow: 0, user_bucket: NO_USER_BUCKET, tokens: [10, 5, 2], seconds }
    }

    #[test]
    fn bounds_fit_the_buckets_and_rise() {
        for (name, _, bounds) in HISTOGRAMS {
            assert!(bounds.len() < MAX_BUCKETS, "{name}");
            assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{name}");
        }
    }

    /// A value on a bound counts in that bound's bucket (`le`); past the
    /// last bound, in `+Inf`; absent durations count nowhere.
    #[test]
    fn values_land_in_le_buckets_and_tallies_add_up() {
        let mut t = Tally::default();
        for v in [0.05, 0.0500001, 61.0, 0.0] {
            t.observe(&observation(1, v));
        }
        let h = &t.series[1].histograms[0];
        assert_eq!(h.counts[0], 2, "0 and 0.05 are <= 0.05");
        assert_eq!(h.counts[1], 1, "just above 0.05");
        assert_eq!(h.counts[10], 1, "past 60 s: +Inf");
        assert_eq!(t.series[1].histograms[1].counts.iter().sum::<u64>(), 0, "no TTFT given");
        assert_eq!(t.series[1].tokens, [40, 20, 8]);
        assert_eq!(t.series[1].requests, vec![4]);

        let mut error = observation(0, 1.0);
        error.code = 3;
        error.overflow = 0b1_0001;
        error.user_bucket = 7;
        let mut other = Tally::default();
        other.observe(&error);
        let mut sum = t.clone();
        sum.add(&other);
        assert_eq!(sum.series[0].requests, vec![0, 0, 0, 1]);
        assert_eq!(sum.series[0].user_tokens[7], [10, 5, 2]);
        assert_eq!(sum.overflow, [1, 0, 0, 0, 1]);
        assert_eq!(sum.series[1], t.series[1]);
        let mut twice = sum.clone();
        twice.add(&sum);
        assert_eq!(twice.series[1].histograms[0].counts[0], 4);
        assert!((twice.series[1].histograms[0].sum - 2.0 * t.series[1].histograms[0].sum).abs() < 1e-9);
    }
}
