//! Configuration of the event contract (the `[schema]` table of the
//! inferlog config file) and the loader every inferlog command uses: one
//! TOML file, then `INFERLOG_<TABLE>__<KEY>` environment overrides.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::SchemaError;

/// The `[schema]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ContractConfig {
    /// Largest accepted event, in bytes. Default: 65536 (64 KiB).
    pub max_event_bytes: usize,
    /// How far past "now" an event timestamp may lie. Default: "5m".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub max_future_skew: Duration,
    /// How old an event may be when ingested; keep it equal to the hot-tier
    /// retention so nothing is written that retention would drop at once.
    /// Default: "7d".
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub max_event_age: Duration,
    /// Error codes added to the default dictionary (0 ok, 1001–1008), as
    /// `"code" = "name"`. Default: none.
    pub error_codes: BTreeMap<String, String>,
    /// Id stored with every user hash, for key rotation. Default: the first
    /// 8 hex digits of SHA-256 of the key.
    pub hash_key_id: Option<String>,
}

impl Default for ContractConfig {
    fn default() -> Self {
        ContractConfig {
            max_event_bytes: 64 * 1024,
            max_future_skew: Duration::from_secs(5 * 60),
            max_event_age: Duration::from_secs(7 * 86_400),
            error_codes: BTreeMap::new(),
            hash_key_id: None,
        }
    }
}

/// The default error dictionary of docs/contract.md §1.
pub const DEFAULT_ERROR_CODES: [(i32, &str); 9] = [
    (0, "ok"),
    (1001, "gpu_oom"),
    (1002, "context_length_exceeded"),
    (1003, "timeout"),
    (1004, "engine_error"),
    (1005, "rate_limited"),
    (1006, "engine_restart"),
    (1007, "invalid_request"),
    (1008, "cancelled"),
];

/// Known error codes and their names, sorted by code.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorDictionary {
    entries: Vec<(i32, String)>,
}

impl ErrorDictionary {
    pub fn get(&self, code: i32) -> Option<&str> {
        self.entries.binary_search_by_key(&code, |(c, _)| *c).ok().map(|i| self.entries[i].1.as_str())
    }

    pub fn entries(&self) -> &[(i32, String)] {
        &self.entries
    }
}

impl ContractConfig {
    /// The one validation step: checks every setting and builds the error
    /// dictionary. Called once at start-up by every command.
    pub fn validate(&self) -> Result<ErrorDictionary, SchemaError> {
        let invalid = |message: String| SchemaError::ConfigInvalid { origin: "[schema]".into(), message };
        if !(256..=16 * 1024 * 1024).contains(&self.max_event_bytes) {
            return Err(invalid(format!("max_event_bytes = {} must be between 256 and 16777216", self.max_event_bytes)));
        }
        if self.max_event_age.is_zero() {
            return Err(invalid("max_event_age must be more than 0".into()));
        }
        let mut entries: Vec<(i32, String)> = DEFAULT_ERROR_CODES.iter().map(|(c, n)| (*c, (*n).to_owned())).collect();
        for (code, name) in &self.error_codes {
            let code: i32 = code.trim().parse().map_err(|_| invalid(format!("error_codes: {code:?} is not an integer code")))?;
            let name = name.trim();
            if name.is_empty() || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                return Err(invalid(format!("error_codes.{code}: name {name:?} must be non-empty [A-Za-z0-9_]")));
            }
            match entries.iter().find(|(c, _)| *c == code) {
                Some((_, existing)) if existing != name => {
                    return Err(invalid(format!("error_codes.{code} = {name:?} redefines the built-in {existing:?}")))
                }
                Some(_) => {}
                None => entries.push((code, name.to_owned())),
            }
        }
        entries.sort_by_key(|(c, _)| *c);
        Ok(ErrorDictionary { entries })
    }
}

/// Declares everything one binary reads from the config file, once: a
/// field per table, named as the table. Generates the struct (with
/// `Default`), `SECTIONS` (the tables it reads: the example config's
/// "Read by" lines are derived from them) and `load` (the file with its
/// `INFERLOG_<TABLE>__<KEY>` overrides, each table deserialized with its
/// unknown keys refused, then the binary's one validation step, its
/// `validate`). The error type must convert from [`SchemaError`].
///
/// ```ignore
/// inferlog_schema::binary_config! {
///     /// Everything the compactor reads.
///     pub struct Config: CompactorError {
///         schema: ContractConfig,
///         compactor: CompactorConfig,
///     }
/// }
/// ```
#[macro_export]
macro_rules! binary_config {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident : $error:ty {
            $( $(#[$field_meta:meta])* $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Default)]
        $vis struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl $name {
            /// The tables of the config file this binary reads, in field order.
            pub const SECTIONS: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Loads the file at `path`, applies environment overrides and validates once.
            pub fn load(path: &::std::path::Path) -> ::std::result::Result<$name, $error> {
                let root = $crate::config::load_config_value(Some(path), ::std::env::vars()).map_err(<$error>::from)?;
                let config = $name { $( $field: $crate::config::section(&root, stringify!($field)).map_err(<$error>::from)?, )* };
                config.validate()?;
                Ok(config)
            }
        }
    };
}

/// Environment variables that carry secrets, never config overrides.
const SECRET_VARIABLES: [&str; 2] = [crate::hash::KEY_ENV, crate::hash::KEY_FILE_ENV];

/// Reads a config file (or an empty config when `path` is `None`) and
/// applies `INFERLOG_<TABLE>__<KEY>=value` overrides from `vars` (`__`
/// separates nesting levels; names are lower-cased; values are read as TOML
/// scalars when they parse as one, else as strings).
pub fn load_config_value(path: Option<&Path>, vars: impl IntoIterator<Item = (String, String)>) -> Result<toml::Table, SchemaError> {
    let mut root = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| SchemaError::ConfigUnreadable { path: path.to_owned(), source })?;
            text.parse::<toml::Table>().map_err(|e| SchemaError::ConfigInvalid { origin: path.display().to_string(), message: e.to_string() })?
        }
        None => toml::Table::new(),
    };
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix("INFERLOG_") else { continue };
        if SECRET_VARIABLES.contains(&name.as_str()) || !rest.contains("__") {
            continue;
        }
        let segments: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        set_path(&mut root, &segments, parse_scalar(&value))
            .map_err(|message| SchemaError::ConfigInvalid { origin: format!("environment variable {name}"), message })?;
    }
    Ok(root)
}

fn parse_scalar(value: &str) -> toml::Value {
    format!("v = {value}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).unwrap_or_else(|| toml::Value::String(value.to_owned()))
}

fn set_path(table: &mut toml::Table, segments: &[String], value: toml::Value) -> Result<(), String> {
    match segments {
        [] => Err("empty name".into()),
        [last] => {
            table.insert(last.clone(), value);
            Ok(())
        }
        [first, rest @ ..] => {
            let entry = table.entry(first.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            match entry {
                toml::Value::Table(inner) => set_path(inner, rest, value),
                _ => Err(format!("{first} is not a table")),
            }
        }
    }
}

/// Deserializes one table of a loaded config (`[schema]`, `[ingest]`, ...),
/// or its defaults when the table is absent.
pub fn section<T: serde::de::DeserializeOwned + Default>(root: &toml::Table, name: &str) -> Result<T, SchemaError> {
    match root.get(name) {
        None => Ok(T::default()),
        Some(value) => {
            value.clone().try_into().map_err(|e: toml::de::Error| SchemaError::ConfigInvalid { origin: format!("[{name}]"), message: e.to_string() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_extensions_merge() {
        let dict = ContractConfig::default().validate().expect("defaults are valid");
        assert_eq!(dict.get(1001), Some("gpu_oom"));
        assert_eq!(dict.get(2001), None);
        let config = ContractConfig { error_codes: BTreeMap::from([("2001".into(), "quota_exceeded".into())]), ..ContractConfig::default() };
        assert_eq!(config.validate().expect("valid").get(2001), Some("quota_exceeded"));
    }

    #[test]
    fn rejects_bad_settings() {
        for config in [
            ContractConfig { max_event_bytes: 10, ..ContractConfig::default() },
            ContractConfig { error_codes: BTreeMap::from([("x".into(), "y".into())]), ..ContractConfig::default() },
            ContractConfig { error_codes: BTreeMap::from([("1001".into(), "oom".into())]), ..ContractConfig::default() },
        ] {
            assert!(matches!(config.validate(), Err(SchemaError::ConfigInvalid { .. })), "{config:?}");
        }
    }

    #[test]
    fn environment_overrides_the_file_and_skips_secrets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[schema]\nmax_event_bytes = 1000\nmax_future_skew = \"1m\"\n").expect("write");
        let vars = [
            ("INFERLOG_SCHEMA__MAX_EVENT_BYTES".to_owned(), "2048".to_owned()),
            ("INFERLOG_HASH_KEY".to_owned(), "secret-never-config".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
        ];
        let root = load_config_value(Some(&path), vars).expect("loads");
        let config: ContractConfig = section(&root, "schema").expect("parses");
        assert_eq!(config.max_event_bytes, 2048);
        assert_eq!(config.max_future_skew, Duration::from_secs(60));
        assert!(!format!("{root:?}").contains("secret-never-config"));
        let unknown = "[schema]\nmax_bytes = 3\n".parse::<toml::Table>().expect("toml");
        assert!(section::<ContractConfig>(&unknown, "schema").is_err());
    }
}
