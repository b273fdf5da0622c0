//! `deploy/inferlog.example.toml` is what the code generates, and every
//! component loads it: the example cannot drift from the config types.

use std::path::PathBuf;

fn example_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("inferlog.example.toml")
}

#[test]
fn the_committed_example_is_what_the_code_generates() {
    let committed = std::fs::read_to_string(example_path()).expect("read deploy/inferlog.example.toml");
    let generated = inferlog_deploy::example_config();
    if committed != generated {
        let first =
            committed.lines().zip(generated.lines()).position(|(a, b)| a != b).unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "deploy/inferlog.example.toml drifted from the config types (first difference at line {}: committed {:?}, generated {:?}); \
             regenerate it: cargo run -p inferlog-deploy --bin inferlog-config-example > deploy/inferlog.example.toml",
            first + 1,
            committed.lines().nth(first),
            generated.lines().nth(first)
        );
    }
}

#[test]
fn every_component_loads_the_example_and_gets_its_defaults() {
    let path = example_path();
    let ingest = inferlog_ingest::Config::load(&path).expect("ingest loads the example");
    assert_eq!(ingest.kafka, inferlog_ingest::config::KafkaConfig::default());
    assert_eq!(ingest.ingest, inferlog_ingest::config::IngestConfig::default());
    assert_eq!(ingest.clickhouse, inferlog_store::ClickHouseConfig::default());
    let compactor = inferlog_compactor::config::Config::load(&path).expect("compactor loads the example");
    assert_eq!(compactor, inferlog_compactor::config::Config::default());
    let retention = inferlog_retention::Config::load(&path).expect("retention loads the example");
    assert_eq!(retention, inferlog_retention::Config::default());
}

#[test]
fn every_table_and_setting_of_the_code_is_in_the_example() {
    let example: toml::Table = std::fs::read_to_string(example_path()).expect("read").parse().expect("the example is TOML");
    for section in inferlog_deploy::sections() {
        let table = example.get(section.name).and_then(|t| t.as_table()).unwrap_or_else(|| panic!("[{}] missing", section.name));
        let text = std::fs::read_to_string(example_path()).expect("read");
        for (key, _) in section.settings() {
            // Settings without a default are present, commented out.
            assert!(table.contains_key(key) || text.contains(&format!("\n# {key} = ")), "{}.{key} is not in the example", section.name);
        }
    }
}
