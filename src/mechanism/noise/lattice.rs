//! Releases as post-processing of an exact discrete mechanism (SPEC §6).
//!
//! A mechanism computes its statistic in *lifted coordinates* `w` in which the noise is iid
//! (the whitened eigen-coefficients of a mean curve, the scaled Fourier coefficients of a
//! KDE's bin weights). This module then
//!
//! 1. rounds `w` to the lattice `γℤ` (`γ = 2^-g`, public),
//! 2. adds iid exact discrete Gaussian (zCDP) or discrete Laplace (pure ε) noise on that
//!    lattice with the samplers of [`crate::mechanism::noise::samplers`] — integers only, no floating point,
//! 3. hands back the noisy lattice vector as f64 values `k·γ` for post-processing.
//!
//! The sensitivity used for calibration is the mechanism's proven bound **plus** twice a
//! stated bound on the floating-point error of computing `w` (both neighbours are computed)
//! **plus** the rounding slack `γ·√dim` (L2) or `γ·dim` (L1). To make the floating-point
//! bound independent of the data, `w` is computed in double-double arithmetic ([`DD`],
//! ≈ 104 significant bits) from the exact fixed-point statistic: the error bound then holds
//! for every table of at most [`ROW_LIMIT`] rows (see README "Privacy").

use std::fmt;

use rand::Rng;

use crate::mechanism::noise::double_double::DD;
use crate::mechanism::noise::samplers::{DiscreteGaussian, MAX_DG_VARIANCE_LOG2, discrete_laplace};

/// The public row limit the floating-point error bounds assume: 2^53 rows in one release
/// (72 PB of float64 values). Statistics are exact integers far beyond it (i128 units).
pub const ROW_LIMIT: f64 = 9_007_199_254_740_992.0;
/// Rounding slack relative to the sensitivity: `γ·√dim ≤ 2^-SLACK_BITS·Δ` where possible.
const SLACK_BITS: i32 = 30;
/// The lattice spacing γ = 2^-g is kept within `2^±MAX_LATTICE_LOG2`, so γ, 1/γ and a lifted
/// coordinate scaled by 1/γ are ordinary finite doubles (no ∞, no NaN, no subnormal γ). A
/// sensitivity that would need a finer lattice is refused at planning.
pub const MAX_LATTICE_LOG2: i32 = 900;

/// A rational `num/den ≥ x` (den a power of two, num < 2^121), or None when x is not a
/// finite positive number below 2^120.
pub(crate) fn rational_at_least(x: f64) -> Option<(u128, u128)> {
    if !(x.is_finite() && x > 0.0 && x < 2f64.powi(120)) {
        return None;
    }
    if x >= 2f64.powi(52) {
        return Some((x.ceil() as u128, 1));
    }
    let den_log2 = (52 - x.max(1e-30).log2().floor() as i32).min(126);
    let den = 1u128 << den_log2;
    Some(((x * den as f64).ceil() as u128 + 1, den))
}

/// `sqrt(blocks)` rounded up (the L2 factor of `blocks` equal per-block bounds).
fn blocks_l2(blocks: u64) -> f64 {
    (blocks.max(1) as f64).sqrt() * (1.0 + f64::EPSILON)
}

/// Why no lattice mechanism fits the parameters (public values only).
#[derive(Debug, Clone, PartialEq)]
pub struct LatticeError(pub String);

impl fmt::Display for LatticeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LatticeError {}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Noise {
    /// iid `N_ℤ(0, S)` per coordinate, in lattice units.
    Gaussian(DiscreteGaussian),
    /// iid discrete Laplace with scale `num/den` lattice units.
    Laplace { num: u128, den: u128 },
}

/// An exact discrete mechanism on `γℤ^dim` for lifted coordinates `w`.
#[derive(Debug, Clone, PartialEq)]
pub struct LatticeMechanism {
    gamma_log2: i32,
    dim: usize,
    noise: Noise,
    sensitivity: f64,
}

impl LatticeMechanism {
    /// Discrete Gaussian noise for `dim` coordinates whose L2 sensitivity (proven bound plus
    /// floating-point slack) is `sensitivity`, satisfying ρ-zCDP (CKS20: for integer inputs
    /// `D_α ≤ α·Δ_L²/(2S)` per coordinate, additive over coordinates).
    pub fn gaussian(sensitivity: f64, dim: usize, rho: f64) -> Result<Self, LatticeError> {
        Self::gaussian_over(sensitivity, dim, rho, 1)
    }

    /// Discrete Gaussian noise for one release of `blocks` statistics (the groups a privacy
    /// unit reaches, SPEC §7) of `dim` coordinates each, where one unit moves each block by at
    /// most `sensitivity` in L2: each block's rounding slack is counted once per block, and
    /// the joint lattice sensitivity is `sqrt(blocks)·(sensitivity + rounding)`; ρ-zCDP for
    /// all blocks together (zCDP adds over the blocks' coordinates).
    pub fn gaussian_over(sensitivity: f64, dim: usize, rho: f64, blocks: u64) -> Result<Self, LatticeError> {
        let factor = blocks_l2(blocks);
        Self::build(sensitivity, dim, (dim as f64).sqrt(), factor, |delta_l| {
            // S ≥ Δ_L²/(2ρ), with a relative margin for the f64 evaluation.
            let need = delta_l * delta_l / (2.0 * rho) * (1.0 + 1e-12);
            if !(need.is_finite() && need < 2f64.powi(MAX_DG_VARIANCE_LOG2 as i32)) {
                return None;
            }
            DiscreteGaussian::at_least(need.ceil() as u128 + 1).map(Noise::Gaussian)
        })
    }

    /// Discrete Laplace noise with scale ≥ 1/ε on an integer statistic of sensitivity 1
    /// (a count): γ = 1, no rounding, the output is an integer. Pure ε-DP.
    pub fn integer_laplace(epsilon: f64) -> Result<Self, LatticeError> {
        Self::integer_laplace_over(epsilon, 1)
    }

    /// Discrete Laplace noise with scale ≥ `sensitivity/ε` on integer statistics whose L1
    /// sensitivity (over all the blocks of one release) is the integer `sensitivity`: pure ε-DP.
    pub fn integer_laplace_over(epsilon: f64, sensitivity: u64) -> Result<Self, LatticeError> {
        if sensitivity == 0 || sensitivity > 1 << 52 {
            return Err(LatticeError(format!("invalid count sensitivity {sensitivity}")));
        }
        let (num, den) = rational_at_least(sensitivity as f64 / epsilon * (1.0 + 1e-12))
            .ok_or_else(|| LatticeError(format!("epsilon {epsilon} is out of range for the count")))?;
        Ok(Self { gamma_log2: 0, dim: 1, noise: Noise::Laplace { num, den }, sensitivity: sensitivity as f64 })
    }

    /// Discrete Laplace noise for `dim` coordinates whose L1 sensitivity is `sensitivity`,
    /// satisfying pure `epsilon`-DP.
    pub fn laplace(sensitivity: f64, dim: usize, epsilon: f64) -> Result<Self, LatticeError> {
        Self::laplace_over(sensitivity, dim, epsilon, 1)
    }

    /// Discrete Laplace noise for one release of `blocks` statistics of `dim` coordinates each,
    /// one unit moving each block by at most `sensitivity` in L1: the joint L1 sensitivity is
    /// `blocks·(sensitivity + rounding)`; pure ε-DP for all blocks together.
    pub fn laplace_over(sensitivity: f64, dim: usize, epsilon: f64, blocks: u64) -> Result<Self, LatticeError> {
        Self::build(sensitivity, dim, dim as f64, blocks as f64, |delta_l| {
            let (num, den) = rational_at_least(delta_l / epsilon * (1.0 + 1e-12))?;
            Some(Noise::Laplace { num, den })
        })
    }

    /// Picks γ = 2^-g with slack `γ·spread ≤ 2^-30·Δ`, coarsening it when the noise would not
    /// fit the sampler's integer range (tiny ε), and builds the noise for the total
    /// sensitivity in lattice units.
    fn build(
        sensitivity: f64,
        dim: usize,
        spread: f64,
        blocks: f64,
        noise_for: impl Fn(f64) -> Option<Noise>,
    ) -> Result<Self, LatticeError> {
        if !(sensitivity.is_finite() && sensitivity > 0.0 && dim > 0 && (1.0..1e15).contains(&blocks)) {
            return Err(LatticeError(format!("invalid lattice mechanism: sensitivity {sensitivity}, dim {dim}")));
        }
        let g0 = (spread / sensitivity).log2().ceil() + SLACK_BITS as f64;
        if !(g0.is_finite() && g0.abs() <= MAX_LATTICE_LOG2 as f64) {
            return Err(LatticeError(format!(
                "the parameters give a sensitivity of {sensitivity:e} over {dim} coordinates, outside the range the \
                 exact lattice covers (its spacing must stay within 2^±{MAX_LATTICE_LOG2}): choose parameters that \
                 make one row's influence less extreme (a larger clip, loss scale or smaller penalty)"
            )));
        }
        let mut g = g0 as i32;
        for _ in 0..200 {
            if g.abs() > MAX_LATTICE_LOG2 {
                break;
            }
            let gamma = 2f64.powi(-g);
            // Rounding moves each coordinate by at most γ/2 (+ an f64 ulp of the fraction).
            // Per block; the blocks' factor (√blocks in L2, blocks in L1) applies to the sum.
            let total = blocks * (sensitivity + gamma * spread * (1.0 + 1e-9)) * (1.0 + 1e-12);
            if let Some(noise) = noise_for(total / gamma) {
                return Ok(Self { gamma_log2: -g, dim, noise, sensitivity: total });
            }
            g -= 1;
        }
        Err(LatticeError("the privacy parameters need more noise than the exact samplers support".into()))
    }

    /// The lattice spacing γ.
    pub fn gamma(&self) -> f64 {
        2f64.powi(self.gamma_log2)
    }

    /// Number of coordinates.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The sensitivity the noise is calibrated for (bound + float slack + rounding slack).
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }

    /// Standard deviation of one coordinate's noise, in real units (≈ σ; exact for the
    /// Laplace case: `√2·scale`).
    pub fn noise_sd(&self) -> f64 {
        match self.noise {
            Noise::Gaussian(dg) => (dg.variance() as f64).sqrt() * self.gamma(),
            Noise::Laplace { num, den } => std::f64::consts::SQRT_2 * num as f64 / den as f64 * self.gamma(),
        }
    }

    /// Rounds `w` to the lattice (integers in units of γ).
    pub fn round(&self, w: &[DD]) -> Vec<i128> {
        w.iter()
            .map(|v| {
                let v = v.scale_pow2(-self.gamma_log2);
                // Accepted parameters keep |w|/γ finite (γ within 2^±900 and statistics bounded
                // by public clamps); beyond i128 the cast saturates, a plain clamp (1-Lipschitz).
                debug_assert!(v.hi.is_finite(), "a non-finite lifted coordinate reached the lattice");
                let int = v.hi.round();
                let frac = (v.hi - int) + v.lo;
                (int as i128).saturating_add(frac.round() as i128)
            })
            .collect()
    }

    /// One noise draw (one coordinate), in lattice units.
    pub fn noise_coordinate<R: Rng + ?Sized>(&self, rng: &mut R) -> i128 {
        match self.noise {
            Noise::Gaussian(dg) => dg.sample(rng),
            Noise::Laplace { num, den } => discrete_laplace(rng, num, den),
        }
    }

    /// One noise draw per coordinate, in lattice units.
    pub fn noise<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<i128> {
        (0..self.dim).map(|_| self.noise_coordinate(rng)).collect()
    }

    /// The release: `round(w) + noise` on the lattice, as f64 values (post-processing starts
    /// here). `rng = None` is the test hook: no noise.
    pub fn release<R: Rng + ?Sized>(&self, w: &[DD], rng: Option<&mut R>) -> Vec<f64> {
        assert_eq!(w.len(), self.dim, "lifted coordinates of the wrong dimension");
        let mut k = self.round(w);
        if let Some(rng) = rng {
            for (v, z) in k.iter_mut().zip(self.noise(rng)) {
                *v = v.saturating_add(z);
            }
        }
        self.to_real(&k)
    }

    /// Lattice integers as real values `k·γ`.
    pub fn to_real(&self, k: &[i128]) -> Vec<f64> {
        let gamma = self.gamma();
        k.iter().map(|&v| v as f64 * gamma).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::ChaCha20Rng;
    #[test]
    fn a_sensitivity_beyond_the_lattice_range_is_refused_not_released_without_noise() {
        // 2^g used to overflow to ∞ below ≈ √dim·2^-994: lifted coordinates became 0 or ±MAX.
        for (sensitivity, dim) in [(1e-290, 5), (1e-300, 1), (1e-262, 512), (1e290, 1)] {
            let e = LatticeMechanism::gaussian(sensitivity, dim, 0.5).unwrap_err();
            assert!(e.to_string().contains("outside the range the exact lattice covers"), "{e}");
            assert!(LatticeMechanism::laplace(sensitivity, dim, 0.5).is_err());
        }
        // Just inside the range, the lattice is finite and a release is noisy.
        for (sensitivity, dim) in [(1e-250, 5), (1e250, 3)] {
            let lat = LatticeMechanism::gaussian(sensitivity, dim, 0.5).unwrap();
            assert!(lat.gamma() > 0.0 && lat.gamma().is_finite() && (1.0 / lat.gamma()).is_finite());
            let w = vec![DD::from_f64(sensitivity); dim];
            let mut rng = ChaCha20Rng::seed_from_u64(3);
            let a = lat.release(&w, Some(&mut rng));
            let b = lat.release(&w, Some(&mut rng));
            assert!(a.iter().all(|v| v.is_finite()));
            assert_ne!(a, b, "noise is drawn");
        }
    }

    #[test]
    fn rounding_moves_each_coordinate_by_at_most_half_a_step() {
        let m = LatticeMechanism::gaussian(1.0, 4, 0.05).unwrap();
        let gamma = m.gamma();
        let w = [DD::from_f64(0.3), DD { hi: 1e9, lo: 1e-8 }, DD::from_f64(-2.5 * gamma), DD::from_f64(0.0)];
        let r = m.round(&w);
        for (v, k) in w.iter().zip(&r) {
            let err = v.sub(DD::from_i128(*k).scale_pow2(m.gamma_log2)).to_f64().abs();
            assert!(err <= 0.5 * gamma * (1.0 + 1e-9), "{v:?} → {k}");
        }
        assert!(m.sensitivity() > 1.0 && m.sensitivity() < 1.0 + 1e-8);
    }

    #[test]
    fn calibrated_noise_has_the_requested_scale() {
        let rho = 0.02;
        let m = LatticeMechanism::gaussian(2.0, 3, rho).unwrap();
        let want = m.sensitivity() / (2.0 * rho).sqrt();
        // S is rounded up (to a multiple of t ≥ √S): at most a factor √2 in σ, never less.
        assert!(m.noise_sd() >= want && m.noise_sd() < want * 1.42, "{} vs {want}", m.noise_sd());
        let l = LatticeMechanism::laplace(2.0, 3, 0.5).unwrap();
        let b = l.sensitivity() / 0.5;
        assert!(
            l.noise_sd() >= std::f64::consts::SQRT_2 * b && l.noise_sd() < std::f64::consts::SQRT_2 * b * 1.000_001
        );
        // Tiny ε (ρ = 1e-26 ≈ ε = 1e-12) still fits, with a coarser lattice: the rounding
        // slack then costs up to 1 % (README "Privacy"); at ρ ≥ 1e-12 it is ≤ 2^-20.
        let tiny = LatticeMechanism::gaussian(1.0, 4096, 1e-26).unwrap();
        assert!(tiny.sensitivity() < 1.0 + 1e-2, "{}", tiny.sensitivity());
        let small = LatticeMechanism::gaussian(1.0, 4096, 1e-12).unwrap();
        assert!(small.sensitivity() < 1.0 + 2f64.powi(-20), "{}", small.sensitivity());
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let out = m.release(&[DD::from_f64(1.0); 3], Some(&mut rng));
        assert!(out.iter().all(|v| (v / m.gamma()).fract() == 0.0), "outputs lie on the lattice");
    }
}
