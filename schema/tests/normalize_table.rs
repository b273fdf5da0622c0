//! Table-driven tests of the contract: every reason code, every
//! normalization rule, and the edge cases producers actually hit.

use inferlog_schema::{Contract, ContractConfig, ErrorStage, ReasonCode, UserIdHasher};
use serde_json::{json, Value};

const KEY: &[u8] = b"test-key-0123456789abcdef";
/// 2025-06-14T10:15:30Z
const NOW: i64 = 1_749_896_130_000;

fn contract() -> Contract {
    Contract::new(&ContractConfig::default()).expect("default config is valid")
}

fn hasher() -> UserIdHasher {
    UserIdHasher::new(KEY, None, "test").expect("valid key")
}

fn base() -> Value {
    json!({
        "request_id": "req-0001",
        "timestamp": "2025-06-14T10:15:00Z",
        "model_name": "llama-3.1-70b-instruct",
        "model_version": "2024-07-23",
        "input_tokens": 1200,
        "output_tokens": 101,
        "total_latency_ms": 2500.0,
        "error_code": 0,
        "queue_wait_ms": 20.0,
        "prefill_time_ms": 180.0,
        "decode_time_ms": 2000.0,
        "user_id": "alice-77",
    })
}

/// Applies `patch` to the base event: `null` values remove the key.
fn with(patch: Value) -> Vec<u8> {
    let mut event = base();
    for (k, v) in patch.as_object().expect("patch is an object") {
        if v.is_null() {
            event.as_object_mut().expect("object").remove(k);
        } else {
            event[k] = v.clone();
        }
    }
    event.to_string().into_bytes()
}

fn rejection(bytes: &[u8], now: Option<i64>) -> (ReasonCode, String) {
    match contract().normalize(bytes, now, &hasher()) {
        Ok(n) => panic!("accepted {}: {:?}", String::from_utf8_lossy(bytes), n.event),
        Err(r) => (r.reason, r.field),
    }
}

#[test]
fn a_request_id_names_its_first_bad_character() {
    for (id, bad) in [("req 1", "' '"), ("req-\u{e9}t\u{e9}", "'\u{e9}'"), ("r\u{1F600}", "'\u{1F600}'"), ("a/b c", "'/'")] {
        let err = contract().normalize(&with(json!({"request_id": id})), Some(NOW), &hasher()).expect_err(id);
        assert_eq!((err.reason, err.field.as_str()), (ReasonCode::FieldFormat, "request_id"), "{id}");
        assert!(err.message.starts_with(&format!("{bad} is not allowed")), "{id}: {}", err.message);
    }
}

#[test]
fn the_base_event_is_valid() {
    let n = contract().normalize(&with(json!({})), Some(NOW), &hasher()).expect("valid");
    assert_eq!(n.event.request_id, "req-0001");
    assert!(n.dropped_fields.is_empty());
}

#[test]
fn every_reason_code_with_its_field() {
    let mut cases: Vec<(&str, Vec<u8>, ReasonCode, &str)> = vec![
        ("truncated json", br#"{"request_id": "r1", "timestamp""#.to_vec(), ReasonCode::JsonMalformed, "timestamp"),
        ("truncated between fields", br#"{"request_id": "r1", "#.to_vec(), ReasonCode::JsonMalformed, "-"),
        ("trailing garbage", br#"{"request_id": "r1"} x"#.to_vec(), ReasonCode::JsonMalformed, "-"),
        ("invalid utf-8", b"{\"request_id\": \"r\xff\"}".to_vec(), ReasonCode::JsonMalformed, "-"),
        ("unbalanced nesting", format!(r#"{{"request_id":"r","x":{}"#, "[".repeat(10_000)).into_bytes(), ReasonCode::JsonMalformed, "x"),
        ("duplicate key", br#"{"request_id": "a", "request_id": "b"}"#.to_vec(), ReasonCode::JsonMalformed, "request_id"),
        ("array", b"[1, 2]".to_vec(), ReasonCode::JsonNotObject, "-"),
        ("string", b"\"hello\"".to_vec(), ReasonCode::JsonNotObject, "-"),
        ("null", b"null".to_vec(), ReasonCode::JsonNotObject, "-"),
        ("no model_version", with(json!({"model_version": null})), ReasonCode::FieldMissing, "model_version"),
        ("blank model_name", with(json!({"model_name": "   "})), ReasonCode::FieldMissing, "model_name"),
        ("null timestamp", with(json!({"timestamp": null})), ReasonCode::FieldMissing, "timestamp"),
        ("no total latency in any unit", with(json!({"total_latency_ms": null})), ReasonCode::FieldMissing, "total_latency_ms"),
        ("tokens as string", with(json!({"input_tokens": "1200"})), ReasonCode::FieldType, "input_tokens"),
        ("fractional tokens", with(json!({"output_tokens": 10.5})), ReasonCode::FieldType, "output_tokens"),
        ("cache_hit as string", with(json!({"cache_hit": "yes"})), ReasonCode::FieldType, "cache_hit"),
        ("model as object", with(json!({"model_name": {"id": 1}})), ReasonCode::FieldType, "model_name"),
        ("latency as string", with(json!({"queue_wait_ms": "20"})), ReasonCode::FieldType, "queue_wait_ms"),
        ("timestamp as bool", with(json!({"timestamp": true})), ReasonCode::FieldType, "timestamp"),
        ("negative tokens", with(json!({"output_tokens": -1})), ReasonCode::FieldRange, "output_tokens"),
        ("negative latency", with(json!({"prefill_time_ms": -0.5})), ReasonCode::FieldRange, "prefill_time_ms"),
        ("huge integer", with(json!({"input_tokens": 99_999_999_999_999_999_999.0})), ReasonCode::FieldRange, "input_tokens"),
        ("tokens beyond u32", with(json!({"input_tokens": 5_000_000_000u64})), ReasonCode::FieldRange, "input_tokens"),
        ("batch size 0", with(json!({"batch_size": 0})), ReasonCode::FieldRange, "batch_size"),
        ("max_tokens 0", with(json!({"max_tokens": 0})), ReasonCode::FieldRange, "max_tokens"),
        ("max_tokens as string", with(json!({"gen_ai.request.max_tokens": "256"})), ReasonCode::FieldType, "gen_ai.request.max_tokens"),
        ("prompt_hash as number", with(json!({"prompt_hash": 42})), ReasonCode::FieldType, "prompt_hash"),
        ("prompt_hash too long", with(json!({"prompt_hash": "h".repeat(257)})), ReasonCode::FieldRange, "prompt_hash"),
        ("prefix longer than input", with(json!({"cache_prefix_tokens": 1201})), ReasonCode::FieldRange, "cache_prefix_tokens"),
        ("model_version too long", with(json!({"model_version": "v".repeat(65)})), ReasonCode::FieldRange, "model_version"),
        ("request_id too long", with(json!({"request_id": "r".repeat(129)})), ReasonCode::FieldRange, "request_id"),
        ("request_id with space", with(json!({"request_id": "req 1"})), ReasonCode::FieldFormat, "request_id"),
        ("request_id with slash", with(json!({"request_id": "a/b"})), ReasonCode::FieldFormat, "request_id"),
        ("unparsable timestamp", with(json!({"timestamp": "yesterday"})), ReasonCode::FieldFormat, "timestamp"),
        ("february 30", with(json!({"timestamp": "2025-02-30T00:00:00Z"})), ReasonCode::FieldFormat, "timestamp"),
        ("29 feb of a common year", with(json!({"timestamp": "2023-02-29T12:00:00Z"})), ReasonCode::FieldFormat, "timestamp"),
        ("compact offset", with(json!({"timestamp": "2025-06-14T10:15:00+0800"})), ReasonCode::FieldFormat, "timestamp"),
        ("unknown stage", with(json!({"error_code": 1003, "error_stage": "network"})), ReasonCode::FieldFormat, "error_stage"),
        ("stage on success", with(json!({"error_stage": "decode"})), ReasonCode::FieldFormat, "error_stage"),
        ("control character", with(json!({"tenant": "acme\u{0007}"})), ReasonCode::FieldFormat, "tenant"),
        ("naive with space", with(json!({"timestamp": "2025-06-14 10:15:30"})), ReasonCode::TimestampNaive, "timestamp"),
        ("naive with T and fraction", with(json!({"timestamp": "2025-06-14T10:15:30.123"})), ReasonCode::TimestampNaive, "timestamp"),
        ("date only", with(json!({"timestamp": "2025-06-14"})), ReasonCode::TimestampNaive, "timestamp"),
        ("epoch seconds", with(json!({"timestamp": 1_749_896_100})), ReasonCode::TimestampOutOfRange, "timestamp"),
        ("epoch microseconds", with(json!({"timestamp": 1_749_896_100_000_000u64})), ReasonCode::TimestampOutOfRange, "timestamp"),
        ("before 2000", with(json!({"timestamp": "1999-12-31T23:59:59Z"})), ReasonCode::TimestampOutOfRange, "timestamp"),
        ("ms and s disagree", with(json!({"decode_time_s": 3.0})), ReasonCode::UnitsConflict, "decode_time_ms"),
        (
            "us and ns disagree",
            with(json!({"queue_wait_ms": null, "queue_wait_us": 20_000, "queue_wait_ns": 21_000_000})),
            ReasonCode::UnitsConflict,
            "queue_wait_ns",
        ),
        ("alias disagrees", with(json!({"gen_ai.usage.input_tokens": 999})), ReasonCode::UnitsConflict, "gen_ai.usage.input_tokens"),
        ("total given in seconds", with(json!({"total_latency_ms": 2.5})), ReasonCode::UnitsInconsistent, "total_latency_ms"),
        ("ttft beyond total", with(json!({"ttft_ms": 2500.5})), ReasonCode::UnitsInconsistent, "ttft_ms"),
        ("unknown error code", with(json!({"error_code": 4242, "error_stage": "decode"})), ReasonCode::ErrorCodeUnknown, "error_code"),
        (
            "error code beyond i32",
            with(json!({"error_code": 10_000_000_000i64, "error_stage": "decode"})),
            ReasonCode::ErrorCodeUnknown,
            "error_code",
        ),
        ("error without stage", with(json!({"error_code": 1001})), ReasonCode::ErrorStageMissing, "error_stage"),
        ("email in tenant", with(json!({"tenant": "ops jane.doe@example.com"})), ReasonCode::PiiDetected, "tenant"),
        ("phone in session", with(json!({"session_id": "+44 20 7946 0958"})), ReasonCode::PiiDetected, "session_id"),
        ("us phone in request_type", with(json!({"request_type": "callback (555) 123-4567"})), ReasonCode::PiiDetected, "request_type"),
        ("email in business_line", with(json!({"business_line": "bob@corp.io"})), ReasonCode::PiiDetected, "business_line"),
        ("oversize", with(json!({"notes": "x".repeat(70_000)})), ReasonCode::EventTooLarge, "-"),
    ];
    cases.push(("future", with(json!({"timestamp": "2025-06-14T10:21:00Z"})), ReasonCode::TimestampOutOfRange, "timestamp"));
    cases.push(("older than hot retention", with(json!({"timestamp": "2025-06-07T10:15:00Z"})), ReasonCode::TimestampOutOfRange, "timestamp"));

    for (name, bytes, reason, field) in &cases {
        let got = rejection(bytes, Some(NOW));
        assert_eq!(got, (*reason, (*field).to_owned()), "case {name:?}");
    }
    let covered: std::collections::BTreeSet<_> = cases.iter().map(|c| c.2).collect();
    assert_eq!(covered.len(), ReasonCode::EVENT.len(), "every reason code an event earns alone is exercised");
}

#[test]
fn time_bounds_apply_only_with_now() {
    let old = with(json!({"timestamp": "2024-01-01T00:00:00Z"}));
    assert!(contract().check(&old, None).is_ok());
    assert_eq!(contract().check(&old, Some(NOW)).map_err(|r| r.reason), Err(ReasonCode::TimestampOutOfRange));
    let skewed = with(json!({"timestamp": "2025-06-14T10:19:59Z"}));
    assert!(contract().check(&skewed, Some(NOW)).is_ok(), "within 5 minutes of skew");
}

#[test]
fn timestamps_normalize_to_utc_epoch_ms() {
    for (given, expected_ms) in [
        (json!("2025-06-14T10:15:00Z"), 1_749_896_100_000i64),
        (json!("2025-06-14T18:15:00+08:00"), 1_749_896_100_000),
        (json!("2025-06-14T16:00:00+05:45"), 1_749_896_100_000),
        (json!("2025-06-14T05:15:00.25-05:00"), 1_749_896_100_250),
        (json!("2025-06-14t10:15:00.123456z"), 1_749_896_100_123),
        (json!("2024-02-29T23:59:59.999Z"), 1_709_251_199_999),
        (json!(1_749_896_100_000i64), 1_749_896_100_000),
        (json!(1_749_896_100_000.0), 1_749_896_100_000),
    ] {
        let n = contract().normalize(&with(json!({"timestamp": given})), None, &hasher()).expect("valid");
        assert_eq!(n.event.timestamp_ms, expected_ms, "{given}");
    }
}

#[test]
fn units_convert_to_ms_and_agreeing_duplicates_are_accepted() {
    let cases = [
        (json!({"decode_time_ms": null, "decode_time_s": 2.0}), 2000.0),
        (json!({"decode_time_ms": null, "decode_time_us": 2_000_500}), 2000.5),
        (json!({"decode_time_ms": null, "decode_time_ns": 1_999_999_999i64}), 1999.999999),
        (json!({"decode_time_s": 2.0}), 2000.0),
        (json!({"decode_time_s": 2.0003}), 2000.0),
    ];
    for (patch, expected) in cases {
        let n = contract().normalize(&with(patch.clone()), None, &hasher()).expect("valid");
        let got = n.event.decode_time_ms.expect("decode set");
        assert!((got - expected).abs() < 1e-9, "{patch}: {got}");
    }
    let total_in_s = with(json!({"total_latency_ms": null, "total_latency_s": 2.5}));
    let n = contract().normalize(&total_in_s, None, &hasher()).expect("valid");
    assert_eq!(n.event.total_latency_ms, 2500.0);
}

#[test]
fn ttft_and_tpot_are_derived_only_when_absent() {
    let n = contract().normalize(&with(json!({})), None, &hasher()).expect("valid");
    assert_eq!(n.event.ttft_ms, Some(200.0), "queue + prefill");
    assert_eq!(n.event.tpot_ms, Some(20.0), "decode / (output_tokens - 1)");

    let given = contract().normalize(&with(json!({"ttft_ms": 250.0, "tpot_ms": 19.5})), None, &hasher()).expect("valid");
    assert_eq!((given.event.ttft_ms, given.event.tpot_ms), (Some(250.0), Some(19.5)));

    let one_token = contract().normalize(&with(json!({"output_tokens": 1})), None, &hasher()).expect("valid");
    assert_eq!(one_token.event.tpot_ms, None, "no tpot for a single output token");

    let no_queue = contract().normalize(&with(json!({"queue_wait_ms": null})), None, &hasher()).expect("valid");
    assert_eq!(no_queue.event.ttft_ms, None, "ttft needs both queue and prefill");
}

#[test]
fn the_stage_sum_tolerance_is_five_percent_plus_five_ms() {
    // stages sum to 2200 ms; the limit for total T is 2200 <= 1.05 T + 5.
    let ok = with(json!({"total_latency_ms": 2090.5}));
    assert!(contract().check(&ok, None).is_ok());
    let bad = with(json!({"total_latency_ms": 2090.4}));
    assert_eq!(contract().check(&bad, None).map_err(|r| r.reason), Err(ReasonCode::UnitsInconsistent));
}

#[test]
fn text_is_trimmed_and_defaults_apply() {
    let n =
        contract().normalize(&with(json!({"model_name": "  llama  ", "tenant": "  ", "request_type": " chat\t"})), None, &hasher()).expect("valid");
    assert_eq!(n.event.model_name, "llama");
    assert_eq!(n.event.tenant, None, "blank optional text is absent");
    assert_eq!(n.event.request_type.as_deref(), Some("chat"));
    assert_eq!(n.event.business_line, "unknown");
}

#[test]
fn negative_zero_becomes_zero() {
    let n = contract()
        .normalize(br#"{"request_id":"r","timestamp":"2025-06-14T10:15:00Z","model_name":"m","model_version":"v","input_tokens":-0,"output_tokens":0,"total_latency_ms":-0.0,"error_code":0,"queue_wait_ms":-0.0}"#, None, &hasher())
        .expect("-0 is >= 0");
    assert_eq!(n.event.input_tokens, 0);
    assert!(n.event.total_latency_ms.is_sign_positive());
    assert!(n.event.queue_wait_ms.expect("set").is_sign_positive());
    assert!(!n.event.to_json().contains(":-0"), "{}", n.event.to_json());
}

#[test]
fn errors_carry_their_stage() {
    let n = contract().normalize(&with(json!({"error_code": 1001, "error_stage": " decode "})), None, &hasher()).expect("valid");
    assert_eq!((n.event.error_code, n.event.error_stage), (1001, Some(ErrorStage::Decode)));
}

#[test]
fn the_error_dictionary_is_extendable() {
    let config = ContractConfig { error_codes: [("2001".to_owned(), "quota_exceeded".to_owned())].into(), ..ContractConfig::default() };
    let extended = Contract::new(&config).expect("valid");
    let event = with(json!({"error_code": 2001, "error_stage": "gateway"}));
    assert!(extended.check(&event, None).is_ok());
    assert_eq!(contract().check(&event, None).map_err(|r| r.reason), Err(ReasonCode::ErrorCodeUnknown));
}

#[test]
fn otel_aliases_map_to_contract_fields() {
    let event = json!({
        "gen_ai.response.id": "chatcmpl-123",
        "timestamp": 1_749_896_100_000i64,
        "gen_ai.request.model": "gpt-oss-20b",
        "model_version": "2025-08-05",
        "gen_ai.usage.prompt_tokens": 50,
        "gen_ai.usage.completion_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 32,
        "total_latency_ms": 300,
        "error_code": 0,
    });
    let n = contract().normalize(event.to_string().as_bytes(), None, &hasher()).expect("valid");
    assert_eq!(n.event.request_id, "chatcmpl-123");
    assert_eq!(n.event.model_name, "gpt-oss-20b");
    assert_eq!((n.event.input_tokens, n.event.output_tokens), (50, 7));
    assert_eq!(n.event.cache_prefix_tokens, Some(32));
    // The canonical name and its alias may both be given when they agree.
    let both = with(json!({"gen_ai.usage.input_tokens": 1200, "gen_ai.request.model": "llama-3.1-70b-instruct"}));
    assert!(contract().check(&both, None).is_ok());
}

#[test]
fn unknown_and_content_fields_are_dropped_and_reported() {
    let n = contract()
        .normalize(
            &with(json!({"prompt": "secret question", "messages": [{"role": "user"}], "trace_id": "abc", "response": {"text": "answer"}})),
            None,
            &hasher(),
        )
        .expect("valid");
    let mut dropped = n.dropped_fields.clone();
    dropped.sort();
    assert_eq!(dropped, ["messages", "prompt", "response", "trace_id"]);
    let stored = n.event.to_json();
    assert!(!stored.contains("secret question") && !stored.contains("answer") && !stored.contains("trace_id"));
}

/// A prompt is stored only as its keyed hash: the producer's
/// `prompt_hash` hashed again, or the first prompt field's text; the same
/// chat messages hash alike whatever their spacing or key order.
#[test]
fn prompts_are_stored_only_as_keyed_hashes() {
    let h = hasher();
    let hash_of = |patch: Value| contract().normalize(&with(patch), None, &h).expect("valid").event.prompt_hash;
    assert_eq!(hash_of(json!({})), None, "no prompt, no hash");
    assert_eq!(hash_of(json!({"prompt_hash": " sha256:ab12 "})), Some(h.hash_prompt("sha256:ab12")));
    assert_eq!(hash_of(json!({"prompt": "  What is 2+2?\n"})), Some(h.hash_prompt("What is 2+2?")));
    assert_eq!(hash_of(json!({"prompt": "a", "prompt_hash": "b"})), Some(h.hash_prompt("b")), "the producer's hash wins");
    assert_eq!(hash_of(json!({"input": "x", "prompt": "a"})), Some(h.hash_prompt("a")), "prompt before input, whatever the order sent");
    assert_eq!(hash_of(json!({"prompt": 7})), None, "a number is no prompt text");
    let messages = r#"[{"role":"user","content":"hi"}]"#;
    let reordered = contract()
        .normalize(&with(json!({"messages": serde_json::from_str::<Value>(r#"[ { "content" : "hi", "role" : "user" } ]"#).expect("json")})), None, &h)
        .expect("valid");
    assert_eq!(reordered.event.prompt_hash, Some(h.hash_prompt(r#"[{"content":"hi","role":"user"}]"#)));
    assert_eq!(hash_of(json!({"messages": serde_json::from_str::<Value>(messages).expect("json")})), reordered.event.prompt_hash);
    let n = contract().normalize(&with(json!({"prompt": "my secret plan", "max_tokens": 256})), None, &h).expect("valid");
    assert_eq!(n.event.max_tokens, Some(256));
    assert_eq!(n.dropped_fields, ["prompt"], "the text is dropped");
    let stored = n.event.to_json();
    assert!(!stored.contains("secret plan") && stored.contains(&h.hash_prompt("my secret plan")), "{stored}");
    // A normalized event normalizes to itself: its digest is not hashed again.
    let again = contract().normalize(stored.as_bytes(), None, &h).expect("valid");
    assert_eq!(again.event, n.event);
    assert!(contract().check(&with(json!({"prompt": "x"})), None).is_ok(), "checking needs no key");
}

#[test]
fn user_ids_are_hashed_with_the_key_id_never_stored_plain() {
    let h = hasher();
    let n = contract().normalize(&with(json!({})), None, &h).expect("valid");
    let stored = n.event.user_id_hash.clone().expect("hashed");
    assert_eq!(stored, h.hash("alice-77"));
    assert!(stored.starts_with(&format!("{}:", h.key_id())));
    assert!(!n.event.to_json().contains("alice-77"));
    // An e-mail address as user id is hashed, not rejected: user_id is the one exempt field.
    let email = contract().normalize(&with(json!({"user_id": "alice@example.com"})), None, &h).expect("valid");
    assert!(!email.event.to_json().contains("example.com"));
    // Another key gives another digest and id: rotation is visible.
    let other = UserIdHasher::new(b"another-key-0123456789", None, "test").expect("valid");
    let rotated = contract().normalize(&with(json!({})), None, &other).expect("valid");
    assert_ne!(rotated.event.user_id_hash, n.event.user_id_hash);
}

#[test]
fn the_size_limit_is_configurable() {
    let small = Contract::new(&ContractConfig { max_event_bytes: 300, ..ContractConfig::default() }).expect("valid");
    let event = with(json!({"tenant": "t".repeat(100)}));
    assert!(event.len() > 300);
    assert_eq!(small.check(&event, None).map_err(|r| r.reason), Err(ReasonCode::EventTooLarge));
    assert!(contract().check(&event, None).is_ok());
}

#[test]
fn escaped_keys_and_values_are_understood() {
    let event = br#"{"request\u005fid":"req-\u0031","timestamp":"2025-06-14T10:15:00Z","model_name":"caf\u00e9","model_version":"v1","input_tokens":1,"output_tokens":1,"total_latency_ms":1,"error_code":0}"#;
    let n = contract().normalize(event, None, &hasher()).expect("valid");
    assert_eq!(n.event.request_id, "req-1");
    assert_eq!(n.event.model_name, "café");
}

/// Inserts `"key": value` (raw JSON text) at the start of the base event.
fn with_raw(key: &str, raw_value: &str) -> Vec<u8> {
    let base = base().to_string();
    format!(r#"{{"{key}":{raw_value},{}"#, &base[1..]).into_bytes()
}

#[test]
fn deep_nesting_neither_crashes_nor_reaches_a_tier() {
    let deep = format!("{}1{}", "[".repeat(30_000), "]".repeat(30_000));
    // In an unknown field it is skipped without recursion and dropped.
    let n = contract().normalize(&with_raw("debug", &deep), None, &hasher()).expect("valid apart from the dropped field");
    assert_eq!(n.dropped_fields, ["debug"]);
    // In a contract field it is the wrong type, however deep.
    let r = contract().check(&with_raw("tenant", &deep), None).expect_err("rejected");
    assert_eq!((r.reason, r.field.as_str()), (ReasonCode::FieldType, "tenant"));
    let shallow = contract().check(&with_raw("tenant", "[[1]]"), None).expect_err("rejected");
    assert_eq!((shallow.reason, shallow.field.as_str()), (ReasonCode::FieldType, "tenant"));
}
