//! The ClickHouse sink, laid out as Vector's sinks are. In: rows encoded
//! as RowBinary, one UTC day of one shard per insert, the rejects log's
//! rows, and what each batch covers for the replay log. Out: rows durable
//! in the hot tier, each insert exactly once.
//!
//! - [`request`]: the body of one INSERT and the row that names it;
//! - [`service`]: [`ClickHouseSink`], the tables and the clients of every
//!   shard's replicas, the inserts and a retry's landed check;
//! - [`retry`]: the one retry policy every write goes through, the
//!   daemon's writer and `dlq replay` alike;
//! - [`replay_log`]: what each batch covers, and what a partition's next
//!   reader skips;
//! - [`in_flight`]: every INSERT named, so a retry or a partition's next
//!   reader ends or waits out the ones still running.
//!
//! Its settings are [`crate::config::ClickHouseConfig`].

pub mod in_flight;
pub mod replay_log;
pub mod request;
pub mod retry;
pub mod service;

pub use replay_log::Coverage;
pub use request::{reject_day, table_partition, EncodedRows, FirstRow};
pub use retry::{RetryPolicy, ShutdownBudget};
pub use service::{ClickHouseSink, ServerFeatures};
