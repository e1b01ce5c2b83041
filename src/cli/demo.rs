//! `dpcurve demo`: Hall et al.'s Fig. 1 example at scale, end to end through SQL.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Float64Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::parquet::arrow::ArrowWriter;

use super::plot::{self, Panel, Series};
use crate::mechanism::kde_release::trapezoid;
use crate::mechanism::{Calibration, Grid, KdeLayout, KdeMechanism, KdeSpec};
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
/// Seed of the *data* generator (the data is synthetic and public; the privacy noise
/// always comes from the operating system).
const DATA_SEED: u64 = 2013;

pub use crate::datagen::mixture;
use crate::datagen::{karhunen_loeve_curves, true_mean};

/// Writes the demo table: `id` (row number, Int64) and `x` (Float64).
pub fn write_parquet(path: &Path, values: &[f64]) -> Result<()> {
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("x", DataType::Float64, true)]));
    let ids = Int64Array::from_iter_values(0..values.len() as i64);
    let batch =
        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ids), Arc::new(Float64Array::from(values.to_vec()))])?;
    let file = File::create(path).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let mut writer = ArrowWriter::try_new(file, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

/// The demo's release parameters.
pub fn demo_spec() -> KdeSpec {
    KdeSpec {
        grid: Grid { lo: -0.2, hi: 1.2, points: 512 },
        bandwidth: 0.02,
        epsilon: 0.5,
        delta: 1e-6,
        calibration: Calibration::Analytic,
        normalise: crate::mechanism::Normalise::Project,
    }
}

/// One private-vs-exact comparison of the demo.
struct Comparison {
    title: String,
    series: Vec<Series>,
    mass: f64,
    count: usize,
    gap: f64,
}

async fn compare(session: &AnalystSession, spec: &KdeSpec, values: &[f64], every: usize) -> Result<Comparison> {
    let filter = if every > 1 { format!("\nWHERE id % {every} = 0") } else { String::new() };
    // lo and hi are omitted: they come from the public bounds in the table's policy.
    let sql = format!(
        "SELECT private_kde(x, bandwidth => {:?}, epsilon => {:?}, delta => {:?}, points => {}, mechanism => 'gaussian') AS kde\nFROM mixture{filter}",
        spec.bandwidth, spec.epsilon, spec.delta, spec.grid.points
    );
    println!("\n{sql};\n");
    let batches = session.query(&sql).await?;
    let kde = batches[0].column(0).as_struct();
    let list = |name: &str| -> Option<Vec<f64>> {
        let col = kde.column_by_name(name)?.as_list::<i32>();
        col.is_valid(0).then(|| col.value(0).as_primitive::<Float64Type>().values().to_vec())
    };
    let xs = list("x").unwrap_or_default();
    let mass = kde.column_by_name("mass").map(|c| c.as_primitive::<Float64Type>().value(0)).unwrap_or(f64::NAN);
    let private = list("density").unwrap_or_else(|| vec![f64::NAN; xs.len()]);

    // The non-private reference: the exact kernel sum of the same rows, normalised the same way.
    let rows: Vec<f64> = values.iter().step_by(every).copied().collect();
    let exact = KdeLayout::exact_sum(&spec.grid, spec.bandwidth, &rows);
    let area = trapezoid(&exact, spec.grid.step());
    let exact: Vec<f64> = exact.iter().map(|v| v / area).collect();
    let peak = exact.iter().cloned().fold(0.0, f64::max);
    let gap = private.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / peak;
    let count = rows.iter().filter(|v| (spec.grid.lo..=spec.grid.hi).contains(*v)).count();
    let title = format!("n = {} rows, ε = {:?}, δ = {:?}", rows.len(), spec.epsilon, spec.delta);
    let series = vec![Series::new("private_kde", xs.clone(), private), Series::new("non-private KDE", xs, exact)];
    Ok(Comparison { title, series, mass, count, gap })
}

/// Runs the demo, writing files under `dir`.
pub async fn run(dir: &Path) -> Result<()> {
    let io = |e: std::io::Error| DataFusionError::External(Box::new(e));
    std::fs::create_dir_all(dir).map_err(io)?;
    let data_path = dir.join("mixture.parquet");
    let values = mixture(DEMO_ROWS, DATA_SEED);
    write_parquet(&data_path, &values)?;
    println!(
        "wrote {} ({} draws from 0.5·N(0.3, 0.1²) + 0.5·N(0.7, 0.1²); columns id, x)",
        data_path.display(),
        DEMO_ROWS
    );

    let spec = demo_spec();
    let sigma = KdeMechanism::sigma_for(&spec).map_err(|e| DataFusionError::Plan(e.to_string()))?;

    // The data owner: a fresh catalog in which `mixture` is private.
    let catalog_path = dir.join("catalog.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", catalog_path.display()));
    }
    let policy = |e: crate::policy::PolicyError| DataFusionError::Plan(e.to_string());
    let admin = Admin::open(&catalog_path).map_err(policy)?;
    admin.register("mixture", &data_path.to_string_lossy()).await.map_err(policy)?;
    admin.make_private("mixture", DEMO_BUDGET.0, DEMO_BUDGET.1).map_err(policy)?;
    admin.set_bounds("mixture", "x", spec.grid.lo, spec.grid.hi).await.map_err(policy)?;
    println!(
        "catalog {}: table 'mixture' is private, total budget ε = {}, δ = {}, public bounds x ∈ [{:?}, {:?}]",
        catalog_path.display(),
        DEMO_BUDGET.0,
        DEMO_BUDGET.1,
        spec.grid.lo,
        spec.grid.hi
    );

    // The analyst: a read-only session on that catalog.
    let session = AnalystSession::with_catalog(Arc::clone(admin.catalog()), SessionOptions::default()).await?;
    let mut panels = Vec::new();
    for every in [1, 100] {
        let c = compare(&session, &spec, &values, every).await?;
        println!("{}", c.title);
        println!("{}", plot::terminal(&c.series, 72, 16));
        println!(
            "released mass (noisy count in [{:?}, {:?}]): {:.1}   true count: {}",
            spec.grid.lo, spec.grid.hi, c.mass, c.count
        );
        println!("largest gap between the curves: {:.2} % of the peak density", 100.0 * c.gap);
        for (table, total, spent, remaining) in session.budgets()? {
            println!("budget of '{table}': spent {spent} of {total}; remaining {remaining}");
        }
        panels.push(Panel {
            title: format!("private vs non-private KDE, {}", c.title),
            series: c.series,
            x_label: "x".into(),
            y_label: "density".into(),
        });
    }
    println!(
        "\nnoise: exact discrete Gaussian on the kernel sum's Fourier coefficients (a Gaussian process with the \
         kernel's covariance), σ = {sigma:.4} on the unnormalised kernel sum (sensitivity Δ = 1, zCDP calibration)"
    );
    println!("the same σ protects one row in both queries; with fewer rows the signal is smaller, so the noise shows.");

    // Functional data: simulated growth-like curves, one per row, private mean curve.
    let curves_path = dir.join("curves.parquet");
    let curves = karhunen_loeve_curves(DEMO_CURVES, DEMO_CURVE_POINTS, DATA_SEED);
    write_curves_parquet(&curves_path, &curves)?;
    admin.register("curves", &curves_path.to_string_lossy()).await.map_err(policy)?;
    admin.make_private("curves", DEMO_BUDGET.0, DEMO_BUDGET.1).map_err(policy)?;
    admin.set_bounds("curves", "c", -0.5, 0.5).await.map_err(policy)?;
    println!(
        "\nwrote {} ({DEMO_CURVES} curves of {DEMO_CURVE_POINTS} points from Mirshani et al.'s simulation, mean 0.1·sin(πt)); \
         private, values bounded in [-0.5, 0.5] (so the clip norm is 0.5)",
        curves_path.display()
    );
    let session = AnalystSession::with_catalog(Arc::clone(admin.catalog()), SessionOptions::default()).await?;
    let sql = "SELECT private_mean_curve(c, epsilon => 1, delta => 1e-5) AS m FROM curves";
    println!("\n{sql};\n");
    let batches = session.query(sql).await?;
    let m = batches[0].column(0).as_struct();
    let list = |name: &str| -> Vec<f64> {
        m.column_by_name(name)
            .map(|c| c.as_list::<i32>().value(0).as_primitive::<Float64Type>().values().to_vec())
            .unwrap_or_default()
    };
    let (t, private_mean) = (list("t"), list("mean"));
    let mut sample_mean = vec![0.0; DEMO_CURVE_POINTS];
    for c in &curves {
        for (a, b) in sample_mean.iter_mut().zip(c) {
            *a += b / DEMO_CURVES as f64;
        }
    }
    let l2 =
        |a: &[f64], b: &[f64]| (a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
    let series = vec![
        Series::new("private_mean_curve", t.clone(), private_mean.clone()),
        Series::new("non-private sample mean", t.clone(), sample_mean.clone()),
    ];
    println!("{}", plot::terminal(&series, 72, 14));
    println!(
        "L² distance to the sample mean: {:.4}; to the true mean 0.1·sin(πt): {:.4} (sample mean: {:.4})",
        l2(&private_mean, &sample_mean),
        l2(&private_mean, &true_mean(DEMO_CURVE_POINTS)),
        l2(&sample_mean, &true_mean(DEMO_CURVE_POINTS))
    );
    for (table, total, spent, remaining) in session.budgets()? {
        println!("budget of '{table}': spent {spent} of {total}; remaining {remaining}");
    }
    panels.push(Panel {
        title: format!("private vs non-private mean curve, n = {DEMO_CURVES} curves, ε = 1, δ = 1e-5"),
        series,
        x_label: "t".into(),
        y_label: "mean".into(),
    });
    let svg_path: PathBuf = dir.join("kde.svg");
    std::fs::write(&svg_path, plot::svg_panels(&panels)).map_err(io)?;
    println!("image: {}", svg_path.display());
    Ok(())
}
