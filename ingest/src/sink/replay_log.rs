//! The replay log. In: what each batch covers per partition
//! ([`Coverage`]), before it is written and once it is durable; and, when
//! a partition is (re)assigned, its committed offset. Out: the offset
//! ranges past that commit an earlier reader already handled
//! ([`StoredRanges`]), so the new reader skips them.
//!
//! The log is a small table keyed by partition and last offset (one row
//! per batch and partition, [`inferlog_store::model::tables::REPLAY_LOG`]), so a
//! lookup reads an index range instead of scanning the hot table:
//!
//! - a range marked done (state 1) is skipped whole: every offset in it was
//!   stored, rejected or dropped as a duplicate;
//! - a range with only intents (state 0: a reader died or lost the
//!   partition while writing it, maybe several in turn) is checked row by
//!   row, in the hot-table and rejects-log days any of them names: an offset with logged
//!   rejects was handled whole, any other by the indexes (in its message)
//!   of its stored rows, since an OTLP message's spans may go to several
//!   days' inserts and a crash between them stores only some;
//! - offsets before the partition's oldest entry (tables written before
//!   the log existed, or entries retention removed) are looked up in both
//!   tables, streamed into ranges.
//!
//! Memory is proportional to the number of ranges, not of rows or
//! batches: the log's entries are streamed, a run of finished batches
//! merges into one range, an unfinished one is one check, and an intended
//! range of a JSON topic is scanned into ranges too; only on an OTLP topic
//! is a message with stored rows kept with their indexes (one entry a
//! message, not a row; the tests below hold these bounds). A batch's
//! intents go out in the same INSERT as the previous batch's done marks,
//! before its rows, so the log costs one small INSERT per batch.

use std::collections::BTreeMap;
use std::sync::Arc;

use clickhouse::Row;
use serde::{Deserialize, Serialize};

use super::in_flight;
use super::request::table_partition;
use super::service::{bounded, ClickHouseSink, OffsetRow};
use crate::error::IngestError;
use crate::offsets::{RangeBuilder, StoredRanges};

/// The offsets one batch handled in one partition, and where it wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    pub topic: Arc<str>,
    pub partition: i32,
    pub first: i64,
    pub last: i64,
    /// Hot-table days (days since 1970-01-01) of its rows, ascending.
    pub row_days: Vec<u16>,
    /// Days its rejects are logged under (the day each was received).
    pub reject_days: Vec<u16>,
}

/// Range states in the log.
const INTENT: u8 = 0;
const DONE: u8 = 1;

/// The index a scan gives an offset found in the rejects log: its whole
/// message was handled.
const WHOLE: u32 = u32::MAX;

/// An offset and the index in its message of one stored row.
#[derive(Debug, Row, Deserialize)]
struct OffsetIndexRow {
    kafka_offset: u64,
    kafka_index: u32,
}

/// One entry, as stored ([`inferlog_store::model::tables::REPLAY_LOG`]'s columns, in order).
#[derive(Debug, Clone, PartialEq, Row, Serialize, Deserialize)]
pub struct Entry {
    pub day: u16,
    pub written_at: u32,
    pub kafka_topic: String,
    pub kafka_partition: u16,
    pub first_offset: u64,
    pub last_offset: u64,
    pub state: u8,
    pub row_days: Vec<u16>,
    pub reject_days: Vec<u16>,
}

impl Entry {
    fn of(c: &Coverage, state: u8, now_ms: i64) -> Result<Entry, IngestError> {
        Ok(Entry {
            day: super::request::reject_day(now_ms),
            written_at: (now_ms / 1000) as u32,
            kafka_topic: c.topic.to_string(),
            kafka_partition: table_partition(&c.topic, c.partition)?,
            first_offset: c.first.max(0) as u64,
            last_offset: c.last.max(0) as u64,
            state,
            row_days: c.row_days.clone(),
            reject_days: c.reject_days.clone(),
        })
    }
}

#[derive(Debug, Row, Deserialize)]
struct Oldest {
    entries: u64,
    first: u64,
}

/// `YYYY-MM-DD` literals of days, for `day IN (…)`.
pub(crate) fn day_list(days: &[u16]) -> String {
    days.iter().map(|d| format!("'{}'", inferlog_store::day_string(i32::from(*d)))).collect::<Vec<_>>().join(", ")
}

/// What the entries of one partition past `from` say: ranges handled
/// whole (adjacent batches merged into one range), and ranges only
/// intended, to check row by row.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    done: Vec<(i64, i64)>,
    checks: Vec<Check>,
}

/// An intended range to check row by row, in the days any of its intents named.
#[derive(Debug, PartialEq)]
struct Check {
    first: i64,
    last: i64,
    row_days: Vec<u16>,
    reject_days: Vec<u16>,
}

/// One decision per range (first, last), from `entries` sorted by it: done
/// if any entry of it is done; else a check in the union of the days its
/// intents named. Several readers that died writing the same range each
/// wrote an intent naming only the days of the rows it wrote (a reader
/// writes only what the ones before it did not), so any one intent's days
/// miss the others' rows (a CI run stored 2,547 rows twice that way).
#[cfg(test)]
fn plan(entries: &[Entry], from: i64) -> Plan {
    let mut planner = Planner::new(from);
    for e in entries {
        planner.push(e);
    }
    planner.finish()
}

/// [`Plan`] built one entry at a time, entries sorted by (first, last):
/// what it keeps is one range or one check per range of offsets, never
/// the entries themselves.
struct Planner {
    from: i64,
    /// Ranges done, merged as they come: a run of batches one reader
    /// finished is one range, however many batches.
    done: RangeBuilder,
    checks: Vec<Check>,
    /// The range being read.
    current: Option<Reading>,
}

/// A range of the log being read: (first, last), whether an entry marked
/// it done, and the days its intents named (rows, rejects).
struct Reading {
    range: (u64, u64),
    done: bool,
    row_days: Vec<u16>,
    reject_days: Vec<u16>,
}

impl Planner {
    fn new(from: i64) -> Planner {
        Planner { from, done: RangeBuilder::default(), checks: Vec::new(), current: None }
    }

    fn push(&mut self, e: &Entry) {
        let range = (e.first_offset, e.last_offset);
        if self.current.as_ref().is_some_and(|r| r.range != range) {
            self.close();
        }
        let r = self.current.get_or_insert_with(|| Reading { range, done: false, row_days: Vec::new(), reject_days: Vec::new() });
        r.done |= e.state == DONE;
        r.row_days.extend_from_slice(&e.row_days);
        r.reject_days.extend_from_slice(&e.reject_days);
    }

    fn close(&mut self) {
        let Some(Reading { range: (first, last), done, mut row_days, mut reject_days }) = self.current.take() else { return };
        let (first, last) = ((first as i64).max(self.from), last as i64);
        if done {
            self.done.push_range(first, last);
            return;
        }
        for days in [&mut row_days, &mut reject_days] {
            days.sort_unstable();
            days.dedup();
        }
        self.checks.push(Check { first, last, row_days, reject_days });
    }

    /// Ranges and checks held so far: what reading the log costs in memory.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.done.len() + self.checks.len() + usize::from(self.current.is_some())
    }

    fn finish(mut self) -> Plan {
        self.close();
        Plan { done: self.done.finish(), checks: self.checks }
    }
}

/// What an intended range's scan found: offsets handled whole, as ranges,
/// and the stored row indexes of each OTLP message not handled whole.
type Found = (Vec<(i64, i64)>, BTreeMap<i64, Vec<u32>>);

/// The rows an intended range's scan finds, one at a time in offset and
/// index order. A JSON topic's stored row is its whole message: it joins
/// a range, so memory is one range per run of stored offsets. An OTLP
/// message keeps the indexes of its stored rows (one entry a message, not
/// a row) until a logged reject, sorted last, says it was handled whole.
struct IntentScan {
    whole_messages: bool,
    whole: RangeBuilder,
    rows: BTreeMap<i64, Vec<u32>>,
}

impl IntentScan {
    fn new(whole_messages: bool) -> IntentScan {
        IntentScan { whole_messages, whole: RangeBuilder::default(), rows: BTreeMap::new() }
    }

    fn push(&mut self, offset: u64, index: u32) {
        let offset = offset as i64;
        if self.whole_messages {
            self.whole.push(offset);
        } else {
            self.rows.entry(offset).or_default().push(index);
        }
    }

    /// Ranges and messages held so far.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.whole.len() + self.rows.len()
    }

    fn finish(mut self) -> Found {
        // Sorted by index, so a logged reject shows as the last one.
        let whole = &mut self.whole;
        self.rows.retain(|offset, indexes| {
            let logged = indexes.last() == Some(&WHOLE);
            if logged {
                whole.push(*offset);
            }
            !logged
        });
        (self.whole.finish(), self.rows)
    }
}

impl ClickHouseSink {
    /// Records `intents` (a batch about to be written) and `done` (batches
    /// now durable) in one INSERT.
    /// On a cluster, one INSERT per shard, each partition's entries on the
    /// shard that stores its rows.
    pub async fn log_coverage(&self, intents: &[Coverage], done: &[Coverage], now_ms: i64) -> Result<(), IngestError> {
        let mut entries: BTreeMap<usize, Vec<Entry>> = BTreeMap::new();
        for (state, coverage) in [(DONE, done), (INTENT, intents)] {
            for c in coverage {
                entries.entry(self.shard_of(&c.topic, c.partition)?).or_default().push(Entry::of(c, state, now_ms)?);
            }
        }
        for (shard, entries) in entries {
            self.shard(shard).insert(&self.replay_table, &entries, &self.insert_id()).await?;
        }
        Ok(())
    }

    /// The offsets ≥ `from` of one partition an earlier reader handled,
    /// once the inserts into the pipeline's tables in flight have ended
    /// ([`crate::sink::in_flight`]): a killed writer's last insert lands before
    /// the log and the tables are read, or not at all.
    /// On a cluster, all of it on the partition's shard, read without
    /// `select_sequential_consistency`: a part that reached one replica but
    /// not yet its quorum counts as stored (the replicas take no other
    /// quorum insert until it reaches it), so it is never written twice.
    ///
    /// `whole_messages`: the topic holds one event a message (JSON), so an
    /// offset with a stored row was stored whole and joins a range; on an
    /// OTLP topic the indexes of each such message's stored rows are kept.
    pub async fn stored_ranges(&self, topic: &str, partition: i32, from: i64, whole_messages: bool) -> Result<StoredRanges, IngestError> {
        self.shard(self.shard_of(topic, partition)?).stored_ranges_here(topic, partition, from, whole_messages).await
    }

    async fn stored_ranges_here(&self, topic: &str, partition: i32, from: i64, whole_messages: bool) -> Result<StoredRanges, IngestError> {
        let p = table_partition(topic, partition)?;
        // Bounded by its grace and a request's time for each of its queries.
        let limit = in_flight::GRACE + 4 * self.request_timeout;
        let waited = bounded(limit, in_flight::wait_out(&self.client, self.ids.prefix(), in_flight::GRACE))
            .await
            .map_err(|e| self.error("wait out inserts in flight", &self.table, e))?;
        if waited.inserts > 0 {
            tracing::info!(
                topic,
                partition,
                inserts = waited.inserts,
                ended_after_grace = waited.ended,
                waited_ms = waited.waited.as_millis() as u64,
                "waited out the inserts in flight before reading the replay log"
            );
        }
        let from = from.max(0);
        let log = format!("{}.{}", self.database, self.replay_table);
        let oldest = self
            .client
            .query(&format!("SELECT count() AS entries, min(first_offset) AS first FROM {log} WHERE kafka_topic = ? AND kafka_partition = ?"))
            .bind(topic)
            .bind(p)
            .fetch_one::<Oldest>();
        let oldest = bounded(self.request_timeout, oldest).await.map_err(|e| self.error("replay-log lookup", &self.replay_table, e))?;
        // Streamed: what is kept is one range or check per batch range, not the entries.
        let mut cursor = self
            .client
            .query(&format!(
                "SELECT ?fields FROM {log} WHERE kafka_topic = ? AND kafka_partition = ? AND last_offset >= ? ORDER BY first_offset, last_offset, state"
            ))
            .bind(topic)
            .bind(p)
            .bind(from as u64)
            .fetch::<Entry>()
            .map_err(|e| self.error("replay-log lookup", &self.replay_table, e))?;
        let mut planner = Planner::new(from);
        while let Some(entry) =
            bounded(self.request_timeout, cursor.next()).await.map_err(|e| self.error("replay-log lookup", &self.replay_table, e))?
        {
            planner.push(&entry);
        }

        let mut ranges: Vec<(i64, i64)> = Vec::new();
        let mut spans: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        // Offsets no entry covers: written before the log existed, or
        // entries already removed by retention.
        let covered_from = if oldest.entries == 0 { None } else { Some(oldest.first as i64) };
        if covered_from.is_none_or(|first| first > from) {
            let until = covered_from.map(|f| f - 1);
            ranges.extend(self.scan(topic, p, from, until).await?);
        }
        let plan = planner.finish();
        ranges.extend(plan.done);
        for check in &plan.checks {
            let (whole, rows) = self.scan_intent(topic, p, check, whole_messages).await?;
            ranges.extend(whole);
            spans.extend(rows);
        }
        Ok(StoredRanges::new(ranges).with_spans(spans))
    }

    /// The offsets of an intended range (in the hot-table and rejects-log
    /// days its intents named) an earlier reader handled: whole
    /// messages where their rejects were logged (that happens after every
    /// row of the batch is written), else each offset with the indexes of
    /// its stored rows. A message's rows may go to several days' inserts
    /// (an OTLP message whose spans straddle midnight), and a crash between
    /// them stores only some: those are written again, the stored ones not.
    /// With `whole_messages` (a JSON topic) a stored row is its whole
    /// message: offsets go straight into ranges, and memory is one range per
    /// run of stored offsets, not an entry per row.
    async fn scan_intent(&self, topic: &str, partition: u16, check: &Check, whole_messages: bool) -> Result<Found, IngestError> {
        let (from, until) = (check.first, check.last);
        let mut parts = Vec::new();
        if !check.row_days.is_empty() {
            parts.push(format!(
                "SELECT kafka_offset, kafka_index FROM {}.{} WHERE kafka_topic = ? AND kafka_partition = ? AND kafka_offset >= ? AND kafka_offset <= ? AND day IN ({})",
                self.database,
                self.table,
                day_list(&check.row_days)
            ));
        }
        if !check.reject_days.is_empty() {
            parts.push(format!(
                "SELECT kafka_offset, toUInt32({WHOLE}) AS kafka_index FROM {}.{} WHERE kafka_topic = ? AND kafka_partition = ? AND kafka_offset >= ? AND kafka_offset <= ? AND day IN ({})",
                self.database,
                self.rejects_table,
                day_list(&check.reject_days)
            ));
        }
        let mut found = IntentScan::new(whole_messages);
        if parts.is_empty() {
            return Ok(found.finish());
        }
        let sql = format!("SELECT kafka_offset, kafka_index FROM ({}) ORDER BY kafka_offset, kafka_index", parts.join(" UNION ALL "));
        let mut query = self.client.query(&sql);
        for _ in &parts {
            query = query.bind(topic).bind(partition).bind(from as u64).bind(until as u64);
        }
        let mut cursor = query.fetch::<OffsetIndexRow>().map_err(|e| self.error("replay scan", &self.table, e))?;
        while let Some(row) = bounded(self.request_timeout, cursor.next()).await.map_err(|e| self.error("replay scan", &self.table, e))? {
            found.push(row.kafka_offset, row.kafka_index);
        }
        Ok(found.finish())
    }

    /// The offsets in `from..=until` of one partition stored as hot rows or
    /// logged rejects, as ranges, streamed in offset order: offsets no
    /// replay-log entry covers (whole messages; memory per range).
    async fn scan(&self, topic: &str, partition: u16, from: i64, until: Option<i64>) -> Result<Vec<(i64, i64)>, IngestError> {
        let until = until.unwrap_or(i64::MAX);
        let mut parts = Vec::new();
        for table in [&self.table, &self.rejects_table] {
            parts.push(format!(
                "SELECT kafka_offset FROM {}.{table} WHERE kafka_topic = ? AND kafka_partition = ? AND kafka_offset >= ? AND kafka_offset <= ?",
                self.database
            ));
        }
        let sql = format!("SELECT kafka_offset FROM ({}) ORDER BY kafka_offset", parts.join(" UNION ALL "));
        let mut query = self.client.query(&sql);
        for _ in &parts {
            query = query.bind(topic).bind(partition).bind(from as u64).bind(until as u64);
        }
        let mut cursor = query.fetch::<OffsetRow>().map_err(|e| self.error("replay scan", &self.table, e))?;
        let mut ranges = RangeBuilder::default();
        while let Some(row) = bounded(self.request_timeout, cursor.next()).await.map_err(|e| self.error("replay scan", &self.table, e))? {
            ranges.push(row.kafka_offset as i64);
        }
        Ok(ranges.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_the_replay_logs_shape() {
        let shape: Vec<&str> = inferlog_store::model::tables::REPLAY_LOG.columns.iter().map(|c| c.name).collect();
        assert_eq!(<Entry as Row>::COLUMN_NAMES, shape.as_slice());
        assert_eq!(day_list(&[20_000, 20_001]), "'2024-10-04', '2024-10-05'");
    }

    fn entry(first: u64, last: u64, state: u8, row_days: &[u16], reject_days: &[u16]) -> Entry {
        Entry {
            day: 1,
            written_at: 0,
            kafka_topic: "events".into(),
            kafka_partition: 0,
            first_offset: first,
            last_offset: last,
            state,
            row_days: row_days.to_vec(),
            reject_days: reject_days.to_vec(),
        }
    }

    #[test]
    fn intents_of_one_range_are_checked_in_the_days_any_of_them_named() {
        // Three readers died writing offsets 0..=5728: the first wrote rows
        // of four days, the second only the rest of days 3 and 4, the third
        // days 1 and 2. The rows of all four days must be looked up.
        let entries = vec![
            entry(0, 5728, INTENT, &[3, 4], &[4]),
            entry(0, 5728, INTENT, &[1, 2, 3, 4], &[4]),
            entry(0, 5728, INTENT, &[1, 2], &[]),
            entry(5729, 6341, INTENT, &[2], &[]),
            entry(5729, 6341, DONE, &[2], &[]),
            entry(6342, 7000, INTENT, &[5], &[5]),
        ];
        let plan = plan(&entries, 100);
        assert_eq!(plan.done, vec![(5729, 6341)], "a range any entry marked done is done whole");
        assert_eq!(
            plan.checks,
            vec![
                Check { first: 100, last: 5728, row_days: vec![1, 2, 3, 4], reject_days: vec![4] },
                Check { first: 6342, last: 7000, row_days: vec![5], reject_days: vec![5] },
            ]
        );
    }

    #[test]
    fn a_run_of_finished_batches_is_held_as_one_range_however_long() {
        // A group that committed nothing for 200,000 batches (each logged
        // as an intent, then done): reading the log holds one range, not
        // an entry per batch; a gap where no reader finished stays apart.
        let mut planner = Planner::new(0);
        let mut most_held = 0;
        for batch in 0..200_000u64 {
            let (first, last) = (batch * 10, batch * 10 + 9);
            let state = if batch == 150_000 { INTENT } else { DONE };
            planner.push(&entry(first, last, INTENT, &[1], &[]));
            planner.push(&entry(first, last, state, &[1], &[]));
            most_held = most_held.max(planner.held());
        }
        assert!(most_held <= 4, "held {most_held} ranges and checks for 200,000 batches");
        let plan = planner.finish();
        assert_eq!(plan.done, vec![(0, 1_499_999), (1_500_010, 1_999_999)]);
        assert_eq!(plan.checks, vec![Check { first: 1_500_000, last: 1_500_009, row_days: vec![1], reject_days: vec![] }]);
    }

    #[test]
    fn an_intended_json_range_is_scanned_into_ranges_not_rows() {
        // 1,000,000 stored rows of an unfinished JSON batch, offset 400,000
        // missing (its insert never ran): two ranges held, whatever the
        // number of rows.
        let mut scan = IntentScan::new(true);
        let mut most_held = 0;
        for offset in (0..1_000_001u64).filter(|o| *o != 400_000) {
            scan.push(offset, 0);
            most_held = most_held.max(scan.held());
        }
        assert_eq!(most_held, 2, "an entry per row is what the scan must not keep");
        let (whole, rows) = scan.finish();
        assert_eq!(whole, vec![(0, 399_999), (400_001, 1_000_000)]);
        assert!(rows.is_empty());
    }

    #[test]
    fn an_intended_otlp_range_keeps_the_indexes_of_messages_not_handled_whole() {
        // Offset 7: spans 0 and 2 stored (a day insert of span 1 never
        // ran); offset 8: its rejects were logged, so it was handled whole.
        let mut scan = IntentScan::new(false);
        for (offset, index) in [(7, 0), (7, 2), (8, 0), (8, 1), (8, WHOLE)] {
            scan.push(offset, index);
        }
        assert_eq!(scan.held(), 2, "one entry a message, not a row");
        let (whole, rows) = scan.finish();
        assert_eq!(whole, vec![(8, 8)]);
        assert_eq!(rows, BTreeMap::from([(7, vec![0, 2])]));
    }
}
