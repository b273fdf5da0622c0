//! Timestamps: RFC 3339 text with an explicit offset, or integer epoch
//! milliseconds, in; UTC epoch milliseconds out. Also the inverse
//! (epoch ms to RFC 3339 UTC text) for output and partition names.
//!
//! Hand-written rather than chrono: it is on the per-event hot path, and it
//! must tell a naive timestamp (rejected as `timestamp.naive`) apart from a
//! malformed one (`field.format`), which general-purpose parsers do not.

/// Milliseconds in one UTC day.
pub const MS_PER_DAY: i64 = 86_400_000;

/// Why a timestamp string could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampError {
    /// A well-formed date and time with no offset (`2025-06-14 10:15:30`).
    Naive,
    /// Not a date-time at all, or an impossible one (`2025-02-30`).
    Malformed(&'static str),
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub const fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The (year, month, day) of a day number since 1970-01-01.
pub const fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

const fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

const fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(year) => 29,
        _ => 28,
    }
}

fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let s = b.get(at..at + n)?;
    let mut v = 0u32;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(c - b'0');
    }
    Some(v)
}

/// Parses an RFC 3339 date-time with an explicit offset to UTC epoch ms.
///
/// Accepts `T`, `t` or a space between date and time (RFC 3339 §5.6 note),
/// any number of fraction digits (truncated to ms), `Z`/`z` or `±hh:mm`
/// offsets, and a leap second (`:60`, counted into the next second as POSIX
/// time does).
pub fn parse_rfc3339_ms(s: &str) -> Result<i64, TimestampError> {
    let b = s.as_bytes();
    const BAD_DATE: TimestampError = TimestampError::Malformed("expected RFC 3339 (2025-06-14T10:15:30Z) or epoch milliseconds");
    let (year, month, day) = match (digits(b, 0, 4), b.get(4), digits(b, 5, 2), b.get(7), digits(b, 8, 2)) {
        (Some(y), Some(b'-'), Some(m), Some(b'-'), Some(d)) => (i64::from(y), m, d),
        _ => return Err(BAD_DATE),
    };
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return Err(TimestampError::Malformed("no such calendar date"));
    }
    if b.len() == 10 {
        // A bare date: no time and no zone.
        return Err(TimestampError::Naive);
    }
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return Err(BAD_DATE);
    }
    let (hour, minute, second) = match (digits(b, 11, 2), b.get(13), digits(b, 14, 2), b.get(16), digits(b, 17, 2)) {
        (Some(h), Some(b':'), Some(m), Some(b':'), Some(s)) => (h, m, s),
        _ => return Err(BAD_DATE),
    };
    if hour > 23 || minute > 59 || second > 60 {
        return Err(TimestampError::Malformed("hour, minute or second out of range"));
    }
    let mut i = 19;
    let mut millis = 0u32;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 3 {
                millis = millis * 10 + u32::from(b[i] - b'0');
            }
            i += 1;
        }
        match i - start {
            0 => return Err(TimestampError::Malformed("empty fraction of a second")),
            1 => millis *= 100,
            2 => millis *= 10,
            _ => {}
        }
    }
    let offset_minutes: i64 = match b.get(i) {
        None => return Err(TimestampError::Naive),
        Some(b'Z' | b'z') if b.len() == i + 1 => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let (oh, om) = match (digits(b, i + 1, 2), b.get(i + 3), digits(b, i + 4, 2)) {
                (Some(h), Some(b':'), Some(m), ..) if b.len() == i + 6 => (h, m),
                _ => return Err(TimestampError::Malformed("offset must be Z or ±hh:mm")),
            };
            if oh > 23 || om > 59 {
                return Err(TimestampError::Malformed("offset out of range"));
            }
            let total = i64::from(oh * 60 + om);
            if sign == b'+' {
                total
            } else {
                -total
            }
        }
        Some(_) => return Err(TimestampError::Malformed("unexpected characters after the time")),
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset_minutes * 60;
    Ok(secs * 1000 + i64::from(millis))
}

/// Formats UTC epoch ms as RFC 3339 with millisecond precision and `Z`.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let days = ms.div_euclid(MS_PER_DAY);
    let in_day = ms.rem_euclid(MS_PER_DAY);
    let (y, m, d) = civil_from_days(days);
    let (h, rest) = (in_day / 3_600_000, in_day % 3_600_000);
    let (min, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// The UTC day (`YYYY-MM-DD`) an epoch-ms instant falls in.
pub fn utc_day(ms: i64) -> String {
    let (y, m, d) = civil_from_days(ms.div_euclid(MS_PER_DAY));
    format!("{y:04}-{m:02}-{d:02}")
}

/// Parses `YYYY-MM-DD` to the epoch ms of its UTC midnight.
pub fn parse_day(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, m, d) = (digits(b, 0, 4)?, digits(b, 5, 2)?, digits(b, 8, 2)?);
    let y = i64::from(y);
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    Some(days_from_civil(y, m, d) * MS_PER_DAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trip_over_four_centuries() {
        for days in (-200_000..200_000).step_by(7) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn parses_offsets_and_fractions() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.5Z"), Ok(500));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.123456789Z"), Ok(123));
        assert_eq!(parse_rfc3339_ms("1970-01-01T05:45:00+05:45"), Ok(0));
        assert_eq!(parse_rfc3339_ms("1969-12-31T16:00:00-08:00"), Ok(0));
        assert_eq!(parse_rfc3339_ms("2024-02-29T12:00:00Z"), Ok(1_709_208_000_000));
        assert_eq!(parse_rfc3339_ms("2016-12-31T23:59:60Z"), parse_rfc3339_ms("2017-01-01T00:00:00Z"));
    }

    #[test]
    fn tells_naive_from_malformed() {
        assert_eq!(parse_rfc3339_ms("2025-06-14 10:15:30"), Err(TimestampError::Naive));
        assert_eq!(parse_rfc3339_ms("2025-06-14T10:15:30.250"), Err(TimestampError::Naive));
        assert_eq!(parse_rfc3339_ms("2025-06-14"), Err(TimestampError::Naive));
        assert!(matches!(parse_rfc3339_ms("2023-02-29T00:00:00Z"), Err(TimestampError::Malformed(_))));
        assert!(matches!(parse_rfc3339_ms("yesterday"), Err(TimestampError::Malformed(_))));
        assert!(matches!(parse_rfc3339_ms("2025-06-14T10:15:30+0800"), Err(TimestampError::Malformed(_))));
        assert!(matches!(parse_rfc3339_ms("2025-06-14T10:15:30ZZ"), Err(TimestampError::Malformed(_))));
    }

    #[test]
    fn formats_and_parses_back() {
        for ms in [0, 1_709_208_000_123, 4_102_444_799_999, 946_684_800_000] {
            assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms)), Ok(ms));
        }
        assert_eq!(utc_day(1_709_208_000_000), "2024-02-29");
        assert_eq!(parse_day("2024-02-29"), Some(1_709_164_800_000));
        assert_eq!(parse_day("2023-02-29"), None);
    }
}
