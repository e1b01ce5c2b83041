//! The lifted basis of the KDE (SPEC §2, §6): for a public (grid, bandwidth), the circle the
//! statistic is wrapped on, the kernel's spectrum by Poisson summation, the kept frequencies and
//! their lift and synthesis factors, and the proven sensitivity. Public, data-independent, cached.

use std::fmt;
use std::sync::{Arc, OnceLock};

use rustfft::{Fft, FftPlanner};

use super::error::MechanismError;
use crate::mechanism::density::kde::{KdeLayout, TRUNCATION_BANDWIDTHS};
use crate::mechanism::noise::cache::PublicCache;
use crate::mechanism::noise::double_double::{self, DD_OP_ERR};
use crate::mechanism::noise::lattice::ROW_LIMIT;

/// Binned mode keeps the frequencies with `λ_k ≥ SPECTRUM_CUTOFF·λ_0`; the dropped part of
/// the kernel is below 1e-13 of its peak.
pub const SPECTRUM_CUTOFF: f64 = 1e-13;
/// Largest double-double transform (the circle over the statistic's entries); larger
/// configurations are refused at planning time.
pub const MAX_LATTICE: usize = 1 << 22;
/// Largest circle of lattice points (the f64 synthesis of the curve runs on it).
pub const MAX_CIRCLE: usize = 1 << 24;
/// The largest circle whose inverse transform a cached basis keeps (16 MiB of twiddles).
const KEPT_PLAN_POINTS: usize = 1 << 20;
/// Relative accuracy of the computed spectrum (f64 exponentials of arguments ≤ 750).
const LAMBDA_REL_ERR: f64 = 1e-11;

/// The lifted basis of a (grid, bandwidth) pair: public, data-independent, cached.
#[derive(Debug)]
pub struct KdeBasis {
    /// Circle size: `stride·2^p` lattice points.
    pub(super) m: usize,
    /// Statistic entries sit every `stride` lattice points; the transform has `m/stride` points.
    pub(super) stride: usize,
    /// Highest frequency kept.
    pub(super) kmax: usize,
    /// Per real coordinate: the factor applied to the orthonormal DFT coordinate (`√λ` in
    /// binned mode, `1/√λ` in exact mode).
    pub(super) lift: Vec<f64>,
    /// Per real coordinate: `√λ`, the factor of the post-processing map A.
    pub(super) synth: Vec<f64>,
    /// Proven L2 sensitivity of the lifted coordinates, before floating-point slack.
    pub(super) stat_sensitivity: f64,
    /// Bound on the floating-point error of computing w for one table (≤ ROW_LIMIT rows).
    pub(super) float_error: f64,
    /// The inverse transform over the circle, planned on first use (its twiddles are computed
    /// once per basis, not once per release).
    inverse: InversePlan,
}

/// A basis's planned inverse transform.
#[derive(Default)]
struct InversePlan(OnceLock<Arc<dyn Fft<f64>>>);

// A plan is immutable once made (a transform takes its scratch per call), and a panic while one is
// made leaves the cell empty: a basis stays as usable across `catch_unwind` as it was without it.
impl std::panic::RefUnwindSafe for InversePlan {}
impl std::panic::UnwindSafe for InversePlan {}

impl fmt::Debug for InversePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InversePlan {{ planned: {} }}", self.0.get().is_some())
    }
}

/// The spectrum of the periodised lattice kernel at frequency k of a circle of m points
/// with `r = h/u` (bandwidth over lattice step), by Poisson summation.
fn spectrum(k: usize, m: usize, r: f64) -> f64 {
    if r >= 1.0 {
        let f = k as f64 / m as f64;
        // Poisson summation: fast for wide kernels (n up to 6.2/r + 1 ≤ 8 terms).
        let n_max = (6.2 / r).ceil() as i64 + 1;
        let c = 2.0 * std::f64::consts::PI * std::f64::consts::PI * r * r;
        let sum: f64 = (-n_max..=n_max).map(|n| (-c * (f + n as f64).powi(2)).exp()).sum();
        r * (2.0 * std::f64::consts::PI).sqrt() * sum
    } else {
        // The DFT's definition for narrow kernels: K(j·u) = exp(−j²/(2r²)) < e^-745 beyond
        // |j| = 39r, so at most 80 terms (and exactly 1 for r → 0).
        let j_max = (39.0 * r).ceil() as u64 + 1;
        let angle = |j: u64| 2.0 * std::f64::consts::PI * ((j * k as u64) % m as u64) as f64 / m as f64;
        1.0 + 2.0 * (1..=j_max).map(|j| (-((j * j) as f64) / (2.0 * r * r)).exp() * angle(j).cos()).sum::<f64>()
    }
}

impl KdeBasis {
    pub(super) fn build(layout: &KdeLayout) -> Result<Self, MechanismError> {
        let lat = layout.lattice();
        let h = layout.bandwidth();
        let r = h / lat.unit;
        let stride = lat.entry_stride;
        // Circle: the used span plus 10h, so wrapped kernel terms are ≤ K(10h) = e^-50; a
        // multiple of the entries' stride, with a power-of-two number of entry positions.
        let need = (lat.span as f64 + (10.0 * r).ceil() + 1.0) / stride as f64;
        let too_big = |what: &str| {
            MechanismError::Noise(format!(
                "the bandwidth is too wide for a grid of {} points: the noise needs {what}; use fewer \
                 points, a smaller bandwidth or a narrower range",
                layout.grid().points
            ))
        };
        if !(need <= MAX_LATTICE as f64) {
            return Err(too_big(&format!("a transform of {need:.0} points (at most {MAX_LATTICE})")));
        }
        let m_entries = (need.ceil() as usize).next_power_of_two().max(16);
        if m_entries.saturating_mul(stride) > MAX_CIRCLE {
            return Err(too_big(&format!(
                "a circle of {} lattice points (at most {MAX_CIRCLE})",
                m_entries as f64 * stride as f64
            )));
        }
        let m = m_entries * stride;
        let lambda0 = spectrum(0, m, r);
        let binned = layout.is_binned();
        let kmax = if binned {
            (0..=m / 2).take_while(|&k| spectrum(k, m, r) >= SPECTRUM_CUTOFF * lambda0).last().unwrap_or(0)
        } else {
            m / 2
        };
        if stride > 1 && kmax >= m_entries {
            return Err(MechanismError::Noise("internal: the kept spectrum exceeds the bin sublattice".into()));
        }
        let (mut lift, mut synth) = (Vec::new(), Vec::new());
        let mut min_lambda = f64::INFINITY;
        for k in 0..=kmax {
            let l = spectrum(k, m, r);
            min_lambda = min_lambda.min(l);
            let copies = if k == 0 || 2 * k == m { 1 } else { 2 };
            for _ in 0..copies {
                lift.push(if binned { l.sqrt() } else { 1.0 / l.sqrt() });
                synth.push(l.sqrt());
            }
        }
        if !(min_lambda > 0.0 && min_lambda.is_finite()) {
            return Err(MechanismError::Noise("the kernel spectrum underflows on this lattice".into()));
        }
        let max_lift = lift.iter().cloned().fold(0.0, f64::max);
        let stat_sensitivity = if binned {
            // max diag of Q·diag(lift²)·Qᵀ = (1/m)·Σ over all frequencies of lift² = Σ over
            // real coordinates of lift²/m·(m/2·2/m…): each real coordinate's basis vector has
            // squared entries ≤ 2/m (1/m for k = 0 and m/2), so the diagonal is
            // Σ_c lift_c²·q_c(j)² ≤ (1/m)·(lift_0² + 2·Σ_{k≥1} lift_k²).
            let mut diag = 0.0;
            let mut c = 0;
            for k in 0..=kmax {
                let w = if k == 0 || 2 * k == m { 1.0 } else { 2.0 };
                diag += w * lift[c] * lift[c];
                c += if k == 0 || 2 * k == m { 1 } else { 2 };
            }
            (diag / m as f64 * (1.0 + 1e-12)).sqrt()
        } else {
            // ‖C^{-1/2}·k_x‖ ≤ sqrt(K_per(x,x)) ≤ sqrt(1 + 2e^-50) for the exact periodised
            // kernel; the computed spectrum is within LAMBDA_REL_ERR; the stored values
            // differ from k_x by the 2^-41 rounding of ≤ (2·8h/dt + 2) entries and the
            // kernel beyond 8h (≤ 1e-13 in norm).
            let entries = 2.0 * TRUNCATION_BANDWIDTHS * h / lat.unit + 2.0;
            let e = entries.sqrt() * 2f64.powi(-41) + 1e-13;
            (1.0 + LAMBDA_REL_ERR) * ((1.0 + 1e-15f64).sqrt() + e * max_lift)
        };
        // ‖fl(w) − w‖ ≤ max lift · (DFT error + 2 dd ops) · ‖v‖₂, ‖v‖₂ ≤ ‖v‖₁ ≤ rows·mass.
        let float_error =
            max_lift * (double_double::dft_relative_error(m) + 2.0 * DD_OP_ERR) * ROW_LIMIT * lat.mass_per_row;
        Ok(Self { m, stride, kmax, lift, synth, stat_sensitivity, float_error, inverse: InversePlan::default() })
    }

    pub(super) fn cached(layout: &KdeLayout) -> Result<Arc<Self>, MechanismError> {
        type Key = (u64, u64, usize, u64);
        static CACHE: PublicCache<Key, KdeBasis> = PublicCache::new(256 << 20);
        let g = layout.grid();
        let key = (g.lo.to_bits(), g.hi.to_bits(), g.points, layout.bandwidth().to_bits());
        // Counted with the twiddles of the inverse transform it may keep (16 bytes a point), planned
        // or not.
        CACHE.get_or_try_insert(
            key,
            |b| 8 * (b.lift.len() + b.synth.len()) + b.kept_plan_bytes(),
            || Self::build(layout),
        )
    }

    /// Bytes of the inverse transform a basis keeps once planned (none above [`KEPT_PLAN_POINTS`]).
    fn kept_plan_bytes(&self) -> usize {
        if self.m <= KEPT_PLAN_POINTS { 16 * self.m } else { 0 }
    }

    /// The inverse transform over the circle of `m` points: planned on first use and kept, up to
    /// [`KEPT_PLAN_POINTS`] points; planned for each use above (as every transform was before), so
    /// that a basis of the largest circles still fits the cache.
    pub(super) fn inverse_fft(&self) -> Arc<dyn Fft<f64>> {
        if self.m > KEPT_PLAN_POINTS {
            return FftPlanner::new().plan_fft_inverse(self.m);
        }
        Arc::clone(self.inverse.0.get_or_init(|| FftPlanner::new().plan_fft_inverse(self.m)))
    }

    /// Number of lifted coordinates.
    pub fn dim(&self) -> usize {
        self.lift.len()
    }

    /// Circle size m.
    pub fn circle(&self) -> usize {
        self.m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basis(m: usize) -> KdeBasis {
        KdeBasis {
            m,
            stride: 1,
            kmax: 0,
            lift: vec![1.0],
            synth: vec![1.0],
            stat_sensitivity: 1.0,
            float_error: 0.0,
            inverse: InversePlan::default(),
        }
    }

    /// A basis keeps its inverse transform up to `KEPT_PLAN_POINTS` points (and the cache counts it),
    /// and plans one per use above, so that the largest circles' bases still fit the cache.
    #[test]
    fn a_basis_keeps_its_plan_only_up_to_the_kept_size() {
        let small = basis(KEPT_PLAN_POINTS);
        assert!(Arc::ptr_eq(&small.inverse_fft(), &small.inverse_fft()));
        assert_eq!(small.kept_plan_bytes(), 16 * KEPT_PLAN_POINTS);
        let large = basis(2 * KEPT_PLAN_POINTS);
        let (a, b) = (large.inverse_fft(), large.inverse_fft());
        assert!(!Arc::ptr_eq(&a, &b) && a.len() == 2 * KEPT_PLAN_POINTS, "planned per use, of the right size");
        assert_eq!(large.kept_plan_bytes(), 0);
        assert!(large.inverse.0.get().is_none(), "nothing kept");
    }
}
