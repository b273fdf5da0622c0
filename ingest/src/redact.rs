//! What the DLQ keeps of a rejected message. In: its original payload and
//! key, and `[kafka] dlq_payload`. Out: the payload and key to write, and,
//! when they differ from the original, the original's size and SHA-256.
//!
//! `redacted` (the default) keeps no plaintext personal data:
//! - a JSON document has every `user_id` replaced by its keyed hash (the
//!   form the hot tier stores, which normalizing leaves alone, so a
//!   replayed reject is hashed once), every prompt or completion field
//!   removed ([`CONTENT_FIELDS`]) after the prompt is hashed into
//!   `prompt_hash` as ingest hashes it (a producer's `prompt_hash` hashed
//!   under the key; else the first prompt field's text), so a replayed
//!   reject still counts as a repeat of its prompt, and every string (value or key) in which
//!   the PII detector finds an e-mail address or a phone number masked;
//! - anything else has its e-mail addresses and phone numbers masked;
//! - a key equal to the plaintext `user_id` is replaced by its hash, and
//!   a key's e-mail addresses and phone numbers are masked.
//!
//! `original` keeps the bytes as received.

use inferlog_schema::normalize::{prompt_text, CONTENT_FIELDS, PROMPT_FIELDS};
use inferlog_schema::{pii, UserIdHasher};
use inferlog_store::kafka::DlqPayload;
use serde_json::Value;
use sha2::Digest as _;

/// The original of a redacted payload: its size and hex SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original {
    pub bytes: usize,
    pub sha256: String,
}

/// What the DLQ writes for one reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    pub payload: Vec<u8>,
    pub key: Option<Vec<u8>>,
    /// Set when the payload is not the original.
    pub original: Option<Original>,
}

/// Applies `[kafka] dlq_payload`.
#[derive(Debug, Clone)]
pub struct Redactor {
    mode: DlqPayload,
    hasher: UserIdHasher,
}

const USER_ID: &str = "user_id";

impl Redactor {
    pub fn new(mode: DlqPayload, hasher: UserIdHasher) -> Redactor {
        Redactor { mode, hasher }
    }

    pub fn mode(&self) -> DlqPayload {
        self.mode
    }

    pub fn redact(&self, payload: &[u8], key: Option<&[u8]>) -> Redacted {
        if self.mode == DlqPayload::Original {
            return Redacted { payload: payload.to_vec(), key: key.map(<[u8]>::to_vec), original: None };
        }
        let mut user_ids = Vec::new();
        let redacted = match serde_json::from_slice::<Value>(payload) {
            // Written again only when something changed (serde_json orders keys).
            Ok(mut doc) => match self.prompt(&mut doc) | self.walk(&mut doc, &mut user_ids) {
                true => serde_json::to_vec(&doc).unwrap_or_default(),
                false => payload.to_vec(),
            },
            Err(_) => pii::mask(payload).unwrap_or_else(|| payload.to_vec()),
        };
        let key = key.map(|k| match std::str::from_utf8(k) {
            Ok(text) if user_ids.iter().any(|u| u == text) => self.hasher.hash(text).into_bytes(),
            _ => pii::mask(k).unwrap_or_else(|| k.to_vec()),
        });
        let original = (redacted != payload).then(|| Original { bytes: payload.len(), sha256: hex::encode(sha2::Sha256::digest(payload)) });
        Redacted { payload: redacted, key, original }
    }

    /// Redacts `value` in place; the plaintext user ids it hashed go to
    /// `user_ids`. Whether anything changed.
    fn walk(&self, value: &mut Value, user_ids: &mut Vec<String>) -> bool {
        match value {
            Value::String(s) => match mask_text(s) {
                Some(masked) => {
                    *s = masked;
                    true
                }
                None => false,
            },
            Value::Array(items) => items.iter_mut().fold(false, |changed, v| self.walk(v, user_ids) | changed),
            Value::Object(map) => {
                let mut changed = false;
                for (name, mut v) in std::mem::take(map) {
                    if CONTENT_FIELDS.contains(&name.as_str()) {
                        changed = true;
                        continue;
                    }
                    if name == USER_ID {
                        changed |= self.user_id(&mut v, user_ids);
                    } else {
                        changed |= self.walk(&mut v, user_ids);
                    }
                    match mask_text(&name) {
                        Some(masked) => {
                            changed = true;
                            map.insert(masked, v);
                        }
                        None => {
                            map.insert(name, v);
                        }
                    }
                }
                changed
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }

    /// Makes the event's prompt what the hot tier would store: its
    /// `prompt_hash` keyed (a digest under this key is kept), or one made
    /// from its first prompt field's text. Whether it changed.
    fn prompt(&self, doc: &mut Value) -> bool {
        const PROMPT_HASH: &str = "prompt_hash";
        let Value::Object(map) = doc else { return false };
        let hashed = match map.get(PROMPT_HASH) {
            Some(Value::String(s)) if self.hasher.is_own_digest(s) => return false,
            Some(Value::String(s)) if !s.trim().is_empty() => self.hasher.hash_prompt(s.trim()),
            Some(_) => return false,
            None => match PROMPT_FIELDS.iter().filter_map(|f| map.get(*f)).find_map(prompt_text) {
                Some(text) => self.hasher.hash_prompt(&text),
                None => return false,
            },
        };
        map.insert(PROMPT_HASH.to_owned(), Value::String(hashed));
        true
    }

    /// Makes a `user_id` value what the hot tier would store: its keyed
    /// hash (a digest under this key is kept; anything not a string is
    /// hashed in its JSON form). Whether it changed.
    fn user_id(&self, v: &mut Value, user_ids: &mut Vec<String>) -> bool {
        let text = match &mut *v {
            Value::Null => return false,
            Value::String(s) if self.hasher.is_own_digest(s) => return false,
            Value::String(s) => std::mem::take(s),
            other => other.to_string(),
        };
        *v = Value::String(self.hasher.hash(&text));
        user_ids.push(text);
        true
    }
}

fn mask_text(s: &str) -> Option<String> {
    pii::detect(s)?;
    pii::mask(s.as_bytes()).map(|m| String::from_utf8_lossy(&m).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor(mode: DlqPayload) -> Redactor {
        Redactor::new(mode, UserIdHasher::new(b"redact-test-key-0123456789abcdef", None, "test").expect("key"))
    }

    #[test]
    fn a_json_reject_keeps_no_user_id_pii_or_prompt_text() {
        let r = redactor(DlqPayload::Redacted);
        let payload = br#"{"request_id":"r-1","user_id":"alice-77","prompt":"hi, I am alice","tags":{"contact":"mail alice@example.com","user_id":42},"note":["+1 415 555 0100"],"input_tokens":-1}"#;
        let out = r.redact(payload, Some(b"alice-77"));
        let text = String::from_utf8(out.payload.clone()).expect("utf-8");
        for plaintext in ["alice-77", "alice@example.com", "555 0100", "hi, I am", "\"42\"", ":42"] {
            assert!(!text.contains(plaintext), "{plaintext} in {text}");
        }
        let doc: Value = serde_json::from_str(&text).expect("still JSON");
        let hasher = UserIdHasher::new(b"redact-test-key-0123456789abcdef", None, "test").expect("key");
        assert_eq!(doc["user_id"], hasher.hash("alice-77"), "the stored form");
        assert_eq!(doc["tags"]["user_id"], hasher.hash("42"));
        assert_eq!(doc["tags"]["contact"], "mail [email]");
        assert_eq!(doc["note"][0], "[phone]");
        assert_eq!((doc["request_id"].as_str(), doc["input_tokens"].as_i64()), (Some("r-1"), Some(-1)), "the rest is kept");
        assert!(doc.get("prompt").is_none());
        assert_eq!(doc["prompt_hash"], hasher.hash_prompt("hi, I am alice"), "the prompt is kept as its keyed hash only");
        assert_eq!(out.key.as_deref(), Some(hasher.hash("alice-77").as_bytes()), "a key that is the user id is hashed");
        let original = out.original.expect("changed");
        assert_eq!((original.bytes, original.sha256), (payload.len(), hex::encode(sha2::Sha256::digest(payload))));
        // Redacting the redacted leaves it alone: the digest is kept.
        assert_eq!(r.redact(&out.payload, None).payload, out.payload);
    }

    /// A replayed reject keeps its prompt's identity: the DLQ's
    /// `prompt_hash` is the one ingest stores for the event as sent.
    #[test]
    fn a_rejects_prompt_hash_is_the_one_ingest_would_store() {
        let key = b"redact-test-key-0123456789abcdef";
        let hasher = UserIdHasher::new(key, None, "test").expect("key");
        let contract = inferlog_schema::Contract::new(&inferlog_schema::ContractConfig::default()).expect("contract");
        let base = r#""request_id":"r-1","timestamp":"2026-12-01T10:00:00Z","model_name":"m","model_version":"v1","input_tokens":3,"output_tokens":4,"total_latency_ms":12.5,"error_code":0"#;
        for extra in [
            r#""messages":[{"role":"user","content":"hi"}],"prompt":"  plain  ""#,
            r#""messages":[{"content":"hi","role":"user"}]"#,
            r#""input":"q","prompt_hash":"sha256:abc""#,
        ] {
            let event = format!("{{{base},{extra}}}");
            let stored = contract.normalize(event.as_bytes(), None, &hasher).expect("valid").event.prompt_hash.expect("a prompt");
            let redacted = redactor(DlqPayload::Redacted).redact(event.as_bytes(), None);
            let doc: Value = serde_json::from_slice(&redacted.payload).expect("JSON");
            assert_eq!(doc["prompt_hash"], stored, "{extra}");
            assert!(["prompt", "messages", "input"].iter().all(|f| doc.get(*f).is_none()), "{doc}");
            let replayed = contract.normalize(&redacted.payload, None, &hasher).expect("valid").event.prompt_hash;
            assert_eq!(replayed.as_deref(), Some(stored.as_str()), "a replayed reject keeps the hash: {extra}");
        }
    }

    #[test]
    fn other_bytes_have_emails_and_phones_masked_and_original_mode_keeps_everything() {
        let r = redactor(DlqPayload::Redacted);
        let out = r.redact(b"{\"user\": jane@example.com, (555) 123-4567", Some(b"req-1"));
        assert_eq!(out.payload, b"{\"user\": [email], [phone]");
        assert_eq!(out.key.as_deref(), Some(&b"req-1"[..]));
        let clean = r.redact(b"{\"request_id\":\"r-2\",\"model_name\":\"m\"}", None);
        assert_eq!(clean.original, None, "nothing to redact: the original");
        let payload = br#"{"user_id":"bob","prompt":"x"}"#;
        let kept = redactor(DlqPayload::Original).redact(payload, Some(b"bob"));
        assert_eq!((kept.payload.as_slice(), kept.key.as_deref(), kept.original), (&payload[..], Some(&b"bob"[..]), None));
    }
}
