//! The shapes of the ClickHouse tables ingest writes, each written once:
//! its columns (name and type), its DDL (ClickHouse 18.16 and current
//! releases), the column list every INSERT names, and the check of an
//! existing table against it. In: a server version, or a table's
//! `system.columns`. Out: SQL, or what drifted.
//!
//! - [`HOT`]: the hot rows (one per accepted event, with its Kafka coordinates).
//! - [`REJECTS`]: the log of rejected messages next to the DLQ.
//! - [`REPLAY_LOG`]: which offset ranges a batch covers, written before its
//!   rows (an intent) and marked done once they and its rejects are
//!   durable; the replay filter of a partition's next owner reads it
//!   instead of scanning the hot table.

/// One column: its name, its type as `system.columns` shows it, and
/// whether current servers store it as `LowCardinality` (the same bytes
/// on the wire; 18.16 has no `LowCardinality` without a setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub ty: &'static str,
    pub low_cardinality: bool,
    /// For a column added after the table's first release: the `DEFAULT`
    /// its older rows get when ingest adds it to an existing table.
    pub added_with_default: Option<&'static str>,
}

const fn col(name: &'static str, ty: &'static str) -> Column {
    Column { name, ty, low_cardinality: false, added_with_default: None }
}

/// A table's shape: columns in insert order, engine, partitioning and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// What the table holds, for messages.
    pub what: &'static str,
    pub columns: &'static [Column],
    pub engine: &'static str,
    pub partition_by: &'static str,
    pub order_by: &'static str,
}

/// The server version from which `LowCardinality(String)` needs no setting.
const LOW_CARDINALITY_FROM: (u32, u32) = (20, 1);

include!(concat!(env!("OUT_DIR"), "/hot_columns.rs"));

/// The hot table: its columns are the lines of `store/hot_row.toml`.
///
/// - ReplacingMergeTree: a producer retry that slipped past ingest's
///   request-id window has an identical sorting key, so merges collapse it
///   (ingest itself never writes a replayed offset twice).
/// - PARTITION BY day: retention and the compactor work a UTC day at a time
///   (`DROP PARTITION`), and time-range queries prune to the days they touch.
/// - ORDER BY (business_line, model_name, model_version, event_time, request_id):
///   the questions users ask filter by business line and model version over
///   a time range; the key prefix makes those range scans, and low-
///   cardinality columns first compress best. request_id last makes the
///   key unique per request, as ReplacingMergeTree needs.
pub const HOT: Shape = Shape {
    what: "hot rows",
    columns: HOT_COLUMNS,
    engine: "ReplacingMergeTree()",
    partition_by: "day",
    order_by: "business_line, model_name, model_version, event_time, request_id",
};

/// The rejects log: one row per rejected message, by the day it was received.
pub const REJECTS: Shape = Shape {
    what: "rejected messages",
    columns: &[
        col("day", "Date"),
        col("received_at", "DateTime"),
        col("reason", "String"),
        col("field", "String"),
        col("message", "String"),
        col("kafka_topic", "String"),
        col("kafka_partition", "UInt16"),
        col("kafka_offset", "UInt64"),
        col("bytes", "UInt32"),
    ],
    engine: "MergeTree()",
    partition_by: "day",
    order_by: "reason, received_at",
};

/// The replay log: per batch and partition, the offsets `first..=last` it
/// covers, the hot-table days its rows go to and the days its rejects are
/// logged under. `state` 0 is written before the batch (its rows may be
/// partly stored), 1 once every offset of the range is handled (stored,
/// rejected or skipped). Partitioned by the day the entry was written, so
/// old entries leave a day at a time. Keyed by partition and last offset:
/// a partition's entries past its committed offset are one index range.
pub const REPLAY_LOG: Shape = Shape {
    what: "replay log",
    columns: &[
        col("day", "Date"),
        col("written_at", "DateTime"),
        col("kafka_topic", "String"),
        col("kafka_partition", "UInt16"),
        col("first_offset", "UInt64"),
        col("last_offset", "UInt64"),
        col("state", "UInt8"),
        col("row_days", "Array(Date)"),
        col("reject_days", "Array(Date)"),
    ],
    engine: "MergeTree()",
    partition_by: "day",
    order_by: "kafka_topic, kafka_partition, last_offset",
};

/// The replay log's table name for a hot table.
pub fn replay_log_table(hot_table: &str) -> String {
    format!("{hot_table}_offsets")
}

/// A column of an existing table, as `system.columns` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingColumn {
    pub name: String,
    pub ty: String,
    /// `default_kind`: "" (none), "DEFAULT", "MATERIALIZED", "ALIAS".
    pub default_kind: String,
}

/// How an existing table differs from its shape in a way no insert can
/// survive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// A column inferlog writes is not in the table.
    Missing { column: &'static str, want: String },
    /// A column has another type than inferlog writes.
    Type { column: &'static str, want: String, got: String },
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drift::Missing { column, want } => write!(f, "column {column} ({want}) is missing"),
            Drift::Type { column, want, got } => write!(f, "column {column} is {got}, inferlog writes {want}"),
        }
    }
}

/// A table's names on a ClickHouse cluster: each server holds the rows
/// of its shard in `<table>_local` (replicated between the shard's
/// replicas through ZooKeeper), and `<table>` is the `Distributed` table
/// over every shard's, for reading.
pub fn local_table(table: &str) -> String {
    format!("{table}_local")
}

impl Shape {
    /// `CREATE TABLE IF NOT EXISTS` for `database.table` on a server of `version`.
    pub fn ddl(&self, database: &str, table: &str, version: (u32, u32)) -> String {
        self.create(database, table, "", self.engine, version)
    }

    /// The DDL of the table on `cluster` (a `remote_servers` name whose
    /// servers define the macros `{shard}` and `{replica}`), run once on
    /// any of its servers: the shard-local table on every server, the
    /// `Replicated` form of [`Shape::engine`] with its ZooKeeper path per
    /// shard (`/clickhouse/tables/{shard}/<database>/<table>_local`, so
    /// the replicas of a shard share it and the shards do not), the same
    /// columns, partitions and key; then the `Distributed` table over
    /// them. `ON CLUSTER`: each statement runs on every server.
    pub fn cluster_ddl(&self, database: &str, table: &str, cluster: &str, version: (u32, u32)) -> [String; 2] {
        let local = local_table(table);
        let engine = self.replicated_engine(database, &local);
        let on = format!(" ON CLUSTER {cluster}");
        [
            self.create(database, &local, &on, &engine, version),
            format!("CREATE TABLE IF NOT EXISTS {database}.{table}{on} AS {database}.{local} ENGINE = Distributed({cluster}, {database}, {local})"),
        ]
    }

    /// `ReplacingMergeTree()` → `ReplicatedReplacingMergeTree('<path>', '{replica}')`.
    fn replicated_engine(&self, database: &str, local: &str) -> String {
        let (name, args) = self.engine.split_once('(').unwrap_or((self.engine, ")"));
        let args = args.trim_end_matches(')');
        let path = format!("'/clickhouse/tables/{{shard}}/{database}/{local}', '{{replica}}'");
        let args = if args.trim().is_empty() { path } else { format!("{path}, {args}") };
        format!("Replicated{name}({args})")
    }

    fn create(&self, database: &str, table: &str, on_cluster: &str, engine: &str, version: (u32, u32)) -> String {
        let columns: Vec<String> = self.columns.iter().map(|c| format!("{} {}", c.name, self.type_on(c, version))).collect();
        format!(
            "CREATE TABLE IF NOT EXISTS {database}.{table}{on_cluster} (\n    {}\n) ENGINE = {engine}\nPARTITION BY {}\nORDER BY ({})",
            columns.join(",\n    "),
            self.partition_by,
            self.order_by
        )
    }

    fn type_on(&self, c: &Column, version: (u32, u32)) -> String {
        if c.low_cardinality && version >= LOW_CARDINALITY_FROM {
            format!("LowCardinality({})", c.ty)
        } else {
            c.ty.to_owned()
        }
    }

    /// `(day, event_time, …)`: the columns every INSERT names, in the order
    /// its rows are encoded. A column an operator added is left to its default.
    pub fn insert_columns(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name).collect();
        format!("({})", names.join(", "))
    }

    /// `INSERT INTO database.table (columns…) FORMAT format`.
    pub fn insert_sql(&self, database: &str, table: &str, format: &str) -> String {
        format!("INSERT INTO {database}.{table} {} FORMAT {format}", self.insert_columns())
    }

    /// `ALTER TABLE … ADD COLUMN` for each column added since the table's
    /// first release that `existing` lacks, placed after its predecessor.
    pub fn additions(&self, database: &str, table: &str, existing: &[ExistingColumn]) -> Vec<String> {
        self.columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let default = c.added_with_default?;
                if existing.iter().any(|e| e.name == c.name) {
                    return None;
                }
                let after = i.checked_sub(1).map(|p| format!(" AFTER {}", self.columns[p].name)).unwrap_or_default();
                Some(format!("ALTER TABLE {database}.{table} ADD COLUMN {} {} DEFAULT {default}{after}", c.name, c.ty))
            })
            .collect()
    }

    /// Compares an existing table with this shape: every column inferlog
    /// writes must be there with its type (`LowCardinality` or not where
    /// either is the same on the wire). `Ok` lists the table's other
    /// columns, which inserts leave to their defaults.
    pub fn check(&self, existing: &[ExistingColumn]) -> Result<Vec<ExistingColumn>, Vec<Drift>> {
        let mut drift = Vec::new();
        for c in self.columns {
            let want = c.ty.to_owned();
            match existing.iter().find(|e| e.name == c.name) {
                None => drift.push(Drift::Missing { column: c.name, want }),
                Some(e) => {
                    let same = e.ty == c.ty || (c.low_cardinality && e.ty == format!("LowCardinality({})", c.ty));
                    if !same {
                        drift.push(Drift::Type { column: c.name, want, got: e.ty.clone() });
                    }
                }
            }
        }
        if !drift.is_empty() {
            return Err(drift);
        }
        Ok(existing.iter().filter(|e| !self.columns.iter().any(|c| c.name == e.name)).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn existing(shape: &Shape) -> Vec<ExistingColumn> {
        shape.columns.iter().map(|c| ExistingColumn { name: c.name.into(), ty: c.ty.into(), default_kind: String::new() }).collect()
    }

    #[test]
    fn low_cardinality_only_where_the_server_has_it_without_a_setting() {
        assert!(!HOT.ddl("d", "t", (18, 16)).contains("LowCardinality"));
        let current = HOT.ddl("d", "t", (24, 8));
        assert_eq!(current.matches("LowCardinality(String)").count(), 3, "{current}");
        assert!(current.starts_with("CREATE TABLE IF NOT EXISTS d.t (\n    day Date,"), "{current}");
        assert!(current.ends_with("ORDER BY (business_line, model_name, model_version, event_time, request_id)"), "{current}");
    }

    #[test]
    fn on_a_cluster_each_shape_is_a_replicated_local_table_and_a_distributed_one() {
        let [local, distributed] = HOT.cluster_ddl("d", "t", "c", (18, 16));
        let single = HOT.ddl("d", "t_local", (18, 16));
        assert_eq!(
            local,
            single
                .replace("d.t_local (", "d.t_local ON CLUSTER c (")
                .replace("ReplacingMergeTree()", "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/d/t_local', '{replica}')"),
            "the same columns, partitions and key as the single server's"
        );
        assert_eq!(distributed, "CREATE TABLE IF NOT EXISTS d.t ON CLUSTER c AS d.t_local ENGINE = Distributed(c, d, t_local)");
        let [rejects, _] = REJECTS.cluster_ddl("d", "r", "c", (24, 8));
        assert!(rejects.contains("ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/d/r_local', '{replica}')\n"), "{rejects}");
    }

    #[test]
    fn inserts_name_every_column_in_encoding_order() {
        let sql = REJECTS.insert_sql("db", "r", "RowBinary");
        assert_eq!(
            sql,
            "INSERT INTO db.r (day, received_at, reason, field, message, kafka_topic, kafka_partition, kafka_offset, bytes) FORMAT RowBinary"
        );
        assert!(HOT.insert_columns().starts_with("(day, event_time, timestamp_ms, request_id,"));
        assert!(HOT.insert_columns().ends_with("kafka_partition, kafka_offset, kafka_index, ingested_at)"));
    }

    #[test]
    fn a_table_as_created_checks_clean_on_either_server() {
        assert_eq!(HOT.check(&existing(&HOT)), Ok(Vec::new()));
        let mut current = existing(&HOT);
        current.iter_mut().filter(|c| c.name == "model_name").for_each(|c| c.ty = "LowCardinality(String)".into());
        assert_eq!(HOT.check(&current), Ok(Vec::new()));
    }

    #[test]
    fn a_table_from_before_an_added_column_gets_it_with_its_default() {
        let mut older = existing(&HOT);
        older.retain(|c| c.name != "kafka_index");
        assert_eq!(HOT.check(&older), Err(vec![Drift::Missing { column: "kafka_index", want: "UInt32".into() }]));
        assert_eq!(HOT.additions("db", "t", &older), vec!["ALTER TABLE db.t ADD COLUMN kafka_index UInt32 DEFAULT 0 AFTER kafka_offset".to_owned()]);
        assert!(HOT.additions("db", "t", &existing(&HOT)).is_empty());
        // Only added columns are added: a missing original one stays drift.
        older.retain(|c| c.name != "tpot_ms");
        assert_eq!(HOT.additions("db", "t", &older).len(), 1);
    }

    #[test]
    fn an_added_column_is_extra_and_a_missing_or_retyped_one_is_drift() {
        let mut table = existing(&HOT);
        let added = ExistingColumn { name: "region".into(), ty: "String".into(), default_kind: "DEFAULT".into() };
        table.push(added.clone());
        assert_eq!(HOT.check(&table), Ok(vec![added]));

        let mut retyped = existing(&HOT);
        retyped.iter_mut().filter(|c| c.name == "error_code").for_each(|c| c.ty = "UInt32".into());
        retyped.retain(|c| c.name != "tpot_ms");
        let drift = HOT.check(&retyped).expect_err("drift");
        assert_eq!(
            drift,
            vec![
                Drift::Type { column: "error_code", want: "Int32".into(), got: "UInt32".into() },
                Drift::Missing { column: "tpot_ms", want: "Nullable(Float64)".into() },
            ]
        );
        assert_eq!(drift[0].to_string(), "column error_code is UInt32, inferlog writes Int32");
        // LowCardinality is accepted only where it is the same on the wire.
        let mut lc_id = existing(&HOT);
        lc_id.iter_mut().filter(|c| c.name == "request_id").for_each(|c| c.ty = "LowCardinality(String)".into());
        assert!(HOT.check(&lc_id).is_err());
    }
}
