//! The DLQ topic as the broker holds it. In: the Kafka config. Out: the
//! topic's `cleanup.policy`, `retention.ms` and `segment.ms` (DescribeConfigs)
//! and the timestamp of the oldest message of each partition (read, not
//! assumed), for the audit; and, for enforce, the AlterConfigs that brings
//! the settings within a policy.
//!
//! Kafka deletes whole closed segments once their newest message is older
//! than `retention.ms`, and never under `cleanup.policy=compact`: a message
//! can live `retention.ms + segment.ms` (plus the broker's check interval).
//! Settings fit a policy when that sum does.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use inferlog_store::kafka::{DlqPayload, KafkaConfig};
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ConfigSource, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

/// How long one admin request, or the read of the oldest messages, may take.
const TIMEOUT: Duration = Duration::from_secs(15);

/// The settings that decide how long the topic keeps a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqSettings {
    pub cleanup_policy: String,
    pub retention_ms: i64,
    pub segment_ms: i64,
    /// Every config set on the topic itself: a (non-incremental) AlterConfigs
    /// replaces them all, so it must send them back.
    pub topic_overrides: BTreeMap<String, String>,
}

impl DlqSettings {
    /// The longest a message can live under these settings, in ms; `None`: for ever.
    pub fn longest_ms(&self) -> Option<i64> {
        if self.cleanup_policy.split(',').any(|p| p.trim() == "compact") || self.retention_ms < 0 || self.segment_ms < 0 {
            return None;
        }
        Some(self.retention_ms.saturating_add(self.segment_ms))
    }

    /// Whether no message can outlive `limit_ms`.
    pub fn fit(&self, limit_ms: i64) -> bool {
        self.longest_ms().is_some_and(|ms| ms <= limit_ms)
    }

    /// `key=value` of the three settings, for messages.
    pub fn describe(&self) -> String {
        format!("cleanup.policy={} retention.ms={} segment.ms={}", self.cleanup_policy, self.retention_ms, self.segment_ms)
    }
}

/// The settings that keep every message at most `limit_ms`: segments of a
/// seventh of the limit (a day for 7 days; at least an hour), so a message
/// is deleted between `limit - segment` and `limit` after it arrived.
pub fn target(current: &DlqSettings, limit_ms: i64) -> DlqSettings {
    let segment_ms = (limit_ms / 7).max(3_600_000).min(limit_ms / 2).min(if current.segment_ms > 0 { current.segment_ms } else { i64::MAX });
    DlqSettings { cleanup_policy: "delete".into(), retention_ms: limit_ms - segment_ms, segment_ms, topic_overrides: current.topic_overrides.clone() }
}

/// The topic as the broker holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqTopic {
    pub topic: String,
    /// The settings, or why they are not known.
    pub settings: Result<DlqSettings, String>,
    /// Per partition, the timestamp (epoch ms) of its oldest message (`None`:
    /// empty), or why they could not be read.
    pub oldest: Result<BTreeMap<i32, Option<i64>>, String>,
    /// What ingest writes there (`[kafka] dlq_payload`).
    pub payload: DlqPayload,
    /// When the read of the oldest messages began (epoch ms): a message
    /// produced after it carries a later timestamp.
    pub read_at_ms: i64,
}

/// How much earlier than the DLQ topic's oldest message a replay ledger
/// entry must have been written before retention prunes it: the ledger's
/// times are Postgres's clock, a message's timestamp its producer's.
pub const LEDGER_MARGIN_MS: i64 = 3_600_000;

impl DlqTopic {
    /// The time (epoch ms) before which a stored replay ledger entry stands
    /// for a message this topic no longer holds: its oldest message (the
    /// read's start for an empty partition) less [`LEDGER_MARGIN_MS`].
    /// A replay reads a message before it records it, so the entry of a
    /// message still held was written after that message's timestamp,
    /// which is not before its partition's first message's: ingest, the
    /// DLQ's producer, stamps create times in the order it appends (the
    /// margin covers members' clocks apart). `None` when the oldest
    /// messages could not be read.
    pub fn ledger_cutoff(&self) -> Option<i64> {
        let oldest = self.oldest.as_ref().ok()?;
        let first = oldest.values().map(|o| o.unwrap_or(self.read_at_ms)).fold(self.read_at_ms, i64::min);
        Some(first - LEDGER_MARGIN_MS)
    }
}

/// librdkafka's config of retention's clients: [`inferlog_store::kafka::client_properties`].
pub(crate) fn client_config(kafka: &KafkaConfig) -> Result<ClientConfig, inferlog_store::StoreError> {
    Ok(inferlog_store::kafka::client_properties(kafka)?.into_iter().collect())
}

fn admin(kafka: &KafkaConfig) -> Result<AdminClient<DefaultClientContext>, String> {
    let config = client_config(kafka).map_err(|e| format!("admin client: {e}"))?;
    config.create().map_err(|e| format!("admin client: {e}"))
}

/// DescribeConfigs of the topic.
pub async fn settings(kafka: &KafkaConfig) -> Result<DlqSettings, String> {
    let client = admin(kafka)?;
    let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let topic = ResourceSpecifier::Topic(&kafka.dlq_topic);
    let results = match tokio::time::timeout(TIMEOUT, client.describe_configs([&topic], &options)).await {
        Err(_) => return Err(format!("the broker did not answer DescribeConfigs within {}s", TIMEOUT.as_secs())),
        Ok(Err(e)) => return Err(format!("DescribeConfigs: {e}")),
        Ok(Ok(results)) => results,
    };
    let resource = match results.into_iter().next() {
        Some(Ok(resource)) => resource,
        Some(Err(code)) => return Err(format!("DescribeConfigs: {code}")),
        None => return Err("DescribeConfigs returned nothing".into()),
    };
    let value = |key: &str| resource.get(key).and_then(|e| e.value.clone()).ok_or_else(|| format!("the broker does not report {key} for the topic"));
    let number = |key: &str| value(key).and_then(|v| v.parse::<i64>().map_err(|_| format!("{key} = {v:?}")));
    let topic_overrides = resource
        .entries
        .iter()
        .filter(|e| e.source == ConfigSource::DynamicTopic && !e.is_sensitive)
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    Ok(DlqSettings {
        cleanup_policy: value("cleanup.policy")?,
        retention_ms: number("retention.ms")?,
        segment_ms: number("segment.ms")?,
        topic_overrides,
    })
}

/// Sets `to` on the topic (keeping its other overrides).
pub async fn alter(kafka: &KafkaConfig, to: &DlqSettings) -> Result<(), String> {
    let client = admin(kafka)?;
    let mut values = to.topic_overrides.clone();
    values.insert("cleanup.policy".into(), to.cleanup_policy.clone());
    values.insert("retention.ms".into(), to.retention_ms.to_string());
    values.insert("segment.ms".into(), to.segment_ms.to_string());
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(&kafka.dlq_topic));
    for (k, v) in &values {
        alter = alter.set(k, v);
    }
    let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
    match tokio::time::timeout(TIMEOUT, client.alter_configs([&alter], &options)).await {
        Err(_) => Err(format!("the broker did not answer AlterConfigs within {}s", TIMEOUT.as_secs())),
        Ok(Err(e)) => Err(format!("AlterConfigs: {e}")),
        Ok(Ok(results)) => match results.into_iter().next() {
            Some(Ok(_)) => Ok(()),
            Some(Err((_, code))) => Err(format!("AlterConfigs: {code}")),
            None => Err("AlterConfigs returned nothing".into()),
        },
    }
}

/// The timestamp of the first message of every partition, read with a
/// consumer that is assigned (never joins a group) and commits nothing.
pub async fn oldest(kafka: &KafkaConfig) -> Result<BTreeMap<i32, Option<i64>>, String> {
    let mut config = client_config(kafka).map_err(|e| format!("consumer: {e}"))?;
    config
        .set("group.id", "inferlog-retention-audit")
        .set("session.timeout.ms", kafka.session_timeout_ms())
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let topic = kafka.dlq_topic.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().map_err(|e| format!("consumer: {e}"))?;
        let metadata = consumer.fetch_metadata(Some(&topic), TIMEOUT).map_err(|e| format!("metadata: {e}"))?;
        let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
        if let Some(e) = metadata.topics().first().and_then(|t| t.error()) {
            return Err(format!("metadata of the topic: {e:?}"));
        }
        let mut list = TopicPartitionList::new();
        for p in &partitions {
            list.add_partition_offset(&topic, *p, Offset::Beginning).map_err(|e| format!("assign: {e}"))?;
        }
        consumer.assign(&list).map_err(|e| format!("assign: {e}"))?;
        let mut found: BTreeMap<i32, Option<i64>> = BTreeMap::new();
        let deadline = Instant::now() + TIMEOUT;
        while found.len() < partitions.len() {
            let left = deadline
                .checked_duration_since(Instant::now())
                .ok_or_else(|| format!("{} of {} partitions answered within {}s", found.len(), partitions.len(), TIMEOUT.as_secs()))?;
            match consumer.poll(left.min(Duration::from_millis(500))) {
                None => {}
                Some(Ok(m)) => {
                    found.entry(m.partition()).or_insert_with(|| m.timestamp().to_millis());
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    found.entry(p).or_insert(None);
                }
                Some(Err(e)) => return Err(format!("reading the oldest messages: {e}")),
            }
        }
        Ok(found)
    })
    .await
    .map_err(|e| format!("reading the oldest messages: {e}"))?
}

/// What one DLQ partition holds of an erasure request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hits {
    /// Messages whose payload, key or a header contains one of the request's ids.
    pub messages: u64,
    /// Of them, where: in the payload, in the key, in a header value.
    pub in_payload: u64,
    pub in_key: u64,
    pub in_headers: u64,
    /// The newest such message's timestamp (epoch ms).
    pub newest_ms: Option<i64>,
    /// Messages read.
    pub read: u64,
    /// Messages whose payload is neither empty nor one JSON document: read
    /// byte by byte only (an id escaped or encoded in it is not found).
    pub unparsed: u64,
}

/// Whether `haystack` holds one of `needles`.
fn holds(haystack: &[u8], needles: &[String]) -> bool {
    needles.iter().any(|n| !n.is_empty() && haystack.windows(n.len()).any(|w| w == n.as_bytes()))
}

/// How long reading the whole topic for [`search`] may take.
const SEARCH_TIMEOUT: Duration = Duration::from_secs(300);

/// Reads every message of the topic (assigned, no group, nothing committed)
/// and counts, per partition, those whose payload, key or a header value
/// contains one of `needles` (the plaintext ids and their digests).
pub async fn search(kafka: &KafkaConfig, needles: Vec<String>) -> Result<BTreeMap<i32, Hits>, String> {
    let mut config = client_config(kafka).map_err(|e| format!("consumer: {e}"))?;
    config
        .set("group.id", "inferlog-retention-erase")
        .set("session.timeout.ms", kafka.session_timeout_ms())
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let topic = kafka.dlq_topic.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().map_err(|e| format!("consumer: {e}"))?;
        let metadata = consumer.fetch_metadata(Some(&topic), TIMEOUT).map_err(|e| format!("metadata: {e}"))?;
        if let Some(e) = metadata.topics().first().and_then(|t| t.error()) {
            return Err(format!("metadata of the topic: {e:?}"));
        }
        let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
        let mut list = TopicPartitionList::new();
        let mut hits: BTreeMap<i32, Hits> = BTreeMap::new();
        let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
        for p in &partitions {
            let (low, high) = consumer.fetch_watermarks(&topic, *p, TIMEOUT).map_err(|e| format!("watermarks: {e}"))?;
            hits.insert(*p, Hits::default());
            if high > low {
                ends.insert(*p, high);
                list.add_partition_offset(&topic, *p, Offset::Offset(low)).map_err(|e| format!("assign: {e}"))?;
            }
        }
        consumer.assign(&list).map_err(|e| format!("assign: {e}"))?;
        let deadline = Instant::now() + SEARCH_TIMEOUT;
        while !ends.is_empty() {
            let left = deadline
                .checked_duration_since(Instant::now())
                .ok_or_else(|| format!("{} partitions not read to their end within {}s", ends.len(), SEARCH_TIMEOUT.as_secs()))?;
            match consumer.poll(left.min(Duration::from_millis(500))) {
                None => {}
                Some(Ok(m)) => {
                    use rdkafka::message::Headers as _;
                    let payload = m.payload().unwrap_or_default();
                    let in_payload = holds(payload, &needles);
                    let in_key = holds(m.key().unwrap_or_default(), &needles);
                    let in_headers = m.headers().is_some_and(|hs| hs.iter().any(|h| holds(h.value.unwrap_or_default(), &needles)));
                    let h = hits.entry(m.partition()).or_default();
                    h.read += 1;
                    if !payload.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_err() {
                        h.unparsed += 1;
                    }
                    if in_payload || in_key || in_headers {
                        h.messages += 1;
                        h.in_payload += u64::from(in_payload);
                        h.in_key += u64::from(in_key);
                        h.in_headers += u64::from(in_headers);
                        h.newest_ms = h.newest_ms.max(m.timestamp().to_millis());
                    }
                    if ends.get(&m.partition()).is_some_and(|end| m.offset() + 1 >= *end) {
                        ends.remove(&m.partition());
                    }
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    ends.remove(&p);
                }
                Some(Err(e)) => return Err(format!("reading the topic: {e}")),
            }
        }
        Ok(hits)
    })
    .await
    .map_err(|e| format!("reading the topic: {e}"))?
}

/// The topic's settings and oldest messages.
pub async fn inspect(kafka: &KafkaConfig) -> DlqTopic {
    let read_at_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let (settings, oldest) = tokio::join!(settings(kafka), oldest(kafka));
    DlqTopic { topic: kafka.dlq_topic.clone(), settings, oldest, payload: kafka.dlq_payload, read_at_ms }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(policy: &str, retention_ms: i64, segment_ms: i64) -> DlqSettings {
        DlqSettings { cleanup_policy: policy.into(), retention_ms, segment_ms, topic_overrides: BTreeMap::new() }
    }

    const DAY: i64 = 86_400_000;

    fn topic(oldest: Result<BTreeMap<i32, Option<i64>>, String>) -> DlqTopic {
        DlqTopic { topic: "dlq".into(), settings: Err("unread".into()), oldest, payload: DlqPayload::Redacted, read_at_ms: 100 * DAY }
    }

    #[test]
    fn the_ledger_cutoff_is_the_oldest_message_held_less_the_margin() {
        let held = BTreeMap::from([(0, Some(40 * DAY)), (1, Some(30 * DAY)), (2, None)]);
        assert_eq!(topic(Ok(held)).ledger_cutoff(), Some(30 * DAY - LEDGER_MARGIN_MS), "the oldest partition decides");
        let empty = BTreeMap::from([(0, None), (1, None)]);
        assert_eq!(topic(Ok(empty)).ledger_cutoff(), Some(100 * DAY - LEDGER_MARGIN_MS), "an empty topic: the read's start");
        assert_eq!(topic(Err("broker down".into())).ledger_cutoff(), None, "unknown: prune nothing");
    }

    #[test]
    fn a_message_lives_retention_plus_segment_and_for_ever_when_compacted() {
        assert_eq!(settings("delete", 7 * DAY, 7 * DAY).longest_ms(), Some(14 * DAY), "Kafka's default segment.ms doubles the life");
        assert!(!settings("delete", 7 * DAY, 7 * DAY).fit(7 * DAY));
        assert!(settings("delete", 6 * DAY, DAY).fit(7 * DAY));
        assert_eq!(settings("compact,delete", DAY, DAY).longest_ms(), None);
        assert_eq!(settings("delete", -1, DAY).longest_ms(), None);
    }

    #[test]
    fn the_target_fits_the_limit_and_keeps_the_topics_other_overrides() {
        let mut current = settings("compact", 7 * DAY, 7 * DAY);
        current.topic_overrides.insert("max.message.bytes".into(), "2000000".into());
        let t = target(&current, 7 * DAY);
        assert_eq!((t.cleanup_policy.as_str(), t.retention_ms, t.segment_ms), ("delete", 6 * DAY, DAY));
        assert!(t.fit(7 * DAY));
        assert_eq!(t.topic_overrides.get("max.message.bytes").map(String::as_str), Some("2000000"));
        // A shorter segment already set is kept; an hour is the floor.
        assert_eq!(target(&settings("delete", 7 * DAY, 600_000), 7 * DAY).segment_ms, 600_000);
        let two_hours = 7_200_000;
        let t = target(&settings("delete", DAY, DAY), two_hours);
        assert_eq!((t.retention_ms, t.segment_ms), (3_600_000, 3_600_000));
        for limit in [DAY, 7 * DAY, 30 * DAY] {
            assert!(target(&settings("delete", -1, -1), limit).fit(limit), "{limit}");
        }
    }
}
