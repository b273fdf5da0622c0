//! The `[sampling]` table: the sampled archive's keep rules and rates.

use serde::{Deserialize, Serialize};

use super::keep_field::{FieldKind, KeepField};
use crate::error::StoreError;

/// The `[sampling]` table: which rows of a day the archive keeps. Off by
/// default. The hot tier keeps every row and the aggregates count every
/// row; sampling applies when a day is archived. Kept always: errors,
/// truncated outputs, slow requests and long ones (by the thresholds of
/// their group); the rest of each stratum (business line × model ×
/// version × input bucket × hour) at `base_rate`, at least
/// `min_per_stratum` rows, with weights that add up to the stratum's
/// exact row count. See docs/contract.md, "Sampled archive".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    /// Sample the archive. Default: false.
    pub enabled: bool,
    /// Share of a stratum's ordinary rows (no error, not truncated, not slow,
    /// not long) the archive keeps, 0 < rate <= 1. Default: 0.1.
    pub base_rate: f64,
    /// Ordinary rows kept per stratum at least, its tail rows aside (all of
    /// them if it has fewer): the smallest hashes. Default: 20.
    pub min_per_stratum: u64,
    /// The quantile of a group's history above which a request is `slow`. Default: 0.99.
    pub quantile: f64,
    /// Days of aggregates before the archived day the thresholds are derived from. Default: 7.
    pub history_days: u32,
    /// Requests a group's history must hold for its thresholds to come
    /// from it; a group with fewer uses the static thresholds. Default: 200.
    pub min_history_rows: u64,
    /// Static threshold of total latency (ms) for a group without history. Default: 30000.0.
    pub slow_total_latency_ms: f64,
    /// Static threshold of time to first token (ms) for a group without history. Default: 5000.0.
    pub slow_ttft_ms: f64,
    /// A request with more output tokens is `long` (the aggregates keep no
    /// token histograms, so this one is static). Default: 4096.
    pub long_output_tokens: u32,
    /// A request with more input tokens is `long`. Default: 32768.
    pub long_input_tokens: u32,
    /// Seed of the hash of `request_id` that picks the ordinary rows kept:
    /// the same seed keeps the same rows. Default: 0.
    pub seed: u64,
    /// More rows to keep whole, weight 1, each rule under its own
    /// `sample_reason`: a row meeting every condition of a rule is kept
    /// (after the built-in reasons; the first matching rule names it), e.g.
    /// `[[sampling.keep]]` `reason = "cache_miss_long"`, `when = [{ field =
    /// "cache_hit", op = "eq", value = false }, { field = "input_tokens", op
    /// = "gt", value = 8000 }]`. Default: none.
    pub keep: Vec<KeepRule>,
}

/// A rule of `[[sampling.keep]]`: rows meeting all of `when` are kept whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeepRule {
    /// The `sample_reason` of the rows it keeps: 1 to 32 of `[a-z0-9_]`,
    /// not a built-in reason (error, truncated, slow, long, sampled, all).
    pub reason: String,
    /// The conditions, all of which a row meets (at least one).
    pub when: Vec<Condition>,
}

/// One condition over a field of the contract: `field op value`. A row
/// without the (optional) field does not meet it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Numbers: input_tokens, output_tokens, total_latency_ms, error_code,
    /// queue_wait_ms, prefill_time_ms, decode_time_ms, ttft_ms, tpot_ms,
    /// gpu_id, batch_size, cache_prefix_tokens, gpu_mem_peak_mb; true or
    /// false: cache_hit, truncated; text: business_line, model_name,
    /// model_version, request_type, tenant, error_stage.
    pub field: String,
    /// One of eq, ne, gt, ge, lt, le (text and true/false: eq, ne).
    pub op: CompareOp,
    pub value: ConditionValue,
}

/// How a [`Condition`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CompareOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

/// The value a [`Condition`] compares with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ConditionValue {
    Bool(bool),
    Number(f64),
    Text(String),
}

/// The reasons the compactor gives itself.
pub const BUILT_IN_REASONS: [&str; 6] = ["error", "truncated", "slow", "long", "sampled", "all"];

impl KeepRule {
    pub fn validate(&self) -> Result<(), StoreError> {
        let name = &self.reason;
        let bad = |why: String| StoreError::Config(format!("sampling.keep reason {name:?}: {why}"));
        if name.is_empty() || name.len() > 32 || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
            return Err(bad("must be 1 to 32 of [a-z0-9_]".into()));
        }
        if BUILT_IN_REASONS.contains(&name.as_str()) {
            return Err(bad("is a built-in reason".into()));
        }
        if self.when.is_empty() {
            return Err(bad("needs at least one condition in `when`".into()));
        }
        for c in &self.when {
            let field = c.field.as_str();
            let Some(kind) = KeepField::parse(field).map(KeepField::kind) else {
                return Err(bad(format!("field {field:?} is not one a rule can test (see the example config)")));
            };
            let ordered = !matches!(c.op, CompareOp::Eq | CompareOp::Ne);
            let fits = match &c.value {
                ConditionValue::Number(v) => kind == FieldKind::Number && v.is_finite(),
                ConditionValue::Bool(_) => kind == FieldKind::Bool && !ordered,
                ConditionValue::Text(_) => kind == FieldKind::Text && !ordered,
            };
            if !fits {
                return Err(bad(format!(
                    "field {field:?}: op {:?} with value {:?} does not fit its kind (numbers: any op; true/false and text: eq, ne)",
                    c.op, c.value
                )));
            }
        }
        Ok(())
    }
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            enabled: false,
            base_rate: 0.1,
            min_per_stratum: 20,
            quantile: 0.99,
            history_days: 7,
            min_history_rows: 200,
            slow_total_latency_ms: 30_000.0,
            slow_ttft_ms: 5_000.0,
            long_output_tokens: 4096,
            long_input_tokens: 32_768,
            seed: 0,
            keep: Vec::new(),
        }
    }
}

impl SamplingConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        if !(self.base_rate > 0.0 && self.base_rate <= 1.0) {
            return Err(StoreError::Config(format!("sampling.base_rate = {} must be in (0, 1]", self.base_rate)));
        }
        if !(self.quantile > 0.0 && self.quantile < 1.0) {
            return Err(StoreError::Config(format!("sampling.quantile = {} must be in (0, 1)", self.quantile)));
        }
        if !(self.slow_total_latency_ms > 0.0 && self.slow_ttft_ms > 0.0) {
            return Err(StoreError::Config("sampling.slow_total_latency_ms and sampling.slow_ttft_ms must be > 0".into()));
        }
        if self.history_days > 366 {
            return Err(StoreError::Config(format!("sampling.history_days = {} must be at most 366", self.history_days)));
        }
        for (i, rule) in self.keep.iter().enumerate() {
            rule.validate()?;
            if self.keep[..i].iter().any(|r| r.reason == rule.reason) {
                return Err(StoreError::Config(format!("sampling.keep reason {:?} is given twice", rule.reason)));
            }
            if i >= 32 {
                return Err(StoreError::Config("sampling.keep: at most 32 rules".into()));
            }
        }
        Ok(())
    }
}
