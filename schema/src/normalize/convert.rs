//! Value conversions. In: a field's value as given. Out: the value the
//! normalized event holds, or the rejection naming the field as the
//! producer spelled it.

use std::borrow::Cow;

use crate::hash::UserIdHasher;
use crate::pii;
use crate::reason::{ReasonCode, Rejection};

use super::fields::*;
use super::{MAX_PROMPT_HASH_CHARS, MAX_USER_ID_CHARS};

/// `s` without leading and trailing white space, as [`str::trim`] has
/// it; a value that starts and ends with a printable ASCII byte (never
/// white space) is returned as it is, without a look at its characters.
pub(super) fn trimmed(s: &str) -> &str {
    let printable = |b: Option<&u8>| b.is_some_and(|b| (0x21..0x7f).contains(b));
    if printable(s.as_bytes().first()) && printable(s.as_bytes().last()) {
        s
    } else {
        s.trim()
    }
}

pub(super) fn type_error(name: &str, expected: &str, got: &FieldValue<'_>) -> Rejection {
    Rejection::new(ReasonCode::FieldType, name, format!("expected {expected}, got {}", got.kind()))
}

pub(super) fn required<T>(
    given: Option<Given<'_>>,
    slot: Slot,
    convert: impl FnOnce(Given<'_>) -> Result<Option<T>, Rejection>,
) -> Result<T, Rejection> {
    match given {
        None => Err(Rejection::new(ReasonCode::FieldMissing, slot.canonical(), "is required")),
        Some(g) => {
            let name = g.name;
            convert(g)?.ok_or_else(|| Rejection::new(ReasonCode::FieldMissing, name, "is required but empty"))
        }
    }
}

pub(super) fn optional<T>(given: Option<Given<'_>>, convert: impl FnOnce(Given<'_>) -> Result<Option<T>, Rejection>) -> Result<Option<T>, Rejection> {
    given.map_or(Ok(None), convert)
}

/// Trimmed text of at most `max_chars` characters, without control
/// characters or personal data; `None` when empty after trimming.
pub(super) fn text(g: &Given<'_>, max_chars: usize) -> Result<Option<String>, Rejection> {
    let name = g.name;
    let FieldValue::Str(s) = &g.value else { return Err(type_error(name, "a string", &g.value)) };
    let s = trimmed(s);
    if s.is_empty() {
        return Ok(None);
    }
    // One pass over the bytes settles the common all-ASCII case (only
    // non-ASCII text needs the per-character checks) and takes the
    // personal-data pre-check.
    let (mut control, mut non_ascii, mut signs) = (false, false, pii::Signs::default());
    for &c in s.as_bytes() {
        control |= c < 0x20 || c == 0x7f;
        non_ascii |= c >= 0x80;
        signs.add(c);
    }
    if control || (non_ascii && s.chars().any(char::is_control)) {
        return Err(Rejection::new(ReasonCode::FieldFormat, name, "contains control characters"));
    }
    let chars = if non_ascii { s.chars().count() } else { s.len() };
    if chars > max_chars {
        return Err(Rejection::new(ReasonCode::FieldRange, name, format!("is {chars} characters; at most {max_chars}")));
    }
    if let Some(kind) = signs.detect(s) {
        return Err(Rejection::new(ReasonCode::PiiDetected, name, kind.describe()));
    }
    Ok(Some(s.to_owned()))
}

/// The bytes a request id may hold: `[A-Za-z0-9._:-]`.
pub(super) const REQUEST_ID_BYTES: [bool; 256] = {
    let mut allowed = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        allowed[b] = c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-');
        b += 1;
    }
    allowed
};

pub(super) fn request_id(g: &Given<'_>) -> Result<Option<String>, Rejection> {
    let name = g.name;
    let FieldValue::Str(s) = &g.value else { return Err(type_error(name, "a string", &g.value)) };
    let s = trimmed(s);
    if s.is_empty() {
        return Ok(None);
    }
    if s.len() > 128 {
        return Err(Rejection::new(ReasonCode::FieldRange, name, format!("is {} characters; at most 128", s.chars().count())));
    }
    // Every allowed character is ASCII, so a byte scan finds the first
    // one that is not (at a character boundary: the bytes before it are ASCII).
    if let Some(at) = s.bytes().position(|b| !REQUEST_ID_BYTES[usize::from(b)]) {
        let bad = s[at..].chars().next().unwrap_or_default();
        return Err(Rejection::new(ReasonCode::FieldFormat, name, format!("{bad:?} is not allowed; use [A-Za-z0-9._:-]")));
    }
    Ok(Some(s.to_owned()))
}

/// What the DLQ's redacted copy of a reject holds in place of a
/// `user_id` or `prompt_hash` the contract refused (the plaintext is never
/// kept): this prefix and the reason code. The contract refuses such a
/// value again with that reason, so `dlq replay` refuses what live ingest
/// refused (docs/contract.md, "The DLQ").
pub const REFUSED_MARK: &str = "inferlog.refused:";

/// The value a redacted reject holds for a keyed field the contract refused.
pub fn refused_mark(rejection: &Rejection) -> String {
    format!("{REFUSED_MARK}{}", rejection.reason.as_str())
}

/// The contract's rule for a `user_id` as it arrives (a JSON value), the
/// one live ingest applies: its stored form (the keyed hash of the trimmed
/// string; a digest under this key is kept), `None` when null or blank,
/// or the rejection (`field.type`, `field.range`). The DLQ's redactor
/// applies it too, so a replayed reject is hashed as its live twin was.
pub fn stored_user_id(value: &serde_json::Value, hasher: &UserIdHasher) -> Result<Option<String>, Rejection> {
    let Some(value) = raw_of(value) else { return Ok(None) };
    user_id(&Given { name: "user_id", value }, Some(hasher))
}

/// The contract's rule for a producer's `prompt_hash` (a JSON value): its
/// stored form, `None` when null or blank (the prompt text then decides),
/// or the rejection.
pub fn stored_prompt_hash(value: &serde_json::Value, hasher: &UserIdHasher) -> Result<Option<String>, Rejection> {
    let Some(value) = raw_of(value) else { return Ok(None) };
    Ok(prompt_hash(&Given { name: "prompt_hash", value })?.map(|given| if hasher.is_own_digest(&given) { given } else { hasher.hash_prompt(&given) }))
}

/// A JSON value as the scanner would have read it; `None` for null (absent).
pub(super) fn raw_of(value: &serde_json::Value) -> Option<FieldValue<'_>> {
    use serde_json::Value;
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => FieldValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => FieldValue::Int(i),
            (None, Some(u)) => FieldValue::UInt(u),
            _ => FieldValue::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => FieldValue::Str(Cow::Borrowed(s)),
        Value::Array(_) => FieldValue::Array,
        Value::Object(_) => FieldValue::Object,
    })
}

/// A value stored only as its keyed hash (`user_id`, `prompt_hash`): a
/// string, trimmed, of at most `max_chars` characters; `None` when empty.
/// A [`REFUSED_MARK`] is refused with the reason it names.
pub(super) fn to_hash<'g>(g: &'g Given<'_>, max_chars: usize) -> Result<Option<&'g str>, Rejection> {
    let name = g.name;
    let FieldValue::Str(s) = &g.value else { return Err(type_error(name, "a string", &g.value)) };
    if let Some(reason) = s.strip_prefix(REFUSED_MARK) {
        let reason = ReasonCode::from_str_code(reason).unwrap_or(ReasonCode::FieldFormat);
        return Err(Rejection::new(reason, name, "was refused when received; the DLQ kept no value (the producer must resend it)"));
    }
    let s = trimmed(s);
    if s.is_empty() {
        return Ok(None);
    }
    let chars = s.chars().count();
    if chars > max_chars {
        return Err(Rejection::new(ReasonCode::FieldRange, name, format!("is {chars} characters; at most {max_chars}")));
    }
    Ok(Some(s))
}

/// A producer's `prompt_hash`, trimmed (hashed again under the key before
/// it is stored, as a `user_id` is); `None` when empty.
pub(super) fn prompt_hash(g: &Given<'_>) -> Result<Option<String>, Rejection> {
    let Some(s) = to_hash(g, MAX_PROMPT_HASH_CHARS)? else { return Ok(None) };
    if s.chars().any(char::is_control) {
        return Err(Rejection::new(ReasonCode::FieldFormat, g.name, "contains control characters"));
    }
    Ok(Some(s.to_owned()))
}

/// The text a prompt is hashed from: a string trimmed; an array or object
/// (chat messages) as compact JSON with every object's keys sorted, so the
/// same messages hash alike however a producer spaced or ordered them.
/// `None` for an empty string or a value that is not text.
pub fn prompt_text(value: &serde_json::Value) -> Option<Cow<'_, str>> {
    use serde_json::Value;
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), sorted(v))).collect())
            }
            other => other.clone(),
        }
    }
    match value {
        Value::String(s) => Some(Cow::Borrowed(s.trim())).filter(|t| !t.is_empty()),
        Value::Array(_) | Value::Object(_) => Some(Cow::Owned(sorted(value).to_string())),
        _ => None,
    }
}

pub(super) fn user_id(g: &Given<'_>, hasher: Option<&UserIdHasher>) -> Result<Option<String>, Rejection> {
    let Some(s) = to_hash(g, MAX_USER_ID_CHARS)? else { return Ok(None) };
    Ok(hasher.map(|h| if h.is_own_digest(s) { s.to_owned() } else { h.hash(s) }))
}

/// Any integer (a JSON number without a fraction; `5.0` counts).
pub(super) fn integer(g: &Given<'_>) -> Result<i128, Rejection> {
    let name = g.name;
    match g.value {
        FieldValue::Int(i) => Ok(i.into()),
        FieldValue::UInt(u) => Ok(u.into()),
        FieldValue::Float(f) if f.fract() == 0.0 && f.abs() < 1e38 => Ok(f as i128),
        FieldValue::Float(f) if f.fract() == 0.0 => Err(Rejection::new(ReasonCode::FieldRange, name, format!("{f} is out of range"))),
        FieldValue::Float(f) => Err(Rejection::new(ReasonCode::FieldType, name, format!("expected an integer, got {f}"))),
        ref other => Err(type_error(name, "an integer", other)),
    }
}

pub(super) fn unsigned(g: &Given<'_>, max: u64) -> Result<u64, Rejection> {
    let v = integer(g)?;
    if v < 0 {
        return Err(Rejection::new(ReasonCode::FieldRange, g.name, format!("must be ≥ 0, got {v}")));
    }
    u64::try_from(v)
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| Rejection::new(ReasonCode::FieldRange, g.name, format!("{v} exceeds the maximum {max}")))
}

/// A number ≥ 0; `-0` becomes `0`.
pub(super) fn non_negative(g: &Given<'_>) -> Result<f64, Rejection> {
    let Some(v) = g.value.as_f64() else { return Err(type_error(g.name, "a number", &g.value)) };
    if v < 0.0 {
        return Err(Rejection::new(ReasonCode::FieldRange, g.name, format!("must be ≥ 0, got {v}")));
    }
    Ok(if v == 0.0 { 0.0 } else { v })
}

pub(super) fn boolean(g: &Given<'_>) -> Result<bool, Rejection> {
    match g.value {
        FieldValue::Bool(b) => Ok(b),
        ref other => Err(type_error(g.name, "true or false", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::trimmed;

    #[test]
    fn trimmed_is_str_trim() {
        let pieces = ["", "a", " ", "\t", "\u{a0}", "\u{2003}", "\u{3000}", "é", "~", "!", "\u{7f}", "\u{1}", "x y", "\n"];
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let s = format!("{a}{b}{c}");
                    assert_eq!(trimmed(&s), s.trim(), "{s:?}");
                }
            }
        }
    }
}
