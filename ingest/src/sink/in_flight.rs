//! Inserts in flight. In: every INSERT ingest sends, named by
//! [`InsertIds`] (`inferlog-ingest/<db>.<hot table>/<run>/<insert>/<attempt>`).
//! Out: no insert lands after a reader decided what is already stored.
//!
//! A writer killed while it waits for an INSERT's answer leaves the INSERT
//! running on the server: the rows were sent, the part is not written yet.
//! Had the partition's next reader read the replay log then, it would find
//! those offsets not stored, write them again, and the dead writer's part
//! would land after its own (a CI run saw 11,774 rows twice). Two fences:
//!
//! - before a partition's reader reads the replay log, it waits until the
//!   inserts into the pipeline's tables running at that moment have ended
//!   (landed or failed), and past [`GRACE`] ends them (`KILL QUERY … SYNC`:
//!   the insert of a live member then fails and is retried, which is safe);
//! - before a retry asks whether the attempt before landed, it ends that
//!   attempt, which a dropped connection may have left running.
//!
//! The server registers a query when its request starts, before the rows
//! are read, so an insert whose rows were all sent is already listed. What
//! is not covered: a request still unread in a socket buffer when the
//! reader looks, which would need the server to take longer to accept it
//! than a new member takes to start and look up its commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clickhouse::{Client, Row};
use serde::Deserialize;

/// How long a reader waits for the inserts in flight before it ends them.
pub const GRACE: Duration = Duration::from_secs(30);

/// The first pause between two looks at the process list; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Names the INSERTs of one pipeline (one hot table and its rejects and
/// replay logs): a prefix every member shares, a run unique to this
/// process, and a counter.
#[derive(Debug)]
pub struct InsertIds {
    prefix: String,
    run: String,
    next: AtomicU64,
}

impl InsertIds {
    pub fn new(database: &str, hot_table: &str) -> InsertIds {
        let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        InsertIds {
            prefix: format!("inferlog-ingest/{database}.{hot_table}/"),
            run: format!("{:x}-{started:x}", std::process::id()),
            next: AtomicU64::new(0),
        }
    }

    /// What the query ids of every member of this pipeline start with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A new logical insert (a batch's day, a day of rejects, a replay-log entry).
    pub fn insert(&self) -> String {
        format!("{}{}/{}", self.prefix, self.run, self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// The query id of one attempt of `insert`.
    pub fn attempt(&self, insert: &str) -> String {
        format!("{insert}/{}", self.next.fetch_add(1, Ordering::Relaxed))
    }
}

#[derive(Debug, Row, Deserialize)]
struct Running {
    query_id: String,
}

async fn running(client: &Client, prefix: &str) -> clickhouse::error::Result<Vec<String>> {
    let rows = client.query("SELECT query_id FROM system.processes WHERE startsWith(query_id, ?)").bind(prefix).fetch_all::<Running>().await?;
    Ok(rows.into_iter().map(|r| r.query_id).collect())
}

/// Ends every attempt of `insert` still running (the server answers once
/// each has landed or stopped), so a retry learns the truth from the table.
pub async fn end_attempts(client: &Client, insert: &str) -> clickhouse::error::Result<()> {
    client.query("KILL QUERY WHERE startsWith(query_id, ?) SYNC").bind(format!("{insert}/")).execute().await
}

/// What [`wait_out`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitedOut {
    /// Inserts that were running when it looked.
    pub inserts: usize,
    /// Of those, still running after [`GRACE`] and ended.
    pub ended: usize,
    pub waited: Duration,
}

/// Waits until the inserts whose query ids start with `prefix` and that
/// run now have ended; ends those still running after `grace`.
pub async fn wait_out(client: &Client, prefix: &str, grace: Duration) -> clickhouse::error::Result<WaitedOut> {
    let ids = running(client, prefix).await?;
    if ids.is_empty() {
        return Ok(WaitedOut::default());
    }
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
        let now = running(client, prefix).await?;
        let left: Vec<&String> = ids.iter().filter(|id| now.contains(id)).collect();
        if left.is_empty() {
            return Ok(WaitedOut { inserts: ids.len(), ended: 0, waited: start.elapsed() });
        }
        if start.elapsed() >= grace {
            client.query("KILL QUERY WHERE has(?, query_id) SYNC").bind(&left).execute().await?;
            return Ok(WaitedOut { inserts: ids.len(), ended: left.len(), waited: start.elapsed() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_share_the_pipelines_prefix_and_attempts_their_inserts() {
        let ids = InsertIds::new("db", "logs");
        let (a, b) = (ids.insert(), ids.insert());
        assert!(a.starts_with("inferlog-ingest/db.logs/") && b.starts_with(ids.prefix()));
        assert_ne!(a, b);
        let attempt = ids.attempt(&a);
        assert!(attempt.starts_with(&format!("{a}/")));
        // An attempt of insert 1 is not one of insert 12 ("…/1/" vs "…/12/").
        assert!(!format!("{a}2/0").starts_with(&format!("{a}/")));
        let other = InsertIds::new("db", "logs_b");
        assert!(!other.insert().starts_with(ids.prefix()), "another hot table's inserts are not this pipeline's");
    }
}
