//! What a kernel fit minimises and where: the losses (pseudo-Huber for regression, a smoothed
//! hinge for classification) with their derivatives in double-double, and the public Fourier
//! feature map of the Gaussian kernel on a periodised box (see `kernel_fit`'s module docs).

use std::fmt;

use crate::mechanism::noise::double_double::DD;

/// The loss of a fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FitLoss {
    /// Pseudo-Huber loss of the residual with this scale c (regression; L = c).
    Huber(f64),
    /// Smoothed hinge of the margin with this smoothing s (classification, labels ±1; L = 1).
    Hinge(f64),
}

impl FitLoss {
    /// Lipschitz constant in the prediction.
    pub fn lipschitz(self) -> f64 {
        match self {
            FitLoss::Huber(c) => c,
            FitLoss::Hinge(_) => 1.0,
        }
    }

    /// Largest second derivative in the prediction.
    pub fn max_curvature(self) -> f64 {
        match self {
            FitLoss::Huber(_) => 1.0,
            FitLoss::Hinge(s) => 0.5 / s,
        }
    }

    /// Loss and its derivative in f at target level y and prediction f (double-double).
    pub(super) fn value_and_slope(self, y: f64, f: DD) -> (DD, DD) {
        match self {
            FitLoss::Huber(c) => {
                let r = DD::from_f64(y).sub(f);
                let t = r.mul(DD::from_f64(c).recip());
                let root = DD::from_f64(1.0).add(t.mul(t)).sqrt();
                // c²(root − 1) = r²/(1 + root): no cancellation for small r.
                let value = r.mul(r).mul(DD::from_f64(1.0).add(root).recip());
                (value, r.mul(root.recip()).neg())
            }
            FitLoss::Hinge(s) => {
                let z = if y > 0.0 { f } else { f.neg() };
                let u = DD::from_f64(1.0).sub(z);
                let s2 = DD::from_f64(s).mul_f64(s);
                let root = u.mul(u).add(s2).sqrt();
                let (value, dz) = if u.hi >= 0.0 {
                    let value = u.add(root).mul_f64(0.5);
                    (value, DD::from_f64(1.0).add(u.mul(root.recip())).mul_f64(-0.5))
                } else {
                    // root + u = s²/(root − u): no cancellation for a wide margin.
                    let gap = root.sub(u);
                    (s2.mul(gap.recip()).mul_f64(0.5), s2.mul(root.mul(gap).recip()).mul_f64(-0.5))
                };
                (value, if y > 0.0 { dz } else { dz.neg() })
            }
        }
    }

    /// Second derivative in f (f64; only steers Newton).
    pub(super) fn curvature(self, y: f64, f: f64) -> f64 {
        match self {
            FitLoss::Huber(c) => {
                let t = (y - f) / c;
                (1.0 + t * t).powf(-1.5)
            }
            FitLoss::Hinge(s) => {
                let u = 1.0 - if y > 0.0 { f } else { -f };
                0.5 * s * s * (u * u + s * s).powf(-1.5)
            }
        }
    }
}

impl fmt::Display for FitLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FitLoss::Huber(c) => write!(f, "huber({c})"),
            FitLoss::Hinge(s) => write!(f, "hinge({s})"),
        }
    }
}

/// Highest kept frequency: `h·ω_J ≥ FREQUENCY_CUTOFF` (`e^{-40.5}` of the spectrum's peak).
const FREQUENCY_CUTOFF: f64 = 9.0;
/// Periodisation margin in bandwidths.
pub const PERIOD_MARGIN: f64 = 10.0;
/// The public feature map (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    pub(super) lo: f64,
    /// ω₁ = 2π/P.
    pub(super) omega: f64,
    /// `√a₀, √(2a₁), …, √(2a_J)`.
    pub(super) amp: Vec<f64>,
}

impl Features {
    pub(super) fn new(lo: f64, hi: f64, h: f64) -> Self {
        let period = (hi - lo) + PERIOD_MARGIN * h;
        let omega = 2.0 * std::f64::consts::PI / period;
        let j_max = ((FREQUENCY_CUTOFF / (h * omega)).ceil() as usize).max(1);
        let scale = h * (2.0 * std::f64::consts::PI).sqrt() / period;
        let amp = (0..=j_max)
            .map(|j| {
                let a = scale * (-0.5 * (h * omega * j as f64).powi(2)).exp();
                if j == 0 { a.sqrt() } else { (2.0 * a).sqrt() }
            })
            .collect();
        Self { lo, omega, amp }
    }

    /// Highest frequency index J.
    pub(super) fn j_max(&self) -> usize {
        self.amp.len() - 1
    }

    /// Number of features D = 2J + 1.
    pub fn dim(&self) -> usize {
        2 * self.j_max() + 1
    }

    /// θ(x) = ω₁·(x − lo).
    pub(super) fn theta(&self, x: f64) -> f64 {
        self.omega * (x - self.lo)
    }

    /// φ(x): `[c₀, c₁…c_J, s₁…s_J]`.
    pub fn eval(&self, x: f64) -> Vec<f64> {
        let (j, theta) = (self.j_max(), self.theta(x));
        let mut out = vec![0.0; self.dim()];
        out[0] = self.amp[0];
        for k in 1..=j {
            let a = k as f64 * theta;
            out[k] = self.amp[k] * libm::cos(a);
            out[j + k] = self.amp[k] * libm::sin(a);
        }
        out
    }

    /// An upper bound on `‖φ(x)‖` for every x (module docs).
    pub fn kappa(&self) -> f64 {
        let sq: f64 = self.amp.iter().map(|a| a * a).sum();
        (sq * (1.0 + 1e-12)).sqrt()
    }
}
