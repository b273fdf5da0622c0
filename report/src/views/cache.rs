//! The `cache` view. In: the facts of the range. Out: per model and
//! version the requests the prefix cache served, the hit ratio, the share
//! of input tokens it served, and the distribution of the cached-prefix
//! length (tokens; from the mergeable histogram, within 1%).

use std::collections::BTreeMap;

use crate::document::{Cell, Kind, Table};
use crate::facts::{Facts, Summary, CACHE_PREFIX};
use crate::views::{groups, Context};

/// The cached-prefix quantiles shown.
const PREFIX_LEVELS: [(f64, &str, &str); 5] = [
    (0.25, "prefix_p25_tokens", "prefix p25"),
    (0.5, "prefix_p50_tokens", "prefix p50"),
    (0.75, "prefix_p75_tokens", "prefix p75"),
    (0.9, "prefix_p90_tokens", "prefix p90"),
    (0.99, "prefix_p99_tokens", "prefix p99"),
];

pub fn tables(facts: &Facts, ctx: &Context) -> Vec<Table> {
    let mut by_version: BTreeMap<(String, String), Summary> = BTreeMap::new();
    for (k, g) in groups(facts, ctx.range, |_| true) {
        by_version.entry((k.model_name.clone(), k.model_version.clone())).or_default().add(g);
    }
    let mut columns = vec![
        ("model_name", "model"),
        ("model_version", "version"),
        ("requests", "requests"),
        ("cache_hits", "cache hits"),
        ("hit_ratio", "hit ratio"),
        ("cached_input_tokens", "cached input"),
        ("cached_input_share", "share of input"),
    ];
    columns.extend(PREFIX_LEVELS.map(|(_, k, l)| (k, l)));
    let mut table = Table::new("cache", "prefix cache by model version", &columns);
    for ((model, version), s) in &by_version {
        let c = &s.counts;
        let mut row = vec![
            Cell::text(model.clone()),
            Cell::text(version.clone()),
            Cell::count(c.totals.requests),
            Cell::count(c.totals.cache_hits),
            Cell::num((c.totals.requests > 0).then(|| c.totals.cache_hits as f64 / c.totals.requests as f64), Kind::Share),
            Cell::count(c.totals.cache_prefix_tokens),
            Cell::num(
                (c.totals.input_tokens > 0).then(|| c.totals.cache_prefix_tokens.min(c.totals.input_tokens) as f64 / c.totals.input_tokens as f64),
                Kind::Share,
            ),
        ];
        row.extend(PREFIX_LEVELS.map(|(q, _, _)| Cell::num(s.quantile(CACHE_PREFIX, q).map(f64::round), Kind::Count)));
        table.push(row);
    }
    vec![table]
}
