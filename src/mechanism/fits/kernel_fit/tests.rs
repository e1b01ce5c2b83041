//! Tests of the parent module.

use super::*;

fn spec(loss: FitLoss) -> FitSpec {
    FitSpec {
        grid: Grid { lo: 0.0, hi: 1.0, points: 51 },
        bandwidth: 0.1,
        penalty: 10.0,
        loss,
        y_range: (-1.0, 1.0),
        epsilon: 1.0,
        delta: 1e-6,
        calibration: Calibration::Analytic,
    }
}

#[test]
fn features_approximate_the_gaussian_kernel_with_unit_norm() {
    let f = Features::new(0.0, 1.0, 0.1);
    assert!((f.kappa() - 1.0).abs() < 1e-9, "κ = {}", f.kappa());
    for (s, t) in [(0.0, 0.0), (0.0, 1.0), (0.3, 0.45), (0.9, 0.2), (0.5, 0.55)] {
        let k: f64 = f.eval(s).iter().zip(f.eval(t)).map(|(a, b)| a * b).sum();
        let exact = (-0.5 * ((s - t) / 0.1f64).powi(2)).exp();
        assert!((k - exact).abs() < 1e-12, "k({s}, {t}) = {k}, Gaussian {exact}");
    }
}

#[test]
fn the_hessian_from_fourier_sums_is_phi_q_phi() {
    let m = KernelFitMechanism::new(spec(FitLoss::Huber(1.0)), Contribution::ROW).unwrap();
    let q: Vec<f64> = (0..m.bins()).map(|b| ((b * 7) % 5) as f64).collect();
    let h = m.hessian(&q);
    let t = m.tables();
    let d = m.features().dim();
    for (a, c) in [(0, 0), (1, 3), (d - 1, 2), (d - 1, d - 1), (5, d / 2 + 3)] {
        let mut direct: f64 = (0..m.bins()).map(|b| q[b] * t.phi[b * d + a] * t.phi[b * d + c]).sum();
        if a == c {
            direct += 10.0;
        }
        assert!((h[(a, c)] - direct).abs() < 1e-9 * (1.0 + direct.abs()), "H[{a},{c}] {} vs {direct}", h[(a, c)]);
    }
}

#[test]
fn regression_recovers_a_smooth_function_and_certifies() {
    let m = KernelFitMechanism::new(spec(FitLoss::Huber(1.0)), Contribution::ROW).unwrap();
    let mut acc = m.accumulation();
    let n = 20_000;
    let xs: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) / n as f64).collect();
    let ys: Vec<f64> = xs.iter().map(|x| (6.0 * x).sin() * 0.8).collect();
    m.add_all(&mut acc, &ys, &xs);
    let s = m.solve(acc.totals());
    assert!(s.certified, "{s:?}");
    let w: Vec<f64> = s.w.iter().map(|v| v.to_f64()).collect();
    for x in [0.1, 0.3, 0.5, 0.7, 0.9] {
        let fit = m.eval(&w, x);
        assert!((fit - (6.0 * x).sin() * 0.8).abs() < 0.02, "f({x}) = {fit}");
    }
}

#[test]
fn classifier_separates_two_regions_and_certifies() {
    let m = KernelFitMechanism::new(spec(FitLoss::Hinge(0.1)), Contribution::ROW).unwrap();
    let mut acc = m.accumulation();
    let n = 4000;
    let xs: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) / n as f64).collect();
    let ys: Vec<f64> = xs.iter().map(|&x| if x > 0.6 { 1.0 } else { 0.0 }).collect();
    m.add_all(&mut acc, &ys, &xs);
    let s = m.solve(acc.totals());
    assert!(s.certified, "{s:?}");
    let w: Vec<f64> = s.w.iter().map(|v| v.to_f64()).collect();
    assert!(m.eval(&w, 0.2) < -0.5 && m.eval(&w, 0.9) > 0.5);
    assert!(m.eval(&w, 0.55) < 0.0 && m.eval(&w, 0.65) > 0.0);
}

#[test]
fn every_row_adds_one_unit_and_nan_drops_it() {
    for loss in [FitLoss::Huber(1.0), FitLoss::Hinge(0.1)] {
        let m = KernelFitMechanism::new(spec(loss), Contribution::ROW).unwrap();
        let mut acc = m.accumulation();
        let xs = [0.3, -5.0, f64::INFINITY, f64::NEG_INFINITY, 1.0, f64::NAN, 0.2, 0.77];
        let ys = [0.1, 9.0, -f64::INFINITY, 0.0, 1.0, 0.5, f64::NAN, -0.999];
        m.add_all(&mut acc, &ys, &xs);
        let mass: i128 = acc.totals().iter().sum();
        assert_eq!(mass, 6 << 40, "{loss}: six rows with a number in both values");
        assert!(acc.totals().iter().all(|&v| v >= 0));
    }
}
