//! Property tests: the parser is total, normalization is idempotent, and
//! `generate` produces exactly what it claims.

use inferlog_schema::generate::{Generator, GeneratorConfig};
use inferlog_schema::{Contract, ContractConfig, UserIdHasher};
use proptest::prelude::*;

/// 2026-11-01T00:00:00Z
const END: i64 = 1_793_491_200_000;

fn contract() -> Contract {
    Contract::new(&ContractConfig::default()).expect("default config is valid")
}

fn hasher() -> UserIdHasher {
    UserIdHasher::new(b"property-test-key-0123456789", None, "test").expect("valid key")
}

fn events(seed: u64, count: usize, invalid_ratio: f64) -> Vec<inferlog_schema::generate::GeneratedEvent> {
    Generator::new(GeneratorConfig { seed, days: 14, end_ms: END, invalid_ratio }).take(count).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = contract().normalize(&bytes, Some(END), &hasher());
    }

    #[test]
    fn never_panics_on_mutated_events(seed in any::<u64>(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut line = events(seed, 1, 0.0).remove(0).line;
        for (at, byte) in flips {
            let i = at % line.len();
            line[i] = byte;
        }
        let _ = contract().normalize(&line, Some(END), &hasher());
    }

    #[test]
    fn normalizing_a_normalized_event_is_the_identity(seed in any::<u64>()) {
        let (contract, hasher) = (contract(), hasher());
        for event in events(seed, 20, 0.0) {
            let once = contract.normalize(&event.line, None, &hasher).expect("generated events are valid");
            let json = once.event.to_json();
            let twice = contract.normalize(json.as_bytes(), None, &hasher).expect("normalized output is valid input");
            prop_assert_eq!(&twice.event, &once.event);
            prop_assert!(twice.dropped_fields.is_empty());
            prop_assert_eq!(twice.event.to_json(), json);
        }
    }

    #[test]
    fn generated_events_with_ratio_0_always_pass_check(seed in any::<u64>(), days in 1u32..40) {
        let contract = contract();
        let config = GeneratorConfig { seed, days, end_ms: END, invalid_ratio: 0.0 };
        // The ingest-time age bound (7 days by default) applies only to a window that fits in it.
        let now = (days <= 7).then_some(END);
        for event in Generator::new(config).take(50) {
            prop_assert_eq!(event.expected, None);
            let checked = contract.check(&event.line, now);
            prop_assert!(checked.is_ok(), "{:?}: {}", checked, String::from_utf8_lossy(&event.line));
        }
    }

    #[test]
    fn invalid_events_are_rejected_with_the_reason_they_were_made_for(seed in any::<u64>()) {
        let contract = contract();
        for event in events(seed, 40, 0.5) {
            let got = contract.check(&event.line, None).err().map(|r| r.reason);
            prop_assert_eq!(got, event.expected, "{}", String::from_utf8_lossy(&event.line[..event.line.len().min(400)]));
        }
    }
}

#[test]
fn generation_is_deterministic_per_seed() {
    let a: Vec<_> = events(7, 500, 0.1).into_iter().map(|e| e.line).collect();
    let b: Vec<_> = events(7, 500, 0.1).into_iter().map(|e| e.line).collect();
    let c: Vec<_> = events(8, 500, 0.1).into_iter().map(|e| e.line).collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn generated_traffic_is_realistic() {
    let contract = contract();
    let hasher = hasher();
    let normalized: Vec<_> = events(3, 20_000, 0.0).into_iter().map(|e| contract.normalize(&e.line, None, &hasher).expect("valid").event).collect();
    let n = normalized.len() as f64;
    let share = |pred: &dyn Fn(&inferlog_schema::InferenceEvent) -> bool| normalized.iter().filter(|e| pred(e)).count() as f64 / n;
    let distinct =
        |key: &dyn Fn(&inferlog_schema::InferenceEvent) -> String| normalized.iter().map(key).collect::<std::collections::BTreeSet<_>>().len();
    assert!(distinct(&|e| e.business_line.clone()) >= 5, "several business lines");
    assert!(distinct(&|e| format!("{}@{}", e.model_name, e.model_version)) >= 6, "models and versions");
    let errors = share(&|e| e.error_code != 0);
    assert!((0.02..0.08).contains(&errors), "a few percent errors: {errors}");
    assert!(normalized.iter().filter(|e| e.error_code != 0).all(|e| e.error_stage.is_some()));
    let short = share(&|e| e.input_tokens < 1024);
    assert!(short > 0.6, "most requests are short: {short}");
    assert!(normalized.iter().any(|e| e.input_tokens >= 32_768), "a tail past 32k");
    let cache = share(&|e| e.cache_hit == Some(true));
    assert!((0.1..0.7).contains(&cache), "cache hits: {cache}");
    assert!(normalized.iter().filter(|e| e.cache_hit == Some(true)).all(|e| e.cache_prefix_tokens.is_some_and(|p| p <= e.input_tokens)));
    assert!(distinct(&|e| e.user_id_hash.clone().unwrap_or_default()) > 1000, "many users");
    for e in &normalized {
        let stages = e.queue_wait_ms.unwrap_or(0.0) + e.prefill_time_ms.unwrap_or(0.0) + e.decode_time_ms.unwrap_or(0.0);
        assert!(stages <= e.total_latency_ms + 1e-6, "stages add up within the total: {e:?}");
    }
    let span = normalized.iter().map(|e| e.timestamp_ms).max().unwrap_or(0) - normalized.iter().map(|e| e.timestamp_ms).min().unwrap_or(0);
    assert!(span > 13 * 86_400_000, "spread over the requested days");
}

#[test]
fn every_reason_code_is_generated() {
    let reasons: std::collections::BTreeSet<_> = events(11, 3000, 0.2).into_iter().filter_map(|e| e.expected).collect();
    assert_eq!(reasons.len(), inferlog_schema::ReasonCode::EVENT.len());
}
