//! A unit's fold as the catalog keeps it until the day's units are merged.
//! In: the [`Folded`] of one unit's rows (what the compactor counts: the
//! daily groups, hours, errors and waste). Out: its record (JSON bytes, the
//! histograms in their Postgres form) for `compactor_unit_folds`, and the
//! [`Folded`] read back from it.

use serde::{Deserialize, Serialize};

use crate::model::fold::{ErrorRow, Folded, Group, Hour};
use crate::model::waste::{LineWaste, TypeWaste, Waste};
use inferlog_schema::{InputBucket, OutputBucket};

#[derive(Serialize, Deserialize)]
struct FoldRecord {
    rows: u64,
    /// (business line, model, version, input bucket, output bucket, group).
    daily: Vec<(String, String, String, String, String, Group)>,
    hours: Vec<Hour>,
    errors: Vec<ErrorRow>,
    waste: Option<WasteRecord>,
}

#[derive(Serialize, Deserialize)]
struct WasteRecord {
    sampled: bool,
    lines: Vec<(String, LineWaste)>,
    /// (business line, request type, waste).
    types: Vec<(String, String, TypeWaste)>,
}

impl Folded {
    /// The record of this fold (users, callers, request types, GPUs and
    /// the repeated prompts are not kept: the compactor counts none of them,
    /// and the day's repeats come from the whole day).
    pub fn record(&self) -> Vec<u8> {
        let record = FoldRecord {
            rows: self.rows,
            daily: self
                .daily
                .iter()
                .map(|((l, m, v, i, o), g)| (l.clone(), m.clone(), v.clone(), (*i).to_owned(), (*o).to_owned(), g.clone()))
                .collect(),
            hours: self.hours.clone(),
            errors: self.errors.clone(),
            waste: self.waste.as_ref().map(|w| WasteRecord {
                sampled: w.sampled,
                lines: w.lines.iter().map(|(l, w)| (l.clone(), *w)).collect(),
                types: w.types.iter().map(|((l, t), w)| (l.clone(), t.clone(), w.clone())).collect(),
            }),
        };
        serde_json::to_vec(&record).unwrap_or_default()
    }

    /// Reads [`Folded::record`]'s bytes back; why not, when they do not decode.
    pub fn from_record(bytes: &[u8]) -> Result<Folded, String> {
        let record: FoldRecord = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let input = |name: &str| InputBucket::ALL.iter().map(|b| b.as_str()).find(|b| *b == name).ok_or(format!("input bucket {name:?}"));
        let output = |name: &str| OutputBucket::ALL.iter().map(|b| b.as_str()).find(|b| *b == name).ok_or(format!("output bucket {name:?}"));
        let mut daily = std::collections::HashMap::with_capacity(record.daily.len());
        for (l, m, v, i, o, g) in record.daily {
            daily.insert((l, m, v, input(&i)?, output(&o)?), g);
        }
        Ok(Folded {
            rows: record.rows,
            daily,
            hours: record.hours,
            errors: record.errors,
            waste: record.waste.map(|w| Waste {
                sampled: w.sampled,
                lines: w.lines.into_iter().collect(),
                repeated: Default::default(),
                types: w.types.into_iter().map(|(l, t, w)| ((l, t), w)).collect(),
            }),
            ..Folded::default()
        })
    }
}
