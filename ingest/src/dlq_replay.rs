//! `inferlog-ingest dlq replay`: rejected events back into the hot tier,
//! exactly once. In: the DLQ's messages ([`crate::dlq_reader`]), chosen by
//! reason and rejection time, and today's contract and config. Out: the
//! ones that now pass stored in the hot table under their original source
//! coordinates, recorded in the replay ledger
//! ([`inferlog_store::dlq_ledger`]), and a [`Summary`] per original reason:
//! stored, already stored, still invalid (with the reason now), refused.
//! Nothing is produced to the DLQ: the still-invalid messages stay where
//! they are, and the queue does not grow.
//!
//! Exactly once: a replayed row's identity is its source topic, partition,
//! offset and index in its message (the DLQ headers), never the DLQ's own
//! offset. Replays of one DLQ hold its lock in Postgres, so two at once
//! run one after the other. Each run first waits out the INSERTs in flight
//! (a killed replay's may still land) and resolves the ledger's pending
//! entries against the hot table; each event is then recorded pending,
//! inserted, recorded stored. A row for a day already released goes to
//! the hot table like a live late row: the compactor archives it as a
//! supplement, verified and audited, and drops it again.
//!
//! On a ClickHouse cluster each row goes to the shard its source partition
//! maps to, as a live row does, and each shard's inserts are waited out
//! and checked on the replica they went to; request ids are looked up
//! through the `Distributed` table.
//!
//! A message is refused (counted, left in the DLQ) when inferlog did not
//! write it (no source headers), when it was truncated, or when its
//! redacted payload had personal data masked: the masked value is not the
//! event. A redacted `user_id` is its keyed hash, which normalizing keeps.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use clickhouse::Row;
use inferlog_schema::{Contract, UserIdHasher};
use inferlog_store::catalog::{AuditEntry, Catalog, DayState};
use inferlog_store::cold::ColdStore;
use inferlog_store::cold_lookup::{find_request_ids, ArchivedKey};
use inferlog_store::dlq_ledger::{Coordinates, Entry};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::dlq::headers;
use crate::dlq_inspect::Window;
use crate::dlq_reader::{DlqReader, Record};
use crate::error::IngestError;
use crate::metrics::Metrics;
use crate::normalize::{Input, Normalizer, Outcome};
use crate::sink::service::bounded;
use crate::sink::{table_partition, ClickHouseSink, EncodedRows, FirstRow, RetryPolicy};

/// What to replay.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Original reasons to replay (`error_code.unknown`, …); empty: all.
    pub reasons: Vec<String>,
    pub window: Window,
    /// Report what would pass; change nothing.
    pub dry_run: bool,
    /// DLQ messages handled together (one ledger round trip and one INSERT per day).
    pub batch: usize,
}

/// Why a message is not even validated again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No source headers: not written by inferlog.
    NoSource,
    /// Only the first bytes of the message were kept.
    Truncated,
    /// Its redacted payload had an e-mail address or phone number masked.
    PiiMasked,
    /// No payload was kept: the contract could not read it as an event
    /// (`dlq_payload = "redacted"`); the producer must resend it.
    NoPayload,
    /// Its day was released to a sampled archive, which keeps only some
    /// of the day's rows: whether the event was stored after all (a copy
    /// delivered again after the contract changed) cannot be told, and
    /// storing it could count it twice.
    DaySampled,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoSource => "replay.no_source",
            Refusal::Truncated => "replay.truncated",
            Refusal::PiiMasked => "replay.pii_masked",
            Refusal::NoPayload => "replay.no_payload",
            Refusal::DaySampled => "replay.day_sampled",
        }
    }
}

/// Where a DLQ message came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Set for a refused span of an OTLP message: the payload is its event.
    pub span: Option<u32>,
}

/// The source of `record`, or why it is refused.
pub fn source(record: &Record) -> Result<Source, Refusal> {
    let topic = record.header(headers::SOURCE_TOPIC);
    let partition = record.header(headers::SOURCE_PARTITION).parse::<i32>();
    let offset = record.header(headers::SOURCE_OFFSET).parse::<i64>();
    let (Ok(partition), Ok(offset)) = (partition, offset) else { return Err(Refusal::NoSource) };
    if topic.is_empty() || record.header(headers::REASON).is_empty() {
        return Err(Refusal::NoSource);
    }
    if record.header(headers::TRUNCATED) == "true" {
        return Err(Refusal::Truncated);
    }
    if record.header(headers::PAYLOAD) == "none" {
        return Err(Refusal::NoPayload);
    }
    if record.header(headers::PAYLOAD) == "redacted" && [&b"[email]"[..], b"[phone]"].iter().any(|m| contains(&record.payload, m)) {
        return Err(Refusal::PiiMasked);
    }
    let span = match record.headers.get(headers::SOURCE_SPAN_INDEX) {
        Some(index) => Some(index.parse::<u32>().map_err(|_| Refusal::NoSource)?),
        None => None,
    };
    Ok(Source { topic: topic.to_owned(), partition, offset, span })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Counts of one original reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReasonLine {
    pub reason: String,
    /// Messages of this reason in the window.
    pub selected: u64,
    /// Events stored by this run (with `--dry-run`: that would be).
    pub replayed: u64,
    /// Stored by an earlier replay, or a copy of one stored (the DLQ is
    /// at least once; a producer's retry).
    pub already_stored: u64,
    pub still_invalid: u64,
    pub refused: u64,
}

/// A still-invalid group: the original reason and the one now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StillInvalid {
    pub reason: String,
    pub now: String,
    pub field: String,
    pub events: u64,
}

/// What a replay did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub dlq_topic: String,
    pub dry_run: bool,
    /// DLQ messages read, and those the window and reasons selected.
    pub read: u64,
    pub selected: u64,
    pub replayed: u64,
    pub already_stored: u64,
    pub still_invalid: u64,
    pub refused: u64,
    /// Of the replayed, rows of days already released: the compactor
    /// archives them as a supplement.
    pub late_rows: u64,
    pub by_reason: Vec<ReasonLine>,
    pub still_invalid_by: Vec<StillInvalid>,
}

/// Folds outcomes into a [`Summary`].
#[derive(Debug, Default)]
struct Tally {
    read: u64,
    late_rows: u64,
    lines: BTreeMap<String, ReasonLine>,
    invalid: BTreeMap<(String, String, String), u64>,
}

impl Tally {
    fn line(&mut self, reason: &str) -> &mut ReasonLine {
        self.lines.entry(reason.to_owned()).or_insert_with(|| ReasonLine { reason: reason.to_owned(), ..ReasonLine::default() })
    }

    fn invalid(&mut self, reason: &str, now: &str, field: &str) {
        self.line(reason).still_invalid += 1;
        *self.invalid.entry((reason.to_owned(), now.to_owned(), field.to_owned())).or_default() += 1;
    }

    /// A message refused before validation: counted, and listed with what refused it.
    fn refused(&mut self, reason: &str, refusal: Refusal) {
        self.line(reason).refused += 1;
        *self.invalid.entry((reason.to_owned(), refusal.as_str().to_owned(), String::new())).or_default() += 1;
    }

    fn finish(self, dlq_topic: &str, dry_run: bool) -> Summary {
        let lines: Vec<ReasonLine> = self.lines.into_values().collect();
        let sum = |f: fn(&ReasonLine) -> u64| lines.iter().map(f).sum::<u64>();
        Summary {
            dlq_topic: dlq_topic.to_owned(),
            dry_run,
            read: self.read,
            selected: sum(|l| l.selected),
            replayed: sum(|l| l.replayed),
            already_stored: sum(|l| l.already_stored),
            still_invalid: sum(|l| l.still_invalid),
            refused: sum(|l| l.refused),
            late_rows: self.late_rows,
            still_invalid_by: self.invalid.into_iter().map(|((reason, now, field), events)| StillInvalid { reason, now, field, events }).collect(),
            by_reason: lines,
        }
    }
}

/// An event that passes today's contract.
#[derive(Debug, Clone)]
struct Candidate {
    reason: String,
    coordinates: Coordinates,
    request_id: u64,
    day: u16,
    row: Vec<u8>,
}

/// One row of the hot table, by identity.
#[derive(Debug, Row, Deserialize)]
struct StoredKey {
    request_id: String,
    kafka_topic: String,
    kafka_partition: u16,
    kafka_offset: u64,
    kafka_index: u32,
}

impl StoredKey {
    fn coordinates(&self) -> Coordinates {
        Coordinates {
            topic: self.kafka_topic.clone(),
            partition: i32::from(self.kafka_partition),
            offset: self.kafka_offset as i64,
            index: self.kafka_index,
        }
    }
}

/// A replay run: what it reads with and writes to.
struct Replay {
    /// This run's name in the ledger (unique per process).
    run: String,
    options: Options,
    config: Config,
    normalizer: Normalizer,
    sink: ClickHouseSink,
    /// The sink's retry policy, with a command's limit.
    policy: RetryPolicy,
    catalog: Catalog,
    tally: Tally,
    /// Source coordinates met in this run (the DLQ may hold a reject twice).
    seen: HashSet<Coordinates>,
    /// Request-id fingerprints of this run's candidates, with their content.
    requests: HashMap<u64, u64>,
    /// Released days met so far.
    released: HashSet<u16>,
    /// The archive, opened when a released day is first looked up.
    cold: Option<ColdStore>,
}

/// Where a day's rows are, for a replay.
struct DayRelease {
    /// Released: a row stored now is a late row.
    released: bool,
    /// Released or being released: its rows may be in the archive only.
    in_archive: bool,
}

/// Runs a replay under `config`.
pub async fn run(config: Config, options: Options) -> Result<Summary, IngestError> {
    let contract = Contract::new(&config.schema)?;
    let hasher = UserIdHasher::from_env(config.schema.hash_key_id.as_deref())?;
    let normalizer = Normalizer::new(contract, hasher, &config.otlp, 1, None)?;
    let (sink, _) = ClickHouseSink::new(&config.clickhouse)?.prepared().await?;
    let catalog = Catalog::connect(&config.postgres).await?;
    let dlq_topic = config.kafka.dlq_topic.clone();
    let lock = catalog.lock_replay(&dlq_topic).await?;
    let ingest = &config.ingest;
    let policy = RetryPolicy::command(
        (ingest.retry_initial_backoff, ingest.retry_max_backoff),
        ingest.shutdown_timeout.max(std::time::Duration::from_secs(60)),
        Metrics::new(),
    );
    let mut replay = Replay {
        run: sink.insert_id(),
        policy,
        options,
        config,
        normalizer,
        sink,
        catalog,
        tally: Tally::default(),
        seen: HashSet::new(),
        requests: HashMap::new(),
        released: HashSet::new(),
        cold: None,
    };
    let result = replay.run().await;
    lock.unlock().await;
    let summary = result?;
    replay.audit(&summary).await?;
    Ok(summary)
}

impl Replay {
    async fn run(&mut self) -> Result<Summary, IngestError> {
        if !self.options.dry_run {
            self.resolve_pending().await?;
        }
        let mut reader = DlqReader::start(&self.config.kafka, "replay")?;
        let mut chunk = Vec::with_capacity(self.options.batch);
        while let Some(record) = reader.next().await {
            self.tally.read += 1;
            if self.selected(&record) {
                chunk.push(record);
            }
            if chunk.len() >= self.options.batch {
                self.chunk(std::mem::take(&mut chunk)).await?;
            }
        }
        reader.finish().await?;
        self.chunk(chunk).await?;
        Ok(std::mem::take(&mut self.tally).finish(&self.config.kafka.dlq_topic, self.options.dry_run))
    }

    fn selected(&self, record: &Record) -> bool {
        let reason = record.header(headers::REASON);
        self.options.window.contains(record.time_ms()) && (self.options.reasons.is_empty() || self.options.reasons.iter().any(|r| r == reason))
    }

    /// A killed replay's pending entries: stored if their rows are in the
    /// hot table once the INSERTs in flight have ended, else forgotten.
    async fn resolve_pending(&mut self) -> Result<(), IngestError> {
        let limit = crate::sink::in_flight::GRACE + 4 * self.sink.request_timeout;
        // On a cluster each shard's inserts ran on its own first replica.
        let mut inserts = 0;
        for shard in 0..self.sink.shard_count() {
            let client = self.sink.shard(shard).client;
            let waited = bounded(limit, crate::sink::in_flight::wait_out(&client, self.sink.ids.prefix(), crate::sink::in_flight::GRACE))
                .await
                .map_err(|e| self.sink.error("wait out inserts in flight", &self.sink.table, e))?;
            inserts += waited.inserts;
        }
        let pending = self.catalog.replay_pending_entries().await?;
        if pending.is_empty() {
            return Ok(());
        }
        let mut by_day: BTreeMap<u16, Vec<Coordinates>> = BTreeMap::new();
        for (c, day) in pending {
            by_day.entry(day.clamp(0, i32::from(u16::MAX)) as u16).or_default().push(c);
        }
        let (mut landed, mut lost) = (Vec::new(), Vec::new());
        for (day, events) in by_day {
            let found = self.stored(day, &events).await?;
            for c in events {
                if found.contains(&c) {
                    landed.push(c);
                } else {
                    lost.push(c);
                }
            }
        }
        tracing::info!(landed = landed.len(), never_landed = lost.len(), inserts_waited = inserts, "resolved an interrupted replay's pending events");
        self.catalog.replay_stored(&landed).await?;
        self.catalog.replay_forget(&lost).await?;
        Ok(())
    }

    /// Which of `events` (rows of `day`) the hot table holds: asked of
    /// the shard each event's partition goes to, on the replica its
    /// inserts went to (on a cluster, its first: the one that answers for
    /// an insert whose quorum was not reached).
    async fn stored(&self, day: u16, events: &[Coordinates]) -> Result<HashSet<Coordinates>, IngestError> {
        let mut found = HashSet::new();
        let mut by_topic: BTreeMap<(usize, &str), Vec<&Coordinates>> = BTreeMap::new();
        for c in events {
            by_topic.entry((self.sink.shard_of(&c.topic, c.partition)?, &c.topic)).or_default().push(c);
        }
        for ((shard, topic), events) in by_topic {
            let sink = self.sink.shard(shard);
            for chunk in events.chunks(2_000) {
                let tuples: Vec<String> = chunk.iter().map(|c| format!("({}, {}, {})", c.partition, c.offset, c.index)).collect();
                let sql = format!(
                    "SELECT request_id, kafka_topic, kafka_partition, kafka_offset, kafka_index FROM {}.{} \
                     WHERE day = '{}' AND kafka_topic = ? AND (kafka_partition, kafka_offset, kafka_index) IN ({})",
                    self.sink.database,
                    self.sink.table,
                    inferlog_store::day_string(i32::from(day)),
                    tuples.join(", ")
                );
                let rows = bounded(self.sink.request_timeout, sink.client.query(&sql).bind(topic).fetch_all::<StoredKey>())
                    .await
                    .map_err(|e| self.sink.error("replay lookup", &self.sink.table, e))?;
                found.extend(rows.iter().map(StoredKey::coordinates));
            }
        }
        Ok(found)
    }

    /// The hot rows of `days` whose request id is one of `ids`.
    async fn by_request_id(&self, days: &[u16], ids: &[String]) -> Result<Vec<StoredKey>, IngestError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT request_id, kafka_topic, kafka_partition, kafka_offset, kafka_index FROM {}.{} WHERE day IN ({}) AND has(?, request_id)",
            self.sink.database,
            self.sink.read_table(),
            crate::sink::replay_log::day_list(days)
        );
        bounded(self.sink.request_timeout, self.sink.client.query(&sql).bind(ids).fetch_all::<StoredKey>())
            .await
            .map_err(|e| self.sink.error("replay lookup", &self.sink.table, e))
    }

    /// Validates a chunk of selected messages again and stores what passes.
    async fn chunk(&mut self, records: Vec<Record>) -> Result<(), IngestError> {
        if records.is_empty() {
            return Ok(());
        }
        let ingested_at = (crate::dlq::now_ms() / 1000) as u32;
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut request_ids: HashMap<u64, String> = HashMap::new();
        // Copies of an event this run already handled: recorded with the
        // stored ones, so a later run skips them too.
        let mut copies: Vec<(Coordinates, u16)> = Vec::new();
        for record in &records {
            let reason = record.header(headers::REASON).to_owned();
            self.tally.line(&reason).selected += 1;
            let source = match source(record) {
                Ok(source) => source,
                Err(refusal) => {
                    self.tally.refused(&reason, refusal);
                    continue;
                }
            };
            let topic: Arc<str> = Arc::from(source.topic.as_str());
            let encoding = if source.span.is_some() { inferlog_store::kafka::TopicEncoding::Json } else { self.config.kafka.encoding(&topic) };
            let input = Input {
                payload: &record.payload,
                topic: &topic,
                partition: table_partition(&topic, source.partition)?,
                offset: source.offset,
                encoding,
            };
            let received_ms = record.time_ms().unwrap_or_else(crate::dlq::now_ms);
            let piece = self.normalizer.replayed(&input, source.span, received_ms, ingested_at);
            for outcome in piece.outcomes {
                let coordinates =
                    Coordinates { topic: source.topic.clone(), partition: source.partition, offset: source.offset, index: outcome.index() };
                match outcome {
                    Outcome::Rejected(rejection, _) => self.tally.invalid(&reason, rejection.reason.as_str(), &rejection.field),
                    Outcome::Row { day, fingerprint, content, range, .. } => {
                        if !self.seen.insert(coordinates.clone()) {
                            self.tally.line(&reason).already_stored += 1;
                            continue;
                        }
                        match self.requests.get(&fingerprint) {
                            Some(c) if *c == content => {
                                self.tally.line(&reason).already_stored += 1;
                                copies.push((coordinates, day));
                                continue;
                            }
                            Some(_) => {
                                self.tally.invalid(&reason, "request_id.conflict", "request_id");
                                continue;
                            }
                            None => {}
                        }
                        self.requests.insert(fingerprint, content);
                        let row = piece.bytes[range].to_vec();
                        if let Some(id) = inferlog_store::model::rows::encoded_request_id(&row) {
                            request_ids.insert(fingerprint, id.to_owned());
                        }
                        candidates.push(Candidate { reason: reason.clone(), coordinates, request_id: fingerprint, day, row });
                    }
                }
            }
        }
        // Every day this chunk may write, locked shared: a release of one
        // (which holds it exclusively) ends before the lookups below or
        // starts after the rows are recorded stored, never in between.
        let mut days: Vec<i32> = candidates.iter().map(|c| i32::from(c.day)).chain(copies.iter().map(|(_, d)| i32::from(*d))).collect();
        days.sort_unstable();
        days.dedup();
        let lock = match self.catalog.lock_days_shared(&days, false).await? {
            Some(lock) => Some(lock),
            None if self.options.dry_run => None,
            None => {
                tracing::info!(days = days.len(), "a release holds one of this chunk's days; waiting for it to end");
                self.catalog.lock_days_shared(&days, true).await?
            }
        };
        let stored = self.store_chunk(candidates, copies, request_ids).await;
        if let Some(lock) = lock {
            lock.unlock().await;
        }
        stored
    }

    /// A chunk's candidates, under their days' shared locks: looked up in
    /// the ledger, then in the tiers; the rest recorded pending, inserted,
    /// recorded stored.
    async fn store_chunk(
        &mut self,
        candidates: Vec<Candidate>,
        copies: Vec<(Coordinates, u16)>,
        request_ids: HashMap<u64, String>,
    ) -> Result<(), IngestError> {
        // The ledger first: stored by an earlier replay.
        let ledger = self.catalog.replayed(&candidates.iter().map(|c| c.coordinates.clone()).collect::<Vec<_>>()).await?;
        let mut pending_here: Vec<Candidate> = Vec::new();
        for c in candidates {
            match ledger.get(&c.coordinates) {
                Some(Entry::Stored) => self.tally.line(&c.reason).already_stored += 1,
                // Only in a dry run (a real one resolved them first): the hot table decides below.
                Some(Entry::Pending) | None => pending_here.push(c),
            }
        }
        // Then the hot table, by request id: this event's own row (stored,
        // the ledger not told), or another event's (a conflict).
        let mut days: Vec<u16> = pending_here.iter().map(|c| c.day).collect();
        days.sort_unstable();
        days.dedup();
        let ids: Vec<String> = pending_here.iter().filter_map(|c| request_ids.get(&c.request_id).cloned()).collect();
        let mut holders: HashMap<u64, Vec<Coordinates>> = HashMap::new();
        for row in self.by_request_id(&days, &ids).await? {
            holders.entry(crate::dedup::fingerprint(&row.request_id)).or_default().push(row.coordinates());
        }
        // A released day's rows are in the archive (the shared lock keeps
        // them from moving meanwhile): looked up there too.
        let mut sampled: HashSet<u16> = HashSet::new();
        let mut released: HashSet<u16> = HashSet::new();
        for &day in &days {
            let release = self.released(day).await?;
            if release.released {
                released.insert(day);
            }
            if !release.in_archive {
                continue;
            }
            let (found, is_sampled) = self.archived(day, &ids).await?;
            for key in found {
                holders.entry(crate::dedup::fingerprint(&key.request_id)).or_default().push(key.coordinates);
            }
            if is_sampled {
                sampled.insert(day);
            }
        }
        let mut to_store: Vec<Candidate> = Vec::new();
        let mut landed: Vec<(Coordinates, u16)> = Vec::new();
        for c in pending_here {
            match holders.get(&c.request_id) {
                Some(at) if at.contains(&c.coordinates) => {
                    self.tally.line(&c.reason).already_stored += 1;
                    landed.push((c.coordinates, c.day));
                }
                Some(_) => self.tally.invalid(&c.reason, "request_id.conflict", "request_id"),
                None if sampled.contains(&c.day) => self.tally.refused(&c.reason, Refusal::DaySampled),
                None => to_store.push(c),
            }
        }
        for c in &to_store {
            self.tally.line(&c.reason).replayed += 1;
            if released.contains(&c.day) {
                self.tally.late_rows += 1;
            }
        }
        if self.options.dry_run {
            return Ok(());
        }
        landed.extend(copies);
        let all: Vec<(Coordinates, u16)> = to_store.iter().map(|c| (c.coordinates.clone(), c.day)).chain(landed).collect();
        let ledger_entries: Vec<(Coordinates, i32)> = all.iter().map(|(c, d)| (c.clone(), i32::from(*d))).collect();
        self.catalog.replay_pending(&ledger_entries, &self.run).await?;
        crate::hooks::slow_write().await;
        let mut by_day: BTreeMap<(u16, usize), Vec<Candidate>> = BTreeMap::new();
        for c in to_store {
            let shard = self.sink.shard_of(&c.coordinates.topic, c.coordinates.partition)?;
            by_day.entry((c.day, shard)).or_default().push(c);
        }
        for ((day, shard), rows) in by_day {
            self.insert_day(day, shard, rows).await?;
        }
        inferlog_store::test_hooks::pause_point(crate::hooks::PAUSE_AFTER, "replay-inserted").await;
        self.catalog.replay_stored(&all.into_iter().map(|(c, _)| c).collect::<Vec<_>>()).await?;
        Ok(())
    }

    /// Inserts one day's replayed rows of one shard (on one server, all of
    /// them): one INSERT into the shard's local table, under the sink's
    /// retry policy as the daemon's inserts are (a retry first checks
    /// whether the attempt before landed), given up once its waits pass
    /// the shutdown budget or a minute (exit 75; the ledger's pending
    /// entries are resolved by the next run).
    async fn insert_day(&self, day: u16, shard: usize, rows: Vec<Candidate>) -> Result<(), IngestError> {
        let Some(first) = rows.first() else { return Ok(()) };
        let first = FirstRow {
            day,
            topic: Arc::from(first.coordinates.topic.as_str()),
            partition: first.coordinates.partition,
            offset: first.coordinates.offset,
            index: first.coordinates.index,
        };
        let body: Vec<u8> = rows.iter().flat_map(|c| c.row.iter().copied()).collect();
        let rows = EncodedRows::whole(body, rows.len(), first, shard);
        let id = self.sink.insert_id();
        self.policy.run("insert replayed rows", |retry| self.sink.insert_rows(&rows, &id, retry)).await
    }

    /// Whether `day` was already released from the hot tier, or its
    /// release began (its rows may be in the archive only). A release is
    /// remembered for the run; a day not released is asked again, as a
    /// release may come between two chunks.
    async fn released(&mut self, day: u16) -> Result<DayRelease, IngestError> {
        if self.released.contains(&day) {
            return Ok(DayRelease { released: true, in_archive: true });
        }
        let state = self.catalog.day(i32::from(day)).await?.map(|r| r.state);
        let released = state == Some(DayState::Released);
        if released {
            tracing::warn!(day = %inferlog_store::day_string(i32::from(day)), "replayed rows for a day already released: the compactor archives them as a supplement");
            self.released.insert(day);
        }
        Ok(DayRelease { released, in_archive: released || state == Some(DayState::Releasing) })
    }

    /// The archived rows of `day` holding one of `ids`, and whether the
    /// day's archive is sampled (holds fewer rows than it stands for).
    async fn archived(&mut self, day: u16, ids: &[String]) -> Result<(Vec<ArchivedKey>, bool), IngestError> {
        let manifest = self.catalog.manifest(Some(i32::from(day))).await?;
        let sampled = manifest.iter().any(|m| m.represented_rows > m.rows);
        let cold = match &self.cold {
            Some(cold) => cold.clone(),
            None => self.cold.insert(ColdStore::new(&self.config.cold)?).clone(),
        };
        let ids: HashSet<String> = ids.iter().cloned().collect();
        Ok((find_request_ids(&cold, &manifest, &ids).await?, sampled))
    }

    /// One audit row per run (dry runs too): what it stored, by reason.
    async fn audit(&self, summary: &Summary) -> Result<(), IngestError> {
        let detail = serde_json::json!({
            "selected": summary.selected,
            "replayed": summary.replayed,
            "already_stored": summary.already_stored,
            "still_invalid": summary.still_invalid,
            "refused": summary.refused,
            "late_rows": summary.late_rows,
            "reasons": self.options.reasons,
            "by_reason": summary.by_reason,
        });
        let entry = AuditEntry {
            tier: "dlq",
            unit: summary.dlq_topic.clone(),
            action: "replay",
            rows: Some(summary.replayed),
            bytes: None,
            policy: self.config.retention.hot_days.to_string(),
            dry_run: summary.dry_run,
            actor: "dlq-replay",
            detail: Some(detail.to_string()),
        };
        self.catalog.audit(&entry).await?;
        Ok(())
    }
}

/// The summary as text.
pub fn render_text(s: &Summary) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let verb = if s.dry_run { "would store" } else { "stored" };
    let _ = writeln!(
        out,
        "DLQ replay of {}{}: {} messages read, {} selected; {verb} {}, already stored {}, still invalid {}, refused {}",
        s.dlq_topic,
        if s.dry_run { " (dry run: nothing changed)" } else { "" },
        s.read,
        s.selected,
        s.replayed,
        s.already_stored,
        s.still_invalid,
        s.refused
    );
    if s.late_rows > 0 {
        let _ = writeln!(out, "{} of them belong to days already released: the compactor archives them as a supplement", s.late_rows);
    }
    let _ = writeln!(out, "\n{:<32} {:>9} {:>9} {:>9} {:>9} {:>9}", "reason", "selected", "replayed", "already", "invalid", "refused");
    for l in &s.by_reason {
        let _ = writeln!(out, "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9}", l.reason, l.selected, l.replayed, l.already_stored, l.still_invalid, l.refused);
    }
    if !s.still_invalid_by.is_empty() {
        let _ = writeln!(out, "\nstill invalid (left in the DLQ):\n{:<32} {:<32} {:<20} {:>9}", "reason", "now", "field", "events");
        for g in &s.still_invalid_by {
            let _ = writeln!(out, "{:<32} {:<32} {:<20} {:>9}", g.reason, g.now, g.field, g.events);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pairs: &[(&str, &str)], payload: &[u8]) -> Record {
        Record { headers: pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), payload: payload.to_vec(), ..Record::default() }
    }

    const OURS: [(&str, &str); 4] = [
        (headers::REASON, "error_code.unknown"),
        (headers::SOURCE_TOPIC, "events"),
        (headers::SOURCE_PARTITION, "3"),
        (headers::SOURCE_OFFSET, "42"),
    ];

    #[test]
    fn a_message_is_replayed_by_its_source_coordinates_or_refused_with_a_reason() {
        assert_eq!(source(&record(&OURS, b"{}")), Ok(Source { topic: "events".into(), partition: 3, offset: 42, span: None }));
        let mut span = OURS.to_vec();
        span.push((headers::SOURCE_SPAN_INDEX, "7"));
        assert_eq!(source(&record(&span, b"{}")).map(|s| s.span), Ok(Some(7)));
        assert_eq!(source(&record(&OURS[..3], b"{}")), Err(Refusal::NoSource), "no source offset");
        assert_eq!(source(&record(&[], b"{}")), Err(Refusal::NoSource), "another producer's message");
        let mut cut = OURS.to_vec();
        cut.push((headers::TRUNCATED, "true"));
        assert_eq!(source(&record(&cut, b"{")), Err(Refusal::Truncated));
        let mut redacted = OURS.to_vec();
        redacted.push((headers::PAYLOAD, "redacted"));
        assert_eq!(source(&record(&redacted, br#"{"user_id":"k1:ab12","model_name":"[email]"}"#)), Err(Refusal::PiiMasked));
        assert!(source(&record(&redacted, br#"{"user_id":"k1:ab12"}"#)).is_ok(), "a hashed user id is what the hot tier stores");
        // Unredacted payloads are what the producer sent: a literal "[email]" is data.
        assert!(source(&record(&OURS, br#"{"model_name":"[email]"}"#)).is_ok());
    }

    #[test]
    fn the_tally_sums_its_reasons() {
        let mut t = Tally::default();
        t.line("a").selected += 2;
        t.line("a").replayed += 1;
        t.invalid("a", "tokens.negative", "output_tokens");
        t.line("b").selected += 1;
        t.line("b").refused += 1;
        let s = t.finish("dlq", true);
        assert_eq!((s.selected, s.replayed, s.still_invalid, s.refused), (3, 1, 1, 1));
        assert_eq!(
            s.still_invalid_by,
            vec![StillInvalid { reason: "a".into(), now: "tokens.negative".into(), field: "output_tokens".into(), events: 1 }]
        );
    }
}
