//! Rejection reasons: the stable reason codes of docs/contract.md §1 and the rejection
//! value every stage passes around (DLQ headers, metrics labels, CLI findings).

use std::fmt;

/// Why an event was rejected. The string forms are a public contract: they
/// appear in DLQ headers, metric labels and `inferlog-schema check` output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReasonCode {
    /// The bytes are not valid JSON (or not UTF-8, nested too deeply, a key given twice).
    JsonMalformed,
    /// Valid JSON whose top level is not an object.
    JsonNotObject,
    /// A required field is absent or `null`.
    FieldMissing,
    /// A field has the wrong JSON type (a string where a number belongs, ...).
    FieldType,
    /// A value is outside its allowed range (negative tokens, too long a string, ...).
    FieldRange,
    /// A value has the right type but the wrong shape (bad characters, unparsable timestamp, ...).
    FieldFormat,
    /// A timestamp without a time-zone offset.
    TimestampNaive,
    /// A timestamp too far in the future, too old, or implausible (epoch seconds given as ms).
    TimestampOutOfRange,
    /// The same quantity given twice (two units, or a name and its alias) with values that disagree.
    UnitsConflict,
    /// Stage durations that cannot belong together (almost always seconds mixed with ms).
    UnitsInconsistent,
    /// An `error_code` that is not in the error dictionary.
    ErrorCodeUnknown,
    /// `error_code` is not 0 but `error_stage` is absent.
    ErrorStageMissing,
    /// An e-mail address or phone number in a text field.
    PiiDetected,
    /// The event is larger than the configured limit.
    EventTooLarge,
    /// Another event with the same `request_id` and different content was
    /// already stored (found by ingest, not by the event alone; an
    /// identical retry is a duplicate, not a rejection).
    RequestIdConflict,
    /// A message of a topic encoded as OTLP (`kafka.encodings`) that does
    /// not decode as OTLP traces in that encoding.
    OtlpMalformed,
}

impl ReasonCode {
    /// Every reason code, in contract order.
    pub const ALL: [ReasonCode; 16] = [
        ReasonCode::JsonMalformed,
        ReasonCode::JsonNotObject,
        ReasonCode::FieldMissing,
        ReasonCode::FieldType,
        ReasonCode::FieldRange,
        ReasonCode::FieldFormat,
        ReasonCode::TimestampNaive,
        ReasonCode::TimestampOutOfRange,
        ReasonCode::UnitsConflict,
        ReasonCode::UnitsInconsistent,
        ReasonCode::ErrorCodeUnknown,
        ReasonCode::ErrorStageMissing,
        ReasonCode::PiiDetected,
        ReasonCode::EventTooLarge,
        ReasonCode::RequestIdConflict,
        ReasonCode::OtlpMalformed,
    ];

    /// The reason codes one event earns on its own (what `inferlog-schema
    /// check` and the normalizer find): all but the last two,
    /// `request_id.conflict`, which needs the events stored before it, and
    /// `otlp.malformed`, which is about a message of spans, not an event.
    pub const EVENT: &'static [ReasonCode] = ReasonCode::ALL.split_at(ReasonCode::ALL.len() - 2).0;

    /// The stable string form (`field.missing`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            ReasonCode::JsonMalformed => "json.malformed",
            ReasonCode::JsonNotObject => "json.not_object",
            ReasonCode::FieldMissing => "field.missing",
            ReasonCode::FieldType => "field.type",
            ReasonCode::FieldRange => "field.range",
            ReasonCode::FieldFormat => "field.format",
            ReasonCode::TimestampNaive => "timestamp.naive",
            ReasonCode::TimestampOutOfRange => "timestamp.out_of_range",
            ReasonCode::UnitsConflict => "units.conflict",
            ReasonCode::UnitsInconsistent => "units.inconsistent",
            ReasonCode::ErrorCodeUnknown => "error_code.unknown",
            ReasonCode::ErrorStageMissing => "error_stage.missing",
            ReasonCode::PiiDetected => "pii.detected",
            ReasonCode::EventTooLarge => "event.too_large",
            ReasonCode::RequestIdConflict => "request_id.conflict",
            ReasonCode::OtlpMalformed => "otlp.malformed",
        }
    }

    /// Parses the stable string form.
    pub fn from_str_code(s: &str) -> Option<ReasonCode> {
        ReasonCode::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Placeholder field name for rejections about the whole event (malformed
/// JSON, oversize), so a finding always has a field column.
pub const WHOLE_EVENT: &str = "-";

/// A rejected event: the reason code, the field it is about (in the name
/// the producer used, or [`WHOLE_EVENT`]) and a human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: ReasonCode,
    pub field: String,
    pub message: String,
}

impl Rejection {
    pub fn new(reason: ReasonCode, field: impl Into<String>, message: impl Into<String>) -> Self {
        Rejection { reason, field: field.into(), message: message.into() }
    }

    pub fn whole_event(reason: ReasonCode, message: impl Into<String>) -> Self {
        Rejection::new(reason, WHOLE_EVENT, message)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.reason, self.field, self.message)
    }
}

impl std::error::Error for Rejection {}

#[cfg(test)]
mod tests {
    use super::ReasonCode;

    /// Every code round-trips through its string; the codes an event earns
    /// alone are all but `request_id.conflict`.
    #[test]
    fn codes_round_trip_and_events_alone_never_conflict() {
        for code in ReasonCode::ALL {
            assert_eq!(ReasonCode::from_str_code(code.as_str()), Some(code));
        }
        assert_eq!(ReasonCode::EVENT.len(), ReasonCode::ALL.len() - 2);
        assert!(!ReasonCode::EVENT.contains(&ReasonCode::RequestIdConflict));
        assert!(!ReasonCode::EVENT.contains(&ReasonCode::OtlpMalformed));
    }
}
