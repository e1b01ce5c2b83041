//! Stored releases (Hall et al. §5, "online" release): what a release keeps so it can be
//! evaluated later, anywhere, without the data and without spending budget.
//!
//! A [`Recipe`] is the release's public parameters and its *released* lifted coordinates
//! `w̃` (plus the released count of a mean curve) — the output of the exact discrete
//! mechanism, never the private statistic. Everything a [`StoredCurve`] computes from it is
//! post-processing (SPEC §0):
//!
//! * **KDE**: `S̃(x) = Σ_k √λ_k·w̃_k·φ_k(j(x))`, the trigonometric sum the release's inverse
//!   transform evaluates at the lattice integers, continued to any lattice position `j(x)`.
//!   At lattice points it is the release's own sample path (bit-identical at the grid points,
//!   to f64 rounding elsewhere); between them it is the band-limited continuation — for this
//!   finite-rank Gaussian process the path is determined by its lattice values, so this is
//!   exactly the GP conditional mean given them. The density is `max(S̃(x), 0)/Z̃` with the
//!   release's own normaliser.
//! * **Mean curve**: `Σ_j c̃_j·v_j(t)` with each eigenvector continued by its Nyström extension
//!   `v_j(t) = (1/(m·λ_j))·Σ_k c(t, t_k)·v_j(t_k)`, which equals `v_j` on the grid (and is the
//!   GP conditional mean of the finite-rank noise given its grid values).
//!
//! * **2-D KDE**: the released surface on its grid (`S̃ = A_x W̃ A_yᵀ`, post-processing of the
//!   lifted coordinates, far smaller than them); at grid points exactly the release, between
//!   them bilinear interpolation of the released density.
//!
//! * **CDF / quantiles**: the released noisy counts of every level of the tree; the distribution
//!   function is recomputed from them exactly as the release did (least squares, isotonic
//!   projection, the monotone interpolant), so at any x it is the returned curve's interpolant.
//!
//! Outside the release's range (`[lo, hi]`, or `[0, 1]` for a mean curve) there is no value.

use serde_json::{Value, json};

use crate::mechanism::contribution::Contribution;
use crate::mechanism::curves::mean_curve::{CovKernel, MeanCurveMechanism, MeanCurveSpec, MeanRelease};
use crate::mechanism::density::kde::{Grid, KdeLayout};
use crate::mechanism::density::kde2d::{Kde2dBands, Kde2dMechanism, Kde2dRelease, Kde2dSpec};
use crate::mechanism::density::kernel::NodeKernel;
use crate::mechanism::density::release::{KdeBands, KdeMechanism, KdeRelease, KdeSpec, MechanismError, Normalise};
use crate::mechanism::distribution::release::{
    CdfMechanism, CdfNoise, CdfRelease, CdfSpec, LEGACY_ROOT_SHARE, Resolution,
};
use crate::mechanism::distribution::tree::TreeShape;
use crate::mechanism::fits::kernel_fit::{FitLoss, FitRelease, FitSpec, KernelFitMechanism};
use crate::mechanism::noise::calibration::Calibration;

/// What a stored release keeps: public parameters and the released coordinates.
#[derive(Debug, Clone, PartialEq)]
pub enum Recipe {
    /// A `private_kde` release.
    Kde {
        /// Its public parameters.
        spec: KdeSpec,
        /// The privacy unit's contribution bound the noise was calibrated for.
        contribution: Contribution,
        /// Level of its bands.
        alpha: f64,
        /// The released (noisy) lifted coordinates.
        lifted: Vec<f64>,
        /// `bandwidth => 'auto'`: the bandwidth whose layout held the statistic and the chosen
        /// node spacing (the release's nodes are laid out on its bins).
        /// whether the reference rule chose them (a small count; the release had
        /// [`REFERENCE_SHARE`](crate::mechanism::density::auto_bandwidth::REFERENCE_SHARE) of the
        /// call's ε) rather than the count's spacing rule, and the kernel its counts were
        /// smoothed with.
        layout_bandwidth: Option<(f64, f64, bool, NodeKernel)>,
        /// The Sobolev-space (exponential-kernel) release (`space => 'sobolev'`).
        sobolev: bool,
        /// The ICLP (Laplace-process) release (`mechanism => 'iclp'`).
        iclp: bool,
    },
    /// A `private_kde2d` release.
    Kde2d {
        /// Its public parameters.
        spec: Kde2dSpec,
        /// The contribution bound.
        contribution: Contribution,
        /// Level of its bands.
        alpha: f64,
        /// The released surface on the grid (x-major), before normalisation.
        surface: Vec<f64>,
    },
    /// A `private_kernel_regression` or `private_kernel_classifier` release.
    KernelFit {
        /// Its public parameters (the loss says which function).
        spec: FitSpec,
        /// The contribution bound.
        contribution: Contribution,
        /// The released (noisy) coefficients of the fitted function in the feature basis.
        coefficients: Vec<f64>,
        /// `penalty => 'auto'`: the ε of the noisy count that chose the penalty (`spec.epsilon` is
        /// then the fit's share of the call's ε).
        count_epsilon: Option<f64>,
    },
    /// A `private_mean_curve` release.
    MeanCurve {
        /// Its public parameters.
        spec: MeanCurveSpec,
        /// The contribution bound.
        contribution: Contribution,
        /// Level of its band.
        alpha: f64,
        /// The released (noisy) lifted coordinates.
        lifted: Vec<f64>,
        /// The released (noisy) count.
        n: i64,
        /// Which of (range, penalty) were chosen from the released count (`'auto'`).
        auto: (bool, bool),
    },
    /// A `private_cdf` or `private_quantiles` release.
    Cdf {
        /// Its public parameters.
        spec: CdfSpec,
        /// The contribution bound.
        contribution: Contribution,
        /// Level of its bands.
        alpha: f64,
        /// log2 of the released tree's leaves (chosen from the released count).
        leaves_log2: u32,
        /// The share of the budget its count spent (the least-squares weights depend on it).
        root_share: f64,
        /// The released (noisy) counts of every level, root first, concatenated.
        levels: Vec<f64>,
        /// `private_quantiles`: the probabilities it released.
        probabilities: Option<Vec<f64>>,
    },
}

fn field(v: &Value, name: &str) -> Result<f64, String> {
    v.get(name).and_then(Value::as_f64).ok_or_else(|| format!("stored release: parameter '{name}' is missing"))
}

fn count(v: &Value, name: &str) -> Result<u64, String> {
    v.get(name).and_then(Value::as_u64).ok_or_else(|| format!("stored release: parameter '{name}' is missing"))
}

fn text<'a>(v: &'a Value, name: &str) -> Result<&'a str, String> {
    v.get(name).and_then(Value::as_str).ok_or_else(|| format!("stored release: parameter '{name}' is missing"))
}

impl Recipe {
    /// The SQL function that made the release.
    pub fn function(&self) -> &'static str {
        match self {
            Recipe::Kde { .. } => "private_kde",
            Recipe::Kde2d { .. } => "private_kde2d",
            Recipe::KernelFit { spec, .. } => match spec.loss {
                FitLoss::Huber(_) => "private_kernel_regression",
                FitLoss::Hinge(_) => "private_kernel_classifier",
            },
            Recipe::MeanCurve { .. } => "private_mean_curve",
            Recipe::Cdf { probabilities: None, .. } => "private_cdf",
            Recipe::Cdf { probabilities: Some(_), .. } => "private_quantiles",
        }
    }

    /// The public parameters as JSON (every float printed so that it reads back exactly).
    pub fn parameters(&self) -> String {
        let v = match self {
            Recipe::Kde { spec, contribution, alpha, layout_bandwidth, sobolev, iclp, .. } => {
                let mut v = json!({
                    "lo": spec.grid.lo, "hi": spec.grid.hi, "points": spec.grid.points,
                    "bandwidth": spec.bandwidth, "epsilon": spec.epsilon, "delta": spec.delta,
                    "calibration": spec.calibration.name(), "normalize": spec.normalise.name(),
                    "mechanism": if *iclp { "iclp" } else if spec.delta == 0.0 { "laplace" } else { "gaussian" },
                    "unit_rows": contribution.rows, "unit_groups": contribution.groups, "band_alpha": alpha,
                });
                if *sobolev {
                    v["space"] = json!("sobolev");
                }
                if let Some((lb, node_spacing, reference, kernel)) = layout_bandwidth {
                    // The automatic bandwidth: `epsilon` is the final release's share; the
                    // count (both counts on the reference path) spent the rest of the call's ε.
                    use crate::mechanism::density::auto_bandwidth::{FINAL_SHARE, REFERENCE_SHARE};
                    v["bandwidth_rule"] = json!("auto");
                    v["layout_bandwidth"] = json!(lb);
                    v["node_spacing"] = json!(node_spacing);
                    v["spacing_rule"] = json!(if *reference { "reference" } else { "count" });
                    v["kernel"] = json!(kernel.name());
                    let share = if *reference { REFERENCE_SHARE } else { FINAL_SHARE };
                    v["count_epsilon"] = json!(spec.epsilon / share * (1.0 - share));
                }
                v
            }
            Recipe::Kde2d { spec, contribution, alpha, .. } => json!({
                "lo_x": spec.grid_x.lo, "hi_x": spec.grid_x.hi, "points_x": spec.grid_x.points,
                "lo_y": spec.grid_y.lo, "hi_y": spec.grid_y.hi, "points_y": spec.grid_y.points,
                "bandwidth_x": spec.bandwidth_x, "bandwidth_y": spec.bandwidth_y,
                "epsilon": spec.epsilon, "delta": spec.delta, "band_alpha": alpha,
                "calibration": spec.calibration.name(), "normalize": spec.normalise.name(),
                "unit_rows": contribution.rows, "unit_groups": contribution.groups,
            }),
            Recipe::KernelFit { spec, contribution, count_epsilon, .. } => {
                let mut v = json!({
                    "lo": spec.grid.lo, "hi": spec.grid.hi, "points": spec.grid.points,
                    "bandwidth": spec.bandwidth, "penalty": spec.penalty,
                    "epsilon": spec.epsilon, "delta": spec.delta, "calibration": spec.calibration.name(),
                    "unit_rows": contribution.rows, "unit_groups": contribution.groups,
                });
                match spec.loss {
                    FitLoss::Huber(c) => {
                        v["huber"] = json!(c);
                        v["lo_y"] = json!(spec.y_range.0);
                        v["hi_y"] = json!(spec.y_range.1);
                    }
                    FitLoss::Hinge(s) => v["smoothing"] = json!(s),
                }
                if let Some(e) = count_epsilon {
                    v["penalty_rule"] = json!("auto");
                    v["count_epsilon"] = json!(e);
                }
                v
            }
            Recipe::MeanCurve { spec, contribution, alpha, auto, .. } => {
                let mut v = json!({
                    "points": spec.points, "kernel": spec.kernel.name(), "range": spec.range,
                    "penalty": spec.penalty, "eta": spec.eta, "clip": spec.clip, "epsilon": spec.epsilon,
                    "delta": spec.delta, "count_fraction": spec.count_fraction,
                    "calibration": spec.calibration.name(),
                    "unit_rows": contribution.rows, "unit_groups": contribution.groups, "band_alpha": alpha,
                });
                // The chosen values are `range`/`penalty` above; these say they were chosen.
                if auto.0 {
                    v["range_rule"] = json!("auto");
                }
                if auto.1 {
                    v["penalty_rule"] = json!("auto");
                }
                v
            }
            Recipe::Cdf { spec, contribution, alpha, leaves_log2, root_share, probabilities, .. } => {
                let mut v = json!({
                    "lo": spec.lo, "hi": spec.hi, "points": spec.points, "leaves": 1u64 << leaves_log2,
                    "epsilon": spec.epsilon, "delta": spec.delta, "mechanism": spec.noise.name(),
                    "calibration": spec.calibration.name(), "count_share": root_share,
                    "unit_rows": contribution.rows, "unit_groups": contribution.groups, "band_alpha": alpha,
                });
                match spec.resolution {
                    Resolution::Auto { max_log2 } => {
                        v["leaves_rule"] = json!("auto");
                        v["max_leaves"] = json!(1u64 << max_log2);
                    }
                    Resolution::Fixed { .. } => {}
                }
                if let Some(p) = probabilities {
                    v["probabilities"] = json!(p);
                }
                v
            }
        };
        v.to_string()
    }

    /// The released numbers: the lifted coordinates (a 2-D KDE's surface) as little-endian f64
    /// (a mean curve's count first, as a little-endian i64).
    pub fn data(&self) -> Vec<u8> {
        let (lifted, n) = match self {
            Recipe::Kde { lifted, .. } => (lifted, None),
            Recipe::Kde2d { surface, .. } => (surface, None),
            Recipe::KernelFit { coefficients, .. } => (coefficients, None),
            Recipe::MeanCurve { lifted, n, .. } => (lifted, Some(*n)),
            Recipe::Cdf { levels, .. } => (levels, None),
        };
        let mut out = Vec::with_capacity(8 * (lifted.len() + 1));
        if let Some(n) = n {
            out.extend_from_slice(&n.to_le_bytes());
        }
        lifted.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        out
    }

    /// Reads a stored release back.
    pub fn decode(function: &str, parameters: &str, data: &[u8]) -> Result<Recipe, String> {
        let p: Value = serde_json::from_str(parameters).map_err(|e| format!("stored release: {e}"))?;
        let calibration = Calibration::parse(text(&p, "calibration")?).ok_or("stored release: bad calibration")?;
        let contribution = Contribution::new(count(&p, "unit_rows")?, count(&p, "unit_groups")?)?;
        let alpha = || field(&p, "band_alpha");
        let floats = |bytes: &[u8]| -> Result<Vec<f64>, String> {
            if !bytes.len().is_multiple_of(8) {
                return Err("stored release: truncated data".into());
            }
            Ok(bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
        };
        match function {
            "private_kde" => Ok(Recipe::Kde {
                spec: KdeSpec {
                    grid: Grid { lo: field(&p, "lo")?, hi: field(&p, "hi")?, points: count(&p, "points")? as usize },
                    bandwidth: field(&p, "bandwidth")?,
                    epsilon: field(&p, "epsilon")?,
                    delta: field(&p, "delta")?,
                    calibration,
                    normalise: Normalise::parse(text(&p, "normalize")?).ok_or("stored release: bad normalize")?,
                },
                contribution,
                alpha: alpha()?,
                lifted: floats(data)?,
                layout_bandwidth: match p.get("layout_bandwidth").and_then(Value::as_f64) {
                    // Releases stored before the spacing was chosen had nodes every h/2.
                    Some(lb) => Some((
                        lb,
                        p.get("node_spacing").and_then(Value::as_f64).unwrap_or(field(&p, "bandwidth")? / 2.0),
                        // Releases stored before the spacing rule say whether a pilot ran (the
                        // reference rule chose when none did); before the no-pilot rule, all had one.
                        match p.get("spacing_rule").and_then(Value::as_str) {
                            Some(rule) => rule == "reference",
                            None => !p.get("pilot").and_then(Value::as_bool).unwrap_or(true),
                        },
                        // Releases stored before the sixth-order kernel were Gaussian.
                        match p.get("kernel").and_then(Value::as_str) {
                            None => NodeKernel::Gaussian,
                            Some(k) => NodeKernel::parse(k).ok_or("stored release: bad kernel")?,
                        },
                    )),
                    None => None,
                },
                sobolev: p.get("space").and_then(Value::as_str) == Some("sobolev"),
                iclp: p.get("mechanism").and_then(Value::as_str) == Some("iclp"),
            }),
            "private_kde2d" => {
                let grid = |axis: &str| -> Result<Grid, String> {
                    Ok(Grid {
                        lo: field(&p, &format!("lo_{axis}"))?,
                        hi: field(&p, &format!("hi_{axis}"))?,
                        points: count(&p, &format!("points_{axis}"))? as usize,
                    })
                };
                Ok(Recipe::Kde2d {
                    spec: Kde2dSpec {
                        grid_x: grid("x")?,
                        grid_y: grid("y")?,
                        bandwidth_x: field(&p, "bandwidth_x")?,
                        bandwidth_y: field(&p, "bandwidth_y")?,
                        epsilon: field(&p, "epsilon")?,
                        delta: field(&p, "delta")?,
                        calibration,
                        normalise: Normalise::parse(text(&p, "normalize")?).ok_or("stored release: bad normalize")?,
                    },
                    contribution,
                    // Releases stored before 2-D bands existed: the default level.
                    alpha: alpha().unwrap_or(crate::mechanism::noise::bands::DEFAULT_ALPHA),
                    surface: floats(data)?,
                })
            }
            "private_kernel_regression" | "private_kernel_classifier" => {
                let (loss, y_range) = if function == "private_kernel_regression" {
                    (FitLoss::Huber(field(&p, "huber")?), (field(&p, "lo_y")?, field(&p, "hi_y")?))
                } else {
                    (FitLoss::Hinge(field(&p, "smoothing")?), (-1.0, 1.0))
                };
                Ok(Recipe::KernelFit {
                    spec: FitSpec {
                        grid: Grid {
                            lo: field(&p, "lo")?,
                            hi: field(&p, "hi")?,
                            points: count(&p, "points")? as usize,
                        },
                        bandwidth: field(&p, "bandwidth")?,
                        penalty: field(&p, "penalty")?,
                        loss,
                        y_range,
                        epsilon: field(&p, "epsilon")?,
                        delta: field(&p, "delta")?,
                        calibration,
                    },
                    contribution,
                    coefficients: floats(data)?,
                    count_epsilon: p.get("count_epsilon").and_then(Value::as_f64),
                })
            }
            "private_mean_curve" => {
                if data.len() < 8 {
                    return Err("stored release: truncated data".into());
                }
                Ok(Recipe::MeanCurve {
                    spec: MeanCurveSpec {
                        points: count(&p, "points")? as usize,
                        kernel: CovKernel::parse(text(&p, "kernel")?).ok_or("stored release: bad kernel")?,
                        range: field(&p, "range")?,
                        penalty: field(&p, "penalty")?,
                        eta: field(&p, "eta")?,
                        clip: field(&p, "clip")?,
                        epsilon: field(&p, "epsilon")?,
                        delta: field(&p, "delta")?,
                        count_fraction: field(&p, "count_fraction")?,
                        calibration,
                    },
                    contribution,
                    alpha: alpha()?,
                    n: i64::from_le_bytes(data[..8].try_into().expect("8 bytes")),
                    lifted: floats(&data[8..])?,
                    auto: (
                        p.get("range_rule").and_then(Value::as_str) == Some("auto"),
                        p.get("penalty_rule").and_then(Value::as_str) == Some("auto"),
                    ),
                })
            }
            "private_cdf" | "private_quantiles" => {
                let leaves = count(&p, "leaves")?;
                if !leaves.is_power_of_two() || leaves < 2 {
                    return Err("stored release: bad leaves".into());
                }
                let leaves_log2 = leaves.trailing_zeros();
                let resolution = match p.get("leaves_rule").and_then(Value::as_str) {
                    Some("auto") => Resolution::Auto { max_log2: count(&p, "max_leaves")?.max(1).trailing_zeros() },
                    _ => Resolution::Fixed { log2: leaves_log2 },
                };
                let probabilities = match p.get("probabilities") {
                    None => None,
                    Some(list) => Some(
                        list.as_array()
                            .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                            .ok_or("stored release: bad probabilities")?,
                    ),
                };
                if probabilities.is_some() != (function == "private_quantiles") {
                    return Err("stored release: probabilities do not match the function".into());
                }
                Ok(Recipe::Cdf {
                    spec: CdfSpec {
                        lo: field(&p, "lo")?,
                        hi: field(&p, "hi")?,
                        points: count(&p, "points")? as usize,
                        resolution,
                        noise: CdfNoise::parse(text(&p, "mechanism")?).ok_or("stored release: bad mechanism")?,
                        epsilon: field(&p, "epsilon")?,
                        delta: field(&p, "delta")?,
                        calibration,
                    },
                    contribution,
                    alpha: alpha()?,
                    leaves_log2,
                    // Releases stored before the share depended on the budget spent 5 %.
                    root_share: p.get("count_share").map_or(Ok(LEGACY_ROOT_SHARE), |_| field(&p, "count_share"))?,
                    levels: floats(data)?,
                    probabilities,
                })
            }
            other => Err(format!("stored release of unknown function '{other}'")),
        }
    }
}

/// A stored release, ready to evaluate.
#[derive(Debug)]
pub enum StoredCurve {
    /// A KDE release.
    Kde {
        /// The mechanism (public parameters, cached basis).
        mechanism: Box<KdeMechanism>,
        /// Released lifted coordinates.
        lifted: Vec<f64>,
        /// The kernel sum at every lattice point of the circle.
        circle: Vec<f64>,
        /// The release as it was returned.
        release: KdeRelease,
        /// Its bands.
        bands: Option<KdeBands>,
    },
    /// A 2-D KDE release.
    Kde2d {
        /// The release as it was returned.
        release: Kde2dRelease,
        /// Its bands.
        bands: Option<Kde2dBands>,
    },
    /// A kernel regression or classifier release.
    KernelFit {
        /// The mechanism (public parameters, the feature map).
        mechanism: Box<KernelFitMechanism>,
        /// Released coefficients.
        coefficients: Vec<f64>,
        /// The release as it was returned.
        release: FitRelease,
    },
    /// A mean-curve release.
    MeanCurve {
        /// The release as it was returned.
        release: MeanRelease,
        /// Its noise band.
        band: Vec<f64>,
        /// Nyström weights `a_k = (1/m)·Σ_j (c̃_j/λ_j)·v_jk`: the curve at t is `Σ_k c(t, t_k)·a_k`.
        weights: Vec<f64>,
        /// Covariance kernel and range.
        kernel: CovKernel,
        /// Range ρ.
        range: f64,
    },
    /// A distribution-function release (`private_cdf`, `private_quantiles`).
    Cdf {
        /// The mechanism (public parameters).
        mechanism: Box<CdfMechanism>,
        /// The release as it was returned.
        release: CdfRelease,
        /// `private_quantiles`: its probabilities.
        probabilities: Option<Vec<f64>>,
    },
}

impl StoredCurve {
    /// Rebuilds the release from its recipe (public computation only).
    pub fn build(recipe: &Recipe) -> Result<Self, String> {
        match recipe {
            Recipe::Kde { spec, contribution, alpha, lifted, layout_bandwidth, sobolev, iclp } => {
                let mechanism = match layout_bandwidth {
                    None if *iclp => KdeMechanism::iclp(spec.clone(), *contribution),
                    None if *sobolev => KdeMechanism::sobolev(spec.clone(), *contribution),
                    None => KdeMechanism::with_contribution(spec.clone(), *contribution),
                    Some((lb, s, _, kernel)) => {
                        KdeLayout::new(spec.grid, *lb).map_err(MechanismError::Kde).and_then(|layout| {
                            KdeMechanism::pure_epsilon_with_kernel(spec.clone(), layout, *contribution, *s, *kernel)
                        })
                    }
                }
                .map_err(|e| e.to_string())?;
                if lifted.len() != mechanism.lattice().dim() {
                    return Err("stored release: coordinates of the wrong dimension".into());
                }
                let circle = mechanism.circle_from_lifted(lifted);
                let release = mechanism.post_process(&mechanism.curve_from_lifted(lifted));
                let bands = mechanism.bands(&release, *alpha);
                Ok(StoredCurve::Kde { mechanism: Box::new(mechanism), lifted: lifted.clone(), circle, release, bands })
            }
            Recipe::Kde2d { spec, contribution, alpha, surface } => {
                let mechanism = Kde2dMechanism::new(spec.clone(), *contribution).map_err(|e| e.to_string())?;
                if surface.len() != spec.grid_x.points * spec.grid_y.points {
                    return Err("stored release: a surface of the wrong size".into());
                }
                let release = mechanism.post_process(surface);
                let bands = mechanism.bands(&release, *alpha);
                Ok(StoredCurve::Kde2d { release, bands })
            }
            Recipe::KernelFit { spec, contribution, coefficients, .. } => {
                let mechanism = KernelFitMechanism::new(spec.clone(), *contribution).map_err(|e| e.to_string())?;
                if coefficients.len() != mechanism.features().dim() {
                    return Err("stored release: coefficients of the wrong dimension".into());
                }
                let release = mechanism.post_process(coefficients);
                Ok(StoredCurve::KernelFit {
                    mechanism: Box::new(mechanism),
                    coefficients: coefficients.clone(),
                    release,
                })
            }
            Recipe::MeanCurve { spec, contribution, alpha, lifted, n, .. } => {
                let mechanism =
                    MeanCurveMechanism::with_contribution(spec.clone(), *contribution).map_err(|e| e.to_string())?;
                let basis = mechanism.basis();
                if lifted.len() != basis.lambda.len() {
                    return Err("stored release: coordinates of the wrong dimension".into());
                }
                let release = mechanism.post_process(lifted, *n);
                let band = mechanism.noise_band(*n, *alpha);
                let m = spec.points;
                let d = (*n).max(1) as f64;
                let mut weights = vec![0.0; m];
                for ((w, l), v) in lifted.iter().zip(&basis.lambda).zip(&basis.vectors) {
                    let c = w * l.sqrt() / d / l / m as f64;
                    weights.iter_mut().zip(v).for_each(|(a, vk)| *a += c * vk);
                }
                Ok(StoredCurve::MeanCurve { release, band, weights, kernel: spec.kernel, range: spec.range })
            }
            Recipe::Cdf { spec, contribution, alpha, leaves_log2, root_share, levels, probabilities } => {
                let mechanism = CdfMechanism::with_root_share(spec.clone(), *contribution, Some(*root_share))?;
                if *leaves_log2 > spec.resolution.statistic_log2() {
                    return Err("stored release: more leaves than its statistic".into());
                }
                let sizes = TreeShape::for_leaves_log2(*leaves_log2).level_sizes();
                if levels.len() != sizes.iter().sum::<usize>() {
                    return Err("stored release: levels of the wrong size".into());
                }
                let mut rest = levels.as_slice();
                let split: Vec<Vec<f64>> = sizes
                    .iter()
                    .map(|&n| {
                        let (head, tail) = rest.split_at(n);
                        rest = tail;
                        head.to_vec()
                    })
                    .collect();
                let release = mechanism.post_process(*leaves_log2, &split, *alpha)?;
                Ok(StoredCurve::Cdf { mechanism: Box::new(mechanism), release, probabilities: probabilities.clone() })
            }
        }
    }

    /// Whether the release is a function of two variables (evaluated with [`Self::eval2`]).
    pub fn is_2d(&self) -> bool {
        matches!(self, StoredCurve::Kde2d { .. })
    }

    /// A 2-D release's density at `(x, y)`: at grid points exactly the released density,
    /// between them bilinear interpolation of the four surrounding grid values. None outside
    /// the box, for a release without a density (too little mass), or a 1-D release.
    pub fn eval2(&self, x: f64, y: f64) -> Option<f64> {
        let StoredCurve::Kde2d { release, .. } = self else { return None };
        let density = release.density.as_ref()?;
        let (i, tx) = cell_of(&release.x, x)?;
        let (j, ty) = cell_of(&release.y, y)?;
        let at = |a: usize, b: usize| density[a.min(release.x.len() - 1)][b.min(release.y.len() - 1)];
        // Exact at the grid points (a zero weight never touches the neighbour).
        let lerp = |a: f64, b: f64, t: f64| if t == 0.0 { a } else { a + t * (b - a) };
        Some(lerp(lerp(at(i, j), at(i, j + 1), ty), lerp(at(i + 1, j), at(i + 1, j + 1), ty), tx))
    }

    /// The released curve at `x` (density for a KDE, mean for a mean curve); None outside the
    /// release's range, when the release has no curve (a KDE with too little mass), or for a
    /// 2-D release.
    pub fn eval(&self, x: f64) -> Option<f64> {
        if !x.is_finite() {
            return None;
        }
        match self {
            StoredCurve::Kde2d { .. } => None,
            StoredCurve::Cdf { mechanism, release, .. } => {
                let spec = mechanism.spec();
                let curve = release.curve.as_ref()?;
                (x >= spec.lo && x <= spec.hi).then(|| curve.interpolant.eval(x))
            }
            StoredCurve::KernelFit { mechanism, coefficients, .. } => {
                let grid = mechanism.spec().grid;
                // The same evaluation as the returned grid values: exact there, and anywhere.
                (x >= grid.lo && x <= grid.hi).then(|| mechanism.eval(coefficients, x))
            }
            StoredCurve::Kde { mechanism, lifted, circle, release, .. } => {
                let grid = mechanism.spec().grid;
                release.density.as_ref()?;
                if !(x >= grid.lo && x <= grid.hi) {
                    return None;
                }
                Some(mechanism.density_of(release, mechanism.sum_at(lifted, circle, x)))
            }
            StoredCurve::MeanCurve { release, weights, kernel, range, .. } => {
                if !(0.0..=1.0).contains(&x) {
                    return None;
                }
                let m = release.t.len();
                let k = (x * (m - 1) as f64).round() as usize;
                if release.t[k] == x {
                    return Some(release.mean[k]);
                }
                Some(release.t.iter().zip(weights).map(|(t, a)| kernel.eval(x - t, *range) * a).sum())
            }
        }
    }
}

/// The cell of an increasing grid holding `v`: (its left index, the fraction of the way to the
/// next point); the last point is its own cell with fraction 0. None outside the grid.
fn cell_of(grid: &[f64], v: f64) -> Option<(usize, f64)> {
    let (&lo, &hi) = (grid.first()?, grid.last()?);
    if !(v >= lo && v <= hi) {
        return None;
    }
    let i = grid.partition_point(|g| *g <= v).saturating_sub(1);
    if grid[i] == v || i + 1 == grid.len() {
        return Some((i, 0.0));
    }
    Some((i, (v - grid[i]) / (grid[i + 1] - grid[i])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::ChaCha20Rng;

    fn kde_recipe(bandwidth: f64) -> (Recipe, KdeRelease) {
        let spec = KdeSpec {
            grid: Grid { lo: 0.0, hi: 1.0, points: 101 },
            bandwidth,
            epsilon: 1.0,
            delta: 1e-6,
            calibration: Calibration::Analytic,
            normalise: Normalise::Project,
        };
        let m = KdeMechanism::new(spec.clone()).unwrap();
        let xs: Vec<f64> = (0..500).map(|i| 0.2 + 0.5 * (i as f64 * 0.618).fract()).collect();
        let mut st = m.layout().empty_state();
        m.layout().add_all(&mut st, &xs);
        let lifted = m.noisy_lifted(&st, Some(&mut ChaCha20Rng::seed_from_u64(3)));
        let release = m.post_process(&m.curve_from_lifted(&lifted));
        (
            Recipe::Kde {
                spec,
                contribution: Contribution::ROW,
                alpha: 0.05,
                lifted,
                layout_bandwidth: None,
                sobolev: false,
                iclp: false,
            },
            release,
        )
    }

    #[test]
    fn a_kde_recipe_round_trips_and_evaluates_the_same_path() {
        for h in [0.05, 0.004] {
            let (recipe, release) = kde_recipe(h);
            let back = Recipe::decode(recipe.function(), &recipe.parameters(), &recipe.data()).unwrap();
            assert_eq!(back, recipe, "exact round trip");
            let curve = StoredCurve::build(&back).unwrap();
            let density = release.density.unwrap();
            // Bit-identical at the grid points.
            for (x, d) in release.x.iter().zip(&density) {
                assert_eq!(curve.eval(*x), Some(*d), "x = {x}");
            }
            // The trigonometric continuation passes through the lattice values.
            let StoredCurve::Kde { mechanism, lifted, circle, .. } = &curve else { unreachable!() };
            for j in [3usize, 100, 257, circle.len() / 2] {
                let t = mechanism.sum_at_position(lifted, j as f64);
                assert!((t - circle[j]).abs() <= 1e-9 * circle.iter().fold(0.0f64, |a, v| a.max(v.abs())), "j = {j}");
            }
            // Between grid points: continuous, close to linear interpolation on a fine grid.
            let mid = curve.eval(0.505).unwrap();
            let (a, b) = (curve.eval(0.5).unwrap(), curve.eval(0.51).unwrap());
            if h > 2.0 * 0.01 {
                assert!((mid - 0.5 * (a + b)).abs() < 0.05 * (a.abs() + b.abs()) + 1e-9, "{a} {mid} {b}");
            } else {
                assert!(mid.is_finite() && mid >= 0.0);
            }
            assert_eq!(curve.eval(-0.01), None);
            assert_eq!(curve.eval(1.01), None);
        }
    }

    #[test]
    fn an_automatic_release_keeps_its_chosen_node_spacing_and_old_records_read_as_half_h() {
        use crate::mechanism::density::auto_bandwidth::{AutoKde, FINAL_KERNEL};
        let grid = Grid { lo: 0.0, hi: 1.0, points: 101 };
        let auto = AutoKde::new(grid, 1.0, Normalise::Project, Contribution::ROW).unwrap();
        let h = 0.05;
        let mut st = auto.layout().empty_state();
        auto.layout().add_all(&mut st, &(0..500).map(|i| 0.2 + 0.5 * (i as f64 * 0.618).fract()).collect::<Vec<_>>());
        for (spacing, reference) in [(h / 2.0, true), (1.25 * h, false)] {
            let m = auto.mechanism_at(h, spacing, reference, FINAL_KERNEL).unwrap();
            let lifted = m.noisy_lifted(&st, Some(&mut ChaCha20Rng::seed_from_u64(3)));
            let release = m.post_process(&m.curve_from_lifted(&lifted));
            let recipe = Recipe::Kde {
                spec: m.spec().clone(),
                contribution: Contribution::ROW,
                alpha: 0.05,
                lifted,
                layout_bandwidth: Some((auto.layout().bandwidth(), spacing, reference, FINAL_KERNEL)),
                sobolev: false,
                iclp: false,
            };
            let back = Recipe::decode(recipe.function(), &recipe.parameters(), &recipe.data()).unwrap();
            assert_eq!(back, recipe, "exact round trip");
            let stored: Value = serde_json::from_str(&recipe.parameters()).unwrap();
            assert_eq!(stored["spacing_rule"], json!(if reference { "reference" } else { "count" }));
            // A record from before the spacing rule says whether a pilot ran: one that did not
            // was the reference rule's.
            let mut old = stored.clone();
            old.as_object_mut().unwrap().remove("spacing_rule");
            old["pilot"] = json!(!reference);
            assert_eq!(Recipe::decode(recipe.function(), &old.to_string(), &recipe.data()).unwrap(), recipe);
            let curve = StoredCurve::build(&back).unwrap();
            for (x, d) in release.x.iter().zip(release.density.as_ref().unwrap()) {
                assert_eq!(curve.eval(*x), Some(*d), "x = {x}");
            }
            // A record from before the spacing was stored reads as nodes every h/2: it
            // rebuilds only when that is what it was.
            let mut old: Value = serde_json::from_str(&recipe.parameters()).unwrap();
            old.as_object_mut().unwrap().remove("node_spacing");
            let legacy = Recipe::decode(recipe.function(), &old.to_string(), &recipe.data()).unwrap();
            assert_eq!(StoredCurve::build(&legacy).is_ok(), spacing == h / 2.0, "spacing {spacing}");
            // A record from before the kernel was stored reads as the Gaussian it was: it
            // rebuilds, as a different curve.
            let mut old: Value = serde_json::from_str(&recipe.parameters()).unwrap();
            assert_eq!(old["kernel"], json!(FINAL_KERNEL.name()));
            old.as_object_mut().unwrap().remove("kernel");
            let gaussian =
                StoredCurve::build(&Recipe::decode(recipe.function(), &old.to_string(), &recipe.data()).unwrap());
            let mid = release.x[50];
            assert_ne!(gaussian.unwrap().eval(mid), curve.eval(mid));
        }
    }

    #[test]
    fn a_cdf_recipe_keeps_its_counts_share_and_old_records_read_as_five_percent() {
        let spec = CdfSpec {
            lo: 0.0,
            hi: 1.0,
            points: 33,
            resolution: Resolution::Auto { max_log2: 10 },
            noise: CdfNoise::Laplace,
            epsilon: 1.0,
            delta: 0.0,
            calibration: Calibration::Analytic,
        };
        let m = CdfMechanism::new(spec.clone(), Contribution::ROW).unwrap();
        assert_eq!(m.root_share(), 0.02, "ε = 1 spends 2 % on the count");
        let mut sums = m.statistic();
        m.accumulate(&mut sums, &(0..2000).map(|i| (i as f64 * 0.618).fract().powi(2)).collect::<Vec<_>>());
        let (k, levels) = m.release(sums.totals(), Some(&mut ChaCha20Rng::seed_from_u64(5)));
        let release = m.post_process(k, &levels, 0.05).unwrap();
        let recipe = Recipe::Cdf {
            spec,
            contribution: Contribution::ROW,
            alpha: 0.05,
            leaves_log2: k,
            root_share: m.root_share(),
            levels: levels.concat(),
            probabilities: None,
        };
        let back = Recipe::decode(recipe.function(), &recipe.parameters(), &recipe.data()).unwrap();
        assert_eq!(back, recipe, "exact round trip");
        let curve = StoredCurve::build(&back).unwrap();
        let values = &release.curve.as_ref().unwrap().cdf;
        for (x, f) in release.x.iter().zip(values) {
            assert_eq!(curve.eval(*x), Some(*f), "x = {x}");
        }
        // A record from before the share depended on ε spent 5 %: its least-squares weights are
        // those, so it evaluates as that release did (and not as today's share would).
        let mut old: Value = serde_json::from_str(&recipe.parameters()).unwrap();
        assert_eq!(old["count_share"], json!(0.02));
        old.as_object_mut().unwrap().remove("count_share");
        let legacy = Recipe::decode(recipe.function(), &old.to_string(), &recipe.data()).unwrap();
        let Recipe::Cdf { root_share, .. } = &legacy else { panic!("a CDF recipe") };
        assert_eq!(*root_share, LEGACY_ROOT_SHARE);
        let then = CdfMechanism::with_root_share(m.spec().clone(), Contribution::ROW, Some(0.05)).unwrap();
        let then = then.post_process(k, &levels, 0.05).unwrap();
        let legacy = StoredCurve::build(&legacy).unwrap();
        let then_values = &then.curve.as_ref().unwrap().cdf;
        for (x, f) in then.x.iter().zip(then_values) {
            assert_eq!(legacy.eval(*x), Some(*f), "x = {x}");
        }
        assert_ne!(then_values, values, "the share changes the least-squares estimate");
    }

    #[test]
    fn a_mean_curve_recipe_round_trips_and_nystrom_matches_the_grid() {
        let spec = MeanCurveSpec {
            points: 40,
            kernel: CovKernel::Matern52,
            range: 0.2,
            penalty: 0.01,
            eta: 1.0,
            clip: 1.0,
            epsilon: 1.0,
            delta: 1e-6,
            count_fraction: 0.1,
            calibration: Calibration::Analytic,
        };
        let m = MeanCurveMechanism::new(spec.clone()).unwrap();
        let mut st = m.empty_state();
        for i in 0..30 {
            m.add(&mut st, &(0..40).map(|k| ((k + i) as f64 / 9.0).sin() * 0.3).collect::<Vec<_>>());
        }
        let lifted = m.lattice().release(&m.lifted(&st), Some(&mut ChaCha20Rng::seed_from_u64(5)));
        let release = m.post_process(&lifted, 31);
        let recipe = Recipe::MeanCurve {
            spec,
            contribution: Contribution::ROW,
            alpha: 0.05,
            lifted,
            n: 31,
            auto: (true, false),
        };
        let back = Recipe::decode(recipe.function(), &recipe.parameters(), &recipe.data()).unwrap();
        assert_eq!(back, recipe);
        let curve = StoredCurve::build(&back).unwrap();
        for (t, v) in release.t.iter().zip(&release.mean) {
            assert_eq!(curve.eval(*t), Some(*v));
        }
        // The Nyström continuation agrees with the grid values when evaluated near them.
        let scale = release.mean.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        for k in [0usize, 7, 20, 39] {
            let t = release.t[k];
            let near = curve.eval((t + 1e-12).min(1.0) - if k == 39 { 2e-12 } else { 0.0 }).unwrap();
            assert!((near - release.mean[k]).abs() < 1e-6 * scale, "k = {k}: {near} vs {}", release.mean[k]);
        }
        assert_eq!(curve.eval(1.5), None);
    }
}
