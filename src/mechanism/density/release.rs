//! The private KDE mechanism (SPEC §2, §6): its privacy map and its release, as
//! post-processing of an exact discrete Gaussian mechanism on lifted coordinates.
//!
//! The statistic `v` (bin weights, or exact kernel values in exact mode) lives on a regular
//! lattice that holds every bin and every grid point ([`KdeLayout::lattice`]). Wrapped on a
//! circle of m lattice points (m a power of two, padded so the kernel has decayed to
//! exp(−50) at the wrap), the periodised kernel matrix is a circulant `C = Q Λ Qᵀ` with the
//! real orthonormal DFT basis Q and the closed-form spectrum
//! `λ_k = (h√(2π)/u)·Σ_n exp(−2π²(h/u)²(k/m + n)²)` (Poisson summation).
//!
//! * **Binned mode**: `w = Λ^{1/2} Qᵀ v`, keeping frequencies with `λ_k ≥ 1e-13·λ_0`. One row
//!   moves v by `(1−θ)e_l + θe_{l+1}`, so `‖Δw‖² ≤ max diag(QΛQᵀ)·1² = (1/m)Σ_kept λ_k ≈ 1`.
//!   The release `A w̃` with `A = P Q Λ^{1/2}` has mean `P C v`, the binned kernel sum.
//! * **Exact mode** (tiny h, no bins): `w = Λ^{-1/2} Qᵀ v` (all frequencies; λ is bounded
//!   below because the grid step exceeds 0.9h). One row adds the kernel's values at the
//!   lattice points, whose Mahalanobis norm is ≤ ‖K_per(·,x)‖_H = 1 plus the rounding and
//!   8h-truncation error; `A w̃` has mean v itself.
//!
//! `w` is computed in double-double from the exact integer statistic, rounded to `γℤ` and
//! released with iid exact discrete Gaussian noise ([`LatticeMechanism`]); σ comes from the
//! zCDP calibration. Everything after that — the inverse transform, clamping, normalising,
//! the mass estimate — is post-processing.

use std::sync::{Arc, OnceLock};

use rand::Rng;
use rustfft::num_complex::Complex;

use crate::mechanism::contribution::Contribution;
use crate::mechanism::density::kde::{Grid, KdeLayout, TRUNCATION_BANDWIDTHS};
use crate::mechanism::density::kernel::{GaussianSum, NodeKernel};
use crate::mechanism::density::sobolev::SobolevMap;
use crate::mechanism::noise::bands::{self, Taps};
use crate::mechanism::noise::cache::{PublicCache, stored_quantile};
use crate::mechanism::noise::calibration::{self, Calibration};
use crate::mechanism::noise::double_double::{self, DD, DD_OP_ERR};
use crate::mechanism::noise::lattice::{LatticeMechanism, ROW_LIMIT};
use crate::mechanism::sums::most_heap_bytes;

pub use super::basis::{KdeBasis, MAX_CIRCLE, MAX_LATTICE, SPECTRUM_CUTOFF};
pub use super::error::MechanismError;
pub use super::normalise::{Normalise, projection_shift, projection_shift_weighted, trapezoid};

/// Largest circle (lattice points) on which an ICLP release's band is simulated.
pub const ICLP_BAND_MAX_CIRCLE: usize = 1 << 16;
/// RKHS sensitivity of the kernel sum under adding or removing one row (before the
/// numerical slack the lifted coordinates add).
pub const KDE_SENSITIVITY: f64 = 1.0;
/// All public parameters of one `private_kde` release.
#[derive(Debug, Clone, PartialEq)]
pub struct KdeSpec {
    /// Output grid.
    pub grid: Grid,
    /// Kernel bandwidth h.
    pub bandwidth: f64,
    /// Privacy parameter ε.
    pub epsilon: f64,
    /// Privacy parameter δ.
    pub delta: f64,
    /// σ calibration.
    pub calibration: Calibration,
    /// How the released kernel sum becomes a density.
    pub normalise: Normalise,
}

/// One private KDE release.
#[derive(Debug, Clone, PartialEq)]
pub struct KdeRelease {
    /// The grid points.
    pub x: Vec<f64>,
    /// The density on the grid, or None when the released curve carries less than one
    /// point's mass (`Z ≤ sqrt(2π)·h`).
    pub density: Option<Vec<f64>>,
    /// `Z/(sqrt(2π)·h)`: a noisy estimate of the number of values in `[lo, hi]`.
    pub mass: f64,
    /// What the noisy sum was divided by to give the density (NaN without one).
    pub normaliser: f64,
    /// The L2 projection's shift c (0 for the other normalisations).
    pub shift: f64,
    /// The smoothing the noiseless release applies, as the sd of its effective kernel
    /// ([`KdeMechanism::smoothing`]): what the bands describe.
    pub bandwidth: f64,
}

/// Simultaneous level-α bands of a KDE release, as half-widths on the grid in density units.
#[derive(Debug, Clone, PartialEq)]
pub struct KdeBands {
    /// Covers the privacy noise: `P(sup_k |noise_k| ≤ band_k) ≥ 1 − α`, from (σ, h, grid) alone.
    pub noise: Vec<f64>,
    /// Plug-in band adding the sampling error of the kernel estimate (estimated from the
    /// released density and mass); None when the released mass is below 2.
    pub total: Option<Vec<f64>>,
}

/// The private KDE mechanism for fixed public parameters.
#[derive(Debug, Clone)]
pub struct KdeMechanism {
    spec: KdeSpec,
    layout: KdeLayout,
    basis: Arc<KdeBasis>,
    lattice: LatticeMechanism,
    /// The pure-ε release (δ = 0), if this is one.
    laplace: Option<LaplaceNodes>,
    /// The pure-ε release's kernel weights on the nodes at each grid point and its mean noise
    /// variance factor: public geometry, each computed once per mechanism when first needed (a
    /// GROUP BY releases every group with one mechanism; planning needs only the factor) and
    /// shared by its clones.
    node_tables: Arc<NodeTables>,
    /// The Sobolev-space (H¹, exponential-kernel noise) release, if this is one.
    sobolev: Option<SobolevMap>,
    /// The ICLP release (Lin & Reimherr §4.4): discrete Laplace noise on the lifted coordinates.
    iclp: bool,
}

/// The pure-ε release's public tables ([`KdeMechanism::node_taps_at_grid`],
/// [`KdeMechanism::noise_variance`]).
#[derive(Debug, Default)]
struct NodeTables {
    taps: OnceLock<Vec<Taps>>,
    variance_factor: OnceLock<f64>,
}

/// Which release a [`KdeMechanism`] makes besides the Gaussian one on the lifted coordinates.
enum Form {
    Gaussian,
    Sobolev(SobolevMap),
    Iclp,
    Laplace(LaplaceNodes),
}

/// The refusal of a release that needs a linearly binned statistic at a bandwidth too small for
/// one (`what` names the release, `binned` what it bins, `alternative` another way out).
fn needs_binned(spec: &KdeSpec, what: &str, binned: &str, alternative: &str) -> MechanismError {
    MechanismError::Noise(format!(
        "{what} needs a bandwidth of at least {:e} for a grid of {} points on [{}, {}] (its {binned} linearly \
         binned); use a larger bandwidth or fewer points{alternative}",
        16.0 * (spec.grid.hi - spec.grid.lo) / crate::mechanism::density::kde::MAX_BINS as f64,
        spec.grid.points,
        spec.grid.lo,
        spec.grid.hi
    ))
}

/// `√(a² + b)` for `a, b ≥ 0`: one square root where neither term can overflow (every band of
/// a reachable release), `hypot` otherwise. A function of released numbers only.
fn root_sum_square(a: f64, b: f64) -> f64 {
    if a < 1e150 && b < 1e300 { (a * a + b).sqrt() } else { a.hypot(b.sqrt()) }
}

/// `Σ_i weight_i·w[first + i]`: a pure-ε release's kernel sum at one point, summed in four
/// lanes (one fixed order, so the same bits wherever the release is evaluated).
fn tap_sum(t: &Taps, w: &[f64]) -> f64 {
    let w = &w[t.first..t.first + t.weights.len()];
    let (weights, weights_rest) = t.weights.as_chunks::<4>();
    let (values, values_rest) = w.as_chunks::<4>();
    let mut lanes = [0.0f64; 4];
    for (k, v) in weights.iter().zip(values) {
        for j in 0..4 {
            lanes[j] += k[j] * v[j];
        }
    }
    let rest: f64 = weights_rest.iter().zip(values_rest).map(|(k, v)| k * v).sum();
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + rest
}

/// The pure-ε KDE (δ = 0): the binned statistic linearly re-binned onto nodes every r bins
/// (spacing ≤ h/2), discrete Laplace noise on the node counts — one row moves them by weights
/// that sum to exactly 1, so the L1 sensitivity is 1 — and the kernel sum of the noisy counts
/// at the grid (post-processing). Re-binning is exact: the coarse hat functions are piecewise
/// linear on the fine bins, so fine-then-coarse linear binning equals coarse linear binning.
#[derive(Debug, Clone, PartialEq)]
struct LaplaceNodes {
    /// Bins per node.
    r: usize,
    /// Position of node 0 (= bin 0).
    origin: f64,
    /// Node spacing.
    spacing: f64,
    /// Number of nodes.
    nodes: usize,
    /// The kernel applied to the noisy counts, and its components at (h, spacing).
    kernel: NodeKernel,
    parts: GaussianSum,
}

impl KdeMechanism {
    /// The privacy map: validates every parameter and returns the noise standard deviation
    /// of one lifted coordinate (≈ σ of the released kernel sum).
    pub fn sigma_for(spec: &KdeSpec) -> Result<f64, MechanismError> {
        Ok(Self::new(spec.clone())?.sigma())
    }

    /// Validates the parameters and fixes the basis, the lattice and the noise.
    pub fn new(spec: KdeSpec) -> Result<Self, MechanismError> {
        Self::with_contribution(spec, Contribution::ROW)
    }

    /// The mechanism when one privacy unit contributes up to `c.rows` rows to each of up to
    /// `c.groups` groups (SPEC §7): each group's lifted coordinates move by at most
    /// `rows·Δ` (+ the float slack, once per group), and the noise covers all groups jointly.
    pub fn with_contribution(spec: KdeSpec, c: Contribution) -> Result<Self, MechanismError> {
        let layout = KdeLayout::new(spec.grid, spec.bandwidth).map_err(MechanismError::Kde)?;
        if spec.delta == 0.0 {
            return Self::pure_epsilon(spec, layout, c);
        }
        let rho =
            calibration::zcdp_rho(spec.calibration, spec.epsilon, spec.delta).map_err(MechanismError::Calibration)?;
        let basis = KdeBasis::cached(&layout)?;
        let sensitivity = c.per_group() * basis.stat_sensitivity + 2.0 * basis.float_error;
        let lattice = LatticeMechanism::gaussian_over(sensitivity, basis.dim(), rho, c.groups)?;
        Ok(Self::assemble(spec, layout, basis, lattice, Form::Gaussian))
    }

    /// The Sobolev-space release (Hall et al. §4.2, [`crate::mechanism::density::sobolev`]): the same statistic and
    /// post-processing, noise from the exponential kernel `exp(−|s − t|/h)` with the H¹
    /// sensitivity bound. Needs δ > 0 and a binned statistic.
    pub fn sobolev(spec: KdeSpec, c: Contribution) -> Result<Self, MechanismError> {
        if spec.delta == 0.0 {
            return Err(MechanismError::Noise(
                "the Sobolev-space release adds a Gaussian process: it needs delta > 0".into(),
            ));
        }
        let layout = KdeLayout::new(spec.grid, spec.bandwidth).map_err(MechanismError::Kde)?;
        let Some(map) = SobolevMap::new(spec.grid, &layout) else {
            return Err(needs_binned(&spec, "space => 'sobolev'", "statistic is", ""));
        };
        let rho =
            calibration::zcdp_rho(spec.calibration, spec.epsilon, spec.delta).map_err(MechanismError::Calibration)?;
        let sensitivity =
            c.per_group() * crate::mechanism::density::sobolev::h1_sensitivity() + 2.0 * map.float_slack();
        let lattice = LatticeMechanism::gaussian_over(sensitivity, spec.grid.points, rho, c.groups)?;
        let basis = KdeBasis::cached(&layout)?;
        Ok(Self::assemble(spec, layout, basis, lattice, Form::Sobolev(map)))
    }

    /// The ICLP release (Lin & Reimherr §4.4; pure ε, `mechanism => 'iclp'`): the Gaussian
    /// release's lifted coordinates `Λ^{1/2}Qᵀv` with iid discrete Laplace noise instead — a
    /// Laplace process whose covariance is the kernel's. One row moves the coordinates by a convex
    /// combination of two bins' columns `Λ^{1/2}Qᵀe_b`; each frequency k ≥ 1 contributes the pair
    /// `√(2λ_k/m)·(cos, sin)`, whose L1 norm is ≤ `2·√(λ_k/m)` (`|cos| + |sin| ≤ √2`), and k = 0
    /// (and m/2) `√(λ_k/m)`: so `Δ₁ = Σ_c lift_c/√m` over the real coordinates. The L2 float bound
    /// times √dim covers the L1 float error. Needs a binned statistic.
    pub fn iclp(spec: KdeSpec, c: Contribution) -> Result<Self, MechanismError> {
        let layout = KdeLayout::new(spec.grid, spec.bandwidth).map_err(MechanismError::Kde)?;
        if !layout.is_binned() {
            return Err(needs_binned(&spec, "mechanism => 'iclp'", "statistic is", ""));
        }
        if !(spec.epsilon.is_finite() && spec.epsilon > 0.0) {
            return Err(MechanismError::Noise(format!("epsilon must be a finite number > 0, got {}", spec.epsilon)));
        }
        let basis = KdeBasis::cached(&layout)?;
        let delta_1 = Self::iclp_sensitivity(&basis);
        let float_l1 = (basis.dim() as f64).sqrt() * basis.float_error;
        let lattice = LatticeMechanism::laplace_over(
            c.per_group() * delta_1 + 2.0 * float_l1,
            basis.dim(),
            spec.epsilon,
            c.groups,
        )?;
        Ok(Self::assemble(spec, layout, basis, lattice, Form::Iclp))
    }

    fn iclp_sensitivity(basis: &KdeBasis) -> f64 {
        basis.lift.iter().sum::<f64>() / (basis.m as f64).sqrt() * (1.0 + 1e-12)
    }

    /// The ICLP release's proven L1 sensitivity of the lifted coordinates (before slack).
    pub fn iclp_l1_sensitivity(&self) -> f64 {
        Self::iclp_sensitivity(&self.basis)
    }

    /// Whether this is the ICLP (Laplace-process) release.
    pub fn is_iclp(&self) -> bool {
        self.iclp
    }

    /// Whether this is the Sobolev-space release.
    pub fn is_sobolev(&self) -> bool {
        self.sobolev.is_some()
    }

    /// The pure-ε release at `spec.bandwidth` over the binned statistic of another layout, with
    /// nodes about `node_spacing` apart (a whole number of bins, at least one): `bandwidth =>
    /// 'auto'` accumulates one fine statistic and releases at the chosen h and spacing.
    pub fn pure_epsilon_on(
        spec: KdeSpec,
        layout: KdeLayout,
        c: Contribution,
        node_spacing: f64,
    ) -> Result<Self, MechanismError> {
        Self::pure_epsilon_with_kernel(spec, layout, c, node_spacing, NodeKernel::Gaussian)
    }

    /// The fixed bandwidth's pure-ε release: nodes h/2 apart (at most), known before any row,
    /// so rows are counted straight onto them ([`Self::counting_on_nodes`]).
    fn pure_epsilon(spec: KdeSpec, layout: KdeLayout, c: Contribution) -> Result<Self, MechanismError> {
        let spacing = 0.5 * spec.bandwidth;
        Ok(Self::pure_epsilon_with_kernel(spec, layout, c, spacing, NodeKernel::Gaussian)?.counting_on_nodes())
    }

    /// The same pure-ε release with its statistic laid out on its nodes instead of the bins `r`
    /// to a node ([`KdeLayout::coarsened`]): the same nodes, so the same release and the same
    /// stored form, from an `r` times smaller statistic (each row's one read-modify-write lands
    /// in a table that stays in the nearest caches, and the states partitions hand on shrink
    /// alike). The lifted basis stays the one of the finer layout (only the memory plan reads
    /// it). Any other release is returned unchanged.
    fn counting_on_nodes(mut self) -> Self {
        if let Some(n) = &mut self.laplace
            && let Some(nodes) = self.layout.coarsened(n.r)
        {
            debug_assert_eq!(nodes.bins(), Some((n.origin, n.spacing, n.nodes)));
            self.layout = nodes;
            n.r = 1;
        }
        self
    }

    /// [`Self::pure_epsilon_on`] smoothing the noisy counts with `kernel` at scale
    /// `spec.bandwidth` (at least [`NodeKernel::min_ratio`] node spacings).
    pub fn pure_epsilon_with_kernel(
        spec: KdeSpec,
        layout: KdeLayout,
        c: Contribution,
        node_spacing: f64,
        kernel: NodeKernel,
    ) -> Result<Self, MechanismError> {
        let Some((origin, bin_spacing, nbins)) = layout.bins() else {
            return Err(needs_binned(&spec, "the pure-ε KDE (delta => 0)", "counts are", ", or delta > 0"));
        };
        if !(spec.epsilon.is_finite() && spec.epsilon > 0.0) {
            return Err(MechanismError::Noise(format!("epsilon must be a finite number > 0, got {}", spec.epsilon)));
        }
        if !(node_spacing.is_finite() && node_spacing > 0.0) {
            return Err(MechanismError::Noise(format!("the node spacing must be > 0, got {node_spacing}")));
        }
        let r = ((node_spacing / bin_spacing).floor().min(nbins as f64) as usize).max(1);
        let nodes = (nbins - 1).div_ceil(r) + 1;
        let spacing = r as f64 * bin_spacing;
        let parts = match kernel {
            NodeKernel::Gaussian => Some(GaussianSum::normal(spec.bandwidth)),
            NodeKernel::Sixth if spec.bandwidth >= kernel.min_ratio() * node_spacing * (1.0 - 1e-9) => {
                kernel.on_nodes(spec.bandwidth, spacing)
            }
            NodeKernel::Sixth => None,
        };
        let Some(parts) = parts else {
            return Err(MechanismError::Noise(format!(
                "the {} kernel needs a bandwidth of at least {} node spacings, got {} for nodes {node_spacing} apart",
                kernel.name(),
                kernel.min_ratio(),
                spec.bandwidth
            )));
        };
        // Each coordinate is an exact integer times the double-double 1/r (relative error
        // ≤ 2 ops): over all nodes the L1 error is ≤ 2·DD_OP_ERR·(total mass ≤ ROW_LIMIT rows).
        let float_error = 2.0 * DD_OP_ERR * ROW_LIMIT;
        let lattice = LatticeMechanism::laplace_over(c.per_group() + 2.0 * float_error, nodes, spec.epsilon, c.groups)?;
        let basis = KdeBasis::cached(&layout)?;
        Ok(Self::assemble(
            spec,
            layout,
            basis,
            lattice,
            Form::Laplace(LaplaceNodes { r, origin, spacing, nodes, kernel, parts }),
        ))
    }

    fn assemble(spec: KdeSpec, layout: KdeLayout, basis: Arc<KdeBasis>, lattice: LatticeMechanism, form: Form) -> Self {
        let (laplace, sobolev, iclp) = match form {
            Form::Gaussian => (None, None, false),
            Form::Sobolev(map) => (None, Some(map), false),
            Form::Iclp => (None, None, true),
            Form::Laplace(nodes) => (Some(nodes), None, false),
        };
        KdeMechanism { spec, layout, basis, lattice, laplace, node_tables: Arc::default(), sobolev, iclp }
    }

    /// The pure-ε release's nodes: (position of node 0, spacing, count).
    pub fn nodes(&self) -> Option<(f64, f64, usize)> {
        self.laplace.as_ref().map(|n| (n.origin, n.spacing, n.nodes))
    }

    /// Whether this is the pure-ε (discrete Laplace) release.
    pub fn is_pure_epsilon(&self) -> bool {
        self.laplace.is_some()
    }

    /// The pure-ε release's kernel sum of node counts `w` at x (the nodes within 8h).
    fn node_sum_at(&self, n: &LaplaceNodes, w: &[f64], x: f64) -> f64 {
        tap_sum(&self.node_taps(n, x), w)
    }

    /// The pure-ε release's taps at every grid point (computed once per mechanism).
    fn node_taps_at_grid(&self, n: &LaplaceNodes) -> &[Taps] {
        self.node_tables.taps.get_or_init(|| {
            let g = self.spec.grid;
            (0..g.points).map(|k| self.node_taps(n, g.at(k))).collect()
        })
    }

    /// `mean_k Σ_i K(t_k − node_i)²` over a sample of at most 257 grid points (computed once per
    /// mechanism, without the taps at every grid point).
    fn node_variance_factor(&self, n: &LaplaceNodes) -> f64 {
        *self.node_tables.variance_factor.get_or_init(|| {
            let g = self.spec.grid;
            let sample = g.points.min(257);
            (0..sample)
                .map(|j| {
                    let x = g.lo + (g.hi - g.lo) * j as f64 / (sample - 1).max(1) as f64;
                    self.node_taps(n, x).weights.iter().map(|k| k * k).sum::<f64>()
                })
                .sum::<f64>()
                / sample as f64
        })
    }

    /// The noise variance of the released kernel sum at a grid point, averaged over the grid
    /// (what `mechanism => 'auto'` compares): σ² for the Gaussian release; for the pure-ε one
    /// `σ²·mean_k Σ_i K(t_k − node_i)²`.
    pub fn noise_variance(&self) -> f64 {
        let s2 = self.sigma().powi(2);
        let Some(n) = &self.laplace else { return s2 };
        s2 * self.node_variance_factor(n)
    }

    /// The parameters.
    pub fn spec(&self) -> &KdeSpec {
        &self.spec
    }

    /// Layout of the sufficient statistic.
    pub fn layout(&self) -> &KdeLayout {
        &self.layout
    }

    /// Memory one call needs (bytes): `(state, work)` — the exact state of one accumulator
    /// (`i128` per entry) and the release's working memory (the lifted basis and the
    /// double-double transform and synthesis over the circle, 96 B per circle point, an
    /// upper bound on what `release` allocates).
    pub fn memory_bytes(&self) -> (u64, u64) {
        let state = most_heap_bytes(self.layout.state_len(), self.layout.buffers());
        if self.sobolev.is_some() {
            // Grid sums, whitened coordinates and the synthesis: a few vectors of the grid's length.
            return (state, 64 * self.spec.grid.points as u64);
        }
        let b = &self.basis;
        let mut work = 8 * (b.lift.len() + b.synth.len()) as u64 + 96 * b.m as u64;
        if let Some(n) = &self.laplace {
            // The node tables: at most 2·8h/spacing + 1 weights (and their index) per grid point.
            let taps = (2.0 * TRUNCATION_BANDWIDTHS * n.parts.widest() / n.spacing).ceil() as u64 + 3;
            work += 8 * taps * self.spec.grid.points as u64;
        }
        (state, work)
    }

    /// The lifted basis.
    pub fn basis(&self) -> &KdeBasis {
        &self.basis
    }

    /// The discrete mechanism on the lifted coordinates.
    pub fn lattice(&self) -> &LatticeMechanism {
        &self.lattice
    }

    /// Noise standard deviation of a lifted coordinate (≈ σ of the released kernel sum).
    pub fn sigma(&self) -> f64 {
        self.lattice.noise_sd()
    }

    /// Proven L2 sensitivity of the lifted coordinates (before floating-point and rounding
    /// slack), ≈ [`KDE_SENSITIVITY`].
    pub fn stat_sensitivity(&self) -> f64 {
        if self.sobolev.is_some() {
            return crate::mechanism::density::sobolev::h1_sensitivity();
        }
        self.basis.stat_sensitivity
    }

    /// The lifted coordinates `w` of a statistic, in double-double.
    pub fn lifted(&self, state: &[i128]) -> Vec<DD> {
        if let Some(map) = &self.sobolev {
            return map.lift(state);
        }
        if let Some(n) = &self.laplace {
            // Node counts: bin l = i·r + m gives (r − m)/r of its mass to node i, m/r to node i + 1.
            // An entry of a table within ROW_LIMIT rows is below 2^93 in magnitude; clamping at
            // 2^100 (1-Lipschitz, so the sensitivity holds for any state) keeps each product
            // below 2^120 (r ≤ MAX_BINS = 2^20), exact without an overflow-checked multiply.
            // Per node, Σ v·(r − m) = r·Σv − Σ m·v: one product per bin.
            const CLAMP: i128 = 1 << 100;
            let mut c = vec![0i128; n.nodes];
            for (i, bins) in state.chunks(n.r).enumerate() {
                let (mut mass, mut right) = (0i128, 0i128);
                for (m, &v) in bins.iter().enumerate() {
                    let v = v.clamp(-CLAMP, CLAMP);
                    mass = mass.saturating_add(v);
                    right = right.saturating_add(v * m as i128);
                }
                c[i] = c[i].saturating_add((n.r as i128).saturating_mul(mass).saturating_sub(right));
                // The last node's bins (m = 0 only) give nothing to a next one.
                if let Some(next) = c.get_mut(i + 1) {
                    *next = next.saturating_add(right);
                }
            }
            let inv_r = DD::from_i128(n.r as i128).recip();
            return c.iter().map(|&u| DD::from_i128(u).scale_pow2(-40).mul(inv_r)).collect();
        }
        // Every entry is converted (no branch on the data: the work is the same for any table).
        let v: Vec<DD> = state.iter().map(|&units| DD::from_i128(units).scale_pow2(-40)).collect();
        self.lift_entries(&v)
    }

    /// The lifted coordinates of statistic entries given in real units (double-double): the
    /// Gaussian release's `Λ^{1/2}Qᵀv` (binned mode), applied along each axis by the 2-D KDE.
    pub(crate) fn lift_entries(&self, entries: &[DD]) -> Vec<DD> {
        let mut v = vec![DD::default(); self.basis.m / self.basis.stride];
        v[..entries.len()].copy_from_slice(entries);
        let coords = double_double::real_dft_coordinates(&v, self.basis.stride, self.basis.kmax);
        coords.iter().zip(&self.basis.lift).map(|(c, &l)| c.mul_f64(l)).collect()
    }

    /// `(max lift factor, relative error of one lift)`: `‖fl(lift(v)) − lift(v)‖ ≤ max·rel·‖v‖`.
    pub(crate) fn lift_error(&self) -> (f64, f64) {
        let max_lift = self.basis.lift.iter().cloned().fold(0.0, f64::max);
        (max_lift, double_double::dft_relative_error(self.basis.m) + 2.0 * DD_OP_ERR)
    }

    /// `A·w̃`: the kernel sum on the grid for (noisy) lifted coordinates. Post-processing.
    pub fn curve_from_lifted(&self, w: &[f64]) -> Vec<f64> {
        if let Some(map) = &self.sobolev {
            return map.synthesise(w);
        }
        if let Some(n) = &self.laplace {
            return self.node_taps_at_grid(n).iter().map(|t| tap_sum(t, w)).collect();
        }
        let y = self.circle_from_lifted(w);
        let lat = self.layout.lattice();
        (0..self.spec.grid.points).map(|k| y[k * lat.grid_stride + lat.grid_offset]).collect()
    }

    /// The kernel sum at every point of the lattice circle (the grid's points among them; the
    /// Sobolev release's grid values).
    pub fn circle_from_lifted(&self, w: &[f64]) -> Vec<f64> {
        if let Some(map) = &self.sobolev {
            return map.synthesise(w);
        }
        if self.laplace.is_some() {
            return Vec::new(); // the pure-ε release is evaluated directly (`sum_at`)
        }
        let m = self.basis.m;
        let mut y = vec![Complex::new(0.0, 0.0); m];
        let (inv_m, inv_2m) = (1.0 / (m as f64).sqrt(), 1.0 / (2.0 * m as f64).sqrt());
        let mut c = 0;
        for k in 0..=self.basis.kmax {
            if k == 0 || 2 * k == m {
                y[k] = Complex::new(self.basis.synth[c] * w[c] * inv_m, 0.0);
                c += 1;
            } else {
                let s = self.basis.synth[c] * inv_2m;
                y[k] = Complex::new(s * w[c], -s * w[c + 1]);
                y[m - k] = y[k].conj();
                c += 2;
            }
        }
        self.basis.inverse_fft().process(&mut y);
        y.into_iter().map(|v| v.re).collect()
    }

    /// The released kernel sum at any x for released coordinates `w` and their lattice circle
    /// ([`Self::circle_from_lifted`]): read from the circle at lattice points, the
    /// trigonometric continuation between them; the pure-ε release's node sum everywhere.
    pub fn sum_at(&self, w: &[f64], circle: &[f64], x: f64) -> f64 {
        if let Some(map) = &self.sobolev {
            return map.continue_at(circle, x).unwrap_or(f64::NAN);
        }
        if let Some(n) = &self.laplace {
            return self.node_sum_at(n, w, x);
        }
        let j = self.lattice_position(x);
        let near = j.round();
        if (j - near).abs() < 1e-9 && near >= 0.0 && (near as usize) < circle.len() {
            circle[near as usize]
        } else {
            self.sum_at_position(w, j)
        }
    }

    /// The position of `x` on the lattice circle, in lattice steps (grid point k sits at
    /// `grid_stride·k + grid_offset`).
    pub fn lattice_position(&self, x: f64) -> f64 {
        let lat = self.layout.lattice();
        lat.grid_offset as f64 + (x - self.spec.grid.lo) / lat.unit
    }

    /// The kernel sum of lifted coordinates `w` at a real lattice position `j`: the same
    /// trigonometric sum [`Self::circle_from_lifted`] evaluates at the integers, at any `j` —
    /// the band-limited continuation of the released sample path (post-processing).
    pub fn sum_at_position(&self, w: &[f64], j: f64) -> f64 {
        let m = self.basis.m;
        let (inv_m, inv_2m) = (1.0 / (m as f64).sqrt(), 1.0 / (2.0 * m as f64).sqrt());
        let turn = 2.0 * std::f64::consts::PI * j / m as f64;
        let mut sum = 0.0;
        let mut c = 0;
        for k in 0..=self.basis.kmax {
            let (sin, cos) = (turn * k as f64).sin_cos();
            if k == 0 || 2 * k == m {
                sum += self.basis.synth[c] * w[c] * inv_m * cos;
                c += 1;
            } else {
                let s = self.basis.synth[c] * inv_2m;
                sum += 2.0 * s * (w[c] * cos + w[c + 1] * sin);
                c += 2;
            }
        }
        sum
    }

    /// The private part of a release: the noisy lifted coordinates on the lattice (exact
    /// discrete Gaussian noise). `rng = None` is the noiseless test hook.
    pub fn noisy_lifted<R: Rng + ?Sized>(&self, state: &[i128], rng: Option<&mut R>) -> Vec<f64> {
        self.lattice.release(&self.lifted(state), rng)
    }

    /// The noisy kernel sum `S̃` on the grid (post-processing of [`Self::noisy_lifted`]).
    pub fn noisy_sum<R: Rng + ?Sized>(&self, state: &[i128], rng: Option<&mut R>) -> Vec<f64> {
        self.curve_from_lifted(&self.noisy_lifted(state, rng))
    }

    /// Releases the statistic: noisy lifted coordinates, then the normalised curve.
    pub fn release<R: Rng + ?Sized>(&self, state: &[i128], rng: Option<&mut R>) -> KdeRelease {
        self.post_process(&self.noisy_sum(state, rng))
    }

    /// Post-processing of the released noisy sum `S̃` (free, SPEC §0).
    pub fn post_process(&self, noisy_sum: &[f64]) -> KdeRelease {
        let grid = self.spec.grid;
        let h = self.spec.bandwidth;
        let one_point = (2.0 * std::f64::consts::PI).sqrt() * h;
        let z = trapezoid(noisy_sum, grid.step());
        let mut release = KdeRelease {
            x: grid.xs(),
            density: None,
            mass: z / one_point,
            normaliser: f64::NAN,
            shift: 0.0,
            bandwidth: self.smoothing(),
        };
        if z > one_point {
            match self.spec.normalise {
                Normalise::Project => {
                    let g: Vec<f64> = noisy_sum.iter().map(|v| v / z).collect();
                    release.shift = projection_shift(&g, grid.step());
                    release.normaliser = z;
                }
                // ∫max(S̃,0) ≥ Z > 0, so this never divides by zero.
                Normalise::Rescale => {
                    release.normaliser =
                        trapezoid(&noisy_sum.iter().map(|v| v.max(0.0)).collect::<Vec<_>>(), grid.step())
                }
                Normalise::Raw => release.normaliser = z,
            }
            release.density = Some(noisy_sum.iter().map(|&v| self.density_of(&release, v)).collect());
        }
        release
    }

    /// The density a released kernel-sum value `v` becomes under the release's normalisation
    /// (the same arithmetic at the grid and anywhere else).
    pub fn density_of(&self, release: &KdeRelease, v: f64) -> f64 {
        match self.spec.normalise {
            Normalise::Project => (v / release.normaliser - release.shift).max(0.0),
            Normalise::Rescale => v.max(0.0) / release.normaliser,
            Normalise::Raw => v / release.normaliser,
        }
    }

    /// The level-α threshold `u` of the noise band: the released kernel sum's noise is a
    /// stationary process with sd σ and correlation `exp(−d²/2h²)` at lag d
    /// ([`bands::gaussian_kernel_threshold`]).
    pub fn noise_threshold(&self, alpha: f64) -> f64 {
        let g = self.spec.grid;
        if let Some(map) = &self.sobolev {
            // An Ornstein–Uhlenbeck path: correlation ρ between all neighbours.
            let theta = bands::path_angle(std::iter::repeat_n(map.rho(), g.points.saturating_sub(1)));
            return bands::sup_threshold(alpha, g.points, theta);
        }
        bands::gaussian_kernel_threshold(alpha, g.points, g.step(), self.spec.bandwidth)
    }

    /// The sd of the synthesis `A·ξ` at a grid point for iid unit-variance lifted coordinates
    /// ξ: the diagonal of `A·Aᵀ`, the same at every lattice point of the circle,
    /// `sqrt(Σ synth²/m)` (≈ 1: the kept spectrum sums to the kernel's value at 0).
    pub fn synthesis_sd(&self) -> f64 {
        (self.basis.synth.iter().map(|v| v * v).sum::<f64>() / self.basis.m as f64).sqrt()
    }

    /// The smoothing of the noiseless release, as the standard deviation of its effective
    /// kernel. Linear binning onto points `s` apart smooths like a hat of half-width `s`
    /// (variance `s²/6`) on top of the Gaussian kernel's h: the pure-ε release bins onto its
    /// nodes (h/2 apart at a fixed h, up to 5h/3 with `bandwidth => 'auto'`), the others onto
    /// bins ≤ h/16 apart, and exact mode not at all. So `sqrt(h² + s²/6)`.
    pub fn smoothing(&self) -> f64 {
        let h = self.spec.bandwidth;
        let s = match (&self.laplace, self.layout.bins()) {
            (Some(n), _) => n.spacing,
            (None, Some((_, spacing, _))) => spacing,
            (None, None) => 0.0,
        };
        self.node_kernel().smoothing(h, s)
    }

    /// The pure-ε release at x as weights on the nodes: the kernel's values at the nodes within
    /// its truncation reach (the release is their sum with the noisy counts, its noise the same
    /// sum with the node noise).
    fn node_taps(&self, n: &LaplaceNodes, x: f64) -> Taps {
        let h = self.spec.bandwidth;
        let reach = TRUNCATION_BANDWIDTHS * n.parts.widest();
        let first = (((x - reach - n.origin) / n.spacing).ceil().max(0.0) as usize).min(n.nodes);
        let last = ((((x + reach - n.origin) / n.spacing).floor() + 1.0).max(0.0) as usize).min(n.nodes);
        let node = |i: usize| n.origin + i as f64 * n.spacing;
        let weights = match n.kernel {
            NodeKernel::Gaussian => (first..last.max(first))
                .map(|i| crate::mechanism::density::kde::gaussian_kernel(x, node(i), h))
                .collect(),
            // Scaled like the Gaussian's `exp(−z²/2)`: integrating to √(2π)·h.
            NodeKernel::Sixth => {
                let scale = (2.0 * std::f64::consts::PI).sqrt() * h;
                (first..last.max(first)).map(|i| scale * n.parts.at(x - node(i))).collect()
            }
        };
        Taps { first, weights }
    }

    /// The kernel the pure-ε release applies to its counts (the Gaussian for the others).
    pub fn node_kernel(&self) -> NodeKernel {
        self.laplace.as_ref().map_or(NodeKernel::Gaussian, |n| n.kernel)
    }

    /// The pure-ε release's band threshold (quantile of the simulated standardised supremum
    /// from a public seed) and its sd profile `s_k` (per unit σ: the noise at grid point k has
    /// sd `σ·s_k`). The standardised process depends on the geometry in units of h only (grid
    /// points, step, node spacing, the grid's offset from node 0), which is the cache's key:
    /// every release with that geometry — any data, any ε, any automatic choice that lands on
    /// it — reuses one simulation.
    fn laplace_threshold(&self, n: &LaplaceNodes, alpha: f64) -> (f64, Vec<f64>) {
        let g = self.spec.grid;
        let h = self.spec.bandwidth;
        type Key = (usize, usize, u64, u64, u64, u64, NodeKernel);
        // The quantile and the profile (kernel weights only: dimensionless, a function of the
        // geometry too), so a cached geometry costs no kernel evaluations.
        static BANDS: PublicCache<Key, (f64, Vec<f64>)> = PublicCache::new(32 << 20);
        let key = (
            g.points,
            n.nodes,
            (g.step() / h).to_bits(),
            (n.spacing / h).to_bits(),
            ((g.lo - n.origin) / h).to_bits(),
            alpha.to_bits(),
            n.kernel,
        );
        let band = BANDS
            .get_or_try_insert(
                key,
                |(_, s)| 8 * (s.len() + 1),
                || {
                    let taps = self.node_taps_at_grid(n);
                    let q = stored_quantile("kde-laplace-band", &key, || {
                        bands::laplace_sup_quantile_banded(alpha, taps, n.nodes)
                    });
                    Ok::<_, std::convert::Infallible>((q, taps.iter().map(Taps::norm).collect()))
                },
            )
            .unwrap_or_else(|e| match e {});
        // |noise_k| ≤ q·b·s_k with b = σ/√2 the Laplace scale: in units of σ·s_k, q/√2.
        (band.0 / std::f64::consts::SQRT_2, band.1.clone())
    }

    /// The ICLP release's band threshold in units of σ: its noise on the grid is the synthesis
    /// `A·ℓ` of iid discrete Laplace lifted coordinates of sd σ, stationary with sd `σ·s`
    /// (`s² = Σ synth²/m ≈ 1`: the kept spectrum sums to the kernel's value at 0); `s` times the
    /// (1 − α) quantile of its standardised supremum, simulated from the public seed and cached
    /// per (grid, bandwidth, α). Each draw is one synthesis on the circle, so the simulation
    /// (≥ 500 draws) runs only for circles of at most [`ICLP_BAND_MAX_CIRCLE`] points (≈ 1 s the
    /// first time); larger ones have no band (a function of public parameters only).
    fn iclp_threshold(&self, alpha: f64) -> Option<f64> {
        if self.basis.m > ICLP_BAND_MAX_CIRCLE {
            return None;
        }
        let g = self.spec.grid;
        type Key = (u64, u64, usize, u64, u64);
        static QUANTILES: PublicCache<Key, f64> = PublicCache::new(1 << 20);
        let key = (g.lo.to_bits(), g.hi.to_bits(), g.points, self.spec.bandwidth.to_bits(), alpha.to_bits());
        let dim = self.lattice.dim();
        let m = self.basis.m;
        let s = self.synthesis_sd();
        let q = QUANTILES
            .get_or_try_insert(
                key,
                |_| 8,
                || {
                    let work = m * (usize::BITS - m.leading_zeros()) as usize;
                    let draws = (200_000_000 / work.max(1)).clamp(500, bands::SIMULATION_DRAWS);
                    let mut w = vec![0.0; dim];
                    Ok::<_, std::convert::Infallible>(stored_quantile("kde-iclp-band", &key, || {
                        bands::simulated_quantile(alpha, draws, |rng| {
                            w.iter_mut().for_each(|v| *v = bands::standard_laplace(rng) / std::f64::consts::SQRT_2);
                            self.curve_from_lifted(&w).iter().map(|v| (v / s).abs()).fold(0.0, f64::max)
                        })
                    }))
                },
            )
            .unwrap_or_else(|e| match e {});
        Some(*q * s)
    }

    /// Simultaneous level-α bands of a release (post-processing: public σ, kernel and grid,
    /// and for the plug-in band the released density and mass). None without a density.
    pub fn bands(&self, release: &KdeRelease, alpha: f64) -> Option<KdeBands> {
        let density = release.density.as_ref()?;
        let h = self.spec.bandwidth;
        let (u, profile) = match &self.laplace {
            None if self.iclp => (self.iclp_threshold(alpha)?, None),
            None => (self.noise_threshold(alpha), None),
            Some(n) => {
                let (q, s) = self.laplace_threshold(n, alpha);
                (q, Some(s))
            }
        };
        // Per-point noise sd in density units (the Laplace release's varies with the position
        // between nodes: sd_k = σ·s_k).
        let sigma = self.sigma();
        let sd = |k: usize| sigma * profile.as_ref().map_or(1.0, |s| s[k]) / release.normaliser;
        let noise: Vec<f64> = (0..density.len()).map(|k| u * sd(k)).collect();
        // Sampling error of a Gaussian-kernel estimate: Var f̂(x) ≈ f(x)·R(K)/(n·h) with
        // R(K) = 1/(2√π), correlation exp(−d²/4h²) at lag d. The sum of the two independent
        // errors is no rougher than the noise (its neighbour correlations are averages of the
        // two, so its path angle is at most the noise's): the noise's threshold covers it.
        // The sixth-order kernel's: `∫K²` of the kernel the data see, whose autocorrelation is
        // also its noise's (the node sum of `K(x − x_j)·K(y − x_j)` is `(K ∗ K)(x − y)/s`).
        let rough = match &self.laplace {
            Some(n) if n.kernel != NodeKernel::Gaussian => n.kernel.effective(h, n.spacing).roughness(),
            _ => 0.5 / (std::f64::consts::PI.sqrt() * h),
        };
        let total = (release.mass >= 2.0).then(|| {
            density
                .iter()
                .enumerate()
                .map(|(k, &f)| u * root_sum_square(sd(k), f.max(0.0) * rough / release.mass))
                .collect()
        });
        Some(KdeBands { noise, total })
    }
}

#[cfg(test)]
mod tests;
