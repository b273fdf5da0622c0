//! Retention policies and the one rule, shared by the compactor and
//! retention, that says when a day has expired from a tier.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Day;

/// How long a tier keeps a day: a number of days, or forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Days(u32),
    Forever,
}

impl Policy {
    /// Whether `day` is past this policy on `today`: a policy of N days
    /// keeps today and the N days before it; older days are expired
    /// (with 7 on 2026-11-29, 2026-11-22 is kept and 2026-11-21 expired).
    pub fn expired(self, day: Day, today: Day) -> bool {
        match self {
            Policy::Days(n) => day < today - n as Day,
            Policy::Forever => false,
        }
    }

    /// Whether this policy keeps every day at least as long as `other` does.
    pub fn outlives(self, other: Policy) -> bool {
        match (self, other) {
            (Policy::Forever, _) => true,
            (Policy::Days(_), Policy::Forever) => false,
            (Policy::Days(a), Policy::Days(b)) => a >= b,
        }
    }

    /// The newest expired day on `today`, if any day can expire.
    pub fn newest_expired(self, today: Day) -> Option<Day> {
        match self {
            Policy::Days(n) => Some(today - n as Day - 1),
            Policy::Forever => None,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Days(n) => write!(f, "{n}d"),
            Policy::Forever => f.write_str("forever"),
        }
    }
}

impl Serialize for Policy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Policy::Days(n) => s.serialize_u32(*n),
            Policy::Forever => s.serialize_str("forever"),
        }
    }
}

impl schemars::JsonSchema for Policy {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Policy".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A number of days, or \"forever\".",
            "anyOf": [{ "type": "integer", "minimum": 0 }, { "const": "forever" }]
        })
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Policy, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Policy;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of days (1-36500) or \"forever\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Policy, E> {
                if (1..=36_500).contains(&v) {
                    Ok(Policy::Days(v as u32))
                } else {
                    Err(E::custom(format!("{v} days is out of range 1-36500")))
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Policy, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Policy, E> {
                match v {
                    "forever" => Ok(Policy::Forever),
                    _ => match v.strip_suffix('d').unwrap_or(v).parse::<i64>() {
                        Ok(n) => self.visit_i64(n),
                        Err(_) => Err(E::custom(format!("{v:?} is neither a number of days nor \"forever\""))),
                    },
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_keeps_today_and_n_days_before() {
        let today = crate::parse_day("2026-11-29").expect("day");
        let seven = Policy::Days(7);
        assert!(!seven.expired(today - 7, today));
        assert!(seven.expired(today - 8, today));
        assert_eq!(seven.newest_expired(today), Some(today - 8));
        assert!(!Policy::Forever.expired(0, today));
        assert_eq!(Policy::Forever.newest_expired(today), None);
    }

    #[test]
    fn parses_days_and_forever() {
        #[derive(Deserialize)]
        struct T {
            p: Policy,
        }
        let p = |s: &str| toml::from_str::<T>(s).map(|t| t.p);
        assert_eq!(p("p = 7").expect("int"), Policy::Days(7));
        assert_eq!(p("p = \"30d\"").expect("suffix"), Policy::Days(30));
        assert_eq!(p("p = \"forever\"").expect("forever"), Policy::Forever);
        assert!(p("p = 0").is_err());
        assert!(p("p = \"never\"").is_err());
    }
}
