//! Seeds the hot tier directly, for tests and benchmarks of the tiers after
//! ingest: generated events, normalized by the real contract, written as
//! ingest writes them (the same `HotRow`s and the same ClickHouse sink),
//! but with timestamps of any age, which ingest would reject as too old.

use std::sync::Arc;

use inferlog_ingest::sink::{ClickHouseSink, EncodedRows, FirstRow};
use inferlog_schema::generate::{Generator, GeneratorConfig};
use inferlog_schema::hash::UserIdHasher;
use inferlog_schema::{Contract, ContractConfig, InferenceEvent};
use inferlog_store::model::rows::HotRow;
use inferlog_store::ClickHouseConfig;

/// The hash key seeded rows are hashed with.
pub const SEED_HASH_KEY: &[u8] = b"integration-test-hash-key-0123456789";

/// `count` valid events over `days` days ending at `end_ms` (exclusive), normalized.
pub fn seeded_events(count: usize, days: u32, end_ms: i64, seed: u64) -> Vec<InferenceEvent> {
    let contract = Contract::new(&ContractConfig::default()).expect("default contract");
    let hasher = UserIdHasher::new(SEED_HASH_KEY, None, "test").expect("hash key");
    Generator::new(GeneratorConfig { seed, days, end_ms, invalid_ratio: 0.0 })
        .take(count)
        .map(|g| contract.normalize(&g.line, None, &hasher).expect("generated valid event").event)
        .collect()
}

/// Creates `database.table` as ingest does and inserts `events`, one INSERT per day and 100k rows.
pub fn insert_hot(clickhouse_url: &str, database: &str, table: &str, events: &[InferenceEvent]) {
    let config = ClickHouseConfig {
        url: clickhouse_url.to_owned(),
        database: database.to_owned(),
        table: table.to_owned(),
        rejects_table: format!("{table}_rejects"),
        ..ClickHouseConfig::default()
    };
    insert_hot_with(&config, events, 1);
}

/// Creates the tables of `config` as ingest does (on its cluster, if it
/// names one) and inserts `events`, the `i`th from Kafka partition `i %
/// partitions`: one INSERT per day, shard and 100k rows, each on the shard
/// `config` maps its partitions to.
pub fn insert_hot_with(config: &ClickHouseConfig, events: &[InferenceEvent], partitions: u16) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let (sink, _) = ClickHouseSink::new(config).expect("sink").prepared().await.expect("create the hot table");
        let topic: Arc<str> = Arc::from("seeded");
        // Ingestion time follows the event time, so the same events make the same rows (and archives) in every run.
        let mut rows: Vec<HotRow> = events
            .iter()
            .enumerate()
            .map(|(i, e)| HotRow::new(e.clone(), topic.clone(), (i % usize::from(partitions)) as u16, i as i64, (e.timestamp_ms / 1000 + 2) as u32))
            .collect();
        let shard = |r: &HotRow| sink.shard_of("seeded", i32::from(r.kafka_partition)).expect("a mapped partition");
        rows.sort_by_key(|r| (r.day, shard(r), r.kafka_partition, r.kafka_offset));
        for group in rows.chunk_by(|a, b| (a.day, shard(a)) == (b.day, shard(b))) {
            for chunk in group.chunks(100_000) {
                let rows = EncodedRows { shard: shard(&chunk[0]), ..encoded(chunk) };
                sink.insert_rows(&rows, &sink.insert_id(), false).await.expect("insert seeded rows");
            }
        }
    });
}

/// `rows` (of one day) encoded as ingest sends them: one INSERT, one chunk.
pub fn encoded(rows: &[HotRow]) -> EncodedRows {
    let mut bytes = Vec::new();
    for row in rows {
        row.encode(&mut bytes);
    }
    let first = rows.first().map_or_else(
        || FirstRow { day: 0, topic: Arc::from(""), partition: 0, offset: 0, index: 0 },
        |r| FirstRow {
            day: r.day,
            topic: r.kafka_topic.clone(),
            partition: i32::from(r.kafka_partition),
            offset: r.kafka_offset as i64,
            index: r.kafka_index,
        },
    );
    EncodedRows { chunks: vec![bytes::Bytes::from(bytes)], ends: Vec::new(), first, rows: rows.len(), shard: 0, order: None }
}
