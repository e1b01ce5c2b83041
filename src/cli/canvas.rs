//! What the terminal and SVG drawings share: finding curves and surfaces in a result's columns,
//! the SVG panel and its axes, tick positions and number labels.

use std::fmt::Write as _;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Fields, Float64Type};

use crate::session::QueryOutput;

pub(super) const PANEL_W: f64 = 900.0;
pub(super) const PANEL_H: f64 = 520.0;

/// A number as a short label.
pub(super) fn short(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if (1e-3..1e5).contains(&a) {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.2e}")
    }
}

/// About `n` round tick positions between `lo` and `hi`.
pub(super) fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

pub(super) fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The plotting area of one chart: data bounds mapped to SVG coordinates.
#[derive(Debug, Clone, Copy)]
pub(super) struct Frame {
    /// Data bounds (x0, x1, y0, y1).
    pub bounds: (f64, f64, f64, f64),
    /// Margins (left, right, top, bottom).
    pub margins: (f64, f64, f64, f64),
}

impl Frame {
    /// SVG x of a data x.
    pub fn px(&self, x: f64) -> f64 {
        let (x0, x1, _, _) = self.bounds;
        let (ml, mr, _, _) = self.margins;
        ml + (x - x0) / (x1 - x0) * (PANEL_W - ml - mr)
    }

    /// SVG y of a data y.
    pub fn py(&self, y: f64) -> f64 {
        let (_, _, y0, y1) = self.bounds;
        let (_, _, mt, mb) = self.margins;
        PANEL_H - mb - (y - y0) / (y1 - y0) * (PANEL_H - mt - mb)
    }

    /// Draws the title, grid lines with tick labels, the frame and the axis labels.
    pub fn draw_axes(&self, s: &mut String, title: &str, x_label: &str, y_label: &str) {
        let (w, h) = (PANEL_W, PANEL_H);
        let (x0, x1, y0, y1) = self.bounds;
        let (ml, mr, mt, mb) = self.margins;
        let _ =
            writeln!(s, r#"<text x="{}" y="28" text-anchor="middle" font-size="16">{}</text>"#, w / 2.0, escape(title));
        for t in nice_ticks(x0, x1, 8) {
            let x = self.px(t);
            let _ =
                writeln!(s, r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##, mt, h - mb);
            let _ =
                writeln!(s, r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, h - mb + 18.0, short(t));
        }
        for t in nice_ticks(y0, y1, 6) {
            let y = self.py(t);
            let _ = writeln!(s, r##"<line x1="{ml}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##, w - mr);
            let _ =
                writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, ml - 8.0, y + 4.0, short(t));
        }
        let _ = writeln!(
            s,
            r##"<rect x="{ml}" y="{mt}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>"##,
            w - ml - mr,
            h - mt - mb
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            (ml + w - mr) / 2.0,
            h - 20.0,
            escape(x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (mt + h - mb) / 2.0,
            escape(y_label)
        );
    }
}

/// The values of a `List<Float64>` cell (None: NULL or another type).
pub(super) fn float_values(array: &dyn Array, row: usize) -> Option<Vec<f64>> {
    if array.is_null(row) {
        return None;
    }
    let items = match array.data_type() {
        DataType::List(f) if f.data_type() == &DataType::Float64 => array.as_list::<i32>().value(row),
        DataType::LargeList(f) if f.data_type() == &DataType::Float64 => array.as_list::<i64>().value(row),
        _ => return None,
    };
    Some(items.as_primitive::<Float64Type>().iter().map(|v| v.unwrap_or(f64::NAN)).collect())
}

/// A grouped result names each curve by its group: the row's scalar columns as `name=value`.
pub(super) fn group_keys(result: &QueryOutput, b: &datafusion::arrow::array::RecordBatch, r: usize) -> Vec<String> {
    result
        .schema
        .fields()
        .iter()
        .zip(b.columns())
        .filter(|(f, _)| !f.data_type().is_nested())
        .filter_map(|(f, c)| {
            datafusion::arrow::util::display::array_value_to_string(c, r).ok().map(|v| format!("{}={v}", f.name()))
        })
        .collect()
}

/// Whether a type is `List<Float64>`.
pub(super) fn is_float_list(t: &DataType) -> bool {
    matches!(t, DataType::List(f) if f.data_type() == &DataType::Float64)
}

/// Whether a struct type is a 2-D result: `x` and `y` lists of numbers and a list of lists.
pub fn is_surface(fields: &Fields) -> bool {
    let has = |name: &str| fields.iter().any(|f| f.name() == name && is_float_list(f.data_type()));
    has("x")
        && has("y")
        && fields.iter().any(|f| matches!(f.data_type(), DataType::List(i) if is_float_list(i.data_type())))
}
