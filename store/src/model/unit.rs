//! A closed day cut into units that compactors archive independently. In:
//! the day's row count and `[compactor] unit_max_rows`. Out: how many units
//! the day is planned in, and for each [`Unit`] the condition on the hot
//! table that selects its rows.
//!
//! The split needs no coordination and no read of the rows: unit `i` of
//! `n` holds the rows whose `cityHash64(request_id)` falls in the `i`-th of
//! `n` equal ranges of the 64-bit hash space, so the same rows make the
//! same units whoever reads them, and the units are disjoint and cover the
//! day. Hashes spread evenly, so each unit holds about `rows / n` rows.

/// Unit `index` of a day planned in `of` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unit {
    pub index: u32,
    pub of: u32,
}

impl Unit {
    /// The whole day as one unit (no condition on the rows).
    pub const WHOLE_DAY: Unit = Unit { index: 0, of: 1 };

    /// How many units a day of `rows` rows is planned in: the fewest of at
    /// most `max_rows` rows each (at least one; `max_rows` 0 means one).
    pub fn count(rows: u64, max_rows: u64) -> u32 {
        if max_rows == 0 {
            return 1;
        }
        u32::try_from(rows.div_ceil(max_rows)).unwrap_or(u32::MAX).max(1)
    }

    /// Every unit of a day planned in `of`.
    pub fn all(of: u32) -> impl Iterator<Item = Unit> {
        (0..of.max(1)).map(move |index| Unit { index, of: of.max(1) })
    }

    /// The unit's range of `cityHash64(request_id)`: `[lo, hi)`, `hi` none
    /// for the last.
    pub fn hash_range(self) -> (u64, Option<u64>) {
        let bound = |i: u32| ((u128::from(i) << 64) / u128::from(self.of.max(1))) as u64;
        (bound(self.index), (self.index + 1 < self.of).then(|| bound(self.index + 1)))
    }

    /// The condition on the hot table's rows, to follow `AND` (`1` for the
    /// whole day, so a one-unit day is read as it always was).
    pub fn condition(self) -> String {
        if self.of <= 1 {
            return "1".into();
        }
        match self.hash_range() {
            (lo, Some(hi)) => format!("cityHash64(request_id) >= {lo} AND cityHash64(request_id) < {hi}"),
            (lo, None) => format!("cityHash64(request_id) >= {lo}"),
        }
    }

    /// Whether the unit holds a row whose `cityHash64(request_id)` is `hash`.
    pub fn holds(self, hash: u64) -> bool {
        match self.hash_range() {
            (lo, Some(hi)) => lo <= hash && hash < hi,
            (lo, None) => lo <= hash,
        }
    }

    /// `i/n`, as logs and the catalog name it.
    pub fn name(self) -> String {
        format!("{}/{}", self.index, self.of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_is_cut_in_the_fewest_units_of_at_most_max_rows() {
        assert_eq!(Unit::count(0, 100), 1);
        assert_eq!(Unit::count(100, 100), 1);
        assert_eq!(Unit::count(101, 100), 2);
        assert_eq!(Unit::count(1_000_000, 125_000), 8);
        assert_eq!(Unit::count(1_000_000, 0), 1, "0: one unit");
    }

    #[test]
    fn the_units_ranges_are_disjoint_and_cover_every_hash() {
        for of in [1, 2, 3, 7, 8, 1000] {
            let units: Vec<Unit> = Unit::all(of).collect();
            assert_eq!(units[0].hash_range().0, 0);
            for pair in units.windows(2) {
                assert_eq!(pair[0].hash_range().1, Some(pair[1].hash_range().0), "adjacent ({of})");
            }
            assert_eq!(units.last().map(|u| u.hash_range().1), Some(None), "the last is open ({of})");
            for hash in [0, 1, u64::MAX / 3, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                assert_eq!(units.iter().filter(|u| u.holds(hash)).count(), 1, "{hash} in one unit of {of}");
            }
        }
        assert_eq!(Unit::WHOLE_DAY.condition(), "1");
        assert_eq!(Unit { index: 1, of: 2 }.condition(), "cityHash64(request_id) >= 9223372036854775808");
    }
}
