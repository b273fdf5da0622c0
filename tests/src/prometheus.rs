//! The Prometheus that `deploy/local/services.sh` runs, as tests use it:
//! scrape targets a test lists while it lives, and the HTTP API's answers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::repo_root;

pub fn url() -> String {
    std::env::var("INFERLOG_TEST_PROMETHEUS_URL").unwrap_or_else(|_| "http://127.0.0.1:9490".into())
}

/// The directory Prometheus discovers scrape targets in (services.sh).
fn targets_dir() -> PathBuf {
    let local = std::env::var_os("INFERLOG_LOCAL_DIR").map_or_else(|| repo_root().join(".inferlog/local"), PathBuf::from);
    local.join("prometheus/targets")
}

/// A scrape target listed while it lives, its series labelled `run`.
#[derive(Debug)]
pub struct Target(PathBuf);

impl Target {
    pub fn add(run: &str, addr: &str) -> Target {
        let path = targets_dir().join(format!("{run}.json"));
        let body = serde_json::json!([{ "targets": [addr], "labels": { "run": run } }]);
        std::fs::write(&path, body.to_string()).expect("write the target file");
        Target(path)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `GET /api/v1/<path>` with form parameters; the `data` of the answer.
pub fn api(path: &str, params: &[(&str, &str)]) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-G", &format!("{}/api/v1/{path}", url())]);
    for (k, v) in params {
        cmd.args(["--data-urlencode", &format!("{k}={v}")]);
    }
    let out = cmd.output().expect("curl");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(answer["status"], "success", "{path} {params:?}: {answer}");
    answer["data"].clone()
}

/// An instant query at `time` (seconds, as Prometheus writes them): each
/// series' labels and value.
pub fn query(expr: &str, time: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let data = api("query", &[("query", expr), ("time", time)]);
    data["result"]
        .as_array()
        .expect("a vector")
        .iter()
        .map(|s| {
            let labels = s["metric"].as_object().expect("labels").iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect();
            (labels, s["value"][1].as_str().expect("a value").parse().expect("a number"))
        })
        .collect()
}

/// The raw samples of one series over the last `range`: (timestamp as
/// Prometheus wrote it, value), oldest first.
pub fn samples(selector: &str, range: &str) -> Vec<(String, f64)> {
    let data = api("query", &[("query", &format!("{selector}[{range}]"))]);
    let result = data["result"].as_array().expect("a matrix");
    assert!(result.len() <= 1, "{selector} names one series: {data}");
    result
        .iter()
        .flat_map(|r| r["values"].as_array().expect("values").iter())
        .map(|v| (v[0].to_string(), v[1].as_str().expect("value").parse().expect("number")))
        .collect()
}

/// Milliseconds of a Prometheus timestamp (seconds, as it writes them).
pub fn ms(t: &str) -> i64 {
    (t.parse::<f64>().expect("a timestamp") * 1000.0).round() as i64
}

/// Now, as Prometheus writes a time.
pub fn now() -> String {
    format!("{}", crate::now_ms() as f64 / 1000.0)
}
