//! The commit stage. In: a batch the write stage finished ([`Written`])
//! and the write's result. Out: on success, its events counted in the
//! service metrics, the offsets of the partitions this member still owns
//! committed (last + 1), its rows and rejects counted; on failure the
//! error, and nothing committed.
//!
//! A commit that fails outside a shutdown loses nothing (the next batch's
//! commit covers it, and a partition's next reader skips durable rows by
//! the replay log). At shutdown the last commit is retried within the
//! budget while the consumer is served, since a rebalance in progress
//! refuses commits until it completes; a failure then ends the run (exit
//! 75). It owns the broker's commit, the budget and its counts; what it
//! needs of the source stage (ownership, a wait that serves the consumer)
//! comes through [`Neighbours`], so its tests run with fakes.

use std::time::Duration;

use super::batcher::Written;
use crate::batch::{PartitionKey, PartitionMap};
use crate::broker::Broker;
use crate::error::IngestError;
use crate::internal_events::{BatchFlushed, InternalEvent};
use crate::metrics::Metrics;
use crate::service_metrics::ServiceMetrics;
use crate::sink::ShutdownBudget;

/// Longest a commit may take outside a shutdown (then it counts as failed).
const COMMIT_LIMIT: Duration = Duration::from_secs(30);
/// The first wait between two attempts of the last commit; doubled after each.
const FIRST_WAIT: Duration = Duration::from_millis(200);

/// Where offsets are committed: the group's broker.
pub(super) trait Offsets {
    /// Commits `(topic, partition, next offset)` within `limit`; the error
    /// says why not.
    async fn commit(&self, offsets: Vec<(String, i32, i64)>, limit: Duration) -> Result<(), String>;
}

impl Offsets for Broker {
    async fn commit(&self, offsets: Vec<(String, i32, i64)>, limit: Duration) -> Result<(), String> {
        Broker::commit(self, offsets, limit).await
    }
}

/// What the commit stage needs of the stages around it.
pub(super) trait Neighbours {
    /// Whether this member still owns the partition.
    fn owns(&self, key: &PartitionKey) -> bool;
    /// Waits `wait` while the consumer is served, then applies the
    /// rebalances received meanwhile.
    async fn pause(&mut self, wait: Duration) -> Result<(), IngestError>;
}

/// The commit stage.
pub(super) struct Commit<O> {
    offsets: O,
    budget: ShutdownBudget,
    /// The live service metrics (absent when `service_metrics.enabled` is false).
    service: Option<ServiceMetrics>,
    metrics: Metrics,
    /// Rows and rejects made durable and committed.
    pub rows: u64,
    pub rejects: u64,
}

impl<O: Offsets> Commit<O> {
    pub fn new(offsets: O, budget: ShutdownBudget, service: Option<ServiceMetrics>, metrics: Metrics) -> Commit<O> {
        Commit { offsets, budget, service, metrics, rows: 0, rejects: 0 }
    }

    /// A batch was written (`result`): on success its offsets are
    /// committed; an error is returned as it is.
    pub async fn committed(&mut self, batch: Written, result: Result<(), IngestError>, around: &mut impl Neighbours) -> Result<(), IngestError> {
        result?;
        let Written { offsets, buffered, rejects, tallies, started } = batch;
        // Durable: its events count in the service metrics (before the
        // rows-inserted counter, so a scrape that sees one sees the other).
        if let Some(service) = &self.service {
            service.add(tallies.values());
        }
        self.commit(&offsets, around).await?;
        let stored = buffered - rejects;
        self.rows += stored as u64;
        self.rejects += rejects as u64;
        BatchFlushed { rows: stored, rejects, elapsed: started.elapsed() }.emit(&self.metrics);
        Ok(())
    }

    /// Commits the offsets of the partitions still owned: once outside a
    /// shutdown, and within the budget at shutdown.
    async fn commit(&mut self, offsets: &PartitionMap<(i64, i64)>, around: &mut impl Neighbours) -> Result<(), IngestError> {
        let mut wait = FIRST_WAIT;
        loop {
            let owned: Vec<(String, i32, i64)> =
                offsets.iter().filter(|(key, _)| around.owns(key)).map(|((t, p), (_, last))| (t.to_string(), *p, last + 1)).collect();
            let Some(left) = self.budget.remaining() else {
                let _ = self.offsets.commit(owned, COMMIT_LIMIT).await;
                return Ok(());
            };
            let Err(e) = self.offsets.commit(owned, left).await else { return Ok(()) };
            let left = self.budget.remaining().unwrap_or_default();
            if left < wait * 2 {
                return Err(IngestError::FinalCommit(e));
            }
            around.pause(wait).await?;
            wait *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use tokio::sync::watch;

    use super::*;

    /// A broker that refuses the first `refuse` commits and records every one.
    #[derive(Default)]
    struct FakeBroker {
        refuse: Mutex<usize>,
        sent: Mutex<Vec<Vec<(String, i32, i64)>>>,
    }

    impl Offsets for Arc<FakeBroker> {
        async fn commit(&self, mut offsets: Vec<(String, i32, i64)>, _limit: Duration) -> Result<(), String> {
            offsets.sort();
            self.sent.lock().expect("sent").push(offsets);
            let mut refuse = self.refuse.lock().expect("refuse");
            if *refuse > 0 {
                *refuse -= 1;
                return Err("rebalance in progress".into());
            }
            Ok(())
        }
    }

    /// The source stage as the commit stage sees it: the partitions owned,
    /// and a pause that may revoke one.
    struct FakeSource {
        owned: HashSet<PartitionKey>,
        revoke_on_pause: Option<PartitionKey>,
        paused: Vec<Duration>,
    }

    impl Neighbours for FakeSource {
        fn owns(&self, key: &PartitionKey) -> bool {
            self.owned.contains(key)
        }

        async fn pause(&mut self, wait: Duration) -> Result<(), IngestError> {
            tokio::time::sleep(wait).await;
            self.paused.push(wait);
            if let Some(key) = self.revoke_on_pause.take() {
                self.owned.remove(&key);
            }
            Ok(())
        }
    }

    fn key(p: i32) -> PartitionKey {
        (Arc::from("events"), p)
    }

    /// A batch of partitions 0..3 (offsets 10..=19, 20..=29, ...) holding
    /// `rows` rows and `rejects` rejects.
    fn written(rows: usize, rejects: usize) -> Written {
        let offsets: PartitionMap<(i64, i64)> = (0..3).map(|p| (key(p), (10 * (i64::from(p) + 1), 10 * (i64::from(p) + 1) + 9))).collect();
        Written { offsets, buffered: rows + rejects, rejects, tallies: PartitionMap::default(), started: Instant::now() }
    }

    fn stage(broker: &Arc<FakeBroker>, shutdown_timeout: Duration) -> (Commit<Arc<FakeBroker>>, ShutdownBudget, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(false);
        let budget = ShutdownBudget::new(shutdown_timeout, rx);
        (Commit::new(broker.clone(), budget.clone(), None, Metrics::new()), budget, tx)
    }

    fn source(owned: &[i32]) -> FakeSource {
        FakeSource { owned: owned.iter().map(|p| key(*p)).collect(), revoke_on_pause: None, paused: Vec::new() }
    }

    /// Each owned partition is committed at its last offset + 1; a revoked
    /// one is not; rows and rejects count once the commit is done.
    #[tokio::test(start_paused = true)]
    async fn the_partitions_still_owned_are_committed_past_their_last_offset() {
        let broker = Arc::new(FakeBroker::default());
        let (mut commit, _, _tx) = stage(&broker, Duration::from_secs(30));
        commit.committed(written(7, 2), Ok(()), &mut source(&[0, 2])).await.expect("committed");
        assert_eq!(*broker.sent.lock().expect("sent"), [vec![("events".to_owned(), 0, 20), ("events".to_owned(), 2, 40)]]);
        assert_eq!((commit.rows, commit.rejects), (7, 2));
    }

    /// A failed write commits nothing and counts nothing.
    #[tokio::test(start_paused = true)]
    async fn a_failed_write_commits_nothing() {
        let broker = Arc::new(FakeBroker::default());
        let (mut commit, _, _tx) = stage(&broker, Duration::from_secs(30));
        let failed = Err(IngestError::Config("refused".into()));
        assert!(commit.committed(written(7, 2), failed, &mut source(&[0, 1, 2])).await.is_err());
        assert!(broker.sent.lock().expect("sent").is_empty());
        assert_eq!((commit.rows, commit.rejects), (0, 0));
    }

    /// Outside a shutdown a refused commit is not retried and loses
    /// nothing: the batch counts as done (its rows are durable).
    #[tokio::test(start_paused = true)]
    async fn outside_a_shutdown_a_refused_commit_is_left_to_the_next() {
        let broker = Arc::new(FakeBroker { refuse: Mutex::new(1), ..FakeBroker::default() });
        let (mut commit, _, _tx) = stage(&broker, Duration::from_secs(30));
        let mut around = source(&[0, 1, 2]);
        commit.committed(written(5, 0), Ok(()), &mut around).await.expect("not an error");
        assert_eq!(broker.sent.lock().expect("sent").len(), 1);
        assert!(around.paused.is_empty());
        assert_eq!(commit.rows, 5);
    }

    /// At shutdown a refused commit is retried after waits that double,
    /// serving the consumer; a partition revoked during a wait is left out
    /// of the next attempt.
    #[tokio::test(start_paused = true)]
    async fn at_shutdown_the_last_commit_is_retried_for_the_partitions_still_owned() {
        let broker = Arc::new(FakeBroker { refuse: Mutex::new(2), ..FakeBroker::default() });
        let (mut commit, budget, _tx) = stage(&broker, Duration::from_secs(30));
        budget.start();
        let mut around = source(&[0, 1, 2]);
        around.revoke_on_pause = Some(key(1));
        commit.committed(written(5, 0), Ok(()), &mut around).await.expect("committed on the third attempt");
        let sent = broker.sent.lock().expect("sent").clone();
        assert_eq!(sent.len(), 3);
        assert_eq!(sent[0].len(), 3);
        assert_eq!(sent[2], [("events".to_owned(), 0, 20), ("events".to_owned(), 2, 40)]);
        assert_eq!(around.paused, [Duration::from_millis(200), Duration::from_millis(400)]);
    }

    /// At shutdown a commit still refused when the budget cannot hold
    /// another wait ends the run with FinalCommit.
    #[tokio::test(start_paused = true)]
    async fn at_shutdown_a_commit_refused_past_the_budget_ends_the_run() {
        let broker = Arc::new(FakeBroker { refuse: Mutex::new(usize::MAX), ..FakeBroker::default() });
        let (mut commit, budget, _tx) = stage(&broker, Duration::from_secs(2));
        budget.start();
        let got = commit.committed(written(5, 0), Ok(()), &mut source(&[0, 1, 2])).await;
        assert!(matches!(got, Err(IngestError::FinalCommit(_))), "{got:?}");
        // Waits of 0.2 and 0.4 s; the next, 0.8 s, needs twice itself left
        // (1.6 s) and 1.4 s is: three attempts.
        assert_eq!(broker.sent.lock().expect("sent").len(), 3);
        assert_eq!(commit.rows, 0, "not counted: not committed");
    }
}
