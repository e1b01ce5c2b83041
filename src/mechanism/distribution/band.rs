//! The threshold of a CDF release's simultaneous band: the (1 − α) quantile of
//! `max_j max(|e_j|, |e_L − e_j|)`, the supremum of the least-squares prefix-count noise of a tree
//! (`release`'s module docs), simulated from the public seed with the levels' noise laws and cached
//! (in memory and beside the catalog) by the tree's shape, the laws and α — public parameters only.
//!
//! Each draw fills every level's noise in a buffer kept across draws, level by level from the root
//! and node by node, with the level's scale computed once per simulation rather than per node:
//! the same values, in the same order, as drawing each node's scale afresh.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use rand::rngs::ChaCha20Rng;

use super::tree::TreeShape;
use crate::mechanism::noise::bands::{SIMULATION_DRAWS, simulated_quantile, standard_laplace};
use crate::mechanism::noise::cache::stored_quantile;

/// Node draws one simulation may take (the draws are `NODE_DRAWS / nodes`, in [500, 4 000]).
const NODE_DRAWS: usize = 8_000_000;

/// The law of one level's noise, as the band simulates it (continuous, with the variance of the
/// discrete law the release samples).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NoiseLaw {
    /// Laplace with this variance.
    Laplace(f64),
    /// Gaussian with this variance.
    Gaussian(f64),
}

impl NoiseLaw {
    /// The variance.
    pub fn variance(self) -> f64 {
        match self {
            NoiseLaw::Laplace(v) | NoiseLaw::Gaussian(v) => v,
        }
    }

    /// Its kind and variance's bits (the in-memory cache's key).
    fn bits(self) -> (bool, u64) {
        (matches!(self, NoiseLaw::Laplace(_)), self.variance().to_bits())
    }

    /// The factor of a standard draw (a standard Laplace has variance 2).
    fn scale(self) -> f64 {
        match self {
            NoiseLaw::Laplace(v) => (v / 2.0).sqrt(),
            NoiseLaw::Gaussian(v) => v.sqrt(),
        }
    }

    /// Fills `out` with draws of the law, `scale` its [`Self::scale`].
    fn fill(self, scale: f64, rng: &mut ChaCha20Rng, out: &mut [f64]) {
        match self {
            NoiseLaw::Laplace(_) => out.iter_mut().for_each(|v| *v = standard_laplace(rng) * scale),
            NoiseLaw::Gaussian(_) => out.iter_mut().for_each(|v| {
                let z: f64 = rand_distr::Distribution::sample(&rand_distr::StandardNormal, rng);
                *v = z * scale;
            }),
        }
    }
}

/// The band threshold, in counts, for the tree `shape` with noise `root` on the root and `level`
/// on every level below it, at level `alpha` (cached).
pub fn band_quantile(shape: &TreeShape, root: NoiseLaw, level: NoiseLaw, alpha: f64) -> f64 {
    type Memo = (Vec<usize>, (bool, u64), (bool, u64), u64);
    static CACHE: LazyLock<Mutex<HashMap<Memo, f64>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
    let memo: Memo = (shape.factors().to_vec(), root.bits(), level.bits(), alpha.to_bits());
    if let Some(q) = CACHE.lock().expect("cdf band cache").get(&memo) {
        return *q;
    }
    let key = (shape.factors(), root, level, alpha.to_bits());
    let q = stored_quantile("cdf-tree-band", &key, || simulate(shape, root, level, alpha));
    let mut cache = CACHE.lock().expect("cdf band cache");
    if cache.len() >= 256 {
        cache.clear();
    }
    cache.insert(memo, q);
    q
}

/// The simulation behind [`band_quantile`] (uncached). One standard error of the simulated tail
/// probability is added to the level, so the simulation's own error makes the band wider, not
/// narrower.
fn simulate(shape: &TreeShape, root: NoiseLaw, level: NoiseLaw, alpha: f64) -> f64 {
    let sizes = shape.level_sizes();
    let nodes: usize = sizes.iter().sum();
    let draws = (NODE_DRAWS / nodes).clamp(500, SIMULATION_DRAWS);
    let laws: Vec<NoiseLaw> = (0..sizes.len()).map(|l| if l == 0 { root } else { level }).collect();
    let variance: Vec<f64> = laws.iter().map(|l| l.variance()).collect();
    let scales: Vec<f64> = laws.iter().map(|l| l.scale()).collect();
    let conservative = alpha - (alpha * (1.0 - alpha) / draws as f64).sqrt();
    let mut y: Vec<Vec<f64>> = sizes.iter().map(|&s| vec![0.0; s]).collect();
    simulated_quantile(conservative.max(alpha / 2.0), draws, |rng| {
        for ((row, law), scale) in y.iter_mut().zip(&laws).zip(&scales) {
            law.fill(*scale, rng, row);
        }
        prefix_sup(&shape.estimate_leaves(&y, &variance))
    })
}

/// `max_j max(|e_j|, |e_L − e_j|)` over the prefix sums `e_j` of `leaves`.
fn prefix_sup(leaves: &[f64]) -> f64 {
    let total: f64 = leaves.iter().sum();
    let mut running = 0.0f64;
    let mut sup = total.abs();
    for c in leaves {
        running += c;
        sup = sup.max(running.abs()).max((total - running).abs());
    }
    sup
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The simulation as first written: every node's scale computed afresh from its law, every
    /// level collected into a new vector.
    fn node_at_a_time(shape: &TreeShape, root: NoiseLaw, level: NoiseLaw, alpha: f64, reversed: bool) -> f64 {
        let sizes = shape.level_sizes();
        let nodes: usize = sizes.iter().sum();
        let draws = (NODE_DRAWS / nodes).clamp(500, SIMULATION_DRAWS);
        let mut variance = vec![root.variance()];
        variance.extend(std::iter::repeat_n(level.variance(), shape.levels()));
        let conservative = alpha - (alpha * (1.0 - alpha) / draws as f64).sqrt();
        simulated_quantile(conservative.max(alpha / 2.0), draws, |rng| {
            // The control (`reversed`): the deepest level drawn first.
            let mut order: Vec<usize> = (0..sizes.len()).collect();
            if reversed {
                order.reverse();
            }
            let mut y: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
            for l in order {
                let law = if l == 0 { root } else { level };
                y[l] = (0..sizes[l])
                    .map(|_| match law {
                        NoiseLaw::Laplace(v) => standard_laplace(rng) * (v / 2.0).sqrt(),
                        NoiseLaw::Gaussian(v) => {
                            let z: f64 = rand_distr::Distribution::sample(&rand_distr::StandardNormal, rng);
                            z * v.sqrt()
                        }
                    })
                    .collect();
            }
            prefix_sup(&shape.estimate_leaves(&y, &variance))
        })
    }

    #[test]
    fn the_buffered_simulation_gives_the_node_at_a_time_quantile_to_the_bit() {
        let cases = [
            (3, NoiseLaw::Laplace(88.9), NoiseLaw::Laplace(2.78), 0.05),
            (6, NoiseLaw::Laplace(889.2), NoiseLaw::Laplace(110.7), 0.05),
            (5, NoiseLaw::Gaussian(411.0), NoiseLaw::Gaussian(145.0), 0.1),
            (8, NoiseLaw::Gaussian(37.0), NoiseLaw::Gaussian(19.0), 0.01),
        ];
        for (k, root, level, alpha) in cases {
            let shape = TreeShape::for_leaves_log2(k);
            let reference = node_at_a_time(&shape, root, level, alpha, false);
            assert_eq!(simulate(&shape, root, level, alpha).to_bits(), reference.to_bits(), "k = {k}, {root:?}");
            // The comparison sees the levels drawn in another order.
            assert_ne!(node_at_a_time(&shape, root, level, alpha, true).to_bits(), reference.to_bits(), "k = {k}");
        }
    }

    #[test]
    fn the_laws_are_part_of_the_key() {
        // Same variances, different laws: different thresholds (the cache must not mix them).
        let shape = TreeShape::for_leaves_log2(4);
        let laplace = band_quantile(&shape, NoiseLaw::Laplace(50.0), NoiseLaw::Laplace(9.0), 0.05);
        let gaussian = band_quantile(&shape, NoiseLaw::Gaussian(50.0), NoiseLaw::Gaussian(9.0), 0.05);
        assert_ne!(laplace.to_bits(), gaussian.to_bits());
        assert_eq!(
            laplace.to_bits(),
            simulate(&shape, NoiseLaw::Laplace(50.0), NoiseLaw::Laplace(9.0), 0.05).to_bits()
        );
    }
}
