//! Drain detection for `--exit-when-idle`. In: the subscribed topics'
//! partitions (log start, high watermark, the group's commit, this
//! member's position) and the partitions this member started. Out: whether
//! the group has read every partition to its end; the partitions this
//! member holds are committed up to what it handled first.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer as _;
use rdkafka::{Offset, TopicPartitionList};

use crate::batch::PartitionKey;
use crate::broker::on_consumer;
use crate::error::IngestError;
use crate::offsets::{self, DrainState, PartitionEnd};
use crate::partitions::Partitions;
use crate::source::Consumer;

/// Whether every partition of `topics` (of `only` when not empty) is read
/// to its end by the group. Called only with nothing buffered or in
/// flight, so every offset this member handled is durable: a partition
/// it holds whose commit is behind what it handled is committed first.
/// `None`: the broker did not answer (a restart, the coordinator
/// loading); not drained.
pub async fn state(
    consumer: &Arc<Consumer>,
    topics: Vec<String>,
    only: Vec<i32>,
    partitions: &Partitions,
) -> Result<Option<DrainState>, IngestError> {
    let looked_up = on_consumer(consumer, "drain check", move |consumer| partition_ends(consumer, &topics, &only)).await?;
    let mut ends = match looked_up {
        Ok(ends) => ends,
        Err(error) => {
            tracing::info!(%error, "cannot confirm the topics are drained yet; waiting for the broker");
            return Ok(None);
        }
    };
    let mut tpl = TopicPartitionList::new();
    for (topic, partition, handled) in catch_up(&mut ends, |key| partitions.started_state(key).map(|s| s.expected)) {
        tpl.add_partition_offset(&topic, partition, Offset::Offset(handled))
            .map_err(|e| IngestError::Kafka { operation: "drain check", source: e })?;
    }
    if tpl.count() > 0 {
        let committed = on_consumer(consumer, "commit", move |consumer| consumer.commit(&tpl, rdkafka::consumer::CommitMode::Sync)).await?;
        if let Err(error) = committed {
            tracing::info!(%error, "offset commit at the drain check failed; checking again");
            return Ok(None);
        }
    }
    Ok(Some(offsets::drain_state(&ends)))
}

/// The commits that bring this member's partitions up to what it handled:
/// per started partition whose commit is behind, `(topic, partition,
/// handled)`, and its end marked committed there. `expected` is a started
/// partition's next offset to deliver.
fn catch_up(ends: &mut [PartitionEnd], expected: impl Fn(&PartitionKey) -> Option<i64>) -> Vec<(String, i32, i64)> {
    let mut commits = Vec::new();
    for e in ends.iter_mut().filter(|e| e.assigned) {
        let key: PartitionKey = (Arc::from(e.topic.as_str()), e.partition);
        let Some(expected) = expected(&key) else { continue };
        // Every offset handled is durable. The fetch position can be
        // past it when the broker skipped offsets it never delivers
        // (transaction markers), which nothing else would commit.
        let handled = expected.max(e.position.unwrap_or(i64::MIN));
        if e.committed.is_none_or(|c| c < handled) {
            commits.push((e.topic.clone(), e.partition, handled));
            e.committed = Some(handled);
        }
    }
    commits
}

/// The end of every partition of `topics` (only `only` when not empty): log
/// start, high watermark, the group's commit, and this member's position
/// where it holds the partition. Blocking (broker round trips).
fn partition_ends(consumer: &Consumer, topics: &[String], only: &[i32]) -> rdkafka::error::KafkaResult<Vec<PartitionEnd>> {
    let timeout = Duration::from_secs(10);
    let assignment = consumer.assignment()?;
    let positions = consumer.position()?;
    let mut ends = Vec::new();
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        for t in metadata.topics() {
            if let Some(error) = t.error() {
                return Err(rdkafka::error::KafkaError::MetadataFetch(error.into()));
            }
            for p in t.partitions().iter().filter(|p| only.is_empty() || only.contains(&p.id())) {
                let (low, high) = consumer.fetch_watermarks(topic, p.id(), timeout)?;
                let assigned = assignment.find_partition(topic, p.id()).is_some();
                let position = positions.find_partition(topic, p.id()).and_then(|e| e.offset().to_raw()).filter(|o| *o >= 0);
                tpl.add_partition(topic, p.id());
                ends.push(PartitionEnd { topic: topic.clone(), partition: p.id(), low, high, committed: None, assigned, position });
            }
        }
    }
    let committed = consumer.committed_offsets(tpl, timeout)?;
    for e in &mut ends {
        e.committed = committed.find_partition(&e.topic, e.partition).and_then(|c| c.offset().to_raw()).filter(|o| *o >= 0);
    }
    Ok(ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(partition: i32, committed: Option<i64>, assigned: bool, position: Option<i64>) -> PartitionEnd {
        PartitionEnd { topic: "t".into(), partition, low: 0, high: 100, committed, assigned, position }
    }

    #[test]
    fn started_partitions_behind_what_they_handled_are_committed_first() {
        let mut ends = [
            end(0, Some(50), true, Some(80)), // behind: committed at the position past transaction markers
            end(1, Some(90), true, Some(90)), // up to date
            end(2, None, true, None),         // never committed: at what it handled
            end(3, Some(10), false, None),    // another member's
            end(4, Some(10), true, Some(20)), // assigned but not started
        ];
        let expected = |key: &PartitionKey| [(0, 70), (1, 90), (2, 5), (3, 99)].iter().find(|(p, _)| *p == key.1).map(|(_, e)| *e);
        let commits = catch_up(&mut ends, expected);
        assert_eq!(commits, [("t".to_owned(), 0, 80), ("t".to_owned(), 2, 5)]);
        let committed: Vec<Option<i64>> = ends.iter().map(|e| e.committed).collect();
        assert_eq!(committed, [Some(80), Some(90), Some(5), Some(10), Some(10)]);
        assert!(catch_up(&mut ends, expected).is_empty(), "a second check commits nothing");
    }
}
