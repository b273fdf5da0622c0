//! Rendering a [`Document`]. In: a view's document. Out: aligned text
//! tables, CSV (each table a block under a `# name` line, raw values),
//! JSON ([`Document::json`]) or the HTML page ([`html`], with [`svg`] charts).

pub mod html;
pub mod svg;

use crate::document::{Cell, Document, Table};

/// The header lines: view, range, comparison, tiers, filter.
fn header(doc: &Document) -> Vec<String> {
    let mut lines = vec![format!(
        "inferlog-report {}: {}..{} ({} days){}",
        doc.view,
        doc.range.from,
        doc.range.to,
        doc.range.days,
        doc.previous.as_ref().map_or_else(String::new, |p| format!(" against {}..{}", p.from, p.to))
    )];
    lines.push(format!("answered by {}", doc.tier_summary()));
    let mut filter = Vec::new();
    if let Some(line) = &doc.filter.business_line {
        filter.push(format!("business line {line}"));
    }
    if let Some(model) = &doc.filter.model {
        filter.push(format!("model {model}"));
    }
    if !filter.is_empty() {
        lines.push(format!("only {}", filter.join(", ")));
    }
    lines
}

fn text_table(t: &Table, out: &mut String) {
    let shown: Vec<Vec<String>> = t.rows.iter().map(|r| r.iter().map(Cell::display).collect()).collect();
    let widths: Vec<usize> = t
        .columns
        .iter()
        .enumerate()
        .map(|(i, (_, label))| shown.iter().map(|r| r[i].chars().count()).chain([label.chars().count()]).max().unwrap_or(0))
        .collect();
    let numeric: Vec<bool> = (0..t.columns.len()).map(|i| t.rows.first().is_some_and(|r| matches!(r[i], Cell::Num(..)))).collect();
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| if numeric[i] { format!("{c:>w$}", w = widths[i]) } else { format!("{c:<w$}", w = widths[i]) })
            .collect();
        parts.join("  ").trim_end().to_owned() + "\n"
    };
    out.push_str(&format!("\n== {} ==\n", t.title));
    out.push_str(&line(t.columns.iter().map(|(_, l)| (*l).to_owned()).collect()));
    if shown.is_empty() {
        out.push_str("(no rows)\n");
    }
    for row in shown {
        out.push_str(&line(row));
    }
}

pub fn text(doc: &Document) -> String {
    let mut out = header(doc).join("\n") + "\n";
    for t in &doc.tables {
        text_table(t, &mut out);
    }
    if !doc.notes.is_empty() || !doc.alerts.is_empty() {
        out.push('\n');
    }
    for n in &doc.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    for a in &doc.alerts {
        out.push_str(&format!("ALERT: {a}\n"));
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

pub fn csv(doc: &Document) -> String {
    let mut out = String::new();
    for (i, t) in doc.tables.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("# {}: {}\n", t.name, csv_field(&t.title)));
        out.push_str(&t.columns.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(","));
        out.push('\n');
        for row in &t.rows {
            let cells: Vec<String> = row
                .iter()
                .map(|c| match c {
                    Cell::Text(s) => csv_field(s),
                    Cell::Num(None, _) => String::new(),
                    Cell::Num(Some(_), _) => c.json().to_string(),
                })
                .collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
    }
    out
}

pub fn json(doc: &Document) -> String {
    serde_json::to_string_pretty(&doc.json()).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::Kind;

    fn doc() -> Document {
        let mut t = Table::new("t", "a table", &[("line", "business line"), ("share", "share")]);
        t.push(vec![Cell::text("search, web"), Cell::num(Some(0.5), Kind::Share)]);
        t.push(vec![Cell::text("ads"), Cell::num(None, Kind::Share)]);
        Document {
            view: "cost",
            range: crate::range::Range { from: 20_000, to: 20_001 }.text(),
            previous: None,
            filter: crate::source::Filter { business_line: None, model: Some("m".into()) },
            tiers: vec![],
            tables: vec![t],
            notes: vec!["n".into()],
            alerts: vec!["a".into()],
        }
    }

    #[test]
    fn text_aligns_numbers_right_and_lists_notes_and_alerts() {
        let out = text(&doc());
        assert!(out.starts_with("inferlog-report cost: 2024-10-04..2024-10-05 (2 days)\n"), "{out}");
        assert!(out.contains("only model m\n"), "{out}");
        assert!(out.contains("business line   share\nsearch, web    50.00%\nads                 -\n"), "{out}");
        assert!(out.ends_with("note: n\nALERT: a\n"), "{out}");
    }

    #[test]
    fn csv_quotes_and_keeps_raw_values() {
        assert_eq!(csv(&doc()), "# t: a table\nline,share\n\"search, web\",0.5\nads,\n");
    }
}
