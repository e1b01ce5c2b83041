//! Tests of the parent module.

use super::*;
use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;
use rand_distr::{Distribution, StandardNormal};

fn spec(kernel: CovKernel, delta: f64) -> MeanCurveSpec {
    MeanCurveSpec {
        points: 60,
        kernel,
        range: 0.1,
        penalty: 0.01,
        eta: 1.0,
        clip: 1.0,
        epsilon: 1.0,
        delta,
        count_fraction: 0.1,
        calibration: Calibration::Analytic,
    }
}

const KERNELS: [CovKernel; 4] = [CovKernel::Gaussian, CovKernel::Matern52, CovKernel::Matern32, CovKernel::Exponential];

#[test]
fn eigenvectors_are_orthonormal_in_discrete_l2() {
    for k in KERNELS {
        let b = Eigenbasis::compute(k, 0.2, 50);
        assert!(!b.is_empty());
        for i in 0..b.lambda.len().min(10) {
            for j in 0..b.lambda.len().min(10) {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((inner(&b.vectors[i], &b.vectors[j]) - want).abs() < 1e-9, "{k:?} {i} {j}");
            }
        }
        assert!(b.lambda.windows(2).all(|w| w[0] >= w[1]));
    }
}

/// The smoothed coefficients of one row's stored contribution.
fn smoothed(m: &MeanCurveMechanism, c: &[i128]) -> Vec<f64> {
    m.sum_coefficients(&MeanState { sums: c.to_vec(), count: 1 })
}

/// The Mahalanobis norm of one row's contribution, in the noise's metric.
fn gaussian_norm(m: &MeanCurveMechanism, c: &[i128]) -> f64 {
    smoothed(m, c).iter().zip(&m.basis().lambda).map(|(v, l)| v * v / l).sum::<f64>().sqrt()
}

fn laplace_norm(m: &MeanCurveMechanism, c: &[i128]) -> f64 {
    smoothed(m, c).iter().zip(&m.basis().lambda).map(|(v, l)| v.abs() / l.sqrt()).sum()
}

fn random_curves(m: usize, n: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let x: Vec<f64> = (0..m).map(|_| StandardNormal.sample(&mut rng)).collect();
            // Mix rough and smooth directions, at and above the clip norm.
            let s = 1.0 + (i % 3) as f64;
            let norm = inner(&x, &x).sqrt();
            x.iter().map(|v| s * v / norm).collect()
        })
        .collect()
}

#[test]
fn a_units_bound_scales_curve_and_count_noise() {
    let c = Contribution::new(4, 9).unwrap();
    for delta in [1e-5, 0.0] {
        let base = MeanCurveMechanism::new(spec(CovKernel::Matern32, delta)).unwrap();
        let unit = MeanCurveMechanism::with_contribution(spec(CovKernel::Matern32, delta), c).unwrap();
        // Joint sensitivity over the groups: rows·√groups (Gaussian) or rows·groups (ICLP).
        let factor = if delta > 0.0 { 4.0 * 3.0 } else { 36.0 };
        let ratio = unit.lattice().sensitivity() / base.lattice().sensitivity();
        assert!(ratio > factor * (1.0 - 1e-6) && ratio < factor * (1.0 + 1e-6), "δ={delta}: {ratio}");
        // The count: discrete Laplace of scale rows·groups/ε_n, sd √2·36/ε_n.
        let sd = unit.count_mechanism().noise_sd() / base.count_mechanism().noise_sd();
        assert!((sd - 36.0).abs() < 1e-6, "{sd}");
    }
}

/// Brute force: no random curve (clipped) exceeds the stated sensitivity, and the
/// worst-case direction attains it, for both mechanisms and every kernel.
#[test]
fn sensitivities_match_brute_force_maximisation() {
    for k in KERNELS {
        for delta in [1e-5, 0.0] {
            let m = MeanCurveMechanism::new(spec(k, delta)).unwrap();
            let norm = |c: &[i128]| if delta > 0.0 { gaussian_norm(&m, c) } else { laplace_norm(&m, c) };
            let mut worst = 0.0f64;
            for x in random_curves(60, 300, 7) {
                worst = worst.max(norm(&m.contribution(&x).unwrap()));
            }
            assert!(worst <= m.sensitivity(), "{k:?} δ={delta}: {worst} > {}", m.sensitivity());
            // The maximiser: for the Gaussian map the single eigenvector with the largest
            // s_j/sqrt(λ_j); for ICLP the curve with coefficients ∝ s_j/sqrt(λ_j).
            let b = m.basis();
            let target: Vec<f64> = if delta > 0.0 {
                let j = (0..b.lambda.len())
                    .max_by(|&a, &c| {
                        (m.smoother()[a] / b.lambda[a].sqrt()).total_cmp(&(m.smoother()[c] / b.lambda[c].sqrt()))
                    })
                    .unwrap();
                b.vectors[j].clone()
            } else {
                let w: Vec<f64> = m.smoother().iter().zip(&b.lambda).map(|(s, l)| s / l.sqrt()).collect();
                let x = b.synthesize(&w);
                let n = inner(&x, &x).sqrt();
                x.iter().map(|v| v / n).collect()
            };
            let attained = norm(&m.contribution(&target).unwrap());
            assert!(
                attained > 0.999 * m.sensitivity(),
                "{k:?} δ={delta}: worst case {attained} vs {}",
                m.sensitivity()
            );
            assert!(attained > worst, "the maximiser beats random curves");
        }
    }
}

#[test]
fn gaussian_sensitivity_obeys_mirshanis_bound() {
    // Δ ≤ τ/(2·sqrt(φ)) for η = 1 (Mirshani Thm 4.1 for a sum), up to the rounding slack.
    for k in KERNELS {
        let m = MeanCurveMechanism::new(spec(k, 1e-5)).unwrap();
        assert!(m.sensitivity() <= 1.0 / (2.0 * 0.01f64.sqrt()) * (1.0 + 1e-6), "{k:?}");
    }
}

/// Unit-scale noise of the smoothed sum's coefficients: `sqrt(λ_j)·z_j/σ` for the
/// lattice noise `z_j` (in real units).
fn lifted_noise(m: &MeanCurveMechanism, rng: &mut ChaCha20Rng) -> Vec<f64> {
    let sd = m.sigma();
    m.lattice().to_real(&m.lattice().noise(rng)).iter().zip(&m.basis().lambda).map(|(z, l)| l.sqrt() * z / sd).collect()
}

#[test]
fn gaussian_noise_has_covariance_sigma_squared_c() {
    let m = MeanCurveMechanism::new(spec(CovKernel::Matern32, 1e-5)).unwrap();
    let b = m.basis();
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let n = 20_000;
    let pairs = [(0usize, 0usize), (30, 30), (30, 31), (10, 20), (59, 59)];
    let mut sums = [0.0; 5];
    for _ in 0..n {
        let z = b.synthesize(&lifted_noise(&m, &mut rng));
        for (s, &(i, j)) in sums.iter_mut().zip(&pairs) {
            *s += z[i] * z[j];
        }
    }
    let t = |k: usize| k as f64 / 59.0;
    for (s, &(i, j)) in sums.iter().zip(&pairs) {
        let got = s / n as f64;
        let want = CovKernel::Matern32.eval(t(i) - t(j), 0.1);
        let se = (2.0 / n as f64).sqrt();
        assert!((got - want).abs() < 5.0 * se, "cov[{i},{j}] {got} vs {want}");
        if i == j {
            assert!((got / 2.0 - want).abs() > 5.0 * se, "a 1/√2 noise scale must be detected");
        }
    }
}

#[test]
fn iclp_components_are_laplace_with_unit_variance() {
    let m = MeanCurveMechanism::new(spec(CovKernel::Exponential, 0.0)).unwrap();
    let b = m.basis();
    let mut rng = ChaCha20Rng::seed_from_u64(12);
    let n = 40_000;
    let (mut abs, mut sq) = (0.0, 0.0);
    for _ in 0..n {
        let noise = lifted_noise(&m, &mut rng);
        // Recover component 3 from the curve, as an analyst would.
        let curve = b.synthesize(&noise);
        let l = inner(&curve, &b.vectors[3]) / b.lambda[3].sqrt();
        abs += l.abs();
        sq += l * l;
    }
    let (mean_abs, var) = (abs / n as f64, sq / n as f64);
    // Laplace with scale b = 1/√2: E|L| = b = 0.7071, Var = 2b² = 1, and the kurtosis
    // separates it from a Gaussian with the same variance (E|Z| = 0.7979).
    let se = (0.5f64 / n as f64).sqrt();
    assert!((mean_abs - std::f64::consts::FRAC_1_SQRT_2).abs() < 5.0 * se, "E|L| = {mean_abs}");
    assert!((mean_abs - 0.7979).abs() > 5.0 * se, "a Gaussian component must be detected");
    assert!((var - 1.0).abs() < 0.05, "var {var}");
    assert!((var / 2.0 - 1.0).abs() > 0.05, "a 1/√2 scale must be detected");
}

#[test]
fn rows_of_wrong_length_or_non_finite_are_dropped_and_clipping_applies() {
    let m = MeanCurveMechanism::new(spec(CovKernel::Gaussian, 1e-5)).unwrap();
    let mut st = m.empty_state();
    m.add(&mut st, &[1.0; 59]);
    let mut bad = vec![0.5; 60];
    bad[7] = f64::NAN;
    m.add(&mut st, &bad);
    assert_eq!(st, m.empty_state());
    let big = vec![100.0; 60];
    let a = m.contribution(&big).unwrap();
    let b = m.contribution(&vec![1.0; 60]).unwrap();
    assert_eq!(a, b, "a curve of norm 100 clips to norm τ = 1");
    // Finite values whose squares overflow still clip to the same direction.
    assert_eq!(m.contribution(&vec![1e300; 60]).unwrap(), b);
    assert_eq!(m.contribution(&vec![-1e308; 60]).unwrap(), b.iter().map(|v| -v).collect::<Vec<_>>());
    assert!(m.contribution(&vec![0.0; 60]).unwrap().iter().all(|v| *v == 0));
}

#[test]
fn noiseless_release_of_identical_curves_is_their_smoothed_value_and_merges_are_exact() {
    let m = MeanCurveMechanism::new(MeanCurveSpec { penalty: 1e-9, ..spec(CovKernel::Gaussian, 1e-5) }).unwrap();
    let t: Vec<f64> = (0..60).map(|k| k as f64 / 59.0).collect();
    let curve: Vec<f64> = t.iter().map(|x| 0.1 * (std::f64::consts::PI * x).sin()).collect();
    let mut whole = m.empty_state();
    let mut parts = [m.empty_state(), m.empty_state()];
    for i in 0..10 {
        m.add(&mut whole, &curve);
        m.add(&mut parts[i % 2], &curve);
    }
    let [mut a, b] = parts;
    a.merge(&b);
    assert_eq!(a, whole);
    let r = m.release::<ChaCha20Rng>(&whole, None);
    assert_eq!(r.n, 10);
    let err = r.mean.iter().zip(&curve).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(err < 1e-3, "smooth curve reproduced up to the smoother: {err}");
}

#[test]
fn buffered_accumulation_equals_row_by_row_across_flushes() {
    let m = MeanCurveMechanism::new(MeanCurveSpec { points: 8, ..spec(CovKernel::Matern32, 1e-5) }).unwrap();
    // Extreme rows (all mass at one point: the largest per-point contribution) more
    // often than FLUSH_ROWS, plus ordinary and dropped rows.
    let mut spike = vec![0.0; 8];
    spike[3] = -1e9;
    let rows: Vec<Vec<f64>> = (0..2 * FLUSH_ROWS + 5000)
        .map(|i| match i % 5 {
            0 => vec![f64::NAN; 8],
            1 => (0..8).map(|k| (k as f64 * 0.3 + i as f64).sin()).collect(),
            _ => spike.clone(),
        })
        .collect();
    let mut acc = MeanAccumulation::new(&m);
    let mut reference = m.empty_state();
    for r in &rows {
        acc.add(&m, r);
        m.add(&mut reference, r);
    }
    assert_eq!(acc.state(), &reference);
    assert_eq!(reference.count, rows.len() as u64 - rows.len().div_ceil(5) as u64);
    // The spike clips to norm τ = 1: −sqrt(8) at point 3, in units, for every spike row
    // (over 2^16 of them, so the buffer must have been flushed to stay exact).
    let mut spikes = MeanAccumulation::new(&m);
    let n = rows.iter().filter(|r| r[3] == -1e9).inspect(|r| spikes.add(&m, r)).count();
    assert!(n > FLUSH_ROWS);
    let one = m.contribution(&spike).unwrap()[3];
    assert!((one as f64 * COEFF_UNIT + 8f64.sqrt()).abs() < 1e-9, "{one}");
    assert_eq!(spikes.state().sums[3], one * n as i128);
    assert!(spikes.state().sums.iter().enumerate().all(|(k, &v)| k == 3 || v == 0));
}

#[test]
fn parameters_are_validated_and_the_basis_is_cached() {
    assert!(MeanCurveMechanism::new(MeanCurveSpec { points: 1, ..spec(CovKernel::Gaussian, 1e-5) }).is_err());
    assert!(MeanCurveMechanism::new(MeanCurveSpec { penalty: 0.0, ..spec(CovKernel::Gaussian, 1e-5) }).is_err());
    assert!(MeanCurveMechanism::new(MeanCurveSpec { eta: 0.5, ..spec(CovKernel::Gaussian, 1e-5) }).is_err());
    assert!(MeanCurveMechanism::new(MeanCurveSpec { count_fraction: 1.0, ..spec(CovKernel::Gaussian, 1e-5) }).is_err());
    let a = Eigenbasis::cached(CovKernel::Matern52, 0.3, 40);
    let b = Eigenbasis::cached(CovKernel::Matern52, 0.3, 40);
    assert!(Arc::ptr_eq(&a, &b));
}

#[test]
fn the_noise_band_covers_sampled_noise_and_half_of_it_does_not() {
    // Through the real samplers (discrete Gaussian for δ > 0, discrete Laplace for δ = 0):
    // over 2 000 releases of one state, the sup over the grid of |release − noiseless|
    // stays inside the level-0.05 band in ≥ 94 % of them; a band 20 % narrower
    // under-covers.
    for (kernel, delta) in [(CovKernel::Gaussian, 1e-6), (CovKernel::Exponential, 1e-6), (CovKernel::Matern32, 0.0)] {
        let m = MeanCurveMechanism::new(spec(kernel, delta)).unwrap();
        let mut st = m.empty_state();
        for i in 0..50 {
            let c: Vec<f64> = (0..60).map(|k| ((k + i) as f64 / 20.0).sin() * 0.5).collect();
            m.add(&mut st, &c);
        }
        let lifted = m.lifted(&st);
        let exact = m.post_process(&m.lattice().release::<ChaCha20Rng>(&lifted, None), 50).mean;
        let band = m.noise_band(50, 0.05);
        let mut rng = ChaCha20Rng::seed_from_u64(31);
        let (cov, half) = bands::coverage(2000, || {
            let noisy = m.post_process(&m.lattice().release(&lifted, Some(&mut rng)), 50).mean;
            noisy.iter().zip(&exact).zip(&band).map(|((a, b), w)| (a - b).abs() / w).fold(0.0, f64::max)
        });
        eprintln!("mean-curve noise band {kernel:?} δ = {delta}: coverage {cov}, 20 %-narrower control {half}");
        assert!(cov >= 0.94, "{kernel:?} δ = {delta}: coverage {cov}");
        assert!(half < 0.94, "{kernel:?} δ = {delta}: a band 20 % narrower covers {half}");
    }
}
