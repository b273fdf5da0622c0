//! The hot tier as a source of facts. In: the days routed to ClickHouse
//! and the filter. Out: [`Facts`] folded from every row of those days
//! (producer retries collapsed with `FINAL`), with the same groups,
//! histograms, busiest minutes and prices the compactor would write, plus
//! each hashed user's tokens, which only this tier keeps.

use std::collections::HashMap;

use clickhouse::Row;
use inferlog_schema::config::ErrorDictionary;
use inferlog_schema::histogram::Histogram;
use inferlog_schema::{InputBucket, OutputBucket};
use inferlog_store::cost::PriceTable;
use inferlog_store::hot::HotTier;
use inferlog_store::Day;
use serde::Deserialize;

use crate::error::ReportError;
use crate::facts::{Counts, ErrorFacts, ErrorKey, Facts, GroupFacts, GroupKey, HourFacts, HourKey, Tier, UserFacts, CACHE_PREFIX};
use crate::source::Filter;

/// One hot row, as much of it as the report needs.
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct HotRow {
    pub timestamp_ms: u64,
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub error_code: i32,
    pub error_stage: String,
    pub cache_hit: u8,
    pub cache_prefix_tokens: Option<u32>,
    /// The hashed user id, empty when the request carried none.
    pub user: String,
    /// Total, TTFT, TPOT, queue, prefill, decode (ms), in [`crate::facts::LATENCIES`] order.
    pub latencies: [Option<f64>; 6],
}

/// The query streaming one day's rows; `?` binds the day, then the filter's values.
fn rows_sql(table: &str, filter: &Filter) -> String {
    let mut sql = format!(
        "SELECT timestamp_ms, business_line, model_name, model_version, input_tokens, output_tokens, error_code, \
         ifNull(error_stage, '') AS error_stage, ifNull(cache_hit, 0) AS cache_hit, cache_prefix_tokens, \
         ifNull(user_id_hash, '') AS user, toNullable(total_latency_ms), ttft_ms, tpot_ms, queue_wait_ms, prefill_time_ms, decode_time_ms \
         FROM {table} FINAL WHERE day = toDate(?)"
    );
    if filter.business_line.is_some() {
        sql.push_str(" AND business_line = ?");
    }
    if filter.model.is_some() {
        sql.push_str(" AND model_name = ?");
    }
    sql
}

/// Reads `days` from the hot tier.
pub async fn load(hot: &HotTier, days: &[Day], filter: &Filter, prices: &PriceTable, dictionary: &ErrorDictionary) -> Result<Facts, ReportError> {
    let mut fold = Fold::default();
    let sql = rows_sql(&hot.qualified(), filter);
    for &day in days {
        let mut query = hot.client().query(&sql).bind(inferlog_store::day_string(day));
        if let Some(line) = &filter.business_line {
            query = query.bind(line);
        }
        if let Some(model) = &filter.model {
            query = query.bind(model);
        }
        let mut cursor = query.fetch::<HotRow>().map_err(hot.error("report rows"))?;
        while let Some(row) = cursor.next().await.map_err(hot.error("report rows"))? {
            fold.add(&row);
        }
    }
    let mut facts = fold.finish(prices, dictionary);
    facts.tiers = days.iter().map(|&d| (d, Tier::Hot)).collect();
    Ok(facts)
}

/// Rows folded into groups, hours, minutes, errors and users.
#[derive(Debug, Default)]
pub struct Fold {
    groups: HashMap<GroupKey, GroupFacts>,
    hours: HashMap<HourKey, HourFacts>,
    /// Per hour group and minute since the epoch: requests and tokens.
    minutes: HashMap<(HourKey, i64), (u64, u64)>,
    errors: HashMap<ErrorKey, u64>,
    users: HashMap<(Day, String), UserFacts>,
}

impl Fold {
    pub fn add(&mut self, row: &HotRow) {
        let ms = row.timestamp_ms as i64;
        let day = inferlog_store::day_of_ms(ms);
        let input_bucket = InputBucket::of(row.input_tokens).as_str();
        let counts = Counts {
            requests: 1,
            errors: u64::from(row.error_code != 0),
            input_tokens: u64::from(row.input_tokens),
            output_tokens: u64::from(row.output_tokens),
            cache_hits: u64::from(row.cache_hit == 1),
            cache_prefix_tokens: u64::from(row.cache_prefix_tokens.unwrap_or(0)),
            cost_usd: 0.0,
            unpriced_requests: 0,
        };
        let key = GroupKey {
            day,
            business_line: row.business_line.clone(),
            model_name: row.model_name.clone(),
            model_version: row.model_version.clone(),
            input_bucket: input_bucket.to_owned(),
            output_bucket: OutputBucket::of(row.output_tokens).as_str().to_owned(),
        };
        let group = self.groups.entry(key).or_default();
        group.counts.add(&counts);
        let hour_key = HourKey {
            hour: ms.div_euclid(3_600_000),
            business_line: row.business_line.clone(),
            model_name: row.model_name.clone(),
            model_version: row.model_version.clone(),
        };
        let hour = self.hours.entry(hour_key.clone()).or_default();
        hour.counts.add(&Counts { cache_hits: 0, ..counts });
        for (i, value) in row.latencies.iter().enumerate() {
            if let Some(v) = value {
                group.hists[i].get_or_insert_with(Histogram::new).add(*v);
                hour.hists[i].get_or_insert_with(Histogram::new).add(*v);
            }
        }
        if let Some(prefix) = row.cache_prefix_tokens {
            group.hists[CACHE_PREFIX].get_or_insert_with(Histogram::new).add(f64::from(prefix));
        }
        let minute = self.minutes.entry((hour_key, ms.div_euclid(60_000))).or_default();
        minute.0 += 1;
        minute.1 += counts.tokens();
        if row.error_code != 0 {
            let key = ErrorKey {
                day,
                business_line: row.business_line.clone(),
                model_name: row.model_name.clone(),
                model_version: row.model_version.clone(),
                input_bucket: input_bucket.to_owned(),
                error_code: row.error_code,
                error_stage: row.error_stage.clone(),
            };
            *self.errors.entry(key).or_default() += 1;
        }
        if !row.user.is_empty() {
            let user = self.users.entry((day, row.user.clone())).or_default();
            user.requests += 1;
            user.tokens += counts.tokens();
        }
    }

    /// Prices the groups and hours as the compactor does (per group, from
    /// its token sums) and picks each hour's busiest minute.
    pub fn finish(self, prices: &PriceTable, dictionary: &ErrorDictionary) -> Facts {
        let mut facts = Facts::default();
        for (key, mut group) in self.groups {
            group.counts.price(prices.cost(&key.model_name, key.day, group.counts.usage()));
            facts.groups.insert(key, group);
        }
        let mut hours = self.hours;
        for ((key, minute), (requests, tokens)) in self.minutes {
            let Some(hour) = hours.get_mut(&key) else { continue };
            let better = requests > hour.peak_minute_requests || (requests == hour.peak_minute_requests && minute < hour.peak_minute);
            if better {
                hour.peak_minute = minute;
                hour.peak_minute_requests = requests;
                hour.peak_minute_tokens = tokens;
            }
        }
        for (key, mut hour) in hours {
            let day = key.hour.div_euclid(24) as Day;
            hour.counts.price(prices.cost(&key.model_name, day, hour.counts.usage()));
            facts.hours.insert(key, hour);
        }
        for (key, errors) in self.errors {
            let name = dictionary.get(key.error_code).unwrap_or("unknown").to_owned();
            facts.errors.insert(key, ErrorFacts { name, errors });
        }
        facts.users = self.users;
        facts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferlog_store::cost::CostConfig;

    fn row(ts: u64, input: u32, error: i32, user: &str) -> HotRow {
        HotRow {
            timestamp_ms: ts,
            business_line: "search".into(),
            model_name: "m".into(),
            model_version: "v1".into(),
            input_tokens: input,
            output_tokens: 100,
            error_code: error,
            error_stage: if error == 0 { String::new() } else { "prefill".into() },
            cache_hit: u8::from(input > 2000),
            cache_prefix_tokens: Some(input / 2),
            user: user.into(),
            latencies: [Some(100.0), Some(10.0), None, Some(1.0), Some(5.0), Some(80.0)],
        }
    }

    #[test]
    fn rows_fold_into_groups_hours_peaks_errors_and_users() {
        let day_ms = 20_000 * 86_400_000_u64;
        let mut fold = Fold::default();
        // 10:00 one request, 10:05 two (the peak), 10:07 two (a tie: the earlier wins).
        let m = |minute: u64| day_ms + 10 * 3_600_000 + minute * 60_000;
        for (ts, input, error, user) in
            [(m(0), 500, 0, "u1"), (m(5), 500, 1002, "u1"), (m(5) + 1, 3000, 0, ""), (m(7), 500, 0, "u2"), (m(7), 500, 0, "u2")]
        {
            fold.add(&row(ts, input, error, user));
        }
        let toml = "[[prices]]\nmodel = \"m\"\neffective_from = \"2020-01-01\"\ninput_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n";
        let prices: CostConfig = toml::from_str(toml).expect("prices");
        let facts = fold.finish(&prices.validate().expect("valid"), &inferlog_schema::ContractConfig::default().validate().expect("dictionary"));
        assert_eq!(facts.groups.len(), 2, "two input buckets");
        let small = facts.groups.iter().find(|(k, _)| k.input_bucket == "0-1k").expect("0-1k").1;
        assert_eq!((small.counts.requests, small.counts.errors, small.counts.input_tokens), (4, 1, 2000));
        assert_eq!(small.hists[crate::facts::TOTAL].as_ref().map(Histogram::count), Some(4));
        assert!(small.hists[crate::facts::TPOT].is_none(), "no request carried TPOT");
        // Cached prefix 250 of 500 per request, cached tokens price at the input price when no cached price is set.
        assert!((small.counts.cost_usd - (2000.0 * 1.0 + 400.0 * 2.0) / 1e6).abs() < 1e-12, "{}", small.counts.cost_usd);
        let (hour_key, hour) = facts.hours.iter().next().expect("one hour");
        assert_eq!(hour_key.hour, (day_ms / 3_600_000 + 10) as i64);
        assert_eq!((hour.counts.requests, hour.peak_minute_requests), (5, 2));
        assert_eq!(hour.peak_minute, (m(5) / 60_000) as i64, "ties go to the earliest minute");
        assert_eq!(hour.peak_minute_tokens, 500 + 100 + 3000 + 100);
        let (error_key, error) = facts.errors.iter().next().expect("one error");
        assert_eq!(
            (error_key.error_code, error_key.input_bucket.as_str(), error.name.as_str(), error.errors),
            (1002, "0-1k", "context_length_exceeded", 1)
        );
        assert_eq!(facts.users.len(), 2, "rows without a user are not a user");
        assert_eq!(facts.users[&(20_000, "u2".to_owned())].tokens, 1200);
    }

    #[test]
    fn the_filter_narrows_the_query() {
        let sql = rows_sql("d.t", &Filter { business_line: Some("x".into()), model: Some("y".into()) });
        assert!(sql.ends_with("FROM d.t FINAL WHERE day = toDate(?) AND business_line = ? AND model_name = ?"), "{sql}");
        assert!(rows_sql("d.t", &Filter::default()).ends_with("WHERE day = toDate(?)"));
    }
}
