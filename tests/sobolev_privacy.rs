//! Privacy checks of the Sobolev-space KDE release (`private_kde(…, space => 'sobolev')`, Hall
//! et al. §4.2) through its real code path (SPEC §1, §6): its calibration against the H¹
//! sensitivity, the neighbour difference of the whitened coordinates against it, the released
//! noise's exponential (Ornstein–Uhlenbeck) covariance, and an empirical ε audit — each with a
//! negative control showing it would catch a mistake.

mod common;

use dpcurve::datagen::mixture;
use dpcurve::mechanism::density::sobolev::h1_sensitivity;
use dpcurve::mechanism::noise::double_double::DD;
use dpcurve::mechanism::{Calibration, Contribution, Grid, KdeMechanism, KdeSpec, Normalise};
use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;

fn spec(grid: Grid, bandwidth: f64, epsilon: f64, delta: f64) -> KdeSpec {
    KdeSpec { grid, bandwidth, epsilon, delta, calibration: Calibration::Analytic, normalise: Normalise::Project }
}

fn sobolev(grid: Grid, h: f64, epsilon: f64, delta: f64) -> KdeMechanism {
    KdeMechanism::sobolev(spec(grid, h, epsilon, delta), Contribution::ROW).unwrap()
}

fn state_of(m: &KdeMechanism, values: &[f64]) -> Vec<i128> {
    let mut st = m.layout().empty_state();
    m.layout().add_all(&mut st, values);
    st
}

fn l2_diff(a: &[DD], b: &[DD]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x.sub(*y).to_f64().powi(2)).sum::<f64>().sqrt()
}

#[test]
fn calibration_is_the_gaussian_release_with_the_h1_sensitivity() {
    let grid = Grid { lo: 0.0, hi: 1.0, points: 256 };
    for (eps, delta) in [(1.0, 1e-6), (0.3, 1e-9), (4.0, 1e-5)] {
        let s = sobolev(grid, 0.04, eps, delta);
        let g = KdeMechanism::new(spec(grid, 0.04, eps, delta)).unwrap();
        // Same (ε, δ) → same noise per unit of sensitivity; the sensitivity is Δ_H ≈ 1.153
        // instead of the Gaussian RKHS's ≈ 1.
        let want = g.sigma() / g.stat_sensitivity() * h1_sensitivity();
        assert!((s.sigma() / want - 1.0).abs() < 1e-6, "ε = {eps}: σ = {} vs {want}", s.sigma());
        assert!((h1_sensitivity() - (0.75 * std::f64::consts::PI.sqrt()).sqrt()).abs() < 1e-15);
        // Negative control: calibrating with the Gaussian RKHS's sensitivity would be too little.
        assert!(s.sigma() > 1.15 * g.sigma(), "σ = {} not above 1.15 × {}", s.sigma(), g.sigma());
    }
    // The reference value at (1, 1e-6): the Gaussian release's σ = 4.5309 (tests/kde_privacy.rs)
    // times Δ_H.
    let s = sobolev(grid, 0.04, 1.0, 1e-6);
    assert!((s.sigma() - 4.5309 * h1_sensitivity()).abs() < 2e-3 * s.sigma(), "σ = {}", s.sigma());
    // δ = 0 has no Gaussian process to add.
    assert!(KdeMechanism::sobolev(spec(grid, 0.04, 1.0, 0.0), Contribution::ROW).is_err());
}

#[test]
fn whitened_neighbour_differences_stay_within_the_h1_sensitivity() {
    for (grid, h) in [
        (Grid { lo: 0.0, hi: 1.0, points: 256 }, 0.04),
        (Grid { lo: -0.5, hi: 1.5, points: 2048 }, 0.05),
        (Grid { lo: 0.0, hi: 1.0, points: 101 }, 0.3),
        (Grid { lo: 0.0, hi: 1.0, points: 64 }, 0.005),
    ] {
        let m = sobolev(grid, h, 1.0, 1e-6);
        let d0 = state_of(&m, &mixture(2_000, 3));
        let w0 = m.lifted(&d0);
        let r0 = m.lattice().round(&w0);
        let dt = grid.step();
        let mut points = vec![
            grid.lo,
            grid.hi,
            grid.at(grid.points / 2),
            grid.at(7) + 0.5 * dt,
            grid.lo + h / 32.0,
            grid.lo - 3.0 * h,
            grid.hi + 7.9 * h,
            grid.hi + 8.2 * h,
            1e300,
            f64::NAN,
        ];
        points.extend((0..40).map(|i| grid.lo - 2.0 * h + i as f64 * (grid.hi - grid.lo + 4.0 * h) / 39.0));
        let mut worst = 0.0f64;
        for x in points {
            let mut d1 = d0.clone();
            m.layout().add(&mut d1, x);
            let w1 = m.lifted(&d1);
            let norm = l2_diff(&w1, &w0);
            worst = worst.max(norm);
            assert!(norm <= m.stat_sensitivity(), "h = {h}, x = {x}: ‖Δw‖ = {norm} > {}", m.stat_sensitivity());
            let r1 = m.lattice().round(&w1);
            let rounded = r1.iter().zip(&r0).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
            assert!(rounded * m.lattice().gamma() <= m.lattice().sensitivity(), "h = {h}, x = {x}: rounded {rounded}");
        }
        // Not vacuous where the grid resolves the bump: an interior point comes close to Δ_H.
        if grid.step() < h / 4.0 {
            assert!(worst > 0.95 * m.stat_sensitivity(), "h = {h}: worst ‖Δw‖ only {worst}");
        }
        // Negative control: a row counted twice is caught.
        let mut d2 = d0.clone();
        m.layout().add_all(&mut d2, &[grid.at(grid.points / 2); 2]);
        assert!(l2_diff(&m.lifted(&d2), &w0) > m.stat_sensitivity(), "h = {h}: double count not detected");
    }
}

#[test]
fn released_noise_has_the_exponential_covariance_and_is_rougher_than_the_gaussian_release() {
    let grid = Grid { lo: 0.0, hi: 1.0, points: 200 };
    let h = 0.05;
    let m = sobolev(grid, h, 1.0, 1e-6);
    let g = KdeMechanism::new(spec(grid, h, 1.0, 1e-6)).unwrap();
    let sigma = m.sigma();
    let st = state_of(&m, &mixture(500, 13));
    let rounded = m.lattice().round(&m.lifted(&st));
    let exact = m.curve_from_lifted(&m.lattice().to_real(&rounded));
    let mut rng = ChaCha20Rng::seed_from_u64(0x50b0);
    let n = 20_000;
    let pairs = [(0usize, 0usize), (100, 100), (100, 101), (100, 105), (40, 52), (199, 199)];
    let mut sums = [0.0; 6];
    let (mut rough_s, mut rough_g) = (0.0, 0.0);
    let g_rounded = g.lattice().round(&g.lifted(&st));
    let g_exact = g.curve_from_lifted(&g.lattice().to_real(&g_rounded));
    for i in 0..n {
        let z = m.lattice().noise(&mut rng);
        let k: Vec<i128> = rounded.iter().zip(&z).map(|(a, b)| a + b).collect();
        let e: Vec<f64> =
            m.curve_from_lifted(&m.lattice().to_real(&k)).iter().zip(&exact).map(|(y, s)| y - s).collect();
        for (s, &(a, b)) in sums.iter_mut().zip(&pairs) {
            *s += e[a] * e[b];
        }
        if i < 2_000 {
            // Mean squared increment of the noise between neighbours, per unit variance.
            rough_s += e.windows(2).map(|w| (w[1] - w[0]).powi(2)).sum::<f64>() / (sigma * sigma);
            let zg = g.lattice().noise(&mut rng);
            let kg: Vec<i128> = g_rounded.iter().zip(&zg).map(|(a, b)| a + b).collect();
            let eg: Vec<f64> =
                g.curve_from_lifted(&g.lattice().to_real(&kg)).iter().zip(&g_exact).map(|(y, s)| y - s).collect();
            rough_g += eg.windows(2).map(|w| (w[1] - w[0]).powi(2)).sum::<f64>() / (g.sigma() * g.sigma());
        }
    }
    let nf = n as f64;
    let se = (2.0 / nf).sqrt() * sigma * sigma;
    for (s, &(a, b)) in sums.iter().zip(&pairs) {
        let want = sigma * sigma * (-(grid.at(a) - grid.at(b)).abs() / h).exp();
        let got = s / nf;
        assert!((got - want).abs() < 5.0 * se, "cov[{a},{b}] {got} vs {want}");
        if a == b {
            // Negative control: σ/√2 halves the variance; 5 SE must reject it.
            assert!((got / 2.0 - want).abs() > 5.0 * se, "σ/√2 not detected at {a}");
        }
    }
    // Hall's Figure 2: the exponential kernel's path is far rougher. Per unit variance the
    // mean squared neighbour increment is 2(1 − e^{−step/h}) ≈ 0.19 here against ≈ 0.01 for
    // the Gaussian-kernel release (measured: 0.192 and 0.0101).
    let per = 2_000.0 * (grid.points - 1) as f64;
    let (rs, rg) = (rough_s / per, rough_g / per);
    let want_s = 2.0 * (1.0 - (-grid.step() / h).exp());
    assert!((rs / want_s - 1.0).abs() < 0.05, "Sobolev increments {rs} vs {want_s}");
    assert!(rs > 10.0 * rg, "Sobolev {rs} not much rougher than Gaussian {rg}");
}

/// The optimal test between D and D ∪ {x} on the released whitened coordinates (iid noise:
/// project on the mean difference); μ̂ − 3·SE gives a lower bound on ε at the claimed δ.
fn audit(noise_scale: f64, seed: u64) -> (f64, f64, f64) {
    let grid = Grid { lo: 0.0, hi: 1.0, points: 128 };
    let (eps, delta) = (1.0, 1e-5);
    let m = sobolev(grid, 0.05, eps, delta);
    let d0 = state_of(&m, &mixture(300, 14));
    let mut d1 = d0.clone();
    m.layout().add(&mut d1, grid.at(64) + 0.41 * grid.step());
    let lat = m.lattice();
    let (r0, r1) = (lat.round(&m.lifted(&d0)), lat.round(&m.lifted(&d1)));
    let (eps_lb, mu) = common::projection_audit(lat, &r0, &r1, noise_scale, seed, 20_000, delta);
    (eps_lb, mu, m.stat_sensitivity() / m.sigma())
}

#[test]
fn empirical_audit_stays_below_the_claim_and_detects_noise_scaled_by_one_over_root_two() {
    let (eps_lb, mu, claimed) = audit(1.0, 301);
    assert!(eps_lb <= 1.0, "ε lower bound {eps_lb} exceeds the claim (μ̂ = {mu}, claimed {claimed})");
    assert!(mu > 0.8 * claimed, "μ̂ = {mu} far below {claimed}: the audit is not sensitive");
    let (eps_lb, mu, _) = audit(std::f64::consts::FRAC_1_SQRT_2, 302);
    assert!(eps_lb > 1.0, "σ/√2 not detected: ε lower bound {eps_lb} (μ̂ = {mu})");
}
