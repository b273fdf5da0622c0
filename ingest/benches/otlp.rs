//! What an event costs by the encoding of its topic: the normalizing stage
//! (decode, map, validate, normalize, encode) over the same events as
//! JSON messages, and as vLLM-shaped spans in OTLP messages of 100 spans
//! (what the Collector's batch processor sends), protobuf and OTLP/JSON.
//!
//! Run: `cargo bench -p inferlog-ingest --bench otlp`. Criterion reports
//! elements/s on one thread (events per second per core); one element is
//! one event. It ends by printing each OTLP encoding's ratio to JSON,
//! medians of rounds taken in turn (the goal: at least 1).

#![allow(clippy::print_stderr)]

use std::sync::Arc;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use inferlog_ingest::normalize::{Input, Normalizer, Outcome};
use inferlog_schema::generate::{Generator, GeneratorConfig};
use inferlog_schema::{Contract, ContractConfig, UserIdHasher};
use inferlog_store::kafka::TopicEncoding;
use inferlog_store::OtlpConfig;
use opentelemetry_proto::tonic::common::v1::{any_value::Value as V, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, TracesData};
use prost::Message as _;
use serde_json::Value;

const EVENTS: usize = 10_000;
const SPANS_PER_MESSAGE: usize = 100;

fn kv(key: &str, value: V) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..KeyValue::default() }
}

/// The normalized event as vLLM's request span (seconds, its attribute names).
fn span(e: &serde_json::Map<String, Value>, i: usize) -> Span {
    let end_ns = e["timestamp_ms"].as_i64().unwrap_or(0) as u64 * 1_000_000;
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let n = |k: &str| e.get(k).and_then(Value::as_i64).unwrap_or_default();
    let secs = |k: &str| e.get(k).and_then(Value::as_f64).map(|ms| ms / 1000.0);
    let mut attributes = vec![
        kv("gen_ai.request.id", V::StringValue(s("request_id"))),
        kv("gen_ai.response.model", V::StringValue(s("model_name"))),
        kv("gen_ai.usage.prompt_tokens", V::IntValue(n("input_tokens"))),
        kv("gen_ai.usage.completion_tokens", V::IntValue(n("output_tokens"))),
        kv("inferlog.model_version", V::StringValue(s("model_version"))),
        kv("inferlog.business_line", V::StringValue(s("business_line"))),
    ];
    for (field, name) in [
        ("total_latency_ms", "gen_ai.latency.e2e"),
        ("queue_wait_ms", "gen_ai.latency.time_in_queue"),
        ("ttft_ms", "gen_ai.latency.time_to_first_token"),
        ("prefill_time_ms", "gen_ai.latency.time_in_model_prefill"),
        ("decode_time_ms", "gen_ai.latency.time_in_model_decode"),
    ] {
        if let Some(v) = secs(field) {
            attributes.push(kv(name, V::DoubleValue(v)));
        }
    }
    if n("error_code") != 0 {
        attributes.push(kv("inferlog.error_code", V::IntValue(n("error_code"))));
        attributes.push(kv("inferlog.error_stage", V::StringValue(s("error_stage"))));
    }
    Span {
        name: "llm_request".into(),
        trace_id: (i as u128).to_be_bytes().to_vec(),
        span_id: (i as u64).to_be_bytes().to_vec(),
        start_time_unix_nano: end_ns.saturating_sub(1_000_000_000),
        end_time_unix_nano: end_ns,
        attributes,
        ..Span::default()
    }
}

fn bench(c: &mut Criterion) {
    let config = GeneratorConfig { seed: 1, days: 1, end_ms: 1_793_491_200_000, invalid_ratio: 0.0 };
    let lines: Vec<Vec<u8>> = Generator::new(config).take(EVENTS).map(|e| e.line).collect();
    let contract = Contract::new(&ContractConfig::default()).expect("valid config");
    let hasher = UserIdHasher::new(b"bench-key-0123456789abcdef", None, "bench").expect("valid key");
    // The spans carry the normalized events (the generator also writes
    // the contract's aliases and unit forms, which spans do not).
    let events: Vec<serde_json::Map<String, Value>> = lines
        .iter()
        .map(|l| {
            let event = contract.normalize(l, None, &hasher).expect("a valid generated event").event;
            match serde_json::to_value(&event).expect("JSON") {
                Value::Object(mut map) => {
                    map.insert("timestamp_ms".into(), Value::from(event.timestamp_ms));
                    map
                }
                other => panic!("not an object: {other}"),
            }
        })
        .collect();
    let messages: Vec<TracesData> = events
        .chunks(SPANS_PER_MESSAGE)
        .enumerate()
        .map(|(m, chunk)| TracesData {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource { attributes: vec![kv("service.name", V::StringValue("vllm".into()))], ..Resource::default() }),
                scope_spans: vec![ScopeSpans {
                    spans: chunk.iter().enumerate().map(|(i, e)| span(e, m * SPANS_PER_MESSAGE + i)).collect(),
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        })
        .collect();
    let proto: Vec<Vec<u8>> = messages.iter().map(|t| t.encode_to_vec()).collect();
    let json: Vec<Vec<u8>> = messages.iter().map(|t| serde_json::to_vec(t).expect("OTLP/JSON")).collect();
    let topic: Arc<str> = Arc::from("events");
    let normalizer = Normalizer::new(contract, hasher, &OtlpConfig::default(), 1, None).expect("one thread");
    let received_ms = 1_793_491_200_000;

    let mut runs: Vec<(&str, Vec<Input<'_>>)> = Vec::new();
    let mut group = c.benchmark_group("event");
    group.throughput(Throughput::Elements(EVENTS as u64));
    for (name, payloads, encoding) in
        [("json", &lines, TopicEncoding::Json), ("otlp_proto", &proto, TopicEncoding::OtlpProto), ("otlp_json", &json, TopicEncoding::OtlpJson)]
    {
        let inputs: Vec<Input<'_>> =
            payloads.iter().enumerate().map(|(i, p)| Input { payload: p, topic: &topic, partition: 0, offset: i as i64, encoding }).collect();
        // Every event becomes a row, whatever its encoding.
        let rows: usize =
            normalizer.normalize(&inputs, received_ms).iter().map(|p| p.outcomes.iter().filter(|o| matches!(o, Outcome::Row { .. })).count()).sum();
        assert_eq!(rows, EVENTS, "{name}: every event a row");
        group.bench_function(name, |b| b.iter(|| normalize_all(&normalizer, &inputs, received_ms)));
        runs.push((name, inputs));
    }
    group.finish();
    // The goal is a ratio: the encodings taken in turn, round after round,
    // so the machine's noise falls on each alike.
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    for _ in 0..15 {
        for ((_, inputs), times) in runs.iter().zip(&mut seconds) {
            let start = std::time::Instant::now();
            normalize_all(&normalizer, inputs, received_ms);
            times.push(start.elapsed().as_secs_f64());
        }
    }
    let median = |times: &mut Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let json = median(&mut seconds[0]);
    for ((name, _), times) in runs.iter().zip(&mut seconds).skip(1) {
        let t = median(times);
        eprintln!(
            "events/s per core, medians of 15 alternated rounds: {name} {:.0}k, json {:.0}k, ratio {:.3}",
            EVENTS as f64 / t / 1e3,
            EVENTS as f64 / json / 1e3,
            json / t
        );
    }
}

fn normalize_all(normalizer: &Normalizer, inputs: &[Input<'_>], received_ms: i64) {
    for chunk in inputs.chunks(2048) {
        black_box(normalizer.normalize(black_box(chunk), received_ms));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
