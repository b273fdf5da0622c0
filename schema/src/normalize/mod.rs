//! The per-event stage. In: the raw bytes of one Kafka message. Out: a
//! normalized [`InferenceEvent`] plus the names of the fields it dropped,
//! or a [`Rejection`] naming the reason code and the field.
//!
//! Parsing is one pass over the bytes into borrowed slots (no
//! `serde_json::Value` tree), because this runs for every message at
//! hundreds of thousands of events per second: the common flat event by a
//! reader of its own (`flat`), anything else by `serde_json` (`scan`). Checks then run in contract
//! order, so the reason reported for an event with several problems is
//! deterministic: the first field in docs/contract.md §1 order that is wrong.

use serde::de::IgnoredAny;

use crate::config::{ContractConfig, ErrorDictionary};
use crate::error::SchemaError;
use crate::event::{ErrorStage, InferenceEvent};
use crate::hash::UserIdHasher;
use crate::reason::{ReasonCode, Rejection};
use crate::timestamp::{parse_rfc3339_ms, TimestampError};

mod convert;
mod fields;
mod flat;
mod scan;

use convert::*;
use fields::*;
use flat::Flat;
use scan::*;

pub use convert::{prompt_text, refused_mark, stored_prompt_hash, stored_user_id};
pub use fields::{FieldValue, DURATIONS, UNITS};
pub use scan::{FieldKey, Fields};

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
        match flat::read(text, &mut slots) {
            Flat::Read => {}
            Flat::Rejected(rejection) => return Err(rejection),
            Flat::Other => {
                slots = Slots::default();
                read_json(text, &mut slots)?;
            }
        }
        let event = self.assemble(&mut slots, now_ms, hasher)?;
        Ok(Normalized { event, dropped_fields: slots.dropped })
    }

    /// [`Contract::normalize`] of an event another decoder read into
    /// [`Fields`] (an OTLP span's attributes): the same checks, reasons and
    /// result as the JSON object of those fields, with no JSON in between.
    /// The caller keeps the event within `max_event_bytes` as JSON
    /// ([`Fields`] cannot measure that).
    /// `fields` are read in place (they are large to move) and left spent.
    pub fn normalize_fields(&self, fields: &mut Fields<'_>, now_ms: Option<i64>, hasher: &UserIdHasher) -> Result<Normalized, Rejection> {
        let slots = &mut fields.slots;
        if let Some(rejection) = slots.rejection.take() {
            return Err(rejection);
        }
        let event = self.assemble(slots, now_ms, Some(hasher))?;
        Ok(Normalized { event, dropped_fields: std::mem::take(&mut slots.dropped) })
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
            FieldValue::Str(s) => match parse_rfc3339_ms(trimmed(s)) {
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
