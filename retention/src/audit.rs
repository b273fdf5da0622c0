//! Audit. In: an [`Inventory`] and the policies at a point in time. Out:
//! per tier the policy, the oldest data held, the units held and how many
//! are past the policy, and every violation with its cause (a stable code):
//!
//! | cause | meaning |
//! |---|---|
//! | `expired.present` | a unit past its tier's policy is still held |
//! | `hot.unarchived` | a hot partition past retention has no verified archive (it cannot be dropped) |
//! | `manifest.object_missing` | a manifest row's object is not in the cold store |
//! | `object.unlisted` | a cold object has no manifest row |
//! | `cold.unknown_object` | a cold object's key names no day (`dt=YYYY-MM-DD/`): no policy can expire it |
//! | `dlq.retention_exceeds` | the DLQ topic's settings let a message outlive the hot policy (`retention.ms + segment.ms`, or `cleanup.policy=compact`) |
//! | `dlq.retention_unknown` | the broker does not report the DLQ topic's settings |
//! | `dlq.oldest_exceeds` | a DLQ partition's oldest message is older than the hot policy keeps |
//! | `dlq.oldest_unknown` | the DLQ partitions' oldest messages could not be read |
//! | `deleted.still_present` | the audit table records a deletion whose data is still there |
//! | `replica.stale` | a replica of a ClickHouse cluster still holds a hot day the compactor released or retention deleted |

use std::collections::{BTreeSet, HashSet};

use inferlog_store::catalog::DayState;
use inferlog_store::{day_string, Day, Policy, RetentionConfig};
use serde::Serialize;

use crate::inventory::Inventory;

/// Every cause the audit reports, in the order of the table above.
pub const CAUSES: [&str; 11] = [
    "expired.present",
    "hot.unarchived",
    "manifest.object_missing",
    "object.unlisted",
    "cold.unknown_object",
    "dlq.retention_exceeds",
    "dlq.retention_unknown",
    "dlq.oldest_exceeds",
    "dlq.oldest_unknown",
    "deleted.still_present",
    "replica.stale",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierReport {
    pub tier: &'static str,
    pub policy: String,
    pub oldest: Option<String>,
    pub units: usize,
    pub expired_units: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub tier: &'static str,
    pub unit: String,
    pub cause: &'static str,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqReport {
    pub topic: String,
    pub retention_ms: Option<i64>,
    pub segment_ms: Option<i64>,
    pub cleanup_policy: Option<String>,
    /// The longest a message can live under the settings, in ms (`None`: for ever, or unknown).
    pub longest_ms: Option<i64>,
    /// The oldest message held, over every partition (RFC 3339).
    pub oldest: Option<String>,
    pub policy: String,
    pub note: Option<String>,
    /// What the DLQ holds of a rejected message: "redacted" (no plaintext
    /// personal data) or "original (plaintext personal data)".
    pub payload: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    pub today: String,
    pub tiers: Vec<TierReport>,
    pub dlq: DlqReport,
    /// Second lines of defence: neither ClickHouse TTL nor an S3 lifecycle rule is set by inferlog.
    pub store_expiry: &'static str,
    pub violations: Vec<Violation>,
}

fn tier_report(tier: &'static str, policy: Policy, days: &[Day], today: Day) -> TierReport {
    TierReport {
        tier,
        policy: policy.to_string(),
        oldest: days.iter().min().map(|d| day_string(*d)),
        units: days.len(),
        expired_units: days.iter().filter(|d| policy.expired(**d, today)).count(),
    }
}

/// Audits `inventory` against `policies` on `today`.
pub fn audit(inventory: &Inventory, policies: &RetentionConfig, today: Day) -> AuditReport {
    let mut violations = Vec::new();
    let mut v = |tier: &'static str, unit: String, cause: &'static str, detail: String| violations.push(Violation { tier, unit, cause, detail });

    // Hot: one unit per day partition.
    let hot_days: Vec<Day> = inventory.hot.iter().map(|p| p.day).collect();
    for p in inventory.hot.iter().filter(|p| policies.hot_days.expired(p.day, today)) {
        if inventory.verified_archive(p.day) {
            v(
                "hot",
                day_string(p.day),
                "expired.present",
                format!("{} rows past the {} policy; the archive is verified, enforce drops it", p.rows, policies.hot_days),
            );
        } else {
            let state = inventory.days.get(&p.day).map_or("none", |r| r.state.as_str());
            v(
                "hot",
                day_string(p.day),
                "hot.unarchived",
                format!("{} rows past the {} policy without a verified archive (compactor state: {state}); not dropped", p.rows, policies.hot_days),
            );
        }
    }

    // The rejects log: one unit per day partition, under the hot policy.
    let reject_days: Vec<Day> = inventory.rejects.iter().map(|p| p.day).collect();
    for p in inventory.rejects.iter().filter(|p| policies.hot_days.expired(p.day, today)) {
        v(
            "rejects",
            day_string(p.day),
            "expired.present",
            format!("{} rejected messages logged past the {} policy; enforce drops them", p.rows, policies.hot_days),
        );
    }

    // Ingest's replay log: one unit per day its entries were written, under the hot policy.
    let replay_log_days: Vec<Day> = inventory.replay_log.iter().map(|p| p.day).collect();
    for p in inventory.replay_log.iter().filter(|p| policies.hot_days.expired(p.day, today)) {
        v(
            "replay_log",
            day_string(p.day),
            "expired.present",
            format!(
                "{} replay log entries written past the {} policy; enforce drops them once the group committed past them",
                p.rows, policies.hot_days
            ),
        );
    }

    // Aggregates: one unit per day.
    let aggregate_days: Vec<Day> = inventory.aggregate_days.keys().copied().collect();
    for (day, rows) in inventory.aggregate_days.iter().filter(|(d, _)| policies.aggregate_days.expired(**d, today)) {
        v("aggregates", day_string(*day), "expired.present", format!("{rows} rows past the {} policy", policies.aggregate_days));
    }

    // Cold: one unit per object.
    let listed: HashSet<&str> = inventory.objects.iter().map(|o| o.key.as_str()).collect();
    let manifested: HashSet<&str> = inventory.manifest.iter().map(|m| m.object_key.as_str()).collect();
    let in_progress =
        |day: Option<Day>| day.and_then(|d| inventory.days.get(&d)).is_some_and(|r| matches!(r.state, DayState::Archiving | DayState::Archived));
    let cold_days: Vec<Day> = inventory.objects.iter().filter_map(|o| o.day).collect();
    for o in &inventory.objects {
        if o.day.is_some_and(|d| policies.cold_days.expired(d, today)) {
            v("cold", o.key.clone(), "expired.present", format!("{} bytes past the {} policy", o.bytes, policies.cold_days));
        }
        if o.day.is_none() {
            v(
                "cold",
                o.key.clone(),
                "cold.unknown_object",
                format!("{} bytes under the cold prefix with no day in its key (dt=YYYY-MM-DD/): no policy expires it", o.bytes),
            );
        } else if !manifested.contains(o.key.as_str()) && !in_progress(o.day) {
            v("cold", o.key.clone(), "object.unlisted", format!("{} bytes with no manifest row", o.bytes));
        }
    }
    for m in inventory.manifest.iter().filter(|m| !listed.contains(m.object_key.as_str())) {
        v(
            "cold",
            m.object_key.clone(),
            "manifest.object_missing",
            format!("the manifest lists {} rows of {} in it, the store does not have it", m.rows, day_string(m.day)),
        );
    }

    // The DLQ holds rejected raw events: no longer than the hot tier holds
    // accepted ones. Its settings must make that so, and its oldest message
    // shows that it is.
    let dlq = &inventory.dlq;
    let limit_ms = match policies.hot_days {
        Policy::Days(n) => Some(i64::from(n) * 86_400_000),
        Policy::Forever => None,
    };
    let mut report = DlqReport {
        topic: dlq.topic.clone(),
        retention_ms: None,
        segment_ms: None,
        cleanup_policy: None,
        longest_ms: None,
        oldest: None,
        policy: policies.hot_days.to_string(),
        note: None,
        payload: match dlq.payload {
            inferlog_store::kafka::DlqPayload::Redacted => "redacted",
            inferlog_store::kafka::DlqPayload::Original => "original (plaintext personal data)",
        },
    };
    match &dlq.settings {
        Ok(settings) => {
            report.retention_ms = Some(settings.retention_ms);
            report.segment_ms = Some(settings.segment_ms);
            report.cleanup_policy = Some(settings.cleanup_policy.clone());
            report.longest_ms = settings.longest_ms();
            if let Some(limit) = limit_ms.filter(|l| !settings.fit(*l)) {
                let to = crate::dlq::target(settings, limit);
                let lives = settings.longest_ms().map_or_else(|| "for ever".to_owned(), |ms| format!("{ms} ms"));
                v(
                    "dlq",
                    dlq.topic.clone(),
                    "dlq.retention_exceeds",
                    format!(
                        "{}: a message can live {lives}, the hot policy {limit} ms; set {} (enforce does where the credentials allow AlterConfigs)",
                        settings.describe(),
                        to.describe()
                    ),
                );
            }
        }
        Err(why) => {
            v("dlq", dlq.topic.clone(), "dlq.retention_unknown", why.clone());
            report.note = Some(why.clone());
        }
    }
    match &dlq.oldest {
        Ok(partitions) => {
            let oldest = partitions.values().flatten().min().copied();
            report.oldest = oldest.map(inferlog_schema::timestamp::format_rfc3339_ms);
            let first_kept_ms = policies.hot_days.newest_expired(today).map(|d| (i64::from(d) + 1) * 86_400_000);
            for (partition, ms) in partitions {
                if let (Some(ms), Some(first_kept)) = (ms, first_kept_ms) {
                    if *ms < first_kept {
                        v(
                            "dlq",
                            format!("{}/{partition}", dlq.topic),
                            "dlq.oldest_exceeds",
                            format!(
                                "its oldest message is of {}, before {}, the oldest day the {} policy keeps",
                                inferlog_schema::timestamp::format_rfc3339_ms(*ms),
                                day_string((first_kept / 86_400_000) as Day),
                                policies.hot_days
                            ),
                        );
                    }
                }
            }
        }
        Err(why) => {
            v("dlq", dlq.topic.clone(), "dlq.oldest_unknown", why.clone());
            report.note.get_or_insert_with(|| why.clone());
        }
    }
    let dlq = report;

    // Deletions the audit table records must have happened.
    let hot_present: BTreeSet<String> = inventory.hot.iter().map(|p| day_string(p.day)).collect();
    let rejects_present: BTreeSet<String> = inventory.rejects.iter().map(|p| day_string(p.day)).collect();
    let replay_log_present: BTreeSet<String> = inventory.replay_log.iter().map(|p| day_string(p.day)).collect();
    let aggregates_present: BTreeSet<String> = inventory.aggregate_days.keys().map(|d| day_string(*d)).collect();
    for d in &inventory.deletions {
        let present = match d.tier.as_str() {
            // An erasure removes some users' rows of a day, not the day: `audit --user-ids` proves it.
            "hot" if d.action == "erase_rows" => false,
            "hot" => hot_present.contains(&d.unit),
            "rejects" => rejects_present.contains(&d.unit),
            "replay_log" => replay_log_present.contains(&d.unit),
            "aggregates" => aggregates_present.contains(&d.unit),
            // A superseded object's key may be written again by a later
            // archive of its day: then the manifest lists it, and it is new.
            // Nor may a key an erasure wrote again (the day archived anew from the hot tier).
            "cold" if d.action == "delete_superseded" || d.action.starts_with("erase_") => {
                listed.contains(d.unit.as_str()) && !manifested.contains(d.unit.as_str())
            }
            "cold" => listed.contains(d.unit.as_str()),
            // The unit is the cut-off: no stored entry older than it may remain.
            "dlq_ledger" => inferlog_schema::timestamp::parse_rfc3339_ms(&d.unit)
                .is_ok_and(|cutoff| inventory.ledger_oldest.is_some_and(|oldest| oldest < cutoff)),
            _ => false,
        };
        if present {
            let tier = match d.tier.as_str() {
                "hot" => "hot",
                "rejects" => "rejects",
                "replay_log" => "replay_log",
                "aggregates" => "aggregates",
                "dlq_ledger" => "dlq_ledger",
                _ => "cold",
            };
            v(tier, d.unit.clone(), "deleted.still_present", "the audit table records its deletion, the data is still there".into());
        }
    }

    // A cluster's replicas: a hot day released or deleted is gone from each.
    let gone = |day: Day| {
        inventory.days.get(&day).is_some_and(|r| r.state == DayState::Released)
            || inventory.deletions.iter().any(|d| d.tier == "hot" && d.unit == day_string(day))
    };
    for replica in &inventory.replicas {
        for p in replica.partitions.iter().filter(|p| gone(p.day)) {
            v(
                "hot",
                day_string(p.day),
                "replica.stale",
                format!("replica {} (shard {}) still holds {} rows of a released day", replica.url, replica.shard + 1, p.rows),
            );
        }
    }

    AuditReport {
        today: day_string(today),
        tiers: vec![
            tier_report("hot", policies.hot_days, &hot_days, today),
            tier_report("rejects", policies.hot_days, &reject_days, today),
            tier_report("replay_log", policies.hot_days, &replay_log_days, today),
            tier_report("aggregates", policies.aggregate_days, &aggregate_days, today),
            tier_report("cold", policies.cold_days, &cold_days, today),
        ],
        dlq,
        store_expiry: "not set: ClickHouse TTL and S3 lifecycle rules are not managed by inferlog; enforce is the only expiry",
        violations,
    }
}

/// The text form of a report.
pub fn render_text(r: &AuditReport) -> String {
    let mut out = format!("retention audit on {}\n{:<11} {:<8} {:<11} {:>6} {:>8}\n", r.today, "tier", "policy", "oldest", "units", "expired");
    for t in &r.tiers {
        out += &format!("{:<11} {:<8} {:<11} {:>6} {:>8}\n", t.tier, t.policy, t.oldest.as_deref().unwrap_or("-"), t.units, t.expired_units);
    }
    let unknown = || "unknown".to_owned();
    out += &format!(
        "dlq         {:<8} {:<11} topic {} cleanup.policy {} retention.ms {} segment.ms {}\n",
        r.dlq.policy,
        r.dlq.oldest.as_deref().map_or("-", |o| o.get(..10).unwrap_or(o)),
        r.dlq.topic,
        r.dlq.cleanup_policy.clone().unwrap_or_else(unknown),
        r.dlq.retention_ms.map_or_else(unknown, |m| m.to_string()),
        r.dlq.segment_ms.map_or_else(unknown, |m| m.to_string()),
    );
    out += &format!("dlq payload: {}\n", r.dlq.payload);
    out += &format!("store expiry: {}\n", r.store_expiry);
    if r.violations.is_empty() {
        out += "clean: no violations\n";
    } else {
        out += &format!("{} violations:\n", r.violations.len());
        for v in &r.violations {
            out += &format!("  {} {} {}: {}\n", v.tier, v.unit, v.cause, v.detail);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::CAUSES;

    /// The metrics and alert rules are keyed by `CAUSES`: a cause the audit
    /// can emit but that is missing there would never raise an alert.
    #[test]
    fn every_cause_the_audit_emits_is_listed() {
        let source = include_str!("audit.rs");
        let code = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        let literals: Vec<&str> = code.split('"').skip(1).step_by(2).collect();
        let emitted: Vec<&str> = literals
            .iter()
            .copied()
            .filter(|l| {
                let mut halves = l.splitn(2, '.');
                let ok = |h: Option<&str>| h.is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
                ok(halves.next()) && ok(halves.next())
            })
            .collect();
        assert!(emitted.len() >= 2 * CAUSES.len(), "found {emitted:?}");
        for cause in &emitted {
            assert!(CAUSES.contains(cause), "{cause} is emitted but not in CAUSES");
        }
        for cause in CAUSES {
            assert!(emitted.iter().filter(|e| **e == cause).count() >= 2, "{cause} is listed but never emitted");
        }
    }
}
