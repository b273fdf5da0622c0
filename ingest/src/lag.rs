//! Lag reporting. In: the consumer's assignment and positions, and the
//! broker's high watermarks, every few seconds. Out: the
//! `inferlog_ingest_consumer_lag` gauge per partition. Runs as its own
//! task, off the pipeline's loop: a slow or absent broker delays the
//! gauge, never the ingest.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer as _;
use tokio::sync::watch;

use crate::internal_events::{ConsumerLag, InternalEvent};
use crate::metrics::Metrics;
use crate::source::Consumer;

/// How often the lag is sampled.
const EVERY: Duration = Duration::from_secs(5);

/// Starts the lag task; it ends at shutdown.
pub fn spawn(consumer: Arc<Consumer>, metrics: Metrics, mut shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval_at((Instant::now() + Duration::from_secs(2)).into(), EVERY);
        // After a long check, one check rather than a burst.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = ticker.tick() => {
                    let consumer = consumer.clone();
                    let Ok(lags) = tokio::task::spawn_blocking(move || lags(&consumer)).await else { continue };
                    for (topic, partition, lag) in lags {
                        ConsumerLag { topic: &topic, partition, lag }.emit(&metrics);
                    }
                }
            }
        }
    })
}

/// Each assigned partition's lag: the high watermark less the position.
/// Blocking (a broker round trip per partition).
fn lags(consumer: &Consumer) -> Vec<(String, i32, i64)> {
    let (Ok(assignment), Ok(positions)) = (consumer.assignment(), consumer.position()) else { return Vec::new() };
    let mut lags = Vec::with_capacity(assignment.count());
    for e in assignment.elements() {
        let (topic, partition) = (e.topic(), e.partition());
        let Ok((_, high)) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(1)) else { continue };
        let position = positions.find_partition(topic, partition).and_then(|p| p.offset().to_raw());
        lags.push((topic.to_owned(), partition, lag(high, position)));
    }
    lags
}

/// A partition's lag: the high watermark less the position; 0 before the
/// position is known (librdkafka reports a negative logical offset then).
fn lag(high: i64, position: Option<i64>) -> i64 {
    high - position.filter(|o| *o >= 0).unwrap_or(high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_what_is_left_to_read_once_the_position_is_known() {
        assert_eq!(lag(100, Some(40)), 60);
        assert_eq!(lag(100, Some(100)), 0);
        assert_eq!(lag(100, None), 0);
        assert_eq!(lag(100, Some(-1001)), 0, "OFFSET_INVALID: not fetched yet");
    }
}
