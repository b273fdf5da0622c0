//! What an operator deploys beyond one machine. In: the config types of
//! every component (their doc comments and `Default`s). Out: the example
//! config, `deploy/inferlog.example.toml`, with every setting and its
//! documentation, generated so that it cannot drift from the code (a test
//! compares the committed file with [`example_config`]).
//!
//! The systemd units, alert rules and the scaling page sit next to this
//! crate in `deploy/`; they are files, not code.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::Serialize;

/// One table of the config file: its name, which binaries read it, and the
/// documentation and defaults of its type.
#[derive(Debug)]
pub struct Section {
    pub name: &'static str,
    /// The binaries whose config has this table ([`READERS`]), comma-separated.
    pub read_by: String,
    schema: serde_json::Value,
    defaults: toml::Table,
}

/// Every binary and the tables it reads, as its own config type declares
/// them (`inferlog-schema` reads `[schema]` alone).
pub const READERS: [(&str, &[&str]); 5] = [
    ("ingest", inferlog_ingest::Config::SECTIONS),
    ("compactor", inferlog_compactor::Config::SECTIONS),
    ("retention", inferlog_retention::Config::SECTIONS),
    ("report", inferlog_report::Config::SECTIONS),
    ("inferlog-schema", &["schema"]),
];

impl Section {
    fn of<T: JsonSchema + Serialize + Default>(name: &'static str) -> Section {
        let schema = schemars::schema_for!(T).to_value();
        let defaults = toml::Table::try_from(T::default()).unwrap_or_else(|e| panic!("[{name}] defaults are not a TOML table: {e}"));
        let readers: Vec<&str> = READERS.iter().filter(|(_, tables)| tables.contains(&name)).map(|(binary, _)| *binary).collect();
        Section { name, read_by: readers.join(", "), schema, defaults }
    }

    /// The doc comment of the table's type.
    pub fn description(&self) -> &str {
        self.schema["description"].as_str().unwrap_or("")
    }

    /// `(key, doc comment)` of every setting, in key order.
    pub fn settings(&self) -> Vec<(&str, &str)> {
        let Some(properties) = self.schema["properties"].as_object() else {
            return Vec::new();
        };
        properties.iter().map(|(k, v)| (k.as_str(), v["description"].as_str().unwrap_or(""))).collect()
    }
}

/// Every table of the config file, in the order of the data flow.
pub fn sections() -> Vec<Section> {
    use inferlog_store::config::{ClickHouseConfig, ColdConfig, PostgresConfig, RetentionConfig};
    vec![
        Section::of::<inferlog_schema::ContractConfig>("schema"),
        Section::of::<inferlog_store::kafka::KafkaConfig>("kafka"),
        Section::of::<inferlog_store::config::IngestConfig>("ingest"),
        Section::of::<inferlog_store::ServiceMetricsConfig>("service_metrics"),
        Section::of::<inferlog_store::OtlpConfig>("otlp"),
        Section::of::<ClickHouseConfig>("clickhouse"),
        Section::of::<PostgresConfig>("postgres"),
        Section::of::<ColdConfig>("cold"),
        Section::of::<inferlog_store::config::CompactorConfig>("compactor"),
        Section::of::<inferlog_store::SamplingConfig>("sampling"),
        Section::of::<RetentionConfig>("retention"),
        Section::of::<inferlog_store::cost::CostConfig>("cost"),
        Section::of::<inferlog_store::budget::BudgetsConfig>("budgets"),
    ]
}

const HEADER: &str = "\
# inferlog example config: every setting, its documentation and its default.
#
# GENERATED from the config types (`cargo run -p inferlog-deploy --bin
# inferlog-config-example > deploy/inferlog.example.toml`); a test fails when
# this file and the code disagree, so edit the doc comments, not this file.
#
# One file serves every component; each reads only its own tables and
# refuses unknown keys in them. Any setting can be overridden from the
# environment as INFERLOG_<TABLE>__<KEY>, e.g. INFERLOG_KAFKA__GROUP_ID=other.
# Secrets never live here: the user-id hash key comes from INFERLOG_HASH_KEY
# or the file named by INFERLOG_HASH_KEY_FILE, the ClickHouse password from
# INFERLOG_CLICKHOUSE_PASSWORD, the Postgres password from
# INFERLOG_POSTGRES_PASSWORD (or postgres.password_file), the S3 secret key
# from AWS_SECRET_ACCESS_KEY (or cold.secret_access_key_file).
# Settings without a default are shown commented out.
";

/// The example config: every table and setting, documented, at its default.
pub fn example_config() -> String {
    let mut out = String::from(HEADER);
    for section in sections() {
        out.push('\n');
        comment(&mut out, section.description());
        let _ = writeln!(out, "# Read by: {}.", section.read_by);
        let _ = writeln!(out, "[{}]", section.name);
        for (key, doc) in section.settings() {
            comment(&mut out, doc);
            match section.defaults.get(key) {
                Some(value) => {
                    let _ = writeln!(out, "{key} = {value}");
                }
                None => {
                    let _ = writeln!(out, "# {key} = \"\"");
                }
            }
        }
    }
    out
}

/// Appends `text` as `#` lines wrapped at 78 columns.
fn comment(out: &mut String, text: &str) {
    for paragraph in text.split("\n\n") {
        let mut line = String::new();
        for word in paragraph.split_whitespace() {
            if !line.is_empty() && 2 + line.len() + 1 + word.len() > 78 {
                let _ = writeln!(out, "# {line}");
                line.clear();
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        if !line.is_empty() {
            let _ = writeln!(out, "# {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The doc-comment convention the example relies on: every setting says
    /// what it does and what its default is.
    #[test]
    fn every_setting_is_documented_with_its_default() {
        let mut missing = Vec::new();
        for section in sections() {
            assert!(!section.description().is_empty(), "[{}] has no doc comment on its type", section.name);
            for (key, doc) in section.settings() {
                if !doc.contains("Default:") {
                    missing.push(format!("{}.{key}", section.name));
                }
            }
        }
        assert!(missing.is_empty(), "settings whose doc comment lacks `Default:`: {missing:?}");
    }

    /// The `Default:` a doc comment states is the default the code has.
    #[test]
    fn every_stated_default_is_the_real_one() {
        let mut checked = 0;
        for section in sections() {
            for (key, doc) in section.settings() {
                let Some(stated) = stated_default(doc) else {
                    continue;
                };
                let actual = section.defaults.get(key).unwrap_or_else(|| panic!("{}.{key} states {stated} but has no default", section.name));
                let same = match (&stated, actual) {
                    (toml::Value::String(a), toml::Value::String(b)) => {
                        a == b || matches!((humantime::parse_duration(a), humantime::parse_duration(b)), (Ok(x), Ok(y)) if x == y)
                    }
                    (a, b) => a == b,
                };
                assert!(same, "{}.{key}: the doc says the default is {stated}, the code has {actual}", section.name);
                checked += 1;
            }
        }
        assert!(checked >= 30, "only {checked} stated defaults were literals");
    }

    /// The literal after `Default: ` (a number, a string or a list), if any.
    fn stated_default(doc: &str) -> Option<toml::Value> {
        let rest = &doc[doc.find("Default: ")? + "Default: ".len()..];
        let literal = match rest.chars().next()? {
            '"' => &rest[..rest[1..].find('"')? + 2],
            '[' => &rest[..rest.find(']')? + 1],
            c if c.is_ascii_digit() => rest.split(|c: char| !c.is_ascii_digit() && c != '.').next()?.trim_end_matches('.'),
            _ => return None,
        };
        let table: toml::Table = format!("v = {literal}").parse().ok()?;
        table.get("v").cloned()
    }

    /// The tables listed are exactly those some binary reads, each read by someone.
    #[test]
    fn the_tables_are_the_ones_the_binaries_read() {
        let listed: std::collections::BTreeSet<&str> = sections().iter().map(|s| s.name).collect();
        let read: std::collections::BTreeSet<&str> = READERS.iter().flat_map(|(_, tables)| tables.iter().copied()).collect();
        assert_eq!(listed, read);
        let report = sections().into_iter().find(|s| s.name == "cold").expect("[cold]").read_by;
        assert_eq!(report, "ingest, compactor, retention, report", "dlq replay and the report read the archive too");
    }

    #[test]
    fn comments_wrap_and_keep_paragraphs() {
        let mut out = String::new();
        comment(&mut out, &format!("{}\n\nsecond", "word ".repeat(30)));
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.len() >= 3, "{out}");
        assert!(lines.iter().all(|l| l.len() <= 78 && l.starts_with("# ")), "{out}");
        assert_eq!(lines.last(), Some(&"# second"));
    }
}
