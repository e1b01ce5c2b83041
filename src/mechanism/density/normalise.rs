//! How a released kernel sum becomes a density (post-processing): the normalisations, the L2
//! projection's shift, and the trapezoid rule.

/// How the released kernel sum `S̃` becomes a density on the grid (post-processing). With
/// `g = S̃/Z`, `Z = ∫S̃` (trapezoid rule over the grid):
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Normalise {
    /// The L2 projection of g onto densities on the grid: `f = max(g − c, 0)` with the
    /// `c ≥ 0` that makes `∫f = 1` (exact: the trapezoid integral is piecewise linear in c).
    #[default]
    Project,
    /// Clamp and rescale: `f = max(S̃, 0)/∫max(S̃, 0)`.
    Rescale,
    /// No clamping: `f = g` (integrates to 1, may be negative).
    Raw,
}

impl Normalise {
    /// Parses the SQL spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "project" => Some(Normalise::Project),
            "rescale" => Some(Normalise::Rescale),
            "none" => Some(Normalise::Raw),
            _ => None,
        }
    }

    /// The SQL spelling.
    pub fn name(self) -> &'static str {
        match self {
            Normalise::Project => "project",
            Normalise::Rescale => "rescale",
            Normalise::Raw => "none",
        }
    }
}

/// The shift `c ≥ 0` of the L2 projection: `step·Σ_k w_k·max(g_k − c, 0) = 1` with trapezoid
/// weights w (½ at the ends). Needs `step·Σ w_k·max(g_k, 0) ≥ 1`, which holds when `∫g = 1`.
pub fn projection_shift(g: &[f64], step: f64) -> f64 {
    let n = g.len();
    let weights: Vec<f64> = (0..n).map(|k| if k == 0 || k + 1 == n { 0.5 } else { 1.0 }).collect();
    projection_shift_weighted(g, &weights, step)
}

/// The shift `c ≥ 0` with `cell·Σ_k w_k·max(g_k − c, 0) = 1` for quadrature weights `w` (the
/// 2-D KDE's are products of trapezoid weights).
pub fn projection_shift_weighted(g: &[f64], weights: &[f64], cell: f64) -> f64 {
    // The positions from the largest value down, equal values by position: one integer key
    // each (the value's `total_cmp` order reversed, then the position), so the unstable sort
    // gives the one order the sums below depend on.
    let mut order: Vec<u128> =
        g.iter().enumerate().map(|(k, &v)| (u128::from(!total_order_key(v)) << 64) | k as u128).collect();
    order.sort_unstable();
    // With the j largest values above c: cell·(G − c·W) = 1, c = (G − 1/cell)/W; valid if it
    // lies between the j-th and (j+1)-th largest values.
    let (mut big_w, mut big_g) = (0.0, 0.0);
    for (j, &key) in order.iter().enumerate() {
        let k = key as u64 as usize;
        big_w += weights[k];
        big_g += weights[k] * g[k];
        let c = (big_g - 1.0 / cell) / big_w;
        let next = order.get(j + 1).map_or(f64::NEG_INFINITY, |&o| g[o as u64 as usize]);
        if c >= next {
            return c.max(0.0);
        }
    }
    0.0
}

/// An unsigned key whose order is `f64::total_cmp`'s.
pub(super) fn total_order_key(v: f64) -> u64 {
    let bits = v.to_bits() as i64;
    // total_cmp's transform (negative values' magnitude bits flipped), then the sign bit flipped.
    ((bits ^ (((bits >> 63) as u64) >> 1) as i64) as u64) ^ (1 << 63)
}

/// Trapezoid rule on an evenly spaced grid.
pub fn trapezoid(y: &[f64], step: f64) -> f64 {
    match y {
        [] | [_] => 0.0,
        [first, .., last] => step * (y.iter().sum::<f64>() - 0.5 * (first + last)),
    }
}
