//! Retention against the real ClickHouse, Postgres, S3 server and broker:
//! audit reports exactly the expected violations at an injected time,
//! enforce deletes exactly the expired units and audits every deletion,
//! an unarchived hot day is never dropped, cold-store drift is reported,
//! dry runs change nothing, and a kill -9 mid-enforce converges.

use std::time::{Duration, Instant};

use inferlog_tests::tiers::{day_string, today, TierScenario};
use inferlog_tests::{kafka_brokers, kafkatool};

/// Policies: hot 7 days, aggregates 20, cold 25; a DLQ topic of one-day
/// segments keeping `dlq_retention_ms` (-1: forever), or no DLQ topic at
/// all (`None`: the broker cannot report its retention).
fn scenario(name: &str, dlq_retention_ms: Option<i64>) -> TierScenario {
    scenario_with(name, "", dlq_retention_ms)
}

/// [`scenario`] with `cold_extra` in the `[cold]` table.
fn scenario_with(name: &str, cold_extra: &str, dlq_retention_ms: Option<i64>) -> TierScenario {
    let id = inferlog_tests::unique(name);
    let dlq = format!("{id}-dlq");
    if let Some(ms) = dlq_retention_ms {
        kafkatool(&["create-topics", "--partitions", "1", "--config", &format!("retention.ms={ms}"), "--config", "segment.ms=86400000", &dlq]);
    }
    TierScenario::with(
        name,
        cold_extra,
        &format!(
            "[kafka]\nbrokers = \"{}\"\ndlq_topic = \"{dlq}\"\n\n[retention]\nhot_days = 7\naggregate_days = 20\ncold_days = 25\n",
            kafka_brokers()
        ),
    )
}

/// With one-day segments, a message lives at most the 7 days of the hot policy.
const SIX_DAYS_MS: i64 = 6 * 86_400_000;

/// The scenario's DLQ topic, from its config file.
fn dlq_topic(s: &TierScenario) -> String {
    let config = std::fs::read_to_string(&s.config).expect("config");
    config.lines().find_map(|l| l.strip_prefix("dlq_topic = \"").map(|t| t.trim_end_matches('"').to_owned())).expect("dlq_topic")
}

/// Noon of `today() + offset` as RFC 3339.
fn at(offset: i32) -> String {
    noon(today() + offset)
}

/// Noon of `day` as RFC 3339.
fn noon(day: i32) -> String {
    format!("{}T12:00:00Z", day_string(day))
}

/// 30 days of rows ending two days before `t`, compacted as of noon of `t`
/// (days past the 7-day hot policy released): the compactor's clock is
/// pinned, so scenarios compared with each other see the same `t` even
/// when UTC midnight passes between them.
fn thirty_compacted_days(s: &TierScenario, per_day: usize, t: i32) {
    s.seed(per_day * 30, 30, t - 2, 51);
    let clock = noon(t);
    let out = s.command("inferlog-compactor", &["--once"], "compactor.log", &[(inferlog_store::test_hooks::NOW_ENV, &clock)]).output().expect("run");
    assert!(out.status.success(), "{}", s.log("compactor.log"));
}

fn audit_json(s: &TierScenario, now: &str, log: &str) -> (i32, serde_json::Value) {
    let (code, stdout) = s.run("inferlog-retention", &["audit", "--format", "json", "--now", now], log);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout} {}", s.log(log)));
    (code, report)
}

/// (tier, unit, cause) of every violation, sorted.
fn violations(report: &serde_json::Value) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = report["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .map(|v| {
            (v["tier"].as_str().unwrap_or("").to_owned(), v["unit"].as_str().unwrap_or("").to_owned(), v["cause"].as_str().unwrap_or("").to_owned())
        })
        .collect();
    v.sort();
    v
}

fn object_key(s: &TierScenario, day: i32) -> String {
    format!("{}dt={}/part-0000.parquet", s.prefix, day_string(day))
}

#[test]
fn audit_reports_exactly_the_expired_units_enforce_removes_them_and_audits_each() {
    let s = scenario("ret_policy", Some(SIX_DAYS_MS));
    let t = today();
    thirty_compacted_days(&s, 150, t);
    // As of today + 5: hot keeps days >= t-2, aggregates >= t-15, cold >= t-20.
    let now = noon(t + 5);
    let mut expected: Vec<(String, String, String)> = Vec::new();
    for d in (t - 7)..=(t - 3) {
        expected.push(("hot".into(), day_string(d), "expired.present".into()));
    }
    for d in (t - 31)..=(t - 16) {
        expected.push(("aggregates".into(), day_string(d), "expired.present".into()));
    }
    for d in (t - 31)..=(t - 21) {
        expected.push(("cold".into(), object_key(&s, d), "expired.present".into()));
    }
    expected.sort();
    let (code, report) = audit_json(&s, &now, "audit1.log");
    assert_eq!(code, 1, "violations exit 1");
    assert_eq!(violations(&report), expected, "exactly the expired units, nothing else");
    assert_eq!(report["dlq"]["retention_ms"], SIX_DAYS_MS, "the broker reports the DLQ retention");
    let hot = &report["tiers"][0];
    assert_eq!(
        (hot["tier"].as_str(), hot["oldest"].as_str(), hot["units"].as_u64(), hot["expired_units"].as_u64()),
        (Some("hot"), Some(day_string(t - 7).as_str()), Some(6), Some(5))
    );

    // Dry run: reports the same units, deletes nothing, audits them as dry runs.
    let before = s.end_state();
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--dry-run", "--now", &now], "dry.log");
    assert_eq!(code, 0, "{}", s.log("dry.log"));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("would delete ")).count(), expected.len(), "{stdout}");
    assert!(!stdout.contains("\ndeleted "), "{stdout}");
    let after_dry = s.end_state();
    let without_audit = |state: &str| state.split("--audit").next().unwrap_or("").to_owned() + state.split("--objects").nth(1).unwrap_or("");
    assert_eq!(without_audit(&after_dry), without_audit(&before), "a dry run changes no data");
    assert_eq!(s.psql("SELECT count(*) FROM retention_audit WHERE dry_run AND actor = 'retention'"), expected.len().to_string());
    assert_eq!(violations(&audit_json(&s, &now, "audit-dry.log").1), expected, "dry-run rows are not deletions");

    // Enforce: exactly the expired units go, each with an audit row.
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &now], "enforce.log");
    assert_eq!(code, 0, "{}", s.log("enforce.log"));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("deleted ")).count(), expected.len(), "{stdout}");
    let (code, report) = audit_json(&s, &now, "audit2.log");
    assert_eq!(code, 0, "clean after enforce: {report}");
    assert!(violations(&report).is_empty());
    assert_eq!(s.hot_days().into_iter().map(|(d, _)| d).collect::<Vec<_>>(), vec![day_string(t - 2)]);
    assert_eq!(s.psql("SELECT min(day)::text FROM daily_aggregates"), day_string(t - 15));
    assert_eq!(s.psql("SELECT min(day)::text FROM hourly_aggregates"), day_string(t - 15), "hourly rows go with their day");
    assert_eq!(s.psql("SELECT min(day)::text FROM daily_series"), day_string(t - 15), "the series go with their day");
    assert_eq!(s.psql("SELECT min(day)::text FROM daily_waste"), day_string(t - 15), "the waste goes with its day");
    assert_eq!(s.psql("SELECT min(day)::text FROM daily_outputs"), day_string(t - 15), "the output lengths go with their day");
    let objects: Vec<String> = s.s3_objects().into_iter().map(|(k, _)| k).collect();
    assert_eq!(objects.first(), Some(&object_key(&s, t - 20)), "oldest object kept");
    assert_eq!(objects.len(), 19, "days t-20 ..= t-2");
    assert_eq!(s.psql("SELECT count(*) FROM cold_manifest"), "19", "manifest rows of deleted objects are gone");
    let audited = s.psql("SELECT tier, unit FROM retention_audit WHERE NOT dry_run AND actor = 'retention' ORDER BY tier, unit");
    let mut listed: Vec<(String, String)> = expected.iter().map(|(t, u, _)| (t.clone(), u.clone())).collect();
    listed.sort();
    assert_eq!(audited, listed.iter().map(|(t, u)| format!("{t}\t{u}")).collect::<Vec<_>>().join("\n"), "every deletion audited once");
    assert_eq!(
        s.psql("SELECT count(*) FROM retention_audit WHERE NOT dry_run AND (rows IS NULL AND bytes IS NULL OR policy = '')"),
        "0",
        "each audit row carries its size and policy"
    );
    // Idempotent: nothing left to do.
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &now], "enforce2.log");
    assert_eq!((code, stdout.trim()), (0, ""), "{}", s.log("enforce2.log"));
}

#[test]
fn an_unarchived_hot_day_is_never_dropped_and_drift_in_the_cold_store_is_reported() {
    let s = scenario("ret_unarch", Some(SIX_DAYS_MS));
    let t = today();
    s.seed(2_000, 2, t - 3, 61);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "{}", s.log("compactor.log"));
    // A third day the compactor never saw.
    s.seed(500, 1, t - 1, 62);
    let now = at(10); // every hot day past the 7-day policy
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &now], "enforce.log");
    assert_eq!(code, 1, "a refused deletion is a problem found: {stdout}");
    assert!(stdout.contains(&format!("refused hot {}: no verified archive", day_string(t - 1))), "{stdout}");
    assert_eq!(s.hot_days().into_iter().map(|(d, _)| d).collect::<Vec<_>>(), vec![day_string(t - 1)], "only the archived days were dropped");
    let (code, report) = audit_json(&s, &now, "audit.log");
    assert_eq!(code, 1);
    assert_eq!(violations(&report), vec![("hot".into(), day_string(t - 1), "hot.unarchived".into())], "{report}");

    // Cold drift: an object deleted behind the manifest's back, and an object nobody listed.
    let missing = object_key(&s, t - 4);
    let orphan = format!("{}dt={}/stray.parquet", s.prefix, day_string(t - 3));
    let script = "import sys, boto3\n\
        s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='inferlog', aws_secret_access_key=sys.argv[4])\n\
        s3.delete_object(Bucket='inferlog-cold', Key=sys.argv[2])\n\
        s3.put_object(Bucket='inferlog-cold', Key=sys.argv[3], Body=b'not parquet')\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script, &inferlog_tests::tiers::s3_endpoint(), &missing, &orphan, &inferlog_tests::tiers::s3_secret()])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, report) = audit_json(&s, &at(0), "audit-drift.log");
    assert_eq!(code, 1);
    assert_eq!(
        violations(&report),
        vec![("cold".into(), missing, "manifest.object_missing".into()), ("cold".into(), orphan, "object.unlisted".into())],
        "{report}"
    );
}

#[test]
fn a_dlq_kept_longer_than_the_hot_policy_or_of_unknown_retention_is_a_violation() {
    for (name, retention, cause) in [
        ("ret_dlq_long", Some(30 * 86_400_000i64), vec!["dlq.retention_exceeds"]),
        ("ret_dlq_forever", Some(-1), vec!["dlq.retention_exceeds"]),
        // The 6 days of retention.ms and Kafka's default week of segment.ms: up to 13 days.
        ("ret_dlq_segment", Some(SIX_DAYS_MS), vec!["dlq.retention_exceeds"]),
        ("ret_dlq_missing", None, vec!["dlq.oldest_unknown", "dlq.retention_unknown"]),
    ] {
        let s = scenario(name, retention);
        if name == "ret_dlq_segment" {
            kafkatool(&["alter-config", "--topic", &dlq_topic(&s), "segment.ms=604800000"]);
        }
        let (code, report) = audit_json(&s, &at(0), "audit.log");
        assert_eq!(code, 1, "{report}");
        assert_eq!(violations(&report).into_iter().map(|v| v.2).collect::<Vec<_>>(), cause, "{report}");
        let (code, text) = s.run("inferlog-retention", &["audit"], "audit-text.log");
        assert_eq!(code, 1);
        assert!(text.contains(cause[0]) && text.contains("violations"), "{text}");
    }
}

#[test]
fn a_tier_that_cannot_be_reached_exits_75() {
    let s = scenario("ret_down", Some(SIX_DAYS_MS));
    let config = std::fs::read_to_string(&s.config).expect("config").replace("127.0.0.1:8123", "127.0.0.1:1");
    std::fs::write(&s.config, config).expect("config");
    let (code, _) = s.run("inferlog-retention", &["audit"], "audit.log");
    assert_eq!(code, 75, "never a silent pass; transient, run again: {}", s.log("audit.log"));
    assert!(s.log("audit.log").contains("hot tier"), "{}", s.log("audit.log"));
}

#[test]
fn kill_9_during_enforce_converges_to_the_uninterrupted_end_state() {
    // One day for every scenario, whatever the wall clock does meanwhile.
    let t = today();
    let now = noon(t + 5);
    let reference = {
        let s = scenario("ret_kill_ref", Some(SIX_DAYS_MS));
        thirty_compacted_days(&s, 60, t);
        let (code, _) = s.run("inferlog-retention", &["enforce", "--now", &now], "enforce.log");
        assert_eq!(code, 0, "{}", s.log("enforce.log"));
        s.end_state()
    };
    for tier in ["hot", "aggregates", "cold"] {
        let s = scenario(&format!("ret_kill_{tier}"), Some(SIX_DAYS_MS));
        thirty_compacted_days(&s, 60, t);
        s.kill_at("inferlog-retention", &["enforce", "--now", &now], "INFERLOG_RETENTION_PAUSE_AFTER", tier, "paused.log");
        let (code, _) = s.run("inferlog-retention", &["enforce", "--now", &now], "resume.log");
        assert_eq!(code, 0, "{}", s.log("resume.log"));
        assert_eq!(s.end_state(), reference, "end state after kill -9 during the {tier} tier");
    }
}

#[test]
fn the_daemon_publishes_the_audit_as_metrics_and_stops_on_sigterm() {
    // No DLQ topic: the broker cannot report its retention (dlq.retention_unknown).
    let s = scenario("ret_daemon", None);
    let addr = inferlog_tests::free_loopback_addr();
    let mut child = s.spawn("inferlog-retention", &["enforce", "--daemon"], "daemon.log", &[("INFERLOG_RETENTION__METRICS_ADDR", addr.as_str())]);
    let get = |path: &str| inferlog_tests::http_get(&addr, path);
    let started = Instant::now();
    let mut metrics = String::new();
    while !metrics.lines().any(|l| l.starts_with("inferlog_retention_last_success_timestamp_seconds ") && !l.ends_with(" 0")) {
        assert!(started.elapsed() < Duration::from_secs(60), "no complete pass: {metrics}\n{}", s.log("daemon.log"));
        std::thread::sleep(Duration::from_millis(200));
        metrics = get("/metrics");
    }
    for expected in [
        "inferlog_retention_audit_violations{cause=\"dlq.retention_unknown\"} 1",
        "inferlog_retention_audit_violations{cause=\"expired.present\"} 0",
        "inferlog_retention_audit_violations{cause=\"hot.unarchived\"} 0",
        "inferlog_retention_pass_errors_total 0",
    ] {
        assert!(metrics.contains(expected), "{expected} in {metrics}");
    }
    assert!(get("/healthz").starts_with("HTTP/1.1 503"), "unhealthy while the audit is not clean");
    let status = inferlog_tests::sigterm(&mut child, Duration::from_secs(20));
    assert!(status.success(), "SIGTERM between passes exits 0: {status}");
}

/// pyarrow, like S3 consoles, leaves 0-byte "folder" keys
/// (`<prefix>/dt=YYYY-MM-DD/`) when it creates a directory or deletes the
/// last object in one. They are not data: audit does not report them and
/// enforce, even past every policy, ends clean with them there.
#[test]
fn folder_markers_left_by_pyarrow_are_not_objects() {
    let s = scenario("ret_marker", Some(SIX_DAYS_MS));
    let t = today();
    s.seed(1_000, 1, t - 3, 71);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "{}", s.log("compactor.log"));
    let (old, archived) = (format!("{}dt={}", s.prefix, day_string(t - 40)), format!("{}dt={}", s.prefix, day_string(t - 3)));
    let script = "import sys\n\
        from pyarrow import fs\n\
        s3 = fs.S3FileSystem(endpoint_override=sys.argv[1], scheme='http', region='us-east-1', access_key='inferlog', secret_key=sys.argv[2])\n\
        for d in sys.argv[3:]: s3.create_dir('inferlog-cold/' + d + '/empty')\n\
        for d in sys.argv[3:]: s3.delete_dir('inferlog-cold/' + d + '/empty')\n";
    let endpoint = inferlog_tests::tiers::s3_endpoint();
    let endpoint = endpoint.trim_start_matches("http://");
    let out = std::process::Command::new("python3")
        .args(["-c", script, endpoint, &inferlog_tests::tiers::s3_secret(), &old, &archived])
        .output()
        .expect("python3");
    assert!(out.status.success(), "pyarrow: {}", String::from_utf8_lossy(&out.stderr));
    let markers: Vec<(String, u64)> = s.s3_objects().into_iter().filter(|(k, _)| k.ends_with('/')).collect();
    assert!(!markers.is_empty(), "pyarrow left folder markers: {:?}", s.s3_objects());

    let (code, report) = audit_json(&s, &at(0), "audit.log");
    assert_eq!((code, violations(&report)), (0, vec![]), "{report}");
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &at(40)], "enforce.log");
    assert_eq!(code, 0, "{stdout}\n{}", s.log("enforce.log"));
    let (code, report) = audit_json(&s, &at(40), "audit-late.log");
    assert_eq!((code, violations(&report)), (0, vec![]), "clean with the markers still there: {report}");
}

/// Seeds the rejects log with `per_day` rejected messages on each day from
/// `today + first` to `today + last` (the ingest DDL of
/// `inferlog_store::model::tables::REJECTS`, rows written by SQL, not by inferlog).
fn seed_rejects(s: &TierScenario, first: i32, last: i32, per_day: u64) {
    let version = inferlog_store::hot::parse_version(&inferlog_tests::clickhouse("SELECT version()"));
    let (database, table) = s.rejects_table().split_once('.').map(|(d, t)| (d.to_owned(), t.to_owned())).expect("database.table");
    inferlog_tests::clickhouse(&inferlog_store::model::tables::REJECTS.ddl(&database, &table, version));
    let days = (last - first + 1) as u64;
    inferlog_tests::clickhouse(&format!(
        "INSERT INTO {} (day, received_at, reason, field, message, kafka_topic, kafka_partition, kafka_offset, bytes) \
         SELECT toDate('{}') + intDiv(number, {per_day}), toDateTime(toDate('{}') + intDiv(number, {per_day})), 'field.missing', 'model_name', 'is required', 'events', 0, number, 100 \
         FROM system.numbers LIMIT {}",
        s.rejects_table(),
        day_string(today() + first),
        day_string(today() + first),
        days * per_day
    ));
}

/// Rejects-log rows per day: (day, rows), counted by SQL.
fn reject_days(s: &TierScenario) -> Vec<(String, u64)> {
    inferlog_tests::clickhouse(&format!("SELECT toString(day), count() FROM {} GROUP BY day ORDER BY day", s.rejects_table()))
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(d, n)| (d.to_owned(), n.parse().unwrap_or(0))))
        .collect()
}

/// The rejects log is a copy of every rejected message's reason and
/// coordinates: the hot policy covers it. Audit reports its expired days,
/// enforce drops them with an audit row each (written before the drop:
/// a kill -9 in between is reported, and the next run finishes it).
#[test]
fn the_rejects_log_is_kept_under_the_hot_policy_dropped_and_audited() {
    let s = scenario("ret_rejects", Some(SIX_DAYS_MS));
    seed_rejects(&s, -10, 0, 40);
    let t = today();
    // On today, the 7-day policy keeps t-7 ..= t: t-10, t-9 and t-8 are expired.
    let expired: Vec<(String, String, String)> =
        ((t - 10)..=(t - 8)).map(|d| ("rejects".to_owned(), day_string(d), "expired.present".to_owned())).collect();
    let (code, report) = audit_json(&s, &at(0), "audit1.log");
    assert_eq!((code, violations(&report)), (1, expired.clone()), "{report}");
    let rejects = report["tiers"].as_array().expect("tiers").iter().find(|t| t["tier"] == "rejects").cloned().expect("a rejects tier");
    assert_eq!((rejects["units"].as_u64(), rejects["expired_units"].as_u64(), rejects["policy"].as_str()), (Some(11), Some(3), Some("7d")));

    // Killed after the first audit row, before its drop.
    s.kill_at("inferlog-retention", &["enforce", "--now", &at(0)], "INFERLOG_RETENTION_PAUSE_AFTER", "rejects", "paused.log");
    let (code, report) = audit_json(&s, &at(0), "audit2.log");
    assert_eq!(code, 1);
    let mut after_kill = expired.clone();
    after_kill.push(("rejects".into(), day_string(t - 10), "deleted.still_present".into()));
    after_kill.sort();
    assert_eq!(violations(&report), after_kill, "the audited, undropped day is reported: {report}");

    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &at(0)], "enforce.log");
    assert_eq!(code, 0, "{stdout}\n{}", s.log("enforce.log"));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("deleted rejects ")).count(), 3, "{stdout}");
    let kept: Vec<(String, u64)> = ((t - 7)..=t).map(|d| (day_string(d), 40)).collect();
    assert_eq!(reject_days(&s), kept, "exactly the expired days dropped, every other row kept");
    assert_eq!(
        s.psql("SELECT unit, rows FROM retention_audit WHERE tier = 'rejects' AND NOT dry_run GROUP BY unit, rows ORDER BY unit"),
        ((t - 10)..=(t - 8)).map(|d| format!("{}\t40", day_string(d))).collect::<Vec<_>>().join("\n"),
        "each drop audited with its rows"
    );
    let (code, report) = audit_json(&s, &at(0), "audit3.log");
    assert_eq!((code, violations(&report)), (0, vec![]), "{report}");
}

/// A policy under which the archive or the aggregates would go before the
/// hot rows could strand a day in the hot tier: every binary that reads
/// the policies refuses it at start, exit 2, naming the fields.
#[test]
fn a_cold_or_aggregate_policy_shorter_than_the_hot_one_is_refused_at_start() {
    let s = scenario("ret_strand", Some(SIX_DAYS_MS));
    s.rewrite_config("cold_days = 25", "cold_days = 5");
    for (binary, args) in [("inferlog-retention", vec!["audit"]), ("inferlog-compactor", vec!["--once"])] {
        let log = format!("{binary}.log");
        let (code, _) = s.run(binary, &args, &log);
        assert_eq!(code, 2, "{binary}: {}", s.log(&log));
        assert!(s.log(&log).contains("retention.cold_days (5d) must be at least retention.hot_days (7d)"), "{binary}: {}", s.log(&log));
    }
    s.rewrite_config("cold_days = 5", "cold_days = 25");
    s.rewrite_config("aggregate_days = 20", "aggregate_days = 6");
    let (code, _) = s.run("inferlog-retention", &["audit"], "aggregates.log");
    assert_eq!(code, 2, "{}", s.log("aggregates.log"));
    assert!(s.log("aggregates.log").contains("retention.aggregate_days (6d)"), "{}", s.log("aggregates.log"));
}

/// Re-archiving a day in fewer objects deletes the earlier split's extra
/// objects: each with an audit row (tier cold, `delete_superseded`), and a
/// kill -9 between the row and the deletion is reported, then finished by
/// the next pass. An object whose key names no day is reported.
#[test]
fn superseded_objects_are_deleted_with_an_audit_row_and_keys_without_a_day_are_reported() {
    let s = scenario_with("ret_superseded", "object_max_rows = 1500\nrow_group_rows = 1024\n", Some(SIX_DAYS_MS));
    let t = today();
    s.seed(5_000, 1, t - 1, 81);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "first.log");
    assert_eq!(code, 0, "{}", s.log("first.log"));
    let first: Vec<String> = s.s3_objects().into_iter().map(|(k, _)| k).collect();
    assert_eq!(first.len(), 4, "5,000 rows at 1,500 per object: {first:?}");

    s.rewrite_config("object_max_rows = 1500", "object_max_rows = 3000");
    let day = day_string(t - 1);
    s.kill_at("inferlog-compactor", &["--day", &day], "INFERLOG_COMPACTOR_PAUSE_AFTER", "superseded", "paused.log");
    let superseded = [format!("{}dt={day}/part-0002.parquet", s.prefix), format!("{}dt={day}/part-0003.parquet", s.prefix)];
    let (code, report) = audit_json(&s, &at(0), "audit1.log");
    assert_eq!(code, 1);
    let v = violations(&report);
    assert!(
        v.contains(&("cold".into(), superseded[0].clone(), "deleted.still_present".into())),
        "the audited, undeleted object is reported: {report}"
    );

    let (code, _) = s.run("inferlog-compactor", &["--once"], "resume.log");
    assert_eq!(code, 0, "{}", s.log("resume.log"));
    let objects: Vec<String> = s.s3_objects().into_iter().map(|(k, _)| k).collect();
    assert_eq!(objects, first[..2].to_vec(), "the two objects of the new split remain");
    assert_eq!(
        s.psql(
            "SELECT DISTINCT unit FROM retention_audit WHERE tier = 'cold' AND action = 'delete_superseded' AND actor = 'compactor' ORDER BY unit"
        ),
        superseded.join("\n"),
        "every superseded object's deletion audited"
    );
    assert_eq!(s.psql("SELECT sum(rows) FROM cold_manifest"), "5000", "the new split holds every row");

    let stray = format!("{}notes/readme.parquet", s.prefix);
    s.s3_put(&stray, b"not inferlog's");
    let (code, report) = audit_json(&s, &at(0), "audit2.log");
    assert_eq!((code, violations(&report)), (1, vec![("cold".into(), stray, "cold.unknown_object".into())]), "{report}");
}

/// The DLQ is audited by what it holds, not by what its settings promise:
/// a message ten days old in a topic whose settings would keep it 31 days
/// is reported with its partition, and so are the settings. Enforce sets
/// settings that fit (AlterConfigs, audited, the topic's other overrides
/// kept); the broker then deletes the old segment and the audit is clean.
#[test]
fn the_dlq_is_audited_by_its_oldest_message_and_enforce_fits_its_settings() {
    let s = scenario("ret_dlq_oldest", Some(30 * 86_400_000));
    let topic = dlq_topic(&s);
    kafkatool(&["alter-config", "--topic", &topic, "max.message.bytes=2000000"]);
    let ten_days_ago = inferlog_tests::now_ms() - 10 * 86_400_000;
    let file = s.dir.path().join("old.jsonl");
    std::fs::write(&file, "{\"request_id\":\"old-1\"}\n{\"request_id\":\"old-2\"}\n").expect("write");
    kafkatool(&["produce", "--topic", &topic, "--timestamp-ms", &ten_days_ago.to_string(), &file.to_string_lossy()]);

    let (code, report) = audit_json(&s, &at(0), "audit1.log");
    assert_eq!(code, 1);
    assert_eq!(
        violations(&report),
        vec![("dlq".into(), topic.clone(), "dlq.retention_exceeds".into()), ("dlq".into(), format!("{topic}/0"), "dlq.oldest_exceeds".into())],
        "{report}"
    );
    assert_eq!(report["dlq"]["oldest"].as_str(), Some(inferlog_schema::timestamp::format_rfc3339_ms(ten_days_ago).as_str()), "{report}");
    assert_eq!(report["dlq"]["longest_ms"], 31 * 86_400_000i64, "retention.ms + segment.ms");

    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &at(0)], "enforce.log");
    assert_eq!(code, 0, "{stdout}\n{}", s.log("enforce.log"));
    assert!(stdout.contains(&format!("set dlq {topic} cleanup.policy=delete retention.ms=518400000 segment.ms=86400000")), "{stdout}");
    assert_eq!(
        s.psql(&format!("SELECT action, policy, detail FROM retention_audit WHERE tier = 'dlq' AND unit = '{topic}' AND NOT dry_run")),
        "alter_configs\t7d\tcleanup.policy=delete retention.ms=2592000000 segment.ms=86400000 -> cleanup.policy=delete retention.ms=518400000 segment.ms=86400000",
        "the change audited"
    );
    // The broker deletes the ten-day-old segment (its check runs every second here).
    inferlog_tests::wait_for(
        Duration::from_secs(120),
        || violations(&audit_json(&s, &at(0), "audit-wait.log").1).is_empty(),
        || format!("{}", audit_json(&s, &at(0), "audit-last.log").1),
    );
    let described = kafkatool(&["describe-config", "--topic", &topic]);
    assert!(described.contains("\"max.message.bytes\": \"2000000\""), "the topic's other override is kept: {described}");
}

/// Rows that arrive for a day already released (a batch flushed just
/// after midnight) are not left in the hot tier for ever, and enforce no
/// longer says "deleted" while dropping nothing: enforce refuses the day
/// until the compactor has archived the rows as a supplement object
/// (verified, in the manifest), then dropped them with an audit row. A
/// kill -9 between the manifest and the drop is finished by the next
/// pass, into the same object. The archive, read with pyarrow, then holds
/// every event of the day exactly once.
#[test]
fn late_rows_on_a_released_day_are_archived_as_a_supplement_then_dropped_and_audited() {
    let s = scenario("ret_late", Some(SIX_DAYS_MS));
    let t = today();
    let first = s.seed(2_000, 2, t - 10, 91);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "{}", s.log("compactor.log"));
    assert!(s.hot_days().is_empty(), "both days archived and released: {:?}", s.hot_days());
    let late = TierScenario::events(37, 1, t - 10, 92);
    s.insert(&late);
    let day = day_string(t - 10);

    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &at(0)], "enforce1.log");
    assert_eq!(code, 1, "{stdout}\n{}", s.log("enforce1.log"));
    assert!(stdout.contains(&format!("refused hot {day}: 37 rows arrived after the day was released")), "{stdout}");
    assert_eq!(s.hot_days(), vec![(day.clone(), 37)], "nothing dropped unarchived");

    s.kill_at("inferlog-compactor", &["--once"], "INFERLOG_COMPACTOR_PAUSE_AFTER", "supplemented", "paused.log");
    let (code, _) = s.run("inferlog-compactor", &["--once"], "resume.log");
    assert_eq!(code, 0, "{}", s.log("resume.log"));
    assert!(s.hot_days().is_empty(), "the late rows dropped: {:?}", s.hot_days());

    let supplements = s.psql(&format!("SELECT object_key, rows FROM cold_manifest WHERE day = '{day}' AND object_key LIKE '%/late-%'"));
    assert_eq!(supplements.lines().count(), 1, "one supplement object, written twice under one key: {supplements}");
    assert!(supplements.ends_with("\t37"), "{supplements}");
    let archive = s.read_archive(0);
    let mut ids: Vec<String> = archive
        .as_array()
        .expect("objects")
        .iter()
        .filter(|o| o["key"].as_str().is_some_and(|k| k.contains(&format!("dt={day}/"))))
        .flat_map(|o| o["request_ids"].as_array().expect("ids").iter().map(|v| v.as_str().expect("id").to_owned()))
        .collect();
    ids.sort();
    let mut expected: Vec<String> =
        first.iter().chain(&late).filter(|e| e.timestamp_ms.div_euclid(86_400_000) == i64::from(t - 10)).map(|e| e.request_id.clone()).collect();
    expected.sort();
    assert_eq!(ids.len(), expected.len(), "every event of the day once in the archive");
    assert_eq!(ids, expected);
    assert_eq!(
        s.psql(&format!(
            "SELECT count(*), max(rows) FROM retention_audit WHERE tier = 'hot' AND unit = '{day}' AND actor = 'compactor' AND detail LIKE '%late-%'"
        )),
        "1\t37",
        "the drop audited once, before it happened"
    );
    let (code, report) = audit_json(&s, &at(0), "audit.log");
    assert_eq!((code, violations(&report)), (0, vec![]), "{report}");
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &at(0)], "enforce2.log");
    assert_eq!((code, stdout.trim()), (0, ""), "{}", s.log("enforce2.log"));
}

/// Ingest's replay log (`<table>_offsets`: per batch and partition, the
/// offsets it covers) is a copy under the hot policy too. Its entries are
/// read only past the group's committed offset, so enforce drops an
/// expired day once the group committed past every entry of it (an audit
/// row each), and refuses a day with an entry still ahead, naming it,
/// until the group commits past it. (Entries written on old days by SQL,
/// in the ingest DDL; the committed offsets by an independent client.)
#[test]
fn the_replay_log_is_dropped_past_the_hot_policy_once_the_group_committed_past_it() {
    let id = inferlog_tests::unique("ret_replaylog");
    let (topic, group, dlq) = (format!("{id}-events"), format!("{id}-group"), format!("{id}-dlq"));
    kafkatool(&["create-topics", "--partitions", "1", &topic]);
    kafkatool(&["create-topics", "--partitions", "1", "--config", &format!("retention.ms={SIX_DAYS_MS}"), "--config", "segment.ms=86400000", &dlq]);
    let s = TierScenario::with(
        "ret_replaylog",
        "",
        &format!(
            "[kafka]\nbrokers = \"{}\"\ntopics = [\"{topic}\"]\ngroup_id = \"{group}\"\ndlq_topic = \"{dlq}\"\n\n[retention]\nhot_days = 7\naggregate_days = 20\ncold_days = 25\n",
            kafka_brokers()
        ),
    );
    let (database, table) = s.qualified_table().split_once('.').map(|(d, t)| (d.to_owned(), t.to_owned())).expect("database.table");
    let log = inferlog_store::model::tables::replay_log_table(&table);
    let version = inferlog_store::hot::parse_version(&inferlog_tests::clickhouse("SELECT version()"));
    inferlog_tests::clickhouse(&inferlog_store::model::tables::REPLAY_LOG.ddl(&database, &log, version));
    let t = today();
    // Days t-10, t-9, t-8 and t-1, each with batches of 10 offsets: 100 offsets a day from 0.
    for (i, day) in [t - 10, t - 9, t - 8, t - 1].into_iter().enumerate() {
        inferlog_tests::clickhouse(&format!(
            "INSERT INTO {database}.{log} (day, written_at, kafka_topic, kafka_partition, first_offset, last_offset, state, row_days, reject_days) \
             SELECT toDate('{d}'), toDateTime(toDate('{d}')), '{topic}', 0, {base} + number * 10, {base} + number * 10 + 9, 1, [toDate('{d}')], [] \
             FROM system.numbers LIMIT 10",
            d = day_string(day),
            base = i * 100
        ));
    }
    let log_days = || inferlog_tests::clickhouse(&format!("SELECT toString(day) FROM {database}.{log} GROUP BY day ORDER BY day"));
    let expired: Vec<(String, String, String)> =
        ((t - 10)..=(t - 8)).map(|d| ("replay_log".to_owned(), day_string(d), "expired.present".to_owned())).collect();
    let (code, report) = audit_json(&s, &at(0), "audit1.log");
    assert_eq!((code, violations(&report)), (1, expired), "{report}");

    // The group has read up to offset 250: t-10 (0..=99) and t-9 (100..=199) are behind it, t-8 (200..=299) is not.
    kafkatool(&["commit", "--topic", &topic, "--group", &group, "--offset", "250"]);
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &at(0)], "enforce1.log");
    assert_eq!(code, 1, "a refused day: {stdout}\n{}", s.log("enforce1.log"));
    assert!(stdout.contains(&format!("{topic}/0: an entry reaches offset 299, group {group} committed 250")), "{stdout}");
    assert_eq!(log_days(), format!("{}\n{}", day_string(t - 8), day_string(t - 1)), "exactly the days behind the group dropped");
    assert_eq!(
        s.psql("SELECT unit, rows FROM retention_audit WHERE tier = 'replay_log' AND NOT dry_run ORDER BY unit"),
        format!("{}\t10\n{}\t10", day_string(t - 10), day_string(t - 9)),
        "each drop audited with its entries"
    );

    kafkatool(&["commit", "--topic", &topic, "--group", &group, "--offset", "400"]);
    let (code, stdout) = s.run("inferlog-retention", &["enforce", "--now", &at(0)], "enforce2.log");
    assert_eq!(code, 0, "{stdout}\n{}", s.log("enforce2.log"));
    assert_eq!(log_days(), day_string(t - 1), "within the policy: kept");
    let (code, report) = audit_json(&s, &at(0), "audit2.log");
    assert_eq!((code, violations(&report)), (0, vec![]), "{report}");
}
