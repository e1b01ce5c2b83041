//! The privacy map of `private_kernel_regression` / `private_kernel_classifier`
//! (`mechanism::kernel_fit`): calibration against reference values, the add/remove
//! neighbour difference through the real accumulate-and-solve path, the released noise's
//! covariance, an empirical ε audit, and the solver's certificate on adversarial statistics —
//! each with a negative control that shows the test would catch the mistake.

mod common;

use dpcurve::mechanism::fits::kernel_fit::{FitLoss, FitSpec, KernelFitMechanism};
use dpcurve::mechanism::noise::double_double::DD;
use dpcurve::mechanism::{Calibration, Contribution, Grid};
use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;

fn spec(loss: FitLoss, penalty: f64, epsilon: f64, delta: f64) -> FitSpec {
    FitSpec {
        grid: Grid { lo: 0.0, hi: 1.0, points: 41 },
        bandwidth: 0.1,
        penalty,
        loss,
        y_range: if matches!(loss, FitLoss::Huber(_)) { (-2.0, 2.0) } else { (-1.0, 1.0) },
        epsilon,
        delta,
        calibration: Calibration::Analytic,
    }
}

fn mechanism(loss: FitLoss, penalty: f64, epsilon: f64, delta: f64) -> KernelFitMechanism {
    KernelFitMechanism::new(spec(loss, penalty, epsilon, delta), Contribution::ROW).unwrap()
}

fn state_of(m: &KernelFitMechanism, ys: &[f64], xs: &[f64]) -> Vec<i128> {
    let mut acc = m.accumulation();
    m.add_all(&mut acc, ys, xs);
    acc.totals().to_vec()
}

fn with_rows(m: &KernelFitMechanism, base: &[i128], ys: &[f64], xs: &[f64]) -> Vec<i128> {
    let mut acc = m.accumulation();
    acc.merge(base);
    m.add_all(&mut acc, ys, xs);
    acc.totals().to_vec()
}

fn l2_diff(a: &[DD], b: &[DD]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x.sub(*y).to_f64().powi(2)).sum::<f64>().sqrt()
}

fn data(n: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let xs = dpcurve::datagen::mixture(n, seed);
    let e = dpcurve::datagen::mixture(n, seed + 1);
    let ys = xs.iter().zip(&e).map(|(x, e)| (6.0 * x).sin() + 2.0 * (e - 0.5)).collect();
    (xs, ys)
}

#[test]
fn calibration_is_the_gaussian_reference_scaled_by_l_kappa_over_lambda() {
    // The 1-D KDE's reference value (Δ = 1, ε = 1, δ = 1e-6, analytic): σ = 4.5309. Here
    // Δ = L·κ/Λ with κ = 1 (unit-norm features): huber c = 0.5 and Λ = 10 give Δ = 0.05.
    for (loss, penalty, want_delta) in
        [(FitLoss::Huber(0.5), 10.0, 0.05), (FitLoss::Hinge(0.1), 4.0, 0.25), (FitLoss::Huber(3.0), 300.0, 0.01)]
    {
        let m = mechanism(loss, penalty, 1.0, 1e-6);
        assert!((m.kappa() - 1.0).abs() < 1e-9, "κ = {}", m.kappa());
        assert!((m.row_sensitivity() / want_delta - 1.0).abs() < 1e-9, "Δ = {}", m.row_sensitivity());
        let sigma = m.sigma();
        assert!((sigma / (4.5309 * want_delta) - 1.0).abs() < 1e-4, "{loss}: σ = {sigma}");
        // The certificate's slack and the lattice rounding cost ≤ 1e-5 of Δ.
        assert!(m.lattice().sensitivity() < want_delta * (1.0 + 1e-5));
    }
    // Negative control: a unit of four rows needs four times the noise; two groups √2 more.
    let row = mechanism(FitLoss::Huber(0.5), 10.0, 1.0, 1e-6);
    let unit =
        KernelFitMechanism::new(spec(FitLoss::Huber(0.5), 10.0, 1.0, 1e-6), Contribution::new(4, 1).unwrap()).unwrap();
    assert!((unit.sigma() / row.sigma() - 4.0).abs() < 1e-5); // 2η is not multiplied
    let two =
        KernelFitMechanism::new(spec(FitLoss::Huber(0.5), 10.0, 1.0, 1e-6), Contribution::new(1, 2).unwrap()).unwrap();
    assert!(two.sigma() > 1.41 * row.sigma());
    // Parameters are refused with a message, at planning.
    for (bad, want) in [
        (FitSpec { penalty: 0.0, ..spec(FitLoss::Huber(1.0), 1.0, 1.0, 1e-6) }, "penalty must be"),
        (FitSpec { bandwidth: 1e-4, ..spec(FitLoss::Huber(1.0), 1.0, 1.0, 1e-6) }, "bandwidth must be at least"),
        (FitSpec { delta: 1.0, ..spec(FitLoss::Huber(1.0), 1.0, 1.0, 1e-6) }, "delta must be"),
        (spec(FitLoss::Hinge(0.01), 1.0, 1.0, 1e-6), "smoothing must be"),
        (FitSpec { y_range: (1.0, 1.0), ..spec(FitLoss::Huber(1.0), 1.0, 1.0, 1e-6) }, "lo_y < hi_y"),
    ] {
        let err = KernelFitMechanism::new(bad, Contribution::ROW).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}

/// One added row moves the certified minimizer by at most L·κ/Λ (+ 2η) — through the real
/// binning and solver, for rows anywhere (corners, outside the box, ±inf, NaN), on an empty
/// table (where the bound is nearly attained) and on a populated one. Control: the same row
/// counted twice exceeds the bound.
#[test]
fn neighbour_differences_stay_within_the_calibrated_sensitivity() {
    let rows: [(f64, f64); 9] = [
        (2.0, 0.0),
        (-2.0, 1.0),
        (2.0, 0.5),
        (9.0, -3.0),
        (f64::INFINITY, f64::NEG_INFINITY),
        (-1e300, 0.37),
        (0.1, 0.999),
        (f64::NAN, 0.5),
        (1.0, f64::NAN),
    ];
    let (xs, ys) = data(2_000, 3);
    for loss in [FitLoss::Huber(0.5), FitLoss::Hinge(0.1)] {
        for penalty in [3.0, 300.0] {
            let m = mechanism(loss, penalty, 1.0, 1e-6);
            let bound = m.row_sensitivity() + 2.0 * m.tolerance();
            let mut worst: f64 = 0.0;
            for base in [vec![0i128; m.state_len()], state_of(&m, &ys, &xs)] {
                let s0 = m.solve(&base);
                assert!(s0.certified, "{s0:?}");
                for &(y, x) in &rows {
                    let s1 = m.solve(&with_rows(&m, &base, &[y], &[x]));
                    assert!(s1.certified);
                    let d = l2_diff(&s0.w, &s1.w);
                    assert!(d <= bound, "{loss} Λ = {penalty}: row ({y}, {x}) moved w by {d} > {bound}");
                    worst = worst.max(d);
                }
                // Control: one row counted twice breaks the bound (on the empty table, Λ large).
                if base.iter().all(|&v| v == 0) && penalty > 100.0 {
                    let s2 = m.solve(&with_rows(&m, &base, &[2.0, 2.0], &[0.5, 0.5]));
                    let d = l2_diff(&s0.w, &s2.w);
                    assert!(d > 1.5 * m.row_sensitivity(), "{loss}: a double-counted row moved w by only {d}");
                }
            }
            // The bound is nearly attained (the proof is tight for a lone row with a large loss slope).
            assert!(worst > 0.9 * m.row_sensitivity(), "{loss} Λ = {penalty}: worst {worst} of {bound}");
        }
    }
}

/// The released coefficients are round(ŵ) + iid discrete Gaussian noise of the calibrated σ,
/// so the fitted function carries a Gaussian process with covariance σ²·k_D(s, t) ≈
/// σ²·exp(−(s−t)²/2h²). Control: σ/√2 noise fails the variance check.
#[test]
fn released_noise_is_a_gaussian_process_with_the_kernels_covariance() {
    let m = mechanism(FitLoss::Huber(1.0), 10.0, 1.0, 1e-6);
    let (xs, ys) = data(500, 5);
    let st = state_of(&m, &ys, &xs);
    let exact: Vec<f64> = m.lattice().to_real(&m.lattice().round(&m.solve(&st).w));
    let (t0, t1) = (0.4, 0.5); // one bandwidth apart
    let draws = 3_000;
    let check = |scale: f64, seed: u64| -> (f64, f64) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let (mut v0, mut v1, mut c01) = (0.0, 0.0, 0.0);
        for _ in 0..draws {
            let z: Vec<f64> = m.lattice().to_real(&m.lattice().noise(&mut rng));
            let w: Vec<f64> = exact.iter().zip(&z).map(|(a, b)| a + scale * b).collect();
            let (e0, e1) = (m.eval(&w, t0) - m.eval(&exact, t0), m.eval(&w, t1) - m.eval(&exact, t1));
            v0 += e0 * e0;
            v1 += e1 * e1;
            c01 += e0 * e1;
        }
        let s2 = m.sigma().powi(2) * draws as f64;
        ((v0 + v1) / (2.0 * s2), c01 / (v0 * v1).sqrt())
    };
    let (var_ratio, corr) = check(1.0, 41);
    // SE of a variance ratio from 6 000 (correlated) squares ≈ 0.02; of the correlation ≈ 0.01.
    assert!((var_ratio - 1.0).abs() < 0.08, "variance ratio {var_ratio}");
    assert!((corr - (-0.5f64).exp()).abs() < 0.05, "correlation {corr} at one bandwidth, want e^-1/2");
    let (var_ratio, _) = check(std::f64::consts::FRAC_1_SQRT_2, 42);
    assert!((var_ratio - 1.0).abs() > 0.3, "σ/√2 not detected: variance ratio {var_ratio}");
}

const AUDIT_EPSILON: f64 = 3.0;

/// The optimal test between a lone row's table and the empty table on the released coefficients
/// (iid noise: project on the mean difference); μ̂ − 3·SE lower-bounds ε at the claimed δ.
fn audit(noise_scale: f64, seed: u64) -> (f64, f64, f64) {
    let delta = 1e-5;
    let m = mechanism(FitLoss::Hinge(0.1), 1000.0, AUDIT_EPSILON, delta);
    let empty = vec![0i128; m.state_len()];
    let lone = with_rows(&m, &empty, &[1.0], &[0.5]);
    let lat = m.lattice();
    let (r0, r1) = (lat.round(&m.solve(&empty).w), lat.round(&m.solve(&lone).w));
    let (eps_lb, mu) = common::projection_audit(lat, &r0, &r1, noise_scale, seed, 1_000, delta);
    (eps_lb, mu, m.row_sensitivity() / m.sigma())
}

#[test]
fn empirical_audit_stays_below_the_claim_and_detects_noise_scaled_by_one_over_root_two() {
    let (eps_lb, mu, claimed_mu) = audit(1.0, 301);
    assert!(eps_lb <= AUDIT_EPSILON, "ε lower bound {eps_lb} exceeds the claim (μ̂ = {mu}, claimed {claimed_mu})");
    assert!(mu > 0.8 * claimed_mu, "μ̂ = {mu} far below {claimed_mu}: the audit is not sensitive");
    let (eps_lb, mu, _) = audit(std::f64::consts::FRAC_1_SQRT_2, 302);
    assert!(eps_lb > AUDIT_EPSILON, "σ/√2 not detected: ε lower bound {eps_lb} (μ̂ = {mu})");
}

/// The sensitivity holds for the computed ŵ only if the solver certifies ‖ŵ − w*‖ ≤ η. The
/// statistics an analyst can shape — all mass in one cell, 10¹² rows, opposite labels in
/// neighbouring bins, the smallest and largest penalties, a bandwidth at each limit — all
/// certify, mostly within a few dozen Newton steps. Control: a tolerance far below the rounding
/// floor (η/10¹²) is not certifiable, so the check is not vacuous.
#[test]
fn the_solver_certifies_on_adversarial_statistics() {
    let unit = 1i128 << 40;
    let mut worst_steps = 0;
    for loss in [FitLoss::Huber(0.5), FitLoss::Hinge(0.1)] {
        for penalty in [1e-6, 1e-2, 1.0, 1e4, 1e15] {
            // The narrowest bandwidth (≈ 700 features, 2 049 bins) costs ~0.1 s a Newton step in a
            // test build: at the extreme penalties only.
            let narrow = if penalty == 1e-6 && loss == FitLoss::Hinge(0.1) { 1.0 / 64.0 } else { 0.02 };
            for bandwidth in [0.1, narrow, 500.0] {
                let m =
                    KernelFitMechanism::new(FitSpec { bandwidth, ..spec(loss, penalty, 1.0, 1e-6) }, Contribution::ROW)
                        .unwrap();
                let (len, levels) = (m.state_len(), m.levels().len());
                let mut cases: Vec<Vec<i128>> = Vec::new();
                let mut one_cell = vec![0; len];
                one_cell[len - 1] = unit * 1_000_000_000_000;
                cases.push(one_cell);
                let mut alternating = vec![0; len];
                for b in 0..m.bins() {
                    alternating[b * levels + if b % 2 == 0 { 0 } else { levels - 1 }] = unit * 10_000_000;
                }
                cases.push(alternating);
                let mut edges = vec![0; len];
                edges[0] = unit * 1_000_000_000;
                edges[levels - 1] = unit * 1_000_000_000;
                edges[len - 1] = unit * 3;
                cases.push(edges);
                let (xs, ys) = data(3_000, 9);
                cases.push(state_of(&m, &ys, &xs));
                for st in &cases {
                    let s = m.solve(st);
                    assert!(
                        s.certified,
                        "{loss} Λ = {penalty} h = {bandwidth}: not certified after {} steps (distance {} > η {})",
                        s.steps,
                        s.distance,
                        m.tolerance()
                    );
                    worst_steps = worst_steps.max(s.steps);
                }
            }
        }
    }
    // Measured: the fixed 40 steps everywhere except the hinge at Λ = 1e-6 and the narrowest
    // bandwidth (114); the cap is 200.
    assert!(worst_steps <= 160, "the solver needed {worst_steps} Newton steps");
    // Control: the certificate always carries its rounding bound — it never claims an exact solve.
    let m = mechanism(FitLoss::Huber(0.5), 1e-2, 1.0, 1e-6);
    let mut st = vec![0; m.state_len()];
    st[7] = unit * 1_000_000_000_000;
    let s = m.solve(&st);
    assert!(s.certified && s.distance > 0.0, "distance {} claims an exact solve", s.distance);
}

/// The timing attack: the run time of a release must not depend on one row. The solver's work is
/// its Newton steps (each a fixed number of objective evaluations); on neighbouring tables — a
/// populated one and the same plus one row anywhere, with a response at either clamp or the middle
/// — it is the same, and every solve certifies. (The adaptive solver this replaced took one to
/// three steps more or fewer on about one neighbour in ten: this test failed on it.)
#[test]
fn the_solvers_work_does_not_depend_on_one_row() {
    let (xs, ys) = data(2_000, 3);
    for loss in [FitLoss::Huber(0.5), FitLoss::Hinge(0.1)] {
        for penalty in [1.0, 100.0] {
            let m = mechanism(loss, penalty, 1.0, 1e-6);
            let base = state_of(&m, &ys, &xs);
            let s0 = m.solve(&base);
            assert!(s0.certified);
            for i in 0..16 {
                let x = i as f64 / 15.0;
                for y in [-2.0, 0.0, 2.0] {
                    let s1 = m.solve(&with_rows(&m, &base, &[y], &[x]));
                    assert!(s1.certified, "{loss} Λ = {penalty}: row ({y}, {x}) not certified");
                    assert_eq!(s1.steps, s0.steps, "{loss} Λ = {penalty}: row ({y}, {x}) changed the solver's work");
                }
            }
        }
    }
}

/// The counterexample of an exact-arithmetic review: h = 0.1, Λ = 10⁻⁴, huber = 10⁻⁵ on
/// [0, 1]², 3 000 rows with y = 0 and the neighbour with (0.5, 1.0) added — Newton stopped
/// uncertified and the released coefficients moved by ≈ 6× the calibrated Δ. That huber scale is
/// now refused at planning; at the smallest accepted scale (10⁻² of hi_y − lo_y) with the smallest
/// penalties, this pair and the other adversarial tables certify. Control: at 10⁻⁵ (refused now)
/// some of them do not, so the boundary is not vacuous.
#[test]
fn the_smallest_accepted_huber_scale_certifies_and_the_counterexample_is_refused() {
    let fit = |huber: f64, penalty: f64, bandwidth: f64| FitSpec {
        bandwidth,
        y_range: (0.0, 1.0),
        ..spec(FitLoss::Huber(huber), penalty, 1.0, 1e-6)
    };
    let e = KernelFitMechanism::new(fit(1e-5, 1e-4, 0.1), Contribution::ROW).unwrap_err().to_string();
    assert!(e.contains("huber must be at least 0.01"), "{e}");
    let n = 3000;
    let xs: Vec<f64> = (0..n).map(|i| i as f64 / n as f64).collect();
    let ys = vec![0.0; n];
    let unit = 1i128 << 40;
    for (penalty, bandwidth) in [(1e-6, 0.1), (1e-4, 0.1), (1e-4, 0.05)] {
        let m = KernelFitMechanism::new(
            fit(dpcurve::mechanism::fits::kernel_fit::MIN_HUBER_FRACTION, penalty, bandwidth),
            Contribution::ROW,
        )
        .unwrap();
        let base = state_of(&m, &ys, &xs);
        let (len, levels) = (m.state_len(), m.levels().len());
        let mut alternating = vec![0; len];
        for b in 0..m.bins() {
            alternating[b * levels + if b % 2 == 0 { 0 } else { levels - 1 }] = unit * 10_000;
        }
        let neighbour = with_rows(&m, &base, &[1.0], &[0.5]);
        let (s0, s1) = (m.solve(&base), m.solve(&neighbour));
        assert!(s0.certified && s1.certified, "Λ = {penalty}, h = {bandwidth}: {} / {} steps", s0.steps, s1.steps);
        assert!(l2_diff(&s0.w, &s1.w) <= m.row_sensitivity() + 2.0 * m.tolerance(), "Λ = {penalty}");
        assert!(m.solve(&alternating).certified, "Λ = {penalty}, h = {bandwidth}: alternating");
        let (xd, yd) = data(3_000, 9);
        let yd: Vec<f64> = yd.iter().map(|y| (y + 2.0) / 4.0).collect();
        assert!(m.solve(&state_of(&m, &yd, &xd)).certified, "Λ = {penalty}, h = {bandwidth}: smooth data");
    }
    // Control: the counterexample's scale (accepted before) does not certify.
    let sharp = KernelFitMechanism::with_any_huber_for_tests(fit(1e-5, 1e-4, 0.1), Contribution::ROW).unwrap();
    let base = state_of(&sharp, &ys, &xs);
    let neighbour = with_rows(&sharp, &base, &[1.0], &[0.5]);
    let (len, levels) = (sharp.state_len(), sharp.levels().len());
    let mut alternating = vec![0; len];
    for b in 0..sharp.bins() {
        alternating[b * levels + if b % 2 == 0 { 0 } else { levels - 1 }] = unit * 10_000;
    }
    let (xs2, ys2) = data(3_000, 9);
    let ys2: Vec<f64> = ys2.iter().map(|y| (y + 2.0) / 4.0).collect();
    let cases = [base, neighbour, alternating, state_of(&sharp, &ys2, &xs2)];
    let uncertified = cases.iter().filter(|st| !sharp.solve(st).certified).count();
    assert!(uncertified > 0, "the boundary is not vacuous");
}
