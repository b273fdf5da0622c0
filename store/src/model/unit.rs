//! A closed day cut into units that compactors archive independently. In:
//! the day's series (business line × model × version, the hot table's
//! leading key columns) with their row counts, and for a series larger than
//! a unit, times that cut it in pieces; `[compactor] unit_max_rows`. Out:
//! the day's [`Unit`]s, each a contiguous range of the table's sorting key
//! given as a condition on its rows; on a cluster, of one shard's rows
//! (planned per shard, read from the shard's local table).
//!
//! A unit is whole series, or pieces of one cut by `event_time`, packed in
//! key order, so ClickHouse reads only the unit's granules (its primary
//! index answers a series and a time range) and the units are disjoint
//! and cover the day: a series' first piece is open below, its last open
//! above. The plan is recorded with the day's fingerprint, so every reader
//! uses the same units; rows that arrive later change the fingerprint and
//! the day is planned again.

/// One unit of a day: `index` of `of`, the shard whose rows it holds (on
/// a cluster; none: the table as the server or `Distributed` reads it),
/// and the condition (SQL, to follow `AND`) that selects its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub index: u32,
    pub of: u32,
    pub shard: Option<u32>,
    pub condition: String,
}

/// The series of one shard's day (on one server, the day's: no shard).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSeries {
    pub shard: Option<u32>,
    pub series: Vec<Series>,
}

/// One series of a day, its rows, and the times (`event_time`, seconds)
/// that cut it in pieces of about `unit_max_rows` (none when it fits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub rows: u64,
    pub cuts: Vec<u32>,
}

impl Series {
    /// Moves each cut down to a multiple of `seconds` (an hour: a sampled
    /// day's strata are group × hour, so no stratum spans two pieces),
    /// dropping a cut that falls on midnight (the piece below it would be
    /// empty) and any repeated.
    pub fn align_cuts(&mut self, seconds: u32) {
        if seconds == 0 {
            return;
        }
        self.cuts = self.cuts.iter().map(|c| c - c % seconds).filter(|c| c % 86_400 != 0).collect();
        self.cuts.dedup();
    }

    /// How many pieces a series of `rows` is cut in, at most `max_rows` each.
    pub fn pieces(rows: u64, max_rows: u64) -> u32 {
        if max_rows == 0 {
            return 1;
        }
        u32::try_from(rows.div_ceil(max_rows)).unwrap_or(u32::MAX).max(1)
    }

    fn key(&self) -> String {
        format!(
            "business_line = {} AND model_name = {} AND model_version = {}",
            quote(&self.business_line),
            quote(&self.model_name),
            quote(&self.model_version)
        )
    }
}

/// A ClickHouse string literal.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

impl Unit {
    /// The whole day as one unit (no condition on the rows).
    pub fn whole_day() -> Unit {
        Unit { index: 0, of: 1, shard: None, condition: "1".into() }
    }

    /// The day's units over its shards: each shard's series planned on
    /// their own ([`Unit::plan`]: a shard that fits is one unit), numbered
    /// in shard order; a shard without rows has none.
    pub fn plan_shards(shards: &[ShardSeries], max_rows: u64) -> Vec<Unit> {
        let mut units: Vec<Unit> = shards
            .iter()
            .filter(|s| s.series.iter().any(|s| s.rows > 0))
            .flat_map(|s| Unit::plan(&s.series, max_rows).into_iter().map(move |u| Unit { shard: s.shard, ..u }))
            .collect();
        let of = units.len() as u32;
        for (i, u) in units.iter_mut().enumerate() {
            (u.index, u.of) = (i as u32, of);
        }
        units
    }

    /// The day's units: `series` (in key order) cut at their `cuts` and
    /// packed, in that order, into units of at most `max_rows` rows (a
    /// piece larger than that is a unit of its own). Sorted and deduplicated
    /// cuts are assumed; one unit (the whole day) when everything fits.
    pub fn plan(series: &[Series], max_rows: u64) -> Vec<Unit> {
        let total: u64 = series.iter().map(|s| s.rows).sum();
        if max_rows == 0 || total <= max_rows {
            return vec![Unit::whole_day()];
        }
        let mut units: Vec<(u64, Vec<String>)> = Vec::new();
        for s in series {
            let pieces = s.cuts.len() as u64 + 1;
            for p in 0..=s.cuts.len() {
                let rows = s.rows / pieces + u64::from((p as u64) < s.rows % pieces);
                let mut condition = s.key();
                if let Some(lo) = p.checked_sub(1).map(|i| s.cuts[i]) {
                    condition += &format!(" AND event_time >= toDateTime({lo})");
                }
                if let Some(hi) = s.cuts.get(p) {
                    condition += &format!(" AND event_time < toDateTime({hi})");
                }
                match units.last_mut() {
                    Some((n, parts)) if *n + rows <= max_rows => {
                        *n += rows;
                        parts.push(condition);
                    }
                    _ => units.push((rows, vec![condition])),
                }
            }
        }
        let of = units.len() as u32;
        units
            .into_iter()
            .enumerate()
            .map(|(i, (_, parts))| Unit { index: i as u32, of, shard: None, condition: format!("(({}))", parts.join(") OR (")) })
            .collect()
    }

    /// `i/n` (and `shard s`, 1-based, on a cluster), as logs name it.
    pub fn name(&self) -> String {
        match self.shard {
            None => format!("{}/{}", self.index, self.of),
            Some(s) => format!("{}/{} (shard {})", self.index, self.of, s + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(line: &str, rows: u64, cuts: &[u32]) -> Series {
        Series { business_line: line.into(), model_name: "m".into(), model_version: "v".into(), rows, cuts: cuts.to_vec() }
    }

    #[test]
    fn a_day_that_fits_is_one_unit_without_a_condition() {
        assert_eq!(Unit::plan(&[series("a", 50, &[]), series("b", 50, &[])], 100), vec![Unit::whole_day()]);
        assert_eq!(Unit::plan(&[series("a", 500, &[])], 0), vec![Unit::whole_day()], "0: one unit");
        assert_eq!(Series::pieces(1_000_000, 125_000), 8);
        assert_eq!(Series::pieces(1, 125_000), 1);
    }

    #[test]
    fn series_pack_in_key_order_and_a_large_one_is_cut_by_time() {
        let units = Unit::plan(&[series("a", 40, &[]), series("b", 50, &[]), series("c", 270, &[100, 200]), series("d", 10, &[])], 100);
        let conditions: Vec<&str> = units.iter().map(|u| u.condition.as_str()).collect();
        let key = |l: &str| format!("business_line = '{l}' AND model_name = 'm' AND model_version = 'v'");
        assert_eq!(
            conditions,
            [
                format!("(({}) OR ({}))", key("a"), key("b")),
                format!("(({} AND event_time < toDateTime(100)))", key("c")),
                format!("(({} AND event_time >= toDateTime(100) AND event_time < toDateTime(200)))", key("c")),
                format!("(({} AND event_time >= toDateTime(200)) OR ({}))", key("c"), key("d")),
            ]
        );
        assert!(units.iter().enumerate().all(|(i, u)| u.index == i as u32 && u.of == 4));
    }

    #[test]
    fn a_cluster_day_is_planned_per_shard_and_numbered_across_them() {
        let shards = [
            ShardSeries { shard: Some(0), series: vec![series("a", 150, &[75]), series("b", 20, &[])] },
            ShardSeries { shard: Some(1), series: vec![] },
            ShardSeries { shard: Some(2), series: vec![series("a", 60, &[])] },
        ];
        let units = Unit::plan_shards(&shards, 100);
        let got: Vec<(u32, u32, Option<u32>)> = units.iter().map(|u| (u.index, u.of, u.shard)).collect();
        assert_eq!(got, [(0, 3, Some(0)), (1, 3, Some(0)), (2, 3, Some(2))], "an empty shard has no unit");
        assert_eq!(units[2].condition, "1", "a shard that fits is one unit, all of its rows");
        assert!(units[1].condition.contains("event_time >= toDateTime(75)") && units[1].condition.contains("business_line = 'b'"));
        assert_eq!(units[1].name(), "1/3 (shard 1)");
        let one = Unit::plan_shards(&[ShardSeries { shard: None, series: vec![series("a", 500, &[250])] }], 300);
        assert_eq!(one.iter().map(|u| u.shard).collect::<Vec<_>>(), [None, None], "one server: no shard");
    }

    #[test]
    fn a_sampled_days_cuts_fall_on_whole_hours() {
        let midnight = 20_000 * 86_400;
        let mut s = series("a", 400, &[midnight + 600, midnight + 3_000, midnight + 4_000, midnight + 7_300]);
        s.align_cuts(3_600);
        assert_eq!(s.cuts, [midnight + 3_600, midnight + 7_200], "the first hour's cuts drop to midnight: gone");
        let units = Unit::plan(&[s], 150);
        assert_eq!(units.len(), 3);
        assert!(units[1].condition.contains(&format!("event_time >= toDateTime({})", midnight + 3_600)));
    }

    #[test]
    fn a_value_is_quoted_as_a_clickhouse_literal() {
        let units = Unit::plan(&[series("it's\\", 200, &[]), series("b", 200, &[])], 100);
        assert!(units[0].condition.starts_with("((business_line = 'it\\'s\\\\' AND"), "{}", units[0].condition);
    }
}
