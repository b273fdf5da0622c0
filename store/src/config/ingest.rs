//! The ingest daemon's own tables: `[ingest]`, `[otlp]` (spans as
//! events) and `[service_metrics]` (its live metrics).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// The `[ingest]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Flush when the batch holds this many rows and rejects. Every insert
    /// writes a part per day it holds, so a larger batch makes fewer, larger
    /// parts for ClickHouse to write and merge; ingest holds up to two
    /// batches' bytes (one filling, one being written). Default: 200000.
    pub batch_max_rows: usize,
    /// Flush when the batch holds this many bytes: rows as encoded for
    /// ClickHouse (about 330 bytes each) and rejected payloads. Default: 67108864 (64 MiB).
    pub batch_max_bytes: usize,
    /// Flush a batch at the latest this long after its first message. Default: "1s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub batch_max_age: Duration,
    /// A batch of at least this many rows and rejects is flushed as soon as
    /// the source has had nothing new for 100ms (a backlog or a burst has
    /// been read to its end) instead of waiting out `batch_max_age`; 0 turns
    /// this off. Smaller batches still wait, so a trickle of events never
    /// becomes a trickle of small inserts. The exception is the tail of a
    /// backlog: the batch right after a full one is flushed when the source
    /// goes quiet, whatever its size. Default: 10000.
    pub flush_when_caught_up_rows: usize,
    /// How many recent request ids are remembered to drop producer retries. Default: 1000000.
    pub dedup_window: usize,
    /// First retry delay after a failed insert or produce; doubles up to `retry_max_backoff`. Default: "200ms".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_initial_backoff: Duration,
    /// Longest retry delay. Default: "10s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_max_backoff: Duration,
    /// On SIGTERM/SIGINT, how long the final flush and commit may take before exiting non-zero. Default: "30s".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub shutdown_timeout: Duration,
    /// Address of `/metrics` and `/healthz`; empty disables them. Default: "127.0.0.1:9464".
    pub metrics_addr: String,
    /// Tokio worker threads: the pipeline and the writer task run on them,
    /// broker round trips run on blocking threads beside them. Default: 2.
    pub worker_threads: usize,
    /// Threads that validate and normalize the messages librdkafka has
    /// ready, a chunk at a time, while the pipeline waits; 1 normalizes on
    /// the pipeline's own thread. Default: 2.
    pub normalize_threads: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            batch_max_rows: 200_000,
            batch_max_bytes: 64 * 1024 * 1024,
            batch_max_age: Duration::from_secs(1),
            flush_when_caught_up_rows: 10_000,
            dedup_window: 1_000_000,
            retry_initial_backoff: Duration::from_millis(200),
            retry_max_backoff: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            metrics_addr: "127.0.0.1:9464".into(),
            worker_threads: 2,
            normalize_threads: 2,
        }
    }
}

/// The `[otlp]` table: which spans of a topic encoded as OTLP
/// (`kafka.encodings`) are inference requests, and how their attributes
/// map to the contract's fields (docs/contract.md, "OTLP spans").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// A span with one of these names is an inference request. Default:
    /// ["llm_request"] (vLLM's request span).
    pub span_names: Vec<String>,
    /// A span carrying one of these attributes is an inference request.
    /// Default: the token counts of vLLM, the GenAI conventions and the
    /// older `llm.*` names ("gen_ai.usage.input_tokens",
    /// "gen_ai.usage.output_tokens", "gen_ai.usage.prompt_tokens",
    /// "gen_ai.usage.completion_tokens", "llm.token_count.prompt",
    /// "llm.token_count.completion", "llm.usage.prompt_tokens",
    /// "llm.usage.completion_tokens"). Other spans are counted and skipped.
    pub match_attributes: Vec<String>,
    /// The span or resource attribute that names the business line (the
    /// span's own first). Default: "inferlog.business_line".
    pub business_line_attribute: String,
    /// `error_code` of a span whose status is ERROR and that names no code
    /// (`inferlog.error_code`, or an `error.type` that is a name of the
    /// error dictionary). Default: 1004 (engine_error).
    pub error_code: i32,
    /// `error_stage` of such a span when it names none
    /// (`inferlog.error_stage`): where the span saw the error. Default: "gateway".
    pub error_stage: String,
    /// More attributes to read, by attribute name (span or resource): the
    /// contract field each fills, or one of its unit forms
    /// ("queue_wait_s"). They take precedence over the built-in table.
    /// Default: {}.
    pub attributes: BTreeMap<String, String>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            span_names: vec!["llm_request".into()],
            match_attributes: [
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "gen_ai.usage.prompt_tokens",
                "gen_ai.usage.completion_tokens",
                "llm.token_count.prompt",
                "llm.token_count.completion",
                "llm.usage.prompt_tokens",
                "llm.usage.completion_tokens",
            ]
            .map(String::from)
            .to_vec(),
            business_line_attribute: "inferlog.business_line".into(),
            error_code: 1004,
            error_stage: "gateway".into(),
            attributes: BTreeMap::new(),
        }
    }
}

impl OtlpConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.span_names.is_empty() && self.match_attributes.is_empty() {
            return Err(StoreError::Config("otlp.span_names and otlp.match_attributes are both empty: no span would be an inference request".into()));
        }
        if self.business_line_attribute.trim().is_empty() {
            return Err(StoreError::Config("otlp.business_line_attribute must be set".into()));
        }
        if inferlog_schema::ErrorStage::parse(&self.error_stage).is_none() {
            return Err(StoreError::Config(format!("otlp.error_stage {:?}: one of gateway, queue, prefill, decode, postprocess", self.error_stage)));
        }
        if self.error_code == 0 {
            return Err(StoreError::Config("otlp.error_code must not be 0 (0 means success)".into()));
        }
        if let Some((attribute, field)) = self.attributes.iter().find(|(_, field)| !inferlog_schema::contract::accepts_name(field)) {
            return Err(StoreError::Config(format!(
                "otlp.attributes.{attribute:?} = {field:?}: not a field of the contract (or a unit form of one)"
            )));
        }
        Ok(())
    }
}

/// The `[service_metrics]` table: the live service metrics ingest exports
/// on `/metrics` from every stored event (request duration, TTFT, TPOT,
/// queue, prefill and decode histograms; requests by status and error
/// code; tokens by type), labelled by model, version, business line and
/// request type. Every label has a cap on its distinct values: a value past
/// it counts under `other`, and `inferlog_service_label_overflow_total`
/// says how often. See docs/contract.md, "Live service metrics".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceMetricsConfig {
    /// Export the service metrics. Default: true.
    pub enabled: bool,
    /// Label the token counter with a bucket of the hashed user id (the
    /// only user dimension Prometheus sees), this many buckets; 0 turns the
    /// label off. Default: 0.
    pub user_buckets: u16,
    /// Distinct `model_name` values at most. Default: 50.
    pub max_models: usize,
    /// Distinct `model_version` values at most. Default: 100.
    pub max_model_versions: usize,
    /// Distinct `business_line` values at most. Default: 50.
    pub max_business_lines: usize,
    /// Distinct `request_type` values at most. Default: 20.
    pub max_request_types: usize,
    /// Distinct `error_code` values at most. Default: 50.
    pub max_error_codes: usize,
}

impl Default for ServiceMetricsConfig {
    fn default() -> Self {
        ServiceMetricsConfig {
            enabled: true,
            user_buckets: 0,
            max_models: 50,
            max_model_versions: 100,
            max_business_lines: 50,
            max_request_types: 20,
            max_error_codes: 50,
        }
    }
}

impl ServiceMetricsConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        let caps = [self.max_models, self.max_model_versions, self.max_business_lines, self.max_request_types, self.max_error_codes];
        if caps.iter().any(|&c| c == 0 || c > 10_000) {
            return Err(StoreError::Config("service_metrics.max_* must be 1..=10000 (a cap of distinct label values)".into()));
        }
        if self.user_buckets > 1000 {
            return Err(StoreError::Config(format!("service_metrics.user_buckets = {} must be at most 1000", self.user_buckets)));
        }
        Ok(())
    }
}
