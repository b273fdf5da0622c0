//! Spans to events. In: one span with its resource's attributes, and the
//! `[otlp]` config. Out: whether it is an inference request and, if so, the
//! event it stands for, as a JSON object in the contract's field names
//! (what the contract then validates and normalizes like any producer's
//! event, and what the DLQ keeps when it is refused).
//!
//! The table (docs/contract.md, "OTLP spans"): each field takes the first
//! attribute present, the span's own before its resource's, a user's
//! `[otlp.attributes]` before the built-in names. vLLM's latencies are
//! seconds and land in the contract's `_s` forms, which it converts to ms.

use std::collections::BTreeMap;

use inferlog_schema::ErrorDictionary;
use inferlog_store::config::OtlpConfig;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::{Map, Number, Value};

use super::decode::ResourceSpan;

/// The built-in names, by the event field (or unit form) they fill, in
/// order of precedence: vLLM's, the GenAI conventions', the older `llm.*`
/// ones (OpenLLMetry, OpenInference), then inferlog's own.
pub const BUILT_IN: &[(&str, &[&str])] = &[
    ("request_id", &["gen_ai.request.id", "gen_ai.response.id"]),
    ("model_name", &["gen_ai.response.model", "gen_ai.request.model", "llm.response.model", "llm.request.model", "llm.model_name"]),
    ("model_version", &["inferlog.model_version", "service.version"]),
    ("input_tokens", &["gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens", "llm.usage.prompt_tokens", "llm.token_count.prompt"]),
    ("output_tokens", &["gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens", "llm.usage.completion_tokens", "llm.token_count.completion"]),
    ("total_latency_s", &["gen_ai.latency.e2e"]),
    ("queue_wait_s", &["gen_ai.latency.time_in_queue"]),
    ("ttft_s", &["gen_ai.latency.time_to_first_token"]),
    ("prefill_time_s", &["gen_ai.latency.time_in_model_prefill"]),
    ("decode_time_s", &["gen_ai.latency.time_in_model_decode"]),
    ("cache_prefix_tokens", &["gen_ai.usage.cache_read.input_tokens"]),
    ("request_type", &["gen_ai.operation.name", "llm.request.type"]),
    ("session_id", &["session.id", "gen_ai.conversation.id"]),
    ("user_id", &["user.id", "enduser.id"]),
    ("tenant", &["inferlog.tenant"]),
    ("max_tokens", &["gen_ai.request.max_tokens"]),
    ("prompt_hash", &["inferlog.prompt_hash"]),
    ("error_code", &["inferlog.error_code"]),
    ("error_stage", &["inferlog.error_stage"]),
];

/// What a span became.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapped {
    /// Not an inference request: counted and skipped.
    Skipped,
    /// The event, as JSON bytes in the contract's names.
    Event(Vec<u8>),
}

/// The `[otlp]` rule and table, ready to apply.
#[derive(Debug, Clone)]
pub struct Mapper {
    config: OtlpConfig,
    /// User attributes by the field they fill, in name order.
    user: BTreeMap<String, Vec<String>>,
    /// Error dictionary names to codes (for `error.type`).
    codes: BTreeMap<String, i32>,
}

impl Mapper {
    pub fn new(config: OtlpConfig, dictionary: &ErrorDictionary) -> Mapper {
        let mut user: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (attribute, field) in &config.attributes {
            user.entry(field.clone()).or_default().push(attribute.clone());
        }
        let codes = dictionary.entries().iter().map(|(code, name)| (name.clone(), *code)).collect();
        Mapper { config, user, codes }
    }

    /// Whether `span` is an inference request, and its event if so.
    pub fn map(&self, s: &ResourceSpan<'_>) -> Mapped {
        let span = s.span;
        let is_inference =
            self.config.span_names.contains(&span.name) || span.attributes.iter().any(|kv| self.config.match_attributes.contains(&kv.key));
        if !is_inference {
            return Mapped::Skipped;
        }
        let lookup = |name: &str| find(&span.attributes, name).or_else(|| find(s.resource, name));
        let mut event = Map::new();
        // The user's names first, then the built-in ones, per field.
        let user = self.user.iter().map(|(field, names)| (field.as_str(), names.iter().map(String::as_str).collect::<Vec<_>>()));
        let built_in = BUILT_IN.iter().map(|(field, names)| (*field, names.to_vec()));
        for (field, names) in user.chain(built_in) {
            if event.contains_key(field) {
                continue;
            }
            if let Some(value) = names.iter().find_map(|n| lookup(n)).and_then(json) {
                event.insert(field.to_owned(), value);
            }
        }
        if let Some(line) = lookup(&self.config.business_line_attribute).and_then(json) {
            event.entry("business_line").or_insert(line);
        }
        if !event.contains_key("request_id") && !span.trace_id.is_empty() {
            event.insert("request_id".into(), Value::String(format!("{}-{}", hex::encode(&span.trace_id), hex::encode(&span.span_id))));
        }
        if span.end_time_unix_nano > 0 {
            event.insert("timestamp".into(), Value::from(span.end_time_unix_nano / 1_000_000));
        }
        if !has_any(&event, "total_latency") && span.end_time_unix_nano >= span.start_time_unix_nano && span.start_time_unix_nano > 0 {
            let ms = (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e6;
            event.insert("total_latency_ms".into(), Number::from_f64(ms).map_or(Value::Null, Value::Number));
        }
        if !event.contains_key("error_code") {
            let failed = span.status.as_ref().is_some_and(|st| st.code == StatusCode::Error as i32);
            let error_type = lookup("error.type").and_then(text);
            let code = match (failed, error_type) {
                (_, Some(kind)) => Some(self.codes.get(kind).copied().unwrap_or(self.config.error_code)),
                (true, None) => Some(self.config.error_code),
                (false, None) => None,
            };
            event.insert("error_code".into(), Value::from(code.unwrap_or(0)));
            if code.is_some() {
                event.entry("error_stage").or_insert_with(|| Value::String(self.config.error_stage.clone()));
            }
        }
        Mapped::Event(serde_json::to_vec(&Value::Object(event)).unwrap_or_default())
    }
}

/// Whether `event` has `base` in any unit (`total_latency_ms`, `_s`, …).
fn has_any(event: &Map<String, Value>, base: &str) -> bool {
    event.keys().any(|k| k.strip_prefix(base).is_some_and(|rest| rest.starts_with('_')))
}

fn find<'a>(attributes: &'a [KeyValue], name: &str) -> Option<&'a AnyValue> {
    attributes.iter().find(|kv| kv.key == name).and_then(|kv| kv.value.as_ref())
}

fn text(v: &AnyValue) -> Option<&str> {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// An attribute value as JSON: scalars as they are, arrays of scalars as
/// arrays (the contract judges the type); maps and bytes are left out.
fn json(v: &AnyValue) -> Option<Value> {
    Some(match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Value::String(s.clone()),
        any_value::Value::BoolValue(b) => Value::Bool(*b),
        any_value::Value::IntValue(i) => Value::from(*i),
        any_value::Value::DoubleValue(d) => Value::Number(Number::from_f64(*d)?),
        any_value::Value::ArrayValue(a) => Value::Array(a.values.iter().filter_map(json).collect()),
        // Maps, bytes and dictionary references (profiles only) are not event fields.
        any_value::Value::KvlistValue(_) | any_value::Value::BytesValue(_) | any_value::Value::StringValueStrindex(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use inferlog_schema::{Contract, ContractConfig};
    use opentelemetry_proto::tonic::trace::v1::{Span, Status};

    use super::*;

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..KeyValue::default() }
    }
    fn s(key: &str, v: &str) -> KeyValue {
        kv(key, any_value::Value::StringValue(v.into()))
    }
    fn i(key: &str, v: i64) -> KeyValue {
        kv(key, any_value::Value::IntValue(v))
    }
    fn d(key: &str, v: f64) -> KeyValue {
        kv(key, any_value::Value::DoubleValue(v))
    }

    fn mapper(config: OtlpConfig) -> Mapper {
        let dictionary = ContractConfig::default().validate().expect("dictionary");
        Mapper::new(config, &dictionary)
    }

    fn event(m: &Mapper, span: &Span, resource: &[KeyValue]) -> Map<String, Value> {
        match m.map(&ResourceSpan { index: 0, span, resource }) {
            Mapped::Event(bytes) => serde_json::from_slice(&bytes).expect("object"),
            Mapped::Skipped => panic!("{} was skipped", span.name),
        }
    }

    /// 2026-12-01T10:00:00Z in ns.
    const END: u64 = 1_796_119_200_000_000_000;

    /// vLLM's request span, as `vllm/tracing.py` names its attributes.
    fn vllm_span() -> Span {
        Span {
            name: "llm_request".into(),
            trace_id: vec![0xab; 16],
            span_id: vec![0xcd; 8],
            start_time_unix_nano: END - 2_500_000_000,
            end_time_unix_nano: END,
            attributes: vec![
                s("gen_ai.request.id", "cmpl-42"),
                s("gen_ai.response.model", "llama-3-8b"),
                i("gen_ai.usage.prompt_tokens", 812),
                i("gen_ai.usage.completion_tokens", 97),
                d("gen_ai.latency.time_in_queue", 0.012),
                d("gen_ai.latency.time_to_first_token", 0.25),
                d("gen_ai.latency.time_in_model_prefill", 0.2),
                d("gen_ai.latency.time_in_model_decode", 2.1),
                d("gen_ai.latency.e2e", 2.4),
                i("gen_ai.request.max_tokens", 256),
            ],
            ..Span::default()
        }
    }

    /// A vLLM span becomes the event its attributes say, in seconds, which
    /// the contract turns into the hot row's milliseconds.
    #[test]
    fn a_vllm_span_maps_to_its_event_and_normalizes_to_milliseconds() {
        let m = mapper(OtlpConfig::default());
        let resource = [s("service.name", "vllm"), s("service.version", "2026-11-30"), s("inferlog.business_line", "search")];
        let e = event(&m, &vllm_span(), &resource);
        let want = serde_json::json!({
            "request_id": "cmpl-42", "model_name": "llama-3-8b", "model_version": "2026-11-30", "business_line": "search",
            "input_tokens": 812, "output_tokens": 97, "total_latency_s": 2.4, "queue_wait_s": 0.012, "ttft_s": 0.25,
            "prefill_time_s": 0.2, "decode_time_s": 2.1, "timestamp": 1_796_119_200_000u64, "error_code": 0, "max_tokens": 256
        });
        assert_eq!(Value::Object(e.clone()), want);
        let contract = Contract::new(&ContractConfig::default()).expect("contract");
        let hasher = inferlog_schema::UserIdHasher::new(b"otlp-map-test-key-0123456789abcdef", None, "t").expect("key");
        let n = contract.normalize(&serde_json::to_vec(&e).expect("bytes"), None, &hasher).expect("valid");
        assert_eq!((n.event.total_latency_ms, n.event.ttft_ms, n.event.decode_time_ms), (2400.0, Some(250.0), Some(2100.0)));
        assert_eq!(n.event.max_tokens, Some(256), "vLLM's output limit");
        assert_eq!(n.event.timestamp_ms, 1_796_119_200_000);
    }

    /// GenAI-convention spans: no request id (the trace and span ids
    /// stand in), the span's duration as total latency, an error status
    /// with an `error.type` of the dictionary, the user's own attribute.
    #[test]
    fn a_genai_span_uses_its_ids_duration_status_and_the_users_table() {
        let config = OtlpConfig { attributes: BTreeMap::from([("acme.line".into(), "business_line".into())]), ..OtlpConfig::default() };
        let m = mapper(config);
        let span = Span {
            name: "chat gpt-4o".into(),
            trace_id: vec![0x01; 16],
            span_id: vec![0x02; 8],
            start_time_unix_nano: END - 1_500_000_000,
            end_time_unix_nano: END,
            attributes: vec![
                s("gen_ai.operation.name", "chat"),
                s("gen_ai.request.model", "gpt-4o"),
                i("gen_ai.usage.input_tokens", 30),
                i("gen_ai.usage.output_tokens", 0),
                s("error.type", "timeout"),
                s("acme.line", "ads"),
                s("inferlog.business_line", "ignored: the user's attribute comes first"),
            ],
            status: Some(Status { code: StatusCode::Error as i32, message: "deadline".into() }),
            ..Span::default()
        };
        let e = event(&m, &span, &[s("inferlog.model_version", "2024-08-06")]);
        assert_eq!(e["request_id"], "01010101010101010101010101010101-0202020202020202");
        assert_eq!(e["total_latency_ms"], 1500.0);
        assert_eq!((e["error_code"].as_i64(), e["error_stage"].as_str()), (Some(1003), Some("gateway")));
        assert_eq!((e["business_line"].as_str(), e["request_type"].as_str()), (Some("ads"), Some("chat")));
        // An error status with no known type takes the configured code.
        let mut other = span.clone();
        other.attributes.retain(|kv| kv.key != "error.type");
        assert_eq!(event(&m, &other, &[])["error_code"], 1004);
    }

    /// Spans that are not inference requests are skipped; span names and
    /// attributes both make one.
    #[test]
    fn only_inference_spans_are_events() {
        let m = mapper(OtlpConfig::default());
        let http = Span { name: "GET /health".into(), attributes: vec![s("http.method", "GET")], ..Span::default() };
        assert_eq!(m.map(&ResourceSpan { index: 0, span: &http, resource: &[] }), Mapped::Skipped);
        let named = Span { name: "llm_request".into(), ..Span::default() };
        assert!(matches!(m.map(&ResourceSpan { index: 0, span: &named, resource: &[] }), Mapped::Event(_)));
        let tokens = Span { name: "anything".into(), attributes: vec![i("llm.token_count.prompt", 3)], ..Span::default() };
        assert!(matches!(m.map(&ResourceSpan { index: 0, span: &tokens, resource: &[] }), Mapped::Event(_)));
    }

    /// Every name the table fills is one the contract accepts.
    #[test]
    fn the_built_in_table_fills_contract_names() {
        for (field, _) in BUILT_IN {
            assert!(inferlog_schema::contract::accepts_name(field), "{field}");
        }
    }
}
