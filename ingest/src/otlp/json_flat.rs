//! OTLP/JSON of the shape exporters write, read by hand. In: the payload
//! of an `otlp_json` message. Out: the [`Traces`] view
//! [`super::json::read`] gives for the same bytes, or `None` for anything
//! outside that shape, which `json::read` then reads from the start, so
//! every verdict and every error stays its own.
//!
//! The shape: every name known and given once; strings without escapes;
//! an `AnyValue` holding a string, bool, int or double; a scope of name
//! and version at most; no events, links or entity references; integers
//! in JSON's own form. That is what the OpenTelemetry Collector and
//! `opentelemetry-proto` write for a vLLM span, and it is read here
//! without serde's per-token visitors (most of what `json::read` costs).

use bumpalo::Bump;

use super::view::{Attribute, Resource, Span, Traces, Value};

/// Reads `text` (the payload, checked to be UTF-8) into the view, or
/// `None` where [`super::json::read`] must judge it. Decoded ids go to
/// `arena`.
pub fn read<'a>(text: &'a str, arena: &'a Bump) -> Option<Traces<'a>> {
    let mut r = Reader { text, at: 0, arena, traces: Traces::default() };
    r.traces.spans.reserve(text.len() / 1024);
    r.traces.attributes.reserve(text.len() / 48);
    let mut seen = 0u32;
    r.object(|r, key| match key {
        "resourceSpans" => once(&mut seen, 0).and_then(|()| r.array(Reader::resource_spans)),
        _ => None,
    })?;
    r.ws();
    (seen == 1 && r.at == r.text.len()).then_some(r.traces)
}

/// Marks field `bit` seen; `None` if it already was (a name given twice).
fn once(seen: &mut u32, bit: u32) -> Option<()> {
    let was = *seen & (1 << bit) != 0;
    *seen |= 1 << bit;
    (!was).then_some(())
}

/// Whether one of the eight bytes of `word` may be a quote, a backslash
/// or a control byte (exact for the first such byte; bytes after it may
/// be flagged too, which only ends the fast scan early).
#[inline]
fn may_stop(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    (zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\'))) | (word.wrapping_sub(ONES * 0x20) & !word & HIGH)) != 0
}

/// Hex bytes (a trace or span id) decoded into `arena` as `const_hex`
/// decodes them for `opentelemetry-proto` (`0x` allowed); the error where
/// it refuses them.
pub fn hex<'a>(arena: &'a Bump, v: &str) -> Result<&'a [u8], const_hex::FromHexError> {
    let digits = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")).unwrap_or(v);
    let bytes = arena.alloc_slice_fill_copy(digits.len() / 2, 0u8);
    // Odd lengths and bad digits are refused as const_hex refuses them.
    const_hex::decode_to_slice(v, bytes)?;
    Ok(bytes)
}

struct Reader<'a> {
    text: &'a str,
    at: usize,
    arena: &'a Bump,
    traces: Traces<'a>,
}

impl<'a> Reader<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// Skips JSON whitespace.
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes().get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not taken.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.bytes().get(self.at).copied()
    }

    #[inline]
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// `word` (`null`, `true`, `false`) if it comes next.
    fn literal(&mut self, word: &str) -> Option<()> {
        self.ws();
        self.text[self.at..].starts_with(word).then(|| self.at += word.len())
    }

    /// A string without escapes or control characters.
    #[inline(always)]
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let bytes = self.bytes();
        // Eight bytes at a time up to the first that may end the string
        // or refuse it, then one by one.
        while let Some(chunk) = bytes.get(self.at..self.at + 8) {
            if may_stop(u64::from_le_bytes(chunk.try_into().ok()?)) {
                break;
            }
            self.at += 8;
        }
        loop {
            match *bytes.get(self.at)? {
                b'"' => break,
                b'\\' | 0..=0x1f => return None,
                _ => self.at += 1,
            }
        }
        self.at += 1;
        // Both ends are ASCII quotes: character boundaries.
        Some(&self.text[start..self.at - 1])
    }

    /// A number in JSON's grammar, as written.
    fn number(&mut self) -> Option<&'a str> {
        self.ws();
        let start = self.at;
        let bytes = self.bytes();
        let digits = |at: &mut usize| {
            let from = *at;
            while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at > from
        };
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        match bytes.get(at)? {
            b'0' => at += 1,
            b'1'..=b'9' => {
                digits(&mut at);
            }
            _ => return None,
        }
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            digits(&mut at).then_some(())?;
        }
        if let Some(b'e' | b'E') = bytes.get(at) {
            at += 1;
            if let Some(b'+' | b'-') = bytes.get(at) {
                at += 1;
            }
            digits(&mut at).then_some(())?;
        }
        self.at = at;
        Some(&self.text[start..at])
    }

    /// A JSON integer (no fraction, no exponent) as `T`, in range. `-0`
    /// is left: `serde_json` reads it as the float -0.0.
    fn integer<T: std::str::FromStr>(&mut self) -> Option<T> {
        let n = self.number()?;
        if n.starts_with("-0") || n.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) {
            return None;
        }
        n.parse().ok()
    }

    /// An object, each member's value read by `member` given its name.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            member(self, key)?;
            if !self.more(b'}')? {
                return Some(());
            }
        }
    }

    /// After a member or an element: `true` past a comma, `false` past
    /// `close`, `None` at anything else.
    #[inline]
    fn more(&mut self, close: u8) -> Option<bool> {
        let next = self.peek()?;
        self.at += 1;
        match next {
            b',' => Some(true),
            _ => (next == close).then_some(false),
        }
    }

    /// An array, each element read by `element`.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            element(self)?;
            if !self.more(b']')? {
                return Some(());
            }
        }
    }

    /// `null`, or what `read` reads.
    fn nullable(&mut self, read: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        match self.literal("null") {
            Some(()) => Some(()),
            None => read(self),
        }
    }

    /// `[]`: a list this reader takes only empty.
    fn empty_array(&mut self) -> Option<()> {
        self.eat(b'[')?;
        self.eat(b']')
    }

    fn resource_spans(&mut self) -> Option<()> {
        let first = self.traces.spans.len();
        let mut attributes = Vec::new();
        let mut seen = 0;
        self.object(|r, key| match key {
            "resource" => once(&mut seen, 0).and_then(|()| {
                let mut seen = 0;
                r.nullable(|r| {
                    r.object(|r, key| match key {
                        "attributes" => once(&mut seen, 0).and_then(|()| r.array(|r| r.key_value().map(|kv| attributes.push(kv)))),
                        "droppedAttributesCount" => once(&mut seen, 1).and_then(|()| r.integer::<u32>().map(drop)),
                        "entityRefs" => once(&mut seen, 2).and_then(|()| r.empty_array()),
                        _ => None,
                    })
                })
            }),
            "scopeSpans" => once(&mut seen, 1).and_then(|()| r.array(Reader::scope_spans)),
            "schemaUrl" => once(&mut seen, 2).and_then(|()| r.string().map(drop)),
            _ => None,
        })?;
        let spans = first..self.traces.spans.len();
        self.traces.resources.push(Resource { attributes, spans });
        Some(())
    }

    fn scope_spans(&mut self) -> Option<()> {
        let mut seen = 0;
        self.object(|r, key| match key {
            "scope" => once(&mut seen, 0).and_then(|()| {
                let mut seen = 0;
                r.nullable(|r| {
                    r.object(|r, key| match key {
                        "name" => once(&mut seen, 0).and_then(|()| r.string().map(drop)),
                        "version" => once(&mut seen, 1).and_then(|()| r.string().map(drop)),
                        "attributes" => once(&mut seen, 2).and_then(|()| r.empty_array()),
                        "droppedAttributesCount" => once(&mut seen, 3).and_then(|()| r.integer::<u32>().map(drop)),
                        _ => None,
                    })
                })
            }),
            "spans" => once(&mut seen, 1).and_then(|()| r.array(Reader::span)),
            "schemaUrl" => once(&mut seen, 2).and_then(|()| r.string().map(drop)),
            _ => None,
        })
    }

    fn span(&mut self) -> Option<()> {
        let mut span = Span::default();
        let mut attributes = None;
        let mut seen = 0;
        let arena = self.arena;
        self.object(|r, key| {
            match key {
                "traceId" => {
                    once(&mut seen, 0)?;
                    span.trace_id = hex(arena, r.string()?).ok()?;
                }
                "spanId" => {
                    once(&mut seen, 1)?;
                    span.span_id = hex(arena, r.string()?).ok()?;
                }
                "traceState" => once(&mut seen, 2).and_then(|()| r.string().map(drop))?,
                "parentSpanId" => once(&mut seen, 3).and_then(|()| hex(arena, r.string()?).ok().map(drop))?,
                "flags" => once(&mut seen, 4).and_then(|()| r.integer::<u32>().map(drop))?,
                "name" => {
                    once(&mut seen, 5)?;
                    span.name = r.string()?;
                }
                "kind" => once(&mut seen, 6).and_then(|()| r.integer::<i32>().map(drop))?,
                "startTimeUnixNano" => {
                    once(&mut seen, 7)?;
                    span.start_time_unix_nano = r.nanos()?;
                }
                "endTimeUnixNano" => {
                    once(&mut seen, 8)?;
                    span.end_time_unix_nano = r.nanos()?;
                }
                "attributes" => {
                    once(&mut seen, 9)?;
                    let from = r.traces.attributes.len();
                    r.array(|r| r.key_value().map(|kv| r.traces.attributes.push(kv)))?;
                    attributes = Some(from..r.traces.attributes.len());
                }
                "droppedAttributesCount" => once(&mut seen, 10).and_then(|()| r.integer::<u32>().map(drop))?,
                "events" => once(&mut seen, 11).and_then(|()| r.empty_array())?,
                "droppedEventsCount" => once(&mut seen, 12).and_then(|()| r.integer::<u32>().map(drop))?,
                "links" => once(&mut seen, 13).and_then(|()| r.empty_array())?,
                "droppedLinksCount" => once(&mut seen, 14).and_then(|()| r.integer::<u32>().map(drop))?,
                "status" => {
                    once(&mut seen, 15)?;
                    span.status_code = r.status()?;
                }
                _ => return None,
            }
            Some(())
        })?;
        let at = self.traces.attributes.len();
        span.attributes = attributes.unwrap_or(at..at);
        self.traces.spans.push(span);
        Some(())
    }

    /// A span time: a u64 as a JSON integer or as a string, read as
    /// `json::read` reads either.
    fn nanos(&mut self) -> Option<u64> {
        if self.peek()? == b'"' {
            self.string()?.parse().ok()
        } else {
            self.integer()
        }
    }

    /// A `Status`'s code (0 for `null`).
    fn status(&mut self) -> Option<i32> {
        let (mut code, mut seen) = (0, 0);
        self.nullable(|r| {
            r.object(|r, key| match key {
                "message" => once(&mut seen, 0).and_then(|()| r.string().map(drop)),
                "code" => once(&mut seen, 1).and_then(|()| r.integer::<i32>().map(|c| code = c)),
                _ => None,
            })
        })?;
        Some(code)
    }

    fn key_value(&mut self) -> Option<Attribute<'a>> {
        let (mut key, mut value, mut seen) = (None, None, 0);
        self.object(|r, name| match name {
            "key" => once(&mut seen, 0).and_then(|()| r.string().map(|k| key = Some(k))),
            "value" => once(&mut seen, 1).and_then(|()| r.nullable(|r| r.any_value().map(|v| value = Some(v)))),
            "keyStrindex" => once(&mut seen, 2).and_then(|()| r.integer::<i32>().map(drop)),
            _ => None,
        })?;
        Some(Attribute { key: key?, value })
    }

    /// An `AnyValue` of one scalar kind: the last value given wins, a
    /// `null` one is no value, as `json::read` reads it.
    fn any_value(&mut self) -> Option<Value<'a>> {
        let mut value = Value::Other;
        self.object(|r, key| {
            if r.literal("null").is_some() {
                return matches!(key, "stringValue" | "boolValue" | "intValue" | "doubleValue").then_some(());
            }
            value = match key {
                "stringValue" => Value::Str(r.string()?),
                "boolValue" => Value::Bool(if r.literal("true").is_some() {
                    true
                } else {
                    r.literal("false")?;
                    false
                }),
                "intValue" if r.peek()? == b'"' => Value::Int(r.string()?.parse().ok()?),
                "intValue" => Value::Int(r.integer()?),
                "doubleValue" => Value::Double(r.double()?),
                _ => return None,
            };
            Some(())
        })?;
        Some(value)
    }

    /// A double as `serde_json` (with `float_roundtrip`) reads it: an
    /// integer that fits 64 bits converted, any other number correctly
    /// rounded; out of range is left to it.
    fn double(&mut self) -> Option<f64> {
        let n = self.number()?;
        if !n.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) {
            return match n.strip_prefix('-') {
                Some("0") => None,
                Some(_) => n.parse::<i64>().ok().map(|i| i as f64),
                None => n.parse::<u64>().ok().map(|u| u as f64),
            };
        }
        n.parse::<f64>().ok().filter(|d| d.is_finite())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(text: &str) -> Option<String> {
        let arena = Bump::new();
        Reader { text, at: 0, arena: &arena, traces: Traces::default() }.string().map(str::to_owned)
    }

    /// Eight bytes at a time, a quote, a backslash or a control byte is
    /// found wherever it falls in the string, and bytes of any other kind
    /// (non-ASCII too) are taken.
    #[test]
    fn a_string_ends_at_its_quote_and_is_left_at_an_escape_or_a_control_byte() {
        for len in 0..24 {
            let body: String = "aé~ 0Z{".chars().cycle().take(len).collect();
            assert_eq!(string(&format!("\"{body}\",")).as_deref(), Some(body.as_str()), "{body:?}");
            assert_eq!(string(&format!("\"{body}")), None, "unterminated {body:?}");
            for at in 0..body.chars().count() {
                let mut chars: Vec<char> = body.chars().collect();
                for odd in ['\\', '\n', '\u{1f}', '\0'] {
                    chars[at] = odd;
                    let text: String = chars.iter().collect();
                    assert_eq!(string(&format!("\"{text}\"")), None, "{text:?}");
                }
                chars[at] = '"';
                let text: String = chars.iter().collect();
                let expected: String = body.chars().take(at).collect();
                assert_eq!(string(&format!("\"{text}\"")).as_deref(), Some(expected.as_str()), "{text:?}");
            }
        }
    }
}
