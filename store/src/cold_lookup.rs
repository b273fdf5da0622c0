//! Request ids in the archive. In: a day's manifest objects and a set of
//! request ids. Out: the archived rows holding one of them, by identity
//! (request id and source coordinates), reading only those five columns.
//! What `dlq replay` asks of a day already released from the hot tier
//! before it stores an event of it again.

use std::collections::HashSet;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use futures_util::TryStreamExt;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};

use crate::catalog::ManifestEntry;
use crate::cold::ColdStore;
use crate::dlq_ledger::Coordinates;
use crate::StoreError;

/// One archived row, by identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedKey {
    pub request_id: String,
    pub coordinates: Coordinates,
}

/// The identity columns; `kafka_index` is missing from objects written
/// before it existed (their rows' index is 0).
const COLUMNS: [&str; 5] = ["request_id", "kafka_topic", "kafka_partition", "kafka_offset", "kafka_index"];

/// The rows of `objects` whose request id is one of `ids`.
pub async fn find_request_ids(cold: &ColdStore, objects: &[ManifestEntry], ids: &HashSet<String>) -> Result<Vec<ArchivedKey>, StoreError> {
    let mut found = Vec::new();
    if ids.is_empty() {
        return Ok(found);
    }
    for object in objects {
        let key = object.object_key.as_str();
        let err = |operation: &'static str| move |source| StoreError::Parquet { operation, key: key.to_owned(), source };
        let builder = ParquetRecordBatchStreamBuilder::new(cold.reader(key, object.bytes)).await.map_err(err("open"))?;
        let schema = builder.parquet_schema();
        let leaves: Vec<usize> = schema.columns().iter().enumerate().filter(|(_, c)| COLUMNS.contains(&c.name())).map(|(i, _)| i).collect();
        let mask = ProjectionMask::leaves(schema, leaves);
        let mut batches = builder.with_projection(mask).with_batch_size(65_536).build().map_err(err("read"))?;
        while let Some(batch) = batches.try_next().await.map_err(err("read"))? {
            keys_in(&batch, ids, &mut found).map_err(|message| StoreError::Config(format!("archive object {key}: {message}")))?;
        }
    }
    Ok(found)
}

/// Appends the rows of `batch` whose request id is one of `ids`.
fn keys_in(batch: &RecordBatch, ids: &HashSet<String>, found: &mut Vec<ArchivedKey>) -> Result<(), String> {
    let column = |name: &str| batch.column_by_name(name).ok_or_else(|| format!("no {name} column: not an inferlog archive object"));
    let requests = column("request_id")?.as_string_opt::<i32>().ok_or("request_id is not text")?;
    let topics = column("kafka_topic")?.as_string_opt::<i32>().ok_or("kafka_topic is not text")?;
    let partitions = column("kafka_partition")?.as_primitive_opt::<Int32Type>().ok_or("kafka_partition is not Int32")?;
    let offsets = column("kafka_offset")?.as_primitive_opt::<Int64Type>().ok_or("kafka_offset is not Int64")?;
    let indexes = batch.column_by_name("kafka_index").and_then(|c| c.as_primitive_opt::<Int64Type>());
    for row in 0..batch.num_rows() {
        if requests.is_null(row) || !ids.contains(requests.value(row)) {
            continue;
        }
        found.push(ArchivedKey {
            request_id: requests.value(row).to_owned(),
            coordinates: Coordinates {
                topic: topics.value(row).to_owned(),
                partition: partitions.value(row),
                offset: offsets.value(row),
                index: indexes.map_or(0, |i| i.value(row) as u32),
            },
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int32Array, Int64Array, StringArray};
    use std::sync::Arc;

    fn batch(with_index: bool) -> RecordBatch {
        let mut columns: Vec<(&str, ArrayRef)> = vec![
            ("request_id", Arc::new(StringArray::from(vec!["a", "b", "c"]))),
            ("kafka_topic", Arc::new(StringArray::from(vec!["t", "t", "u"]))),
            ("kafka_partition", Arc::new(Int32Array::from(vec![0, 1, 2]))),
            ("kafka_offset", Arc::new(Int64Array::from(vec![10, 11, 12]))),
        ];
        if with_index {
            columns.push(("kafka_index", Arc::new(Int64Array::from(vec![0, 3, 4]))));
        }
        RecordBatch::try_from_iter(columns).expect("batch")
    }

    #[test]
    fn finds_the_rows_of_the_ids_with_their_coordinates() {
        let ids: HashSet<String> = ["b".to_owned(), "c".to_owned(), "zz".to_owned()].into();
        let mut found = Vec::new();
        keys_in(&batch(true), &ids, &mut found).expect("read");
        let got: Vec<(String, i64, u32)> = found.iter().map(|k| (k.request_id.clone(), k.coordinates.offset, k.coordinates.index)).collect();
        assert_eq!(got, vec![("b".into(), 11, 3), ("c".into(), 12, 4)]);
        found.clear();
        keys_in(&batch(false), &ids, &mut found).expect("an object before kafka_index");
        assert_eq!(found.iter().map(|k| k.coordinates.index).collect::<Vec<_>>(), vec![0, 0]);
    }
}
