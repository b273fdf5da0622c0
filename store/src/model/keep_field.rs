//! A keep field's value in a stored row. In: a [`KeepField`] (the `keep`
//! columns of `store/hot_row.toml`, which `[[sampling.keep]]` names) and a
//! stored row. Out: its [`Value`].

use crate::config::KeepField;
use crate::model::stored::StoredRow;

/// A field's value in one row (`None`: the row does not carry it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Number(Option<f64>),
    Bool(Option<bool>),
    Text(Option<&'a str>),
}

include!(concat!(env!("OUT_DIR"), "/keep_values.rs"));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FieldKind;

    #[test]
    fn each_field_reads_its_column_with_its_kind() {
        let row = StoredRow::example();
        let cases = [
            ("input_tokens", FieldKind::Number, Value::Number(Some(10.0))),
            ("error_code", FieldKind::Number, Value::Number(Some(1003.0))),
            ("ttft_ms", FieldKind::Number, Value::Number(None)),
            ("gpu_id", FieldKind::Number, Value::Number(Some(3.0))),
            ("cache_hit", FieldKind::Bool, Value::Bool(Some(true))),
            ("truncated", FieldKind::Bool, Value::Bool(Some(false))),
            ("business_line", FieldKind::Text, Value::Text(Some("search"))),
            ("error_stage", FieldKind::Text, Value::Text(Some("decode"))),
            ("tenant", FieldKind::Text, Value::Text(Some("web"))),
        ];
        for (name, kind, value) in cases {
            let field = KeepField::parse(name).expect(name);
            assert_eq!((field.kind(), field.value(&row)), (kind, value), "{name}");
        }
        for name in ["request_id", "user_id_hash", "kafka_offset", "prompt_hash", "day", "nope"] {
            assert_eq!(KeepField::parse(name), None, "{name} is not a field a rule may test");
        }
    }
}
