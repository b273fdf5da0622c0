//! The sort stage. In: one insert's rows, RowBinary-encoded, as chunks (a
//! chunk per Kafka partition of the batch) with where each row ends. Out:
//! the order of those rows in the hot table's sorting key
//! ([`SortKey`]: business line, model, version, event time, request id),
//! and the insert's body in that order, copied from the chunks in pieces
//! of about [`PIECE_BYTES`] while the insert sends them.
//!
//! ClickHouse sorts every block it inserts by the table's `ORDER BY`. A
//! block that arrives sorted costs it about a third less CPU: 1,000,000
//! rows inserted in 200,000-row blocks took 18.16 1.3–2.1 CPU-s sorted
//! per block against 2.3–3.1 in the order ingest reads them
//! (`docs/performance.md`). The order is a hint only: ClickHouse sorts
//! anyway, so what lands is the same rows whatever order they arrive in.
//! It is deterministic (rows with equal keys keep the batch's order), so
//! a retry sends the same bytes, as a replicated table's deduplication of
//! a retried block expects.
//!
//! The pieces stay under glibc's mmap threshold ([`crate::memory`]): they
//! come from the heap and go back to it, instead of being fresh mappings
//! the kernel faults in for every batch, and at most two are in flight.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use inferlog_store::model::rows::SortKey;

/// The body's pieces: under [`crate::memory::MMAP_THRESHOLD`].
pub const PIECE_BYTES: usize = 96 * 1024;

/// A business line, model and version, as a row's key holds them.
type Series<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// One row: its chunk and its bytes there.
#[derive(Debug, Clone, Copy)]
struct RowAt {
    chunk: u32,
    start: u32,
    end: u32,
}

/// An insert's rows in the table's sorting key.
#[derive(Debug)]
pub struct Order {
    rows: Vec<RowAt>,
}

impl Order {
    /// The order of the rows of `chunks`, whose rows end at `ends` (per
    /// chunk); `None` when the two disagree or a row is not one
    /// [`inferlog_store::model::rows::HotRow::encode`] wrote (the insert
    /// then goes in the order it has).
    pub fn of(chunks: &[Bytes], ends: &[Vec<u32>]) -> Option<Order> {
        if chunks.len() != ends.len() || u32::try_from(chunks.len()).is_err() {
            return None;
        }
        // A batch holds a few dozen business line × model × version: each
        // is numbered as first seen and ranked once, so most comparisons
        // are of one integer (rank, then second), and only rows of one
        // series and second compare their request ids.
        let mut series: HashMap<Series<'_>, u32, foldhash::fast::RandomState> = HashMap::default();
        let mut keyed: Vec<(u64, &[u8], RowAt)> = Vec::with_capacity(ends.iter().map(Vec::len).sum());
        for (c, (chunk, ends)) in chunks.iter().zip(ends).enumerate() {
            if ends.last().map_or(0, |&e| e as usize) != chunk.len() {
                return None;
            }
            let mut start = 0u32;
            for &end in ends {
                let key = SortKey::of_encoded(chunk.get(start as usize..end as usize)?)?;
                let next = series.len() as u32;
                let seen = *series.entry((key.business_line, key.model_name, key.model_version)).or_insert(next);
                keyed.push(((u64::from(seen) << 32) | u64::from(key.event_time), key.request_id, RowAt { chunk: c as u32, start, end }));
                start = end;
            }
        }
        let mut names: Vec<(Series<'_>, u32)> = series.into_iter().collect();
        names.sort_unstable();
        let mut rank = vec![0u32; names.len()];
        for (r, (_, seen)) in names.iter().enumerate() {
            rank[*seen as usize] = r as u32;
        }
        for (key, _, _) in &mut keyed {
            *key = (u64::from(rank[(*key >> 32) as usize]) << 32) | (*key & u64::from(u32::MAX));
        }
        // Ties keep the batch's order: chunk, then place in it.
        keyed.sort_unstable_by(|(a, a_id, at), (b, b_id, bt)| {
            a.cmp(b).then_with(|| a_id.cmp(b_id)).then_with(|| (at.chunk, at.start).cmp(&(bt.chunk, bt.start)))
        });
        Some(Order { rows: keyed.into_iter().map(|(_, _, at)| at).collect() })
    }

    /// The body: the rows of `chunks` (those [`Order::of`] read) in the
    /// order, copied into pieces of at most [`PIECE_BYTES`] (a row larger
    /// than that, which the contract's field limits rule out, would be a
    /// piece of its own).
    pub fn pieces<'a>(&'a self, chunks: &'a [Bytes]) -> impl Iterator<Item = Bytes> + 'a {
        let mut next = 0;
        std::iter::from_fn(move || {
            let mut piece = BytesMut::with_capacity(PIECE_BYTES);
            while let Some(at) = self.rows.get(next) {
                let row = &chunks[at.chunk as usize][at.start as usize..at.end as usize];
                if !piece.is_empty() && piece.len() + row.len() > PIECE_BYTES {
                    break;
                }
                piece.extend_from_slice(row);
                next += 1;
            }
            (!piece.is_empty()).then(|| piece.freeze())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use inferlog_store::model::rows::HotRow;

    use super::*;

    /// splitmix64: reproducible from the seed a failure names.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn row(state: &mut u64, partition: u16, offset: i64) -> HotRow {
        static CONTRACT: std::sync::OnceLock<(inferlog_schema::Contract, inferlog_schema::UserIdHasher)> = std::sync::OnceLock::new();
        let (contract, hasher) = CONTRACT.get_or_init(|| {
            let contract = inferlog_schema::Contract::new(&inferlog_schema::ContractConfig::default()).expect("contract");
            let hasher = inferlog_schema::UserIdHasher::new(b"sort-test-key-0123456789abcdefghij", None, "test").expect("key");
            (contract, hasher)
        });
        let lines = ["search", "ads", "search-ads", "chat"];
        let models = ["m", "llama", "l"];
        let line = lines[(next(state) % 4) as usize];
        let model = models[(next(state) % 3) as usize];
        let version = next(state) % 2;
        let second = next(state) % 3;
        // Few ids, so equal keys (the same id twice) happen too; some long.
        let id = match next(state) % 10 {
            0 => "x".repeat(128),
            n => format!("r{}", n % 4),
        };
        let json = format!(
            r#"{{"request_id":"{id}","timestamp":"2026-12-01T10:00:0{second}Z","model_name":"{model}","model_version":"v{version}","business_line":"{line}","input_tokens":3,"output_tokens":4,"total_latency_ms":12.5,"error_code":0}}"#
        );
        let event = contract.normalize(json.as_bytes(), None, hasher).expect("valid").event;
        HotRow::new(event, Arc::from("events"), partition, offset, 1)
    }

    #[test]
    fn the_body_holds_every_row_once_in_the_tables_order() {
        for seed in 0..20u64 {
            let mut state = seed;
            let mut chunks = Vec::new();
            let mut ends = Vec::new();
            let mut expected: Vec<(HotRow, Vec<u8>)> = Vec::new();
            for partition in 0..(1 + next(&mut state) % 4) as u16 {
                let mut chunk = Vec::new();
                let mut chunk_ends = Vec::new();
                for offset in 0..(next(&mut state) % 300) as i64 {
                    let r = row(&mut state, partition, offset);
                    let mut encoded = Vec::new();
                    r.encode(&mut encoded);
                    chunk.extend_from_slice(&encoded);
                    chunk_ends.push(chunk.len() as u32);
                    expected.push((r, encoded));
                }
                chunks.push(Bytes::from(chunk));
                ends.push(chunk_ends);
            }
            // Independently: a stable sort of the rows by the ORDER BY's fields.
            expected.sort_by(|(a, _), (b, _)| {
                (&a.business_line, &a.model_name, &a.model_version, a.event_time, &a.request_id).cmp(&(
                    &b.business_line,
                    &b.model_name,
                    &b.model_version,
                    b.event_time,
                    &b.request_id,
                ))
            });
            let expected: Vec<u8> = expected.into_iter().flat_map(|(_, e)| e).collect();
            let order = Order::of(&chunks, &ends).unwrap_or_else(|| panic!("seed {seed}: rows read"));
            let pieces: Vec<Bytes> = order.pieces(&chunks).collect();
            assert!(pieces.iter().all(|p| p.len() <= PIECE_BYTES), "seed {seed}: pieces bounded");
            let body: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            assert_eq!(body, expected, "seed {seed}: the rows, each once, in the table's order, ties in the batch's");
            let again: Vec<u8> = Order::of(&chunks, &ends).expect("rows").pieces(&chunks).flat_map(|p| p.to_vec()).collect();
            assert_eq!(again, body, "seed {seed}: a retry sends the same bytes");
        }
    }

    #[test]
    fn rows_it_cannot_read_leave_the_order_as_it_is() {
        let mut state = 7;
        let mut encoded = Vec::new();
        row(&mut state, 0, 0).encode(&mut encoded);
        let chunks = vec![Bytes::from(encoded.clone())];
        assert!(Order::of(&chunks, &[vec![encoded.len() as u32]]).is_some());
        assert!(Order::of(&chunks, &[vec![encoded.len() as u32 - 1]]).is_none(), "ends short of the chunk");
        assert!(Order::of(&chunks, &[]).is_none(), "no ends for a chunk");
        assert!(Order::of(&[Bytes::from_static(&[0; 8])], &[vec![8]]).is_none(), "not a row");
    }

    #[test]
    fn pieces_fill_up_to_their_size() {
        let mut state = 3;
        let mut chunk = Vec::new();
        let mut ends = Vec::new();
        for offset in 0..2000 {
            row(&mut state, 0, offset).encode(&mut chunk);
            ends.push(chunk.len() as u32);
        }
        let chunks = vec![Bytes::from(chunk)];
        let order = Order::of(&chunks, &[ends]).expect("rows");
        let sizes: Vec<usize> = order.pieces(&chunks).map(|p| p.len()).collect();
        let (last, full) = sizes.split_last().expect("pieces");
        assert!(!full.is_empty() && full.iter().all(|&s| s <= PIECE_BYTES && s > PIECE_BYTES - 400), "{sizes:?}");
        assert!(*last <= PIECE_BYTES, "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), chunks[0].len());
    }
}
