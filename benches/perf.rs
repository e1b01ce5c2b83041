//! dpcurve's benchmark harness: every number is a ratio against a baseline measured in the
//! same run, on data the harness generates itself (deterministic seeds).
//!
//! ```text
//! cargo bench --bench perf                                   # default sizes
//! cargo bench --bench perf -- --rows 1e6,1e7,1e8 --curves 1e5,1e6
//! cargo bench --bench perf -- --only kde,peers --rows 1e7 --reps 9
//! ```
//!
//! Sections (`--only` takes a comma-separated subset):
//! * `kde`: `private_kde` (through an analyst session, budget gate included; the Gaussian
//!   release, the pure-ε one at the same bandwidth and with `bandwidth => 'auto'`, bands
//!   included) vs `sum(x)` vs `count(*)` on the same Parquet file, and the per-row cost of the binning loop against a
//!   plain sum and a bare histogram (one core, values in memory);
//! * `peers`: KDEpy `FFTKDE` and statsmodels `KDEUnivariate(fft=True)` end to end on the same
//!   file (`benches/peers.py`, run in a local virtual environment it creates; skipped with a
//!   message when Python or the packages are not available);
//! * `cdf`: `private_cdf` (pure ε, and δ > 0) and `private_quantiles` (99 percentiles) at ε = 1 vs
//!   `sum(x)` on the same file (`'auto'` leaves: 4 096 at these sizes), and the first use of the
//!   CDF band's simulated threshold (once per tree shape, noise and α) against the release;
//! * `mean`: `private_mean_curve` (warm eigen cache) vs `count(c)` over the same list column;
//! * `eigen`: cold vs warm `private_mean_curve` at m = 100, 500, 1000;
//! * `noise`: the exact discrete samplers (samples/s) and the parts of a release (lifted
//!   coordinates in double-double, noise, synthesis) for `private_kde` at G = 256…16384 and
//!   `private_mean_curve` at m = 100, 1000; the first use of a pure-ε KDE band (its simulated
//!   quantile) against the release;
//! * `gate`: per-query cost of the budget gate, ledger on disk (fsync) vs in memory (tmpfs);
//! * `process`: one `dpcurve sql --catalog … -c` process per query (the binary this bench was built
//!   with, or `--binary`) vs the same query in one analyst session: `private_kde` (pure ε) over 10⁵ rows and
//!   `private_mean_curve` over 10⁴ curves at m = 100 and 1000, each with the store beside the
//!   catalog warm and emptied before the process (cold), and `SELECT 1` (the process floor), also
//!   on a catalog grown by 400 kept results of 1 MiB;
//! * `groups`: `SELECT g, private_kde(x, …) … GROUP BY g` over 100 declared keys, the same with a
//!   privacy unit (≈ 100 rows per unit; K = 10, L = 3) and over private keys (partition
//!   selection), vs `SELECT g, sum(x) … GROUP BY g` on the same file (10^7 rows by default: the
//!   largest `--rows`).
//!
//! Options: `--rows LIST` (default 1e6,1e7), `--curves LIST` (default 1e5), `--reps N`
//! (default 7), `--data DIR` (default `target/bench-data`;
//! generated files are reused), `--python PATH` (default `python3`), `--groups LIST` (the
//! `groups` variants to run besides the baseline: `plain,units,selection`, the default; `floor`
//! adds `min(x) … GROUP BY u`, the unit grouping alone; `filter` adds `sum(x) … WHERE g BETWEEN
//! 0 AND 99`, the declared keys' filter alone; `units-selection` the grouped call over private keys
//! with a privacy unit; `text` the grouped call over 100 declared text keys, and `text-baseline`
//! `sum(x) … GROUP BY s` over the same text column), `--binary PATH` (the `dpcurve` the `process`
//! section starts, by default the one built with this bench: e.g. `target/dist/dpcurve`, built with
//! `cargo build --profile dist`).
//! Repetitions interleave the variants (round-robin) so drift in a shared machine affects all
//! of them alike; a ratio's spread is the range of the per-round ratios.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, FixedSizeListBuilder, Float64Array, Float64Builder, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use dpcurve::mechanism::contribution::Contribution;
use dpcurve::mechanism::curves::mean_curve::{CovKernel, Eigenbasis, MeanCurveMechanism, MeanCurveSpec};
use dpcurve::mechanism::density::kde::{Grid, KdeLayout};
use dpcurve::mechanism::density::release::{KdeMechanism, KdeSpec};
use dpcurve::mechanism::distribution::release::{CdfMechanism, CdfNoise, CdfSpec, Resolution};
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::mechanism::noise::calibration::Calibration;
use dpcurve::mechanism::noise::lattice::LatticeMechanism;
use dpcurve::policy::{Catalog, Charge, QueryRecord};
use dpcurve::{Admin, AnalystSession, SessionOptions};
use rand::SeedableRng;

// ---------------------------------------------------------------------------------------------
// Options and reporting

struct Options {
    rows: Vec<usize>,
    curves: Vec<usize>,
    reps: usize,
    only: Option<Vec<String>>,
    data: PathBuf,
    python: String,
    groups: Vec<String>,
    /// The `dpcurve` binary the `process` section starts.
    binary: PathBuf,
}

fn parse_count(s: &str) -> usize {
    let v: f64 = s.trim().parse().unwrap_or_else(|_| panic!("not a number: {s}"));
    assert!(v >= 1.0 && v.fract() == 0.0, "not a positive count: {s}");
    v as usize
}

impl Options {
    fn parse() -> Self {
        let mut o = Options {
            rows: vec![1_000_000, 10_000_000],
            curves: vec![100_000],
            reps: 7,
            only: None,
            data: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("bench-data"),
            python: "python3".into(),
            groups: vec!["plain".into(), "units".into(), "selection".into()],
            binary: PathBuf::from(env!("CARGO_BIN_EXE_dpcurve")),
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
            match a.as_str() {
                "--bench" => {} // added by `cargo bench`
                "--rows" => o.rows = value().split(',').map(parse_count).collect(),
                "--curves" => o.curves = value().split(',').map(parse_count).collect(),
                "--reps" => o.reps = parse_count(&value()),
                "--only" => o.only = Some(value().split(',').map(|s| s.trim().to_string()).collect()),
                "--data" => o.data = PathBuf::from(value()),
                "--python" => o.python = value(),
                "--groups" => o.groups = value().split(',').map(|s| s.trim().to_string()).collect(),
                "--binary" => o.binary = PathBuf::from(value()),
                other => panic!("unknown option {other} (see the header of benches/perf.rs)"),
            }
        }
        o
    }

    fn wants(&self, section: &str) -> bool {
        self.only.as_ref().is_none_or(|s| s.iter().any(|x| x == section))
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)))
}

/// Summary lines collected for the final Markdown table.
#[derive(Default)]
struct Report {
    lines: Vec<String>,
}

impl Report {
    fn add(&mut self, bench: &str, size: &str, variant: &str, ms: f64, ratio: &str) {
        self.lines.push(format!("| {bench} | {size} | {variant} | {ms:.3} | {ratio} |"));
    }

    fn print(&self) {
        println!("\n## Summary (median milliseconds; ratio = median of per-round ratios [min, max])\n");
        println!("| benchmark | size | variant | ms | ratio to baseline |");
        println!("|---|---|---|---|---|");
        for l in &self.lines {
            println!("{l}");
        }
    }
}

/// Times `variants` round-robin (`reps` rounds after one warm-up round). Returns the
/// milliseconds per variant, per round.
async fn interleaved(variants: &[(&str, &AnalystSession, String)], reps: usize) -> Vec<Vec<f64>> {
    for (_, s, sql) in variants {
        s.query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let mut times = vec![Vec::with_capacity(reps); variants.len()];
    for _ in 0..reps {
        for (i, (_, s, sql)) in variants.iter().enumerate() {
            let t = Instant::now();
            std::hint::black_box(s.query(sql).await.unwrap());
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times
}

/// Prints and records `times` against variant `base`.
fn report_against(report: &mut Report, bench: &str, size: &str, names: &[&str], times: &[Vec<f64>], base: usize) {
    for (i, name) in names.iter().enumerate() {
        let ratios: Vec<f64> = times[i].iter().zip(&times[base]).map(|(a, b)| a / b).collect();
        let (lo, hi) = min_max(&times[i]);
        let (rlo, rhi) = min_max(&ratios);
        let ratio =
            if i == base { "1 (baseline)".to_string() } else { format!("{:.2} [{rlo:.2}, {rhi:.2}]", median(&ratios)) };
        println!("  {name:<34} {:>10.3} ms [{lo:.3}, {hi:.3}]   {ratio}", median(&times[i]));
        report.add(bench, size, name, median(&times[i]), &ratio);
    }
}

fn human(n: usize) -> String {
    let e = (n as f64).log10();
    if n >= 1000 && e.fract() == 0.0 { format!("1e{}", e as u32) } else { n.to_string() }
}

// ---------------------------------------------------------------------------------------------
// Data (deterministic, reused across runs)

const CHUNK: usize = 1 << 20;

/// Writes `rows` rows to `path` (once; reused afterwards) as one column `name` of type
/// `data_type`, in chunks of at most `per_chunk` rows made by `chunk(rows, seed)`.
fn generated_file(
    path: PathBuf,
    name: &str,
    data_type: DataType,
    rows: usize,
    per_chunk: usize,
    mut chunk: impl FnMut(usize, u64) -> ArrayRef,
) -> PathBuf {
    if path.exists() {
        return path;
    }
    println!("  generating {} …", path.display());
    let schema = Arc::new(Schema::new(vec![Field::new(name, data_type, true)]));
    let tmp = path.with_extension("tmp");
    let mut w = ArrowWriter::try_new(File::create(&tmp).unwrap(), Arc::clone(&schema), None).unwrap();
    let (mut done, mut seed) = (0, 1000);
    while done < rows {
        let n = per_chunk.min(rows - done);
        w.write(&RecordBatch::try_new(Arc::clone(&schema), vec![chunk(n, seed)]).unwrap()).unwrap();
        done += n;
        seed += 1;
    }
    w.close().unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// `rows` draws of the Hall et al. mixture in one Float64 column `x`.
fn mixture_file(dir: &Path, rows: usize) -> PathBuf {
    let path = dir.join(format!("mixture-{}.parquet", human(rows)));
    generated_file(path, "x", DataType::Float64, rows, CHUNK, |n, seed| {
        Arc::new(Float64Array::from(dpcurve::datagen::mixture(n, seed)))
    })
}

/// `n` Karhunen–Loève curves of length `m` in one FixedSizeList column `c`.
fn curves_file(dir: &Path, n: usize, m: usize) -> PathBuf {
    let path = dir.join(format!("curves-{}x{m}.parquet", human(n)));
    let item = Arc::new(Field::new("item", DataType::Float64, true));
    generated_file(path, "c", DataType::FixedSizeList(item, m as i32), n, (CHUNK / m).max(1), |k, seed| {
        let mut b = FixedSizeListBuilder::new(Float64Builder::new(), m as i32);
        for c in dpcurve::datagen::karhunen_loeve_curves(k, m, seed + 1000) {
            b.values().append_slice(&c);
            b.append(true);
        }
        Arc::new(b.finish())
    })
}

/// A private copy of `file` (a private table's files may be reached by no other table, so
/// the public baseline reads the original and the private table a copy with the same bytes).
fn private_copy(file: &Path) -> PathBuf {
    let copy = file.with_extension("private.parquet");
    let same = std::fs::metadata(&copy).ok().map(|m| m.len()) == std::fs::metadata(file).ok().map(|m| m.len());
    if !same {
        std::fs::copy(file, &copy).unwrap();
    }
    copy
}

/// A catalog with `pub_t` (public, the file) and `priv_t` (private, a copy of it; a budget large
/// enough for any benchmark run). Returns the admin handle and the analyst session.
async fn catalog_with_admin(dir: &Path, name: &str, file: &Path) -> (Admin, AnalystSession) {
    let path = dir.join(format!("catalog-{name}-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let admin = Admin::open(&path).unwrap();
    admin.register("pub_t", &file.to_string_lossy()).await.unwrap();
    admin.register("priv_t", &private_copy(file).to_string_lossy()).await.unwrap();
    admin.make_private("priv_t", 1000.0, 0.5).await.unwrap();
    let s = AnalystSession::open(&path, SessionOptions::default()).await.unwrap();
    (admin, s)
}

async fn catalog_session(dir: &Path, name: &str, file: &Path) -> AnalystSession {
    catalog_with_admin(dir, name, file).await.1
}

fn remove_catalog(dir: &Path, name: &str) {
    let base = dir.join(format!("catalog-{name}-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", base.display()));
    }
    let _ = std::fs::remove_dir_all(format!("{}.cache", base.display()));
}

// ---------------------------------------------------------------------------------------------
// Sections

/// The KDE query every KDE section runs (ε small so the budget lasts; noise cost is the same).
const KDE_BANDWIDTH: f64 = 0.02;
const KDE_POINTS: usize = 1024;
fn kde_sql(table: &str) -> String {
    format!("SELECT private_kde(x, {KDE_BANDWIDTH}, 0.001, 1e-9, -0.2, 1.2, {KDE_POINTS}) FROM {table}")
}

/// The same query through the pure-ε (default for δ = 0) mechanism, at a bandwidth or 'auto'.
fn kde_pure_sql(table: &str, bandwidth: &str) -> String {
    format!("SELECT private_kde(x, {bandwidth}, 0.001, 0, -0.2, 1.2, {KDE_POINTS}) FROM {table}")
}

async fn kde(o: &Options, report: &mut Report) -> Vec<(usize, PathBuf, f64)> {
    let mut medians = Vec::new();
    for &rows in &o.rows {
        println!("\n# private_kde vs the scan floor, {} rows (h = {KDE_BANDWIDTH}, {KDE_POINTS} points)", human(rows));
        let file = mixture_file(&o.data, rows);
        let s = catalog_session(&o.data, "kde", &file).await;
        let names = [
            "SELECT sum(x)",
            "SELECT count(*)",
            "private_kde (gate included)",
            "private_kde, pure ε (δ = 0)",
            "private_kde, bandwidth 'auto'",
        ];
        let sqls = [
            "SELECT sum(x) FROM pub_t".to_string(),
            "SELECT count(*) FROM pub_t".into(),
            kde_sql("priv_t"),
            kde_pure_sql("priv_t", &KDE_BANDWIDTH.to_string()),
            kde_pure_sql("priv_t", "'auto'"),
        ];
        let variants: Vec<_> = names.iter().zip(sqls).map(|(n, q)| (*n, &s, q)).collect();
        let times = interleaved(&variants, o.reps).await;
        let size = format!("{} rows", human(rows));
        report_against(report, "kde", &size, &names, &times, 0);
        // The default (pure-ε) release against the Gaussian one, round by round: what its band
        // and its node evaluation add.
        for (i, name) in [(3, "pure ε ÷ Gaussian release"), (4, "'auto' ÷ Gaussian release")] {
            let ratios: Vec<f64> = times[i].iter().zip(&times[2]).map(|(a, b)| a / b).collect();
            let (rlo, rhi) = min_max(&ratios);
            let ratio = format!("{:.2} [{rlo:.2}, {rhi:.2}]", median(&ratios));
            println!("  {name:<34} {ratio}");
            report.add("kde", &size, name, median(&times[i]), &ratio);
        }
        medians.push((rows, file, median(&times[2])));
        drop(s);
        remove_catalog(&o.data, "kde");
    }
    medians
}

/// `private_cdf` and `private_quantiles` against `sum(x)`, then what the first use of a tree
/// shape's band costs against the release itself (the threshold is simulated once per shape,
/// noise and α, then cached in memory and beside the catalog).
async fn cdf(o: &Options, report: &mut Report) {
    const RANGE: &str = "-0.2, 1.2";
    let probabilities: Vec<String> = (1..100).map(|p| format!("{:.2}", p as f64 / 100.0)).collect();
    for &rows in &o.rows {
        println!("\n# private_cdf vs the scan floor, {} rows (ε = 1, 'auto' leaves)", human(rows));
        let file = mixture_file(&o.data, rows);
        let s = catalog_session(&o.data, "cdf", &file).await;
        let names = [
            "SELECT sum(x)",
            "private_cdf, pure ε (δ = 0)",
            "private_cdf, δ = 1e-9",
            "private_quantiles, 99 p, pure ε",
        ];
        let sqls = [
            "SELECT sum(x) FROM pub_t".to_string(),
            format!("SELECT private_cdf(x, 1, 0, {RANGE}) FROM priv_t"),
            format!("SELECT private_cdf(x, 1, 1e-9, {RANGE}) FROM priv_t"),
            format!("SELECT private_quantiles(x, [{}], 1, 0, {RANGE}) FROM priv_t", probabilities.join(", ")),
        ];
        let variants: Vec<_> = names.iter().zip(sqls).map(|(n, q)| (*n, &s, q)).collect();
        let times = interleaved(&variants, o.reps).await;
        report_against(report, "cdf", &format!("{} rows", human(rows)), &names, &times, 0);
        drop(s);
        remove_catalog(&o.data, "cdf");
    }
    println!("\n# private_cdf band, 4096 leaves (the 'auto' resolution at large n·ε): first use vs the release");
    let reps = o.reps.max(20);
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(1);
    let xs = dpcurve::datagen::mixture(100_000, 7);
    for (noise, delta, label) in [(CdfNoise::Laplace, 0.0, "pure ε"), (CdfNoise::Gaussian, 1e-9, "δ = 1e-9")] {
        let spec = CdfSpec {
            lo: -0.2,
            hi: 1.2,
            points: 512,
            resolution: Resolution::Fixed { log2: 12 },
            noise,
            epsilon: 1.0,
            delta,
            calibration: Calibration::Analytic,
        };
        let m = CdfMechanism::new(spec, Contribution::new(1, 1).unwrap()).unwrap();
        let mut sums = m.statistic();
        m.accumulate(&mut sums, &xs);
        let leaves = sums.totals().to_vec();
        let release = median(&time_ms(reps, || {
            let (k, levels) = m.release(&leaves, Some(&mut rng));
            m.prefix_counts(k, &levels).unwrap()
        }));
        // A new level α each time: a threshold never simulated before (α is part of the key).
        let mut level = 0u64;
        let first = median(&time_ms(o.reps.clamp(3, 9), || {
            level += 1;
            m.band_threshold(12, 0.05 + level as f64 * 1e-9)
        }));
        let cached = median(&time_ms(reps, || m.band_threshold(12, 0.05 + level as f64 * 1e-9)));
        println!(
            "  {label:<10} release {release:>8.3} ms | band, first use {first:>8.3} ms ({:.0}x the release), cached {cached:.4} ms",
            first / release
        );
        report.add(
            "cdf",
            &format!("band, 4096 leaves, {label}"),
            "first use (simulated)",
            first,
            &format!("{:.0}x the release ({release:.3} ms)", first / release),
        );
    }
}

/// The per-row costs behind the KDE ratios, single-threaded on 10^7 values in memory: the
/// statistic's binning loop against a plain sum and a bare histogram (one add per row).
fn binning(report: &mut Report, reps: usize) {
    let n = 10_000_000;
    println!("\n# per-row costs, one core, {} values in memory (ns per row)", human(n));
    let xs = dpcurve::datagen::mixture(n, 1000);
    let grid = Grid { lo: -0.2, hi: 1.2, points: KDE_POINTS };
    let layout = KdeLayout::new(grid, KDE_BANDWIDTH).unwrap();
    let sum = time_ms(reps, || xs.iter().sum::<f64>());
    let histogram = time_ms(reps, || {
        let mut counts = vec![0u64; layout.state_len()];
        let inv = (layout.state_len() - 1) as f64 / 3.0;
        for &x in &xs {
            counts[(((x + 1.0) * inv) as usize).min(layout.state_len() - 1)] += 1;
        }
        counts
    });
    let bin = time_ms(reps, || {
        let mut acc = layout.accumulation();
        layout.accumulate(&mut acc, &xs);
        acc
    });
    for (name, t) in [("sum of f64", &sum), ("histogram, one add per row", &histogram), ("private_kde binning", &bin)] {
        let ns = median(t) * 1e6 / n as f64;
        println!("  {name:<34} {ns:>8.2} ns/row   {:.2}x the sum", median(t) / median(&sum));
        report.add("per-row cost (1 core)", "1e7 in memory", name, median(t), &format!("{ns:.2} ns/row"));
    }
}

/// Runs `benches/peers.py` on each file; prints KDEpy/statsmodels against private_kde.
fn peers(o: &Options, report: &mut Report, kde_runs: &[(usize, PathBuf, f64)]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches").join("peers.py");
    let venv = o.data.join("venv");
    for (rows, file, ours) in kde_runs {
        println!("\n# peers, {} rows (end to end: Parquet → curve; Python, one thread)", human(*rows));
        let out = std::process::Command::new(&o.python)
            .arg(&script)
            .args(["--venv", &venv.to_string_lossy(), "--file", &file.to_string_lossy()])
            .args(["--bandwidth", &KDE_BANDWIDTH.to_string(), "--points", &KDE_POINTS.to_string()])
            .args(["--reps", &o.reps.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output();
        let out = match out {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).to_string(),
            Ok(out) => {
                println!("  peers skipped: {} exited with {}", script.display(), out.status);
                print!("{}", String::from_utf8_lossy(&out.stdout));
                return;
            }
            Err(e) => {
                println!("  peers skipped: cannot run {}: {e}", o.python);
                return;
            }
        };
        let mut any = false;
        for line in out.lines() {
            if let Some(skip) = line.strip_prefix("SKIP ") {
                println!("  peers skipped: {skip}");
                return;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let name = v["name"].as_str().unwrap_or("?");
            let times: Vec<f64> = v["ms"].as_array().unwrap().iter().filter_map(|t| t.as_f64()).collect();
            let (lo, hi) = min_max(&times);
            let m = median(&times);
            let r = m / ours;
            let ratio = if r >= 1.0 {
                format!("private_kde {r:.2}x faster")
            } else {
                format!("private_kde {:.2}x slower", 1.0 / r)
            };
            println!("  {name:<34} {m:>10.3} ms [{lo:.3}, {hi:.3}]   vs private_kde {ours:.3} ms: {ratio}");
            report.add("peers", &format!("{} rows", human(*rows)), name, m, &ratio);
            any = true;
        }
        if !any {
            println!("  peers skipped: no results from {}", script.display());
            return;
        }
    }
}

const MEAN_SQL: &str = "SELECT private_mean_curve(c, 1.0, 1e-9, clip => 0.5) FROM priv_t";

async fn mean(o: &Options, report: &mut Report) {
    for &n in &o.curves {
        let m = 100;
        println!("\n# private_mean_curve vs count(c), {} curves × m = {m} (warm eigen cache)", human(n));
        let file = curves_file(&o.data, n, m);
        let s = catalog_session(&o.data, "mean", &file).await;
        let names = ["SELECT count(c)", "private_mean_curve (gate included)"];
        let sqls = ["SELECT count(c) FROM pub_t".to_string(), MEAN_SQL.to_string()];
        let variants: Vec<_> = names.iter().zip(sqls).map(|(n, q)| (*n, &s, q)).collect();
        let times = interleaved(&variants, o.reps).await;
        report_against(report, "mean_curve", &format!("{} × {m}", human(n)), &names, &times, 0);
        drop(s);
        remove_catalog(&o.data, "mean");
    }
}

async fn eigen(o: &Options, report: &mut Report) {
    let n = 10_000;
    for m in [100usize, 500, 1000] {
        println!("\n# eigendecomposition cache, {} curves × m = {m}", human(n));
        let file = curves_file(&o.data, n, m);
        let s = catalog_session(&o.data, "eigen", &file).await;
        let mut floor = Vec::new();
        let mut warm = Vec::new();
        let mut cold = Vec::new();
        let mut decomposition = Vec::new();
        s.query(MEAN_SQL).await.unwrap();
        s.query("SELECT count(c) FROM pub_t").await.unwrap();
        for _ in 0..o.reps {
            let time = async |sql: &str, clear: bool| {
                if clear {
                    Eigenbasis::clear_cache();
                }
                let t = Instant::now();
                std::hint::black_box(s.query(sql).await.unwrap());
                t.elapsed().as_secs_f64() * 1e3
            };
            floor.push(time("SELECT count(c) FROM pub_t", false).await);
            warm.push(time(MEAN_SQL, false).await);
            cold.push(time(MEAN_SQL, true).await);
            let t = Instant::now();
            std::hint::black_box(Eigenbasis::compute(
                dpcurve::mechanism::curves::mean_curve::CovKernel::Matern32,
                0.2,
                m,
            ));
            decomposition.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let names = ["SELECT count(c)", "private_mean_curve warm", "private_mean_curve cold"];
        report_against(report, "eigen cache", &format!("{} × {m}", human(n)), &names, &[floor, warm, cold], 0);
        let (lo, hi) = min_max(&decomposition);
        println!("  {:<34} {:>10.3} ms [{lo:.3}, {hi:.3}]", "eigendecomposition alone", median(&decomposition));
        report.add("eigen cache", &format!("m = {m}"), "eigendecomposition alone", median(&decomposition), "");
        drop(s);
        remove_catalog(&o.data, "eigen");
    }
}

/// One query per `dpcurve sql` process against the same query inside one session.
async fn process(o: &Options, report: &mut Report) {
    let cases = [
        ("private_kde (pure ε), 10⁵ rows", mixture_file(&o.data, 100_000), kde_pure_sql("priv_t", "0.02")),
        ("private_mean_curve, 10⁴ × m = 100", curves_file(&o.data, 10_000, 100), MEAN_SQL.to_string()),
        ("private_mean_curve, 10⁴ × m = 1000", curves_file(&o.data, 10_000, 1000), MEAN_SQL.to_string()),
    ];
    for (what, file, sql) in cases {
        println!("\n# one process per query: {what}");
        let (_admin, s) = catalog_with_admin(&o.data, "process", &file).await;
        let catalog = o.data.join(format!("catalog-process-{}.db", std::process::id()));
        let store = o.data.join(format!("catalog-process-{}.db.cache", std::process::id()));
        let spawn = |sql: &str, cold: bool| {
            if cold {
                let _ = std::fs::remove_dir_all(&store);
            }
            let t = Instant::now();
            let out = std::process::Command::new(&o.binary)
                .args(["sql", "--catalog", &catalog.to_string_lossy(), "--format", "csv", "-c", sql])
                .output()
                .unwrap();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
            ms
        };
        s.query(&sql).await.unwrap();
        spawn(&sql, false);
        let mut times = vec![Vec::new(); 4];
        for _ in 0..o.reps {
            let t = Instant::now();
            std::hint::black_box(s.query(&sql).await.unwrap());
            times[0].push(t.elapsed().as_secs_f64() * 1e3);
            times[1].push(spawn(&sql, false));
            times[2].push(spawn(&sql, true));
            times[3].push(spawn("SELECT 1", false));
        }
        let names =
            ["in one session", "one process per query", "one process, store emptied", "process floor: SELECT 1"];
        report_against(report, "process", what, &names, &times, 0);
        drop(s);
        remove_catalog(&o.data, "process");
    }
    grown_catalog(o, report).await;
}

/// `SELECT 1` in one process on a new catalog, on the same catalog once it holds 400 kept
/// results of 1 MiB (what a busy server's catalog grows to) and once it also has 100 more tables:
/// opening must grow neither with the logs nor with the tables a statement does not name.
async fn grown_catalog(o: &Options, report: &mut Report) {
    println!(
        "\n# one process per query: SELECT 1 on a catalog that grew (400 kept results of 1 MiB, then 100 more tables)"
    );
    let file = mixture_file(&o.data, 100_000);
    let (admin, s) = catalog_with_admin(&o.data, "process", &file).await;
    drop(s);
    let catalog = o.data.join(format!("catalog-process-{}.db", std::process::id()));
    let select = || {
        let t = Instant::now();
        let out = std::process::Command::new(&o.binary)
            .args(["sql", "--catalog", &catalog.to_string_lossy(), "--format", "csv", "-c", "SELECT 1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        t.elapsed().as_secs_f64() * 1e3
    };
    select();
    let new: Vec<f64> = (0..o.reps).map(|_| select()).collect();
    {
        let c = Catalog::open(&catalog).unwrap();
        c.add_analyst("bench").unwrap();
        c.grant("bench", "priv_t", Budget::total(10.0, 0.1).unwrap()).unwrap();
        let result = vec![0x5a; 1 << 20];
        for i in 0..400u32 {
            let ticket = [i.to_le_bytes(), [0; 4], [0; 4], [0; 4]].concat();
            let record = QueryRecord::of(&format!("SELECT private_kde(x, {i}) FROM priv_t")).for_ticket(&ticket);
            let charge = Charge {
                table: "priv_t".into(),
                function: "private_kde".into(),
                cost: Budget::total(0.001, 0.0).unwrap(),
            };
            c.charge_reserving(&[charge], &record, Some("bench"), 1).unwrap();
            c.store_result("bench", &ticket, &result).unwrap().expect("kept");
        }
    }
    let size = std::fs::metadata(&catalog).map_or(0, |m| m.len()) as f64 / 1e6;
    select();
    let grown: Vec<f64> = (0..o.reps).map(|_| select()).collect();
    for i in 0..100 {
        admin.register(&format!("t{i:03}"), &file.to_string_lossy()).await.unwrap();
    }
    select();
    let tables: Vec<f64> = (0..o.reps).map(|_| select()).collect();
    let grown_name = format!("SELECT 1, catalog grown to {size:.0} MB");
    let names = ["SELECT 1, new catalog", grown_name.as_str(), "SELECT 1, the same with 100 more tables"];
    report_against(report, "process", "a grown catalog", &names, &[new, grown, tables], 0);
    remove_catalog(&o.data, "process");
}

fn time_ms<T>(reps: usize, mut f: impl FnMut() -> T) -> Vec<f64> {
    std::hint::black_box(f());
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

fn noise(o: &Options, report: &mut Report) {
    let reps = o.reps.max(20);
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(1);
    // The exact samplers alone, at the scales real releases use.
    println!("\n# exact discrete samplers (integer arithmetic, ChaCha20 bits)");
    let kde = KdeMechanism::new(kde_spec(1024)).unwrap();
    let count = LatticeMechanism::integer_laplace(0.1).unwrap();
    let iclp = LatticeMechanism::laplace(1.0, 100, 0.9).unwrap();
    for (name, lat, draws) in [
        ("discrete Gaussian, KDE release at (1, 1e-6)", kde.lattice(), 20_000),
        ("discrete Laplace, count at ε = 0.1", &count, 20_000),
        ("discrete Laplace, ICLP coordinate", &iclp, 20_000),
    ] {
        let t = median(&time_ms(5, || (0..draws).map(|_| lat.noise_coordinate(&mut rng)).fold(0i128, |a, b| a ^ b)));
        let per_s = draws as f64 / (t / 1e3);
        println!(
            "  {name:<45} {:>8.0} ns/sample  {:>10.3e} samples/s  (σ_L = 2^{:.1})",
            t * 1e6 / draws as f64,
            per_s,
            (lat.noise_sd() / lat.gamma()).log2()
        );
        report.add("noise", name, "one sample", t / draws as f64, &format!("{per_s:.2e} samples/s"));
    }
    println!(
        "\n# private_kde release on G grid points (unit range, h = 1/50 of it): lifted coordinates (double-double FFT), exact noise, synthesis"
    );
    println!(
        "  {:>6} {:>8} {:>6} | {:>12} {:>12} {:>12} {:>12} | {:>12}",
        "G", "m", "dim", "basis", "lift (dd)", "noise", "synthesis", "release"
    );
    for g in [256usize, 1024, 4096, 16384] {
        let spec = kde_spec(g);
        let basis = median(&time_ms(1, || KdeMechanism::new(spec.clone()).unwrap()));
        let mech = KdeMechanism::new(spec).unwrap();
        let state = mech.layout().empty_state();
        let lift = median(&time_ms(reps, || mech.lifted(&state)));
        let w = mech.lattice().round(&mech.lifted(&state));
        let noise = median(&time_ms(reps, || mech.lattice().noise(&mut rng)));
        let real = mech.lattice().to_real(&w);
        let synth = median(&time_ms(reps, || mech.post_process(&mech.curve_from_lifted(&real))));
        let release = median(&time_ms(reps, || mech.release(&state, Some(&mut rng))));
        let (m, dim) = (mech.basis().circle(), mech.basis().dim());
        println!(
            "  {g:>6} {m:>8} {dim:>6} | {basis:>9.3} ms {lift:>9.3} ms {noise:>9.3} ms {synth:>9.3} ms | {release:>9.3} ms"
        );
        report.add(
            "noise",
            &format!("private_kde G = {g}"),
            "whole release (lift + noise + synthesis)",
            release,
            &format!("m = {m}, dim = {dim}"),
        );
    }
    println!(
        "\n# private_mean_curve release (matern32, range 0.2, penalty 0.1): whitened coordinates in double-double, exact noise"
    );
    for points in [100usize, 1000] {
        let m = MeanCurveMechanism::new(MeanCurveSpec {
            points,
            kernel: CovKernel::Matern32,
            range: 0.2,
            penalty: 0.1,
            eta: 1.0,
            clip: 1.0,
            epsilon: 1.0,
            delta: 1e-6,
            count_fraction: 0.1,
            calibration: Calibration::Analytic,
        })
        .unwrap();
        let state = m.empty_state();
        let release = median(&time_ms(reps, || m.release(&state, Some(&mut rng))));
        println!("  m = {points:>5}: {} kept eigenpairs, release {release:.3} ms", m.basis().lambda.len());
        report.add("noise", &format!("private_mean_curve m = {points}"), "whole release", release, "");
    }
    // A pure-ε release's band is the simulated quantile of its noise's supremum, a function of the
    // release's geometry only: computed on its first use and cached (in memory and beside the
    // catalog). Every `'auto'` bandwidth the data pick, and every group's, is a new geometry.
    println!("\n# pure-ε private_kde band on G = 1024 points: first use (simulated, then cached) vs the release");
    for (h, label) in [(1.0 / 50.0, "h = range/50"), (1.0 / 200.0, "h = range/200")] {
        let mech = KdeMechanism::new(KdeSpec { bandwidth: h, delta: 0.0, ..kde_spec(1024) }).unwrap();
        let mut state = mech.layout().empty_state();
        mech.layout().add_all(&mut state, &dpcurve::datagen::mixture(10_000, 7));
        let released = mech.release(&state, Some(&mut rng));
        let release = median(&time_ms(reps, || mech.release(&state, Some(&mut rng))));
        // A new level α each time: a geometry never simulated before (α is part of the key).
        let mut level = 0u64;
        let first = median(&time_ms(o.reps.clamp(3, 9), || {
            level += 1;
            mech.bands(&released, 0.05 + level as f64 * 1e-9)
        }));
        let cached = median(&time_ms(reps, || mech.bands(&released, 0.05 + level as f64 * 1e-9)));
        println!(
            "  {label:<14} release {release:>8.3} ms | band, first use {first:>8.3} ms ({:.1}x the release), cached {cached:.3} ms",
            first / release
        );
        report.add(
            "noise",
            &format!("pure-ε band, G = 1024, {label}"),
            "first use (simulated)",
            first,
            &format!("{:.1}x the release ({release:.3} ms)", first / release),
        );
    }
}

fn kde_spec(g: usize) -> KdeSpec {
    KdeSpec {
        grid: Grid { lo: 0.0, hi: 1.0, points: g },
        bandwidth: 1.0 / 50.0,
        epsilon: 1.0,
        delta: 1e-6,
        calibration: Calibration::Analytic,
        normalise: dpcurve::mechanism::Normalise::Project,
    }
}

/// `rows` mixture draws `x` with a group key `g = i mod 100`, the same key as text `s` (`k00` …
/// `k99`), and a unit `u = 7919·i mod 100 003` (≈ 100 rows per unit, spread over the groups).
fn grouped_file(dir: &Path, rows: usize) -> PathBuf {
    let path = dir.join(format!("grouped-units-text-{}.parquet", human(rows)));
    if path.exists() {
        return path;
    }
    println!("  generating {} …", path.display());
    let schema = Arc::new(Schema::new(vec![
        Field::new("x", DataType::Float64, true),
        Field::new("g", DataType::Int64, false),
        Field::new("u", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    let tmp = path.with_extension("tmp");
    let mut w = ArrowWriter::try_new(File::create(&tmp).unwrap(), Arc::clone(&schema), None).unwrap();
    let (mut done, mut seed) = (0, 2000);
    while done < rows {
        let n = CHUNK.min(rows - done);
        let x = Arc::new(Float64Array::from(dpcurve::datagen::mixture(n, seed)));
        let g = Arc::new(datafusion::arrow::array::Int64Array::from_iter_values(
            (done..done + n).map(|i| (i % 100) as i64),
        ));
        let u = Arc::new(datafusion::arrow::array::Int64Array::from_iter_values(
            (done..done + n).map(|i| ((i as u64 * 7919) % 100_003) as i64),
        ));
        let s = Arc::new(datafusion::arrow::array::StringArray::from_iter_values(
            (done..done + n).map(|i| format!("k{:02}", i % 100)),
        ));
        w.write(&RecordBatch::try_new(Arc::clone(&schema), vec![x, g, u, s]).unwrap()).unwrap();
        done += n;
        seed += 1;
    }
    w.close().unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

async fn groups(o: &Options, report: &mut Report) {
    let rows = *o.rows.iter().max().unwrap_or(&10_000_000);
    println!(
        "\n# grouped private_kde (100 declared keys; with a privacy unit; over private keys) vs sum(x) GROUP BY g, {} rows",
        human(rows)
    );
    let file = grouped_file(&o.data, rows);
    let keys: Vec<String> = (0..100).map(|k: i64| k.to_string()).collect();
    // Three catalogs over the same file: declared keys; declared keys and a unit (≈ 100 rows per
    // unit, K = 10 rows per group, L = 3 groups); no keys (partition selection).
    let mut sessions = Vec::new();
    for name in ["groups", "groups-units", "groups-select", "groups-units-select"] {
        let (admin, _) = catalog_with_admin(&o.data, name, &file).await;
        if !name.ends_with("-select") {
            admin.set_keys("priv_t", "g", &keys).await.unwrap();
            let text: Vec<String> = (0..100).map(|k| format!("k{k:02}")).collect();
            admin.set_keys("priv_t", "s", &text).await.unwrap();
        }
        if name.starts_with("groups-units") {
            admin.set_privacy_unit("priv_t", "u", 10, 3).await.unwrap();
        }
        // The public bound the unit bound and the selection's count plan their memory from: the
        // file's rows.
        admin.set_row_bound("priv_t", Some(rows as i64)).unwrap();
        let path = o.data.join(format!("catalog-{name}-{}.db", std::process::id()));
        sessions.push(AnalystSession::open(&path, SessionOptions::default()).await.unwrap());
    }
    let names = [
        "SELECT g, sum(x) GROUP BY g",
        "SELECT g, private_kde GROUP BY g (100 groups)",
        "the same, unit u: K = 10, L = 3",
        "the same, private keys: selection",
        "floor of any per-unit bound: min(x) GROUP BY u",
        "the declared keys' filter: sum(x) WHERE g BETWEEN 0 AND 99 GROUP BY g",
        "the same, unit u and private keys: selection",
        "SELECT s, sum(x) GROUP BY s (text)",
        "SELECT s, private_kde GROUP BY s (100 declared text keys)",
    ];
    let kde = format!("private_kde(x, {KDE_BANDWIDTH}, 0.001, 1e-9, -0.2, 1.2, {KDE_POINTS}");
    let sqls = [
        "SELECT g, sum(x) FROM pub_t GROUP BY g".to_string(),
        format!("SELECT g, {kde}) FROM priv_t GROUP BY g"),
        format!("SELECT g, {kde}) FROM priv_t GROUP BY g"),
        format!(
            "SELECT g, {kde}, select_epsilon => 0.001, select_delta => 1e-9, select_max_groups => 100) FROM priv_t GROUP BY g"
        ),
        // Every row to its unit's state (10⁵ units), nothing else: what grouping by the unit
        // costs any operator that bounds each unit, before any hashing or sampling.
        "SELECT count(*) FROM (SELECT u, min(x) FROM pub_t GROUP BY u)".to_string(),
        // DataFusion's own test of a run of keys (here 0…99) as a range: two comparison kernels
        // and an AND. Below a unit bound the guard tests the declared keys with its one-comparison
        // `declared_key_range` instead; the plain call drops its filter.
        "SELECT g, sum(x) FROM pub_t WHERE g BETWEEN 0 AND 99 GROUP BY g".to_string(),
        format!(
            "SELECT g, {kde}, select_epsilon => 0.001, select_delta => 1e-9, select_max_groups => 100) FROM priv_t GROUP BY g"
        ),
        "SELECT s, sum(x) FROM pub_t GROUP BY s".to_string(),
        format!("SELECT s, {kde}) FROM priv_t GROUP BY s"),
    ];
    let on = [0, 0, 1, 2, 0, 0, 3, 0, 0];
    let wanted =
        ["baseline", "plain", "units", "selection", "floor", "filter", "units-selection", "text-baseline", "text"];
    let variants: Vec<_> = names
        .iter()
        .zip(sqls)
        .zip(on)
        .zip(wanted)
        .filter(|(_, w)| *w == "baseline" || o.groups.iter().any(|g| g == w))
        .map(|(((n, q), i), _)| (*n, &sessions[i], q))
        .collect();
    let times = interleaved(&variants, o.reps).await;
    let names: Vec<&str> = variants.iter().map(|v| v.0).collect();
    report_against(report, "groups", &format!("{} rows, 100 keys", human(rows)), &names, &times, 0);
    drop(variants);
    drop(sessions);
    for name in ["groups", "groups-units", "groups-select", "groups-units-select"] {
        remove_catalog(&o.data, name);
    }
}

async fn gate(o: &Options, report: &mut Report) {
    let n = (o.reps * 30).max(200);
    println!("\n# budget gate: {n} queries per variant over a 1 000-row table, round-robin");
    let disk = o.data.join(format!("gate-{}", std::process::id()));
    let shm = PathBuf::from("/dev/shm").join(format!("dpcurve-gate-{}", std::process::id()));
    std::fs::create_dir_all(&disk).unwrap();
    let data = disk.join("d.parquet");
    dpcurve::cli::demo::write_parquet(&data, &dpcurve::datagen::mixture(1_000, 3)).unwrap();
    let opts = || SessionOptions { target_partitions: Some(1), ..Default::default() };
    let make = async |dir: &Path| {
        let path = dir.join("catalog.db");
        let admin = Admin::open(&path).unwrap();
        admin.register("public_t", &data.to_string_lossy()).await.unwrap();
        admin.register("private_t", &private_copy(&data).to_string_lossy()).await.unwrap();
        admin.make_private("private_t", 1000.0, 0.5).await.unwrap();
        path
    };
    let on_disk = make(&disk).await;
    let durable = AnalystSession::open(&on_disk, opts()).await.unwrap();
    let nosync_catalog = Arc::new(Catalog::open(&on_disk).unwrap());
    nosync_catalog.disable_fsync_for_benchmarks().unwrap();
    let nosync = AnalystSession::with_catalog(nosync_catalog, opts()).await.unwrap();
    let memory = if std::fs::create_dir_all(&shm).is_ok() {
        Some(AnalystSession::open(&make(&shm).await, opts()).await.unwrap())
    } else {
        println!("  /dev/shm not available: the in-memory variant is skipped");
        None
    };
    let q = |t: &str| format!("SELECT private_kde(x, 0.05, 0.001, 1e-9, 0, 1, 64) FROM {t}");
    let mut variants = vec![
        ("public table (no gate)", &durable, q("public_t")),
        ("gate, ledger on disk (fsync)", &durable, q("private_t")),
        ("gate, ledger on disk, no fsync", &nosync, q("private_t")),
    ];
    if let Some(m) = &memory {
        variants.push(("gate, ledger in memory (tmpfs)", m, q("private_t")));
    }
    let times = interleaved(&variants, n).await;
    let names: Vec<&str> = variants.iter().map(|v| v.0).collect();
    report_against(report, "gate", "1 000 rows", &names, &times, 0);
    let base = median(&times[0]);
    for (i, name) in names.iter().enumerate().skip(1) {
        println!("  added by the gate, {name}: {:.3} ms", median(&times[i]) - base);
    }
    drop((durable, nosync, memory));
    let _ = std::fs::remove_dir_all(&disk);
    let _ = std::fs::remove_dir_all(&shm);
}

#[tokio::main]
async fn main() {
    // As the dpcurve binary does; DPCURVE_BENCH_MALLOC=default measures glibc's defaults instead.
    let kept =
        std::env::var("DPCURVE_BENCH_MALLOC").as_deref() != Ok("default") && dpcurve::allocator::keep_freed_memory();
    let o = Options::parse();
    std::fs::create_dir_all(&o.data).unwrap();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let profile = if cfg!(debug_assertions) { "debug assertions on (not a release build!)" } else { "optimised" };
    let malloc = if kept { "freed memory kept" } else { "allocator defaults" };
    println!(
        "dpcurve benchmark: {cores} cores, {profile}, {malloc}, {} repetitions, data in {}",
        o.reps,
        o.data.display()
    );
    let mut report = Report::default();
    let mut kde_runs = Vec::new();
    if o.wants("kde") || o.wants("peers") {
        kde_runs = kde(&o, &mut report).await;
    }
    if o.wants("kde") {
        binning(&mut report, o.reps);
    }
    if o.wants("peers") {
        peers(&o, &mut report, &kde_runs);
    }
    if o.wants("cdf") {
        cdf(&o, &mut report).await;
    }
    if o.wants("mean") {
        mean(&o, &mut report).await;
    }
    if o.wants("eigen") {
        eigen(&o, &mut report).await;
    }
    if o.wants("noise") {
        noise(&o, &mut report);
    }
    if o.wants("gate") {
        gate(&o, &mut report).await;
    }
    if o.wants("groups") {
        groups(&o, &mut report).await;
    }
    if o.wants("process") {
        process(&o, &mut report).await;
    }
    report.print();
}
