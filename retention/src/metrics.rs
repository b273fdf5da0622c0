//! Internal events of `inferlog-retention --daemon`: one function per thing
//! that happens, each writing its log line and updating its metrics in one
//! place. In: enforce actions and audit reports. Out: `/metrics`, which the
//! alert rules in `deploy/prometheus/` read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use inferlog_store::http::registered;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::audit::{AuditReport, CAUSES};
use crate::enforce::{Action, Outcome};

#[derive(Clone, Debug)]
pub struct Metrics {
    pub registry: Registry,
    deletions: IntCounterVec,
    refusals: IntCounterVec,
    violations: IntGaugeVec,
    expired_units: IntGaugeVec,
    pass_errors: IntCounter,
    last_success: IntGauge,
    /// False after a failed pass or an audit with violations; `/healthz` answers 503 then.
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
        let counter_by = |name: &str, help: &str, label: &str| registered(&registry, IntCounterVec::new(Opts::new(name, help), &[label]));
        let gauge_by = |name: &str, help: &str, label: &str| registered(&registry, IntGaugeVec::new(Opts::new(name, help), &[label]));
        let violations = gauge_by("inferlog_retention_audit_violations", "Violations the last audit found, by cause (0 when clean)", "cause");
        for cause in CAUSES {
            violations.with_label_values(&[cause]).set(0);
        }
        Metrics {
            deletions: counter_by("inferlog_retention_deletions_total", "Units deleted past their policy (dry runs excluded), by tier", "tier"),
            refusals: counter_by(
                "inferlog_retention_refusals_total",
                "Expired units enforce refused to delete (a hot day without a verified archive), by tier",
                "tier",
            ),
            violations,
            expired_units: gauge_by("inferlog_retention_expired_units", "Units past their policy still held at the last audit, by tier", "tier"),
            pass_errors: registered(
                &registry,
                IntCounter::new("inferlog_retention_pass_errors_total", "Enforce + audit passes that failed (a tier unreachable)"),
            ),
            last_success: registered(
                &registry,
                IntGauge::new(
                    "inferlog_retention_last_success_timestamp_seconds",
                    "Unix time of the last pass whose enforce and audit both completed",
                ),
            ),
            registry,
            healthy: Arc::new(AtomicBool::new(true)),
        }
    }
}

/// Enforce finished: count what it deleted and refused.
pub fn enforced(m: &Metrics, actions: &[Action]) {
    for a in actions {
        match a.outcome {
            Outcome::Deleted => m.deletions.with_label_values(&[a.tier]).inc(),
            Outcome::Refused(_) => m.refusals.with_label_values(&[a.tier]).inc(),
            Outcome::WouldDelete | Outcome::Set(_) | Outcome::WouldSet(_) | Outcome::Busy => {}
        }
    }
}

/// The audit after enforce: every cause's count (zero when absent), so an
/// alert on `> 0` fires for as long as the violation lasts.
pub fn audited(m: &Metrics, report: &AuditReport, unix_seconds: i64) {
    for cause in CAUSES {
        let n = report.violations.iter().filter(|v| v.cause == cause).count();
        m.violations.with_label_values(&[cause]).set(n as i64);
    }
    for tier in &report.tiers {
        m.expired_units.with_label_values(&[tier.tier]).set(tier.expired_units as i64);
    }
    m.last_success.set(unix_seconds);
    m.healthy.store(report.violations.is_empty(), Ordering::Relaxed);
    if report.violations.is_empty() {
        tracing::info!("audit clean");
    } else {
        tracing::warn!(violations = report.violations.len(), "audit found violations");
    }
}

/// A pass failed (a tier unreachable): nothing was proven this time.
pub fn pass_failed(m: &Metrics, error: &dyn std::fmt::Display) {
    m.pass_errors.inc();
    m.healthy.store(false, Ordering::Relaxed);
    tracing::error!(%error, "retention pass failed; retrying next interval");
}
