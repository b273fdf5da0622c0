//! The input contract as a table of fields, and the two artefacts made from
//! it: the JSON Schema (`inferlog-schema json-schema`) and the compatibility
//! check against an older schema (`inferlog-schema compat OLD.json`).
//!
//! The table documents what [`crate::normalize`] enforces; the tests in
//! `schema/tests/contract.rs` keep both in step: an independent validator
//! (the `jsonschema` crate) accepts every generated valid event and refuses
//! every generated rejection that JSON Schema can express.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::event::{ErrorStage, SCHEMA_VERSION};
use crate::normalize::{CONTENT_FIELDS, UNITS};

/// When a field must be present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Required,
    Optional,
    /// Required when `error_code` is not 0.
    WhenError,
}

/// The type and constraints of a field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldType {
    Text {
        min: u32,
        max: u32,
        pattern: Option<&'static str>,
    },
    Integer {
        min: Option<i64>,
    },
    /// A duration in ms; `_s`, `_us` and `_ns` variants are accepted too.
    DurationMs,
    Number {
        unit: &'static str,
    },
    Boolean,
    Timestamp,
    Enum(&'static [&'static str]),
}

/// One field of the input contract.
#[derive(Debug, Clone, Copy)]
pub struct FieldSpec {
    pub name: &'static str,
    pub field_type: FieldType,
    pub presence: Presence,
    pub aliases: &'static [&'static str],
    pub description: &'static str,
}

const STAGES: [&str; 5] = [
    ErrorStage::Gateway.as_str(),
    ErrorStage::Queue.as_str(),
    ErrorStage::Prefill.as_str(),
    ErrorStage::Decode.as_str(),
    ErrorStage::Postprocess.as_str(),
];

const fn field(name: &'static str, field_type: FieldType, presence: Presence, description: &'static str) -> FieldSpec {
    FieldSpec { name, field_type, presence, aliases: &[], description }
}

const fn text(max: u32) -> FieldType {
    FieldType::Text { min: 1, max, pattern: None }
}

/// The fields of schema v1, in docs/contract.md §1 order.
pub const FIELDS: [FieldSpec; 27] = [
    FieldSpec {
        aliases: &["gen_ai.response.id"],
        ..field(
            "request_id",
            FieldType::Text { min: 1, max: 128, pattern: Some("^[A-Za-z0-9._:-]{1,128}$") },
            Presence::Required,
            "Unique id of the request; the dedup key.",
        )
    },
    field(
        "timestamp",
        FieldType::Timestamp,
        Presence::Required,
        "When the request finished: RFC 3339 with an explicit offset, or integer epoch milliseconds. Stored as UTC epoch ms.",
    ),
    FieldSpec { aliases: &["gen_ai.request.model"], ..field("model_name", text(128), Presence::Required, "Model served.") },
    field("model_version", text(64), Presence::Required, "Version of the model that served the request."),
    FieldSpec {
        aliases: &["gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"],
        ..field("input_tokens", FieldType::Integer { min: Some(0) }, Presence::Required, "Prompt tokens (real tokens, never characters).")
    },
    FieldSpec {
        aliases: &["gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"],
        ..field("output_tokens", FieldType::Integer { min: Some(0) }, Presence::Required, "Generated tokens.")
    },
    field("total_latency_ms", FieldType::DurationMs, Presence::Required, "End-to-end latency."),
    field("error_code", FieldType::Integer { min: None }, Presence::Required, "0 = success; otherwise a code of the error dictionary."),
    field("business_line", text(64), Presence::Optional, "Business line; `unknown` when absent."),
    field(
        "user_id",
        FieldType::Text { min: 1, max: 1024, pattern: None },
        Presence::Optional,
        "End user; stored only as a keyed HMAC-SHA256 with the key id.",
    ),
    field("tenant", FieldType::Text { min: 0, max: 128, pattern: None }, Presence::Optional, "Tenant."),
    field("session_id", FieldType::Text { min: 0, max: 128, pattern: None }, Presence::Optional, "Conversation or session."),
    field("request_type", FieldType::Text { min: 0, max: 128, pattern: None }, Presence::Optional, "chat, summarize, translate, code, ..."),
    field("queue_wait_ms", FieldType::DurationMs, Presence::Optional, "Time waiting for a slot."),
    field("prefill_time_ms", FieldType::DurationMs, Presence::Optional, "Prompt processing time."),
    field("decode_time_ms", FieldType::DurationMs, Presence::Optional, "Generation time."),
    field("ttft_ms", FieldType::DurationMs, Presence::Optional, "Time to first token; derived as queue + prefill when absent."),
    field("tpot_ms", FieldType::DurationMs, Presence::Optional, "Time per output token; derived as decode / (output_tokens - 1) when absent."),
    field("gpu_id", FieldType::Integer { min: Some(0) }, Presence::Optional, "GPU that served the request."),
    field("batch_size", FieldType::Integer { min: Some(1) }, Presence::Optional, "Batch the request ran in."),
    field("cache_hit", FieldType::Boolean, Presence::Optional, "A prompt prefix was reused from cache."),
    FieldSpec {
        aliases: &["gen_ai.usage.cache_read.input_tokens"],
        ..field("cache_prefix_tokens", FieldType::Integer { min: Some(0) }, Presence::Optional, "Length of the reused prefix; at most input_tokens.")
    },
    field("gpu_mem_peak_mb", FieldType::Number { unit: "MB" }, Presence::Optional, "Peak GPU memory of the request."),
    field("truncated", FieldType::Boolean, Presence::Optional, "The input was cut for length."),
    field(
        "prompt_hash",
        FieldType::Text { min: 1, max: 256, pattern: None },
        Presence::Optional,
        "The producer's hash of the prompt; stored only as a keyed HMAC-SHA256 with the key id. Without it, prompt text (prompt, messages, input) is hashed so before it is dropped.",
    ),
    FieldSpec {
        aliases: &["gen_ai.request.max_tokens"],
        ..field("max_tokens", FieldType::Integer { min: Some(1) }, Presence::Optional, "The output limit the request set.")
    },
    field("error_stage", FieldType::Enum(&STAGES), Presence::WhenError, "Where the error happened; required when error_code is not 0."),
];

fn duration_variants(name: &str) -> Vec<(String, &'static str)> {
    let base = name.strip_suffix("_ms").unwrap_or(name);
    UNITS.iter().filter(|(u, _)| *u != "ms").map(|(u, _)| (format!("{base}_{u}"), *u)).collect()
}

fn property(spec: &FieldSpec) -> Value {
    let mut p = match spec.field_type {
        FieldType::Text { min, max, pattern } => {
            let mut p = json!({"type": "string", "minLength": min, "maxLength": max});
            if let Some(pattern) = pattern {
                p["pattern"] = json!(pattern);
            }
            p
        }
        FieldType::Integer { min } => {
            let mut p = json!({"type": "integer"});
            if let Some(min) = min {
                p["minimum"] = json!(min);
            }
            p
        }
        FieldType::DurationMs => json!({"type": "number", "minimum": 0, "x-unit": "ms"}),
        FieldType::Number { unit } => json!({"type": "number", "minimum": 0, "x-unit": unit}),
        FieldType::Boolean => json!({"type": "boolean"}),
        FieldType::Timestamp => json!({
            "type": ["string", "integer"],
            "format": "date-time",
            "x-unit": "epoch-ms"
        }),
        FieldType::Enum(values) => json!({"type": "string", "enum": values}),
    };
    p["description"] = json!(spec.description);
    if !spec.aliases.is_empty() {
        p["x-aliases"] = json!(spec.aliases);
    }
    p
}

/// Whether an event may carry `name`: a field of [`FIELDS`], one of its
/// aliases, or a unit form of a duration (`queue_wait_s`).
pub fn accepts_name(name: &str) -> bool {
    FIELDS.iter().any(|spec| {
        spec.name == name
            || spec.aliases.contains(&name)
            || (spec.field_type == FieldType::DurationMs && duration_variants(spec.name).iter().any(|(v, _)| v == name))
    })
}

/// The JSON Schema (draft 2020-12) of the input contract.
pub fn json_schema() -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    let mut all_of = Vec::new();
    for spec in &FIELDS {
        properties.insert(spec.name.to_owned(), property(spec));
        let mut names: Vec<String> = vec![spec.name.to_owned()];
        names.extend(spec.aliases.iter().map(|a| (*a).to_owned()));
        for alias in spec.aliases {
            properties.insert((*alias).to_owned(), json!({"$ref": format!("#/properties/{}", spec.name)}));
        }
        if spec.field_type == FieldType::DurationMs {
            for (variant, unit) in duration_variants(spec.name) {
                properties.insert(
                    variant.clone(),
                    json!({"type": "number", "minimum": 0, "x-unit": unit, "description": format!("{} in {unit}", spec.name)}),
                );
                names.push(variant);
            }
        }
        match spec.presence {
            Presence::Required if names.len() == 1 => required.push(json!(spec.name)),
            Presence::Required => all_of.push(json!({
                "anyOf": names.iter().map(|n| json!({"required": [n]})).collect::<Vec<_>>()
            })),
            Presence::WhenError => all_of.push(json!({
                "if": {"properties": {"error_code": {"not": {"const": 0}}}, "required": ["error_code"]},
                "then": {"required": [spec.name]}
            })),
            Presence::Optional => {}
        }
    }
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": format!("urn:inferlog:inference-event:v{SCHEMA_VERSION}"),
        "title": "inferlog inference event",
        "description": format!(
            "One finished LLM inference request. Unknown fields are dropped; prompt and completion fields ({}) are never stored.",
            CONTENT_FIELDS.join(", ")
        ),
        "x-schema-version": SCHEMA_VERSION,
        "type": "object",
        "properties": properties,
        "required": required,
        "allOf": all_of,
        "additionalProperties": true,
    })
}

/// A change from an old schema that breaks producers written against it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Break {
    pub field: String,
    pub what: String,
}

/// The canonical names a schema requires (plain `required` plus the first
/// name of each `anyOf` group of alternatives).
fn required_names(schema: &Value) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
    for group in schema["allOf"].as_array().into_iter().flatten() {
        if let Some(first) = group["anyOf"][0]["required"][0].as_str() {
            names.insert(first.to_owned());
        }
        if let Some(name) = group["then"]["required"][0].as_str() {
            names.insert(name.to_owned());
        }
    }
    names
}

fn type_set(p: &Value) -> BTreeSet<String> {
    match &p["type"] {
        Value::String(s) => BTreeSet::from([s.clone()]),
        Value::Array(a) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        _ => BTreeSet::new(),
    }
}

/// Every way `new` breaks producers written against `old`: a field
/// removed, a type narrowed, a unit changed, a constraint tightened, a new
/// required field. An integer field that now also accepts numbers is fine;
/// the reverse is not.
pub fn compat(old: &Value, new: &Value) -> Vec<Break> {
    let empty = Map::new();
    let old_props = old["properties"].as_object().unwrap_or(&empty);
    let new_props = new["properties"].as_object().unwrap_or(&empty);
    let mut breaks = Vec::new();
    let mut push = |field: &str, what: String| breaks.push(Break { field: field.to_owned(), what });
    for (name, old_p) in old_props {
        let Some(new_p) = new_props.get(name) else {
            push(name, "field removed".into());
            continue;
        };
        let (old_types, mut new_types) = (type_set(old_p), type_set(new_p));
        if new_types.contains("number") {
            new_types.insert("integer".into());
        }
        if !old_types.is_subset(&new_types) {
            push(name, format!("type changed from {old_types:?} to {:?}", type_set(new_p)));
        }
        if old_p["x-unit"] != new_p["x-unit"] {
            push(name, format!("unit changed from {} to {}", old_p["x-unit"], new_p["x-unit"]));
        }
        let num = |p: &Value, k: &str| p[k].as_f64();
        if let (Some(o), Some(n)) = (num(old_p, "maxLength"), num(new_p, "maxLength")) {
            if n < o {
                push(name, format!("maxLength lowered from {o} to {n}"));
            }
        }
        if let (Some(o), Some(n)) = (num(old_p, "maximum"), num(new_p, "maximum")) {
            if n < o {
                push(name, format!("maximum lowered from {o} to {n}"));
            }
        }
        for key in ["minLength", "minimum"] {
            match (num(old_p, key), num(new_p, key)) {
                (Some(o), Some(n)) if n > o => push(name, format!("{key} raised from {o} to {n}")),
                (None, Some(n)) => push(name, format!("{key} {n} added")),
                _ => {}
            }
        }
        if new_p.get("maximum").is_some() && old_p.get("maximum").is_none() {
            push(name, "maximum added".into());
        }
        if old_p["pattern"] != new_p["pattern"] && !new_p["pattern"].is_null() {
            push(name, format!("pattern changed from {} to {}", old_p["pattern"], new_p["pattern"]));
        }
        if let (Some(o), Some(n)) = (old_p["enum"].as_array(), new_p["enum"].as_array()) {
            for value in o.iter().filter(|v| !n.contains(v)) {
                push(name, format!("enum value {value} removed"));
            }
        } else if new_p["enum"].is_array() {
            push(name, "now restricted to an enum".into());
        }
    }
    let (old_required, new_required) = (required_names(old), required_names(new));
    for name in new_required.difference(&old_required) {
        push(name, "new required field".into());
    }
    breaks.sort();
    breaks.dedup();
    breaks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `[otlp] attributes` may name: fields, aliases and unit forms of
    /// durations only.
    #[test]
    fn accepts_fields_aliases_and_duration_units_only() {
        for name in ["gpu_id", "ttft_ms", "ttft_s", "decode_time_us", "gen_ai.usage.input_tokens", "total_latency_ns"] {
            assert!(accepts_name(name), "{name}");
        }
        for name in ["gpu_id_s", "input_tokens_ms", "prompt", "ttft", ""] {
            assert!(!accepts_name(name), "{name}");
        }
    }

    #[test]
    fn schema_is_compatible_with_itself() {
        assert_eq!(compat(&json_schema(), &json_schema()), vec![]);
    }

    #[test]
    fn every_kind_of_break_is_found() {
        let old = json_schema();
        let mut new = old.clone();
        new["properties"].as_object_mut().expect("object").remove("gpu_id");
        new["properties"]["input_tokens"]["type"] = json!("string");
        new["properties"]["queue_wait_ms"]["x-unit"] = json!("s");
        new["properties"]["model_name"]["maxLength"] = json!(64);
        new["properties"]["error_stage"]["enum"] = json!(["gateway"]);
        new["required"].as_array_mut().expect("array").push(json!("tenant"));
        let breaks = compat(&old, &new);
        let fields: BTreeSet<&str> = breaks.iter().map(|b| b.field.as_str()).collect();
        assert_eq!(fields, BTreeSet::from(["gpu_id", "input_tokens", "queue_wait_ms", "model_name", "error_stage", "tenant"]), "{breaks:?}");
    }

    #[test]
    fn widening_is_not_a_break() {
        let old = json_schema();
        let mut new = old.clone();
        new["properties"]["model_name"]["maxLength"] = json!(256);
        new["properties"]["gpu_id"]["type"] = json!("number");
        new["properties"]["new_optional"] = json!({"type": "string"});
        assert_eq!(compat(&old, &new), vec![]);
    }
}
