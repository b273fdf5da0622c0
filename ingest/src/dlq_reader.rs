//! Reading the DLQ back. In: the DLQ topic (`[kafka] dlq_topic`). Out:
//! its messages as [`Record`]s, from each partition's first message to its
//! high watermark at the start, through a bounded queue, so a large DLQ is
//! read in constant memory. The consumer is assigned its partitions under
//! its own group id (`<group_id>-dlq-<purpose>`): it never joins or moves
//! the live group, and commits nothing, so every inspect or replay sees
//! the whole DLQ. It runs on a blocking thread.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use inferlog_schema::timestamp::parse_rfc3339_ms;
use inferlog_store::kafka::KafkaConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::dlq::headers;
use crate::error::IngestError;

/// How long the broker may stay silent before the read gives up (exit 75).
const STALL: Duration = Duration::from_secs(30);

/// Messages read ahead of their consumer, at most.
const QUEUE: usize = 4096;

/// One DLQ message.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    /// The broker's timestamp of the DLQ message (epoch ms), if any.
    pub timestamp_ms: Option<i64>,
    pub headers: BTreeMap<String, String>,
    pub payload: Vec<u8>,
}

impl Record {
    /// When the event was refused: the `inferlog.time` header, else the
    /// DLQ message's own timestamp.
    pub fn time_ms(&self) -> Option<i64> {
        self.headers.get(headers::TIME).and_then(|t| parse_rfc3339_ms(t).ok()).or(self.timestamp_ms)
    }

    /// A header's value, "" when absent.
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// A DLQ read in progress.
#[derive(Debug)]
pub struct DlqReader {
    records: mpsc::Receiver<Record>,
    task: JoinHandle<Result<(), IngestError>>,
}

impl DlqReader {
    /// Starts reading the DLQ for `purpose` (`inspect`, `replay`).
    pub fn start(kafka: &KafkaConfig, purpose: &str) -> Result<DlqReader, IngestError> {
        let mut config = crate::source::client_config(kafka)?;
        config
            .set("group.id", format!("{}-dlq-{purpose}", kafka.group_id))
            .set("session.timeout.ms", kafka.session_timeout_ms())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        let topic = kafka.dlq_topic.clone();
        let (tx, records) = mpsc::channel(QUEUE);
        let task = tokio::task::spawn_blocking(move || read(&config, &topic, &tx));
        Ok(DlqReader { records, task })
    }

    /// The next message; `None` once every partition was read to its end
    /// (or the read failed: [`DlqReader::finish`] says which).
    pub async fn next(&mut self) -> Option<Record> {
        self.records.recv().await
    }

    /// How the read ended.
    pub async fn finish(self) -> Result<(), IngestError> {
        drop(self.records);
        self.task.await.map_err(|e| IngestError::join("dlq read", e))?
    }
}

fn read(config: &rdkafka::ClientConfig, topic: &str, tx: &mpsc::Sender<Record>) -> Result<(), IngestError> {
    let kafka_error = |operation: &'static str| move |source| IngestError::Kafka { operation, source };
    let consumer: BaseConsumer = config.create().map_err(kafka_error("dlq consumer"))?;
    let metadata = consumer.fetch_metadata(Some(topic), STALL).map_err(kafka_error("dlq metadata"))?;
    let Some(described) = metadata.topics().first().filter(|t| t.error().is_none()) else {
        return Err(IngestError::DlqMissing { dlq_topic: topic.to_owned(), reason: "the broker does not describe it".into() });
    };
    let mut list = TopicPartitionList::new();
    let mut left: BTreeMap<i32, i64> = BTreeMap::new();
    for p in described.partitions() {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), STALL).map_err(kafka_error("dlq watermarks"))?;
        if high > low {
            left.insert(p.id(), high);
            list.add_partition_offset(topic, p.id(), Offset::Offset(low)).map_err(kafka_error("dlq assign"))?;
        }
    }
    consumer.assign(&list).map_err(kafka_error("dlq assign"))?;
    let mut heard = Instant::now();
    while !left.is_empty() {
        let Some(message) = consumer.poll(Duration::from_millis(500)) else {
            if heard.elapsed() > STALL {
                return Err(IngestError::NotDrained(format!(
                    "the DLQ topic {topic}: no message for {}s with partitions {:?} not read to their end",
                    STALL.as_secs(),
                    left.keys().collect::<Vec<_>>()
                )));
            }
            continue;
        };
        heard = Instant::now();
        let message = message.map_err(kafka_error("dlq read"))?;
        let (partition, offset) = (message.partition(), message.offset());
        if left.get(&partition).is_some_and(|high| offset < *high) {
            let mut record = Record {
                partition,
                offset,
                timestamp_ms: message.timestamp().to_millis(),
                payload: message.payload().unwrap_or_default().to_vec(),
                ..Record::default()
            };
            if let Some(h) = message.headers() {
                for header in h.iter() {
                    record.headers.insert(header.key.to_owned(), String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned());
                }
            }
            if tx.blocking_send(record).is_err() {
                // The reader was dropped: nobody wants the rest.
                return Ok(());
            }
        }
        if left.get(&partition).is_some_and(|high| offset + 1 >= *high) {
            left.remove(&partition);
        }
    }
    Ok(())
}
