//! `inferlog-ingest`: Kafka → validate/normalize → ClickHouse, exactly once,
//! with rejects to the DLQ. The daemon is [`pipeline`], one type per stage
//! under a supervisor; in data-flow order:
//!
//! source ([`source`]: the Kafka consumer group; [`partitions`] owned and
//! started, [`offsets`] per partition) → [`normalize`] (a chunk of messages
//! validated and normalized with `inferlog-schema`, and encoded as
//! ClickHouse rows, on a small thread pool; an OTLP message's inference
//! spans each an event, [`otlp`]; [`skew`] of event clocks) → batcher
//! ([`batch`], the per-day batch; [`dedup`], producer retries and
//! conflicts) → write ([`writer`], one batch in flight: [`sort`] each
//! insert's rows in the table's order, [`sink`] the ClickHouse sink and its
//! replay log, [`late_days`], and [`dlq`] for rejects as [`redact`] leaves
//! them) → commit ([`offset_commit`]).
//!
//! Beside the loop: [`broker`] (retried broker round trips), [`lag`]
//! (consumer lag, its own task), [`drain`] (`--exit-when-idle`),
//! [`internal_events`] (each thing that happens, its log line and metrics
//! on the [`metrics`] registry), [`hooks`] (test faults),
//! [`service_metrics`] (the live service metrics of every stored event,
//! counted when its batch is durable).
//!
//! Apart from the daemon, the DLQ read back ([`dlq_reader`]):
//! [`dlq_inspect`] (`inferlog-ingest dlq inspect`, what the DLQ holds) and
//! [`dlq_replay`] (`inferlog-ingest dlq replay`, what now passes stored
//! once, by its source coordinates, through the same [`sink`]) and
//! [`dlq_replay_metrics`] (a run's figures for Prometheus).

pub mod batch;
pub mod broker;
pub mod config;
pub mod dedup;
pub mod dlq;
pub mod dlq_inspect;
pub mod dlq_reader;
pub mod dlq_replay;
pub mod dlq_replay_metrics;
pub mod drain;
pub mod error;
pub mod hooks;
pub mod internal_events;
pub mod lag;
pub mod late_days;
pub mod memory;
pub mod metrics;
pub mod normalize;
pub mod offset_commit;
pub mod offsets;
pub mod otlp;
pub mod partitions;
pub mod pipeline;
pub mod redact;
pub mod service_metrics;
pub mod sink;
pub mod skew;
pub mod sort;
pub mod source;
pub mod writer;

pub use config::Config;
pub use error::IngestError;
