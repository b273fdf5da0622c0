//! The user's keep rules of the sampled archive. In: `[[sampling.keep]]`
//! (validated at start-up) and a stored row. Out: the name of the first
//! rule whose every condition the row meets, if any: its `sample_reason`.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use crate::config::{CompareOp, ConditionValue, KeepField, KeepRule};
use crate::error::StoreError;
use crate::model::keep_field::Value;
use crate::model::stored::StoredRow;

#[derive(Debug, Clone, PartialEq)]
struct Test {
    field: KeepField,
    op: CompareOp,
    value: ConditionValue,
}

impl Test {
    fn holds(&self, row: &StoredRow<'_>) -> bool {
        use std::cmp::Ordering::*;
        let ordering = match (self.field.value(row), &self.value) {
            (Value::Number(Some(v)), ConditionValue::Number(w)) => v.partial_cmp(w),
            (Value::Bool(Some(v)), ConditionValue::Bool(w)) => Some(v.cmp(w)),
            (Value::Text(Some(v)), ConditionValue::Text(w)) => Some(v.cmp(w.as_str())),
            // Absent from the row (or a kind validation refused): not met.
            _ => None,
        };
        matches!(
            (self.op, ordering),
            (CompareOp::Eq, Some(Equal))
                | (CompareOp::Ne, Some(Less | Greater))
                | (CompareOp::Gt, Some(Greater))
                | (CompareOp::Ge, Some(Greater | Equal))
                | (CompareOp::Lt, Some(Less))
                | (CompareOp::Le, Some(Less | Equal))
        )
    }
}

/// A keep rule ready to test rows, with the rule as configured (recorded
/// with each day it archives).
#[derive(Debug, Clone, PartialEq)]
pub struct Keep {
    pub rule: KeepRule,
    reason: &'static str,
    tests: Vec<Test>,
}

impl Keep {
    pub fn new(rule: &KeepRule) -> Result<Keep, StoreError> {
        rule.validate()?;
        let tests = rule
            .when
            .iter()
            .map(|c| {
                let field = KeepField::parse(&c.field).ok_or_else(|| StoreError::Config(format!("sampling.keep field {:?} is unknown", c.field)))?;
                Ok(Test { field, op: c.op, value: c.value.clone() })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Keep { rule: rule.clone(), reason: intern(&rule.reason), tests })
    }

    /// The reason of the rows it keeps.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// Whether `row` meets every condition.
    pub fn keeps(&self, row: &StoredRow<'_>) -> bool {
        self.tests.iter().all(|t| t.holds(row))
    }
}

/// The one copy of a reason's name for the process: reasons are few (the
/// configured rules and those recorded with archived days), and a
/// [`crate::model::sample::Reason`] stays `Copy`.
fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = names.get(name) {
        return found;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Condition;

    fn keep(conditions: Vec<(&str, CompareOp, ConditionValue)>) -> Keep {
        let when = conditions.into_iter().map(|(f, op, value)| Condition { field: f.into(), op, value }).collect();
        Keep::new(&KeepRule { reason: "cache_miss_long".into(), when }).expect("valid")
    }

    #[test]
    fn a_row_is_kept_when_it_meets_every_condition_and_carries_each_field() {
        let rule = keep(vec![
            ("cache_hit", CompareOp::Eq, ConditionValue::Bool(false)),
            ("input_tokens", CompareOp::Gt, ConditionValue::Number(8000.0)),
            ("model_name", CompareOp::Ne, ConditionValue::Text("tiny".into())),
        ]);
        let base = StoredRow { input_tokens: 9000, cache_hit: Some(0), model_name: "big", ..StoredRow::example() };
        assert!(rule.keeps(&base));
        assert!(!rule.keeps(&StoredRow { input_tokens: 8000, ..base }), "8000 is not > 8000");
        assert!(!rule.keeps(&StoredRow { cache_hit: Some(1), ..base }));
        assert!(!rule.keeps(&StoredRow { cache_hit: None, ..base }), "a row without cache_hit does not meet it");
        assert!(!rule.keeps(&StoredRow { model_name: "tiny", ..base }));
        assert_eq!(rule.reason(), "cache_miss_long");
        assert!(std::ptr::eq(rule.reason(), keep(vec![("ttft_ms", CompareOp::Ge, ConditionValue::Number(1.0))]).reason()), "one copy");
        let ge = keep(vec![("ttft_ms", CompareOp::Ge, ConditionValue::Number(100.0))]);
        assert!(ge.keeps(&StoredRow { ttft_ms: Some(100.0), ..base }) && !ge.keeps(&StoredRow { ttft_ms: Some(99.9), ..base }));
        let le = keep(vec![
            ("error_code", CompareOp::Le, ConditionValue::Number(0.0)),
            ("request_type", CompareOp::Eq, ConditionValue::Text("code".into())),
        ]);
        assert!(le.keeps(&StoredRow { error_code: 0, request_type: Some("code"), ..base }));
        assert!(!le.keeps(&StoredRow { error_code: 0, request_type: None, ..base }));
    }
}
