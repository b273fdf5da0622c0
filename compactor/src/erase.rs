//! Erase stage. In: one archive object and the hashed user ids of an
//! erasure request. Out: how many of the object's rows hold those ids
//! ([`scan`], which reads the `user_id_hash` column only), or the object
//! written again under a new key without those rows
//! ([`Archiver::rewrite_without`]), read back and verified like every
//! archive object: the bytes as written, the footer's row count and schema
//! version, the fingerprint of the rows kept, and none of the ids left.
//!
//! The caller (`inferlog-retention erase`) swaps the manifest row and
//! deletes the old object; this stage never touches the catalog.

use std::collections::{BTreeSet, HashSet};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMillisecondType};
use arrow_array::{BooleanArray, RecordBatch, StringArray};
use futures_util::TryStreamExt;
use inferlog_store::catalog::ManifestEntry;
use inferlog_store::cold::ColdStore;
use inferlog_store::model::archive::in_current_schema;
use inferlog_store::Day;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};

use crate::archive::Archiver;
use crate::error::CompactorError;
use crate::verify::{verify_day, Expected, ReadBack};

/// The column erasure matches on.
const USER_COLUMN: &str = "user_id_hash";

/// What one object holds of an erasure request's users.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    pub rows: u64,
    /// Rows whose `user_id_hash` is one of the request's.
    pub held: u64,
    /// The key ids (before the `:`) of every hashed user id in the object.
    pub key_ids: BTreeSet<String>,
}

/// An object written again without a request's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    pub removed: u64,
    pub kept: u64,
    /// The new object's manifest row; `None` when no row was left (nothing written).
    pub entry: Option<ManifestEntry>,
}

/// The key an erasure request `request` writes `key` again under: the
/// same folder and part, `.e<request>` before `.parquet` (replacing the
/// mark of an earlier erasure), so a resumed run writes the same key.
pub fn erased_key(key: &str, request: &str) -> String {
    let stem = key.strip_suffix(".parquet").unwrap_or(key);
    let (folder, name) = stem.rsplit_once('/').unwrap_or(("", stem));
    let base = name.split_once(".e").map_or(name, |(b, _)| b);
    let folder = if folder.is_empty() { String::new() } else { format!("{folder}/") };
    format!("{folder}{base}.e{request}.parquet")
}

fn parquet_error(operation: &'static str, key: &str) -> impl Fn(parquet::errors::ParquetError) -> CompactorError {
    let key = key.to_owned();
    move |source| CompactorError::Parquet { operation, key: key.clone(), source }
}

/// Which rows of `batch` hold none of `hashes` (a null user id is kept).
fn keep_mask(users: &StringArray, hashes: &HashSet<String>) -> BooleanArray {
    users.iter().map(|u| Some(u.is_none_or(|u| !hashes.contains(u)))).collect()
}

fn user_column<'a>(batch: &'a RecordBatch, key: &str) -> Result<&'a StringArray, CompactorError> {
    batch.column_by_name(USER_COLUMN).and_then(|c| c.as_string_opt::<i32>()).ok_or_else(|| CompactorError::Archive {
        day: key.to_owned(),
        message: format!("{key} has no {USER_COLUMN} text column: not an inferlog archive object"),
    })
}

/// Reads the `user_id_hash` column of `key` (`size` bytes) and counts the rows holding `hashes`.
pub async fn scan(cold: &ColdStore, key: &str, size: u64, hashes: &HashSet<String>) -> Result<Scan, CompactorError> {
    let err = parquet_error("scan", key);
    let builder = ParquetRecordBatchStreamBuilder::new(cold.reader(key, size)).await.map_err(&err)?;
    let schema = builder.parquet_schema();
    let Some(leaf) = schema.columns().iter().position(|c| c.name() == USER_COLUMN) else {
        return Err(CompactorError::Archive { day: key.to_owned(), message: format!("{key} has no {USER_COLUMN} column") });
    };
    let mask = ProjectionMask::leaves(schema, [leaf]);
    let mut batches = builder.with_projection(mask).with_batch_size(65_536).build().map_err(&err)?;
    let mut found = Scan::default();
    while let Some(batch) = batches.try_next().await.map_err(&err)? {
        let users = user_column(&batch, key)?;
        found.rows += batch.num_rows() as u64;
        for user in users.iter().flatten() {
            if hashes.contains(user) {
                found.held += 1;
            }
            if let Some((id, _)) = user.split_once(':') {
                if !found.key_ids.contains(id) {
                    found.key_ids.insert(id.to_owned());
                }
            }
        }
    }
    Ok(found)
}

impl Archiver {
    /// Writes `object` (of `day`) again as `new_key` without the rows whose
    /// user is one of `hashes`, with the archive's schema and writer
    /// settings, then reads the new object back and verifies it. Writing
    /// the same object for the same request gives the same bytes, so a
    /// resumed run overwrites a half-written `new_key` with the same object.
    pub async fn rewrite_without(
        &self,
        day: Day,
        object: &ManifestEntry,
        hashes: &HashSet<String>,
        new_key: &str,
    ) -> Result<Rewritten, CompactorError> {
        let key = object.object_key.as_str();
        let err = parquet_error("rewrite", key);
        let builder = ParquetRecordBatchStreamBuilder::new(self.cold.reader(key, object.bytes)).await.map_err(&err)?;
        let part = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|e| e.key == "inferlog.part"))
            .and_then(|e| e.value.as_deref()?.parse::<u32>().ok())
            .unwrap_or(0);
        let mut batches = builder.with_batch_size(inferlog_store::model::archive::BATCH_ROWS).build().map_err(&err)?;
        let mut kept = ReadBack::default();
        let mut removed = 0u64;
        let mut open = None;
        while let Some(batch) = batches.try_next().await.map_err(&err)? {
            let mask = keep_mask(user_column(&batch, key)?, hashes);
            let filtered = arrow_select::filter::filter_record_batch(&batch, &mask)
                .map_err(|e| CompactorError::Archive { day: key.to_owned(), message: format!("filtering rows: {e}") })?;
            removed += (batch.num_rows() - filtered.num_rows()) as u64;
            if filtered.num_rows() == 0 {
                continue;
            }
            // The archive's own schema, without the file's metadata: a file of another schema fails
            // here (an object written before the sample columns gets them: `all`, weight 1).
            let rows = in_current_schema(filtered).map_err(|e| CompactorError::Verification {
                day: inferlog_store::day_string(day),
                key: key.to_owned(),
                message: format!("not the archive schema: {e}"),
            })?;
            // The archive schema's types, checked by `try_new` above.
            let column = |name: &str| rows.column_by_name(name).cloned().unwrap_or_else(|| rows.column(0).clone());
            let (ts, input, output, errors, weights) =
                (column("timestamp"), column("input_tokens"), column("output_tokens"), column("error_code"), column("sample_weight"));
            match (
                ts.as_primitive_opt::<TimestampMillisecondType>(),
                input.as_primitive_opt::<Int64Type>(),
                output.as_primitive_opt::<Int64Type>(),
                errors.as_primitive_opt::<Int32Type>(),
                weights.as_primitive_opt::<Int64Type>(),
            ) {
                (Some(ts), Some(input), Some(output), Some(errors), Some(weights)) => {
                    kept.add(ts.values(), input.values(), output.values(), errors.values(), weights.values())
                }
                _ => return Err(CompactorError::Archive { day: key.to_owned(), message: "the fingerprint columns are not the archive's".into() }),
            }
            if open.is_none() {
                open = Some(self.open(day, part, new_key.to_owned())?);
            }
            if let Some(o) = open.as_mut() {
                o.writer.write(&rows).await.map_err(parquet_error("write", new_key))?;
                o.rows += rows.num_rows() as u64;
            }
        }
        let Some(open) = open else {
            return Ok(Rewritten { removed, kept: 0, entry: None });
        };
        let written = self.close(open).await?;
        let mut entries = verify_day(
            &self.cold,
            day,
            std::slice::from_ref(&written),
            &Expected { fingerprint: kept.fingerprint(), represented_rows: kept.represented() },
        )
        .await?;
        let left = scan(&self.cold, new_key, written.bytes, hashes).await?;
        if left.held > 0 {
            return Err(CompactorError::Verification {
                day: inferlog_store::day_string(day),
                key: new_key.to_owned(),
                message: format!("{} rows of the erased users read back", left.held),
            });
        }
        let mut entry = entries.pop();
        if let Some(e) = entry.as_mut() {
            e.schema_version = object.schema_version;
        }
        Ok(Rewritten { removed, kept: written.rows, entry })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_erased_key_keeps_folder_and_part_and_replaces_an_earlier_mark() {
        assert_eq!(erased_key("p/dt=2026-11-20/part-0003.parquet", "r1"), "p/dt=2026-11-20/part-0003.er1.parquet");
        assert_eq!(erased_key("p/dt=2026-11-20/part-0003.er1.parquet", "r2"), "p/dt=2026-11-20/part-0003.er2.parquet");
        assert_eq!(erased_key("dt=2026-11-20/late-ab12-0000.parquet", "r1"), "dt=2026-11-20/late-ab12-0000.er1.parquet");
        assert_eq!(erased_key("dt=2026-11-20/part-0000.er1.parquet", "r1"), "dt=2026-11-20/part-0000.er1.parquet", "the same request, the same key");
    }

    #[test]
    fn the_mask_keeps_other_users_and_rows_without_one() {
        let users = StringArray::from(vec![Some("k:a"), None, Some("k:b"), Some("k:a")]);
        let hashes: HashSet<String> = ["k:a".to_owned()].into();
        assert_eq!(keep_mask(&users, &hashes), BooleanArray::from(vec![false, true, true, false]));
    }
}
