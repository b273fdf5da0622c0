//! `--fail-if`: thresholds a cron job or CI step states. In: expressions
//! `METRIC>VALUE` (also `>=`, `<`, `<=`) over the overview's metrics of the
//! range (`p99_ttft_ms`, `success_rate` as a fraction, `cost_usd`,
//! `error_share.<code name>` …). Out: the ones crossed, as alerts (exit 1).

use crate::document::show;
use crate::error::ReportError;
use crate::views::overview::Metric;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Gt,
    Ge,
    Lt,
    Le,
}

/// One `--fail-if` expression.
#[derive(Debug, Clone, PartialEq)]
pub struct FailIf {
    pub metric: String,
    pub op: Op,
    pub value: f64,
    pub text: String,
}

impl FailIf {
    pub fn parse(text: &str) -> Result<FailIf, ReportError> {
        let bad = |why: &str| ReportError::Usage(format!("--fail-if {text:?}: {why} (expected METRIC>VALUE, >=, < or <=, e.g. 'p99_ttft_ms>2000')"));
        let at = text.find(['>', '<']).ok_or_else(|| bad("no comparison"))?;
        let (metric, rest) = text.split_at(at);
        let (op, value) = match rest.as_bytes() {
            [b'>', b'=', ..] => (Op::Ge, &rest[2..]),
            [b'<', b'=', ..] => (Op::Le, &rest[2..]),
            [b'>', ..] => (Op::Gt, &rest[1..]),
            _ => (Op::Lt, &rest[1..]),
        };
        let metric = metric.trim();
        if metric.is_empty() {
            return Err(bad("no metric"));
        }
        let value: f64 = value.trim().parse().map_err(|_| bad("the value is not a number"))?;
        Ok(FailIf { metric: metric.to_owned(), op, value, text: text.to_owned() })
    }

    /// The alert when `metrics` cross this threshold; an unknown metric is a usage error.
    pub fn check(&self, metrics: &[Metric]) -> Result<Option<String>, ReportError> {
        let Some(m) = metrics.iter().find(|m| m.key == self.metric) else {
            let known: Vec<&str> = metrics.iter().map(|m| m.key.as_str()).collect();
            return Err(ReportError::Usage(format!("--fail-if {:?}: unknown metric {:?}; known: {}", self.text, self.metric, known.join(", "))));
        };
        let Some(v) = m.value else { return Ok(None) };
        let crossed = match self.op {
            Op::Gt => v > self.value,
            Op::Ge => v >= self.value,
            Op::Lt => v < self.value,
            Op::Le => v <= self.value,
        };
        Ok(crossed.then(|| format!("threshold {}: {} is {}", self.text, self.metric, show(v, m.kind))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::Kind;

    #[test]
    fn thresholds_parse_and_compare() {
        let metrics = [
            Metric { key: "p99_ttft_ms".into(), value: Some(2500.0), kind: Kind::Ms },
            Metric { key: "success_rate".into(), value: Some(0.995), kind: Kind::Share },
        ];
        let t = FailIf::parse("p99_ttft_ms>2000").expect("parse");
        assert_eq!((t.metric.as_str(), t.op, t.value), ("p99_ttft_ms", Op::Gt, 2000.0));
        assert_eq!(t.check(&metrics).expect("known").as_deref(), Some("threshold p99_ttft_ms>2000: p99_ttft_ms is 2500.0"));
        assert!(FailIf::parse("p99_ttft_ms >= 2500").expect("parse").check(&metrics).expect("known").is_some());
        assert_eq!(FailIf::parse("success_rate<0.99").expect("parse").check(&metrics).expect("known"), None);
        assert!(FailIf::parse("success_rate<=0.995").expect("parse").check(&metrics).expect("known").is_some());
        assert!(FailIf::parse("p99_ttft_ms=3").expect_err("no op").to_string().contains("no comparison"));
        assert!(FailIf::parse(">3").expect_err("no metric").to_string().contains("no metric"));
        assert!(FailIf::parse("x>fast").expect_err("nan").to_string().contains("not a number"));
        let err = FailIf::parse("p99_ttfb_ms>1").expect("parse").check(&metrics).expect_err("unknown");
        assert!(err.to_string().contains("unknown metric \"p99_ttfb_ms\"; known: p99_ttft_ms, success_rate"), "{err}");
    }
}
