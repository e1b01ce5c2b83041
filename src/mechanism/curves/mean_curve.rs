//! The private mean of functional data (SPEC §3; Mirshani et al. 2019 §4; the ICLP paper).
//!
//! Curves are vectors of `m` values on `t_k = k/(m−1)` with the discrete L² inner product
//! `⟨a,b⟩ = (1/m)·Σ a_k b_k`. The covariance kernel `c` (one of Mirshani's C1–C4, range ρ)
//! gives the operator `a ↦ (1/m)·C·a` with eigenpairs `(λ_j, v_j)`, `v_j` orthonormal in
//! ⟨·,·⟩; only `λ_j > 1e-12·λ_1` are kept, and estimate and noise both live in their span.
//!
//! Per row: clip to norm τ and add the clipped curve, in fixed point (units of τ·2^-40,
//! so merges are exact), to the statistic; count the row. The smoother is linear, so the
//! smoothed sum `T_D = Σ_i S·X_i = S·(Σ_i X_i)` is computed once, at release, from the
//! summed curve: coefficients `⟨Σ X_i, v_j⟩` smoothed by `s_j = λ_j^η/(λ_j^η + φ)`. A row
//! costs O(m), not O(m·J). The rounding of one row (≤ one unit per point) and the
//! floating-point error of its clipping are bounded and added to the clip norm in the
//! sensitivity (as OpenDP adds its rounding distance), so the privacy claim holds for the
//! statistic actually computed.
//!
//! Release (SPEC §6): the smoothed sum is released through its whitened coordinates
//! `w_j = s_j·⟨T, v_j⟩/√λ_j`, computed in double-double from the exact fixed-point sums,
//! rounded to a lattice and given iid exact discrete Gaussian noise (δ > 0, zCDP
//! calibration; the curve then carries the GP noise `σ·Σ_j sqrt(λ_j)·ξ_j·v_j`) or discrete
//! Laplace noise (δ = 0, ICLP, pure ε); the count is an integer with discrete Laplace noise
//! of scale 1/ε_n. The mean `T̃ / max(ñ, 1)` is post-processing.

use std::fmt;
use std::sync::Arc;

use rand::Rng;

use crate::mechanism::contribution::Contribution;
use crate::mechanism::noise::bands;
use crate::mechanism::noise::cache::{PublicCache, stored_quantile};
use crate::mechanism::noise::calibration::{self, Calibration};
use crate::mechanism::noise::double_double::{DD, DD_OP_ERR};
use crate::mechanism::noise::lattice::{LatticeMechanism, ROW_LIMIT};
use crate::mechanism::ranges;
use crate::mechanism::sums::{BufferedSums, Buffers, add_saturating, most_heap_bytes};

pub use super::eigenbasis::{CovKernel, EIGEN_CUTOFF, Eigenbasis, inner};

/// Fixed-point unit of the summed curve, relative to the clip norm τ.
pub const COEFF_UNIT: f64 = 1.0 / (1u64 << 40) as f64;
/// Relative slack added to τ in the sensitivity: one row's stored contribution `g` has
/// `‖g‖ ≤ τ·(1 + CLIP_SLACK)`. It covers the fixed-point rounding (≤ one unit per point, so
/// ≤ τ·2^-40 in norm) and the floating-point error of computing the clip factor
/// (≤ (m + 9)·2^-53 relative, below 2^-41.9 for m ≤ 2048): 2^-38 exceeds their sum.
pub const CLIP_SLACK: f64 = 1.0 / (1u64 << 38) as f64;
/// Rows a [`MeanAccumulation`] buffers in i64 before flushing: one row adds at most
/// `τ·sqrt(m)/unit + 1 < 2^46` units to a point (m ≤ 2048), so 2^16 rows stay below 2^62.
const FLUSH_ROWS: usize = 1 << 16;
/// Largest curve length accepted.
pub const MAX_CURVE_LENGTH: usize = 2048;

/// Parameters of one `private_mean_curve` release.
#[derive(Debug, Clone, PartialEq)]
pub struct MeanCurveSpec {
    /// Curve length m.
    pub points: usize,
    /// Covariance kernel.
    pub kernel: CovKernel,
    /// Kernel range ρ > 0.
    pub range: f64,
    /// Penalty φ > 0.
    pub penalty: f64,
    /// Smoother power η ≥ 1.
    pub eta: f64,
    /// Clip norm τ > 0.
    pub clip: f64,
    /// Total ε of the release.
    pub epsilon: f64,
    /// δ (0 selects the pure-ε ICLP mechanism).
    pub delta: f64,
    /// Share of ε spent on the count, in (0, 1).
    pub count_fraction: f64,
    /// σ calibration for the Gaussian mechanism.
    pub calibration: Calibration,
}

/// `penalty => 'auto'`: the public prior's mean energy as a share of τ², `E‖μ‖² = (P·τ)²` (chosen
/// on the simulated data of `examples/utility_study.rs`, like the other defaults).
pub const AUTO_PRIOR_SHARE: f64 = 0.15;
/// `penalty => 'auto'` searches φ over `10^(-6 + 7k/56)`, k = 0..56 (10⁻⁶ to 10).
const AUTO_GRID: usize = 57;

/// `range => 'auto'` chooses among these ranges.
pub const AUTO_RANGES: [f64; 5] = [0.05, 0.1, 0.2, 0.4, 0.8];
/// `range => 'auto'`: the prior's range (the default range, whose kernel is the one the defaults
/// were chosen for).
pub const AUTO_PRIOR_RANGE: f64 = 0.2;
/// `range => 'auto'` needs the candidates' bases against the prior's (O(m³) each): m ≤ this.
pub const MAX_AUTO_RANGE_POINTS: usize = 512;

/// `penalty => 'auto'` (ICLP §4.3's plug-in idea, from public parameters and the released count ñ
/// only — post-processing of a release): the φ minimising the expected squared L² error of the
/// released mean under a public prior `μ ~ GP(0, (P·τ)²·C/tr C)` — the smoother's bias
/// `Σ_j (1 − s_j)²·(P·τ)²·λ_j/Σλ` plus the noise `σ(φ)²·Σ_j λ_j/ñ²` (σ the calibrated noise of
/// this mechanism at φ). More rows: less noise per row, so a smaller φ and less shrinkage.
pub fn auto_penalty(spec: &MeanCurveSpec, c: Contribution, n: i64) -> f64 {
    auto_tuning(spec, c, n, false, true).1
}

/// `range => 'auto'` and/or `penalty => 'auto'`: the (ρ, φ) among [`AUTO_RANGES`] (or the given
/// ρ) × the φ grid (or the given φ) minimising the same expected error, now under a prior whose
/// covariance `C₀` is the kernel at [`AUTO_PRIOR_RANGE`] whatever the candidate: with the
/// candidate's smoother `S = Σ_j s_j v_j v_jᵀ`, `E‖(I − S)μ‖² ∝ tr C₀ − Σ_j (1 − (1 − s_j)²)·⟨v_j, C₀ v_j⟩`
/// (`tr(S C₀ S) = Σ_j s_j²⟨v_j, C₀ v_j⟩` since the v_j are orthonormal). With ρ given the prior is
/// the candidate's own kernel and this is [`auto_penalty`]'s bias. Returns (ρ, φ).
pub fn auto_tuning(spec: &MeanCurveSpec, c: Contribution, n: i64, range: bool, penalty: bool) -> (f64, f64) {
    let nn = n.max(1) as f64;
    let prior = (AUTO_PRIOR_SHARE * spec.clip).powi(2);
    let ranges: Vec<f64> = if range { AUTO_RANGES.to_vec() } else { vec![spec.range] };
    let phis: Vec<f64> = if penalty {
        (0..AUTO_GRID).map(|k| 10f64.powf(-6.0 + 7.0 * k as f64 / (AUTO_GRID - 1) as f64)).collect()
    } else {
        vec![spec.penalty]
    };
    let prior_basis = range.then(|| Eigenbasis::cached(spec.kernel, AUTO_PRIOR_RANGE, spec.points));
    let mut best = (f64::INFINITY, (spec.range, spec.penalty));
    for &rho in &ranges {
        let basis = Eigenbasis::cached(spec.kernel, rho, spec.points);
        // ⟨v_j, C₀ v_j⟩ and tr C₀ (kept spectrum).
        let (diag, trace): (Vec<f64>, f64) = match &prior_basis {
            None => (basis.lambda.clone(), basis.lambda.iter().sum()),
            Some(p) => (
                basis
                    .vectors
                    .iter()
                    .map(|v| p.lambda.iter().zip(&p.vectors).map(|(l, u)| l * inner(v, u).powi(2)).sum())
                    .collect(),
                p.lambda.iter().sum(),
            ),
        };
        for &phi in &phis {
            let cand = MeanCurveSpec { range: rho, penalty: phi, ..spec.clone() };
            let Ok(m) = MeanCurveMechanism::with_contribution(cand, c) else { continue };
            let kept: f64 = m.smoother.iter().zip(&diag).map(|(s, d)| (1.0 - (1.0 - s).powi(2)) * d).sum();
            let bias = (trace - kept).max(0.0) / trace;
            let risk = prior * bias + m.sigma().powi(2) * m.basis.lambda.iter().sum::<f64>() / (nn * nn);
            if risk < best.0 {
                best = (risk, (rho, phi));
            }
        }
    }
    best.1
}

/// A parameter problem (public values only).
#[derive(Debug, Clone, PartialEq)]
pub struct MeanCurveError(pub String);

impl fmt::Display for MeanCurveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MeanCurveError {}

/// The sufficient statistic: the fixed-point sum of the clipped curves, and the count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeanState {
    /// `Σ_i round(clip(X_i)_k / (τ·COEFF_UNIT))` per grid point k (m entries).
    pub sums: Vec<i128>,
    /// Number of rows accumulated.
    pub count: u64,
}

impl MeanState {
    /// Adds another state of the same mechanism.
    pub fn merge(&mut self, other: &MeanState) {
        add_saturating(&mut self.sums, &other.sums);
        self.count = self.count.saturating_add(other.count);
    }
}

/// One release.
#[derive(Debug, Clone, PartialEq)]
pub struct MeanRelease {
    /// Grid on [0, 1].
    pub t: Vec<f64>,
    /// The private mean curve.
    pub mean: Vec<f64>,
    /// The noisy count that normalised it: an integer (discrete Laplace noise).
    pub n: i64,
}

/// The mechanism for fixed public parameters.
#[derive(Debug, Clone)]
pub struct MeanCurveMechanism {
    spec: MeanCurveSpec,
    basis: Arc<Eigenbasis>,
    smoother: Vec<f64>,
    /// Per kept j: `s_j/√λ_j`, the whitening factor of the lifted coordinates.
    whiten: Vec<f64>,
    sensitivity: f64,
    lattice: LatticeMechanism,
    count: LatticeMechanism,
}

impl MeanCurveMechanism {
    /// Validates the parameters and computes the privacy map.
    pub fn new(spec: MeanCurveSpec) -> Result<Self, MeanCurveError> {
        Self::with_contribution(spec, Contribution::ROW)
    }

    /// The mechanism when one privacy unit contributes up to `c.rows` curves to each of up to
    /// `c.groups` groups (SPEC §7): per group the summed curve moves by `rows` clipped curves
    /// and the count by `rows`; the curve noise covers all groups jointly (`sqrt(groups)` in
    /// L2, `groups` in L1) and the count's discrete Laplace noise has scale `rows·groups/ε_n`.
    pub fn with_contribution(spec: MeanCurveSpec, c: Contribution) -> Result<Self, MeanCurveError> {
        let bad = |m: String| Err(MeanCurveError(m));
        if !(2..=MAX_CURVE_LENGTH).contains(&spec.points) {
            return bad(format!("points must be in [2, {MAX_CURVE_LENGTH}], got {}", spec.points));
        }
        for (name, v) in [("range", spec.range), ("penalty", spec.penalty), ("clip", spec.clip)] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!("{name} must be a finite number > 0, got {v}"));
            }
        }
        if !ranges::accepts_scale(spec.clip) {
            return bad(format!(
                "clip must be from {:e} to {:e} (the release's sensitivity is then a finite double), got {}",
                ranges::MIN_WIDTH,
                ranges::MAX_MAGNITUDE,
                spec.clip
            ));
        }
        if !(spec.eta.is_finite() && spec.eta >= 1.0) {
            return bad(format!("eta must be a finite number ≥ 1, got {}", spec.eta));
        }
        if !(spec.count_fraction > 0.0 && spec.count_fraction < 1.0) {
            return bad(format!("count_fraction must be in (0, 1), got {}", spec.count_fraction));
        }
        if !(spec.epsilon.is_finite() && spec.epsilon > 0.0) {
            return bad(format!("epsilon must be a finite number > 0, got {}", spec.epsilon));
        }
        if !(0.0..1.0).contains(&spec.delta) {
            return bad(format!("delta must be in [0, 1), got {}", spec.delta));
        }
        let basis = Eigenbasis::cached(spec.kernel, spec.range, spec.points);
        let smoother: Vec<f64> = basis
            .lambda
            .iter()
            .map(|&l| {
                let p = l.powf(spec.eta);
                p / (p + spec.penalty)
            })
            .collect();
        // Lifted coordinates w_j = (s_j/√λ_j)·⟨T, v_j⟩ (whitened: the noise is iid in them).
        // One row changes the summed curve by g with ‖g‖ ≤ τ·(1 + CLIP_SLACK) (rounding and
        // clipping error included), so ‖Δw‖₂ ≤ τ'·max_j s_j/√λ_j·‖V‖ and
        // ‖Δw‖₁ ≤ τ'·sqrt(Σ_j s_j²/λ_j)·‖V‖ (Cauchy–Schwarz), ‖V‖ = the basis' norm bound.
        let whiten: Vec<f64> = smoother.iter().zip(&basis.lambda).map(|(s, l)| s / l.sqrt()).collect();
        let norm_bound = spec.clip * (1.0 + CLIP_SLACK) * basis.norm_bound;
        let eps_t = spec.epsilon * (1.0 - spec.count_fraction);
        let err = |e: &dyn fmt::Display| MeanCurveError(e.to_string());
        // Floating-point error of one coordinate for a table of ≤ ROW_LIMIT rows: the dd dot
        // product of m terms has error ≤ (m + 2)·DD_OP_ERR·Σ_k |v_jk·T_k| with
        // Σ_k |T_k| ≤ rows·m·τ·(1 + CLIP_SLACK) (each clipped value is ≤ τ√m, |v_jk| ≤ √m)
        // after scaling by 1/m.
        let m = spec.points as f64;
        let per_coordinate =
            |w: f64| w * (m + 2.0) * DD_OP_ERR * m.sqrt() * ROW_LIMIT * spec.clip * (1.0 + CLIP_SLACK) * 1.01;
        let (sensitivity, lattice) = if spec.delta > 0.0 {
            let delta_h = norm_bound * whiten.iter().cloned().fold(0.0, f64::max);
            let float = whiten.iter().map(|&w| per_coordinate(w).powi(2)).sum::<f64>().sqrt();
            let rho = calibration::zcdp_rho(spec.calibration, eps_t, spec.delta).map_err(|e| err(&e))?;
            let per_group = c.per_group() * delta_h + 2.0 * float;
            let lattice =
                LatticeMechanism::gaussian_over(per_group, whiten.len(), rho, c.groups).map_err(|e| err(&e))?;
            (delta_h, lattice)
        } else {
            let delta_1 = norm_bound * whiten.iter().map(|w| w * w).sum::<f64>().sqrt();
            let float: f64 = whiten.iter().map(|&w| per_coordinate(w)).sum();
            let per_group = c.per_group() * delta_1 + 2.0 * float;
            let lattice =
                LatticeMechanism::laplace_over(per_group, whiten.len(), eps_t, c.groups).map_err(|e| err(&e))?;
            (delta_1, lattice)
        };
        let count = LatticeMechanism::integer_laplace_over(spec.epsilon * spec.count_fraction, c.count_l1())
            .map_err(|e| err(&e))?;
        Ok(Self { spec, basis, smoother, whiten, sensitivity, lattice, count })
    }

    /// Parameters.
    /// Memory one call needs (bytes): `(state, work)` — one accumulator's exact sums
    /// (`i128` per point, plus the count) and the release's working memory (the eigenbasis,
    /// and 64 B per point for coordinates, noise and the curve).
    pub fn memory_bytes(&self) -> (u64, u64) {
        let m = self.spec.points as u64;
        let state = most_heap_bytes(self.spec.points, Buffers::Plain) + 16;
        let basis =
            8 * (self.basis.vectors.iter().map(|v| v.len() as u64).sum::<u64>() + self.basis.lambda.len() as u64);
        (state, basis + 8 * (self.smoother.len() + self.whiten.len()) as u64 + 64 * m)
    }

    pub fn spec(&self) -> &MeanCurveSpec {
        &self.spec
    }

    /// The eigenbasis.
    pub fn basis(&self) -> &Eigenbasis {
        &self.basis
    }

    /// Smoother weights `s_j`.
    pub fn smoother(&self) -> &[f64] {
        &self.smoother
    }

    /// Δ (Cameron–Martin, Gaussian) or Δ₁ (ICLP), including the rounding slack.
    pub fn sensitivity(&self) -> f64 {
        self.sensitivity
    }

    /// Noise scale σ of the coefficient sum (per unit of `sqrt(λ_j)`): the standard
    /// deviation of one lifted coordinate's noise.
    pub fn sigma(&self) -> f64 {
        self.lattice.noise_sd()
    }

    /// The discrete mechanism on the lifted (whitened) coordinates.
    pub fn lattice(&self) -> &LatticeMechanism {
        &self.lattice
    }

    /// The discrete Laplace mechanism of the count (integer lattice, sensitivity 1).
    pub fn count_mechanism(&self) -> &LatticeMechanism {
        &self.count
    }

    /// ε spent on the count.
    pub fn count_epsilon(&self) -> f64 {
        self.spec.epsilon * self.spec.count_fraction
    }

    /// A zero statistic.
    pub fn empty_state(&self) -> MeanState {
        MeanState { sums: vec![0; self.spec.points], count: 0 }
    }

    /// Calls `emit(k, units)` for the clipped curve's value at every point k, in units of
    /// τ·COEFF_UNIT; returns false (and emits nothing) for a curve that is dropped (wrong
    /// length or a non-finite value). An all-zero curve emits nothing and counts.
    #[inline]
    fn clipped_units(&self, curve: &[f64], mut emit: impl FnMut(usize, i64)) -> bool {
        if curve.len() != self.spec.points {
            return false;
        }
        // max|x| is NaN-propagating here: any non-finite value makes `a` non-finite.
        let a = curve.iter().fold(0.0f64, |m, v| if v.abs() > m || v.is_nan() { v.abs() } else { m });
        if !a.is_finite() {
            return false;
        }
        if a == 0.0 {
            return true;
        }
        // Scale by the largest |value| first so huge (finite) curves cannot overflow the
        // norm: x = a·y with max|y| = 1, ‖x‖ = a·‖y‖. y is computed by one expression,
        // used for both the norm and the output (a reciprocal unless it is not finite).
        let inv = 1.0 / a;
        let fast = inv.is_finite();
        let y = |v: f64| if fast { v * inv } else { v / a };
        let norm_y = (curve.iter().map(|&v| y(v) * y(v)).sum::<f64>() / curve.len() as f64).sqrt();
        // x·min(1, τ/‖x‖) = y·min(a, τ/‖y‖), in units; the factor is ≤ τ·sqrt(m).
        let scale = a.min(self.spec.clip / norm_y) / (self.spec.clip * COEFF_UNIT);
        for (k, &v) in curve.iter().enumerate() {
            let u = y(v) * scale;
            // Round half away from zero without libm (|u| < 2^46, so the error is ≤ 1/2 +
            // 2^-7 of a unit, within CLIP_SLACK).
            emit(k, (u + 0.5f64.copysign(u)) as i64);
        }
        true
    }

    /// The clipped curve one row contributes (in units), or None for a curve that is
    /// dropped (wrong length or a non-finite value).
    pub fn contribution(&self, curve: &[f64]) -> Option<Vec<i128>> {
        let mut out = vec![0i128; self.spec.points];
        self.clipped_units(curve, |k, u| out[k] = u as i128).then_some(out)
    }

    /// Adds one curve (dropped silently when it has the wrong length or a non-finite value).
    pub fn add(&self, state: &mut MeanState, curve: &[f64]) {
        let sums = &mut state.sums;
        if self.clipped_units(curve, |k, u| sums[k] = sums[k].saturating_add(u as i128)) {
            state.count = state.count.saturating_add(1);
        }
    }

    /// The exact smoothed sum `T_D` in coefficients: `s_j·⟨Σ_i clip(X_i), v_j⟩`.
    pub fn sum_coefficients(&self, state: &MeanState) -> Vec<f64> {
        let unit = self.spec.clip * COEFF_UNIT;
        let total: Vec<f64> = state.sums.iter().map(|&v| v as f64 * unit).collect();
        self.basis.coefficients(&total).iter().zip(&self.smoother).map(|(c, s)| s * c).collect()
    }

    /// The lifted coordinates `w_j = (s_j/√λ_j)·⟨T, v_j⟩` of a statistic, in double-double
    /// from the exact fixed-point sums.
    pub fn lifted(&self, state: &MeanState) -> Vec<DD> {
        let m = self.spec.points;
        let t: Vec<DD> = state.sums.iter().map(|&v| DD::from_i128(v)).collect();
        let unit = self.spec.clip * COEFF_UNIT / m as f64;
        self.basis
            .vectors
            .iter()
            .zip(&self.whiten)
            .map(|(v, &w)| {
                let dot = t.iter().zip(v).fold(DD::default(), |acc, (tk, &vk)| acc.add(tk.mul_f64(vk)));
                dot.mul_f64(unit).mul_f64(w)
            })
            .collect()
    }

    /// Releases the mean curve; `rng = None` is the noiseless test hook.
    pub fn release<R: Rng + ?Sized>(&self, state: &MeanState, rng: Option<&mut R>) -> MeanRelease {
        let (w, n) = self.noisy_coordinates(state, rng);
        self.post_process(&w, n)
    }

    /// The private part of a release: the noisy lifted coordinates and the noisy count
    /// (exact discrete noise). `rng = None` is the noiseless test hook.
    pub fn noisy_coordinates<R: Rng + ?Sized>(&self, state: &MeanState, mut rng: Option<&mut R>) -> (Vec<f64>, i64) {
        let w = self.lattice.release(&self.lifted(state), rng.as_deref_mut());
        let n = self.count.release(&[DD::from_i128(state.count as i128)], rng)[0] as i64;
        (w, n)
    }

    /// The released count alone (an `penalty => 'auto'` release draws it first, then chooses φ
    /// from it). `rng = None` is the noiseless test hook.
    pub fn noisy_count<R: Rng + ?Sized>(&self, state: &MeanState, rng: Option<&mut R>) -> i64 {
        self.count.release(&[DD::from_i128(state.count as i128)], rng)[0] as i64
    }

    /// The released lifted coordinates alone (exact discrete noise).
    pub fn noisy_curve<R: Rng + ?Sized>(&self, state: &MeanState, rng: Option<&mut R>) -> Vec<f64> {
        self.lattice.release(&self.lifted(state), rng)
    }

    /// The mean curve from released lifted coordinates and the released count
    /// (post-processing: the smoothed sum's coefficients are `T̃_j = √λ_j·w̃_j`; the mean
    /// is `T̃/max(ñ, 1)`).
    pub fn post_process(&self, w: &[f64], n: i64) -> MeanRelease {
        let d = n.max(1) as f64;
        let coeffs: Vec<f64> = w.iter().zip(&self.basis.lambda).map(|(w, l)| w * l.sqrt() / d).collect();
        let m = self.spec.points;
        MeanRelease { t: (0..m).map(|k| k as f64 / (m - 1) as f64).collect(), mean: self.basis.synthesize(&coeffs), n }
    }
}

impl MeanCurveMechanism {
    /// The simultaneous level-α band of the privacy noise of a release normalised by the
    /// released count `n`, as half-widths per grid point (post-processing: public parameters
    /// and ñ only). The noise `(σ/ñ)·Σ_j sqrt(λ_j)·ξ_j·v_j` has pointwise sd `(σ/ñ)·s_k`; the
    /// Gaussian threshold comes from [`bands::sup_threshold`], the pure-ε one from a public
    /// simulation (cached per kernel, range, length and α).
    pub fn noise_band(&self, n: i64, alpha: f64) -> Vec<f64> {
        let amplitudes: Vec<f64> = self.basis.lambda.iter().map(|l| l.sqrt()).collect();
        let (sd, theta) = bands::finite_rank_profile(&amplitudes, &self.basis.vectors);
        let scale = if self.spec.delta > 0.0 {
            bands::sup_threshold(alpha, sd.len(), theta) * self.sigma()
        } else {
            type Key = (CovKernel, u64, usize, u64);
            static QUANTILES: PublicCache<Key, f64> = PublicCache::new(1 << 20);
            let key = (self.spec.kernel, self.spec.range.to_bits(), self.spec.points, alpha.to_bits());
            let q = QUANTILES
                .get_or_try_insert(
                    key,
                    |_| 8,
                    || {
                        Ok::<_, std::convert::Infallible>(stored_quantile("mean-curve-laplace-band", &key, || {
                            bands::laplace_sup_quantile(alpha, &amplitudes, &self.basis.vectors, &sd)
                        }))
                    },
                )
                .unwrap_or_else(|e| match e {});
            // Discrete Laplace coordinates of sd σ are σ/√2 times a standard Laplace.
            *q * self.sigma() / std::f64::consts::SQRT_2
        };
        let d = n.max(1) as f64;
        sd.iter().map(|s| scale * s / d).collect()
    }
}

/// A statistic under accumulation ([`BufferedSums`]: the per-row loop adds to an i64
/// buffer without overflow checks) and the row count. Bit-identical to
/// [`MeanCurveMechanism::add`] row by row.
#[derive(Debug, Clone)]
pub struct MeanAccumulation {
    sums: BufferedSums,
    state: MeanState,
}

impl MeanAccumulation {
    /// An empty statistic for `mechanism`.
    pub fn new(mechanism: &MeanCurveMechanism) -> Self {
        Self {
            sums: BufferedSums::new(mechanism.spec.points, FLUSH_ROWS, Buffers::Plain),
            state: mechanism.empty_state(),
        }
    }

    /// Adds one curve (see [`MeanCurveMechanism::add`]).
    #[inline]
    pub fn add(&mut self, mechanism: &MeanCurveMechanism, curve: &[f64]) {
        // A dropped row is counted against the buffer too (it only flushes earlier).
        let pending = self.sums.buffer(1);
        if mechanism.clipped_units(curve, |k, u| pending[k] += u) {
            self.state.count = self.state.count.saturating_add(1);
        }
    }

    /// Adds a statistic of the same mechanism.
    pub fn merge(&mut self, other: &MeanState) {
        self.sums.merge(&other.sums);
        self.state.count = self.state.count.saturating_add(other.count);
    }

    /// Adds the buffer into the exact sums.
    pub fn flush(&mut self) {
        self.sums.flush();
    }

    /// The most rows the buffer holds between two flushes.
    pub fn flush_rows(&self) -> usize {
        self.sums.flush_rows()
    }

    /// The statistic (flushes the buffer).
    pub fn state(&mut self) -> &MeanState {
        self.state.sums.copy_from_slice(self.sums.totals());
        &self.state
    }

    /// Heap bytes held.
    pub fn heap_size(&self) -> usize {
        self.sums.heap_size() + self.state.sums.capacity() * size_of::<i128>()
    }
}

#[cfg(test)]
mod tests;
