//! The private KDE statistic (SPEC §2): an exact, mergeable sufficient statistic of the
//! data, and the unnormalised kernel sum `S_D(t_k) = Σ_i K(t_k, x_i)` computed from it.
//!
//! The statistic is a vector of fixed-point integers (units of 2^-40), so accumulation is
//! associative: any split of the rows into partitions and files gives *bit-identical*
//! state, and the order in which rows arrive cannot leak through floating-point
//! rounding. Each finite value adds weights that sum to exactly one unit of mass:
//!
//! * **binned mode** (the usual case): linear binning on bins of spacing ≤ h/16, so one
//!   value moves the kernel sum by `(1−w)·K(·,c_l) + w·K(·,c_{l+1})`, whose RKHS norm is
//!   ≤ 1 (Δ = 1 holds). Kernel sums are truncated no closer than 8h, and values more than
//!   8h outside `[lo, hi]` are dropped (a row-wise filter).
//! * **exact mode** (only when h is so small against the grid step that bins would exceed
//!   [`MAX_BINS`]): the kernel is evaluated at the grid points within 8h of each value.
//!
//! Everything in [`KdeLayout`] is derived from public parameters only.

use std::fmt;

use crate::mechanism::density::binning::{LinearBins, UNIT, linear_bin};
use crate::mechanism::ranges;
use crate::mechanism::sums::{BufferedSums, Buffers, add_saturating};

/// Fixed-point unit of the statistic: one row contributes `FIXED_ONE` in total.
pub const FIXED_ONE: f64 = UNIT as f64;
/// Bin spacing is at most `h / BINS_PER_BANDWIDTH`; linear binning's worst-case error
/// relative to the peak is (spacing/h)²/8 = 4.9e-4 (SPEC §2 asks for ≤ 1e-3).
pub const BINS_PER_BANDWIDTH: f64 = 16.0;
/// Kernel sums are truncated no closer than this many bandwidths (SPEC §1).
pub const TRUNCATION_BANDWIDTHS: f64 = 8.0;
/// Above this many bins the layout switches to exact evaluation at the grid points.
pub const MAX_BINS: usize = 1 << 20;
/// Largest grid accepted.
pub const MAX_POINTS: usize = 65_536;
/// Largest bandwidth relative to the grid's range.
pub const MAX_BANDWIDTH_OVER_RANGE: f64 = 16_777_216.0;
/// Kernel lag tables longer than this are replaced by evaluating exp() on the fly.
const MAX_TAPS: usize = 1 << 20;

/// An evenly spaced output grid `t_k = lo + k·(hi−lo)/(points−1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    /// First grid point.
    pub lo: f64,
    /// Last grid point.
    pub hi: f64,
    /// Number of points, at least 2.
    pub points: usize,
}

impl Grid {
    /// Distance between neighbouring points.
    pub fn step(&self) -> f64 {
        (self.hi - self.lo) / (self.points - 1) as f64
    }

    /// The k-th grid point.
    pub fn at(&self, k: usize) -> f64 {
        if k + 1 == self.points { self.hi } else { self.lo + k as f64 * self.step() }
    }

    /// All grid points.
    pub fn xs(&self) -> Vec<f64> {
        (0..self.points).map(|k| self.at(k)).collect()
    }
}

/// The Gaussian kernel `K(s,t) = exp(−(s−t)²/(2h²))`, with K(t,t) = 1.
pub fn gaussian_kernel(s: f64, t: f64, h: f64) -> f64 {
    let z = (s - t) / h;
    (-0.5 * z * z).exp()
}

/// Invalid KDE parameters (public values only).
#[derive(Debug, Clone, PartialEq)]
pub enum KdeError {
    /// Bandwidth must be finite and > 0.
    Bandwidth(f64),
    /// lo and hi must be finite with lo < hi.
    Range(f64, f64),
    /// Points must be in [2, MAX_POINTS].
    Points(i64),
    /// The bandwidth is more than [`MAX_BANDWIDTH_OVER_RANGE`] times hi − lo.
    BandwidthTooWide(f64, f64),
}

impl fmt::Display for KdeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KdeError::Bandwidth(h) => write!(f, "bandwidth must be a finite number > 0, got {h}"),
            KdeError::Range(lo, hi) => {
                write!(
                    f,
                    "lo and hi must be finite with lo < hi and lie {}, and the bandwidth at most 1e300, got lo = \
                     {lo}, hi = {hi}",
                    ranges::rule()
                )
            }
            KdeError::BandwidthTooWide(h, range) => write!(
                f,
                "bandwidth must be at most {MAX_BANDWIDTH_OVER_RANGE:e} times hi − lo = {range}, got {h} \
                 (the kernel would be flat across the grid)"
            ),
            KdeError::Points(p) => {
                write!(f, "points must be an integer in [2, {MAX_POINTS}], got {p}")
            }
        }
    }
}

impl std::error::Error for KdeError {}

/// Where a statistic's entries and the grid sit on one regular lattice (public).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatticeLayout {
    /// Lattice step (a length).
    pub unit: f64,
    /// Statistic entry j sits at lattice index `entry_stride·j`.
    pub entry_stride: usize,
    /// Grid point k sits at lattice index `grid_stride·k + grid_offset`.
    pub grid_stride: usize,
    /// See `grid_stride`.
    pub grid_offset: usize,
    /// Lattice indices used by the statistic: `0..span`.
    pub span: usize,
    /// Largest total weight (in real units) one row adds to the statistic.
    pub mass_per_row: f64,
}

/// How the statistic is laid out; see the module docs.
#[derive(Debug, Clone, PartialEq)]
enum Mode {
    /// Bins at positions `bin_step·j` (in lag units), grid point k at `grid_step·k + grid_offset`.
    Binned {
        /// Lag unit u (a length): every grid–bin distance is an integer multiple of it.
        unit: f64,
        /// Bin spacing in units.
        bin_step: usize,
        /// Grid spacing in units.
        grid_step: usize,
        /// Position of grid point 0 in units.
        grid_offset: usize,
        /// Position (length) of bin 0.
        origin: f64,
        /// Bin spacing as a length.
        spacing: f64,
        /// Number of bins.
        nbins: usize,
        /// Largest lag (units) still summed; `max_lag·unit ≥ 8h`.
        max_lag: usize,
    },
    /// One accumulator per lattice point of step `dt` from `pad` points below `lo` to `pad`
    /// points above `hi` (grid point k is entry `pad + k`), exact kernel values.
    Exact {
        /// Lattice points on each side of the grid (reach 2·8h: every value kept has all of
        /// its within-8h lattice points inside the statistic).
        pad: usize,
    },
}

/// Public layout of the KDE statistic for a (grid, bandwidth) pair.
#[derive(Debug, Clone, PartialEq)]
pub struct KdeLayout {
    grid: Grid,
    bandwidth: f64,
    mode: Mode,
}

impl KdeLayout {
    /// Validates the parameters and fixes the layout.
    pub fn new(grid: Grid, bandwidth: f64) -> Result<Self, KdeError> {
        if !(bandwidth.is_finite() && bandwidth > 0.0) {
            return Err(KdeError::Bandwidth(bandwidth));
        }
        // hi − lo must itself be finite (lo = −1e308, hi = 1e308 is not), and so must the
        // grid step: every derived quantity below is then finite.
        if !(grid.lo.is_finite() && grid.hi.is_finite() && grid.lo < grid.hi && (grid.hi - grid.lo).is_finite()) {
            return Err(KdeError::Range(grid.lo, grid.hi));
        }
        // The box and the padding around it (16 bandwidths) must stay ordinary doubles too:
        // lo = −1e308 with a bandwidth of 1e308 overflowed the padding to ∞, and the released
        // bands left the doubles on ranges 1e-200 or 2e200 wide ([`ranges`]).
        if !(ranges::accepts(grid.lo, grid.hi) && bandwidth <= 1e300) {
            return Err(KdeError::Range(grid.lo, grid.hi));
        }
        if !(2..=MAX_POINTS).contains(&grid.points) {
            return Err(KdeError::Points(grid.points as i64));
        }
        // A bandwidth more than 2^24 times the range (or a grid step below 2^-24 of it) would
        // make lattice indices overflow; such a kernel is flat across the grid anyway.
        if !(bandwidth <= MAX_BANDWIDTH_OVER_RANGE * (grid.hi - grid.lo)) {
            return Err(KdeError::BandwidthTooWide(bandwidth, grid.hi - grid.lo));
        }
        let h = bandwidth;
        let dt = grid.step();
        let g1 = (grid.points - 1) as f64;
        let max_spacing = h / BINS_PER_BANDWIDTH;
        let mode = if dt >= max_spacing {
            // Grid coarser than the bins: r bins per grid step.
            let r = (dt / max_spacing).ceil();
            let spacing = dt / r;
            let pad = (TRUNCATION_BANDWIDTHS * h / spacing).ceil();
            let nbins = g1 * r + 1.0 + 2.0 * pad;
            if nbins > MAX_BINS as f64 {
                Mode::Exact { pad: (2.0 * TRUNCATION_BANDWIDTHS * h / dt).ceil() as usize + 2 }
            } else {
                let (r, pad) = (r as usize, pad as usize);
                Mode::Binned {
                    unit: spacing,
                    bin_step: 1,
                    grid_step: r,
                    grid_offset: pad,
                    origin: grid.lo - pad as f64 * spacing,
                    spacing,
                    nbins: nbins as usize,
                    max_lag: pad,
                }
            }
        } else {
            // Grid finer than the bins: a bin every `q` grid steps.
            let q = (max_spacing / dt).floor().max(1.0) as usize;
            let spacing = dt * q as f64;
            let pad = (TRUNCATION_BANDWIDTHS * h / spacing).ceil() as usize;
            let inner = ((g1 / q as f64).ceil()) as usize + 1;
            Mode::Binned {
                unit: dt,
                bin_step: q,
                grid_step: 1,
                grid_offset: pad * q,
                origin: grid.lo - pad as f64 * spacing,
                spacing,
                nbins: inner + 2 * pad,
                max_lag: (TRUNCATION_BANDWIDTHS * h / dt).ceil() as usize,
            }
        };
        Ok(KdeLayout { grid, bandwidth, mode })
    }

    /// The output grid.
    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// The bandwidth h.
    pub fn bandwidth(&self) -> f64 {
        self.bandwidth
    }

    /// The bins of binned mode: (position of bin 0, spacing, number of bins); None in exact mode.
    pub fn bins(&self) -> Option<(f64, f64, usize)> {
        match &self.mode {
            Mode::Binned { origin, spacing, nbins, .. } => Some((*origin, *spacing, *nbins)),
            Mode::Exact { .. } => None,
        }
    }

    /// The binned layout with every `r`-th bin kept (`r ≥ 1`): bins `r` times as far apart
    /// (`r as f64 · spacing`), from the same origin, as many as reach the last bin — the same
    /// lattice, grid and truncation. Linear binning onto these bins gives each of them what
    /// binning onto the finer bins and then re-binning every fine bin onto its two nearest
    /// coarse ones gives (a linear interpolation of a linear interpolation), up to the 2^-40
    /// rounding of each value's weights: the pure-ε release counts rows straight onto its
    /// nodes with it. A value past the last fine bin but not past the last coarse bin is kept
    /// (each value's fate still depends on the value alone). None in exact mode.
    pub fn coarsened(&self, r: usize) -> Option<KdeLayout> {
        let Mode::Binned { unit, bin_step, grid_step, grid_offset, origin, spacing, nbins, max_lag } = self.mode else {
            return None;
        };
        let r = r.max(1);
        let mode = Mode::Binned {
            unit,
            bin_step: bin_step * r,
            grid_step,
            grid_offset,
            origin,
            spacing: r as f64 * spacing,
            nbins: (nbins - 1).div_ceil(r) + 1,
            max_lag,
        };
        Some(KdeLayout { grid: self.grid, bandwidth: self.bandwidth, mode })
    }

    /// Whether the statistic uses linear binning (false: exact kernel values per grid point).
    pub fn is_binned(&self) -> bool {
        matches!(self.mode, Mode::Binned { .. })
    }

    /// The buffer its accumulation adds rows to: split (binned) or plain (exact).
    pub fn buffers(&self) -> Buffers {
        if self.is_binned() { Buffers::Split } else { Buffers::Plain }
    }

    /// Length of the statistic vector.
    pub fn state_len(&self) -> usize {
        match &self.mode {
            Mode::Binned { nbins, .. } => *nbins,
            Mode::Exact { pad } => self.grid.points + 2 * pad,
        }
    }

    /// A zeroed statistic.
    pub fn empty_state(&self) -> Vec<i128> {
        vec![0; self.state_len()]
    }

    /// Adds one value. Non-finite values and values farther than 8h outside `[lo, hi]`
    /// are dropped silently; nothing a value can be makes this fail.
    #[inline]
    pub fn add(&self, state: &mut [i128], x: f64) {
        match &self.mode {
            Mode::Binned { origin, spacing, nbins, .. } => {
                let (l, left, right, ok) = linear_bin(x, *origin, 1.0 / spacing, *nbins);
                if ok {
                    state[l] = state[l].saturating_add(left as i128);
                    state[l + 1] = state[l + 1].saturating_add(right as i128);
                }
            }
            Mode::Exact { .. } => self.add_exact(|k, w| state[k] = state[k].saturating_add(w as i128), x),
        }
    }

    /// The exact-mode weights of `x`: `round(K(p_j, x)·2^40)` for the lattice points `p_j`
    /// within 8h of x. Values farther than 8h outside `[lo, hi]` are dropped (row-wise).
    #[inline]
    fn add_exact(&self, mut add: impl FnMut(usize, i64), x: f64) {
        let Mode::Exact { pad } = self.mode else { return };
        let h = self.bandwidth;
        let reach = TRUNCATION_BANDWIDTHS * h;
        let (lo, hi, dt) = (self.grid.lo, self.grid.hi, self.grid.step());
        if !(x >= lo - reach && x <= hi + reach) {
            return;
        }
        let origin = lo - pad as f64 * dt;
        let last = self.state_len() as i64 - 1;
        let kmin = (((x - reach - origin) / dt).ceil() as i64).max(0);
        let kmax = (((x + reach - origin) / dt).floor() as i64).min(last);
        for k in kmin..=kmax {
            let w = gaussian_kernel(self.lattice_position(k as usize), x, h);
            // w ∈ [0, 1]: truncation of w·2^40 + 1/2 rounds to the nearest unit.
            add(k as usize, (w * FIXED_ONE + 0.5) as i64);
        }
    }

    /// The position of statistic entry j on the real line (exact mode: lattice point j;
    /// binned mode: bin j).
    pub fn lattice_position(&self, j: usize) -> f64 {
        match &self.mode {
            Mode::Binned { origin, spacing, .. } => origin + j as f64 * spacing,
            Mode::Exact { pad } => {
                let k = j as i64 - *pad as i64;
                if k >= 0 && k < self.grid.points as i64 {
                    self.grid.at(k as usize)
                } else {
                    self.grid.lo + k as f64 * self.grid.step()
                }
            }
        }
    }

    /// The lattice the statistic lives on: its step (a length), the lattice index of each
    /// statistic entry (`entry_stride·j`), and of each grid point (`grid_stride·k +
    /// grid_offset`). Every grid point and every bin is a lattice point.
    pub fn lattice(&self) -> LatticeLayout {
        match &self.mode {
            Mode::Binned { unit, bin_step, grid_step, grid_offset, nbins, .. } => LatticeLayout {
                unit: *unit,
                entry_stride: *bin_step,
                grid_stride: *grid_step,
                grid_offset: *grid_offset,
                span: (nbins - 1) * bin_step + 1,
                mass_per_row: 1.0,
            },
            Mode::Exact { pad } => LatticeLayout {
                unit: self.grid.step(),
                entry_stride: 1,
                grid_stride: 1,
                grid_offset: *pad,
                span: self.state_len(),
                // Σ_j K(p_j, x) ≤ 2·Σ_{j≥0} exp(−j²s²/2) over lattice points, s = dt/h.
                mass_per_row: {
                    let s = self.grid.step() / self.bandwidth;
                    2.0 * (0..200).map(|j| (-0.5 * (j as f64 * s).powi(2)).exp()).sum::<f64>() * (1.0 + 1e-12)
                },
            },
        }
    }

    /// Adds a slice of values (the same per-value rule as [`KdeLayout::add`]).
    pub fn add_all(&self, state: &mut [i128], values: &[f64]) {
        let mut acc = self.accumulation();
        self.accumulate(&mut acc, values);
        Self::merge(state, acc.totals());
    }

    /// Adds another statistic of the same layout (exact, order-independent).
    pub fn merge(state: &mut [i128], other: &[i128]) {
        add_saturating(state, other);
    }

    /// The kernel sum `S(t_k)` on the grid, computed from the statistic.
    pub fn sum_on_grid(&self, state: &[i128]) -> Vec<f64> {
        let w: Vec<f64> = state.iter().map(|&v| v as f64 / FIXED_ONE).collect();
        match &self.mode {
            Mode::Exact { pad } => w[*pad..*pad + self.grid.points].to_vec(),
            Mode::Binned { unit, bin_step, grid_step, grid_offset, nbins, max_lag, .. } => {
                // The lag table is built here, once per release, not in every partial
                // accumulator (which never needs it).
                let taps: Option<Vec<f64>> = (*max_lag < MAX_TAPS)
                    .then(|| (0..=*max_lag).map(|l| gaussian_kernel(l as f64 * unit, 0.0, self.bandwidth)).collect());
                let kernel = |lag: usize| match &taps {
                    Some(t) => t[lag],
                    None => gaussian_kernel(lag as f64 * unit, 0.0, self.bandwidth),
                };
                (0..self.grid.points)
                    .map(|k| {
                        let gp = k * grid_step + grid_offset;
                        let first = gp.saturating_sub(*max_lag).div_ceil(*bin_step);
                        let last = ((gp + max_lag) / bin_step).min(nbins - 1);
                        let mut s = 0.0;
                        for (j, wj) in w.iter().enumerate().take(last + 1).skip(first) {
                            if *wj != 0.0 {
                                s += wj * kernel(gp.abs_diff(j * bin_step));
                            }
                        }
                        s
                    })
                    .collect()
            }
        }
    }

    /// The kernel sum over values, computed directly from the statistic's definition
    /// without binning or truncation (a reference for tests and for non-private plots).
    pub fn exact_sum(grid: &Grid, bandwidth: f64, values: &[f64]) -> Vec<f64> {
        let xs = grid.xs();
        let mut out = vec![0.0; grid.points];
        for &v in values.iter().filter(|v| v.is_finite()) {
            for (o, &t) in out.iter_mut().zip(&xs) {
                *o += gaussian_kernel(t, v, bandwidth);
            }
        }
        out
    }
}

/// Rows a [`KdeLayout::accumulation`] buffers before flushing: one row adds at most 2^40 to an
/// entry, so 2^22 rows keep every buffered entry below 2^62 (no i64 overflow, ever).
const FLUSH_ROWS: usize = 1 << 22;

impl KdeLayout {
    /// An empty statistic for this layout, under accumulation ([`BufferedSums`]: the hot loop
    /// adds to an i64 buffer without overflow checks).
    pub fn accumulation(&self) -> BufferedSums {
        BufferedSums::new(self.state_len(), FLUSH_ROWS, self.buffers())
    }

    /// Empty exact sums that partial states are merged into (no buffer: no rows are added).
    pub fn merged_accumulation(&self) -> BufferedSums {
        BufferedSums::new(self.state_len(), FLUSH_ROWS, Buffers::None)
    }

    /// Adds values to `acc` (non-finite ones and those more than 8h outside the grid are
    /// dropped). Bit-identical to adding every value with [`KdeLayout::add`].
    pub fn accumulate(&self, acc: &mut BufferedSums, values: &[f64]) {
        for chunk in values.chunks(FLUSH_ROWS) {
            match self.linear_bins() {
                Some(bins) => bins.add(acc.buffer_split(chunk.len(), UNIT), chunk),
                None => self.accumulate_exact(acc, chunk.len(), chunk.iter().copied()),
            }
        }
    }

    /// Adds the values at `rows` of `values` to `acc`, those where `valid(row)` is false
    /// dropped (GROUP BY: one group's rows of a batch, nulls dropped). Bit-identical to
    /// [`KdeLayout::accumulate`] on the valid values (pass `|_| true` when all are).
    pub fn accumulate_rows(&self, acc: &mut BufferedSums, values: &[f64], rows: &[u32], valid: impl Fn(usize) -> bool) {
        for chunk in rows.chunks(FLUSH_ROWS) {
            // A dropped row is NaN, which binning drops (branch-free).
            let xs = chunk.iter().map(|&i| if valid(i as usize) { values[i as usize] } else { f64::NAN });
            match self.linear_bins() {
                Some(bins) => bins.add_iter(acc.buffer_split(chunk.len(), UNIT), xs),
                None => self.accumulate_exact(acc, chunk.len(), xs),
            }
        }
    }

    /// Adds row i of `values` to `accs[groups[i]]`, rows where `keep(i)` is false dropped
    /// (GROUP BY: a whole batch, each row scattered into its group's statistic; every row costs
    /// the same work, dropped or not). `touched` lists each group that has rows here and how
    /// many (dropped ones included). Each group's statistic is bit-identical to
    /// [`KdeLayout::accumulate_rows`] of its rows. False, with nothing added, when the layout
    /// cannot scatter (exact mode, or more rows than one buffer holds): add each group's rows
    /// with [`KdeLayout::accumulate_rows`] instead.
    pub fn scatter_rows(
        &self,
        accs: &mut [BufferedSums],
        touched: impl Iterator<Item = (usize, usize)>,
        values: &[f64],
        groups: &[usize],
        keep: impl Fn(usize) -> bool,
    ) -> bool {
        let Some(bins) = self.linear_bins().filter(|_| values.len() <= FLUSH_ROWS) else { return false };
        for (g, rows) in touched {
            accs[g].buffer_split(rows, UNIT);
        }
        bins.scatter(accs, values, groups, keep);
        true
    }

    /// The bins of binned mode, for the block binning loop.
    fn linear_bins(&self) -> Option<LinearBins> {
        match &self.mode {
            Mode::Binned { origin, spacing, nbins, .. } => {
                Some(LinearBins { origin: *origin, inv_spacing: 1.0 / spacing, nbins: *nbins })
            }
            Mode::Exact { .. } => None,
        }
    }

    /// Adds `len` (≤ [`FLUSH_ROWS`]) values in exact mode.
    fn accumulate_exact(&self, acc: &mut BufferedSums, len: usize, values: impl Iterator<Item = f64>) {
        let pending = acc.buffer(len);
        for x in values {
            self.add_exact(|k, w| pending[k] += w, x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datagen::mixture;

    fn grid(lo: f64, hi: f64, points: usize) -> Grid {
        Grid { lo, hi, points }
    }

    fn max_rel_err(a: &[f64], b: &[f64]) -> f64 {
        let peak = b.iter().cloned().fold(0.0, f64::max);
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / peak
    }

    fn binned_sum(g: Grid, h: f64, xs: &[f64]) -> Vec<f64> {
        let layout = KdeLayout::new(g, h).unwrap();
        let mut st = layout.empty_state();
        layout.add_all(&mut st, xs);
        layout.sum_on_grid(&st)
    }

    #[test]
    fn binned_sum_within_1e_3_of_exact_for_smooth_data() {
        let xs = mixture(5_000, 1);
        // Coarse grid (bins finer than grid) and fine grid (bins coarser than grid).
        for (g, h) in [(grid(0.0, 1.0, 64), 0.02), (grid(-0.5, 1.5, 4096), 0.05), (grid(0.0, 1.0, 512), 0.1)] {
            let e = max_rel_err(&binned_sum(g, h, &xs), &KdeLayout::exact_sum(&g, h, &xs));
            assert!(e < 1e-3, "{g:?} h={h}: rel err {e}");
        }
    }

    #[test]
    fn binned_sum_within_1e_3_of_exact_worst_case_single_points() {
        // Single points in the middle of a bin are linear binning's worst case.
        let g = grid(0.0, 1.0, 101);
        let h = 0.05;
        let layout = KdeLayout::new(g, h).unwrap();
        for x in [0.0, 0.00155, 0.5 + 0.5 * h / 16.0, 0.99999, 1.0, -0.3, 1.39] {
            let e = max_rel_err(&binned_sum(g, h, &[x]), &KdeLayout::exact_sum(&g, h, &[x]));
            let peak = KdeLayout::exact_sum(&g, h, &[x]).into_iter().fold(0.0, f64::max);
            if peak > 1e-3 {
                assert!(e < 1e-3, "x={x}: rel err {e}");
            }
        }
        assert!(layout.is_binned());
    }

    #[test]
    fn exact_mode_for_tiny_bandwidth_matches_exact_sum() {
        let g = grid(0.0, 1000.0, 65_536);
        let h = 1e-4;
        let layout = KdeLayout::new(g, h).unwrap();
        assert!(!layout.is_binned());
        let xs: Vec<f64> = (0..200).map(|i| i as f64 * 4.9873).collect();
        let mut st = layout.empty_state();
        layout.add_all(&mut st, &xs);
        let got = layout.sum_on_grid(&st);
        let want = KdeLayout::exact_sum(&g, h, &xs);
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(err < 1e-11, "{err}");
    }

    #[test]
    fn wide_bandwidth_against_grid_stays_accurate() {
        let g = grid(0.0, 1.0, 2048);
        let h = 3.0;
        let xs = mixture(500, 2);
        let e = max_rel_err(&binned_sum(g, h, &xs), &KdeLayout::exact_sum(&g, h, &xs));
        assert!(e < 1e-3, "{e}");
    }

    #[test]
    fn every_row_adds_exactly_one_unit_or_nothing() {
        let g = grid(0.0, 1.0, 512);
        let layout = KdeLayout::new(g, 0.02).unwrap();
        for x in [0.5, 0.0, 1.0, -0.16, 1.16, 0.123456789, -0.1600001] {
            let mut st = layout.empty_state();
            layout.add(&mut st, x);
            assert_eq!(st.iter().sum::<i128>(), FIXED_ONE as i128, "x = {x}");
        }
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e308, 1e308, -0.2, 1.2] {
            let mut st = layout.empty_state();
            layout.add(&mut st, x);
            assert!(st.iter().all(|&v| v == 0), "x = {x} should be dropped");
        }
    }

    #[test]
    fn merging_is_exact_and_order_independent() {
        let g = grid(0.0, 1.0, 300);
        let layout = KdeLayout::new(g, 0.03).unwrap();
        let xs = mixture(10_000, 3);
        let mut whole = layout.empty_state();
        layout.add_all(&mut whole, &xs);
        let mut parts = layout.empty_state();
        for chunk in xs.chunks(777).rev() {
            let mut p = layout.empty_state();
            layout.add_all(&mut p, chunk);
            KdeLayout::merge(&mut parts, &p);
        }
        assert_eq!(whole, parts);
    }

    #[test]
    fn buffered_accumulation_equals_one_by_one_and_survives_flushes() {
        let layout = KdeLayout::new(grid(0.0, 1.0, 200), 0.05).unwrap();
        // More than FLUSH_ROWS rows, many in the same bin: a buffer that overflowed or was
        // not flushed would show here.
        let mut xs = vec![0.5; FLUSH_ROWS + 1000];
        xs.extend(mixture(5_000, 9));
        let mut acc = layout.accumulation();
        for chunk in xs.chunks(FLUSH_ROWS / 3 + 17) {
            layout.accumulate(&mut acc, chunk);
        }
        let mut one_by_one = layout.empty_state();
        for &x in xs.iter().rev().take(5_000) {
            layout.add(&mut one_by_one, x);
        }
        let mut same = layout.empty_state();
        layout.add(&mut same, 0.5);
        for (v, s) in one_by_one.iter_mut().zip(&same) {
            *v += s * (FLUSH_ROWS + 1000) as i128;
        }
        assert_eq!(acc.totals(), &one_by_one[..]);
        assert_eq!(acc.totals().iter().sum::<i128>(), xs.len() as i128 * FIXED_ONE as i128);
        // Exact mode (h tiny against the grid step) goes through the same buffer.
        let exact = KdeLayout::new(grid(0.0, 1e6, 100), 1e-3).unwrap();
        assert!(!exact.is_binned());
        let ys: Vec<f64> = (0..1000).map(|i| i as f64 * 10101.0 + 0.0004).collect();
        let mut acc = exact.accumulation();
        exact.accumulate(&mut acc, &ys);
        let mut reference = exact.empty_state();
        ys.iter().for_each(|&y| exact.add(&mut reference, y));
        assert_eq!(acc.totals(), &reference[..]);
        assert!(reference.iter().any(|&v| v > 0));
    }

    #[test]
    fn invalid_layouts_are_rejected() {
        assert_eq!(KdeLayout::new(grid(0.0, 1.0, 10), 0.0), Err(KdeError::Bandwidth(0.0)));
        assert!(matches!(KdeLayout::new(grid(1.0, 1.0, 10), 0.1), Err(KdeError::Range(..))));
        assert!(matches!(KdeLayout::new(grid(0.0, f64::INFINITY, 10), 0.1), Err(KdeError::Range(..))));
        // hi − lo overflows: refused, not an infinite step.
        assert!(matches!(KdeLayout::new(grid(-1e308, 1e308, 10), 0.1), Err(KdeError::Range(..))));
        assert!(matches!(KdeLayout::new(grid(0.0, 1.0, 512), 5e15), Err(KdeError::BandwidthTooWide(..))));
        assert!(KdeLayout::new(grid(0.0, 1.0, 512), 1e7).is_ok());
        assert_eq!(KdeLayout::new(grid(0.0, 1.0, 1), 0.1), Err(KdeError::Points(1)));
        assert_eq!(KdeLayout::new(grid(0.0, 1.0, 65_537), 0.1), Err(KdeError::Points(65_537)));
    }
}
