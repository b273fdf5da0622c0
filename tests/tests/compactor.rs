//! The compactor against the real ClickHouse, Postgres and S3 server:
//! aggregates equal figures computed here from the generated events,
//! the archive is readable by pyarrow and matches ClickHouse, a re-run
//! changes nothing, late rows are re-archived, and a `kill -9` at every
//! state transition converges to the end state of an uninterrupted run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use inferlog_schema::timestamp::MS_PER_DAY;
use inferlog_schema::InferenceEvent;
use inferlog_tests::clickhouse;
use inferlog_tests::expected::{assert_aggregates_match, assert_units_archived, percentile, plant_prompts};
use inferlog_tests::tiers::{day_string, today, TierScenario};

#[test]
fn aggregates_equal_independent_figures_and_a_rerun_changes_nothing() {
    let s = TierScenario::new("cmp_agg", "");
    // Three closed days, recent enough to stay hot (retention 7 days).
    let last = today() - 2;
    let events = s.seed(30_000, 3, last, 11);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "first.log");
    assert_eq!(code, 0, "{}", s.log("first.log"));
    let states = s.psql("SELECT day, state, hot_rows FROM compactor_days ORDER BY day");
    let expected_states: Vec<String> = (0..3)
        .map(|i| {
            let day = last - 2 + i;
            let rows = events.iter().filter(|e| e.timestamp_ms.div_euclid(MS_PER_DAY) == i64::from(day)).count();
            format!("{}\taggregated\t{rows}", day_string(day))
        })
        .collect();
    assert_eq!(states, expected_states.join("\n"), "every closed day complete and still hot");
    assert_aggregates_match(&s, &events);
    assert_eq!(s.hot_days().iter().map(|(_, n)| n).sum::<u64>(), events.len() as u64, "nothing released before the hot retention");

    // Re-running a day (and a whole pass) gives the same aggregates, objects and manifest.
    let before = s.end_state();
    let (code, _) = s.run("inferlog-compactor", &["--day", &day_string(last - 1)], "rerun-day.log");
    assert_eq!(code, 0, "{}", s.log("rerun-day.log"));
    assert!(s.log("rerun-day.log").contains("state=\"archiving\""), "--day redoes the day even though nothing changed");
    let (code, _) = s.run("inferlog-compactor", &["--once"], "rerun.log");
    assert_eq!(code, 0, "{}", s.log("rerun.log"));
    assert!(!s.log("rerun.log").contains("state=\"archiving\""), "a pass leaves complete, unchanged days alone");
    assert_eq!(s.end_state(), before, "same aggregates, same object keys and bytes, same manifest");
    assert_aggregates_match(&s, &events);

    // A day that is not closed yet is refused, with the reason.
    let (code, _) = s.run("inferlog-compactor", &["--day", &day_string(today())], "open.log");
    assert_eq!(code, 2);
    assert!(s.log("open.log").contains("not closed"), "{}", s.log("open.log"));
}

/// Each measure's histogram column and its hot-tier column.
const HISTOGRAMS: [(&str, &str); 8] = [
    ("total_latency_hist", "total_latency_ms"),
    ("ttft_hist", "ttft_ms"),
    ("tpot_hist", "tpot_ms"),
    ("queue_wait_hist", "queue_wait_ms"),
    ("prefill_hist", "prefill_time_ms"),
    ("decode_hist", "decode_time_ms"),
    ("cache_prefix_hist", "toFloat64(cache_prefix_tokens)"),
    ("gpu_mem_hist", "gpu_mem_peak_mb"),
];

fn measures_of(e: &InferenceEvent) -> [Option<f64>; 8] {
    [
        Some(e.total_latency_ms),
        e.ttft_ms,
        e.tpot_ms,
        e.queue_wait_ms,
        e.prefill_time_ms,
        e.decode_time_ms,
        e.cache_prefix_tokens.map(f64::from),
        e.gpu_mem_peak_mb,
    ]
}

/// `label<TAB>value` lines as a map; an empty value is `None`.
fn by_label(text: &str) -> BTreeMap<String, Option<f64>> {
    text.lines()
        .map(|line| {
            let (label, value) = line.split_once('\t').unwrap_or_else(|| panic!("not label<TAB>value: {line}"));
            (label.to_owned(), (!value.is_empty()).then(|| value.parse::<f64>().unwrap_or_else(|e| panic!("{line}: {e}"))))
        })
        .collect()
}

fn close(a: f64, b: f64, relative: f64) -> bool {
    if b == 0.0 {
        a == 0.0
    } else {
        ((a - b) / b).abs() <= relative
    }
}

#[test]
fn merged_histograms_answer_any_range_within_one_percent() {
    use inferlog_schema::histogram::{Histogram, RELATIVE_ERROR};
    use rand::Rng as _;
    let s = TierScenario::new("cmp_hist", "");
    let last = today() - 2;
    let mut events = TierScenario::events(20_000, 4, last, 29);
    // A long tail: total latency log-uniform from 1 ms to 10 minutes.
    let (mut rng, _) = inferlog_tests::test_rng("merged_histograms");
    for e in &mut events {
        let ms = 10f64.powf(rng.gen_range(0.0..600_000f64.log10()));
        e.total_latency_ms = (ms * 1000.0).round() / 1000.0;
    }
    s.insert(&events);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compact.log");
    assert_eq!(code, 0, "{}", s.log("compact.log"));
    assert_aggregates_match(&s, &events);

    let day_of = |e: &InferenceEvent| e.timestamp_ms.div_euclid(MS_PER_DAY) as i32;
    // All four days, and the last two.
    for from in [last - 3, last - 1] {
        let since = day_string(from);
        let in_range: Vec<&InferenceEvent> = events.iter().filter(|e| day_of(e) >= from).collect();
        for (d, (hist, column)) in HISTOGRAMS.iter().enumerate() {
            // Independent of inferlog: the exact values, per business line and overall ("*").
            let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for e in &in_range {
                if let Some(v) = measures_of(e)[d] {
                    values.entry(e.business_line.clone()).or_default().push(v);
                    values.entry("*".to_owned()).or_default().push(v);
                }
            }
            // The stored histograms, decoded and merged by the reference code.
            let mut reference = Histogram::new();
            for line in s.psql(&format!("SELECT {hist} FROM daily_aggregates WHERE day >= '{since}' AND {hist} IS NOT NULL")).lines() {
                let encoded: Vec<i64> = line.trim_matches(['{', '}']).split(',').map(|n| n.parse().expect("bigint")).collect();
                reference.merge(&Histogram::decode(&encoded).expect("a stored histogram decodes"));
            }
            assert_eq!(reference.count(), values.get("*").map_or(0, |v| v.len() as u64), "{hist}: one count per row that carried {column}");
            for q in [0.5, 0.95, 0.99] {
                let merged = by_label(&s.psql(&format!(
                    "SELECT coalesce(business_line, '*'), inferlog_quantile(inferlog_merge({hist}), {q}) FROM daily_aggregates \
                     WHERE day >= '{since}' GROUP BY ROLLUP (business_line) ORDER BY 1"
                )));
                let table = s.qualified_table();
                let exact_in_clickhouse = by_label(&format!(
                    "{}\n*\t{}",
                    clickhouse(&format!(
                        "SELECT business_line, quantileExact({q})({column}) FROM {table} FINAL \
                         WHERE day >= toDate('{since}') AND isNotNull({column}) GROUP BY business_line ORDER BY business_line FORMAT TSV"
                    )),
                    clickhouse(&format!(
                        "SELECT quantileExact({q})({column}) FROM {table} FINAL WHERE day >= toDate('{since}') AND isNotNull({column}) FORMAT TSV"
                    ))
                ));
                let what = |label: &str| format!("{hist} p{q} of {label} since {since}");
                for (label, v) in &mut values {
                    let exact = percentile(v, q).expect("not empty");
                    let got = merged.get(label).copied().flatten().unwrap_or_else(|| panic!("{}: no merged value in {merged:?}", what(label)));
                    assert!(close(got, exact, RELATIVE_ERROR + 1e-9), "{}: merged {got}, exact {exact}", what(label));
                    let in_clickhouse = exact_in_clickhouse.get(label).copied().flatten().expect("quantileExact");
                    assert!(close(in_clickhouse, exact, 1e-12), "{}: ClickHouse quantileExact {in_clickhouse}, here {exact}", what(label));
                    if label == "*" {
                        let by_reference = reference.quantile(q).expect("not empty");
                        assert!(close(got, by_reference, 1e-9), "{}: SQL {got}, reference {by_reference}", what(label));
                    }
                }
            }
        }
    }
}

#[test]
fn the_archive_is_readable_by_pyarrow_and_matches_clickhouse() {
    let s = TierScenario::with("cmp_pq", "row_group_rows = 4096\nobject_max_rows = 10000\n", "");
    let last = today() - 3;
    let events = s.seed(24_000, 2, last, 12);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "run.log");
    assert_eq!(code, 0, "{}", s.log("run.log"));

    let objects = s.read_archive(20);
    let objects = objects.as_array().expect("list");
    let manifest = s.psql("SELECT object_key, rows, bytes FROM cold_manifest ORDER BY object_key");
    assert_eq!(manifest.lines().count(), objects.len(), "one manifest row per object");
    let mut total = 0;
    for (object, row) in objects.iter().zip(manifest.lines()) {
        let key = object["key"].as_str().expect("key");
        let f: Vec<&str> = row.split('\t').collect();
        assert_eq!(f[0], key);
        assert_eq!(object["num_rows"].as_u64().map(|n| n.to_string()).as_deref(), Some(f[1]), "{key}: rows");
        assert_eq!(object["size"].as_u64().map(|n| n.to_string()).as_deref(), Some(f[2]), "{key}: bytes");
        assert!(key.contains("/dt=") && key.ends_with(".parquet"), "{key}");
        assert!(object["num_rows"].as_u64().expect("rows") <= 10_000, "objects split at object_max_rows");
        let rows = object["num_rows"].as_u64().expect("rows");
        assert_eq!(object["row_groups"].as_u64(), Some(rows.div_ceil(4096)), "{key}: row groups of row_group_rows");
        assert_eq!(object["compression"], "ZSTD");
        assert_eq!(object["metadata"]["inferlog.schema_version"], "1");
        assert_eq!(object["columns"]["timestamp"], "timestamp[ms, tz=UTC]");
        assert_eq!(object["columns"]["ingested_at"], "timestamp[ms, tz=UTC]");
        assert_eq!(object["columns"]["input_tokens"], "int64");
        assert_eq!(object["columns"]["request_id"], "string");
        assert_eq!(object["columns"]["cache_hit"], "bool");
        assert_eq!(object["columns"]["ttft_ms"], "double");
        let physical = object["physical"]["timestamp"].as_str().expect("type");
        assert!(physical.starts_with("INT64/Timestamp(isAdjustedToUTC=true, timeUnit=milliseconds"), "{physical}");
        total += object["num_rows"].as_u64().expect("rows");
        let day = key.split("dt=").nth(1).and_then(|r| r.get(..10)).expect("day");
        assert_eq!(object["metadata"]["inferlog.day"], day);
        for sample in object["sample"].as_array().expect("sample") {
            let id = sample["request_id"].as_str().expect("request_id");
            let hot = clickhouse(&format!(
                "SELECT timestamp_ms, business_line, model_version, input_tokens, ifNull(toString(ttft_ms), 'null'), ifNull(user_id_hash, 'null'), toString(day) \
                 FROM {} WHERE request_id = '{id}' FORMAT TSV",
                s.qualified_table()
            ));
            let f: Vec<&str> = hot.split('\t').collect();
            assert_eq!(sample["timestamp"].as_i64().map(|t| t.to_string()).as_deref(), Some(f[0]), "{id}: timestamp");
            assert_eq!(sample["business_line"].as_str(), Some(f[1]));
            assert_eq!(sample["model_version"].as_str(), Some(f[2]));
            assert_eq!(sample["input_tokens"].as_i64().map(|t| t.to_string()).as_deref(), Some(f[3]));
            let ttft = sample["ttft_ms"].as_f64().map_or("null".to_owned(), |v| v.to_string());
            assert_eq!(ttft.parse::<f64>().ok(), f[4].parse::<f64>().ok(), "{id}: ttft");
            assert_eq!(sample["user_id_hash"].as_str().unwrap_or("null"), f[5]);
            assert_eq!(f[6], day, "{id} is archived under its own day");
        }
    }
    assert_eq!(total, events.len() as u64, "every hot row is archived once");
    // No plaintext user id reaches the archive.
    for object in objects {
        for sample in object["sample"].as_array().expect("sample") {
            if let Some(hash) = sample["user_id_hash"].as_str() {
                assert!(hash.len() == 73 && hash.as_bytes()[8] == b':', "stored as keyid:hex: {hash}");
            }
        }
    }
}

#[test]
fn late_rows_after_archiving_are_archived_and_aggregated_again() {
    let s = TierScenario::new("cmp_late", "");
    let day = today() - 2;
    let mut events = s.seed(6_000, 1, day, 13);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "first.log");
    assert_eq!(code, 0, "{}", s.log("first.log"));
    let first_sha = s.psql("SELECT sha256 FROM cold_manifest");
    // Late events for the same day (ingest accepts up to max_event_age).
    let late = inferlog_tests::seed::seeded_events(500, 1, (i64::from(day) + 1) * MS_PER_DAY, 14);
    let late: Vec<InferenceEvent> = late
        .into_iter()
        .map(|mut e| {
            e.request_id = format!("late-{}", e.request_id);
            e
        })
        .collect();
    inferlog_tests::seed::insert_hot(&inferlog_tests::clickhouse_url(), "inferlog_test", &s.table, &late);
    events.extend(late);
    // Producer retries that slipped past ingest's window: the same rows again, collapsed before archiving.
    inferlog_tests::seed::insert_hot(&inferlog_tests::clickhouse_url(), "inferlog_test", &s.table, &events[..200]);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "second.log");
    assert_eq!(code, 0, "{}", s.log("second.log"));
    assert_eq!(s.psql("SELECT state, hot_rows FROM compactor_days"), format!("aggregated\t{}", events.len()));
    assert_eq!(s.psql("SELECT sum(rows) FROM cold_manifest"), events.len().to_string(), "the archive holds the late rows");
    assert_ne!(s.psql("SELECT sha256 FROM cold_manifest"), first_sha, "the object was rewritten under the same key");
    assert_eq!(s.s3_objects().len(), 1, "same key, no second object");
    assert_aggregates_match(&s, &events);
}

/// After a crash between archiving and verifying, the day's object is no
/// longer the one written (bytes changed, another tool's file under the
/// key): verification fails naming the key and what differed, the day
/// stays hot with `last_error`, `--once` exits 1 (never a panic); the next
/// pass archives the day again from ClickHouse and completes.
#[test]
fn a_corrupt_object_after_a_crash_fails_verification_and_the_day_is_archived_again() {
    let s = TierScenario::new("cmp_corrupt", "");
    let day = today() - 10; // past the hot policy: released once verified
    let events = s.seed(4_000, 1, day, 31);
    let mut child = s.spawn("inferlog-compactor", &["--once"], "paused.log", &[("INFERLOG_COMPACTOR_PAUSE_AFTER", "archived")]);
    if let Some(status) = inferlog_tests::wait_paused(&mut child, || s.log("paused.log"), Duration::from_secs(120)) {
        panic!("compactor exited ({status}) before archiving: {}", s.log("paused.log"));
    }
    child.kill().expect("kill -9");
    let _ = child.wait();
    let objects = s.s3_objects();
    assert_eq!(objects.len(), 1, "{objects:?}");
    let key = objects[0].0.clone();
    s.s3_put(&key, b"PAR1 not what the compactor wrote PAR1");

    let (code, _) = s.run("inferlog-compactor", &["--once"], "corrupt.log");
    let log = s.log("corrupt.log");
    assert_eq!(code, 1, "a verification failure exits 1: {log}");
    assert!(!log.contains("panicked"), "{log}");
    let record = s.psql(&format!("SELECT state, last_error FROM compactor_days WHERE day = '{}'", day_string(day)));
    assert!(record.starts_with("archiving\t") && record.contains(&key) && record.contains("not a readable"), "{record}");
    assert_eq!(s.hot_days().len(), 1, "the day stays hot");

    let (code, _) = s.run("inferlog-compactor", &["--once"], "again.log");
    assert_eq!(code, 0, "{}", s.log("again.log"));
    assert_eq!(s.psql("SELECT state FROM compactor_days"), "released");
    assert_aggregates_match(&s, &events);
    assert_eq!(s.read_archive(0).as_array().map(|o| o.iter().map(|o| o["num_rows"].as_u64().unwrap_or(0)).sum::<u64>()), Some(events.len() as u64));
}

/// Runs the compactor paused at `step`, kills it with SIGKILL there, then runs it to completion.
fn crash_at(step: &str, seed_days: impl Fn(&TierScenario)) -> String {
    let s = TierScenario::new(&format!("cmp_kill_{step}"), "");
    seed_days(&s);
    s.kill_at("inferlog-compactor", &["--once"], "INFERLOG_COMPACTOR_PAUSE_AFTER", step, "paused.log");
    let (code, _) = s.run("inferlog-compactor", &["--once"], "resume.log");
    assert_eq!(code, 0, "resume after a kill at {step}: {}", s.log("resume.log"));
    s.end_state()
}

#[test]
fn kill_9_at_every_state_transition_converges_to_the_same_end_state() {
    // Two old days (released: past the 7-day hot retention) and one recent (kept hot).
    let old = today() - 10;
    let recent = today() - 2;
    let seed = |s: &TierScenario| {
        s.seed(8_000, 2, old, 21);
        s.seed(3_000, 1, recent, 22);
    };
    let reference = {
        let s = TierScenario::new("cmp_kill_ref", "");
        seed(&s);
        let (code, _) = s.run("inferlog-compactor", &["--once"], "run.log");
        assert_eq!(code, 0, "{}", s.log("run.log"));
        let days = s.psql("SELECT day, state FROM compactor_days ORDER BY day");
        assert_eq!(
            days,
            format!("{}\treleased\n{}\treleased\n{}\taggregated", day_string(old - 1), day_string(old), day_string(recent)),
            "old days released, the recent one kept"
        );
        assert_eq!(s.hot_days().len(), 1, "only the recent day is still hot");
        assert_eq!(
            s.psql("SELECT tier, unit, action, rows, actor FROM retention_audit ORDER BY unit"),
            s.psql("SELECT 'hot', day::text, 'drop_partition', hot_rows, 'compactor' FROM compactor_days WHERE state = 'released' ORDER BY day"),
            "every drop is audited with its rows"
        );
        s.end_state()
    };
    for step in ["archiving", "archived", "verified", "aggregated", "releasing", "dropped"] {
        let state = crash_at(step, seed);
        assert_eq!(state, reference, "end state after kill -9 at {step}");
    }
}

#[test]
fn the_daemon_serves_metrics_and_stops_on_sigterm() {
    let addr = inferlog_tests::free_loopback_addr();
    let s = TierScenario::new("cmp_daemon", "");
    let config = std::fs::read_to_string(&s.config)
        .expect("config")
        .replace("[compactor]\nmetrics_addr = \"\"\n", &format!("[compactor]\nmetrics_addr = \"{addr}\"\ninterval = \"1h\"\n"));
    std::fs::write(&s.config, config).expect("config");
    s.seed(3_000, 1, today() - 2, 41);
    let mut child = s.spawn("inferlog-compactor", &[], "daemon.log", &[]);
    let started = Instant::now();
    while !s.log("daemon.log").contains("pass finished") {
        assert!(started.elapsed() < Duration::from_secs(60), "{}", s.log("daemon.log"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let get = |path: &str| inferlog_tests::http_get(&addr, path);
    let metrics = get("/metrics");
    for expected in [
        "inferlog_compactor_days_total{state=\"aggregated\"} 1",
        "inferlog_compactor_rows_archived_total 3000",
        "inferlog_compactor_objects_written_total 1",
        "inferlog_compactor_verification_failures_total 0",
        "inferlog_compactor_pass_seconds_count 1",
        "inferlog_compactor_stage_seconds_count{stage=\"archive\"} 1",
    ] {
        assert!(metrics.contains(expected), "{expected} in {metrics}");
    }
    assert!(get("/healthz").starts_with("HTTP/1.1 200"), "healthy after a clean pass");
    let status = inferlog_tests::sigterm(&mut child, Duration::from_secs(20));
    assert!(status.success(), "SIGTERM between passes exits 0: {status}");
}

#[test]
fn two_replicas_share_the_days_and_a_local_directory_works_as_the_cold_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TierScenario::new("cmp_replicas", "");
    let config = std::fs::read_to_string(&s.config).expect("config");
    let cold = format!("[cold]\nurl = \"file://{}/\"\n", dir.path().display());
    let start = config.find("[cold]").expect("[cold]");
    let end = config[start..].find("\n\n").map_or(config.len(), |e| start + e + 2);
    std::fs::write(&s.config, format!("{}{cold}\n{}", &config[..start], &config[end..])).expect("config");
    let old = today() - 12;
    let events = s.seed(12_000, 6, old, 71);
    let mut a = s.spawn("inferlog-compactor", &["--once"], "a.log", &[]);
    let mut b = s.spawn("inferlog-compactor", &["--once"], "b.log", &[]);
    let (sa, sb) = (a.wait().expect("a"), b.wait().expect("b"));
    assert!(sa.success() && sb.success(), "{}\n{}", s.log("a.log"), s.log("b.log"));
    // Whatever each replica skipped as busy, one more pass finishes; nothing is done twice.
    let (code, _) = s.run("inferlog-compactor", &["--once"], "c.log");
    assert_eq!(code, 0, "{}", s.log("c.log"));
    assert_eq!(s.psql("SELECT count(*), sum(hot_rows) FROM compactor_days WHERE state = 'released'"), format!("6\t{}", events.len()));
    assert_eq!(s.psql("SELECT count(*), count(DISTINCT unit) FROM retention_audit"), "6\t6", "each day released once");
    assert!(s.hot_days().is_empty());
    let mut files: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(dir.path()).expect("cold dir") {
        let day_dir = entry.expect("entry").path();
        for f in std::fs::read_dir(&day_dir).expect("day dir") {
            files.push(format!("{}/{}", day_dir.file_name().and_then(|n| n.to_str()).unwrap_or(""), f.expect("file").file_name().to_string_lossy()));
        }
    }
    files.sort();
    let manifest = s.psql("SELECT object_key FROM cold_manifest ORDER BY object_key");
    assert_eq!(files.join("\n"), manifest, "one file per manifest row under dt= folders, nothing else");
}

#[test]
#[allow(clippy::print_stderr)] // the seed, to replay a failure
fn three_compactors_share_a_day_in_units_one_killed_mid_unit() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::thread_rng().gen();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = TierScenario::new("cmp_units", "");
    s.rewrite_config("lateness = \"1s\"", "lateness = \"1s\"\nunit_max_rows = 125000");
    // Past the 7-day hot retention: archived, aggregated and released in one pass.
    let day = today() - 10;
    let mut events = TierScenario::events(1_000_000, 1, day, seed);
    plant_prompts(&mut events);
    s.insert(&events);

    // A: plans the day in units, claims the first, writes its objects and
    // pauses there, holding the day's lock and the unit (not recorded).
    let mut a = s.paused_at("inferlog-compactor", &["--once"], ("INFERLOG_COMPACTOR_PAUSE_AFTER", "unit-written"), "a.log", Duration::from_secs(300));
    // Planned once: whole series and pieces of series, at most 125,000 rows each.
    let planned = s.psql("SELECT count(*), min(units), max(units) FROM compactor_units");
    let units_planned: usize = planned.split('\t').next().and_then(|n| n.parse().ok()).expect("count");
    assert!(units_planned >= 8 && planned == format!("{units_planned}\t{units_planned}\t{units_planned}"), "{planned}");
    // B and C find the day held and work its other units. A dies at a
    // seeded moment while they do (or after they left, if they were quick).
    let mut running = s.compactors_while_killing(&mut a, &["b.log", "c.log"], &mut rng);
    for (name, child) in ["b", "c"].into_iter().zip(running.iter_mut()) {
        let status = inferlog_tests::wait_with_limit(child, Duration::from_secs(300));
        assert!(status.success(), "{name}: {status}: {}", s.log(&format!("{name}.log")));
    }
    // Whoever is left finishes the day: B or C took it over if A died
    // before they left; otherwise a fourth run does.
    let (code, _) = s.run("inferlog-compactor", &["--once"], "d.log");
    assert_eq!(code, 0, "{}", s.log("d.log"));

    assert!(s.hot_days().is_empty(), "released from the hot tier");
    assert_units_archived(&s, &events, day, units_planned, &["a.log", "b.log", "c.log", "d.log"]);
}
