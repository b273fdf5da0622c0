//! Events of one message's events: rejected, skipped as stored, trimmed.

use super::InternalEvent;
use crate::metrics::Metrics;

/// An event was rejected and goes to the DLQ.
#[derive(Debug)]
pub struct EventRejected {
    pub reason: &'static str,
}

impl InternalEvent for EventRejected {
    fn emit(self, m: &Metrics) {
        m.rejects.with_label_values(&[self.reason]).inc();
    }
}

/// An event was skipped as already stored: `kind` is "replay" (its offset
/// was handled by an earlier reader) or "request_id" (a producer's retry).
#[derive(Debug)]
pub struct DuplicateSkipped {
    pub kind: &'static str,
}

impl InternalEvent for DuplicateSkipped {
    fn emit(self, m: &Metrics) {
        m.duplicates.with_label_values(&[self.kind]).inc();
    }
}

/// Fields dropped from an accepted event (data minimisation).
#[derive(Debug)]
pub struct FieldsDropped {
    pub count: usize,
}

impl InternalEvent for FieldsDropped {
    fn emit(self, m: &Metrics) {
        m.dropped_fields.inc_by(self.count as u64);
    }
}

/// Spans of an OTLP message that were not inference requests.
#[derive(Debug)]
pub struct SpansSkipped<'a> {
    pub topic: &'a str,
    pub count: u32,
}

impl InternalEvent for SpansSkipped<'_> {
    fn emit(self, m: &Metrics) {
        m.spans_skipped.with_label_values(&[self.topic]).inc_by(u64::from(self.count));
    }
}

/// A reject too large for the DLQ was written cut to `kept` bytes.
#[derive(Debug)]
pub struct DlqTruncated<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub bytes: usize,
    pub kept: usize,
}

impl InternalEvent for DlqTruncated<'_> {
    fn emit(self, m: &Metrics) {
        m.dlq_truncated.inc();
        tracing::warn!(
            topic = self.topic,
            partition = self.partition,
            offset = self.offset,
            bytes = self.bytes,
            kept = self.kept,
            "reject larger than the DLQ takes: written truncated (headers carry its size and SHA-256)"
        );
    }
}
