//! The ingest group's committed offsets. In: the Kafka config and the
//! topic partitions the replay log names. Out: each one's committed offset
//! (the next offset the group reads; `None` when it has none), read with
//! an OffsetFetch that does not join the group. A replay log entry whose
//! offsets are all below its partition's is never read again.

use std::collections::BTreeMap;
use std::time::Duration;

use inferlog_store::kafka::KafkaConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

/// How long the broker may take to answer.
const TIMEOUT: Duration = Duration::from_secs(15);

/// The committed offset of each of `partitions` in `[kafka] group_id`.
pub async fn committed(kafka: &KafkaConfig, partitions: Vec<(String, i32)>) -> Result<BTreeMap<(String, i32), Option<i64>>, String> {
    let mut config = crate::dlq::client_config(kafka).map_err(|e| format!("consumer: {e}"))?;
    config.set("group.id", &kafka.group_id).set("session.timeout.ms", kafka.session_timeout_ms()).set("enable.auto.commit", "false");
    let group = kafka.group_id.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().map_err(|e| format!("consumer: {e}"))?;
        let mut list = TopicPartitionList::new();
        for (topic, partition) in &partitions {
            list.add_partition(topic, *partition);
        }
        let committed = consumer.committed_offsets(list, TIMEOUT).map_err(|e| format!("the committed offsets of group {group}: {e}"))?;
        Ok(committed
            .elements()
            .iter()
            .map(|e| {
                let offset = match e.offset() {
                    Offset::Offset(n) => Some(n),
                    _ => None,
                };
                ((e.topic().to_owned(), e.partition()), offset)
            })
            .collect())
    })
    .await
    .map_err(|e| format!("reading the committed offsets: {e}"))?
}
