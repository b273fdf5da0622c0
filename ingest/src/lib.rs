//! `inferlog-ingest`: Kafka → validate/normalize → ClickHouse, exactly once,
//! with rejects to the DLQ. Stages, in data-flow order:
//!
//! [`source`] (Kafka consumer group; [`partitions`] owned and started) →
//! [`normalize`] (a chunk of messages validated and normalized with
//! `inferlog-schema`, and encoded as ClickHouse rows, on a small thread
//! pool; an OTLP message's inference spans each an event, [`otlp`]) → [`pipeline`] (drop unowned partitions' messages, skip replays
//! and retries, in offset order; [`skew`] of event clocks) → [`batch`]
//! (per-day batches) → [`writer`] task, one batch in flight:
//! [`replay_log`] (what the batch covers), [`sort`] (each insert's rows
//! in the table's order), [`clickhouse_sink`] (hot rows)
//! and [`dlq`] (rejects, as [`redact`] leaves them) → [`commit`].
//!
//! Beside the loop: [`broker`] (retried broker round trips), [`lag`]
//! (consumer lag, its own task), [`drain`] (`--exit-when-idle`),
//! [`offsets`] (per-partition bookkeeping), [`in_flight`] (every INSERT
//! named; a partition's reader waits out the ones in flight before it
//! reads the replay log), [`hooks`] (test faults), [`service_metrics`]
//! (the live service metrics of every stored event, counted when its
//! batch is durable).
//!
//! Apart from the daemon, the DLQ read back ([`dlq_reader`]):
//! [`dlq_inspect`] (`inferlog-ingest dlq inspect`, what the DLQ holds) and
//! [`dlq_replay`] (`inferlog-ingest dlq replay`, what now passes stored
//! once, by its source coordinates) and [`dlq_replay_metrics`] (a run's
//! figures for Prometheus).

pub mod batch;
pub mod broker;
pub mod clickhouse_sink;
pub mod commit;
pub mod config;
pub mod dlq;
pub mod dlq_inspect;
pub mod dlq_reader;
pub mod dlq_replay;
pub mod dlq_replay_metrics;
pub mod drain;
pub mod error;
pub mod hooks;
pub mod in_flight;
pub mod lag;
pub mod late_days;
pub mod memory;
pub mod metrics;
pub mod normalize;
pub mod offsets;
pub mod otlp;
pub mod partitions;
pub mod pipeline;
pub mod redact;
pub mod replay_log;
pub mod service_metrics;
pub mod skew;
pub mod sort;
pub mod source;
pub mod writer;

pub use config::Config;
pub use error::IngestError;
