//! The Kafka stage. In: the source topics, as a member of the consumer
//! group. Out: messages in partition order, plus the rebalance events the
//! pipeline must act on (revoked partitions lose their uncommitted work).
//!
//! Auto-commit is off: the pipeline commits a partition's offset only after
//! everything before it is durable (rows in ClickHouse, rejects in the DLQ).

use std::sync::{Arc, Mutex};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::ClientContext;

use crate::config::{Assignment, KafkaConfig};
use crate::error::IngestError;

/// Partitions the group took from or gave to this member since the
/// pipeline last looked. Filled by librdkafka's rebalance callbacks, which
/// run inside `recv()`, so never while a flush is writing.
#[derive(Debug, Default)]
pub struct RebalanceLog {
    events: Mutex<Vec<RebalanceEvent>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

impl RebalanceLog {
    pub fn take(&self) -> Vec<RebalanceEvent> {
        self.events.lock().map(|mut e| std::mem::take(&mut *e)).unwrap_or_default()
    }

    fn push(&self, event: RebalanceEvent) {
        if let Ok(mut e) = self.events.lock() {
            e.push(event);
        }
    }
}

/// The consumer's context: records rebalances for the pipeline.
#[derive(Debug, Clone, Default)]
pub struct IngestContext {
    pub rebalances: Arc<RebalanceLog>,
}

impl ClientContext for IngestContext {}

fn partitions(tpl: &rdkafka::TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.rebalances.push(RebalanceEvent::Revoked(partitions(tpl)));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.rebalances.push(RebalanceEvent::Assigned(partitions(tpl)));
        }
    }
}

pub type Consumer = StreamConsumer<IngestContext>;

/// librdkafka settings shared by the consumer and the DLQ producer.
pub fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.brokers);
    for (k, v) in &kafka.options {
        config.set(k, v);
    }
    config
}

/// A group member subscribed to the source topics.
pub fn subscribe(kafka: &KafkaConfig) -> Result<(Arc<Consumer>, Arc<RebalanceLog>), IngestError> {
    use rdkafka::consumer::Consumer as _;
    let context = IngestContext::default();
    let rebalances = context.rebalances.clone();
    let mut config = client_config(kafka);
    config
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", kafka.session_timeout.as_millis().to_string())
        .set("heartbeat.interval.ms", (kafka.session_timeout.as_millis() / 4).max(100).to_string())
        .set("queued.max.messages.kbytes", kafka.prefetch_max_kbytes.to_string())
        .set("fetch.wait.max.ms", kafka.fetch_max_wait.as_millis().max(1).to_string())
        .set("fetch.max.bytes", (16 * 1024 * 1024).to_string())
        .set("max.partition.fetch.bytes", (4 * 1024 * 1024).to_string());

    let consumer: Consumer = config
        .create_with_context(context)
        .map_err(|source| IngestError::Kafka { operation: "create consumer", source })?;
    match kafka.assignment {
        Assignment::Group => {
            let topics: Vec<&str> = kafka.topics.iter().map(String::as_str).collect();
            consumer.subscribe(&topics).map_err(|source| IngestError::Kafka { operation: "subscribe", source })?;
        }
        Assignment::Static => {
            // Resume every partition from its committed offset (librdkafka
            // fetches it for Offset::Stored), earliest when none.
            let mut tpl = rdkafka::TopicPartitionList::new();
            let mut assigned = Vec::new();
            for topic in &kafka.topics {
                let metadata = consumer
                    .fetch_metadata(Some(topic), std::time::Duration::from_secs(10))
                    .map_err(|source| IngestError::Kafka { operation: "fetch metadata", source })?;
                for t in metadata.topics() {
                    for p in t.partitions() {
                        if kafka.partitions.is_empty() || kafka.partitions.contains(&p.id()) {
                            tpl.add_partition_offset(topic, p.id(), rdkafka::Offset::Stored)
                                .map_err(|source| IngestError::Kafka { operation: "assign", source })?;
                            assigned.push((topic.clone(), p.id()));
                        }
                    }
                }
            }
            if assigned.is_empty() {
                return Err(IngestError::Config(format!("no partitions to read in {:?} (kafka.partitions = {:?})", kafka.topics, kafka.partitions)));
            }
            consumer.assign(&tpl).map_err(|source| IngestError::Kafka { operation: "assign", source })?;
            rebalances.push(RebalanceEvent::Assigned(assigned));
        }
    }
    Ok((Arc::new(consumer), rebalances))
}
