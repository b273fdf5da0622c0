//! The published JSON Schema (`inferlog-schema json-schema`) and the parser
//! in step, checked with an independent validator (the `jsonschema` crate):
//! every generated valid event validates, and every generated invalid event
//! whose rejection JSON Schema can express (a missing field, a wrong type, a
//! value out of range, an unknown error stage or a missing one) fails
//! validation too.

use std::collections::BTreeMap;

use inferlog_schema::contract::json_schema;
use inferlog_schema::generate::{GeneratedEvent, Generator, GeneratorConfig};
use inferlog_schema::ReasonCode;
use serde_json::{json, Value};

/// 2026-11-01T00:00:00Z
const END: i64 = 1_793_491_200_000;

fn events(seed: u64, count: usize, invalid_ratio: f64) -> Vec<GeneratedEvent> {
    Generator::new(GeneratorConfig { seed, days: 14, end_ms: END, invalid_ratio }).take(count).collect()
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&json_schema()).expect("the published schema is a valid JSON Schema")
}

/// Rejections a JSON Schema states: required fields, types, ranges, enums.
fn expressible(reason: ReasonCode) -> bool {
    matches!(
        reason,
        ReasonCode::JsonNotObject | ReasonCode::FieldMissing | ReasonCode::FieldType | ReasonCode::FieldRange | ReasonCode::ErrorStageMissing
    )
}

#[test]
fn every_valid_generated_event_validates_against_the_published_schema() {
    let schema = validator();
    let mut checked = 0;
    for e in events(11, 5_000, 0.0) {
        assert_eq!(e.expected, None);
        let value: Value = serde_json::from_slice(&e.line).expect("generated valid events are JSON");
        let errors: Vec<String> = schema.iter_errors(&value).map(|err| format!("{} at {}", err, err.instance_path())).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", String::from_utf8_lossy(&e.line));
        checked += 1;
    }
    assert_eq!(checked, 5_000);
}

#[test]
fn every_rejection_json_schema_can_express_fails_validation_too() {
    let schema = validator();
    let mut per_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for e in events(12, 20_000, 0.5) {
        let Some(reason) = e.expected.filter(|r| expressible(*r)) else { continue };
        let Ok(value) = serde_json::from_slice::<Value>(&e.line) else { continue };
        assert!(
            !schema.is_valid(&value),
            "{} is rejected as {} by the parser but valid by the schema",
            String::from_utf8_lossy(&e.line),
            reason.as_str()
        );
        *per_reason.entry(reason.as_str()).or_default() += 1;
    }
    for reason in ["field.missing", "field.type", "field.range", "error_stage.missing"] {
        assert!(per_reason.get(reason).copied().unwrap_or(0) >= 10, "the generator covers {reason}: {per_reason:?}");
    }
}

/// A change that breaks a valid event.
type Mutation = dyn Fn(&mut Value);

#[test]
fn hand_made_breaks_fail_validation_where_the_field_is() {
    let schema = validator();
    let valid: Value = serde_json::from_slice(&events(13, 1, 0.0)[0].line).expect("json");
    assert!(schema.is_valid(&valid));
    // (field, where the validator points: the instance path, or the group
    // of alternative names for a field that has aliases)
    let cases: [(&str, &str, Box<Mutation>); 4] = [
        ("model_name", "anyOf", Box::new(|v: &mut Value| drop(v.as_object_mut().map(|o| o.remove("model_name"))))),
        ("input_tokens", "/input_tokens", Box::new(|v: &mut Value| v["input_tokens"] = json!("many"))),
        ("output_tokens", "/output_tokens", Box::new(|v: &mut Value| v["output_tokens"] = json!(-1))),
        (
            "error_stage",
            "/error_stage",
            Box::new(|v: &mut Value| {
                v["error_code"] = json!(1003);
                v["error_stage"] = json!("teleport");
            }),
        ),
    ];
    for (field, place, mutate) in cases {
        let mut broken = valid.clone();
        mutate(&mut broken);
        let errors: Vec<String> = schema.iter_errors(&broken).map(|e| format!("{} {}", e.instance_path(), e.schema_path())).collect();
        assert!(!errors.is_empty(), "{field}: {broken}");
        assert!(errors.iter().any(|e| e.contains(place)), "{field}: {place} in {errors:?}");
    }
}
