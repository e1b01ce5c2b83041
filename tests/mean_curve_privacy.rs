//! Empirical privacy audits of `private_mean_curve`'s two mechanisms on neighbouring
//! datasets, through the real release path, each with a σ/√2 negative control; and the
//! containment check of SPEC §1 on the smoothed neighbour difference.

use dpcurve::datagen::karhunen_loeve_curves;
use dpcurve::mechanism::Calibration;
use dpcurve::mechanism::calibration::epsilon_for_mu;
use dpcurve::mechanism::mean_curve::{CovKernel, MeanCurveMechanism, MeanCurveSpec, MeanState, inner};
use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;

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

/// Draws releases (count noise held at 0 so the audit isolates the curve mechanism) and
/// returns the j*-th coefficient of `n·mean` — the released noisy sum `T̃_j*`.
fn coefficient_samples(
    m: &MeanCurveMechanism,
    state: &MeanState,
    j: usize,
    scale: f64,
    n: usize,
    seed: u64,
) -> Vec<f64> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let count = state.count as f64;
    (0..n)
        .map(|_| {
            let noise: Vec<f64> = m.noise_coefficients(&mut rng).iter().map(|z| z * scale).collect();
            let r = m.release_with_noise(state, &noise, 0.0);
            inner(&r.mean, &m.basis().vectors[j]) * count.max(1.0)
        })
        .collect()
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
    let unit = |s: &MeanState| m.sum_coefficients(s)[j];
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

/// SPEC §1 containment for the smoothed difference: through the real code path, the
/// change one row makes has Mahalanobis norm (in the noise's metric, kept span) at most
/// Δ·(1 + 1e-3), for every kernel, rough and smooth rows, and clipped extremes.
#[test]
fn smoothed_neighbour_differences_are_contained() {
    for kernel in [CovKernel::Gaussian, CovKernel::Matern52, CovKernel::Matern32, CovKernel::Exponential] {
        let m = MeanCurveMechanism::new(spec(kernel, 0.1, 0.01, 1e-5)).unwrap();
        let (d0, _, _) = neighbours(&m);
        let mut rows = karhunen_loeve_curves(50, 64, 10);
        rows.push(vec![1e6; 64]);
        rows.push((0..64).map(|k| if k % 2 == 0 { 3.0 } else { -3.0 }).collect());
        rows.extend(m.basis().vectors.iter().take(20).map(|v| v.iter().map(|x| x * 7.0).collect::<Vec<f64>>()));
        for r in rows {
            let mut d1 = d0.clone();
            m.add(&mut d1, &r);
            let a = m.sum_coefficients(&d0);
            let b = m.sum_coefficients(&d1);
            let norm =
                a.iter().zip(&b).zip(&m.basis().lambda).map(|((x, y), l)| (y - x).powi(2) / l).sum::<f64>().sqrt();
            assert!(norm <= m.sensitivity() * (1.0 + 1e-3), "{kernel:?}: {norm} > {}", m.sensitivity());
        }
    }
}
