//! Ingest's Prometheus registry and the `/metrics` and `/healthz` server.
//! In: what [`crate::internal_events`] emit. Out: the text exposition
//! format, and health (503 while ClickHouse writes fail).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use inferlog_store::http::registered;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;

use crate::error::IngestError;

/// Every ingest metric. Cloning shares the underlying counters.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub(crate) messages: IntCounterVec,
    pub(crate) rows_inserted: IntCounter,
    pub(crate) rejects: IntCounterVec,
    pub(crate) dlq_produced: IntCounter,
    pub(crate) duplicates: IntCounterVec,
    pub(crate) dropped_fields: IntCounter,
    pub(crate) batch_rows: Histogram,
    pub(crate) flush_seconds: Histogram,
    pub(crate) insert_errors: IntCounter,
    pub(crate) consume_errors: IntCounter,
    pub(crate) consumer_lag: IntGaugeVec,
    pub(crate) inflight_rows: IntGauge,
    pub(crate) rebalances: IntCounterVec,
    pub(crate) offset_gaps: IntCounterVec,
    pub(crate) offsets_lost: IntCounter,
    pub(crate) dlq_truncated: IntCounter,
    pub(crate) caught_up_flushes: IntCounter,
    pub(crate) buffers_reused: IntCounter,
    pub(crate) session_lost: IntCounter,
    pub(crate) commit_failures: IntCounter,
    pub(crate) unowned: IntCounter,
    pub(crate) pauses: IntCounter,
    pub(crate) clock_skew: HistogramVec,
    pub(crate) spans_skipped: IntCounterVec,
    /// False while ClickHouse is failing; `/healthz` answers 503 then.
    pub(crate) healthy: Arc<AtomicBool>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| registered(&registry, IntCounterVec::new(Opts::new(name, help), labels));
        let counter = |name: &str, help: &str| registered(&registry, IntCounter::new(name, help));
        let histogram =
            |name: &str, help: &str, buckets: Vec<f64>| registered(&registry, Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)));
        let consumer_lag = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new("inferlog_ingest_consumer_lag", "Messages behind the partition's high watermark (as the broker reports it)"),
                &["topic", "partition"],
            ),
        );
        let inflight_rows = registered(&registry, IntGauge::new("inferlog_ingest_inflight_rows", "Rows and rejects buffered, not yet durable"));
        Metrics {
            messages: counter_vec("inferlog_ingest_messages_total", "Messages consumed", &["topic"]),
            rows_inserted: counter("inferlog_ingest_rows_inserted_total", "Rows durable in ClickHouse"),
            rejects: counter_vec("inferlog_ingest_rejects_total", "Messages rejected, by reason code", &["reason"]),
            dlq_produced: counter("inferlog_ingest_dlq_produced_total", "Messages acknowledged by the DLQ topic"),
            duplicates: counter_vec(
                "inferlog_ingest_duplicates_total",
                "Messages skipped as already stored: replayed offsets, or producer retries of a request_id",
                &["kind"],
            ),
            dropped_fields: counter("inferlog_ingest_dropped_fields_total", "Unknown and prompt/completion fields dropped"),
            batch_rows: histogram(
                "inferlog_ingest_batch_rows",
                "Rows and rejects per flushed batch",
                vec![10.0, 100.0, 1_000.0, 10_000.0, 50_000.0, 100_000.0, 250_000.0, 1_000_000.0],
            ),
            flush_seconds: histogram(
                "inferlog_ingest_flush_seconds",
                "Time to make one batch durable and commit it",
                vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            ),
            insert_errors: counter("inferlog_ingest_insert_errors_total", "Failed ClickHouse inserts (retried)"),
            consume_errors: counter("inferlog_ingest_consume_errors_total", "Transient Kafka consume errors waited out (broker restarting, leader moving)"),
            rebalances: counter_vec("inferlog_ingest_rebalances_total", "Partition assignments and revocations", &["kind"]),
            offset_gaps: counter_vec(
                "inferlog_ingest_offset_gaps_total",
                "Gaps in the offsets a partition delivered: lost (deleted by retention before ingest read them) or skipped (transaction markers, compacted records: nothing to read)",
                &["outcome"],
            ),
            offsets_lost: counter("inferlog_ingest_offsets_lost_total", "Offsets deleted by the broker (retention) before ingest read them"),
            dlq_truncated: counter("inferlog_ingest_dlq_truncated_total", "Rejects larger than the DLQ takes, written truncated (headers inferlog.truncated, original size and SHA-256)"),
            caught_up_flushes: counter(
                "inferlog_ingest_caught_up_flushes_total",
                "Batches flushed before batch_max_age because the source was read to its end",
            ),
            buffers_reused: counter(
                "inferlog_ingest_buffers_reused_total",
                "Row buffers a batch took back from written batches instead of allocating new memory",
            ),
            session_lost: counter(
                "inferlog_ingest_session_lost_batches_total",
                "Batches not written because the group session timed out (their messages are read again by the partitions' next owner)",
            ),
            commit_failures: counter(
                "inferlog_ingest_commit_failures_total",
                "Offset commits that failed or timed out (the rows are durable; the partition's next reader skips them by the replay log)",
            ),
            unowned: counter(
                "inferlog_ingest_unowned_messages_total",
                "Messages of a partition this member no longer owns (revoked while they were read, or queued when the group session was lost), dropped unwritten for their next owner",
            ),
            pauses: counter(
                "inferlog_ingest_pauses_total",
                "Waits (a slow or failing write, a partition start) served with every partition paused, so the group keeps this member",
            ),
            clock_skew: registered(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "inferlog_ingest_event_clock_skew_seconds",
                        "Event timestamp less its Kafka message timestamp, per topic: hours away means a producer clock is off (local time, unsynchronised)",
                    )
                    .buckets(vec![-86_400.0, -3_600.0, -600.0, -60.0, -10.0, -1.0, 0.0, 1.0, 10.0, 60.0, 600.0, 3_600.0, 86_400.0]),
                    &["topic"],
                ),
            ),
            spans_skipped: counter_vec(
                "inferlog_ingest_otlp_spans_skipped_total",
                "Spans of OTLP messages that are not inference requests ([otlp] span_names, match_attributes), skipped",
                &["topic"],
            ),
            consumer_lag,
            inflight_rows,
            healthy: Arc::new(AtomicBool::new(true)),
            registry,
        }
    }

    /// The counter of messages consumed from `topic` (looked up once per
    /// topic: it is bumped for every message).
    pub fn messages_counter(&self, topic: &str) -> IntCounter {
        self.messages.with_label_values(&[topic])
    }

    /// The clock-skew histogram of `topic` (looked up once per topic).
    pub fn skew_histogram(&self, topic: &str) -> Histogram {
        self.clock_skew.with_label_values(&[topic])
    }

    pub fn render(&self) -> String {
        inferlog_store::http::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Serves `/metrics` and `/healthz` (503 while ClickHouse writes fail) until shutdown.
pub async fn serve(addr: String, metrics: Metrics, shutdown: watch::Receiver<bool>) -> Result<(), IngestError> {
    inferlog_store::http::serve(addr, metrics.registry.clone(), metrics.healthy.clone(), "clickhouse writes failing", shutdown).await?;
    Ok(())
}
