//! Drawing 2-D densities (`private_kde2d` results): a character heat map for the terminal and an
//! SVG heat map with a colour bar. A surface with a band (the result's `band`, else its
//! `noise_band`) shows it: the SVG washes out the cells whose lower band edge is ≤ 0 (not told
//! apart from zero at the band's level) and outlines them, and both name the widest half-width.

use std::fmt::Write as _;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::DataType;

use super::canvas::{Frame, PANEL_H, PANEL_W, escape, float_values, group_keys, is_float_list, is_surface, short};
use crate::session::QueryOutput;

/// One density on a product grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Surface {
    /// Title.
    pub name: String,
    /// Grid along x (increasing).
    pub xs: Vec<f64>,
    /// Grid along y (increasing).
    pub ys: Vec<f64>,
    /// `z[i][j]` at `(xs[i], ys[j])`.
    pub z: Vec<Vec<f64>>,
    /// Half-widths `[i][j]` of its simultaneous band, and which band (`band` or `noise_band`).
    pub band: Option<(Vec<Vec<f64>>, String)>,
}

impl Surface {
    /// Largest finite value (0 if none is positive).
    fn top(&self) -> f64 {
        self.z.iter().flatten().filter(|v| v.is_finite()).fold(0.0f64, |a, v| a.max(*v))
    }

    /// Whether the band's lower edge at grid point (i, j) is above zero.
    fn above_zero(&self, i: usize, j: usize) -> bool {
        self.band.as_ref().is_none_or(|(b, _)| self.z[i][j] - b[i][j] > 0.0)
    }

    /// One line naming the band: its widest half-width and what the picture marks.
    fn band_caption(&self) -> Option<String> {
        let (b, which) = self.band.as_ref()?;
        let widest = b.iter().flatten().filter(|v| v.is_finite()).fold(0.0f64, |a, v| a.max(*v));
        let clear = (0..self.z.len()).flat_map(|i| (0..self.z[i].len()).map(move |j| (i, j)));
        let above = clear.filter(|&(i, j)| self.above_zero(i, j)).count();
        let total: usize = self.z.iter().map(Vec::len).sum();
        Some(format!("{which} ± up to {}: {above} of {total} grid points clear of 0", short(widest)))
    }

    /// The value of the grid point nearest to `(x, y)`.
    fn nearest(&self, x: f64, y: f64) -> f64 {
        let near = |g: &[f64], v: f64| {
            let i = g.partition_point(|p| *p < v).min(g.len() - 1);
            if i > 0 && (v - g[i - 1]).abs() <= (g[i] - v).abs() { i - 1 } else { i }
        };
        self.z[near(&self.xs, x)][near(&self.ys, y)]
    }
}

/// Finds the 2-D densities in a result (one per row of each such struct column).
pub fn surfaces(result: &QueryOutput) -> Vec<Surface> {
    let mut out = Vec::new();
    for b in &result.batches {
        for (field, col) in result.schema.fields().iter().zip(b.columns()) {
            let DataType::Struct(fields) = field.data_type() else { continue };
            if !is_surface(fields) {
                continue;
            }
            let s = col.as_struct();
            let Some(zi) =
                fields.iter().position(|f| matches!(f.data_type(), DataType::List(i) if is_float_list(i.data_type())))
            else {
                continue;
            };
            for r in 0..b.num_rows() {
                let (Some(xs), Some(ys)) = (
                    s.column_by_name("x").and_then(|c| float_values(c.as_ref(), r)),
                    s.column_by_name("y").and_then(|c| float_values(c.as_ref(), r)),
                ) else {
                    continue;
                };
                let rows = s.column(zi).as_list::<i32>();
                if rows.is_null(r) {
                    continue;
                }
                let rows = rows.value(r);
                let z: Vec<Vec<f64>> = (0..rows.len()).filter_map(|i| float_values(rows.as_ref(), i)).collect();
                if xs.len() < 2 || ys.len() < 2 || z.len() != xs.len() || z.iter().any(|row| row.len() != ys.len()) {
                    continue;
                }
                // The band of the same shape, if the result has one.
                let band = ["band", "noise_band"].iter().find_map(|name| {
                    let rows = s.column_by_name(name)?.as_list_opt::<i32>()?;
                    if rows.is_null(r) {
                        return None;
                    }
                    let rows = rows.value(r);
                    let band: Vec<Vec<f64>> = (0..rows.len()).filter_map(|i| float_values(rows.as_ref(), i)).collect();
                    let same = band.len() == z.len() && band.iter().zip(&z).all(|(a, b)| a.len() == b.len());
                    same.then(|| (band, name.to_string()))
                });
                let keys = group_keys(result, b, r);
                let what = fields[zi].name();
                let name = if keys.is_empty() {
                    format!("{} row {} ({what})", field.name(), out.len() + 1)
                } else {
                    format!("{} [{}] ({what})", field.name(), keys.join(", "))
                };
                out.push(Surface { name, xs, ys, z, band });
            }
        }
    }
    out
}

/// Shades from empty to full.
const RAMP: [char; 10] = [' ', '.', ':', '-', '=', '+', '*', '#', '%', '@'];

/// Renders a surface as `width × height` characters (x across, y up), shaded by value
/// relative to its maximum; negative values are blank.
pub fn terminal(surface: &Surface, width: usize, height: usize) -> String {
    let top = surface.top();
    let (x0, x1) = (surface.xs[0], *surface.xs.last().expect("≥ 2 points"));
    let (y0, y1) = (surface.ys[0], *surface.ys.last().expect("≥ 2 points"));
    let labels = [short(y1), short((y0 + y1) / 2.0), short(y0)];
    let lw = labels.iter().map(|l| l.len()).max().unwrap_or(1);
    let mut out = String::new();
    for r in 0..height {
        let y = y1 - (y1 - y0) * r as f64 / (height - 1).max(1) as f64;
        let row: String = (0..width)
            .map(|c| {
                let x = x0 + (x1 - x0) * c as f64 / (width - 1).max(1) as f64;
                let v = surface.nearest(x, y);
                if !(v.is_finite() && v > 0.0 && top > 0.0) {
                    return RAMP[0];
                }
                RAMP[((v / top) * (RAMP.len() - 1) as f64).round().clamp(0.0, (RAMP.len() - 1) as f64) as usize]
            })
            .collect();
        let label = match r {
            0 => &labels[0],
            r if r == height / 2 => &labels[1],
            r if r + 1 == height => &labels[2],
            _ => "",
        };
        let _ = writeln!(out, "{label:>lw$} |{row}");
    }
    let _ = writeln!(out, "{} +{}", " ".repeat(lw), "-".repeat(width));
    let (l, m, r) = (short(x0), short((x0 + x1) / 2.0), short(x1));
    let gap1 = (width / 2).saturating_sub(l.len() + m.len() / 2);
    let gap2 = width.saturating_sub(l.len() + gap1 + m.len() + r.len());
    let _ = writeln!(out, "{}  {l}{}{m}{}{r}", " ".repeat(lw), " ".repeat(gap1), " ".repeat(gap2));
    let ramp: String = RAMP.iter().collect();
    let _ = writeln!(out, "{}  shades '{ramp}' from 0 to {} (x across, y up)", " ".repeat(lw), short(top));
    if let Some(caption) = surface.band_caption() {
        let _ = writeln!(out, "{}  {caption}", " ".repeat(lw));
    }
    out
}

/// A sequential colour map (dark blue → teal → yellow) at `t` in [0, 1], as `#rrggbb`.
fn colour(t: f64) -> String {
    const STOPS: [(f64, [f64; 3]); 5] = [
        (0.0, [255.0, 255.0, 255.0]),
        (0.25, [65.0, 68.0, 135.0]),
        (0.5, [42.0, 120.0, 142.0]),
        (0.75, [34.0, 168.0, 132.0]),
        (1.0, [253.0, 231.0, 37.0]),
    ];
    let t = t.clamp(0.0, 1.0);
    let k = STOPS.iter().rposition(|(s, _)| *s <= t).unwrap_or(0).min(STOPS.len() - 2);
    let ((a, ca), (b, cb)) = (STOPS[k], STOPS[k + 1]);
    let f = (t - a) / (b - a);
    let c: Vec<u8> = (0..3).map(|i| (ca[i] + f * (cb[i] - ca[i])).round() as u8).collect();
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// One heat map chart: a cell per grid point, coloured by value, and a colour bar.
fn chart(s: &mut String, surface: &Surface, x_label: &str, y_label: &str) {
    let (xs, ys) = (&surface.xs, &surface.ys);
    let half = |g: &[f64], i: usize| {
        let lo = if i == 0 { g[0] } else { 0.5 * (g[i - 1] + g[i]) };
        let hi = if i + 1 == g.len() { g[i] } else { 0.5 * (g[i] + g[i + 1]) };
        (lo, hi)
    };
    let frame = Frame {
        bounds: (xs[0], *xs.last().expect("≥ 2"), ys[0], *ys.last().expect("≥ 2")),
        margins: (80.0, 110.0, 50.0, 70.0),
    };
    let top = surface.top();
    for (i, row) in surface.z.iter().enumerate() {
        let (xa, xb) = half(xs, i);
        for (j, v) in row.iter().enumerate() {
            let (ya, yb) = half(ys, j);
            let t = if top > 0.0 && v.is_finite() { v.max(0.0) / top } else { 0.0 };
            let _ = writeln!(
                s,
                r#"<rect class="cell" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"/>"#,
                frame.px(xa),
                frame.py(yb),
                frame.px(xb) - frame.px(xa) + 0.3,
                frame.py(ya) - frame.py(yb) + 0.3,
                colour(t)
            );
            if !surface.above_zero(i, j) {
                // Not told apart from zero at the band's level: washed out.
                let _ = writeln!(
                    s,
                    r##"<rect class="below-band" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="#ffffff" fill-opacity="0.6"/>"##,
                    frame.px(xa),
                    frame.py(yb),
                    frame.px(xb) - frame.px(xa) + 0.3,
                    frame.py(ya) - frame.py(yb) + 0.3,
                );
            }
        }
    }
    if let Some(caption) = surface.band_caption() {
        let _ = writeln!(
            s,
            r#"<text class="band-caption" x="{:.1}" y="{:.1}">{} (washed out: lower edge ≤ 0)</text>"#,
            frame.px(xs[0]),
            PANEL_H - 12.0,
            escape(&caption)
        );
    }
    // Grid lines, ticks and the frame over the cells.
    frame.draw_axes(s, &surface.name, x_label, y_label);
    // The colour bar, right of the frame.
    let (bx, b0, b1) = (PANEL_W - 95.0, frame.py(ys[0]), frame.py(*ys.last().expect("≥ 2")));
    let steps = 40;
    for k in 0..steps {
        let t = k as f64 / (steps - 1) as f64;
        let y = b0 - (b0 - b1) * (k + 1) as f64 / steps as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{bx:.1}" y="{y:.2}" width="16" height="{:.2}" fill="{}"/>"#,
            (b0 - b1) / steps as f64 + 0.3,
            colour(t)
        );
    }
    for (t, y) in [(0.0, b0), (top, b1)] {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, bx + 22.0, y + 4.0, escape(&short(t)));
    }
}

/// Renders surfaces as one SVG document, a heat map each, stacked vertically.
pub fn svg(surfaces: &[Surface], x_label: &str, y_label: &str) -> String {
    let total_h = PANEL_H * surfaces.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL_W}" height="{total_h}" viewBox="0 0 {PANEL_W} {total_h}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, surface) in surfaces.iter().enumerate() {
        let _ = writeln!(s, r#"<g transform="translate(0 {})">"#, PANEL_H * i as f64);
        chart(&mut s, surface, x_label, y_label);
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bump at (0.25, 0.75) on [0, 1]².
    fn bump() -> Surface {
        let g: Vec<f64> = (0..21).map(|i| i as f64 / 20.0).collect();
        let z = g
            .iter()
            .map(|x| g.iter().map(|y| (-((x - 0.25).powi(2) + (y - 0.75).powi(2)) / 0.01).exp()).collect())
            .collect();
        Surface { name: "bump".into(), xs: g.clone(), ys: g, z, band: None }
    }

    #[test]
    fn a_band_washes_out_the_cells_it_cannot_tell_from_zero_and_is_named() {
        let mut s = bump();
        // A flat band of 0.1: cells below 0.1 are not clear of zero.
        s.band = Some((vec![vec![0.1; 21]; 21], "band".into()));
        let faint = s.z.iter().flatten().filter(|v| **v - 0.1 <= 0.0).count();
        let doc = svg(std::slice::from_ref(&s), "x", "y");
        assert_eq!(doc.matches(r#"class="below-band""#).count(), faint);
        assert!(faint > 0 && faint < 441);
        assert!(doc.contains(&format!("band ± up to 0.1: {} of 441 grid points clear of 0", 441 - faint)), "{doc}");
        assert!(terminal(&s, 41, 21).contains("band ± up to 0.1"));
        // Negative control: without a band nothing is washed out or named.
        let plain = svg(&[bump()], "x", "y");
        assert!(!plain.contains("below-band") && !plain.contains("band-caption"));
    }

    #[test]
    fn the_terminal_heat_map_puts_the_peak_top_left_and_blanks_the_far_corner() {
        let text = terminal(&bump(), 41, 21);
        let lines: Vec<&str> = text.lines().collect();
        let bar = lines[0].find('|').unwrap();
        let cell = |r: usize, c: usize| lines[r].chars().nth(bar + 1 + c).unwrap();
        // y = 0.75 is row 5 of 21 (top = 1), x = 0.25 is column 10 of 41.
        assert_eq!(cell(5, 10), '@', "{text}");
        assert_eq!(cell(20, 40), ' ', "{text}");
        // Negative control: the mirrored bump is not read as the same picture.
        let mut m = bump();
        m.z.reverse();
        assert_ne!(terminal(&m, 41, 21), text);
        assert!(text.contains("from 0 to 1"));
    }

    #[test]
    fn the_svg_heat_map_has_a_cell_per_grid_point_and_the_brightest_at_the_peak() {
        let doc = svg(&[bump()], "x", "y");
        assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
        assert_eq!(doc.matches(r#"class="cell""#).count(), 21 * 21);
        let top = colour(1.0);
        assert_eq!(doc.matches(&r#"class="cell" x"#.to_string()).count(), 441);
        assert!(doc.contains(&top), "the peak has the top colour");
        assert_eq!(colour(0.0), "#ffffff");
        assert_ne!(colour(0.5), colour(0.6));
    }
}
