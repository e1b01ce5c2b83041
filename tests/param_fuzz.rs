//! No panic reachable from parameters (SPEC §5.1): random literal parameters — drawn from
//! pools of boundary values (0, negatives, subnormals, ±inf, NaN, 1e308, huge integers,
//! extreme ratios of bandwidth to range) — are driven through the mechanisms' privacy maps
//! and releases, and through SQL planning and execution. Every attempt must end in a value
//! or an error, never a panic. Bounded: a fixed seed and a fixed number of attempts
//! (a few seconds in all); releases run only where the noise lattice is small enough to be
//! quick at the test profile's optimisation level.

mod common;

use common::{TempDir, write_x};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::DataFusionError;
use dpcurve::mechanism::curves::mean_curve::{CovKernel, MeanCurveMechanism, MeanCurveSpec};
use dpcurve::mechanism::{Calibration, Grid, KdeMechanism, KdeSpec};
use dpcurve::{DpSession, NoiseSource, SessionOptions};
use rand::rngs::ChaCha20Rng;
use rand::{Rng, SeedableRng};

const FLOATS: [f64; 22] = [
    0.0,
    -0.0,
    -1.0,
    5e-324,
    1e-300,
    1e-12,
    1e-9,
    1e-4,
    0.02,
    0.5,
    1.0,
    3.0,
    1e3,
    1e6,
    1e15,
    5e15,
    1e300,
    1e308,
    -1e308,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
];

fn pick<T: Copy>(rng: &mut ChaCha20Rng, pool: &[T]) -> T {
    pool[(rng.next_u32() as usize) % pool.len()]
}

fn float(rng: &mut ChaCha20Rng) -> f64 {
    pick(rng, &FLOATS)
}

/// A boundary value one time in three, otherwise one of the plausible `valid` values (so
/// that releases run often enough to be exercised).
fn mostly(rng: &mut ChaCha20Rng, valid: &[f64]) -> f64 {
    if rng.next_u32().is_multiple_of(3) { float(rng) } else { pick(rng, valid) }
}

/// A δ-like value: mostly small probabilities, sometimes anything.
fn delta(rng: &mut ChaCha20Rng) -> f64 {
    if rng.next_u32().is_multiple_of(3) {
        float(rng)
    } else {
        pick(rng, &[1e-19, 1e-18, 1e-12, 1e-6, 1e-5, 0.1, 0.5, 0.999_999])
    }
}

fn ends_in_a_value_or_an_error<T, E>(r: std::thread::Result<Result<T, E>>, what: &str) -> Option<T> {
    match r {
        Ok(v) => v.ok(),
        Err(_) => panic!("panic for {what}"),
    }
}

#[test]
fn kde_privacy_map_and_release_never_panic() {
    let mut rng = ChaCha20Rng::seed_from_u64(0xF022);
    let mut released = 0;
    for _ in 0..1500 {
        let (lo, hi) = (mostly(&mut rng, &[-1.0, 0.0, 0.3]), mostly(&mut rng, &[1.0, 2.0, 1e3]));
        let spec = KdeSpec {
            grid: Grid { lo, hi, points: pick(&mut rng, &[0usize, 1, 2, 3, 17, 512, 4096, 65_536, 65_537]) },
            bandwidth: mostly(&mut rng, &[0.01, 0.1, 0.7, 30.0]),
            epsilon: mostly(&mut rng, &[1e-12, 0.1, 1.0, 10.0]),
            delta: delta(&mut rng),
            calibration: pick(&mut rng, &[Calibration::Analytic, Calibration::Classic]),
            normalise: [
                dpcurve::mechanism::Normalise::Project,
                dpcurve::mechanism::Normalise::Rescale,
                dpcurve::mechanism::Normalise::Raw,
            ][(rng.next_u32() % 3) as usize],
        };
        let what = format!("{spec:?}");
        let t0 = std::time::Instant::now();
        let m = std::panic::catch_unwind(|| KdeMechanism::new(spec.clone()));
        if t0.elapsed().as_secs_f64() > 0.3 {
            eprintln!("SLOW new {:.2}s {what}", t0.elapsed().as_secs_f64());
        }
        let Some(m) = ends_in_a_value_or_an_error(m, &what) else { continue };
        assert!(m.sigma().is_finite() && m.sigma() > 0.0, "{what}: σ = {}", m.sigma());
        if m.basis().circle() > 1 << 15 || m.basis().dim() > 4096 {
            continue;
        }
        let values: Vec<f64> = (0..20).map(|_| float(&mut rng)).chain([lo, hi, 0.5 * (lo + hi)]).collect();
        let r = std::panic::catch_unwind(|| {
            let mut state = m.layout().empty_state();
            m.layout().add_all(&mut state, &values);
            m.release(&state, Some(&mut ChaCha20Rng::seed_from_u64(1)))
        });
        if t0.elapsed().as_secs_f64() > 0.3 {
            eprintln!("SLOW release {:.2}s {what}", t0.elapsed().as_secs_f64());
        }
        // Absurd grids (hi − lo = 1e308) may overflow the post-processed mass to ±inf:
        // that is a property of the public parameters, not a failure.
        let _ = r.unwrap_or_else(|_| panic!("release panicked for {what}"));
        released += 1;
    }
    assert!(released > 50, "too few valid configurations exercised the release: {released}");
}

#[test]
fn kde2d_and_sobolev_privacy_maps_and_releases_never_panic() {
    use dpcurve::mechanism::Contribution;
    use dpcurve::mechanism::density::kde2d::{Kde2dMechanism, Kde2dSpec};
    let mut rng = ChaCha20Rng::seed_from_u64(0xF025);
    let (mut released_2d, mut released_sobolev) = (0, 0);
    let points = [0usize, 1, 2, 3, 9, 64, 1024, 1025, 1 << 20];
    for _ in 0..400 {
        let grid = |rng: &mut ChaCha20Rng| {
            let (lo, hi) = (mostly(rng, &[-1.0, 0.0, 0.3]), mostly(rng, &[1.0, 2.0, 1e3]));
            Grid { lo, hi, points: pick(rng, &points) }
        };
        let (gx, gy) = (grid(&mut rng), grid(&mut rng));
        let spec = Kde2dSpec {
            grid_x: gx,
            grid_y: gy,
            bandwidth_x: mostly(&mut rng, &[0.05, 0.3, 0.7, 30.0]),
            bandwidth_y: mostly(&mut rng, &[0.05, 0.3, 0.7, 30.0]),
            epsilon: mostly(&mut rng, &[1e-12, 0.1, 1.0, 10.0]),
            delta: delta(&mut rng),
            calibration: Calibration::Analytic,
            normalise: dpcurve::mechanism::Normalise::Project,
        };
        let what = format!("{spec:?}");
        let m = std::panic::catch_unwind(|| Kde2dMechanism::new(spec.clone(), Contribution::ROW));
        if let Some(m) = ends_in_a_value_or_an_error(m, &what) {
            assert!(m.sigma().is_finite() && m.sigma() > 0.0, "{what}: σ = {}", m.sigma());
            // Release only where the noise lattice is quick (≤ 1.2·10⁴ coordinates).
            if m.lattice().dim() <= 12_000 {
                let xs: Vec<f64> = (0..20).map(|_| float(&mut rng)).chain([gx.lo, gx.hi]).collect();
                let ys: Vec<f64> = (0..20).map(|_| float(&mut rng)).chain([gy.hi, gy.lo]).collect();
                let r = std::panic::catch_unwind(|| {
                    let mut acc = m.accumulation();
                    m.add_all(&mut acc, &xs, &ys);
                    m.release(acc.totals(), Some(&mut ChaCha20Rng::seed_from_u64(1)))
                });
                r.unwrap_or_else(|_| panic!("2-D release panicked for {what}"));
                released_2d += 1;
            }
        }
        // The same axis as a Sobolev-space 1-D release.
        let spec1 = KdeSpec {
            grid: Grid { points: gx.points.min(65_537), ..gx },
            bandwidth: spec.bandwidth_x,
            epsilon: spec.epsilon,
            delta: spec.delta,
            calibration: Calibration::Analytic,
            normalise: dpcurve::mechanism::Normalise::Project,
        };
        let what = format!("sobolev {spec1:?}");
        let m = std::panic::catch_unwind(|| KdeMechanism::sobolev(spec1.clone(), Contribution::ROW));
        if let Some(m) = ends_in_a_value_or_an_error(m, &what) {
            assert!(m.sigma().is_finite() && m.sigma() > 0.0, "{what}: σ = {}", m.sigma());
            if m.layout().state_len() <= 1 << 20 {
                let values: Vec<f64> = (0..20).map(|_| float(&mut rng)).collect();
                let r = std::panic::catch_unwind(|| {
                    let mut state = m.layout().empty_state();
                    m.layout().add_all(&mut state, &values);
                    m.release(&state, Some(&mut ChaCha20Rng::seed_from_u64(1)))
                });
                r.unwrap_or_else(|_| panic!("Sobolev release panicked for {what}"));
                released_sobolev += 1;
            }
        }
    }
    assert!(
        released_2d >= 5 && released_sobolev > 20,
        "too few releases: {released_2d} 2-D, {released_sobolev} Sobolev"
    );
}

#[test]
fn kernel_fit_and_iclp_privacy_maps_and_releases_never_panic() {
    use dpcurve::mechanism::Contribution;
    use dpcurve::mechanism::fits::kernel_fit::{FitLoss, FitSpec, KernelFitMechanism};
    let mut rng = ChaCha20Rng::seed_from_u64(0xF027);
    let (mut fits, mut iclp) = (0, 0);
    for i in 0..700 {
        let (lo, hi) = (mostly(&mut rng, &[-1.0, 0.0, 0.3]), mostly(&mut rng, &[1.0, 2.0, 1e3]));
        let grid = Grid { lo, hi, points: pick(&mut rng, &[0usize, 1, 2, 41, 4096, 65_537]) };
        let y_range = (mostly(&mut rng, &[-1.0, -1e6]), mostly(&mut rng, &[1.0, 1e6]));
        let loss = if i % 2 == 0 {
            // Relative to the response range (the accepted scales start at 1 % of it), or a
            // boundary value.
            let span = y_range.1 - y_range.0;
            let frac = mostly(&mut rng, &[0.05, 0.5, 10.0]);
            FitLoss::Huber(if [0.05, 0.5, 10.0].contains(&frac) { frac * span } else { frac })
        } else {
            FitLoss::Hinge(mostly(&mut rng, &[0.05, 0.1, 1.0]))
        };
        let spec = FitSpec {
            grid,
            bandwidth: mostly(&mut rng, &[0.01, 0.1, 0.7, 30.0]),
            penalty: mostly(&mut rng, &[1e-6, 1.0, 100.0, 1e15]),
            loss,
            y_range,
            epsilon: mostly(&mut rng, &[1e-12, 0.1, 1.0, 10.0]),
            delta: if i % 3 == 0 { 0.0 } else { delta(&mut rng) },
            calibration: Calibration::Analytic,
        };
        let what = format!("{spec:?}");
        let m = std::panic::catch_unwind(|| KernelFitMechanism::new(spec.clone(), Contribution::ROW));
        if let Some(m) = ends_in_a_value_or_an_error(m, &what) {
            assert!(m.sigma().is_finite() && m.sigma() > 0.0, "{what}: σ = {}", m.sigma());
            if m.features().dim() <= 300 {
                let xs: Vec<f64> = (0..20).map(|_| float(&mut rng)).chain([lo, hi]).collect();
                let ys: Vec<f64> = (0..22).map(|_| float(&mut rng)).collect();
                let r = std::panic::catch_unwind(|| {
                    let mut acc = m.accumulation();
                    m.add_all(&mut acc, &ys, &xs);
                    m.release(acc.totals(), Some(&mut ChaCha20Rng::seed_from_u64(1)))
                });
                r.unwrap_or_else(|_| panic!("kernel fit release panicked for {what}"));
                fits += 1;
            }
        }
        // The ICLP KDE at the same box and bandwidth.
        let kspec = KdeSpec {
            grid: Grid { points: grid.points.min(65_537), ..grid },
            bandwidth: spec.bandwidth,
            epsilon: spec.epsilon,
            delta: 0.0,
            calibration: Calibration::Analytic,
            normalise: dpcurve::mechanism::Normalise::Project,
        };
        let what = format!("iclp {kspec:?}");
        let m = std::panic::catch_unwind(|| KdeMechanism::iclp(kspec.clone(), Contribution::ROW));
        if let Some(m) = ends_in_a_value_or_an_error(m, &what) {
            assert!(m.sigma().is_finite() && m.sigma() > 0.0, "{what}: σ = {}", m.sigma());
            if m.layout().state_len() <= 1 << 20 {
                let values: Vec<f64> = (0..20).map(|_| float(&mut rng)).collect();
                let r = std::panic::catch_unwind(|| {
                    let mut state = m.layout().empty_state();
                    m.layout().add_all(&mut state, &values);
                    m.release(&state, Some(&mut ChaCha20Rng::seed_from_u64(1)))
                });
                r.unwrap_or_else(|_| panic!("ICLP release panicked for {what}"));
                iclp += 1;
            }
        }
    }
    assert!(fits >= 20 && iclp >= 20, "too few releases: {fits} fits, {iclp} ICLP");
}

#[test]
fn mean_curve_privacy_map_and_release_never_panic() {
    let mut rng = ChaCha20Rng::seed_from_u64(0xF023);
    let kernels = [CovKernel::Gaussian, CovKernel::Matern52, CovKernel::Matern32, CovKernel::Exponential];
    let mut released = 0;
    for _ in 0..1000 {
        let points = pick(&mut rng, &[0usize, 1, 2, 3, 16, 40]);
        let spec = MeanCurveSpec {
            points,
            kernel: pick(&mut rng, &kernels),
            range: mostly(&mut rng, &[0.05, 0.2, 1.0]),
            penalty: mostly(&mut rng, &[1e-3, 0.1, 10.0]),
            eta: pick(&mut rng, &[0.5, 1.0, 2.0, 1e300, f64::NAN]),
            clip: mostly(&mut rng, &[0.5, 1.0, 100.0]),
            epsilon: mostly(&mut rng, &[1e-12, 0.5, 1.0, 50.0]),
            delta: if rng.next_u32() % 2 == 0 { 0.0 } else { delta(&mut rng) },
            count_fraction: pick(&mut rng, &[0.0, 1e-300, 0.1, 0.5, 0.999_999, 1.0, f64::NAN]),
            calibration: pick(&mut rng, &[Calibration::Analytic, Calibration::Classic]),
        };
        let what = format!("{spec:?}");
        let m = std::panic::catch_unwind(|| MeanCurveMechanism::new(spec.clone()));
        let Some(m) = ends_in_a_value_or_an_error(m, &what) else { continue };
        let curves: Vec<Vec<f64>> = (0..5).map(|_| (0..points).map(|_| float(&mut rng)).collect()).collect();
        let r = std::panic::catch_unwind(|| {
            let mut state = m.empty_state();
            for c in &curves {
                m.add(&mut state, c);
            }
            m.release(&state, Some(&mut ChaCha20Rng::seed_from_u64(2)))
        });
        let r = r.unwrap_or_else(|_| panic!("release panicked for {what}"));
        assert_eq!(r.mean.len(), points, "{what}");
        released += 1;
    }
    assert!(released > 25, "too few valid configurations exercised the release: {released}");
}

fn literal(v: f64) -> String {
    if v.is_nan() {
        "'NaN'::double".into()
    } else if v.is_infinite() {
        format!("'{}'::double", if v > 0.0 { "inf" } else { "-inf" })
    } else {
        format!("{v:e}")
    }
}

/// Through SQL: the named-argument rewrite, coercion, the planner guard and (for cheap grids)
/// execution, with random literal parameters, some of them of the wrong type.
#[tokio::test]
async fn sql_with_random_literal_parameters_never_panics() {
    let dir = TempDir::new("fuzz");
    let values: Vec<Option<f64>> =
        [0.1, 0.5, 0.9, -3.0, 1e300, f64::NAN, f64::INFINITY].iter().map(|v| Some(*v)).chain([None]).collect();
    write_x(&dir.path("t.parquet"), &values);
    let s = std::sync::Arc::new(DpSession::new(SessionOptions {
        noise: NoiseSource::TestSeed(3),
        ..SessionOptions::default()
    }));
    s.register_parquet("t", &dir.str("t.parquet")).await.unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(0xF024);
    let (mut ok, mut refused) = (0, 0);
    for i in 0..300 {
        let p = |rng: &mut ChaCha20Rng| {
            if rng.next_u32().is_multiple_of(10) {
                pick(rng, &["'abc'", "NULL", "true", "9223372036854775807"]).to_string()
            } else {
                literal(float(rng))
            }
        };
        let points =
            pick(&mut rng, &["-1", "0", "2", "64", "64", "256", "65537", "9223372036854775807", "1.5", "NULL"]);
        // Execute only small grids over a moderate range; plan (EXPLAIN) everything else.
        let cheap = i % 2 == 0;
        let sql = if i % 6 == 1 {
            // The kernel fits (executed): random penalty (or 'auto'), bandwidth, ε, δ.
            let penalty = pick(&mut rng, &["'auto'", "100", "1e-7", "1e16", "0"]);
            format!(
                "SELECT {}(x, x, {}, {}, penalty => {penalty}, bandwidth => {}, lo => -1, hi => 2{}) FROM t",
                pick(&mut rng, &["private_kernel_regression", "private_kernel_classifier"]),
                p(&mut rng),
                literal(delta(&mut rng)),
                pick(&mut rng, &["0.05", "0.5", "1e-9", "1e6", "0"]),
                pick(&mut rng, &[", lo_y => -1, hi_y => 2", ", points => 7", ""]),
            )
        } else if i % 6 == 3 {
            // The distribution functions (executed): random ε, δ, leaves, points, probabilities.
            let leaves = pick(&mut rng, &["'auto'", "2", "64", "65536", "3", "0", "-8", "1e300", "NULL"]);
            if rng.next_u32() % 2 == 0 {
                format!(
                    "SELECT private_cdf(x, {}, {}, lo => -1, hi => 2, points => {points}, leaves => {leaves}, \
                     band_alpha => {}) FROM t",
                    p(&mut rng),
                    literal(delta(&mut rng)),
                    pick(&mut rng, &["0.05", "1e-300", "0.999999", "0", "NULL"]),
                )
            } else {
                let probs = pick(&mut rng, &["[0.5]", "[0, 1]", "[]", "[0.1, NULL]", "[-0.1]", "[1e300]", "NULL"]);
                format!(
                    "SELECT private_quantiles(x, {probs}, {}, {}, lo => -1, hi => 2, leaves => {leaves}) FROM t",
                    p(&mut rng),
                    literal(delta(&mut rng)),
                )
            }
        } else if cheap {
            let h = pick(&mut rng, &["0.05", "0.05", "0.5", "0.5", "1e-9", "1e6", "0", "-1", "'NaN'::double"]);
            format!(
                "SELECT private_kde(x, {h}, {}, {}, lo => -1, hi => 2, points => {points}) FROM t",
                p(&mut rng),
                literal(delta(&mut rng))
            )
        } else {
            format!(
                "EXPLAIN SELECT private_kde(x, {}, {}, {}, lo => {}, hi => {}, points => {points}, calibration => {}, nonneg => {}) FROM t",
                p(&mut rng),
                p(&mut rng),
                p(&mut rng),
                p(&mut rng),
                p(&mut rng),
                pick(&mut rng, &["'analytic'", "'classic'", "'bogus'", "1"]),
                pick(&mut rng, &["true", "false", "NULL", "2"]),
            )
        };
        let r = tokio::spawn({
            let s = std::sync::Arc::clone(&s);
            let sql = sql.clone();
            async move { s.sql(&sql).await.map(|_| ()) }
        })
        .await;
        match r {
            Ok(Ok(())) => ok += 1,
            Ok(Err(_)) => refused += 1,
            Err(e) => panic!("panic for {sql}: {e}"),
        }
    }
    assert!(ok >= 5 && refused >= 50, "both outcomes exercised: {ok} ok, {refused} refused");
}

/// Every float a result struct holds (its Float64 fields and lists of them), by field name.
fn released_numbers(batches: &[RecordBatch]) -> Vec<(String, Vec<f64>)> {
    let mut out = Vec::new();
    for b in batches.iter().filter(|b| b.num_rows() > 0) {
        let s = b.column(0).as_struct();
        for (field, column) in s.fields().iter().zip(s.columns()) {
            let values: Vec<f64> = match field.data_type() {
                DataType::Float64 => column.as_primitive::<Float64Type>().iter().flatten().collect(),
                DataType::List(item) if item.data_type() == &DataType::Float64 => {
                    let l = column.as_list::<i32>();
                    (0..l.len())
                        .filter(|&i| l.is_valid(i))
                        .flat_map(|i| l.value(i).as_primitive::<Float64Type>().iter().flatten().collect::<Vec<_>>())
                        .collect()
                }
                _ => continue,
            };
            out.push((field.name().clone(), values));
        }
    }
    out
}

/// The accepted ranges are the ones every release's numerics cover (`dpcurve::mechanism::ranges`):
/// every function with a public range refuses at planning, with the rule, a range whose width or
/// grid would overflow or whose steps would leave the normal doubles — ends beyond ±1e100 or
/// closer than 1e-100 — and at the limits themselves (and on a range narrower than the doubles
/// around it) releases only finite numbers, its grids and quantiles inside the range. Before the
/// rule, `private_kde` released a band of ∞ on [0, 1e-200], an effective bandwidth of ∞ on
/// [−1e200, 1e200], `private_kde2d` a mass of ∞, and `private_cdf` a grid of ∞ on
/// [−1.5e308, 1.5e308] (and on [0, 5e-324] with 65 536 leaves a leaf 0 wide, which `MonotoneCubic::new`
/// asserts against: reasoned from the code, not run).
#[tokio::test]
async fn extreme_ranges_are_refused_or_release_finite_numbers() {
    let dir = TempDir::new("fuzz-ranges");
    let rows = [-1e308, -1e100, -1.0, 0.0, 1e-300, 1e-101, 0.5, 1.0, 1.0 + f64::EPSILON, 3e99, 1e308];
    let v: Vec<Option<f64>> = rows.iter().cycle().take(660).map(|&x| Some(x)).collect();
    write_x(&dir.path("t.parquet"), &v);
    let s = DpSession::new(SessionOptions {
        target_partitions: Some(2),
        noise: NoiseSource::TestSeed(5),
        allow_statements: true,
        ..SessionOptions::default()
    });
    s.register_parquet("t", &dir.str("t.parquet")).await.unwrap();
    let ulp = f64::EPSILON;
    let ranges = [
        (-1.5e308, 1.5e308, false),
        (-1e200, 1e200, false),
        (0.0, 1.0000000000000002e100, false),
        (-f64::MAX, 0.0, false),
        (0.0, 5e-324, false),
        (0.0, 1e-200, false),
        (0.0, 9.9e-101, false),
        (-1e100, 1e100, true),
        (0.0, 1e-100, true),
        (1.0, 1.0 + 4.0 * ulp, true),
        (1e100 * (1.0 - 2.0 * ulp), 1e100, true),
    ];
    let mut accepted = 0;
    for (lo, hi, accept) in ranges {
        let (w, r) = (hi - lo, format!("{lo:e}, {hi:e}"));
        let h = if w.is_finite() { (w / 10.0).max(1e-300) } else { 1.0 };
        let calls = [
            format!("private_kde(x, {h:e}, 1.0, 0, {r})"),
            format!("private_kde(x, {h:e}, 1.0, 1e-6, {r})"),
            format!("private_kde(x, {:e}, 1.0, 1e-6, {r})", h * 1e-3),
            format!("private_kde(x, 'auto', 1.0, 0, {r}, points => 64)"),
            format!("private_kde(x, {h:e}, 1.0, 0, {r}, mechanism => 'iclp')"),
            format!("private_kde(x, {h:e}, 1.0, 1e-6, {r}, space => 'sobolev')"),
            format!("private_kde2d(x, x, {h:e}, {h:e}, 1.0, 1e-6, {r}, {r}, points_x => 16, points_y => 16)"),
            format!(
                "private_kernel_regression(x, x, 1.0, 1e-6, lo => {lo:e}, hi => {hi:e}, lo_y => {lo:e}, hi_y => {hi:e})"
            ),
            format!("private_kernel_classifier(x > 0.5, x, 1.0, 1e-6, lo => {lo:e}, hi => {hi:e})"),
            format!("private_cdf(x, 1.0, 0, {r}, leaves => 4096)"),
            format!("private_cdf(x, 1.0, 1e-6, {r}, points => 64, mechanism => 'gaussian')"),
            format!("private_quantiles(x, [0, 0.01, 0.5, 0.99, 1], 1.0, 0, {r}, leaves => 4096)"),
        ];
        for call in calls {
            let sql = format!("SELECT {call} FROM t");
            let r = s.query(&sql).await;
            if !accept {
                let err = r.err().unwrap_or_else(|| panic!("accepted: {sql}"));
                assert!(matches!(err, DataFusionError::Plan(_)), "{sql}: {err:?}");
                assert!(err.to_string().contains("within ±1e100 and at least 1e-100 apart"), "{sql}: {err}");
                continue;
            }
            let b = r.unwrap_or_else(|e| panic!("{sql}: {e}"));
            accepted += 1;
            for (name, values) in released_numbers(&b) {
                assert!(values.iter().all(|v| v.is_finite()), "{sql}: {name} {values:?}");
                if ["x", "quantile", "lower", "upper"].contains(&name.as_str()) && !call.starts_with("private_kde") {
                    assert!(values.iter().all(|v| (lo..=hi).contains(v)), "{sql}: {name} {values:?}");
                }
            }
        }
    }
    assert_eq!(accepted, 4 * 12, "every call runs on every accepted range");
    // The mean curve's norm bound has the same limits.
    let curves: Vec<Option<Vec<f64>>> =
        (0..200).map(|i| Some((0..8).map(|j| ((i + j) % 5) as f64).collect())).collect();
    common::write_curves(&dir.path("c.parquet"), &curves, common::ListKind::List);
    s.register_parquet("c", &dir.str("c.parquet")).await.unwrap();
    for (clip, accept) in [("1e100", true), ("1e-100", true), ("1e101", false), ("1e300", false), ("1e-101", false)] {
        for delta in ["0", "1e-6"] {
            let sql = format!("SELECT private_mean_curve(c, 1.0, {delta}, clip => {clip}, points => 8) FROM c");
            match s.query(&sql).await {
                Ok(b) if accept => {
                    for (name, values) in released_numbers(&b) {
                        assert!(values.iter().all(|v| v.is_finite()), "{sql}: {name} {values:?}");
                    }
                }
                Err(e) if !accept => assert!(e.to_string().contains("clip must be from 1e-100 to 1e100"), "{sql}: {e}"),
                other => panic!("{sql}: {other:?}"),
            }
        }
    }
}
