//! The kernels a pure-ε node release smooths its noisy counts with (post-processing): the
//! Gaussian, and a sixth-order kernel that is a signed sum of three Gaussians.
//!
//! Linear binning onto nodes `s` apart smooths the data like a hat of variance `v = s²/6`
//! before any kernel does (the expected node counts are `n·s·(f ∗ hat)(node)`), so the
//! noiseless release applies `hat ∗ K` to the data. For the Gaussian at h that is a kernel of
//! sd `√(h² + v)`, a second-order kernel: its bias is `h²·f″/2`.
//!
//! The sixth-order kernel at scale H is `3·φ_H − 3·φ_{√2·H} + φ_{√3·H}` (Tukey's twicing applied
//! twice: `3K − 3K∗K + K∗K∗K` for `K = φ_H`): its second and fourth moments vanish, so its bias
//! is `μ₆·H⁶·f⁽⁶⁾/720` with `μ₆ = 90·H⁶`. The release applies it *after* the binning: the
//! component of variance `a·H²` is applied as a Gaussian of variance `a·H² − v`, so that with
//! the hat's variance the data see the three Gaussians at `a·H²` (up to the hat's fourth
//! cumulant, `−s⁴/60`, a bias of order `s⁴·f⁗/1440`). On smooth densities whose release is
//! dominated by the counts' noise it has 0.4–0.9 times the integrated squared error of the best
//! Gaussian at the same ε (`docs/functions/private_kde.md`); it takes negative values, which the
//! projection onto densities removes.

/// Which kernel a pure-ε node release applies to its noisy counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NodeKernel {
    /// The Gaussian at h (second order): a fixed bandwidth's release.
    #[default]
    Gaussian,
    /// The sixth-order sum of three Gaussians at scale H, corrected for the binning:
    /// `bandwidth => 'auto'`'s final release.
    Sixth,
}

/// The largest number of Gaussian components of a [`NodeKernel`].
const MAX_PARTS: usize = 3;

/// A kernel as a signed sum of normal densities: `Σ weight·φ_sd`, each `φ` integrating to 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaussianSum {
    parts: [(f64, f64); MAX_PARTS],
    len: usize,
}

impl GaussianSum {
    /// One normal density of sd `sd`.
    pub fn normal(sd: f64) -> Self {
        Self::of(&[(1.0, sd)])
    }

    fn of(parts: &[(f64, f64)]) -> Self {
        let mut out = [(0.0, 1.0); MAX_PARTS];
        out[..parts.len()].copy_from_slice(parts);
        Self { parts: out, len: parts.len() }
    }

    /// The (weight, sd) components.
    pub fn parts(&self) -> &[(f64, f64)] {
        &self.parts[..self.len]
    }

    /// The kernel's value at x.
    pub fn at(&self, x: f64) -> f64 {
        self.parts().iter().map(|&(w, s)| w * normal_density(s, x)).sum()
    }

    /// The largest component sd (what the kernel's truncation reach is measured in).
    pub fn widest(&self) -> f64 {
        self.parts().iter().map(|p| p.1).fold(0.0, f64::max)
    }

    /// `∫K²`: `Σ_{a,b} w_a·w_b·φ_{√(s_a² + s_b²)}(0)`.
    pub fn roughness(&self) -> f64 {
        self.pairs().map(|(w, s)| w * normal_density(s, 0.0)).sum()
    }

    /// The components of `K ∗ K` (the convolution of two Gaussians is a Gaussian): `∫f̂²` of a
    /// kernel sum is its counts' pair sums with these.
    pub fn pairs(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.parts()
            .iter()
            .flat_map(move |&(wa, sa)| self.parts().iter().map(move |&(wb, sb)| (wa * wb, (sa * sa + sb * sb).sqrt())))
    }

    /// The kernel with every component's variance lowered by `v` (None when one would not
    /// stay positive).
    pub fn narrowed(&self, v: f64) -> Option<Self> {
        let mut out = *self;
        for p in &mut out.parts[..self.len] {
            let var = p.1 * p.1 - v;
            if !(var > 0.0) {
                return None;
            }
            p.1 = var.sqrt();
        }
        Some(out)
    }
}

impl NodeKernel {
    /// The name stored with a release and shown in the docs.
    pub fn name(self) -> &'static str {
        match self {
            NodeKernel::Gaussian => "gaussian",
            NodeKernel::Sixth => "gaussian6",
        }
    }

    /// Reads [`Self::name`] back.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gaussian" => Some(NodeKernel::Gaussian),
            "gaussian6" => Some(NodeKernel::Sixth),
            _ => None,
        }
    }

    /// The smallest `h / s` the kernel is used at (nodes `s` apart). The Gaussian's sum over
    /// nodes ripples by ≤ 2·exp(−2π²h²/s²) of its level: ≈ 1.6e-3 at 0.6. The sixth-order
    /// kernel's narrowest component has variance `H² − s²/6`, ≥ (0.63·s)² at 0.75 (its ripple,
    /// weighed by 3, ≈ 2.4e-3 of the level).
    pub fn min_ratio(self) -> f64 {
        match self {
            NodeKernel::Gaussian => 0.6,
            NodeKernel::Sixth => 0.75,
        }
    }

    /// What the data see: the kernel the noiseless release at `h` on nodes `s` apart applies
    /// (the binning's hat included, as a Gaussian of the same variance).
    pub fn effective(self, h: f64, s: f64) -> GaussianSum {
        match self {
            NodeKernel::Gaussian => GaussianSum::normal((h * h + s * s / 6.0).sqrt()),
            NodeKernel::Sixth => Self::sixth(h),
        }
    }

    /// The sixth-order kernel at scale `h`.
    pub fn sixth(h: f64) -> GaussianSum {
        GaussianSum::of(&[(3.0, h), (-3.0, std::f64::consts::SQRT_2 * h), (1.0, 3f64.sqrt() * h)])
    }

    /// What the release applies to its node counts at `h` with nodes `s` apart, as a density
    /// kernel (integrating to 1). None when the sixth-order kernel's narrowest component would
    /// not stay positive (`h² ≤ s²/6`).
    pub fn on_nodes(self, h: f64, s: f64) -> Option<GaussianSum> {
        match self {
            NodeKernel::Gaussian => Some(GaussianSum::normal(h)),
            NodeKernel::Sixth => Self::sixth(h).narrowed(s * s / 6.0),
        }
    }

    /// The scale of the kernel the data see, as the release reports it: the Gaussian's sd
    /// `√(h² + s²/6)`; the sixth-order kernel's H (its second moment is 0).
    pub fn smoothing(self, h: f64, s: f64) -> f64 {
        match self {
            NodeKernel::Gaussian => (h * h + s * s / 6.0).sqrt(),
            NodeKernel::Sixth => h,
        }
    }
}

/// The normal density with sd `s` at `x`.
pub fn normal_density(s: f64, x: f64) -> f64 {
    (-0.5 * (x / s).powi(2)).exp() / (s * (2.0 * std::f64::consts::PI).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `∫ x^k K(x) dx` by the trapezoid rule on a wide fine grid.
    fn moment(k: &GaussianSum, power: i32) -> f64 {
        let reach = 12.0 * k.widest();
        let steps = 200_000;
        let dx = 2.0 * reach / steps as f64;
        (0..=steps).map(|i| -reach + i as f64 * dx).map(|x| x.powi(power) * k.at(x)).sum::<f64>() * dx
    }

    #[test]
    fn the_sixth_order_kernel_integrates_to_one_and_its_second_and_fourth_moments_vanish() {
        let h = 0.3;
        let k = NodeKernel::sixth(h);
        assert!((moment(&k, 0) - 1.0).abs() < 1e-9);
        assert!(moment(&k, 2).abs() < 1e-9, "{}", moment(&k, 2));
        assert!(moment(&k, 4).abs() < 1e-9, "{}", moment(&k, 4));
        // μ₆ = 90·h⁶; the Gaussian's second moment is h² (control: the moments are measured).
        assert!((moment(&k, 6) / (90.0 * h.powi(6)) - 1.0).abs() < 1e-6);
        assert!((moment(&GaussianSum::normal(h), 2) / (h * h) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn on_nodes_the_binnings_variance_is_taken_from_every_component() {
        let (h, s) = (0.3, 0.2);
        let on = NodeKernel::Sixth.on_nodes(h, s).unwrap();
        let seen = NodeKernel::Sixth.effective(h, s);
        for (a, b) in on.parts().iter().zip(seen.parts()) {
            assert_eq!(a.0, b.0);
            assert!((a.1 * a.1 + s * s / 6.0 - b.1 * b.1).abs() < 1e-12);
        }
        // Nodes too far apart for the narrowest component: refused, not NaN.
        assert!(NodeKernel::Sixth.on_nodes(0.1, 0.3).is_none());
        assert!(NodeKernel::Sixth.on_nodes(0.75 * 0.3, 0.3).is_some());
    }

    #[test]
    fn the_roughness_is_the_integral_of_the_square() {
        for k in [GaussianSum::normal(0.2), NodeKernel::sixth(0.2)] {
            let reach = 12.0 * k.widest();
            let steps = 100_000;
            let dx = 2.0 * reach / steps as f64;
            let direct = (0..=steps).map(|i| k.at(-reach + i as f64 * dx).powi(2)).sum::<f64>() * dx;
            assert!((k.roughness() / direct - 1.0).abs() < 1e-9, "{} vs {direct}", k.roughness());
        }
        // The Gaussian's: 1/(2√π·h).
        let g = GaussianSum::normal(0.2).roughness();
        assert!((g * 2.0 * std::f64::consts::PI.sqrt() * 0.2 - 1.0).abs() < 1e-12);
    }

    #[test]
    fn names_read_back() {
        for k in [NodeKernel::Gaussian, NodeKernel::Sixth] {
            assert_eq!(NodeKernel::parse(k.name()), Some(k));
        }
        assert_eq!(NodeKernel::parse("epanechnikov"), None);
    }
}
