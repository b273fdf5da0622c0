//! A workload whose every write is known, in each input encoding the
//! matrix drives: `json` (one event a message), `otlp_proto` and
//! `otlp_json` (OTLP traces, several spans a message, as the Collector's
//! Kafka exporter writes them). In: a seed and a size. Out: the lines
//! `kafkatool.py produce` sends (hex for protobuf), and what a correct run
//! stores (the valid request ids) and refuses (the invalid ones, by reason).
//!
//! The events' times straddle the last UTC midnight: the spans of one OTLP
//! message fall on two days, so one message's rows go to two day inserts.
//! One event in `invalid_every` carries an error code no dictionary knows
//! (`error_code.unknown`, which a config fix makes valid: `dlq replay`'s
//! input).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use inferlog_schema::timestamp::MS_PER_DAY;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, TracesData};
use prost::Message as _;
use rand::{Rng as _, SeedableRng as _};

/// The error code the workload's invalid events carry.
pub const UNKNOWN_CODE: i64 = 987_654;

/// How events reach the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Json,
    OtlpProto,
    OtlpJson,
}

impl Input {
    pub const ALL: [Input; 3] = [Input::Json, Input::OtlpProto, Input::OtlpJson];

    /// The topic encoding (`[kafka] encodings`).
    pub fn encoding(self) -> &'static str {
        match self {
            Input::Json => "json",
            Input::OtlpProto => "otlp_proto",
            Input::OtlpJson => "otlp_json",
        }
    }

    pub fn parse(name: &str) -> Option<Input> {
        Input::ALL.into_iter().find(|i| i.encoding() == name)
    }
}

/// One request of the workload.
#[derive(Debug, Clone)]
pub struct Request {
    pub request_id: String,
    pub timestamp_ms: i64,
    pub business_line: &'static str,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub latency_ms: f64,
    pub error_code: i64,
}

impl Request {
    pub fn valid(&self) -> bool {
        self.error_code != UNKNOWN_CODE
    }

    fn json(&self) -> serde_json::Value {
        let mut event = serde_json::json!({
            "request_id": self.request_id,
            "timestamp": self.timestamp_ms,
            "business_line": self.business_line,
            "model_name": "llama-3.1-8b-instruct",
            "model_version": "2024-07-23",
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_latency_ms": self.latency_ms,
            "error_code": self.error_code,
        });
        if self.error_code != 0 {
            event["error_stage"] = "decode".into();
        }
        event
    }

    /// vLLM's `llm_request` span for this request, with the attributes
    /// vLLM does not trace under inferlog's own names.
    fn span(&self, i: u64) -> Span {
        let s = |k: &str, v: &str| kv(k, any_value::Value::StringValue(v.into()));
        let n = |k: &str, v: i64| kv(k, any_value::Value::IntValue(v));
        let d = |k: &str, v: f64| kv(k, any_value::Value::DoubleValue(v));
        let end = self.timestamp_ms as u64 * 1_000_000;
        let mut attributes = vec![
            s("gen_ai.request.id", &self.request_id),
            s("gen_ai.response.model", "llama-3.1-8b-instruct"),
            n("gen_ai.usage.prompt_tokens", self.input_tokens),
            n("gen_ai.usage.completion_tokens", self.output_tokens),
            d("gen_ai.latency.e2e", self.latency_ms / 1000.0),
            s("inferlog.business_line", self.business_line),
            s("inferlog.model_version", "2024-07-23"),
        ];
        if self.error_code != 0 {
            attributes.push(n("inferlog.error_code", self.error_code));
            attributes.push(s("inferlog.error_stage", "decode"));
        }
        let mut trace_id = [0u8; 16];
        trace_id[..8].copy_from_slice(&i.to_be_bytes());
        Span {
            trace_id: trace_id.to_vec(),
            span_id: (i + 1).to_be_bytes().to_vec(),
            name: "llm_request".into(),
            start_time_unix_nano: end - (self.latency_ms * 1e6) as u64,
            end_time_unix_nano: end,
            attributes,
            ..Span::default()
        }
    }
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..KeyValue::default() }
}

/// The workload: requests in the order they are produced, grouped into
/// messages of `per_message` (1 for JSON).
#[derive(Debug, Clone)]
pub struct Workload {
    pub input: Input,
    pub requests: Vec<Request>,
    pub per_message: usize,
}

impl Workload {
    /// `count` requests around the last UTC midnight (the first half
    /// before it, the rest after, spread over `spread_ms` either side),
    /// one in `invalid_every` invalid; `tag` makes the ids unique to a run.
    pub fn around_midnight(input: Input, count: usize, per_message: usize, invalid_every: usize, seed: u64, tag: &str) -> Workload {
        Workload::around(crate::now_ms().div_euclid(MS_PER_DAY), input, count, per_message, invalid_every, seed, tag)
    }

    /// As [`Workload::around_midnight`], around the midnight that starts
    /// `day` (days since 1970-01-01).
    pub fn around(day: i64, input: Input, count: usize, per_message: usize, invalid_every: usize, seed: u64, tag: &str) -> Workload {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let midnight = day * MS_PER_DAY;
        let spread_ms = 50_000;
        let lines = ["search", "chat", "code", "support"];
        let requests = (0..count)
            .map(|i| {
                // Alternate sides of midnight, so each message holds both days.
                let side = if i % 2 == 0 { -1 } else { 0 };
                let offset = rng.gen_range(1..spread_ms);
                Request {
                    request_id: format!("{tag}-{seed}-{i}"),
                    timestamp_ms: midnight + side * spread_ms + offset,
                    business_line: lines[i % lines.len()],
                    input_tokens: rng.gen_range(1..4_000),
                    output_tokens: rng.gen_range(1..1_000),
                    latency_ms: f64::from(rng.gen_range(50u32..20_000)),
                    error_code: if invalid_every > 0 && i % invalid_every == invalid_every - 1 { UNKNOWN_CODE } else { 0 },
                }
            })
            .collect();
        let per_message = if input == Input::Json { 1 } else { per_message.max(1) };
        Workload { input, requests, per_message }
    }

    pub fn valid_ids(&self) -> BTreeSet<String> {
        self.requests.iter().filter(|r| r.valid()).map(|r| r.request_id.clone()).collect()
    }

    pub fn invalid_ids(&self) -> BTreeSet<String> {
        self.requests.iter().filter(|r| !r.valid()).map(|r| r.request_id.clone()).collect()
    }

    /// One line per Kafka message, as `kafkatool.py produce` takes them
    /// (`--hex` for protobuf).
    pub fn lines(&self) -> Vec<String> {
        self.requests
            .chunks(self.per_message)
            .enumerate()
            .map(|(m, chunk)| match self.input {
                Input::Json => chunk[0].json().to_string(),
                Input::OtlpProto | Input::OtlpJson => {
                    let spans = chunk.iter().enumerate().map(|(j, r)| r.span((m * self.per_message + j) as u64)).collect();
                    let traces = TracesData {
                        resource_spans: vec![ResourceSpans {
                            resource: Some(Resource {
                                attributes: vec![kv("service.name", any_value::Value::StringValue("vllm".into()))],
                                ..Resource::default()
                            }),
                            scope_spans: vec![ScopeSpans { spans, ..ScopeSpans::default() }],
                            ..ResourceSpans::default()
                        }],
                    };
                    if self.input == Input::OtlpProto {
                        hex::encode(traces.encode_to_vec())
                    } else {
                        serde_json::to_string(&traces).expect("OTLP/JSON")
                    }
                }
            })
            .collect()
    }

    /// Writes [`Workload::lines`] to `dir` and produces them to `topic`,
    /// message i to partition i mod `partitions`.
    pub fn produce(&self, dir: &Path, topic: &str, partitions: usize) -> PathBuf {
        self.produce_part(dir, topic, partitions, 0, 1)
    }

    /// Produces part `part` of `parts` of the messages (in order): a
    /// workload sent in several goes.
    pub fn produce_part(&self, dir: &Path, topic: &str, partitions: usize, part: usize, parts: usize) -> PathBuf {
        let path = dir.join(format!("workload-{}-{part}.lines", self.input.encoding()));
        let lines = self.lines();
        let per = lines.len().div_ceil(parts.max(1));
        let mut text = lines.iter().skip(part * per).take(per).cloned().collect::<Vec<_>>().join("\n");
        text.push('\n');
        std::fs::write(&path, text).expect("write the workload");
        let file = path.to_str().expect("utf-8 path");
        // Every partition gets its share: keyless messages (OTLP) would
        // otherwise go to one partition a burst.
        let partitions = partitions.to_string();
        if self.input == Input::OtlpProto {
            crate::kafkatool(&["produce", "--topic", topic, "--hex", "--round-robin", &partitions, file]);
        } else {
            crate::kafkatool(&["produce", "--topic", topic, "--round-robin", &partitions, file]);
        }
        path
    }

    /// Messages the workload sends.
    pub fn messages(&self) -> usize {
        self.requests.len().div_ceil(self.per_message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_otlp_message_holds_spans_of_both_days() {
        let w = Workload::around_midnight(Input::OtlpProto, 40, 10, 7, 1, "t");
        assert_eq!(w.messages(), 4);
        for chunk in w.requests.chunks(10) {
            let days: BTreeSet<i64> = chunk.iter().map(|r| r.timestamp_ms.div_euclid(MS_PER_DAY)).collect();
            assert_eq!(days.len(), 2, "each message crosses midnight");
        }
        assert_eq!(w.valid_ids().len() + w.invalid_ids().len(), 40);
        assert_eq!(w.invalid_ids().len(), 5);
        let bytes = hex::decode(&w.lines()[0]).expect("hex");
        let traces = TracesData::decode(bytes.as_slice()).expect("protobuf");
        assert_eq!(traces.resource_spans[0].scope_spans[0].spans.len(), 10);
    }
}
