//! Samples a centred Gaussian process with the Gaussian kernel on a regular grid (SPEC §1).
//!
//! Every sample `z` this module returns has covariance ⪰ `K_grid + GUARANTEED_NUGGET·I`
//! (unit scale; the caller multiplies by σ), where `K_grid[k,l] = exp(−((k−l)·s)²/2)` and
//! `s = step/h`. Two samplers:
//!
//! * **circulant embedding** (Dietrich & Newsam 1997; Wood & Chan 1994), O(m log m) per
//!   sample. The Toeplitz `K_grid` is embedded in a circulant of size m, padded until the
//!   kernel has decayed below 1e-17 at the wrap-around point (half-length ≥ 9h), so the
//!   embedding is positive semidefinite up to round-off. Round-off negatives of its
//!   spectrum are clipped to 0 — that only adds noise — and the spectrum is never
//!   rescaled down.
//! * **Cholesky** of `K_grid + NUGGET·I`, the fallback when the embedding would be too
//!   large (very wide kernels on long grids).
//!
//! Independent white noise of variance [`NUGGET`] is always added on top (circulant) or
//! built in (Cholesky). It is post-processing-safe extra noise that makes the covariance
//! full rank, so numerical error in the released curve's high-frequency directions is
//! covered (SPEC §1 numerics).

use std::fmt;
use std::sync::Arc;

use nalgebra::{DMatrix, DVector};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rustfft::{Fft, FftPlanner, num_complex::Complex};

/// White-noise variance added to every grid point, relative to K(0) = 1.
/// SPEC §1: τ ≥ 1e-9; 1e-6 costs at most 0.1 % extra noise standard deviation.
pub const NUGGET: f64 = 1e-6;
/// What the samplers guarantee after allowing for round-off: covariance ⪰ K + this·I.
pub const GUARANTEED_NUGGET: f64 = 0.5e-6;
/// Largest circulant embedding used (2^22 complex points, ~64 MiB of work space).
pub const MAX_EMBEDDING: usize = 1 << 22;
/// Largest grid for the dense Cholesky fallback.
pub const MAX_CHOLESKY_POINTS: usize = 2048;
/// The embedding's half-length must reach this many bandwidths (K(9h) ≈ 2.6e-18).
const EMBEDDING_REACH: f64 = 9.0;

/// Why noise cannot be generated for a (grid, bandwidth) pair (public values only).
#[derive(Debug, Clone, PartialEq)]
pub struct GpPlanError {
    points: usize,
    step_over_h: f64,
}

impl fmt::Display for GpPlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the bandwidth is too wide for a grid of {} points: noise on this grid would need a \
             circulant embedding of more than {MAX_EMBEDDING} points and the dense fallback \
             allows at most {MAX_CHOLESKY_POINTS} points; use fewer points or a smaller \
             bandwidth (grid step / bandwidth = {:.3e})",
            self.points, self.step_over_h
        )
    }
}

impl std::error::Error for GpPlanError {}

/// A ready-to-use sampler of `N(0, K_grid + NUGGET·I)`-dominating noise.
#[derive(Clone)]
pub struct GpSampler {
    points: usize,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Circulant { sqrt_eig: Vec<f64>, fft: Arc<dyn Fft<f64>> },
    Cholesky { l: DMatrix<f64> },
}

impl fmt::Debug for GpSampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Circulant { sqrt_eig, .. } => format!("circulant(m = {})", sqrt_eig.len()),
            Kind::Cholesky { .. } => "cholesky".to_string(),
        };
        write!(f, "GpSampler {{ points: {}, {kind} }}", self.points)
    }
}

/// Size of the circulant embedding for `points` grid points with `s = step/h`,
/// or None if it would exceed [`MAX_EMBEDDING`].
pub fn embedding_size(points: usize, step_over_h: f64) -> Option<usize> {
    let reach_steps = (EMBEDDING_REACH / step_over_h).ceil();
    let half = reach_steps.max((points - 1) as f64).max(1.0);
    if 2.0 * half > MAX_EMBEDDING as f64 {
        return None;
    }
    Some(((2.0 * half) as usize).next_power_of_two())
}

/// Checks, from public parameters only, that noise can be generated.
pub fn check_plan(points: usize, step_over_h: f64) -> Result<(), GpPlanError> {
    if embedding_size(points, step_over_h).is_some() || points <= MAX_CHOLESKY_POINTS {
        Ok(())
    } else {
        Err(GpPlanError { points, step_over_h })
    }
}

fn kernel_at_lag(lag: usize, step_over_h: f64) -> f64 {
    let z = lag as f64 * step_over_h;
    (-0.5 * z * z).exp()
}

impl GpSampler {
    /// Builds a sampler for a grid of `points` points with `step_over_h` = grid step / h.
    pub fn new(points: usize, step_over_h: f64) -> Result<Self, GpPlanError> {
        check_plan(points, step_over_h)?;
        if let Some(m) = embedding_size(points, step_over_h) {
            if let Some(s) = Self::circulant(points, step_over_h, m) {
                return Ok(s);
            }
        }
        if points <= MAX_CHOLESKY_POINTS {
            return Ok(Self::cholesky(points, step_over_h));
        }
        Err(GpPlanError { points, step_over_h })
    }

    /// The eigenvalues of the circulant embedding of size m (before clipping).
    pub fn circulant_spectrum(step_over_h: f64, m: usize) -> Vec<f64> {
        Self::spectrum_with(&*FftPlanner::new().plan_fft_forward(m), step_over_h, m)
    }

    fn spectrum_with(fft: &dyn Fft<f64>, step_over_h: f64, m: usize) -> Vec<f64> {
        let mut c: Vec<Complex<f64>> =
            (0..m).map(|k| Complex::new(kernel_at_lag(k.min(m - k), step_over_h), 0.0)).collect();
        fft.process(&mut c);
        c.iter().map(|z| z.re).collect()
    }

    fn circulant(points: usize, step_over_h: f64, m: usize) -> Option<Self> {
        // One forward plan serves both the spectrum and every sample.
        let fft = FftPlanner::new().plan_fft_forward(m);
        let eig = Self::spectrum_with(&*fft, step_over_h, m);
        let max = eig.iter().cloned().fold(f64::MIN, f64::max);
        let min = eig.iter().cloned().fold(f64::MAX, f64::min);
        // With the padding above, negatives are round-off (~1e-16·max). Anything larger
        // means the embedding is not PSD: use the dense fallback instead.
        if min < -1e-10 * max {
            return None;
        }
        let sqrt_eig = eig.iter().map(|&l| (l.max(0.0) / m as f64).sqrt()).collect();
        Some(GpSampler { points, kind: Kind::Circulant { sqrt_eig, fft } })
    }

    fn cholesky(points: usize, step_over_h: f64) -> Self {
        let k = DMatrix::from_fn(points, points, |i, j| {
            kernel_at_lag(i.abs_diff(j), step_over_h) + if i == j { NUGGET } else { 0.0 }
        });
        // K + 1e-6·I has smallest eigenvalue ≥ 1e-6 − O(points·1e-16): always PD.
        let l = k.cholesky().expect("K + nugget·I is positive definite").l();
        GpSampler { points, kind: Kind::Cholesky { l } }
    }

    /// Benchmarks only: the dense Cholesky sampler at any size (O(G³) to build).
    #[doc(hidden)]
    pub fn cholesky_for_benchmarks(points: usize, step_over_h: f64) -> Self {
        Self::cholesky(points, step_over_h)
    }

    /// Number of grid points.
    pub fn points(&self) -> usize {
        self.points
    }

    /// Whether the circulant embedding is used.
    pub fn is_circulant(&self) -> bool {
        matches!(self.kind, Kind::Circulant { .. })
    }

    /// Draws two independent samples (the circulant method produces them in pairs).
    pub fn sample_pair<R: Rng + ?Sized>(&self, rng: &mut R) -> (Vec<f64>, Vec<f64>) {
        let g = self.points;
        let white = |rng: &mut R| -> f64 {
            let z: f64 = StandardNormal.sample(rng);
            NUGGET.sqrt() * z
        };
        match &self.kind {
            Kind::Circulant { sqrt_eig, fft } => {
                let mut y: Vec<Complex<f64>> = sqrt_eig
                    .iter()
                    .map(|&s| {
                        let a: f64 = StandardNormal.sample(rng);
                        let b: f64 = StandardNormal.sample(rng);
                        Complex::new(s * a, s * b)
                    })
                    .collect();
                fft.process(&mut y);
                let a = y[..g].iter().map(|z| z.re + white(rng)).collect();
                let b = y[..g].iter().map(|z| z.im + white(rng)).collect();
                (a, b)
            }
            Kind::Cholesky { l } => {
                let mut draw = || {
                    let z = DVector::from_fn(g, |_, _| StandardNormal.sample(rng));
                    (l * z).iter().cloned().collect::<Vec<f64>>()
                };
                (draw(), draw())
            }
        }
    }

    /// Draws one sample.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<f64> {
        self.sample_pair(rng).0
    }

    /// The covariance this sampler actually realises at lags 0..points (circulant only):
    /// the inverse transform of the clipped spectrum plus the nugget at lag 0.
    /// Used by tests to prove `cov ⪰ K + GUARANTEED_NUGGET·I` without sampling.
    pub fn realised_covariance_row(&self) -> Option<Vec<f64>> {
        match &self.kind {
            Kind::Circulant { sqrt_eig, .. } => {
                let m = sqrt_eig.len();
                let mut c: Vec<Complex<f64>> = sqrt_eig.iter().map(|s| Complex::new(s * s, 0.0)).collect();
                FftPlanner::new().plan_fft_inverse(m).process(&mut c);
                let mut row: Vec<f64> = c[..self.points].iter().map(|z| z.re).collect();
                row[0] += NUGGET;
                Some(row)
            }
            Kind::Cholesky { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::ChaCha20Rng;

    /// Lower bound on the smallest eigenvalue of `Toeplitz(d)` (Gershgorin).
    fn toeplitz_min_eig_lower_bound(d: &[f64]) -> f64 {
        d[0] - 2.0 * d[1..].iter().map(|v| v.abs()).sum::<f64>()
    }

    #[test]
    fn circulant_covariance_dominates_kernel_plus_guaranteed_nugget() {
        // Narrow to very wide kernels relative to the grid (h/step from 0.5 to 40 000).
        for &(points, step_over_h) in
            &[(512, 2.0), (512, 0.1), (1024, 1.0 / 20.0), (4096, 1.0 / 400.0), (100, 1.0 / 40_000.0)]
        {
            let s = GpSampler::new(points, step_over_h).unwrap();
            assert!(s.is_circulant(), "{points} {step_over_h}");
            let row = s.realised_covariance_row().unwrap();
            let d: Vec<f64> = row
                .iter()
                .enumerate()
                .map(|(k, v)| v - kernel_at_lag(k, step_over_h) - if k == 0 { GUARANTEED_NUGGET } else { 0.0 })
                .collect();
            let bound = toeplitz_min_eig_lower_bound(&d);
            assert!(bound >= 0.0, "points={points} s={step_over_h}: min eig ≥ {bound}");
        }
    }

    /// Negative control for the deterministic check above: a spectrum that was rescaled
    /// down by 1 % (a variance-matching "fix") must be caught.
    #[test]
    fn dominance_check_catches_a_shrunken_spectrum() {
        let s = GpSampler::new(512, 0.1).unwrap();
        let row = s.realised_covariance_row().unwrap();
        let d: Vec<f64> = row
            .iter()
            .enumerate()
            .map(|(k, v)| 0.99 * (v - if k == 0 { NUGGET } else { 0.0 }) - kernel_at_lag(k, 0.1))
            .collect();
        assert!(toeplitz_min_eig_lower_bound(&d) < 0.0);
    }

    #[test]
    fn unpadded_embedding_fails_for_wide_kernels_and_padding_fixes_it() {
        // Minimal embedding 2(G−1) for h = 0.5·range: not PSD (notes §2.1).
        let points = 1024;
        let s = 1.0 / (0.5 * 1023.0);
        let eig = GpSampler::circulant_spectrum(s, 2 * (points - 1));
        let (max, min) = eig.iter().fold((f64::MIN, f64::MAX), |(a, b), &v| (a.max(v), b.min(v)));
        assert!(min < -1e-6 * max, "expected a clearly negative eigenvalue, got {min}");
        let m = embedding_size(points, s).unwrap();
        let eig = GpSampler::circulant_spectrum(s, m);
        let (max, min) = eig.iter().fold((f64::MIN, f64::MAX), |(a, b), &v| (a.max(v), b.min(v)));
        assert!(min > -1e-12 * max, "padded embedding still negative: {min}");
    }

    #[test]
    fn cholesky_fallback_and_impossible_plans() {
        // Too wide for the embedding but small enough for Cholesky.
        let s = GpSampler::new(1500, 1e-9).unwrap();
        assert!(!s.is_circulant());
        assert_eq!(s.sample(&mut ChaCha20Rng::seed_from_u64(1)).len(), 1500);
        assert!(check_plan(65_536, 1e-7).is_err());
        assert!(check_plan(65_536, 1e-3).is_ok());
    }

    /// Sampled covariance ≈ K + NUGGET·I at a few lags; with the 1/√2 negative control.
    #[test]
    fn sampled_covariance_matches_kernel() {
        for &(points, step_over_h) in &[(256usize, 0.05), (300, 0.2)] {
            let sampler = GpSampler::new(points, step_over_h).unwrap();
            let mut rng = ChaCha20Rng::seed_from_u64(20261121);
            let n = 20_000;
            let pairs = [(0usize, 0usize), (10, 10), (10, 11), (10, 15), (100, 120), (200, 200)];
            let mut sums = vec![0.0; pairs.len()];
            let mut means = [0.0; 2];
            for _ in 0..n / 2 {
                let (a, b) = sampler.sample_pair(&mut rng);
                for z in [&a, &b] {
                    for (s, &(i, j)) in sums.iter_mut().zip(&pairs) {
                        *s += z[i] * z[j];
                    }
                    means[0] += z[0];
                    means[1] += z[150];
                }
            }
            for m in means {
                // sd of a mean of n unit-variance draws is 1/√n; allow 5 SE.
                assert!((m / n as f64).abs() < 5.0 / (n as f64).sqrt(), "mean {m}");
            }
            for (s, &(i, j)) in sums.iter().zip(&pairs) {
                let want = kernel_at_lag(i.abs_diff(j), step_over_h) + if i == j { NUGGET } else { 0.0 };
                let got = s / n as f64;
                // SE of a product-moment estimate is ≤ sqrt((1 + ρ²)/n) ≤ sqrt(2/n).
                let se = (2.0 / n as f64).sqrt();
                assert!((got - want).abs() < 5.0 * se, "cov[{i},{j}] = {got}, want {want}");
                // Negative control: noise scaled by 1/√2 has half the covariance, which the
                // same tolerance must reject for every diagonal pair.
                if i == j {
                    assert!((got / 2.0 - want).abs() > 5.0 * se, "control not detected at {i}");
                }
            }
        }
    }
}
