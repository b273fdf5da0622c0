//! Validate + normalize + hash throughput over `generate` output.
//!
//! Run: `cargo bench -p inferlog-schema --bench normalize`. Criterion
//! reports time per batch and elements/s; one element is one event.
#![allow(clippy::print_stderr)]

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use inferlog_schema::generate::{Generator, GeneratorConfig};
use inferlog_schema::{Contract, ContractConfig, UserIdHasher};

const EVENTS: usize = 10_000;

fn corpus() -> Vec<Vec<u8>> {
    let config = GeneratorConfig { seed: 1, days: 1, end_ms: 1_793_491_200_000, invalid_ratio: 0.0 };
    Generator::new(config).take(EVENTS).map(|e| e.line).collect()
}

fn bench(c: &mut Criterion) {
    let events = corpus();
    let bytes: usize = events.iter().map(Vec::len).sum();
    eprintln!("corpus: {EVENTS} events, mean {} bytes", bytes / EVENTS);
    let contract = Contract::new(&ContractConfig::default()).expect("valid config");
    let hasher = UserIdHasher::new(b"bench-key-0123456789abcdef", None, "bench").expect("valid key");

    let mut group = c.benchmark_group("event");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("normalize (validate + normalize + hash)", |b| {
        b.iter(|| {
            for e in &events {
                let _ = black_box(contract.normalize(black_box(e), Some(1_793_491_200_000), &hasher));
            }
        })
    });
    group.bench_function("check (validate only)", |b| {
        b.iter(|| {
            for e in &events {
                let _ = black_box(contract.check(black_box(e), None));
            }
        })
    });
    group.bench_function("hash user_id", |b| {
        b.iter(|| {
            for i in 0..EVENTS {
                black_box(hasher.hash(black_box(if i % 2 == 0 { "u-000123" } else { "u-019876" })));
            }
        })
    });
    group.bench_function("baseline: serde_json::Value parse", |b| {
        b.iter_batched(
            || (),
            |()| {
                for e in &events {
                    let _ = black_box(serde_json::from_slice::<serde_json::Value>(black_box(e)));
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
