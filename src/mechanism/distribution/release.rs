//! The private distribution function: a hierarchical histogram released with exact discrete
//! noise, made consistent by least squares, projected onto distribution functions and
//! interpolated.
//!
//! **Statistic.** Exact counts of the values in `2^K` equal leaves of `[lo, hi]` (values outside
//! count in the end leaves — clamping, 1-stable; NULL, NaN and ±∞ rows are dropped).
//!
//! **Release** (adaptive composition, every step calibrated from public parameters only):
//!
//! 1. The total count with noise, a share `s` of the budget ([`root_share`]: the least share in
//!    [`ROOT_SHARES`] at which the count's noise sd is at most [`ROOT_SD`] per unit of sensitivity —
//!    2 % at ε ≥ 1 with Laplace noise, 5 % at ε ≤ 0.4).
//! 2. The resolution: `2^k` leaves with `2^k ≈ max(sqrt(ñ·ε₁), ñ·ε₁²/72)` (`ε₁` the per-unit noise
//!    level of one level at the remaining budget, `(1 − s)·ε` for Laplace noise; `k` in `[3, K]`), from
//!    the released count alone — where the noise of a finer tree would cost more than its
//!    resolution gains (the rank error of a tree's prefix grows like log^1.5 of its leaves; the
//!    error of interpolating a smooth CDF inside a leaf falls like its width, the sample's own
//!    roughness inside a leaf like the square root of its mass over n). `leaves => N` fixes it.
//! 3. Every level of [`TreeShape::for_leaves_log2`]`(k)` below the root with noise, the rest of
//!    the budget split equally over its levels: one unit changes one node per level by at most
//!    `rows` in each of `groups` groups, so level sensitivity is `rows·groups` in L1 (discrete
//!    Laplace, pure ε) or `rows·√groups` in L2 (discrete Gaussian, ρ-zCDP, the (ε, δ) conversion of
//!    CKS20; the root's and the levels' ρ add up to the call's).
//!
//! **Post-processing** (free): the least-squares leaf counts (`tree`), their prefix sums divided
//! by the consistent total `ñ`, the isotonic projection clamped to [0, 1], the monotone cubic
//! interpolant (`monotone`), its inverse for quantiles. Below one point of mass (`ñ < 1`) there is
//! no distribution: the CDF and quantiles are NULL (a function of the released count).
//!
//! **Bands.** With `e_j` the least-squares prefix-count noise at edge j, the data's CDF at the
//! edges lies within `q/ñ` of the estimate whenever `max_j max(|e_j|, |e_L − e_j|) ≤ q`
//! (`F̂_j − F_j = (e_j − F_j·e_L)/ñ`, a convex combination); q is the (1 − α) quantile of that
//! supremum simulated from the public seed (its noise has the public levels' variances; `band`,
//! cached per shape, noise and α). The isotonic projection and the clamp keep it (they never move away from a monotone
//! target in the sup norm). Between edges the data's CDF lies between its values at the two
//! edges, so the half-width there adds the interpolant's distance to them. `noise_band` covers the
//! data's CDF; `band` the population's (the noise band at α/2 plus the Dvoretzky–Kiefer–Wolfowitz
//! band at α/2 with n replaced by ñ, a plug-in).

use rand::Rng;

use super::band::{NoiseLaw, band_quantile};
use super::leaves::Leaves;
use super::monotone::{MonotoneCubic, isotonic};
use super::tree::{MAX_LEAVES_LOG2, TreeShape};
use crate::mechanism::contribution::Contribution;
use crate::mechanism::noise::calibration::{Calibration, zcdp_rho};
use crate::mechanism::noise::lattice::rational_at_least;
use crate::mechanism::noise::samplers::{DiscreteGaussian, discrete_laplace};
use crate::mechanism::ranges;
use crate::mechanism::sums::{BufferedSums, Buffers, most_heap_bytes};

/// The range of the share of the budget (ε, or ρ under zCDP) spent on the total count that picks
/// the resolution and roots the tree. The count only has to place the resolution within a factor
/// of two, and as the root it adds little to the least-squares prefixes: every tree's prefix
/// noise is 3.1 % lower with a 2 % count than with 5 % (exact variances; docs/functions/private_cdf.md).
pub const ROOT_SHARES: (f64, f64) = (0.02, 0.05);
/// The count's largest noise sd per unit of sensitivity where the share allows it (a discrete
/// Laplace scale of 50): the share rises towards 5 % before the count gets noisier than this.
pub const ROOT_SD: f64 = 50.0 * std::f64::consts::SQRT_2;
/// The count's share of releases stored before it depended on the budget.
pub const LEGACY_ROOT_SHARE: f64 = 0.05;

/// The count's share of the budget: the least in [`ROOT_SHARES`] at which its noise sd per unit of
/// sensitivity is at most [`ROOT_SD`] — `√2/(s·ε)` for discrete Laplace, `1/√(2·s·ρ)` for the
/// discrete Gaussian (ρ the call's zCDP budget). A function of public parameters only.
pub fn root_share(noise: CdfNoise, epsilon: f64, rho: f64) -> f64 {
    let wanted = match noise {
        CdfNoise::Laplace => std::f64::consts::SQRT_2 / (ROOT_SD * epsilon),
        CdfNoise::Gaussian => 1.0 / (2.0 * rho * ROOT_SD * ROOT_SD),
    };
    let (least, most) = ROOT_SHARES;
    if wanted.is_nan() { most } else { wanted.clamp(least, most) }
}
/// The coarsest automatic resolution: `2^MIN_AUTO_LOG2` leaves.
pub const MIN_AUTO_LOG2: u32 = 3;
/// The finest automatic resolution by default: `2^DEFAULT_MAX_LOG2` leaves.
pub const DEFAULT_MAX_LOG2: u32 = 12;
/// Grid points of the returned curve by default.
pub const DEFAULT_POINTS: usize = 512;
/// Most grid points of the returned curve.
pub const MAX_POINTS: usize = 65_536;

/// The noise of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CdfNoise {
    /// Discrete Laplace on every level: pure ε.
    Laplace,
    /// Discrete Gaussian on every level: ρ-zCDP converted to (ε, δ).
    Gaussian,
}

impl CdfNoise {
    /// Its name in parameters and stored releases.
    pub fn name(self) -> &'static str {
        match self {
            CdfNoise::Laplace => "laplace",
            CdfNoise::Gaussian => "gaussian",
        }
    }

    /// The noise of a name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "laplace" => Some(CdfNoise::Laplace),
            "gaussian" => Some(CdfNoise::Gaussian),
            _ => None,
        }
    }
}

/// The leaves of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Chosen from the released count, at most `2^max_log2` leaves.
    Auto {
        /// log2 of the finest resolution (the statistic's).
        max_log2: u32,
    },
    /// `2^log2` leaves.
    Fixed {
        /// log2 of the leaves.
        log2: u32,
    },
}

impl Resolution {
    /// log2 of the statistic's leaves.
    pub fn statistic_log2(self) -> u32 {
        match self {
            Resolution::Auto { max_log2 } => max_log2,
            Resolution::Fixed { log2 } => log2,
        }
    }
}

/// Public parameters of a CDF release.
#[derive(Debug, Clone, PartialEq)]
pub struct CdfSpec {
    /// Left end of the range.
    pub lo: f64,
    /// Right end of the range.
    pub hi: f64,
    /// Points of the returned grid.
    pub points: usize,
    /// Leaves.
    pub resolution: Resolution,
    /// The noise.
    pub noise: CdfNoise,
    /// ε the release is calibrated for.
    pub epsilon: f64,
    /// δ (Gaussian noise only; 0 for Laplace).
    pub delta: f64,
    /// The zCDP → (ε, δ) calibration (Gaussian noise).
    pub calibration: Calibration,
}

/// The noise of one level: what the release samples and the variance the estimate weighs by.
#[derive(Debug, Clone, Copy, PartialEq)]
enum LevelNoise {
    /// Discrete Laplace with scale `num/den`.
    Laplace { num: u128, den: u128 },
    /// Discrete Gaussian.
    Gaussian(DiscreteGaussian),
}

impl LevelNoise {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> i128 {
        match *self {
            LevelNoise::Laplace { num, den } => discrete_laplace(rng, num, den),
            LevelNoise::Gaussian(g) => g.sample(rng),
        }
    }

    /// The variance of one draw: `2p/(1 − p)²` with `p = e^{−1/scale}` for the discrete Laplace,
    /// the variance parameter (an upper bound) for the discrete Gaussian.
    fn variance(&self) -> f64 {
        match *self {
            LevelNoise::Laplace { num, den } => {
                let p = (-(den as f64) / num as f64).exp();
                2.0 * p / ((1.0 - p) * (1.0 - p))
            }
            LevelNoise::Gaussian(g) => g.variance() as f64,
        }
    }

    /// Its law as the public band simulation draws it (continuous, the same variance).
    fn law(&self) -> NoiseLaw {
        match self {
            LevelNoise::Laplace { .. } => NoiseLaw::Laplace(self.variance()),
            LevelNoise::Gaussian(_) => NoiseLaw::Gaussian(self.variance()),
        }
    }
}

/// A calibrated CDF release (public parameters only).
#[derive(Debug, Clone, PartialEq)]
pub struct CdfMechanism {
    spec: CdfSpec,
    contribution: Contribution,
    /// The share of the budget the root (the count) spends.
    root_share: f64,
    /// The root's noise.
    root: LevelNoise,
    /// The noise of the levels below the root, per number of levels (index = levels − 1).
    levels: Vec<LevelNoise>,
    /// One level's noise sd if the whole non-root budget went to it (the resolution rule's unit).
    single_level_sd: f64,
}

/// What a release publishes: every level's noisy counts, root first.
pub type NoisyLevels = Vec<Vec<f64>>;

impl CdfMechanism {
    /// Calibrates the release, the count's share from [`root_share`]; every error is about a
    /// public parameter.
    pub fn new(spec: CdfSpec, contribution: Contribution) -> Result<Self, String> {
        Self::with_root_share(spec, contribution, None)
    }

    /// Calibrates the release with the count's share given (a stored release's), or from
    /// [`root_share`] when None.
    pub fn with_root_share(spec: CdfSpec, contribution: Contribution, share: Option<f64>) -> Result<Self, String> {
        if let Some(s) = share
            && !(ROOT_SHARES.0..=ROOT_SHARES.1).contains(&s)
        {
            return Err(format!("the count's share must be in [{}, {}], got {s}", ROOT_SHARES.0, ROOT_SHARES.1));
        }
        if !(spec.lo.is_finite() && spec.hi.is_finite() && spec.lo < spec.hi) {
            return Err(format!("the range must be finite with lo < hi, got [{}, {}]", spec.lo, spec.hi));
        }
        // The leaves' width, the output grid, the interpolant's secants and every quantile are
        // computed from hi − lo: where it overflows (lo = −1e308, hi = 1e308), or where i·(hi − lo)
        // does for a grid point, they would be ∞ or NaN; a leaf narrower than the normal doubles
        // (hi − lo = 5e-324 over 2^16 leaves) would be 0 wide and its secants ∞.
        if !ranges::accepts(spec.lo, spec.hi) {
            return Err(format!(
                "the range [lo, hi] must lie {} (every leaf, grid point and quantile is then a finite double), \
                 got [{}, {}]",
                ranges::rule(),
                spec.lo,
                spec.hi
            ));
        }
        if !(2..=MAX_POINTS).contains(&spec.points) {
            return Err(format!("points must be in [2, {MAX_POINTS}], got {}", spec.points));
        }
        let k = spec.resolution.statistic_log2();
        if !(1..=MAX_LEAVES_LOG2).contains(&k) {
            return Err(format!("leaves must be a power of two from 2 to 2^{MAX_LEAVES_LOG2}, got 2^{k}"));
        }
        let max_levels = (1..=k).map(|j| TreeShape::for_leaves_log2(j).levels()).max().unwrap_or(1);
        let (root_share, root, levels, single_level_sd) = match spec.noise {
            CdfNoise::Laplace => {
                let share = share.unwrap_or_else(|| root_share(CdfNoise::Laplace, spec.epsilon, 0.0));
                let l1 = contribution.count_l1() as f64;
                let laplace = |scale: f64| {
                    rational_at_least(scale * (1.0 + 1e-12))
                        .map(|(num, den)| LevelNoise::Laplace { num, den })
                        .ok_or_else(|| format!("ε = {} is out of range for the CDF's noise", spec.epsilon))
                };
                let rest = (1.0 - share) * spec.epsilon;
                let root = laplace(l1 / (share * spec.epsilon))?;
                let levels = (1..=max_levels).map(|d| laplace(l1 * d as f64 / rest)).collect::<Result<Vec<_>, _>>()?;
                (share, root, levels, std::f64::consts::SQRT_2 * l1 / rest)
            }
            CdfNoise::Gaussian => {
                let rho = zcdp_rho(spec.calibration, spec.epsilon, spec.delta).map_err(|e| e.to_string())?;
                // L2 sensitivity² of one level: rows² in each of `groups` groups (exact integer).
                let l2sq = (contribution.rows as f64).powi(2) * contribution.groups as f64;
                let gaussian = |share: f64| {
                    let variance = (l2sq / (2.0 * share * rho)).ceil();
                    (variance.is_finite() && variance < 2f64.powi(110))
                        .then(|| DiscreteGaussian::at_least(variance as u128))
                        .flatten()
                        .map(LevelNoise::Gaussian)
                        .ok_or_else(|| {
                            format!("(ε, δ) = ({}, {}) is out of range for the CDF's noise", spec.epsilon, spec.delta)
                        })
                };
                let share = share.unwrap_or_else(|| root_share(CdfNoise::Gaussian, spec.epsilon, rho));
                let rest = 1.0 - share;
                let root = gaussian(share)?;
                let levels = (1..=max_levels).map(|d| gaussian(rest / d as f64)).collect::<Result<Vec<_>, _>>()?;
                (share, root, levels, (l2sq / (2.0 * rest * rho)).sqrt())
            }
        };
        Ok(Self { spec, contribution, root_share, root, levels, single_level_sd })
    }

    /// The public parameters.
    pub fn spec(&self) -> &CdfSpec {
        &self.spec
    }

    /// The contribution bound it is calibrated for.
    pub fn contribution(&self) -> Contribution {
        self.contribution
    }

    /// The share of the budget the count (the root) spends.
    pub fn root_share(&self) -> f64 {
        self.root_share
    }

    /// The noise variance of one node of the deepest tree this call may release (public; what
    /// `mechanism => 'auto'` compares).
    pub fn deepest_level_variance(&self) -> f64 {
        self.levels.last().expect("at least one level").variance()
    }

    /// What the noise actually sampled guarantees for one unit when the tree has `levels` levels
    /// below the root: ε from the exact rationals of the discrete Laplace scales
    /// (`Σ_l Δ₁/scale_l`), or ρ of the discrete Gaussians (`Σ_l Δ₂²/(2·S_l)`).
    pub fn implied_privacy(&self, levels: usize) -> f64 {
        let c = self.contribution;
        let one = |noise: &LevelNoise| match *noise {
            LevelNoise::Laplace { num, den } => c.count_l1() as f64 * den as f64 / num as f64,
            LevelNoise::Gaussian(g) => (c.rows as f64).powi(2) * c.groups as f64 / (2.0 * g.variance() as f64),
        };
        one(&self.root) + levels as f64 * one(&self.level(levels))
    }

    /// The discrete Laplace scales (root, each level at `levels` levels), None for Gaussian noise.
    pub fn laplace_scales(&self, levels: usize) -> Option<(f64, f64)> {
        match (self.root, self.level(levels)) {
            (LevelNoise::Laplace { num: a, den: b }, LevelNoise::Laplace { num: c, den: d }) => {
                Some((a as f64 / b as f64, c as f64 / d as f64))
            }
            _ => None,
        }
    }

    /// Leaves of the accumulated statistic.
    pub fn statistic_leaves(&self) -> usize {
        1 << self.spec.resolution.statistic_log2()
    }

    /// Memory one call needs: (state, release work), in bytes.
    pub fn memory_bytes(&self) -> (u64, u64) {
        let leaves = self.statistic_leaves() as u64;
        (most_heap_bytes(self.statistic_leaves(), Buffers::Plain), 96 * leaves + 32 * self.spec.points as u64)
    }

    /// An empty statistic: one exact count per leaf.
    pub fn statistic(&self) -> BufferedSums {
        BufferedSums::new(self.statistic_leaves(), 1 << 40, Buffers::Plain)
    }

    /// Empty exact counts that partial states are merged into (no buffer: no rows are added).
    pub fn merged_statistic(&self) -> BufferedSums {
        BufferedSums::new(self.statistic_leaves(), 1 << 40, Buffers::None)
    }

    /// Counts `values` into their leaves: finite values only, those outside the range in the
    /// end leaves (a public, row-wise clamp; `leaves`).
    pub fn accumulate(&self, sums: &mut BufferedSums, values: &[f64]) {
        let count = self.statistic_leaves();
        let leaves = Leaves { lo: self.spec.lo, scale: count as f64 / (self.spec.hi - self.spec.lo), count };
        for chunk in values.chunks(sums.flush_rows()) {
            leaves.add(sums.buffer(chunk.len()), chunk);
        }
    }

    /// Average prefix-count noise variance proxy: one level's variance at `levels` levels.
    fn level(&self, levels: usize) -> LevelNoise {
        self.levels[levels - 1]
    }

    /// The resolution (log2 of the leaves) for a released count.
    pub fn resolution_for(&self, count: f64) -> u32 {
        match self.spec.resolution {
            Resolution::Fixed { log2 } => log2,
            Resolution::Auto { max_log2 } => {
                // 2^k ≈ max(sqrt(ñ·ε₁), ñ·ε₁²/72), ε₁ = √2/sd the noise level of one level per unit
                // (Laplace: (1 − s)·ε, s the count's share). The first balances the prefix noise against interpolating a
                // smooth CDF inside a leaf; the second against the sample's own roughness inside
                // a leaf (√(1/(4ñL)) of rank), which takes over at large n·ε² (module docs).
                let unit = std::f64::consts::SQRT_2 / self.single_level_sd;
                let n = count.max(1.0);
                let target = (n * unit).sqrt().max(n * unit * unit / 72.0).max(1.0).log2().round();
                let k = if target.is_finite() { target as i64 } else { 0 };
                k.clamp(i64::from(MIN_AUTO_LOG2.min(max_log2)), i64::from(max_log2)) as u32
            }
        }
    }

    /// The release: the noisy count, the resolution it picks, then every level with noise
    /// (`rng` None: no noise, the test hook). Returns the resolution and the noisy levels.
    pub fn release<R: Rng + ?Sized>(&self, leaves: &[i128], mut rng: Option<&mut R>) -> (u32, NoisyLevels) {
        assert_eq!(leaves.len(), self.statistic_leaves());
        let total = leaves.iter().fold(0i128, |a, b| a.saturating_add(*b));
        let mut noisy = |count: i128, noise: &LevelNoise| -> f64 {
            let z = rng.as_deref_mut().map_or(0, |r| noise.sample(r));
            count.saturating_add(z) as f64
        };
        let root = noisy(total, &self.root);
        let k = self.resolution_for(root);
        let coarse = 1usize << (self.spec.resolution.statistic_log2() - k);
        let merged: Vec<i128> =
            leaves.chunks_exact(coarse).map(|c| c.iter().fold(0i128, |a, b| a.saturating_add(*b))).collect();
        let shape = TreeShape::for_leaves_log2(k);
        let level = self.level(shape.levels());
        let mut out = vec![vec![root]];
        for counts in shape.level_counts(&merged).iter().skip(1) {
            out.push(counts.iter().map(|c| noisy(*c, &level)).collect());
        }
        (k, out)
    }

    /// The least-squares prefix counts `P̂_0 = 0, …, P̂_L = ñ` of released levels at resolution
    /// `2^k` (post-processing).
    pub fn prefix_counts(&self, k: u32, levels: &[Vec<f64>]) -> Result<Vec<f64>, String> {
        let shape = TreeShape::for_leaves_log2(k);
        let sizes = shape.level_sizes();
        if levels.len() != sizes.len() || levels.iter().zip(&sizes).any(|(l, s)| l.len() != *s) {
            return Err("released levels of the wrong shape".into());
        }
        let leaves = shape.estimate_leaves(levels, &self.variances(&shape));
        let mut prefix = Vec::with_capacity(leaves.len() + 1);
        prefix.push(0.0);
        let mut running = 0.0;
        for c in &leaves {
            running += c;
            prefix.push(running);
        }
        Ok(prefix)
    }

    /// The (1 − α) quantile, in counts, of `max_j max(|e_j|, |e_L − e_j|)` for the prefix-count
    /// noise of the tree at resolution `2^k` (simulated from the public seed, cached).
    pub fn band_threshold(&self, k: u32, alpha: f64) -> f64 {
        let shape = TreeShape::for_leaves_log2(k);
        band_quantile(&shape, self.root.law(), self.level(shape.levels()).law(), alpha)
    }

    fn variances(&self, shape: &TreeShape) -> Vec<f64> {
        let mut variance = vec![self.root.variance()];
        variance.extend(std::iter::repeat_n(self.level(shape.levels()).variance(), shape.levels()));
        variance
    }

    /// Post-processing of released levels at resolution `2^k` (also what a stored release
    /// recomputes): the distribution function, its grid values and bands at level `alpha`.
    pub fn post_process(&self, k: u32, levels: &[Vec<f64>], alpha: f64) -> Result<CdfRelease, String> {
        let prefix = self.prefix_counts(k, levels)?;
        let leaves = prefix.len() - 1;
        let count = prefix[leaves];
        let step = (self.spec.hi - self.spec.lo) / leaves as f64;
        let x: Vec<f64> = (0..self.spec.points)
            .map(|i| self.spec.lo + (self.spec.hi - self.spec.lo) * i as f64 / (self.spec.points - 1) as f64)
            .collect();
        if !(count >= 1.0) {
            return Ok(CdfRelease { x, count, leaves, curve: None });
        }
        let raw: Vec<f64> = prefix.iter().map(|p| p / count).collect();
        let mut edges: Vec<f64> = isotonic(&raw).into_iter().map(|v| v.clamp(0.0, 1.0)).collect();
        edges[0] = 0.0;
        *edges.last_mut().expect("edges") = 1.0;
        let interpolant = MonotoneCubic::new(self.spec.lo, step, edges);
        let sup = self.band_threshold(k, alpha);
        let sup_half = self.band_threshold(k, alpha / 2.0);
        let noise_width = sup / count;
        let dkw = ((4.0 / alpha).ln() / (2.0 * count)).sqrt();
        let total_width = sup_half / count + dkw;
        let cdf: Vec<f64> = x.iter().map(|&v| interpolant.eval(v)).collect();
        let between: Vec<f64> = x
            .iter()
            .zip(&cdf)
            .map(|(&v, f)| {
                let (a, b) = interpolant.knots_around(v);
                let knots = interpolant.values();
                (f - knots[a]).max(knots[b] - f)
            })
            .collect();
        let noise_band = between.iter().map(|b| b + noise_width).collect();
        let band = between.iter().map(|b| b + total_width).collect();
        Ok(CdfRelease {
            x,
            count,
            leaves,
            curve: Some(CdfCurve { interpolant, cdf, noise_band, band, noise_width, total_width }),
        })
    }
}

/// A released distribution function.
#[derive(Debug, Clone, PartialEq)]
pub struct CdfRelease {
    /// The grid.
    pub x: Vec<f64>,
    /// The consistent noisy count ñ.
    pub count: f64,
    /// Leaves of the released tree.
    pub leaves: usize,
    /// The distribution function, None below one point of mass.
    pub curve: Option<CdfCurve>,
}

/// The distribution function of a release with mass.
#[derive(Debug, Clone, PartialEq)]
pub struct CdfCurve {
    /// The monotone interpolant through the leaf edges.
    pub interpolant: MonotoneCubic,
    /// Its values on the grid.
    pub cdf: Vec<f64>,
    /// Half-widths of the simultaneous band for the data's CDF on the grid.
    pub noise_band: Vec<f64>,
    /// Half-widths of the simultaneous band for the population's CDF on the grid.
    pub band: Vec<f64>,
    /// The data's band half-width at the leaf edges.
    pub noise_width: f64,
    /// The population's band half-width at the leaf edges.
    pub total_width: f64,
}

/// Quantiles of a released distribution function, with simultaneous bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantiles {
    /// The estimates.
    pub values: Vec<f64>,
    /// Lower bounds of the population's quantiles.
    pub lower: Vec<f64>,
    /// Upper bounds.
    pub upper: Vec<f64>,
}

impl CdfCurve {
    /// The quantiles at `probabilities` (each in [0, 1]): the smallest x where the interpolant
    /// reaches p, and the simultaneous bounds from the population band at the leaf edges (the
    /// largest edge whose upper band edge stays below p, the smallest whose lower one reaches it).
    pub fn quantiles(&self, probabilities: &[f64], lo: f64, hi: f64) -> Quantiles {
        let knots = self.interpolant.values();
        let step = (hi - lo) / (knots.len() - 1) as f64;
        let edge = |j: usize| if j + 1 == knots.len() { hi } else { lo + step * j as f64 };
        let w = self.total_width;
        let mut out = Quantiles { values: Vec::new(), lower: Vec::new(), upper: Vec::new() };
        for &p in probabilities {
            out.values.push(self.interpolant.inverse(p));
            let below = knots.partition_point(|f| f + w < p);
            out.lower.push(if below == 0 { lo } else { edge(below - 1) });
            let reach = knots.partition_point(|f| f - w < p);
            out.upper.push(if reach == knots.len() { hi } else { edge(reach) });
        }
        out
    }
}
