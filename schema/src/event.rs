//! The normalized event: what one accepted Kafka message becomes, and what
//! every later stage (ClickHouse rows, Parquet archive, aggregates) reads
//! without validating again.
//!
//! Units: every duration is milliseconds (`f64`, never negative, never
//! `-0.0`), every timestamp is UTC epoch milliseconds, token counts are
//! real tokens. Text is trimmed and free of control characters and personal
//! data. `user_id` and prompts never appear: only their keyed hashes.

use serde::{Serialize, Serializer};

use crate::timestamp::format_rfc3339_ms;

/// Version of the input contract this crate implements. Written into
/// Parquet metadata and the JSON Schema so readers can tell versions apart.
pub const SCHEMA_VERSION: u32 = 1;

/// Where in the serving path a failed request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorStage {
    Gateway,
    Queue,
    Prefill,
    Decode,
    Postprocess,
}

impl ErrorStage {
    pub const ALL: [ErrorStage; 5] = [ErrorStage::Gateway, ErrorStage::Queue, ErrorStage::Prefill, ErrorStage::Decode, ErrorStage::Postprocess];

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorStage::Gateway => "gateway",
            ErrorStage::Queue => "queue",
            ErrorStage::Prefill => "prefill",
            ErrorStage::Decode => "decode",
            ErrorStage::Postprocess => "postprocess",
        }
    }

    pub fn parse(s: &str) -> Option<ErrorStage> {
        ErrorStage::ALL.into_iter().find(|stage| stage.as_str() == s)
    }
}

/// Input-length bucket of the aggregates tier. Boundaries are powers of two
/// (1k = 1024 tokens), as context windows are: `0-1k` holds 0..=1023.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InputBucket {
    UpTo1k,
    UpTo2k,
    UpTo4k,
    UpTo8k,
    UpTo32k,
    Over32k,
}

impl InputBucket {
    pub const ALL: [InputBucket; 6] =
        [InputBucket::UpTo1k, InputBucket::UpTo2k, InputBucket::UpTo4k, InputBucket::UpTo8k, InputBucket::UpTo32k, InputBucket::Over32k];

    pub const fn of(input_tokens: u32) -> InputBucket {
        match input_tokens {
            0..1024 => InputBucket::UpTo1k,
            1024..2048 => InputBucket::UpTo2k,
            2048..4096 => InputBucket::UpTo4k,
            4096..8192 => InputBucket::UpTo8k,
            8192..32768 => InputBucket::UpTo32k,
            _ => InputBucket::Over32k,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            InputBucket::UpTo1k => "0-1k",
            InputBucket::UpTo2k => "1k-2k",
            InputBucket::UpTo4k => "2k-4k",
            InputBucket::UpTo8k => "4k-8k",
            InputBucket::UpTo32k => "8k-32k",
            InputBucket::Over32k => "32k+",
        }
    }

    /// The lowest input-token count in the bucket (for SQL `multiIf` bounds).
    pub const fn lower_bound(self) -> u32 {
        match self {
            InputBucket::UpTo1k => 0,
            InputBucket::UpTo2k => 1024,
            InputBucket::UpTo4k => 2048,
            InputBucket::UpTo8k => 4096,
            InputBucket::UpTo32k => 8192,
            InputBucket::Over32k => 32768,
        }
    }
}

/// Output-length bucket of the aggregates tier: a 50-token answer, a
/// paragraph, a page and a long generation are different experiences (and
/// decode costs). Powers of two like the input buckets: `0-128` holds
/// 0..=127 output tokens (failed requests that produced nothing count here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutputBucket {
    UpTo128,
    UpTo512,
    UpTo2k,
    UpTo8k,
    Over8k,
}

impl OutputBucket {
    pub const ALL: [OutputBucket; 5] =
        [OutputBucket::UpTo128, OutputBucket::UpTo512, OutputBucket::UpTo2k, OutputBucket::UpTo8k, OutputBucket::Over8k];

    pub const fn of(output_tokens: u32) -> OutputBucket {
        match output_tokens {
            0..128 => OutputBucket::UpTo128,
            128..512 => OutputBucket::UpTo512,
            512..2048 => OutputBucket::UpTo2k,
            2048..8192 => OutputBucket::UpTo8k,
            _ => OutputBucket::Over8k,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            OutputBucket::UpTo128 => "0-128",
            OutputBucket::UpTo512 => "128-512",
            OutputBucket::UpTo2k => "512-2k",
            OutputBucket::UpTo8k => "2k-8k",
            OutputBucket::Over8k => "8k+",
        }
    }

    /// The lowest output-token count in the bucket (for SQL `multiIf` bounds).
    pub const fn lower_bound(self) -> u32 {
        match self {
            OutputBucket::UpTo128 => 0,
            OutputBucket::UpTo512 => 128,
            OutputBucket::UpTo2k => 512,
            OutputBucket::UpTo8k => 2048,
            OutputBucket::Over8k => 8192,
        }
    }
}

/// One accepted inference request, normalized.
///
/// Serializes (with `serde_json`) to the input contract's field names, so the
/// output of `inferlog-schema normalize` is itself a valid event that
/// normalizes to the same value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InferenceEvent {
    /// Unique id of the request, 1–128 of `[A-Za-z0-9._:-]`; the dedup key.
    pub request_id: String,
    /// When the request finished, UTC epoch milliseconds (RFC 3339 in JSON).
    #[serde(rename = "timestamp", serialize_with = "serialize_timestamp")]
    pub timestamp_ms: i64,
    pub model_name: String,
    pub model_version: String,
    /// Business line; `unknown` when the producer gave none.
    pub business_line: String,
    /// Prompt tokens (real tokens, never characters).
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// End-to-end latency, ms.
    pub total_latency_ms: f64,
    /// 0 for success, otherwise a code of the error dictionary.
    pub error_code: i32,
    /// Set exactly when `error_code` is not 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_stage: Option<ErrorStage>,
    /// `<key id>:<hex HMAC-SHA256 of the user id>`; never the plaintext id.
    #[serde(rename = "user_id", skip_serializing_if = "Option::is_none")]
    pub user_id_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// chat, summarize, translate, code, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_type: Option<String>,
    /// Time spent waiting for a slot, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_wait_ms: Option<f64>,
    /// Prompt processing time, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_time_ms: Option<f64>,
    /// Generation time, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_time_ms: Option<f64>,
    /// Time to first token, ms; derived as queue + prefill when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    /// Time per output token, ms; derived as decode / (output_tokens − 1) when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_hit: Option<bool>,
    /// Tokens of the reused prompt prefix, at most `input_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_prefix_tokens: Option<u32>,
    /// Peak GPU memory of the request, MB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_mem_peak_mb: Option<f64>,
    /// The input was cut for length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// `<key id>:<hex HMAC-SHA256>` of the producer's `prompt_hash`, or of
    /// the prompt text the event carried; never the text itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_hash: Option<String>,
    /// The output limit the request set (an answer of this many tokens was cut).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

fn serialize_timestamp<S: Serializer>(ms: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_rfc3339_ms(*ms))
}

impl InferenceEvent {
    /// The event as one line of JSON in the input contract's field names.
    pub fn to_json(&self) -> String {
        // Serializing plain strings, numbers and bools cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn input_bucket(&self) -> InputBucket {
        InputBucket::of(self.input_tokens)
    }

    pub fn output_bucket(&self) -> OutputBucket {
        OutputBucket::of(self.output_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_boundaries() {
        assert_eq!(InputBucket::of(0), InputBucket::UpTo1k);
        assert_eq!(InputBucket::of(1023), InputBucket::UpTo1k);
        assert_eq!(InputBucket::of(1024), InputBucket::UpTo2k);
        assert_eq!(InputBucket::of(32767), InputBucket::UpTo32k);
        assert_eq!(InputBucket::of(32768), InputBucket::Over32k);
        for bucket in InputBucket::ALL {
            assert_eq!(InputBucket::of(bucket.lower_bound()), bucket);
        }
    }
}
