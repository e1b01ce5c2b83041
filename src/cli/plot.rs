//! Drawing curves: a character plot for the terminal and a self-contained SVG file.

use std::fmt::Write as _;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Float64Type};

use super::canvas::{Frame, PANEL_H, PANEL_W, escape, float_values, group_keys, is_surface, short};
use crate::session::QueryOutput;

/// One curve to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// x coordinates (increasing).
    pub xs: Vec<f64>,
    /// y coordinates.
    pub ys: Vec<f64>,
    /// A band around the curve (drawn shaded), if the result carries one.
    pub band: Option<Band>,
}

/// A band around a curve.
#[derive(Debug, Clone, PartialEq)]
pub enum Band {
    /// Half-widths at each x (`noise_band`, `band`).
    HalfWidths(Vec<f64>),
    /// Its lower and upper edges at each x (`lower`, `upper`, as quantile bounds are).
    Edges(Vec<f64>, Vec<f64>),
}

impl Series {
    /// A curve without a band.
    pub fn new(name: impl Into<String>, xs: Vec<f64>, ys: Vec<f64>) -> Self {
        Self { name: name.into(), xs, ys, band: None }
    }

    /// The band's lower and upper edges, if any.
    fn edges(&self) -> Option<(Series, Series)> {
        let edge = |ys: Vec<f64>| Series::new("", self.xs.clone(), ys);
        match self.band.as_ref()? {
            Band::HalfWidths(band) => {
                let shifted = |sign: f64| self.ys.iter().zip(band).map(|(y, w)| y + sign * w).collect();
                Some((edge(shifted(-1.0)), edge(shifted(1.0))))
            }
            Band::Edges(lower, upper) => Some((edge(lower.clone()), edge(upper.clone()))),
        }
    }
}

const MARKERS: [char; 4] = ['*', 'o', '+', 'x'];
const COLORS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

fn bounds(series: &[Series]) -> Option<(f64, f64, f64, f64)> {
    let edges: Vec<Series> = series.iter().filter_map(Series::edges).flat_map(|(a, b)| [a, b]).collect();
    let pts = series
        .iter()
        .chain(&edges)
        .flat_map(|s| s.xs.iter().zip(&s.ys))
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
    let mut any = false;
    for (&x, &y) in pts {
        any = true;
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !any {
        return None;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    Some((x0, x1, y0, y1))
}

/// Linear interpolation of a series at x (None outside its range).
fn value_at(s: &Series, x: f64) -> Option<f64> {
    let i = s.xs.partition_point(|&v| v < x);
    if i == 0 {
        return (s.xs.first() == Some(&x)).then(|| s.ys[0]);
    }
    if i == s.xs.len() {
        return None;
    }
    let (xa, xb, ya, yb) = (s.xs[i - 1], s.xs[i], s.ys[i - 1], s.ys[i]);
    Some(if xb > xa { ya + (yb - ya) * (x - xa) / (xb - xa) } else { yb })
}

/// Renders the curves as a character plot of `width × height` plot cells.
#[allow(clippy::needless_range_loop)] // a column index places x and indexes every canvas row
pub fn terminal(series: &[Series], width: usize, height: usize) -> String {
    let Some((x0, x1, y0, y1)) = bounds(series) else {
        return "(nothing to plot: no finite values)\n".into();
    };
    let mut canvas = vec![vec![' '; width]; height];
    let row_of = |y: f64| ((y - y0) / (y1 - y0) * (height - 1) as f64).round().clamp(0.0, (height - 1) as f64) as usize;
    // Bands first, as dots between their edges; the curves are drawn over them.
    for s in series {
        let Some((lower, upper)) = s.edges() else { continue };
        for c in 0..width {
            let x = x0 + (x1 - x0) * c as f64 / (width - 1).max(1) as f64;
            let (Some(a), Some(b)) = (value_at(&lower, x), value_at(&upper, x)) else { continue };
            if !(a.is_finite() && b.is_finite()) {
                continue;
            }
            for rr in row_of(a)..=row_of(b) {
                canvas[height - 1 - rr][c] = '.';
            }
        }
    }
    let bands = series.iter().any(|s| s.band.is_some());
    for (si, s) in series.iter().enumerate() {
        let marker = MARKERS[si % MARKERS.len()];
        let mut prev: Option<usize> = None;
        for c in 0..width {
            let x = x0 + (x1 - x0) * c as f64 / (width - 1).max(1) as f64;
            let Some(y) = value_at(s, x).filter(|y| y.is_finite()) else {
                prev = None;
                continue;
            };
            let r = row_of(y);
            // Join to the previous column so steep slopes stay connected.
            let (a, b) = match prev {
                Some(p) if p.abs_diff(r) > 1 => (p.min(r) + 1, p.max(r) - 1),
                _ => (r, r),
            };
            for rr in a.min(r)..=b.max(r) {
                let cell = &mut canvas[height - 1 - rr][c];
                *cell = if *cell == ' ' || *cell == '.' || *cell == marker { marker } else { '#' };
            }
            prev = Some(r);
        }
    }
    let labels = [short(y1), short((y0 + y1) / 2.0), short(y0)];
    let lw = labels.iter().map(|l| l.len()).max().unwrap_or(1);
    let mut out = String::new();
    for (i, row) in canvas.iter().enumerate() {
        let label = if i == 0 {
            &labels[0]
        } else if i == height / 2 {
            &labels[1]
        } else if i == height - 1 {
            &labels[2]
        } else {
            ""
        };
        let _ = writeln!(out, "{label:>lw$} |{}", row.iter().collect::<String>());
    }
    let _ = writeln!(out, "{} +{}", " ".repeat(lw), "-".repeat(width));
    let (l, m, r) = (short(x0), short((x0 + x1) / 2.0), short(x1));
    let gap1 = (width / 2).saturating_sub(l.len() + m.len() / 2);
    let gap2 = width.saturating_sub(l.len() + gap1 + m.len() + r.len());
    let _ = writeln!(out, "{}  {l}{}{m}{}{r}", " ".repeat(lw), " ".repeat(gap1), " ".repeat(gap2));
    let legend: Vec<String> =
        series.iter().enumerate().map(|(i, s)| format!("{} {}", MARKERS[i % MARKERS.len()], s.name)).collect();
    let note = if bands { "   (# = overlap, . = band)" } else { "   (# = overlap)" };
    let _ = writeln!(out, "{}  {}{note}", " ".repeat(lw), legend.join("   "));
    out
}

/// One chart of an SVG document: a title and its curves.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Title above the chart.
    pub title: String,
    /// Curves drawn in it.
    pub series: Vec<Series>,
    /// Horizontal axis label.
    pub x_label: String,
    /// Vertical axis label.
    pub y_label: String,
}

/// Renders the curves as a standalone SVG document with one chart.
pub fn svg(series: &[Series], title: &str, x_label: &str, y_label: &str) -> String {
    svg_panels(&[Panel {
        title: title.to_string(),
        series: series.to_vec(),
        x_label: x_label.to_string(),
        y_label: y_label.to_string(),
    }])
}

/// Renders several charts stacked vertically as one SVG document.
pub fn svg_panels(panels: &[Panel]) -> String {
    let total_h = PANEL_H * panels.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL_W}" height="{total_h}" viewBox="0 0 {PANEL_W} {total_h}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, p) in panels.iter().enumerate() {
        let _ = writeln!(s, r#"<g transform="translate(0 {})">"#, PANEL_H * i as f64);
        chart(&mut s, &p.series, &p.title, &p.x_label, &p.y_label);
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    s
}

fn chart(s: &mut String, series: &[Series], title: &str, x_label: &str, y_label: &str) {
    let (ml, mt) = (80.0, 50.0);
    let (x0, x1, y0, y1) = bounds(series).unwrap_or((0.0, 1.0, 0.0, 1.0));
    let y1 = y1 + 0.08 * (y1 - y0); // headroom for the legend and the peak
    let frame = Frame { bounds: (x0, x1, y0, y1), margins: (ml, 30.0, mt, 70.0) };
    let (px, py) = (|x| frame.px(x), |y| frame.py(y));
    frame.draw_axes(s, title, x_label, y_label);
    for (i, se) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        if let Some((lower, upper)) = se.edges() {
            let pts: Vec<String> = lower
                .xs
                .iter()
                .zip(&lower.ys)
                .chain(upper.xs.iter().zip(&upper.ys).rev())
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|(&x, &y)| format!("{:.2},{:.2}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polygon class="band" fill="{color}" fill-opacity="0.18" stroke="none" points="{}"/>"#,
                pts.join(" ")
            );
        }
        let dash = if i == 0 { "" } else { r#" stroke-dasharray="6 4""# };
        let pts: Vec<String> = se
            .xs
            .iter()
            .zip(&se.ys)
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(&x, &y)| format!("{:.2},{:.2}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            pts.join(" ")
        );
        // Legend in the top-left corner, inside the frame.
        let ly = mt + 20.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>"#,
            ml + 12.0,
            ml + 42.0
        );
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, ml + 50.0, ly + 4.0, escape(&se.name));
    }
}

/// Finds curves in a result: every struct cell with at least two `List<Float64>` fields
/// (the first is x, the second y, as `private_kde` returns), or else, for a result whose
/// first two columns are numbers, those columns as (x, y).
pub fn curves(result: &QueryOutput) -> Vec<Series> {
    let mut out = Vec::new();
    for b in &result.batches {
        for (field, col) in result.schema.fields().iter().zip(b.columns()) {
            let DataType::Struct(fields) = field.data_type() else { continue };
            if is_surface(fields) {
                continue; // drawn as a heat map
            }
            let s = col.as_struct();
            let lists: Vec<usize> =
                (0..fields.len()).filter(|&i| matches!(fields[i].data_type(), DataType::List(_))).collect();
            if lists.len() < 2 {
                continue;
            }
            for r in 0..b.num_rows() {
                let (Some(xs), Some(ys)) =
                    (float_values(s.column(lists[0]).as_ref(), r), float_values(s.column(lists[1]).as_ref(), r))
                else {
                    continue;
                };
                let keys = group_keys(result, b, r);
                let name = if keys.is_empty() {
                    format!("{} row {} ({})", field.name(), out.len() + 1, fields[lists[1]].name())
                } else {
                    format!("{} [{}] ({})", field.name(), keys.join(", "), fields[lists[1]].name())
                };
                // A release's band: the plug-in band (noise and sampling) if it has one, else the
                // noise band, else explicit lower and upper edges (quantile bounds).
                let field = |name: &str| {
                    fields
                        .iter()
                        .position(|f| f.name() == name)
                        .and_then(|i| float_values(s.column(i).as_ref(), r))
                        .filter(|b| b.len() == ys.len())
                };
                let band = ["band", "noise_band"]
                    .iter()
                    .find_map(|n| field(n))
                    .map(Band::HalfWidths)
                    .or_else(|| Some(Band::Edges(field("lower")?, field("upper")?)));
                out.push(Series { name, xs, ys, band });
            }
        }
    }
    if out.is_empty() && result.schema.fields().len() >= 2 {
        let numeric = |i: usize| result.schema.field(i).data_type().is_numeric();
        if numeric(0) && numeric(1) {
            let mut pts: Vec<(f64, f64)> = Vec::new();
            for b in &result.batches {
                let cast = |i: usize| datafusion::arrow::compute::cast(b.column(i), &DataType::Float64).ok();
                if let (Some(x), Some(y)) = (cast(0), cast(1)) {
                    let (x, y) = (x.as_primitive::<Float64Type>(), y.as_primitive::<Float64Type>());
                    pts.extend(
                        (0..b.num_rows()).filter(|&r| x.is_valid(r) && y.is_valid(r)).map(|r| (x.value(r), y.value(r))),
                    );
                }
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if pts.len() >= 2 {
                let name = result.schema.field(1).name().clone();
                out.push(Series::new(name, pts.iter().map(|p| p.0).collect(), pts.iter().map(|p| p.1).collect()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bump() -> Series {
        let xs: Vec<f64> = (0..100).map(|i| i as f64 / 99.0).collect();
        let ys = xs.iter().map(|x| (-(x - 0.5) * (x - 0.5) / 0.02).exp()).collect();
        Series::new("bump", xs, ys)
    }

    #[test]
    fn terminal_plot_puts_the_peak_on_top_in_the_middle() {
        let text = terminal(&[bump()], 41, 10);
        let lines: Vec<&str> = text.lines().collect();
        let top = lines[0];
        let col = top.find('*').expect("peak on the top row");
        let bar = top.find('|').unwrap();
        assert!((col - bar - 1).abs_diff(20) <= 1, "{text}");
        assert!(text.contains("* bump"));
    }

    #[test]
    fn svg_is_a_document_with_one_polyline_per_series() {
        let mut b2 = bump();
        b2.name = "second <b>".into();
        let doc = svg(&[bump(), b2], "t", "x", "y");
        assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
        assert_eq!(doc.matches("<polyline").count(), 2);
        assert!(doc.contains("second &lt;b&gt;"));
    }
}
