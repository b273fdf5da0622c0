//! Internal events of the compactor: one function per thing that happens,
//! each writing its log line and updating its metrics in one place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inferlog_store::catalog::DayState;
use inferlog_store::http::registered;
use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone, Debug)]
pub struct Metrics {
    pub registry: Registry,
    day_states: IntCounterVec,
    rows_archived: IntCounter,
    bytes_written: IntCounter,
    objects_written: IntCounter,
    verification_failures: IntCounter,
    day_errors: IntCounterVec,
    pass_seconds: Histogram,
    days_pending: IntGauge,
    stage_seconds: prometheus::HistogramVec,
    unpriced_requests: IntCounterVec,
    budget_used: GaugeVec,
    budget_forecast: GaugeVec,
    rows_sampled: IntCounterVec,
    /// False after a pass with failed days; `/healthz` answers 503 then.
    pub healthy: Arc<AtomicBool>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let day_states =
            registered(&registry, IntCounterVec::new(Opts::new("inferlog_compactor_days_total", "Days that reached a state, by state"), &["state"]));
        let rows_archived =
            registered(&registry, IntCounter::new("inferlog_compactor_rows_archived_total", "Rows written to verified Parquet objects"));
        let bytes_written = registered(&registry, IntCounter::new("inferlog_compactor_bytes_written_total", "Bytes of Parquet objects written"));
        let objects_written = registered(&registry, IntCounter::new("inferlog_compactor_objects_written_total", "Parquet objects written"));
        let verification_failures = registered(
            &registry,
            IntCounter::new("inferlog_compactor_verification_failures_total", "Archives whose read-back did not match ClickHouse"),
        );
        let day_errors = registered(
            &registry,
            IntCounterVec::new(Opts::new("inferlog_compactor_day_errors_total", "Days whose work failed in a pass, by error class"), &["class"]),
        );
        let pass_seconds = registered(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new("inferlog_compactor_pass_seconds", "Duration of one pass over every closed day")
                    .buckets(vec![0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1200.0, 3600.0]),
            ),
        );
        let days_pending =
            registered(&registry, IntGauge::new("inferlog_compactor_days_pending", "Closed days not yet complete after the last pass"));
        let stage_seconds = registered(
            &registry,
            prometheus::HistogramVec::new(
                HistogramOpts::new("inferlog_compactor_stage_seconds", "Duration of one stage of one day")
                    .buckets(vec![0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0, 1200.0]),
                &["stage"],
            ),
        );
        let unpriced_requests = registered(
            &registry,
            IntCounterVec::new(
                Opts::new("inferlog_compactor_unpriced_requests_total", "Requests aggregated with no price for their model (cost NULL), by model"),
                &["model_name"],
            ),
        );
        let budget_used = registered(
            &registry,
            GaugeVec::new(
                Opts::new("inferlog_budget_used_ratio", "Share of the month's budget spent through the last closed day, by business line"),
                &["business_line"],
            ),
        );
        let budget_forecast = registered(
            &registry,
            GaugeVec::new(
                Opts::new("inferlog_budget_forecast_ratio", "Month-end spend at the month's rate so far, as a share of the budget, by business line"),
                &["business_line"],
            ),
        );
        let rows_sampled = registered(
            &registry,
            IntCounterVec::new(
                Opts::new("inferlog_compactor_sample_rows_total", "Rows a sampled archive kept, by reason (error, truncated, slow, long, sampled)"),
                &["reason"],
            ),
        );
        Metrics {
            registry,
            rows_sampled,
            unpriced_requests,
            budget_used,
            budget_forecast,
            day_states,
            rows_archived,
            bytes_written,
            objects_written,
            verification_failures,
            day_errors,
            pass_seconds,
            days_pending,
            stage_seconds,
            healthy: Arc::new(AtomicBool::new(true)),
        }
    }

    pub fn render(&self) -> String {
        inferlog_store::http::render(&self.registry)
    }
}

/// A day reached `state`.
pub fn day_state(m: &Metrics, day: &str, state: DayState, rows: u64) {
    m.day_states.with_label_values(&[state.as_str()]).inc();
    tracing::info!(day, state = state.as_str(), rows, "day state");
}

/// One stage (archive, verify, aggregate, release) of one day finished.
pub fn stage_finished(m: &Metrics, day: &str, stage: &'static str, rows: u64, elapsed: Duration) {
    m.stage_seconds.with_label_values(&[stage]).observe(elapsed.as_secs_f64());
    let rows_per_s = if elapsed.is_zero() { 0 } else { (rows as f64 / elapsed.as_secs_f64()) as u64 };
    tracing::info!(day, stage, rows, elapsed_ms = elapsed.as_millis() as u64, rows_per_s, "stage finished");
}

/// An object was written and closed.
/// A sampled archive of `day` kept `rows` rows of `line` for `reason`, standing for `represented` rows.
pub fn sample_kept(m: &Metrics, day: &str, line: &str, reason: &str, rows: u64, represented: u64) {
    m.rows_sampled.with_label_values(&[reason]).inc_by(rows);
    tracing::info!(day, business_line = line, reason, rows, represented, "sampled archive kept");
}

pub fn object_written(m: &Metrics, key: &str, rows: u64, bytes: u64) {
    m.objects_written.inc();
    m.bytes_written.inc_by(bytes);
    tracing::info!(key, rows, bytes, "parquet object written");
}

/// A day's objects were read back and matched ClickHouse.
pub fn day_verified(m: &Metrics, rows: u64) {
    m.rows_archived.inc_by(rows);
}

pub fn verification_failed(m: &Metrics, error: &dyn std::fmt::Display) {
    m.verification_failures.inc();
    tracing::error!(%error, "archive verification failed; the day stays hot");
}

/// A day's work failed in this pass; its recorded state is where the next pass resumes.
pub fn day_failed(m: &Metrics, day: &str, class: inferlog_schema::ErrorClass, error: &dyn std::fmt::Display) {
    let label = match class {
        inferlog_schema::ErrorClass::Retry => "retry",
        inferlog_schema::ErrorClass::Reject => "reject",
        inferlog_schema::ErrorClass::Fail => "fail",
    };
    m.day_errors.with_label_values(&[label]).inc();
    tracing::error!(day, class = label, %error, "day not completed in this pass");
}

pub fn pass_finished(m: &Metrics, elapsed: Duration, completed: usize, failed: usize, pending: usize) {
    m.pass_seconds.observe(elapsed.as_secs_f64());
    m.days_pending.set(pending as i64);
    m.healthy.store(failed == 0, Ordering::Relaxed);
    tracing::info!(elapsed_ms = elapsed.as_millis() as u64, completed, failed, pending, "pass finished");
}

/// A day's aggregates were written to Postgres.
pub fn day_published(m: &Metrics, day: &str, published: &crate::publish::Published) {
    for (model, requests) in &published.newly_unpriced {
        m.unpriced_requests.with_label_values(&[model.as_str()]).inc_by(*requests);
    }
    for (model, requests) in &published.unpriced {
        tracing::warn!(day, model, requests, "no price for the model: its cost is NULL (add a [[cost.prices]] entry, then reprice)");
    }
    tracing::info!(day, cost_usd = published.cost_usd, "aggregates published");
}

/// The budgets as of the last closed day; a line without a budget exports nothing.
pub fn budgets(m: &Metrics, status: &[inferlog_store::budget::BudgetStatus]) {
    m.budget_used.reset();
    m.budget_forecast.reset();
    for s in status {
        if let (Some(used), Some(forecast)) = (s.used_ratio, s.forecast_ratio) {
            m.budget_used.with_label_values(&[s.business_line.as_str()]).set(used);
            m.budget_forecast.with_label_values(&[s.business_line.as_str()]).set(forecast);
        }
        if s.over_alert() {
            tracing::warn!(business_line = %s.business_line, month = %s.month, used_ratio = s.used_ratio, "90% or more of the monthly budget used");
        }
    }
}
