//! The parts of an OTLP traces message the mapping reads, borrowed from
//! wherever the message was decoded: the protobuf payload itself
//! ([`super::wire`]) or `opentelemetry-proto`'s messages (OTLP/JSON,
//! through [`Traces::of`]). In: a decoded message. Out: per resource,
//! its attributes and its spans' ids, name, times, attributes and status.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use std::ops::Range;

use opentelemetry_proto::tonic::trace::v1::TracesData;

/// A message's resources, its spans (each resource's in one range, its
/// scopes flattened, in message order) and the spans' attributes (each
/// span's in one range).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traces<'a> {
    pub resources: Vec<Resource<'a>>,
    pub spans: Vec<Span<'a>>,
    pub attributes: Vec<Attribute<'a>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resource<'a> {
    pub attributes: Vec<Attribute<'a>>,
    /// Its spans in [`Traces::spans`].
    pub spans: Range<usize>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Span<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub name: &'a str,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    /// Its attributes in [`Traces::attributes`].
    pub attributes: Range<usize>,
    /// `Status.code` (0, unset, without a status).
    pub status_code: i32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attribute<'a> {
    pub key: &'a str,
    /// `None`: the key-value carries no `AnyValue` at all.
    pub value: Option<Value<'a>>,
}

/// An attribute's value: the kinds an event field can hold, and `Other`
/// for the rest (maps, bytes, dictionary references, or none set).
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
    Double(f64),
    Array(Vec<Value<'a>>),
    Other,
}

impl<'a> Traces<'a> {
    /// The view of `opentelemetry-proto`'s message.
    pub fn of(traces: &'a TracesData) -> Traces<'a> {
        let mut view = Traces::default();
        for rs in &traces.resource_spans {
            let first = view.spans.len();
            for s in rs.scope_spans.iter().flat_map(|ss| &ss.spans) {
                let from = view.attributes.len();
                view.attributes.extend(attributes(&s.attributes));
                view.spans.push(Span {
                    trace_id: &s.trace_id,
                    span_id: &s.span_id,
                    name: &s.name,
                    start_time_unix_nano: s.start_time_unix_nano,
                    end_time_unix_nano: s.end_time_unix_nano,
                    attributes: from..view.attributes.len(),
                    status_code: s.status.as_ref().map_or(0, |st| st.code),
                });
            }
            let attributes = rs.resource.as_ref().map_or_else(Vec::new, |r| attributes(&r.attributes).collect());
            view.resources.push(Resource { attributes, spans: first..view.spans.len() });
        }
        view
    }
}

/// Key-values as the view holds them.
fn attributes(kvs: &[KeyValue]) -> impl Iterator<Item = Attribute<'_>> {
    kvs.iter().map(|kv| Attribute { key: &kv.key, value: kv.value.as_ref().map(value) })
}

fn value(v: &AnyValue) -> Value<'_> {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => Value::Str(s),
        Some(any_value::Value::BoolValue(b)) => Value::Bool(*b),
        Some(any_value::Value::IntValue(i)) => Value::Int(*i),
        Some(any_value::Value::DoubleValue(d)) => Value::Double(*d),
        Some(any_value::Value::ArrayValue(a)) => Value::Array(a.values.iter().map(value).collect()),
        Some(any_value::Value::KvlistValue(_) | any_value::Value::BytesValue(_) | any_value::Value::StringValueStrindex(_)) | None => Value::Other,
    }
}
