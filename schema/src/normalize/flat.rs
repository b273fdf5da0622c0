//! The common event read without serde. In: an event's JSON text. Out:
//! the [`Slots`] filled exactly as [`read_json`]'s serde pass fills them,
//! or [`Flat::Other`] when the object holds what this reader leaves to
//! that pass, which then reads the event from the start.
//!
//! What it reads: one object of string keys without escapes, each value a
//! string without escapes, `true`, `false`, `null`, or a non-negative
//! number without an exponent, with JSON's whitespace between tokens.
//! Everything else (an escape, a nested value, a prompt field, a negative
//! number or an exponent, anything malformed) is left to serde, so an
//! event's verdict, reason and message are serde's whatever this reader
//! takes; the tests below hold the two readers equal on valid, invalid
//! and mangled events. Numbers are read as `serde_json` reads them with
//! `float_roundtrip`: an integer as `u64`, a decimal correctly rounded.

use std::borrow::Cow;

use crate::reason::Rejection;

use super::fields::{classify, FieldValue, Given, Key};
use super::scan::Slots;
use super::PROMPT_FIELDS;

/// What [`read`] made of an event.
pub(super) enum Flat {
    /// The whole event read into the slots.
    Read,
    /// A key the slots refuse (given twice, aliases that disagree): the
    /// verdict serde's pass reaches too, since it reads the same up to it.
    Rejected(Rejection),
    /// Something this reader leaves to serde; the slots are partly filled.
    Other,
}

/// Reads `text` into `slots` (which must be empty).
pub(super) fn read<'a>(text: &'a str, slots: &mut Slots<'a>) -> Flat {
    let mut reader = Reader { text, at: 0 };
    match reader.object(slots) {
        Some(Ok(())) => Flat::Read,
        Some(Err(rejection)) => Flat::Rejected(rejection),
        None => Flat::Other,
    }
}

/// Exact powers of ten: a decimal of at most 15 digits is its digits
/// divided by one of these, correctly rounded (both operands exact).
const POW10: [f64; 16] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];

/// The bytes that end an unescaped string's scan: the closing quote, an
/// escape, or a control character (which JSON does not allow unescaped).
const STRING_STOP: [bool; 256] = {
    let mut stop = [false; 256];
    let mut b = 0;
    while b < 256 {
        stop[b] = b < 0x20 || b == b'"' as usize || b == b'\\' as usize;
        b += 1;
    }
    stop
};

struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Consumes `byte` after any whitespace.
    fn expect(&mut self, byte: u8) -> Option<()> {
        self.skip_whitespace();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn object(&mut self, slots: &mut Slots<'a>) -> Option<Result<(), Rejection>> {
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.peek()? == b'}' {
            self.at += 1;
        } else {
            loop {
                self.expect(b'"')?;
                let key = self.string()?;
                self.expect(b':')?;
                self.skip_whitespace();
                match classify(key) {
                    Key::Dropped => {
                        if PROMPT_FIELDS.contains(&key) {
                            return None;
                        }
                        self.value()?;
                        slots.dropped.push(key.to_owned());
                    }
                    known => {
                        let value = self.value()?;
                        if let Err(rejection) = slots.file(&known, Given { name: known.name(), value }) {
                            return Some(Err(rejection));
                        }
                    }
                }
                self.skip_whitespace();
                match self.peek()? {
                    b',' => self.at += 1,
                    b'}' => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.skip_whitespace();
        (self.at == self.text.len()).then_some(Ok(()))
    }

    /// The rest of a string whose opening quote was consumed, when it has no escape.
    #[inline]
    fn string(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut end = start;
        // Eight bytes at a time, as serde_json skips to an escape: the
        // lowest flagged byte of each mask is a true stop (a borrow only
        // flags bytes above one), so the lowest of the three is the first.
        const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
        const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
        while let Some(chunk) = bytes.get(end..end + 8) {
            let chunk = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
            let zero_at = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
            let stops = zero_at(chunk ^ (ONES * u64::from(b'"')))
                | zero_at(chunk ^ (ONES * u64::from(b'\\')))
                | (chunk.wrapping_sub(ONES * 0x20) & !chunk & HIGHS);
            if stops != 0 {
                end += (stops.trailing_zeros() / 8) as usize;
                break;
            }
            end += 8;
        }
        end += bytes[end..].iter().position(|&b| STRING_STOP[usize::from(b)])?;
        if bytes[end] != b'"' {
            return None;
        }
        self.at = end + 1;
        // Both ends are ASCII quotes, so both are character boundaries.
        Some(&self.text[start..end])
    }

    fn literal(&mut self, word: &str, value: FieldValue<'a>) -> Option<FieldValue<'a>> {
        self.text[self.at..].starts_with(word).then(|| {
            self.at += word.len();
            value
        })
    }

    #[inline]
    fn value(&mut self) -> Option<FieldValue<'a>> {
        match self.peek()? {
            b'"' => {
                self.at += 1;
                self.string().map(|s| FieldValue::Str(Cow::Borrowed(s)))
            }
            b't' => self.literal("true", FieldValue::Bool(true)),
            b'f' => self.literal("false", FieldValue::Bool(false)),
            b'n' => self.literal("null", FieldValue::Null),
            b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// Digits from here: how many, and their value while it fits (at
    /// most 19 digits always do).
    #[inline]
    fn digits(&mut self, mut value: u64) -> (usize, u64) {
        let start = self.at;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit - b'0'));
            self.at += 1;
        }
        (self.at - start, value)
    }

    /// A non-negative number without an exponent, as `serde_json` reads it.
    #[inline]
    fn number(&mut self) -> Option<FieldValue<'a>> {
        let start = self.at;
        let (whole, significand) = self.digits(0);
        if whole > 1 && self.text.as_bytes()[start] == b'0' {
            return None; // a leading zero
        }
        if self.peek() != Some(b'.') {
            if matches!(self.peek(), Some(b'e' | b'E')) {
                return None;
            }
            return match whole {
                ..=19 => Some(FieldValue::UInt(significand)),
                // An integer that does not fit a u64 is a float to serde_json.
                _ => self.text[start..self.at].parse::<u64>().ok().map(FieldValue::UInt),
            };
        }
        self.at += 1;
        let (fraction, significand) = self.digits(significand);
        if fraction == 0 || matches!(self.peek(), Some(b'e' | b'E')) {
            return None;
        }
        if whole + fraction <= 15 {
            return Some(FieldValue::Float(significand as f64 / POW10[fraction]));
        }
        // Correctly rounded, as serde_json's `float_roundtrip` reads it.
        self.text[start..self.at].parse::<f64>().ok().filter(|f| f.is_finite()).map(FieldValue::Float)
    }
}

#[cfg(test)]
#[allow(clippy::print_stderr)] // the seed and the share taken, for a replay
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::super::scan::read_json;
    use super::*;
    use crate::generate::{Generator, GeneratorConfig};

    /// A generator seeded from `INFERLOG_TEST_SEED` when set (a replay),
    /// else from the clock; the seed is printed.
    fn seeded(test: &str) -> ChaCha8Rng {
        let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let seed = std::env::var("INFERLOG_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(clock);
        eprintln!("{test}: seed {seed} (replay with INFERLOG_TEST_SEED={seed})");
        ChaCha8Rng::seed_from_u64(seed)
    }

    /// Both readers on `text`: what serde's pass filed (or refused), and
    /// what this reader filed when it took the event.
    fn both(text: &str) -> (String, Option<String>) {
        let mut serde = Slots::default();
        let by_serde = match read_json(text, &mut serde) {
            Ok(()) => format!("{serde:?}"),
            Err(rejection) => format!("refused {rejection:?}"),
        };
        let mut flat = Slots::default();
        let by_flat = match read(text, &mut flat) {
            Flat::Read => Some(format!("{flat:?}")),
            Flat::Rejected(rejection) => Some(format!("refused {rejection:?}")),
            Flat::Other => None,
        };
        (by_serde, by_flat)
    }

    /// Asserts the readers agree on `text`; true when this reader took it.
    fn agree(text: &str) -> bool {
        let (by_serde, by_flat) = both(text);
        if let Some(by_flat) = &by_flat {
            assert_eq!(by_flat, &by_serde, "the readers differ on {text:?}");
        }
        by_flat.is_some()
    }

    #[test]
    fn numbers_read_as_serde_json_reads_them() {
        let taken = [
            "0",
            "7",
            "18446744073709551615",
            "0.0",
            "1.5",
            "0.1",
            "2.675",
            "123456789.123456",
            "1234567890.1234567",
            "0.30000000000000004",
            "9007199254740993.0",
            "179769313486231570000000000000000000000.5",
            "5.000",
        ];
        for number in taken {
            assert!(agree(&format!(r#"{{"input_tokens":{number}}}"#)), "{number} is left to serde");
        }
        let left = ["18446744073709551616", "01", "1.", ".5", "-1", "-0", "1e3", "1E-2", "0x10", "1.5.5", "+1", "Infinity", "1_0"];
        for number in left {
            assert!(!agree(&format!(r#"{{"input_tokens":{number}}}"#)), "{number} is taken");
        }
        // Decimals of every length, against serde_json's own parse.
        let mut rng = seeded("numbers_read_as_serde_json_reads_them");
        for _ in 0..20_000 {
            let magnitude = rng.gen_range(1..=12);
            let whole: u64 = rng.gen_range(0..10u64.pow(magnitude));
            let digits = rng.gen_range(1..=20);
            let fraction: String = (0..digits).map(|_| char::from(b'0' + rng.gen_range(0..10u8))).collect();
            assert!(agree(&format!(r#"{{"total_latency_ms":{whole}.{fraction}}}"#)));
        }
    }

    #[test]
    fn what_is_left_to_serde_and_what_is_taken() {
        let taken = [
            "{}",
            " \t\r\n{ \"request_id\" : \"r-1\" , \"model_name\":\"m\" } \n",
            r#"{"request_id":"r-1","request_id":"r-2"}"#,
            r#"{"total_latency_ms":5,"total_latency_s":0.5}"#,
            r#"{"input_tokens":1,"gen_ai.usage.input_tokens":1.0,"x":true,"y":null,"z":"é"}"#,
            r#"{"cache_hit":false,"truncated":true,"tenant":null}"#,
        ];
        for text in taken {
            assert!(agree(text), "{text} is left to serde");
        }
        let left = [
            "",
            "[]",
            r#"{"request_id":"r\u002d1"}"#,
            r#"{"request\u005fid":"r-1"}"#,
            r#"{"tags":["a"]}"#,
            r#"{"meta":{}}"#,
            r#"{"prompt":"hi"}"#,
            r#"{"request_id":"r-1",}"#,
            r#"{"request_id":"r-1"} x"#,
            r#"{"request_id":"r-1""#,
            "{\"request_id\":\"r\t1\"}",
            r#"{"request_id" "r-1"}"#,
            r#"{"cache_hit":tru}"#,
            r#"{"cache_hit":nul,"x":1}"#,
            r#"{request_id:1}"#,
        ];
        for text in left {
            assert!(!agree(text), "{text} is taken");
        }
    }

    /// Generated events of every reason code, and the same mangled byte by
    /// byte (cut, a byte replaced, a JSON token inserted): wherever this
    /// reader takes an event, it files exactly what serde's pass files.
    #[test]
    fn the_readers_agree_on_generated_and_mangled_events() {
        let mut rng = seeded("the_readers_agree_on_generated_and_mangled_events");
        let seed = rng.gen();
        let config = GeneratorConfig { seed, days: 1, end_ms: 1_793_491_200_000, invalid_ratio: 0.5 };
        const TOKENS: [&str; 16] = ["\"", "\\", ",", ":", "{", "}", "[", "]", " ", "-", ".", "e", "0", "null", "\"x\":", "\u{1}"];
        let (mut events, mut taken, mut originals_taken) = (0, 0, 0);
        for generated in Generator::new(config).take(4_000) {
            let Ok(text) = std::str::from_utf8(&generated.line) else { continue };
            let mut variants = vec![text.to_owned()];
            for _ in 0..4 {
                let mut bytes = text.as_bytes().to_vec();
                let at = rng.gen_range(0..bytes.len());
                match rng.gen_range(0..3) {
                    0 => bytes.truncate(at),
                    1 => bytes[at] = TOKENS[rng.gen_range(0..TOKENS.len())].as_bytes()[0],
                    _ => {
                        let token = TOKENS[rng.gen_range(0..TOKENS.len())];
                        bytes.splice(at..at, token.bytes());
                    }
                }
                if let Ok(text) = String::from_utf8(bytes) {
                    variants.push(text);
                }
            }
            originals_taken += usize::from(agree(&variants[0]));
            for text in &variants[1..] {
                events += 1;
                taken += usize::from(agree(text));
            }
        }
        // Most generated events are this reader's to take, and so are
        // many mangled ones: the comparison is not vacuous.
        eprintln!("taken: {originals_taken} of 4000 generated, {taken} of {events} mangled");
        assert!(originals_taken > 3_000 && taken * 5 > events, "{originals_taken} generated and {taken} mangled taken");
    }
}
