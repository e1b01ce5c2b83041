//! Synthetic data for the demo, examples, benchmarks and tests (public, seeded; never
//! used for privacy noise).

use rand::{RngExt, SeedableRng};

/// `n` draws from the two-normal mixture of Hall et al. (2013), Fig. 1: means 0.3 and
/// 0.7, standard deviation 0.1, equal weights; deterministic for a seed.
pub fn mixture(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let z: f64 = rng.sample(rand_distr::StandardNormal);
            if rng.random::<bool>() { 0.3 + 0.1 * z } else { 0.7 + 0.1 * z }
        })
        .collect()
}
