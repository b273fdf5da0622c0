//! The hot tier's reads of a day in units. In: a closed day, how it is
//! read, and a unit of it ([`Unit`]). Out: the day's series per shard
//! (what its units are planned from), each unit's fingerprint with the
//! place to read its rows ([`UnitSource`]: on a cluster, the unit's shard
//! on a replica that agreed), and each business line's repeated prompts
//! over the whole day (which no single unit can count).

use std::collections::HashMap;

use clickhouse::{Client, Row};
use serde::Deserialize;

use super::{DayFingerprint, HotTier, ReadMode, Replica, UnitSource};
use crate::error::StoreError;
use crate::model::unit::{Series, ShardSeries, Unit};
use crate::model::waste::LineRepeats;
use crate::Day;

impl HotTier {
    /// The day's series (business line × model × version, in key order)
    /// and their rows, each larger than `max_rows` with the times that cut
    /// it in pieces of about that many (approximate quantiles of its
    /// `event_time`: any cut keeps the pieces disjoint and complete). On a
    /// cluster, per shard, from the first of its replicas that answers
    /// (the plan only sizes units: rows it missed fail the plan's check).
    pub async fn day_series(&self, day: Day, mode: ReadMode, max_rows: u64) -> Result<Vec<ShardSeries>, StoreError> {
        let Some(cluster) = &self.cluster else {
            let series = self.series_on(&self.client, &self.qualified(), day, mode, max_rows).await?;
            return Ok(vec![ShardSeries { shard: None, series }]);
        };
        let local = self.local();
        let mut out = Vec::with_capacity(cluster.read_quorum.len());
        for shard in 0..cluster.read_quorum.len() {
            let mut silent = Vec::new();
            let mut series = None;
            for r in cluster.replicas.iter().filter(|r| r.shard == shard) {
                match self.series_on(&r.client, &local, day, mode, max_rows).await {
                    Ok(s) => {
                        series = Some(s);
                        break;
                    }
                    Err(e) => silent.push(format!("{} ({e})", r.url)),
                }
            }
            let Some(series) = series else {
                return Err(StoreError::Unconfirmed(format!("{local}: no replica of shard {} answered: {}", shard + 1, silent.join(", "))));
            };
            out.push(ShardSeries { shard: Some(shard as u32), series });
        }
        Ok(out)
    }

    async fn series_on(&self, client: &Client, table: &str, day: Day, mode: ReadMode, max_rows: u64) -> Result<Vec<Series>, StoreError> {
        #[derive(clickhouse::Row, serde::Deserialize)]
        struct Counted {
            business_line: String,
            model_name: String,
            model_version: String,
            rows: u64,
        }
        #[derive(clickhouse::Row, serde::Deserialize)]
        struct Cuts {
            cuts: Vec<u32>,
        }
        let sql = format!(
            "SELECT business_line, model_name, model_version, count() AS rows FROM {table} {} WHERE day = toDate(?) \
             GROUP BY business_line, model_name, model_version ORDER BY business_line, model_name, model_version",
            mode.modifier()
        );
        let counted =
            client.query(&sql).bind(crate::day_string(day)).fetch_all::<Counted>().await.map_err(StoreError::clickhouse("day series", table))?;
        let mut series = Vec::with_capacity(counted.len());
        for c in counted {
            let mut s =
                Series { business_line: c.business_line, model_name: c.model_name, model_version: c.model_version, rows: c.rows, cuts: Vec::new() };
            let pieces = Series::pieces(s.rows, max_rows);
            if pieces > 1 {
                let levels: Vec<String> = (1..pieces).map(|i| format!("{}", f64::from(i) / f64::from(pieces))).collect();
                let sql = format!(
                    "SELECT arrayMap(x -> toUInt32(x), quantiles({})(toUInt32(event_time))) AS cuts FROM {table} {} \
                     WHERE day = toDate(?) AND business_line = ? AND model_name = ? AND model_version = ?",
                    levels.join(", "),
                    mode.modifier()
                );
                let mut cuts: Vec<u32> = client
                    .query(&sql)
                    .bind(crate::day_string(day))
                    .bind(&s.business_line)
                    .bind(&s.model_name)
                    .bind(&s.model_version)
                    .fetch_one::<Cuts>()
                    .await
                    .map_err(StoreError::clickhouse("day series cuts", table))?
                    .cuts;
                cuts.sort_unstable();
                cuts.dedup();
                s.cuts = cuts;
            }
            series.push(s);
        }
        Ok(series)
    }

    /// Each business line's repeated prompts over the whole day (read as
    /// `mode` says), counted by ClickHouse as [`crate::model::waste`]
    /// counts them: of a prompt's n requests that day, all but the
    /// earliest (by timestamp, tokens, uncached input) are repeats. For a
    /// day folded in units, whose prompts span units.
    pub async fn day_repeats(&self, day: Day, mode: ReadMode) -> Result<HashMap<String, LineRepeats>, StoreError> {
        #[derive(Row, Deserialize)]
        struct Repeats {
            business_line: String,
            repeats: u64,
            repeat_tokens: u64,
            repeat_uncached_input: u64,
        }
        let uncached = "toUInt64(input_tokens) - least(input_tokens, ifNull(cache_prefix_tokens, 0))";
        let sql = format!(
            "SELECT business_line, toUInt64(sum(n - 1)) AS repeats, toUInt64(sum(tokens - tupleElement(first, 2))) AS repeat_tokens, \
             toUInt64(sum(uncached - tupleElement(first, 3))) AS repeat_uncached_input FROM (\
             SELECT business_line, count() AS n, sum(toUInt64(input_tokens) + output_tokens) AS tokens, sum({uncached}) AS uncached, \
             min(tuple(timestamp_ms, toUInt64(input_tokens) + output_tokens, {uncached})) AS first \
             FROM {} {} WHERE day = toDate(?) AND ifNull(prompt_hash, '') != '' GROUP BY business_line, prompt_hash HAVING n > 1) \
             GROUP BY business_line ORDER BY business_line",
            self.qualified(),
            mode.modifier()
        );
        let rows = self.client.query(&sql).bind(crate::day_string(day)).fetch_all::<Repeats>().await.map_err(self.error("repeated prompts"))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let repeats = LineRepeats { repeats: r.repeats, repeat_tokens: r.repeat_tokens, repeat_uncached_input: r.repeat_uncached_input };
                (r.business_line, repeats)
            })
            .collect())
    }

    /// The fingerprint of one unit of a day's rows ([`Unit::condition`]),
    /// as [`HotTier::fingerprint`] computes the day's.
    pub async fn unit_fingerprint(&self, day: Day, mode: ReadMode, unit: &Unit) -> Result<DayFingerprint, StoreError> {
        Ok(self.confirm_unit(day, mode, unit).await?.0)
    }

    /// The fingerprint of `unit`'s rows, and where to read them: on one
    /// server (or for a unit of no shard) the table as the fingerprint
    /// names it; on a cluster, for a unit of one shard, that shard's local
    /// table on a replica whose fingerprint agreed (the unit's index picks
    /// among them, so units spread over a shard's replicas).
    pub async fn confirm_unit(&self, day: Day, mode: ReadMode, unit: &Unit) -> Result<(DayFingerprint, UnitSource), StoreError> {
        let Some(cluster) = &self.cluster else {
            let fp = self.fingerprint_on(&self.client, &self.qualified(), day, mode, unit).await?;
            return Ok((fp, self.source()));
        };
        let local = self.local();
        let asked: Vec<&Replica> = cluster.replicas.iter().filter(|r| unit.shard.is_none_or(|s| r.shard == s as usize)).collect();
        let answers = futures_util::future::join_all(asked.iter().map(|r| self.fingerprint_on(&r.client, &local, day, mode, unit))).await;
        let mut total = DayFingerprint::EMPTY;
        let mut agreeing = Vec::new();
        for (shard, &needed) in cluster.read_quorum.iter().enumerate().filter(|(s, _)| unit.shard.is_none_or(|u| *s == u as usize)) {
            let mut agreed: Option<(&str, DayFingerprint)> = None;
            let mut answered = Vec::new();
            let mut silent = Vec::new();
            for (r, answer) in asked.iter().zip(&answers).filter(|(r, _)| r.shard == shard) {
                let fp = match answer {
                    Ok(fp) => *fp,
                    Err(e) => {
                        silent.push(format!("{} ({e})", r.url));
                        continue;
                    }
                };
                answered.push(*r);
                match agreed {
                    None => agreed = Some((&r.url, fp)),
                    Some((first, other)) if other != fp => {
                        return Err(StoreError::Unconfirmed(format!(
                            "{local}: the replicas of shard {} disagree on {}: {first} has {}, {} has {} (replication is behind)",
                            shard + 1,
                            crate::day_string(day),
                            other.encode(),
                            r.url,
                            fp.encode()
                        )));
                    }
                    Some(_) => {}
                }
            }
            if answered.len() < needed {
                return Err(StoreError::Unconfirmed(format!(
                    "{local}: {} replicas of shard {} answered for {}, {needed} needed: {}",
                    answered.len(),
                    shard + 1,
                    crate::day_string(day),
                    silent.join(", ")
                )));
            }
            let fp = agreed.map_or(DayFingerprint::EMPTY, |(_, fp)| fp);
            tracing::debug!(table = %local, shard = shard + 1, day = %crate::day_string(day), fingerprint = %fp.encode(), "shard fingerprint");
            total = total.plus(&fp);
            agreeing = answered;
        }
        let source = match (unit.shard, agreeing.is_empty()) {
            (Some(_), false) => {
                let r = agreeing[unit.index as usize % agreeing.len()];
                UnitSource { client: r.client.clone(), table: local, replica: Some(r.url.clone()) }
            }
            _ => self.source(),
        };
        Ok((total, source))
    }

    /// Where a day read as a whole comes from: the table at `url` (on a
    /// cluster, the `Distributed` table).
    pub fn source(&self) -> UnitSource {
        UnitSource { client: self.client.clone(), table: self.qualified(), replica: None }
    }

    /// `database.<table>_local`, a shard's own table on a cluster.
    fn local(&self) -> String {
        format!("{}.{}", self.database, crate::model::tables::local_table(&self.table))
    }

    async fn fingerprint_on(&self, client: &Client, table: &str, day: Day, mode: ReadMode, unit: &Unit) -> Result<DayFingerprint, StoreError> {
        let sql = format!(
            "SELECT count() AS rows, sum(toUInt64(input_tokens)) AS input_tokens, sum(toUInt64(output_tokens)) AS output_tokens, \
             countIf(error_code != 0) AS errors, min(timestamp_ms) AS min_timestamp_ms, max(timestamp_ms) AS max_timestamp_ms \
             FROM {table} {} WHERE day = toDate(?) AND {}",
            mode.modifier(),
            unit.condition
        );
        let fp = client
            .query(&sql)
            .bind(crate::day_string(day))
            .fetch_one::<DayFingerprint>()
            .await
            .map_err(StoreError::clickhouse("fingerprint", table))?;
        Ok(if fp.rows == 0 { DayFingerprint::EMPTY } else { fp })
    }
}
