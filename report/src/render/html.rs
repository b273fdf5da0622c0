//! The HTML page. In: the `page` view's [`Document`]. Out: one
//! self-contained file (inline CSS and SVG, the document's JSON embedded,
//! no script, no font or request beyond the file): the overview, the
//! diagnosis walk, traffic and latency time series, latency by input
//! bucket, the stage breakdown, the version comparison, the capacity knee
//! and forecast, cost by business line, cache and errors. Every figure shown is a cell of the JSON
//! document, marked `data-figure="<table>.<row>.<column>"` with its raw
//! `data-value`.

use crate::document::{Cell, Document, Kind, Table};
use crate::render::svg::{bar_chart, escape, line_chart, Series};

const STYLE: &str = "body{font-family:'DejaVu Sans',sans-serif;margin:24px;color:#1b1b1b;background:#fff;max-width:1440px}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}\
h3{font-size:14px;margin:14px 0 6px}.meta{color:#555;font-size:13px;margin:2px 0}\
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}\
.card .k{font-size:12px;color:#555}.card .v{font-size:22px;font-weight:bold}.card .d{font-size:12px;color:#555}\
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:14px}\
table{border-collapse:collapse;font-size:12px;margin:6px 0 12px}th,td{border-bottom:1px solid #eee;padding:3px 8px;text-align:left}\
td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f6f6f6}\
figure{margin:0}figcaption{font-size:13px;font-weight:bold;margin:0 0 4px}svg.chart{width:100%;max-width:680px;height:auto;border:1px solid #eee;border-radius:6px}\
svg .grid{stroke:#e5e5e5}svg text{font-size:11px;fill:#444}svg .legend{font-size:11px}\
.alert{background:#fde8e8;border:1px solid #e0a0a0;padding:6px 10px;border-radius:6px;margin:6px 0}\
.note{background:#f3f6fb;border:1px solid #c9d6ea;padding:6px 10px;border-radius:6px;margin:6px 0;font-size:13px}";

/// The headline cards: (overview metric, label).
const CARDS: [(&str, &str); 8] = [
    ("requests", "requests"),
    ("success_rate", "success rate"),
    ("p99_ttft_ms", "TTFT p99 (ms)"),
    ("p99_tpot_ms", "TPOT p99 (ms)"),
    ("p99_total_ms", "latency p99 (ms)"),
    ("tokens_per_minute", "tokens / minute"),
    ("cost_usd", "cost"),
    ("error_rate", "error rate"),
];

/// A figure's cell: its shown form, raw value and JSON path.
fn figure(tag: &str, class: &str, table: &str, row: usize, column: &str, cell: &Cell) -> String {
    let value = cell.json();
    let raw = if value.is_string() { value.as_str().unwrap_or_default().to_owned() } else { value.to_string() };
    format!("<{tag} class=\"{class}\" data-figure=\"{table}.{row}.{column}\" data-value=\"{}\">{}</{tag}>", escape(&raw), escape(&cell.display()))
}

fn html_table(t: &Table, limit: usize) -> String {
    let mut out = format!("<h3>{}</h3><table data-table=\"{}\"><thead><tr>", escape(&t.title), t.name);
    for (_, label) in &t.columns {
        out.push_str(&format!("<th>{}</th>", escape(label)));
    }
    out.push_str("</tr></thead><tbody>");
    for (r, row) in t.rows.iter().take(limit).enumerate() {
        out.push_str("<tr>");
        for ((key, _), cell) in t.columns.iter().zip(row) {
            match cell {
                Cell::Text(s) => out.push_str(&format!("<td>{}</td>", escape(s))),
                Cell::Num(..) => out.push_str(&figure("td", "num", t.name, r, key, cell)),
            }
        }
        out.push_str("</tr>");
    }
    if t.rows.is_empty() {
        out.push_str(&format!("<tr><td colspan=\"{}\">no rows</td></tr>", t.columns.len()));
    }
    out.push_str("</tbody></table>");
    if t.rows.len() > limit {
        out.push_str(&format!("<p class=\"meta\">the first {limit} of {} rows; all are in the JSON output</p>", t.rows.len()));
    }
    out
}

/// A chart with its visible caption.
fn figure_of(title: &str, svg: String) -> String {
    format!("<figure><figcaption>{}</figcaption>{svg}</figure>", escape(title))
}

/// The values of `column` of `t`.
fn values(t: &Table, column: &str) -> Vec<Option<f64>> {
    let i = t.column(column);
    t.rows.iter().map(|r| i.and_then(|i| r[i].value())).collect()
}

fn labels(t: &Table, column: &str, and: Option<&str>) -> Vec<String> {
    let i = t.column(column);
    let j = and.and_then(|c| t.column(c));
    t.rows
        .iter()
        .map(|r| {
            let a = i.map(|i| r[i].display()).unwrap_or_default();
            j.map_or(a.clone(), |j| format!("{a} {}", r[j].display()))
        })
        .collect()
}

/// Draws a chart with `draw` and captions it with its title.
fn chart(
    draw: fn(&str, &str, &[String], &[Series], Kind) -> String,
    id: &str,
    title: &str,
    labels: &[String],
    series: &[Series],
    kind: Kind,
) -> String {
    figure_of(title, draw(id, title, labels, series, kind))
}

fn series(t: &Table, columns: &[(&str, &str)]) -> Vec<Series> {
    columns.iter().map(|(c, name)| Series { name: (*name).to_owned(), values: values(t, c) }).collect()
}

/// The page of `doc` (the `page` view), generated at `generated` (shown only).
pub fn page(doc: &Document, generated: &str) -> String {
    let empty = Table::new("none", "", &[]);
    let table = |name: &str| doc.table(name).unwrap_or(&empty);
    let mut body = String::new();
    body.push_str(&format!(
        "<h1>inferlog: LLM inference traffic, latency and cost</h1><p class=\"meta\">{}..{} ({} days){}; generated {}</p><p class=\"meta\">answered by {}</p>",
        doc.range.from,
        doc.range.to,
        doc.range.days,
        doc.previous.as_ref().map_or_else(String::new, |p| format!(", compared with {}..{}", p.from, p.to)),
        escape(generated),
        escape(&doc.tier_summary())
    ));
    if let Some(line) = &doc.filter.business_line {
        body.push_str(&format!("<p class=\"meta\">business line {}</p>", escape(line)));
    }
    if let Some(model) = &doc.filter.model {
        body.push_str(&format!("<p class=\"meta\">model {}</p>", escape(model)));
    }
    for a in &doc.alerts {
        body.push_str(&format!("<div class=\"alert\">{}</div>", escape(a)));
    }
    for n in &doc.notes {
        body.push_str(&format!("<div class=\"note\">{}</div>", escape(n)));
    }

    // Overview.
    let overview = table("overview");
    body.push_str("<h2 id=\"overview\">Overview</h2><div class=\"cards\">");
    for (metric, label) in CARDS {
        let Some(r) = overview.rows.iter().position(|row| matches!(&row[0], Cell::Text(k) if k == metric)) else { continue };
        let row = &overview.rows[r];
        body.push_str(&format!(
            "<div class=\"card\"><div class=\"k\">{}</div>{}<div class=\"d\">{} vs {}</div></div>",
            escape(label),
            figure("div", "v", "overview", r, "current", &row[1]),
            figure("span", "", "overview", r, "change", &row[3]),
            figure("span", "", "overview", r, "previous", &row[2])
        ));
    }
    body.push_str("</div>");
    body.push_str(&html_table(overview, 100));
    body.push_str(&html_table(table("errors_by_code"), 100));

    // Diagnosis: the path the decision tree took.
    body.push_str("<h2 id=\"diagnosis\">Diagnosis</h2>");
    body.push_str(&html_table(table("diagnosis"), 100));
    if let Some(dims) = doc.table("diagnosis_dimensions") {
        body.push_str(&html_table(dims, 100));
    }

    // Traffic and latency over time.
    let hourly = table("hourly");
    let hours = labels(hourly, "hour", None);
    body.push_str("<h2 id=\"performance\">Performance</h2><div class=\"grid\">");
    body.push_str(&chart(
        line_chart,
        "requests",
        "requests per hour",
        &hours,
        &series(hourly, &[("requests", "requests"), ("errors", "errors")]),
        Kind::Count,
    ));
    body.push_str(&chart(line_chart, "tokens", "tokens per hour (input + output)", &hours, &series(hourly, &[("tokens", "tokens")]), Kind::Count));
    body.push_str(&chart(
        line_chart,
        "ttft",
        "TTFT per hour (ms)",
        &hours,
        &series(hourly, &[("ttft_p50_ms", "p50"), ("ttft_p95_ms", "p95"), ("ttft_p99_ms", "p99")]),
        Kind::Ms,
    ));
    body.push_str(&chart(
        line_chart,
        "tpot",
        "TPOT per hour (ms)",
        &hours,
        &series(hourly, &[("tpot_p50_ms", "p50"), ("tpot_p95_ms", "p95"), ("tpot_p99_ms", "p99")]),
        Kind::Ms,
    ));
    let by_bucket = table("latency_by_input_bucket");
    body.push_str(&chart(
        bar_chart,
        "latency_by_input_bucket",
        "latency by input bucket (ms)",
        &labels(by_bucket, "input_bucket", None),
        &series(by_bucket, &[("total_p50_ms", "total p50"), ("total_p99_ms", "total p99"), ("ttft_p99_ms", "TTFT p99")]),
        Kind::Ms,
    ));
    let stages = table("stages");
    body.push_str(&chart(
        bar_chart,
        "stages",
        "stage breakdown by input bucket: p99 (ms)",
        &labels(stages, "input_bucket", None),
        &series(stages, &[("queue_p99_ms", "queue"), ("prefill_p99_ms", "prefill"), ("decode_p99_ms", "decode")]),
        Kind::Ms,
    ));
    body.push_str("</div>");
    body.push_str(&html_table(by_bucket, 100));
    body.push_str(&html_table(stages, 100));
    body.push_str(&html_table(hourly, 0));

    // Version comparison (the page's pick, or --a/--b).
    if let Some(compare) = doc.table("compare") {
        let mut by_input = compare.clone();
        by_input.rows.retain(|r| r[0].display() != "all" && r[1].display() == "all");
        body.push_str(&format!("<h2 id=\"compare\">Version comparison</h2><p class=\"meta\">{}</p><div class=\"grid\">", escape(&compare.title)));
        body.push_str(&chart(
            bar_chart,
            "compare_ttft",
            "TTFT p99 by input bucket: A against B (ms)",
            &labels(&by_input, "input_bucket", None),
            &series(&by_input, &[("ttft_p99_ms_a", "A"), ("ttft_p99_ms_b", "B")]),
            Kind::Ms,
        ));
        body.push_str(&chart(
            bar_chart,
            "compare_total",
            "total latency p99 by input bucket: A against B (ms)",
            &labels(&by_input, "input_bucket", None),
            &series(&by_input, &[("total_p99_ms_a", "A"), ("total_p99_ms_b", "B")]),
            Kind::Ms,
        ));
        body.push_str("</div>");
        body.push_str(&html_table(compare, 60));
        if let Some(types) = doc.table("compare_request_types").filter(|t| !t.rows.is_empty()) {
            body.push_str(&html_table(types, 30));
        }
        body.push_str(&html_table(table("compare_errors"), 30));
        if let Some(pairs) = doc.table("compare_pairs") {
            body.push_str(&html_table(pairs, 10));
        }
    }

    // Capacity: the knee and the forecast.
    if let Some(curve) = doc.table("knee_curve") {
        body.push_str("<h2 id=\"capacity\">Capacity</h2><div class=\"grid\">");
        body.push_str(&chart(
            line_chart,
            "knee",
            "fleet p99 TTFT by the busiest minute's load (requests/min), against the threshold",
            &labels(curve, "requests_per_minute", None),
            &series(curve, &[("p99_ttft_ms", "p99 TTFT"), ("threshold_ms", "threshold")]),
            Kind::Ms,
        ));
        body.push_str("</div>");
        body.push_str(&html_table(table("knee"), 20));
        body.push_str(&html_table(table("forecast"), 20));
        body.push_str(&html_table(table("minute_load"), 20));
    }

    // Cost.
    let lines = table("cost_by_business_line");
    body.push_str("<h2 id=\"cost\">Cost</h2><div class=\"grid\">");
    body.push_str(&chart(
        bar_chart,
        "cost_by_business_line",
        "cost by business line (USD)",
        &labels(lines, "business_line", None),
        &series(lines, &[("cost_usd", "cost")]),
        Kind::Usd,
    ));
    body.push_str(&chart(
        bar_chart,
        "tokens_by_business_line",
        "tokens by business line",
        &labels(lines, "business_line", None),
        &series(lines, &[("input_tokens", "input"), ("cached_input_tokens", "cached input"), ("output_tokens", "output")]),
        Kind::Count,
    ));
    body.push_str("</div>");
    body.push_str(&html_table(lines, 100));
    body.push_str(&html_table(table("cost_by_model"), 100));
    body.push_str(&html_table(table("budgets"), 100));

    // Spikes: the last hour's tokens against the same hour before.
    if let Some(spikes) = doc.table("spikes").filter(|t| !t.rows.is_empty()) {
        body.push_str("<h2 id=\"spikes\">Spikes</h2><div class=\"grid\">");
        body.push_str(&chart(
            bar_chart,
            "spikes",
            "tokens in the hour against the same hour of the weeks before",
            &labels(spikes, "business_line", None),
            &series(spikes, &[("tokens", "this hour"), ("baseline_tokens", "baseline")]),
            Kind::Count,
        ));
        body.push_str("</div>");
        body.push_str(&html_table(spikes, 100));
        body.push_str(&html_table(table("spike_callers"), 20));
    }

    // Waste: repeated prompts, long outputs, answers cut at max_tokens.
    if let Some(waste) = doc.table("waste").filter(|t| !t.rows.is_empty()) {
        body.push_str("<h2 id=\"waste\">Waste</h2><div class=\"grid\">");
        let outputs = table("waste_outputs");
        // A chart of zeros (no prompt hashes, no max_tokens) says nothing the tables do not.
        let any = |t: &Table, columns: &[&str]| {
            columns.iter().filter_map(|c| t.column(c)).any(|i| t.rows.iter().any(|r| r[i].value().is_some_and(|v| v > 0.0)))
        };
        if any(waste, &["repeat_tokens", "cache_saved_prefill_tokens"]) {
            body.push_str(&chart(
                bar_chart,
                "waste",
                "tokens on repeated prompts by business line",
                &labels(waste, "business_line", None),
                &series(waste, &[("repeat_tokens", "tokens on repeats"), ("cache_saved_prefill_tokens", "prefill a prompt cache saves")]),
                Kind::Count,
            ));
        }
        if any(outputs, &["long_share", "at_limit_share"]) {
            body.push_str(&chart(
                bar_chart,
                "waste_outputs",
                "long outputs and answers cut at max_tokens by request type",
                &labels(outputs, "request_type", None),
                &series(outputs, &[("long_share", "long (> 4× p50)"), ("at_limit_share", "ended at max_tokens")]),
                Kind::Share,
            ));
        }
        body.push_str("</div>");
        body.push_str(&html_table(waste, 100));
        body.push_str(&html_table(table("waste_prompts"), 20));
        body.push_str(&html_table(outputs, 100));
    }

    // Cache and errors.
    let cache = table("cache");
    let errors = table("errors_by_code");
    body.push_str("<h2 id=\"cache-errors\">Cache and errors</h2><div class=\"grid\">");
    body.push_str(&chart(
        bar_chart,
        "cache",
        "cache-hit ratio by model version",
        &labels(cache, "model_name", Some("model_version")),
        &series(cache, &[("hit_ratio", "hit ratio"), ("cached_input_share", "share of input cached")]),
        Kind::Share,
    ));
    body.push_str(&chart(
        bar_chart,
        "errors",
        "error share by code",
        &labels(errors, "name", None),
        &series(errors, &[("share", "this range"), ("previous_share", "previous range")]),
        Kind::Share,
    ));
    body.push_str("</div>");
    body.push_str(&html_table(cache, 100));
    body.push_str(&html_table(table("errors"), 25));

    let data = serde_json::to_string(&doc.json()).unwrap_or_default().replace("</", "<\\/");
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><link rel=\"icon\" href=\"data:,\">\
         <title>inferlog report {}..{}</title><style>{STYLE}</style></head><body>{body}\
         <script type=\"application/json\" id=\"inferlog-data\">{data}</script></body></html>\n",
        doc.range.from, doc.range.to
    )
}
