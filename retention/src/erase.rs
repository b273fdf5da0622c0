//! Erasure on request. In: the hashed user ids of one request. Out:
//! [`find`] says what every tier holds of them (`audit --user-ids`);
//! [`erase`] removes it and returns a [`Receipt`]:
//!
//! - hot: audit rows per day first, then one mutation on the hot table,
//!   waited for until no mutation of the table is left on any part, then
//!   counted again (the rejects log has no user column);
//! - cold: every object that holds a user is written again without those
//!   rows under [`erased_key`], read back and verified, its manifest row
//!   swapped with an audit row in one transaction, then the old object
//!   deleted; an object no manifest row lists that holds a user (a copy
//!   a killed run left) is audited, then deleted;
//! - aggregates hold no user dimension; the DLQ cannot delete one message:
//!   the receipt lists the partitions that hold the users and when the
//!   topic's retention removes them.
//!
//! Every step is idempotent and each day is worked under its advisory
//! lock, so a run killed at any point is finished by running it again,
//! and a second run removes nothing and says so.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use inferlog_compactor::archive::Archiver;
use inferlog_compactor::erase::{erased_key, scan};
use inferlog_store::catalog::{AuditEntry, DayLock};
use inferlog_store::kafka::DlqPayload;
use inferlog_store::{day_string, Day};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::dlq::Hits;
use crate::error::RetentionError;
use crate::inventory::Stores;

/// Test hook steps ([`crate::enforce::PAUSE_ENV`]): `erase_hot` (hot audit
/// rows written, no mutation yet), `erase_written` (an object written again
/// and verified, the manifest not swapped), `erase_swapped` (swapped, the
/// old object not deleted).
async fn pause_point(step: &str) {
    inferlog_store::test_hooks::pause_point(crate::enforce::PAUSE_ENV, step).await;
}

/// How long erase waits for a day's lock, and for the hot mutation.
const LOCK_WAIT: Duration = Duration::from_secs(600);
const MUTATION_WAIT: Duration = Duration::from_secs(1800);

/// One erasure request: the users, as stored (`<key id>:<hex>`).
#[derive(Clone)]
pub struct Request {
    pub id: String,
    pub hashes: Vec<String>,
    /// The plaintext ids when the request gave them: searched for in the DLQ
    /// too (an unparseable reject keeps its bytes). Never logged or written.
    pub plaintext: Vec<String>,
    /// The key id plaintext ids were hashed with (`None` for `--hashed`).
    pub key_id: Option<String>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("id", &self.id).field("users", &self.hashes.len()).finish_non_exhaustive()
    }
}

/// Whether `s` is a stored user id: `<key id>:<64 hex digits>`.
fn is_stored_hash(s: &str) -> bool {
    s.split_once(':').is_some_and(|(id, hex)| {
        (1..=32).contains(&id.len())
            && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
            && hex.len() == 64
            && hex.bytes().all(|c| c.is_ascii_hexdigit())
    })
}

impl Request {
    /// A request from the lines of a file (blank lines and `#` comments
    /// skipped): plaintext user ids hashed with `hasher`, or, with `hasher`
    /// `None`, stored hashes. `id` defaults to one derived from the hashes,
    /// so running the same request again is the same request.
    pub fn parse(text: &str, hasher: Option<&inferlog_schema::hash::UserIdHasher>, id: Option<String>) -> Result<Request, RetentionError> {
        let mut hashes = BTreeSet::new();
        let mut plaintext = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match hasher {
                Some(h) => {
                    hashes.insert(h.hash(line));
                    plaintext.push(line.to_owned());
                }
                None if is_stored_hash(line) => {
                    let (key_id, hex) = line.split_once(':').unwrap_or((line, ""));
                    hashes.insert(format!("{key_id}:{}", hex.to_ascii_lowercase()));
                }
                None => {
                    return Err(RetentionError::Config(format!(
                        "--user-ids line {}: not a stored user id (`<key id>:<64 hex digits>`); without --hashed the file holds plaintext ids",
                        n + 1
                    )))
                }
            }
        }
        if hashes.is_empty() {
            return Err(RetentionError::Config("--user-ids: the file names no user".into()));
        }
        let hashes: Vec<String> = hashes.into_iter().collect();
        let id = match id {
            Some(id) if (1..=32).contains(&id.len()) && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') => id,
            Some(id) => return Err(RetentionError::Config(format!("--request-id {id:?}: 1 to 32 letters, digits or '-'"))),
            None => format!("r{}", &hex::encode(Sha256::digest(hashes.join("\n").as_bytes()))[..12]),
        };
        Ok(Request { id, hashes, plaintext, key_id: hasher.map(|h| h.key_id().to_owned()) })
    }

    fn set(&self) -> HashSet<String> {
        self.hashes.iter().cloned().collect()
    }
}

/// One cold object holding a request's users.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldObject {
    pub key: String,
    pub day: String,
    pub rows: u64,
    pub held: u64,
    pub bytes: u64,
    /// Whether a manifest row lists it (else: a copy a killed run left).
    pub listed: bool,
}

/// A DLQ partition holding a request's users.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqPartition {
    pub partition: i32,
    pub messages: u64,
    /// Of them, those holding an id in the payload, in the key, in a header.
    pub in_payload: u64,
    pub in_key: u64,
    pub in_headers: u64,
    pub newest: Option<String>,
    /// When the topic's retention will have removed the newest of them (`None`: its settings do not say).
    pub removed_by: Option<String>,
}

/// What every tier holds of one request.
#[derive(Debug, Clone, Serialize)]
pub struct Holdings {
    pub hot_days: BTreeMap<String, u64>,
    pub objects_scanned: usize,
    pub objects: Vec<HeldObject>,
    /// Key ids of the user ids the hot and cold tiers hold.
    pub key_ids: BTreeSet<String>,
    /// DLQ partitions holding a user.
    pub dlq: Vec<DlqPartition>,
    /// Why the DLQ could not be read (then `dlq` is unknown).
    pub dlq_unread: Option<String>,
    pub dlq_payload: &'static str,
    /// How the DLQ was searched, and what it could not search.
    pub dlq_searched: DlqSearch,
}

/// What the DLQ search covered: every message's payload, key and header
/// values, for the plaintext ids (when the request gave them) and their
/// digests; and the copies a byte search cannot vouch for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DlqSearch {
    pub messages: u64,
    pub copies: &'static str,
    pub plaintext_ids: usize,
    pub digests: usize,
    /// Payloads that are neither empty nor JSON, searched byte by byte only.
    pub unparsed_payloads: u64,
    /// What the search could not cover, said plainly; `None`: nothing.
    pub not_searchable: Option<String>,
}

impl DlqSearch {
    /// What a search that found `hits` covered, for `request`, on a DLQ
    /// keeping `original` payloads or not.
    fn of(hits: &BTreeMap<i32, Hits>, request: &Request, original: bool) -> DlqSearch {
        let unparsed: u64 = hits.values().map(|h| h.unparsed).sum();
        let mut gaps = Vec::new();
        if request.plaintext.is_empty() && original {
            gaps.push(
                "the request gave digests only (--hashed) and the DLQ keeps original payloads and keys: their plaintext ids could not be searched"
                    .to_owned(),
            );
        }
        if unparsed > 0 {
            gaps.push(format!(
                "{unparsed} payloads are not JSON (rejects the contract could not read, kept whole by dlq_payload = \"original\"): searched byte by byte, so an id escaped or encoded in them is not found"
            ));
        }
        DlqSearch {
            messages: hits.values().map(|h| h.read).sum(),
            copies: "payloads, keys and header values",
            plaintext_ids: request.plaintext.len(),
            digests: request.hashes.len(),
            unparsed_payloads: unparsed,
            not_searchable: (!gaps.is_empty()).then(|| gaps.join("; ")),
        }
    }
}

impl Holdings {
    pub fn hot_rows(&self) -> u64 {
        self.hot_days.values().sum()
    }

    pub fn cold_rows(&self) -> u64 {
        self.objects.iter().map(|o| o.held).sum()
    }

    /// Whether the hot or cold tier holds a user, or the DLQ holds one past
    /// what its settings let it keep (an unknown removal time, or a DLQ
    /// that could not be read, counts: nothing is proved).
    pub fn held(&self) -> bool {
        self.hot_rows() > 0 || self.cold_rows() > 0 || self.dlq_unread.is_some() || self.dlq.iter().any(|p| p.removed_by.is_none())
    }

    fn days(&self) -> BTreeSet<Day> {
        self.hot_days.keys().chain(self.objects.iter().map(|o| &o.day)).filter_map(|d| inferlog_store::parse_day(d)).collect()
    }
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// What every tier holds of `request` now.
pub async fn find(stores: &Stores, config: &Config, request: &Request) -> Result<Holdings, RetentionError> {
    let hot = stores.hot.user_rows(&request.hashes).await.map_err(RetentionError::tier("hot"))?;
    let mut key_ids: BTreeSet<String> = stores.hot.user_key_ids().await.map_err(RetentionError::tier("hot"))?.into_iter().collect();
    let manifest: HashSet<String> =
        stores.catalog.manifest(None).await.map_err(RetentionError::tier("aggregates"))?.into_iter().map(|m| m.object_key).collect();
    let hashes = request.set();
    let mut objects = Vec::new();
    let mut scanned = 0;
    for object in stores.cold.list_all().await.map_err(RetentionError::tier("cold"))? {
        let Some(day) = object.day else { continue };
        scanned += 1;
        let found = scan(&stores.cold, &object.key, object.bytes, &hashes).await.map_err(RetentionError::Cold)?;
        key_ids.extend(found.key_ids);
        if found.held > 0 {
            let listed = manifest.contains(&object.key);
            objects.push(HeldObject { day: day_string(day), listed, rows: found.rows, held: found.held, bytes: object.bytes, key: object.key });
        }
    }
    let needles: Vec<String> = request.hashes.iter().chain(&request.plaintext).cloned().collect();
    let longest = crate::dlq::settings(&config.kafka).await.ok().and_then(|s| s.longest_ms());
    let dlq = crate::dlq::search(&config.kafka, needles).await;
    let dlq_unread = dlq.as_ref().err().cloned();
    let original = config.kafka.dlq_payload == DlqPayload::Original;
    let dlq_searched = dlq.as_ref().map_or_else(|_| DlqSearch::default(), |hits| DlqSearch::of(hits, request, original));
    let dlq = dlq.map(|hits: BTreeMap<i32, Hits>| {
        hits.into_iter()
            .filter(|(_, h)| h.messages > 0)
            .map(|(partition, h)| DlqPartition {
                partition,
                messages: h.messages,
                in_payload: h.in_payload,
                in_key: h.in_key,
                in_headers: h.in_headers,
                newest: h.newest_ms.map(rfc3339),
                removed_by: h.newest_ms.zip(longest).map(|(t, l)| rfc3339(t.saturating_add(l))),
            })
            .collect()
    });
    Ok(Holdings {
        dlq: dlq.unwrap_or_default(),
        dlq_unread,
        hot_days: hot.into_iter().map(|(d, n)| (day_string(d), n)).collect(),
        objects_scanned: scanned,
        objects,
        key_ids,
        dlq_payload: match config.kafka.dlq_payload {
            DlqPayload::Redacted => "redacted",
            DlqPayload::Original => "original",
        },
        dlq_searched,
    })
}

/// `audit --user-ids` as text: per tier what it holds of the request's users.
pub fn render_holdings(request: &Request, h: &Holdings) -> String {
    let mut text = format!("users {} (request {})\n", request.hashes.len(), request.id);
    text += &format!("hot        rows {}", h.hot_rows());
    for (day, n) in &h.hot_days {
        text += &format!(" {day}={n}");
    }
    text += &format!("\ncold       rows {} in {} of {} objects\n", h.cold_rows(), h.objects.len(), h.objects_scanned);
    for o in &h.objects {
        text += &format!("  {} {} rows{}\n", o.key, o.held, if o.listed { "" } else { " (no manifest row)" });
    }
    text += "rejects    no user column\naggregates no user dimension\n";
    if let Some(why) = &h.dlq_unread {
        text += &format!("dlq        not read: {why}\n");
    } else {
        let s = &h.dlq_searched;
        text += &format!(
            "dlq        searched the {} of {} messages ({} payloads) for {} plaintext ids and {} digests\n",
            s.copies, s.messages, h.dlq_payload, s.plaintext_ids, s.digests
        );
        if let Some(gap) = &s.not_searchable {
            text += &format!("dlq        not searchable: {gap}\n");
        }
        if h.dlq.is_empty() {
            text += "dlq        none\n";
        }
    }
    for p in &h.dlq {
        let by = p.removed_by.as_deref().unwrap_or("unknown: the topic's settings keep messages for ever");
        text += &format!(
            "dlq        partition {} messages {} (payload {}, key {}, headers {}) removed by {by}\n",
            p.partition, p.messages, p.in_payload, p.in_key, p.in_headers
        );
    }
    text += if h.held() { "HELD\n" } else { "CLEAN\n" };
    text
}

/// Refuses plaintext ids when a tier holds ids hashed under a key this process does not have.
pub fn check_keys(request: &Request, holdings: &Holdings) -> Result<(), RetentionError> {
    let Some(ours) = &request.key_id else { return Ok(()) };
    let others: Vec<&String> = holdings.key_ids.iter().filter(|k| *k != ours).collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(RetentionError::Config(format!(
        "the tiers hold user ids hashed under key id(s) {others:?}, and this process has only the key of {ours:?} \
         (INFERLOG_HASH_KEY_FILE / INFERLOG_HASH_KEY): those users' rows cannot be found from plaintext ids; \
         erase them with --hashed and their stored hashes, or run with each key"
    )))
}

/// One object in the receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectErased {
    pub day: String,
    pub old_key: String,
    /// The object written in its place (`None`: no row was left, or the old one was an unlisted copy).
    pub new_key: Option<String>,
    pub rows_removed: u64,
    pub rows_kept: u64,
    pub sha256: Option<String>,
    pub bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TierErased {
    pub rows_removed: u64,
    pub note: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct HotErased {
    pub table: String,
    pub rows_removed: u64,
    pub days: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ColdErased {
    pub rows_removed: u64,
    pub objects_scanned: usize,
    pub objects: Vec<ObjectErased>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DlqErased {
    pub topic: String,
    pub payload: &'static str,
    /// How the topic was searched, and what it could not search.
    pub searched: DlqSearch,
    pub partitions: Vec<DlqPartition>,
    /// Why the topic could not be read (then `partitions` is empty and unknown).
    pub unread: Option<String>,
    pub note: String,
}

/// What one run of a request removed, tier by tier.
#[derive(Debug, Clone, Serialize)]
pub struct Receipt {
    pub request_id: String,
    pub started_at: String,
    pub finished_at: String,
    /// `erased` when this run removed rows, `nothing_held` when no tier held any.
    pub outcome: &'static str,
    pub users: usize,
    pub hashes: Vec<String>,
    pub hot: HotErased,
    pub rejects: TierErased,
    pub cold: ColdErased,
    pub aggregates: TierErased,
    pub dlq: DlqErased,
    /// Copies inferlog does not keep, which a complete erasure must also cover.
    pub outside: String,
}

/// Takes the locks of `days`, waiting while a replica holds one.
async fn lock_days(stores: &Stores, days: &BTreeSet<Day>) -> Result<DayLock, RetentionError> {
    let days: Vec<Day> = days.iter().copied().collect();
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        if let Some(lock) = stores.catalog.try_lock_days(&days).await.map_err(RetentionError::tier("aggregates"))? {
            return Ok(lock);
        }
        if Instant::now() > deadline {
            return Err(RetentionError::Incomplete(format!(
                "one of {} days stayed locked by another process for {}s; run erase again",
                days.len(),
                LOCK_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn audit_entry(tier: &'static str, unit: String, action: &'static str, rows: u64, bytes: Option<u64>, detail: String) -> AuditEntry {
    AuditEntry { tier, unit, action, rows: Some(rows), bytes, policy: "erasure".into(), dry_run: false, actor: "erase", detail: Some(detail) }
}

/// Removes every row of `request` from the hot tier: audit rows first, one
/// mutation, waited for, counted again.
async fn erase_hot(stores: &Stores, request: &Request, days: &BTreeMap<String, u64>) -> Result<(), RetentionError> {
    let hot_err = RetentionError::tier("hot");
    for (day, rows) in days {
        let detail = format!("request {}: {} users, {}", request.id, request.hashes.len(), stores.hot.qualified());
        stores
            .catalog
            .audit_once(&audit_entry("hot", day.clone(), "erase_rows", *rows, None, detail))
            .await
            .map_err(RetentionError::tier("aggregates"))?;
    }
    pause_point("erase_hot").await;
    stores.hot.delete_users(&request.hashes).await.map_err(hot_err)?;
    let deadline = Instant::now() + MUTATION_WAIT;
    loop {
        let running = stores.hot.mutations_running().await.map_err(RetentionError::tier("hot"))?;
        if running == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(RetentionError::Incomplete(format!(
                "hot tier: {running} mutations still running after {}s; run erase again",
                MUTATION_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let left: u64 = stores.hot.user_rows(&request.hashes).await.map_err(RetentionError::tier("hot"))?.iter().map(|(_, n)| n).sum();
    if left > 0 {
        return Err(RetentionError::Incomplete(format!(
            "hot tier: {left} rows of the users were stored while they were being erased; run erase again"
        )));
    }
    Ok(())
}

/// Writes `object` again without the request's rows and swaps it in, or
/// deletes an unlisted copy; audited either way.
async fn erase_object(stores: &Stores, archiver: &Archiver, request: &Request, object: &HeldObject) -> Result<ObjectErased, RetentionError> {
    let agg = RetentionError::tier("aggregates");
    let day = inferlog_store::parse_day(&object.day).ok_or_else(|| RetentionError::Config(format!("day {:?}", object.day)))?;
    let mut erased = ObjectErased {
        day: object.day.clone(),
        old_key: object.key.clone(),
        new_key: None,
        rows_removed: object.held,
        rows_kept: object.rows - object.held,
        sha256: None,
        bytes: None,
    };
    let entry =
        stores.catalog.manifest(Some(day)).await.map_err(RetentionError::tier("aggregates"))?.into_iter().find(|m| m.object_key == object.key);
    let Some(entry) = entry else {
        // A copy no manifest row lists (the old object of a run killed after its swap): nothing refers to it.
        let detail = format!("request {}: an unlisted copy holding {} rows of the users", request.id, object.held);
        stores
            .catalog
            .audit(&audit_entry("cold", object.key.clone(), "erase_unlisted", object.held, Some(object.bytes), detail))
            .await
            .map_err(agg)?;
        stores.cold.delete(&object.key).await.map_err(RetentionError::tier("cold"))?;
        erased.rows_kept = 0;
        return Ok(erased);
    };
    let new_key = erased_key(&object.key, &request.id);
    if new_key == object.key {
        return Err(RetentionError::Config(format!(
            "{} was written by request {} and holds other users of the same id: give this request another --request-id",
            object.key, request.id
        )));
    }
    let rewritten = archiver.rewrite_without(day, &entry, &request.set(), &new_key).await.map_err(RetentionError::Cold)?;
    pause_point("erase_written").await;
    let detail = match &rewritten.entry {
        Some(e) => format!("request {}: written again as {} ({} rows, sha256 {})", request.id, e.object_key, e.rows, e.sha256),
        None => format!("request {}: every row was the users'", request.id),
    };
    let audit = audit_entry("cold", object.key.clone(), "erase_rewrite", rewritten.removed, Some(object.bytes), detail);
    stores.catalog.replace_object(&object.key, rewritten.entry.as_ref(), &audit).await.map_err(agg)?;
    pause_point("erase_swapped").await;
    stores.cold.delete(&object.key).await.map_err(RetentionError::tier("cold"))?;
    erased.rows_removed = rewritten.removed;
    erased.rows_kept = rewritten.kept;
    if let Some(e) = rewritten.entry {
        erased.new_key = Some(e.object_key);
        erased.sha256 = Some(e.sha256);
        erased.bytes = Some(e.bytes);
    }
    Ok(erased)
}

/// Erases `request` from every tier and returns the receipt of this run.
pub async fn erase(stores: &Stores, config: &Config, request: &Request) -> Result<Receipt, RetentionError> {
    let started_at = now_rfc3339();
    let before = find(stores, config, request).await?;
    check_keys(request, &before)?;
    let lock = lock_days(stores, &before.days()).await?;
    // Under the locks: what the tiers hold now (a compactor may have moved a day meanwhile).
    let held = find(stores, config, request).await?;
    let archiver = Archiver { hot: stores.hot.clone(), cold: stores.cold.clone(), config: config.cold.clone(), sort_memory_bytes: 0 };
    let result = async {
        if held.hot_rows() > 0 {
            erase_hot(stores, request, &held.hot_days).await?;
        }
        let mut objects = Vec::new();
        for object in &held.objects {
            objects.push(erase_object(stores, &archiver, request, object).await?);
        }
        Ok::<_, RetentionError>(objects)
    }
    .await;
    lock.unlock().await;
    let objects = result?;
    let removed = held.hot_rows() + objects.iter().map(|o| o.rows_removed).sum::<u64>();
    let longest = config.retention.hot_days.to_string();
    Ok(Receipt {
        request_id: request.id.clone(),
        started_at,
        finished_at: now_rfc3339(),
        outcome: if removed > 0 { "erased" } else { "nothing_held" },
        users: request.hashes.len(),
        hashes: request.hashes.clone(),
        hot: HotErased { table: stores.hot.qualified(), rows_removed: held.hot_rows(), days: held.hot_days.clone() },
        rejects: TierErased {
            rows_removed: 0,
            note: format!("{}.{} has no user column (reason, field, message, offsets)", stores.hot.database, stores.hot.rejects_table),
        },
        cold: ColdErased { rows_removed: objects.iter().map(|o| o.rows_removed).sum(), objects_scanned: held.objects_scanned, objects },
        aggregates: TierErased {
            rows_removed: 0,
            note: "daily and hourly aggregates and error counts hold no user dimension; a day whose hot rows changed is aggregated again by the compactor"
                .into(),
        },
        dlq: DlqErased {
            topic: config.kafka.dlq_topic.clone(),
            payload: held.dlq_payload,
            searched: held.dlq_searched.clone(),
            partitions: held.dlq.clone(),
            unread: held.dlq_unread.clone(),
            note: format!(
                "Kafka cannot delete one message: the partitions listed hold the users' rejected events ({}), \
                 which the topic's retention (kept within the hot policy of {longest} by enforce) removes by the time given",
                if held.dlq_payload == "original" {
                    "their original bytes and keys, plaintext included"
                } else {
                    "redacted: user ids and keys as keyed hashes, no payload kept of a reject the contract could not read"
                }
            ),
        },
        outside: format!(
            "the input topic(s) {:?} are the producers' copy under their own retention; backups of the Postgres catalog and of the cold bucket are outside inferlog",
            config.kafka.topics
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferlog_schema::hash::UserIdHasher;

    #[test]
    fn a_request_hashes_plaintext_ids_or_takes_stored_hashes_and_has_a_stable_id() {
        let hasher = UserIdHasher::new(b"0123456789abcdef0123", Some("k1"), "test").expect("hasher");
        let plain = Request::parse("# users\nu-000001\n\nu-000002\nu-000001\n", Some(&hasher), None).expect("plaintext");
        assert_eq!(plain.hashes.len(), 2, "duplicates and comments dropped");
        assert!(plain.hashes.contains(&hasher.hash("u-000001")));
        assert_eq!(plain.key_id.as_deref(), Some("k1"));
        let stored = Request::parse(&plain.hashes.join("\n"), None, None).expect("hashed");
        assert_eq!((stored.hashes.clone(), stored.id.clone()), (plain.hashes.clone(), plain.id.clone()), "the same users, the same request");
        assert!(stored.plaintext.is_empty());
        let err = Request::parse("u-000001\n", None, None).expect_err("plaintext without a key");
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(Request::parse("# nobody\n", Some(&hasher), None).is_err());
        assert!(Request::parse("u-1", Some(&hasher), Some("bad id!".into())).is_err());
        assert!(!format!("{plain:?}").contains("u-000001"), "Debug never shows a plaintext id");
    }

    #[test]
    fn plaintext_ids_are_refused_when_a_tier_holds_another_key() {
        let hasher = UserIdHasher::new(b"0123456789abcdef0123", Some("k1"), "test").expect("hasher");
        let plain = Request::parse("u-000001", Some(&hasher), None).expect("plaintext");
        let mut holdings = Holdings {
            hot_days: BTreeMap::new(),
            objects_scanned: 0,
            objects: Vec::new(),
            key_ids: ["k1".to_owned()].into(),
            dlq: Vec::new(),
            dlq_unread: None,
            dlq_payload: "redacted",
            dlq_searched: DlqSearch::default(),
        };
        assert!(check_keys(&plain, &holdings).is_ok());
        holdings.key_ids.insert("k0".into());
        let err = check_keys(&plain, &holdings).expect_err("another key");
        assert!(err.to_string().contains("k0"), "{err}");
        let hashed = Request::parse(&plain.hashes[0], None, None).expect("hashed");
        assert!(check_keys(&hashed, &holdings).is_ok(), "stored hashes need no key");
    }
}
