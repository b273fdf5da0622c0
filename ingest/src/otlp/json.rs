//! OTLP/JSON read straight into the view (the common shape by hand,
//! [`super::json_flat`]; the rest here). In: the payload of an
//! `otlp_json` message (the OTLP/JSON mapping of `TracesData`, as the
//! Collector's Kafka exporter writes it). Out: the [`Traces`] view the
//! protobuf reader gives too, its strings borrowed from the payload (an
//! escaped string, and each decoded id, copied once into the caller's
//! arena), or an error.
//!
//! What the view holds is read by the rules of `opentelemetry-proto`'s
//! serde mapping: camelCase names, unknown names skipped, a field given
//! twice refused (an `AnyValue`'s last value wins instead), hex ids (`0x`
//! allowed), 64-bit times as strings or numbers, `intValue` as a string or
//! a number. What it does not hold (scopes, events, links, the status,
//! key-value lists, entity references) is read with `opentelemetry-proto`'s
//! own types, so it is checked as that crate checks it. What this reader
//! leaves to that crate (a `bytesValue`, an object written as an array)
//! is an error here, and [`super::decode`] then reads the message with
//! `opentelemetry-proto`, whose verdict stands: this reader only ever
//! takes a message that crate takes, and reads it the same (the tests
//! below hold both).

use std::cell::RefCell;
use std::fmt;

use bumpalo::Bump;
use opentelemetry_proto::tonic::common::v1::{EntityRef, InstrumentationScope, KeyValueList};
use opentelemetry_proto::tonic::trace::v1::{span, Status};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::view::{Attribute, Resource, Span, Traces, Value};

/// Reads `payload` into the view; strings that cannot be borrowed go to
/// `arena`. The payload is checked to be UTF-8 once, whole, so its strings
/// are not checked one by one (a payload that is not is left to
/// `opentelemetry-proto`, whose verdict stands).
///
/// The common shape is read by hand first ([`super::json_flat`]); anything
/// else from the start here.
pub fn read<'a>(payload: &'a [u8], arena: &'a Bump) -> Result<Traces<'a>, serde_json::Error> {
    let text = std::str::from_utf8(payload).map_err(<serde_json::Error as de::Error>::custom)?;
    match super::json_flat::read(text, arena) {
        Some(traces) => Ok(traces),
        None => read_with_serde(text, arena),
    }
}

/// [`read`] without the hand-read shape: every message through serde.
fn read_with_serde<'a>(text: &'a str, arena: &'a Bump) -> Result<Traces<'a>, serde_json::Error> {
    let view = RefCell::new(Traces::default());
    let mut de = serde_json::Deserializer::from_str(text);
    Read(TracesData(Fill { view: &view, arena })).deserialize(&mut de)?;
    de.end()?;
    Ok(view.into_inner())
}

/// A map key among `names`: its index, `None` for a name not among them.
struct Key(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for Key {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|n| *n == v))
    }
}

/// A string, borrowed from the payload or copied into the arena.
#[derive(Clone, Copy)]
struct Str<'a>(&'a Bump);

impl<'a> DeserializeSeed<'a> for Str<'a> {
    type Value = &'a str;

    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<&'a str, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'a> Visitor<'a> for Str<'a> {
    type Value = &'a str;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'a str) -> Result<&'a str, E> {
        Ok(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<&'a str, E> {
        Ok(self.0.alloc_str(v))
    }
}

/// Hex bytes (a trace or span id), decoded into the arena as `const_hex`
/// decodes them for `opentelemetry-proto`.
#[derive(Clone, Copy)]
struct Hex<'a>(&'a Bump);

impl<'a> DeserializeSeed<'a> for Hex<'a> {
    type Value = &'a [u8];

    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<&'a [u8], D::Error> {
        d.deserialize_str(self)
    }
}

impl<'a> Visitor<'a> for Hex<'a> {
    type Value = &'a [u8];

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string representing hex-encoded bytes")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<&'a [u8], E> {
        super::json_flat::hex(self.0, v).map_err(E::custom)
    }
}

/// A u64 written as a number or a string (span times).
struct U64;

impl<'de> DeserializeSeed<'de> for U64 {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for U64 {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a u64 integer or a string containing a u64 integer")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("i64 value {v} is out of range for u64")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        v.parse::<u64>().map_err(E::custom)
    }
}

/// An `intValue`: an i64 written as a number or a string.
struct I64;

impl<'de> DeserializeSeed<'de> for I64 {
    type Value = i64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<i64, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for I64 {
    type Value = i64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an i64 integer or a string containing an i64 integer")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
        Ok(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v).map_err(|_| E::custom(format!("u64 value {v} is out of range for i64")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
        v.parse::<i64>().map_err(E::custom)
    }
}

/// `null` or what `S` reads.
struct Nullable<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("null or a value")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// A JSON array, each element read by a seed `make` gives and handed to `each`.
struct Each<M, F>(M, F);

impl<'de, S: DeserializeSeed<'de>, M: Fn() -> S, F: FnMut(S::Value)> DeserializeSeed<'de> for Each<M, F> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, S: DeserializeSeed<'de>, M: Fn() -> S, F: FnMut(S::Value)> Visitor<'de> for Each<M, F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while let Some(v) = seq.next_element_seed((self.0)())? {
            (self.1)(v);
        }
        Ok(())
    }
}

/// An OTLP message type read from a JSON object, as serde's derived
/// structs read it: a known field ([`Object::FIELDS`]) is handed to
/// [`Object::field`] once (a second refuses the object), an unknown one
/// is skipped, and [`Object::end`] gives the result.
trait Object<'a> {
    /// For errors: "struct Span".
    const NAME: &'static str;
    const FIELDS: &'static [&'static str];
    type Out;
    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, i: usize) -> Result<(), M::Error>;
    /// `seen` has bit `i` set for each field met.
    fn end<E: de::Error>(self, seen: u32) -> Result<Self::Out, E>;
}

/// Reads an [`Object`].
struct Read<O>(O);

impl<'a, O: Object<'a>> DeserializeSeed<'a> for Read<O> {
    type Value = O::Out;

    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<O::Out, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'a, O: Object<'a>> Visitor<'a> for Read<O> {
    type Value = O::Out;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(O::NAME)
    }

    fn visit_map<M: MapAccess<'a>>(mut self, mut map: M) -> Result<O::Out, M::Error> {
        let mut seen = 0u32;
        while let Some(key) = map.next_key_seed(Key(O::FIELDS))? {
            let Some(i) = key else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            if seen & (1 << i) != 0 {
                return Err(de::Error::duplicate_field(O::FIELDS[i]));
            }
            seen |= 1 << i;
            self.0.field(&mut map, i)?;
        }
        self.0.end(seen)
    }
}

/// Where the message's parts go: the view (shared by the nested readers,
/// each borrowing it only to push what it read) and the arena.
#[derive(Clone, Copy)]
struct Fill<'v, 'a> {
    view: &'v RefCell<Traces<'a>>,
    arena: &'a Bump,
}

/// An `AnyValue`: the kinds the view holds; `Other` for none set or a
/// key-value list. Not an [`Object`]: a value given again is no error,
/// the last wins, as opentelemetry-proto reads it.
#[derive(Clone, Copy)]
struct AnyValue<'a>(&'a Bump);

const ANY_VALUE: &[&str] = &["stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue", "bytesValue"];

impl<'a> DeserializeSeed<'a> for AnyValue<'a> {
    type Value = Value<'a>;

    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Value<'a>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'a> Visitor<'a> for AnyValue<'a> {
    type Value = Value<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object for AnyValue")
    }

    fn visit_map<M: MapAccess<'a>>(self, mut map: M) -> Result<Value<'a>, M::Error> {
        let mut value = Value::Other;
        while let Some(key) = map.next_key_seed(Key(ANY_VALUE))? {
            let read = match key {
                Some(0) => map.next_value_seed(Nullable(Str(self.0)))?.map(Value::Str),
                Some(1) => map.next_value::<Option<bool>>()?.map(Value::Bool),
                Some(2) => map.next_value_seed(Nullable(I64))?.map(Value::Int),
                Some(3) => map.next_value::<Option<f64>>()?.map(Value::Double),
                Some(4) => map.next_value_seed(Nullable(Read(ArrayValue { arena: self.0, values: Vec::new() })))?.map(Value::Array),
                Some(5) => map.next_value::<Option<KeyValueList>>()?.map(|_| Value::Other),
                Some(_) => return Err(de::Error::custom("a bytesValue is read by opentelemetry-proto")),
                None => map.next_value::<IgnoredAny>().map(|_| None)?,
            };
            if let Some(read) = read {
                value = read;
            }
        }
        Ok(value)
    }
}

/// An `ArrayValue`: its values (required).
struct ArrayValue<'a> {
    arena: &'a Bump,
    values: Vec<Value<'a>>,
}

impl<'a> Object<'a> for ArrayValue<'a> {
    const NAME: &'static str = "struct ArrayValue";
    const FIELDS: &'static [&'static str] = &["values"];
    type Out = Vec<Value<'a>>;

    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, _: usize) -> Result<(), M::Error> {
        let (arena, values) = (self.arena, &mut self.values);
        map.next_value_seed(Each(|| AnyValue(arena), |v| values.push(v)))
    }

    fn end<E: de::Error>(self, seen: u32) -> Result<Self::Out, E> {
        if seen == 0 {
            return Err(E::missing_field("values"));
        }
        Ok(self.values)
    }
}

/// A `KeyValue`: an attribute (its key required).
struct KeyValue<'a> {
    arena: &'a Bump,
    key: Option<&'a str>,
    value: Option<Value<'a>>,
}

impl<'a> KeyValue<'a> {
    fn new(arena: &'a Bump) -> Read<KeyValue<'a>> {
        Read(KeyValue { arena, key: None, value: None })
    }
}

impl<'a> Object<'a> for KeyValue<'a> {
    const NAME: &'static str = "struct KeyValue";
    const FIELDS: &'static [&'static str] = &["key", "value", "keyStrindex"];
    type Out = Attribute<'a>;

    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, i: usize) -> Result<(), M::Error> {
        match i {
            0 => self.key = Some(map.next_value_seed(Str(self.arena))?),
            1 => self.value = map.next_value_seed(Nullable(AnyValue(self.arena)))?,
            _ => drop(map.next_value::<i32>()?),
        }
        Ok(())
    }

    fn end<E: de::Error>(self, _: u32) -> Result<Attribute<'a>, E> {
        let key = self.key.ok_or_else(|| E::missing_field("key"))?;
        Ok(Attribute { key, value: self.value })
    }
}

/// Key-values into `out`.
fn key_values<'a, M: MapAccess<'a>>(map: &mut M, arena: &'a Bump, out: &mut Vec<Attribute<'a>>) -> Result<(), M::Error> {
    map.next_value_seed(Each(|| KeyValue::new(arena), |kv| out.push(kv)))
}

/// A `Resource`: its attributes.
struct ResourceAttributes<'a> {
    arena: &'a Bump,
    attributes: Vec<Attribute<'a>>,
}

impl<'a> Object<'a> for ResourceAttributes<'a> {
    const NAME: &'static str = "struct Resource";
    const FIELDS: &'static [&'static str] = &["attributes", "droppedAttributesCount", "entityRefs"];
    type Out = Vec<Attribute<'a>>;

    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, i: usize) -> Result<(), M::Error> {
        match i {
            0 => key_values(map, self.arena, &mut self.attributes),
            1 => map.next_value::<u32>().map(drop),
            _ => map.next_value::<Vec<EntityRef>>().map(drop),
        }
    }

    fn end<E: de::Error>(self, _: u32) -> Result<Self::Out, E> {
        Ok(self.attributes)
    }
}

/// A string field the view does not hold, checked to be one.
struct AnyStr;

impl<'de> DeserializeSeed<'de> for AnyStr {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for AnyStr {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
}

/// A `Span`, pushed to the view; its attributes go to the view's list
/// as they are read.
struct SpanPart<'v, 'a> {
    fill: Fill<'v, 'a>,
    span: Span<'a>,
}

impl<'v, 'a> SpanPart<'v, 'a> {
    fn new(fill: Fill<'v, 'a>) -> Read<SpanPart<'v, 'a>> {
        Read(SpanPart { fill, span: Span::default() })
    }
}

/// The bit of the span's `attributes` among [`SpanPart`]'s fields.
const SPAN_ATTRIBUTES: usize = 9;

impl<'a> Object<'a> for SpanPart<'_, 'a> {
    const NAME: &'static str = "struct Span";
    const FIELDS: &'static [&'static str] = &[
        "traceId",
        "spanId",
        "traceState",
        "parentSpanId",
        "flags",
        "name",
        "kind",
        "startTimeUnixNano",
        "endTimeUnixNano",
        "attributes",
        "droppedAttributesCount",
        "events",
        "droppedEventsCount",
        "links",
        "droppedLinksCount",
        "status",
    ];
    type Out = ();

    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, i: usize) -> Result<(), M::Error> {
        let (arena, view, span) = (self.fill.arena, self.fill.view, &mut self.span);
        match i {
            0 => span.trace_id = map.next_value_seed(Hex(arena))?,
            1 => span.span_id = map.next_value_seed(Hex(arena))?,
            2 => map.next_value_seed(AnyStr)?,
            3 => drop(map.next_value_seed(Hex(arena))?),
            4 | 10 | 12 | 14 => drop(map.next_value::<u32>()?),
            5 => span.name = map.next_value_seed(Str(arena))?,
            6 => drop(map.next_value::<i32>()?),
            7 => span.start_time_unix_nano = map.next_value_seed(U64)?,
            8 => span.end_time_unix_nano = map.next_value_seed(U64)?,
            SPAN_ATTRIBUTES => {
                let from = view.borrow().attributes.len();
                map.next_value_seed(Each(|| KeyValue::new(arena), |kv| view.borrow_mut().attributes.push(kv)))?;
                span.attributes = from..view.borrow().attributes.len();
            }
            11 => drop(map.next_value::<Vec<span::Event>>()?),
            13 => drop(map.next_value::<Vec<span::Link>>()?),
            _ => span.status_code = map.next_value::<Option<Status>>()?.map_or(0, |s| s.code),
        }
        Ok(())
    }

    fn end<E: de::Error>(mut self, seen: u32) -> Result<(), E> {
        let mut view = self.fill.view.borrow_mut();
        if seen & (1 << SPAN_ATTRIBUTES) == 0 {
            let at = view.attributes.len();
            self.span.attributes = at..at;
        }
        view.spans.push(self.span);
        Ok(())
    }
}

/// A `ScopeSpans`: its spans pushed to the view.
struct ScopeSpans<'v, 'a>(Fill<'v, 'a>);

impl<'a> Object<'a> for ScopeSpans<'_, 'a> {
    const NAME: &'static str = "struct ScopeSpans";
    const FIELDS: &'static [&'static str] = &["scope", "spans", "schemaUrl"];
    type Out = ();

    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, i: usize) -> Result<(), M::Error> {
        let fill = self.0;
        match i {
            0 => map.next_value::<Option<InstrumentationScope>>().map(drop),
            1 => map.next_value_seed(Each(|| SpanPart::new(fill), drop)),
            _ => map.next_value_seed(AnyStr),
        }
    }

    fn end<E: de::Error>(self, _: u32) -> Result<(), E> {
        Ok(())
    }
}

/// A `ResourceSpans`: its spans pushed to the view, then its resource.
struct ResourceSpans<'v, 'a> {
    fill: Fill<'v, 'a>,
    /// Where its spans start in the view.
    first: usize,
    attributes: Vec<Attribute<'a>>,
}

impl<'a> Object<'a> for ResourceSpans<'_, 'a> {
    const NAME: &'static str = "struct ResourceSpans";
    const FIELDS: &'static [&'static str] = &["resource", "scopeSpans", "schemaUrl"];
    type Out = ();

    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, i: usize) -> Result<(), M::Error> {
        let fill = self.fill;
        match i {
            0 => {
                let resource = Read(ResourceAttributes { arena: fill.arena, attributes: Vec::new() });
                self.attributes = map.next_value_seed(Nullable(resource))?.unwrap_or_default();
                Ok(())
            }
            1 => map.next_value_seed(Each(|| Read(ScopeSpans(fill)), drop)),
            _ => map.next_value_seed(AnyStr),
        }
    }

    fn end<E: de::Error>(self, _: u32) -> Result<(), E> {
        let mut view = self.fill.view.borrow_mut();
        let spans = self.first..view.spans.len();
        view.resources.push(Resource { attributes: self.attributes, spans });
        Ok(())
    }
}

/// The message: `resourceSpans`, required.
struct TracesData<'v, 'a>(Fill<'v, 'a>);

impl<'a> Object<'a> for TracesData<'_, 'a> {
    const NAME: &'static str = "struct TracesData";
    const FIELDS: &'static [&'static str] = &["resourceSpans"];
    type Out = ();

    fn field<M: MapAccess<'a>>(&mut self, map: &mut M, _: usize) -> Result<(), M::Error> {
        let fill = self.0;
        let resource = || {
            let first = fill.view.borrow().spans.len();
            Read(ResourceSpans { fill, first, attributes: Vec::new() })
        };
        map.next_value_seed(Each(resource, drop))
    }

    fn end<E: de::Error>(self, seen: u32) -> Result<(), E> {
        if seen == 0 {
            return Err(E::missing_field("resourceSpans"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::TracesData as ProtoTraces;
    use proptest::prelude::*;
    use serde_json::{json, Value as Json};

    use super::*;
    use crate::otlp::strategies::traces;

    /// What `opentelemetry-proto` makes of `bytes`, viewed: `None` where it refuses them.
    fn by_serde(bytes: &[u8]) -> Option<String> {
        serde_json::from_slice::<ProtoTraces>(bytes).ok().map(|t| format!("{:?}", Traces::of(&t)))
    }

    /// What this reader makes of `bytes`: `None` where it leaves them.
    fn by_reader(bytes: &[u8]) -> Option<String> {
        let arena = Bump::new();
        read(bytes, &arena).ok().map(|t| format!("{t:?}"))
    }

    /// Whatever this reader takes, opentelemetry-proto takes and reads the
    /// same; whatever the hand-read path takes, the serde path reads the same.
    fn agrees(bytes: &[u8]) -> Result<(), TestCaseError> {
        if let Some(read) = by_reader(bytes) {
            prop_assert_eq!(Some(read), by_serde(bytes), "{}", String::from_utf8_lossy(bytes));
        }
        if let Some(flat) = by_flat(bytes) {
            prop_assert_eq!(Some(flat), by_serde_path(bytes), "{}", String::from_utf8_lossy(bytes));
        }
        Ok(())
    }

    /// [`agrees`] on `bytes` cut at `cut`, and on `bytes` with `name` set
    /// to `value` in the `at`th object.
    fn agrees_cut_and_changed(
        bytes: &[u8],
        cut: prop::sample::Index,
        at: prop::sample::Index,
        name: &str,
        value: &Json,
    ) -> Result<(), TestCaseError> {
        agrees(&bytes[..cut.index(bytes.len())])?;
        let mut tree: Json = serde_json::from_slice(bytes).expect("json");
        let mut objects = 0;
        set_in(&mut tree, usize::MAX, &mut objects, name, value);
        set_in(&mut tree, at.index(objects.max(1)), &mut 0, name, value);
        agrees(&serde_json::to_vec(&tree).expect("json"))
    }

    /// What the hand-read path makes of `bytes`: `None` where it leaves them.
    fn by_flat(bytes: &[u8]) -> Option<String> {
        let arena = Bump::new();
        crate::otlp::json_flat::read(std::str::from_utf8(bytes).ok()?, &arena).map(|t| format!("{t:?}"))
    }

    /// What the serde path alone makes of `bytes`.
    fn by_serde_path(bytes: &[u8]) -> Option<String> {
        let arena = Bump::new();
        read_with_serde(std::str::from_utf8(bytes).ok()?, &arena).ok().map(|t| format!("{t:?}"))
    }

    /// `t` without what the hand-read path leaves to serde: events,
    /// links, and values other than strings, bools, ints and doubles.
    fn plain(mut t: ProtoTraces) -> ProtoTraces {
        use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
        let scalar = |kv: &opentelemetry_proto::tonic::common::v1::KeyValue| {
            kv.value.as_ref().is_none_or(|v| matches!(v.value, None | Some(V::StringValue(_) | V::BoolValue(_) | V::IntValue(_) | V::DoubleValue(_))))
        };
        for rs in &mut t.resource_spans {
            if let Some(r) = &mut rs.resource {
                r.attributes.retain(scalar);
            }
            for ss in &mut rs.scope_spans {
                for span in &mut ss.spans {
                    span.events.clear();
                    span.links.clear();
                    span.attributes.retain(scalar);
                }
            }
        }
        t
    }

    /// Sets `name` to `value` in the `target`th object of `tree`, depth
    /// first; counts the objects in `seen`.
    fn set_in(tree: &mut Json, target: usize, seen: &mut usize, name: &str, value: &Json) {
        match tree {
            Json::Object(map) => {
                if *seen == target {
                    map.insert(name.to_owned(), value.clone());
                }
                *seen += 1;
                map.values_mut().for_each(|v| set_in(v, target, seen, name, value));
            }
            Json::Array(items) => items.iter_mut().for_each(|v| set_in(v, target, seen, name, value)),
            _ => {}
        }
    }

    /// Every field name either mapping knows, and one neither does.
    const NAMES: &[&str] = &[
        "resourceSpans",
        "resource",
        "scopeSpans",
        "schemaUrl",
        "scope",
        "spans",
        "traceId",
        "spanId",
        "parentSpanId",
        "name",
        "kind",
        "startTimeUnixNano",
        "endTimeUnixNano",
        "attributes",
        "status",
        "code",
        "key",
        "value",
        "stringValue",
        "boolValue",
        "intValue",
        "doubleValue",
        "arrayValue",
        "values",
        "kvlistValue",
        "events",
        "flags",
        "droppedAttributesCount",
        "unknownField",
    ];

    fn replacement() -> impl Strategy<Value = Json> {
        prop_oneof![
            Just(Json::Null),
            Just(json!(true)),
            Just(json!(7)),
            Just(json!(-7)),
            Just(json!(1.5)),
            Just(json!(18446744073709551615u64)),
            Just(json!("12")),
            Just(json!("0x0a0b")),
            Just(json!("abc")),
            Just(json!("")),
            Just(json!({})),
            Just(json!([])),
            Just(json!([{}])),
            Just(json!({"values": []})),
            Just(json!({"stringValue": "s", "intValue": "3"})),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        /// opentelemetry-proto's JSON of a message reads as that crate reads
        /// it (a bytesValue is left to it); with any field of any object
        /// set to a value of another shape, whatever this reader takes,
        /// that crate takes and reads the same; cut anywhere, the same.
        #[test]
        fn the_payload_reads_as_opentelemetry_proto_reads_it(
            t in traces(),
            at in any::<prop::sample::Index>(),
            name in prop::sample::select(NAMES),
            value in replacement(),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = serde_json::to_vec(&t).expect("json");
            let expected = by_serde(&bytes);
            prop_assert!(expected.is_some(), "opentelemetry-proto reads its own JSON");
            if !String::from_utf8_lossy(&bytes).contains("bytesValue") {
                prop_assert_eq!(by_reader(&bytes), expected);
            }
            agrees_cut_and_changed(&bytes, cut, at, name, &value)?;
        }

        /// opentelemetry-proto's JSON of a message of the plain shape is
        /// taken by the hand-read path, and read as the serde path reads
        /// it; changed or cut, whatever it takes is read the same.
        #[test]
        fn the_plain_shape_is_read_by_hand_as_serde_reads_it(
            t in traces(),
            at in any::<prop::sample::Index>(),
            name in prop::sample::select(NAMES),
            value in replacement(),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = serde_json::to_vec(&plain(t)).expect("json");
            let flat = by_flat(&bytes);
            prop_assert!(flat.is_some(), "the plain shape is taken: {}", String::from_utf8_lossy(&bytes));
            prop_assert_eq!(flat, by_serde_path(&bytes));
            agrees_cut_and_changed(&bytes, cut, at, name, &value)?;
        }
    }

    /// The Collector's form of a vLLM span (defaults left out, ints and
    /// times as strings, the kind a number) is read by hand, as serde and
    /// opentelemetry-proto read it; numbers serde_json reads otherwise
    /// (`-0`, out of range) are left to serde.
    #[test]
    fn the_collectors_form_is_read_by_hand_and_odd_numbers_are_left() {
        let message = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"vllm"}}]},
            "scopeSpans":[{"scope":{"name":"vllm.llm_engine","version":"0.6.3"},"spans":[{"traceId":"5b8efff798038103d269b633813fc60c",
            "spanId":"eee19b7ec3c1b174","parentSpanId":"","name":"llm_request","kind":2,
            "startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000",
            "attributes":[{"key":"gen_ai.request.id","value":{"stringValue":"cmpl-42"}},
              {"key":"gen_ai.usage.prompt_tokens","value":{"intValue":"812"}},
              {"key":"gen_ai.latency.e2e","value":{"doubleValue":2.4}},
              {"key":"gen_ai.latency.time_in_queue","value":{"doubleValue":0}},
              {"key":"flag","value":{"boolValue":true}}],
            "status":{}}]}]}]}"#;
        let flat = by_flat(message).expect("taken by hand");
        assert_eq!(Some(flat.clone()), by_serde_path(message));
        assert_eq!(Some(flat.clone()), by_serde(message));
        for part in ["Str(\"cmpl-42\")", "Int(812)", "Double(2.4)", "Double(0.0)", "Bool(true)", "end_time_unix_nano: 1544712661000000000"] {
            assert!(flat.contains(part), "{part} in {flat}");
        }
        let attribute =
            |value: &str| format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"attributes":[{{"key":"k","value":{value}}}]}}]}}]}}]}}"#);
        for value in [r#"{"doubleValue":-0}"#, r#"{"intValue":-0}"#, r#"{"doubleValue":1e400}"#, r#"{"intValue":9223372036854775808}"#] {
            let message = attribute(value);
            assert_eq!(by_flat(message.as_bytes()), None, "{message}");
            assert_eq!(by_reader(message.as_bytes()), by_serde(message.as_bytes()), "{message}");
        }
        let taken = attribute(r#"{"doubleValue":-0.0}"#);
        assert_eq!(by_flat(taken.as_bytes()), by_serde_path(taken.as_bytes()));
        assert!(by_flat(taken.as_bytes()).is_some_and(|t| t.contains("Double(-0.0)")));
    }

    /// The forms opentelemetry-proto takes besides its own output: numbers
    /// for times and `intValue`, `0x` ids, escaped strings, unknown fields,
    /// nulls, several values in one `AnyValue` (the last wins).
    #[test]
    fn the_forms_a_producer_may_write_read_the_same() {
        let message = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"vllm \"a\"\n"}}]},
            "scopeSpans":[{"scope":null,"spans":[{"traceId":"0x0102","spanId":"ABCDEF0123456789","name":"ch\u0061t",
            "startTimeUnixNano":1700000000000000000,"endTimeUnixNano":"1700000000500000000","unknown":{"deep":[1,2,{}]},
            "status":{"code":2},"attributes":[
              {"key":"n","value":{"intValue":5}},{"key":"s","value":{"intValue":"-5"}},
              {"key":"last","value":{"stringValue":"first","intValue":"9","boolValue":null}},
              {"key":"d","value":{"doubleValue":3}},{"key":"none","value":{}},{"key":"nul","value":null},{"key":"nokv"},
              {"key":"arr","value":{"arrayValue":{"values":[{"intValue":1},{"arrayValue":{"values":[]}}]}}},
              {"key":"kv","value":{"kvlistValue":{"values":[{"key":"k"}]}}}]}]}]}]}"#;
        let read = by_reader(message).expect("taken");
        assert_eq!(Some(read.clone()), by_serde(message));
        for part in [
            "trace_id: [1, 2]",
            "name: \"chat\"",
            "Str(\"vllm \\\"a\\\"\\n\")",
            "Int(9)",
            "Double(3.0)",
            "status_code: 2",
            "Array([Int(1), Array([])])",
        ] {
            assert!(read.contains(part), "{part} in {read}");
        }
    }

    /// What opentelemetry-proto refuses, this reader refuses too: a field
    /// given twice, a required one missing, a value of the wrong kind.
    #[test]
    fn what_opentelemetry_proto_refuses_is_refused() {
        let spans = |span: &str| format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{span}]}}]}}]}}"#);
        let refused = [
            r#"{}"#.to_owned(),
            r#"{"resourceSpans":[],"resourceSpans":[]}"#.to_owned(),
            r#"{"resourceSpans":null}"#.to_owned(),
            spans(r#"{"name":"a","name":"b"}"#),
            spans(r#"{"name":null}"#),
            spans(r#"{"traceId":"abc"}"#),
            spans(r#"{"traceId":"zz"}"#),
            spans(r#"{"startTimeUnixNano":-1}"#),
            spans(r#"{"startTimeUnixNano":1.5}"#),
            spans(r#"{"attributes":[{"value":{"intValue":1}}]}"#),
            spans(r#"{"attributes":[{"key":"k","value":{"intValue":1.5}}]}"#),
            spans(r#"{"attributes":[{"key":"k","value":{"intValue":"x"}}]}"#),
            spans(r#"{"attributes":[{"key":"k","value":{"arrayValue":{}}}]}"#),
            spans(r#"{"attributes":[{"key":"k","value":{"arrayValue":{"values":[null]}}}]}"#),
            spans(r#"{"attributes":[{"key":"k","key":"l"}]}"#),
            spans(r#"{"events":[{"timeUnixNano":"x"}]}"#),
            spans(r#"{"status":{"code":"ERROR"}}"#),
        ];
        for message in refused {
            assert_eq!(by_serde(message.as_bytes()), None, "opentelemetry-proto refuses {message}");
            assert_eq!(by_reader(message.as_bytes()), None, "{message}");
        }
    }

    /// A bytesValue is left to opentelemetry-proto, and `decode` reads the
    /// message through it.
    #[test]
    fn a_bytes_value_is_read_by_opentelemetry_proto() {
        let message = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"b","attributes":[{"key":"b","value":{"bytesValue":"AQI="}}]}]}]}]}"#;
        assert_eq!(by_reader(message), None);
        let got = crate::otlp::decode(message, inferlog_store::kafka::TopicEncoding::OtlpJson, |t| format!("{t:?}")).expect("decoded");
        assert_eq!(Some(got), by_serde(message));
    }
}
