//! Printing query results as an aligned table, CSV, or JSON lines.

use std::io::Write;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::Result;

use crate::session::QueryOutput;

/// Output format of `dpcurve sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned text table; long lists are shortened.
    Table,
    /// CSV with a header; nested values written in full as `[…]` / `{…}`.
    Csv,
    /// One JSON object per result row, one per line.
    Json,
}

impl Format {
    /// Parses `table`, `csv` or `json`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "table" => Some(Format::Table),
            "csv" => Some(Format::Csv),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// Lists longer than this are shortened in table output.
const TABLE_LIST_ITEMS: usize = 6;

/// Formats one cell; `limit` shortens long lists (None: write everything).
pub fn cell(array: &dyn Array, row: usize, limit: Option<usize>) -> Result<String> {
    if array.is_null(row) {
        return Ok("NULL".to_string());
    }
    Ok(match array.data_type() {
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) => {
            let items = match array.data_type() {
                DataType::List(_) => array.as_list::<i32>().value(row),
                DataType::LargeList(_) => array.as_list::<i64>().value(row),
                _ => array.as_fixed_size_list().value(row),
            };
            let n = items.len();
            let show: Vec<usize> = match limit {
                Some(l) if n > l => (0..l / 2).chain(n - (l - l / 2)..n).collect(),
                _ => (0..n).collect(),
            };
            let mut parts = Vec::with_capacity(show.len() + 1);
            for (i, &k) in show.iter().enumerate() {
                if i > 0 && show[i - 1] + 1 != k {
                    parts.push("…".to_string());
                }
                parts.push(cell(items.as_ref(), k, limit)?);
            }
            let suffix = if show.len() < n { format!(" ({n} values)") } else { String::new() };
            format!("[{}]{suffix}", parts.join(", "))
        }
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let mut parts = Vec::with_capacity(fields.len());
            for (f, col) in fields.iter().zip(s.columns()) {
                parts.push(format!("{}: {}", f.name(), cell(col.as_ref(), row, limit)?));
            }
            format!("{{{}}}", parts.join(", "))
        }
        _ => ArrayFormatter::try_new(array, &FormatOptions::default())?.value(row).to_string(),
    })
}

fn rows(batches: &[RecordBatch], limit: Option<usize>) -> Result<Vec<Vec<String>>> {
    let mut out = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            out.push(b.columns().iter().map(|c| cell(c.as_ref(), r, limit)).collect::<Result<_>>()?);
        }
    }
    Ok(out)
}

fn csv_quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// Writes one statement's result in the chosen format.
pub fn write_output(out: &mut dyn Write, result: &QueryOutput, format: Format) -> Result<()> {
    let names: Vec<String> = result.schema.fields().iter().map(|f| f.name().clone()).collect();
    match format {
        Format::Json => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut *out);
            for b in &result.batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        Format::Csv => {
            writeln!(out, "{}", names.iter().map(|n| csv_quote(n)).collect::<Vec<_>>().join(","))?;
            for row in rows(&result.batches, None)? {
                writeln!(out, "{}", row.iter().map(|c| csv_quote(c)).collect::<Vec<_>>().join(","))?;
            }
        }
        Format::Table => {
            let body = rows(&result.batches, Some(TABLE_LIST_ITEMS))?;
            if names.is_empty() {
                return Ok(());
            }
            let mut widths: Vec<usize> = names.iter().map(|n| n.chars().count()).collect();
            for row in &body {
                for (w, c) in widths.iter_mut().zip(row) {
                    *w = (*w).max(c.chars().count());
                }
            }
            let rule = format!("+{}+", widths.iter().map(|w| "-".repeat(w + 2)).collect::<Vec<_>>().join("+"));
            let line = |cells: &[String]| {
                let padded: Vec<String> = cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!(" {c}{} ", " ".repeat(w - c.chars().count())))
                    .collect();
                format!("|{}|", padded.join("|"))
            };
            writeln!(out, "{rule}\n{}\n{rule}", line(&names))?;
            for row in &body {
                writeln!(out, "{}", line(row))?;
            }
            writeln!(out, "{rule}")?;
            let n = body.len();
            writeln!(out, "{n} row{}", if n == 1 { "" } else { "s" })?;
        }
    }
    Ok(())
}
