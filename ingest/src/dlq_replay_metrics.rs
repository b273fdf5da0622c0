//! A replay's figures for Prometheus. In: the [`Summary`] of a finished
//! `dlq replay` run. Out: the text exposition format, written by
//! `--metrics-file` for node_exporter's textfile collector (the way a batch
//! job's results reach Prometheus): per DLQ and reason, the events the run
//! replayed, found already stored, left invalid and refused; the late rows;
//! and when the run finished. Labels are bounded: the DLQ topic and the
//! reason codes.

use prometheus::{Encoder, GaugeVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::dlq_replay::Summary;

/// The run's figures as Prometheus text; `finished_s` is the Unix time
/// the run ended.
pub fn render(summary: &Summary, finished_s: f64) -> Result<String, prometheus::Error> {
    let registry = Registry::new();
    let events = IntGaugeVec::new(
        Opts::new(
            "inferlog_dlq_replay_events",
            "Events of the last dlq replay run, by the reason the DLQ holds them for and what the run did with them",
        ),
        &["dlq_topic", "reason", "outcome"],
    )?;
    let late = IntGaugeVec::new(
        Opts::new("inferlog_dlq_replay_late_rows", "Rows the last dlq replay run stored for days already released (archived as a supplement)"),
        &["dlq_topic"],
    )?;
    let finished = GaugeVec::new(
        Opts::new("inferlog_dlq_replay_last_run_timestamp_seconds", "When the last dlq replay run finished (Unix time)"),
        &["dlq_topic"],
    )?;
    registry.register(Box::new(events.clone()))?;
    registry.register(Box::new(late.clone()))?;
    registry.register(Box::new(finished.clone()))?;
    let topic = summary.dlq_topic.as_str();
    for line in &summary.by_reason {
        for (outcome, n) in
            [("replayed", line.replayed), ("already_stored", line.already_stored), ("still_invalid", line.still_invalid), ("refused", line.refused)]
        {
            events.with_label_values(&[topic, line.reason.as_str(), outcome]).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    late.with_label_values(&[topic]).set(i64::try_from(summary.late_rows).unwrap_or(i64::MAX));
    finished.with_label_values(&[topic]).set(finished_s);
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlq_replay::ReasonLine;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
    }

    /// Every reason's four outcomes and the late rows are series of their
    /// own, with the figures of the run.
    #[test]
    fn each_reason_and_outcome_is_a_series_with_the_runs_figure() {
        let line = |reason: &str, replayed, already_stored, still_invalid, refused| ReasonLine {
            reason: reason.to_owned(),
            selected: replayed + already_stored + still_invalid + refused,
            replayed,
            already_stored,
            still_invalid,
            refused,
        };
        let summary = Summary {
            dlq_topic: "events-dlq".to_owned(),
            by_reason: vec![line("error_code.unknown", 120, 3, 0, 0), line("field.missing", 0, 0, 41, 2)],
            late_rows: 17,
            ..Summary::default()
        };
        let text = render(&summary, 1_796_400_000.5).expect("render");
        let series = |reason: &str, outcome: &str| {
            value(&text, &format!("inferlog_dlq_replay_events{{dlq_topic=\"events-dlq\",outcome=\"{outcome}\",reason=\"{reason}\"}}"))
        };
        assert_eq!(series("error_code.unknown", "replayed"), Some(120.0), "{text}");
        assert_eq!(series("error_code.unknown", "already_stored"), Some(3.0));
        assert_eq!(series("field.missing", "still_invalid"), Some(41.0));
        assert_eq!(series("field.missing", "refused"), Some(2.0));
        assert_eq!(series("field.missing", "replayed"), Some(0.0));
        assert_eq!(value(&text, "inferlog_dlq_replay_late_rows{dlq_topic=\"events-dlq\"}"), Some(17.0));
        assert_eq!(value(&text, "inferlog_dlq_replay_last_run_timestamp_seconds{dlq_topic=\"events-dlq\"}"), Some(1_796_400_000.5));
        assert_eq!(text.lines().filter(|l| l.starts_with("inferlog_dlq_replay_events{")).count(), 8, "two reasons × four outcomes");
    }
}
