//! The sink's requests. In: rows a batch (or a replay) encoded as
//! RowBinary, one UTC day of one shard. Out: the body of one INSERT, in
//! the table's order when the writer computed it ([`Order`]), and the row
//! that names it for a retry's landed check ([`FirstRow`]).

use std::sync::Arc;

use bytes::Bytes;

use crate::error::IngestError;
use crate::sort::Order;

/// The row that names an insert: one of its rows, by everything that
/// makes a hot row unique (its day, its message's Kafka coordinates and
/// its index in the message). A retry looks it up to learn whether the
/// attempt before landed. The coordinates alone do not name an insert:
/// the spans of one OTLP message can fall on two UTC days, and the two
/// days' inserts run side by side; the sibling's rows must not pass for
/// this insert's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstRow {
    pub day: u16,
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    /// The event's index in its message: 0 for a JSON event, the span's for OTLP.
    pub index: u32,
}

/// Rows of one UTC day, RowBinary-encoded, as one INSERT: `chunks` (one
/// per partition of the batch) are sent in `order` when it is set
/// ([`Order`], the table's sorting key, copied in pieces), else as they
/// are; `first` names the insert ([`FirstRow`]).
#[derive(Debug, Clone)]
pub struct EncodedRows {
    pub chunks: Vec<Bytes>,
    /// Per chunk, where each of its rows ends (empty: not known, the
    /// chunks go as they are); [`Order::of`] takes them.
    pub ends: Vec<Vec<u32>>,
    /// The rows in the table's order, once the writer computed it.
    pub order: Option<Arc<Order>>,
    pub first: FirstRow,
    pub rows: usize,
    /// The shard whose local table takes them (0 on one server).
    pub shard: usize,
}

impl EncodedRows {
    /// The insert's body: the rows in `order` when it is set, else the
    /// chunks as they are.
    pub fn body(&self) -> Box<dyn Iterator<Item = Bytes> + Send + '_> {
        match &self.order {
            Some(order) => Box::new(order.pieces(&self.chunks)),
            None => Box::new(self.chunks.iter().cloned()),
        }
    }

    /// Rows sent as they are, in one chunk (a replay's few rows): no
    /// order computed.
    pub fn whole(body: Vec<u8>, rows: usize, first: FirstRow, shard: usize) -> EncodedRows {
        EncodedRows { chunks: vec![Bytes::from(body)], ends: Vec::new(), order: None, first, rows, shard }
    }
}

/// A Kafka partition number as the tables store it (`UInt16`). Ingest
/// refuses a partition beyond it when it is assigned, so this never fails
/// on an owned partition; it is never cast.
pub fn table_partition(topic: &str, partition: i32) -> Result<u16, IngestError> {
    u16::try_from(partition).map_err(|_| {
        IngestError::Config(format!("partition {partition} of topic {topic} does not fit the tables' kafka_partition (UInt16, 0..=65535)"))
    })
}

/// The rejects log's day of a reject received at `received_ms`.
pub fn reject_day(received_ms: i64) -> u16 {
    // Receipt times are this host's clock: 1970..2149 fits.
    received_ms.div_euclid(inferlog_schema::timestamp::MS_PER_DAY).clamp(0, i64::from(u16::MAX)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_beyond_uint16_is_refused_not_cast() {
        assert_eq!(table_partition("t", 65_535).ok(), Some(65_535));
        let e = table_partition("t", 65_536).expect_err("too large");
        assert!(e.to_string().contains("partition 65536 of topic t"), "{e}");
    }
}
