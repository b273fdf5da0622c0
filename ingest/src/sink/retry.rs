//! The sink's one retry policy, used by every write of the daemon's writer
//! and of `dlq replay`. In: an attempt (an insert, a replay-log entry, a
//! DLQ send), told whether it is a retry so an insert can check first
//! whether the attempt before landed. Out: the first success, or the error
//! that ended it: a permanent one at once; a transient one once the
//! policy's limit is reached (the daemon's shutdown budget, or a command's
//! total wait). Every failure is emitted as [`InsertFailed`]; a daemon's
//! attempts each check the rebalance fence first ([`FlushGate::fenced`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inferlog_store::retry::{self, Retryable};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::IngestError;
use crate::internal_events::{InsertFailed, InternalEvent};
use crate::metrics::Metrics;
use crate::source::FlushGate;

/// The daemon's shutdown budget: started by the first wait after a
/// SIGTERM (or by the pipeline when it stops), `timeout` long; no retry
/// waits past it. Clones share it. Kept on tokio's clock (the same
/// instant as the system's, and one a test can advance).
#[derive(Debug, Clone)]
pub struct ShutdownBudget {
    deadline: Arc<Mutex<Option<Instant>>>,
    timeout: Duration,
    shutdown: watch::Receiver<bool>,
}

impl ShutdownBudget {
    pub fn new(timeout: Duration, shutdown: watch::Receiver<bool>) -> ShutdownBudget {
        ShutdownBudget { deadline: Arc::default(), timeout, shutdown }
    }

    /// Starts the budget if it has not started; its deadline.
    pub fn start(&self) -> Option<std::time::Instant> {
        self.started().map(Instant::into_std)
    }

    fn started(&self) -> Option<Instant> {
        let mut deadline = self.deadline.lock().ok()?;
        Some(*deadline.get_or_insert_with(|| Instant::now() + self.timeout))
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline.lock().ok().and_then(|d| *d)
    }

    /// What is left of the budget, once it has started.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline().map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether a wait of `wait` still fits: a SIGTERM starts the budget at
    /// the first wait after it; past it the daemon exits without
    /// committing, and the uncommitted messages are re-read on restart.
    fn fits(&self, wait: Duration) -> bool {
        let deadline = if *self.shutdown.borrow() { self.started() } else { self.deadline() };
        deadline.is_none_or(|deadline| Instant::now() + wait <= deadline)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// When a policy stops retrying a transient error.
#[derive(Debug, Clone)]
enum Limit {
    /// The daemon's: when the next wait would overrun the shutdown budget
    /// ([`IngestError::ShutdownTimeout`]).
    Budget(ShutdownBudget),
    /// A command's: once the waits add up to this (the last error).
    Total(Duration),
}

/// Exponential backoff from `initial` to `max` over transient errors
/// ([`IngestError::retry_in_place`]); a shutdown cuts a wait short.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    initial: Duration,
    max: Duration,
    shutdown: watch::Receiver<bool>,
    limit: Limit,
    fence: Option<Arc<FlushGate>>,
    metrics: Metrics,
}

impl RetryPolicy {
    /// The daemon's policy: retried until `budget` would be overrun, every
    /// attempt checking `fence` first.
    pub fn daemon(backoff: (Duration, Duration), budget: ShutdownBudget, fence: Arc<FlushGate>, metrics: Metrics) -> RetryPolicy {
        let shutdown = budget.shutdown.clone();
        RetryPolicy { initial: backoff.0, max: backoff.1, shutdown, limit: Limit::Budget(budget), fence: Some(fence), metrics }
    }

    /// A command's policy: given up once the waits add up to `total`.
    pub fn command(backoff: (Duration, Duration), total: Duration, metrics: Metrics) -> RetryPolicy {
        // No shutdown signal: the sender is dropped, so a wait runs its length.
        let (_, shutdown) = watch::channel(false);
        RetryPolicy { initial: backoff.0, max: backoff.1, shutdown, limit: Limit::Total(total), fence: None, metrics }
    }

    /// Runs `op` until it succeeds or the policy gives up; `op` learns
    /// whether this attempt is a retry.
    pub async fn run<T, F, Fut>(&self, what: &'static str, mut op: F) -> Result<T, IngestError>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<T, IngestError>>,
    {
        // Atomics, not Cells: the future runs on the multi-threaded runtime.
        let attempt = AtomicU32::new(0);
        let first = AtomicBool::new(true);
        let out_of_time = AtomicBool::new(false);
        // Every attempt, the first too, checks the fence before it starts.
        let fenced_op = || {
            let fenced = self.fence.as_ref().map_or(Ok(()), |gate| gate.fenced());
            let attempt = op(!first.swap(false, Ordering::Relaxed));
            async move {
                fenced?;
                attempt.await
            }
        };
        let backoff = match &self.limit {
            Limit::Budget(_) => retry::backoff(self.initial, self.max),
            Limit::Total(total) => retry::backoff_for(self.initial, self.max, *total),
        };
        let result = fenced_op
            .retry(backoff)
            .sleep(retry::ShutdownSleeper::new(self.shutdown.clone()))
            .when(IngestError::retry_in_place)
            .adjust(|_, wait| {
                let fits = match &self.limit {
                    Limit::Budget(budget) => wait.filter(|w| budget.fits(*w)),
                    Limit::Total(_) => return wait,
                };
                out_of_time.store(fits.is_none(), Ordering::Relaxed);
                fits
            })
            .notify(|error, backoff| {
                let attempt = attempt.fetch_add(1, Ordering::Relaxed) + 1;
                InsertFailed { what, error, attempt, backoff }.emit(&self.metrics);
            })
            .await;
        match (result, &self.limit) {
            (Err(_), Limit::Budget(budget)) if out_of_time.load(Ordering::Relaxed) => Err(IngestError::ShutdownTimeout(budget.timeout)),
            (result, _) => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transient() -> IngestError {
        IngestError::ClickHouse { operation: "insert", table: "t".into(), source: clickhouse::error::Error::TimedOut }
    }

    fn permanent() -> IngestError {
        IngestError::Config("refused".into())
    }

    /// Runs `policy` on an attempt that always fails with `error()`: the
    /// result and the number of attempts.
    async fn always_failing(policy: &RetryPolicy, error: fn() -> IngestError) -> (Result<(), IngestError>, u32) {
        let calls = AtomicU32::new(0);
        let got = policy
            .run("insert", |_| {
                calls.fetch_add(1, Ordering::Relaxed);
                async move { Err(error()) }
            })
            .await;
        (got, calls.load(Ordering::Relaxed))
    }

    /// Transient failures are retried and the attempts after the first
    /// are told they are retries; a permanent one ends the run at once.
    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_as_retries_and_a_permanent_one_ends_it() {
        let policy = RetryPolicy::command((Duration::from_millis(10), Duration::from_millis(40)), Duration::from_secs(60), Metrics::new());
        let seen = Mutex::new(Vec::new());
        let got = policy
            .run("insert", |retry| {
                let n = {
                    let mut seen = seen.lock().expect("seen");
                    seen.push(retry);
                    seen.len()
                };
                async move {
                    if n < 4 {
                        Err(transient())
                    } else {
                        Ok(n)
                    }
                }
            })
            .await;
        assert_eq!(got.ok(), Some(4));
        assert_eq!(*seen.lock().expect("seen"), [false, true, true, true]);
        let (got, calls) = always_failing(&policy, permanent).await;
        assert!(matches!(got, Err(IngestError::Config(_))), "{got:?}");
        assert_eq!(calls, 1, "a permanent error is not retried");
    }

    /// A command gives up with the last error once its waits add up to
    /// its total; a failure each time counts in the insert-errors metric.
    #[tokio::test(start_paused = true)]
    async fn a_command_gives_up_after_its_total_wait_with_the_last_error() {
        let metrics = Metrics::new();
        let policy = RetryPolicy::command((Duration::from_millis(100), Duration::from_millis(100)), Duration::from_millis(450), metrics.clone());
        let (got, calls) = always_failing(&policy, transient).await;
        assert!(matches!(got, Err(IngestError::ClickHouse { .. })), "{got:?}");
        // Waits of 100 ms: four fit in 450 ms, so five attempts.
        assert_eq!(calls, 5);
        assert_eq!(metrics.insert_errors.get(), 4);
    }

    /// After a SIGTERM, a wait that would overrun the shutdown budget ends
    /// the run with ShutdownTimeout (the fence is held by the writer's
    /// tests through the daemon).
    #[tokio::test(start_paused = true)]
    async fn the_daemon_stops_at_its_budget() {
        let (tx, rx) = watch::channel(false);
        let budget = ShutdownBudget::new(Duration::from_millis(350), rx);
        let gate = Arc::new(FlushGate::default());
        let policy = RetryPolicy::daemon((Duration::from_millis(100), Duration::from_millis(100)), budget.clone(), gate, Metrics::new());
        tx.send(true).expect("receiver alive");
        let (got, calls) = always_failing(&policy, transient).await;
        assert!(matches!(got, Err(IngestError::ShutdownTimeout(t)) if t == Duration::from_millis(350)), "{got:?}");
        assert_eq!(calls, 4, "three waits of 100 ms fit 350 ms");
        assert!(budget.remaining().is_some(), "the first wait after the SIGTERM started the budget");
    }
}
