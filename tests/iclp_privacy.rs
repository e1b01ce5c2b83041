//! The pure-ε ICLP releases (Lin & Reimherr §4.4): `private_kde(…, delta => 0, mechanism =>
//! 'iclp')` and `private_kernel_regression` / `_classifier` with `delta => 0`. Their noise is iid
//! discrete Laplace on the Gaussian releases' coordinates (a Laplace process with the kernel's
//! covariance), calibrated to an L1 sensitivity: checked here through the real code paths, with an
//! empirical pure-ε audit whose negative control is the likeliest bug — calibrating to the L2 bound.

mod common;

use dpcurve::mechanism::fits::kernel_fit::{FitLoss, FitSpec, KernelFitMechanism};
use dpcurve::mechanism::noise::double_double::DD;
use dpcurve::mechanism::{Calibration, Contribution, Grid, KdeMechanism, KdeSpec, Normalise};

fn kde(bandwidth: f64, epsilon: f64) -> KdeMechanism {
    let spec = KdeSpec {
        grid: Grid { lo: 0.0, hi: 1.0, points: 64 },
        bandwidth,
        epsilon,
        delta: 0.0,
        calibration: Calibration::Analytic,
        normalise: Normalise::Project,
    };
    KdeMechanism::iclp(spec, Contribution::ROW).unwrap()
}

fn l1(a: &[DD], b: &[DD]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x.sub(*y).to_f64().abs()).sum()
}

fn kde_state(m: &KdeMechanism, xs: &[f64]) -> Vec<i128> {
    let mut st = m.layout().empty_state();
    m.layout().add_all(&mut st, xs);
    st
}

/// One row moves the lifted coordinates by at most Δ₁ in L1 (anywhere, bins and between bins,
/// outside the range), the bound is ≥ 60 % attained, and the noise is Laplace with scale Δ₁/ε.
/// Control: the L1 change exceeds the L2 sensitivity the Gaussian release uses — calibrating the
/// Laplace noise to it would under-noise.
#[test]
fn kde_iclp_l1_sensitivity_holds_through_the_real_path() {
    for h in [0.02, 0.1, 0.4] {
        let m = kde(h, 1.0);
        assert!(m.is_iclp() && m.bands(&m.post_process(&vec![0.0; 64]), 0.05).is_none());
        let bound = m.iclp_l1_sensitivity();
        let base: Vec<f64> = dpcurve::datagen::mixture(500, 4);
        let w0 = m.lifted(&kde_state(&m, &base));
        let mut worst: f64 = 0.0;
        for i in 0..400 {
            let x = -0.1 + 1.2 * i as f64 / 399.0;
            let mut xs = base.clone();
            xs.push(x);
            let d = l1(&w0, &m.lifted(&kde_state(&m, &xs)));
            assert!(d <= bound * (1.0 + 1e-9), "h = {h}: row at {x} moved the coordinates by {d} > Δ₁ = {bound}");
            worst = worst.max(d);
        }
        assert!(worst > 0.6 * bound, "h = {h}: worst {worst} of Δ₁ = {bound}: the bound is loose");
        assert!(worst > 1.5 * m.stat_sensitivity(), "h = {h}: the L1 change {worst} exceeds the L2 bound");
        let b = bound / 1.0;
        assert!((m.sigma() / (std::f64::consts::SQRT_2 * b) - 1.0).abs() < 1e-6, "sd {} vs √2·{b}", m.sigma());
    }
}

#[test]
fn kde_iclp_audit_stays_below_the_claim_and_detects_l2_calibration() {
    let eps = 2.0;
    let m = kde(0.3, eps);
    let xs = dpcurve::datagen::mixture(300, 8);
    let mut ys = xs.clone();
    ys.push(0.5);
    let lat = m.lattice();
    let (r0, r1) = (lat.round(&m.lifted(&kde_state(&m, &xs))), lat.round(&m.lifted(&kde_state(&m, &ys))));
    let eps_lb = common::laplace_audit(lat, &r0, &r1, 1.0, 71, 40_000);
    assert!(eps_lb <= eps, "ε lower bound {eps_lb} exceeds the claim {eps}");
    assert!(eps_lb > 0.15 * eps, "the audit is too weak to mean anything: {eps_lb}");
    let l2_scale = m.stat_sensitivity() / m.iclp_l1_sensitivity();
    let eps_lb = common::laplace_audit(lat, &r0, &r1, l2_scale, 72, 40_000);
    assert!(eps_lb > eps, "Laplace noise calibrated to the L2 bound not detected: ε lower bound {eps_lb}");
}

fn fit(loss: FitLoss, bandwidth: f64, epsilon: f64) -> KernelFitMechanism {
    let spec = FitSpec {
        grid: Grid { lo: 0.0, hi: 1.0, points: 41 },
        bandwidth,
        penalty: 50.0,
        loss,
        y_range: (-1.0, 1.0),
        epsilon,
        delta: 0.0,
        calibration: Calibration::Analytic,
    };
    KernelFitMechanism::new(spec, Contribution::ROW).unwrap()
}

fn fit_state(m: &KernelFitMechanism, ys: &[f64], xs: &[f64]) -> Vec<i128> {
    let mut acc = m.accumulation();
    m.add_all(&mut acc, ys, xs);
    acc.totals().to_vec()
}

/// The pure-ε fit: noise sd √2·√D·Δ₂/ε, every added row within the L1 bound through the real
/// binning and solver; an empirical audit below ε, and the L2-calibration bug detected.
#[test]
fn kernel_fit_iclp_calibration_neighbours_and_audit() {
    let eps = 2.0;
    let m = fit(FitLoss::Hinge(0.1), 2.0, eps); // a wide kernel: few features carry the change
    let d = m.features().dim() as f64;
    let l1_bound = d.sqrt() * (m.row_sensitivity() + 2.0 * m.tolerance());
    assert!((m.sigma() / (std::f64::consts::SQRT_2 * l1_bound / eps) - 1.0).abs() < 1e-6);
    let empty = vec![0i128; m.state_len()];
    let w0 = m.solve(&empty).w;
    let mut worst: f64 = 0.0;
    for &(y, x) in &[(1.0, 0.0), (0.0, 1.0), (1.0, 0.5), (1.0, 7.0), (0.0, 0.31)] {
        let w1 = m.solve(&fit_state(&m, &[y], &[x])).w;
        let change = l1(&w0, &w1);
        assert!(change <= l1_bound, "row ({y}, {x}): {change} > {l1_bound}");
        worst = worst.max(change);
    }
    let lat = m.lattice();
    let (r0, r1) = (lat.round(&w0), lat.round(&m.solve(&fit_state(&m, &[1.0], &[0.5])).w));
    let eps_lb = common::laplace_audit(lat, &r0, &r1, 1.0, 81, 200_000);
    assert!(eps_lb <= eps, "ε lower bound {eps_lb} exceeds the claim {eps}");
    assert!(
        eps_lb > 0.1 * eps,
        "the audit is too weak to mean anything: {eps_lb} (worst L1 change {worst} of {l1_bound})"
    );
    let eps_lb = common::laplace_audit(lat, &r0, &r1, 1.0 / d.sqrt(), 82, 200_000);
    assert!(eps_lb > eps, "noise calibrated to the L2 bound not detected: ε lower bound {eps_lb}");
    // The regression's pure-ε mode too: the same L1 bound, a finite release.
    let r = fit(FitLoss::Huber(1.0), 0.1, 1.0);
    let (w, rel) = r.release(
        &fit_state(&r, &[0.5, -0.2], &[0.3, 0.6]),
        Some(&mut <rand::rngs::ChaCha20Rng as rand::SeedableRng>::seed_from_u64(3)),
    );
    assert!(w.iter().chain(&rel.fit).all(|v| v.is_finite()));
}
