//! Synthetic traffic. In: a seed, a time window and an invalid ratio. Out:
//! JSONL events shaped like a real LLM serving fleet's, each tagged (for
//! tests) with the reason code it must be rejected with, if any.
//!
//! The shape: several business lines with their own request mix, models
//! and versions with their own speed, heavy-tailed token counts (most
//! requests short, a tail past 32k), stage latencies that add up to the
//! total, a few percent errors at plausible stages, prefix-cache hits on
//! each business line's shared system prompt, a Zipf-like user population,
//! and a diurnal load curve. Producers' habits show up too: offsets other
//! than Z, epoch-ms integers, OpenTelemetry names, µs units, extra fields.
//!
//! Deterministic: the same seed, count, window and ratio give the same bytes
//! (ChaCha8, whose stream is fixed across platforms and versions).

use rand::distributions::Distribution;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Exp, LogNormal};
use serde_json::{json, Map, Value};

use crate::reason::ReasonCode;
use crate::timestamp::{format_rfc3339_ms, MS_PER_DAY};

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorConfig {
    pub seed: u64,
    /// Events are spread over `days` days ending at `end_ms`.
    pub days: u32,
    /// Exclusive end of the time window, UTC epoch ms.
    pub end_ms: i64,
    /// Share of events (0..=1) broken so they must be rejected, spread over every reason code.
    pub invalid_ratio: f64,
}

/// One generated line and, for an invalid one, the reason it must be rejected with.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedEvent {
    pub line: Vec<u8>,
    pub expected: Option<ReasonCode>,
}

struct Model {
    name: &'static str,
    versions: &'static [&'static str],
    /// Prefill cost, ms per input token.
    prefill_per_token: f64,
    /// Typical time per output token, ms.
    tpot: f64,
    weight: u32,
}

const MODELS: [Model; 4] = [
    Model { name: "llama-3.1-70b-instruct", versions: &["2024-07-23", "2024-09-25"], prefill_per_token: 0.21, tpot: 38.0, weight: 35 },
    Model { name: "qwen2.5-72b-instruct", versions: &["v1.0", "v1.1"], prefill_per_token: 0.19, tpot: 34.0, weight: 25 },
    Model { name: "mistral-7b-instruct", versions: &["v0.3"], prefill_per_token: 0.04, tpot: 9.0, weight: 25 },
    Model { name: "gpt-oss-20b", versions: &["2025-08-05", "2025-11-02"], prefill_per_token: 0.08, tpot: 15.0, weight: 15 },
];

struct BusinessLine {
    name: &'static str,
    weight: u32,
    request_types: &'static [&'static str],
    /// Length of the shared system prompt that prefix caching reuses.
    system_prompt_tokens: u32,
    cache_hit_rate: f64,
    tenants: &'static [&'static str],
}

const BUSINESS_LINES: [BusinessLine; 6] = [
    BusinessLine {
        name: "search",
        weight: 30,
        request_types: &["summarize", "chat"],
        system_prompt_tokens: 380,
        cache_hit_rate: 0.35,
        tenants: &["web", "mobile"],
    },
    BusinessLine {
        name: "chat-assistant",
        weight: 25,
        request_types: &["chat"],
        system_prompt_tokens: 900,
        cache_hit_rate: 0.55,
        tenants: &["consumer", "enterprise"],
    },
    BusinessLine {
        name: "code-copilot",
        weight: 15,
        request_types: &["code", "chat"],
        system_prompt_tokens: 1400,
        cache_hit_rate: 0.6,
        tenants: &["ide", "ci-bot"],
    },
    BusinessLine {
        name: "customer-support",
        weight: 12,
        request_types: &["chat", "summarize", "translate"],
        system_prompt_tokens: 2100,
        cache_hit_rate: 0.7,
        tenants: &["emea", "apac", "amer"],
    },
    BusinessLine {
        name: "ads",
        weight: 10,
        request_types: &["summarize", "translate"],
        system_prompt_tokens: 250,
        cache_hit_rate: 0.2,
        tenants: &["creative"],
    },
    BusinessLine {
        name: "internal-tools",
        weight: 8,
        request_types: &["chat", "code", "summarize"],
        system_prompt_tokens: 600,
        cache_hit_rate: 0.3,
        tenants: &["staff"],
    },
];

/// (code, weight, stages it happens at).
const ERRORS: [(i32, u32, &[&str]); 8] = [
    (1001, 14, &["prefill", "decode"]),
    (1002, 12, &["gateway"]),
    (1003, 22, &["queue", "decode"]),
    (1004, 10, &["prefill", "decode", "postprocess"]),
    (1005, 18, &["gateway"]),
    (1006, 4, &["queue", "prefill", "decode"]),
    (1007, 8, &["gateway"]),
    (1008, 12, &["decode", "postprocess"]),
];

pub const USERS: u32 = 20_000;

fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T], weight: impl Fn(&T) -> u32) -> &'a T {
    let total: u32 = items.iter().map(&weight).sum();
    let mut roll = rng.gen_range(0..total);
    for item in items {
        let w = weight(item);
        if roll < w {
            return item;
        }
        roll -= w;
    }
    &items[items.len() - 1]
}

/// Rounds to 3 decimals, as producers do.
fn ms3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// An endless, deterministic stream of events.
#[derive(Debug)]
pub struct Generator {
    config: GeneratorConfig,
    rng: ChaCha8Rng,
    seq: u64,
    short_inputs: LogNormal<f64>,
    long_inputs: LogNormal<f64>,
    outputs: LogNormal<f64>,
    queue: Exp<f64>,
}

impl Generator {
    pub fn new(config: GeneratorConfig) -> Generator {
        let rng = ChaCha8Rng::seed_from_u64(config.seed);
        // Parameters are constants in range: construction cannot fail.
        let lognormal = |median: f64, sigma: f64| LogNormal::new(median.ln(), sigma).unwrap_or_else(|_| unreachable!());
        Generator {
            rng,
            seq: 0,
            short_inputs: lognormal(420.0, 0.9),
            long_inputs: lognormal(6000.0, 1.0),
            outputs: lognormal(160.0, 0.9),
            queue: Exp::new(1.0 / 25.0).unwrap_or_else(|_| unreachable!()),
            config,
        }
    }

    /// A time in the window, weighted towards the (UTC) working day.
    fn timestamp(&mut self) -> i64 {
        let span = i64::from(self.config.days.max(1)) * MS_PER_DAY;
        loop {
            let t = self.config.end_ms - 1 - self.rng.gen_range(0..span);
            let hour = t.rem_euclid(MS_PER_DAY) as f64 / 3_600_000.0;
            let load = 0.35 + 0.65 * (((hour - 14.0) / 24.0 * std::f64::consts::TAU).cos() * 0.5 + 0.5);
            if self.rng.gen_bool(load.clamp(0.0, 1.0)) {
                return t;
            }
        }
    }

    fn user(&mut self) -> u32 {
        // Zipf-like: a few heavy users, a long tail.
        let u: f64 = self.rng.gen();
        (f64::from(USERS) * u.powi(3)) as u32
    }

    /// A valid event; `plain` keeps to the canonical field names and units so
    /// an invalid mutation has exactly one effect.
    fn valid(&mut self, plain: bool) -> Map<String, Value> {
        self.seq += 1;
        let line = pick(&mut self.rng, &BUSINESS_LINES, |b| b.weight);
        let model = pick(&mut self.rng, &MODELS, |m| m.weight);
        let version = model.versions[self.rng.gen_range(0..model.versions.len())];
        let request_type = line.request_types[self.rng.gen_range(0..line.request_types.len())];
        let ts = self.timestamp();

        let long = self.rng.gen_bool(0.07);
        let mut input = if long { self.long_inputs.sample(&mut self.rng) } else { self.short_inputs.sample(&mut self.rng) };
        input = input.clamp(1.0, 131_072.0);
        let mut input_tokens = input as u32 + line.system_prompt_tokens / 4;
        let truncated = input_tokens > 32_768 && self.rng.gen_bool(0.5);
        if truncated {
            input_tokens = 32_768;
        }
        let out_scale = if request_type == "code" { 2.0 } else { 1.0 };
        let mut output_tokens = ((self.outputs.sample(&mut self.rng) * out_scale).clamp(1.0, 8192.0)) as u32;

        let cache_hit = input_tokens > line.system_prompt_tokens && self.rng.gen_bool(line.cache_hit_rate);
        let cache_prefix = if cache_hit { line.system_prompt_tokens } else { 0 };

        let congestion = if self.rng.gen_bool(0.02) { 20.0 } else { 1.0 };
        let queue = self.queue.sample(&mut self.rng) * congestion;
        let jitter = self.rng.gen_range(0.8..1.3);
        let prefill = 4.0 + f64::from(input_tokens - cache_prefix) * model.prefill_per_token * jitter;
        let tpot = model.tpot * self.rng.gen_range(0.85..1.4) * (1.0 + f64::from(input_tokens) / 65_536.0);
        let mut decode = tpot * f64::from(output_tokens.saturating_sub(1)) + self.rng.gen_range(1.0..6.0);

        let mut error = None;
        if self.rng.gen_bool(0.03) || (input_tokens > 32_000 && self.rng.gen_bool(0.2)) {
            let (code, _, stages) = *pick(&mut self.rng, &ERRORS, |e| e.1);
            let stage = stages[self.rng.gen_range(0..stages.len())];
            error = Some((code, stage));
        }
        let (mut queue_v, mut prefill_v) = (Some(queue), Some(prefill));
        if let Some((_, stage)) = error {
            // A failed request stops at its stage: later stages take no time.
            match stage {
                "gateway" => (queue_v, prefill_v, decode, output_tokens) = (None, None, 0.0, 0),
                "queue" => (prefill_v, decode, output_tokens) = (None, 0.0, 0),
                "prefill" => (decode, output_tokens) = (0.0, 0),
                "decode" => {
                    output_tokens = self.rng.gen_range(0..=output_tokens);
                    decode = tpot * f64::from(output_tokens);
                }
                _ => {}
            }
        }
        let overhead = self.rng.gen_range(2.0..15.0);
        let total = queue_v.unwrap_or(0.0) + prefill_v.unwrap_or(0.0) + decode + overhead;

        let mut e = Map::new();
        let user = self.user();
        let request_id = format!("req-{:012x}-{:09}", self.rng.gen::<u64>() & 0xffff_ffff_ffff, self.seq);
        let alias = !plain && self.rng.gen_bool(0.05);
        let key = |canonical: &'static str, otel: &'static str| if alias { otel } else { canonical };
        e.insert(key("request_id", "gen_ai.response.id").into(), json!(request_id));
        let form: u32 = self.rng.gen_range(0..20);
        let timestamp = match form {
            0..=13 => json!(format_rfc3339_ms(ts)),
            14..=16 => json!(format_rfc3339_ms(ts + 8 * 3_600_000).replace('Z', "+08:00")),
            17 => json!(format_rfc3339_ms(ts + 5 * 3_600_000 + 45 * 60_000).replace('Z', "+05:45")),
            _ => json!(ts),
        };
        e.insert("timestamp".into(), timestamp);
        e.insert(key("model_name", "gen_ai.request.model").into(), json!(model.name));
        e.insert("model_version".into(), json!(version));
        e.insert(key("input_tokens", "gen_ai.usage.input_tokens").into(), json!(input_tokens));
        e.insert(key("output_tokens", "gen_ai.usage.output_tokens").into(), json!(output_tokens));
        e.insert("total_latency_ms".into(), json!(ms3(total)));
        e.insert("error_code".into(), json!(error.map_or(0, |(c, _)| c)));
        if let Some((_, stage)) = error {
            e.insert("error_stage".into(), json!(stage));
        }
        e.insert("business_line".into(), json!(line.name));
        if self.rng.gen_bool(0.92) {
            e.insert("user_id".into(), json!(format!("u-{user:06}")));
        }
        e.insert("tenant".into(), json!(line.tenants[self.rng.gen_range(0..line.tenants.len())]));
        e.insert("session_id".into(), json!(format!("s-{:08x}", user.wrapping_mul(2_654_435_761) ^ (ts / 3_600_000) as u32)));
        e.insert("request_type".into(), json!(request_type));
        if let Some(q) = queue_v {
            e.insert("queue_wait_ms".into(), json!(ms3(q)));
        }
        if let Some(p) = prefill_v {
            e.insert("prefill_time_ms".into(), json!(ms3(p)));
        }
        if decode > 0.0 {
            if !plain && self.rng.gen_bool(0.05) {
                e.insert("decode_time_us".into(), json!((decode * 1000.0).round()));
            } else {
                e.insert("decode_time_ms".into(), json!(ms3(decode)));
            }
        }
        if let (Some(q), Some(p)) = (queue_v, prefill_v) {
            if self.rng.gen_bool(0.5) {
                e.insert("ttft_ms".into(), json!(ms3((q + p + tpot.min(overhead)).min(total))));
            }
        }
        e.insert("gpu_id".into(), json!(self.rng.gen_range(0..64)));
        e.insert("batch_size".into(), json!(self.rng.gen_range(1..=64)));
        e.insert("cache_hit".into(), json!(cache_hit));
        if cache_hit {
            e.insert(key("cache_prefix_tokens", "gen_ai.usage.cache_read.input_tokens").into(), json!(cache_prefix));
        }
        let mem = 18_000.0 + f64::from(input_tokens + output_tokens) * 0.5 * self.rng.gen_range(0.9..1.1);
        e.insert("gpu_mem_peak_mb".into(), json!(mem.round()));
        if truncated {
            e.insert("truncated".into(), json!(true));
        }
        if !plain && self.rng.gen_bool(0.03) {
            // Producers send extras; inferlog drops them (and prompt text always).
            e.insert("trace_id".into(), json!(format!("{:032x}", self.rng.gen::<u128>())));
            if self.rng.gen_bool(0.3) {
                e.insert("prompt".into(), json!("Summarize the following document in three bullet points."));
            }
        }
        e
    }

    /// Breaks a valid (plain) event so that it must be rejected with `reason`.
    fn break_event(&mut self, mut e: Map<String, Value>, reason: ReasonCode) -> Vec<u8> {
        let ts_ms = e["timestamp"].as_str().and_then(|s| crate::timestamp::parse_rfc3339_ms(s).ok()).or_else(|| e["timestamp"].as_i64());
        match reason {
            ReasonCode::JsonMalformed => {
                let mut line = Value::Object(e).to_string().into_bytes();
                line.truncate(line.len() / 2);
                return line;
            }
            ReasonCode::JsonNotObject => return format!("[{}]", Value::Object(e)).into_bytes(),
            ReasonCode::FieldMissing => {
                e.remove("model_version");
            }
            ReasonCode::FieldType => {
                let tokens = e["input_tokens"].to_string();
                e.insert("input_tokens".into(), json!(tokens));
            }
            ReasonCode::FieldRange => {
                e.insert("output_tokens".into(), json!(-5));
            }
            ReasonCode::FieldFormat => {
                e.insert("request_id".into(), json!("req with spaces"));
            }
            ReasonCode::TimestampNaive => {
                let naive = format_rfc3339_ms(ts_ms.unwrap_or(0)).replace('T', " ");
                e.insert("timestamp".into(), json!(naive[..19]));
            }
            ReasonCode::TimestampOutOfRange => {
                e.insert("timestamp".into(), json!(ts_ms.unwrap_or(0) / 1000));
            }
            ReasonCode::UnitsConflict => {
                let decode = e.get("decode_time_ms").and_then(Value::as_f64).unwrap_or(0.0);
                e.insert("decode_time_ms".into(), json!(decode));
                e.insert("decode_time_s".into(), json!((decode + 1000.0) / 1000.0));
            }
            ReasonCode::UnitsInconsistent => {
                let total = e["total_latency_ms"].as_f64().unwrap_or(0.0);
                e.insert("queue_wait_ms".into(), json!(ms3(total * 0.5 + 10.0)));
                e.insert("total_latency_ms".into(), json!(ms3(total / 1000.0)));
            }
            ReasonCode::ErrorCodeUnknown => {
                e.insert("error_code".into(), json!(4242));
                e.insert("error_stage".into(), json!("decode"));
            }
            ReasonCode::ErrorStageMissing => {
                e.insert("error_code".into(), json!(1003));
                e.remove("error_stage");
            }
            ReasonCode::PiiDetected => {
                let pii = if self.rng.gen_bool(0.5) { "jane.doe@example.com" } else { "call +1 415 555 0100" };
                e.insert("session_id".into(), json!(pii));
            }
            ReasonCode::EventTooLarge => {
                e.insert("debug_blob".into(), json!("x".repeat(70_000)));
            }
            // Need a second event under the same id, or an OTLP message:
            // never drawn here (only ReasonCode::EVENT is).
            ReasonCode::RequestIdConflict | ReasonCode::OtlpMalformed => {}
        }
        Value::Object(e).to_string().into_bytes()
    }
}

impl Iterator for Generator {
    type Item = GeneratedEvent;

    fn next(&mut self) -> Option<GeneratedEvent> {
        if self.config.invalid_ratio > 0.0 && self.rng.gen_bool(self.config.invalid_ratio.clamp(0.0, 1.0)) {
            let reason = ReasonCode::EVENT[self.rng.gen_range(0..ReasonCode::EVENT.len())];
            let event = self.valid(true);
            return Some(GeneratedEvent { line: self.break_event(event, reason), expected: Some(reason) });
        }
        let event = self.valid(false);
        Some(GeneratedEvent { line: Value::Object(event).to_string().into_bytes(), expected: None })
    }
}
