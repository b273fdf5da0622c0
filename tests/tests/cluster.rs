//! The hot tier's shapes on a ClickHouse cluster (`services.sh up
//! --cluster`: cluster `inferlog`, 2 shards × 2 replicas, ZooKeeper), the
//! ground the cluster mode of issue 31 builds on: the DDL each shape
//! derives for a cluster runs on ClickHouse 18.16 and gives every server
//! its replicated shard-local table and the `Distributed` table over them;
//! a block sent again, to the other replica of its shard or to the same
//! one (a retry after a lost answer), is stored once and reaches the
//! replica it was not sent to, counted on a table no merge collapses
//! (the rejects log: `ReplicatedMergeTree`); each shard holds only its own
//! rows, and the `Distributed` table reads them all. Every expected figure
//! comes from the rows the test wrote, read back over SQL.

use std::process::Command;
use std::sync::Arc;

use inferlog_schema::timestamp::{utc_day, MS_PER_DAY};
use inferlog_store::model::rows::HotRow;
use inferlog_store::model::tables::{local_table, HOT, REJECTS};
use inferlog_tests::seed::seeded_events;
use inferlog_tests::wait_for;

/// The local cluster's servers: (name, shard, HTTP port), as services.sh starts them.
const NODES: [(&str, u32, u16); 4] = [("s1r1", 1, 8131), ("s1r2", 1, 8132), ("s2r1", 2, 8133), ("s2r2", 2, 8134)];
const CLUSTER: &str = "inferlog";
const DATABASE: &str = "inferlog_test";

/// Runs `sql` on one server (with URL `settings`, `K=V&…`), the body from `data` when given.
fn on(port: u16, sql: &str, settings: &str, data: Option<&std::path::Path>) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--fail-with-body", &format!("http://127.0.0.1:{port}/?{settings}")]);
    match data {
        // curl encodes the query into the URL; the body is the rows.
        Some(path) => cmd.args(["--url-query", &format!("query={sql}"), "--data-binary", &format!("@{}", path.display())]),
        None => cmd.args(["--data-binary", sql]),
    };
    let out = cmd.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "{port}: {sql}: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

fn count(port: u16, table: &str) -> u64 {
    on(port, &format!("SELECT count() FROM {DATABASE}.{table}"), "", None).parse().expect("a count")
}

#[test]
fn each_shape_is_replicated_per_shard_and_distributed_and_a_resent_block_is_stored_once() {
    let up = Command::new("curl").args(["-sf", "http://127.0.0.1:8131/ping"]).output().expect("curl");
    assert!(up.status.success(), "the local cluster is not up: run deploy/local/services.sh up --cluster");
    let version = inferlog_store::hot::parse_version(&on(8131, "SELECT version()", "", None));
    let table = inferlog_tests::unique("cluster").to_ascii_lowercase();
    let rejects = format!("{table}_rejects");
    on(8131, &format!("CREATE DATABASE IF NOT EXISTS {DATABASE} ON CLUSTER {CLUSTER}"), "", None);
    for (shape, name) in [(&HOT, &table), (&REJECTS, &rejects)] {
        for statement in shape.cluster_ddl(DATABASE, name, CLUSTER, version) {
            on(8131, &statement, "", None);
        }
    }
    for (node, _, port) in NODES {
        let engines = on(
            port,
            &format!(
                "SELECT name, engine FROM system.tables WHERE database = '{DATABASE}' AND name IN ('{table}', '{rejects}', '{}', '{}') ORDER BY name",
                local_table(&table),
                local_table(&rejects)
            ),
            "",
            None,
        );
        assert_eq!(
            engines,
            format!(
                "{table}\tDistributed\n{}\tReplicatedReplacingMergeTree\n{rejects}\tDistributed\n{}\tReplicatedMergeTree",
                local_table(&table),
                local_table(&rejects)
            ),
            "{node}"
        );
    }

    // Shard 1 gets one block of hot rows and one of rejects, each sent to
    // s1r1 and then again, the same bytes, to s1r2 (a retry on the other
    // replica); shard 2 its own blocks, each sent twice to s2r1 alone, so
    // s2r2 holds them only through replication.
    let dir = tempfile::tempdir().expect("temp dir");
    let end_ms = (i64::from(inferlog_tests::tiers::today()) + 1) * MS_PER_DAY;
    let events = seeded_events(600, 1, end_ms, 31);
    let topic: Arc<str> = Arc::from("events");
    let mut written = [0u64; 2];
    for (shard, chunk) in events.chunks(events.len() / 2).take(2).enumerate() {
        let (mut hot, mut log) = (Vec::new(), String::new());
        for (i, e) in chunk.iter().enumerate() {
            let offset = (shard * 1_000 + i) as i64;
            HotRow::new(e.clone(), topic.clone(), shard as u16, offset, (e.timestamp_ms / 1000) as u32).encode(&mut hot);
            let day = utc_day(e.timestamp_ms);
            log += &format!("{day}\t{day} 12:00:00\tfield.missing\tmodel_name\tis required\tevents\t{shard}\t{offset}\t100\n");
        }
        let (hot_file, log_file) = (dir.path().join(format!("hot{shard}")), dir.path().join(format!("rejects{shard}")));
        std::fs::write(&hot_file, hot).expect("write");
        std::fs::write(&log_file, log).expect("write");
        let replicas: [u16; 2] = if shard == 0 { [8131, 8132] } else { [8133, 8133] };
        for port in &replicas {
            on(*port, &HOT.insert_sql(DATABASE, &local_table(&table), "RowBinary"), "insert_quorum=2", Some(&hot_file));
            on(*port, &REJECTS.insert_sql(DATABASE, &local_table(&rejects), "TabSeparated"), "insert_quorum=2", Some(&log_file));
        }
        written[shard] = chunk.len() as u64;
    }

    // Every replica holds its shard's rows once, the other shard's none.
    for (node, shard, port) in NODES {
        let want = written[shard as usize - 1];
        wait_for(
            std::time::Duration::from_secs(30),
            || count(port, &local_table(&rejects)) == want && count(port, &local_table(&table)) == want,
            || format!("{node} holds its shard's {want} rows, once"),
        );
        assert_eq!(count(port, &local_table(&rejects)), want, "{node}: the resent block stored once");
    }
    // Read through any server, the Distributed tables hold every row once.
    for (node, _, port) in NODES {
        assert_eq!(count(port, &rejects), written[0] + written[1], "{node}");
        assert_eq!(count(port, &table), written[0] + written[1], "{node}");
    }
    for name in [&table, &rejects] {
        on(8131, &format!("DROP TABLE IF EXISTS {DATABASE}.{name} ON CLUSTER {CLUSTER}"), "", None);
        on(8131, &format!("DROP TABLE IF EXISTS {DATABASE}.{} ON CLUSTER {CLUSTER}", local_table(name)), "", None);
    }
}
