//! Private RKHS minimizers (Hall, Rinaldo & Wasserman §4.3; Bousquet & Elisseeff 2002):
//! kernel regression with a Huber-type loss and a soft-margin kernel classifier, released by
//! output perturbation with exact discrete Gaussian noise (SPEC §6).
//!
//! # The estimator
//!
//! Public parameters fix an x box `[lo, hi]`, a bandwidth h, a penalty Λ > 0 and a loss ℓ.
//! The hypothesis space is the RKHS `H_D` of the kernel `k_D(s, t) = φ(s)ᵀφ(t)` of a public,
//! deterministic feature map `φ: ℝ → ℝ^D` (below); `f_w(x) = wᵀφ(x)`, `‖f_w‖_{H_D} = ‖w‖₂`.
//! The fit minimises the **unnormalised** objective
//!
//! ```text
//!     F_D(w) = Σ_{rows z ∈ D} ℓ_z(w) + (Λ/2)·‖w‖²
//! ```
//!
//! where a row's loss `ℓ_z` is a convex combination of the loss at the lattice points its values
//! are linearly binned to (below). Unnormalised, because the number of rows is private: the
//! usual `(1/n)Σ + λ‖f‖²` of the papers (neighbours *replace* one row, n public) has no
//! add/remove sensitivity bound that does not depend on n. With Λ fixed, more rows mean less
//! regularisation per row (the effective `λ = Λ/n`), exactly as a ridge penalty behaves.
//!
//! # Sensitivity (add/remove neighbours)
//!
//! **Claim.** If every `ℓ_z` is convex in w and `|ℓ_z(w) − ℓ_z(w')| ≤ L·κ·‖w − w'‖` for all
//! w, w' (L the loss's Lipschitz constant in the prediction, `κ ≥ sup ‖φ(x)‖` over the points
//! rows are binned to), then for `D' = D ∪ {z}` the minimizers satisfy
//! `‖w*_D − w*_{D'}‖₂ ≤ L·κ/Λ`.
//!
//! **Proof** (Bousquet–Elisseeff's argument, restated for add/remove). `F_D` is Λ-strongly
//! convex, so at its minimizer `F_D(v) − F_D(w*_D) ≥ (Λ/2)‖v − w*_D‖²` for every v; the same
//! holds for `F_{D'} = F_D + ℓ_z`. With `a = w*_D`, `b = w*_{D'}`:
//! `F_D(b) − F_D(a) ≥ (Λ/2)‖a − b‖²` and `F_{D'}(a) − F_{D'}(b) ≥ (Λ/2)‖a − b‖²`. Adding
//! them, the `F_D` terms cancel: `ℓ_z(a) − ℓ_z(b) ≥ Λ‖a − b‖²`. The left side is at most
//! `L·κ·‖a − b‖`, hence `‖a − b‖ ≤ L·κ/Λ`. ∎
//!
//! A privacy unit of at most K rows per group adds K such terms: `K·L·κ/Λ` (SPEC §7). The
//! bound is on the coefficient vector, i.e. on the RKHS norm of the fitted function, which is
//! what Hall et al.'s Gaussian-process release needs; here the "process" is `φ(t)ᵀZ` with
//! `Z ~ N(0, σ²I_D)` — a Gaussian process with covariance `σ²k_D` — so no infinite-dimensional
//! argument is needed.
//!
//! **The approximation.** `k_D` approximates the Gaussian kernel `exp(−(s−t)²/(2h²))`; the
//! proof above is about `k_D` itself, so the approximation changes what is estimated (a
//! slightly different, still smooth, function class), never the privacy guarantee.
//! `φ` is a truncated Fourier series of the Gaussian kernel periodised with period
//! `P = (hi − lo) + 10h` (images are ≥ 10h away, e^{-50}): with `θ = x − lo`,
//! `ω_j = 2πj/P` and `a_j = (h√(2π)/P)·e^{−h²ω_j²/2}` for `j ≤ J = ⌈9P/(2πh)⌉`,
//! `φ(x) = (√a₀, √(2a_j)·cos(ω_j θ), √(2a_j)·sin(ω_j θ))`, so `‖φ(x)‖² = a₀ + 2Σa_j ≈ 1`
//! for every x (κ ≈ 1 exactly up to rounding; the bound uses the computed sum times
//! `1 + 10⁻¹²`, which covers the rounding of the float features, D ≤ 1 024).
//!
//! **The losses** (both convex, smooth and L-Lipschitz in the prediction f):
//! * regression, the pseudo-Huber loss of the residual r = y − f with scale c:
//!   `ℓ = c²(√(1 + (r/c)²) − 1)`, `|∂ℓ/∂f| < c` (L = c), `∂²ℓ/∂f² ≤ 1`. Quadratic for |r| ≪ c,
//!   so with c of the order of the y range it is regularised least squares on clipped y.
//! * classification (labels ±1), the smoothed hinge of the margin z = y·f with smoothing s:
//!   `ℓ = ½(1 − z + √((1 − z)² + s²))`, `|∂ℓ/∂f| < 1` (L = 1), `∂²ℓ/∂f² ≤ 1/(2s)`; the hinge
//!   `max(0, 1 − z)` of the soft-margin SVM as s → 0 (Chaudhuri et al. 2011 smooth it too).
//!
//! # The statistic (exact, mergeable, any number of rows)
//!
//! x is clamped to `[lo, hi]` and linearly binned to `nb` bins (spacing ≤ h/8); for regression
//! y is clamped to `[lo_y, hi_y]` and linearly binned to 33 levels, for classification the
//! label picks one of two levels (−1: label ≤ 0, +1: label > 0). Each row adds fixed-point
//! weights ≥ 0 summing to exactly one unit (2⁻⁴⁰ units, as the KDE) to the `nb × levels`
//! lattice; NULL or NaN in either value drops the row (a row that adds nothing). A row's loss is
//! `Σ_c ω_c·ℓ(y_c, f(x_c))` over its cells: a convex combination of L-Lipschitz convex losses, so
//! the claim applies. The objective depends on the data only through these exact integers
//! (merge order cannot matter), so training scales to any number of rows in one pass.
//!
//! **Cell cap.** The objective uses `min(m_c, C)` for each cell's mass, with the public cap
//! `C = min(10¹⁰·Λ/(ℓ''_max·κ²·cells), 10¹¹/cells)` rows. Adding a row changes each capped mass
//! by some `δ_c ∈ [0, ω_c]`, so `F_{D'} − F_D = Σ_c δ_c·ℓ_c` is still convex and `L·κ`-Lipschitz
//! (a sub-convex combination): the claim holds unchanged. What the cap buys is a Newton system
//! whose condition number is ≤ 1 + 10¹⁰ and a total mass ≤ 10¹¹ for *every* table, so the
//! certificate below is reachable in double-double. It binds only when a cell holds more than C
//! rows: at the default Λ = 100 and bandwidth that is ≈ 2·10⁷ rows per cell (the 10¹¹-row total binds), i.e. never in
//! practice; a very small Λ lowers it (Λ = 10⁻⁶ with the classifier: ≈ 1 row per cell — such a
//! penalty asks for a fit the noise of `1/Λ` would drown anyway).
//!
//! # Computing the minimizer, and its certificate
//!
//! Damped Newton in double-double (gradient and objective in double-double, the Newton system in
//! f64; the Hessian is assembled from the Fourier sums `Σ_b q_b cos(kθ_b)`, `Σ_b q_b sin(kθ_b)`),
//! started from the ridge least-squares fit of the levels, always 40 steps of 6 step-size trials
//! (constant work), more only where the certificate needs them. The classifier's smoothing is at
//! least 0.1: a sharper hinge needed more than the fixed steps at ordinary penalties. Likewise the
//! regression's pseudo-Huber scale is at least 10⁻² of `hi_y − lo_y` ([`MIN_HUBER_FRACTION`]): a
//! nearly absolute loss (scale 10⁻⁵ with Λ = 10⁻⁴) left Newton uncertified at its cap, and the
//! uncertified iterate was released.
//! The computed `ŵ` is used only with an a-posteriori certificate: by strong convexity
//! `‖ŵ − w*‖ ≤ ‖∇F(ŵ)‖/Λ`, and the gradient is evaluated in double-double with a stated
//! rounding bound. Newton stops once the certified distance is ≤ `η = 2⁻²⁰·L·κ/Λ`; the
//! calibrated sensitivity is `K·L·κ/Λ + 2η` (both neighbours' solver errors) plus the lattice
//! rounding slack. With δ = 0 (ICLP, Lin & Reimherr §4.4) the coefficients get iid discrete Laplace
//! noise for the L1 sensitivity `√D·(K·L·κ/Λ + 2η)` (Cauchy–Schwarz on the L2 bound): pure ε, a
//! Laplace process with covariance ∝ k_D, and √D times the L2 bound in scale — the price of pure ε.
//! **Residual assumption**: the solver reaches the certificate for every accepted parameter (it
//! always has in the adversarial tests, `tests/kernel_fit_privacy.rs`, which include the smallest
//! accepted huber scale and penalty; the domain is cut where it did not).

use std::sync::OnceLock;

use nalgebra::{DMatrix, DVector};
use rand::Rng;

use crate::mechanism::contribution::Contribution;
use crate::mechanism::density::binning::linear_bin;
use crate::mechanism::density::kde::{FIXED_ONE, Grid};
use crate::mechanism::density::release::MechanismError;
use crate::mechanism::noise::calibration;
use crate::mechanism::noise::calibration::Calibration;
use crate::mechanism::noise::double_double::{DD, DD_OP_ERR};
use crate::mechanism::noise::lattice::LatticeMechanism;
use crate::mechanism::ranges;
use crate::mechanism::sums::{BufferedSums, Buffers, most_heap_bytes};

pub use super::loss::{Features, FitLoss, PERIOD_MARGIN};

/// x bins per bandwidth (linear binning's error relative to the kernel is (1/8)²/8 ≈ 0.2 %).
pub const BINS_PER_BANDWIDTH: f64 = 8.0;
/// Fewest x bins.
pub const MIN_BINS: usize = 33;
/// Largest `(hi − lo)/bandwidth` (the feature count grows with it: D ≈ 2.9·(hi−lo)/h + 30).
pub const MAX_RANGE_OVER_BANDWIDTH: f64 = 256.0;
/// Largest bandwidth relative to the box (the kernel would be flat).
pub const MAX_BANDWIDTH_OVER_RANGE: f64 = 1024.0;
/// Levels of the clamped response of a regression.
pub const Y_LEVELS: usize = 33;
/// Penalties accepted: `[MIN_PENALTY, MAX_PENALTY]`.
pub const MIN_PENALTY: f64 = 1e-6;
/// See [`MIN_PENALTY`].
pub const MAX_PENALTY: f64 = 1e15;
/// Newton steps before the solver gives up on the certificate.
pub const MAX_NEWTON_STEPS: usize = 200;
/// Newton steps every solve takes (constant work, see [`KernelFitMechanism::solve`]).
pub const FIXED_STEPS: usize = 40;
/// Step sizes evaluated in each of the fixed steps.
const LINE_STEPS: usize = 6;
/// Smallest pseudo-Huber scale relative to `hi_y − lo_y`. Below 10⁻⁴ the damped Newton solver
/// stops uncertified at its cap on adversarial tables (the iterate was off by 10⁷–10⁹ η, and one
/// released pair moved by ≈ 6× the calibrated Δ); at 10⁻³ it certifies within ≈ 90 steps; the bound
/// keeps a decade of margin (`tests/kernel_fit_privacy.rs` checks the boundary).
pub const MIN_HUBER_FRACTION: f64 = 1e-2;
/// Smallest smoothing of the classifier's hinge (its curvature is ≤ 1/(2s)).
pub const MIN_SMOOTHING: f64 = 0.1;
/// Largest condition number of the Newton system the cell cap allows.
pub const MAX_CONDITION: f64 = 1e10;
/// Largest total mass (rows) the cell cap allows.
pub const MAX_MASS: f64 = 1e11;
/// The certificate's tolerance: `η = 2^-CERTIFICATE_BITS · L·κ/Λ`.
const CERTIFICATE_BITS: i32 = 20;
/// Rows buffered before a flush (one row adds at most 2^40 to an entry).
const FLUSH_ROWS: usize = 1 << 22;

/// `penalty => 'auto'`: the share of the call's ε spent on the noisy count.
pub const AUTO_COUNT_SHARE: f64 = 0.05;

/// `penalty => 'auto'` (a plug-in rule from public parameters and the released row count ñ only:
/// post-processing): `Λ = 100·(ñ/1000)^{3/7}·(L/(B·ε))^{4/7}`, clamped to the accepted penalties,
/// with L the loss's Lipschitz constant, B the signal scale (half the response range; 1 for the
/// classifier's margin) and ε the fit's share. The noise's squared error falls as `(L/(Λε))²`
/// while the penalty's squared bias grows about as `(Λ/n)^{3/2}` (measured in the regression
/// study); balancing them gives the exponents, and the constant is the study's best Λ at n = 10³,
/// ε = 1 (see README "Accuracy").
pub fn auto_penalty(spec: &FitSpec, n: i64) -> f64 {
    let scale = match spec.loss {
        FitLoss::Huber(_) => (spec.y_range.1 - spec.y_range.0) / 2.0,
        FitLoss::Hinge(_) => 1.0,
    };
    let ratio = spec.loss.lipschitz() / (scale * spec.epsilon);
    let lambda = 100.0 * (n.max(1) as f64 / 1000.0).powf(3.0 / 7.0) * ratio.powf(4.0 / 7.0);
    if lambda.is_finite() { lambda.clamp(MIN_PENALTY, MAX_PENALTY) } else { MAX_PENALTY }
}

/// The exact row count of a statistic (every row adds exactly one unit of mass).
pub fn row_count(state: &[i128]) -> i128 {
    state.iter().fold(0i128, |a, &v| a.saturating_add(v)) >> 40
}

/// All public parameters of one fit.
#[derive(Debug, Clone, PartialEq)]
pub struct FitSpec {
    /// The x box and the output grid.
    pub grid: Grid,
    /// Kernel bandwidth h.
    pub bandwidth: f64,
    /// Penalty Λ of the unnormalised objective.
    pub penalty: f64,
    /// The loss.
    pub loss: FitLoss,
    /// Clamping range of the response (regression); (−1, 1) for a classifier.
    pub y_range: (f64, f64),
    /// Privacy parameter ε.
    pub epsilon: f64,
    /// Privacy parameter δ (> 0).
    pub delta: f64,
    /// σ calibration.
    pub calibration: Calibration,
}

/// The fitted function on the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct FitRelease {
    /// Grid points.
    pub x: Vec<f64>,
    /// The fitted function at the grid points.
    pub fit: Vec<f64>,
}

/// What the solver did (for tests and the bench).
#[derive(Debug, Clone, PartialEq)]
pub struct Solution {
    /// The coefficients, in double-double.
    pub w: Vec<DD>,
    /// Newton steps taken.
    pub steps: usize,
    /// Certified bound on ‖ŵ − w*‖.
    pub distance: f64,
    /// Whether `distance ≤ η`.
    pub certified: bool,
}

/// Tables the solver needs (built at release time only).
#[derive(Debug)]
struct SolverTables {
    /// φ at every bin, bin-major (nb × D).
    phi: Vec<f64>,
    /// cos(kθ_b), sin(kθ_b) for k = 0..=2J, bin-major (nb × (2J+1)).
    cos: Vec<f64>,
    sin: Vec<f64>,
}

/// The private kernel fit for fixed public parameters.
#[derive(Debug)]
pub struct KernelFitMechanism {
    spec: FitSpec,
    features: Features,
    /// Number of x bins and their spacing.
    bins: usize,
    spacing: f64,
    /// Response levels.
    levels: Vec<f64>,
    kappa: f64,
    /// `L·κ/Λ` for one row.
    core: f64,
    eta: f64,
    lattice: LatticeMechanism,
    tables: OnceLock<SolverTables>,
}

impl Clone for KernelFitMechanism {
    /// A copy without the solver tables (they are rebuilt on demand).
    fn clone(&self) -> Self {
        Self {
            spec: self.spec.clone(),
            features: self.features.clone(),
            bins: self.bins,
            spacing: self.spacing,
            levels: self.levels.clone(),
            kappa: self.kappa,
            core: self.core,
            eta: self.eta,
            lattice: self.lattice.clone(),
            tables: OnceLock::new(),
        }
    }
}

impl KernelFitMechanism {
    /// Validates every parameter (planning time) and fixes the noise.
    pub fn new(spec: FitSpec, c: Contribution) -> Result<Self, MechanismError> {
        Self::build(spec, c, true)
    }

    /// [`KernelFitMechanism::new`] without the lower bound on the huber scale — to show in a test
    /// that below it the solver does not certify. Never reachable from SQL.
    #[cfg(feature = "test-hooks")]
    pub fn with_any_huber_for_tests(spec: FitSpec, c: Contribution) -> Result<Self, MechanismError> {
        Self::build(spec, c, false)
    }

    fn build(spec: FitSpec, c: Contribution, huber_floor: bool) -> Result<Self, MechanismError> {
        let bad = |m: String| Err(MechanismError::Noise(m));
        let Grid { lo, hi, points } = spec.grid;
        let range = hi - lo;
        if !(lo.is_finite() && hi.is_finite() && lo < hi && range.is_finite()) {
            return bad(format!("lo and hi must be finite with lo < hi, got lo = {lo}, hi = {hi}"));
        }
        if !(2..=65_536).contains(&points) {
            return bad(format!("points must be an integer in [2, 65536], got {points}"));
        }
        let h = spec.bandwidth;
        if !(h.is_finite() && h > 0.0) {
            return bad(format!("bandwidth must be a finite number > 0, got {h}"));
        }
        if range / h > MAX_RANGE_OVER_BANDWIDTH {
            return bad(format!(
                "bandwidth must be at least (hi − lo)/{MAX_RANGE_OVER_BANDWIDTH} = {} (the fit has ≈ 3 features \
                 per bandwidth), got {h}",
                range / MAX_RANGE_OVER_BANDWIDTH
            ));
        }
        // Every derived length (the feature period hi − lo + margin·h, the bins) stays an ordinary
        // finite double: the box is an accepted range ([`ranges`]) and the bandwidth within 1e300.
        if !(ranges::accepts(lo, hi) && h <= 1e300 && (range + PERIOD_MARGIN * h).is_finite()) {
            return bad(format!(
                "lo and hi must lie {} and the bandwidth be at most 1e300 (so every derived length is finite), \
                 got lo = {lo}, hi = {hi}, bandwidth = {h}",
                ranges::rule()
            ));
        }
        if h / range > MAX_BANDWIDTH_OVER_RANGE {
            return bad(format!(
                "bandwidth must be at most {MAX_BANDWIDTH_OVER_RANGE} times hi − lo = {range}, got {h}"
            ));
        }
        let lambda = spec.penalty;
        if !(lambda.is_finite() && (MIN_PENALTY..=MAX_PENALTY).contains(&lambda)) {
            return bad(format!("penalty must be a number in [{MIN_PENALTY:e}, {MAX_PENALTY:e}], got {lambda}"));
        }
        let levels = match spec.loss {
            FitLoss::Huber(scale) => {
                let (ylo, yhi) = spec.y_range;
                if !(ylo.is_finite() && yhi.is_finite() && ylo < yhi && (yhi - ylo).is_finite()) {
                    return bad(format!("lo_y and hi_y must be finite with lo_y < hi_y, got {ylo}, {yhi}"));
                }
                if !(scale.is_finite() && scale > 0.0 && scale <= 1e12 * (yhi - ylo)) {
                    return bad(format!("huber must be a finite number > 0, got {scale}"));
                }
                if huber_floor && scale < MIN_HUBER_FRACTION * (yhi - ylo) {
                    return bad(format!(
                        "huber must be at least {MIN_HUBER_FRACTION} × (hi_y − lo_y) = {} (a sharper loss is not \
                         solved reliably to the certificate, and an uncertified fit could move by more than the \
                         noise covers), got {scale}",
                        MIN_HUBER_FRACTION * (yhi - ylo)
                    ));
                }
                let step = (yhi - ylo) / (Y_LEVELS - 1) as f64;
                (0..Y_LEVELS).map(|j| if j + 1 == Y_LEVELS { yhi } else { ylo + j as f64 * step }).collect()
            }
            FitLoss::Hinge(s) => {
                if !(s.is_finite() && (MIN_SMOOTHING..=1.0).contains(&s)) {
                    return bad(format!(
                        "smoothing must be a number in [{MIN_SMOOTHING}, 1] (a sharper hinge is not solved \
                         reliably to the certificate), got {s}"
                    ));
                }
                vec![-1.0, 1.0]
            }
        };
        if !(0.0..1.0).contains(&spec.delta) {
            return bad(format!("delta must be in [0, 1) (0: the pure-ε Laplace-process release), got {}", spec.delta));
        }
        let features = Features::new(lo, hi, h);
        let bins = ((BINS_PER_BANDWIDTH * range / h).ceil() as usize + 1).max(MIN_BINS);
        let spacing = range / (bins - 1) as f64;
        let kappa = features.kappa();
        let core = spec.loss.lipschitz() * kappa / lambda * (1.0 + 1e-12);
        let eta = core * 2f64.powi(-CERTIFICATE_BITS);
        let sensitivity = c.per_group() * core + 2.0 * eta;
        let lattice = if spec.delta > 0.0 {
            let rho = calibration::zcdp_rho(spec.calibration, spec.epsilon, spec.delta)
                .map_err(MechanismError::Calibration)?;
            LatticeMechanism::gaussian_over(sensitivity, features.dim(), rho, c.groups)?
        } else {
            // ICLP (pure ε): ‖Δw‖₁ ≤ √D·‖Δw‖₂ (Cauchy–Schwarz), iid discrete Laplace noise — the
            // fitted function then carries a Laplace process with covariance ∝ k_D.
            if !(spec.epsilon.is_finite() && spec.epsilon > 0.0) {
                return bad(format!("epsilon must be a finite number > 0, got {}", spec.epsilon));
            }
            let l1 = sensitivity * (features.dim() as f64).sqrt() * (1.0 + 1e-12);
            LatticeMechanism::laplace_over(l1, features.dim(), spec.epsilon, c.groups)?
        };
        Ok(Self { spec, features, bins, spacing, levels, kappa, core, eta, lattice, tables: OnceLock::new() })
    }

    /// The parameters.
    pub fn spec(&self) -> &FitSpec {
        &self.spec
    }

    /// The feature map.
    pub fn features(&self) -> &Features {
        &self.features
    }

    /// `L·κ/Λ`: the proven sensitivity of one row's change to the coefficients.
    pub fn row_sensitivity(&self) -> f64 {
        self.core
    }

    /// Smallest pseudo-Huber scale relative to `hi_y − lo_y`. Below 10⁻⁴ the damped Newton solver
    /// stops uncertified at its cap on adversarial tables (the iterate was off by 10⁷–10⁹ η, and one
    /// released pair moved by ≈ 6× the calibrated Δ); at 10⁻³ it certifies within ≈ 90 steps; the bound
    /// keeps a decade of margin (`tests/kernel_fit_privacy.rs` checks the boundary).
    pub const MIN_HUBER_FRACTION: f64 = 1e-2;
    /// Smallest smoothing of the classifier's hinge (its curvature is ≤ 1/(2s)).
    pub const MIN_SMOOTHING: f64 = 0.1;
    /// Largest condition number of the Newton system the cell cap allows.
    pub const MAX_CONDITION: f64 = 1e10;
    /// Largest total mass (rows) the cell cap allows.
    pub const MAX_MASS: f64 = 1e11;
    /// The certificate's tolerance η.
    pub fn tolerance(&self) -> f64 {
        self.eta
    }

    /// The bound κ on ‖φ‖.
    pub fn kappa(&self) -> f64 {
        self.kappa
    }

    /// Noise standard deviation of one coefficient (≈ of the fitted function at a point).
    pub fn sigma(&self) -> f64 {
        self.lattice.noise_sd()
    }

    /// The discrete mechanism on the coefficients.
    pub fn lattice(&self) -> &LatticeMechanism {
        &self.lattice
    }

    /// Number of x bins.
    pub fn bins(&self) -> usize {
        self.bins
    }

    /// Response levels (lattice columns).
    pub fn levels(&self) -> &[f64] {
        &self.levels
    }

    /// Length of the statistic (bins × levels, bin-major).
    pub fn state_len(&self) -> usize {
        self.bins * self.levels.len()
    }

    /// Memory one call needs: (state, work) in bytes.
    pub fn memory_bytes(&self) -> (u64, u64) {
        let (nb, d) = (self.bins as u64, self.features.dim() as u64);
        (
            most_heap_bytes(self.state_len(), Buffers::Plain),
            8 * nb * (d + 4 * d) + 8 * d * d + 32 * d + 8 * self.spec.grid.points as u64,
        )
    }

    /// A statistic under accumulation.
    pub fn accumulation(&self) -> BufferedSums {
        BufferedSums::new(self.state_len(), FLUSH_ROWS, Buffers::Plain)
    }

    /// Empty exact sums that partial states are merged into (no buffer: no rows are added).
    pub fn merged_accumulation(&self) -> BufferedSums {
        BufferedSums::new(self.state_len(), FLUSH_ROWS, Buffers::None)
    }

    /// Adds rows (response or label `ys`, predictor `xs`). A NULL-free batch; NaN in either
    /// value drops the row, ±inf and values outside the box are clamped. Nothing a value can
    /// be makes this fail.
    pub fn add_all(&self, acc: &mut BufferedSums, ys: &[f64], xs: &[f64]) {
        let (lo, nb) = (self.spec.grid.lo, self.bins);
        let ix = 1.0 / self.spacing;
        let top = (nb - 1) as f64;
        let ny = self.levels.len();
        let regression = matches!(self.spec.loss, FitLoss::Huber(_));
        let (ylo, yhi) = self.spec.y_range;
        let iy = (ny - 1) as f64 / (yhi - ylo);
        for (cy, cx) in ys.chunks(FLUSH_ROWS).zip(xs.chunks(FLUSH_ROWS)) {
            let pending = acc.buffer(cx.len());
            for (&y, &x) in cy.iter().zip(cx) {
                // Clamp in bin units (NaN stays NaN and is dropped by linear_bin).
                let p = ((x - lo) * ix).clamp(0.0, top);
                let (l, wl, wr, okx) = linear_bin(p, 0.0, 1.0, nb);
                if regression {
                    let q = ((y - ylo) * iy).clamp(0.0, (ny - 1) as f64);
                    let (m, vl, _vr, oky) = linear_bin(q, 0.0, 1.0, ny);
                    let half = 1i128 << 39;
                    let w00 = ((wl as i128 * vl as i128 + half) >> 40) as i64;
                    let w10 = ((wr as i128 * vl as i128 + half) >> 40) as i64;
                    let mask = -((okx & oky) as i64);
                    let base = l * ny + m;
                    pending[base] += w00 & mask;
                    pending[base + 1] += (wl - w00) & mask;
                    pending[base + ny] += w10 & mask;
                    pending[base + ny + 1] += (wr - w10) & mask;
                } else {
                    let mask = -((okx & !y.is_nan()) as i64);
                    let level = (y > 0.0) as usize;
                    pending[l * 2 + level] += wl & mask;
                    pending[(l + 1) * 2 + level] += wr & mask;
                }
            }
        }
    }

    fn tables(&self) -> &SolverTables {
        self.tables.get_or_init(|| {
            let (nb, d, j2) = (self.bins, self.features.dim(), 2 * self.features.j_max() + 1);
            let mut phi = Vec::with_capacity(nb * d);
            let (mut cos, mut sin) = (Vec::with_capacity(nb * j2), Vec::with_capacity(nb * j2));
            for b in 0..nb {
                let x = self.bin_x(b);
                phi.extend(self.features.eval(x));
                let theta = self.features.theta(x);
                for k in 0..j2 {
                    cos.push(libm::cos(k as f64 * theta));
                    sin.push(libm::sin(k as f64 * theta));
                }
            }
            SolverTables { phi, cos, sin }
        })
    }

    /// Position of bin b.
    pub fn bin_x(&self, b: usize) -> f64 {
        if b + 1 == self.bins { self.spec.grid.hi } else { self.spec.grid.lo + b as f64 * self.spacing }
    }

    /// Objective, gradient (double-double) and the per-bin curvature sums at `w`. Every bin and
    /// cell is visited, empty or not: the work per call is the same for every table.
    fn evaluate(&self, mass: &[DD], w: &[DD], want_curvature: bool) -> (DD, Vec<DD>, Vec<f64>) {
        let t = self.tables();
        let (nb, d, ny) = (self.bins, w.len(), self.levels.len());
        let lambda = self.spec.penalty;
        let mut objective = DD::default();
        for v in w {
            objective = objective.add(v.mul(*v).mul_f64(0.5 * lambda));
        }
        let mut grad: Vec<DD> = w.iter().map(|v| v.mul_f64(lambda)).collect();
        let mut curvature = vec![0.0; if want_curvature { nb } else { 0 }];
        for b in 0..nb {
            let phi = &t.phi[b * d..(b + 1) * d];
            let cells = &mass[b * ny..(b + 1) * ny];
            let mut f = DD::default();
            for (p, v) in phi.iter().zip(w) {
                f = f.add(v.mul_f64(*p));
            }
            let mut slope = DD::default();
            for (m, &y) in cells.iter().zip(&self.levels) {
                let (value, ds) = self.spec.loss.value_and_slope(y, f);
                objective = objective.add(value.mul(*m));
                slope = slope.add(ds.mul(*m));
                if want_curvature {
                    curvature[b] += m.hi * self.spec.loss.curvature(y, f.hi);
                }
            }
            for (g, p) in grad.iter_mut().zip(phi) {
                *g = g.add(slope.mul_f64(*p));
            }
        }
        (objective, grad, curvature)
    }

    /// `H = ΛI + Σ_b q_b φ_bφ_bᵀ` from the Fourier sums of q (f64).
    fn hessian(&self, q: &[f64]) -> DMatrix<f64> {
        let t = self.tables();
        let (j, d) = (self.features.j_max(), self.features.dim());
        let j2 = 2 * j + 1;
        let (mut cs, mut sn) = (vec![0.0; j2], vec![0.0; j2]);
        for (b, &qb) in q.iter().enumerate() {
            for k in 0..j2 {
                cs[k] += qb * t.cos[b * j2 + k];
                sn[k] += qb * t.sin[b * j2 + k];
            }
        }
        let amp = &self.features.amp;
        let mut h = DMatrix::<f64>::zeros(d, d);
        for a in 0..=j {
            for b in 0..=j {
                let (sum, diff) = (a + b, a.abs_diff(b));
                let s = amp[a] * amp[b] * 0.5;
                h[(a, b)] = s * (cs[diff] + cs[sum]);
                if a >= 1 && b >= 1 {
                    h[(j + a, j + b)] = s * (cs[diff] - cs[sum]);
                }
                if b >= 1 {
                    // cos(aθ)·sin(bθ) = ½[sin((a+b)θ) − sin((a−b)θ)]
                    let sd = if a >= b { sn[diff] } else { -sn[diff] };
                    let v = s * (sn[sum] - sd);
                    h[(a, j + b)] = v;
                    h[(j + b, a)] = v;
                }
            }
        }
        for i in 0..d {
            h[(i, i)] += self.spec.penalty;
        }
        h
    }

    /// A certified bound on `‖ŵ − w*‖` from the double-double gradient at ŵ.
    fn certify(&self, grad: &[DD], w: &[DD], total_mass: f64) -> f64 {
        let d = w.len() as f64;
        let norm = |v: &[DD]| v.iter().map(|x| x.hi * x.hi).sum::<f64>().sqrt() * (1.0 + 4.0 * d * f64::EPSILON);
        // The norms use the leading parts; the trailing parts are ≤ 2^-53 of them.
        let (g, wn) = (norm(grad) * (1.0 + 1e-15), norm(w) * (1.0 + 1e-15));
        let (nb, ny) = (self.bins as f64, self.levels.len() as f64);
        let (l, k, lambda) = (self.spec.loss.lipschitz(), self.kappa, self.spec.penalty);
        let err = 4.0
            * DD_OP_ERR
            * (k * total_mass * (self.spec.loss.max_curvature() * d * k * wn + (16.0 + ny + nb + 1.0) * l)
                + 2.0 * lambda * wn);
        (g + err) / lambda * (1.0 + 1e-12)
    }

    /// The public cap on one cell's mass, in fixed-point units: the Newton system's condition
    /// number `1 + M·κ²·ℓ''/Λ` stays ≤ 1 + [`MAX_CONDITION`] and the total mass M ≤ [`MAX_MASS`].
    pub fn cell_cap(&self) -> i128 {
        let cells = self.state_len() as f64;
        let by_condition =
            MAX_CONDITION * self.spec.penalty / (self.spec.loss.max_curvature() * self.kappa * self.kappa * cells);
        let rows = by_condition.min(MAX_MASS / cells).max(1.0);
        (rows * FIXED_ONE) as i128
    }

    /// Newton's starting point: the ridge least-squares fit of the levels (one linear solve; any
    /// start is sound — only the certificate at the end matters — this one is usually close).
    fn least_squares_start(&self, capped: &[i128]) -> Vec<DD> {
        let (d, ny) = (self.features.dim(), self.levels.len());
        let t = self.tables();
        let q: Vec<f64> = capped.chunks(ny).map(|c| c.iter().map(|&v| v as f64).sum::<f64>() / FIXED_ONE).collect();
        let mut rhs = DVector::<f64>::zeros(d);
        for (b, cells) in capped.chunks(ny).enumerate() {
            let r: f64 = cells.iter().zip(&self.levels).map(|(&v, y)| v as f64 / FIXED_ONE * y).sum();
            rhs.iter_mut().zip(&t.phi[b * d..(b + 1) * d]).for_each(|(a, p)| *a += r * p);
        }
        match self.hessian(&q).cholesky() {
            Some(ch) => ch.solve(&rhs).iter().map(|&v| DD::from_f64(if v.is_finite() { v } else { 0.0 })).collect(),
            None => vec![DD::default(); d],
        }
    }

    /// The exact minimizer's numerical stand-in with its certificate (no noise).
    pub fn solve(&self, state: &[i128]) -> Solution {
        // Each cell's mass is capped (public cap, module docs): one row still moves the
        // objective by a sub-convex combination of its losses, and the Newton system stays
        // well conditioned whatever the table.
        let cap = self.cell_cap();
        let capped: Vec<i128> = state.iter().map(|&v| v.clamp(0, cap)).collect();
        let mass: Vec<DD> = capped.iter().map(|&v| DD::from_i128(v).scale_pow2(-40)).collect();
        let total_mass = capped.iter().map(|&v| v as f64).sum::<f64>() / FIXED_ONE * (1.0 + 1e-9);
        let mut w = self.least_squares_start(&capped);
        // Constant work: exactly FIXED_STEPS damped Newton steps, each evaluating all LINE_STEPS
        // trial step sizes, whatever the table (one row must not change how long this runs;
        // an unconverged step count did, in `tests/kernel_fit_privacy.rs`). Steps after
        // convergence are full Newton steps of size ≈ 0.
        for _ in 0..FIXED_STEPS {
            w = self.newton_step(&mass, w, LINE_STEPS).0;
        }
        let mut steps = FIXED_STEPS;
        loop {
            let (_, grad, _) = self.evaluate(&mass, &w, false);
            let distance = self.certify(&grad, &w, total_mass);
            // Beyond the fixed steps only where the parameters sit in the corners the adversarial
            // tests probe (Λ ≈ 1e-6 with a sharp hinge): there the run time can depend on the data.
            if distance <= self.eta || steps >= MAX_NEWTON_STEPS {
                return Solution { w, steps, distance, certified: distance <= self.eta };
            }
            let (next, moved) = self.newton_step(&mass, w, 60);
            w = next;
            steps += 1;
            if !moved {
                let (_, grad, _) = self.evaluate(&mass, &w, false);
                let distance = self.certify(&grad, &w, total_mass);
                return Solution { w, steps, distance, certified: distance <= self.eta };
            }
        }
    }

    /// One damped Newton step from `w`: the Newton direction, then the first of the step sizes
    /// 1, ½, …, 2^-(trials−1) that satisfies Armijo's condition (double-double objective). All
    /// `trials` sizes are evaluated, so the work does not depend on which is taken. Returns the
    /// new point and whether it moved.
    fn newton_step(&self, mass: &[DD], w: Vec<DD>, trials: usize) -> (Vec<DD>, bool) {
        let d = w.len();
        let (objective, grad, q) = self.evaluate(mass, &w, true);
        let g = DVector::from_iterator(d, grad.iter().map(|v| v.to_f64()));
        let h = self.hessian(&q);
        let p = match h.clone().cholesky() {
            Some(ch) => -ch.solve(&g),
            // Not positive definite in floating point: a gradient step scaled by the
            // Hessian's largest diagonal entry (Armijo below keeps it a descent step).
            None => -&g / h.diagonal().max().max(self.spec.penalty),
        };
        let slope: f64 = g.dot(&p);
        let mut chosen: Option<Vec<DD>> = None;
        let mut t = 1.0;
        for _ in 0..trials {
            let trial: Vec<DD> = w.iter().zip(p.iter()).map(|(v, pk)| v.add(DD::from_f64(pk * t))).collect();
            let (value, _, _) = self.evaluate(mass, &trial, false);
            let allowed = objective.add(DD::from_f64(1e-4 * t * slope + objective.hi.abs() * 1e-27));
            if chosen.is_none() && value.sub(allowed).hi <= 0.0 {
                chosen = Some(trial);
            }
            t *= 0.5;
        }
        match chosen {
            Some(next) => (next, true),
            None => (w, false),
        }
    }

    /// The private part of a release: `round(ŵ) + Z` on the lattice (exact discrete Gaussian).
    /// `rng = None` is the noiseless test hook.
    pub fn noisy_coefficients<R: Rng + ?Sized>(&self, state: &[i128], rng: Option<&mut R>) -> Vec<f64> {
        self.lattice.release(&self.solve(state).w, rng)
    }

    /// The fitted function `φ(x)ᵀw` (post-processing of released coefficients).
    pub fn eval(&self, w: &[f64], x: f64) -> f64 {
        self.features.eval(x).iter().zip(w).map(|(p, v)| p * v).sum()
    }

    /// The fitted function on the grid.
    pub fn post_process(&self, w: &[f64]) -> FitRelease {
        let x = self.spec.grid.xs();
        let fit = x.iter().map(|&t| self.eval(w, t)).collect();
        FitRelease { x, fit }
    }

    /// One release from the exact statistic.
    pub fn release<R: Rng + ?Sized>(&self, state: &[i128], rng: Option<&mut R>) -> (Vec<f64>, FitRelease) {
        let w = self.noisy_coefficients(state, rng);
        let release = self.post_process(&w);
        (w, release)
    }
}

#[cfg(test)]
mod tests;
