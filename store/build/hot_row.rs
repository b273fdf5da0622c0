//! Generates the code that spells the hot row from `hot_row.toml` (its
//! one definition). In: the list of columns. Out: six files in
//! `OUT_DIR`, each included by the module that owns that view of the row:
//!
//! - `hot_columns.rs` → `model::tables` (`HOT`'s columns)
//! - `hot_row.rs` → `model::rows` (`HotRow`, `new`, the RowBinary encoder)
//! - `stored_row.rs` → `model::stored` (`StoredRow`, `FoldRow`, `fold_row`, `example`)
//! - `archive_columns.rs` → `model::archive` (Arrow fields, builders, read-back, added defaults, Parquet encodings)
//! - `keep_fields.rs` → `config::keep_field` (`KeepField`, its kind: what a keep rule may name)
//! - `keep_values.rs` → `model::keep_field` (a `KeepField`'s value in a stored row)
//!
//! A list the generator cannot read, or a type it has no mapping for,
//! fails the build with the column's name.

use std::fmt::Write as _;

/// One line of `hot_row.toml`, with every default filled in.
struct Column {
    name: String,
    /// The ClickHouse type without `LowCardinality`.
    clickhouse: String,
    low_cardinality: bool,
    nullable: bool,
    added: Option<String>,
    row: String,
    stored: String,
    /// The stored type borrows from the response (`#[serde(borrow)]` on an `Option`).
    text: bool,
    from: String,
    derived: bool,
    archive: &'static str,
    archive_name: String,
    parquet: Option<String>,
    fold: bool,
    keep: bool,
    coordinate: bool,
    example: String,
    doc: Option<String>,
}

const KEYS: [&str; 14] =
    ["name", "clickhouse", "added", "row", "from", "derived", "archive", "archive_name", "parquet", "fold", "keep", "coordinate", "example", "doc"];

/// The Rust scalar a ClickHouse type maps to, and its default Arrow kind.
fn scalar(ty: &str) -> Option<(&'static str, &'static str)> {
    Some(match ty {
        "Date" => ("u16", "int32"),
        "DateTime" => ("u32", "ts_s"),
        "UInt8" => ("u8", "int32"),
        "UInt16" => ("u16", "int32"),
        "UInt32" => ("u32", "int64"),
        "UInt64" => ("u64", "int64"),
        "Int32" => ("i32", "int32"),
        "Float64" => ("f64", "float64"),
        "String" => ("String", "utf8"),
        _ => return None,
    })
}

fn parse(text: &str) -> Result<Vec<Column>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("hot_row.toml: {e}"))?;
    let lines = table.get("columns").and_then(|c| c.as_array()).ok_or("hot_row.toml: no `columns` list")?;
    let mut columns = Vec::new();
    for line in lines {
        let line = line.as_table().ok_or("hot_row.toml: a column is not an inline table")?;
        let text_of = |key: &str| line.get(key).and_then(|v| v.as_str()).map(str::to_owned);
        let flag = |key: &str| line.get(key).and_then(|v| v.as_bool()).unwrap_or(false);
        let name = text_of("name").ok_or("hot_row.toml: a column has no name")?;
        let bad = |why: String| format!("hot_row.toml, column {name}: {why}");
        if let Some(key) = line.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(bad(format!("unknown key {key}")));
        }
        let declared = text_of("clickhouse").ok_or_else(|| bad("no clickhouse type".into()))?;
        let (declared, low_cardinality) = match declared.strip_prefix("LowCardinality(").and_then(|t| t.strip_suffix(')')) {
            Some(inner) => (inner.to_owned(), true),
            None => (declared, false),
        };
        let (inner, nullable) = match declared.strip_prefix("Nullable(").and_then(|t| t.strip_suffix(')')) {
            Some(inner) => (inner.to_owned(), true),
            None => (declared.clone(), false),
        };
        let (rust, default_kind) = scalar(&inner).ok_or_else(|| bad(format!("no Rust type for {inner}")))?;
        let wrap = |t: &str| if nullable { format!("Option<{t}>") } else { t.to_owned() };
        let text = inner == "String";
        let row = text_of("row").unwrap_or_else(|| wrap(rust));
        let stored = if text { wrap("&'a str") } else { wrap(rust) };
        let archive: &'static str = match text_of("archive").as_deref() {
            None => default_kind,
            Some("bool") => "bool",
            Some("ts_ms") => "ts_ms",
            Some(other) => return Err(bad(format!("archive kind {other} is not bool or ts_ms"))),
        };
        if nullable && archive.starts_with("ts") {
            return Err(bad("a nullable time has no archive kind".into()));
        }
        let derived = flag("derived");
        let example = text_of("example").unwrap_or_default();
        if !derived && example.is_empty() {
            return Err(bad("no example".into()));
        }
        columns.push(Column {
            from: text_of("from").unwrap_or_else(|| format!("e.{name}")),
            archive_name: text_of("archive_name").unwrap_or_else(|| name.clone()),
            added: text_of("added"),
            parquet: text_of("parquet"),
            fold: flag("fold"),
            keep: flag("keep"),
            coordinate: flag("coordinate"),
            doc: text_of("doc"),
            clickhouse: declared,
            low_cardinality,
            nullable,
            row,
            stored,
            text,
            derived,
            archive,
            example,
            name,
        });
    }
    let first_coordinate = columns.iter().position(|c| c.coordinate).unwrap_or(columns.len());
    if let Some(c) = columns[first_coordinate..].iter().find(|c| !c.coordinate) {
        return Err(format!("hot_row.toml, column {}: the event's columns come before its coordinates", c.name));
    }
    Ok(columns)
}

fn camel(name: &str) -> String {
    name.split('_').map(|w| w[..1].to_uppercase() + &w[1..]).collect()
}

fn doc(out: &mut String, indent: &str, doc: &Option<String>) {
    if let Some(doc) = doc {
        let _ = writeln!(out, "{indent}#[doc = {doc:?}]");
    }
}

fn hot_columns(columns: &[Column]) -> String {
    let mut out = String::from(
        "/// The hot table's columns, in insert order (generated from `store/hot_row.toml`).\npub(crate) const HOT_COLUMNS: &[Column] = &[\n",
    );
    for c in columns {
        let added = c.added.as_ref().map_or("None".to_owned(), |d| format!("Some({d:?})"));
        let _ = writeln!(
            out,
            "    Column {{ name: {:?}, ty: {:?}, low_cardinality: {}, added_with_default: {added} }},",
            c.name, c.clickhouse, c.low_cardinality
        );
    }
    out.push_str("];\n");
    out
}

fn hot_row(columns: &[Column]) -> String {
    let mut out = String::from(
        "/// One hot row: the normalized event plus where it came from. Field order\n\
         /// is the column order of the table (RowBinary is positional). Generated\n\
         /// from `store/hot_row.toml`.\n\
         #[derive(Debug, Clone, PartialEq, clickhouse::Row, serde::Serialize)]\npub struct HotRow {\n",
    );
    for c in columns {
        doc(&mut out, "    ", &c.doc);
        let _ = writeln!(out, "    pub {}: {},", c.name, c.row);
    }
    out.push_str(
        "}\n\nimpl HotRow {\n    /// The row of event `e`, read from `topic`'s `partition` at `offset` and ingested at `ingested_at` (seconds).\n\
         \x20   pub fn new(e: inferlog_schema::InferenceEvent, topic: std::sync::Arc<str>, partition: u16, offset: i64, ingested_at: u32) -> HotRow {\n\
         \x20       // Timestamps are validated to lie in 2000..2100, so days and seconds fit.\n        HotRow {\n",
    );
    for c in columns {
        if c.from == c.name {
            let _ = writeln!(out, "            {},", c.name);
        } else {
            let _ = writeln!(out, "            {}: {},", c.name, c.from);
        }
    }
    out.push_str(
        "        }\n    }\n\n\
         \x20   /// Appends the row in ClickHouse's RowBinary format, in the column\n\
         \x20   /// order of [`HOT`](crate::model::tables::HOT): a batch holds its rows encoded (about\n\
         \x20   /// 330 bytes a row, against about 750 as a `HotRow` with its strings),\n\
         \x20   /// and the normalizing threads encode them. Checked against the\n\
         \x20   /// `clickhouse` crate's own serializer of this struct on a real server\n\
         \x20   /// (`tests/tests/ingest.rs`). Returns how many of the bytes written are\n\
         \x20   /// the event itself (what two retries of one request share); the rest\n\
         \x20   /// are its Kafka coordinates and ingest time.\n\
         \x20   pub fn encode(&self, out: &mut Vec<u8>) -> usize {\n        let start = out.len();\n",
    );
    let mut event_done = false;
    for c in columns {
        if c.coordinate && !event_done {
            out.push_str("        let event = out.len() - start;\n");
            event_done = true;
        }
        let _ = writeln!(out, "        RowBinary::put(&self.{}, out);", c.name);
    }
    if !event_done {
        out.push_str("        let event = out.len() - start;\n");
    }
    out.push_str("        event\n    }\n}\n");
    out
}

fn stored_row(columns: &[Column]) -> String {
    let stored: Vec<&Column> = columns.iter().filter(|c| !c.derived).collect();
    let folded: Vec<&Column> = stored.iter().copied().filter(|c| c.fold).collect();
    let fields = |out: &mut String, list: &[&Column]| {
        for c in list {
            if c.text && c.nullable {
                out.push_str("    #[serde(borrow)]\n");
            }
            let _ = writeln!(out, "    pub {}: {},", c.name, c.stored);
        }
    };
    let mut out = String::from(
        "/// One hot row as read back: every column of [`HOT`](crate::model::tables::HOT) but the ones\n\
         /// derived from others (`day`, `event_time`), in its order. Strings borrow\n\
         /// from the response buffer. Generated from `store/hot_row.toml`.\n\
         #[derive(Debug, Clone, PartialEq, clickhouse::Row, serde::Deserialize)]\npub struct StoredRow<'a> {\n",
    );
    fields(&mut out, &stored);
    out.push_str(
        "}\n\n/// The columns of a hot row the aggregates fold ([`crate::model::fold`]),\n\
         /// with [`HOT`](crate::model::tables::HOT)'s names and order: the `fold` columns of\n\
         /// `store/hot_row.toml`.\n\
         #[derive(Debug, Clone, Copy, PartialEq, clickhouse::Row, serde::Deserialize)]\npub struct FoldRow<'a> {\n",
    );
    fields(&mut out, &folded);
    out.push_str(
        "}\n\nimpl StoredRow<'_> {\n    /// The columns the aggregates fold.\n    pub fn fold_row(&self) -> FoldRow<'_> {\n        FoldRow {\n",
    );
    for c in &folded {
        let _ = writeln!(out, "            {0}: self.{0},", c.name);
    }
    out.push_str("        }\n    }\n\n    /// A row with every column set (some to `None`), for tests.\n    pub fn example() -> StoredRow<'static> {\n        StoredRow {\n");
    for c in &stored {
        let _ = writeln!(out, "            {}: {},", c.name, c.example);
    }
    out.push_str("        }\n    }\n}\n");
    out
}

/// Per Arrow kind: the builder, the array, the cast to the array and the data type.
fn kind(kind: &str) -> (&'static str, &'static str, &'static str, &'static str) {
    match kind {
        "utf8" => ("StringBuilder", "arrow_array::StringArray", "as_string_opt::<i32>()", "DataType::Utf8"),
        "int64" => ("Int64Builder", "arrow_array::Int64Array", "as_primitive_opt::<arrow_array::types::Int64Type>()", "DataType::Int64"),
        "int32" => ("Int32Builder", "arrow_array::Int32Array", "as_primitive_opt::<arrow_array::types::Int32Type>()", "DataType::Int32"),
        "float64" => ("Float64Builder", "arrow_array::Float64Array", "as_primitive_opt::<arrow_array::types::Float64Type>()", "DataType::Float64"),
        "bool" => ("BooleanBuilder", "arrow_array::BooleanArray", "as_boolean_opt()", "DataType::Boolean"),
        _ => (
            "TimestampMillisecondBuilder",
            "arrow_array::TimestampMillisecondArray",
            "as_primitive_opt::<arrow_array::types::TimestampMillisecondType>()",
            "DataType::Timestamp(TimeUnit::Millisecond, Some(\"UTC\".into()))",
        ),
    }
}

/// The scalar of a stored type (`Option<u32>` → `u32`).
fn scalar_of(stored: &str) -> &str {
    stored.strip_prefix("Option<").and_then(|t| t.strip_suffix('>')).unwrap_or(stored)
}

fn archive_columns(columns: &[Column]) -> String {
    let stored: Vec<&Column> = columns.iter().filter(|c| !c.derived).collect();
    let text = stored.iter().filter(|c| c.archive == "utf8").count();
    let mut out = String::new();
    let _ = writeln!(out, "/// Text columns of the hot row in the archive.\nconst HOT_TEXT_COLUMNS: usize = {text};\n");
    out.push_str("/// The archive's fields of the hot row's columns, in order.\nfn hot_fields() -> Vec<Field> {\n    vec![\n");
    for c in &stored {
        let _ = writeln!(out, "        Field::new({:?}, {}, {}),", c.archive_name, kind(c.archive).3, c.nullable);
    }
    out.push_str("    ]\n}\n\n");

    out.push_str("/// One builder per hot column of the archive.\n#[derive(Debug)]\nstruct HotBuilders {\n");
    for c in &stored {
        let _ = writeln!(out, "    {}: {},", c.name, kind(c.archive).0);
    }
    out.push_str(
        "}\n\n#[allow(clippy::unnecessary_cast)]\nimpl HotBuilders {\n    /// Builders for a batch, the text columns starting with room for `text_bytes` bytes each.\n\
         \x20   fn new(text_bytes: [usize; HOT_TEXT_COLUMNS]) -> HotBuilders {\n        let mut bytes = text_bytes.into_iter();\n        HotBuilders {\n",
    );
    for c in &stored {
        let make = match c.archive {
            "utf8" => "StringBuilder::with_capacity(BATCH_ROWS, bytes.next().unwrap_or(BATCH_ROWS * 24))".to_owned(),
            "ts_ms" | "ts_s" => "TimestampMillisecondBuilder::with_capacity(BATCH_ROWS).with_timezone(\"UTC\")".to_owned(),
            k => format!("{}::with_capacity(BATCH_ROWS)", kind(k).0),
        };
        let _ = writeln!(out, "            {}: {make},", c.name);
    }
    out.push_str("        }\n    }\n\n    fn append(&mut self, r: &StoredRow<'_>) {\n");
    for c in &stored {
        let convert = match c.archive {
            "int64" => "v as i64",
            "int32" => "v as i32",
            "bool" => "v != 0",
            "ts_ms" => "v as i64",
            "ts_s" => "v as i64 * 1000",
            _ => "v",
        };
        let line = match (c.nullable, convert) {
            (false, "v") => format!("self.{0}.append_value(r.{0})", c.name),
            (false, convert) => format!("self.{0}.append_value({1})", c.name, convert.replacen('v', &format!("r.{}", c.name), 1)),
            (true, "v") => format!("self.{0}.append_option(r.{0})", c.name),
            (true, convert) => format!("self.{0}.append_option(r.{0}.map(|v| {convert}))", c.name),
        };
        let _ = writeln!(out, "        {line};");
    }
    out.push_str("    }\n\n    /// The bytes each text column holds so far, in column order.\n    fn text_bytes(&self) -> [usize; HOT_TEXT_COLUMNS] {\n        [\n");
    for c in stored.iter().filter(|c| c.archive == "utf8") {
        let _ = writeln!(out, "            self.{}.values_slice().len(),", c.name);
    }
    out.push_str("        ]\n    }\n\n    /// Moves the columns built so far to `columns`, in order.\n    fn finish(&mut self, columns: &mut Vec<ArrayRef>) {\n");
    for c in &stored {
        let _ = writeln!(out, "        columns.push(Arc::new(self.{}.finish()));", c.name);
    }
    out.push_str("    }\n}\n\n");

    let folded: Vec<&Column> = stored.iter().copied().filter(|c| c.fold).collect();
    out.push_str("/// The fold's columns of an archive batch, typed.\nstruct FoldColumns<'b> {\n");
    for c in &folded {
        let _ = writeln!(out, "    {}: &'b {},", c.name, kind(c.archive).1);
    }
    out.push_str(
        "}\n\n#[allow(clippy::unnecessary_cast)]\nimpl<'b> FoldColumns<'b> {\n    fn of(batch: &'b RecordBatch) -> Result<FoldColumns<'b>, arrow_schema::ArrowError> {\n\
         \x20       use arrow_array::cast::AsArray;\n        Ok(FoldColumns {\n",
    );
    for c in &folded {
        let _ = writeln!(
            out,
            "            {}: column(batch, {:?})?.{}.ok_or_else(|| kind({:?}))?,",
            c.name,
            c.archive_name,
            kind(c.archive).2,
            c.archive_name
        );
    }
    out.push_str("        })\n    }\n\n    fn row(&self, i: usize) -> FoldRow<'b> {\n        use arrow_array::Array;\n        FoldRow {\n");
    for c in &folded {
        let scalar = scalar_of(&c.stored);
        let value = format!("self.{}.value(i)", c.name);
        let read = match c.archive {
            "int64" | "int32" | "ts_ms" => format!("{value} as {scalar}"),
            "ts_s" => format!("({value} / 1000) as {scalar}"),
            "bool" => format!("u8::from({value})"),
            _ => value,
        };
        let read = if c.nullable { format!("self.{}.is_valid(i).then(|| {read})", c.name) } else { read };
        let _ = writeln!(out, "            {}: {read},", c.name);
    }
    out.push_str("        }\n    }\n}\n\n");

    out.push_str(
        "/// The column `name` of an object written before the hot table had it, as\n/// its older rows read (`NULL`, or the column's `DEFAULT`); `None` for\n/// any other column.\n\
         fn added_default(name: &str, rows: usize) -> Option<ArrayRef> {\n    match name {\n",
    );
    for c in stored.iter().filter(|c| c.added.is_some()) {
        let default = c.added.as_deref().unwrap_or_default();
        let array = if c.nullable {
            format!("arrow_array::new_null_array(&{}, rows)", kind(c.archive).3)
        } else {
            format!("Arc::new({}::from(vec![{default}; rows]))", kind(c.archive).1)
        };
        let _ = writeln!(out, "        {:?} => Some({array}),", c.archive_name);
    }
    out.push_str(
        "        _ => None,\n    }\n}\n\n/// The Parquet encoding of each column that has its own.\npub const ENCODINGS: &[(&str, Encoding)] = &[\n",
    );
    for c in &stored {
        if let Some(encoding) = &c.parquet {
            let _ = writeln!(out, "    ({:?}, Encoding::{}),", c.archive_name, camel(encoding));
        }
    }
    out.push_str("];\n");
    out
}

fn keep_fields(columns: &[Column]) -> String {
    let kept: Vec<&Column> = columns.iter().filter(|c| c.keep && !c.derived).collect();
    let mut out = String::from("/// A field a [`Condition`](crate::config::Condition) may name: the `keep` columns of `store/hot_row.toml`.\n#[derive(Debug, Clone, Copy, PartialEq, Eq)]\npub enum KeepField {\n");
    for c in &kept {
        let _ = writeln!(out, "    {},", camel(&c.name));
    }
    out.push_str("}\n\nimpl KeepField {\n    /// The field a condition names.\n    pub fn parse(name: &str) -> Option<KeepField> {\n        Some(match name {\n");
    for c in &kept {
        let _ = writeln!(out, "            {:?} => KeepField::{},", c.name, camel(&c.name));
    }
    out.push_str("            _ => return None,\n        })\n    }\n\n    /// The kind of value the field holds.\n    pub fn kind(self) -> FieldKind {\n        match self {\n");
    for c in &kept {
        let kind = match c.archive {
            "bool" => "Bool",
            "utf8" => "Text",
            _ => "Number",
        };
        let _ = writeln!(out, "            KeepField::{} => FieldKind::{kind},", camel(&c.name));
    }
    out.push_str("        }\n    }\n}\n");
    out
}

fn keep_values(columns: &[Column]) -> String {
    let kept: Vec<&Column> = columns.iter().filter(|c| c.keep && !c.derived).collect();
    let mut out = String::from("impl KeepField {\n    /// The field's value in `r`.\n    #[allow(clippy::unnecessary_cast)]\n    pub fn value<'a>(self, r: &StoredRow<'a>) -> Value<'a> {\n        match self {\n");
    for c in &kept {
        let (variant, convert) = match c.archive {
            "bool" => ("Bool", "v != 0"),
            "utf8" => ("Text", "v"),
            _ => ("Number", "v as f64"),
        };
        let value = match (c.nullable, convert) {
            (true, "v") => format!("r.{}", c.name),
            (true, convert) => format!("r.{}.map(|v| {convert})", c.name),
            (false, convert) => format!("Some({})", convert.replacen('v', &format!("r.{}", c.name), 1)),
        };
        let _ = writeln!(out, "            KeepField::{} => Value::{variant}({value}),", camel(&c.name));
    }
    out.push_str("        }\n    }\n}\n");
    out
}

/// Writes the six files into `out_dir`.
pub fn generate(toml: &str, out_dir: &std::path::Path) -> Result<(), String> {
    let columns = parse(toml)?;
    for (file, text) in [
        ("hot_columns.rs", hot_columns(&columns)),
        ("hot_row.rs", hot_row(&columns)),
        ("stored_row.rs", stored_row(&columns)),
        ("archive_columns.rs", archive_columns(&columns)),
        ("keep_fields.rs", keep_fields(&columns)),
        ("keep_values.rs", keep_values(&columns)),
    ] {
        std::fs::write(out_dir.join(file), text).map_err(|e| format!("{file}: {e}"))?;
    }
    Ok(())
}
