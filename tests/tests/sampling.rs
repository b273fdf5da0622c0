//! The sampled archive on the real stack (ClickHouse, Postgres, SeaweedFS):
//! the tail kept whole, weights that add up to ClickHouse's exact counts
//! per stratum, thresholds equal to the merged p99 of the history's
//! histograms, the same objects when a day is archived again or after a
//! kill -9, and the size against the same day archived whole. Every
//! expected figure comes from ClickHouse or Postgres, and the archive is
//! read with pyarrow (`tests/scripts/read_sampled.py`), not inferlog.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;

use inferlog_schema::histogram::Histogram;
use inferlog_schema::InferenceEvent;
use inferlog_tests::clickhouse;
use inferlog_tests::repo_root;
use inferlog_tests::tiers::{day_string, s3_endpoint, s3_secret, today, TierScenario};

/// The test's sampling: the default rate, a floor of 3 rows per stratum,
/// and a keep rule of the user's: cache misses on inputs of 12,345 tokens or more.
const SAMPLING: &str = "[sampling]\nenabled = true\nbase_rate = 0.1\nmin_per_stratum = 3\nmin_history_rows = 200\n\
                        slow_total_latency_ms = 20000.0\nslow_ttft_ms = 4000.0\nlong_output_tokens = 3000\n\
                        [[sampling.keep]]\nreason = \"cache_miss_long\"\n\
                        when = [{ field = \"cache_hit\", op = \"eq\", value = false }, { field = \"input_tokens\", op = \"ge\", value = 12345 }]\n";

/// The contract's input buckets, by their upper bounds.
fn input_bucket(tokens: u64) -> &'static str {
    match tokens {
        0..1024 => "0-1k",
        1024..2048 => "1k-2k",
        2048..4096 => "2k-4k",
        4096..8192 => "4k-8k",
        8192..32768 => "8k-32k",
        _ => "32k+",
    }
}

/// One archived row, as pyarrow reads it.
#[derive(Debug, Clone)]
struct Archived {
    request_id: String,
    stratum: (String, String, String, &'static str, u64),
    total_latency_ms: f64,
    weight: u64,
    reason: String,
}

type Object = (String, u64, String);

/// Runs `read_sampled.py` on `day`'s prefix: its objects (key, size,
/// sha256) and its `rows` document.
fn read_prefix(s: &TierScenario, day: i32, extra: &[&str]) -> (Vec<Object>, serde_json::Value) {
    let prefix = format!("{}dt={}/", s.prefix, day_string(day));
    let out = Command::new("python3")
        .arg(repo_root().join("tests/scripts/read_sampled.py"))
        .args([&s3_endpoint(), "inferlog-cold", &prefix, &s3_secret()])
        .args(extra)
        .output()
        .expect("python3");
    assert!(out.status.success(), "read_sampled.py: {}", String::from_utf8_lossy(&out.stderr));
    let mut doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let objects = doc["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| (o["key"].as_str().expect("key").to_owned(), o["size"].as_u64().expect("size"), o["sha256"].as_str().expect("sha").to_owned()))
        .collect();
    (objects, doc["rows"].take())
}

/// The objects and rows count of `day`'s archive, per "reason/weight".
fn read_objects(s: &TierScenario, day: i32) -> (Vec<Object>, BTreeMap<String, u64>) {
    let (objects, counts) = read_prefix(s, day, &["--summary"]);
    (objects, serde_json::from_value(counts).expect("counts"))
}

/// The objects and rows of `day`'s archive.
fn read_day(s: &TierScenario, day: i32) -> (Vec<Object>, Vec<Archived>) {
    let (objects, rows) = read_prefix(s, day, &[]);
    let rows = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            let text = |i: usize| r[i].as_str().expect("text").to_owned();
            Archived {
                request_id: text(0),
                stratum: (text(1), text(2), text(3), input_bucket(r[4].as_u64().expect("input")), r[5].as_u64().expect("hour")),
                total_latency_ms: r[6].as_f64().expect("latency"),
                weight: r[7].as_u64().expect("weight"),
                reason: text(8),
            }
        })
        .collect();
    (objects, rows)
}

/// One hot row of the day, as ClickHouse returns it.
#[derive(Debug)]
struct Hot {
    request_id: String,
    stratum: (String, String, String, &'static str, u64),
    input_tokens: u64,
    output_tokens: u64,
    total_latency_ms: f64,
    ttft_ms: Option<f64>,
    error_code: i64,
    truncated: bool,
    cache_hit: Option<bool>,
}

fn hot_rows(s: &TierScenario, day: i32) -> Vec<Hot> {
    let text = clickhouse(&format!(
        "SELECT request_id, business_line, model_name, model_version, input_tokens, intDiv(timestamp_ms, 3600000) % 24, output_tokens, total_latency_ms, \
         ifNull(toString(ttft_ms), 'null'), error_code, ifNull(truncated, 0), ifNull(toString(cache_hit), 'null') FROM {} FINAL WHERE day = toDate('{}') FORMAT TSV",
        s.qualified_table(),
        day_string(day)
    ));
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let n = |i: usize| f[i].parse::<u64>().expect("number");
            Hot {
                request_id: f[0].to_owned(),
                stratum: (f[1].to_owned(), f[2].to_owned(), f[3].to_owned(), input_bucket(n(4)), n(5)),
                input_tokens: n(4),
                output_tokens: n(6),
                total_latency_ms: f[7].parse().expect("latency"),
                ttft_ms: f[8].parse().ok(),
                error_code: f[9].parse().expect("code"),
                truncated: f[10] == "1",
                cache_hit: f[11].parse::<u8>().ok().map(|v| v != 0),
            }
        })
        .collect()
}

/// The thresholds `day` was archived with: per group (line, model,
/// version, bucket) from history, and the static ones.
type Group = (String, String, String, String);
fn recorded_thresholds(s: &TierScenario, day: i32) -> (HashMap<Group, (f64, f64)>, (f64, f64)) {
    let d = day_string(day);
    let fixed = s.psql(&format!("SELECT slow_total_latency_ms, slow_ttft_ms FROM sampling_days WHERE day = '{d}'"));
    let f: Vec<f64> = fixed.split('\t').map(|v| v.parse().expect("threshold")).collect();
    assert_eq!(f.len(), 2, "the day's rule is recorded: {fixed:?}");
    let groups = s
        .psql(&format!(
            "SELECT business_line, model_name, model_version, input_bucket, slow_total_latency_ms, slow_ttft_ms FROM sampling_thresholds WHERE day = '{d}'"
        ))
        .lines()
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            ((c[0].to_owned(), c[1].to_owned(), c[2].to_owned(), c[3].to_owned()), (c[4].parse().expect("t"), c[5].parse().expect("t")))
        })
        .collect();
    (groups, (f[0], f[1]))
}

/// Equal to 12 significant digits (far below a bucket's 1% width).
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

/// Postgres's `{1,2,3}` as numbers.
fn pg_array(text: &str) -> Vec<i64> {
    text.trim_matches(['{', '}']).split(',').filter(|v| !v.is_empty()).map(|v| v.parse().expect("bigint")).collect()
}

/// The weighted floor-rank quantile: the first value whose cumulative weight reaches q of the total.
fn weighted_quantile(mut values: Vec<(f64, u64)>, q: f64) -> f64 {
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = values.iter().map(|v| v.1).sum();
    let target = (q * total as f64).floor() as u64;
    let mut seen = 0;
    for (v, w) in &values {
        seen += w;
        if seen > target {
            return *v;
        }
    }
    values.last().map_or(f64::NAN, |v| v.0)
}

/// A day of 600,000 requests (7 a second, 5,700 strata of 105 rows on
/// average; a day of 200,000 has strata of 38, where the floor of 3 rows
/// alone is 8% of the day) with a planted tail: one in 25 of the `search` line's
/// requests 20 times slower, one in 500 requests with a long output, and
/// one in 997 a cache miss on an input of 12,345 tokens (the keep rule's).
fn heavy_day(last: i32) -> Vec<InferenceEvent> {
    let mut day = TierScenario::events(600_000, 1, last, 31);
    for (i, e) in day.iter_mut().enumerate() {
        if i % 25 == 0 && e.business_line == "search" {
            e.total_latency_ms *= 20.0;
        }
        if i % 500 == 7 && e.error_code == 0 {
            e.output_tokens = 3500;
        }
        if i % 997 == 3 {
            e.cache_hit = Some(false);
            e.cache_prefix_tokens = None;
            e.input_tokens = 12_345;
        }
    }
    day
}

/// Seven days of light traffic, then the heavy day.
fn seed(s: &TierScenario, last: i32) -> Vec<InferenceEvent> {
    s.seed(70_000, 7, last - 1, 29);
    let day = heavy_day(last);
    s.insert(&day);
    day
}

#[test]
#[allow(clippy::print_stdout)] // the figures the closing note and docs/performance.md quote
fn a_sampled_archive_keeps_the_tail_and_its_weights_add_up_to_the_exact_counts() {
    let s = TierScenario::new("smp_tail", SAMPLING);
    let last = today() - 3;
    let events = seed(&s, last);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "run.log");
    assert_eq!(code, 0, "{}", s.log("run.log"));
    assert!(events.iter().any(|e| e.business_line == "search"), "the planted line is in the day");

    // Thresholds: a group with 200 or more values in the 7 days before has
    // the merged p99 of its daily histograms; the others, the static ones.
    let (groups, fixed) = recorded_thresholds(&s, last);
    assert_eq!(fixed, (20_000.0, 4_000.0));
    let history = s.psql(&format!(
        "SELECT business_line, model_name, model_version, input_bucket, total_latency_hist, coalesce(ttft_hist::text, '{{}}') FROM daily_aggregates \
         WHERE day >= '{}' AND day < '{}'",
        day_string(last - 7),
        day_string(last)
    ));
    let mut merged: HashMap<Group, (Histogram, Histogram)> = HashMap::new();
    for line in history.lines() {
        let c: Vec<&str> = line.split('\t').collect();
        let entry = merged.entry((c[0].to_owned(), c[1].to_owned(), c[2].to_owned(), c[3].to_owned())).or_default();
        entry.0.merge(&Histogram::decode(&pg_array(c[4])).expect("total histogram"));
        if c[5] != "{}" {
            entry.1.merge(&Histogram::decode(&pg_array(c[5])).expect("ttft histogram"));
        }
    }
    assert!(merged.values().any(|(h, _)| h.count() >= 200) && merged.values().any(|(h, _)| h.count() < 200), "both kinds of group");
    for (group, (total, ttft)) in &merged {
        match groups.get(group) {
            Some((slow_total, slow_ttft)) => {
                assert!(total.count() >= 200, "{group:?} has {} values and history thresholds", total.count());
                // The same bucket's value: Postgres's pow and Rust's powi differ in the last digits.
                let p99 = total.quantile(0.99).expect("p99");
                assert!(same(*slow_total, p99), "{group:?}: total latency p99 {slow_total} against {p99}");
                let expected_ttft = if ttft.count() >= 200 { ttft.quantile(0.99).expect("p99") } else { fixed.1 };
                assert!(same(*slow_ttft, expected_ttft), "{group:?}: TTFT p99 {slow_ttft} against {expected_ttft}");
            }
            None => assert!(total.count() < 200, "{group:?} has {} values but no thresholds", total.count()),
        }
    }
    // The first day had no history: static thresholds only.
    let (first_groups, _) = recorded_thresholds(&s, last - 7);
    assert!(first_groups.is_empty(), "no history, no group thresholds: {first_groups:?}");

    // The tail, by the recorded thresholds, from ClickHouse's rows.
    let hot = hot_rows(&s, last);
    let (objects, archived) = read_day(&s, last);
    let kept: HashMap<&str, &Archived> = archived.iter().map(|a| (a.request_id.as_str(), a)).collect();
    assert_eq!(kept.len(), archived.len(), "each request once");
    let mut tail = 0;
    for h in &hot {
        let (l, m, v, b, _) = &h.stratum;
        let (slow_total, slow_ttft) = groups.get(&(l.clone(), m.clone(), v.clone(), b.to_string())).copied().unwrap_or(fixed);
        let reason = if h.error_code != 0 {
            Some("error")
        } else if h.truncated {
            Some("truncated")
        } else if h.total_latency_ms > slow_total || h.ttft_ms.is_some_and(|t| t > slow_ttft) {
            Some("slow")
        } else if h.output_tokens > 3000 || h.input_tokens > 32_768 {
            Some("long")
        } else if h.cache_hit == Some(false) && h.input_tokens >= 12_345 {
            Some("cache_miss_long")
        } else {
            None
        };
        if let Some(reason) = reason {
            tail += 1;
            let a = kept.get(h.request_id.as_str()).unwrap_or_else(|| panic!("{} ({reason}) is not in the archive", h.request_id));
            assert_eq!((a.reason.as_str(), a.weight), (reason, 1), "{}", h.request_id);
        }
    }
    let slow_search = archived.iter().filter(|a| a.reason == "slow" && a.stratum.0 == "search").count();
    assert!(slow_search > 100, "the planted slow rows of search are kept: {slow_search}");
    assert!(archived.iter().any(|a| a.reason == "long") && archived.iter().any(|a| a.reason == "error"));
    let planted = hot
        .iter()
        .filter(|h| h.input_tokens == 12_345 && h.cache_hit == Some(false) && kept[h.request_id.as_str()].reason == "cache_miss_long")
        .count();
    assert!(planted >= 150, "the planted cache misses are kept under the user's reason: {planted}");
    let recorded = s.psql(&format!("SELECT keep_rules FROM sampling_days WHERE day = '{}'", day_string(last)));
    assert!(recorded.contains("\"reason\":\"cache_miss_long\"") && recorded.contains("\"input_tokens\""), "recorded with the day: {recorded}");

    // Per stratum, the weights add up to ClickHouse's row count, exactly.
    let mut exact: BTreeMap<_, u64> = BTreeMap::new();
    hot.iter().for_each(|h| *exact.entry(h.stratum.clone()).or_default() += 1);
    let mut weighted: BTreeMap<_, u64> = BTreeMap::new();
    archived.iter().for_each(|a| *weighted.entry(a.stratum.clone()).or_default() += a.weight);
    assert_eq!(weighted, exact, "sum(sample_weight) per stratum = ClickHouse's count");
    let sampled = archived.iter().filter(|a| a.reason == "sampled").count();
    let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
    archived.iter().for_each(|a| *reasons.entry(a.reason.as_str()).or_default() += 1);
    println!("day of {} rows: {} archived ({tail} tail, {sampled} sampled) in {} strata: {reasons:?}", hot.len(), archived.len(), exact.len());

    // Weighted p50 and p99 of total latency per line, against ClickHouse's exact ones.
    let exact_q = clickhouse(&format!(
        "SELECT business_line, quantileExact(0.5)(total_latency_ms), quantileExact(0.99)(total_latency_ms) FROM {} FINAL \
         WHERE day = toDate('{}') GROUP BY business_line ORDER BY business_line FORMAT TSV",
        s.qualified_table(),
        day_string(last)
    ));
    for line in exact_q.lines() {
        let c: Vec<&str> = line.split('\t').collect();
        let values: Vec<(f64, u64)> = archived.iter().filter(|a| a.stratum.0 == c[0]).map(|a| (a.total_latency_ms, a.weight)).collect();
        for (q, exact) in [(0.5, c[1]), (0.99, c[2])] {
            let exact: f64 = exact.parse().expect("quantile");
            let estimate = weighted_quantile(values.clone(), q);
            println!("{}: weighted p{} {estimate} against exact {exact} ({:+.2}%)", c[0], q * 100.0, 100.0 * (estimate - exact) / exact);
            assert!((estimate - exact).abs() <= 0.05 * exact, "{}: weighted p{} {estimate} against exact {exact}", c[0], q * 100.0);
        }
    }

    // The manifest records the rows each object stands for.
    let represented = s.psql(&format!("SELECT sum(represented_rows), sum(rows) FROM cold_manifest WHERE day = '{}'", day_string(last)));
    assert_eq!(represented, format!("{}\t{}", hot.len(), archived.len()));

    // Archived again (the day re-run): the same objects, byte for byte.
    let (code, _) = s.run("inferlog-compactor", &["--day", &day_string(last)], "again.log");
    assert_eq!(code, 0, "{}", s.log("again.log"));
    let (again, _) = read_objects(&s, last);
    assert_eq!(again, objects, "archiving the day twice writes the same objects");

    // Against the same rows archived whole.
    let whole = TierScenario::new("smp_whole", "");
    whole.insert(&heavy_day(last));
    let (code, _) = whole.run("inferlog-compactor", &["--once"], "run.log");
    assert_eq!(code, 0, "{}", whole.log("run.log"));
    let (whole_objects, whole_rows) = read_objects(&whole, last);
    assert_eq!(whole_rows, BTreeMap::from([("all/1".to_owned(), hot.len() as u64)]), "unsampled: every row, all, weight 1");
    let (sampled_bytes, whole_bytes): (u64, u64) = (objects.iter().map(|o| o.1).sum(), whole_objects.iter().map(|o| o.1).sum());
    println!("archive of the day: {sampled_bytes} bytes sampled, {whole_bytes} bytes whole");
    // The tail alone is 8.3% of this day's rows (3% errors, 4.4% slow).
    assert!(sampled_bytes * 5 <= whole_bytes, "sampled {sampled_bytes} bytes is more than a fifth of {whole_bytes}");

    // The day once only the archive holds it (hot rows dropped, aggregates
    // deleted, as a shorter aggregate policy would): `inferlog-report`
    // answers it from the weights, exact requests and errors per line, p99
    // near ClickHouse's exact value, and says what is estimated.
    let mut per_line: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for h in &hot {
        let e = per_line.entry(h.stratum.0.as_str()).or_default();
        e.0 += 1;
        e.1 += u64::from(h.error_code != 0);
    }
    let exact_p99: HashMap<String, f64> = exact_q
        .lines()
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            (c[0].to_owned(), c[2].parse().expect("p99"))
        })
        .collect();
    let d = day_string(last);
    for table in ["daily_aggregates", "hourly_aggregates", "daily_errors"] {
        s.psql(&format!("DELETE FROM {table} WHERE day = '{d}'"));
    }
    clickhouse(&format!("ALTER TABLE {} DROP PARTITION '{d}'", s.qualified_table()));
    for (line, (requests, errors)) in &per_line {
        let (code, out) =
            s.run("inferlog-report", &["--format", "json", "--from", &d, "--to", &d, "--business-line", line, "overview"], "report.log");
        assert_eq!(code, 0, "{}", s.log("report.log"));
        let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
        let tier = doc["tiers"].as_array().expect("tiers").iter().find(|t| t["day"] == d.as_str()).map(|t| t["tier"].clone());
        assert_eq!(tier, Some("archive".into()), "{}", doc["tiers"]);
        let notes = doc["notes"].to_string();
        assert!(notes.contains("sampled archive") && notes.contains("estimates"), "{notes}");
        let metric = |name: &str| {
            doc["tables"]["overview"]["rows"].as_array().expect("rows").iter().find(|r| r["metric"] == name).expect(name)["current"]
                .as_f64()
                .expect(name)
        };
        assert_eq!(metric("requests"), *requests as f64, "{line}: requests from the weights");
        assert_eq!(((1.0 - metric("success_rate")) * *requests as f64).round(), *errors as f64, "{line}: errors are kept whole");
        // The weighted rows' p99 is within 5% (checked above), and the report
        // reads it from its histograms, within 1% of any value (α): 6.05% at most.
        let (estimate, exact) = (metric("p99_total_ms"), exact_p99[*line]);
        assert!((estimate - exact).abs() <= (1.05 * 1.01 - 1.0) * exact, "{line}: p99 from the archive {estimate} against exact {exact}");
    }
}

#[test]
fn a_sampled_archive_killed_before_verifying_resumes_with_the_same_objects() {
    let s = TierScenario::new("smp_kill", SAMPLING);
    let last = today() - 3;
    s.seed(60_000, 1, last, 41);
    s.kill_at("inferlog-compactor", &["--once"], "INFERLOG_COMPACTOR_PAUSE_AFTER", "archived", "killed.log");
    let (written, _) = read_objects(&s, last);
    assert!(!written.is_empty(), "the killed run wrote its objects");
    assert_eq!(s.psql("SELECT state FROM compactor_days"), "archived");

    let (code, _) = s.run("inferlog-compactor", &["--once"], "resume.log");
    assert_eq!(code, 0, "{}", s.log("resume.log"));
    assert_eq!(s.psql("SELECT state FROM compactor_days"), "aggregated");
    let (after, rows) = read_day(&s, last);
    assert_eq!(after, written, "the resumed run verified the objects the killed one wrote");
    let manifest: HashSet<String> = s.psql("SELECT sha256 FROM cold_manifest").lines().map(str::to_owned).collect();
    assert_eq!(manifest, written.iter().map(|o| o.2.clone()).collect::<HashSet<_>>());
    let total: u64 = rows.iter().map(|r| r.weight).sum();
    assert_eq!(total, 60_000, "the weights stand for every row");
    assert!(rows.len() < 20_000, "sampled: {} rows", rows.len());
}

/// Issue 60: a sampled day larger than `unit_max_rows`, archived in units
/// by two compactors at once. Its units are cut at whole hours, so each
/// stratum (group × hour) lies in one unit, and the units keep the very
/// rows, with the very weights and reasons, that the same day archived in
/// one piece keeps; the weights add up, per stratum and per business line,
/// to the input's counts exactly, and per line to the aggregates'
/// requests; every error is kept whole (weight 1); each request at most
/// once. Expected figures come from the generated events; the archive is
/// read with pyarrow.
#[test]
fn a_sampled_day_in_units_keeps_whole_strata_and_its_weights_add_up_per_line() {
    let s = TierScenario::new("smp_units", SAMPLING);
    s.rewrite_config("lateness = \"1s\"", "lateness = \"1s\"\nunit_max_rows = 8000");
    let last = today() - 3;
    let events = TierScenario::events(240_000, 1, last, 43);
    s.insert(&events);
    let stratum = |e: &InferenceEvent| {
        let bucket = input_bucket(u64::from(e.input_tokens));
        (e.business_line.clone(), e.model_name.clone(), e.model_version.clone(), bucket, (e.timestamp_ms / 3_600_000 % 24) as u64)
    };
    let mut series: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
    events.iter().for_each(|e| *series.entry((&e.business_line, &e.model_name, &e.model_version)).or_default() += 1);
    assert!(series.values().any(|n| *n > 8_000), "a series larger than a unit, so cut by time: {series:?}");

    let mut a = s.spawn("inferlog-compactor", &["--once"], "a.log", &[]);
    let mut b = s.spawn("inferlog-compactor", &["--once"], "b.log", &[]);
    for (name, child) in [("a", &mut a), ("b", &mut b)] {
        let status = inferlog_tests::wait_with_limit(child, std::time::Duration::from_secs(300));
        assert!(status.success(), "{name}: {status}: {}", s.log(&format!("{name}.log")));
    }
    let (objects, archived) = read_day(&s, last);
    let units: HashSet<&str> = objects.iter().filter_map(|o| o.0.rsplit('/').next()).filter_map(|f| f.get(..17)).collect();
    assert!(units.len() >= 12 && units.iter().all(|u| u.starts_with("unit-")), "archived in units: {units:?}");
    let ids: HashSet<&str> = archived.iter().map(|a| a.request_id.as_str()).collect();
    assert_eq!(ids.len(), archived.len(), "each request once");
    assert!(archived.len() * 3 < events.len(), "sampled: {} of {} rows kept", archived.len(), events.len());

    let mut exact: BTreeMap<_, u64> = BTreeMap::new();
    events.iter().for_each(|e| *exact.entry(stratum(e)).or_default() += 1);
    let mut weighted: BTreeMap<_, u64> = BTreeMap::new();
    archived.iter().for_each(|a| *weighted.entry(a.stratum.clone()).or_default() += a.weight);
    assert_eq!(weighted, exact, "sum(sample_weight) per stratum = the input's count");
    let errors = events.iter().filter(|e| e.error_code != 0).count();
    let kept_errors = archived.iter().filter(|a| a.reason == "error" && a.weight == 1).count();
    assert_eq!(kept_errors, errors, "every error kept whole");

    let mut per_line: BTreeMap<String, u64> = BTreeMap::new();
    events.iter().for_each(|e| *per_line.entry(e.business_line.clone()).or_default() += 1);
    let mut weights: BTreeMap<String, u64> = BTreeMap::new();
    archived.iter().for_each(|a| *weights.entry(a.stratum.0.clone()).or_default() += a.weight);
    assert_eq!(weights, per_line, "sum(sample_weight) per line = the input's requests");
    let aggregates: BTreeMap<String, u64> = s
        .psql("SELECT business_line, sum(requests) FROM daily_aggregates GROUP BY business_line ORDER BY 1")
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(line, n)| (line.to_owned(), n.parse().expect("requests"))))
        .collect();
    assert_eq!(aggregates, per_line, "the aggregates' requests per line = the input's (and the weights')");
    let represented = s.psql(&format!("SELECT sum(represented_rows), sum(rows) FROM cold_manifest WHERE day = '{}'", day_string(last)));
    assert_eq!(represented, format!("{}\t{}", events.len(), archived.len()));

    // The same rows archived in one piece keep the same rows, weights and reasons.
    let whole = TierScenario::new("smp_units_whole", SAMPLING);
    whole.rewrite_config("lateness = \"1s\"", "lateness = \"1s\"\nunit_max_rows = 0");
    whole.insert(&events);
    let (code, _) = whole.run("inferlog-compactor", &["--once"], "run.log");
    assert_eq!(code, 0, "{}", whole.log("run.log"));
    let (one_piece, whole_rows) = read_day(&whole, last);
    assert!(one_piece.iter().all(|o| o.0.contains("/part-")), "one piece: {one_piece:?}");
    let decisions = |rows: &[Archived]| -> BTreeMap<String, (u64, String)> {
        rows.iter().map(|a| (a.request_id.clone(), (a.weight, a.reason.clone()))).collect()
    };
    assert!(decisions(&archived) == decisions(&whole_rows), "the units keep what the day in one piece keeps");
}
