//! Shared helpers for integration tests: temporary directories and Parquet files.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::array::{Array, AsArray, Float64Array};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod neighbours;

/// A catalog in `dir` with table `t` over `dir/t.parquet`, private with a budget that no test
/// exhausts (ε = 1000, δ = 1e-2) and `x` bounded to [0, 1]; the data owner's handle.
#[allow(dead_code)]
pub async fn private_t(dir: &TempDir) -> dpcurve::Admin {
    let admin = dpcurve::Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("t", &dir.str("t.parquet")).await.unwrap();
    admin.make_private("t", 1000.0, 1e-2).await.unwrap();
    admin.set_bounds("t", "x", 0.0, 1.0).await.unwrap();
    admin
}

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "dpcurve-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn str(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a nullable Float64 column `x` to a Parquet file, in row groups of `group` rows.
pub fn write_x(path: &Path, values: &[Option<f64>]) {
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true)]));
    let file = File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), None).unwrap();
    for chunk in values.chunks(1000) {
        let b = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Float64Array::from(chunk.to_vec()))]).unwrap();
        w.write(&b).unwrap();
    }
    w.close().unwrap();
}

/// Deterministic values from the two-normal mixture.
pub fn mixture(n: usize, seed: u64) -> Vec<f64> {
    dpcurve::datagen::mixture(n, seed)
}

/// The (x, density, mass) of a one-row `private_kde` result in column 0.
pub fn kde_result(batches: &[RecordBatch]) -> (Vec<f64>, Option<Vec<f64>>, f64) {
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    let b = batches.iter().find(|b| b.num_rows() == 1).unwrap();
    let s = b.column(0).as_struct();
    let list = |name: &str| {
        let l = s.column_by_name(name).unwrap().as_list::<i32>();
        l.is_valid(0).then(|| l.value(0).as_primitive::<Float64Type>().values().to_vec())
    };
    let mass = s.column_by_name("mass").unwrap().as_primitive::<Float64Type>().value(0);
    (list("x").unwrap(), list("density"), mass)
}

/// How a curve column is stored.
#[derive(Debug, Clone, Copy)]
pub enum ListKind {
    List,
    LargeList,
    Fixed(i32),
}

/// Writes curves (None = a NULL row) to a Parquet file with one list column `c`.
pub fn write_curves(path: &Path, curves: &[Option<Vec<f64>>], kind: ListKind) {
    use datafusion::arrow::array::{ArrayRef, FixedSizeListBuilder, Float64Builder, LargeListBuilder, ListBuilder};
    let array: ArrayRef = match kind {
        ListKind::List => {
            let mut b = ListBuilder::new(Float64Builder::new());
            for c in curves {
                match c {
                    Some(v) => b.append_value(v.iter().map(|x| Some(*x))),
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        ListKind::LargeList => {
            let mut b = LargeListBuilder::new(Float64Builder::new());
            for c in curves {
                match c {
                    Some(v) => b.append_value(v.iter().map(|x| Some(*x))),
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        ListKind::Fixed(m) => {
            let mut b = FixedSizeListBuilder::new(Float64Builder::new(), m);
            for c in curves {
                match c {
                    Some(v) => {
                        b.values().append_slice(v);
                        b.append(true);
                    }
                    None => {
                        b.values().append_slice(&vec![0.0; m as usize]);
                        b.append(false);
                    }
                }
            }
            Arc::new(b.finish())
        }
    };
    let schema = Arc::new(Schema::new(vec![Field::new("c", array.data_type().clone(), true)]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![array]).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// The (t, mean, n) of a one-row `private_mean_curve` result in column 0 (n is an integer).
pub fn mean_result(batches: &[RecordBatch]) -> (Vec<f64>, Vec<f64>, i64) {
    let b = batches.iter().find(|b| b.num_rows() == 1).unwrap();
    let s = b.column(0).as_struct();
    let list = |name: &str| {
        s.column_by_name(name).unwrap().as_list::<i32>().value(0).as_primitive::<Float64Type>().values().to_vec()
    };
    let n = s.column_by_name("n").unwrap().as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0);
    (list("t"), list("mean"), n)
}

/// Writes `columns` (named, in order) to a Parquet file as one batch; non-nullable fields except
/// lists and columns holding nulls.
pub fn write_columns(path: &Path, columns: Vec<(&str, datafusion::arrow::array::ArrayRef)>) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, c)| {
            Field::new(*n, c.data_type().clone(), matches!(c.data_type(), DataType::List(_)) || c.null_count() > 0)
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns.into_iter().map(|(_, c)| c).collect()).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// (key as text, Float64 value) of the first two columns of a result, sorted by key.
pub fn keyed_values(batches: &[RecordBatch]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for b in batches {
        let k = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
        let k = k.as_string::<i32>();
        let v = b.column(1).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            out.push((k.value(i).to_string(), v.value(i)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// An empirical privacy audit of a Gaussian lattice release on neighbouring datasets whose
/// rounded lifted coordinates are `r0` and `r1`: the noise is iid in them, so the optimal test
/// statistic is the projection on the mean difference. `n` draws per side of the real sampler
/// (`noise_scale` ≠ 1 simulates a calibration bug) give its standardised shift μ̂; through the
/// Gaussian trade-off curve, μ̂ − 3·SE is a lower bound on ε at `delta`. Returns (that bound, μ̂).
pub fn projection_audit(
    lat: &dpcurve::mechanism::noise::lattice::LatticeMechanism,
    r0: &[i128],
    r1: &[i128],
    noise_scale: f64,
    seed: u64,
    n: usize,
    delta: f64,
) -> (f64, f64) {
    use rand::SeedableRng;
    let dir: Vec<f64> = r1.iter().zip(r0).map(|(a, b)| (a - b) as f64).collect();
    let norm = dir.iter().map(|v| v * v).sum::<f64>().sqrt();
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(seed);
    let mut stats = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for (side, r) in [r0, r1].into_iter().enumerate() {
        for _ in 0..n {
            let z = lat.noise(&mut rng);
            let t: f64 = r.iter().zip(&z).zip(&dir).map(|((a, z), d)| (*a as f64 + noise_scale * *z as f64) * d).sum();
            stats[side].push(t / norm * lat.gamma());
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let var = |v: &[f64], mu: f64| v.iter().map(|x| (x - mu) * (x - mu)).sum::<f64>() / (v.len() - 1) as f64;
    let (m0, m1) = (mean(&stats[0]), mean(&stats[1]));
    let sd = (0.5 * (var(&stats[0], m0) + var(&stats[1], m1))).sqrt();
    let mu = (m1 - m0) / sd;
    let se = (2.0 / n as f64 + mu * mu / (4.0 * n as f64)).sqrt();
    (dpcurve::mechanism::noise::calibration::epsilon_for_mu(mu - 3.0 * se, delta), mu)
}

/// The Float64 column `col` of a result, row by row (None for NULL).
pub fn floats(batches: &[RecordBatch], col: usize) -> Vec<Option<f64>> {
    batches
        .iter()
        .flat_map(|b| {
            let c = b.column(col).as_primitive::<Float64Type>();
            (0..b.num_rows()).map(move |i| c.is_valid(i).then(|| c.value(i)))
        })
        .collect()
}

/// An empirical pure-ε audit of a discrete Laplace lattice release on neighbouring datasets whose
/// rounded lifted coordinates are `r0` and `r1`: the noise is iid Laplace, so the privacy loss of
/// an output x is `Σ_j (|x_j − r0_j| − |x_j − r1_j|)/b`; the events {loss ≥ t} for thresholds at
/// three upper quantiles of a pilot sample under r1 are counted in `n` fresh draws per side
/// (`noise_scale` ≠ 1 simulates a calibration bug), and ln((p1 − 4·SE)/(p0 + 4·SE)) is a lower
/// bound on ε for each; the largest is returned.
pub fn laplace_audit(
    lat: &dpcurve::mechanism::noise::lattice::LatticeMechanism,
    r0: &[i128],
    r1: &[i128],
    noise_scale: f64,
    seed: u64,
    n: usize,
) -> f64 {
    use rand::SeedableRng;
    let loss = |x: &[f64]| -> f64 {
        x.iter().zip(r0.iter().zip(r1)).map(|(v, (a, b))| (v - *a as f64).abs() - (v - *b as f64).abs()).sum()
    };
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(seed);
    let draw = |r: &[i128], rng: &mut rand::rngs::ChaCha20Rng| -> f64 {
        let z = lat.noise(rng);
        let x: Vec<f64> = r.iter().zip(&z).map(|(a, z)| *a as f64 + noise_scale * *z as f64).collect();
        loss(&x)
    };
    let mut pilot: Vec<f64> = (0..n / 10).map(|_| draw(r1, &mut rng)).collect();
    pilot.sort_by(f64::total_cmp);
    let thresholds: Vec<f64> = [0.9, 0.97, 0.99].iter().map(|q| pilot[(q * pilot.len() as f64) as usize]).collect();
    let mut counts = [[0usize; 3]; 2];
    for (side, r) in [r0, r1].into_iter().enumerate() {
        for _ in 0..n {
            let l = draw(r, &mut rng);
            for (c, t) in counts[side].iter_mut().zip(&thresholds) {
                *c += (l >= *t) as usize;
            }
        }
    }
    (0..3)
        .map(|i| {
            let (p0, p1) = (counts[0][i] as f64 / n as f64, counts[1][i] as f64 / n as f64);
            let (s0, s1) = ((p0 * (1.0 - p0) / n as f64).sqrt(), (p1 * (1.0 - p1) / n as f64).sqrt());
            ((p1 - 4.0 * s1).max(1e-300) / (p0 + 4.0 * s0).max(1e-300)).ln()
        })
        .fold(f64::NEG_INFINITY, f64::max)
}

/// A self-signed certificate for localhost / 127.0.0.1 and its key (openssl CLI), as PEM files.
pub fn self_signed(dir: &TempDir) -> (PathBuf, PathBuf) {
    use std::process::Command;
    let (cert, key) = (dir.path("server.pem"), dir.path("server.key"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the TLS test needs the openssl command");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

/// A `dpcurve serve` process on a free port of 127.0.0.1, killed when dropped.
pub struct Server {
    pub child: std::process::Child,
    pub addr: String,
}

impl Server {
    pub fn start(catalog: &Path, extra: &[&str]) -> Server {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        let mut child = Command::new(env!("CARGO_BIN_EXE_dpcurve"))
            .args(["serve", "--catalog", &catalog.to_string_lossy(), "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .split("://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("the server did not report its address: {line:?}"))
            .to_string();
        Server { child, addr }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The Python of the virtual environment `.ci/python-env` makes (or checks) first: idempotent,
/// it installs `tests/python/requirements.txt` from the package registry when they are missing
/// and the client package from `python/`.
pub fn python() -> PathBuf {
    use std::process::Command;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join(".ci/python-env")).output().expect("cannot run .ci/python-env");
    assert!(
        out.status.success(),
        "the Python tests need a virtual environment with tests/python/requirements.txt, and \
         .ci/python-env could not make it (is python3 with venv installed, and the package registry \
         reachable?):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    root.join(".venv/bin/python")
}

/// Rows per partition of the first phase of `plan` that groups raw rows (ours or DataFusion's:
/// partial or single), run alone.
pub async fn partial_rows(
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    ctx: Arc<datafusion::execution::TaskContext>,
) -> Vec<usize> {
    use datafusion::physical_plan::ExecutionPlan;
    use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
    use dpcurve::guard::exec::known_keys_partial::KnownKeysPartialExec;
    fn find(p: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        let partial = p.downcast_ref::<KnownKeysPartialExec>().is_some()
            || p.downcast_ref::<AggregateExec>().is_some_and(|a| {
                matches!(a.mode(), AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned)
            });
        if partial { Some(Arc::clone(p)) } else { p.children().into_iter().find_map(find) }
    }
    let partial = find(plan).expect("a partial phase");
    let mut rows = Vec::new();
    for i in 0..partial.properties().output_partitioning().partition_count() {
        let stream = partial.execute(i, Arc::clone(&ctx)).unwrap();
        let batches = datafusion::physical_plan::common::collect(stream).await.unwrap();
        rows.push(batches.iter().map(|b| b.num_rows()).sum());
    }
    rows
}

/// Rows per partition of the partial (or single) phase of `sql` over the Parquet file `path`
/// registered as `t` in a plain DataFusion session of `partitions` partitions (a control: what
/// DataFusion's own hash aggregate holds).
pub async fn datafusion_partial_rows(path: &str, partitions: usize, sql: &str) -> Vec<usize> {
    let config = datafusion::prelude::SessionConfig::new().with_target_partitions(partitions);
    let ctx = datafusion::prelude::SessionContext::new_with_config(config);
    ctx.register_parquet("t", path, Default::default()).await.unwrap();
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    partial_rows(&plan, ctx.task_ctx()).await
}
