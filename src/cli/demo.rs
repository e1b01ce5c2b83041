//! `dpcurve demo`: Hall et al.'s Fig. 1 example at scale, end to end through SQL.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::parquet::arrow::ArrowWriter;

use super::plot::{self, Panel, Series};
use crate::session::{Admin, AnalystSession, SessionOptions};

/// Rows in the demo table.
pub const DEMO_ROWS: usize = 100_000;
/// Curves in the demo's functional table, and their length.
pub const DEMO_CURVES: usize = 500;
/// Points per demo curve.
pub const DEMO_CURVE_POINTS: usize = 100;

/// Writes curves as a Parquet file with one FixedSizeList<Float64> column `c`.
pub fn write_curves_parquet(path: &Path, curves: &[Vec<f64>]) -> Result<()> {
    use datafusion::arrow::array::{FixedSizeListBuilder, Float64Builder};
    let m = curves.first().map(|c| c.len()).unwrap_or(2) as i32;
    let mut b = FixedSizeListBuilder::new(Float64Builder::new(), m);
    for c in curves {
        b.values().append_slice(c);
        b.append(true);
    }
    let array = b.finish();
    let schema = Arc::new(Schema::new(vec![Field::new("c", array.data_type().clone(), true)]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(array)])?;
    let file = File::create(path).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let mut writer = ArrowWriter::try_new(file, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

/// Total budget the demo's data owner gives the table: (ε, δ).
pub const DEMO_BUDGET: (f64, f64) = (2.0, 1e-5);
/// Public bounds of the demo's `x` column.
pub const DEMO_BOUNDS: (f64, f64) = (-0.2, 1.2);
/// ε of each of the demo's density releases.
pub const DEMO_EPSILON: f64 = 0.5;
/// Seed of the *data* generator (the data is synthetic and public; the privacy noise
/// always comes from the operating system).
const DATA_SEED: u64 = 2013;

pub use crate::datagen::mixture;
use crate::datagen::{karhunen_loeve_curves, labelled_mixture, mixture_density, sine_response, true_mean};

/// Writes the demo table: `id` (row number, Int64) and `x` (Float64).
pub fn write_parquet(path: &Path, values: &[f64]) -> Result<()> {
    write_table(path, values, None)
}

/// Writes `id`, `x` and, if given, a response `y` (Float64) and a `component` (Utf8) column.
fn write_table(path: &Path, values: &[f64], extra: Option<(Vec<f64>, Vec<&str>)>) -> Result<()> {
    let mut fields = vec![Field::new("id", DataType::Int64, false), Field::new("x", DataType::Float64, true)];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..values.len() as i64)),
        Arc::new(Float64Array::from(values.to_vec())),
    ];
    if let Some((y, c)) = extra {
        fields.push(Field::new("y", DataType::Float64, true));
        columns.push(Arc::new(Float64Array::from(y)));
        fields.push(Field::new("component", DataType::Utf8, false));
        columns.push(Arc::new(StringArray::from(c)));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let file = File::create(path).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let mut writer = ArrowWriter::try_new(file, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

/// One query's curves, ready to draw and to report.
struct Released {
    title: String,
    series: Vec<Series>,
    mass: Option<f64>,
}

/// Runs `sql` (printed first) and returns its curves — with their bands — as the CLI plots them,
/// named `label`, or by their group.
async fn released(session: &AnalystSession, sql: &str, label: &str, title: String) -> Result<Released> {
    println!("\n{sql};\n");
    let output = session.sql(sql).await?.pop().ok_or_else(|| DataFusionError::Plan("no result".into()))?;
    let mass = output.batches.first().and_then(|b| {
        let kde = b.column_by_name("kde")?.as_struct();
        kde.column_by_name("mass").map(|c| c.as_primitive::<Float64Type>().value(0))
    });
    let mut series = plot::curves(&output);
    for s in &mut series {
        s.name = match (s.name.find('['), s.name.find(']')) {
            (Some(a), Some(b)) if a < b => s.name[a + 1..b].to_string(),
            _ => label.to_string(),
        };
    }
    Ok(Released { title, series, mass })
}

/// The true density on a curve's grid, as a second series to compare with.
fn truth(private: &Series) -> Series {
    Series::new("true density", private.xs.clone(), private.xs.iter().map(|&x| mixture_density(x)).collect())
}

/// Largest distance between the private and the true curve, relative to the true peak.
fn gap(private: &Series, truth: &Series) -> f64 {
    let peak = truth.ys.iter().cloned().fold(0.0, f64::max);
    private.ys.iter().zip(&truth.ys).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / peak
}

fn print_budgets(session: &AnalystSession) -> Result<()> {
    for (table, total, spent, remaining) in session.budgets()? {
        println!("budget of '{table}': spent {spent} of {total}; remaining {remaining}");
    }
    Ok(())
}

/// Runs the demo, writing files under `dir`.
pub async fn run(dir: &Path) -> Result<()> {
    let io = |e: std::io::Error| DataFusionError::External(Box::new(e));
    std::fs::create_dir_all(dir).map_err(io)?;
    let data_path = dir.join("mixture.parquet");
    let (values, components): (Vec<f64>, Vec<&str>) = labelled_mixture(DEMO_ROWS, DATA_SEED).into_iter().unzip();
    let ys = sine_response(&values, DATA_SEED + 1);
    write_table(&data_path, &values, Some((ys, components)))?;
    println!(
        "wrote {} ({} draws from 0.5·N(0.3, 0.1²) + 0.5·N(0.7, 0.1²); columns id, x, y = 0.5·sin(2πx) + noise, \
         component = left | right)",
        data_path.display(),
        DEMO_ROWS
    );

    // The data owner: a fresh catalog in which `mixture` is private.
    let catalog_path = dir.join("catalog.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", catalog_path.display()));
    }
    let policy = |e: crate::policy::PolicyError| DataFusionError::Plan(e.to_string());
    let admin = Admin::open(&catalog_path).map_err(policy)?;
    admin.register("mixture", &data_path.to_string_lossy()).await.map_err(policy)?;
    admin.make_private("mixture", DEMO_BUDGET.0, DEMO_BUDGET.1).await.map_err(policy)?;
    admin.set_bounds("mixture", "x", DEMO_BOUNDS.0, DEMO_BOUNDS.1).await.map_err(policy)?;
    admin.set_bounds("mixture", "y", -1.5, 1.5).await.map_err(policy)?;
    admin.set_keys("mixture", "component", &["left".into(), "right".into()]).await.map_err(policy)?;
    // The public bound on its rows plans the memory of grouped queries (in memory, not spilled).
    admin.set_row_bound("mixture", Some(DEMO_ROWS as i64)).map_err(policy)?;
    println!(
        "catalog {}: table 'mixture' is private, total budget ε = {}, δ = {}, public bounds x ∈ [{:?}, {:?}] \
         and y ∈ [-1.5, 1.5], declared keys component ∈ {{left, right}}, at most {DEMO_ROWS} rows",
        catalog_path.display(),
        DEMO_BUDGET.0,
        DEMO_BUDGET.1,
        DEMO_BOUNDS.0,
        DEMO_BOUNDS.1
    );

    // The analyst: a read-only session on that catalog. The bandwidth is chosen privately
    // (within the same ε) and the mechanism is the default; lo and hi come from the policy.
    let session = AnalystSession::with_catalog(Arc::clone(admin.catalog()), SessionOptions::default()).await?;
    let kde = format!("private_kde(x, bandwidth => 'auto', epsilon => {DEMO_EPSILON:?}, delta => 0) AS kde");
    let mut panels = Vec::new();
    for every in [1, 100] {
        let filter = if every > 1 { format!("\nWHERE id % {every} = 0") } else { String::new() };
        let n = DEMO_ROWS / every;
        let title = format!("n = {n} rows, ε = {DEMO_EPSILON:?}, δ = 0");
        let mut r = released(&session, &format!("SELECT {kde}\nFROM mixture{filter}"), "private_kde", title).await?;
        let Some(private) = r.series.first().cloned() else { return Err(DataFusionError::Plan("no curve".into())) };
        let truth = truth(&private);
        println!("{}", r.title);
        r.series.push(truth.clone());
        println!("{}", plot::terminal(&r.series, 72, 16));
        let count = values.iter().step_by(every).filter(|v| (DEMO_BOUNDS.0..=DEMO_BOUNDS.1).contains(*v)).count();
        println!(
            "released mass (noisy count in [{:?}, {:?}]): {:.1}   true count: {count}",
            DEMO_BOUNDS.0,
            DEMO_BOUNDS.1,
            r.mass.unwrap_or(f64::NAN)
        );
        println!("largest gap to the true density: {:.2} % of its peak", 100.0 * gap(&private, &truth));
        print_budgets(&session)?;
        panels.push(Panel {
            title: format!("private_kde (shaded: 95 % band) vs the true density, {}", r.title),
            series: r.series,
            x_label: "x".into(),
            y_label: "density".into(),
        });
    }
    // One curve per declared key, in declared order, each with its band.
    let title = format!("one curve per component, ε = {DEMO_EPSILON:?} each (disjoint groups: one charge)");
    let r =
        released(&session, &format!("SELECT component, {kde}\nFROM mixture\nGROUP BY component"), "private_kde", title)
            .await?;
    println!("{}", r.title);
    println!("{}", plot::terminal(&r.series, 72, 16));
    print_budgets(&session)?;
    panels.push(Panel { title: r.title, series: r.series, x_label: "x".into(), y_label: "density".into() });
    println!(
        "\nnoise: the pure-ε mechanism (exact discrete Laplace), its bandwidth chosen privately from a noisy count \
         and the release's own counts within the same ε; the band covers the release's noise and sampling error simultaneously at level 95 %"
    );

    // Functional data: simulated growth-like curves, one per row, private mean curve.
    let curves_path = dir.join("curves.parquet");
    let curves = karhunen_loeve_curves(DEMO_CURVES, DEMO_CURVE_POINTS, DATA_SEED);
    write_curves_parquet(&curves_path, &curves)?;
    admin.register("curves", &curves_path.to_string_lossy()).await.map_err(policy)?;
    admin.make_private("curves", DEMO_BUDGET.0, DEMO_BUDGET.1).await.map_err(policy)?;
    admin.set_bounds("curves", "c", -0.5, 0.5).await.map_err(policy)?;
    admin.set_row_bound("curves", Some(DEMO_CURVES as i64)).map_err(policy)?;
    println!(
        "\nwrote {} ({DEMO_CURVES} curves of {DEMO_CURVE_POINTS} points from Mirshani et al.'s simulation, mean 0.1·sin(πt)); \
         private, values bounded in [-0.5, 0.5] (so the clip norm is 0.5), at most {DEMO_CURVES} rows",
        curves_path.display()
    );
    let session = AnalystSession::with_catalog(Arc::clone(admin.catalog()), SessionOptions::default()).await?;
    let sql = "SELECT private_mean_curve(c, epsilon => 1, delta => 1e-5) AS m FROM curves";
    let title = format!("private vs non-private mean curve, n = {DEMO_CURVES} curves, ε = 1, δ = 1e-5");
    let mut r = released(&session, sql, "private_mean_curve", title).await?;
    let Some(private) = r.series.first().cloned() else { return Err(DataFusionError::Plan("no curve".into())) };
    let mut sample_mean = vec![0.0; DEMO_CURVE_POINTS];
    for c in &curves {
        for (a, b) in sample_mean.iter_mut().zip(c) {
            *a += b / DEMO_CURVES as f64;
        }
    }
    let l2 =
        |a: &[f64], b: &[f64]| (a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
    r.series.push(Series::new("non-private sample mean", private.xs.clone(), sample_mean.clone()));
    println!("{}", plot::terminal(&r.series, 72, 14));
    println!(
        "L² distance to the sample mean: {:.4}; to the true mean 0.1·sin(πt): {:.4} (sample mean: {:.4})",
        l2(&private.ys, &sample_mean),
        l2(&private.ys, &true_mean(DEMO_CURVE_POINTS)),
        l2(&sample_mean, &true_mean(DEMO_CURVE_POINTS))
    );
    print_budgets(&session)?;
    panels.push(Panel { title: r.title, series: r.series, x_label: "t".into(), y_label: "mean".into() });
    let svg_path: PathBuf = dir.join("kde.svg");
    std::fs::write(&svg_path, plot::svg_panels(&panels)).map_err(io)?;
    println!("image: {}", svg_path.display());
    Ok(())
}
