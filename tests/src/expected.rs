//! What the tiers must hold, computed here from the input events, never
//! from inferlog's own figures: the day's aggregates (counts, sums, exact
//! percentiles, errors) and a day archived in units by several compactors.

use std::collections::BTreeMap;

use inferlog_schema::histogram::{Histogram, RELATIVE_ERROR};
use inferlog_schema::InferenceEvent;

use crate::tiers::{day_string, TierScenario};

pub type GroupKey = (String, String, String, String, String, String);

#[derive(Debug, Default)]
pub struct Group {
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_hits: u64,
    pub cache_prefix_tokens: u64,
    /// total, ttft, tpot, queue, prefill, decode
    pub durations: [Vec<f64>; 6],
}

/// The floor-rank percentile the aggregates document: the value at 0-based position floor(q·n).
pub fn percentile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let index = ((q * values.len() as f64) as usize).min(values.len() - 1);
    Some(values[index])
}

pub fn expected_groups(events: &[InferenceEvent]) -> BTreeMap<GroupKey, Group> {
    let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
    for e in events {
        let key = (
            inferlog_schema::timestamp::utc_day(e.timestamp_ms),
            e.business_line.clone(),
            e.model_name.clone(),
            e.model_version.clone(),
            e.input_bucket().as_str().to_owned(),
            e.output_bucket().as_str().to_owned(),
        );
        let g = groups.entry(key).or_default();
        g.requests += 1;
        g.errors += u64::from(e.error_code != 0);
        g.input_tokens += u64::from(e.input_tokens);
        g.output_tokens += u64::from(e.output_tokens);
        g.cache_hits += u64::from(e.cache_hit == Some(true));
        g.cache_prefix_tokens += u64::from(e.cache_prefix_tokens.unwrap_or(0));
        let values = [Some(e.total_latency_ms), e.ttft_ms, e.tpot_ms, e.queue_wait_ms, e.prefill_time_ms, e.decode_time_ms];
        for (column, value) in g.durations.iter_mut().zip(values) {
            if let Some(v) = value {
                column.push(v);
            }
        }
    }
    groups
}

pub const AGGREGATE_COLUMNS: &str = "day, business_line, model_name, model_version, input_bucket, output_bucket, requests, errors, input_tokens, \
    output_tokens, cache_hits, cache_prefix_tokens, total_latency_p50_ms, total_latency_p95_ms, total_latency_p99_ms, \
    ttft_p50_ms, ttft_p95_ms, ttft_p99_ms, tpot_p50_ms, tpot_p95_ms, tpot_p99_ms, queue_wait_p50_ms, queue_wait_p95_ms, \
    queue_wait_p99_ms, prefill_p50_ms, prefill_p95_ms, prefill_p99_ms, decode_p50_ms, decode_p95_ms, decode_p99_ms";

pub fn assert_aggregates_match(s: &TierScenario, events: &[InferenceEvent]) {
    let mut expected = expected_groups(events);
    let stored = s.psql(&format!("SELECT {AGGREGATE_COLUMNS} FROM daily_aggregates ORDER BY 1, 2, 3, 4, 5, 6"));
    let mut seen = 0;
    for line in stored.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 30, "{line}");
        let key = (f[0].to_owned(), f[1].to_owned(), f[2].to_owned(), f[3].to_owned(), f[4].to_owned(), f[5].to_owned());
        let g = expected.get_mut(&key).unwrap_or_else(|| panic!("unexpected group {key:?}"));
        let n = |i: usize| f[i].parse::<u64>().unwrap_or_else(|e| panic!("{line}: column {i}: {e}"));
        assert_eq!(
            (n(6), n(7), n(8), n(9), n(10), n(11)),
            (g.requests, g.errors, g.input_tokens, g.output_tokens, g.cache_hits, g.cache_prefix_tokens),
            "{key:?}: counts and sums"
        );
        for (d, values) in g.durations.iter_mut().enumerate() {
            for (l, q) in [0.5, 0.95, 0.99].into_iter().enumerate() {
                let text = f[12 + d * 3 + l];
                let stored = (!text.is_empty()).then(|| text.parse::<f64>().expect("float"));
                assert_eq!(stored, percentile(values, q), "{key:?}: duration {d} p{q} (exact floor rank)");
            }
        }
        seen += 1;
    }
    assert_eq!(seen, expected.len(), "every group of the input is stored, and nothing else");

    // (day, business line, model, version, input bucket, code, stage) -> errors
    type ErrorKey = (String, String, String, String, String, i32, String);
    let mut errors: BTreeMap<ErrorKey, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e.error_code != 0) {
        let key = (
            inferlog_schema::timestamp::utc_day(e.timestamp_ms),
            e.business_line.clone(),
            e.model_name.clone(),
            e.model_version.clone(),
            e.input_bucket().as_str().to_owned(),
            e.error_code,
            e.error_stage.map(|s| s.as_str().to_owned()).unwrap_or_default(),
        );
        *errors.entry(key).or_default() += 1;
    }
    let stored = s.psql(
        "SELECT day, business_line, model_name, model_version, input_bucket, error_code, error_stage, errors, error_name FROM daily_errors ORDER BY 1, 2, 3, 4, 5, 6, 7",
    );
    let mut found = BTreeMap::new();
    for line in stored.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_ne!(f[8], "unknown", "every code has its dictionary name: {line}");
        found.insert(
            (f[0].to_owned(), f[1].to_owned(), f[2].to_owned(), f[3].to_owned(), f[4].to_owned(), f[5].parse().expect("code"), f[6].to_owned()),
            f[7].parse::<u64>().expect("count"),
        );
    }
    assert_eq!(found, errors, "error counts per (day, business line, model, version, input bucket, code, stage)");
}

/// A day of `events` archived in `units_planned` units by the processes
/// whose logs are `logs`, then released (the caller checks its hot tier):
/// the day released once, the plan
/// forgotten, at least two processes verified units, the manifest equal to
/// the objects in the store byte for byte, objects of every unit, every
/// request id of the input archived once, the aggregates (groups, errors,
/// hours, waste: `events` with [`plant_prompts`]) equal to the input's, and
/// a clean retention audit.
pub fn assert_units_archived(s: &TierScenario, events: &[InferenceEvent], day: i32, units_planned: usize, logs: &[&str]) {
    let name = day_string(day);
    assert_eq!(s.psql("SELECT day, state, hot_rows FROM compactor_days"), format!("{name}\treleased\t{}", events.len()));
    assert_eq!(s.psql("SELECT count(*) FROM compactor_units"), "0", "the plan is forgotten once the manifest holds it");
    assert_eq!(
        s.psql(&format!("SELECT count(*), sum(rows) FROM retention_audit WHERE action = 'drop_partition' AND unit = '{name}'")),
        format!("1\t{}", events.len()),
        "released once"
    );
    let workers = logs.iter().filter(|l| s.log(l).contains("unit verified")).count();
    assert!(workers >= 2, "the units were shared: {workers} processes verified units");

    // The manifest lists every object once and only the objects that exist,
    // each with the bytes the store holds; every request id once.
    let manifest = s.psql("SELECT object_key, sha256, rows FROM cold_manifest ORDER BY object_key");
    let digests = s.s3_digests();
    let listed: BTreeMap<String, String> =
        manifest.lines().map(|l| l.split('\t').collect::<Vec<_>>()).map(|f| (f[0].to_owned(), f[1].to_owned())).collect();
    assert_eq!(listed, digests, "manifest = the objects in the store, byte for byte (none of A's left over)");
    let units: std::collections::BTreeSet<&str> = listed.keys().filter_map(|k| k.rsplit('/').next()).filter_map(|f| f.get(..17)).collect();
    assert_eq!(units.len(), units_planned, "objects of every unit: {units:?}");
    let archive = s.read_archive(0);
    let mut ids: Vec<&str> = archive
        .as_array()
        .expect("objects")
        .iter()
        .flat_map(|o| o["request_ids"].as_array().expect("ids").iter().filter_map(|v| v.as_str()))
        .collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = events.iter().map(|e| e.request_id.as_str()).collect();
    expected.sort_unstable();
    assert!(ids == expected, "every request id of the input archived once ({} archived, {} sent)", ids.len(), expected.len());

    // The day's aggregates equal figures computed here from the input:
    // counts, tokens and the exact percentiles; hours and waste.
    assert_aggregates_match(s, events);
    assert_histograms_match(s, events);
    assert_hours_and_waste_match(s, events);
    let (code, out) = s.run("inferlog-retention", &["audit"], "audit.log");
    assert_eq!(code, 0, "the audit is clean: {out}{}", s.log("audit.log"));
}

/// Gives every third event a prompt hash out of 20,000, so prompts repeat
/// within a business line across its models, versions and hours (and so
/// across the units of a day archived in units).
pub fn plant_prompts(events: &mut [InferenceEvent]) {
    for (i, e) in events.iter_mut().enumerate().filter(|(i, _)| i % 3 == 0) {
        e.prompt_hash = Some(format!("k1:p{}", (i * 7_919) % 20_000));
    }
}

/// The stored hours (`hourly_aggregates`: totals and busiest minute per
/// hour × line × model × version) and waste (`daily_waste`: requests,
/// prompts and repeats per line) equal figures computed here from `events`.
pub fn assert_hours_and_waste_match(s: &TierScenario, events: &[InferenceEvent]) {
    type HourKey = (u64, String, String, String);
    // (requests, errors, input, output, requests per minute of the hour)
    let mut hours: BTreeMap<HourKey, (u64, u64, u64, u64, [u64; 60])> = BTreeMap::new();
    for e in events {
        let minute = (e.timestamp_ms / 60_000) as u64;
        let h = hours.entry((minute / 60, e.business_line.clone(), e.model_name.clone(), e.model_version.clone())).or_insert((0, 0, 0, 0, [0; 60]));
        h.0 += 1;
        h.1 += u64::from(e.error_code != 0);
        h.2 += u64::from(e.input_tokens);
        h.3 += u64::from(e.output_tokens);
        h.4[(minute % 60) as usize] += 1;
    }
    let expected: Vec<String> = hours
        .iter()
        .map(|((hour, l, m, v), (n, err, i, o, minutes))| {
            // The busiest minute, the earliest of equals.
            let most = minutes.iter().max().copied().unwrap_or(0);
            let peak = minutes.iter().position(|c| *c == most).unwrap_or(0) as u64;
            format!("{hour}\t{l}\t{m}\t{v}\t{n}\t{err}\t{i}\t{o}\t{}\t{most}", hour * 60 + peak)
        })
        .collect();
    let stored = s.psql(
        "SELECT extract(epoch FROM hour)::bigint / 3600, business_line, model_name, model_version, requests, errors, input_tokens, output_tokens, \
         extract(epoch FROM peak_minute)::bigint / 60, peak_minute_requests FROM hourly_aggregates \
         ORDER BY hour, business_line COLLATE \"C\", model_name COLLATE \"C\", model_version COLLATE \"C\"",
    );
    assert!(stored.lines().eq(expected.iter().map(String::as_str)), "hourly_aggregates = the input's hours ({} expected)", expected.len());

    // Per line: requests, hashed, and per prompt its requests, tokens,
    // uncached input and first request (timestamp, tokens, uncached).
    type Prompt = (u64, u64, u64, (u64, u64, u64));
    let mut lines: BTreeMap<String, (u64, u64, BTreeMap<String, Prompt>)> = BTreeMap::new();
    for e in events {
        let line = lines.entry(e.business_line.clone()).or_default();
        line.0 += 1;
        let Some(prompt) = e.prompt_hash.as_ref().filter(|p| !p.is_empty()) else { continue };
        line.1 += 1;
        let tokens = u64::from(e.input_tokens) + u64::from(e.output_tokens);
        let uncached = u64::from(e.input_tokens.saturating_sub(e.cache_prefix_tokens.unwrap_or(0)));
        let this = (e.timestamp_ms as u64, tokens, uncached);
        let p = line.2.entry(prompt.clone()).or_insert((0, 0, 0, this));
        (p.0, p.1, p.2, p.3) = (p.0 + 1, p.1 + tokens, p.2 + uncached, p.3.min(this));
    }
    let expected: Vec<String> = lines
        .iter()
        .map(|(line, (requests, hashed, prompts))| {
            let repeated = prompts.values().filter(|p| p.0 > 1);
            let (repeats, tokens, uncached) = repeated.fold((0, 0, 0), |(r, t, u), p| (r + p.0 - 1, t + p.1 - p.3 .1, u + p.2 - p.3 .2));
            format!("{line}\t{requests}\t{hashed}\t{repeats}\t{tokens}\t{uncached}")
        })
        .collect();
    let stored = s.psql(
        "SELECT business_line, requests, hashed, repeats, repeat_tokens, repeat_uncached_input FROM daily_waste ORDER BY business_line COLLATE \"C\"",
    );
    assert_eq!(stored.lines().collect::<Vec<_>>(), expected, "daily_waste = the input's repeated prompts per line");
    assert!(lines.values().all(|(_, _, prompts)| prompts.values().any(|p| p.0 > 1)), "prompts repeat on every line: {expected:?}");
}

/// Each daily group's stored total-latency histogram (the units' merged
/// ones, for a day in units) counts the group's requests and answers its
/// p50 and p99 within the histograms' 1% of the input's exact values.
pub fn assert_histograms_match(s: &TierScenario, events: &[InferenceEvent]) {
    let mut expected = expected_groups(events);
    let stored =
        s.psql("SELECT day, business_line, model_name, model_version, input_bucket, output_bucket, total_latency_hist FROM daily_aggregates");
    let mut seen = 0;
    for line in stored.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let key = (f[0].to_owned(), f[1].to_owned(), f[2].to_owned(), f[3].to_owned(), f[4].to_owned(), f[5].to_owned());
        let g = expected.get_mut(&key).unwrap_or_else(|| panic!("unexpected group {key:?}"));
        let encoded: Vec<i64> = f[6].trim_matches(['{', '}']).split(',').map(|n| n.parse().expect("bigint")).collect();
        let h = Histogram::decode(&encoded).expect("a stored histogram decodes");
        assert_eq!(h.count(), g.requests, "{key:?}: one count per request");
        for q in [0.5, 0.99] {
            let exact = percentile(&mut g.durations[0], q).expect("not empty");
            let got = h.quantile(q).expect("not empty");
            assert!((got - exact).abs() <= exact * (RELATIVE_ERROR + 1e-9), "{key:?}: p{q} {got} from the histogram, exact {exact}");
        }
        seen += 1;
    }
    assert_eq!(seen, expected.len(), "a histogram for every group");
}
