//! What the live service metrics cost per event: the normalizing stage
//! (validate, normalize, encode) with them off, against the same stage
//! with them on plus the pipeline's tally of each row, over `generate`
//! output (8 lines × models × versions, the bench's usual mix).
//!
//! Run: `cargo bench -p inferlog-ingest --bench service_metrics`.
//! Criterion reports elements/s; one element is one event.

use std::sync::Arc;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use inferlog_ingest::normalize::{Input, Normalizer, Outcome};
use inferlog_ingest::service_metrics::{Interner, Tally};
use inferlog_schema::generate::{Generator, GeneratorConfig};
use inferlog_schema::{Contract, ContractConfig, UserIdHasher};
use inferlog_store::kafka::TopicEncoding;
use inferlog_store::{OtlpConfig, ServiceMetricsConfig};

const EVENTS: usize = 10_000;

fn bench(c: &mut Criterion) {
    let config = GeneratorConfig { seed: 1, days: 1, end_ms: 1_793_491_200_000, invalid_ratio: 0.0 };
    let lines: Vec<Vec<u8>> = Generator::new(config).take(EVENTS).map(|e| e.line).collect();
    let topic: Arc<str> = Arc::from("events");
    let inputs: Vec<Input<'_>> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| Input { payload: l, topic: &topic, partition: 0, offset: i as i64, encoding: TopicEncoding::Json })
        .collect();
    let normalizer = |observer| {
        let contract = Contract::new(&ContractConfig::default()).expect("valid config");
        let hasher = UserIdHasher::new(b"bench-key-0123456789abcdef", None, "bench").expect("valid key");
        Normalizer::new(contract, hasher, &OtlpConfig::default(), 1, observer).expect("one thread")
    };
    let off = normalizer(None);
    let on = normalizer(Some(Arc::new(Interner::new(&ServiceMetricsConfig::default()))));
    let received_ms = 1_793_491_200_000;

    let mut group = c.benchmark_group("event");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("normalize + encode, service metrics off", |b| {
        b.iter(|| {
            for chunk in inputs.chunks(2048) {
                black_box(off.normalize(black_box(chunk), received_ms));
            }
        })
    });
    group.bench_function("normalize + encode + observe + tally, service metrics on", |b| {
        let mut tally = Tally::default();
        b.iter(|| {
            for chunk in inputs.chunks(2048) {
                for piece in on.normalize(black_box(chunk), received_ms) {
                    for outcome in &piece.outcomes {
                        if let Outcome::Row { observation: Some(o), .. } = outcome {
                            tally.observe(o);
                        }
                    }
                }
            }
        });
        black_box(tally);
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
