//! Personal-data detection in free-text fields: e-mail addresses and phone
//! numbers. In: one text value. Out: what was found, if anything.
//!
//! Phone detection must not fire on the digit runs that ids, dates and
//! versions are full of (`req-20250614-000123`, `2024-06-01`, UUIDs), so it
//! only matches shapes that people write phone numbers in: an international
//! `+` number, or the 3-3-4 grouping (`(555) 123-4567`, `555-123-4567`,
//! `555.123.4567`). A bare run of digits is never called a phone number.

/// What kind of personal data a text contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PiiKind {
    Email,
    Phone,
}

impl PiiKind {
    pub fn describe(self) -> &'static str {
        match self {
            PiiKind::Email => "contains an e-mail address",
            PiiKind::Phone => "contains a phone number",
        }
    }
}

/// Finds the first e-mail address or phone number in `text`.
pub fn detect(text: &str) -> Option<PiiKind> {
    let b = text.as_bytes();
    // Cheap pre-check in one pass: most values have neither '@' nor seven digits.
    let (mut has_at, mut digit_count) = (false, 0usize);
    for &c in b {
        has_at |= c == b'@';
        digit_count += usize::from(c.is_ascii_digit());
    }
    if has_at && contains_email(b) {
        return Some(PiiKind::Email);
    }
    if digit_count >= 7 && contains_phone(b) {
        return Some(PiiKind::Phone);
    }
    None
}

fn is_local_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'%' | b'+' | b'-')
}

fn is_domain_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-')
}

fn contains_email(b: &[u8]) -> bool {
    b.iter().enumerate().filter(|(_, &c)| c == b'@').any(|(at, _)| {
        let local = b[..at].iter().rev().take_while(|&&c| is_local_char(c)).count();
        let domain_len = b[at + 1..].iter().take_while(|&&c| is_domain_char(c)).count();
        let domain = b[at + 1..at + 1 + domain_len].strip_suffix(b".").unwrap_or(&b[at + 1..at + 1 + domain_len]);
        // A domain needs a dot and a top-level label of two or more letters.
        let tld_ok = match domain.iter().rposition(|&c| c == b'.') {
            Some(dot) if dot > 0 => {
                let tld = &domain[dot + 1..];
                tld.len() >= 2 && tld.iter().all(u8::is_ascii_alphabetic)
            }
            _ => false,
        };
        local > 0 && tld_ok
    })
}

fn contains_phone(b: &[u8]) -> bool {
    (0..b.len()).any(|start| {
        let boundary = start == 0 || !b[start - 1].is_ascii_alphanumeric();
        boundary && (international_at(b, start) || grouped_3_3_4_at(b, start))
    })
}

/// `+` followed by 8–15 digits, optionally grouped by short runs (one or
/// two characters) of spaces, dots, hyphens or parentheses.
fn international_at(b: &[u8], start: usize) -> bool {
    let is_sep = |c: u8| matches!(c, b' ' | b'-' | b'.' | b'(' | b')');
    let mut digits = 0;
    let mut i = start + 1;
    if b[start] != b'+' {
        return false;
    }
    loop {
        let run = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        if run == 0 {
            break;
        }
        digits += run;
        i += run;
        let seps = b[i..].iter().take_while(|&&c| is_sep(c)).count();
        if seps == 0 || seps > 2 || !b.get(i + seps).is_some_and(u8::is_ascii_digit) {
            break;
        }
        i += seps;
    }
    let end_ok = b.get(i).is_none_or(|c| !c.is_ascii_alphanumeric());
    (8..=15).contains(&digits) && end_ok
}

/// `(ddd) ddd-dddd`, `ddd-ddd-dddd`, `ddd.ddd.dddd` or `ddd ddd dddd`.
fn grouped_3_3_4_at(b: &[u8], start: usize) -> bool {
    let run = |at: usize, n: usize| b.get(at..at + n).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let ends_at = |at: usize| b.get(at).is_none_or(|c| !c.is_ascii_alphanumeric());
    if b[start] == b'(' {
        if !(run(start + 1, 3) && b.get(start + 4) == Some(&b')')) {
            return false;
        }
        let exchange = if b.get(start + 5) == Some(&b' ') { start + 6 } else { start + 5 };
        return run(exchange, 3) && matches!(b.get(exchange + 3), Some(b'-' | b'.' | b' ')) && run(exchange + 4, 4) && ends_at(exchange + 8);
    }
    let Some(&sep @ (b'-' | b'.' | b' ')) = b.get(start + 3) else {
        return false;
    };
    run(start, 3) && run(start + 4, 3) && b.get(start + 7) == Some(&sep) && run(start + 8, 4) && ends_at(start + 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_emails_and_phones() {
        for (text, kind) in [
            ("jane.doe@example.com", PiiKind::Email),
            ("contact: a+b@mail.example.co.uk.", PiiKind::Email),
            ("call +1 415 555 0100 now", PiiKind::Phone),
            ("+8613812345678", PiiKind::Phone),
            ("+44 (20) 7946-0958", PiiKind::Phone),
            ("(555) 123-4567", PiiKind::Phone),
            ("555-123-4567", PiiKind::Phone),
            ("tel 555.123.4567", PiiKind::Phone),
        ] {
            assert_eq!(detect(text), Some(kind), "{text}");
        }
    }

    #[test]
    fn leaves_ids_dates_and_versions_alone() {
        for text in [
            "req-20250614-000123456",
            "2024-06-01",
            "2025-06-14T10:15:30+08:00",
            "550e8400-e29b-41d4-a716-446655440000",
            "llama-3.1-70b-instruct",
            "v1.2.3-rc.4",
            "batch 12345678901234",
            "user@localhost",
            "sess-555-123-45678",
            "x+12345",
            "@handle",
        ] {
            assert_eq!(detect(text), None, "{text}");
        }
    }
}
