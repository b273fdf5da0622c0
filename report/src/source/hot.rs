//! The hot tier as a source of facts. In: the days routed to ClickHouse
//! and the filter. Out: [`Facts`] folded from every row of those days
//! (producer retries collapsed with `FINAL`), with the same groups,
//! histograms, busiest minutes and prices the compactor would write, plus
//! each hashed user's tokens, which only this tier keeps.

use std::collections::HashMap;

use clickhouse::Row;
use inferlog_schema::config::ErrorDictionary;
use inferlog_schema::histogram::{self, Histogram};
use inferlog_schema::{InputBucket, OutputBucket};
use inferlog_store::cost::PriceTable;
use inferlog_store::hot::HotTier;
use inferlog_store::Day;
use serde::Deserialize;

use crate::error::ReportError;
use crate::facts::{Counts, ErrorFacts, ErrorKey, Facts, GroupFacts, GroupKey, HourFacts, HourKey, Tier, UserFacts, CACHE_PREFIX};
use crate::source::Filter;

/// One hot row, as much of it as the report needs (strings borrowed from
/// the response: no allocation per row).
#[derive(Debug, Clone, PartialEq, Row, Deserialize)]
pub struct HotRow<'a> {
    pub timestamp_ms: u64,
    pub business_line: &'a str,
    pub model_name: &'a str,
    pub model_version: &'a str,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub error_code: i32,
    pub error_stage: &'a str,
    pub cache_hit: u8,
    pub cache_prefix_tokens: Option<u32>,
    /// The hashed user id, empty when the request carried none.
    pub user: &'a str,
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
        let mut cursor = query.fetch::<HotRow<'_>>().map_err(hot.error("report rows"))?;
        while let Some(row) = cursor.next().await.map_err(hot.error("report rows"))? {
            fold.add(&row);
        }
    }
    let mut facts = fold.finish(prices, dictionary);
    facts.tiers = days.iter().map(|&d| (d, Tier::Hot)).collect();
    Ok(facts)
}

/// A series: business line, model, version.
type Series = (String, String, String);

/// Rows folded into groups, hours, minutes, errors and users. Rows arrive
/// in the table's key order (business line, model, version, time), so a
/// series is looked up once per run of rows and the keys are small copies.
#[derive(Debug, Default)]
pub struct Fold {
    series: Vec<Series>,
    /// The series of the previous row.
    last: Option<usize>,
    stages: Vec<String>,
    groups: HashMap<(Day, usize, InputBucket, OutputBucket), GroupFacts>,
    hours: HashMap<(i64, usize), HourFacts>,
    /// Per minute since the epoch and series: requests and tokens.
    minutes: HashMap<(i64, usize), (u64, u64)>,
    /// Per (day, series, input bucket, error code, stage).
    errors: HashMap<(Day, usize, InputBucket, i32, usize), u64>,
    users: HashMap<Day, HashMap<String, UserFacts>>,
}

/// The index of `value` in `list`, added when new.
fn index_of(list: &mut Vec<String>, value: &str) -> usize {
    list.iter().position(|v| v == value).unwrap_or_else(|| {
        list.push(value.to_owned());
        list.len() - 1
    })
}

impl Fold {
    fn series_of(&mut self, row: &HotRow<'_>) -> usize {
        let same = |s: &Series| s.0 == row.business_line && s.1 == row.model_name && s.2 == row.model_version;
        if let Some(i) = self.last.filter(|i| same(&self.series[*i])) {
            return i;
        }
        let i = self.series.iter().position(same).unwrap_or_else(|| {
            self.series.push((row.business_line.to_owned(), row.model_name.to_owned(), row.model_version.to_owned()));
            self.series.len() - 1
        });
        self.last = Some(i);
        i
    }

    pub fn add(&mut self, row: &HotRow<'_>) {
        let ms = row.timestamp_ms as i64;
        let day = inferlog_store::day_of_ms(ms);
        let series = self.series_of(row);
        let input_bucket = InputBucket::of(row.input_tokens);
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
        let group = self.groups.entry((day, series, input_bucket, OutputBucket::of(row.output_tokens))).or_default();
        group.counts.add(&counts);
        let hour = self.hours.entry((ms.div_euclid(3_600_000), series)).or_default();
        hour.counts.add(&Counts { cache_hits: 0, ..counts });
        for (i, value) in row.latencies.iter().enumerate() {
            if let Some(v) = value {
                // Each value's bucket once, counted in both histograms.
                let bucket = (*v > 0.0).then(|| histogram::bucket(*v));
                group.hists[i].get_or_insert_with(Histogram::new).add_bucket(bucket, 1);
                hour.hists[i].get_or_insert_with(Histogram::new).add_bucket(bucket, 1);
            }
        }
        if let Some(prefix) = row.cache_prefix_tokens {
            group.hists[CACHE_PREFIX].get_or_insert_with(Histogram::new).add(f64::from(prefix));
        }
        let minute = self.minutes.entry((ms.div_euclid(60_000), series)).or_default();
        minute.0 += 1;
        minute.1 += counts.tokens();
        if row.error_code != 0 {
            let stage = index_of(&mut self.stages, row.error_stage);
            *self.errors.entry((day, series, input_bucket, row.error_code, stage)).or_default() += 1;
        }
        if !row.user.is_empty() {
            let users = self.users.entry(day).or_default();
            // Allocates for a user's first row only.
            if !users.contains_key(row.user) {
                users.insert(row.user.to_owned(), UserFacts::default());
            }
            if let Some(user) = users.get_mut(row.user) {
                user.requests += 1;
                user.tokens += counts.tokens();
            }
        }
    }

    /// Prices the groups and hours as the compactor does (per group, from
    /// its token sums) and picks each hour's busiest minute.
    pub fn finish(self, prices: &PriceTable, dictionary: &ErrorDictionary) -> Facts {
        let series = &self.series;
        let mut facts = Facts::default();
        for ((day, s, input, output), mut group) in self.groups {
            let (line, model, version) = series[s].clone();
            group.counts.price(prices.cost(&model, day, group.counts.usage()));
            let key = GroupKey {
                day,
                business_line: line,
                model_name: model,
                model_version: version,
                input_bucket: input.as_str().to_owned(),
                output_bucket: output.as_str().to_owned(),
            };
            facts.groups.insert(key, group);
        }
        let mut hours = self.hours;
        for ((minute, s), (requests, tokens)) in self.minutes {
            let Some(hour) = hours.get_mut(&(minute.div_euclid(60), s)) else { continue };
            let better = requests > hour.peak_minute_requests || (requests == hour.peak_minute_requests && minute < hour.peak_minute);
            if better {
                hour.peak_minute = minute;
                hour.peak_minute_requests = requests;
                hour.peak_minute_tokens = tokens;
            }
        }
        for ((hour_number, s), mut hour) in hours {
            let (line, model, version) = series[s].clone();
            hour.counts.price(prices.cost(&model, hour_number.div_euclid(24) as Day, hour.counts.usage()));
            facts.hours.insert(HourKey { hour: hour_number, business_line: line, model_name: model, model_version: version }, hour);
        }
        for ((day, s, input, code, stage), errors) in self.errors {
            let (line, model, version) = series[s].clone();
            let key = ErrorKey {
                day,
                business_line: line,
                model_name: model,
                model_version: version,
                input_bucket: input.as_str().to_owned(),
                error_code: code,
                error_stage: self.stages[stage].clone(),
            };
            facts.errors.insert(key, ErrorFacts { name: dictionary.get(code).unwrap_or("unknown").to_owned(), errors });
        }
        for (day, users) in self.users {
            facts.users.extend(users.into_iter().map(|(user, u)| ((day, user), u)));
        }
        facts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferlog_store::cost::CostConfig;

    fn row(ts: u64, input: u32, error: i32, user: &str) -> HotRow<'_> {
        HotRow {
            timestamp_ms: ts,
            business_line: "search",
            model_name: "m",
            model_version: "v1",
            input_tokens: input,
            output_tokens: 100,
            error_code: error,
            error_stage: if error == 0 { "" } else { "prefill" },
            cache_hit: u8::from(input > 2000),
            cache_prefix_tokens: Some(input / 2),
            user,
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
