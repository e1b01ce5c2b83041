//! Simultaneous error bands: public thresholds for the supremum of a release's noise
//! over its grid, computed from the public parameters (σ, kernel, grid) alone — never from the
//! data — so a band is post-processing and costs nothing.
//!
//! The noise of a Gaussian release on its grid is a centred Gaussian vector `σ·s_k·Y_k` with
//! unit-variance `Y_k` whose neighbours have correlations `r_k`. For the level-α band we need
//! `u` with `P(max_k |Y_k| > u) ≤ α`; we take the smaller of two bounds, each valid alone:
//!
//! * **Efron's length bound** (Efron 1997, the discrete form of Rice's formula): for a standard
//!   bivariate normal pair with correlation `r = cos θ`, `P(Y_k ≤ u < Y_{k+1}) ≤ θ/(2π)·e^{−u²/2}`
//!   (checked numerically in the tests below), so
//!   `P(max_k |Y_k| > u) ≤ 2(1 − Φ(u)) + (Θ/π)·e^{−u²/2}` with `Θ = Σ_k arccos r_k`, the
//!   length of the normalised noise path. Tight for smooth processes (wide kernels).
//! * **Bonferroni** over the N grid points: `2N(1 − Φ(u))`. Tight for rough ones.
//!
//! The discrete Gaussian `N_ℤ(0, σ²)` the releases use is σ²-sub-Gaussian with variance ≤ σ²
//! (Canonne–Kamath–Steinke 2020), so the Gaussian bounds carry over; the coverage is measured
//! through the real samplers in the tests. A 2-D Gaussian field's threshold comes from the
//! expected Euler characteristic of its excursion set ([`gaussian_field_threshold`]). Pure-ε
//! (discrete Laplace) releases have no Gaussian structure: their threshold is the (1 − α)
//! quantile of the simulated supremum, from a fixed public seed (deterministic,
//! data-independent; callers cache it by the public parameters it depends on). Every band's
//! coverage, with a control that a band 20 % narrower under-covers, is measured in
//! `tests/band_coverage.rs`.

use std::f64::consts::{PI, SQRT_2};

use rand::rngs::ChaCha20Rng;
use rand::{Rng, SeedableRng};

use crate::mechanism::cpu::Kernel;

/// Default level of the bands: 95 % simultaneous coverage.
pub const DEFAULT_ALPHA: f64 = 0.05;
/// Draws of the simulated supremum for pure-ε bands.
pub const SIMULATION_DRAWS: usize = 4000;
/// The public seed of those simulations (a constant: the band is a function of public
/// parameters only and must be the same in every session).
const SIMULATION_SEED: u64 = 0x6470_6375_7276_6531;

/// `1 − Φ(u)`.
pub fn normal_upper_tail(u: f64) -> f64 {
    0.5 * libm::erfc(u / SQRT_2)
}

/// Upper bound on `P(max_k |Y_k| > u)` for `points` unit-variance jointly Gaussian values
/// whose consecutive correlations have total angle `theta = Σ arccos r_k`.
pub fn sup_tail_bound(u: f64, points: usize, theta: f64) -> f64 {
    let tail = normal_upper_tail(u);
    let efron = 2.0 * tail + theta / PI * (-0.5 * u * u).exp();
    let bonferroni = 2.0 * points as f64 * tail;
    efron.min(bonferroni)
}

/// The smallest `u` (to 1e-9) with [`sup_tail_bound`] ≤ `alpha`.
pub fn sup_threshold(alpha: f64, points: usize, theta: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 40.0f64);
    while hi - lo > 1e-9 {
        let mid = 0.5 * (lo + hi);
        if sup_tail_bound(mid, points, theta) <= alpha {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// `Σ_k arccos r_k` over consecutive correlations (clamped to [−1, 1]).
pub fn path_angle(correlations: impl IntoIterator<Item = f64>) -> f64 {
    correlations.into_iter().map(|r| r.clamp(-1.0, 1.0).acos()).sum()
}

/// Threshold for a stationary Gaussian process sampled at `points` points `step` apart whose
/// correlation at lag d is `exp(−d²/(2ℓ²))` (the KDE's noise: ℓ = h; its sampling error: ℓ = √2·h).
pub fn gaussian_kernel_threshold(alpha: f64, points: usize, step: f64, length_scale: f64) -> f64 {
    let z = step / length_scale;
    let r = (-0.5 * z * z).exp();
    sup_threshold(alpha, points, points.saturating_sub(1) as f64 * r.clamp(-1.0, 1.0).acos())
}

/// Pointwise standard deviations `s_k = sqrt(Σ_j a_j²·v_jk²)` and the path angle of the noise
/// `Σ_j a_j·ξ_j·v_j` (iid standard `ξ_j`) on the grid of the vectors `v_j`.
pub fn finite_rank_profile(amplitudes: &[f64], vectors: &[Vec<f64>]) -> (Vec<f64>, f64) {
    let m = vectors.first().map_or(0, Vec::len);
    let cov = |k: usize, l: usize| -> f64 { amplitudes.iter().zip(vectors).map(|(a, v)| a * a * v[k] * v[l]).sum() };
    let sd: Vec<f64> = (0..m).map(|k| cov(k, k).max(0.0).sqrt()).collect();
    let theta = path_angle((1..m).map(|k| {
        let d = sd[k - 1] * sd[k];
        if d > 0.0 { cov(k - 1, k) / d } else { 0.0 }
    }));
    (sd, theta)
}

/// The (1 − α) quantile of `max_k |Σ_j a_j·ℓ_j·v_jk| / s_k` for iid standard Laplace `ℓ_j`
/// (variance 2; `s` from [`finite_rank_profile`]), by simulation from a fixed public seed.
pub fn laplace_sup_quantile(alpha: f64, amplitudes: &[f64], vectors: &[Vec<f64>], sd: &[f64]) -> f64 {
    let mut path = vec![0.0; sd.len()];
    simulated_quantile(alpha, SIMULATION_DRAWS, |rng| {
        path.iter_mut().for_each(|p| *p = 0.0);
        for (a, v) in amplitudes.iter().zip(vectors) {
            let c = a * standard_laplace(rng);
            path.iter_mut().zip(v).for_each(|(p, vk)| *p += c * vk);
        }
        path.iter().zip(sd).filter(|(_, s)| **s > 0.0).map(|(p, s)| (p / s).abs()).fold(0.0, f64::max)
    })
}

/// A standard Laplace draw (variance 2) by inversion, for public simulations (not a release).
pub fn standard_laplace(rng: &mut ChaCha20Rng) -> f64 {
    let u = (rng.next_u64() >> 11) as f64 * 2f64.powi(-53) - 0.5;
    -u.signum() * (1.0 - 2.0 * u.abs()).max(f64::MIN_POSITIVE).ln()
}

/// The (1 − α) quantile of a simulated supremum: `draws` values of `sup(rng)` from the fixed
/// public seed, the ⌈(1 − α)(D + 1)⌉-th order statistic.
pub fn simulated_quantile(alpha: f64, draws: usize, mut sup: impl FnMut(&mut ChaCha20Rng) -> f64) -> f64 {
    let mut rng = ChaCha20Rng::seed_from_u64(SIMULATION_SEED);
    order_statistic(alpha, (0..draws).map(|_| sup(&mut rng)).collect())
}

/// The ⌈(1 − α)(D + 1)⌉-th smallest of D simulated suprema.
fn order_statistic(alpha: f64, mut sups: Vec<f64>) -> f64 {
    let draws = sups.len();
    sups.sort_by(f64::total_cmp);
    let rank = (((1.0 - alpha) * (draws + 1) as f64).ceil() as usize).clamp(1, draws);
    sups[rank - 1]
}

/// The noise of a linear map of iid standard Laplace coordinates at one point: weights on
/// the consecutive coordinates `first, first + 1, …`.
#[derive(Debug, Clone, PartialEq)]
pub struct Taps {
    /// The first coordinate.
    pub first: usize,
    /// The weights from there on.
    pub weights: Vec<f64>,
}

impl Taps {
    /// `sqrt(Σ w²)`: the sd of the point's noise per unit coordinate sd.
    pub fn norm(&self) -> f64 {
        self.weights.iter().map(|w| w * w).sum::<f64>().sqrt()
    }
}

/// The (1 − α) quantile of `max_k |Σ_i w_ki·ℓ_i| / s_k` for iid standard Laplace `ℓ_i` over
/// `nodes` coordinates, with banded weights `taps[k]` and `s_k = ‖taps[k]‖`, by simulation
/// from the fixed public seed. The number of draws keeps the work near 4·10⁸ weight products
/// (at least 500, at most [`SIMULATION_DRAWS`]).
pub fn laplace_sup_quantile_banded(alpha: f64, taps: &[Taps], nodes: usize) -> f64 {
    let work: usize = taps.iter().map(|t| t.weights.len()).sum::<usize>().max(1);
    banded_quantile(alpha, taps, nodes, (400_000_000 / work).clamp(500, SIMULATION_DRAWS))
}

/// Draws simulated together by [`banded_quantile`].
const BLOCK: usize = 16;

/// [`laplace_sup_quantile_banded`] over `draws` draws, simulated [`BLOCK`] at a time: their
/// coordinates are stored node by node, so the innermost loop runs across independent draws
/// (vectorised, no chain of dependent additions) while each draw's dot product is still summed
/// tap by tap in the same order, from the same coordinates drawn in the same order as one draw
/// at a time. The quantile is the same to the bit as [`simulated_quantile`] over single draws
/// (tested below), so every stored band stays valid.
fn banded_quantile(alpha: f64, taps: &[Taps], nodes: usize, draws: usize) -> f64 {
    banded_quantile_on(alpha, taps, nodes, draws, Kernel::detect())
}

/// [`banded_quantile`] with a chosen kernel (one [`Kernel::detect`] allows).
fn banded_quantile_on(alpha: f64, taps: &[Taps], nodes: usize, draws: usize, kernel: Kernel) -> f64 {
    let points: Vec<(&Taps, f64)> = taps.iter().map(|t| (t, t.norm())).filter(|(_, s)| *s > 0.0).collect();
    let mut rng = ChaCha20Rng::seed_from_u64(SIMULATION_SEED);
    let mut l = vec![[0.0; BLOCK]; nodes];
    let mut sups = Vec::with_capacity(draws);
    while sups.len() < draws {
        let block = BLOCK.min(draws - sups.len());
        for d in 0..block {
            l.iter_mut().for_each(|v| v[d] = standard_laplace(&mut rng));
        }
        sups.extend_from_slice(&block_sups(&points, &l, kernel)[..block]);
    }
    order_statistic(alpha, sups)
}

/// The suprema of one block of draws: `max_k |Σ_i w_ki·ℓ_i| / s_k` for each draw in `l`'s
/// lanes, the dot products summed tap by tap (no fused multiply-add, so every instruction set
/// gives the same bits).
fn block_sups(points: &[(&Taps, f64)], l: &[[f64; BLOCK]], kernel: Kernel) -> [f64; BLOCK] {
    match kernel {
        Kernel::Portable => block_sups_portable(points, l),
        // SAFETY: kernels are only chosen when the CPU has their features (`Kernel::detect`,
        // `Kernel::available`).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 | Kernel::Avx512 => unsafe { block_sups_avx2(points, l) },
    }
}

#[inline(always)]
fn block_sups_portable(points: &[(&Taps, f64)], l: &[[f64; BLOCK]]) -> [f64; BLOCK] {
    let mut sup = [0.0f64; BLOCK];
    for &(t, s) in points {
        let mut dot = [0.0f64; BLOCK];
        for (w, v) in t.weights.iter().zip(&l[t.first..]) {
            dot.iter_mut().zip(v).for_each(|(a, v)| *a += w * v);
        }
        sup.iter_mut().zip(dot).for_each(|(m, a)| *m = m.max((a / s).abs()));
    }
    sup
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_sups_avx2(points: &[(&Taps, f64)], l: &[[f64; BLOCK]]) -> [f64; BLOCK] {
    block_sups_portable(points, l)
}

/// The level-α threshold for the supremum of |Y| over a grid of a stationary, unit-variance
/// Gaussian field in two dimensions with correlation `exp(−dx²/2ℓx² − dy²/2ℓy²)`, sampled at
/// `points_x × points_y` points `step_x`, `step_y` apart: the smallest u (to 1e-9) with
/// `2·E χ(A_u) ≤ α`, the expected Euler characteristic of the excursion set by the Gaussian
/// kinematic formula (Adler & Taylor 2007, Thm 12.4.2, for a rectangle whose sides measure
/// `a = Θx`, `b = Θy` in the field's own metric):
/// `E χ = (1 − Φ(u)) + (a + b)·e^{−u²/2}/(2π) + a·b·u·e^{−u²/2}/(2π)^{3/2}`, with the discrete
/// path angles `Θ = (G − 1)·arccos r` in place of the lengths (≤ them: the grid's supremum is
/// at most the field's), or Bonferroni's `2N(1 − Φ(u))` if smaller. The formula approximates
/// the excursion probability with an exponentially small relative error at these levels; the
/// coverage test in `tests/band_coverage.rs` measures it through the real sampler.
pub fn gaussian_field_threshold(
    alpha: f64,
    (points_x, step_x, ell_x): (usize, f64, f64),
    (points_y, step_y, ell_y): (usize, f64, f64),
) -> f64 {
    let angle = |points: usize, step: f64, ell: f64| {
        let z = step / ell;
        points.saturating_sub(1) as f64 * (-0.5 * z * z).exp().clamp(-1.0, 1.0).acos()
    };
    let (a, b) = (angle(points_x, step_x, ell_x), angle(points_y, step_y, ell_y));
    let points = (points_x * points_y) as f64;
    let tail = |u: f64| {
        let q = normal_upper_tail(u);
        let e = (-0.5 * u * u).exp();
        let ec = q + (a + b) * e / (2.0 * PI) + a * b * u * e / (2.0 * PI).powf(1.5);
        (2.0 * ec).min(2.0 * points * q)
    };
    let (mut lo, mut hi) = (0.0f64, 40.0f64);
    while hi - lo > 1e-9 {
        let mid = 0.5 * (lo + hi);
        if tail(mid) <= alpha {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Width of the negative control of the coverage tests: a band this much narrower than the
/// real one must cover clearly less than the nominal level.
pub const NARROWER: f64 = 0.8;

/// Test helper: the share of `draws` samples of the sup-ratio `|noise|/band` that are ≤ 1
/// (coverage) and ≤ [`NARROWER`] (the negative control: a band 20 % narrower).
pub fn coverage(draws: usize, mut sup_ratio: impl FnMut() -> f64) -> (f64, f64) {
    let (mut covered, mut covered_narrow) = (0, 0);
    for _ in 0..draws {
        let r = sup_ratio();
        covered += (r <= 1.0) as usize;
        covered_narrow += (r <= NARROWER) as usize;
    }
    (covered as f64 / draws as f64, covered_narrow as f64 / draws as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `P(X ≤ u < Y)` for a standard bivariate normal pair with correlation r, by quadrature:
    /// `∫_u^∞ φ(y)·Φ((u − r·y)/sqrt(1 − r²)) dy`.
    fn crossing_probability(u: f64, r: f64) -> f64 {
        let s = (1.0 - r * r).sqrt();
        let n = 200_000;
        let top = u.max(0.0) + 12.0;
        let dy = (top - u) / n as f64;
        (0..n)
            .map(|i| {
                let y = u + (i as f64 + 0.5) * dy;
                let phi = (-0.5 * y * y).exp() / (2.0 * PI).sqrt();
                phi * (1.0 - normal_upper_tail((u - r * y) / s))
            })
            .sum::<f64>()
            * dy
    }

    #[test]
    fn the_crossing_inequality_holds_and_is_tight_at_zero() {
        for &r in &[-0.5, 0.0, 0.3, 0.7, 0.9, 0.99, 0.9999] {
            let theta = f64::acos(r);
            for &u in &[0.0, 0.5, 1.0, 2.0, 3.0, 4.0] {
                let p = crossing_probability(u, r);
                let bound = theta / (2.0 * PI) * (-0.5 * u * u).exp();
                assert!(p <= bound * (1.0 + 1e-6) + 1e-12, "r = {r}, u = {u}: {p} > {bound}");
                if u == 0.0 {
                    assert!((p - bound).abs() < 1e-6, "equality at u = 0: {p} vs {bound}");
                }
            }
        }
    }

    #[test]
    fn thresholds_match_closed_forms() {
        // One point: the two-sided normal quantile 1.95996.
        assert!((sup_threshold(0.05, 1, 0.0) - 1.959_964).abs() < 1e-5);
        // Independent points (θ = π/2 each): Bonferroni, 2N(1 − Φ(u)) = α.
        let u = sup_threshold(0.05, 100, 99.0 * PI / 2.0);
        assert!((2.0 * 100.0 * normal_upper_tail(u) - 0.05).abs() < 1e-9);
        // A very smooth path: Efron's bound, far below Bonferroni.
        let smooth = gaussian_kernel_threshold(0.05, 1000, 0.001, 0.2);
        assert!(smooth < 2.8 && smooth > 2.0, "{smooth}");
        assert!(smooth < sup_threshold(0.05, 1000, 1e9));
    }

    #[test]
    fn efron_threshold_covers_a_simulated_gaussian_process_and_half_does_not() {
        // Stationary process with correlation exp(−d²/2h²) on 200 points, h = 5 steps,
        // simulated exactly through its Cholesky factor.
        let (n, h) = (200usize, 5.0f64);
        let c = nalgebra::DMatrix::from_fn(n, n, |i, j| {
            let d = (i as f64 - j as f64) / h;
            (-0.5 * d * d).exp() + if i == j { 1e-9 } else { 0.0 }
        });
        let l = c.cholesky().unwrap().l();
        let u = gaussian_kernel_threshold(0.05, n, 1.0, h);
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        use rand_distr::{Distribution, StandardNormal};
        let draws = 4000;
        let (mut covered, mut covered_half) = (0, 0);
        for _ in 0..draws {
            let z = nalgebra::DVector::from_fn(n, |_, _| StandardNormal.sample(&mut rng));
            let sup = (&l * z).amax();
            covered += (sup <= u) as usize;
            covered_half += (sup <= u / 2.0) as usize;
        }
        let cov = covered as f64 / draws as f64;
        assert!((0.95..0.985).contains(&cov), "coverage {cov} (conservative, not absurdly so)");
        let half = covered_half as f64 / draws as f64;
        assert!(half < 0.5, "negative control: a band of u/2 covers {half}");
    }

    #[test]
    fn laplace_quantile_is_deterministic_and_above_the_gaussian_one() {
        let vectors: Vec<Vec<f64>> =
            (0..4).map(|j| (0..50).map(|k| ((j + 1) as f64 * k as f64 / 10.0).cos()).collect()).collect();
        let amps = [1.0, 0.5, 0.25, 0.1];
        let (sd, _) = finite_rank_profile(&amps, &vectors);
        let a = laplace_sup_quantile(0.05, &amps, &vectors, &sd);
        assert_eq!(a, laplace_sup_quantile(0.05, &amps, &vectors, &sd));
        // Standardised by the Gaussian sd, a Laplace sum (variance 2) needs more than √2 × 1.96.
        assert!(a > 2.0 * SQRT_2 && a < 8.0, "{a}");
        assert!(laplace_sup_quantile(0.5, &amps, &vectors, &sd) < a);
    }

    /// The banded quantile one draw at a time, as it was simulated before the draws were blocked.
    fn banded_one_draw_at_a_time(alpha: f64, taps: &[Taps], nodes: usize, draws: usize) -> f64 {
        let sd: Vec<f64> = taps.iter().map(Taps::norm).collect();
        let mut l = vec![0.0; nodes];
        simulated_quantile(alpha, draws, |rng| {
            l.iter_mut().for_each(|v| *v = standard_laplace(rng));
            taps.iter()
                .zip(&sd)
                .filter(|(_, s)| **s > 0.0)
                .map(|(t, s)| {
                    let dot: f64 = t.weights.iter().zip(&l[t.first..]).map(|(w, v)| w * v).sum();
                    (dot / s).abs()
                })
                .fold(0.0, f64::max)
        })
    }

    #[test]
    fn blocked_banded_simulation_gives_the_one_draw_at_a_time_quantile_to_the_bit() {
        // Gaussian taps of a kernel sum on nodes 0.75 apart read at points 0.3 apart (varying
        // offsets and lengths), a point with no taps, and signed weights; draw counts that are
        // and are not whole blocks, several levels. Stored band quantiles were computed one
        // draw at a time, so the blocked simulation must reproduce them exactly.
        let nodes = 41;
        let mut taps: Vec<Taps> = (0..97)
            .map(|k| {
                let x = k as f64 * 0.3;
                let first = ((x - 3.0) / 0.75).ceil().max(0.0) as usize;
                let last = (((x + 3.0) / 0.75).floor() as usize).min(nodes - 1);
                let weights = (first..=last)
                    .map(|j| {
                        let z = x - j as f64 * 0.75;
                        (-0.5 * z * z).exp() * if j % 7 == 3 { -0.5 } else { 1.0 }
                    })
                    .collect();
                Taps { first, weights }
            })
            .collect();
        taps.push(Taps { first: 3, weights: vec![] });
        for (alpha, draws) in [(0.05, 500), (0.05, 37), (0.2, 16), (0.01, 1), (0.05, 4000)] {
            let single = banded_one_draw_at_a_time(alpha, &taps, nodes, draws);
            for kernel in Kernel::available() {
                let blocked = banded_quantile_on(alpha, &taps, nodes, draws, kernel);
                assert_eq!(blocked.to_bits(), single.to_bits(), "α = {alpha}, {draws} draws, {kernel:?}");
            }
        }
        assert_eq!(
            laplace_sup_quantile_banded(0.05, &taps, nodes).to_bits(),
            banded_one_draw_at_a_time(0.05, &taps, nodes, SIMULATION_DRAWS).to_bits()
        );
        // Control: the comparison sees a change in the order the coordinates are drawn (a
        // block's drawn node by node instead of draw by draw gives other suprema).
        let sd: Vec<f64> = taps.iter().map(Taps::norm).collect();
        let mut rng = ChaCha20Rng::seed_from_u64(SIMULATION_SEED);
        let mut l = vec![[0.0; BLOCK]; nodes];
        let mut sups = Vec::new();
        while sups.len() < 500 {
            l.iter_mut().for_each(|v| v.iter_mut().for_each(|x| *x = standard_laplace(&mut rng)));
            for d in 0..BLOCK.min(500 - sups.len()) {
                let sup = taps
                    .iter()
                    .zip(&sd)
                    .filter(|(_, s)| **s > 0.0)
                    .map(|(t, s)| (t.weights.iter().zip(&l[t.first..]).map(|(w, v)| w * v[d]).sum::<f64>() / s).abs())
                    .fold(0.0, f64::max);
                sups.push(sup);
            }
        }
        let reordered = order_statistic(0.05, sups);
        assert_ne!(reordered.to_bits(), banded_one_draw_at_a_time(0.05, &taps, nodes, 500).to_bits());
    }
}
