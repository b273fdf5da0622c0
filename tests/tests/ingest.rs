//! `inferlog-ingest` against the real broker (Apache Kafka) and ClickHouse:
//! reconciliation, DLQ reasons, producer retries, partitions handed over
//! between replicas mid-write, two replicas with one killed, SIGTERM,
//! rejects larger than the DLQ takes, and the replay log: a new group on a
//! stored history, with and without the log. Each test has its own topics,
//! group and tables. (A DLQ failing while ingest runs: `ingest_dlq.rs`.)

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use inferlog_tests::{
    clickhouse_u64, expected_reasons, generate, http_get, kafkatool, read_topic, sigterm, valid_count, wait_for, wait_with_limit, write_jsonl,
    Scenario,
};

#[test]
fn every_message_becomes_one_hot_row_or_one_dlq_message_with_its_reason() {
    let s = Scenario::new("reconcile", 8, "");
    let events = s.produce_generated(100_000, 0.02, 101);
    s.drain("ingest.log");

    let valid = valid_count(&events) as u64;
    let invalid = events.len() as u64 - valid;
    assert_eq!(s.hot_count(), (valid, valid), "hot rows: count() and uniqExact(request_id)");

    let dlq = read_topic(&s.dlq);
    assert_eq!(dlq.len() as u64, invalid, "one DLQ message per rejected event");
    assert_eq!(valid + dlq.len() as u64, events.len() as u64, "hot + DLQ = produced");
    let expected = expected_reasons(&events);
    let mut by_reason = BTreeMap::new();
    let mut sources = HashSet::new();
    for m in &dlq {
        let h = &m["headers"];
        let reason = h["inferlog.reason"].as_str().expect("reason header");
        let want = expected.get(inferlog_tests::original_sha256(m)).expect("each DLQ message comes from a produced event");
        assert_eq!(reason, want.as_str(), "{m}");
        for header in ["inferlog.field", "inferlog.message", "inferlog.source.partition", "inferlog.time"] {
            assert!(h[header].is_string(), "{header} missing in {m}");
        }
        assert_eq!(h["inferlog.source.topic"], s.topic.as_str());
        assert!(sources.insert((h["inferlog.source.partition"].to_string(), h["inferlog.source.offset"].to_string())));
        *by_reason.entry(reason.to_owned()).or_insert(0) += 1;
    }
    assert_eq!(by_reason.len(), 14, "every reason code is exercised: {by_reason:?}");

    // The rejects are queryable in ClickHouse too, by reason.
    let logged = clickhouse_u64(&format!("SELECT count() FROM inferlog_test.{}", s.rejects_table));
    assert_eq!(logged, invalid);

    // No user id in clear: every stored value is `<key id>:<64 hex>`, and no
    // text column holds a generated plaintext id (`u-` and six digits).
    let t = s.qualified_table();
    assert_eq!(
        clickhouse_u64(&format!(
            "SELECT count() FROM {t} WHERE user_id_hash IS NOT NULL AND NOT match(user_id_hash, '^[0-9a-f]{{8}}:[0-9a-f]{{64}}$')"
        )),
        0
    );
    assert!(clickhouse_u64(&format!("SELECT count() FROM {t} WHERE user_id_hash IS NOT NULL")) > valid / 2);
    let text = "concat(request_id, business_line, model_name, model_version, ifNull(tenant, ''), ifNull(session_id, ''), ifNull(request_type, ''), ifNull(user_id_hash, ''))";
    assert_eq!(clickhouse_u64(&format!("SELECT count() FROM {t} WHERE match({text}, 'u-[0-9]{{6}}')")), 0);
    assert_eq!(clickhouse_u64(&format!("SELECT count() FROM inferlog_test.{} WHERE match(message, 'u-[0-9]{{6}}')", s.rejects_table)), 0);

    // Prompt text is stored only as its keyed hash: each valid event that
    // carried a prompt has the HMAC of that text, computed here again.
    let key = std::fs::read(s.dir.path().join("hash.key")).expect("key");
    let hasher = inferlog_schema::UserIdHasher::new(key.trim_ascii(), None, "test").expect("hasher");
    let mut prompted: BTreeMap<String, u64> = BTreeMap::new();
    for e in events.iter().filter(|e| e.expected.is_none()) {
        let doc: serde_json::Value = serde_json::from_slice(&e.line).expect("generated JSON");
        if let Some(text) = doc["prompt"].as_str() {
            *prompted.entry(hasher.hash_prompt(text.trim())).or_default() += 1;
        }
    }
    assert!(!prompted.is_empty(), "the generator sends prompt text now and then");
    let stored = inferlog_tests::clickhouse(&format!(
        "SELECT prompt_hash, count() FROM {t} WHERE prompt_hash IS NOT NULL GROUP BY prompt_hash ORDER BY prompt_hash FORMAT TSV"
    ));
    let stored: BTreeMap<String, u64> =
        stored.lines().map(|l| l.split_once('\t').map(|(h, n)| (h.to_owned(), n.parse().expect("count"))).expect("row")).collect();
    assert_eq!(stored, prompted, "stored prompt hashes");
    assert_eq!(clickhouse_u64(&format!("SELECT count() FROM {t} WHERE match({text}, 'Summarize the following')")), 0, "no prompt text");

    // Rows land in their UTC day's partition.
    let days = clickhouse_u64(&format!("SELECT uniqExact(_partition_id) FROM {t}"));
    assert!(days >= 3, "partitioned by day: {days}");
    assert_eq!(
        clickhouse_u64(&format!("SELECT count() FROM {t} WHERE toDate(event_time) != day AND toDateTime(toDate(event_time)) = toDateTime(day)")),
        0
    );
}

#[test]
fn a_request_id_produced_twice_is_stored_once() {
    // Small batches: the retry usually lands in a later batch than the original.
    let s = Scenario::new("retries", 4, "batch_max_rows = 100\n");
    let mut events = generate(2_000, 0.0, 202, 2);
    let retries: Vec<_> = events.iter().step_by(13).cloned().collect();
    events.extend(retries.iter().cloned());
    let file = write_jsonl(s.dir.path(), &events);
    inferlog_tests::produce(&s.topic, &file);
    s.drain("ingest.log");
    assert_eq!(s.hot_count(), (2_000, 2_000));
    assert!(read_topic(&s.dlq).is_empty(), "a retry is not an error");
    assert!(!retries.is_empty());
}

/// `--exit-when-idle` on a member the group gives no partition (another
/// live member holds the topic's only one) never calls the topic drained:
/// it exits 75 saying so, while the other member goes on. (A holds the
/// partition before B joins, and the sticky assignor leaves it there.)
#[test]
fn a_member_given_no_partition_exits_75_instead_of_calling_the_topic_drained() {
    let s = Scenario::new("no_partition", 1, "");
    let events = s.produce_generated(2_000, 0.0, 307);
    let valid = valid_count(&events) as u64;
    let config = std::fs::read_to_string(&s.config).expect("config");
    let with_client_id = |id: &str| config.replacen("[kafka]\n", &format!("[kafka]\noptions = {{ \"client.id\" = \"{id}\" }}\n"), 1);
    let (a_config, b_config) = (s.dir.path().join("a.toml"), s.dir.path().join("b.toml"));
    std::fs::write(&a_config, with_client_id("a-holder")).expect("a.toml");
    std::fs::write(&b_config, with_client_id("z-idle")).expect("b.toml");

    let mut a = s.spawn_ingest_on(&a_config, None, "a.log", &[]);
    wait_for(Duration::from_secs(90), || s.hot_count().0 == valid, || format!("A stores the topic: {:?}\n{}", s.hot_count(), s.log("a.log")));
    let mut b = s.spawn_ingest_on(&b_config, Some("2s"), "b.log", &[]);
    let status = wait_with_limit(&mut b, Duration::from_secs(120));
    let b_log = s.log("b.log");
    assert_eq!(status.code(), Some(75), "a member that read nothing is not drained: {b_log}");
    assert!(b_log.contains("gave this member no partition"), "it says why: {b_log}");
    assert!(a.try_wait().expect("try_wait").is_none(), "A goes on: {}", s.log("a.log"));
    assert!(sigterm(&mut a, Duration::from_secs(60)).success(), "{}", s.log("a.log"));
    assert_eq!(s.hot_count(), (valid, valid));
}

/// One of two replicas in the group is killed (`kill -9`) mid-run and no
/// replacement comes: the broker expires the dead member after the session
/// timeout, the survivor alone is assigned every partition, re-reads the
/// dead one's uncommitted work from its last commit (skipping what it had
/// already stored) and finishes with exact totals.
#[test]
fn two_replicas_share_the_partitions_and_survive_one_being_killed() {
    let s = Scenario::new("replicas", 8, "batch_max_rows = 5000\n");
    let events = generate(100_000, 0.01, 303, 3);
    let file = write_jsonl(s.dir.path(), &events);
    let valid = valid_count(&events) as u64;

    // Both replicas join the group first, so the partitions are shared.
    let mut a = s.spawn_ingest(None, "a.log");
    let mut b = s.spawn_ingest(None, "b.log");
    let start = Instant::now();
    while !(s.log("a.log").contains("\"assign\"") && s.log("b.log").contains("\"assign\"")) {
        assert!(start.elapsed() < Duration::from_secs(90), "both replicas get partitions: {}\n{}", s.log("a.log"), s.log("b.log"));
        std::thread::sleep(Duration::from_millis(200));
    }
    inferlog_tests::produce(&s.topic, &file);
    // kill -9 replica A while both are writing.
    while s.hot_count().0 < valid / 4 {
        assert!(start.elapsed() < Duration::from_secs(180), "a quarter stored within 180 s: {}\n{}", s.log("a.log"), s.log("b.log"));
        std::thread::sleep(Duration::from_millis(100));
    }
    a.kill().expect("kill -9 replica A");
    let _ = a.wait();
    let rows_at_kill = s.hot_count().0;
    // B takes over A's partitions once the group expires A, and re-reads
    // them from A's last commit, skipping what A had already stored.
    let killed = Instant::now();
    while s.hot_count().0 < valid {
        assert!(killed.elapsed() < Duration::from_secs(180), "B alone stored everything within 180 s: {:?}\n{}", s.hot_count(), s.log("b.log"));
        std::thread::sleep(Duration::from_millis(500));
    }
    // Graceful stop: SIGTERM flushes, commits and exits 0.
    let status = sigterm(&mut b, Duration::from_secs(60));
    let b_log = s.log("b.log");
    assert!(status.success(), "replica B: {b_log}");
    assert!(rows_at_kill < valid, "A was killed mid-run");
    assert!(b_log.matches("\"assign\"").count() >= 2, "B was assigned A's partitions: {b_log}");
    assert_eq!(s.hot_count(), (valid, valid), "A: {}\nB: {b_log}", s.log("a.log"));
    // Rejects A sent to the DLQ but never committed are sent again by B
    // (the DLQ is at least once, with the same key): each source offset is there.
    let sources = inferlog_tests::dlq_sources(&read_topic(&s.dlq));
    assert_eq!(sources.len() as u64, events.len() as u64 - valid, "every reject in the DLQ");
}

/// One of two replicas is killed (`kill -9`) mid-run and its supervisor
/// starts a replacement: the group reassigns the partitions, and whoever
/// gets the killed replica's partitions reads its uncommitted work again
/// from its last commit, skipping what it had already stored. Totals exact.
/// (Whether the survivor has taken everything before the replacement
/// joins is the broker's timing, so who ends up with which partitions is
/// not asserted.)
#[test]
fn a_killed_replica_replaced_by_a_new_one_loses_and_doubles_nothing() {
    let s = Scenario::new("replaced", 8, "batch_max_rows = 5000\n");
    let events = generate(100_000, 0.01, 323, 3);
    let valid = valid_count(&events) as u64;
    let file = write_jsonl(s.dir.path(), &events);

    let mut a = s.spawn_ingest(None, "a.log");
    let mut b = s.spawn_ingest(None, "b.log");
    let start = Instant::now();
    let count = |log: &str, what: &str| s.log(log).matches(what).count();
    while !(count("a.log", "\"assign\"") >= 1 && count("b.log", "\"assign\"") >= 1) {
        assert!(start.elapsed() < Duration::from_secs(90), "both replicas get partitions:\nA: {}\nB: {}", s.log("a.log"), s.log("b.log"));
        std::thread::sleep(Duration::from_millis(200));
    }
    inferlog_tests::produce(&s.topic, &file);
    while s.hot_count().0 < valid / 4 {
        assert!(start.elapsed() < Duration::from_secs(180), "the replicas write: {}", s.log("b.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    a.kill().expect("kill -9 replica A");
    let _ = a.wait();
    let rows_at_kill = s.hot_count().0;
    // The replacement joins once the group has expired A (session timeout
    // 6 s): B's heartbeat evicts A and B rejoins.
    let revokes_before = count("b.log", "\"revoke\"");
    let killed = Instant::now();
    wait_for(
        Duration::from_secs(60),
        || count("b.log", "\"revoke\"") > revokes_before || count("b.log", "\"assign\"") > 1,
        || format!("the group expires A and B rebalances: {}", s.log("b.log")),
    );
    let mut c = s.spawn_ingest(None, "c.log");
    while s.hot_count().0 < valid && killed.elapsed() < Duration::from_secs(180) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let status_b = sigterm(&mut b, Duration::from_secs(60));
    let status_c = sigterm(&mut c, Duration::from_secs(60));
    let (a_log, b_log, c_log) = (s.log("a.log"), s.log("b.log"), s.log("c.log"));
    assert!(status_b.success() && status_c.success(), "B and C stop cleanly:\nB: {b_log}\nC: {c_log}");
    assert!(rows_at_kill < valid, "A was killed mid-run ({rows_at_kill} of {valid} rows stored)");
    assert_eq!(s.hot_count(), (valid, valid), "A: {a_log}\nB: {b_log}\nC: {c_log}");
    // Rejects A sent to the DLQ but never committed are sent again by their
    // new owner (the DLQ is at least once, README); each source offset is there.
    let sources = inferlog_tests::dlq_sources(&read_topic(&s.dlq));
    assert_eq!(sources.len() as u64, events.len() as u64 - valid, "every reject in the DLQ");
    #[allow(clippy::print_stderr)] // what the run went through, in the test's output
    {
        let replays = b_log.matches("replaying: skipping stored offsets").count() + c_log.matches("replaying: skipping stored offsets").count();
        eprintln!(
            "rows at the kill: {rows_at_kill}/{valid}; assignments B {} C {}; partitions resumed past stored rows: {replays}",
            b_log.matches("\"assign\"").count(),
            c_log.matches("\"assign\"").count()
        );
    }
}

/// Partitions change hands twice while batches are being written: a second
/// replica joins while the first drains a backlog (the first's revocation
/// waits for its batch in flight), then the first is stopped with SIGTERM
/// mid-stream (it flushes, commits and leaves; the second's revocation waits
/// for its own batch in flight and it takes everything over). The totals are
/// exact: no row lost or stored twice across the hand-overs. Both replicas
/// run on one tokio worker, where a blocked revocation would deadlock.
#[test]
fn partitions_handed_over_while_batches_are_written_lose_and_double_nothing() {
    let s = Scenario::new("handover", 8, "batch_max_rows = 5000\n");
    let first = generate(120_000, 0.01, 313, 3);
    let valid_first = valid_count(&first) as u64;
    let second = generate(60_000, 0.01, 314, 3);
    let valid = (valid_count(&first) + valid_count(&second)) as u64;
    let rejects = (first.len() + second.len()) as u64 - valid;

    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &first));
    let second_file = write_jsonl(s.dir.path(), &second);
    // One tokio worker each: a revocation that waits for the batch in
    // flight must not starve the writer task it waits for. Each batch is
    // in flight for at least 300 ms, so the revocations meet one.
    let one_worker = [("INFERLOG_INGEST__WORKER_THREADS", "1"), ("INFERLOG_INGEST_TEST_SLOW_WRITE_MS", "300")];
    let mut a = s.spawn_ingest_with(None, "a.log", &one_worker);
    let start = Instant::now();
    let assigned = |log: &str, times: usize| s.log(log).matches("\"assign\"").count() >= times;
    while s.hot_count().0 == 0 {
        assert!(start.elapsed() < Duration::from_secs(90), "A starts writing: {}", s.log("a.log"));
        std::thread::sleep(Duration::from_millis(50));
    }
    // B joins while A is still working through the backlog.
    let mut b = s.spawn_ingest_with(None, "b.log", &one_worker);
    while !(assigned("b.log", 1) && assigned("a.log", 2)) {
        assert!(start.elapsed() < Duration::from_secs(120), "the group rebalances onto A and B:\nA: {}\nB: {}", s.log("a.log"), s.log("b.log"));
        std::thread::sleep(Duration::from_millis(100));
    }
    // More events, and A leaves while both are writing them.
    inferlog_tests::produce(&s.topic, &second_file);
    // Mid-stream: rows of the second lot are landing.
    wait_for(
        Duration::from_secs(120),
        || s.hot_count().0 > valid_first,
        || format!("{:?}\nA: {}\nB: {}", s.hot_count(), s.log("a.log"), s.log("b.log")),
    );
    let status_a = sigterm(&mut a, Duration::from_secs(60));
    assert!(status_a.success(), "A stops cleanly: {}", s.log("a.log"));
    // B resumes from A's commits.
    while !assigned("b.log", 2) {
        assert!(start.elapsed() < Duration::from_secs(240), "B takes A's partitions: {}", s.log("b.log"));
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for(Duration::from_secs(120), || s.hot_count().0 >= valid, || format!("B stores everything: {:?}\n{}", s.hot_count(), s.log("b.log")));
    let status_b = sigterm(&mut b, Duration::from_secs(60));
    let (a_log, b_log) = (s.log("a.log"), s.log("b.log"));
    assert!(status_b.success(), "B stops cleanly: {b_log}");
    assert!(a_log.contains("\"revoke\""), "A gave partitions to B: {a_log}");
    assert!(assigned("b.log", 2), "B took A's partitions when A left: {b_log}");
    assert_eq!(s.hot_count(), (valid, valid), "A: {a_log}\nB: {b_log}");
    assert_eq!(read_topic(&s.dlq).len() as u64, rejects, "every reject once in the DLQ");
    let waits = a_log.matches("waiting for the batch in flight").count() + b_log.matches("waiting for the batch in flight").count();
    assert!(waits >= 1, "a revocation met a batch in flight and waited for it:\nA: {a_log}\nB: {b_log}");
}

/// The rows ingest encodes itself are, byte for byte as ClickHouse stores
/// them, the rows the `clickhouse` crate's serializer sends for the same
/// `HotRow`s: every column, NULL and set, long and non-ASCII strings.
#[test]
fn encoded_rows_are_stored_exactly_as_the_clickhouse_crates_own_rows() {
    use inferlog_ingest::sink::ClickHouseSink;
    use inferlog_store::model::rows::HotRow;
    use inferlog_store::ClickHouseConfig;
    use std::sync::Arc;

    let id = inferlog_tests::unique("encode");
    let config = |table: &str| ClickHouseConfig {
        url: inferlog_tests::clickhouse_url(),
        database: "inferlog_test".into(),
        table: table.into(),
        rejects_table: format!("{table}_rejects"),
        ..ClickHouseConfig::default()
    };
    let (typed, encoded) = (format!("{id}_typed"), format!("{id}_encoded"));
    let topic: Arc<str> = Arc::from("encode-topic");
    let end_ms = inferlog_tests::now_ms() - 86_400_000;
    let mut rows: Vec<HotRow> = inferlog_tests::seed::seeded_events(200, 1, end_ms, 909)
        .into_iter()
        .enumerate()
        .map(|(i, e)| HotRow::new(e, topic.clone(), 5, i as i64, 1_800_000_000))
        .collect();
    let template = rows[0].clone();
    let long = "é-ü-東京-".repeat(40);
    rows.push(HotRow {
        request_id: long.clone(),
        business_line: "x".repeat(128),
        error_code: -7,
        error_stage: Some("decode"),
        user_id_hash: Some(long.clone()),
        tenant: Some(String::new()),
        session_id: Some("s".repeat(16_500)),
        request_type: Some("chat".into()),
        queue_wait_ms: Some(0.5),
        prefill_time_ms: Some(1e-9),
        decode_time_ms: Some(123_456.789),
        ttft_ms: Some(f64::MAX),
        tpot_ms: Some(-0.0),
        gpu_id: Some(u32::MAX),
        batch_size: Some(0),
        cache_hit: Some(1),
        cache_prefix_tokens: Some(4096),
        gpu_mem_peak_mb: Some(80_000.25),
        truncated: Some(0),
        prompt_hash: Some(long.clone()),
        max_tokens: Some(u32::MAX),
        kafka_partition: u16::MAX,
        kafka_offset: u64::MAX >> 1,
        kafka_index: u32::MAX,
        ..template.clone()
    });
    rows.push(HotRow {
        request_id: "all-null".into(),
        error_stage: None,
        user_id_hash: None,
        tenant: None,
        session_id: None,
        request_type: None,
        queue_wait_ms: None,
        prefill_time_ms: None,
        decode_time_ms: None,
        ttft_ms: None,
        tpot_ms: None,
        gpu_id: None,
        batch_size: None,
        cache_hit: None,
        cache_prefix_tokens: None,
        gpu_mem_peak_mb: None,
        truncated: None,
        prompt_hash: None,
        max_tokens: None,
        kafka_offset: 999_999,
        ..template
    });
    let day = rows[0].day;
    rows.iter_mut().for_each(|r| r.day = day);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        ClickHouseSink::new(&config(&typed)).expect("sink").prepared().await.expect("typed table");
        let client = config(&typed).client().expect("client").with_database("inferlog_test");
        let mut insert = client.insert::<HotRow>(&typed).await.expect("typed insert");
        for row in &rows {
            insert.write(row).await.expect("typed row");
        }
        insert.end().await.expect("typed insert ends");

        let (sink, _) = ClickHouseSink::new(&config(&encoded)).expect("sink").prepared().await.expect("encoded table");
        sink.insert_rows(&inferlog_tests::seed::encoded(&rows), &sink.insert_id(), false).await.expect("encoded insert");
    });
    let all = |table: &str| inferlog_tests::clickhouse(&format!("SELECT * FROM inferlog_test.{table} ORDER BY kafka_offset FORMAT TabSeparated"));
    let (want, got) = (all(&typed), all(&encoded));
    assert_eq!(want.lines().count(), rows.len());
    assert!(got == want, "encoded rows differ from the crate's:\n{got}\n--- want ---\n{want}");
}

#[test]
fn the_small_tail_of_a_backlog_is_written_when_the_source_goes_quiet() {
    // Batches of 500: 1,637 events are three full batches and a tail of 137,
    // below flush_when_caught_up_rows; batch_max_age is far past the deadline.
    let addr = inferlog_tests::free_loopback_addr();
    let extra = format!("batch_max_rows = 500\nflush_when_caught_up_rows = 10000\nbatch_max_age = \"10m\"\nmetrics_addr = \"{addr}\"\n");
    let s = Scenario::new("tail", 2, &extra);
    let events = s.produce_generated(1_637, 0.0, 707);
    let want = valid_count(&events) as u64;
    let mut child = s.spawn_ingest(None, "ingest.log");
    wait_for(
        Duration::from_secs(60),
        || s.hot_count() == (want, want),
        || format!("the tail after the full batches is written: {:?} of {want}\n{}", s.hot_count(), s.log("ingest.log")),
    );

    // A trickle after it is no backlog's tail: it waits for its age (here,
    // for the SIGTERM's final flush) instead of becoming tiny inserts.
    let trickle = inferlog_tests::generate(3, 0.0, 708, 1);
    inferlog_tests::produce(&s.topic, &write_jsonl(s.dir.path(), &trickle));
    let all_read = format!("inferlog_ingest_messages_total{{topic=\"{}\"}} {}", s.topic, events.len() + 3);
    wait_for(
        Duration::from_secs(60),
        || http_get(&addr, "/metrics").contains(&all_read) && http_get(&addr, "/metrics").contains("inferlog_ingest_inflight_rows 3"),
        || format!("the trickle is read and buffered: {}\n{}", http_get(&addr, "/metrics"), s.log("ingest.log")),
    );
    // Several times the 100 ms quiet period that flushes a tail.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert_eq!(s.hot_count().0, want, "a trickle below flush_when_caught_up_rows is not flushed when the source goes quiet");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Batches after the first write into the buffers of the ones written
    // before them (the pool); a reference an insert attempt kept alive
    // would leave every buffer new.
    let reused = inferlog_tests::metric(&addr, "inferlog_ingest_buffers_reused_total").unwrap_or(0.0);
    assert!(reused > 0.0, "no batch reused a written buffer: {}", http_get(&addr, "/metrics"));
    let status = sigterm(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{}", s.log("ingest.log"));
    assert_eq!(s.hot_count(), (want + 3, want + 3), "the final flush wrote the trickle");
}

#[test]
fn sigterm_flushes_commits_and_exits_zero() {
    let addr = inferlog_tests::free_loopback_addr();
    let s = Scenario::static_assignment("sigterm", 4, &format!("batch_max_age = \"30s\"\nmetrics_addr = \"{addr}\"\n"));
    s.produce_generated(5_000, 0.0, 606);
    // A 30 s batch age: everything read is still buffered when SIGTERM comes.
    let mut child = s.spawn_ingest(None, "ingest.log");
    let get = |path: &str| http_get(&addr, path);
    let all_read = format!("inferlog_ingest_messages_total{{topic=\"{}\"}} 5000", s.topic);
    // The counter moves per message, the gauge once per chunk read: both settle.
    let all_buffered = |m: &str| m.contains(&all_read) && m.contains("inferlog_ingest_inflight_rows 5000");
    wait_for(
        Duration::from_secs(60),
        || all_buffered(&get("/metrics")),
        || format!("everything read is buffered: {}\n{}", get("/metrics"), s.log("ingest.log")),
    );
    assert_eq!(s.hot_count().0, 0, "nothing flushed before the signal");
    let metrics = get("/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(all_buffered(&metrics), "nothing left or flushed before the signal: {metrics}");
    for name in ["inferlog_ingest_rows_inserted_total", "inferlog_ingest_flush_seconds_bucket", "inferlog_ingest_insert_errors_total"] {
        assert!(metrics.contains(name), "{name} in {metrics}");
    }
    // Lag is sampled every few seconds; it shows up for the assigned partitions.
    let lag = format!("inferlog_ingest_consumer_lag{{partition=\"0\",topic=\"{}\"}}", s.topic);
    wait_for(Duration::from_secs(15), || get("/metrics").contains(&lag), || format!("consumer lag per partition: {}", get("/metrics")));
    assert!(get("/healthz").starts_with("HTTP/1.1 200"));
    let status = sigterm(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{}", s.log("ingest.log"));
    assert_eq!(s.hot_count(), (5_000, 5_000), "the final flush wrote everything read");
    // The commit happened: a new run finds nothing left to do.
    s.drain("again.log");
    assert_eq!(s.hot_count(), (5_000, 5_000));
    assert!(s.log("again.log").contains("messages=0"), "{}", s.log("again.log"));
}

/// Rejects larger than the DLQ takes, between normal rejects: one over the
/// DLQ topic's `max.message.bytes` (100 kB; the broker refuses it) and one
/// over the producer's `message.max.bytes` (1 MB; refused at enqueue).
/// Each is written truncated to fit, with headers giving its size and
/// SHA-256, and counted; the rejects around them arrive whole; nothing
/// blocks and nothing is lost.
#[test]
fn rejects_larger_than_the_dlq_takes_are_written_truncated_and_nothing_behind_them_is_lost() {
    let addr = inferlog_tests::free_loopback_addr();
    let s = Scenario::static_assignment("dlqbig", 1, &format!("metrics_addr = \"{addr}\"\n"));
    kafkatool(&["alter-config", "--topic", &s.dlq, "max.message.bytes=100000"]);
    kafkatool(&["alter-config", "--topic", &s.topic, "max.message.bytes=4000000"]);
    let big = |n: usize| format!("{{\"request_id\":\"big-{n}\",\"pad\":\"{}\"}}", "x".repeat(n));
    let lines = ["{not json".to_owned(), big(300_000), "{\"request_id\": 1}".to_owned(), big(1_500_000), "[]".to_owned()];
    let file = s.dir.path().join("big.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").expect("write");
    inferlog_tests::produce(&s.topic, &file);

    let mut ingest = s.spawn_ingest(None, "ingest.log");
    let logged = || {
        let sql = format!("SELECT uniqExact(kafka_offset) FROM inferlog_test.{}", s.rejects_table);
        inferlog_tests::try_clickhouse(&sql).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    // Logged only once the DLQ acknowledged every one: nothing is blocked.
    wait_for(Duration::from_secs(120), || logged() == lines.len() as u64, || s.log("ingest.log"));
    let metrics = http_get(&addr, "/metrics");
    assert!(metrics.contains("inferlog_ingest_dlq_truncated_total 2"), "both cuts counted: {metrics}\n{}", s.log("ingest.log"));
    assert!(sigterm(&mut ingest, Duration::from_secs(60)).success(), "{}", s.log("ingest.log"));
    let log = s.log("ingest.log");
    let dlq = read_topic(&s.dlq);
    assert_eq!(dlq.len(), lines.len(), "one DLQ message per reject: {dlq:?}");
    let by_offset: BTreeMap<i64, &serde_json::Value> =
        dlq.iter().map(|m| (m["headers"]["inferlog.source.offset"].as_str().expect("offset").parse().expect("number"), m)).collect();
    for (offset, line) in lines.iter().enumerate() {
        let m = by_offset[&(offset as i64)];
        let headers = &m["headers"];
        if line.len() < 100_000 {
            // Whole, or (what the contract cannot read keeps no payload) named by its SHA-256.
            assert_eq!(inferlog_tests::original_sha256(m), inferlog_tests::sha256_hex(line.as_bytes()), "whole: {m}");
            assert!(headers.get("inferlog.truncated").is_none(), "{m}");
        } else {
            assert_eq!(headers["inferlog.truncated"].as_str(), Some("true"), "{m}");
            assert_eq!(headers["inferlog.original.bytes"].as_str(), Some(line.len().to_string().as_str()), "{m}");
            assert_eq!(headers["inferlog.original.sha256"].as_str(), Some(inferlog_tests::sha256_hex(line.as_bytes()).as_str()), "{m}");
            let kept = m["bytes"].as_u64().expect("bytes");
            assert!(kept > 50_000 && kept < 100_000, "cut to fit the DLQ's 100 kB: {kept}");
            assert_eq!(headers["inferlog.reason"].as_str(), Some("event.too_large"), "{m}");
        }
    }
    assert!(log.contains("written truncated"), "the cut is logged: {log}");
}

/// A new consumer group on a topic whose events are all stored (a group id
/// changed, or offsets lost) stores nothing again: the replay log's done
/// ranges say which offsets are handled, a handful of ranges instead of a
/// set of every offset. And a history stored before the replay log
/// existed (the log emptied) is found by scanning the tables, streamed
/// into ranges: nothing stored twice either way, on a table no merge
/// collapses.
#[test]
fn a_new_group_on_a_stored_history_stores_nothing_again_with_or_without_the_replay_log() {
    let s = Scenario::new("replaylog", 4, "batch_max_rows = 2000\n");
    s.create_plain_hot_table();
    let events = s.produce_generated(20_000, 0.02, 2901);
    let valid = valid_count(&events) as u64;
    let rejects = events.len() as u64 - valid;
    s.drain("first.log");
    assert_eq!(s.hot_count(), (valid, valid));

    let log_table = format!("inferlog_test.{}_offsets", s.table);
    assert!(clickhouse_u64(&format!("SELECT count() FROM {log_table} WHERE state = 1")) > 0, "batches are marked done");
    for (round, empty_the_log) in [("done ranges", false), ("no log", true)] {
        if empty_the_log {
            // As before the log existed: ingest creates it again, empty.
            inferlog_tests::clickhouse(&format!("DROP TABLE {log_table}"));
        }
        let group = format!("{}-{}", s.group, round.replace(' ', "-"));
        let log = format!("{}.log", round.replace(' ', "-"));
        let (code, _, text) = s.run_ingest(Some("6s"), &log, &[("INFERLOG_KAFKA__GROUP_ID", group.as_str())], Duration::from_secs(180));
        assert_eq!(code, Some(0), "{round}: {text}");
        assert_eq!(s.hot_count(), (valid, valid), "{round}: nothing stored twice: {text}");
        assert_eq!(s.rejects_logged(), (rejects, rejects), "{round}: no reject logged twice");
        assert!(text.contains(&format!("duplicates={}", events.len())), "{round}: every message skipped as handled: {text}");
        let ranges: Vec<u64> = text
            .lines()
            .filter(|l| l.contains("replaying: skipping stored offsets"))
            .filter_map(|l| l.split("ranges=").nth(1)?.split_whitespace().next()?.parse().ok())
            .collect();
        assert_eq!(ranges.len(), 4, "{round}: each partition started past its history: {text}");
        if !empty_the_log {
            assert!(ranges.iter().all(|r| *r == 1), "{round}: one merged range per partition: {ranges:?}");
        }
    }
}
