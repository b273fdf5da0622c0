//! The contract's vocabulary of fields. In: a JSON key or a field's value.
//! Out: the slot the key fills ([`Slot`], [`classify`]: a known field, a
//! duration in some unit, a content or unknown field) and the value as
//! given ([`FieldValue`], [`Given`]).

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A known field's place among the event's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
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

pub(super) const SLOT_COUNT: usize = Slot::MaxTokens as usize + 1;

impl Slot {
    /// The contract name, used when the field is missing altogether.
    pub(super) const fn canonical(self) -> &'static str {
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
pub(super) const DURATION_KEYS: [[&str; 4]; 6] = [
    ["queue_wait_ns", "queue_wait_us", "queue_wait_ms", "queue_wait_s"],
    ["prefill_time_ns", "prefill_time_us", "prefill_time_ms", "prefill_time_s"],
    ["decode_time_ns", "decode_time_us", "decode_time_ms", "decode_time_s"],
    ["total_latency_ns", "total_latency_us", "total_latency_ms", "total_latency_s"],
    ["ttft_ns", "ttft_us", "ttft_ms", "ttft_s"],
    ["tpot_ns", "tpot_us", "tpot_ms", "tpot_s"],
];

/// Where a key goes. Known keys carry their static spelling, so slots
/// never hold a copy of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Key {
    Field(Slot, &'static str),
    Duration(usize, usize),
    Dropped,
}

impl Key {
    /// A known key's static spelling ("" for a dropped one).
    pub(super) fn name(&self) -> &'static str {
        match *self {
            Key::Field(_, name) => name,
            Key::Duration(d, u) => DURATION_KEYS[d][u],
            Key::Dropped => "",
        }
    }
}

pub(super) fn classify(key: &str) -> Key {
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
    pub(super) fn kind(&self) -> &'static str {
        match self {
            FieldValue::Null => "null",
            FieldValue::Bool(_) => "a boolean",
            FieldValue::Int(_) | FieldValue::UInt(_) | FieldValue::Float(_) => "a number",
            FieldValue::Str(_) => "a string",
            FieldValue::Array => "an array",
            FieldValue::Object => "an object",
        }
    }

    pub(super) fn as_f64(&self) -> Option<f64> {
        match *self {
            FieldValue::Int(i) => Some(i as f64),
            FieldValue::UInt(u) => Some(u as f64),
            FieldValue::Float(f) => Some(f),
            _ => None,
        }
    }

    /// Equal as JSON values, with numbers compared by value (`5` == `5.0`).
    pub(super) fn same_as(&self, other: &FieldValue<'_>) -> bool {
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

/// A value as given, with the name the producer used for it.
#[derive(Debug)]
pub(super) struct Given<'a> {
    pub(super) name: &'static str,
    pub(super) value: FieldValue<'a>,
}
