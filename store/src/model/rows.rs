//! The rows ingest writes, each in the column order of its table's
//! [`Shape`](crate::model::tables::Shape). In: a normalized event and its
//! Kafka coordinates, or a rejected message. Out: [`HotRow`] (and its
//! RowBinary bytes, [`HotRow::encode`]), [`RejectRow`].

use clickhouse::Row;
use serde::Serialize;

include!(concat!(env!("OUT_DIR"), "/hot_row.rs"));

/// The request id of a row [`HotRow::encode`] wrote: the string after the
/// fixed-width day, event time and timestamp.
pub fn encoded_request_id(row: &[u8]) -> Option<&str> {
    read_str(row, REQUEST_ID_AT).and_then(|(id, _)| std::str::from_utf8(id).ok())
}

/// Where the request id starts in an encoded row: after the day (2 bytes),
/// the event time (4) and the timestamp (8).
const REQUEST_ID_AT: usize = 2 + 4 + 8;

/// The hot table's sorting key of one encoded row, its fields in the
/// order of the `ORDER BY` ([`SortKey::COLUMNS`], `HOT.order_by`), so the
/// derived `Ord` is ClickHouse's (strings compare as bytes). Ingest sends
/// each insert in this order: ClickHouse then sorts a block that is
/// already sorted (about a third less of its CPU per insert, measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SortKey<'a> {
    pub business_line: &'a [u8],
    pub model_name: &'a [u8],
    pub model_version: &'a [u8],
    pub event_time: u32,
    pub request_id: &'a [u8],
}

impl<'a> SortKey<'a> {
    /// The columns the key holds, in its order.
    pub const COLUMNS: [&'static str; 5] = ["business_line", "model_name", "model_version", "event_time", "request_id"];

    /// The key of a row [`HotRow::encode`] wrote; `None` for bytes that are
    /// not one.
    pub fn of_encoded(row: &'a [u8]) -> Option<SortKey<'a>> {
        let event_time = u32::from_le_bytes(row.get(2..6)?.try_into().ok()?);
        let (request_id, at) = read_str(row, REQUEST_ID_AT)?;
        let (business_line, at) = read_str(row, at)?;
        let (model_name, at) = read_str(row, at)?;
        let (model_version, _) = read_str(row, at)?;
        Some(SortKey { business_line, model_name, model_version, event_time, request_id })
    }
}

/// The RowBinary `String` at `at` (its length as an unsigned LEB128, then
/// its bytes), and where the next column starts.
fn read_str(row: &[u8], mut at: usize) -> Option<(&[u8], usize)> {
    let (mut len, mut shift) = (0u64, 0u32);
    loop {
        let b = *row.get(at)?;
        at += 1;
        len |= u64::from(b & 0x7f).checked_shl(shift)?;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let end = at.checked_add(usize::try_from(len).ok()?)?;
    Some((row.get(at..end)?, end))
}

/// A RowBinary `String`: its length as an unsigned LEB128, then its bytes.
fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut len = s.len() as u64;
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(s.as_bytes());
}

/// A RowBinary `Nullable(T)`: 1 for NULL, else 0 and the value.
fn put_nullable<T>(out: &mut Vec<u8>, value: Option<T>, put: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        None => out.push(1),
        Some(v) => {
            out.push(0);
            put(out, v);
        }
    }
}

/// A value in ClickHouse's RowBinary format: what [`HotRow::encode`]
/// writes for each column, by the field's type.
trait RowBinary {
    fn put(&self, out: &mut Vec<u8>);
}

macro_rules! little_endian {
    ($($t:ty),*) => {$(
        impl RowBinary for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

little_endian!(u16, u32, u64, i32, f64);

impl RowBinary for u8 {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
}

impl RowBinary for str {
    fn put(&self, out: &mut Vec<u8>) {
        put_str(out, self);
    }
}

impl RowBinary for String {
    fn put(&self, out: &mut Vec<u8>) {
        put_str(out, self);
    }
}

impl RowBinary for std::sync::Arc<str> {
    fn put(&self, out: &mut Vec<u8>) {
        put_str(out, self);
    }
}

impl RowBinary for &str {
    fn put(&self, out: &mut Vec<u8>) {
        put_str(out, self);
    }
}

impl<T: RowBinary> RowBinary for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        put_nullable(out, self.as_ref(), |out, v| v.put(out));
    }
}

/// One rejected message, as logged in ClickHouse next to the DLQ (so rejects
/// are queryable by reason and day, and replays know what was rejected).
#[derive(Debug, Clone, PartialEq, Row, Serialize)]
pub struct RejectRow {
    /// Day the message was received (its own timestamp may be unreadable).
    pub day: u16,
    pub received_at: u32,
    pub reason: &'static str,
    pub field: String,
    pub message: String,
    pub kafka_topic: String,
    pub kafka_partition: u16,
    pub kafka_offset: u64,
    pub bytes: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tables;

    #[test]
    fn strings_carry_their_length_as_leb128() {
        let mut out = Vec::new();
        put_str(&mut out, "ab");
        assert_eq!(out, [2, b'a', b'b']);
        for (len, prefix) in [(127usize, vec![0x7f]), (128, vec![0x80, 0x01]), (300, vec![0xac, 0x02]), (16_384, vec![0x80, 0x80, 0x01])] {
            let mut out = Vec::new();
            put_str(&mut out, &"x".repeat(len));
            assert_eq!(out[..prefix.len()], prefix[..], "length {len}");
            assert_eq!(out.len(), prefix.len() + len);
        }
        let mut out = Vec::new();
        put_nullable(&mut out, None::<u8>, |out, v| out.push(v));
        put_nullable(&mut out, Some(7u8), |out, v| out.push(v));
        assert_eq!(out, [1, 0, 7]);
    }

    #[test]
    fn the_request_id_is_read_back_from_an_encoded_row() {
        let contract = inferlog_schema::Contract::new(&inferlog_schema::ContractConfig::default()).expect("contract");
        let hasher = inferlog_schema::UserIdHasher::new(b"rows-test-key-0123456789abcdefgh", None, "test").expect("key");
        for id in ["req-1", &"r".repeat(128)] {
            let line = format!(
                r#"{{"request_id":"{id}","timestamp":"2026-12-01T10:00:00Z","model_name":"m","model_version":"v1","business_line":"search","input_tokens":3,"output_tokens":4,"total_latency_ms":12.5,"error_code":0}}"#
            );
            let event = contract.normalize(line.as_bytes(), None, &hasher).expect("valid").event;
            let mut out = Vec::new();
            HotRow::new(event, std::sync::Arc::from("events"), 1, 2, 3).encode(&mut out);
            assert_eq!(encoded_request_id(&out), Some(id));
        }
        assert_eq!(encoded_request_id(&[0; 14]), None, "cut short");
    }

    #[test]
    fn the_sort_key_is_read_back_and_is_the_tables_order() {
        assert_eq!(SortKey::COLUMNS.join(", "), tables::HOT.order_by, "the key is the hot table's ORDER BY");
        let contract = inferlog_schema::Contract::new(&inferlog_schema::ContractConfig::default()).expect("contract");
        let hasher = inferlog_schema::UserIdHasher::new(b"rows-test-key-0123456789abcdefgh", None, "test").expect("key");
        let mut rows = Vec::new();
        // Every column of the key decides once, a long id included (a two-byte length).
        for (line, model, version, second, id) in [
            ("search", "m", "v1", 5, "b"),
            ("ads", "m", "v1", 9, "a"),
            ("search", "m", "v1", 5, &"a".repeat(128) as &str),
            ("search", "l", "v2", 7, "c"),
            ("search", "m", "v0", 8, "d"),
            ("search", "m", "v1", 4, "z"),
        ] {
            let line_json = format!(
                r#"{{"request_id":"{id}","timestamp":"2026-12-01T10:00:0{second}Z","model_name":"{model}","model_version":"{version}","business_line":"{line}","input_tokens":3,"output_tokens":4,"total_latency_ms":12.5,"error_code":0}}"#
            );
            let event = contract.normalize(line_json.as_bytes(), None, &hasher).expect("valid").event;
            let row = HotRow::new(event, std::sync::Arc::from("events"), 1, 2, 3);
            let mut out = Vec::new();
            row.encode(&mut out);
            let key = SortKey::of_encoded(&out).expect("a row");
            let fields =
                (row.business_line.as_bytes(), row.model_name.as_bytes(), row.model_version.as_bytes(), row.event_time, row.request_id.as_bytes());
            assert_eq!((key.business_line, key.model_name, key.model_version, key.event_time, key.request_id), fields);
            rows.push(out);
        }
        let mut by_key = rows.clone();
        by_key.sort_by(|a, b| SortKey::of_encoded(a).cmp(&SortKey::of_encoded(b)));
        let ids: Vec<&str> = by_key.iter().filter_map(|r| encoded_request_id(r)).map(|id| &id[..1]).collect();
        assert_eq!(ids, ["a", "c", "d", "z", "a", "b"], "line, model, version, second, id");
        assert_eq!(SortKey::of_encoded(&rows[0][..20]), None, "cut short");
    }

    /// The typed inserts name the columns of their table's shape, in order.
    #[test]
    fn each_row_is_its_tables_shape() {
        let shape: Vec<&str> = tables::REJECTS.columns.iter().map(|c| c.name).collect();
        assert_eq!(<RejectRow as Row>::COLUMN_NAMES, shape.as_slice());
        let hot: Vec<&str> = tables::HOT.columns.iter().map(|c| c.name).collect();
        assert_eq!(<HotRow as Row>::COLUMN_NAMES, hot.as_slice());
    }
}
