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
    let mut signs = Signs::default();
    text.bytes().for_each(|c| signs.add(c));
    signs.detect(text)
}

/// The cheap pre-check, taken byte by byte (so a caller that already
/// passes over a text's bytes takes it on the way): most values have
/// neither an '@' nor seven digits, and then hold no personal data.
#[derive(Debug, Default, Clone, Copy)]
pub struct Signs {
    at: bool,
    digits: usize,
}

impl Signs {
    #[inline]
    pub fn add(&mut self, c: u8) {
        self.at |= c == b'@';
        self.digits += usize::from(c.is_ascii_digit());
    }

    /// [`detect`] on `text`, whose every byte was added.
    pub fn detect(self, text: &str) -> Option<PiiKind> {
        let b = text.as_bytes();
        if self.at && email_spans(b).next().is_some() {
            return Some(PiiKind::Email);
        }
        if self.digits >= 7 && phone_spans(b).next().is_some() {
            return Some(PiiKind::Phone);
        }
        None
    }
}

/// `bytes` with every e-mail address and phone number that [`detect`]
/// would find replaced by `[email]` or `[phone]`; `None` when there is none.
/// For text that is not a JSON document (the rest of such bytes is kept).
pub fn mask(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut spans: Vec<(usize, usize, &[u8])> = email_spans(bytes).map(|(s, e)| (s, e, &b"[email]"[..])).collect();
    spans.extend(phone_spans(bytes).map(|(s, e)| (s, e, &b"[phone]"[..])));
    if spans.is_empty() {
        return None;
    }
    spans.sort_unstable();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    for (start, end, marker) in spans {
        if start < at {
            continue; // overlaps a span already masked
        }
        out.extend_from_slice(&bytes[at..start]);
        out.extend_from_slice(marker);
        at = end;
    }
    out.extend_from_slice(&bytes[at..]);
    Some(out)
}

fn is_local_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'%' | b'+' | b'-')
}

fn is_domain_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-')
}

/// `(start, end)` of every e-mail address.
fn email_spans(b: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    b.iter().enumerate().filter(|(_, &c)| c == b'@').filter_map(|(at, _)| {
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
        (local > 0 && tld_ok).then_some((at - local, at + 1 + domain.len()))
    })
}

/// `(start, end)` of every phone number.
fn phone_spans(b: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    (0..b.len()).filter_map(|start| {
        let boundary = start == 0 || !b[start - 1].is_ascii_alphanumeric();
        if !boundary {
            return None;
        }
        international_at(b, start).or_else(|| grouped_3_3_4_at(b, start)).map(|end| (start, end))
    })
}

/// `+` followed by 8–15 digits, optionally grouped by short runs (one or
/// two characters) of spaces, dots, hyphens or parentheses. Its end.
fn international_at(b: &[u8], start: usize) -> Option<usize> {
    let is_sep = |c: u8| matches!(c, b' ' | b'-' | b'.' | b'(' | b')');
    let mut digits = 0;
    let mut i = start + 1;
    if b[start] != b'+' {
        return None;
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
    ((8..=15).contains(&digits) && end_ok).then_some(i)
}

/// `(ddd) ddd-dddd`, `ddd-ddd-dddd`, `ddd.ddd.dddd` or `ddd ddd dddd`. Its end.
fn grouped_3_3_4_at(b: &[u8], start: usize) -> Option<usize> {
    let run = |at: usize, n: usize| b.get(at..at + n).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let ends_at = |at: usize| b.get(at).is_none_or(|c| !c.is_ascii_alphanumeric());
    if b[start] == b'(' {
        if !(run(start + 1, 3) && b.get(start + 4) == Some(&b')')) {
            return None;
        }
        let exchange = if b.get(start + 5) == Some(&b' ') { start + 6 } else { start + 5 };
        let ok = run(exchange, 3) && matches!(b.get(exchange + 3), Some(b'-' | b'.' | b' ')) && run(exchange + 4, 4) && ends_at(exchange + 8);
        return ok.then_some(exchange + 8);
    }
    let Some(&sep @ (b'-' | b'.' | b' ')) = b.get(start + 3) else {
        return None;
    };
    let ok = run(start, 3) && run(start + 4, 3) && b.get(start + 7) == Some(&sep) && run(start + 8, 4) && ends_at(start + 12);
    ok.then_some(start + 12)
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
    fn masks_what_it_detects_and_keeps_the_rest() {
        assert_eq!(
            mask(b"{\"user\": \"jane.doe@example.com\", \"tel\": \"+1 415 555 0100\", bad json").as_deref(),
            Some(&b"{\"user\": \"[email]\", \"tel\": \"[phone]\", bad json"[..])
        );
        assert_eq!(mask(b"call (555) 123-4567 or 555.123.4567.").as_deref(), Some(&b"call [phone] or [phone]."[..]));
        assert_eq!(mask(b"req-20250614-000123 2024-06-01 v1.2.3"), None, "nothing to mask");
        assert_eq!(
            mask(&[0xff, b' ', b'a', b'@', b'b', b'.', b'i', b'o', 0xfe]).as_deref(),
            Some(&[0xff, b' ', b'[', b'e', b'm', b'a', b'i', b'l', b']', 0xfe][..]),
            "not UTF-8"
        );
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
