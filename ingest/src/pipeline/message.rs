//! Messages into the batch. In: a chunk of Kafka messages with the
//! rebalance generation each was received under. Out: the rebalance
//! events before each message applied, then each message normalized (on
//! the normalizing threads, the whole chunk together) and taken in offset
//! order into the batch as a row, a skipped replay or retry, or a reject
//! (redacted for the DLQ); a batch that fills up is flushed on the way.

use super::*;

impl Pipeline {
    /// Applies every rebalance event received so far (between chunks).
    pub(super) fn apply_rebalances(&mut self) -> Result<(), IngestError> {
        self.apply_through(u64::MAX)
    }

    /// Applies the rebalance events that came before a message received
    /// under `generation`.
    pub(super) fn apply_through(&mut self, generation: u64) -> Result<(), IngestError> {
        // Asked for every message: nothing new costs one atomic load.
        let through = generation.min(self.rebalances.generation());
        if through <= self.applied {
            return Ok(());
        }
        self.applied = through;
        for (generation, event) in self.rebalances.take_through(through) {
            match event {
                RebalanceEvent::Revoked(list) => {
                    metrics::rebalanced(&self.metrics, "revoke", &list);
                    self.batch.drop_partitions(&list);
                    let keys: Vec<PartitionKey> = list.iter().map(|(t, p)| (self.topic(t).0, *p)).collect();
                    self.partitions.revoke(&keys);
                }
                RebalanceEvent::Assigned(list) => {
                    metrics::rebalanced(&self.metrics, "assign", &list);
                    // A partition paused during a wait and assigned again
                    // after it stays paused in librdkafka: never here.
                    let mut tpl = TopicPartitionList::with_capacity(list.len());
                    for (t, p) in &list {
                        tpl.add_partition(t, *p);
                    }
                    let _ = self.consumer.resume(&tpl);
                    let keys: Vec<PartitionKey> = list.iter().map(|(t, p)| (self.topic(t).0, *p)).collect();
                    self.partitions.assign(&keys, generation)?;
                    // An empty assignment is not one to drain.
                    self.assigned_once |= !list.is_empty();
                }
            }
        }
        metrics::inflight(&self.metrics, self.buffered_rows());
        Ok(())
    }

    /// The shared name of a topic and its per-topic metrics.
    pub(super) fn topic(&mut self, name: &str) -> TopicEntry {
        if let Some(t) = self.topics.get(name) {
            return t.clone();
        }
        let t = (Arc::from(name), metrics::messages_counter(&self.metrics, name));
        self.topics.insert(name.to_owned(), t.clone());
        t
    }

    /// Normalizes a chunk of messages together, then takes them one by one
    /// in order, each after the rebalance events received before it; a
    /// batch that fills up on the way is handed to the writer.
    pub(super) async fn handle_chunk<M: Message>(&mut self, messages: &[(M, u64)]) -> Result<(), IngestError> {
        let received_ms = now_ms();
        let topics: Vec<TopicEntry> = messages.iter().map(|(m, _)| self.topic(m.topic())).collect();
        let mut inputs = Vec::with_capacity(messages.len());
        for ((m, _), (topic, _)) in messages.iter().zip(&topics) {
            let partition = table_partition(topic, m.partition())?;
            let encoding = self.config.kafka.encoding(topic);
            inputs.push(Input { payload: m.payload().unwrap_or_default(), topic, partition, offset: m.offset(), encoding });
        }
        let pieces = self.normalizer.normalize(&inputs, received_ms);
        drop(inputs);
        let mut messages = messages.iter().zip(topics);
        let mut skews = crate::skew::Samples::default();
        for piece in pieces {
            let mut outcomes = piece.outcomes.into_iter();
            let mut start = 0;
            for end in piece.messages {
                let Some(((message, generation), topic)) = messages.next() else { break };
                let mut events = outcomes.by_ref().take((end.end - start) as usize);
                start = end.end;
                self.apply_through(*generation)?;
                self.handle(message, *generation, topic, events.by_ref(), end.skipped_spans, &piece.bytes, received_ms, &mut skews).await?;
                // A message handle() drops unread (not owned, delivered
                // again, already stored) leaves its outcomes here: they are
                // its own, never the next message's.
                events.for_each(drop);
                if self.batch.is_full(self.config.ingest.batch_max_rows, self.config.ingest.batch_max_bytes) {
                    self.after_full = true;
                    self.flush().await?;
                }
            }
        }
        skews.flush();
        Ok(())
    }

    /// Handles what arrived while a wait served the consumer (normally
    /// nothing: the partitions were paused).
    pub(super) async fn handle_carried(&mut self) -> Result<(), IngestError> {
        while !self.carry.is_empty() {
            let carried = std::mem::take(&mut self.carry);
            self.handle_chunk(&carried).await?;
        }
        Ok(())
    }

    /// Takes one message, received under rebalance generation `received`,
    /// whose payload normalized to `outcomes` (one for
    /// a JSON event, one per inference span of an OTLP message, none when
    /// every span was skipped: a row encoded in `encoded`, or a rejection).
    #[allow(clippy::too_many_arguments)] // the message, what it became, and the chunk's shared state
    pub(super) async fn handle<M: Message>(
        &mut self,
        message: &M,
        received: u64,
        (topic, consumed): TopicEntry,
        outcomes: impl Iterator<Item = Outcome>,
        skipped_spans: u32,
        encoded: &[u8],
        received_ms: i64,
        skews: &mut crate::skew::Samples,
    ) -> Result<(), IngestError> {
        let (partition, offset) = (message.partition(), message.offset());
        let key: PartitionKey = (topic.clone(), partition);
        // One lookup for a started partition, the common case.
        let mut state = match self.partitions.state(&key, received) {
            Some(state) => state,
            None => match self.partitions.status(&key, received) {
                Status::NotOwned | Status::Lost => {
                    metrics::unowned_message(&self.metrics, &topic, partition, offset);
                    return Ok(());
                }
                // Never started while stopping: it is left to the next run.
                Status::NotStarted if *self.writer.shutdown.borrow() => return Ok(()),
                Status::NotStarted | Status::Started => {
                    let task = tokio::spawn(partitions::lookup_start(self.broker.clone(), self.writer.clone(), self.metrics.clone(), key.clone()));
                    match self.serve_while(task, "partition start").await? {
                        Ok(state) => self.partitions.started(&key, state),
                        Err(error) if *self.writer.shutdown.borrow() => {
                            tracing::info!(%error, topic = %key.0, partition, "stopping before the partition started");
                            return Ok(());
                        }
                        Err(error) => return Err(error),
                    }
                    // Revoked or lost while it started (the wait served the consumer): not owned now.
                    match self.partitions.state(&key, received) {
                        Some(state) => state,
                        None => return Ok(()),
                    }
                }
            },
        };
        match state.classify(offset) {
            Delivery::Next => {}
            // Before the commit point: delivered again (a seek or an offset reset).
            Delivery::Again => return Ok(()),
            Delivery::Gap => {
                let task = tokio::spawn(partitions::log_start(self.broker.clone(), key.clone()));
                let log_start = self.serve_while(task, "log start lookup").await??;
                state = match self.partitions.state(&key, received) {
                    Some(state) => state,
                    None => return Ok(()),
                };
                partitions::account_gap(&self.metrics, &key, state, offset, log_start);
            }
        }
        state.advanced_to(offset);
        // Only some rows of this message known stored (a crash between two
        // days' inserts of its spans): those are skipped, the rest written.
        let stored_spans = state.stored_spans(offset);
        self.summary.messages += 1;
        consumed.inc();
        if state.already_stored(offset) {
            metrics::duplicate_skipped(&self.metrics, "replay");
            self.summary.duplicates += 1;
            self.batch.push_skipped(key, offset);
            return Ok(());
        }
        if skipped_spans > 0 {
            metrics::spans_skipped(&self.metrics, &topic, skipped_spans);
        }
        let kafka_ms = crate::skew::kafka_ms(message.timestamp());
        let mut handled = false;
        for outcome in outcomes {
            if stored_spans.as_ref().is_some_and(|stored| stored.binary_search(&outcome.index()).is_ok()) {
                metrics::duplicate_skipped(&self.metrics, "replay");
                self.summary.duplicates += 1;
                continue;
            }
            handled = true;
            self.take(message, &key, outcome, encoded, kafka_ms, received_ms, skews);
        }
        if !handled {
            // Every span was skipped: the message still moves the commit point.
            self.batch.push_skipped(key, offset);
        }
        Ok(())
    }

    /// Takes one event of a message into the batch: a new row, a skipped
    /// retry, or a reject.
    #[allow(clippy::too_many_arguments)] // one event, its message and the chunk's shared state
    fn take<M: Message>(
        &mut self,
        message: &M,
        key: &PartitionKey,
        outcome: Outcome,
        encoded: &[u8],
        kafka_ms: Option<i64>,
        received_ms: i64,
        skews: &mut crate::skew::Samples,
    ) {
        let (topic, partition, offset) = (&key.0, message.partition(), message.offset());
        let index = outcome.index();
        let (rejection, span) = match outcome {
            Outcome::Row { day, timestamp_ms, fingerprint, content, range, dropped_fields, observation, span } => {
                if dropped_fields > 0 {
                    metrics::fields_dropped(&self.metrics, dropped_fields);
                }
                if let Some(kafka_ms) = kafka_ms {
                    let metrics = &self.metrics;
                    skews.observe(topic, || metrics::skew_histogram(metrics, topic), crate::skew::seconds(timestamp_ms, kafka_ms));
                }
                let stored = self.recent.get(fingerprint).or_else(|| self.batch.request_ids.get(&fingerprint).copied());
                match Seen::of(stored, content) {
                    Seen::New => {
                        if let Some(o) = &observation {
                            self.batch.observe(key, o);
                        }
                        self.batch.push_row(day, &encoded[range], (fingerprint, content), key.clone(), (offset, index));
                        return;
                    }
                    Seen::Retry => {
                        metrics::duplicate_skipped(&self.metrics, "request_id");
                        self.summary.duplicates += 1;
                        self.batch.push_skipped(key.clone(), offset);
                        return;
                    }
                    Seen::Conflict => {
                        let rejection = Rejection::new(
                            ReasonCode::RequestIdConflict,
                            "request_id",
                            "a different event with this request_id was already stored (ids must be unique per request; a retry must resend the same event)",
                        );
                        // A span's ids and event are written again from the message.
                        let span =
                            span.and_then(|i| self.normalizer.span(message.payload().unwrap_or_default(), self.config.kafka.encoding(topic), i));
                        (rejection, span.map(Box::new))
                    }
                }
            }
            Outcome::Rejected(rejection, span) => (crate::skew::explain(rejection, kafka_ms, received_ms), span),
        };
        metrics::event_rejected(&self.metrics, rejection.reason.as_str());
        // A span's reject keeps the event it mapped to, not the whole message.
        let payload = span.as_ref().map_or_else(|| message.payload().unwrap_or_default(), |s| s.event.as_slice());
        let Redacted { payload, key: source_key, original } = self.redactor.redact(payload, message.key(), rejection.reason);
        let headers = self.redactor.carried(message.headers());
        let span = span.map(|s| SpanRef { index: s.index, trace_id: s.trace_id, span_id: s.span_id });
        let reject = Reject { payload, key: source_key, headers, original, rejection, topic: topic.clone(), partition, offset, received_ms, span };
        self.batch.push_reject(reject, key.clone());
    }
}
