//! Empirical privacy audits of `private_mean_curve`'s two mechanisms on neighbouring
//! datasets, through the real release path (lifted coordinates, lattice rounding, the exact
//! samplers), each with a σ/√2 negative control; the neighbour-difference bound of the
//! lifted coordinates (SPEC §6); and the count attack regression with the old float
//! Laplace sampler as its failing control.

use dpcurve::datagen::karhunen_loeve_curves;
use dpcurve::mechanism::Calibration;
use dpcurve::mechanism::curves::mean_curve::{CovKernel, MeanCurveMechanism, MeanCurveSpec, MeanState};
use dpcurve::mechanism::noise::calibration::epsilon_for_mu;
use dpcurve::mechanism::noise::double_double::DD;
use rand::rngs::ChaCha20Rng;
use rand::{Rng, SeedableRng};

fn spec(kernel: CovKernel, range: f64, penalty: f64, delta: f64) -> MeanCurveSpec {
    MeanCurveSpec {
        points: 64,
        kernel,
        range,
        penalty,
        eta: 1.0,
        clip: 0.5,
        epsilon: 1.0,
        delta,
        count_fraction: 0.1,
        calibration: Calibration::Analytic,
    }
}

/// Neighbouring statistics: D (100 simulated curves) and D plus the worst-case curve for
/// one eigen-direction j* (the maximiser of s_j/sqrt(λ_j)).
fn neighbours(m: &MeanCurveMechanism) -> (MeanState, MeanState, usize) {
    let b = m.basis();
    let j = (0..b.lambda.len())
        .max_by(|&a, &c| (m.smoother()[a] / b.lambda[a].sqrt()).total_cmp(&(m.smoother()[c] / b.lambda[c].sqrt())))
        .unwrap();
    let mut d0 = m.empty_state();
    for c in karhunen_loeve_curves(100, 64, 9) {
        m.add(&mut d0, &c);
    }
    let mut d1 = d0.clone();
    let extreme: Vec<f64> = b.vectors[j].iter().map(|v| 10.0 * v).collect(); // clipped to τ
    m.add(&mut d1, &extreme);
    (d0, d1, j)
}

/// Draws the j-th released lifted coordinate `w̃_j = round(w_j) + γ·z_j` (real sampler;
/// `scale` ≠ 1 simulates a calibration bug). The curve and count are post-processing.
fn coefficient_samples(
    m: &MeanCurveMechanism,
    state: &MeanState,
    j: usize,
    scale: f64,
    n: usize,
    seed: u64,
) -> Vec<f64> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let lat = m.lattice();
    let rounded = lat.round(&m.lifted(state))[j] as f64;
    (0..n).map(|_| (rounded + scale * lat.noise_coordinate(&mut rng) as f64) * lat.gamma()).collect()
}

/// Gaussian mechanism: the standardised shift μ̂ of the optimal statistic gives an ε lower
/// bound at δ through the Gaussian trade-off curve.
fn gaussian_audit(scale: f64, seed: u64) -> (f64, f64) {
    let m = MeanCurveMechanism::new(spec(CovKernel::Matern32, 0.2, 0.05, 1e-5)).unwrap();
    let (d0, d1, j) = neighbours(&m);
    let n = 20_000;
    let a = coefficient_samples(&m, &d0, j, scale, n, seed);
    let b = coefficient_samples(&m, &d1, j, scale, n, seed + 1);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let var = |v: &[f64], mu: f64| v.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / (v.len() - 1) as f64;
    let (ma, mb) = (mean(&a), mean(&b));
    let sd = (0.5 * (var(&a, ma) + var(&b, mb))).sqrt();
    let mu = (mb - ma).abs() / sd;
    let se = (2.0 / n as f64 + mu * mu / (4.0 * n as f64)).sqrt();
    (epsilon_for_mu(mu - 3.0 * se, m.spec().delta), mu * m.sigma() / m.sensitivity())
}

#[test]
fn gaussian_mechanism_audit_stays_below_the_claim() {
    let (eps_lb, ratio) = gaussian_audit(1.0, 100);
    // The curve part is charged ε_T = 0.9 (the count gets the other 0.1).
    assert!(eps_lb <= 0.9, "ε lower bound {eps_lb} exceeds ε_T = 0.9");
    assert!(ratio > 0.9, "the audit sees the full sensitivity (μ̂·σ/Δ = {ratio})");
}

#[test]
fn gaussian_mechanism_audit_detects_noise_scaled_by_one_over_root_two() {
    let (eps_lb, _) = gaussian_audit(std::f64::consts::FRAC_1_SQRT_2, 200);
    assert!(eps_lb > 0.9, "σ/√2 not detected: ε lower bound {eps_lb}");
}

/// ICLP (δ = 0): the event {coefficient above both means} has probability ratio
/// exp(√2·|d_j|/(σ·sqrt(λ_j))) between the neighbours; its Clopper–Pearson-style lower
/// bound (normal approximation, 4 SE) must stay below ε_T.
fn iclp_audit(scale: f64, seed: u64) -> f64 {
    // A smooth kernel and a large penalty concentrate Δ₁ on one coefficient, so the
    // single-coefficient test is nearly tight.
    let m = MeanCurveMechanism::new(spec(CovKernel::Gaussian, 1.0, 10.0, 0.0)).unwrap();
    let (d0, d1, j) = neighbours(&m);
    let n = 200_000;
    let a = coefficient_samples(&m, &d0, j, scale, n, seed);
    let b = coefficient_samples(&m, &d1, j, scale, n, seed + 1);
    let unit = |s: &MeanState| m.lifted(s)[j].to_f64();
    let (ta, tb) = (unit(&d0), unit(&d1));
    let threshold = ta.max(tb);
    let above = |v: &[f64], t: f64| v.iter().filter(|x| **x > t).count() as f64 / v.len() as f64;
    let (p1, p0) = (above(&b, threshold), above(&a, threshold));
    let (s1, s0) = ((p1 * (1.0 - p1) / n as f64).sqrt(), (p0 * (1.0 - p0) / n as f64).sqrt());
    ((p1 - 4.0 * s1) / (p0 + 4.0 * s0)).ln()
}

#[test]
fn iclp_mechanism_audit_stays_below_the_claim() {
    let m = MeanCurveMechanism::new(spec(CovKernel::Gaussian, 1.0, 10.0, 0.0)).unwrap();
    let eps_lb = iclp_audit(1.0, 300);
    let eps_t = 0.9;
    assert!(eps_lb <= eps_t, "ε lower bound {eps_lb} exceeds ε_T = {eps_t} (σ = {})", m.sigma());
    assert!(eps_lb > 0.5 * eps_t, "the audit is too weak to mean anything: {eps_lb}");
}

#[test]
fn iclp_mechanism_audit_detects_noise_scaled_by_one_over_root_two() {
    let eps_lb = iclp_audit(std::f64::consts::FRAC_1_SQRT_2, 400);
    assert!(eps_lb > 0.9, "σ/√2 not detected: ε lower bound {eps_lb}");
}

fn norms(a: &[DD], b: &[DD]) -> (f64, f64) {
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x.sub(*y).to_f64()).collect();
    (d.iter().map(|v| v * v).sum::<f64>().sqrt(), d.iter().map(|v| v.abs()).sum())
}

/// SPEC §6: through the real code path, the change one row makes to the lifted (whitened)
/// coordinates is within the sensitivity the calibration used — L2 for the Gaussian
/// mechanism, L1 for ICLP — for every kernel, rough and smooth rows, and clipped extremes;
/// and after rounding, within the lattice mechanism's total. A double-counted row is caught.
#[test]
fn lifted_neighbour_differences_are_within_the_sensitivity() {
    for kernel in [CovKernel::Gaussian, CovKernel::Matern52, CovKernel::Matern32, CovKernel::Exponential] {
        for delta in [1e-5, 0.0] {
            let m = MeanCurveMechanism::new(spec(kernel, 0.1, 0.01, delta)).unwrap();
            let (d0, _, _) = neighbours(&m);
            let w0 = m.lifted(&d0);
            let r0 = m.lattice().round(&w0);
            let mut rows = karhunen_loeve_curves(50, 64, 10);
            rows.push(vec![1e6; 64]);
            rows.push((0..64).map(|k| if k % 2 == 0 { 3.0 } else { -3.0 }).collect());
            rows.extend(m.basis().vectors.iter().take(20).map(|v| v.iter().map(|x| x * 7.0).collect::<Vec<f64>>()));
            let pick = |(l2, l1): (f64, f64)| if delta > 0.0 { l2 } else { l1 };
            let mut worst = 0.0f64;
            let mut worst_row = &rows[0];
            for r in &rows {
                let mut d1 = d0.clone();
                m.add(&mut d1, r);
                let w1 = m.lifted(&d1);
                let norm = pick(norms(&w1, &w0));
                if norm > worst {
                    (worst, worst_row) = (norm, r);
                }
                assert!(norm <= m.sensitivity(), "{kernel:?} δ={delta}: {norm} > {}", m.sensitivity());
                let r1 = m.lattice().round(&w1);
                let dk: Vec<f64> = r1.iter().zip(&r0).map(|(a, b)| (a - b) as f64 * m.lattice().gamma()).collect();
                let rounded = if delta > 0.0 {
                    dk.iter().map(|v| v * v).sum::<f64>().sqrt()
                } else {
                    dk.iter().map(|v| v.abs()).sum()
                };
                assert!(rounded <= m.lattice().sensitivity(), "{kernel:?} δ={delta}: rounded {rounded}");
            }
            if delta > 0.0 {
                // The worst direction attains the bound (not vacuous).
                assert!(worst > 0.999 * m.sensitivity(), "{kernel:?}: worst {worst} vs {}", m.sensitivity());
            }
            // Negative control: the worst row counted twice exceeds the bound in both norms
            // (for ICLP a row along the L1 maximiser, coefficients ∝ s_j/√λ_j, is added too).
            let b = m.basis();
            let w: Vec<f64> = m.smoother().iter().zip(&b.lambda).map(|(s, l)| s / l.sqrt()).collect();
            let l1_max: Vec<f64> = b.synthesize(&w).iter().map(|v| 1e3 * v).collect();
            let row = if delta > 0.0 { worst_row } else { &l1_max };
            let mut d2 = d0.clone();
            m.add(&mut d2, row);
            m.add(&mut d2, row);
            assert!(pick(norms(&m.lifted(&d2), &w0)) > m.sensitivity(), "{kernel:?}: double count not detected");
        }
    }
}

/// The old count release: `count + Laplace(b)` in f64 from a 53-bit uniform (inversion).
fn old_float_laplace(rng: &mut ChaCha20Rng, b: f64) -> f64 {
    let u = (rng.next_u64() >> 11) as f64 * 2f64.powi(-53) - 0.5;
    old_laplace_from(u, b)
}

fn old_laplace_from(u: f64, b: f64) -> f64 {
    -b * u.signum() * (1.0 - 2.0 * u.abs()).max(f64::MIN_POSITIVE).ln()
}

/// Whether the old sampler can output `y` for a count of 0: some 53-bit uniform maps to
/// exactly y (the inversion is monotone, so the candidates are a few around the inverse).
fn old_output_possible_at_zero(y: f64, b: f64) -> bool {
    let u = y.signum() * (1.0 - (-y.abs() / b).exp()) / 2.0;
    let k = ((u + 0.5) * 2f64.powi(53)).round() as i64;
    (k - 64..=k + 64).any(|k| old_laplace_from(k as f64 * 2f64.powi(-53) - 0.5, b) == y)
}

/// SPEC §6 attack regression for the count: with a table filtered to one person (count 1)
/// against the same table without them (count 0), no released `n` may be impossible
/// under the other count. The released n is an integer with discrete Laplace noise of full
/// support on ℤ. The old f64 sampler is the failing control: most of its outputs at count
/// 1 are values it can never produce at count 0 (Mironov 2012).
#[test]
fn count_attack_regression_no_release_is_impossible_under_the_neighbour() {
    let m = MeanCurveMechanism::new(spec(CovKernel::Matern32, 0.2, 0.05, 1e-5)).unwrap();
    let count = m.count_mechanism();
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    for _ in 0..2_000 {
        let y = count.release(&[DD::from_i128(1)], Some(&mut rng))[0];
        assert!(y.fract() == 0.0 && y.abs() < 1e15, "the released count is an integer: {y}");
        // Needed noise under count 0 is y − 0 ∈ ℤ: in the discrete Laplace's support.
    }
    // Through the whole release: n is an integer.
    let (d0, _, _) = neighbours(&m);
    let r = m.release(&d0, Some(&mut rng));
    assert!((r.n - 100).abs() < 1000, "n = {}", r.n);
    // Failing control: the old sampler at ε_n = 0.1 (b = 10).
    let b = 10.0;
    let releases = 1_000;
    let at_one =
        (0..releases).filter(|_| !old_output_possible_at_zero(1.0 + old_float_laplace(&mut rng, b), b)).count();
    let at_zero = (0..releases).filter(|_| !old_output_possible_at_zero(old_float_laplace(&mut rng, b), b)).count();
    assert_eq!(at_zero, 0, "the impossibility check has false positives");
    assert!(at_one > releases / 2, "old float sampler flagged in only {at_one}/{releases} releases");
}
