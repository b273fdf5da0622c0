//! The days a report covers. In: `--from` and `--to` (UTC days
//! `YYYY-MM-DD`, both included; default the 7 days through today) and
//! the current time. Out: [`Range`], the previous range of equal length the
//! report compares against.

use inferlog_store::Day;
use serde::Serialize;

use crate::error::ReportError;

/// Days shown when `--from` is not given.
pub const DEFAULT_DAYS: i32 = 7;

/// A range of UTC days, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub from: Day,
    pub to: Day,
}

/// The JSON form: both ends as `YYYY-MM-DD`.
#[derive(Debug, Clone, Serialize)]
pub struct RangeText {
    pub from: String,
    pub to: String,
    pub days: i32,
}

impl Range {
    /// Parses `--from`/`--to`; `today` is the default end.
    pub fn parse(from: Option<&str>, to: Option<&str>, today: Day) -> Result<Range, ReportError> {
        let day = |flag: &str, text: &str| {
            inferlog_store::parse_day(text).ok_or_else(|| ReportError::Usage(format!("{flag} {text:?} is not a UTC day YYYY-MM-DD")))
        };
        let to = match to {
            Some(t) => day("--to", t)?,
            None => today,
        };
        let from = match from {
            Some(f) => day("--from", f)?,
            None => to - (DEFAULT_DAYS - 1),
        };
        if from > to {
            return Err(ReportError::Usage(format!("--from {} is after --to {}", inferlog_store::day_string(from), inferlog_store::day_string(to))));
        }
        Ok(Range { from, to })
    }

    pub fn days(&self) -> i32 {
        self.to - self.from + 1
    }

    pub fn contains(&self, day: Day) -> bool {
        (self.from..=self.to).contains(&day)
    }

    pub fn iter(&self) -> impl Iterator<Item = Day> {
        self.from..=self.to
    }

    /// The range of equal length ending the day before this one starts.
    pub fn previous(&self) -> Range {
        Range { from: self.from - self.days(), to: self.from - 1 }
    }

    /// This range and the previous one together.
    pub fn with_previous(&self) -> Range {
        Range { from: self.previous().from, to: self.to }
    }

    pub fn text(&self) -> RangeText {
        RangeText { from: inferlog_store::day_string(self.from), to: inferlog_store::day_string(self.to), days: self.days() }
    }
}

/// Sorted `days` as runs of consecutive days: `2026-11-25..2026-11-28, 2026-11-30`.
pub fn runs_text(days: &[Day]) -> String {
    let mut runs: Vec<(Day, Day)> = Vec::new();
    for &d in days {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == d => *end = d,
            _ => runs.push((d, d)),
        }
    }
    let day = inferlog_store::day_string;
    runs.iter().map(|&(a, b)| if a == b { day(a) } else { format!("{}..{}", day(a), day(b)) }).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_default_to_the_week_through_today_and_compare_with_the_one_before() {
        let today = inferlog_store::parse_day("2026-12-01").expect("day");
        let r = Range::parse(None, None, today).expect("default");
        assert_eq!(r.text().from, "2026-11-25");
        assert_eq!((r.to, r.days()), (today, 7));
        assert_eq!(r.previous().text().from, "2026-11-18");
        assert_eq!(r.previous().to, r.from - 1);
        assert_eq!(r.with_previous().days(), 14);
        let one = Range::parse(Some("2026-11-30"), Some("2026-11-30"), today).expect("one day");
        assert_eq!(one.days(), 1);
        let err = Range::parse(Some("2026-12-02"), Some("2026-12-01"), today).expect_err("reversed");
        assert!(err.to_string().contains("--from 2026-12-02 is after --to 2026-12-01"), "{err}");
        assert!(Range::parse(Some("yesterday"), None, today).expect_err("bad").to_string().contains("--from \"yesterday\""));
    }
}
