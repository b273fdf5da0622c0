//! Waiting without leaving the group. In: a task to wait for (a write,
//! a partition start, a commit), or the drain check's question. Out: the
//! task's result, with every partition paused and the consumer polled
//! meanwhile past a second (so `max.poll.interval.ms` is met however long
//! the wait); consume errors sorted into permanent and waited out; with
//! `--exit-when-idle`, whether every partition is read to its end and
//! committed.

use super::*;

impl Pipeline {
    /// With `--exit-when-idle`: whether every partition is read to its end
    /// and committed (exit 0), or an error when this member never got a
    /// partition or partitions stay behind yet silent (exit 75).
    pub(super) async fn drained(&mut self, idle: Duration, grace: Duration, silent: Duration) -> Result<bool, IngestError> {
        let kafka = &self.config.kafka;
        if !self.assigned_once {
            return Err(IngestError::NotDrained(format!(
                "group {} gave this member no partition of {:?} within {}; another member holds them all, or the group is still rebalancing",
                kafka.group_id,
                kafka.topics,
                humantime::format_duration(idle + grace)
            )));
        }
        match crate::drain::state(&self.consumer, kafka.topics.clone(), kafka.partitions.clone(), &self.partitions).await? {
            Some(DrainState::Drained) => {
                tracing::info!(idle = %humantime::format_duration(idle), "every partition read to its end and committed: drained");
                Ok(true)
            }
            Some(DrainState::Behind { held, others }) if silent >= idle + NOT_DRAINED_LIMIT => Err(IngestError::NotDrained(format!(
                "nothing arrived for {} while partitions are behind their end: held here {held:?}, by others {others:?}",
                humantime::format_duration(silent)
            ))),
            Some(DrainState::Behind { held, others }) => {
                tracing::info!(?held, ?others, "not drained yet: partitions behind their end (held here, or by other members)");
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// A consume error: permanent ones (authorization, an unknown topic)
    /// stop ingest; the rest (a broker restarting, a leader moving) are
    /// waited out: librdkafka retries, and nothing past what is durable is
    /// committed meanwhile.
    pub(super) fn waited_out(&self, source: rdkafka::error::KafkaError) -> Result<(), IngestError> {
        use rdkafka::error::RDKafkaErrorCode as Code;
        match source.rdkafka_error_code() {
            Some(code) if source::is_permanent(code) || matches!(code, Code::UnknownTopicOrPartition | Code::UnknownTopic) => {
                Err(self.broker.refused(code, source.to_string()))
            }
            _ => {
                metrics::consume_error(&self.metrics);
                tracing::warn!(error = %source, "kafka consume error: waiting for the broker (nothing is committed past what is durable)");
                Ok(())
            }
        }
    }

    /// Waits for `task`. Past [`PAUSE_AFTER`] every assigned partition is
    /// paused (librdkafka purges what it prefetched and resumes from the
    /// last message handed out) and the consumer is polled meanwhile:
    /// rebalance callbacks run and `max.poll.interval.ms` is met, so a long
    /// outage does not churn the group. What arrives anyway is kept for later.
    pub(super) async fn serve_while<T>(&mut self, task: JoinHandle<T>, what: &'static str) -> Result<T, IngestError> {
        self.serve_while_after(task, what, PAUSE_AFTER).await
    }

    /// [`Pipeline::serve_while`], pausing after `pause_after`.
    pub(super) async fn serve_while_after<T>(
        &mut self,
        mut task: JoinHandle<T>,
        what: &'static str,
        pause_after: Duration,
    ) -> Result<T, IngestError> {
        if let Ok(done) = tokio::time::timeout(pause_after, &mut task).await {
            return done.map_err(|e| IngestError::join(what, e));
        }
        metrics::paused(&self.metrics, what);
        let consumer = self.consumer.clone();
        let mut paused_at = None;
        // Every partition paused: librdkafka keeps a partition paused across
        // its revocation and a later assignment, so all are resumed at the end.
        let mut paused = TopicPartitionList::new();
        let mut recheck = tokio::time::interval(Duration::from_millis(500));
        let done = loop {
            // A new assignment meanwhile is paused too.
            if paused_at != Some(self.rebalances.generation()) {
                paused_at = Some(self.rebalances.generation());
                if let Ok(assignment) = consumer.assignment() {
                    let _ = consumer.pause(&assignment);
                    for e in assignment.elements() {
                        if paused.find_partition(e.topic(), e.partition()).is_none() {
                            paused.add_partition(e.topic(), e.partition());
                        }
                    }
                }
            }
            tokio::select! {
                biased;
                done = &mut task => break done,
                message = consumer.recv() => match message {
                    Ok(m) => self.carry.push((m.detach(), self.rebalances.generation())),
                    Err(e) => self.waited_out(e)?,
                },
                _ = recheck.tick() => {}
            }
        };
        let _ = consumer.resume(&paused);
        if let Ok(assignment) = consumer.assignment() {
            let _ = consumer.resume(&assignment);
        }
        done.map_err(|e| IngestError::join(what, e))
    }
}
