//! The hot tier as a source of facts. In: the days routed to ClickHouse
//! and the filter. Out: [`Facts`] folded from every row of those days
//! (producer retries collapsed with `FINAL`) by the store's one fold
//! ([`DayFold`], the compactor's too), priced as the compactor prices
//! them, plus each hashed user's tokens, which only this tier keeps.

use inferlog_schema::config::ErrorDictionary;
use inferlog_store::cost::PriceTable;
use inferlog_store::hot::HotTier;
use inferlog_store::model::fold::Folded;
use inferlog_store::model::measures::DURATIONS;
use inferlog_store::model::stored::FoldRow;
use inferlog_store::Day;

use crate::error::ReportError;
use crate::facts::{Counts, ErrorFacts, ErrorKey, Facts, GroupFacts, GroupKey, HourFacts, HourKey, Pairs, Tier, TypeKey, UserFacts};
use crate::source::{Filter, Reads};

/// The query streaming one day's rows; `?` binds the day, then the filter's values.
fn rows_sql(table: &str, filter: &Filter) -> String {
    let mut sql = format!("SELECT {} FROM {table} FINAL WHERE day = toDate(?)", FoldRow::select_list());
    if filter.business_line.is_some() {
        sql.push_str(" AND business_line = ?");
    }
    if filter.model.is_some() {
        sql.push_str(" AND model_name = ?");
    }
    sql
}

/// One request both versions served: each version's total latency, TTFT
/// (`*_ttft` counts only where `*_ttft_n` > 0) and error code.
#[derive(Debug, Clone, Copy, clickhouse::Row, serde::Deserialize)]
struct PairRow {
    a_total: f64,
    b_total: f64,
    a_ttft: f64,
    b_ttft: f64,
    a_ttft_n: u64,
    b_ttft_n: u64,
    a_error: i32,
    b_error: i32,
}

/// The query of the requests both versions served on one day; `?` binds
/// versions A and B four times (one pair per measure), the day, A and B,
/// then the filter's values. ClickHouse 18.16's `anyIf` of a Nullable
/// column answers 0, not NULL, where no row of the version carries a
/// value, so TTFT comes with a count of the rows that carry it.
fn pairs_sql(table: &str, filter: &Filter) -> String {
    let mut sql = format!(
        "SELECT anyIf(total_latency_ms, model_version = ?) AS a_total, anyIf(total_latency_ms, model_version = ?) AS b_total, \
         anyIf(ifNull(ttft_ms, 0), model_version = ? AND isNotNull(ttft_ms)) AS a_ttft, \
         anyIf(ifNull(ttft_ms, 0), model_version = ? AND isNotNull(ttft_ms)) AS b_ttft, \
         countIf(model_version = ? AND isNotNull(ttft_ms)) AS a_ttft_n, countIf(model_version = ? AND isNotNull(ttft_ms)) AS b_ttft_n, \
         anyIf(error_code, model_version = ?) AS a_error, anyIf(error_code, model_version = ?) AS b_error \
         FROM {table} FINAL WHERE day = toDate(?) AND model_version IN (?, ?)"
    );
    if filter.business_line.is_some() {
        sql.push_str(" AND business_line = ?");
    }
    if filter.model.is_some() {
        sql.push_str(" AND model_name = ?");
    }
    sql.push_str(" GROUP BY request_id HAVING uniqExact(model_version) = 2");
    sql
}

/// The requests versions `a` and `b` both served on `days` (hot days).
pub async fn pairs(hot: &HotTier, days: &[Day], filter: &Filter, a: &str, b: &str) -> Result<Pairs, ReportError> {
    let sql = pairs_sql(&hot.qualified(), filter);
    let mut out = Pairs { days: days.len(), ..Pairs::default() };
    for &day in days {
        let mut query = hot.client().query(&sql);
        for _ in 0..4 {
            query = query.bind(a).bind(b);
        }
        query = query.bind(inferlog_store::day_string(day)).bind(a).bind(b);
        if let Some(line) = &filter.business_line {
            query = query.bind(line);
        }
        if let Some(model) = &filter.model {
            query = query.bind(model);
        }
        let mut cursor = query.fetch::<PairRow>().map_err(hot.error("report pairs"))?;
        while let Some(p) = cursor.next().await.map_err(hot.error("report pairs"))? {
            out.pairs += 1;
            match (p.a_error != 0, p.b_error != 0) {
                (true, false) => out.a_only_failed += 1,
                (false, true) => out.b_only_failed += 1,
                (true, true) => {}
                (false, false) => {
                    out.total_diffs.push(p.b_total - p.a_total);
                    if p.a_ttft_n > 0 && p.b_ttft_n > 0 {
                        out.ttft_diffs.push(p.b_ttft - p.a_ttft);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Reads `days` from the hot tier, with their waste and callers when `reads` asks.
pub async fn load(
    hot: &HotTier,
    days: &[Day],
    filter: &Filter,
    reads: Reads,
    prices: &PriceTable,
    dictionary: &ErrorDictionary,
) -> Result<Facts, ReportError> {
    let mut facts = Facts::default();
    let sql = rows_sql(&hot.qualified(), filter);
    for &day in days {
        let mut query = hot.client().query(&sql).bind(inferlog_store::day_string(day));
        if let Some(line) = &filter.business_line {
            query = query.bind(line);
        }
        if let Some(model) = &filter.model {
            query = query.bind(model);
        }
        let mut fold = reads.fold(true);
        let mut cursor = query.fetch::<FoldRow<'_>>().map_err(hot.error("report rows"))?;
        while let Some(row) = cursor.next().await.map_err(hot.error("report rows"))? {
            fold.add(&row);
        }
        add_day(&mut facts, day, fold.finish(), prices, dictionary);
    }
    facts.tiers = days.iter().map(|&d| (d, Tier::Hot)).collect();
    Ok(facts)
}

/// Adds one day's fold to `facts`: groups and hours priced from their
/// token sums (per group and per hour, as the compactor prices them), error
/// counts named by the dictionary, users, waste, callers, request types, GPUs.
pub fn add_day(facts: &mut Facts, day: Day, folded: Folded, prices: &PriceTable, dictionary: &ErrorDictionary) {
    for ((business_line, model_name, model_version, input, output), group) in folded.daily {
        let mut counts = Counts::from(group.totals);
        counts.price(prices.cost(&model_name, day, counts.usage()));
        let key = GroupKey { day, business_line, model_name, model_version, input_bucket: input.to_owned(), output_bucket: output.to_owned() };
        facts.groups.insert(key, GroupFacts { counts, hists: group.histograms });
    }
    for hour in folded.hours {
        let r = hour.row;
        let mut counts = Counts::from(r.totals());
        counts.price(prices.cost(&r.model_name, day, r.usage()));
        let key = HourKey { hour: r.hour as i64, business_line: r.business_line, model_name: r.model_name, model_version: r.model_version };
        let hists: [_; DURATIONS] = hour.histograms;
        let facts_hour = HourFacts {
            counts,
            peak_minute: r.peak_minute as i64,
            peak_minute_requests: r.peak_minute_requests,
            peak_minute_tokens: r.peak_minute_tokens,
            minutes: Some(r.minutes),
            hists,
        };
        facts.hours.insert(key, facts_hour);
    }
    for e in folded.errors {
        let key = ErrorKey {
            day,
            business_line: e.business_line,
            model_name: e.model_name,
            model_version: e.model_version,
            input_bucket: e.input_bucket,
            error_code: e.error_code,
            error_stage: e.error_stage,
        };
        facts.errors.insert(key, ErrorFacts { name: dictionary.get(e.error_code).unwrap_or("unknown").to_owned(), errors: e.errors });
    }
    for (user, u) in folded.users {
        facts.users.insert((day, user), UserFacts { requests: u.requests, tokens: u.tokens });
    }
    if let Some(waste) = folded.waste {
        facts.waste.insert(day, waste);
    }
    for ((line, caller), load) in folded.callers.unwrap_or_default() {
        facts.callers.insert((day, line, caller), load);
    }
    for t in folded.types.unwrap_or_default() {
        let key = TypeKey { day, model_name: t.model_name, model_version: t.model_version, request_type: t.request_type };
        facts.types.insert(key, GroupFacts::from(t.group));
    }
    for (gpu, g) in folded.gpus.unwrap_or_default() {
        facts.gpus.insert((day, gpu), GroupFacts::from(g));
    }
}

#[cfg(test)]
mod tests {
    use inferlog_schema::histogram::Histogram;
    use inferlog_store::cost::CostConfig;
    use inferlog_store::model::fold::{DayFold, Extras};

    use super::*;

    fn row(ts: u64, input: u32, error: i32, user: &str) -> FoldRow<'_> {
        FoldRow {
            timestamp_ms: ts,
            business_line: "search",
            model_name: "m",
            model_version: "v1",
            input_tokens: input,
            output_tokens: 100,
            total_latency_ms: 100.0,
            error_code: error,
            error_stage: (error != 0).then_some("prefill"),
            user_id_hash: (!user.is_empty()).then_some(user),
            request_type: None,
            queue_wait_ms: Some(1.0),
            prefill_time_ms: Some(5.0),
            decode_time_ms: Some(80.0),
            ttft_ms: Some(10.0),
            tpot_ms: None,
            gpu_id: None,
            cache_hit: Some(u8::from(input > 2000)),
            cache_prefix_tokens: Some(input / 2),
            gpu_mem_peak_mb: None,
            prompt_hash: None,
            max_tokens: None,
        }
    }

    #[test]
    fn rows_fold_into_groups_hours_peaks_errors_and_users() {
        let day_ms = 20_000 * 86_400_000_u64;
        let mut fold = DayFold::counting(Extras { users: true, ..Extras::default() });
        // 10:00 one request, 10:05 two (the peak), 10:07 two (a tie: the earlier wins).
        let m = |minute: u64| day_ms + 10 * 3_600_000 + minute * 60_000;
        for (ts, input, error, user) in
            [(m(0), 500, 0, "u1"), (m(5), 500, 1002, "u1"), (m(5) + 1, 3000, 0, ""), (m(7), 500, 0, "u2"), (m(7), 500, 0, "u2")]
        {
            fold.add(&row(ts, input, error, user));
        }
        let toml = "[[prices]]\nmodel = \"m\"\neffective_from = \"2020-01-01\"\ninput_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n";
        let prices: CostConfig = toml::from_str(toml).expect("prices");
        let mut facts = Facts::default();
        let dictionary = inferlog_schema::ContractConfig::default().validate().expect("dictionary");
        add_day(&mut facts, 20_000, fold.finish(), &prices.validate().expect("valid"), &dictionary);
        assert_eq!(facts.groups.len(), 2, "two input buckets");
        let small = facts.groups.iter().find(|(k, _)| k.input_bucket == "0-1k").expect("0-1k").1;
        assert_eq!((small.counts.totals.requests, small.counts.totals.errors, small.counts.totals.input_tokens), (4, 1, 2000));
        assert_eq!(small.hists[crate::facts::TOTAL].as_ref().map(Histogram::count), Some(4));
        assert!(small.hists[crate::facts::TPOT].is_none(), "no request carried TPOT");
        // Cached prefix 250 of 500 per request, cached tokens price at the input price when no cached price is set.
        assert!((small.counts.cost_usd - (2000.0 * 1.0 + 400.0 * 2.0) / 1e6).abs() < 1e-12, "{}", small.counts.cost_usd);
        let (hour_key, hour) = facts.hours.iter().next().expect("one hour");
        assert_eq!(hour_key.hour, (day_ms / 3_600_000 + 10) as i64);
        assert_eq!((hour.counts.totals.requests, hour.peak_minute_requests), (5, 2));
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
    fn pairs_are_requests_both_versions_served() {
        let sql = pairs_sql("d.t", &Filter { business_line: None, model: Some("y".into()) });
        assert_eq!(sql.matches('?').count(), 8 + 3 + 1, "{sql}");
        assert!(sql.contains("FROM d.t FINAL WHERE day = toDate(?) AND model_version IN (?, ?) AND model_name = ?"), "{sql}");
        assert!(sql.ends_with("GROUP BY request_id HAVING uniqExact(model_version) = 2"), "{sql}");
    }

    #[test]
    fn the_filter_narrows_the_query() {
        let sql = rows_sql("d.t", &Filter { business_line: Some("x".into()), model: Some("y".into()) });
        assert!(sql.starts_with("SELECT timestamp_ms, business_line, model_name,"), "{sql}");
        assert!(sql.ends_with("FROM d.t FINAL WHERE day = toDate(?) AND business_line = ? AND model_name = ?"), "{sql}");
        assert!(rows_sql("d.t", &Filter::default()).ends_with("WHERE day = toDate(?)"));
    }
}
