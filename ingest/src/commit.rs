//! The commit stage. In: the next offset to read per partition, once
//! everything before it is durable (rows in ClickHouse, rejects in the
//! DLQ and their log). Out: the group's committed offsets.
//!
//! A commit that fails loses nothing: the rows are durable, and the
//! partition's next reader skips them by the replay log. It is counted
//! (`inferlog_ingest_commit_failures_total`) and logged.

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

/// Commits `(topic, partition, next offset)` synchronously. Blocking (a
/// broker round trip): call it off the async workers, or from a rebalance
/// callback, which librdkafka runs on the polling thread.
pub fn commit<C: ConsumerContext, K: Consumer<C> + ?Sized>(consumer: &K, offsets: &[(String, i32, i64)]) -> KafkaResult<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    for (topic, partition, next) in offsets {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))?;
    }
    consumer.commit(&tpl, CommitMode::Sync)
}
