//! Charts as inline SVG, drawn here (no script, no network). In: labels
//! and series of numbers. Out: an `<svg class="chart">` whose every data
//! point is a `.mark` element carrying its label and value in a `<title>`
//! (the tooltip), and `data-chart` / `data-marks` attributes a test reads.

use crate::document::{show, Kind};

pub const WIDTH: f64 = 680.0;
pub const HEIGHT: f64 = 250.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 42.0;
/// Colour-blind-safe (Okabe–Ito).
const PALETTE: [&str; 6] = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9"];

/// One named line or bar series, a value per label (`None`: no value).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A round upper bound of the axis for `max`.
fn axis_max(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|v| *v >= max).unwrap_or(10.0 * magnitude)
}

/// A tick label: `kind`'s form without decimals for large values.
fn tick(v: f64, kind: Kind) -> String {
    match kind {
        Kind::Count | Kind::Rate if v >= 1e6 => format!("{:.1}M", v / 1e6),
        Kind::Count | Kind::Rate if v >= 1e4 => format!("{:.0}k", v / 1e3),
        Kind::Ms | Kind::Rate => format!("{v:.0}"),
        _ => show(v, kind),
    }
}

/// The frame: axes, grid, y ticks, legend. Returns (svg head, y scale).
fn frame(id: &str, title: &str, series: &[Series], kind: Kind, marks: usize) -> (String, f64) {
    let max = series.iter().flat_map(|s| s.values.iter().flatten()).fold(0.0_f64, |a, b| a.max(*b));
    let top = axis_max(max);
    let mut svg = format!(
        "<svg class=\"chart\" data-chart=\"{id}\" data-marks=\"{marks}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{t}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <title>{t}</title>",
        t = escape(title)
    );
    for i in 0..=4 {
        let v = top * f64::from(i) / 4.0;
        let y = HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * f64::from(i) / 4.0;
        svg.push_str(&format!(
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{x2}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/><text class=\"tick\" x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{label}</text>",
            x2 = WIDTH - RIGHT,
            tx = LEFT - 6.0,
            ty = y + 4.0,
            label = escape(&tick(v, kind))
        ));
    }
    let mut x = LEFT;
    for (i, s) in series.iter().enumerate() {
        svg.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"8\" width=\"10\" height=\"10\" fill=\"{c}\"/><text class=\"legend\" x=\"{tx:.1}\" y=\"17\">{n}</text>",
            c = PALETTE[i % PALETTE.len()],
            tx = x + 14.0,
            n = escape(&s.name)
        ));
        x += 24.0 + 7.0 * s.name.chars().count() as f64;
    }
    (svg, top)
}

fn y_of(v: f64, top: f64) -> f64 {
    HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * (v / top)
}

/// A line chart over `labels` (time), at most ~8 x labels shown.
pub fn line_chart(id: &str, title: &str, labels: &[String], series: &[Series], kind: Kind) -> String {
    let marks = series.iter().map(|s| s.values.iter().flatten().count()).sum();
    let (mut svg, top) = frame(id, title, series, kind, marks);
    let n = labels.len().max(1);
    let step = (WIDTH - LEFT - RIGHT) / (n.max(2) - 1) as f64;
    let x_of = |i: usize| LEFT + step * i as f64;
    let every = n.div_ceil(8).max(1);
    for (i, label) in labels.iter().enumerate().filter(|(i, _)| i % every == 0) {
        svg.push_str(&format!(
            "<text class=\"tick\" x=\"{x:.1}\" y=\"{y}\" text-anchor=\"middle\">{l}</text>",
            x = x_of(i),
            y = HEIGHT - BOTTOM + 16.0,
            l = escape(label.get(5..).unwrap_or(label))
        ));
    }
    for (si, s) in series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        // A gap (no value) breaks the line.
        let mut path = String::new();
        let mut pen_down = false;
        for (i, v) in s.values.iter().enumerate() {
            match v {
                Some(v) => {
                    path.push_str(&format!("{}{:.1},{:.1} ", if pen_down { "L" } else { "M" }, x_of(i), y_of(*v, top)));
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        svg.push_str(&format!("<path d=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"/>", path.trim_end()));
        for (i, v) in s.values.iter().enumerate() {
            if let Some(v) = v {
                svg.push_str(&format!(
                    "<circle class=\"mark\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2\" fill=\"{color}\"><title>{l} · {n}: {val}</title></circle>",
                    x = x_of(i),
                    y = y_of(*v, top),
                    l = escape(&labels[i]),
                    n = escape(&s.name),
                    val = escape(&show(*v, kind))
                ));
            }
        }
    }
    svg.push_str("</svg>");
    svg
}

/// Grouped bars: one group per label, one bar per series.
pub fn bar_chart(id: &str, title: &str, labels: &[String], series: &[Series], kind: Kind) -> String {
    let marks = series.iter().map(|s| s.values.iter().flatten().count()).sum();
    let (mut svg, top) = frame(id, title, series, kind, marks);
    let groups = labels.len().max(1) as f64;
    let slot = (WIDTH - LEFT - RIGHT) / groups;
    let bar = (slot * 0.8 / series.len().max(1) as f64).min(40.0);
    for (i, label) in labels.iter().enumerate() {
        let x0 = LEFT + slot * i as f64 + (slot - bar * series.len() as f64) / 2.0;
        svg.push_str(&format!(
            "<text class=\"tick\" x=\"{x:.1}\" y=\"{y}\" text-anchor=\"middle\">{l}</text>",
            x = LEFT + slot * (i as f64 + 0.5),
            y = HEIGHT - BOTTOM + 16.0,
            l = escape(label)
        ));
        for (si, s) in series.iter().enumerate() {
            let Some(v) = s.values.get(i).copied().flatten() else { continue };
            let y = y_of(v, top);
            svg.push_str(&format!(
                "<rect class=\"mark\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{c}\"><title>{l} · {n}: {val}</title></rect>",
                x = x0 + bar * si as f64,
                w = (bar - 2.0).max(1.0),
                h = (HEIGHT - BOTTOM - y).max(0.5),
                c = PALETTE[si % PALETTE.len()],
                l = escape(label),
                n = escape(&s.name),
                val = escape(&show(v, kind))
            ));
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_one_mark_with_its_tooltip() {
        let labels = vec!["2026-11-30 00:00".to_owned(), "2026-11-30 01:00".to_owned(), "2026-11-30 02:00".to_owned()];
        let s = [Series { name: "p99".into(), values: vec![Some(10.0), None, Some(30.0)] }];
        let svg = line_chart("ttft", "TTFT <ms>", &labels, &s, Kind::Ms);
        assert!(svg.contains("data-chart=\"ttft\" data-marks=\"2\""), "{svg}");
        assert_eq!(svg.matches("class=\"mark\"").count(), 2);
        assert!(svg.contains("<title>2026-11-30 02:00 · p99: 30.0</title>"), "{svg}");
        assert!(svg.contains("TTFT &lt;ms&gt;"));
        assert_eq!(svg.matches(" M").count() + svg.matches("\"M").count(), 2, "the gap breaks the line: {svg}");
        let bars =
            bar_chart("cost", "cost", &["a".into(), "b".into()], &[Series { name: "usd".into(), values: vec![Some(1.5), Some(0.0)] }], Kind::Usd);
        assert_eq!(bars.matches("class=\"mark\"").count(), 2);
        assert!(bars.contains("<title>a · usd: $1.5000</title>"));
        assert_eq!(axis_max(7.3), 10.0);
        assert_eq!(axis_max(230.0), 250.0);
        assert_eq!(axis_max(0.0), 1.0);
    }
}
