//! `private_kernel_classifier`: a differentially private soft-margin kernel classifier (smoothed-hinge SVM
//! in a Gaussian RKHS) as a SQL aggregate (Hall et al. §4.3; the mechanism, its add/remove
//! sensitivity proof and the solver's certificate are in [`crate::mechanism::fits::kernel_fit`]).
//!
//! ```sql
//! private_kernel_classifier(label, x, epsilon, delta
//!     [, bandwidth => (hi − lo)/20, penalty => 100 | 'auto', lo => …, hi => …, points => 101,
//!      calibration => 'analytic', select_…])
//!   -> {x: List<Float64>, score: List<Float64>, penalty: Float64, release: Utf8}
//! ```
//!
//! The label is boolean or numeric (true or > 0: the positive class; false or ≤ 0: the negative one)
//! and the predictor is clamped to `[lo, hi]`; `score[k]` at `x[k]` is the decision function
//! minimising `Σ smooth_hinge(label_i·f(x_i)) + (Λ/2)‖f‖²` (positive: predict the positive class),
//! released with Gaussian-process noise of sensitivity `1/Λ`.

use std::sync::LazyLock;

use datafusion::logical_expr::Documentation;

use super::aggregate::PrivateUdaf;
use super::kernel_fit::{FitFunction, Kind};
use super::params::{FunctionParams, ParamDef, ParamKind};

/// SQL name of the function.
pub const NAME: &str = "private_kernel_classifier";
/// Argument positions of the boxes and the data argument each comes from (policy defaults).
pub const BOX_ARGS: &[(usize, (usize, usize))] = &[(1, (6, 7))];

/// Declared arguments, in positional order.
pub static PARAMS: FunctionParams = FunctionParams {
    function: NAME,
    data: &["label", "x"],
    params: &[
        ParamDef { name: "epsilon", kind: ParamKind::Float },
        ParamDef { name: "delta", kind: ParamKind::Float },
        ParamDef { name: "bandwidth", kind: ParamKind::Float },
        ParamDef { name: "penalty", kind: ParamKind::FloatOrAuto },
        ParamDef { name: "lo", kind: ParamKind::Float },
        ParamDef { name: "hi", kind: ParamKind::Float },
        ParamDef { name: "points", kind: ParamKind::Int },
        ParamDef { name: "smoothing", kind: ParamKind::Float },
        ParamDef { name: "calibration", kind: ParamKind::Str },
        ParamDef { name: "select_epsilon", kind: ParamKind::Float },
        ParamDef { name: "select_delta", kind: ParamKind::Float },
        ParamDef { name: "select_max_groups", kind: ParamKind::Int },
    ],
    required: 2,
};

static DOCUMENTATION: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        datafusion::logical_expr::DocSection {
            include: true,
            label: "Differentially private functions",
            description: None,
        },
        "Differentially private soft-margin kernel classifier (SVM with the smoothed hinge ½(1 − z + √((1 − z)² + s²)), z = label·f(x)) over a Gaussian-kernel RKHS (bandwidth h), x clamped to [lo, hi], released with Gaussian-process noise calibrated to (epsilon, delta) for the add/remove sensitivity κ/Λ. Returns {x, score, release}: the grid, the decision function on it (> 0: positive class) and the stored release's id.",
        "private_kernel_classifier(label, x, epsilon, delta [, bandwidth, penalty, lo, hi, points, smoothing, calibration])",
    )
    .with_sql_example("```sql\nSELECT private_kernel_classifier(churned, age, 1.0, 1e-6, bandwidth => 5, penalty => 100, lo => 18, hi => 90) FROM t;\n```")
    .with_argument("label", "boolean or numeric label: true or > 0 is the positive class; NULL or NaN drops the row")
    .with_argument("x", "numeric predictor; clamped to [lo, hi]; NULL or NaN drops the row")
    .with_argument("epsilon", "privacy parameter ε > 0 (literal)")
    .with_argument("delta", "privacy parameter δ in [0, 1) (literal); 0: pure ε, Laplace-process noise (ICLP)")
    .with_argument("bandwidth", "Gaussian kernel bandwidth, (hi − lo)/256 ≤ bandwidth (literal; default (hi − lo)/20)")
    .with_argument("penalty", "Λ of the unnormalised objective Σ loss + (Λ/2)‖f‖², in [1e-6, 1e15] (default 100): the noise scales as 1/Λ; 'auto': chosen from a noisy row count (5 % of ε)")
    .with_argument("lo", "the x box (default: the x column's policy bounds)")
    .with_argument("hi", "lo < hi")
    .with_argument("smoothing", "smoothing s of the hinge in [0.1, 1], default 0.1")
    .with_argument("points", "grid points of the returned function in [2, 4096], default 101")
    .with_argument("calibration", "'analytic' (default) or 'classic' (ε ≤ 1 only)")
    .build()
});

/// The `private_kernel_classifier` function (module docs).
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct Classifier;

/// The `private_kernel_classifier` aggregate UDF.
pub type PrivateKernelClassifier = PrivateUdaf<Classifier>;

impl FitFunction for Classifier {
    const KIND: Kind = Kind::Classifier;
    const BOXES: &'static [(usize, (usize, usize))] = BOX_ARGS;

    fn params() -> &'static FunctionParams {
        &PARAMS
    }

    fn documentation() -> &'static Documentation {
        &DOCUMENTATION
    }
}
