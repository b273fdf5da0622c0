//! The service metrics on `/metrics`. In: the tallies of each durable
//! batch. Out: at every scrape, the Prometheus families of their totals:
//! six histograms, requests by status and error code, tokens by type (and
//! user bucket, when configured), and the label overflow counter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Counter, Histogram, LabelPair, Metric, MetricFamily, MetricType};

use super::labels::{Interner, LABELS};
use super::tally::{Tally, HISTOGRAMS, TOKEN_TYPES};

const REQUESTS: (&str, &str) = ("inferlog_service_requests_total", "Stored events (requests), by status (ok: error_code 0) and error code");
const TOKENS: (&str, &str) = ("inferlog_service_tokens_total", "Tokens of stored events, by type (input, output, cached: the reused prefix)");
const OVERFLOW: (&str, &str) = (
    "inferlog_service_label_overflow_total",
    "Stored events counted under `other` because a label had reached its cap of distinct values (service_metrics.max_*)",
);

/// The service metrics' totals and their collector. Cloning shares them.
#[derive(Debug, Clone)]
pub struct ServiceMetrics {
    interner: Arc<Interner>,
    totals: Arc<Mutex<Tally>>,
    descs: Arc<Vec<Desc>>,
}

impl ServiceMetrics {
    pub fn new(interner: Arc<Interner>) -> ServiceMetrics {
        let series: Vec<String> = LABELS[..4].iter().map(|l| l.to_string()).collect();
        let with = |extra: &[&str]| series.iter().cloned().chain(extra.iter().map(|l| l.to_string())).collect::<Vec<_>>();
        let token_labels = if interner.user_buckets() > 0 { with(&["type", "user_bucket"]) } else { with(&["type"]) };
        let mut descs: Vec<Desc> = HISTOGRAMS.iter().map(|(name, help, _)| desc(name, help, series.clone())).collect();
        descs.push(desc(REQUESTS.0, REQUESTS.1, with(&["status", "error_code"])));
        descs.push(desc(TOKENS.0, TOKENS.1, token_labels));
        descs.push(desc(OVERFLOW.0, OVERFLOW.1, vec!["label".into()]));
        ServiceMetrics { interner, totals: Arc::default(), descs: Arc::new(descs) }
    }

    /// Adds a durable batch's tallies.
    pub fn add<'a>(&self, tallies: impl IntoIterator<Item = &'a Tally>) {
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        for t in tallies {
            totals.add(t);
        }
    }

    fn snapshot(&self) -> Tally {
        self.totals.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn desc(name: &str, help: &str, labels: Vec<String>) -> Desc {
    Desc::new(name.into(), help.into(), labels, HashMap::new()).expect("a valid metric name and labels")
}

/// Label pairs sorted by name, as the crate's own metrics have them.
fn pairs(names: &[&str], values: &[&str]) -> Vec<LabelPair> {
    let mut pairs: Vec<LabelPair> = names
        .iter()
        .zip(values)
        .map(|(n, v)| {
            let mut p = LabelPair::default();
            p.set_name(n.to_string());
            p.set_value(v.to_string());
            p
        })
        .collect();
    pairs.sort_by(|a, b| a.name().cmp(b.name()));
    pairs
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.into());
    f.set_help(help.into());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn counter(labels: Vec<LabelPair>, value: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value as f64);
    let mut m = Metric::from_label(labels);
    m.set_counter(c);
    m
}

impl Collector for ServiceMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let totals = self.snapshot();
        let series = self.interner.series_labels();
        let codes = self.interner.code_labels();
        let names = &LABELS[..4];
        let mut histograms: Vec<Vec<Metric>> = vec![Vec::new(); HISTOGRAMS.len()];
        let (mut requests, mut tokens) = (Vec::new(), Vec::new());
        for (s, labels) in totals.series.iter().zip(&series) {
            let values: Vec<&str> = labels.iter().map(|v| &**v).collect();
            for ((out, hist), (_, _, bounds)) in histograms.iter_mut().zip(&s.histograms).zip(HISTOGRAMS) {
                let count: u64 = hist.counts.iter().sum();
                if count == 0 {
                    continue;
                }
                let mut cumulative = 0;
                let buckets = bounds
                    .iter()
                    .zip(hist.counts)
                    .map(|(bound, n)| {
                        cumulative += n;
                        let mut b = Bucket::default();
                        b.set_upper_bound(*bound);
                        b.set_cumulative_count(cumulative);
                        b
                    })
                    .collect();
                let mut h = Histogram::default();
                h.set_sample_count(count);
                h.set_sample_sum(hist.sum);
                h.set_bucket(buckets);
                let mut m = Metric::from_label(pairs(names, &values));
                m.set_histogram(h);
                out.push(m);
            }
            let request_names = [names, &["status", "error_code"]].concat();
            for (code, &n) in s.requests.iter().enumerate().filter(|(_, n)| **n > 0) {
                let status = if code == 0 { "ok" } else { "error" };
                let code = codes.get(code).map_or("other", |c| &**c);
                requests.push(counter(pairs(&request_names, &[&values[..], &[status, code]].concat()), n));
            }
            if self.interner.user_buckets() > 0 {
                let token_names = [names, &["type", "user_bucket"]].concat();
                let none = usize::from(self.interner.user_buckets());
                for (bucket, counts) in s.user_tokens.iter().enumerate() {
                    let bucket = if bucket == none { "none".to_string() } else { bucket.to_string() };
                    for (kind, &n) in TOKEN_TYPES.iter().zip(counts).filter(|(_, n)| **n > 0) {
                        tokens.push(counter(pairs(&token_names, &[&values[..], &[kind, &bucket]].concat()), n));
                    }
                }
            } else {
                let token_names = [names, &["type"]].concat();
                for (kind, &n) in TOKEN_TYPES.iter().zip(&s.tokens) {
                    tokens.push(counter(pairs(&token_names, &[&values[..], &[kind]].concat()), n));
                }
            }
        }
        let overflow = LABELS.iter().zip(totals.overflow).map(|(label, n)| counter(pairs(&["label"], &[label]), n)).collect();
        let mut out: Vec<MetricFamily> =
            HISTOGRAMS.iter().zip(histograms).map(|((name, help, _), m)| family(name, help, MetricType::HISTOGRAM, m)).collect();
        out.push(family(REQUESTS.0, REQUESTS.1, MetricType::COUNTER, requests));
        out.push(family(TOKENS.0, TOKENS.1, MetricType::COUNTER, tokens));
        out.push(family(OVERFLOW.0, OVERFLOW.1, MetricType::COUNTER, overflow));
        out.retain(|f| !f.get_metric().is_empty());
        out
    }
}

#[cfg(test)]
mod tests {
    use inferlog_store::ServiceMetricsConfig;

    use super::super::labels::Cache;
    use super::*;

    fn row(model: &str, line: &str, code: i32, total_ms: f64, user: Option<&str>) -> inferlog_store::model::rows::HotRow {
        let json = format!(
            r#"{{"request_id":"r-{model}-{code}-{total_ms}","timestamp":"2026-11-29T23:00:00Z","business_line":"{line}","model_name":"{model}","model_version":"v1","input_tokens":100,"output_tokens":20,"total_latency_ms":{total_ms},"error_code":{code},"ttft_ms":40,"cache_prefix_tokens":30{}{}}}"#,
            if code != 0 { r#","error_stage":"decode""# } else { "" },
            user.map(|u| format!(r#","user_id":"{u}""#)).unwrap_or_default(),
        );
        let contract = inferlog_schema::Contract::new(&inferlog_schema::ContractConfig::default()).expect("contract");
        let hasher = inferlog_schema::UserIdHasher::new(b"exporter-test-key-0123456789abcdef", None, "test").expect("key");
        let event = contract.normalize(json.as_bytes(), None, &hasher).expect("valid").event;
        inferlog_store::model::rows::HotRow::new(event, Arc::from("events"), 0, 1, 0)
    }

    /// `/metrics` of an exporter with `config` once `rows` are durable.
    fn export(config: &ServiceMetricsConfig, rows: &[inferlog_store::model::rows::HotRow]) -> String {
        let interner = Arc::new(Interner::new(config));
        let metrics = ServiceMetrics::new(interner.clone());
        let (mut cache, mut tally) = (Cache::default(), Tally::default());
        for r in rows {
            tally.observe(&interner.observe(r, &mut cache));
        }
        metrics.add([&tally]);
        let registry = prometheus::Registry::new();
        registry.register(Box::new(metrics)).expect("registers");
        inferlog_store::http::render(&registry)
    }

    #[test]
    fn renders_cumulative_buckets_statuses_tokens_and_overflow() {
        let config = ServiceMetricsConfig { max_models: 1, ..ServiceMetricsConfig::default() };
        let rows = [
            row("m1", "search", 0, 80.0, None),
            row("m1", "search", 0, 700.0, None),
            row("m1", "search", 1003, 3000.0, None),
            row("m2", "ads", 0, 80.0, None),
        ];
        let text = export(&config, &rows);
        let has = |line: &str| assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        let series = r#"business_line="search",model_name="m1",model_version="v1",request_type="unknown""#;
        has(&format!(r#"inferlog_service_request_duration_seconds_bucket{{{series},le="0.1"}} 1"#));
        has(&format!(r#"inferlog_service_request_duration_seconds_bucket{{{series},le="1"}} 2"#));
        has(&format!(r#"inferlog_service_request_duration_seconds_bucket{{{series},le="5"}} 3"#));
        has(&format!(r#"inferlog_service_request_duration_seconds_bucket{{{series},le="+Inf"}} 3"#));
        has(&format!(r#"inferlog_service_request_duration_seconds_count{{{series}}} 3"#));
        has(
            r#"inferlog_service_requests_total{business_line="search",error_code="0",model_name="m1",model_version="v1",request_type="unknown",status="ok"} 2"#,
        );
        has(
            r#"inferlog_service_requests_total{business_line="search",error_code="1003",model_name="m1",model_version="v1",request_type="unknown",status="error"} 1"#,
        );
        has(&format!(r#"inferlog_service_tokens_total{{{series},type="cached"}} 90"#));
        has(&format!(r#"inferlog_service_tokens_total{{{series},type="input"}} 300"#));
        has(&format!(r#"inferlog_service_tokens_total{{{series},type="output"}} 60"#));
        // The second model is past a cap of one: counted under `other`.
        has(
            r#"inferlog_service_requests_total{business_line="ads",error_code="0",model_name="other",model_version="v1",request_type="unknown",status="ok"} 1"#,
        );
        has(r#"inferlog_service_label_overflow_total{label="model_name"} 1"#);
        has(r#"inferlog_service_label_overflow_total{label="business_line"} 0"#);
        assert!(!text.contains("user_bucket"), "no user label unless configured");
    }

    #[test]
    fn user_buckets_label_only_the_token_counter() {
        let config = ServiceMetricsConfig { user_buckets: 10, ..ServiceMetricsConfig::default() };
        let r = row("m1", "search", 0, 80.0, Some("alice@example.com"));
        let bucket = super::super::labels::user_bucket(r.user_id_hash.as_deref().expect("hashed"), 10);
        assert_eq!(Interner::new(&config).observe(&r, &mut Cache::default()).user_bucket, bucket);
        let text = export(&config, &[r, row("m1", "search", 0, 90.0, None)]);
        assert!(text.contains(&format!(r#"type="output",user_bucket="{bucket}"}} 20"#)), "{text}");
        assert!(text.contains(r#"type="output",user_bucket="none"} 20"#), "an event without a user: {text}");
        assert!(!text.contains("alice"), "{text}");
        for line in text.lines().filter(|l| l.contains("user_bucket")) {
            assert!(line.starts_with("inferlog_service_tokens_total"), "{line}");
        }
    }
}
