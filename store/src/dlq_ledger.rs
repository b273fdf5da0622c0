//! The DLQ replay ledger. In: the source coordinates of rejected events a
//! replay is about to store, and then has stored. Out: which of a set are
//! already stored or pending, the pending ones of a killed replay, and the
//! lock that serializes replays of one DLQ.
//!
//! A replayed row's identity is its source coordinates (topic, partition,
//! offset, index in the message), as for a live row. The ledger remembers
//! them apart from the tiers, because a row moves on: a replayed row of a
//! day later archived (and sampled) and released is no longer in the hot
//! table, yet a second replay must not store it again. Each entry is
//! written `pending` before its row's INSERT and `stored` once it landed;
//! a pending entry is resolved by the next replay (found in the hot table:
//! stored; not found once the INSERTs in flight ended: never landed), and
//! [`crate::release`] keeps a day with pending entries in the hot tier
//! until then.

use std::collections::HashMap;

use sqlx::Row as _;

use crate::catalog::{Catalog, DayLock};
use crate::{Day, StoreError};

/// A rejected event's identity: its source topic, partition, offset and
/// index in its message (a span's index; 0 for a JSON event).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Coordinates {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub index: u32,
}

/// What the ledger knows of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Written before its INSERT: the row may or may not have landed.
    Pending,
    /// Its row landed.
    Stored,
}

/// The second key of a DLQ's replay lock: negative, so never a day's.
fn replay_key(dlq_topic: &str) -> i32 {
    let digest = crate::catalog::stable_hash(dlq_topic.as_bytes());
    -1 - (digest & 0x3fff_ffff) as i32
}

impl Catalog {
    /// Takes the replay lock of `dlq_topic`, waiting while another replay
    /// holds it. Released by [`DayLock::unlock`], or by Postgres when this
    /// process dies.
    pub async fn lock_replay(&self, dlq_topic: &str) -> Result<DayLock, StoreError> {
        let mut conn = self.pool().acquire().await.map_err(StoreError::postgres("acquire"))?;
        let key = replay_key(dlq_topic);
        sqlx::query("SELECT pg_advisory_lock($1, $2)")
            .bind(self.lock_space())
            .bind(key)
            .execute(&mut *conn)
            .await
            .map_err(StoreError::postgres("replay lock"))?;
        Ok(DayLock::held(conn, self.lock_space(), vec![key]))
    }

    /// What the ledger holds of `events`.
    pub async fn replayed(&self, events: &[Coordinates]) -> Result<HashMap<Coordinates, Entry>, StoreError> {
        let mut found = HashMap::new();
        for chunk in events.chunks(5_000) {
            let (topics, partitions, offsets, indexes) = columns(chunk.iter());
            let rows = sqlx::query(
                "SELECT l.kafka_topic, l.kafka_partition, l.kafka_offset, l.kafka_index, l.state \
                 FROM dlq_replayed l JOIN UNNEST($1::text[], $2::integer[], $3::bigint[], $4::bigint[]) AS e(t, p, o, i) \
                 ON l.kafka_topic = e.t AND l.kafka_partition = e.p AND l.kafka_offset = e.o AND l.kafka_index = e.i",
            )
            .bind(topics)
            .bind(partitions)
            .bind(offsets)
            .bind(indexes)
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::postgres("replay ledger lookup"))?;
            for row in rows {
                let c = coordinates(&row)?;
                let state: String = row.try_get("state").map_err(StoreError::postgres("replay ledger row"))?;
                found.insert(c, if state == "stored" { Entry::Stored } else { Entry::Pending });
            }
        }
        Ok(found)
    }

    /// Records `events` (each with its row's day) as pending for replay `run`.
    pub async fn replay_pending(&self, events: &[(Coordinates, Day)], run: &str) -> Result<(), StoreError> {
        for chunk in events.chunks(5_000) {
            let (topics, partitions, offsets, indexes) = columns(chunk.iter().map(|(c, _)| c));
            sqlx::query(
                "INSERT INTO dlq_replayed (kafka_topic, kafka_partition, kafka_offset, kafka_index, day, state, run) \
                 SELECT t, p, o, i, d, 'pending', $6 FROM UNNEST($1::text[], $2::integer[], $3::bigint[], $4::bigint[], $5::integer[]) AS e(t, p, o, i, d) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(topics)
            .bind(partitions)
            .bind(offsets)
            .bind(indexes)
            .bind(chunk.iter().map(|(_, d)| *d).collect::<Vec<_>>())
            .bind(run)
            .execute(self.pool())
            .await
            .map_err(StoreError::postgres("replay ledger pending"))?;
        }
        Ok(())
    }

    /// Marks `events` stored (their rows landed).
    pub async fn replay_stored(&self, events: &[Coordinates]) -> Result<(), StoreError> {
        self.replay_set(events, "UPDATE dlq_replayed l SET state = 'stored', at = now() FROM", "replay ledger stored").await
    }

    /// Forgets pending `events` whose rows never landed.
    pub async fn replay_forget(&self, events: &[Coordinates]) -> Result<(), StoreError> {
        self.replay_set(events, "DELETE FROM dlq_replayed l USING", "replay ledger forget").await
    }

    async fn replay_set(&self, events: &[Coordinates], head: &str, operation: &'static str) -> Result<(), StoreError> {
        for chunk in events.chunks(5_000) {
            let (topics, partitions, offsets, indexes) = columns(chunk.iter());
            sqlx::query(&format!(
                "{head} UNNEST($1::text[], $2::integer[], $3::bigint[], $4::bigint[]) AS e(t, p, o, i) \
                 WHERE l.kafka_topic = e.t AND l.kafka_partition = e.p AND l.kafka_offset = e.o AND l.kafka_index = e.i"
            ))
            .bind(topics)
            .bind(partitions)
            .bind(offsets)
            .bind(indexes)
            .execute(self.pool())
            .await
            .map_err(StoreError::postgres(operation))?;
        }
        Ok(())
    }

    /// When the oldest stored entry was written (epoch ms); `None` when
    /// the ledger holds none. Retention's view of the ledger.
    pub async fn replay_oldest_stored(&self) -> Result<Option<i64>, StoreError> {
        sqlx::query_scalar("SELECT (extract(epoch FROM min(at)) * 1000)::bigint FROM dlq_replayed WHERE state = 'stored'")
            .fetch_one(self.pool())
            .await
            .map_err(StoreError::postgres("replay ledger oldest"))
    }

    /// Stored entries written before `before_ms` (epoch ms): what
    /// [`Catalog::replay_prune`] would delete.
    pub async fn replay_stored_before(&self, before_ms: i64) -> Result<u64, StoreError> {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM dlq_replayed WHERE state = 'stored' AND at < to_timestamp($1::double precision / 1000)")
                .bind(before_ms)
                .fetch_one(self.pool())
                .await
                .map_err(StoreError::postgres("replay ledger count"))?;
        Ok(n as u64)
    }

    /// Deletes the stored entries written before `before_ms` (epoch ms),
    /// and says how many. Only retention calls it, with a cut-off before
    /// the DLQ topic's oldest message: an entry written then stands for a
    /// message the topic no longer holds, so no replay can meet it again.
    /// Pending entries stay: the next replay resolves them.
    pub async fn replay_prune(&self, before_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM dlq_replayed WHERE state = 'stored' AND at < to_timestamp($1::double precision / 1000)")
            .bind(before_ms)
            .execute(self.pool())
            .await
            .map_err(StoreError::postgres("replay ledger prune"))?;
        Ok(done.rows_affected())
    }

    /// Every pending entry, with its row's day: what killed replays left.
    pub async fn replay_pending_entries(&self) -> Result<Vec<(Coordinates, Day)>, StoreError> {
        let rows = sqlx::query("SELECT kafka_topic, kafka_partition, kafka_offset, kafka_index, day FROM dlq_replayed WHERE state = 'pending'")
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::postgres("replay ledger pending lookup"))?;
        rows.iter()
            .map(|row| Ok((coordinates(row)?, row.try_get::<i32, _>("day").map_err(StoreError::postgres("replay ledger pending lookup"))?)))
            .collect()
    }

    /// How many replayed rows of `day` may or may not have landed (a
    /// replay was killed between its INSERT and its ledger): the day stays
    /// in the hot tier until the next replay resolves them.
    pub async fn replay_pending_on(&self, day: Day) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM dlq_replayed WHERE state = 'pending' AND day = $1")
            .bind(day)
            .fetch_one(self.pool())
            .await
            .map_err(StoreError::postgres("replay ledger pending count"))?;
        Ok(n as u64)
    }
}

/// Coordinates as the four arrays an `UNNEST` takes.
fn columns<'a>(events: impl Iterator<Item = &'a Coordinates>) -> (Vec<String>, Vec<i32>, Vec<i64>, Vec<i64>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for c in events {
        out.0.push(c.topic.clone());
        out.1.push(c.partition);
        out.2.push(c.offset);
        out.3.push(i64::from(c.index));
    }
    out
}

fn coordinates(row: &sqlx::postgres::PgRow) -> Result<Coordinates, StoreError> {
    let error = || StoreError::postgres("replay ledger row");
    let index: i64 = row.try_get("kafka_index").map_err(error())?;
    Ok(Coordinates {
        topic: row.try_get("kafka_topic").map_err(error())?,
        partition: row.try_get("kafka_partition").map_err(error())?,
        offset: row.try_get("kafka_offset").map_err(error())?,
        index: index as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_keys_never_collide_with_days() {
        for topic in ["dlq", "inferlog-dlq", "a-much-longer-dead-letter-topic-name"] {
            let key = replay_key(topic);
            assert!(key < 0, "{topic}: {key}");
            assert_eq!(key, replay_key(topic), "stable");
        }
        assert_ne!(replay_key("dlq-a"), replay_key("dlq-b"));
    }
}
