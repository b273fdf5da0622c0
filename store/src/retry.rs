//! How every inferlog daemon waits between attempts of a call that failed
//! transiently (a broker restarting, ClickHouse away, the DLQ refusing):
//! exponential backoff from [`backon`], with a sleep that a shutdown cuts
//! short so the caller can stop or start its shutdown budget at once.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use backon::{BlockingRetryable, Retryable};
use backon::{ExponentialBuilder, Sleeper};
use tokio::sync::watch;

/// Waits from `initial`, doubled after each failure up to `max`, with no
/// limit on the number of attempts (the caller's `when` decides to stop).
pub fn backoff(initial: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new().with_min_delay(initial).with_max_delay(max).without_max_times()
}

/// [`backoff`] that gives up once the waits add up to `total`.
pub fn backoff_for(initial: Duration, max: Duration, total: Duration) -> ExponentialBuilder {
    backoff(initial, max).with_total_delay(Some(total))
}

/// A backoff sleep that ends early when the shutdown flag changes to true.
/// Once it is true (or its sender is gone) the sleep runs its full length:
/// the caller's budget, not a busy loop, then decides.
#[derive(Debug, Clone)]
pub struct ShutdownSleeper(watch::Receiver<bool>);

impl ShutdownSleeper {
    pub fn new(shutdown: watch::Receiver<bool>) -> Self {
        ShutdownSleeper(shutdown)
    }
}

impl Sleeper for ShutdownSleeper {
    type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn sleep(&self, wait: Duration) -> Self::Sleep {
        let mut shutdown = self.0.clone();
        Box::pin(async move {
            if *shutdown.borrow_and_update() {
                return tokio::time::sleep(wait).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                Ok(()) = shutdown.changed() => {}
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    #[tokio::test(start_paused = true)]
    async fn waits_double_up_to_the_cap_and_retry_until_success() {
        let calls = AtomicU32::new(0);
        let waits = Mutex::new(Vec::new());
        let (_tx, rx) = watch::channel(false);
        let got = (|| async {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            if n < 5 {
                Err(n)
            } else {
                Ok(n)
            }
        })
        .retry(backoff(Duration::from_millis(100), Duration::from_millis(500)))
        .sleep(ShutdownSleeper::new(rx))
        .notify(|_, wait| waits.lock().expect("waits").push(wait))
        .await;
        assert_eq!(got, Ok(5));
        let ms: Vec<u128> = waits.into_inner().expect("waits").iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 500, 500]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_cuts_the_wait_short() {
        let (tx, rx) = watch::channel(false);
        let sleeper = ShutdownSleeper::new(rx);
        let started = tokio::time::Instant::now();
        let sleep = sleeper.sleep(Duration::from_secs(3600));
        let signal = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send(true).expect("receiver alive");
        };
        tokio::join!(sleep, signal);
        assert!(started.elapsed() < Duration::from_secs(2), "woke at {:?}", started.elapsed());
        // After the shutdown, a wait is served in full (no busy loop).
        let started = tokio::time::Instant::now();
        sleeper.sleep(Duration::from_secs(5)).await;
        assert_eq!(started.elapsed().as_secs(), 5);
    }

    #[test]
    fn a_total_limit_ends_the_retries_with_the_last_error() {
        let calls = AtomicU32::new(0);
        let got: Result<(), u32> = (|| Err(calls.fetch_add(1, Ordering::SeqCst)))
            .retry(backoff_for(Duration::from_millis(1), Duration::from_millis(4), Duration::from_millis(20)))
            .call();
        // Waits 1, 2, 4, 4, 4, 4 (19 ms) and then 4 more would pass 20 ms.
        assert_eq!(got, Err(6));
    }
}
