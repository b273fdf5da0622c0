//! `inferlog-ingest dlq inspect`: what the DLQ holds. In: the DLQ topic's
//! messages ([`crate::dlq_reader`]), and an optional window on each
//! message's rejection time. Out: a [`Summary`]:
//! messages by reason × field × source topic and by UTC hour, one sample
//! per reason (the payload as stored: redacted unless `[kafka] dlq_payload
//! = "original"`), the messages inferlog did not write (no source
//! headers), and the oldest message's age against the hot tier's policy,
//! which the DLQ must not outlive.

use std::collections::BTreeMap;

use inferlog_schema::timestamp::format_rfc3339_ms;
use inferlog_store::kafka::KafkaConfig;
use inferlog_store::policy::Policy;
use serde::Serialize;

use crate::dlq::headers;
use crate::dlq_reader::{DlqReader, Record};
use crate::error::IngestError;

/// The bytes of a sample payload shown, at most.
const SAMPLE_BYTES: usize = 2048;

/// The rejection times to count, `[from, to)` in epoch ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
}

impl Window {
    pub fn contains(&self, ms: Option<i64>) -> bool {
        match ms {
            Some(ms) => self.from_ms.is_none_or(|f| ms >= f) && self.to_ms.is_none_or(|t| ms < t),
            None => self.from_ms.is_none() && self.to_ms.is_none(),
        }
    }
}

/// Messages of one reason × field × source topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonRow {
    pub reason: String,
    pub field: String,
    pub source_topic: String,
    pub messages: u64,
}

/// Messages refused in one UTC hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HourRow {
    pub hour: String,
    pub messages: u64,
}

/// The first message of a reason: where it came from and what the DLQ keeps of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sample {
    pub reason: String,
    pub field: String,
    pub message: String,
    pub source: String,
    /// `redacted` (ingest changed it: user ids hashed, personal data
    /// masked or removed), else `as_received`.
    pub payload_kind: String,
    /// The payload as stored (lossy UTF-8, its first 2 KiB).
    pub payload: String,
}

/// What the DLQ holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub topic: String,
    /// Messages read, and those in the window.
    pub read: u64,
    pub messages: u64,
    pub by_reason: Vec<ReasonRow>,
    pub by_hour: Vec<HourRow>,
    pub samples: Vec<Sample>,
    /// Messages without `inferlog.reason` or source headers: not written by
    /// inferlog (replay refuses them).
    pub foreign: u64,
    /// The oldest message of the topic (whatever the window), its age in
    /// seconds, the hot policy and whether the message outlived it.
    pub oldest: Option<String>,
    pub oldest_age_s: Option<i64>,
    pub policy: String,
    pub exceeds_policy: bool,
}

/// Folds DLQ messages into a [`Summary`].
#[derive(Debug, Default)]
pub struct Inspector {
    window: Window,
    read: u64,
    foreign: u64,
    oldest_ms: Option<i64>,
    by_reason: BTreeMap<(String, String, String), u64>,
    by_hour: BTreeMap<i64, u64>,
    samples: BTreeMap<String, Sample>,
}

impl Inspector {
    pub fn new(window: Window) -> Inspector {
        Inspector { window, ..Inspector::default() }
    }

    pub fn add(&mut self, record: &Record) {
        self.read += 1;
        let time = record.time_ms();
        if let Some(t) = time {
            self.oldest_ms = Some(self.oldest_ms.map_or(t, |o| o.min(t)));
        }
        if !self.window.contains(time) {
            return;
        }
        let (reason, topic) = (record.header(headers::REASON), record.header(headers::SOURCE_TOPIC));
        if reason.is_empty()
            || topic.is_empty()
            || record.header(headers::SOURCE_PARTITION).is_empty()
            || record.header(headers::SOURCE_OFFSET).is_empty()
        {
            self.foreign += 1;
            return;
        }
        let field = record.header(headers::FIELD);
        *self.by_reason.entry((reason.to_owned(), field.to_owned(), topic.to_owned())).or_default() += 1;
        if let Some(t) = time {
            *self.by_hour.entry(t.div_euclid(3_600_000) * 3_600_000).or_default() += 1;
        }
        if !self.samples.contains_key(reason) {
            let end = record.payload.len().min(SAMPLE_BYTES);
            self.samples.insert(
                reason.to_owned(),
                Sample {
                    reason: reason.to_owned(),
                    field: field.to_owned(),
                    message: record.header(headers::MESSAGE).to_owned(),
                    source: format!("{topic}/{}@{}", record.header(headers::SOURCE_PARTITION), record.header(headers::SOURCE_OFFSET)),
                    payload_kind: match record.header(headers::PAYLOAD) {
                        "redacted" => "redacted",
                        // An unreadable reject under `redacted`: no payload kept.
                        "none" => "none",
                        _ => "as_received",
                    }
                    .to_owned(),
                    payload: String::from_utf8_lossy(&record.payload[..end]).into_owned(),
                },
            );
        }
    }

    /// The summary, with the oldest message's age at `now_ms` against `policy`.
    pub fn finish(self, topic: &str, policy: Policy, now_ms: i64) -> Summary {
        let age_s = self.oldest_ms.map(|o| (now_ms - o).max(0) / 1000);
        let exceeds_policy = match (policy, age_s) {
            (Policy::Days(days), Some(age)) => age > i64::from(days) * 86_400,
            _ => false,
        };
        Summary {
            topic: topic.to_owned(),
            read: self.read,
            messages: self.foreign + self.by_reason.values().sum::<u64>(),
            by_reason: self
                .by_reason
                .into_iter()
                .map(|((reason, field, source_topic), messages)| ReasonRow { reason, field, source_topic, messages })
                .collect(),
            by_hour: self.by_hour.into_iter().map(|(h, messages)| HourRow { hour: format_rfc3339_ms(h), messages }).collect(),
            samples: self.samples.into_values().collect(),
            foreign: self.foreign,
            oldest: self.oldest_ms.map(format_rfc3339_ms),
            oldest_age_s: age_s,
            policy: policy.to_string(),
            exceeds_policy,
        }
    }
}

/// Reads the whole DLQ topic (to the high watermarks found at the start)
/// into `inspector`.
pub async fn read(kafka: &KafkaConfig, mut inspector: Inspector) -> Result<Inspector, IngestError> {
    let mut reader = DlqReader::start(kafka, "inspect")?;
    while let Some(record) = reader.next().await {
        inspector.add(&record);
    }
    reader.finish().await?;
    Ok(inspector)
}

/// The summary as text: the tables an operator reads first.
pub fn render_text(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "DLQ {}: {} messages read, {} in the window, {} not written by inferlog", s.topic, s.read, s.messages, s.foreign);
    match (&s.oldest, s.oldest_age_s) {
        (Some(oldest), Some(age)) => {
            let verdict = if s.exceeds_policy { "OLDER than the hot policy: check the topic's retention" } else { "within the hot policy" };
            let _ = writeln!(
                out,
                "oldest message {oldest}, {} old; hot policy {}: {verdict}",
                humantime::format_duration(std::time::Duration::from_secs(age as u64)),
                s.policy
            );
        }
        _ => {
            let _ = writeln!(out, "the topic is empty; hot policy {}", s.policy);
        }
    }
    let _ = writeln!(out, "\n{:<28} {:<24} {:<28} {:>10}", "reason", "field", "source topic", "messages");
    for r in &s.by_reason {
        let _ = writeln!(out, "{:<28} {:<24} {:<28} {:>10}", r.reason, r.field, r.source_topic, r.messages);
    }
    let _ = writeln!(out, "\n{:<26} {:>10}", "hour (UTC)", "messages");
    for h in &s.by_hour {
        let _ = writeln!(out, "{:<26} {:>10}", h.hour, h.messages);
    }
    for sample in &s.samples {
        let _ = writeln!(
            out,
            "\nsample of {} ({}; {}): {}\n  {} payload: {}",
            sample.reason, sample.field, sample.source, sample.message, sample.payload_kind, sample.payload
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use inferlog_schema::timestamp::parse_rfc3339_ms;

    use super::*;

    fn record(reason: &str, field: &str, topic: &str, time: &str) -> Record {
        let mut headers = BTreeMap::new();
        for (k, v) in [
            (headers::REASON, reason),
            (headers::FIELD, field),
            (headers::SOURCE_TOPIC, topic),
            (headers::SOURCE_PARTITION, "0"),
            (headers::SOURCE_OFFSET, "7"),
            (headers::TIME, time),
            (headers::PAYLOAD, "redacted"),
        ] {
            headers.insert(k.to_owned(), v.to_owned());
        }
        Record { partition: 0, offset: 0, timestamp_ms: None, headers, payload: b"{\"user_id\":\"k:ab\"}".to_vec() }
    }

    #[test]
    fn messages_count_by_reason_field_topic_and_hour_with_one_sample_each() {
        let mut i = Inspector::new(Window::default());
        i.add(&record("error_code.unknown", "error_code", "a", "2026-12-01T10:05:00.000Z"));
        i.add(&record("error_code.unknown", "error_code", "a", "2026-12-01T10:59:59.999Z"));
        i.add(&record("error_code.unknown", "error_code", "b", "2026-12-01T11:00:00.000Z"));
        i.add(&record("field.missing", "model_name", "a", "2026-12-01T11:30:00.000Z"));
        i.add(&Record { timestamp_ms: Some(1_764_590_400_000), payload: b"not ours".to_vec(), ..Record::default() });
        let now = parse_rfc3339_ms("2026-12-03T10:00:00Z").expect("time");
        let s = i.finish("dlq", Policy::Days(1), now);
        assert_eq!((s.read, s.messages, s.foreign), (5, 5, 1));
        let rows: Vec<(&str, &str, &str, u64)> =
            s.by_reason.iter().map(|r| (r.reason.as_str(), r.field.as_str(), r.source_topic.as_str(), r.messages)).collect();
        assert_eq!(
            rows,
            vec![("error_code.unknown", "error_code", "a", 2), ("error_code.unknown", "error_code", "b", 1), ("field.missing", "model_name", "a", 1)]
        );
        let hours: Vec<(&str, u64)> = s.by_hour.iter().map(|h| (h.hour.as_str(), h.messages)).collect();
        assert_eq!(hours, vec![("2026-12-01T10:00:00.000Z", 2), ("2026-12-01T11:00:00.000Z", 2)]);
        assert_eq!(s.samples.len(), 2);
        assert_eq!((s.samples[0].source.as_str(), s.samples[0].payload_kind.as_str()), ("a/0@7", "redacted"));
        // The foreign message (its broker timestamp, 2025-12-01T12:00Z) is the oldest, past the 1-day policy.
        assert_eq!(s.oldest.as_deref(), Some("2025-12-01T12:00:00.000Z"));
        assert!(s.exceeds_policy, "{s:?}");
    }

    #[test]
    fn the_window_counts_by_rejection_time_and_the_oldest_is_the_topics() {
        let from = parse_rfc3339_ms("2026-12-01T11:00:00Z").ok();
        let mut i = Inspector::new(Window { from_ms: from, to_ms: None });
        i.add(&record("r", "f", "a", "2026-12-01T10:59:59.999Z"));
        i.add(&record("r", "f", "a", "2026-12-01T11:00:00.000Z"));
        let s = i.finish("dlq", Policy::Days(7), parse_rfc3339_ms("2026-12-02T00:00:00Z").expect("time"));
        assert_eq!((s.read, s.messages), (2, 1));
        assert_eq!(s.oldest.as_deref(), Some("2026-12-01T10:59:59.999Z"));
        assert_eq!(s.oldest_age_s, Some(13 * 3600));
        assert!(!s.exceeds_policy);
        assert!(render_text(&s).contains("within the hot policy"));
    }
}
