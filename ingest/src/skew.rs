//! Clock skew. In: an accepted event's timestamp and its Kafka message
//! timestamp (the producer client's clock, or the broker's with
//! `LogAppendTime`), or a timestamp rejection. Out: the skew, for the
//! per-topic histogram `inferlog_ingest_event_clock_skew_seconds`, and a
//! rejection message that names skew as the cause when it is one.
//!
//! Events are judged against this host's clock. An event stamped hours
//! away from its own Kafka message was stamped by a clock that is off (an
//! engine on local time, a gateway on UTC), not sent hours late: the
//! histogram shows it before events are refused, and a refusal says so.

use std::sync::Arc;

use inferlog_schema::timestamp::{format_rfc3339_ms, parse_rfc3339_ms};
use inferlog_schema::{ReasonCode, Rejection};
use prometheus::local::LocalHistogram;
use prometheus::Histogram;
use rdkafka::message::Timestamp;

/// The skew samples of one chunk of messages, per topic, observed into
/// thread-local copies of the topics' histograms and added to them once
/// per chunk (not two atomic updates per message).
#[derive(Default)]
pub struct Samples {
    locals: Vec<(Arc<str>, LocalHistogram)>,
}

impl std::fmt::Debug for Samples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Samples").field("topics", &self.locals.len()).finish()
    }
}

impl Samples {
    /// One sample of `topic`; `histogram` gives the topic's histogram the
    /// first time the chunk meets it.
    pub fn observe(&mut self, topic: &Arc<str>, histogram: impl FnOnce() -> Histogram, seconds: f64) {
        let local = match self.locals.iter().position(|(t, _)| Arc::ptr_eq(t, topic)) {
            Some(i) => &self.locals[i].1,
            None => {
                self.locals.push((topic.clone(), histogram().local()));
                &self.locals[self.locals.len() - 1].1
            }
        };
        local.observe(seconds);
    }

    /// Adds the samples to the topics' histograms.
    pub fn flush(&self) {
        for (_, local) in &self.locals {
            local.flush();
        }
    }
}

/// Skew below this is delivery delay, not a clock that is off.
const NOTABLE_MS: i64 = 60_000;

/// The Kafka timestamp of a message, in epoch ms, if it has one.
pub fn kafka_ms(timestamp: Timestamp) -> Option<i64> {
    match timestamp {
        Timestamp::CreateTime(ms) | Timestamp::LogAppendTime(ms) if ms > 0 => Some(ms),
        _ => None,
    }
}

/// Event time less Kafka time, in seconds (positive: the event claims a
/// later time than its message).
pub fn seconds(event_ms: i64, kafka_ms: i64) -> f64 {
    (event_ms - kafka_ms) as f64 / 1000.0
}

fn duration(ms: i64) -> String {
    // Whole seconds: the cause, not the noise.
    humantime::format_duration(std::time::Duration::from_secs(ms.unsigned_abs() / 1000)).to_string()
}

/// A `timestamp.out_of_range` rejection judged against this host's clock
/// (`now_ms`), with the cause named: the event's clock is off (its Kafka
/// timestamp agrees with this host), or this host's clock or the
/// producer's is (the Kafka timestamp is as far off as the event).
/// Other rejections are returned as they are.
pub fn explain(mut rejection: Rejection, kafka_ms: Option<i64>, now_ms: i64) -> Rejection {
    if rejection.reason != ReasonCode::TimestampOutOfRange {
        return rejection;
    }
    // The message starts with the event time the contract read.
    let (Some(kafka_ms), Some(event_ms)) = (kafka_ms, rejection.message.split_whitespace().next().and_then(|t| parse_rfc3339_ms(t).ok())) else {
        return rejection;
    };
    let (skew, host) = (event_ms - kafka_ms, kafka_ms - now_ms);
    let direction = if skew > 0 { "ahead of" } else { "behind" };
    if skew.abs() >= NOTABLE_MS && host.abs() < NOTABLE_MS {
        rejection.message.push_str(&format!(
            "; its Kafka timestamp {} agrees with this host's clock, so the clock that stamped the event is {} {direction} it (clock skew: an engine on local time, or an unsynchronised host)",
            format_rfc3339_ms(kafka_ms),
            duration(skew)
        ));
    } else if host.abs() >= NOTABLE_MS && skew.abs() < NOTABLE_MS {
        rejection.message.push_str(&format!(
            "; its Kafka timestamp {} is as far from this host's clock ({}): this host's clock or the producer's is off (clock skew)",
            format_rfc3339_ms(kafka_ms),
            duration(host)
        ));
    }
    rejection
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_000_000_000;
    const HOUR: i64 = 3_600_000;

    fn future(event_ms: i64) -> Rejection {
        Rejection::new(ReasonCode::TimestampOutOfRange, "timestamp", format!("{} is more than 5m in the future", format_rfc3339_ms(event_ms)))
    }

    #[test]
    fn an_event_clock_hours_off_its_own_message_is_named_as_skew() {
        let r = explain(future(NOW + 8 * HOUR), Some(NOW - 2_000), NOW);
        assert!(r.message.contains("clock skew") && r.message.contains("8h") && r.message.contains("ahead of"), "{}", r.message);
        let host = explain(future(NOW + 8 * HOUR), Some(NOW + 8 * HOUR - 500), NOW);
        assert!(host.message.contains("this host's clock or the producer's is off"), "{}", host.message);
        let plain = explain(future(NOW + 8 * HOUR), None, NOW);
        assert_eq!(plain, future(NOW + 8 * HOUR), "no Kafka timestamp, nothing to add");
        let other = Rejection::new(ReasonCode::FieldMissing, "model_name", "missing");
        assert_eq!(explain(other.clone(), Some(NOW), NOW), other);
        assert_eq!(seconds(NOW + 1_500, NOW), 1.5);
        assert_eq!(kafka_ms(Timestamp::NotAvailable), None);
        assert_eq!(kafka_ms(Timestamp::CreateTime(NOW)), Some(NOW));
    }

    #[test]
    fn samples_reach_the_histogram_once_flushed() {
        let histogram = Histogram::with_opts(prometheus::HistogramOpts::new("s", "s").buckets(vec![-60.0, 0.0, 60.0])).expect("histogram");
        let topic: Arc<str> = Arc::from("events");
        let mut samples = Samples::default();
        for v in [-7200.0, -0.5, 0.2] {
            samples.observe(&topic, || histogram.clone(), v);
        }
        assert_eq!(histogram.get_sample_count(), 0, "nothing before the flush");
        samples.flush();
        assert_eq!(histogram.get_sample_count(), 3);
        assert_eq!(histogram.get_sample_sum(), -7200.3);
    }
}
