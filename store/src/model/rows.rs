//! The rows ingest writes, each in the column order of its table's
//! [`Shape`](crate::model::tables::Shape). In: a normalized event and its
//! Kafka coordinates, or a rejected message. Out: [`HotRow`] (and its
//! RowBinary bytes, [`HotRow::encode`]), [`RejectRow`].

use clickhouse::Row;
use inferlog_schema::{InferenceEvent, SCHEMA_VERSION};
use serde::Serialize;

#[cfg(doc)]
use crate::model::tables::HOT;

/// One hot row: the normalized event plus where it came from. Field order
/// is the column order of the table (RowBinary is positional).
#[derive(Debug, Clone, PartialEq, Row, Serialize)]
pub struct HotRow {
    /// UTC day of the event, days since 1970-01-01 (ClickHouse `Date`).
    pub day: u16,
    /// Event time, whole seconds (ClickHouse `DateTime`), for time-range filters.
    pub event_time: u32,
    pub timestamp_ms: u64,
    pub request_id: String,
    pub business_line: String,
    pub model_name: String,
    pub model_version: String,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub total_latency_ms: f64,
    pub error_code: i32,
    pub error_stage: Option<&'static str>,
    pub user_id_hash: Option<String>,
    pub tenant: Option<String>,
    pub session_id: Option<String>,
    pub request_type: Option<String>,
    pub queue_wait_ms: Option<f64>,
    pub prefill_time_ms: Option<f64>,
    pub decode_time_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub gpu_id: Option<u32>,
    pub batch_size: Option<u32>,
    pub cache_hit: Option<u8>,
    pub cache_prefix_tokens: Option<u32>,
    pub gpu_mem_peak_mb: Option<f64>,
    pub truncated: Option<u8>,
    pub prompt_hash: Option<String>,
    pub max_tokens: Option<u32>,
    pub schema_version: u8,
    /// Shared by every row of the topic: no allocation per row.
    pub kafka_topic: std::sync::Arc<str>,
    pub kafka_partition: u16,
    pub kafka_offset: u64,
    /// The event's place in its message: 0 for a JSON event, the span's
    /// index for an OTLP message (whose spans share its coordinates).
    pub kafka_index: u32,
    pub ingested_at: u32,
}

impl HotRow {
    pub fn new(e: InferenceEvent, topic: std::sync::Arc<str>, partition: u16, offset: i64, ingested_at: u32) -> HotRow {
        // Timestamps are validated to lie in 2000..2100, so these fit.
        let day = e.timestamp_ms.div_euclid(inferlog_schema::timestamp::MS_PER_DAY) as u16;
        HotRow {
            day,
            event_time: (e.timestamp_ms / 1000) as u32,
            timestamp_ms: e.timestamp_ms as u64,
            request_id: e.request_id,
            business_line: e.business_line,
            model_name: e.model_name,
            model_version: e.model_version,
            input_tokens: e.input_tokens,
            output_tokens: e.output_tokens,
            total_latency_ms: e.total_latency_ms,
            error_code: e.error_code,
            error_stage: e.error_stage.map(|s| s.as_str()),
            user_id_hash: e.user_id_hash,
            tenant: e.tenant,
            session_id: e.session_id,
            request_type: e.request_type,
            queue_wait_ms: e.queue_wait_ms,
            prefill_time_ms: e.prefill_time_ms,
            decode_time_ms: e.decode_time_ms,
            ttft_ms: e.ttft_ms,
            tpot_ms: e.tpot_ms,
            gpu_id: e.gpu_id,
            batch_size: e.batch_size,
            cache_hit: e.cache_hit.map(u8::from),
            cache_prefix_tokens: e.cache_prefix_tokens,
            gpu_mem_peak_mb: e.gpu_mem_peak_mb,
            truncated: e.truncated.map(u8::from),
            prompt_hash: e.prompt_hash,
            max_tokens: e.max_tokens,
            schema_version: SCHEMA_VERSION as u8,
            kafka_topic: topic,
            kafka_partition: partition,
            kafka_offset: offset as u64,
            kafka_index: 0,
            ingested_at,
        }
    }

    /// Appends the row in ClickHouse's RowBinary format, in the column
    /// order of [`HOT`]: a batch holds its rows encoded (about
    /// 330 bytes a row, against about 750 as a `HotRow` with its strings),
    /// and the normalizing threads encode them. Checked against the
    /// `clickhouse` crate's own serializer of this struct on a real server
    /// (`tests/tests/ingest.rs`). Returns how many of the bytes written are
    /// the event itself (what two retries of one request share); the rest
    /// are its Kafka coordinates and ingest time.
    pub fn encode(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&self.day.to_le_bytes());
        out.extend_from_slice(&self.event_time.to_le_bytes());
        out.extend_from_slice(&self.timestamp_ms.to_le_bytes());
        put_str(out, &self.request_id);
        put_str(out, &self.business_line);
        put_str(out, &self.model_name);
        put_str(out, &self.model_version);
        out.extend_from_slice(&self.input_tokens.to_le_bytes());
        out.extend_from_slice(&self.output_tokens.to_le_bytes());
        out.extend_from_slice(&self.total_latency_ms.to_le_bytes());
        out.extend_from_slice(&self.error_code.to_le_bytes());
        put_nullable(out, self.error_stage, put_str);
        for text in [&self.user_id_hash, &self.tenant, &self.session_id, &self.request_type] {
            put_nullable(out, text.as_deref(), put_str);
        }
        for ms in [self.queue_wait_ms, self.prefill_time_ms, self.decode_time_ms, self.ttft_ms, self.tpot_ms] {
            put_nullable(out, ms, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        }
        for count in [self.gpu_id, self.batch_size] {
            put_nullable(out, count, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        }
        put_nullable(out, self.cache_hit, |out, v| out.push(v));
        put_nullable(out, self.cache_prefix_tokens, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        put_nullable(out, self.gpu_mem_peak_mb, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        put_nullable(out, self.truncated, |out, v| out.push(v));
        put_nullable(out, self.prompt_hash.as_deref(), put_str);
        put_nullable(out, self.max_tokens, |out, v| out.extend_from_slice(&v.to_le_bytes()));
        out.push(self.schema_version);
        let event = out.len() - start;
        put_str(out, &self.kafka_topic);
        out.extend_from_slice(&self.kafka_partition.to_le_bytes());
        out.extend_from_slice(&self.kafka_offset.to_le_bytes());
        out.extend_from_slice(&self.kafka_index.to_le_bytes());
        out.extend_from_slice(&self.ingested_at.to_le_bytes());
        event
    }
}

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
