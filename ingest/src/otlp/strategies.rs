//! Random OTLP traces for the readers' conformance tests (protobuf and
//! OTLP/JSON against `opentelemetry-proto`): every kind of value, nested
//! arrays, key-value lists and bytes, spans with events, scopes and
//! statuses, resources with and without attributes.

use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue, KeyValueList};
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span as ProtoSpan, Status, TracesData};
use proptest::prelude::*;

pub(crate) fn any_value() -> impl Strategy<Value = AnyValue> {
    let leaf = prop_oneof![
        "[a-zé ]{0,8}".prop_map(any_value::Value::StringValue),
        any::<bool>().prop_map(any_value::Value::BoolValue),
        any::<i64>().prop_map(any_value::Value::IntValue),
        any::<f64>().prop_map(any_value::Value::DoubleValue),
        prop::collection::vec(any::<u8>(), 0..4).prop_map(any_value::Value::BytesValue),
        Just(any_value::Value::KvlistValue(KeyValueList { values: vec![KeyValue { key: "k".into(), ..KeyValue::default() }] })),
    ]
    .prop_map(|v| AnyValue { value: Some(v) });
    let leaf = prop_oneof![8 => leaf, 1 => Just(AnyValue { value: None })];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(|values| AnyValue { value: Some(any_value::Value::ArrayValue(ArrayValue { values })) })
    })
}

pub(crate) fn attributes() -> impl Strategy<Value = Vec<KeyValue>> {
    let kv = ("[a-z.]{1,6}", prop::option::weighted(0.9, any_value())).prop_map(|(key, value)| KeyValue { key, value, ..KeyValue::default() });
    prop::collection::vec(kv, 0..6)
}

pub(crate) fn spans() -> impl Strategy<Value = Vec<ProtoSpan>> {
    let span = (attributes(), any::<u64>(), any::<u64>(), prop::option::of(0..3i32), "[a-z_]{0,8}", prop::collection::vec(any::<u8>(), 0..17))
        .prop_map(|(attributes, start, end, status, name, id)| ProtoSpan {
            trace_id: id.clone(),
            span_id: id.into_iter().take(8).collect(),
            trace_state: "k=v".into(),
            name,
            kind: 2,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes,
            events: vec![span::Event { name: "token".into(), ..span::Event::default() }],
            status: status.map(|code| Status { code, message: "m".into() }),
            flags: 1,
            ..ProtoSpan::default()
        });
    prop::collection::vec(span, 0..4)
}

pub(crate) fn traces() -> impl Strategy<Value = TracesData> {
    let scope = spans().prop_map(|spans| ScopeSpans {
        scope: Some(InstrumentationScope { name: "vllm".into(), ..Default::default() }),
        spans,
        schema_url: "u".into(),
    });
    let rs = (prop::option::of(attributes()), prop::collection::vec(scope, 0..3)).prop_map(|(attributes, scope_spans)| ResourceSpans {
        resource: attributes.map(|attributes| ProtoResource { attributes, ..ProtoResource::default() }),
        scope_spans,
        schema_url: String::new(),
    });
    prop::collection::vec(rs, 0..3).prop_map(|resource_spans| TracesData { resource_spans })
}
