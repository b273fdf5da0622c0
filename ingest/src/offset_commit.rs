//! Offset commits as the broker takes them. In: the next offset to read
//! per partition, once everything before it is durable (rows in
//! ClickHouse, rejects in the DLQ and their log). Out: the group's
//! committed offsets. The pipeline's commit stage
//! ([`crate::pipeline`]'s `commit`) and a revocation's last commit
//! ([`crate::source`]) both send them here.
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
    consumer.commit(&list(offsets)?, CommitMode::Sync)
}

/// The partition list a commit of `offsets` sends.
fn list(offsets: &[(String, i32, i64)]) -> KafkaResult<TopicPartitionList> {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    for (topic, partition, next) in offsets {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*next))?;
    }
    Ok(tpl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_partition_is_committed_at_its_next_offset() {
        let tpl = list(&[("a".into(), 0, 10), ("a".into(), 3, 0), ("b".into(), 1, 7)]).expect("list");
        let sent: Vec<(String, i32, Offset)> = tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition(), e.offset())).collect();
        assert_eq!(sent, [("a".to_owned(), 0, Offset::Offset(10)), ("a".to_owned(), 3, Offset::Offset(0)), ("b".to_owned(), 1, Offset::Offset(7))]);
    }
}
