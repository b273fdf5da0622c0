//! Internal events: one struct per thing that happens, each emitting its
//! log line and updating its Prometheus metrics in one place (the Vector
//! `internal_events` pattern), plus the `/metrics` and `/healthz` server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inferlog_store::http::registered;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;

use crate::error::IngestError;

/// Every ingest metric. Cloning shares the underlying counters.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub registry: Registry,
    messages: IntCounterVec,
    rows_inserted: IntCounter,
    rejects: IntCounterVec,
    dlq_produced: IntCounter,
    duplicates: IntCounterVec,
    dropped_fields: IntCounter,
    batch_rows: Histogram,
    flush_seconds: Histogram,
    insert_errors: IntCounter,
    consume_errors: IntCounter,
    consumer_lag: IntGaugeVec,
    inflight_rows: IntGauge,
    rebalances: IntCounterVec,
    offset_gaps: IntCounterVec,
    offsets_lost: IntCounter,
    dlq_truncated: IntCounter,
    caught_up_flushes: IntCounter,
    buffers_reused: IntCounter,
    session_lost: IntCounter,
    commit_failures: IntCounter,
    unowned: IntCounter,
    pauses: IntCounter,
    clock_skew: HistogramVec,
    spans_skipped: IntCounterVec,
    /// False while ClickHouse is failing; `/healthz` answers 503 then.
    healthy: Arc<AtomicBool>,
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

    pub fn render(&self) -> String {
        inferlog_store::http::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The counter of messages consumed from `topic` (looked up once per topic:
/// it is bumped for every message).
pub fn messages_counter(m: &Metrics, topic: &str) -> prometheus::IntCounter {
    m.messages.with_label_values(&[topic])
}

/// The clock-skew histogram of `topic` (looked up once per topic).
pub fn skew_histogram(m: &Metrics, topic: &str) -> Histogram {
    m.clock_skew.with_label_values(&[topic])
}

/// An offset commit failed or timed out; nothing is lost.
pub fn commit_failed(m: &Metrics, error: &str) {
    m.commit_failures.inc();
    tracing::warn!(error, "offset commit failed; the rows are durable and the partition's next reader skips them by the replay log");
}

/// A message of a partition this member does not own was dropped.
pub fn unowned_message(m: &Metrics, topic: &str, partition: i32, offset: i64) {
    m.unowned.inc();
    tracing::debug!(topic, partition, offset, "message of a partition this member does not own: dropped for its owner");
}

/// A wait began with every partition paused.
pub fn paused(m: &Metrics, what: &'static str) {
    m.pauses.inc();
    tracing::info!(what, "waiting with the partitions paused (the group keeps this member)");
}

/// Fields dropped from an accepted event (data minimisation).
pub fn fields_dropped(m: &Metrics, count: usize) {
    m.dropped_fields.inc_by(count as u64);
}

/// Spans of an OTLP message that were not inference requests.
pub fn spans_skipped(m: &Metrics, topic: &str, count: u32) {
    m.spans_skipped.with_label_values(&[topic]).inc_by(u64::from(count));
}

/// An event was rejected and will go to the DLQ.
pub fn event_rejected(m: &Metrics, reason: &'static str) {
    m.rejects.with_label_values(&[reason]).inc();
}

/// A message was skipped because it is already stored.
pub fn duplicate_skipped(m: &Metrics, kind: &'static str) {
    m.duplicates.with_label_values(&[kind]).inc();
}

pub fn inflight(m: &Metrics, rows: usize) {
    m.inflight_rows.set(rows as i64);
}

/// A batch became durable and its offsets were committed.
pub fn batch_flushed(m: &Metrics, rows: usize, rejects: usize, elapsed: Duration) {
    m.rows_inserted.inc_by(rows as u64);
    m.dlq_produced.inc_by(rejects as u64);
    m.batch_rows.observe((rows + rejects) as f64);
    m.flush_seconds.observe(elapsed.as_secs_f64());
    m.healthy.store(true, Ordering::Relaxed);
    tracing::debug!(rows, rejects, elapsed_ms = elapsed.as_millis() as u64, "batch flushed and committed");
}

/// The group session timed out before a batch was written; it is dropped.
pub fn session_lost(m: &Metrics) {
    m.session_lost.inc();
}

/// Row buffers batches took back from the pool since the last count.
pub fn buffers_reused(m: &Metrics, buffers: u64) {
    m.buffers_reused.inc_by(buffers);
}

/// The source has nothing more for now and the batch is big enough to insert.
pub fn caught_up_flush(m: &Metrics, rows: usize) {
    m.caught_up_flushes.inc();
    tracing::debug!(rows, "source read to its end: flushing without waiting for batch_max_age");
}

/// A transient consume error, waited out (the caller logs it).
pub fn consume_error(m: &Metrics) {
    m.consume_errors.inc();
}

/// A ClickHouse insert failed; it will be retried after `backoff`.
pub fn insert_failed(m: &Metrics, error: &IngestError, attempt: u32, backoff: Duration) {
    m.insert_errors.inc();
    m.healthy.store(false, Ordering::Relaxed);
    tracing::warn!(%error, attempt, backoff_ms = backoff.as_millis() as u64, "write failed; retrying");
}

/// The group assigned or revoked partitions.
pub fn rebalanced(m: &Metrics, kind: &'static str, partitions: &[(String, i32)]) {
    m.rebalances.with_label_values(&[kind]).inc();
    if kind == "revoke" {
        for (topic, partition) in partitions {
            let _ = m.consumer_lag.remove_label_values(&[topic, &partition.to_string()]);
        }
    }
    tracing::info!(kind, ?partitions, "rebalance");
}

/// Offsets below the broker's log start that ingest never read: one gap
/// with outcome "lost", and the number of offsets in it.
pub fn offsets_lost(m: &Metrics, offsets: i64) {
    m.offset_gaps.with_label_values(&["lost"]).inc();
    m.offsets_lost.inc_by(offsets.max(0) as u64);
}

/// A reject too large for the DLQ was written cut to `kept` bytes.
pub fn dlq_truncated(m: &Metrics, topic: &str, partition: i32, offset: i64, bytes: usize, kept: usize) {
    m.dlq_truncated.inc();
    tracing::warn!(topic, partition, offset, bytes, kept, "reject larger than the DLQ takes: written truncated (headers carry its size and SHA-256)");
}

pub fn offset_gap(m: &Metrics, outcome: &'static str) {
    m.offset_gaps.with_label_values(&[outcome]).inc();
}

pub fn consumer_lag(m: &Metrics, topic: &str, partition: i32, lag: i64) {
    m.consumer_lag.with_label_values(&[topic, &partition.to_string()]).set(lag.max(0));
}

/// Serves `/metrics` and `/healthz` (503 while ClickHouse writes fail) until shutdown.
pub async fn serve(addr: String, metrics: Metrics, shutdown: watch::Receiver<bool>) -> Result<(), IngestError> {
    inferlog_store::http::serve(addr, metrics.registry.clone(), metrics.healthy.clone(), "clickhouse writes failing", shutdown).await?;
    Ok(())
}
