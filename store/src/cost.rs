//! Token cost. In: the `[cost]` table's price entries and an aggregate
//! row's model, day and token sums. Out: its cost in USD, or `None` when no
//! entry prices the model (unpriced: never silently zero).
//!
//! Which entry applies: among the entries whose `model` pattern matches the
//! model name and whose `effective_from` is not after the day, those of the
//! most specific pattern (the most characters besides `*`; between equals,
//! the longer literal prefix, then the first in byte order, so the config's
//! order never decides), and of those the newest. So `gpt-oss-20b` priced from March wins over a `*` fallback, and
//! a price change takes effect on its day.

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::{Day, StoreError};

/// The `[cost]` table: the price table that turns token sums into USD.
/// Each `[[cost.prices]]` entry has `model` (a name pattern, `*` matching
/// any run of characters), `effective_from` (YYYY-MM-DD), and USD per
/// million tokens: `input_usd_per_mtok`, `cached_input_usd_per_mtok`
/// (prefix-cache hits; default: the input price), `output_usd_per_mtok`,
/// plus an optional `request_usd` per request. For a request, the entries
/// of the most specific matching pattern apply, the newest one not after
/// its day. A model no entry matches stays unpriced: cost NULL, counted in
/// `inferlog_compactor_unpriced_requests_total` and in `cost_audit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CostConfig {
    /// The price table, as `[[cost.prices]]` entries. Default: empty (every
    /// request unpriced; tokens are still counted).
    pub prices: Vec<Price>,
}

/// One `[[cost.prices]]` entry: USD per million tokens of a model from a day on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Model name pattern; `*` matches any run of characters
    /// (`"llama-3.1-*"`, `"*"`). Required.
    pub model: String,
    /// First UTC day (YYYY-MM-DD) the entry applies to. Required.
    pub effective_from: String,
    /// USD per million input tokens the cache did not serve. Required.
    pub input_usd_per_mtok: f64,
    /// USD per million input tokens served from the prefix cache
    /// (`cache_prefix_tokens`). Default: the input price.
    #[serde(default)]
    pub cached_input_usd_per_mtok: Option<f64>,
    /// USD per million output tokens. Required.
    pub output_usd_per_mtok: f64,
    /// USD per request, on top of the tokens. Default: 0.
    #[serde(default)]
    pub request_usd: f64,
}

/// The token sums a cost is computed from, as the aggregates store them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub requests: u64,
    /// All input tokens, cached ones included.
    pub input_tokens: u64,
    /// The part of `input_tokens` the prefix cache served.
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
}

impl Price {
    /// The cost of `usage` at this price, in USD.
    pub fn cost(&self, usage: Usage) -> f64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let uncached = usage.input_tokens - cached;
        (uncached as f64 * self.input_usd_per_mtok
            + cached as f64 * self.cached_input_usd_per_mtok.unwrap_or(self.input_usd_per_mtok)
            + usage.output_tokens as f64 * self.output_usd_per_mtok)
            / 1e6
            + usage.requests as f64 * self.request_usd
    }
}

/// The price table, validated: entries with their first day parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    entries: Vec<(Price, Day)>,
    digest: String,
}

impl CostConfig {
    /// Checks every entry (pattern, day, non-negative prices, no two entries
    /// for one pattern and day) and builds the table.
    pub fn validate(&self) -> Result<PriceTable, StoreError> {
        let mut entries = Vec::with_capacity(self.prices.len());
        for (i, p) in self.prices.iter().enumerate() {
            let at = |what: String| StoreError::Config(format!("cost.prices[{i}] (model {:?}): {what}", p.model));
            if p.model.is_empty() {
                return Err(at("model must not be empty".into()));
            }
            let day =
                crate::parse_day(&p.effective_from).ok_or_else(|| at(format!("effective_from {:?} is not a date YYYY-MM-DD", p.effective_from)))?;
            for (name, value) in [
                ("input_usd_per_mtok", p.input_usd_per_mtok),
                ("cached_input_usd_per_mtok", p.cached_input_usd_per_mtok.unwrap_or(0.0)),
                ("output_usd_per_mtok", p.output_usd_per_mtok),
                ("request_usd", p.request_usd),
            ] {
                if !value.is_finite() || value < 0.0 {
                    return Err(at(format!("{name} must be a number >= 0, got {value}")));
                }
            }
            if entries.iter().any(|(q, d): &(Price, Day)| q.model == p.model && *d == day) {
                return Err(at(format!("a second entry for the same model pattern from {}", p.effective_from)));
            }
            entries.push((p.clone(), day));
        }
        let canonical = serde_json::to_string(&self.prices).map_err(|e| StoreError::Config(format!("cost.prices: {e}")))?;
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(canonical.as_bytes())));
        Ok(PriceTable { entries, digest })
    }
}

/// Whether `name` matches `pattern`, where `*` matches any run of characters.
fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl PriceTable {
    /// The entry pricing `model` on `day`, if any.
    pub fn price(&self, model: &str, day: Day) -> Option<&Price> {
        // Which pattern: the most literal characters, then the longest
        // literal prefix, then the first in byte order, whatever the
        // config's order; then that pattern's newest entry.
        let rank = |p: &Price| {
            let literal = p.model.chars().filter(|c| *c != '*').count();
            let prefix = p.model.find('*').unwrap_or(p.model.len());
            (literal, prefix, std::cmp::Reverse(p.model.clone()))
        };
        self.entries.iter().filter(|(p, from)| *from <= day && matches(&p.model, model)).max_by_key(|(p, from)| (rank(p), *from)).map(|(p, _)| p)
    }

    /// The cost of `usage` of `model` on `day`; `None` when unpriced.
    pub fn cost(&self, model: &str, day: Day, usage: Usage) -> Option<f64> {
        self.price(model, day).map(|p| p.cost(usage))
    }

    /// `sha256:<hex>` of the entries as configured: which prices a figure came from.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(model: &str, from: &str, input: f64) -> Price {
        Price {
            model: model.into(),
            effective_from: from.into(),
            input_usd_per_mtok: input,
            cached_input_usd_per_mtok: None,
            output_usd_per_mtok: 2.0 * input,
            request_usd: 0.0,
        }
    }

    fn day(text: &str) -> Day {
        crate::parse_day(text).expect("date")
    }

    #[test]
    fn patterns_match_like_globs() {
        assert!(matches("*", "anything"));
        assert!(matches("gpt-oss-20b", "gpt-oss-20b"));
        assert!(!matches("gpt-oss-20b", "gpt-oss-20b-x"));
        assert!(matches("llama-*", "llama-3.1-70b"));
        assert!(matches("*-instruct", "qwen2.5-72b-instruct"));
        assert!(matches("q*72b*ct", "qwen2.5-72b-instruct"));
        assert!(!matches("q*72b*ct", "qwen2.5-7b-instruct"));
        assert!(!matches("a*a", "a"), "the prefix and the suffix may not overlap");
    }

    #[test]
    fn the_newest_entry_of_the_most_specific_pattern_applies() {
        let table =
            CostConfig { prices: vec![price("*", "2026-01-01", 1.0), price("llama-*", "2026-03-01", 2.0), price("llama-*", "2026-06-01", 3.0)] }
                .validate()
                .expect("valid");
        let usage = Usage { requests: 1, input_tokens: 1_000_000, cached_input_tokens: 0, output_tokens: 0 };
        assert_eq!(table.cost("llama-3", day("2025-12-31"), usage), None, "before every entry: unpriced");
        assert_eq!(table.cost("llama-3", day("2026-02-01"), usage), Some(1.0), "only the fallback is in force");
        assert_eq!(table.cost("llama-3", day("2026-03-01"), usage), Some(2.0), "a price applies from its own day");
        assert_eq!(table.cost("llama-3", day("2026-05-31"), usage), Some(2.0));
        assert_eq!(table.cost("llama-3", day("2026-06-01"), usage), Some(3.0));
        assert_eq!(table.cost("mistral", day("2026-06-01"), usage), Some(1.0));
        assert!(CostConfig::default().validate().expect("empty").cost("x", 0, usage).is_none());
    }

    #[test]
    fn patterns_of_equal_specificity_are_ranked_the_same_in_any_config_order() {
        let usage = Usage { requests: 1, input_tokens: 1_000_000, cached_input_tokens: 0, output_tokens: 0 };
        let entries = [price("*-70b", "2026-01-01", 1.0), price("llama*", "2026-03-01", 2.0), price("lla*70b", "2026-02-01", 4.0)];
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2]] {
            let table = CostConfig { prices: order.map(|i| entries[i].clone()).to_vec() }.validate().expect("valid");
            // "*-70b", "llama*" and "lla*70b": 4, 5 and 6 literal characters.
            assert_eq!(table.cost("llama-70b", day("2026-06-01"), usage), Some(4.0), "{order:?}: the most literal characters");
        }
        let tie = [price("*ma-70b", "2026-01-01", 1.0), price("llama-*", "2026-01-01", 2.0), price("lla*70b", "2026-05-01", 3.0)];
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let table = CostConfig { prices: order.map(|i| tie[i].clone()).to_vec() }.validate().expect("valid");
            // Six literal characters each: the longest literal prefix wins ("llama-*"), though another entry is newer.
            assert_eq!(table.cost("llama-70b", day("2026-06-01"), usage), Some(2.0), "{order:?}");
        }
        let same_prefix = [price("a*bc", "2026-01-01", 1.0), price("a*b*c", "2026-01-01", 2.0)];
        for order in [[0, 1], [1, 0]] {
            let table = CostConfig { prices: order.map(|i| same_prefix[i].clone()).to_vec() }.validate().expect("valid");
            assert_eq!(table.cost("abcb", day("2026-06-01"), usage), None, "neither matches");
            assert_eq!(table.cost("abbc", day("2026-06-01"), usage), Some(2.0), "{order:?}: both match; the first in byte order");
        }
    }

    #[test]
    fn cached_input_and_requests_are_priced_apart() {
        let p = Price { cached_input_usd_per_mtok: Some(0.25), request_usd: 0.001, ..price("m", "2026-01-01", 1.0) };
        let usage = Usage { requests: 10, input_tokens: 3_000_000, cached_input_tokens: 1_000_000, output_tokens: 500_000 };
        let expected = 2.0 * 1.0 + 0.25 + 0.5 * 2.0 + 10.0 * 0.001;
        assert!((p.cost(usage) - expected).abs() < 1e-12, "{} != {expected}", p.cost(usage));
        let no_cache_price = price("m", "2026-01-01", 1.0);
        assert!((no_cache_price.cost(usage) - (3.0 + 1.0)).abs() < 1e-12, "cached tokens default to the input price");
    }

    #[test]
    fn bad_entries_are_named() {
        let bad = |p: Price| CostConfig { prices: vec![p] }.validate().expect_err("invalid").to_string();
        assert!(bad(price("m", "2026-13-01", 1.0)).contains("cost.prices[0] (model \"m\"): effective_from"));
        assert!(bad(price("m", "2026-01-01", -1.0)).contains("input_usd_per_mtok must be a number >= 0"));
        assert!(bad(price("", "2026-01-01", 1.0)).contains("model must not be empty"));
        let twice = CostConfig { prices: vec![price("m", "2026-01-01", 1.0), price("m", "2026-01-01", 2.0)] }.validate().expect_err("duplicate");
        assert!(twice.to_string().contains("cost.prices[1]"), "{twice}");
        let a = CostConfig { prices: vec![price("m", "2026-01-01", 1.0)] }.validate().expect("valid");
        let b = CostConfig { prices: vec![price("m", "2026-01-01", 1.5)] }.validate().expect("valid");
        assert_ne!(a.digest(), b.digest(), "the digest names the prices");
    }
}
