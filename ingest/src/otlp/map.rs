//! Spans to events. In: one span with its resource's attributes, and the
//! `[otlp]` config. Out: whether it is an inference request and, if so, the
//! event it stands for, in the contract's field names (what the contract
//! then validates and normalizes like any producer's event).
//!
//! The event is handed to the contract as its fields
//! ([`MappedEvent::fields`]), with no JSON text in between; its JSON
//! ([`MappedEvent::json`]) is written only for the DLQ, or where only the
//! JSON can be judged the same (an event that may be too large, an array,
//! a prompt).
//!
//! The table (docs/contract.md, "OTLP spans"): each field takes the first
//! attribute present, the span's own before its resource's, a user's
//! `[otlp.attributes]` before the built-in names. vLLM's latencies are
//! seconds and land in the contract's `_s` forms, which it converts to ms.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use inferlog_schema::normalize::PROMPT_FIELDS;
use inferlog_schema::{ErrorDictionary, FieldKey, FieldValue, Fields};
use inferlog_store::config::OtlpConfig;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::{Map, Number};

use super::decode::ResourceSpan;
use super::view::{Attribute, Value};

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
pub enum Mapped<'a> {
    /// Not an inference request: counted and skipped.
    Skipped,
    /// The event, its fields in the contract's names.
    Event(MappedEvent<'a>),
}

/// A span's event: each field and where its value comes from, in name
/// order (the order of the JSON object [`MappedEvent::json`] writes).
#[derive(Debug, Clone, PartialEq)]
pub struct MappedEvent<'a> {
    /// Every field the mapping can fill, in name order ([`Mapper::fields`]).
    names: &'a [String],
    /// Per name, how the contract files it ([`Mapper::direct`]).
    direct: &'a [Direct],
    /// Per name, its value if the span gave one.
    slots: Vec<Option<Given<'a>>>,
}

/// How a field the mapping fills reaches the contract without JSON,
/// decided once per name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direct {
    /// A key the contract knows.
    Known(FieldKey),
    /// A key it drops.
    Dropped,
    /// A prompt field: hashed from its JSON, so the event goes as JSON.
    Prompt,
}

/// One field's value: an attribute as given, or one the span implies.
#[derive(Debug, Clone, PartialEq)]
enum Given<'a> {
    /// An attribute whose value is a JSON one ([`is_json`]).
    Attribute(&'a Value<'a>),
    Text(String),
    Unsigned(u64),
    Signed(i64),
    /// `None`: not a finite number, JSON's `null`.
    Float(Option<f64>),
}

impl<'a> MappedEvent<'a> {
    /// Its fields with how each is filed, in name order.
    fn iter(&self) -> impl Iterator<Item = (&str, Direct, &Given<'a>)> {
        self.names.iter().zip(self.direct).zip(&self.slots).filter_map(|((name, direct), given)| Some((name.as_str(), *direct, given.as_ref()?)))
    }

    /// The event as the JSON object of its fields: what the DLQ keeps of
    /// a refused span, and what the contract reads when [`Self::fields`] cannot stand in.
    pub fn json(&self) -> Vec<u8> {
        let object: Map<String, serde_json::Value> = self
            .iter()
            .filter_map(|(field, _, given)| {
                let value = match given {
                    Given::Attribute(v) => as_json(v)?,
                    Given::Text(t) => serde_json::Value::String(t.clone()),
                    Given::Unsigned(u) => serde_json::Value::from(*u),
                    Given::Signed(i) => serde_json::Value::from(*i),
                    Given::Float(f) => f.and_then(Number::from_f64).map_or(serde_json::Value::Null, serde_json::Value::Number),
                };
                Some((field.to_owned(), value))
            })
            .collect();
        serde_json::to_vec(&serde_json::Value::Object(object)).unwrap_or_default()
    }

    /// Fills `fields` (empty) with the event's fields for
    /// [`inferlog_schema::Contract::normalize_fields`], which checks them
    /// exactly as it checks [`Self::json`]; `false` where only the JSON can
    /// be judged the same: the JSON may be larger than `max_event_bytes`, a
    /// field holds an array, or one is a prompt (the contract hashes those
    /// from their JSON). `fields` are filled in place: they are large to move.
    pub fn fields<'s>(&'s self, max_event_bytes: usize, fields: &mut Fields<'s>) -> bool {
        let integer = |i: i64| u64::try_from(i).map_or(FieldValue::Int(i), FieldValue::UInt);
        // An upper bound of the JSON's size: every character escaped as \uXXXX.
        let escaped = |text: &str| 6 * text.len() + 2;
        let mut bound = 2;
        for (field, direct, given) in self.iter() {
            if direct == Direct::Prompt {
                return false;
            }
            let (value, size) = match given {
                Given::Attribute(v) => match v {
                    Value::Str(s) => (FieldValue::Str(Cow::Borrowed(s)), escaped(s)),
                    Value::Bool(b) => (FieldValue::Bool(*b), 5),
                    Value::Int(i) => (integer(*i), 20),
                    Value::Double(d) => (FieldValue::Float(*d), 32),
                    Value::Array(_) | Value::Other => return false,
                },
                Given::Text(t) => (FieldValue::Str(Cow::Borrowed(t)), escaped(t)),
                Given::Unsigned(u) => (FieldValue::UInt(*u), 20),
                Given::Signed(i) => (integer(*i), 20),
                Given::Float(f) => (f.map_or(FieldValue::Null, FieldValue::Float), 32),
            };
            bound += escaped(field) + 2 + size;
            match direct {
                Direct::Known(key) => fields.insert_known(key, value),
                _ => fields.insert(field, value),
            }
        }
        bound <= max_event_bytes
    }
}

/// The `[otlp]` rule and table, ready to apply: every attribute name it
/// reads and every field it fills numbered once, so a span's attributes
/// are indexed in one pass and its event filled in place.
#[derive(Debug, Clone)]
pub struct Mapper {
    config: OtlpConfig,
    /// Each attribute name the mapping reads, to its number.
    names: HashMap<String, usize, foldhash::fast::RandomState>,
    /// Every field it can fill, in name order: a field's number is its place.
    fields: Vec<String>,
    /// Per field, how the contract files it.
    direct: Vec<Direct>,
    /// Per field, the user's names (`[otlp.attributes]`), by field name.
    user: Vec<(usize, Vec<usize>)>,
    /// Per field, the built-in names ([`BUILT_IN`]).
    built_in: Vec<(usize, Vec<usize>)>,
    /// The attributes read for the business line and `error.type`.
    business_line: usize,
    error_type: usize,
    /// The fields the span itself can fill.
    slot: Slots,
    /// Every field some unit of `total_latency`.
    total_latency: Vec<usize>,
    /// Error dictionary names to codes (for `error.type`).
    codes: BTreeMap<String, i32>,
}

/// The numbers of the fields a span fills from itself.
#[derive(Debug, Clone, Copy)]
struct Slots {
    business_line: usize,
    request_id: usize,
    timestamp: usize,
    total_latency_ms: usize,
    error_code: usize,
    error_stage: usize,
}

impl Mapper {
    pub fn new(config: OtlpConfig, dictionary: &ErrorDictionary) -> Mapper {
        let mut names = HashMap::default();
        let mut number = |name: &str| {
            let next = names.len();
            *names.entry(name.to_owned()).or_insert(next)
        };
        let mut by_field: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (attribute, field) in &config.attributes {
            by_field.entry(field.clone()).or_default().push(number(attribute));
        }
        let built_in: Vec<(&str, Vec<usize>)> = BUILT_IN.iter().map(|(field, list)| (*field, list.iter().map(|n| number(n)).collect())).collect();
        let business_line = number(&config.business_line_attribute);
        let error_type = number("error.type");
        let own = ["business_line", "request_id", "timestamp", "total_latency_ms", "error_code", "error_stage"];
        let mut fields: Vec<String> =
            by_field.keys().cloned().chain(built_in.iter().map(|(f, _)| (*f).to_owned())).chain(own.map(String::from)).collect();
        fields.sort_unstable();
        fields.dedup();
        let at = |field: &str| fields.binary_search_by(|f| f.as_str().cmp(field)).expect("every field is listed");
        let user = by_field.iter().map(|(field, list)| (at(field), list.clone())).collect();
        let built_in = built_in.into_iter().map(|(field, list)| (at(field), list)).collect();
        let [business_line_field, request_id, timestamp, total_latency_ms, error_code, error_stage] = own.map(at);
        let slot = Slots { business_line: business_line_field, request_id, timestamp, total_latency_ms, error_code, error_stage };
        let total_latency = fields
            .iter()
            .enumerate()
            .filter(|(_, f)| f.strip_prefix("total_latency").is_some_and(|rest| rest.starts_with('_')))
            .map(|(i, _)| i)
            .collect();
        let codes = dictionary.entries().iter().map(|(code, name)| (name.clone(), *code)).collect();
        let direct = fields
            .iter()
            .map(|f| match FieldKey::of(f) {
                _ if PROMPT_FIELDS.contains(&f.as_str()) => Direct::Prompt,
                Some(key) => Direct::Known(key),
                None => Direct::Dropped,
            })
            .collect();
        Mapper { config, names, fields, direct, user, built_in, business_line, error_type, slot, total_latency, codes }
    }

    /// Whether `span` is an inference request, and its event if so.
    pub fn map<'a>(&'a self, s: &ResourceSpan<'a>) -> Mapped<'a> {
        let span = s.span;
        let is_inference = self.config.span_names.iter().any(|n| n == span.name)
            || s.attributes.iter().any(|kv| self.config.match_attributes.iter().any(|m| m == kv.key));
        if !is_inference {
            return Mapped::Skipped;
        }
        // Each name's value: the span's own attribute before its
        // resource's, the first of a name within each (a first one with
        // no value hides the rest, as a search by name would).
        let found = self.index(s.attributes, s.resource);
        let at = |list: &'a [Attribute<'a>], i: u32| list.get(i as usize).map(|kv| kv.value.as_ref());
        let lookup = |name: usize| at(s.attributes, found[name].0).flatten().or_else(|| at(s.resource, found[name].1).flatten());
        let mut event: Vec<Option<Given<'a>>> = vec![None; self.fields.len()];
        // The user's names first, then the built-in ones, per field: the
        // first name present with a JSON value fills it.
        for (field, names) in self.user.iter().chain(&self.built_in) {
            if event[*field].is_none() {
                if let Some(value) = names.iter().find_map(|n| lookup(*n)).filter(|v| is_json(v)) {
                    event[*field] = Some(Given::Attribute(value));
                }
            }
        }
        let slot = self.slot;
        if let Some(line) = lookup(self.business_line).filter(|v| is_json(v)) {
            event[slot.business_line].get_or_insert(Given::Attribute(line));
        }
        if event[slot.request_id].is_none() && !span.trace_id.is_empty() {
            event[slot.request_id] = Some(Given::Text(format!("{}-{}", hex::encode(span.trace_id), hex::encode(span.span_id))));
        }
        if span.end_time_unix_nano > 0 {
            event[slot.timestamp] = Some(Given::Unsigned(span.end_time_unix_nano / 1_000_000));
        }
        let has_total_latency = self.total_latency.iter().any(|f| event[*f].is_some());
        if !has_total_latency && span.end_time_unix_nano >= span.start_time_unix_nano && span.start_time_unix_nano > 0 {
            let ms = (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e6;
            event[slot.total_latency_ms] = Some(Given::Float(Some(ms).filter(|ms| ms.is_finite())));
        }
        if event[slot.error_code].is_none() {
            let failed = span.status_code == StatusCode::Error as i32;
            let error_type = lookup(self.error_type).and_then(text);
            let code = match (failed, error_type) {
                (_, Some(kind)) => Some(self.codes.get(kind).copied().unwrap_or(self.config.error_code)),
                (true, None) => Some(self.config.error_code),
                (false, None) => None,
            };
            event[slot.error_code] = Some(Given::Signed(i64::from(code.unwrap_or(0))));
            if code.is_some() {
                event[slot.error_stage].get_or_insert_with(|| Given::Text(self.config.error_stage.clone()));
            }
        }
        Mapped::Event(MappedEvent { names: &self.fields, direct: &self.direct, slots: event })
    }

    /// Per name the mapping reads, where in the span's and in the
    /// resource's attributes it first comes (`u32::MAX`: nowhere).
    fn index(&self, span: &[Attribute<'_>], resource: &[Attribute<'_>]) -> Vec<(u32, u32)> {
        let mut found = vec![(u32::MAX, u32::MAX); self.names.len()];
        for (i, kv) in span.iter().enumerate() {
            if let Some(&n) = self.names.get(kv.key) {
                found[n].0 = found[n].0.min(i as u32);
            }
        }
        for (i, kv) in resource.iter().enumerate() {
            if let Some(&n) = self.names.get(kv.key) {
                found[n].1 = found[n].1.min(i as u32);
            }
        }
        found
    }
}

fn text<'a>(v: &Value<'a>) -> Option<&'a str> {
    match v {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

/// Whether [`as_json`] gives `v` a value (without building it).
fn is_json(v: &Value<'_>) -> bool {
    match v {
        Value::Str(_) | Value::Bool(_) | Value::Int(_) | Value::Array(_) => true,
        Value::Double(d) => d.is_finite(),
        Value::Other => false,
    }
}

/// An attribute value as JSON: scalars as they are, arrays of scalars as
/// arrays (the contract judges the type); maps, bytes and numbers JSON
/// cannot hold are left out.
fn as_json(v: &Value<'_>) -> Option<serde_json::Value> {
    Some(match v {
        Value::Str(s) => serde_json::Value::String((*s).to_owned()),
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Int(i) => serde_json::Value::from(*i),
        Value::Double(d) => serde_json::Value::Number(Number::from_f64(*d)?),
        Value::Array(a) => serde_json::Value::Array(a.iter().filter_map(as_json).collect()),
        // Maps, bytes and dictionary references (profiles only) are not event fields.
        Value::Other => return None,
    })
}

#[cfg(test)]
mod tests {
    use inferlog_schema::{Contract, ContractConfig};
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, TracesData};
    use serde_json::Value;

    use super::*;
    use crate::otlp::view;

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

    /// `read` of what `m` maps `span` of `resource` to.
    fn mapped<R>(m: &Mapper, span: &Span, resource: &[KeyValue], read: impl FnOnce(Mapped<'_>) -> R) -> R {
        let traces = TracesData {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource { attributes: resource.to_vec(), ..Resource::default() }),
                scope_spans: vec![ScopeSpans { spans: vec![span.clone()], ..ScopeSpans::default() }],
                ..ResourceSpans::default()
            }],
        };
        let traces = view::Traces::of(&traces);
        let s = crate::otlp::spans(&traces).next().expect("one span");
        read(m.map(&s))
    }

    fn event(m: &Mapper, span: &Span, resource: &[KeyValue]) -> Map<String, Value> {
        mapped(m, span, resource, |mapped| match mapped {
            Mapped::Event(e) => serde_json::from_slice(&e.json()).expect("object"),
            Mapped::Skipped => panic!("{} was skipped", span.name),
        })
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
        assert!(mapped(&m, &http, &[], |e| e == Mapped::Skipped));
        let named = Span { name: "llm_request".into(), ..Span::default() };
        assert!(mapped(&m, &named, &[], |e| matches!(e, Mapped::Event(_))));
        let tokens = Span { name: "anything".into(), attributes: vec![i("llm.token_count.prompt", 3)], ..Span::default() };
        assert!(mapped(&m, &tokens, &[], |e| matches!(e, Mapped::Event(_))));
    }

    /// Every name the table fills is one the contract accepts.
    #[test]
    fn the_built_in_table_fills_contract_names() {
        for (field, _) in BUILT_IN {
            assert!(inferlog_schema::contract::accepts_name(field), "{field}");
        }
    }

    /// The contract judges a span's fields exactly as it judges their JSON:
    /// the same event and dropped fields, or the same reason, field and
    /// message, over spans whose attributes producers get wrong in every
    /// way the contract checks (types, signs, NaN, arrays, aliases given
    /// twice, units that disagree, unknown names, prompts, long strings).
    mod direct_equals_json {
        use proptest::prelude::*;

        use super::*;

        /// Attribute names a span may carry: built-in ones, a user's, and others.
        const NAMES: [&str; 16] = [
            "gen_ai.request.id",
            "gen_ai.response.model",
            "service.version",
            "gen_ai.usage.prompt_tokens",
            "gen_ai.usage.completion_tokens",
            "gen_ai.latency.e2e",
            "gen_ai.latency.time_to_first_token",
            "gen_ai.request.max_tokens",
            "inferlog.business_line",
            "inferlog.error_code",
            "user.id",
            "acme.latency_ms",
            "acme.model",
            "acme.prompt",
            "acme.unknown",
            "error.type",
        ];

        fn value() -> impl Strategy<Value = any_value::Value> {
            prop_oneof![
                "[a-z0-9 é-]{0,12}".prop_map(any_value::Value::StringValue),
                Just(any_value::Value::StringValue("x".repeat(300))),
                (-5i64..5_000).prop_map(any_value::Value::IntValue),
                any::<i64>().prop_map(any_value::Value::IntValue),
                (-1.0f64..10.0).prop_map(any_value::Value::DoubleValue),
                Just(any_value::Value::DoubleValue(f64::NAN)),
                any::<bool>().prop_map(any_value::Value::BoolValue),
                Just(any_value::Value::ArrayValue(Default::default())),
                Just(any_value::Value::BytesValue(vec![1, 2])),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]
            #[test]
            fn the_contract_judges_fields_as_their_json(
                attributes in proptest::collection::vec((0..NAMES.len(), value()), 0..12),
                ids: bool,
                start_ms in 0u64..3_000,
                error: bool,
                small_limit: bool,
            ) {
                let config = OtlpConfig {
                    attributes: BTreeMap::from([
                        ("acme.latency_ms".into(), "total_latency_ms".into()),
                        ("acme.model".into(), "gen_ai.request.model".into()),
                        ("acme.prompt".into(), "prompt".into()),
                        ("acme.unknown".into(), "colour".into()),
                    ]),
                    ..OtlpConfig::default()
                };
                let m = mapper(config);
                let span = Span {
                    name: "llm_request".into(),
                    trace_id: if ids { vec![0xab; 16] } else { Vec::new() },
                    span_id: vec![0xcd; 8],
                    start_time_unix_nano: if start_ms == 0 { 0 } else { END - start_ms * 1_000_000 },
                    end_time_unix_nano: END,
                    // The random attributes first (the first of a name is the one
                    // read), then a valid vLLM request's, so that most events
                    // get past the required fields to the checks further on.
                    attributes: attributes
                        .iter()
                        .map(|(n, v)| kv(NAMES[*n], v.clone()))
                        .chain(vllm_span().attributes)
                        .chain([s("service.version", "v1"), s("inferlog.business_line", "search")])
                        .collect(),
                    status: error.then(|| Status { code: StatusCode::Error as i32, message: String::new() }),
                    ..Span::default()
                };
                let contract_config = ContractConfig { max_event_bytes: if small_limit { 300 } else { 65_536 }, ..ContractConfig::default() };
                let contract = Contract::new(&contract_config).expect("contract");
                let hasher = inferlog_schema::UserIdHasher::new(b"otlp-map-test-key-0123456789abcdef", None, "t").expect("key");
                mapped(&m, &span, &[], |mapped| {
                    let Mapped::Event(event) = mapped else { panic!("an inference span") };
                    let json = contract.normalize(&event.json(), Some(1_796_119_300_000), &hasher);
                    let mut fields = Fields::default();
                    if event.fields(contract_config.max_event_bytes, &mut fields) {
                        let direct = contract.normalize_fields(&mut fields, Some(1_796_119_300_000), &hasher);
                        prop_assert_eq!(direct, json);
                    }
                    Ok(())
                })?;
            }
        }

        /// The direct path is the one taken: only a prompt, an array or a
        /// possibly oversized event goes through the JSON.
        #[test]
        fn fields_stand_in_for_the_json_unless_it_must_be_read() {
            let m = mapper(OtlpConfig { attributes: BTreeMap::from([("acme.prompt".into(), "prompt".into())]), ..OtlpConfig::default() });
            let direct = |span: &Span, limit: usize| {
                mapped(&m, span, &[], |mapped| match mapped {
                    Mapped::Event(e) => e.fields(limit, &mut Fields::default()),
                    Mapped::Skipped => panic!("skipped"),
                })
            };
            assert!(direct(&vllm_span(), 65_536));
            assert!(!direct(&vllm_span(), 100), "may be larger than the limit: the JSON decides");
            let mut prompt = vllm_span();
            prompt.attributes.push(s("acme.prompt", "hello"));
            assert!(!direct(&prompt, 65_536), "a prompt is hashed from its JSON");
            let mut array = vllm_span();
            array.attributes.push(kv("gen_ai.request.id", any_value::Value::ArrayValue(Default::default())));
            array.attributes.retain(|a| {
                !(a.key == "gen_ai.request.id" && matches!(a.value.as_ref().and_then(|v| v.value.as_ref()), Some(any_value::Value::StringValue(_))))
            });
            assert!(!direct(&array, 65_536));
        }
    }
}
