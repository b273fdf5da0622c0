//! Internal events, as Vector lays them out: each thing that happens in
//! ingest is a leaf struct of primitives whose [`InternalEvent::emit`]
//! writes its log line and updates its Prometheus metrics in one place.
//! In: the event's facts. Out: a log line and metric updates on the
//! [`Metrics`] registry ([`crate::metrics`]).
//!
//! A call site says what happened (`BatchFlushed { rows, .. }.emit(&m)`);
//! how it is counted and logged is written here, once.

mod clickhouse;
mod events;
mod kafka;

pub use clickhouse::{BatchFlushed, BuffersReused, InFlightRows, InsertFailed};
pub use events::{DlqTruncated, DuplicateSkipped, EventRejected, FieldsDropped, SpansSkipped};
pub use kafka::{
    CaughtUpFlush, CommitFailed, ConsumeError, ConsumerLag, OffsetsLost, OffsetsSkipped, Paused, Rebalanced, SessionLost, UnownedMessage,
};

use crate::metrics::Metrics;

/// Something that happened, emitted once where it happened.
pub trait InternalEvent {
    /// Writes the event's log line (if it has one) and updates its metrics.
    fn emit(self, metrics: &Metrics);
}
