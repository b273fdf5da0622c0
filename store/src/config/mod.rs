//! The config tables of the stores every component shares: `[clickhouse]`,
//! `[postgres]`, `[cold]` and `[retention]`; and the daemons' own
//! `[ingest]`, `[service_metrics]` (ingest's live metrics), `[compactor]`
//! and `[sampling]` (the compactor's archive), so that every table's type (with
//! [`crate::kafka`], [`crate::cost`], [`crate::budget`] and the schema's
//! `[schema]`) is in reach without building a daemon: the example config
//! is generated from them. Secrets (passwords, the S3
//! secret key) come from the environment or files named here, never from
//! values in the file or the command line.

use std::path::PathBuf;

use crate::error::StoreError;

mod clickhouse;
mod cold;
mod compactor;
mod ingest;
mod keep_field;
mod postgres;
mod retention;
mod sampling;

pub use clickhouse::{ClickHouseConfig, ShardConfig};
pub use cold::{ColdConfig, ColdLocation};
pub use compactor::CompactorConfig;
pub use ingest::{IngestConfig, OtlpConfig, ServiceMetricsConfig};
pub use keep_field::{FieldKind, KeepField};
pub use postgres::PostgresConfig;
pub use retention::RetentionConfig;
pub use sampling::{CompareOp, Condition, ConditionValue, KeepRule, SamplingConfig, BUILT_IN_REASONS};

/// Environment variable holding the ClickHouse password (else
/// `clickhouse.password_file`).
pub const CLICKHOUSE_PASSWORD_ENV: &str = "INFERLOG_CLICKHOUSE_PASSWORD";
/// Environment variable holding the Postgres password (else
/// `postgres.password_file`).
pub const POSTGRES_PASSWORD_ENV: &str = "INFERLOG_POSTGRES_PASSWORD";

/// Reads a secret from `env`, else from `file`, else none.
pub(crate) fn secret(env: &str, file: Option<&PathBuf>, what: &str) -> Result<Option<String>, StoreError> {
    if let Ok(value) = std::env::var(env) {
        return Ok(Some(value));
    }
    match file {
        Some(path) => std::fs::read_to_string(path)
            .map(|p| Some(p.trim_end_matches(['\n', '\r']).to_owned()))
            .map_err(|e| StoreError::Config(format!("cannot read {what} {}: {e}", path.display()))),
        None => Ok(None),
    }
}

/// A ClickHouse database or table name (it is spliced into DDL).
pub fn identifier(value: &str, what: &str) -> Result<(), StoreError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !value.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(StoreError::Config(format!("{what} = {value:?} must be an identifier of [A-Za-z0-9_]")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::policy::Policy;

    use super::*;

    #[test]
    fn a_cluster_maps_each_partition_to_one_shard_and_a_majority_quorum() {
        let shard = |replicas: usize, partitions: Vec<u16>| ShardConfig {
            replicas: (0..replicas).map(|r| format!("http://ch-{r}:8123")).collect(),
            partitions,
        };
        let mut c =
            ClickHouseConfig { cluster: Some("c".into()), shards: vec![shard(2, vec![0, 2]), shard(3, vec![1])], ..ClickHouseConfig::default() };
        c.validate().expect("valid");
        assert_eq!((c.shard_of(0), c.shard_of(2), c.shard_of(1), c.shard_of(3)), (Some(0), Some(0), Some(1), None));
        assert_eq!((c.quorum(0), c.quorum(1)), (2, 2), "a majority of 2 and of 3");
        assert_eq!((c.read_quorum(0), c.read_quorum(1)), (1, 2), "any 1 of 2 holds what 2 acknowledged; 2 of 3 meet any 2");
        c.insert_quorum = 1;
        assert_eq!((c.read_quorum(0), c.read_quorum(1)), (2, 3), "a row on one replica: every replica must answer");
        c.insert_quorum = 0;
        assert_eq!(ClickHouseConfig::default().shard_of(7), Some(0), "one server holds every partition");

        c.shards[1].partitions.push(2);
        let e = c.validate().expect_err("partition 2 twice");
        assert!(e.to_string().contains("Kafka partition 2 is in clickhouse.shards[1] and clickhouse.shards[2]"), "{e}");
        c.shards[1].partitions.pop();
        c.insert_quorum = 3;
        assert!(c.validate().expect_err("3 of 2").to_string().contains("clickhouse.insert_quorum = 3"));
        c.insert_quorum = 0;
        c.shards[0].replicas.clear();
        assert!(c.validate().expect_err("no replicas").to_string().contains("clickhouse.shards[1] lists no replicas"));
        let no_cluster = ClickHouseConfig { shards: vec![shard(1, vec![0])], ..ClickHouseConfig::default() };
        assert!(no_cluster.validate().expect_err("shards alone").to_string().contains("without clickhouse.cluster"));
        let no_shards = ClickHouseConfig { cluster: Some("c".into()), ..ClickHouseConfig::default() };
        assert!(no_shards.validate().expect_err("cluster alone").to_string().contains("needs its [[clickhouse.shards]]"));
    }

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        ClickHouseConfig::default().validate().expect("defaults");
        PostgresConfig::default().validate().expect("defaults");
        ColdConfig::default().validate().expect("defaults");
        RetentionConfig::default().validate(Duration::from_secs(7 * 86_400)).expect("defaults");
        let late = RetentionConfig::default().validate(Duration::from_secs(8 * 86_400)).expect_err("8d > 7d");
        assert!(late.to_string().contains("max_event_age"), "{late}");
        let week = Duration::from_secs(7 * 86_400);
        let short = RetentionConfig { cold_days: Policy::Days(6), ..RetentionConfig::default() }.validate(week).expect_err("6 < 7");
        assert!(short.to_string().contains("retention.cold_days (6d)") && short.to_string().contains("hot_days (7d)"), "{short}");
        let short = RetentionConfig { aggregate_days: Policy::Days(3), ..RetentionConfig::default() }.validate(week).expect_err("3 < 7");
        assert!(short.to_string().contains("retention.aggregate_days (3d)"), "{short}");
        let forever = RetentionConfig { hot_days: Policy::Forever, ..RetentionConfig::default() }.validate(week).expect_err("365 < forever");
        assert!(forever.to_string().contains("retention.cold_days"), "{forever}");
        RetentionConfig { hot_days: Policy::Days(7), cold_days: Policy::Days(7), aggregate_days: Policy::Forever, ..RetentionConfig::default() }
            .validate(week)
            .expect("equal and forever outlive 7 days");
        let bad = PostgresConfig { schema: "a;b".into(), ..PostgresConfig::default() }.validate().expect_err("identifier");
        assert!(bad.to_string().contains("postgres.schema"), "{bad}");
        let bad = ColdConfig { url: "ftp://x/".into(), ..ColdConfig::default() }.validate().expect_err("scheme");
        assert!(bad.to_string().contains("ftp"), "{bad}");
        SamplingConfig::default().validate().expect("defaults");
        ServiceMetricsConfig::default().validate().expect("defaults");
        let rule: SamplingConfig = toml::from_str(
            "[[keep]]\nreason = \"cache_miss_long\"\nwhen = [{ field = \"cache_hit\", op = \"eq\", value = false }, { field = \"input_tokens\", op = \"gt\", value = 8000 }]\n",
        )
        .expect("a keep rule");
        rule.validate().expect("valid");
        assert_eq!(rule.keep[0].when[1].value, ConditionValue::Number(8000.0));
        for (toml, why) in [
            ("reason = \"slow\"\nwhen = [{ field = \"ttft_ms\", op = \"gt\", value = 1 }]", "built-in"),
            ("reason = \"x\"\nwhen = []", "at least one condition"),
            ("reason = \"x\"\nwhen = [{ field = \"prompt\", op = \"eq\", value = \"a\" }]", "not one a rule can test"),
            ("reason = \"x\"\nwhen = [{ field = \"cache_hit\", op = \"gt\", value = true }]", "does not fit"),
            ("reason = \"x\"\nwhen = [{ field = \"input_tokens\", op = \"eq\", value = \"8\" }]", "does not fit"),
            ("reason = \"Bad Name\"\nwhen = [{ field = \"ttft_ms\", op = \"gt\", value = 1 }]", "[a-z0-9_]"),
        ] {
            let rule: KeepRule = toml::from_str(toml).expect(toml);
            let e = rule.validate().expect_err(toml);
            assert!(e.to_string().contains(why) && e.to_string().contains("sampling.keep"), "{toml}: {e}");
        }
        let bad = ServiceMetricsConfig { max_models: 0, ..ServiceMetricsConfig::default() }.validate().expect_err("cap 0");
        assert!(bad.to_string().contains("service_metrics.max_"), "{bad}");
        let bad = SamplingConfig { base_rate: 0.0, ..SamplingConfig::default() }.validate().expect_err("rate 0");
        assert!(bad.to_string().contains("sampling.base_rate"), "{bad}");
        let bad = SamplingConfig { quantile: 1.0, ..SamplingConfig::default() }.validate().expect_err("q 1");
        assert!(bad.to_string().contains("sampling.quantile"), "{bad}");
    }
}
