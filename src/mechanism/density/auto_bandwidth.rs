//! `bandwidth => 'auto'` (Hall et al. §4.1.2): a bandwidth chosen privately, for the
//! data, within the call's own ε.
//!
//! One fine binned statistic is accumulated (bins ≤ Δ/8 apart, Δ = (hi − lo)/[`FINEST_NODES`]);
//! values farther than 16Δ = (hi − lo)/64 outside `[lo, hi]` are dropped (a public row-wise
//! rule). At release, two pure-ε releases of that statistic:
//!
//! 1. **Count** (a share [`COUNT_SHARE`] of ε): the statistic binned onto two nodes (its ends),
//!    discrete Laplace noise. The noisy total ñ, in units of the final release's node noise sd
//!    σ (a public number: ñ/σ is the data's signal against that release's noise), picks the
//!    path:
//!    - ñ/σ ≥ [`REFERENCE_BELOW`]: the final release's **node spacing** is
//!      `(hi − lo)/m` with `m = `[`NODES_PER_ROOT`]`·√(ñ/σ)` snapped to the nearest
//!      quarter-octave in [`NODE_LADDER`] (finer nodes resolve more, coarser ones carry less
//!      noise per unit of smoothing; the finest a density needs grows like √(n·ε)).
//!    - Below: at such small n the counts are mostly noise. A second count
//!      ([`SECOND_COUNT_SHARE`] of ε; the first one's noise is a large part of n) sharpens ñ
//!      (inverse-variance mean of the two), and the **reference rule**
//!      ([`AutoKde::reference_choice`]) chooses (h, spacing): the pair minimising the exact MISE of
//!      the release's kernel for a normal density with sd [`REFERENCE_SD`]·range plus the exact
//!      integrated noise variance of that release ([`REFERENCE_SHARE`] of ε).
//! 2. **Release** ([`FINAL_SHARE`] of ε after the spacing rule): the statistic linearly binned onto
//!    those nodes, discrete Laplace noise on the node counts (the pure-ε KDE's release).
//! 3. **Choice** (post-processing of the release's own counts, [`AutoKde::refine`]): binned
//!    least-squares cross-validation of the kernel the release applies ([`FINAL_KERNEL`],
//!    [`NodeKernel::Sixth`]: a signed sum of three Gaussians, so every term below is a sum of
//!    Gaussian terms), `LSCV(h) = ∫f̂_h² − 2/(n(n−1))·Σ_{i≠l} K_h(X_i − X_l)`, computed from the
//!    noisy node counts with the known noise variance removed from the diagonal
//!    (E c̃_j² = c_j² + σ²) and each row's own binned contribution (⅔·K_h(0) + ⅓·K_h(Δ) on
//!    average) removed from the cross term, plus the integrated variance the release's noise
//!    adds at h, `L·σ²·∫K²/(Δ·ñ²)`, over the [`CANDIDATES`] bandwidths ≥
//!    [`NodeKernel::min_ratio`] node spacings; the largest local minimiser (Hall & Marron 1991;
//!    the global one is often a spurious small h at small n). LSCV estimates the MISE up to a
//!    constant without assuming a shape, so multimodal densities (the claw) are not smoothed
//!    away the way normal-reference and plug-in rules do. The curve is the kernel sum of the
//!    released counts at that h. (The reference path keeps the reference rule's h: at
//!    n·ε ≈ 100 a choice from the counts was measured to lose.)
//!
//! The releases compose to ε (pure); which path runs and the final release's nodes are a
//! function of the count release, the final h a function of the releases only (adaptive
//! composition of pure-ε mechanisms, each calibrated before any data are read; every (h,
//! nodes) pair the data could pick is validated at planning).

use rand::Rng;

use crate::mechanism::contribution::Contribution;
use crate::mechanism::density::kde::{Grid, KdeLayout};
use crate::mechanism::density::kernel::{GaussianSum, NodeKernel, normal_density};
use crate::mechanism::density::release::{KdeMechanism, KdeSpec, MechanismError, Normalise};
use crate::mechanism::noise::calibration::Calibration;

/// Share of the call's ε spent on the noisy count that chooses the path and the node spacing.
pub const COUNT_SHARE: f64 = 0.02;
/// Share of the call's ε of the final release when the count chose its node spacing.
pub const FINAL_SHARE: f64 = 1.0 - COUNT_SHARE;
/// Share of the call's ε of the second count (the reference path only).
pub const SECOND_COUNT_SHARE: f64 = 0.05;
/// Share of the call's ε of the final release on the reference path.
pub const REFERENCE_SHARE: f64 = 1.0 - COUNT_SHARE - SECOND_COUNT_SHARE;
/// Below this many final-release noise sds (ñ/σ, ≈ 0.69·n·ε for one row per unit) the
/// reference rule chooses.
pub const REFERENCE_BELOW: f64 = 280.0;
/// The final release's node count over the range per √(ñ/σ) (≈ 2·√(n·ε) for one row per unit).
pub const NODES_PER_ROOT: f64 = 2.4;
/// The node counts over the range the spacing rule snaps to: quarter octaves from 2⁵ to 2¹⁰.
pub const NODE_LADDER: std::ops::RangeInclusive<i32> = 20..=40;
/// The finest node count over the range the statistic's bins serve (bins ≤ range/(8·1024)).
pub const FINEST_NODES: f64 = 1024.0;
/// Candidate bandwidths (geometric from 2·range/[`FINEST_NODES`] to range/4).
pub const CANDIDATES: usize = 48;
/// The reference rule's normal density has this standard deviation, as a share of the range.
pub const REFERENCE_SD: f64 = 1.0 / 10.0;
/// Counts whose total is below this many noise sds are noise: the reference rule's h is kept.
pub const NOISE_FLOOR: f64 = 3.0;
/// The kernel the final release smooths its node counts with (post-processing).
pub const FINAL_KERNEL: NodeKernel = NodeKernel::Sixth;

/// The reference rule's node spacings, as multiples of h: the widest the kernel allows with
/// the binning (the sixth-order kernel's bias does not depend on the spacing, its noise falls
/// with it); the Gaussian's h/2 (the fixed-h release's) and 3h/2 (a third of the nodes, so a
/// third of the noise, for about 17 % more smoothing).
pub fn node_factors(kernel: NodeKernel) -> &'static [f64] {
    match kernel {
        NodeKernel::Gaussian => &[0.5, 1.5],
        NodeKernel::Sixth => &[4.0 / 3.0],
    }
}

/// The public parameters of an automatic-bandwidth release.
#[derive(Debug, Clone)]
pub struct AutoKde {
    grid: Grid,
    epsilon: f64,
    normalise: Normalise,
    contribution: Contribution,
    layout: KdeLayout,
    count: KdeMechanism,
    second_count: KdeMechanism,
    /// The final release at the finest nodes (its memory is the most any release needs).
    finest: KdeMechanism,
    /// The final release's node noise sd after the spacing rule, and on the reference path.
    final_sigma: f64,
    reference_sigma: f64,
}

/// What the choice saw (for the log and the tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The chosen bandwidth.
    pub bandwidth: f64,
    /// The final release's node spacing (asked for: the nodes are a whole number of bins
    /// apart, never more).
    pub node_spacing: f64,
    /// The noisy count the path and the spacing were chosen from.
    pub n: f64,
    /// Whether the reference rule chose (h, spacing) (a small ñ; the release has
    /// [`REFERENCE_SHARE`] of ε), or the count chose the spacing and the release's counts h
    /// ([`FINAL_SHARE`]).
    pub reference: bool,
    /// Every candidate scored.
    pub scores: Scores,
}

/// (h, node spacing, score) for every candidate scored.
pub type Scores = Vec<(f64, f64, f64)>;

impl AutoKde {
    /// Validates the public parameters (planning time).
    pub fn new(grid: Grid, epsilon: f64, normalise: Normalise, c: Contribution) -> Result<Self, MechanismError> {
        let range = grid.hi - grid.lo;
        let finest = range / FINEST_NODES;
        // Bins Δ/8 apart for the finest nodes (a layout at bandwidth 2Δ bins at ≤ 2Δ/16), reach 16Δ.
        let layout = KdeLayout::new(grid, 2.0 * finest).map_err(MechanismError::Kde)?;
        let pure = |h: f64, e: f64| {
            KdeMechanism::pure_epsilon_on(Self::spec(grid, h, e, normalise), layout.clone(), c, h / 2.0)
        };
        // The count: nodes at the two ends of the layout (a bandwidth far above the range).
        // (Nodes ≥ 2·range apart: one at each end of the layout, whose reach is range/64.)
        let count_bandwidth = 4.25 * range;
        let count = pure(count_bandwidth, epsilon * COUNT_SHARE)?;
        let second_count = pure(count_bandwidth, epsilon * SECOND_COUNT_SHARE)?;
        // Every release's node noise has one sd whatever its nodes (L1 sensitivity 1 per row).
        let finest_release = pure(2.0 * finest, epsilon * FINAL_SHARE)?;
        let (final_sigma, reference_sigma) =
            (finest_release.sigma(), pure(2.0 * finest, epsilon * REFERENCE_SHARE)?.sigma());
        let auto = Self {
            grid,
            epsilon,
            normalise,
            contribution: c,
            layout,
            count,
            second_count,
            finest: finest_release,
            final_sigma,
            reference_sigma,
        };
        // Every final mechanism the data could pick is built here, at planning: which one they
        // pick can then never decide whether the release fails.
        for h in auto.candidates() {
            for &f in node_factors(FINAL_KERNEL) {
                auto.mechanism_with_share(h, f * h, REFERENCE_SHARE, FINAL_KERNEL)?;
            }
        }
        for spacing in auto.ladder() {
            // (At least range/4 ≥ 0.75·range/32 is always there; checked, not assumed.)
            if auto.final_candidates(spacing).is_empty() {
                return Err(MechanismError::Noise(format!("no candidate bandwidth for nodes {spacing} apart")));
            }
            for h in auto.final_candidates(spacing) {
                auto.mechanism_with_share(h, spacing, FINAL_SHARE, FINAL_KERNEL)?;
            }
        }
        Ok(auto)
    }

    /// The candidate bandwidths: geometric from twice the finest node spacing to range/4.
    fn candidates(&self) -> Vec<f64> {
        let range = self.grid.hi - self.grid.lo;
        let (h_lo, h_hi) = (2.0 * range / FINEST_NODES, range / 4.0);
        (0..CANDIDATES).map(|i| h_lo * (h_hi / h_lo).powf(i as f64 / (CANDIDATES - 1) as f64)).collect()
    }

    /// The node spacings the spacing rule can pick: the range over each of [`NODE_LADDER`]'s
    /// node counts.
    fn ladder(&self) -> impl Iterator<Item = f64> + '_ {
        NODE_LADDER.map(|j| (self.grid.hi - self.grid.lo) / 2f64.powf(j as f64 / 4.0))
    }

    /// The spacing rule: the final release's node spacing for the noisy count `n` (≥
    /// [`REFERENCE_BELOW`] noise sds), `range / m` with `m = NODES_PER_ROOT·√(n/σ)` snapped to the
    /// nearest of [`NODE_LADDER`] (post-processing of the count).
    pub fn node_spacing_for(&self, n: f64) -> f64 {
        let m = NODES_PER_ROOT * (n.max(0.0) / self.final_sigma).sqrt();
        let j = (4.0 * m.max(1.0).log2()).round().clamp(*NODE_LADDER.start() as f64, *NODE_LADDER.end() as f64);
        (self.grid.hi - self.grid.lo) / 2f64.powf(j / 4.0)
    }

    /// The risk the reference rule minimises for n rows at (h, s): the exact MISE of the kernel
    /// the release applies for a normal density of sd [`REFERENCE_SD`]·range ([`normal_mise`]),
    /// plus the release's integrated noise variance at node noise sd `sigma`.
    fn reference_risk(&self, n: f64, sigma: f64) -> impl Fn(f64, f64) -> f64 {
        let sd = REFERENCE_SD * (self.grid.hi - self.grid.lo);
        let noise = self.release_noise(n, sigma);
        move |h: f64, s: f64| normal_mise(&FINAL_KERNEL.effective(h, s), sd, n) + noise(h, s)
    }

    /// The final release's integrated noise variance at bandwidth h with nodes s apart, for n
    /// rows and node noise sd `sigma`, as a function of (h, s): the kernel sum of iid node noise
    /// of variance σ² over nodes s apart has variance ≈ σ²·∫K²/s at every point (in the units
    /// of n rows: divided by n²).
    fn release_noise(&self, n: f64, sigma: f64) -> impl Fn(f64, f64) -> f64 {
        let range = self.grid.hi - self.grid.lo;
        move |h: f64, s: f64| {
            FINAL_KERNEL.on_nodes(h, s).map_or(f64::INFINITY, |k| range * sigma * sigma * k.roughness() / (s * n * n))
        }
    }

    /// The reference rule: the (h, node spacing) among the candidates and [`node_factors`]
    /// minimising [`Self::reference_risk`] for the noisy count `count`. A function of the noisy
    /// count and public parameters only.
    pub fn reference_choice(&self, count: f64) -> Choice {
        let risk = self.reference_risk(count.max(2.0), self.reference_sigma);
        let mut scores = Vec::new();
        for h in self.candidates() {
            for &f in node_factors(FINAL_KERNEL) {
                scores.push((h, f * h, risk(h, f * h)));
            }
        }
        let (bandwidth, node_spacing, _) =
            scores.iter().copied().min_by(|a, b| a.2.total_cmp(&b.2)).expect("candidates");
        Choice { bandwidth, node_spacing, n: count, reference: true, scores }
    }

    fn spec(grid: Grid, bandwidth: f64, epsilon: f64, normalise: Normalise) -> KdeSpec {
        KdeSpec { grid, bandwidth, epsilon, delta: 0.0, calibration: Calibration::Analytic, normalise }
    }

    /// The layout of the accumulated statistic.
    pub fn layout(&self) -> &KdeLayout {
        &self.layout
    }

    /// The final release's mechanism smoothing with `kernel` at bandwidth h with nodes
    /// `node_spacing` apart, with [`REFERENCE_SHARE`] of ε on the reference path (`reference`),
    /// [`FINAL_SHARE`] otherwise.
    pub fn mechanism_at(
        &self,
        h: f64,
        node_spacing: f64,
        reference: bool,
        kernel: NodeKernel,
    ) -> Result<KdeMechanism, MechanismError> {
        self.mechanism_with_share(h, node_spacing, if reference { REFERENCE_SHARE } else { FINAL_SHARE }, kernel)
    }

    /// [`Self::mechanism_at`] with `share` of the call's ε.
    fn mechanism_with_share(
        &self,
        h: f64,
        node_spacing: f64,
        share: f64,
        kernel: NodeKernel,
    ) -> Result<KdeMechanism, MechanismError> {
        let spec = Self::spec(self.grid, h, self.epsilon * share, self.normalise);
        KdeMechanism::pure_epsilon_with_kernel(spec, self.layout.clone(), self.contribution, node_spacing, kernel)
    }

    /// The final step alone, for studies of the choice (`cargo bench --bench utility -- --study
    /// spacing`): a release on nodes `node_spacing` apart with `share` (in (0, 1]) of the call's
    /// ε, and h chosen from its own counts ([`Self::refine`]). Returns the mechanism at that h
    /// and the released node counts. Not what a query runs: a query's spacing comes from its
    /// count, and its shares are fixed.
    pub fn release_at_spacing<R: Rng + ?Sized>(
        &self,
        node_spacing: f64,
        share: f64,
        state: &[i128],
        rng: Option<&mut R>,
    ) -> Result<(KdeMechanism, Vec<f64>), MechanismError> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(MechanismError::Noise(format!("a share of ε must be in (0, 1], got {share}")));
        }
        if self.final_candidates(node_spacing).is_empty() {
            return Err(MechanismError::Noise(format!("no candidate bandwidth for nodes {node_spacing} apart")));
        }
        let (m, lifted, _) = self.release_and_refine(None, node_spacing, share, state, rng)?;
        Ok((m, lifted))
    }

    /// The final release on nodes `node_spacing` apart with `share` of ε, then h chosen from
    /// its own counts ([`Self::refine`]; when their total is noise, the reference rule's h at
    /// that spacing among the same candidates, for the noisy count `n` or, from the studies,
    /// the counts' total): the mechanism at that h, the released counts, and the choice. The
    /// counts do not depend on the h the first mechanism is built at, only that mechanism does.
    fn release_and_refine<R: Rng + ?Sized>(
        &self,
        n: Option<f64>,
        node_spacing: f64,
        share: f64,
        state: &[i128],
        rng: Option<&mut R>,
    ) -> Result<(KdeMechanism, Vec<f64>, Choice), MechanismError> {
        let candidates = self.final_candidates(node_spacing);
        let Some(&h0) = candidates.last() else {
            return Err(MechanismError::Noise(format!("no candidate bandwidth for nodes {node_spacing} apart")));
        };
        let mut mechanism = self.mechanism_with_share(h0, node_spacing, share, FINAL_KERNEL)?;
        let lifted = mechanism.noisy_lifted(state, rng);
        let (_, spacing, _) = mechanism.nodes().expect("the release is a pure-ε release");
        let sigma = mechanism.sigma();
        let fallback = |total: f64| {
            let risk = self.reference_risk(n.unwrap_or(total).max(2.0), sigma);
            candidates.iter().copied().min_by(|a, b| risk(*a, spacing).total_cmp(&risk(*b, spacing))).unwrap_or(h0)
        };
        let (h, scores) = self.refine(&lifted, spacing, sigma * sigma, &candidates, fallback);
        if h != h0 {
            mechanism = self.mechanism_with_share(h, node_spacing, share, FINAL_KERNEL)?;
        }
        let n = n.unwrap_or_else(|| lifted.iter().sum());
        Ok((mechanism, lifted, Choice { bandwidth: h, node_spacing, n, reference: false, scores }))
    }

    /// Memory one call needs: (state, work), as [`KdeMechanism::memory_bytes`].
    pub fn memory_bytes(&self) -> (u64, u64) {
        self.finest.memory_bytes()
    }

    /// The bandwidths the final choice may take for a release whose nodes were placed
    /// `node_spacing` apart (the spacing asked for, which [`Self::new`] validates with each of
    /// them): the candidates ≥ [`NodeKernel::min_ratio`]·`node_spacing`.
    fn final_candidates(&self, node_spacing: f64) -> Vec<f64> {
        let min = FINAL_KERNEL.min_ratio() * node_spacing * (1.0 - 1e-9);
        self.candidates().into_iter().filter(|&h| h >= min).collect()
    }

    /// The final choice of h, from the release's own noisy node counts `counts` (nodes
    /// `spacing` apart, noise variance `noise_var`; post-processing), among `candidates`:
    /// binned least-squares cross-validation — `∫f̂_h²` of the release itself (exact in the
    /// counts) minus twice the cross term at the kernel that, both rows having been binned
    /// (s²/6 each), smooths like the release (s²/6 once), each node's own rows removed — plus
    /// the integrated variance of the release's noise at h; the largest local minimiser. When
    /// the counts' total is indistinguishable from noise, `fallback(total)`. Returns h and the
    /// scores.
    fn refine(
        &self,
        counts: &[f64],
        spacing: f64,
        noise_var: f64,
        candidates: &[f64],
        fallback: impl Fn(f64) -> f64,
    ) -> (f64, Scores) {
        let total = counts.iter().sum::<f64>();
        if total < NOISE_FLOOR * (noise_var * counts.len() as f64).sqrt() {
            return (fallback(total), Vec::new());
        }
        let n = total.max(2.0);
        let pairs = PairSums::new(counts, spacing, noise_var);
        let noise = self.release_noise(n, noise_var.sqrt());
        let v = spacing * spacing / 6.0;
        let scores: Scores = candidates
            .iter()
            .map(|&h| {
                // The kernel on the counts, and the one whose pair sums over binned counts
                // estimate the cross term: what the data see, less both rows' binning (2·s²/6).
                let on = FINAL_KERNEL.on_nodes(h, spacing);
                let cross = FINAL_KERNEL.effective(h, spacing).narrowed(2.0 * v);
                let (Some(on), Some(cross)) = (on, cross) else { return (h, spacing, f64::INFINITY) };
                let own = own_pairs(&cross, n, spacing);
                let cross_sum = cross.parts().iter().map(|&(w, s)| w * pairs.at(s)).sum::<f64>();
                let square = on.pairs().map(|(w, s)| w * pairs.at(s)).sum::<f64>();
                (h, spacing, square / (n * n) - 2.0 * (cross_sum - own) / (n * (n - 1.0)) + noise(h, spacing))
            })
            .collect();
        let k = largest_local_minimiser(&scores.iter().map(|s| s.2).collect::<Vec<_>>());
        (k.map_or_else(|| fallback(total), |k| candidates[k]), scores)
    }

    /// The whole release: count, then the reference path (second count, reference rule,
    /// release) or the spacing rule's release and the choice from its counts. `rng = None` is
    /// the noiseless hook.
    pub fn release<R: Rng + ?Sized>(
        &self,
        state: &[i128],
        mut rng: Option<&mut R>,
    ) -> Result<(KdeMechanism, Vec<f64>, Choice), MechanismError> {
        let n = self.count.noisy_lifted(state, rng.as_deref_mut()).iter().sum::<f64>();
        if n / self.final_sigma < REFERENCE_BELOW {
            let n2 = self.second_count.noisy_lifted(state, rng.as_deref_mut()).iter().sum::<f64>();
            let (w1, w2) = (self.count.sigma().powi(-2), self.second_count.sigma().powi(-2));
            let choice = self.reference_choice((w1 * n + w2 * n2) / (w1 + w2));
            let mechanism = self.mechanism_at(choice.bandwidth, choice.node_spacing, true, FINAL_KERNEL)?;
            let lifted = mechanism.noisy_lifted(state, rng);
            return Ok((mechanism, lifted, choice));
        }
        self.release_and_refine(Some(n), self.node_spacing_for(n), FINAL_SHARE, state, rng)
    }
}

/// What n rows' own pairs add to the pair sum of their counts on nodes `spacing` apart with
/// kernel `k`: a row t of the way between two nodes adds (1−t)² + t² at lag 0 and 2t(1−t) at
/// lag 1, ⅔·K(0) + ⅓·K(Δ) on average (the cross-validation's self terms).
fn own_pairs(k: &GaussianSum, n: f64, spacing: f64) -> f64 {
    n * k.parts().iter().map(|&(w, s)| w * (2.0 * normal_density(s, 0.0) + normal_density(s, spacing))).sum::<f64>()
        / 3.0
}

/// The exact MISE of the kernel estimate with kernel `k` (what the data see) for n draws of a
/// normal density with sd `sd` (Marron & Wand 1992): the integrated squared bias
/// `∫(K∗f − f)²` plus the integrated variance `(∫K² − ∫(K∗f)²)/n`, every term a normal density
/// at 0 because convolutions of normals are normal.
fn normal_mise(k: &GaussianSum, sd: f64, n: f64) -> f64 {
    let two = 2.0 * sd * sd;
    let at = |var: f64| normal_density(var.sqrt(), 0.0);
    let kk_f: f64 = k.pairs().map(|(w, s)| w * at(two + s * s)).sum();
    let k_f: f64 = k.parts().iter().map(|&(w, s)| w * at(two + s * s)).sum();
    let bias = kk_f - 2.0 * k_f + at(two);
    bias + (k.roughness() - kk_f) / n
}

/// The index of the largest local minimiser of `scores` (the last one's neighbours both score
/// higher; the first counts when the second is higher), or of the global minimum when there is
/// no interior one.
fn largest_local_minimiser(scores: &[f64]) -> Option<usize> {
    (0..scores.len().saturating_sub(1))
        .rev()
        .find(|&k| (k == 0 || scores[k - 1] > scores[k]) && scores[k + 1] > scores[k])
        .or_else(|| (0..scores.len()).min_by(|&a, &b| scores[a].total_cmp(&scores[b])))
}

/// `Σ_{j,k} c_j·c_k·φ_s(x_j − x_k)` for noisy node counts `c` on nodes Δ apart, from their
/// autocorrelation by lag with the noise's known variance removed from the diagonal
/// (`E c̃_j² = c_j² + σ²`): the pair sums of binned cross-validation.
struct PairSums {
    acf: Vec<f64>,
    spacing: f64,
}

impl PairSums {
    fn new(counts: &[f64], spacing: f64, noise_var: f64) -> Self {
        let nodes = counts.len();
        let mut acf: Vec<f64> =
            (0..nodes).map(|lag| (0..nodes - lag).map(|j| counts[j] * counts[j + lag]).sum::<f64>()).collect();
        if let Some(a) = acf.first_mut() {
            *a -= noise_var * nodes as f64;
        }
        Self { acf, spacing }
    }

    /// The pair sum with the normal density of sd `s`.
    fn at(&self, s: f64) -> f64 {
        let norm = 1.0 / (s * (2.0 * std::f64::consts::PI).sqrt());
        let mut total = self.acf.first().copied().unwrap_or(0.0) * norm;
        for (lag, a) in self.acf.iter().enumerate().skip(1) {
            let z = lag as f64 * self.spacing / s;
            if z > 40.0 {
                break;
            }
            total += 2.0 * a * norm * (-0.5 * z * z).exp();
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::ChaCha20Rng;
    use rand_distr::{Distribution, Normal};

    fn draws(n: usize, seed: u64, claw: bool) -> Vec<f64> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                if claw {
                    // Marron–Wand claw: ½N(0,1) + Σ_{l=0..4} (1/10)·N(l/2 − 1, 0.1²).
                    if i % 2 == 0 {
                        Normal::new(0.0, 1.0).unwrap().sample(&mut rng)
                    } else {
                        Normal::new(((i / 2) % 5) as f64 / 2.0 - 1.0, 0.1).unwrap().sample(&mut rng)
                    }
                } else {
                    let m = if i % 2 == 0 { -1.0 } else { 1.0 };
                    Normal::new(m, 0.5).unwrap().sample(&mut rng)
                }
            })
            .collect()
    }

    fn claw_density(x: f64) -> f64 {
        let phi = |z: f64, s: f64| (-(z * z) / (2.0 * s * s)).exp() / (s * (2.0 * std::f64::consts::PI).sqrt());
        0.5 * phi(x, 1.0) + (0..5).map(|l| 0.1 * phi(x - (l as f64 / 2.0 - 1.0), 0.1)).sum::<f64>()
    }

    fn ise(density: &[f64], xs: &[f64], truth: impl Fn(f64) -> f64) -> f64 {
        let step = xs[1] - xs[0];
        density.iter().zip(xs).map(|(d, x)| (d - truth(*x)).powi(2)).sum::<f64>() * step
    }

    /// The automatic release on the claw's range [−3, 3] (`points` grid points, `epsilon`) and
    /// its statistic of n claw draws from `seed`.
    fn claw(points: usize, epsilon: f64, n: usize, seed: u64) -> (AutoKde, Vec<i128>) {
        let auto =
            AutoKde::new(Grid { lo: -3.0, hi: 3.0, points }, epsilon, Normalise::Project, Contribution::ROW).unwrap();
        let mut st = auto.layout().empty_state();
        auto.layout().add_all(&mut st, &draws(n, seed, true));
        (auto, st)
    }

    #[test]
    fn auto_resolves_the_claw_that_a_fixed_range_over_50_bandwidth_also_gets_and_beats_it_on_error() {
        // n = 10⁵ claw draws on [−3, 3], ε = 1: the automatic choice is near the claw's scale
        // (≤ 0.1), shows the five peaks, and has a lower ISE than h = range/50 = 0.12
        // (negative control: the oversmoothed h = range/10 loses the peaks).
        let (auto, st) = claw(601, 1.0, 100_000, 3);
        let xs = draws(100_000, 3, true);
        let grid = Grid { lo: -3.0, hi: 3.0, points: 601 };
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let (m, lifted, choice) = auto.release(&st, Some(&mut rng)).unwrap();
        let r = m.post_process(&m.curve_from_lifted(&lifted));
        let d = r.density.unwrap();
        let peaks = (1..d.len() - 1).filter(|&k| d[k] > d[k - 1] && d[k] >= d[k + 1] && r.x[k].abs() < 1.2).count();
        let ise_auto = ise(&d, &r.x, claw_density);
        let fixed = |h: f64| {
            let m = KdeMechanism::new(KdeSpec {
                grid,
                bandwidth: h,
                epsilon: 1.0,
                delta: 0.0,
                calibration: Calibration::Analytic,
                normalise: Normalise::Project,
            })
            .unwrap();
            let mut st = m.layout().empty_state();
            m.layout().add_all(&mut st, &xs);
            let r = m.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(9)));
            ise(&r.density.unwrap(), &r.x, claw_density)
        };
        let (ise_50, ise_10) = (fixed(6.0 / 50.0), fixed(6.0 / 10.0));
        eprintln!(
            "claw n = 1e5, ε = 1: auto h = {:.4} ({peaks} peaks), ISE auto {ise_auto:.5}, range/50 {ise_50:.5}, range/10 {ise_10:.5}",
            choice.bandwidth
        );
        assert!(choice.bandwidth < 0.1, "{}", choice.bandwidth);
        assert!(peaks >= 5, "{peaks} peaks");
        assert!(ise_auto < ise_50, "{ise_auto} vs {ise_50}");
        assert!(ise_10 > 2.0 * ise_auto, "negative control {ise_10}");
    }

    #[test]
    fn auto_beats_the_fixed_bandwidth_on_a_two_normal_mixture_at_large_n_and_stays_sane_at_small_n() {
        let grid = Grid { lo: -3.0, hi: 3.0, points: 601 };
        let truth = |x: f64| {
            let phi = |z: f64| (-(z * z) / (2.0 * 0.25)).exp() / (0.5 * (2.0 * std::f64::consts::PI).sqrt());
            0.5 * phi(x + 1.0) + 0.5 * phi(x - 1.0)
        };
        for (n, eps) in [(1_000_000usize, 1.0), (1_000, 0.5)] {
            let auto = AutoKde::new(grid, eps, Normalise::Project, Contribution::ROW).unwrap();
            let xs = draws(n, 5, false);
            let mut st = auto.layout().empty_state();
            auto.layout().add_all(&mut st, &xs);
            // Mean over 10 releases (one release is one noisy draw at small n).
            let reps = 10;
            let mut ise_auto = 0.0;
            let mut hs = Vec::new();
            let mut xs_grid = Vec::new();
            for seed in 0..reps {
                let (m, lifted, choice) = auto.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed))).unwrap();
                let r = m.post_process(&m.curve_from_lifted(&lifted));
                ise_auto += ise(&r.density.unwrap(), &r.x, truth) / reps as f64;
                hs.push(format!("{:.3}", choice.bandwidth));
                xs_grid = r.x;
            }
            let fm = KdeMechanism::new(KdeSpec {
                grid,
                bandwidth: 6.0 / 50.0,
                epsilon: eps,
                delta: 0.0,
                calibration: Calibration::Analytic,
                normalise: Normalise::Project,
            })
            .unwrap();
            let mut fst = fm.layout().empty_state();
            fm.layout().add_all(&mut fst, &xs);
            let ise_fixed = (0..reps)
                .map(|seed| {
                    let d = fm.release(&fst, Some(&mut ChaCha20Rng::seed_from_u64(100 + seed))).density.unwrap();
                    ise(&d, &xs_grid, truth)
                })
                .sum::<f64>()
                / reps as f64;
            eprintln!(
                "mixture n = {n}, ε = {eps}: auto h {hs:?}, mean ISE auto {ise_auto:.6}, range/50 {ise_fixed:.6}"
            );
            if n >= 1_000_000 {
                assert!(ise_auto < ise_fixed / 3.0, "{ise_auto} vs {ise_fixed}");
            } else {
                assert!(ise_auto < 3.0 * ise_fixed + 0.01, "{ise_auto} vs {ise_fixed}");
            }
        }
    }

    #[test]
    fn neighbouring_extreme_tables_all_release_so_the_choice_cannot_fail_a_query() {
        // Attack: make the choice pick an extreme h (empty table → noise only; one row; every row
        // on one point → the smallest h; uniform → a large h) and hope the final release fails
        // for one neighbour only. Every candidate is validated at planning, so all release.
        let grid = Grid { lo: 0.0, hi: 1.0, points: 128 };
        let auto = AutoKde::new(grid, 0.1, Normalise::Project, Contribution::ROW).unwrap();
        let tables: Vec<Vec<f64>> =
            vec![vec![], vec![0.5], vec![0.5; 100_000], (0..100_000).map(|i| i as f64 / 100_000.0).collect()];
        let mut chosen = Vec::new();
        for xs in &tables {
            let mut st = auto.layout().empty_state();
            auto.layout().add_all(&mut st, xs);
            for seed in 0..5 {
                let (m, lifted, c) = auto.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed))).unwrap();
                assert_eq!(lifted.len(), m.lattice().dim());
                chosen.push(c.bandwidth);
            }
        }
        // The attack did move h (so the test exercised different final mechanisms).
        let (lo, hi) = chosen.iter().fold((f64::MAX, 0.0f64), |(a, b), h| (a.min(*h), b.max(*h)));
        assert!(hi > 2.0 * lo, "{chosen:?}");
    }

    #[test]
    fn at_the_edges_of_the_range_planning_refuses_or_every_neighbour_releases_finite_numbers() {
        // Attack: a range so narrow or so wide that the sixth-order kernel's squared sds under- or
        // overflow, hoping a NaN score or ∞ weight reaches the release for one neighbour only.
        // Either the public parameters are refused at planning, or a table and its neighbour
        // (one row more, at the edge) both release, on the same number of nodes, a finite
        // density. The accepted edges must plan (so the releases are exercised there).
        let mut planned = 0;
        // The widest and narrowest ranges planning accepts (±1e100, 1e-100 apart), and beyond.
        for (lo, hi) in [(0.0, 1e-100), (-1e100, 1e100), (0.0, 1e100), (-1.0, 1.0), (0.0, 1e-300), (-1e300, 1e300)] {
            let grid = Grid { lo, hi, points: 64 };
            let plan = AutoKde::new(grid, 1.0, Normalise::Project, Contribution::ROW);
            let Ok(auto) = plan else { continue };
            planned += 1;
            let xs: Vec<f64> = (0..2_000).map(|i| lo + (hi - lo) * (0.3 + 0.4 * (i as f64 * 0.618).fract())).collect();
            for extra in [None, Some(hi)] {
                let mut st = auto.layout().empty_state();
                auto.layout().add_all(&mut st, &xs);
                if let Some(x) = extra {
                    auto.layout().add(&mut st, x);
                }
                for seed in 0..3 {
                    let (m, lifted, c) = auto.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed))).unwrap();
                    assert!(c.bandwidth.is_finite() && c.bandwidth > 0.0, "[{lo}, {hi}]: {c:?}");
                    assert_eq!(lifted.len(), m.lattice().dim());
                    let r = m.post_process(&m.curve_from_lifted(&lifted));
                    assert!(r.mass.is_finite() && r.bandwidth.is_finite(), "[{lo}, {hi}]");
                    if let Some(d) = r.density {
                        assert!(d.iter().all(|v| v.is_finite()), "[{lo}, {hi}]");
                    }
                }
            }
        }
        assert_eq!(planned, 4, "the four accepted ranges plan, the two beyond are refused");
    }

    #[test]
    fn a_large_table_gets_nodes_fine_enough_for_the_claw_and_an_error_below_the_best_fixed_bandwidth() {
        // n = 10⁶ claw draws on [−3, 3], ε = 1: the noisy count asks for the finest nodes
        // (range/1024), LSCV can go down to the claw's scale, and the ISE is below 0.8 × the
        // best of 12 fixed Gaussian bandwidths (chosen with the truth, at the full ε; the
        // sixth-order kernel beats it). Negative control: the same counts' kernel at the
        // smoothest candidate (range/4) lose the fingers, by more than 3×.
        let (auto, st) = claw(512, 1.0, 1_000_000, 31);
        let grid = Grid { lo: -3.0, hi: 3.0, points: 512 };
        let release_ise = |m: &KdeMechanism, seed: u64| {
            let l = m.noisy_lifted(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed)));
            let c = m.post_process(&m.curve_from_lifted(&l));
            ise(&c.density.unwrap(), &c.x, claw_density)
        };
        let (mut auto_ise, mut coarse_ise) = (0.0, 0.0);
        for seed in 0..3 {
            let (m, l, c) = auto.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed))).unwrap();
            assert!(!c.reference);
            assert_eq!(c.node_spacing, 6.0 / FINEST_NODES, "the finest nodes");
            assert!(m.nodes().unwrap().1 <= c.node_spacing);
            let r = m.post_process(&m.curve_from_lifted(&l));
            auto_ise += ise(&r.density.unwrap(), &r.x, claw_density) / 3.0;
            let smooth = auto.mechanism_at(1.5, c.node_spacing, false, FINAL_KERNEL).unwrap();
            let r = smooth.post_process(&smooth.curve_from_lifted(&l));
            coarse_ise += ise(&r.density.unwrap(), &r.x, claw_density) / 3.0;
        }
        let best_fixed = (0..12)
            .map(|k| {
                let h = 6.0 / 512.0 * 64f64.powf(k as f64 / 11.0);
                let spec = KdeSpec {
                    grid,
                    bandwidth: h,
                    epsilon: 1.0,
                    delta: 0.0,
                    calibration: Calibration::Analytic,
                    normalise: Normalise::Project,
                };
                let m = KdeMechanism::pure_epsilon_on(spec, auto.layout().clone(), Contribution::ROW, h / 2.0).unwrap();
                (0..3).map(|seed| release_ise(&m, 100 + seed)).sum::<f64>() / 3.0
            })
            .fold(f64::INFINITY, f64::min);
        eprintln!(
            "claw n = 1e6, ε = 1: ISE auto {auto_ise:.3e}, best fixed {best_fixed:.3e}, range/4 {coarse_ise:.3e}"
        );
        assert!(auto_ise <= 0.8 * best_fixed, "{auto_ise} vs {best_fixed}");
        assert!(coarse_ise > 3.0 * auto_ise, "negative control: {coarse_ise} vs {auto_ise}");
    }

    /// ½N(0.3, 0.1²) + ½N(0.7, 0.1²) on [0, 1].
    fn narrow_mixture_density(x: f64) -> f64 {
        let phi = |z: f64| (-(z * z) / (2.0 * 0.01)).exp() / (0.1 * (2.0 * std::f64::consts::PI).sqrt());
        0.5 * phi(x - 0.3) + 0.5 * phi(x - 0.7)
    }

    /// The automatic release at ε = 0.1 on [0, 1] (512 points) and its statistic of n draws
    /// of [`narrow_mixture_density`].
    fn narrow_mixture(n: usize, seed: u64) -> (AutoKde, Vec<i128>) {
        let auto =
            AutoKde::new(Grid { lo: 0.0, hi: 1.0, points: 512 }, 0.1, Normalise::Project, Contribution::ROW).unwrap();
        let xs: Vec<f64> = draws(n, seed, false).iter().map(|x| 0.5 + 0.2 * x).collect();
        let mut st = auto.layout().empty_state();
        auto.layout().add_all(&mut st, &xs);
        (auto, st)
    }

    #[test]
    fn the_count_places_nodes_that_resolve_the_claw_at_n_eps_1000_where_coarser_ones_do_not() {
        // n = 10³ claw draws on [−3, 3], ε = 1: the count's rule puts the final release's nodes
        // about range/64 apart (2.4·√(ñ/σ) ≈ 63 → 2⁶, a quarter octave either way with the
        // count's noise), fine enough for h to come down to the fingers
        // (sd 0.1, 0.5 apart) from the release's own counts. Over 20 releases the mean ISE is
        // below 0.6 × the same releases on nodes twice as far apart (a spacing the rule gives
        // at a quarter of the count), whose smallest h smooths the fingers away.
        let (auto, st) = claw(512, 1.0, 1_000, 41);
        let reps = 20;
        let (mut rule, mut coarse) = (0.0, 0.0);
        for seed in 0..reps {
            let (m, lifted, c) = auto.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed))).unwrap();
            assert!(!c.reference, "n·ε = 10³ takes the count's spacing");
            assert!((6.0 / 2f64.powf(6.25)..=6.0 / 2f64.powf(5.75)).contains(&c.node_spacing), "ñ = {}", c.n);
            let r = m.post_process(&m.curve_from_lifted(&lifted));
            rule += ise(&r.density.unwrap(), &r.x, claw_density) / reps as f64;
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            auto.count.noisy_lifted(&st, Some(&mut rng));
            let (m, lifted) = auto.release_at_spacing(2.0 * c.node_spacing, FINAL_SHARE, &st, Some(&mut rng)).unwrap();
            let r = m.post_process(&m.curve_from_lifted(&lifted));
            coarse += ise(&r.density.unwrap(), &r.x, claw_density) / reps as f64;
        }
        eprintln!("claw n = 1e3, ε = 1: mean ISE on the rule's nodes {rule:.5}, twice as far apart {coarse:.5}");
        assert!(rule < 0.6 * coarse, "{rule} vs {coarse}");
    }

    #[test]
    fn the_spacing_grows_like_the_root_of_the_count_on_the_ladder_and_small_counts_take_the_reference_rule() {
        let grid = Grid { lo: 0.0, hi: 1.0, points: 128 };
        let auto = AutoKde::new(grid, 1.0, Normalise::Project, Contribution::ROW).unwrap();
        let sigma = auto.final_sigma;
        // 2.4·√(ñ/σ) nodes, snapped to quarter octaves, within [2⁵, 2¹⁰].
        for (n_over_sigma, nodes) in [(280.0, 2f64.powf(5.25)), (711.1, 64.0), (1e4, 256.0), (1e9, 1024.0)] {
            let s = auto.node_spacing_for(n_over_sigma * sigma);
            assert!((1.0 / s - nodes).abs() < 1e-9 * nodes, "{n_over_sigma}: {} nodes, not {nodes}", 1.0 / s);
            assert!(auto.ladder().any(|l| l == s), "{s} is validated at planning");
        }
        // Small tables take the reference rule; a thousand rows at ε = 1 do not.
        for (n, reference) in [(0, true), (100, true), (1_000, false)] {
            let xs: Vec<f64> = (0..n).map(|i| (i as f64 * 0.618).fract()).collect();
            let mut st = auto.layout().empty_state();
            auto.layout().add_all(&mut st, &xs);
            for seed in 0..5 {
                let (_, _, c) = auto.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed))).unwrap();
                assert_eq!(c.reference, reference, "n = {n}: {c:?}");
            }
        }
    }

    #[test]
    fn the_release_chooses_h_from_its_own_counts_and_that_beats_the_reference_rule_at_the_same_nodes() {
        // n = 10⁴ draws at ε = 0.1 (n·ε = 10³), 30 releases each. On the claw ([−3, 3]), h
        // from the release's own counts has a lower mean ISE than the reference rule's h at the
        // same nodes (a normal shape smooths the fingers away). On ½N(0.3, 0.1²) + ½N(0.7, 0.1²)
        // ([0, 1]), the negative control: the same choice that forgets the counts' noise (its
        // variance neither removed from the diagonal nor charged to small h) undersmooths and
        // loses.
        let claw = claw(512, 0.1, 10_000, 23);
        let truths: [fn(f64) -> f64; 2] = [claw_density, narrow_mixture_density];
        let mut means = Vec::new();
        for ((auto, st), truth) in [claw, narrow_mixture(10_000, 23)].into_iter().zip(truths) {
            let reps = 30;
            let (mut refit, mut reference, mut noiseless) = (0.0, 0.0, 0.0);
            for seed in 0..reps {
                let mut rng = ChaCha20Rng::seed_from_u64(3_000 + seed);
                let n = auto.count.noisy_lifted(&st, Some(&mut rng)).iter().sum::<f64>();
                let node_spacing = auto.node_spacing_for(n);
                let candidates = auto.final_candidates(node_spacing);
                let m = auto.mechanism_at(candidates[0], node_spacing, false, FINAL_KERNEL).unwrap();
                let lifted = m.noisy_lifted(&st, Some(&mut rng));
                let (_, spacing, _) = m.nodes().unwrap();
                let curve_ise = |h: f64| {
                    let m = auto.mechanism_at(h, node_spacing, false, FINAL_KERNEL).unwrap();
                    let r = m.post_process(&m.curve_from_lifted(&lifted));
                    ise(&r.density.unwrap(), &r.x, truth)
                };
                let risk = auto.reference_risk(n, m.sigma());
                let h_ref = candidates.iter().copied().min_by(|a, b| risk(*a, spacing).total_cmp(&risk(*b, spacing)));
                let never = |_: f64| panic!("the counts are not noise");
                let var = m.sigma().powi(2);
                refit += curve_ise(auto.refine(&lifted, spacing, var, &candidates, never).0) / reps as f64;
                reference += curve_ise(h_ref.unwrap()) / reps as f64;
                noiseless += curve_ise(auto.refine(&lifted, spacing, 0.0, &candidates, never).0) / reps as f64;
            }
            eprintln!(
                "mean ISE: h from the release's counts {refit:.5}, the reference rule's {reference:.5}, noise ignored {noiseless:.5}"
            );
            means.push((refit, reference, noiseless));
        }
        let ((refit, reference, _), (mixture, _, noiseless)) = (means[0], means[1]);
        assert!(refit < 0.8 * reference, "claw: {refit} vs {reference}");
        assert!(noiseless > 1.15 * mixture, "negative control: {noiseless} vs {mixture}");
    }

    #[test]
    fn the_final_step_alone_at_the_chosen_spacing_is_the_automatic_releases_own_final_step() {
        // What `--study spacing` measures must be 'auto''s own final step: replaying a release's
        // count on the same noise stream, the final step alone at the spacing the count chose
        // gives the same counts and the same h. Controls: at another share of ε the counts
        // differ; shares outside (0, 1] are refused.
        let (auto, st) = narrow_mixture(10_000, 29);
        for seed in 0..5 {
            let (m, lifted, c) = auto.release(&st, Some(&mut ChaCha20Rng::seed_from_u64(seed))).unwrap();
            assert!(!c.reference, "n·ε = 10³ takes the count's spacing");
            let replay = |share: f64| {
                let mut rng = ChaCha20Rng::seed_from_u64(seed);
                auto.count.noisy_lifted(&st, Some(&mut rng));
                auto.release_at_spacing(c.node_spacing, share, &st, Some(&mut rng)).unwrap()
            };
            let (m2, lifted2) = replay(FINAL_SHARE);
            assert_eq!(lifted2, lifted, "seed {seed}");
            assert_eq!(m2.spec().bandwidth, m.spec().bandwidth, "seed {seed}");
            assert_ne!(replay(0.95).1, lifted, "control: another share, other counts");
        }
        for share in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(auto.release_at_spacing(0.01, share, &st, Some(&mut ChaCha20Rng::seed_from_u64(1))).is_err());
        }
        // Spacings no release can have are refused, not a panic.
        for spacing in [0.0, -0.01, f64::NAN, f64::INFINITY, 10.0] {
            let r = auto.release_at_spacing(spacing, 0.5, &st, Some(&mut ChaCha20Rng::seed_from_u64(1)));
            assert!(r.is_err(), "spacing {spacing}");
        }
    }
}
