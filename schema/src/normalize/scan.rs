//! Filling the slots. In: an event's JSON text (one `serde_json` pass, no
//! tree: what `flat` leaves) or its fields as values (an OTLP span). Out: [`Slots`], each known
//! field's value as given, the first of a key given twice kept and the
//! second judged, and the names of the fields dropped.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::reason::{ReasonCode, Rejection};

use super::convert::*;
use super::fields::*;
use super::PROMPT_FIELDS;

/// A JSON object key, borrowed where it has no escapes.
pub(super) struct KeyName<'a>(pub(super) Cow<'a, str>);

impl<'de> Deserialize<'de> for KeyName<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeyName<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<KeyName<'de>, E> {
                Ok(KeyName(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyName<'de>, E> {
                Ok(KeyName(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<KeyName<'de>, E> {
                Ok(KeyName(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Everything one pass over the JSON object collected.
#[derive(Debug)]
pub(super) struct Slots<'a> {
    pub(super) fields: [Option<Given<'a>>; SLOT_COUNT],
    pub(super) durations: [[Option<Given<'a>>; UNITS.len()]; DURATIONS.len()],
    pub(super) dropped: Vec<String>,
    /// The prompt fields' values ([`PROMPT_FIELDS`] order), to hash.
    pub(super) prompt: [Option<serde_json::Value>; PROMPT_FIELDS.len()],
    /// The key whose value is being parsed, to name the field in a parse error.
    pub(super) current_key: Option<Cow<'a, str>>,
    /// A rejection found while collecting (a duplicate key, an alias conflict).
    pub(super) rejection: Option<Rejection>,
}

impl Default for Slots<'_> {
    fn default() -> Self {
        Slots {
            fields: [const { None }; SLOT_COUNT],
            durations: [const { [const { None }; UNITS.len()] }; DURATIONS.len()],
            dropped: Vec::new(),
            prompt: [const { None }; PROMPT_FIELDS.len()],
            current_key: None,
            rejection: None,
        }
    }
}

impl<'a> Slots<'a> {
    /// The value of a slot; JSON `null` counts as absent.
    pub(super) fn take(&mut self, slot: Slot) -> Option<Given<'a>> {
        self.fields[slot as usize].take().filter(|g| g.value != FieldValue::Null)
    }

    /// Files a value given under a known key (`Key::Field` or
    /// `Key::Duration`, with its static spelling `given.name`): the first
    /// value kept, a second one judged by [`Slots::second`].
    #[inline(always)]
    pub(super) fn file(&mut self, key: &Key, given: Given<'a>) -> Result<(), Rejection> {
        let target = match *key {
            Key::Field(slot, _) => &mut self.fields[slot as usize],
            Key::Duration(d, u) => &mut self.durations[d][u],
            Key::Dropped => unreachable!("a dropped key has no slot"),
        };
        match target {
            None => *target = Some(given),
            Some(first) => Slots::second(first, &given)?,
        }
        Ok(())
    }

    /// A second value for a slot that holds `first`: a duplicate key (same
    /// name) or an alias given twice (must agree). Judged by reference:
    /// the first value is stored where the visitor finds the slot empty,
    /// without moving either through here.
    pub(super) fn second(first: &Given<'a>, given: &Given<'_>) -> Result<(), Rejection> {
        if first.name == given.name {
            return Err(Rejection::new(
                ReasonCode::JsonMalformed,
                given.name,
                "key given twice in one object (which one a reader keeps is undefined)",
            ));
        }
        if first.value.same_as(&given.value) {
            return Ok(());
        }
        Err(Rejection::new(
            ReasonCode::UnitsConflict,
            first.name,
            format!("{} and {} name the same field with different values", first.name, given.name),
        ))
    }

    /// One duration in ms from whichever units were given, with the name it
    /// came under; several units must agree within 0.5 ms + 0.1%.
    pub(super) fn duration(&mut self, dur: usize) -> Result<Option<(f64, &'static str)>, Rejection> {
        let mut chosen: Option<(f64, &'static str)> = None;
        for (unit, slot) in self.durations[dur].iter_mut().enumerate() {
            let Some(given) = slot.take().filter(|g| g.value != FieldValue::Null) else { continue };
            let value = non_negative(&given)?;
            let ms = if UNITS[unit].1 >= 1.0 { value * UNITS[unit].1 } else { value / (1.0 / UNITS[unit].1).round() };
            match &chosen {
                None => chosen = Some((ms, given.name)),
                Some((first_ms, first_name)) => {
                    if (first_ms - ms).abs() > 0.5 + 0.001 * first_ms.max(ms) {
                        return Err(Rejection::new(
                            ReasonCode::UnitsConflict,
                            *first_name,
                            format!("{first_name} = {first_ms} ms but {} = {ms} ms: the same duration given twice", given.name),
                        ));
                    }
                }
            }
        }
        // The canonical `_ms` name identifies the field in later messages.
        Ok(chosen.map(|(ms, _)| (ms, CANONICAL_DURATION_NAMES[dur])))
    }
}

pub(super) const CANONICAL_DURATION_NAMES: [&str; 6] =
    ["queue_wait_ms", "prefill_time_ms", "decode_time_ms", "total_latency_ms", "ttft_ms", "tpot_ms"];

/// Reads an event's JSON `text` into `slots` (which must be empty) with
/// one `serde_json` pass, or the rejection: a key the slots refuse, a
/// number out of range (`field.range`), or malformed JSON naming the key
/// being read.
pub(super) fn read_json<'a>(text: &'a str, slots: &mut Slots<'a>) -> Result<(), Rejection> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let parsed = deserializer.deserialize_map(&mut *slots).and_then(|()| deserializer.end());
    if let Err(e) = parsed {
        if let Some(rejection) = slots.rejection.take() {
            return Err(rejection);
        }
        let field = slots.current_key.take().map_or_else(|| crate::reason::WHOLE_EVENT.to_owned(), Cow::into_owned);
        let message = e.to_string();
        let reason = if message.starts_with("number out of range") { ReasonCode::FieldRange } else { ReasonCode::JsonMalformed };
        return Err(Rejection::new(reason, field, message));
    }
    Ok(())
}

impl<'de> Visitor<'de> for &mut Slots<'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(KeyName(key)) = map.next_key::<KeyName<'de>>()? {
            let known = match classify(&key) {
                Key::Dropped => {
                    if let Some(i) = PROMPT_FIELDS.iter().position(|f| *f == key.as_ref()) {
                        self.current_key = Some(key);
                        self.prompt[i] = Some(map.next_value::<serde_json::Value>()?);
                    } else {
                        self.current_key = Some(key);
                        map.next_value::<IgnoredAny>()?;
                    }
                    if let Some(key) = self.current_key.take() {
                        self.dropped.push(key.into_owned());
                    }
                    continue;
                }
                known => known,
            };
            let name = known.name();
            self.current_key = Some(Cow::Borrowed(name));
            let value = map.next_value::<FieldValue<'de>>()?;
            if let Err(rejection) = self.file(&known, Given { name, value }) {
                self.rejection = Some(rejection);
                return Err(de::Error::custom("rejected"));
            }
            self.current_key = None;
        }
        Ok(())
    }
}

/// An event's fields as a decoder other than JSON reads them, in the
/// order a JSON object would list them: what [`Contract::normalize_fields`]
/// checks. A key is filed as the JSON scanner files it (contract names,
/// aliases, durations in any unit; other keys are dropped), and a key given
/// twice is judged as in JSON.
#[derive(Debug, Default)]
pub struct Fields<'a> {
    pub(super) slots: Slots<'a>,
}

/// A key the contract knows (a field, an alias or a duration in some
/// unit), classified once ([`FieldKey::of`]) so that a decoder that reads
/// the same names in every event files its values without comparing names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldKey(Key);

impl FieldKey {
    /// `name` classified as the JSON scanner classifies a key; `None` for
    /// a key it drops (a prompt field among them).
    pub fn of(name: &str) -> Option<FieldKey> {
        match classify(name) {
            Key::Dropped => None,
            known => Some(FieldKey(known)),
        }
    }
}

impl<'a> Fields<'a> {
    /// Adds `key` = `value`. A prompt field ([`PROMPT_FIELDS`]) is
    /// dropped here unhashed: a decoder that carries prompts uses JSON.
    pub fn insert(&mut self, key: &str, value: FieldValue<'a>) {
        match FieldKey::of(key) {
            Some(known) => self.insert_known(known, value),
            None if self.slots.rejection.is_none() => self.slots.dropped.push(key.to_owned()),
            None => {}
        }
    }

    /// [`Fields::insert`] under a key classified beforehand.
    #[inline]
    pub fn insert_known(&mut self, key: FieldKey, value: FieldValue<'a>) {
        if self.slots.rejection.is_some() {
            return;
        }
        if let Err(rejection) = self.slots.file(&key.0, Given { name: key.0.name(), value }) {
            self.slots.rejection = Some(rejection);
        }
    }
}
