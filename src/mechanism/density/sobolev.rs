//! The Sobolev-space release of the KDE (Hall et al. §4.2): the kernel sum on the grid with
//! noise from the exponential kernel `K(s, t) = exp(−γ|s − t|)`, the reproducing kernel of the
//! Sobolev space H¹[lo, hi] — a release whose sensitivity needs only that the statistic be
//! smooth (square-integrable first derivative), not that it lie in the Gaussian kernel's RKHS.
//!
//! **Norm.** For `K = exp(−γ|s − t|)` on `[a, b]` the RKHS norm is
//! `‖f‖² = ½(f(a)² + f(b)²) + (1/2γ)∫_a^b (f′² + γ²f²)` (Hall eq. 9; it gives `‖K(·, s)‖² = 1`,
//! checked in the tests). One row adds an unnormalised Gaussian bump `φ_μ(t) = exp(−(t−μ)²/2h²)`
//! (peak 1, as in the Gaussian release) to the kernel sum. Over the whole line `∫φ′² = √π/(2h)`
//! and `∫φ² = h√π`. With Hall's choice `γ = 1/h`, each boundary term is paid for by the part of
//! the integral the box cuts off on its side: for the edge a at distance d ≥ 0 from μ (μ inside),
//! `D(d) = (h/2)∫_d^∞ (u²/h⁴ + 1/h²)e^{−u²/h²}du − ½e^{−d²/h²}` has `D(∞) = 0` and
//! `D′(d) = −e^{−d²/h²}(d − h)²/(2h³) ≤ 0`, so `D ≥ 0`; for μ outside the box the cut-off part
//! holds a whole half of the bump, `(h/2)·(3√π/8) ≥ ½ ≥ ½f(a)²`. Hence for every centre μ
//!
//! `‖φ_μ‖² ≤ (h/2)(√π/(2h) + √π/h) = 3√π/4`,   `Δ_H = √(3√π/4) ≈ 1.153`
//!
//! (Hall's looser bound adds the boundary terms: 1 + 3√π/4). A linearly binned row is a convex
//! combination of two bumps, so it moves the statistic by at most Δ_H too.
//!
//! **Lifted coordinates.** The release is the kernel sum `S` at the grid points `t_k`. For any
//! f in the RKHS, the vector of its values at finitely many points has Mahalanobis norm
//! `vᵀC⁻¹v ≤ ‖f‖²` with `C_jk = K(t_j, t_k)` (the minimum-norm interpolant), so the whitened
//! coordinates `w = L⁻¹S` (`C = LLᵀ`) move by at most Δ_H in L2. On an evenly spaced grid, C is
//! the covariance of a stationary AR(1) chain with `ρ = exp(−γ·step)`, whose Cholesky inverse is
//! explicit: `w_0 = S_0`, `w_k = (S_k − ρS_{k−1})/√(1 − ρ²)`. The coordinates are rounded to γℤ
//! and exact discrete Gaussian noise is added ([`crate::mechanism::noise::lattice::LatticeMechanism`], SPEC §6); the
//! release `S̃ = L·w̃` (`S̃_0 = w̃_0`, `S̃_k = ρS̃_{k−1} + √(1−ρ²)·w̃_k`) is post-processing. Its noise is
//! σ times a stationary Ornstein–Uhlenbeck path: continuous but nowhere differentiable — Hall's
//! Figure 2 "does not have the desirable smoothness" of the Gaussian-kernel release.
//!
//! **Floating point.** The kernel values `fl(φ)` and the constants `fl(ρ)`, `fl(1/√(1−ρ²))` are
//! public and the same for neighbouring tables, so the map actually applied is a fixed linear
//! map; its distance from the exact one (relative errors of 2⁻⁵⁰ on kernel values and constants,
//! truncation of the kernel beyond 8h where it is below e⁻³², grid points that are floating-point
//! sums rather than evenly spaced reals) and the double-double rounding of
//! the sums (≤ 2⁻¹⁰⁰ relative, over at most [`ROW_LIMIT`] rows) are bounded in
//! [`SobolevMap::float_slack`] and added to the sensitivity.

use crate::mechanism::density::kde::{Grid, KdeLayout, TRUNCATION_BANDWIDTHS, gaussian_kernel};
use crate::mechanism::noise::double_double::{DD, DD_OP_ERR};
use crate::mechanism::noise::lattice::ROW_LIMIT;

/// `Δ_H` for γ = 1/h: the H¹ norm bound of one row's bump (see the module docs).
pub fn h1_sensitivity() -> f64 {
    (0.75 * std::f64::consts::PI.sqrt()).sqrt()
}

/// The exponential-kernel (H¹) release map of a grid over a binned statistic.
#[derive(Debug, Clone, PartialEq)]
pub struct SobolevMap {
    grid: Grid,
    bandwidth: f64,
    /// Bins of the statistic: (position of bin 0, spacing, count).
    bins: (f64, f64, usize),
    /// Neighbour correlation of the noise, `exp(−step/h)`.
    rho: f64,
    /// `√(1 − ρ²)`.
    innovation: f64,
}

impl SobolevMap {
    /// The map for `grid` over `layout`'s binned statistic (γ = 1/h). None when the layout is not
    /// binned (the bandwidth is tiny next to the grid step).
    pub fn new(grid: Grid, layout: &KdeLayout) -> Option<Self> {
        let bins = layout.bins()?;
        let h = layout.bandwidth();
        let rho = (-grid.step() / h).exp();
        let innovation = ((1.0 - rho) * (1.0 + rho)).sqrt();
        (innovation > 0.0).then_some(Self { grid, bandwidth: h, bins, rho, innovation })
    }

    /// Neighbour correlation of the released noise on the grid.
    pub fn rho(&self) -> f64 {
        self.rho
    }

    /// Bound on the distance between the computed and the exact lifted map's images of one
    /// row, plus the double-double rounding of a whole table's sums (see the module docs).
    pub fn float_slack(&self) -> f64 {
        let n = self.grid.points as f64;
        // ‖L̂⁻¹‖₂ ≤ (1 + ρ)/√(1 − ρ²) ≤ 2/√(1 − ρ²).
        let inv = 2.0 / self.innovation;
        // Kernel values (2⁻⁵⁰ relative), truncation (< e⁻³² each), constants (2⁻⁵⁰ relative)
        // on a bump of entries ≤ 1 over n points; sums of ≤ ROW_LIMIT rows in double-double.
        // The grid points are `fl(lo + k·step)`, not the evenly spaced reals the AR(1) whitening
        // assumes: each is off by at most 8·2⁻⁵²·(|lo| + |hi|), which moves a bump's value by at
        // most that over h (its slope is below 1/h).
        let position = 8.0 * 2f64.powi(-52) * (self.grid.lo.abs() + self.grid.hi.abs()) / self.bandwidth;
        let per_row = inv * n.sqrt() * (4.0 * 2f64.powi(-50) + (-32f64).exp() + position);
        let sums = inv * n.sqrt() * 8.0 * DD_OP_ERR * ROW_LIMIT * (1.0 + self.kernel_taps() as f64);
        per_row + sums
    }

    /// Bins within the kernel's reach of a grid point (an upper bound).
    fn kernel_taps(&self) -> usize {
        (2.0 * TRUNCATION_BANDWIDTHS * self.bandwidth / self.bins.1).ceil() as usize + 2
    }

    /// The kernel sum at the grid points from the binned statistic, in double-double (every
    /// bin within reach is read, whatever its value: the same work for any table).
    fn grid_sums(&self, state: &[i128]) -> Vec<DD> {
        let (origin, spacing, nbins) = self.bins;
        let h = self.bandwidth;
        let reach = TRUNCATION_BANDWIDTHS * h;
        (0..self.grid.points)
            .map(|k| {
                let t = self.grid.at(k);
                let first = ((t - reach - origin) / spacing).ceil().max(0.0) as usize;
                let last = ((((t + reach - origin) / spacing).floor() + 1.0).max(0.0) as usize).min(nbins);
                (first..last).fold(DD::default(), |acc, b| {
                    let v = DD::from_i128(state[b]).scale_pow2(-40);
                    acc.add(v.mul_f64(gaussian_kernel(t, origin + b as f64 * spacing, h)))
                })
            })
            .collect()
    }

    /// The whitened (lifted) coordinates `w = L⁻¹S` of a binned statistic.
    pub fn lift(&self, state: &[i128]) -> Vec<DD> {
        let s = self.grid_sums(state);
        let scale = 1.0 / self.innovation;
        let mut w = Vec::with_capacity(s.len());
        w.push(s[0]);
        for k in 1..s.len() {
            w.push(s[k].sub(s[k - 1].mul_f64(self.rho)).mul_f64(scale));
        }
        w
    }

    /// `S̃ = L·w̃`: the kernel sum on the grid for (noisy) lifted coordinates. Post-processing.
    pub fn synthesise(&self, w: &[f64]) -> Vec<f64> {
        let mut s = Vec::with_capacity(w.len());
        let mut prev = 0.0;
        for (k, &v) in w.iter().enumerate() {
            prev = if k == 0 { v } else { self.rho * prev + self.innovation * v };
            s.push(prev);
        }
        s
    }

    /// The released path at any x in the box: the grid value at grid points, between them the
    /// conditional mean of the Ornstein–Uhlenbeck process given its two neighbouring values,
    /// `(sinh(γ(t₁ − x))·S̃₀ + sinh(γ(x − t₀))·S̃₁)/sinh(γ(t₁ − t₀))`. None outside the box.
    pub fn continue_at(&self, s: &[f64], x: f64) -> Option<f64> {
        let g = self.grid;
        if !(x >= g.lo && x <= g.hi) {
            return None;
        }
        let pos = (x - g.lo) / g.step();
        let near = (pos.round() as usize).min(g.points - 1);
        if g.at(near) == x {
            return Some(s[near]); // exactly the release at its grid points
        }
        let mut k = (pos.floor() as usize).min(g.points - 2);
        if g.at(k) > x {
            k = k.saturating_sub(1);
        } else if g.at(k + 1) < x {
            k = (k + 1).min(g.points - 2);
        }
        let t0 = g.at(k);
        let gamma = 1.0 / self.bandwidth;
        let (a, b) = (gamma * (g.at(k + 1) - x), gamma * (x - t0));
        let d = gamma * g.step();
        // sinh ratios without overflow for large γ·step: scale by e^{−d}.
        let ratio = |u: f64| ((u - d).exp() - (-u - d).exp()) / (1.0 - (-2.0 * d).exp());
        Some(ratio(a) * s[k] + ratio(b) * s[k + 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H¹ norm (Hall eq. 9, γ = 1/h) of f on [a, b] by the trapezoid rule on a fine grid.
    fn h1_norm2(f: impl Fn(f64) -> f64, df: impl Fn(f64) -> f64, a: f64, b: f64, gamma: f64) -> f64 {
        let n = 200_000;
        let dt = (b - a) / n as f64;
        let integral: f64 = (0..=n)
            .map(|i| {
                let t = a + i as f64 * dt;
                let w = if i == 0 || i == n { 0.5 } else { 1.0 };
                w * (df(t).powi(2) + gamma * gamma * f(t).powi(2))
            })
            .sum::<f64>()
            * dt;
        0.5 * (f(a).powi(2) + f(b).powi(2)) + integral / (2.0 * gamma)
    }

    #[test]
    fn the_norm_gives_the_kernel_sections_norm_one_and_bounds_every_bump() {
        let (a, b, h) = (0.0, 1.0, 0.05);
        let gamma = 1.0 / h;
        // ‖K(·, s)‖² = K(s, s) = 1 confirms the norm's form and constants.
        for s in [0.0, 0.3, 0.97] {
            let k = h1_norm2(
                |t| (-gamma * (t - s).abs()).exp(),
                |t| -gamma * (t - s).signum() * (-gamma * (t - s).abs()).exp(),
                a,
                b,
                gamma,
            );
            assert!((k - 1.0).abs() < 1e-3, "‖K(·, {s})‖² = {k}");
        }
        let bound = h1_sensitivity().powi(2);
        let mut worst = 0.0f64;
        for mu in [-0.4, -0.1, -0.01, 0.0, 0.02, 0.05, 0.08, 0.5, 0.95, 0.99, 1.0, 1.3] {
            let f = |t: f64| (-(t - mu) * (t - mu) / (2.0 * h * h)).exp();
            let df = |t: f64| -(t - mu) / (h * h) * f(t);
            let n2 = h1_norm2(f, df, a, b, gamma);
            worst = worst.max(n2);
            assert!(n2 <= bound, "μ = {mu}: ‖φ‖² = {n2} > {bound}");
        }
        // Not vacuous: an interior bump's norm is within 1 % of the bound.
        assert!(worst > 0.99 * bound, "worst {worst} vs {bound}");
        // Negative control: a bump of width h/3 (three times the slope) exceeds the bound for γ = 1/h.
        let w2 = h * h / 9.0;
        let f = |t: f64| (-(t - 0.5) * (t - 0.5) / (2.0 * w2)).exp();
        let df = |t: f64| -(t - 0.5) / w2 * f(t);
        assert!(h1_norm2(f, df, a, b, gamma) > bound, "a narrower bump must not fit");
    }

    #[test]
    fn whitening_inverts_synthesis_and_continuation_interpolates() {
        let grid = Grid { lo: 0.0, hi: 1.0, points: 11 };
        let layout = KdeLayout::new(grid, 0.2).unwrap();
        let m = SobolevMap::new(grid, &layout).unwrap();
        let s: Vec<f64> = (0..11).map(|k| (k as f64 * 0.7).sin() + 2.0).collect();
        let w: Vec<f64> = {
            let mut w = vec![s[0]];
            for k in 1..11 {
                w.push((s[k] - m.rho() * s[k - 1]) / ((1.0 - m.rho() * m.rho()).sqrt()));
            }
            w
        };
        let back = m.synthesise(&w);
        for (a, b) in back.iter().zip(&s) {
            assert!((a - b).abs() < 1e-12);
        }
        assert_eq!(m.continue_at(&s, grid.at(3)), Some(s[3]));
        // Halfway, both neighbours weigh sinh(d/2)/sinh(d) = 1/(2cosh(d/2)), d = γ·step.
        let mid = m.continue_at(&s, 0.5 * (grid.at(3) + grid.at(4))).unwrap();
        let want = (s[3] + s[4]) / (2.0 * (0.5 * 0.1 / 0.2f64).cosh());
        assert!((mid - want).abs() < 1e-12, "{mid} vs {want}");
        assert_eq!(m.continue_at(&s, 1.2), None);
    }
}
