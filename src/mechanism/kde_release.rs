//! The private KDE mechanism (SPEC §2): its privacy map (parameters → σ) and its release
//! (exact kernel sum on the grid + σ·GP noise → normalised density curve).
//!
//! The released value is `S̃ = S_D + σ·G` on the grid with Δ = 1 (adding or removing one
//! value moves `S_D` by `K(·,x)`, of RKHS norm 1); everything after that — clamping,
//! normalising, the mass estimate — is post-processing of `S̃` and costs nothing.

use std::fmt;

use rand::Rng;

use super::calibration::{self, Calibration, CalibrationError};
use super::gp::{self, GpPlanError, GpSampler};
use super::kde::{Grid, KdeError, KdeLayout};

/// RKHS sensitivity of the kernel sum under adding or removing one row.
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
    /// Clamp negative values to zero before normalising.
    pub nonneg: bool,
}

/// A parameter problem, found before any data is read.
#[derive(Debug, Clone, PartialEq)]
pub enum MechanismError {
    /// ε, δ or calibration.
    Calibration(CalibrationError),
    /// Bandwidth, range or points.
    Kde(KdeError),
    /// The noise cannot be generated on this grid.
    Noise(GpPlanError),
}

impl fmt::Display for MechanismError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MechanismError::Calibration(e) => e.fmt(f),
            MechanismError::Kde(e) => e.fmt(f),
            MechanismError::Noise(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for MechanismError {}

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
}

/// The private KDE mechanism for fixed public parameters.
#[derive(Debug, Clone)]
pub struct KdeMechanism {
    spec: KdeSpec,
    layout: KdeLayout,
    sigma: f64,
}

impl KdeMechanism {
    /// The privacy map: validates every parameter and returns σ for Δ = 1.
    pub fn sigma_for(spec: &KdeSpec) -> Result<f64, MechanismError> {
        Ok(Self::new(spec.clone())?.sigma)
    }

    /// Validates the parameters (including that noise can be generated on this grid).
    pub fn new(spec: KdeSpec) -> Result<Self, MechanismError> {
        let layout = KdeLayout::new(spec.grid, spec.bandwidth).map_err(MechanismError::Kde)?;
        let sigma = calibration::sigma(spec.calibration, KDE_SENSITIVITY, spec.epsilon, spec.delta)
            .map_err(MechanismError::Calibration)?;
        gp::check_plan(spec.grid.points, spec.grid.step() / spec.bandwidth).map_err(MechanismError::Noise)?;
        Ok(KdeMechanism { spec, layout, sigma })
    }

    /// The parameters.
    pub fn spec(&self) -> &KdeSpec {
        &self.spec
    }

    /// Layout of the sufficient statistic.
    pub fn layout(&self) -> &KdeLayout {
        &self.layout
    }

    /// Noise scale σ.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// The sampler for this grid (built on demand: it is only needed at release time).
    pub fn sampler(&self) -> GpSampler {
        GpSampler::new(self.spec.grid.points, self.spec.grid.step() / self.spec.bandwidth)
            .expect("checked in KdeMechanism::new")
    }

    /// Releases the statistic: kernel sum on the grid, plus σ·GP noise, then normalised.
    pub fn release<R: Rng + ?Sized>(&self, state: &[i128], rng: &mut R) -> KdeRelease {
        self.post_process(&self.noisy_sum(state, rng))
    }

    /// The private part of a release: `S̃ = S_D + σ·G` on the grid. Everything else is
    /// post-processing of this vector, so privacy audits look at it.
    pub fn noisy_sum<R: Rng + ?Sized>(&self, state: &[i128], rng: &mut R) -> Vec<f64> {
        self.add_noise(state, &self.sampler().sample(rng))
    }

    /// The release for a given unit-scale noise vector (zero noise is the test hook).
    pub fn release_with_noise(&self, state: &[i128], unit_noise: &[f64]) -> KdeRelease {
        self.post_process(&self.add_noise(state, unit_noise))
    }

    /// `S_D + σ·unit_noise` on the grid, for a unit-scale noise vector from [`Self::sampler`].
    pub fn add_noise(&self, state: &[i128], unit_noise: &[f64]) -> Vec<f64> {
        let mut s = self.layout.sum_on_grid(state);
        for (v, z) in s.iter_mut().zip(unit_noise) {
            *v += self.sigma * z;
        }
        s
    }

    /// Post-processing of the released noisy sum `S̃` (free, SPEC §0).
    pub fn post_process(&self, noisy_sum: &[f64]) -> KdeRelease {
        let grid = self.spec.grid;
        let h = self.spec.bandwidth;
        let one_point = (2.0 * std::f64::consts::PI).sqrt() * h;
        let z = trapezoid(noisy_sum, grid.step());
        let density = if z > one_point {
            let curve: Vec<f64> =
                if self.spec.nonneg { noisy_sum.iter().map(|v| v.max(0.0)).collect() } else { noisy_sum.to_vec() };
            // With nonneg, ∫max(S̃,0) ≥ Z > 0, so this never divides by zero.
            let area = trapezoid(&curve, grid.step());
            Some(curve.iter().map(|v| v / area).collect())
        } else {
            None
        };
        KdeRelease { x: grid.xs(), density, mass: z / one_point }
    }
}

/// Trapezoid rule on an evenly spaced grid.
pub fn trapezoid(y: &[f64], step: f64) -> f64 {
    match y {
        [] | [_] => 0.0,
        [first, .., last] => step * (y.iter().sum::<f64>() - 0.5 * (first + last)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> KdeSpec {
        KdeSpec {
            grid: Grid { lo: 0.0, hi: 1.0, points: 201 },
            bandwidth: 0.05,
            epsilon: 1.0,
            delta: 1e-6,
            calibration: Calibration::Analytic,
            nonneg: true,
        }
    }

    #[test]
    fn privacy_map_uses_unit_sensitivity() {
        let s = KdeMechanism::sigma_for(&spec()).unwrap();
        assert!((s - 4.2247).abs() < 5e-4);
        let classic = KdeMechanism::sigma_for(&KdeSpec { calibration: Calibration::Classic, ..spec() });
        assert!((classic.unwrap() - 5.3868).abs() < 1e-3);
        let bad = KdeMechanism::sigma_for(&KdeSpec { calibration: Calibration::Classic, epsilon: 2.0, ..spec() });
        assert!(matches!(bad, Err(MechanismError::Calibration(CalibrationError::ClassicNeedsSmallEpsilon(_)))));
    }

    #[test]
    fn noiseless_release_is_the_normalised_kde_with_the_right_mass() {
        let m = KdeMechanism::new(spec()).unwrap();
        let xs: Vec<f64> = (0..400).map(|i| 0.3 + 0.4 * (i as f64 / 399.0)).collect();
        let mut st = m.layout().empty_state();
        m.layout().add_all(&mut st, &xs);
        let r = m.release_with_noise(&st, &vec![0.0; 201]);
        let d = r.density.unwrap();
        assert!((trapezoid(&d, 0.005) - 1.0).abs() < 1e-12);
        // All 400 points lie ≥ 0.2 = 4h inside [0, 1], so their mass is almost entirely inside.
        assert!((r.mass - 400.0).abs() < 0.5, "mass {}", r.mass);
    }

    #[test]
    fn too_little_mass_gives_null_density_not_an_error() {
        let m = KdeMechanism::new(spec()).unwrap();
        let st = m.layout().empty_state();
        let r = m.release_with_noise(&st, &vec![0.0; 201]);
        assert_eq!(r.density, None);
        assert_eq!(r.mass, 0.0);
        // Negative noisy sums (possible with an empty table) are handled the same way.
        let r = m.post_process(&vec![-3.0; 201]);
        assert_eq!(r.density, None);
        assert!(r.mass < 0.0);
    }

    #[test]
    fn nonneg_clamps_before_normalising() {
        let m = KdeMechanism::new(spec()).unwrap();
        let mut s = vec![10.0; 201];
        s[3] = -50.0;
        let r = m.post_process(&s);
        let d = r.density.unwrap();
        assert_eq!(d[3], 0.0);
        assert!((trapezoid(&d, 0.005) - 1.0).abs() < 1e-12);
        let m2 = KdeMechanism::new(KdeSpec { nonneg: false, ..spec() }).unwrap();
        assert!(m2.post_process(&s).density.unwrap()[3] < 0.0);
    }
}
