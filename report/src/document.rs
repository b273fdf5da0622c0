//! What every view produces: a [`Document`] of named tables whose cells
//! carry raw numbers and how to show them. In: a view's figures. Out: the
//! same figures as text, CSV, JSON or the HTML page (see [`crate::render`]),
//! so every number shown anywhere is a number of the JSON output.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::facts::Tier;
use crate::range::RangeText;
use crate::source::Filter;

/// How a number is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A whole number (requests, tokens).
    Count,
    /// Milliseconds, one decimal.
    Ms,
    /// A share in [0, 1], shown as a percentage with two decimals.
    Share,
    /// US dollars, four decimals.
    Usd,
    /// US dollars of a sum some of whose requests had no price: the true
    /// cost is at least this, shown `≥$…`.
    UsdPartial,
    /// A rate (tokens per minute), one decimal.
    Rate,
    /// A relative change, shown as a signed percentage.
    Change,
    /// A change of a share, in percentage points.
    Points,
}

impl Kind {
    /// How `counts`' cost ([`crate::facts::Counts::cost`]) is shown:
    /// [`Kind::UsdPartial`] when it is a partial sum (a lower bound).
    pub fn of_cost(counts: &crate::facts::Counts) -> Kind {
        if counts.partly_priced() {
            Kind::UsdPartial
        } else {
            Kind::Usd
        }
    }
}

/// One cell: text, or a number (`None`: no value, shown as `-`).
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Text(String),
    Num(Option<f64>, Kind),
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }
    pub fn count(n: u64) -> Cell {
        Cell::Num(Some(n as f64), Kind::Count)
    }
    pub fn num(v: Option<f64>, kind: Kind) -> Cell {
        Cell::Num(v.filter(|v| v.is_finite()), kind)
    }

    /// The cell as it is shown.
    pub fn display(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Num(None, _) => "-".into(),
            Cell::Num(Some(v), kind) => show(*v, *kind),
        }
    }

    /// The cell's raw value.
    pub fn json(&self) -> Value {
        match self {
            Cell::Text(s) => Value::String(s.clone()),
            Cell::Num(None, _) => Value::Null,
            Cell::Num(Some(v), Kind::Count) => Value::from(*v as i64),
            Cell::Num(Some(v), _) => serde_json::Number::from_f64(*v).map_or(Value::Null, Value::Number),
        }
    }

    pub fn value(&self) -> Option<f64> {
        match self {
            Cell::Num(v, _) => *v,
            Cell::Text(_) => None,
        }
    }
}

/// `v` shown as `kind` says.
pub fn show(v: f64, kind: Kind) -> String {
    match kind {
        Kind::Count => format!("{v:.0}"),
        Kind::Ms => format!("{v:.1}"),
        Kind::Share => format!("{:.2}%", v * 100.0),
        Kind::Usd => format!("${v:.4}"),
        Kind::UsdPartial => format!("≥${v:.4}"),
        Kind::Rate => format!("{v:.1}"),
        Kind::Change => format!("{:+.1}%", v * 100.0),
        Kind::Points => format!("{:+.2} pt", v * 100.0),
    }
}

/// One table of a view.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Stable name, the key in the JSON output.
    pub name: &'static str,
    pub title: String,
    /// (key in the JSON rows, header shown).
    pub columns: Vec<(&'static str, &'static str)>,
    pub rows: Vec<Vec<Cell>>,
}

/// A column name or label built once at start (the views' column lists are
/// derived from the measures, and a [`Table`] holds `'static` names).
pub fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

impl Table {
    pub fn new(name: &'static str, title: impl Into<String>, columns: &[(&'static str, &'static str)]) -> Table {
        Table { name, title: title.into(), columns: columns.to_vec(), rows: Vec::new() }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(row.len(), self.columns.len(), "{}: a row of {} cells for {} columns", self.name, row.len(), self.columns.len());
        self.rows.push(row);
    }

    /// The index of column `key`.
    pub fn column(&self, key: &str) -> Option<usize> {
        self.columns.iter().position(|(k, _)| *k == key)
    }

    /// The rows as JSON objects keyed by column.
    pub fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|row| Value::Object(self.columns.iter().zip(row).map(|((k, _), c)| ((*k).to_owned(), c.json())).collect::<Map<_, _>>()))
            .collect();
        serde_json::json!({ "title": self.title, "rows": rows })
    }
}

/// Which tier answered one day.
#[derive(Debug, Clone, Serialize)]
pub struct DayTier {
    pub day: String,
    pub tier: Tier,
}

/// A view's whole output.
#[derive(Debug, Clone)]
pub struct Document {
    pub view: &'static str,
    pub range: RangeText,
    /// The range compared against, for views that compare.
    pub previous: Option<RangeText>,
    pub filter: Filter,
    pub tiers: Vec<DayTier>,
    pub tables: Vec<Table>,
    /// Facts about the answer a reader must know (days missing, users from hot days only).
    pub notes: Vec<String>,
    /// Thresholds crossed: the command exits 1 when there is any.
    pub alerts: Vec<String>,
}

impl Document {
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }

    pub fn json(&self) -> Value {
        let tables: Map<String, Value> = self.tables.iter().map(|t| (t.name.to_owned(), t.json())).collect();
        serde_json::json!({
            "view": self.view,
            "range": self.range,
            "previous": self.previous,
            "filter": self.filter,
            "tiers": self.tiers,
            "tables": tables,
            "notes": self.notes,
            "alerts": self.alerts,
        })
    }

    /// A one-line summary of which tier answered which days, e.g.
    /// `hot: 2026-11-28..2026-12-01; aggregates: 2026-11-20..2026-11-27`.
    pub fn tier_summary(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        for tier in [Tier::Hot, Tier::Aggregates, Tier::Archive, Tier::None] {
            let days: Vec<inferlog_store::Day> =
                self.tiers.iter().filter(|t| t.tier == tier).filter_map(|t| inferlog_store::parse_day(&t.day)).collect();
            if !days.is_empty() {
                parts.push(format!("{}: {}", tier.as_str(), crate::range::runs_text(&days)));
            }
        }
        parts.join("; ")
    }
}

/// The relative change from `before` to `now` (`None` when `before` is zero or missing).
pub fn change(now: Option<f64>, before: Option<f64>) -> Option<f64> {
    match (now, before) {
        (Some(a), Some(b)) if b != 0.0 => Some((a - b) / b.abs()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_show_their_kind_and_keep_the_raw_value() {
        assert_eq!(Cell::count(1234).display(), "1234");
        assert_eq!(Cell::num(Some(12.345), Kind::Ms).display(), "12.3");
        assert_eq!(Cell::num(Some(0.97849), Kind::Share).display(), "97.85%");
        assert_eq!(Cell::num(Some(0.2), Kind::Change).display(), "+20.0%");
        assert_eq!(Cell::num(Some(-0.05), Kind::Points).display(), "-5.00 pt");
        assert_eq!(Cell::num(Some(f64::NAN), Kind::Ms).display(), "-");
        assert_eq!(Cell::num(Some(0.97849), Kind::Share).json(), serde_json::json!(0.97849));
        assert_eq!(Cell::count(7).json(), serde_json::json!(7));
        assert_eq!(change(Some(3.0), Some(2.0)), Some(0.5));
        assert_eq!(change(Some(3.0), Some(0.0)), None);
    }

    #[test]
    fn tables_become_json_rows_keyed_by_column() {
        let mut t = Table::new("t", "T", &[("line", "business line"), ("requests", "requests")]);
        t.push(vec![Cell::text("search"), Cell::count(3)]);
        assert_eq!(t.json()["rows"][0], serde_json::json!({"line": "search", "requests": 3}));
        let doc = Document {
            view: "v",
            range: crate::range::Range { from: 0, to: 3 }.text(),
            previous: None,
            filter: Filter::default(),
            tiers: [(0, Tier::Aggregates), (1, Tier::Aggregates), (2, Tier::Hot), (3, Tier::None)]
                .iter()
                .map(|(d, t)| DayTier { day: inferlog_store::day_string(*d), tier: *t })
                .collect(),
            tables: vec![t],
            notes: vec![],
            alerts: vec![],
        };
        assert_eq!(doc.tier_summary(), "hot: 1970-01-03; aggregates: 1970-01-01..1970-01-02; none: 1970-01-04");
        assert_eq!(doc.json()["tables"]["t"]["rows"][0]["requests"], 3);
    }
}
