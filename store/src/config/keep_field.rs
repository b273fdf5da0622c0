//! The fields of a hot row a `[[sampling.keep]]` condition may name: the
//! `keep` columns of `store/hot_row.toml`. In: a field's name. Out:
//! [`KeepField`] and its [`FieldKind`], which validation checks a
//! condition's value against. A field's value in a row is the model's
//! (`model::keep_field`).

/// Numbers compare with any op; true/false and text with eq and ne.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    Number,
    Bool,
    Text,
}

include!(concat!(env!("OUT_DIR"), "/keep_fields.rs"));
