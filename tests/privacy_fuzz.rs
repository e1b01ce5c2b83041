//! Privacy property fuzz (SPEC §0, §6): for each mechanism, parameters drawn log-uniformly across
//! their whole accepted domain (edges included) and neighbour pairs (extreme rows, the box's
//! edges, NaN/±∞ rows) through the real statistic → lifted coordinates → lattice path (KDE, 2-D KDE,
//! mean curve, and the lattice alone; the kernel fits' certified solves are covered at their domain
//! edges in `kernel_fit_privacy.rs`). For every
//! accepted parameter set, the lifted difference stays within the sensitivity the noise is
//! calibrated for (L2, or L1 for the pure-ε releases), after rounding to the lattice too, and no
//! non-finite value appears. Negative control: the same checks against half the sensitivity fail
//! for some draw of each mechanism, so they are not vacuous. Seeded; `DPCURVE_FUZZ_CASES` runs more.

use dpcurve::mechanism::curves::mean_curve::{CovKernel, MeanCurveMechanism, MeanCurveSpec};
use dpcurve::mechanism::noise::double_double::DD;
use dpcurve::mechanism::noise::lattice::LatticeMechanism;
use dpcurve::mechanism::{Calibration, Grid, KdeMechanism, KdeSpec};
use rand::Rng;
use rand::rngs::ChaCha20Rng;
use rand::{RngExt, SeedableRng};

fn cases(default: usize) -> usize {
    std::env::var("DPCURVE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// 10^U(a, b), with the edges themselves one time in eight each.
fn log_uniform(rng: &mut ChaCha20Rng, a: f64, b: f64) -> f64 {
    match rng.next_u32() % 8 {
        0 => 10f64.powf(a),
        1 => 10f64.powf(b),
        _ => 10f64.powf(a + (b - a) * rng.random::<f64>()),
    }
}

/// Euclidean norm without overflow (differences near 1e300 are in range).
fn norm2(d: impl Iterator<Item = f64> + Clone) -> f64 {
    let scale = d.clone().fold(0.0f64, |m, v| m.max(v.abs()));
    if scale == 0.0 || !scale.is_finite() {
        return scale;
    }
    d.map(|v| (v / scale).powi(2)).sum::<f64>().sqrt() * scale
}

fn l2(a: &[DD], b: &[DD]) -> f64 {
    norm2(a.iter().zip(b).map(|(x, y)| x.sub(*y).to_f64()))
}

fn l1(a: &[DD], b: &[DD]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x.sub(*y).to_f64().abs()).sum()
}

fn finite(w: &[DD]) -> bool {
    w.iter().all(|v| v.hi.is_finite() && v.lo.is_finite())
}

/// The rounded lattice difference, in real units (L2 or L1).
fn rounded(lat: &LatticeMechanism, w0: &[DD], w1: &[DD], pure: bool) -> f64 {
    let (r0, r1) = (lat.round(w0), lat.round(w1));
    let d = r0.iter().zip(&r1).map(|(a, b)| (a - b) as f64 * lat.gamma());
    if pure { d.map(f64::abs).sum() } else { norm2(d) }
}

/// What one mechanism's fuzz saw: accepted draws, and the largest difference relative to the
/// calibrated sensitivity.
#[derive(Default)]
struct Seen {
    accepted: usize,
    worst: f64,
}

impl Seen {
    fn check(&mut self, what: &str, diff: f64, bound: f64) {
        assert!(diff.is_finite(), "{what}: non-finite difference");
        assert!(diff <= bound, "{what}: difference {diff} > calibrated {bound}");
        self.worst = self.worst.max(diff / bound);
    }
}

#[test]
fn kde_lifted_differences_stay_within_the_calibrated_sensitivity() {
    let mut rng = ChaCha20Rng::seed_from_u64(0x9f_0001);
    let mut seen = Seen::default();
    for i in 0..cases(300) {
        let lo = [-1e6, -1.0, 0.0, 17.0][rng.next_u32() as usize % 4];
        let width = log_uniform(&mut rng, -3.0, 6.0);
        let h = width * log_uniform(&mut rng, -2.5, 0.5);
        let points = log_uniform(&mut rng, 0.31, 2.71) as usize;
        let spec = KdeSpec {
            grid: Grid { lo, hi: lo + width, points },
            bandwidth: h,
            epsilon: log_uniform(&mut rng, -3.0, 1.0),
            delta: log_uniform(&mut rng, -12.0, -2.0),
            calibration: Calibration::Analytic,
            normalise: Default::default(),
        };
        let Ok(m) = KdeMechanism::new(spec.clone()) else { continue };
        seen.accepted += 1;
        let grid = spec.grid;
        let mut state = m.layout().empty_state();
        for k in 0..200 {
            m.layout().add(&mut state, grid.lo + width * ((k as f64 * 0.618).fract()));
        }
        let w0 = m.lifted(&state);
        assert!(finite(&w0), "draw {i}: non-finite lifted coordinates");
        for x in [
            grid.lo,
            grid.hi,
            grid.lo - 8.0 * h,
            grid.hi + 8.0 * h,
            grid.lo + width / 3.0 + 0.37 * grid.step(),
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e308,
            -1e308,
        ] {
            let mut s1 = state.clone();
            m.layout().add(&mut s1, x);
            let w1 = m.lifted(&s1);
            assert!(finite(&w1), "draw {i} x = {x}: non-finite lifted coordinates");
            let what = format!("kde draw {i} ({spec:?}) x = {x}");
            seen.check(&what, l2(&w0, &w1), m.stat_sensitivity());
            assert!(rounded(m.lattice(), &w0, &w1, false) <= m.lattice().sensitivity(), "{what}: rounded");
        }
    }
    assert!(seen.accepted >= 10, "only {} draws were accepted", seen.accepted);
    // Negative control: against half the sensitivity the check fails.
    assert!(seen.worst > 0.5, "the worst difference is only {} of the sensitivity", seen.worst);
}

#[test]
fn mean_curve_lifted_differences_stay_within_the_calibrated_sensitivity() {
    let mut rng = ChaCha20Rng::seed_from_u64(0x9f_0002);
    let kernels = [CovKernel::Gaussian, CovKernel::Matern52, CovKernel::Matern32, CovKernel::Exponential];
    let mut seen = Seen::default();
    for i in 0..cases(300) {
        let points = log_uniform(&mut rng, 0.31, 1.9) as usize;
        let pure = rng.next_u32() % 3 == 0;
        let spec = MeanCurveSpec {
            points,
            kernel: kernels[rng.next_u32() as usize % 4],
            range: log_uniform(&mut rng, -2.0, 0.5),
            penalty: log_uniform(&mut rng, -6.0, 2.0),
            eta: 1.0 + 3.0 * rng.random::<f64>(),
            clip: log_uniform(&mut rng, -6.0, 6.0),
            epsilon: log_uniform(&mut rng, -3.0, 1.0),
            delta: if pure { 0.0 } else { log_uniform(&mut rng, -12.0, -2.0) },
            count_fraction: 0.1,
            calibration: Calibration::Analytic,
        };
        let Ok(m) = MeanCurveMechanism::new(spec.clone()) else { continue };
        seen.accepted += 1;
        let mut state = m.empty_state();
        for k in 0..50 {
            let c: Vec<f64> = (0..points).map(|t| ((k * 7 + t) as f64 * 0.37).sin() * spec.clip).collect();
            m.add(&mut state, &c);
        }
        let w0 = m.lifted(&state);
        assert!(finite(&w0), "draw {i}: non-finite lifted coordinates");
        let mut rows: Vec<Vec<f64>> = vec![
            vec![1e300; points],
            vec![-1e300; points],
            (0..points).map(|t| if t % 2 == 0 { spec.clip } else { -spec.clip }).collect(),
            vec![spec.clip * 1e6; points],
            vec![f64::NAN; points],
            vec![f64::INFINITY; points],
        ];
        rows.extend(m.basis().vectors.iter().take(3).map(|v| v.iter().map(|x| x * spec.clip * 3.0).collect()));
        for r in &rows {
            let mut s1 = state.clone();
            m.add(&mut s1, r);
            let w1 = m.lifted(&s1);
            assert!(finite(&w1), "draw {i}: non-finite lifted coordinates");
            let what = format!("mean curve draw {i} ({spec:?})");
            let diff = if pure { l1(&w0, &w1) } else { l2(&w0, &w1) };
            seen.check(&what, diff, m.sensitivity());
            assert!(rounded(m.lattice(), &w0, &w1, pure) <= m.lattice().sensitivity(), "{what}: rounded");
        }
    }
    assert!(seen.accepted >= 10, "only {} draws were accepted", seen.accepted);
    assert!(seen.worst > 0.5, "the worst difference is only {} of the sensitivity", seen.worst);
}

/// The lattice itself over its whole accepted range: for a sensitivity and dimension drawn across
/// the range, a lifted pair exactly one sensitivity apart rounds within the calibrated bound and
/// never to a non-finite or saturated value; outside the range, construction is refused.
#[test]
fn the_lattice_is_finite_and_calibrated_wherever_it_is_accepted() {
    let mut rng = ChaCha20Rng::seed_from_u64(0x9f_0003);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..cases(3000) {
        let sensitivity = log_uniform(&mut rng, -300.0, 300.0);
        let dim = log_uniform(&mut rng, 0.0, 3.0) as usize;
        let pure = rng.next_u32() % 2 == 0;
        let lat = if pure {
            LatticeMechanism::laplace(sensitivity, dim, 1.0)
        } else {
            LatticeMechanism::gaussian(sensitivity, dim, 0.5)
        };
        let Ok(lat) = lat else {
            refused += 1;
            continue;
        };
        accepted += 1;
        assert!(lat.gamma() > 0.0 && (1.0 / lat.gamma()).is_finite());
        let per = if pure { sensitivity / dim as f64 } else { sensitivity / (dim as f64).sqrt() };
        let w0: Vec<DD> = (0..dim).map(|k| DD::from_f64(per * (k as f64 + 0.3))).collect();
        let w1: Vec<DD> = w0.iter().map(|v| v.add(DD::from_f64(per))).collect();
        let r = lat.round(&w1);
        assert!(r.iter().all(|&v| v != i128::MAX && v != i128::MIN), "saturated at {sensitivity:e}, dim {dim}");
        let got = rounded(&lat, &w0, &w1, pure);
        assert!(
            got <= lat.sensitivity(),
            "{sensitivity:e}, dim {dim}, pure {pure}: {got:e} > {:e} (γ {:e})",
            lat.sensitivity(),
            lat.gamma()
        );
    }
    assert!(accepted > 100 && refused > 20, "accepted {accepted}, refused {refused}");
}

#[test]
fn kde2d_lifted_differences_stay_within_the_calibrated_sensitivity() {
    use dpcurve::mechanism::Contribution;
    use dpcurve::mechanism::density::kde2d::{Kde2dMechanism, Kde2dSpec};
    let mut rng = ChaCha20Rng::seed_from_u64(0x9f_0004);
    let mut seen = Seen::default();
    for i in 0..cases(20) {
        let (wx, wy) = (log_uniform(&mut rng, -3.0, 6.0), log_uniform(&mut rng, -3.0, 6.0));
        let (lo_x, lo_y) = ([-1e5, 0.0, 3.0][rng.next_u32() as usize % 3], [-7.0, 0.0][rng.next_u32() as usize % 2]);
        let spec = Kde2dSpec {
            grid_x: Grid { lo: lo_x, hi: lo_x + wx, points: log_uniform(&mut rng, 0.31, 1.5) as usize },
            grid_y: Grid { lo: lo_y, hi: lo_y + wy, points: log_uniform(&mut rng, 0.31, 1.5) as usize },
            bandwidth_x: wx * log_uniform(&mut rng, -1.5, 0.5),
            bandwidth_y: wy * log_uniform(&mut rng, -1.5, 0.5),
            epsilon: log_uniform(&mut rng, -3.0, 1.0),
            delta: log_uniform(&mut rng, -12.0, -2.0),
            calibration: Calibration::Analytic,
            normalise: Default::default(),
        };
        let Ok(m) = Kde2dMechanism::new(spec.clone(), Contribution::ROW) else { continue };
        seen.accepted += 1;
        let (gx, gy) = (spec.grid_x, spec.grid_y);
        let xs: Vec<f64> = (0..100).map(|k| gx.lo + wx * ((k as f64 * 0.618).fract())).collect();
        let ys: Vec<f64> = (0..100).map(|k| gy.lo + wy * ((k as f64 * 0.377).fract())).collect();
        let mut acc = m.accumulation();
        m.add_all(&mut acc, &xs, &ys);
        let base = acc.totals().to_vec();
        let w0 = m.lifted(&base);
        assert!(finite(&w0), "draw {i}: non-finite lifted coordinates");
        for (x, y) in [
            (gx.lo, gy.lo),
            (gx.hi, gy.hi),
            (gx.lo - 8.0 * spec.bandwidth_x, gy.hi + 8.0 * spec.bandwidth_y),
            (gx.lo + wx / 3.0, gy.lo + wy / 7.0),
            (f64::NAN, gy.lo),
            (f64::INFINITY, f64::NEG_INFINITY),
            (1e308, -1e308),
        ] {
            let mut acc = m.accumulation();
            acc.merge(&base);
            m.add_all(&mut acc, &[x], &[y]);
            let w1 = m.lifted(acc.totals());
            assert!(finite(&w1), "draw {i} ({x}, {y}): non-finite lifted coordinates");
            let what = format!("kde2d draw {i} ({spec:?}) ({x}, {y})");
            seen.check(&what, l2(&w0, &w1), m.stat_sensitivity());
            assert!(rounded(m.lattice(), &w0, &w1, false) <= m.lattice().sensitivity(), "{what}: rounded");
        }
    }
    assert!(seen.accepted >= 6, "only {} draws were accepted", seen.accepted);
    assert!(seen.worst > 0.5, "the worst difference is only {} of the sensitivity", seen.worst);
}
