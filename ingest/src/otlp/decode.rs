//! OTLP decoding. In: the payload of one Kafka message of a topic encoded
//! as `otlp_proto` or `otlp_json` (what the OpenTelemetry Collector's Kafka
//! exporter writes: one `ExportTraceServiceRequest`, the same bytes as
//! `TracesData`). Out: its spans in message order, each with its resource's
//! attributes, or an `otlp.malformed` rejection for the whole message.
//!
//! Protobuf is read in place ([`super::wire`]), OTLP/JSON straight into the
//! same view ([`super::json`], with `opentelemetry-proto`'s serde mapping:
//! hex trace and span ids, 64-bit integers as strings); a JSON message that
//! reader leaves (a `bytesValue`, an object written as an array, or an
//! error) is decoded into `opentelemetry-proto`'s messages, whose verdict
//! and error stand, and viewed the same way.

use inferlog_schema::{ReasonCode, Rejection};
use inferlog_store::kafka::TopicEncoding;
use opentelemetry_proto::tonic::trace::v1::TracesData;

use super::view::{Attribute, Span, Traces};
use super::wire;

/// One span of a message, its attributes, and those of the resource that
/// sent it.
#[derive(Debug)]
pub struct ResourceSpan<'a> {
    /// Its place among all the message's spans, from 0.
    pub index: u32,
    pub span: &'a Span<'a>,
    pub attributes: &'a [Attribute<'a>],
    pub resource: &'a [Attribute<'a>],
}

/// Decodes a message's payload in `encoding` (an OTLP one) and hands its
/// traces to `read`.
pub fn decode<R>(payload: &[u8], encoding: TopicEncoding, read: impl FnOnce(&Traces<'_>) -> R) -> Result<R, Rejection> {
    let malformed = |what: &str, e: &dyn std::fmt::Display| Rejection::whole_event(ReasonCode::OtlpMalformed, format!("not {what}: {e}"));
    match encoding {
        TopicEncoding::OtlpProto => wire::decode(payload).map(|t| read(&t)).map_err(|e| malformed("OTLP protobuf traces", &e)),
        TopicEncoding::OtlpJson => {
            let arena = bumpalo::Bump::new();
            match super::json::read(payload, &arena) {
                Ok(traces) => Ok(read(&traces)),
                Err(_) => serde_json::from_slice::<TracesData>(payload).map(|t| read(&Traces::of(&t))).map_err(|e| malformed("OTLP/JSON traces", &e)),
            }
        }
        TopicEncoding::Json => Err(Rejection::whole_event(ReasonCode::OtlpMalformed, "a JSON topic holds events, not OTLP")),
    }
}

/// Every span of `traces`, in message order.
pub fn spans<'a>(traces: &'a Traces<'a>) -> impl Iterator<Item = ResourceSpan<'a>> {
    traces.resources.iter().flat_map(move |r| {
        traces.spans[r.spans.clone()].iter().zip(r.spans.clone()).map(move |(span, i)| ResourceSpan {
            index: i as u32,
            span,
            attributes: &traces.attributes[span.attributes.clone()],
            resource: &r.attributes,
        })
    })
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message as _;

    use crate::otlp::view::Value;

    use super::*;

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue { key: key.into(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }), ..KeyValue::default() }
    }

    fn traces() -> TracesData {
        let span = |name: &str| Span { name: name.into(), trace_id: vec![1; 16], span_id: vec![2; 8], ..Span::default() };
        let resource = |service: &str| Some(Resource { attributes: vec![kv("service.name", service)], ..Resource::default() });
        TracesData {
            resource_spans: vec![
                ResourceSpans {
                    resource: resource("a"),
                    scope_spans: vec![
                        ScopeSpans { spans: vec![span("a0"), span("a1")], ..ScopeSpans::default() },
                        ScopeSpans { spans: vec![span("a2")], ..ScopeSpans::default() },
                    ],
                    ..ResourceSpans::default()
                },
                ResourceSpans {
                    resource: resource("b"),
                    scope_spans: vec![ScopeSpans { spans: vec![span("b0")], ..ScopeSpans::default() }],
                    ..ResourceSpans::default()
                },
            ],
        }
    }

    /// Spans come in message order, numbered across resources and scopes,
    /// each with its own resource's attributes.
    #[test]
    fn spans_are_numbered_in_message_order_with_their_resource() {
        let t = traces();
        let t = Traces::of(&t);
        let got: Vec<(u32, String, String)> = spans(&t)
            .map(|s| {
                let service = s.resource.iter().find(|k| k.key == "service.name").and_then(|k| k.value.clone());
                let Some(Value::Str(service)) = service else { panic!("service.name") };
                (s.index, s.span.name.to_owned(), service.to_owned())
            })
            .collect();
        let want = [(0, "a0", "a"), (1, "a1", "a"), (2, "a2", "a"), (3, "b0", "b")];
        assert_eq!(got, want.map(|(i, n, s)| (i, n.to_owned(), s.to_owned())).to_vec());
    }

    /// Both encodings of the Collector decode to the same spans; bytes of
    /// the other kind are `otlp.malformed`.
    #[test]
    fn both_encodings_decode_and_garbage_is_malformed() {
        let t = traces();
        let want = format!("{:?}", Traces::of(&t));
        let proto = t.encode_to_vec();
        assert_eq!(decode(&proto, TopicEncoding::OtlpProto, |t| format!("{t:?}")).expect("proto"), want);
        let json = serde_json::to_vec(&t).expect("json");
        assert!(String::from_utf8_lossy(&json).contains("\"traceId\":\"01010101010101010101010101010101\""), "hex ids");
        assert_eq!(decode(&json, TopicEncoding::OtlpJson, |t| format!("{t:?}")).expect("json"), want);
        let e = decode(b"{\"request_id\":", TopicEncoding::OtlpJson, |_| ()).expect_err("not OTLP/JSON");
        assert_eq!(e.reason, ReasonCode::OtlpMalformed);
        let e = decode(&[0xff, 0xff, 0xff], TopicEncoding::OtlpProto, |_| ()).expect_err("not protobuf");
        assert_eq!((e.reason, e.field.as_str()), (ReasonCode::OtlpMalformed, "-"));
    }
}
