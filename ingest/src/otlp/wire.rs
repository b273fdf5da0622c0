//! OTLP protobuf, read in place. In: the payload of an `otlp_proto`
//! message (`TracesData`). Out: its [`Traces`] view, every string and id
//! borrowed from the payload: no allocation per attribute, which is most
//! of what decoding into `opentelemetry-proto`'s owned messages costs.
//!
//! It reads as `prost` does what the mapping uses: the same wire types,
//! last value wins for a field given twice, a message given twice merged,
//! UTF-8 checked, the same nesting limit (100). Nested messages the
//! mapping does not read (a scope, events, links, key-value lists) are
//! skipped without being parsed, so damage inside them does not cost the
//! span its event.

use super::view::{Attribute, Resource, Span, Traces, Value};

/// Why a payload is not OTLP protobuf.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(&'static str);

type Result<T> = std::result::Result<T, WireError>;

/// prost's nesting limit.
const RECURSION_LIMIT: u32 = 100;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// Decodes `payload` as `TracesData`.
pub fn decode(payload: &[u8]) -> Result<Traces<'_>> {
    // Room for what a span of a vLLM fleet takes (some 400 bytes, of which
    // a dozen attributes), so the lists seldom grow.
    let mut traces =
        Traces { resources: Vec::new(), spans: Vec::with_capacity(payload.len() / 256), attributes: Vec::with_capacity(payload.len() / 24) };
    let mut r = Reader { buf: payload, depth: 0, traces: &mut traces };
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => {
                let resource = r.message(wire, resource_spans)?;
                r.traces.resources.push(resource);
            }
            _ => r.skip(tag, wire)?,
        }
    }
    Ok(traces)
}

/// The bytes left of one message, how deep it is nested, and the traces
/// its spans and their attributes are added to.
struct Reader<'a, 'o> {
    buf: &'a [u8],
    depth: u32,
    traces: &'o mut Traces<'a>,
}

impl<'a> Reader<'a, '_> {
    #[inline]
    fn varint(&mut self) -> Result<u64> {
        // Most are one byte: every key, most lengths.
        if let Some((&byte, rest)) = self.buf.split_first() {
            if byte < 0x80 {
                self.buf = rest;
                return Ok(u64::from(byte));
            }
        }
        let mut value = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.buf.split_first().ok_or(WireError("a varint runs past the end"))?;
            self.buf = rest;
            if i == 9 && byte > 1 {
                return Err(WireError("a varint longer than 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(WireError("a varint longer than 64 bits"))
    }

    /// The next field's tag and wire type; `None` at the end.
    #[inline]
    fn key(&mut self) -> Result<Option<(u32, u8)>> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| WireError("a field key beyond 32 bits"))?;
        let wire = (key & 7) as u8;
        if wire > FIXED32 {
            return Err(WireError("an unknown wire type"));
        }
        if key >> 3 == 0 {
            return Err(WireError("a field numbered 0"));
        }
        Ok(Some((key >> 3, wire)))
    }

    #[inline]
    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let n = usize::try_from(n).ok().filter(|n| *n <= self.buf.len()).ok_or(WireError("a field runs past the end"))?;
        let (taken, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(taken)
    }

    fn expect(wire: u8, want: u8) -> Result<()> {
        if wire == want {
            Ok(())
        } else {
            Err(WireError("a field of the wrong wire type"))
        }
    }

    #[inline]
    fn bytes(&mut self, wire: u8) -> Result<&'a [u8]> {
        Self::expect(wire, LEN)?;
        let n = self.varint()?;
        self.take(n)
    }

    #[inline]
    fn string(&mut self, wire: u8) -> Result<&'a str> {
        std::str::from_utf8(self.bytes(wire)?).map_err(|_| WireError("a string that is not UTF-8"))
    }

    #[inline]
    fn fixed64(&mut self, wire: u8) -> Result<u64> {
        Self::expect(wire, FIXED64)?;
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    #[inline]
    fn scalar(&mut self, wire: u8) -> Result<u64> {
        Self::expect(wire, VARINT)?;
        self.varint()
    }

    /// A nested message, read by `read` into a fresh value. (`read` is a
    /// type parameter, not a function pointer, so that it is inlined.)
    #[inline]
    fn message<T: Default>(&mut self, wire: u8, read: impl FnOnce(&mut Reader<'a, '_>, &mut T) -> Result<()>) -> Result<T> {
        let mut value = T::default();
        self.merge(wire, &mut value, read)?;
        Ok(value)
    }

    /// A nested message, read by `read` into `value` (a message given
    /// twice is merged, as protobuf says).
    #[inline]
    fn merge<T>(&mut self, wire: u8, value: &mut T, read: impl FnOnce(&mut Reader<'a, '_>, &mut T) -> Result<()>) -> Result<()> {
        if self.depth >= RECURSION_LIMIT {
            return Err(WireError("messages nested too deep"));
        }
        let buf = self.bytes(wire)?;
        read(&mut Reader { buf, depth: self.depth + 1, traces: &mut *self.traces }, value)
    }

    /// A `KeyValue`: the common shape read straight off the bytes
    /// ([`plain_key_value`]), any other through [`key_value`].
    #[inline]
    fn attribute(&mut self, wire: u8) -> Result<Attribute<'a>> {
        if wire == LEN {
            let whole = self.buf;
            let n = self.varint()?;
            if let Some(attribute) = self.take(n).ok().and_then(plain_key_value) {
                return Ok(attribute);
            }
            self.buf = whole;
        }
        self.message(wire, key_value)
    }

    /// A field the mapping does not read.
    fn skip(&mut self, tag: u32, wire: u8) -> Result<()> {
        if self.depth >= RECURSION_LIMIT {
            return Err(WireError("messages nested too deep"));
        }
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            FIXED32 => self.take(4).map(drop),
            LEN => self.bytes(wire).map(drop),
            START_GROUP => loop {
                let (inner, inner_wire) = self.key()?.ok_or(WireError("a group without its end"))?;
                if inner_wire == END_GROUP {
                    break if inner == tag { Ok(()) } else { Err(WireError("a group ended by another tag")) };
                }
                self.depth += 1;
                let skipped = self.skip(inner, inner_wire);
                self.depth -= 1;
                skipped?;
            },
            _ => Err(WireError("a group end without its start")),
        }
    }

    /// A known field the mapping does not read: its wire type checked, a
    /// string's UTF-8 too.
    fn known(&mut self, wire: u8, want: u8, utf8: bool) -> Result<()> {
        Self::expect(wire, want)?;
        match want {
            LEN if utf8 => self.string(wire).map(drop),
            LEN => self.bytes(wire).map(drop),
            VARINT => self.varint().map(drop),
            FIXED32 => self.take(4).map(drop),
            _ => self.take(8).map(drop),
        }
    }
}

fn resource_spans<'a>(r: &mut Reader<'a, '_>, out: &mut Resource<'a>) -> Result<()> {
    let first = r.traces.spans.len();
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => r.merge(wire, &mut out.attributes, resource)?,
            2 => r.merge(wire, &mut (), scope_spans)?,
            3 => r.known(wire, LEN, true)?,
            _ => r.skip(tag, wire)?,
        }
    }
    out.spans = first..r.traces.spans.len();
    Ok(())
}

/// A `Resource`: its attributes (the rest is not read).
fn resource<'a>(r: &mut Reader<'a, '_>, attributes: &mut Vec<Attribute<'a>>) -> Result<()> {
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => attributes.push(r.attribute(wire)?),
            2 => r.known(wire, VARINT, false)?,
            3 => r.known(wire, LEN, false)?,
            _ => r.skip(tag, wire)?,
        }
    }
    Ok(())
}

/// A `ScopeSpans`: its spans, added to the traces' (the scope is not read).
fn scope_spans(r: &mut Reader<'_, '_>, _: &mut ()) -> Result<()> {
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => r.known(wire, LEN, false)?,
            2 => {
                let span = r.message(wire, span)?;
                r.traces.spans.push(span);
            }
            3 => r.known(wire, LEN, true)?,
            _ => r.skip(tag, wire)?,
        }
    }
    Ok(())
}

fn span<'a>(r: &mut Reader<'a, '_>, s: &mut Span<'a>) -> Result<()> {
    let first = r.traces.attributes.len();
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => s.trace_id = r.bytes(wire)?,
            2 => s.span_id = r.bytes(wire)?,
            3 => r.known(wire, LEN, true)?,
            4 | 11 | 13 => r.known(wire, LEN, false)?,
            5 => s.name = r.string(wire)?,
            6 | 10 | 12 | 14 => r.known(wire, VARINT, false)?,
            7 => s.start_time_unix_nano = r.fixed64(wire)?,
            8 => s.end_time_unix_nano = r.fixed64(wire)?,
            9 => {
                let attribute = r.attribute(wire)?;
                r.traces.attributes.push(attribute);
            }
            15 => r.merge(wire, &mut s.status_code, status)?,
            16 => r.known(wire, FIXED32, false)?,
            _ => r.skip(tag, wire)?,
        }
    }
    s.attributes = first..r.traces.attributes.len();
    Ok(())
}

fn status(r: &mut Reader<'_, '_>, code: &mut i32) -> Result<()> {
    while let Some((tag, wire)) = r.key()? {
        match tag {
            2 => r.known(wire, LEN, true)?,
            3 => *code = r.scalar(wire)? as i32,
            _ => r.skip(tag, wire)?,
        }
    }
    Ok(())
}

/// A `KeyValue` of the shape every SDK writes — its key, then an
/// `AnyValue` holding one string, bool, int or double, each length under
/// 128 — read without a reader per nested message: what [`key_value`]
/// reads from the same bytes. `None` for any other shape, or anything
/// [`key_value`] would refuse (it then reads, or refuses, them itself).
#[inline]
fn plain_key_value(b: &[u8]) -> Option<Attribute<'_>> {
    // Field 1 (the key, length-delimited), then field 2 (the value).
    let [0x0a, key_len, rest @ ..] = b else { return None };
    let (key, rest) = rest.split_at_checked(usize::from(*key_len).min(0x80))?;
    let [0x12, value_len, value @ ..] = rest else { return None };
    if *key_len >= 0x80 || *value_len >= 0x80 || value.len() != usize::from(*value_len) {
        return None;
    }
    let value = match value {
        // string_value: its length is the rest.
        [0x0a, len, text @ ..] if usize::from(*len) == text.len() && *len < 0x80 => Value::Str(std::str::from_utf8(text).ok()?),
        // bool_value: a one-byte varint.
        [0x10, v] if *v < 0x80 => Value::Bool(*v != 0),
        // int_value: a varint that is the rest.
        [0x18, v @ ..] => Value::Int(whole_varint(v)? as i64),
        // double_value: eight bytes.
        [0x21, v @ ..] => Value::Double(f64::from_le_bytes(v.try_into().ok()?)),
        _ => return None,
    };
    Some(Attribute { key: std::str::from_utf8(key).ok()?, value: Some(value) })
}

/// `b` as one varint that ends with its last byte, in at most 64 bits.
#[inline]
fn whole_varint(b: &[u8]) -> Option<u64> {
    let (last, init) = b.split_last()?;
    if *last >= 0x80 || b.len() > 10 || (b.len() == 10 && *last > 1) || init.iter().any(|x| *x < 0x80) {
        return None;
    }
    Some(b.iter().enumerate().fold(0u64, |value, (i, byte)| value | u64::from(byte & 0x7f) << (7 * i)))
}

fn key_value<'a>(r: &mut Reader<'a, '_>, kv: &mut Attribute<'a>) -> Result<()> {
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => kv.key = r.string(wire)?,
            2 => r.merge(wire, kv.value.get_or_insert(Value::Other), any_value)?,
            3 => r.known(wire, VARINT, false)?,
            _ => r.skip(tag, wire)?,
        }
    }
    Ok(())
}

/// An `AnyValue`: its one value, the last given (an array given twice is
/// merged, as protobuf merges a message).
fn any_value<'a>(r: &mut Reader<'a, '_>, value: &mut Value<'a>) -> Result<()> {
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => *value = Value::Str(r.string(wire)?),
            2 => *value = Value::Bool(r.scalar(wire)? != 0),
            3 => *value = Value::Int(r.scalar(wire)? as i64),
            4 => *value = Value::Double(f64::from_bits(r.fixed64(wire)?)),
            5 => {
                if !matches!(value, Value::Array(_)) {
                    *value = Value::Array(Vec::new());
                }
                let Value::Array(values) = value else { unreachable!("just set") };
                r.merge(wire, values, array)?;
            }
            6 | 7 => {
                r.known(wire, LEN, false)?;
                *value = Value::Other;
            }
            8 => {
                r.scalar(wire)?;
                *value = Value::Other;
            }
            _ => r.skip(tag, wire)?,
        }
    }
    Ok(())
}

fn array<'a>(r: &mut Reader<'a, '_>, values: &mut Vec<Value<'a>>) -> Result<()> {
    while let Some((tag, wire)) = r.key()? {
        match tag {
            1 => {
                let mut value = Value::Other;
                r.merge(wire, &mut value, any_value)?;
                values.push(value);
            }
            _ => r.skip(tag, wire)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as ProtoSpan, Status, TracesData};
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;
    use crate::otlp::strategies::traces;

    /// What prost makes of `bytes`, viewed: `None` where it refuses them.
    fn by_prost(bytes: &[u8]) -> Option<String> {
        TracesData::decode(bytes).ok().map(|t| format!("{:?}", Traces::of(&t)))
    }

    fn by_wire(bytes: &[u8]) -> Option<String> {
        decode(bytes).ok().map(|t| format!("{t:?}"))
    }

    /// `inner` as field `tag`, length-delimited.
    fn wrap(tag: u32, inner: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(inner.len() as u64, &mut out);
        out.extend(inner);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        /// Read in place, a message gives exactly what prost's decoding
        /// gives; cut anywhere, it is refused exactly where prost refuses
        /// it; damaged, what prost reads is read the same (damage inside a
        /// part the mapping does not read may be let through).
        #[test]
        fn the_payload_reads_as_prost_reads_it(t in traces(), cut in any::<prop::sample::Index>(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let bytes = t.encode_to_vec();
            prop_assert_eq!(by_wire(&bytes), Some(format!("{:?}", Traces::of(&t))));
            if !bytes.is_empty() {
                let short = &bytes[..cut.index(bytes.len())];
                prop_assert_eq!(by_wire(short), by_prost(short), "cut at {}", short.len());
                let mut damaged = bytes.clone();
                damaged[at.index(bytes.len())] = byte;
                if let Some(read) = by_prost(&damaged) {
                    prop_assert_eq!(by_wire(&damaged), Some(read));
                }
            }
        }
    }

    /// A field given twice: the last scalar wins, messages merge (a
    /// second resource's attributes and a second array's values are
    /// added), as prost decodes them.
    #[test]
    fn fields_given_twice_merge_as_prost_merges_them() {
        let kv = |key: &str, v: any_value::Value| KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), ..KeyValue::default() };
        let array = |v: i64| any_value::Value::ArrayValue(ArrayValue { values: vec![AnyValue { value: Some(any_value::Value::IntValue(v)) }] });
        let one = TracesData {
            resource_spans: vec![ResourceSpans {
                resource: Some(ProtoResource { attributes: vec![kv("a", array(1))], ..ProtoResource::default() }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![ProtoSpan { name: "first".into(), status: Some(Status { code: 2, message: String::new() }), ..ProtoSpan::default() }],
                    ..ScopeSpans::default()
                }],
                schema_url: String::new(),
            }],
        };
        let two = TracesData {
            resource_spans: vec![ResourceSpans {
                resource: Some(ProtoResource { attributes: vec![kv("b", any_value::Value::StringValue("x".into()))], ..ProtoResource::default() }),
                scope_spans: vec![],
                schema_url: String::new(),
            }],
        };
        // Concatenated messages merge: the repeated resource_spans add up.
        let mut bytes = one.encode_to_vec();
        bytes.extend(two.encode_to_vec());
        assert_eq!(by_wire(&bytes), by_prost(&bytes));
        // A resource given twice, a span's fields given twice.
        let rs = &one.resource_spans[0];
        let mut rs_bytes = rs.encode_to_vec();
        rs_bytes.extend(ResourceSpans { resource: two.resource_spans[0].resource.clone(), ..ResourceSpans::default() }.encode_to_vec());
        let mut twice = rs.scope_spans[0].spans[0].encode_to_vec();
        let second = ProtoSpan {
            name: "second".into(),
            attributes: vec![kv("a", array(2)), kv("a", any_value::Value::BoolValue(true))],
            status: Some(Status { code: 1, message: String::new() }),
            ..ProtoSpan::default()
        };
        twice.extend(second.encode_to_vec());
        rs_bytes.extend(wrap(2, &wrap(2, &twice)));
        let message = wrap(1, &rs_bytes);
        let read = by_wire(&message).expect("valid");
        assert_eq!(Some(read.clone()), by_prost(&message));
        assert!(read.contains("name: \"second\"") && read.contains("key: \"b\"") && read.contains("status_code: 1"), "{read}");
        // A key-value whose value comes twice, an array both times.
        let mut kv_bytes = kv("k", array(1)).encode_to_vec();
        kv_bytes.extend(wrap(2, &AnyValue { value: Some(array(2)) }.encode_to_vec()));
        let mut span_bytes = ProtoSpan { name: "s".into(), ..ProtoSpan::default() }.encode_to_vec();
        span_bytes.extend(wrap(9, &kv_bytes));
        let message = wrap(1, &wrap(2, &wrap(2, &span_bytes)));
        let read = by_wire(&message).expect("valid");
        assert_eq!(Some(read.clone()), by_prost(&message));
        assert!(read.contains("Array([Int(1), Int(2)])"), "{read}");
    }

    /// The common key-value shapes are read straight off the bytes, and
    /// read as the general reader reads them; the others are left to it.
    #[test]
    fn plain_key_values_are_read_directly_and_as_the_reader_reads_them() {
        let kv = |key: &str, v: Option<any_value::Value>| KeyValue { key: key.into(), value: Some(AnyValue { value: v }), ..KeyValue::default() };
        fn general(bytes: &[u8]) -> Result<Attribute<'_>> {
            let mut traces = Traces::default();
            let mut attribute = Attribute::default();
            key_value(&mut Reader { buf: bytes, depth: 0, traces: &mut traces }, &mut attribute).map(|()| attribute)
        }
        let taken = [
            kv("gen_ai.request.id", Some(any_value::Value::StringValue("cmpl-é".into()))),
            kv("b", Some(any_value::Value::BoolValue(true))),
            kv("i", Some(any_value::Value::IntValue(-1))),
            kv("i", Some(any_value::Value::IntValue(i64::MAX))),
            kv("i", Some(any_value::Value::IntValue(0))),
            kv("d", Some(any_value::Value::DoubleValue(0.25))),
            kv("d", Some(any_value::Value::DoubleValue(f64::NAN))),
        ];
        for kv in &taken {
            let bytes = kv.encode_to_vec();
            let direct = plain_key_value(&bytes).unwrap_or_else(|| panic!("{kv:?} is taken"));
            assert_eq!(format!("{direct:?}"), format!("{:?}", general(&bytes).expect("valid")), "{kv:?}");
        }
        let left = [
            kv("long", Some(any_value::Value::StringValue("x".repeat(200)))),
            kv(&"k".repeat(130), Some(any_value::Value::BoolValue(false))),
            kv("none", None),
            // Written without its empty key and value: another shape.
            kv("", Some(any_value::Value::StringValue(String::new()))),
            kv("bytes", Some(any_value::Value::BytesValue(vec![1]))),
            KeyValue { key: "no value".into(), ..KeyValue::default() },
        ];
        for kv in &left {
            assert_eq!(plain_key_value(&kv.encode_to_vec()), None, "{kv:?}");
        }
        // Damage the general reader refuses is left to it.
        let mut bad_utf8 = kv("k", Some(any_value::Value::StringValue("ab".into()))).encode_to_vec();
        *bad_utf8.last_mut().expect("bytes") = 0xff;
        assert_eq!((plain_key_value(&bad_utf8), general(&bad_utf8).is_err()), (None, true));
        let mut trailing = kv("k", Some(any_value::Value::IntValue(5))).encode_to_vec();
        trailing.extend([0x18, 0x06]);
        assert_eq!(plain_key_value(&trailing), None, "a second field: merged by the reader");
    }

    /// Arrays nested past prost's limit are refused as prost refuses them.
    #[test]
    fn nesting_stops_where_prosts_does() {
        for depth in [40, 45, 46, 47, 48, 60] {
            let mut value = AnyValue { value: Some(any_value::Value::IntValue(1)) };
            for _ in 0..depth {
                value = AnyValue { value: Some(any_value::Value::ArrayValue(ArrayValue { values: vec![value] })) };
            }
            let span =
                ProtoSpan { attributes: vec![KeyValue { key: "deep".into(), value: Some(value), ..KeyValue::default() }], ..ProtoSpan::default() };
            let t = TracesData {
                resource_spans: vec![ResourceSpans {
                    scope_spans: vec![ScopeSpans { spans: vec![span], ..ScopeSpans::default() }],
                    ..ResourceSpans::default()
                }],
            };
            let bytes = t.encode_to_vec();
            assert_eq!(by_wire(&bytes).is_some(), by_prost(&bytes).is_some(), "{depth} arrays deep");
        }
    }
}
