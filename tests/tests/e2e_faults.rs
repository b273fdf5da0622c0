//! End to end under a fault schedule, in one run: the S3 server is down
//! while the compactor daemon runs, ingest is `kill -9`ed twice mid-ingest
//! and restarted, ClickHouse is stopped and started mid-ingest, the compactor is
//! `kill -9`ed mid-day (at a random recorded state), Postgres is restarted
//! under the compactor daemon, and retention is `kill -9`ed mid-enforce. At
//! the end the reconciliation still holds exactly ([`Pipeline::reconcile`])
//! and `audit` is clean.
//!
//! It stops shared servers (SeaweedFS keeps its objects on disk across the
//! stop), so it lives alone in its test binary; cargo runs test binaries
//! one after another.

use std::process::Child;
use std::time::{Duration, Instant};

use inferlog_tests::pipeline::{services, OnDrop, Pipeline};
use inferlog_tests::{generate, produce, sigterm, wait_for, wait_paused, write_jsonl};
use rand::seq::SliceRandom;
use rand::Rng;

const TOTAL: usize = 90_000;

fn kill_9(child: &mut Child) {
    child.kill().expect("kill -9");
    let _ = child.wait();
}

fn stop(child: &mut Child, what: &str) {
    let status = sigterm(child, Duration::from_secs(60));
    assert!(status.success(), "{what} exits 0 on SIGTERM after the faults: {status}");
}

/// Waits until ingest has made `target` messages durable.
fn wait_ingested(p: &Pipeline, target: u64, log: &str) {
    let started = Instant::now();
    while p.ingested() < target {
        assert!(started.elapsed() < Duration::from_secs(240), "ingest stalled at {} of {target}: {}", p.ingested(), p.tiers.log(log));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `binary args` with its test hook `hook=step` and `kill -9`s it
/// once it stops there; what happened, for the schedule.
fn kill_at_step(p: &Pipeline, binary: &str, args: &[&str], hook: &str, step: &str, log: &str) -> String {
    let mut child = p.spawn(binary, args, log, &[(hook, step)]);
    if let Some(status) = wait_paused(&mut child, || p.tiers.log(log), Duration::from_secs(120)) {
        let text = p.tiers.log(log);
        let last = text.lines().rev().find(|l| l.contains("ERROR") || l.contains("WARN")).unwrap_or("").to_owned();
        return format!("{binary} finished ({status}) before {step}: {last}");
    }
    kill_9(&mut child);
    format!("kill -9 {binary} at {step}")
}

/// Days the compactor could not archive (their last pass failed before verification).
const FAILED_ON_S3: &str =
    "SELECT count(*) FROM compactor_days WHERE last_error IS NOT NULL AND state NOT IN ('verified', 'aggregated', 'releasing', 'released')";

#[test]
fn kills_and_restarts_of_every_component_and_server_lose_nothing() {
    // The seed is printed and is the schedule's first entry; INFERLOG_TEST_SEED replays it.
    let (mut rng, seed) = inferlog_tests::test_rng("fault schedule");
    let p = Pipeline::new("e2e_faults", 4);
    let events = generate(TOTAL, 0.01, 707, 2);
    let chunks: Vec<_> = events
        .chunks(TOTAL / 3)
        .enumerate()
        .map(|(i, chunk)| {
            let dir = p.tiers.dir.path().join(format!("chunk-{i}"));
            std::fs::create_dir_all(&dir).expect("chunk dir");
            write_jsonl(&dir, chunk)
        })
        .collect();
    produce(&p.topic, &chunks[0]);
    produce(&p.topic, &chunks[1]);
    // Small batches: ingest takes long enough for faults to land mid-stream.
    let ingest_env = [("INFERLOG_INGEST__BATCH_MAX_ROWS", "2000")];
    let daemon_env = [("INFERLOG_COMPACTOR__INTERVAL", "2s")];
    let mut schedule = vec![format!("seed {seed}")];

    // The cold store is down while the compactor daemon runs: its passes
    // fail and record why, nothing is dropped.
    let _s3 = OnDrop("start-s3");
    let _clickhouse = OnDrop("start-clickhouse");
    services("stop-s3");
    let mut compactor = p.spawn("inferlog-compactor", &[], "compactor-1.log", &daemon_env);
    let mut ingest = p.spawn("inferlog-ingest", &[], "ingest-1.log", &ingest_env);

    // Ingest killed mid-stream, ClickHouse restarted under it, killed again.
    wait_ingested(&p, rng.gen_range(10_000..25_000), "ingest-1.log");
    kill_9(&mut ingest);
    schedule.push(format!("kill -9 ingest at {} durable", p.ingested()));
    ingest = p.spawn("inferlog-ingest", &[], "ingest-2.log", &ingest_env);
    // A closed day has rows now: the compactor daemon's next pass fails on S3.
    // (Waited for, not assumed: ingest can outrun the daemon's interval.)
    // Counted when seen: each retry of the day clears `last_error` while it
    // runs, so a later read can land between two attempts and see none.
    let mut failed = 0u32;
    wait_for(
        Duration::from_secs(60),
        || {
            failed = p.tiers.psql(FAILED_ON_S3).parse().unwrap_or(0);
            failed > 0
        },
        || format!("the S3 outage made no compactor pass fail:\n{}", p.tiers.log("compactor-1.log")),
    );
    // The last third arrives while ClickHouse is down: ingest holds it,
    // retries, and resumes by itself.
    wait_ingested(&p, rng.gen_range(35_000..55_000), "ingest-2.log");
    schedule.push(format!("ClickHouse stopped at {} durable", p.ingested()));
    services("stop-clickhouse");
    produce(&p.topic, &chunks[2]);
    services("start-clickhouse");
    wait_ingested(&p, rng.gen_range(60_000..75_000), "ingest-2.log");
    kill_9(&mut ingest);
    schedule.push(format!("kill -9 ingest at {} durable", p.ingested()));
    ingest = p.spawn("inferlog-ingest", &[], "ingest-3.log", &ingest_env);

    // The compactor daemon never got an archive out: kill it, bring S3
    // back, and kill a compactor mid-day at a random recorded state.
    kill_9(&mut compactor);
    schedule.push(format!("kill -9 compactor daemon ({failed} days failed on S3)"));
    services("start-s3");
    let step = *["archiving", "archived", "verified", "aggregated"].choose(&mut rng).expect("a step");
    // A pass can end early (rows still arriving change the day under it,
    // which it reports and redoes): try up to three times to land the kill.
    for attempt in 0..3 {
        let outcome =
            kill_at_step(&p, "inferlog-compactor", &["--once"], "INFERLOG_COMPACTOR_PAUSE_AFTER", step, &format!("compactor-2-{attempt}.log"));
        let landed = outcome.starts_with("kill -9");
        schedule.push(outcome);
        if landed {
            break;
        }
    }

    // The compactor daemon again; Postgres restarts under it.
    compactor = p.spawn("inferlog-compactor", &[], "compactor-3.log", &daemon_env);
    std::thread::sleep(Duration::from_millis(rng.gen_range(200..2500)));
    services("restart-postgres");
    schedule.push("Postgres restarted".into());

    // Ingest drains everything (hot rows + logged rejects = produced); both daemons stop on SIGTERM.
    wait_ingested(&p, TOTAL as u64, "ingest-3.log");
    stop(&mut ingest, "ingest");
    stop(&mut compactor, "compactor");

    // Every closed day compacted; retention killed mid-enforce (after its
    // first hot drop), then at a random moment, then run to the end.
    p.run_ok("inferlog-compactor", &["--once"], "compactor-4.log");
    let later = Pipeline::later();
    let paused = kill_at_step(&p, "inferlog-retention", &["enforce", "--now", &later], "INFERLOG_RETENTION_PAUSE_AFTER", "hot", "retention-1.log");
    schedule.push(paused);
    let mut retention = p.spawn("inferlog-retention", &["enforce", "--now", &later], "retention-2.log", &[]);
    std::thread::sleep(Duration::from_millis(rng.gen_range(50..600)));
    kill_9(&mut retention);
    schedule.push("kill -9 retention at a random moment".into());
    p.run_ok("inferlog-retention", &["enforce", "--now", &later], "retention-3.log");

    #[allow(clippy::print_stderr)] // the schedule that ran, in the test's output
    {
        eprintln!("fault schedule: {schedule:?}");
    }
    p.reconcile(&events, None);
}
