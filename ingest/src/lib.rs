//! `inferlog-ingest`: Kafka → validate/normalize → ClickHouse, exactly once,
//! with rejects to the DLQ. Stages, in data-flow order:
//!
//! [`source`] (Kafka consumer group) → [`normalize`] (a chunk of messages
//! validated and normalized with `inferlog-schema`, and encoded as
//! ClickHouse rows, on a small thread pool)
//! → [`pipeline`] (skip replays and retries, in offset order) → [`batch`]
//! (per-day batches) → [`writer`] task, one batch in flight: [`clickhouse_sink`]
//! (hot rows) and [`dlq`] (rejects) → commit.

pub mod batch;
pub mod clickhouse_sink;
pub mod config;
pub mod dlq;
pub mod error;
pub mod memory;
pub mod metrics;
pub mod normalize;
pub mod offsets;
pub mod pipeline;
pub mod source;
pub mod writer;

pub use config::Config;
pub use error::IngestError;
