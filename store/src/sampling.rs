//! The sampled days' rules in the catalog. In: the `[sampling]` config and
//! a day to archive. Out: the day's [`Rule`]: the one recorded with the day
//! (`sampling_days`, `sampling_thresholds`), else one derived from the
//! aggregates of the `history_days` before it (the configured quantile of
//! each group's merged total-latency and TTFT histograms, and the keep
//! rules of `[[sampling.keep]]`) and recorded,
//! so archiving the day again (after a crash, or late rows) keeps the same
//! rows, and the archive can be derived again and checked.

use std::collections::HashMap;

use sqlx::Row;

use crate::catalog::{date_of, Catalog};
use crate::config::KeepRule;
use crate::config::SamplingConfig;
use crate::error::StoreError;
use crate::model::aggregates::hist_column;
use crate::model::keep::Keep;
use crate::model::measures::{TOTAL, TTFT};
use crate::model::sample::{GroupHistory, Method, Rule, Source, Thresholds};
use crate::Day;

fn bucket_name(text: &str) -> Result<&'static str, StoreError> {
    inferlog_schema::InputBucket::ALL
        .iter()
        .map(|b| b.as_str())
        .find(|b| *b == text)
        .ok_or_else(|| StoreError::Config(format!("unknown input bucket {text:?} in the catalog")))
}

impl Catalog {
    /// Each group's history over the `days` days before `day`: requests and
    /// the `quantile` of the merged total-latency and TTFT histograms.
    pub async fn group_history(&self, day: Day, days: u32, quantile: f64) -> Result<Vec<GroupHistory>, StoreError> {
        let (total, ttft) = (hist_column(TOTAL), hist_column(TTFT));
        let sql = format!(
            "SELECT business_line, model_name, model_version, input_bucket, \
             coalesce(inferlog_count(inferlog_merge({total})), 0) AS total_rows, inferlog_quantile(inferlog_merge({total}), $3) AS total_q, \
             coalesce(inferlog_count(inferlog_merge({ttft})), 0) AS ttft_rows, inferlog_quantile(inferlog_merge({ttft}), $3) AS ttft_q \
             FROM daily_aggregates WHERE day >= $1::date - $2::int AND day < $1 \
             GROUP BY business_line, model_name, model_version, input_bucket"
        );
        let rows = sqlx::query(&sql)
            .bind(date_of(day))
            .bind(days as i32)
            .bind(quantile)
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::postgres("read group history"))?;
        let decode = || StoreError::postgres("decode group history");
        rows.iter()
            .map(|r| {
                Ok(GroupHistory {
                    group: (
                        r.try_get("business_line").map_err(decode())?,
                        r.try_get("model_name").map_err(decode())?,
                        r.try_get("model_version").map_err(decode())?,
                        bucket_name(r.try_get("input_bucket").map_err(decode())?)?,
                    ),
                    total_rows: r.try_get::<i64, _>("total_rows").map_err(decode())? as u64,
                    total_quantile_ms: r.try_get("total_q").map_err(decode())?,
                    ttft_rows: r.try_get::<i64, _>("ttft_rows").map_err(decode())? as u64,
                    ttft_quantile_ms: r.try_get("ttft_q").map_err(decode())?,
                })
            })
            .collect()
    }

    /// The rule `day` was archived with, if it was sampled.
    pub async fn sampling_rule(&self, day: Day) -> Result<Option<Rule>, StoreError> {
        let decode = || StoreError::postgres("decode sampling rule");
        let Some(d) = sqlx::query("SELECT * FROM sampling_days WHERE day = $1")
            .bind(date_of(day))
            .fetch_optional(self.pool())
            .await
            .map_err(StoreError::postgres("read sampling rule"))?
        else {
            return Ok(None);
        };
        let fixed = Thresholds {
            slow_total_latency_ms: d.try_get("slow_total_latency_ms").map_err(decode())?,
            slow_ttft_ms: d.try_get("slow_ttft_ms").map_err(decode())?,
            long_output_tokens: d.try_get::<i64, _>("long_output_tokens").map_err(decode())? as u32,
            long_input_tokens: d.try_get::<i64, _>("long_input_tokens").map_err(decode())? as u32,
            source: Source::Static,
        };
        let rows = sqlx::query("SELECT * FROM sampling_thresholds WHERE day = $1")
            .bind(date_of(day))
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::postgres("read sampling thresholds"))?;
        let mut groups = HashMap::with_capacity(rows.len());
        for r in &rows {
            let group = (
                r.try_get("business_line").map_err(decode())?,
                r.try_get("model_name").map_err(decode())?,
                r.try_get("model_version").map_err(decode())?,
                bucket_name(r.try_get("input_bucket").map_err(decode())?)?,
            );
            let t = Thresholds {
                slow_total_latency_ms: r.try_get("slow_total_latency_ms").map_err(decode())?,
                slow_ttft_ms: r.try_get("slow_ttft_ms").map_err(decode())?,
                source: Source::History,
                ..fixed
            };
            groups.insert(group, t);
        }
        let keep_rules: Vec<KeepRule> = serde_json::from_str(d.try_get("keep_rules").map_err(decode())?)
            .map_err(|e| StoreError::Config(format!("the keep rules recorded with {day:?} do not read: {e}")))?;
        Ok(Some(Rule {
            method: Method::from_code(d.try_get("method").map_err(decode())?)?,
            base_rate: d.try_get("base_rate").map_err(decode())?,
            min_per_stratum: d.try_get::<i64, _>("min_per_stratum").map_err(decode())? as u64,
            seed: d.try_get::<i64, _>("seed").map_err(decode())? as u64,
            groups,
            fixed,
            keep: keep_rules.iter().map(Keep::new).collect::<Result<_, _>>()?,
        }))
    }

    /// The rule to archive `day` with: the recorded one, else one derived
    /// from the history before it and recorded (with `history`'s row counts).
    pub async fn sampling_rule_for(&self, day: Day, config: &SamplingConfig) -> Result<Rule, StoreError> {
        if let Some(rule) = self.sampling_rule(day).await? {
            return Ok(rule);
        }
        let history = self.group_history(day, config.history_days, config.quantile).await?;
        let rule = Rule::new(config, &history)?;
        let keep_rules: Vec<&KeepRule> = rule.keep.iter().map(|k| &k.rule).collect();
        let keep_rules = serde_json::to_string(&keep_rules).map_err(|e| StoreError::Config(format!("keep rules: {e}")))?;
        let rows: HashMap<_, u64> = history.iter().map(|h| (h.group.clone(), h.total_rows)).collect();
        let mut tx = self.pool().begin().await.map_err(StoreError::postgres("begin"))?;
        sqlx::query(
            "INSERT INTO sampling_days (day, base_rate, min_per_stratum, quantile, history_days, min_history_rows, seed, \
             slow_total_latency_ms, slow_ttft_ms, long_output_tokens, long_input_tokens, keep_rules, method) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(date_of(day))
        .bind(rule.base_rate)
        .bind(rule.min_per_stratum as i64)
        .bind(config.quantile)
        .bind(config.history_days as i32)
        .bind(config.min_history_rows as i64)
        .bind(rule.seed as i64)
        .bind(rule.fixed.slow_total_latency_ms)
        .bind(rule.fixed.slow_ttft_ms)
        .bind(i64::from(rule.fixed.long_output_tokens))
        .bind(i64::from(rule.fixed.long_input_tokens))
        .bind(&keep_rules)
        .bind(rule.method.code())
        .execute(&mut *tx)
        .await
        .map_err(StoreError::postgres("record sampling rule"))?;
        for ((line, model, version, bucket), t) in &rule.groups {
            let key = (line.clone(), model.clone(), version.clone(), *bucket);
            sqlx::query(
                "INSERT INTO sampling_thresholds (day, business_line, model_name, model_version, input_bucket, \
                 slow_total_latency_ms, slow_ttft_ms, history_rows) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(date_of(day))
            .bind(line)
            .bind(model)
            .bind(version)
            .bind(*bucket)
            .bind(t.slow_total_latency_ms)
            .bind(t.slow_ttft_ms)
            .bind(rows.get(&key).copied().unwrap_or(0) as i64)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::postgres("record sampling thresholds"))?;
        }
        tx.commit().await.map_err(StoreError::postgres("commit sampling rule"))?;
        Ok(rule)
    }

    /// Forgets `day`'s rule (the day is archived without sampling now).
    pub async fn forget_sampling_rule(&self, day: Day) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sampling_days WHERE day = $1")
            .bind(date_of(day))
            .execute(self.pool())
            .await
            .map_err(StoreError::postgres("forget sampling rule"))?;
        Ok(())
    }
}
