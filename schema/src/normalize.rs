//! The per-event stage. In: the raw bytes of one Kafka message. Out: a
//! normalized [`InferenceEvent`] plus the names of the fields it dropped,
//! or a [`Rejection`] naming the reason code and the field.
//!
//! Parsing is one pass of `serde_json` over the bytes into borrowed slots
//! (no `serde_json::Value` tree), because this runs for every message at
//! hundreds of thousands of events per second. Checks then run in contract
//! order, so the reason reported for an event with several problems is
//! deterministic: the first field in docs/contract.md §1 order that is wrong.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::config::{ContractConfig, ErrorDictionary};
use crate::error::SchemaError;
use crate::event::{ErrorStage, InferenceEvent};
use crate::hash::UserIdHasher;
use crate::pii;
use crate::reason::{ReasonCode, Rejection};
use crate::timestamp::{parse_rfc3339_ms, TimestampError};

/// Earliest plausible event time: 2000-01-01T00:00:00Z. Anything earlier is
/// a unit mistake (epoch seconds given as ms), whatever `--now` says.
pub const MIN_PLAUSIBLE_MS: i64 = 946_684_800_000;
/// Latest plausible event time: 2100-01-01T00:00:00Z (epoch µs given as ms land far beyond).
pub const MAX_PLAUSIBLE_MS: i64 = 4_102_444_800_000;

/// Fields whose content is prompt or completion text: always dropped, never stored.
pub const CONTENT_FIELDS: [&str; 6] = ["prompt", "completion", "messages", "input", "output", "response"];

/// Content fields that carry the prompt: the first of them (in this
/// order) that an event carries is hashed into `prompt_hash` (when the producer sent none) before
/// it is dropped.
pub const PROMPT_FIELDS: [&str; 3] = ["prompt", "messages", "input"];

/// Longest accepted `prompt_hash` before hashing, in characters.
const MAX_PROMPT_HASH_CHARS: usize = 256;

/// Longest accepted `user_id` before hashing, in characters.
const MAX_USER_ID_CHARS: usize = 1024;

/// The event contract, ready to apply: validated config plus the error dictionary.
#[derive(Debug, Clone)]
pub struct Contract {
    config: ContractConfig,
    dictionary: ErrorDictionary,
}

/// A normalized event and what was dropped from it on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    pub event: InferenceEvent,
    /// Names of unknown and content fields that were dropped, in input order.
    pub dropped_fields: Vec<String>,
}

impl Contract {
    pub fn new(config: &ContractConfig) -> Result<Contract, SchemaError> {
        let dictionary = config.validate()?;
        Ok(Contract { config: config.clone(), dictionary })
    }

    pub fn config(&self) -> &ContractConfig {
        &self.config
    }

    pub fn dictionary(&self) -> &ErrorDictionary {
        &self.dictionary
    }

    /// Validates one event without a hash key (the producers' CI step).
    /// Returns the dropped field names. Time bounds apply only with `now_ms`.
    pub fn check(&self, bytes: &[u8], now_ms: Option<i64>) -> Result<Vec<String>, Rejection> {
        self.parse(bytes, now_ms, None).map(|n| n.dropped_fields)
    }

    /// Validates and normalizes one event, hashing `user_id` under `hasher`.
    pub fn normalize(&self, bytes: &[u8], now_ms: Option<i64>, hasher: &UserIdHasher) -> Result<Normalized, Rejection> {
        self.parse(bytes, now_ms, Some(hasher))
    }

    fn parse(&self, bytes: &[u8], now_ms: Option<i64>, hasher: Option<&UserIdHasher>) -> Result<Normalized, Rejection> {
        if bytes.len() > self.config.max_event_bytes {
            return Err(Rejection::whole_event(
                ReasonCode::EventTooLarge,
                format!("event is {} bytes; the limit is {}", bytes.len(), self.config.max_event_bytes),
            ));
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|e| Rejection::whole_event(ReasonCode::JsonMalformed, format!("not valid UTF-8 at byte {}", e.valid_up_to())))?;
        if text.trim_start().as_bytes().first() != Some(&b'{') {
            return Err(match serde_json::from_str::<IgnoredAny>(text) {
                Ok(_) => Rejection::whole_event(ReasonCode::JsonNotObject, "the event must be a JSON object"),
                Err(e) => Rejection::whole_event(ReasonCode::JsonMalformed, e.to_string()),
            });
        }
        let mut slots = Slots::default();
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let parsed = deserializer.deserialize_map(&mut slots).and_then(|()| deserializer.end());
        if let Err(e) = parsed {
            if let Some(rejection) = slots.rejection.take() {
                return Err(rejection);
            }
            let field = slots.current_key.take().map_or_else(|| crate::reason::WHOLE_EVENT.to_owned(), Cow::into_owned);
            let message = e.to_string();
            let reason = if message.starts_with("number out of range") { ReasonCode::FieldRange } else { ReasonCode::JsonMalformed };
            return Err(Rejection::new(reason, field, message));
        }
        let event = self.assemble(&mut slots, now_ms, hasher)?;
        Ok(Normalized { event, dropped_fields: slots.dropped })
    }

    /// [`Contract::normalize`] of an event another decoder read into
    /// [`Fields`] (an OTLP span's attributes): the same checks, reasons and
    /// result as the JSON object of those fields, with no JSON in between.
    /// The caller keeps the event within `max_event_bytes` as JSON
    /// ([`Fields`] cannot measure that).
    pub fn normalize_fields(&self, fields: Fields<'_>, now_ms: Option<i64>, hasher: &UserIdHasher) -> Result<Normalized, Rejection> {
        let mut slots = fields.slots;
        if let Some(rejection) = slots.rejection.take() {
            return Err(rejection);
        }
        let event = self.assemble(&mut slots, now_ms, Some(hasher))?;
        Ok(Normalized { event, dropped_fields: slots.dropped })
    }

    fn assemble(&self, s: &mut Slots<'_>, now_ms: Option<i64>, hasher: Option<&UserIdHasher>) -> Result<InferenceEvent, Rejection> {
        let request_id = required(s.take(Slot::RequestId), Slot::RequestId, |g| request_id(&g))?;
        let timestamp_ms = required(s.take(Slot::Timestamp), Slot::Timestamp, |g| self.timestamp(&g, now_ms))?;
        let model_name = required(s.take(Slot::ModelName), Slot::ModelName, |g| text(&g, 128))?;
        let model_version = required(s.take(Slot::ModelVersion), Slot::ModelVersion, |g| text(&g, 64))?;
        let input_tokens = required(s.take(Slot::InputTokens), Slot::InputTokens, |g| unsigned(&g, u32::MAX.into()).map(Some))? as u32;
        let output_tokens = required(s.take(Slot::OutputTokens), Slot::OutputTokens, |g| unsigned(&g, u32::MAX.into()).map(Some))? as u32;

        let mut durations = [None; DURATIONS.len()];
        for (dur, out) in durations.iter_mut().enumerate() {
            *out = s.duration(dur)?;
        }
        let [queue, prefill, decode, total, ttft, tpot] = durations;
        let total = total.ok_or_else(|| Rejection::new(ReasonCode::FieldMissing, "total_latency_ms", "is required"))?;

        let error_code = required(s.take(Slot::ErrorCode), Slot::ErrorCode, |g| {
            let code = integer(&g)?;
            let code = i32::try_from(code)
                .ok()
                .filter(|c| self.dictionary.get(*c).is_some())
                .ok_or_else(|| Rejection::new(ReasonCode::ErrorCodeUnknown, g.name, format!("{code} is not in the error dictionary")))?;
            Ok(Some(code))
        })?;
        let error_stage = optional(s.take(Slot::ErrorStage), |g| {
            let stage = text(&g, 32)?;
            stage
                .map(|stage| {
                    ErrorStage::parse(&stage).ok_or_else(|| {
                        Rejection::new(
                            ReasonCode::FieldFormat,
                            g.name,
                            format!("{stage:?} is not one of gateway, queue, prefill, decode, postprocess"),
                        )
                    })
                })
                .transpose()
        })?;
        match (error_code, error_stage) {
            (0, Some(_)) => return Err(Rejection::new(ReasonCode::FieldFormat, "error_stage", "is only allowed when error_code is not 0")),
            (code, None) if code != 0 => {
                return Err(Rejection::new(
                    ReasonCode::ErrorStageMissing,
                    "error_stage",
                    format!("is required when error_code is not 0 (got {code})"),
                ))
            }
            _ => {}
        }

        let business_line = optional(s.take(Slot::BusinessLine), |g| text(&g, 64))?.unwrap_or_else(|| "unknown".to_owned());
        let user_id_hash = optional(s.take(Slot::UserId), |g| user_id(&g, hasher))?;
        let tenant = optional(s.take(Slot::Tenant), |g| text(&g, 128))?;
        let session_id = optional(s.take(Slot::SessionId), |g| text(&g, 128))?;
        let request_type = optional(s.take(Slot::RequestType), |g| text(&g, 128))?;
        let gpu_id = optional(s.take(Slot::GpuId), |g| unsigned(&g, u32::MAX.into()).map(|v| Some(v as u32)))?;
        let batch_size = optional(s.take(Slot::BatchSize), |g| match unsigned(&g, u32::MAX.into())? {
            0 => Err(Rejection::new(ReasonCode::FieldRange, g.name, "must be at least 1")),
            n => Ok(Some(n as u32)),
        })?;
        let cache_hit = optional(s.take(Slot::CacheHit), |g| boolean(&g).map(Some))?;
        let cache_prefix_tokens = optional(s.take(Slot::CachePrefixTokens), |g| {
            let n = unsigned(&g, u32::MAX.into())?;
            if n > u64::from(input_tokens) {
                return Err(Rejection::new(ReasonCode::FieldRange, g.name, format!("{n} exceeds input_tokens ({input_tokens})")));
            }
            Ok(Some(n as u32))
        })?;
        let gpu_mem_peak_mb = optional(s.take(Slot::GpuMemPeakMb), |g| non_negative(&g).map(Some))?;
        let truncated = optional(s.take(Slot::Truncated), |g| boolean(&g).map(Some))?;
        let prompt_hash = match optional(s.take(Slot::PromptHash), |g| prompt_hash(&g))? {
            Some(given) => hasher.map(|h| if h.is_own_digest(&given) { given } else { h.hash_prompt(&given) }),
            None => s.prompt.iter().flatten().find_map(prompt_text).and_then(|text| hasher.map(|h| h.hash_prompt(&text))),
        };
        let max_tokens = optional(s.take(Slot::MaxTokens), |g| match unsigned(&g, u32::MAX.into())? {
            0 => Err(Rejection::new(ReasonCode::FieldRange, g.name, "must be at least 1")),
            n => Ok(Some(n as u32)),
        })?;

        // Consistency: a stage sum or TTFT beyond the total almost always
        // means seconds were mixed with milliseconds.
        let (total_ms, total_name) = total;
        let stage_sum: f64 = [queue, prefill, decode].iter().flatten().map(|(v, _)| v).sum();
        if stage_sum > total_ms * 1.05 + 5.0 {
            return Err(Rejection::new(
                ReasonCode::UnitsInconsistent,
                total_name,
                format!(
                    "queue + prefill + decode = {stage_sum} ms exceeds total_latency = {total_ms} ms by more than 5% + 5 ms (seconds mixed with milliseconds?)"
                ),
            ));
        }
        if let Some((ttft_ms, name)) = ttft {
            if ttft_ms > total_ms {
                return Err(Rejection::new(
                    ReasonCode::UnitsInconsistent,
                    name,
                    format!("ttft = {ttft_ms} ms exceeds total_latency = {total_ms} ms"),
                ));
            }
        }
        let value = |d: Option<(f64, &str)>| d.map(|(v, _)| v);
        let (queue, prefill, decode) = (value(queue), value(prefill), value(decode));
        let ttft_ms = value(ttft).or_else(|| Some((queue? + prefill?).min(total_ms)));
        let tpot_ms = value(tpot).or_else(|| (output_tokens > 1).then(|| decode.map(|d| d / f64::from(output_tokens - 1))).flatten());

        Ok(InferenceEvent {
            request_id,
            timestamp_ms,
            model_name,
            model_version,
            business_line,
            input_tokens,
            output_tokens,
            total_latency_ms: total_ms,
            error_code,
            error_stage,
            user_id_hash,
            tenant,
            session_id,
            request_type,
            queue_wait_ms: queue,
            prefill_time_ms: prefill,
            decode_time_ms: decode,
            ttft_ms,
            tpot_ms,
            gpu_id,
            batch_size,
            cache_hit,
            cache_prefix_tokens,
            gpu_mem_peak_mb,
            truncated,
            prompt_hash,
            max_tokens,
        })
    }

    fn timestamp(&self, g: &Given<'_>, now_ms: Option<i64>) -> Result<Option<i64>, Rejection> {
        let name = g.name;
        let ms = match &g.value {
            FieldValue::Str(s) => match parse_rfc3339_ms(s.trim()) {
                Ok(ms) => ms,
                Err(TimestampError::Naive) => {
                    return Err(Rejection::new(ReasonCode::TimestampNaive, name, format!("{s:?} has no time-zone offset; add Z or ±hh:mm")))
                }
                Err(TimestampError::Malformed(why)) => return Err(Rejection::new(ReasonCode::FieldFormat, name, format!("{s:?}: {why}"))),
            },
            FieldValue::Int(_) | FieldValue::UInt(_) | FieldValue::Float(_) => {
                let v = integer(g)?;
                i64::try_from(v)
                    .map_err(|_| Rejection::new(ReasonCode::TimestampOutOfRange, name, format!("{v} is not a plausible epoch-ms time")))?
            }
            other => return Err(type_error(name, "an RFC 3339 string or integer epoch milliseconds", other)),
        };
        if !(MIN_PLAUSIBLE_MS..MAX_PLAUSIBLE_MS).contains(&ms) {
            let hint = match &g.value {
                FieldValue::Str(_) => "",
                _ if (MIN_PLAUSIBLE_MS / 1000..MAX_PLAUSIBLE_MS / 1000).contains(&ms) => " (looks like epoch seconds; milliseconds are expected)",
                _ if (MIN_PLAUSIBLE_MS.saturating_mul(1000)..MAX_PLAUSIBLE_MS.saturating_mul(1000)).contains(&ms) => {
                    " (looks like epoch microseconds; milliseconds are expected)"
                }
                _ => "",
            };
            return Err(Rejection::new(
                ReasonCode::TimestampOutOfRange,
                name,
                format!("{} is outside 2000-01-01..2100-01-01{hint}", crate::timestamp::format_rfc3339_ms(ms)),
            ));
        }
        if let Some(now) = now_ms {
            let skew = self.config.max_future_skew.as_millis() as i64;
            let max_age = i64::try_from(self.config.max_event_age.as_millis()).unwrap_or(i64::MAX);
            if ms > now.saturating_add(skew) {
                return Err(Rejection::new(
                    ReasonCode::TimestampOutOfRange,
                    name,
                    format!(
                        "{} is more than {} in the future",
                        crate::timestamp::format_rfc3339_ms(ms),
                        humantime::format_duration(self.config.max_future_skew)
                    ),
                ));
            }
            if ms < now.saturating_sub(max_age) {
                return Err(Rejection::new(
                    ReasonCode::TimestampOutOfRange,
                    name,
                    format!(
                        "{} is older than the hot-tier retention ({})",
                        crate::timestamp::format_rfc3339_ms(ms),
                        humantime::format_duration(self.config.max_event_age)
                    ),
                ));
            }
        }
        Ok(Some(ms))
    }
}

// ---------------------------------------------------------------------------
// Field slots: where each JSON key goes.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    RequestId,
    Timestamp,
    ModelName,
    ModelVersion,
    InputTokens,
    OutputTokens,
    ErrorCode,
    ErrorStage,
    BusinessLine,
    UserId,
    Tenant,
    SessionId,
    RequestType,
    GpuId,
    BatchSize,
    CacheHit,
    CachePrefixTokens,
    GpuMemPeakMb,
    Truncated,
    PromptHash,
    MaxTokens,
}

const SLOT_COUNT: usize = Slot::MaxTokens as usize + 1;

impl Slot {
    /// The contract name, used when the field is missing altogether.
    const fn canonical(self) -> &'static str {
        match self {
            Slot::RequestId => "request_id",
            Slot::Timestamp => "timestamp",
            Slot::ModelName => "model_name",
            Slot::ModelVersion => "model_version",
            Slot::InputTokens => "input_tokens",
            Slot::OutputTokens => "output_tokens",
            Slot::ErrorCode => "error_code",
            Slot::ErrorStage => "error_stage",
            Slot::BusinessLine => "business_line",
            Slot::UserId => "user_id",
            Slot::Tenant => "tenant",
            Slot::SessionId => "session_id",
            Slot::RequestType => "request_type",
            Slot::GpuId => "gpu_id",
            Slot::BatchSize => "batch_size",
            Slot::CacheHit => "cache_hit",
            Slot::CachePrefixTokens => "cache_prefix_tokens",
            Slot::GpuMemPeakMb => "gpu_mem_peak_mb",
            Slot::Truncated => "truncated",
            Slot::PromptHash => "prompt_hash",
            Slot::MaxTokens => "max_tokens",
        }
    }
}

/// Duration base names, in slot order; each takes a `_ms`, `_s`, `_us` or `_ns` suffix.
pub const DURATIONS: [&str; 6] = ["queue_wait", "prefill_time", "decode_time", "total_latency", "ttft", "tpot"];

/// Duration unit suffixes with their factor to milliseconds, finest first so
/// that when several agree the most precise value is kept.
pub const UNITS: [(&str, f64); 4] = [("ns", 1e-6), ("us", 1e-3), ("ms", 1.0), ("s", 1e3)];

/// Every accepted duration key, `[duration][unit]` in `DURATIONS` × `UNITS` order.
const DURATION_KEYS: [[&str; 4]; 6] = [
    ["queue_wait_ns", "queue_wait_us", "queue_wait_ms", "queue_wait_s"],
    ["prefill_time_ns", "prefill_time_us", "prefill_time_ms", "prefill_time_s"],
    ["decode_time_ns", "decode_time_us", "decode_time_ms", "decode_time_s"],
    ["total_latency_ns", "total_latency_us", "total_latency_ms", "total_latency_s"],
    ["ttft_ns", "ttft_us", "ttft_ms", "ttft_s"],
    ["tpot_ns", "tpot_us", "tpot_ms", "tpot_s"],
];

/// Where a key goes. Known keys carry their static spelling, so slots
/// never hold a copy of the key.
enum Key {
    Field(Slot, &'static str),
    Duration(usize, usize),
    Dropped,
}

impl Key {
    /// A known key's static spelling ("" for a dropped one).
    fn name(&self) -> &'static str {
        match *self {
            Key::Field(_, name) => name,
            Key::Duration(d, u) => DURATION_KEYS[d][u],
            Key::Dropped => "",
        }
    }
}

fn classify(key: &str) -> Key {
    let (slot, name) = match key {
        "request_id" => (Slot::RequestId, "request_id"),
        "gen_ai.response.id" => (Slot::RequestId, "gen_ai.response.id"),
        "timestamp" => (Slot::Timestamp, "timestamp"),
        "model_name" => (Slot::ModelName, "model_name"),
        "gen_ai.request.model" => (Slot::ModelName, "gen_ai.request.model"),
        "model_version" => (Slot::ModelVersion, "model_version"),
        "input_tokens" => (Slot::InputTokens, "input_tokens"),
        "gen_ai.usage.input_tokens" => (Slot::InputTokens, "gen_ai.usage.input_tokens"),
        "gen_ai.usage.prompt_tokens" => (Slot::InputTokens, "gen_ai.usage.prompt_tokens"),
        "output_tokens" => (Slot::OutputTokens, "output_tokens"),
        "gen_ai.usage.output_tokens" => (Slot::OutputTokens, "gen_ai.usage.output_tokens"),
        "gen_ai.usage.completion_tokens" => (Slot::OutputTokens, "gen_ai.usage.completion_tokens"),
        "error_code" => (Slot::ErrorCode, "error_code"),
        "error_stage" => (Slot::ErrorStage, "error_stage"),
        "business_line" => (Slot::BusinessLine, "business_line"),
        "user_id" => (Slot::UserId, "user_id"),
        "tenant" => (Slot::Tenant, "tenant"),
        "session_id" => (Slot::SessionId, "session_id"),
        "request_type" => (Slot::RequestType, "request_type"),
        "gpu_id" => (Slot::GpuId, "gpu_id"),
        "batch_size" => (Slot::BatchSize, "batch_size"),
        "cache_hit" => (Slot::CacheHit, "cache_hit"),
        "cache_prefix_tokens" => (Slot::CachePrefixTokens, "cache_prefix_tokens"),
        "gen_ai.usage.cache_read.input_tokens" => (Slot::CachePrefixTokens, "gen_ai.usage.cache_read.input_tokens"),
        "gpu_mem_peak_mb" => (Slot::GpuMemPeakMb, "gpu_mem_peak_mb"),
        "truncated" => (Slot::Truncated, "truncated"),
        "prompt_hash" => (Slot::PromptHash, "prompt_hash"),
        "max_tokens" => (Slot::MaxTokens, "max_tokens"),
        "gen_ai.request.max_tokens" => (Slot::MaxTokens, "gen_ai.request.max_tokens"),
        _ => {
            return key
                .rsplit_once('_')
                .and_then(|(base, unit)| {
                    let d = DURATIONS.iter().position(|b| *b == base)?;
                    let u = UNITS.iter().position(|(suffix, _)| *suffix == unit)?;
                    Some(Key::Duration(d, u))
                })
                .unwrap_or(Key::Dropped)
        }
    };
    Key::Field(slot, name)
}

/// One field's value as given: a JSON value borrowed from the input where
/// it has no escapes, or a value another decoder read (an OTLP attribute,
/// [`Fields`]). Arrays and objects are skipped, only their kind is kept.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(Cow<'a, str>),
    Array,
    Object,
}

impl FieldValue<'_> {
    fn kind(&self) -> &'static str {
        match self {
            FieldValue::Null => "null",
            FieldValue::Bool(_) => "a boolean",
            FieldValue::Int(_) | FieldValue::UInt(_) | FieldValue::Float(_) => "a number",
            FieldValue::Str(_) => "a string",
            FieldValue::Array => "an array",
            FieldValue::Object => "an object",
        }
    }

    fn as_f64(&self) -> Option<f64> {
        match *self {
            FieldValue::Int(i) => Some(i as f64),
            FieldValue::UInt(u) => Some(u as f64),
            FieldValue::Float(f) => Some(f),
            _ => None,
        }
    }

    /// Equal as JSON values, with numbers compared by value (`5` == `5.0`).
    fn same_as(&self, other: &FieldValue<'_>) -> bool {
        match (self.as_f64(), other.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => match (self, other) {
                (FieldValue::Str(a), FieldValue::Str(b)) => a.trim() == b.trim(),
                (a, b) => a.kind() == b.kind() && format!("{a:?}") == format!("{b:?}"),
            },
        }
    }
}

impl<'de> Deserialize<'de> for FieldValue<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RawVisitor;
        impl<'de> Visitor<'de> for RawVisitor {
            type Value = FieldValue<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::UInt(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::Float(v))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<FieldValue<'de>, E> {
                Ok(FieldValue::Str(Cow::Owned(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FieldValue<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(FieldValue::Array)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FieldValue<'de>, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(FieldValue::Object)
            }
        }
        deserializer.deserialize_any(RawVisitor)
    }
}

/// A JSON object key, borrowed where it has no escapes.
struct KeyName<'a>(Cow<'a, str>);

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

/// A value as given, with the name the producer used for it.
#[derive(Debug)]
struct Given<'a> {
    name: &'static str,
    value: FieldValue<'a>,
}

/// Everything one pass over the JSON object collected.
#[derive(Debug)]
struct Slots<'a> {
    fields: [Option<Given<'a>>; SLOT_COUNT],
    durations: [[Option<Given<'a>>; UNITS.len()]; DURATIONS.len()],
    dropped: Vec<String>,
    /// The prompt fields' values ([`PROMPT_FIELDS`] order), to hash.
    prompt: [Option<serde_json::Value>; PROMPT_FIELDS.len()],
    /// The key whose value is being parsed, to name the field in a parse error.
    current_key: Option<Cow<'a, str>>,
    /// A rejection found while collecting (a duplicate key, an alias conflict).
    rejection: Option<Rejection>,
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
    fn take(&mut self, slot: Slot) -> Option<Given<'a>> {
        self.fields[slot as usize].take().filter(|g| g.value != FieldValue::Null)
    }

    /// Files a value given under a known key (`Key::Field` or
    /// `Key::Duration`, with its static spelling `given.name`): the first
    /// value kept, a second one judged by [`Slots::second`].
    fn file(&mut self, key: &Key, given: Given<'a>) -> Result<(), Rejection> {
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
    fn second(first: &Given<'a>, given: &Given<'_>) -> Result<(), Rejection> {
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
    fn duration(&mut self, dur: usize) -> Result<Option<(f64, &'static str)>, Rejection> {
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

const CANONICAL_DURATION_NAMES: [&str; 6] = ["queue_wait_ms", "prefill_time_ms", "decode_time_ms", "total_latency_ms", "ttft_ms", "tpot_ms"];

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
    slots: Slots<'a>,
}

impl<'a> Fields<'a> {
    /// Adds `key` = `value`. A prompt field ([`PROMPT_FIELDS`]) is
    /// dropped here unhashed: a decoder that carries prompts uses JSON.
    pub fn insert(&mut self, key: &str, value: FieldValue<'a>) {
        if self.slots.rejection.is_some() {
            return;
        }
        match classify(key) {
            Key::Dropped => self.slots.dropped.push(key.to_owned()),
            known => {
                if let Err(rejection) = self.slots.file(&known, Given { name: known.name(), value }) {
                    self.slots.rejection = Some(rejection);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Value conversions. Each names the field as the producer spelled it.

fn type_error(name: &str, expected: &str, got: &FieldValue<'_>) -> Rejection {
    Rejection::new(ReasonCode::FieldType, name, format!("expected {expected}, got {}", got.kind()))
}

fn required<T>(given: Option<Given<'_>>, slot: Slot, convert: impl FnOnce(Given<'_>) -> Result<Option<T>, Rejection>) -> Result<T, Rejection> {
    match given {
        None => Err(Rejection::new(ReasonCode::FieldMissing, slot.canonical(), "is required")),
        Some(g) => {
            let name = g.name;
            convert(g)?.ok_or_else(|| Rejection::new(ReasonCode::FieldMissing, name, "is required but empty"))
        }
    }
}

fn optional<T>(given: Option<Given<'_>>, convert: impl FnOnce(Given<'_>) -> Result<Option<T>, Rejection>) -> Result<Option<T>, Rejection> {
    given.map_or(Ok(None), convert)
}

/// Trimmed text of at most `max_chars` characters, without control
/// characters or personal data; `None` when empty after trimming.
fn text(g: &Given<'_>, max_chars: usize) -> Result<Option<String>, Rejection> {
    let name = g.name;
    let FieldValue::Str(s) = &g.value else { return Err(type_error(name, "a string", &g.value)) };
    let s = s.trim();
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
const REQUEST_ID_BYTES: [bool; 256] = {
    let mut allowed = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        allowed[b] = c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-');
        b += 1;
    }
    allowed
};

fn request_id(g: &Given<'_>) -> Result<Option<String>, Rejection> {
    let name = g.name;
    let FieldValue::Str(s) = &g.value else { return Err(type_error(name, "a string", &g.value)) };
    let s = s.trim();
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
fn raw_of(value: &serde_json::Value) -> Option<FieldValue<'_>> {
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
fn to_hash<'g>(g: &'g Given<'_>, max_chars: usize) -> Result<Option<&'g str>, Rejection> {
    let name = g.name;
    let FieldValue::Str(s) = &g.value else { return Err(type_error(name, "a string", &g.value)) };
    if let Some(reason) = s.strip_prefix(REFUSED_MARK) {
        let reason = ReasonCode::from_str_code(reason).unwrap_or(ReasonCode::FieldFormat);
        return Err(Rejection::new(reason, name, "was refused when received; the DLQ kept no value (the producer must resend it)"));
    }
    let s = s.trim();
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
fn prompt_hash(g: &Given<'_>) -> Result<Option<String>, Rejection> {
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

fn user_id(g: &Given<'_>, hasher: Option<&UserIdHasher>) -> Result<Option<String>, Rejection> {
    let Some(s) = to_hash(g, MAX_USER_ID_CHARS)? else { return Ok(None) };
    Ok(hasher.map(|h| if h.is_own_digest(s) { s.to_owned() } else { h.hash(s) }))
}

/// Any integer (a JSON number without a fraction; `5.0` counts).
fn integer(g: &Given<'_>) -> Result<i128, Rejection> {
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

fn unsigned(g: &Given<'_>, max: u64) -> Result<u64, Rejection> {
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
fn non_negative(g: &Given<'_>) -> Result<f64, Rejection> {
    let Some(v) = g.value.as_f64() else { return Err(type_error(g.name, "a number", &g.value)) };
    if v < 0.0 {
        return Err(Rejection::new(ReasonCode::FieldRange, g.name, format!("must be ≥ 0, got {v}")));
    }
    Ok(if v == 0.0 { 0.0 } else { v })
}

fn boolean(g: &Given<'_>) -> Result<bool, Rejection> {
    match g.value {
        FieldValue::Bool(b) => Ok(b),
        ref other => Err(type_error(g.name, "true or false", other)),
    }
}
