//! The private 2-D kernel density estimate (SPEC §2 "Two dimensions", Hall et al. §4.1 with the
//! diagonal bandwidth of §4.1.1): `S_D(s, t) = Σ_i K_x(s, x_i)·K_y(t, y_i)` on a product grid,
//! released as post-processing of an exact discrete Gaussian mechanism on lifted coordinates.
//!
//! **Statistic.** Each axis has the 1-D layout of its bandwidth ([`crate::mechanism::density::kde::KdeLayout`], binned mode:
//! bins ≤ h/16 apart, values farther than 8h outside the axis range dropped). A row (x, y)
//! adds bilinear weights to the four surrounding bins of the product lattice — in fixed point,
//! `w₀₀ = round(wₗˣ·wₗʸ)`, `w₀₁ = wₗˣ − w₀₀`, `w₁₀ = round(wᵣˣ·wₗʸ)`, `w₁₁ = wᵣˣ − w₁₀` — which are
//! ≥ 0 and sum to exactly one unit of mass. The statistic is exact integers (mergeable
//! bit-identically across partitions, like the 1-D one).
//!
//! **Privacy map.** The product kernel is `K = K_x ⊗ K_y`, so on the periodised lattice its
//! matrix is `C_x ⊗ C_y` with each `C = Q Λ Qᵀ` the 1-D circulant of that axis. The lifted
//! coordinates are `W = L_x V L_yᵀ` with `L = Λ^{1/2} Qᵀ` (kept frequencies), computed axis by
//! axis in double-double — never a (G_x·G_y)² matrix. One row moves V by `Σ w_ab e_a e_bᵀ` with
//! `w ≥ 0, Σ w = 1`, so by convexity `‖ΔW‖_F ≤ max_ab ‖L_x e_a‖·‖L_y e_b‖ ≤ Δ_x·Δ_y`, the
//! product of the axes' proven 1-D sensitivities (each ≈ 1: SPEC's Δ = 1). Floating-point
//! error of the two passes is bounded and added to the sensitivity (as in 1-D), the
//! coordinates are rounded to `γℤ` and exact discrete Gaussian noise is added
//! ([`LatticeMechanism`]), σ from the zCDP calibration of (ε, δ).
//!
//! **Release.** `S̃ = A_x W̃ A_yᵀ` on the grid (`A = P Q Λ^{1/2}`, the 1-D synthesis along each
//! axis): its mean is the binned product-kernel sum and its noise a Gaussian field with
//! covariance `K_x ⊗ K_y` (Kronecker-structured). Normalising by the 2-D trapezoid integral,
//! the L2 projection onto densities, the mass `Z/(2π·h_x·h_y)`: post-processing.

use rand::Rng;

use crate::mechanism::contribution::Contribution;
use crate::mechanism::density::binning::linear_bin;
use crate::mechanism::density::kde::{FIXED_ONE, Grid};
use crate::mechanism::density::release::{KdeMechanism, KdeSpec, MechanismError, Normalise, projection_shift_weighted};
use crate::mechanism::noise::bands;
use crate::mechanism::noise::calibration;
use crate::mechanism::noise::calibration::Calibration;
use crate::mechanism::noise::double_double::DD;
use crate::mechanism::noise::lattice::{LatticeMechanism, ROW_LIMIT};
use crate::mechanism::sums::{BufferedSums, Buffers, most_heap_bytes};

/// Largest product-lattice statistic (entries): 2^22 × 16 B = 64 MiB per accumulator.
pub const MAX_STATE: usize = 1 << 22;
/// Largest number of lifted coordinates (the noise's dimension).
pub const MAX_COORDINATES: usize = 1 << 22;
/// Largest output grid (points_x × points_y).
pub const MAX_GRID: usize = 1 << 20;
/// Rows buffered before a flush: one row adds at most 2^40 to an entry (see [`BufferedSums`]).
const FLUSH_ROWS: usize = 1 << 22;

/// All public parameters of one `private_kde2d` release.
#[derive(Debug, Clone, PartialEq)]
pub struct Kde2dSpec {
    /// Grid along x.
    pub grid_x: Grid,
    /// Grid along y.
    pub grid_y: Grid,
    /// Bandwidth along x.
    pub bandwidth_x: f64,
    /// Bandwidth along y.
    pub bandwidth_y: f64,
    /// Privacy parameter ε.
    pub epsilon: f64,
    /// Privacy parameter δ (> 0).
    pub delta: f64,
    /// σ calibration.
    pub calibration: Calibration,
    /// How the released sum becomes a density.
    pub normalise: Normalise,
}

/// One private 2-D KDE release.
#[derive(Debug, Clone, PartialEq)]
pub struct Kde2dRelease {
    /// Grid along x.
    pub x: Vec<f64>,
    /// Grid along y.
    pub y: Vec<f64>,
    /// `density[i][j]` at `(x[i], y[j])`, or None when the released surface carries less than
    /// one point's mass.
    pub density: Option<Vec<Vec<f64>>>,
    /// `Z/(2π·h_x·h_y)`: a noisy count of the points in the box.
    pub mass: f64,
    /// What the noisy surface was divided by to give the density (NaN without one).
    pub normaliser: f64,
}

/// Simultaneous level-α bands of a 2-D release, as half-widths on the grid in density units
/// (`[i][j]` at `(x[i], y[j])`, like the density).
#[derive(Debug, Clone, PartialEq)]
pub struct Kde2dBands {
    /// Covers the privacy noise over the whole grid with probability ≥ 1 − α.
    pub noise: Vec<Vec<f64>>,
    /// Plug-in band adding the sampling error of the kernel estimate; None when the released
    /// mass is below 2.
    pub total: Option<Vec<Vec<f64>>>,
}

/// The private 2-D KDE mechanism for fixed public parameters.
#[derive(Debug, Clone)]
pub struct Kde2dMechanism {
    spec: Kde2dSpec,
    /// The 1-D mechanisms of the axes: their layouts and lifted bases (their noise is unused).
    axis_x: KdeMechanism,
    axis_y: KdeMechanism,
    /// Bins along x and y.
    bins: (usize, usize),
    /// Lifted coordinates along x and y.
    dims: (usize, usize),
    lattice: LatticeMechanism,
    stat_sensitivity: f64,
}

impl Kde2dMechanism {
    /// Validates every parameter (planning time) and fixes the noise.
    pub fn new(spec: Kde2dSpec, c: Contribution) -> Result<Self, MechanismError> {
        if !(spec.delta > 0.0 && spec.delta < 1.0) {
            return Err(MechanismError::Noise(format!(
                "private_kde2d needs 0 < delta < 1 (its noise is a Gaussian field), got {}",
                spec.delta
            )));
        }
        let grid_points = spec.grid_x.points.saturating_mul(spec.grid_y.points);
        if grid_points > MAX_GRID {
            return Err(MechanismError::Noise(format!(
                "a grid of {} × {} points is too large (at most {MAX_GRID} points in all)",
                spec.grid_x.points, spec.grid_y.points
            )));
        }
        let axis = |grid: Grid, h: f64, name: &str| -> Result<KdeMechanism, MechanismError> {
            let m = KdeMechanism::new(KdeSpec {
                grid,
                bandwidth: h,
                epsilon: spec.epsilon,
                delta: spec.delta,
                calibration: spec.calibration,
                normalise: Normalise::Raw,
            })?;
            if !m.layout().is_binned() {
                return Err(MechanismError::Noise(format!(
                    "bandwidth_{name} = {h} is too small for {} points on [{}, {}] (the 2-D statistic is \
                     linearly binned): use a larger bandwidth or fewer points",
                    grid.points, grid.lo, grid.hi
                )));
            }
            Ok(m)
        };
        let axis_x = axis(spec.grid_x, spec.bandwidth_x, "x")?;
        let axis_y = axis(spec.grid_y, spec.bandwidth_y, "y")?;
        let bins = (axis_x.layout().state_len(), axis_y.layout().state_len());
        let dims = (axis_x.basis().dim(), axis_y.basis().dim());
        if bins.0.saturating_mul(bins.1) > MAX_STATE {
            return Err(MechanismError::Noise(format!(
                "the 2-D statistic would need {} × {} bins (at most {MAX_STATE}): use larger bandwidths or a \
                 smaller box",
                bins.0, bins.1
            )));
        }
        if dims.0.saturating_mul(dims.1) > MAX_COORDINATES {
            return Err(MechanismError::Noise(format!(
                "the 2-D noise would need {} × {} coordinates (at most {MAX_COORDINATES}): use larger \
                 bandwidths or a smaller box",
                dims.0, dims.1
            )));
        }
        let stat_sensitivity = axis_x.stat_sensitivity() * axis_y.stat_sensitivity();
        // Floating point: the x pass on columns of U = fl(V L_yᵀ) has error ≤ ml_x·e_x·‖U‖ and
        // propagates the y pass's error ≤ ml_y·e_y·‖V‖ through ‖L_x‖ ≤ ml_x; ‖U‖ ≤ ml_y(1+e_y)‖V‖;
        // ‖V‖_F ≤ ‖V‖₁ ≤ ROW_LIMIT rows of mass 1.
        let (ml_x, e_x) = axis_x.lift_error();
        let (ml_y, e_y) = axis_y.lift_error();
        let float_error = ml_x * ml_y * (e_y + e_x * (1.0 + e_y)) * ROW_LIMIT;
        let rho =
            calibration::zcdp_rho(spec.calibration, spec.epsilon, spec.delta).map_err(MechanismError::Calibration)?;
        let sensitivity = c.per_group() * stat_sensitivity + 2.0 * float_error;
        let lattice = LatticeMechanism::gaussian_over(sensitivity, dims.0 * dims.1, rho, c.groups)?;
        Ok(Self { spec, axis_x, axis_y, bins, dims, lattice, stat_sensitivity })
    }

    /// The parameters.
    pub fn spec(&self) -> &Kde2dSpec {
        &self.spec
    }

    /// Noise standard deviation of a lifted coordinate (≈ σ of the released sum).
    pub fn sigma(&self) -> f64 {
        self.lattice.noise_sd()
    }

    /// Proven L2 sensitivity of the lifted coordinates before floating-point slack (≈ 1).
    pub fn stat_sensitivity(&self) -> f64 {
        self.stat_sensitivity
    }

    /// The discrete mechanism on the lifted coordinates.
    pub fn lattice(&self) -> &LatticeMechanism {
        &self.lattice
    }

    /// Length of the statistic (bins_x · bins_y, x-major).
    pub fn state_len(&self) -> usize {
        self.bins.0 * self.bins.1
    }

    /// Memory one call needs: (state, work) in bytes — the i128 statistic, and the release's
    /// double-double passes plus the synthesis.
    pub fn memory_bytes(&self) -> (u64, u64) {
        let bx = self.bins.0 as u64;
        let (dx, dy) = (self.dims.0 as u64, self.dims.1 as u64);
        let (gx, gy) = (self.spec.grid_x.points as u64, self.spec.grid_y.points as u64);
        let (ax, ay) = (self.axis_x.memory_bytes().1, self.axis_y.memory_bytes().1);
        (
            most_heap_bytes(self.state_len(), Buffers::Plain),
            16 * (bx * dy + dx * dy) + 8 * (dx * gy + gx * gy + dx * dy) + ax + ay,
        )
    }

    /// A zeroed statistic.
    pub fn empty_state(&self) -> Vec<i128> {
        vec![0; self.state_len()]
    }

    /// A statistic under accumulation.
    pub fn accumulation(&self) -> BufferedSums {
        BufferedSums::new(self.state_len(), FLUSH_ROWS, Buffers::Plain)
    }

    /// Empty exact sums that partial states are merged into (no buffer: no rows are added).
    pub fn merged_accumulation(&self) -> BufferedSums {
        BufferedSums::new(self.state_len(), FLUSH_ROWS, Buffers::None)
    }

    /// Adds pairs (x, y): rows with a non-finite value, or a value farther than 8h outside its
    /// axis's range, are dropped (row-wise). Nothing a value can be makes this fail.
    pub fn add_all(&self, acc: &mut BufferedSums, xs: &[f64], ys: &[f64]) {
        let (ox, sx, nx) = self.axis_x.layout().bins().expect("binned (checked in new)");
        let (oy, sy, ny) = self.axis_y.layout().bins().expect("binned (checked in new)");
        let (ix, iy) = (1.0 / sx, 1.0 / sy);
        for (cx, cy) in xs.chunks(FLUSH_ROWS).zip(ys.chunks(FLUSH_ROWS)) {
            let pending = acc.buffer(cx.len());
            for (&x, &y) in cx.iter().zip(cy) {
                let (lx, wlx, wrx, okx) = linear_bin(x, ox, ix, nx);
                let (ly, wly, _wry, oky) = linear_bin(y, oy, iy, ny);
                let half = 1i128 << 39;
                let w00 = ((wlx as i128 * wly as i128 + half) >> 40) as i64;
                let w10 = ((wrx as i128 * wly as i128 + half) >> 40) as i64;
                let mask = -((okx & oky) as i64);
                let base = lx * ny + ly;
                pending[base] += w00 & mask;
                pending[base + 1] += (wlx - w00) & mask;
                pending[base + ny] += w10 & mask;
                pending[base + ny + 1] += (wrx - w10) & mask;
            }
        }
    }

    /// The lifted coordinates `W = L_x V L_yᵀ` (x-major, `dims.0 × dims.1`), in double-double.
    pub fn lifted(&self, state: &[i128]) -> Vec<DD> {
        let (bx, by) = self.bins;
        let (dx, dy) = self.dims;
        // y pass: every row of V (no branch on the data: the same work for any table).
        let mut u = vec![DD::default(); bx * dy];
        for ix in 0..bx {
            let row: Vec<DD> =
                state[ix * by..(ix + 1) * by].iter().map(|&v| DD::from_i128(v).scale_pow2(-40)).collect();
            u[ix * dy..(ix + 1) * dy].copy_from_slice(&self.axis_y.lift_entries(&row));
        }
        // x pass: every column of U.
        let mut w = vec![DD::default(); dx * dy];
        for c in 0..dy {
            let column: Vec<DD> = (0..bx).map(|ix| u[ix * dy + c]).collect();
            for (a, v) in self.axis_x.lift_entries(&column).into_iter().enumerate() {
                w[a * dy + c] = v;
            }
        }
        w
    }

    /// The private part of a release: noisy lifted coordinates (exact discrete Gaussian noise).
    /// `rng = None` is the noiseless test hook.
    pub fn noisy_lifted<R: Rng + ?Sized>(&self, state: &[i128], rng: Option<&mut R>) -> Vec<f64> {
        self.lattice.release(&self.lifted(state), rng)
    }

    /// `A_x W̃ A_yᵀ`: the product-kernel sum on the grid (x-major, `points_x × points_y`) for
    /// (noisy) lifted coordinates. Post-processing.
    pub fn surface_from_lifted(&self, w: &[f64]) -> Vec<f64> {
        let (dx, dy) = self.dims;
        let (gx, gy) = (self.spec.grid_x.points, self.spec.grid_y.points);
        let mut t = vec![0.0; dx * gy];
        for a in 0..dx {
            t[a * gy..(a + 1) * gy].copy_from_slice(&self.axis_y.curve_from_lifted(&w[a * dy..(a + 1) * dy]));
        }
        let mut out = vec![0.0; gx * gy];
        for ky in 0..gy {
            let column: Vec<f64> = (0..dx).map(|a| t[a * gy + ky]).collect();
            for (kx, v) in self.axis_x.curve_from_lifted(&column).into_iter().enumerate() {
                out[kx * gy + ky] = v;
            }
        }
        out
    }

    /// The exact (binned, noiseless) product-kernel sum on the grid, from the statistic: for tests.
    pub fn sum_on_grid(&self, state: &[i128]) -> Vec<f64> {
        let (bx, by) = self.bins;
        let (gx, gy) = (self.spec.grid_x, self.spec.grid_y);
        let (hx, hy) = (self.spec.bandwidth_x, self.spec.bandwidth_y);
        let (lx, ly) = (self.axis_x.layout(), self.axis_y.layout());
        let mut out = vec![0.0; gx.points * gy.points];
        for ix in 0..bx {
            let px = lx.lattice_position(ix);
            for iy in 0..by {
                let v = state[ix * by + iy];
                if v == 0 {
                    continue;
                }
                let (py, w) = (ly.lattice_position(iy), v as f64 / FIXED_ONE);
                for kx in 0..gx.points {
                    let kxv = crate::mechanism::density::kde::gaussian_kernel(gx.at(kx), px, hx);
                    for ky in 0..gy.points {
                        out[kx * gy.points + ky] +=
                            w * kxv * crate::mechanism::density::kde::gaussian_kernel(gy.at(ky), py, hy);
                    }
                }
            }
        }
        out
    }

    /// The 2-D trapezoid weights of the grid (x-major) and the cell area.
    fn quadrature(&self) -> (Vec<f64>, f64) {
        let (gx, gy) = (self.spec.grid_x, self.spec.grid_y);
        let end = |k: usize, n: usize| if k == 0 || k + 1 == n { 0.5 } else { 1.0 };
        let w = (0..gx.points)
            .flat_map(|kx| (0..gy.points).map(move |ky| end(kx, gx.points) * end(ky, gy.points)))
            .collect();
        (w, gx.step() * gy.step())
    }

    /// Post-processing of the released surface `S̃` (free, SPEC §0): the density on the grid
    /// under the chosen normalisation, and the mass.
    pub fn post_process(&self, noisy_sum: &[f64]) -> Kde2dRelease {
        let (gx, gy) = (self.spec.grid_x, self.spec.grid_y);
        let one_point = 2.0 * std::f64::consts::PI * self.spec.bandwidth_x * self.spec.bandwidth_y;
        let (weights, cell) = self.quadrature();
        let integral = |v: &mut dyn Iterator<Item = f64>| cell * v.zip(&weights).map(|(a, w)| a * w).sum::<f64>();
        let z = integral(&mut noisy_sum.iter().copied());
        let mut release =
            Kde2dRelease { x: gx.xs(), y: gy.xs(), density: None, mass: z / one_point, normaliser: f64::NAN };
        if z > one_point {
            let flat: Vec<f64> = match self.spec.normalise {
                Normalise::Project => {
                    release.normaliser = z;
                    let g: Vec<f64> = noisy_sum.iter().map(|v| v / z).collect();
                    let c = projection_shift_weighted(&g, &weights, cell);
                    g.iter().map(|v| (v - c).max(0.0)).collect()
                }
                Normalise::Rescale => {
                    // ∫max(S̃, 0) ≥ Z > 0.
                    let total = integral(&mut noisy_sum.iter().map(|v| v.max(0.0)));
                    release.normaliser = total;
                    noisy_sum.iter().map(|v| v.max(0.0) / total).collect()
                }
                Normalise::Raw => {
                    release.normaliser = z;
                    noisy_sum.iter().map(|v| v / z).collect()
                }
            };
            release.density = Some(flat.chunks(gy.points).map(<[f64]>::to_vec).collect());
        }
        release
    }

    /// The level-α threshold of the noise band in units of σ: the released surface's noise is
    /// a stationary Gaussian field with sd `σ·s_x·s_y` (each axis' synthesis sd, ≈ 1) and
    /// correlation `exp(−dx²/2h_x² − dy²/2h_y²)` ([`bands::gaussian_field_threshold`]).
    pub fn noise_threshold(&self, alpha: f64) -> f64 {
        let (gx, gy) = (self.spec.grid_x, self.spec.grid_y);
        let u = bands::gaussian_field_threshold(
            alpha,
            (gx.points, gx.step(), self.spec.bandwidth_x),
            (gy.points, gy.step(), self.spec.bandwidth_y),
        );
        u * self.axis_x.synthesis_sd() * self.axis_y.synthesis_sd()
    }

    /// Simultaneous level-α bands of a release (post-processing: public σ, kernel and grid, and
    /// for the plug-in band the released density and mass). None without a density.
    pub fn bands(&self, release: &Kde2dRelease, alpha: f64) -> Option<Kde2dBands> {
        let density = release.density.as_ref()?;
        let u = self.noise_threshold(alpha);
        let sd = self.sigma() / release.normaliser;
        let noise = density.iter().map(|row| vec![u * sd; row.len()]).collect();
        // Sampling error of a product Gaussian kernel estimate: Var f̂ ≈ f·R(K)/(n·h_x·h_y)
        // with R(K) = 1/(4π); its field is no rougher than the noise's, so u covers the sum.
        let (hx, hy) = (self.spec.bandwidth_x, self.spec.bandwidth_y);
        let rk = 0.25 / std::f64::consts::PI;
        let total = (release.mass >= 2.0).then(|| {
            density
                .iter()
                .map(|row| {
                    row.iter().map(|&f| u * sd.hypot((f.max(0.0) * rk / (release.mass * hx * hy)).sqrt())).collect()
                })
                .collect()
        });
        Some(Kde2dBands { noise, total })
    }

    /// Releases: noisy lifted coordinates, the surface, the density.
    pub fn release<R: Rng + ?Sized>(&self, state: &[i128], rng: Option<&mut R>) -> Kde2dRelease {
        self.post_process(&self.surface_from_lifted(&self.noisy_lifted(state, rng)))
    }
}
