//! Synthetic data for the demo, examples, benchmarks and tests (public, seeded; never
//! used for privacy noise).

use rand::{RngExt, SeedableRng};

/// `n` draws from the two-normal mixture of Hall et al. (2013), Fig. 1: means 0.3 and
/// 0.7, standard deviation 0.1, equal weights; deterministic for a seed.
pub fn mixture(n: usize, seed: u64) -> Vec<f64> {
    labelled_mixture(n, seed).into_iter().map(|(x, _)| x).collect()
}

/// The same draws as [`mixture`], each with the component it came from: `"left"` (mean 0.3)
/// or `"right"` (mean 0.7).
pub fn labelled_mixture(n: usize, seed: u64) -> Vec<(f64, &'static str)> {
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let z: f64 = rng.sample(rand_distr::StandardNormal);
            if rng.random::<bool>() { (0.3 + 0.1 * z, "left") } else { (0.7 + 0.1 * z, "right") }
        })
        .collect()
}

/// A response for each of `xs`: `0.5·sin(2πx)` plus N(0, 0.2²) noise, deterministic for a seed.
pub fn sine_response(xs: &[f64], seed: u64) -> Vec<f64> {
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(seed);
    xs.iter()
        .map(|x| {
            let z: f64 = rng.sample(rand_distr::StandardNormal);
            0.5 * (2.0 * std::f64::consts::PI * x).sin() + 0.2 * z
        })
        .collect()
}

/// The density of [`mixture`]'s distribution at `x`.
pub fn mixture_density(x: f64) -> f64 {
    let normal = |m: f64| (-0.5 * ((x - m) / 0.1).powi(2)).exp() / (0.1 * (2.0 * std::f64::consts::PI).sqrt());
    0.5 * normal(0.3) + 0.5 * normal(0.7)
}

/// Mirshani et al. (2019) §5's functional data: `X_i(t) = μ(t) + Σ_{j≤J} j^{-p/2}·U_ij·v_j(t)`
/// on `m` points of [0, 1], with `μ(t) = 0.1·sin(πt)`, `U_ij ~ Uniform(−0.4, 0.4)`, `p = 4`,
/// and `v_j` the eigenfunctions of the Gaussian kernel with ρ = 0.001 (J = 50 of them).
pub fn karhunen_loeve_curves(n: usize, m: usize, seed: u64) -> Vec<Vec<f64>> {
    use crate::mechanism::curves::mean_curve::{CovKernel, Eigenbasis};
    let basis = Eigenbasis::cached(CovKernel::Gaussian, 0.001, m);
    let terms = basis.vectors.len().min(50);
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let mut x = true_mean(m);
            for (j, v) in basis.vectors.iter().take(terms).enumerate() {
                let u: f64 = rng.random_range(-0.4..0.4);
                let w = ((j + 1) as f64).powf(-2.0) * u;
                for (xk, vk) in x.iter_mut().zip(v) {
                    *xk += w * vk;
                }
            }
            x
        })
        .collect()
}

/// The simulation's true mean `0.1·sin(πt)` on `m` points.
pub fn true_mean(m: usize) -> Vec<f64> {
    (0..m).map(|k| 0.1 * (std::f64::consts::PI * k as f64 / (m - 1) as f64).sin()).collect()
}
