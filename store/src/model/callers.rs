//! The fold's account of each hashed caller's load hour by hour, part of
//! the one fold ([`crate::model::fold::DayFold::counting_callers`]). In:
//! one UTC day's rows ([`FoldRow`]: business line, hashed user, time,
//! tokens). Out: per business line × hashed caller, requests and input
//! plus output tokens in each hour of the day (the report's `spikes`: a
//! caller's last hour against the same hour of the days before). Rows
//! without a `user_id` are no caller. Hot days only: the aggregates keep
//! no users.

use std::collections::HashMap;

use crate::model::stored::FoldRow;

/// Requests and tokens in each hour (0..23) of a UTC day.
pub type HourLoad = [(u64, u64); 24];

/// A day's callers: (business line, hashed caller) → its load per hour.
pub type Callers = HashMap<(String, String), HourLoad>;

/// The callers part of a day's fold: per line, per caller.
#[derive(Debug, Default)]
pub struct CallerFold {
    lines: HashMap<String, HashMap<String, HourLoad>>,
}

impl CallerFold {
    /// Counts one row standing for `weight` requests.
    pub fn add(&mut self, row: &FoldRow<'_>, weight: u64) {
        let Some(caller) = row.user_id_hash.filter(|u| !u.is_empty()) else { return };
        let tokens = u64::from(row.input_tokens) + u64::from(row.output_tokens);
        let hour = ((row.timestamp_ms / 3_600_000) % 24) as usize;
        // Allocates for a line's and a caller's first row only.
        let line = entry(&mut self.lines, row.business_line, HashMap::new);
        let load = entry(line, caller, || [(0, 0); 24]);
        load[hour].0 += weight;
        load[hour].1 += weight * tokens;
    }

    pub fn finish(self) -> Callers {
        let mut callers = Callers::new();
        for (line, of_line) in self.lines {
            callers.extend(of_line.into_iter().map(|(caller, load)| ((line.clone(), caller), load)));
        }
        callers
    }
}

/// `map[key]`, inserting `new()` (and allocating the key) only when absent.
fn entry<'m, V>(map: &'m mut HashMap<String, V>, key: &str, new: impl FnOnce() -> V) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), new());
    }
    map.get_mut(key).unwrap_or_else(|| unreachable!("inserted above"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::stored::StoredRow;

    #[test]
    fn each_caller_of_each_line_counts_its_hours() {
        let mut fold = CallerFold::default();
        let day = 20_000 * 86_400_000_u64;
        for (line, user, hour, input) in
            [("s", Some("u1"), 3, 10), ("s", Some("u1"), 3, 20), ("s", Some("u1"), 23, 5), ("a", Some("u1"), 3, 1), ("s", None, 3, 9)]
        {
            let row = StoredRow {
                business_line: line,
                user_id_hash: user,
                timestamp_ms: day + hour * 3_600_000 + 7,
                input_tokens: input,
                output_tokens: 2,
                ..StoredRow::example()
            };
            fold.add(&row.fold_row(), 1);
        }
        let callers = fold.finish();
        assert_eq!(callers.len(), 2, "a row without a user is no caller");
        let s = &callers[&("s".to_owned(), "u1".to_owned())];
        assert_eq!((s[3], s[23], s[0]), ((2, 34), (1, 7), (0, 0)));
        assert_eq!(callers[&("a".to_owned(), "u1".to_owned())][3], (1, 3));
    }
}
