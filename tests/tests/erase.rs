//! Erasure on request against the real ClickHouse, Postgres, S3 server and
//! broker: three users erased from 10 hot and 10 archived days, the run
//! killed -9 mid-rewrite and after a manifest swap, then finished; every
//! other row intact, counted independently (ClickHouse over HTTP, the
//! archive with pyarrow, the events as generated); the receipt's digests
//! are the objects' own; the DLQ partitions listed; a second run and an
//! unknown user remove nothing and say so; a key the tiers do not hold is
//! refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use inferlog_schema::hash::UserIdHasher;
use inferlog_schema::InferenceEvent;
use inferlog_tests::seed::SEED_HASH_KEY;
use inferlog_tests::tiers::{day_string, today, TierScenario};
use inferlog_tests::{kafka_brokers, kafkatool};

/// Rows per day; `INFERLOG_TEST_ERASE_PER_DAY` sets it for the figure in docs/performance.md.
fn per_day() -> usize {
    std::env::var("INFERLOG_TEST_ERASE_PER_DAY").ok().and_then(|v| v.parse().ok()).unwrap_or(1_500)
}

/// Hot policy 11 days: of the 20 days ending two days ago, 10 are released and 10 stay hot.
fn scenario(name: &str) -> (TierScenario, String) {
    let id = inferlog_tests::unique(name);
    let dlq = format!("{id}-dlq");
    kafkatool(&["create-topics", "--partitions", "1", "--config", "retention.ms=518400000", "--config", "segment.ms=86400000", &dlq]);
    let s = TierScenario::new(
        name,
        &format!(
            "[kafka]\nbrokers = \"{}\"\ndlq_topic = \"{dlq}\"\n\n[retention]\nhot_days = 11\naggregate_days = 30\ncold_days = 30\n",
            kafka_brokers()
        ),
    );
    (s, dlq)
}

fn key() -> String {
    String::from_utf8(SEED_HASH_KEY.to_vec()).expect("ascii key")
}

/// Runs `inferlog-retention args` with the seed's hash key: exit code and stdout.
fn retention(s: &TierScenario, args: &[&str], log: &str) -> (i32, String) {
    let out = s.command("inferlog-retention", args, log, &[("INFERLOG_HASH_KEY", &key())]).output().expect("run");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs erase until it pauses at `step`, then kills it with SIGKILL.
fn kill_erase_at(s: &TierScenario, args: &[&str], step: &str, log: &str) {
    let mut child = s.spawn("inferlog-retention", args, log, &[("INFERLOG_HASH_KEY", &key()), ("INFERLOG_RETENTION_PAUSE_AFTER", step)]);
    if let Some(status) = inferlog_tests::wait_paused(&mut child, || s.log(log), Duration::from_secs(300)) {
        panic!("erase exited ({status}) before reaching {step}: {}", s.log(log));
    }
    child.kill().expect("kill -9");
    let _ = child.wait();
}

/// Request ids of the archive (pyarrow) by day folder.
fn archived_ids(s: &TierScenario) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_day: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for o in s.read_archive(0).as_array().expect("objects") {
        let key = o["key"].as_str().expect("key");
        let day = key.split("dt=").nth(1).map(|r| r[..10].to_owned()).expect("day folder");
        let ids = by_day.entry(day).or_default();
        for id in o["request_ids"].as_array().expect("ids") {
            assert!(ids.insert(id.as_str().expect("id").to_owned()), "{id} archived twice");
        }
    }
    by_day
}

/// Request ids of the hot table (ClickHouse over HTTP) by day.
fn hot_ids(s: &TierScenario) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_day: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in inferlog_tests::clickhouse(&format!("SELECT toString(day), request_id FROM {}", s.qualified_table())).lines() {
        let (day, id) = line.split_once('\t').expect("tsv");
        assert!(by_day.entry(day.to_owned()).or_default().insert(id.to_owned()), "{id} stored twice");
    }
    by_day
}

/// The events' request ids by day, without those of `erased` users.
fn expected_ids(events: &[InferenceEvent], erased: &BTreeSet<String>, days: impl Fn(&str) -> bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_day: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in events.iter().filter(|e| !e.user_id_hash.as_ref().is_some_and(|u| erased.contains(u))) {
        let day = inferlog_schema::timestamp::utc_day(e.timestamp_ms);
        if days(&day) {
            by_day.entry(day).or_default().insert(e.request_id.clone());
        }
    }
    by_day
}

/// Every manifest row names an object the store has, with the digest the store's bytes have.
fn assert_manifest_matches_the_store(s: &TierScenario) {
    let digests = s.s3_digests();
    for row in s.psql("SELECT object_key, sha256 FROM cold_manifest ORDER BY object_key").lines() {
        let (key, sha) = row.split_once('\t').expect("row");
        assert_eq!(digests.get(key).map(String::as_str), Some(sha), "manifest row {key} against the store: {digests:?}");
    }
}

#[test]
#[allow(clippy::print_stderr)] // the receipt, in the test's output
fn erasing_three_users_from_hot_and_archived_days_is_exact_resumable_and_receipted() {
    let (s, dlq) = scenario("erase");
    let t = today();
    let events = s.seed(per_day() * 20, 20, t - 2, 71);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "{}", s.log("compactor.log"));
    let released = |d: &str| d < day_string(t - 11).as_str();
    let hot_before = s.hot_days();
    assert_eq!(hot_before.len(), 10, "10 days stay hot: {hot_before:?}");
    assert!(hot_before.iter().all(|(d, _)| !released(d)));

    // Three users: the heaviest, one of middle weight, one of the tail, each on hot and released days.
    let mut per_user: HashMap<&str, (usize, BTreeSet<bool>)> = HashMap::new();
    for e in &events {
        if let Some(u) = e.user_id_hash.as_deref() {
            let entry = per_user.entry(u).or_default();
            entry.0 += 1;
            entry.1.insert(released(&inferlog_schema::timestamp::utc_day(e.timestamp_ms)));
        }
    }
    let mut users: Vec<(&str, usize)> = per_user.iter().filter(|(_, (_, tiers))| tiers.len() == 2).map(|(u, (n, _))| (*u, *n)).collect();
    users.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let chosen = [users[0], users[users.len() / 4], users[users.len() - 1]];
    let erased: BTreeSet<String> = chosen.iter().map(|(u, _)| (*u).to_owned()).collect();
    let erased_rows: usize = chosen.iter().map(|(_, n)| n).sum();
    // The request names them as the compliance team would: plaintext ids (the generator's `u-NNNNNN`).
    let hasher = UserIdHasher::new(SEED_HASH_KEY, None, "test").expect("hasher");
    let plaintext: Vec<String> =
        (0..inferlog_schema::generate::USERS).map(|n| format!("u-{n:06}")).filter(|p| erased.contains(&hasher.hash(p))).collect();
    assert_eq!(plaintext.len(), 3, "the chosen users' plaintext ids");
    let users_file = s.dir.path().join("users.txt");
    std::fs::write(&users_file, format!("# request 2026-12-03\n{}\n", plaintext.join("\n"))).expect("users file");
    let users_arg = users_file.to_str().expect("path");
    let hashes_file = s.dir.path().join("hashes.txt");
    std::fs::write(&hashes_file, erased.iter().cloned().collect::<Vec<_>>().join("\n") + "\n").expect("hashes file");
    let hashes_arg = hashes_file.to_str().expect("path");

    // One redacted reject in the DLQ carries a user's hash, one does not.
    let rejects = s.dir.path().join("rejects.jsonl");
    let first = erased.iter().next().expect("a user");
    std::fs::write(&rejects, format!("{{\"user_id\":\"{first}\",\"error_code\":\"x\"}}\n{{\"user_id\":\"k:other\"}}\n")).expect("rejects");
    inferlog_tests::produce(&dlq, &rejects);

    // Plaintext ids with a key the tiers were not written with: refused, nothing removed.
    let other = s
        .command("inferlog-retention", &["erase", "--user-ids", users_arg], "wrong_key.log", &[("INFERLOG_HASH_KEY", "another-key-another-key-0123")])
        .output()
        .expect("run");
    assert_eq!(out_code(&other), 2, "{}", s.log("wrong_key.log"));
    assert!(s.log("wrong_key.log").contains("key id"), "{}", s.log("wrong_key.log"));
    assert_eq!(s.hot_days(), hot_before, "a refused request removes nothing");

    // Killed after the hot mutation and the first object written; then after the first swap.
    let erase = ["erase", "--user-ids", users_arg];
    kill_erase_at(&s, &erase, "erase_written", "erase1.log");
    assert_manifest_matches_the_store(&s);
    kill_erase_at(&s, &erase, "erase_swapped", "erase2.log");
    assert_manifest_matches_the_store(&s);
    let receipt_file = s.dir.path().join("receipt.json");
    let started = std::time::Instant::now();
    let (code, stdout) = retention(&s, &["erase", "--user-ids", users_arg, "--receipt", receipt_file.to_str().expect("path")], "erase3.log");
    eprintln!("erase (resumed) of 3 users from 20 days of {} rows: {:?}", per_day(), started.elapsed());
    assert_eq!(code, 0, "{stdout}\n{}", s.log("erase3.log"));
    let receipt: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&receipt_file).expect("receipt")).expect("json");
    assert_eq!(receipt, serde_json::from_str::<serde_json::Value>(&stdout).expect("stdout json"), "the file is the receipt printed");
    eprintln!("receipt: {stdout}");

    // Every other row intact, no row of the users: hot from ClickHouse, archive with pyarrow, against the generated events.
    assert_eq!(hot_ids(&s), expected_ids(&events, &erased, |d| !released(d)), "hot rows after the erasure");
    assert_eq!(archived_ids(&s), expected_ids(&events, &erased, |_| true), "archived rows after the erasure");
    let hot_after: u64 = s.hot_days().iter().map(|(_, n)| n).sum();
    let archived_after: usize = archived_ids(&s).values().map(BTreeSet::len).sum();
    assert_eq!(archived_after, events.len() - erased_rows, "{erased_rows} rows erased from the archive");
    assert!(hot_after < hot_before.iter().map(|(_, n)| n).sum::<u64>());
    assert_manifest_matches_the_store(&s);

    // The receipt: its digests are the objects'; the interrupted first object is the unlisted copy this run deleted.
    let digests = s.s3_digests();
    let objects = receipt["cold"]["objects"].as_array().expect("objects");
    assert!(!objects.is_empty());
    for o in objects {
        match o["new_key"].as_str() {
            Some(new_key) => assert_eq!(digests.get(new_key).map(String::as_str), o["sha256"].as_str(), "{o}"),
            None => assert!(!digests.contains_key(o["old_key"].as_str().expect("old key")), "{o}"),
        }
        assert!(!digests.contains_key(o["old_key"].as_str().expect("old key")), "old object deleted: {o}");
    }
    assert_eq!(receipt["outcome"], "erased");
    assert_eq!(receipt["hashes"].as_array().map(Vec::len), Some(3));
    let dlq_parts = receipt["dlq"]["partitions"].as_array().expect("dlq partitions read");
    assert_eq!(dlq_parts.len(), 1, "{receipt}");
    assert_eq!(dlq_parts[0]["messages"], 1);
    let ms = |field: &str| inferlog_schema::timestamp::parse_rfc3339_ms(dlq_parts[0][field].as_str().expect(field)).expect("time");
    assert_eq!(ms("removed_by") - ms("newest"), 7 * 86_400_000, "retention.ms + segment.ms of the topic");

    // Each deletion audited once; audit --user-ids proves the tiers clean; the policy audit has no violation.
    let audited = s.psql("SELECT tier, action, count(*) FROM retention_audit WHERE actor = 'erase' GROUP BY tier, action ORDER BY tier, action");
    assert!(audited.contains("hot\terase_rows\t10"), "one audit row per hot day: {audited}");
    assert!(audited.contains("cold\terase_unlisted\t1"), "the copy the killed run left: {audited}");
    let (code, report) = retention(&s, &["audit", "--user-ids", hashes_arg, "--hashed"], "audit_users.log");
    assert_eq!(code, 0, "{report}\n{}", s.log("audit_users.log"));
    assert!(report.contains("CLEAN") && report.contains("hot        rows 0") && report.contains("cold       rows 0"), "{report}");
    let (code, report) = s.run("inferlog-retention", &["audit", "--format", "json"], "audit.log");
    assert_eq!(code, 0, "{report}");

    // Idempotent: a second run (of the stored hashes, the same users) removes nothing and says so.
    let (code, stdout) = retention(&s, &["erase", "--user-ids", hashes_arg, "--hashed"], "erase4.log");
    assert_eq!(code, 0, "{}", s.log("erase4.log"));
    let again: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        (again["outcome"].as_str(), again["hot"]["rows_removed"].as_u64(), again["cold"]["rows_removed"].as_u64()),
        (Some("nothing_held"), Some(0), Some(0))
    );
    assert_eq!(again["request_id"], receipt["request_id"], "the same users, the same request");

    // The compactor archives the changed hot days again; the erased rows stay gone and the audit stays clean.
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor2.log");
    assert_eq!(code, 0, "{}", s.log("compactor2.log"));
    assert_eq!(archived_ids(&s), expected_ids(&events, &erased, |_| true), "archived rows after the compactor's next pass");
    assert_manifest_matches_the_store(&s);
    let (code, report) = s.run("inferlog-retention", &["audit", "--format", "json"], "audit2.log");
    assert_eq!(code, 0, "{report}");

    // A user who never existed: zero everywhere, exit 0, nothing changed.
    let nobody = s.dir.path().join("nobody.txt");
    std::fs::write(&nobody, "u-999999999\n").expect("file");
    let before = s.end_state();
    let (code, stdout) = retention(&s, &["erase", "--user-ids", nobody.to_str().expect("path")], "erase5.log");
    assert_eq!(code, 0, "{}", s.log("erase5.log"));
    let none: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        (none["outcome"].as_str(), none["hot"]["rows_removed"].as_u64(), none["cold"]["rows_removed"].as_u64()),
        (Some("nothing_held"), Some(0), Some(0))
    );
    assert_eq!(s.end_state(), before, "nothing changed");
    let logs: String = ["erase1.log", "erase2.log", "erase3.log", "erase5.log", "wrong_key.log"].iter().map(|l| s.log(l)).collect();
    for p in plaintext.iter().map(String::as_str).chain(["u-999999999"]) {
        assert!(!stdout.contains(p) && !logs.contains(p) && !receipt.to_string().contains(p), "{p} printed or logged");
    }
}

fn out_code(out: &std::process::Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// The figure in docs/performance.md (not run by `.ci/run`): `erase` of
/// three users at a time from 10 archived (released) days of
/// `INFERLOG_TEST_ERASE_PER_DAY` rows each (default 100,000), three times
/// with three different users, beside `audit --user-ids` (the read-only
/// scan of every tier erase starts with) on the same data.
#[test]
#[allow(clippy::print_stderr)] // the figures, in the test's output
#[ignore = "benchmark: cargo test --test erase -- --ignored --nocapture"]
fn bench_erase_three_users_from_ten_archived_days() {
    let per_day = std::env::var("INFERLOG_TEST_ERASE_PER_DAY").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let (s, _) = scenario("erase_bench");
    let t = today();
    let events = s.seed(per_day * 10, 10, t - 12, 72);
    let (code, _) = s.run("inferlog-compactor", &["--once"], "compactor.log");
    assert_eq!(code, 0, "{}", s.log("compactor.log"));
    assert!(s.hot_days().is_empty(), "every day released");
    let mut per_user: HashMap<&str, usize> = HashMap::new();
    for u in events.iter().filter_map(|e| e.user_id_hash.as_deref()) {
        *per_user.entry(u).or_default() += 1;
    }
    let mut users: Vec<(&str, usize)> = per_user.into_iter().collect();
    users.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let (mut erase_s, mut audit_s) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let chosen = [users[round], users[users.len() / 4 + round], users[users.len() - 1 - round]];
        let file = s.dir.path().join(format!("users{round}.txt"));
        std::fs::write(&file, chosen.iter().map(|(u, _)| *u).collect::<Vec<_>>().join("\n")).expect("file");
        let path = file.to_str().expect("path");
        let started = std::time::Instant::now();
        let (code, _) = retention(&s, &["audit", "--user-ids", path, "--hashed"], "bench_audit.log");
        audit_s.push(started.elapsed().as_secs_f64());
        assert_eq!(code, 1, "the users are held before the erasure");
        let started = std::time::Instant::now();
        let (code, stdout) = retention(&s, &["erase", "--user-ids", path, "--hashed"], "bench_erase.log");
        erase_s.push(started.elapsed().as_secs_f64());
        assert_eq!(code, 0, "{}", s.log("bench_erase.log"));
        let receipt: serde_json::Value = serde_json::from_str(&stdout).expect("json");
        let rows: usize = chosen.iter().map(|(_, n)| n).sum();
        assert_eq!(receipt["cold"]["rows_removed"].as_u64(), Some(rows as u64));
        eprintln!(
            "round {round}: {rows} rows in {} objects; audit --user-ids {:.2} s, erase {:.2} s",
            receipt["cold"]["objects"].as_array().map_or(0, Vec::len),
            audit_s[round],
            erase_s[round]
        );
        if round == 0 {
            eprintln!("receipt: {stdout}");
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[1]
    };
    eprintln!(
        "median of 3: erase {:.2} s, audit --user-ids {:.2} s ({} rows over 10 days)",
        median(&mut erase_s),
        median(&mut audit_s),
        events.len()
    );
}
