//! `private_kernel_regression`: differentially private kernel regression (a regularised pseudo-Huber fit
//! in a Gaussian RKHS) as a SQL aggregate (Hall et al. §4.3; the mechanism, its add/remove
//! sensitivity proof and the solver's certificate are in [`crate::mechanism::fits::kernel_fit`]).
//!
//! ```sql
//! private_kernel_regression(y, x, epsilon, delta
//!     [, bandwidth => (hi − lo)/20, penalty => 100 | 'auto', lo => …, hi => …, lo_y => …, hi_y => …, huber => (hi_y − lo_y)/2, points => 101,
//!      calibration => 'analytic', select_…])
//!   -> {x: List<Float64>, fit: List<Float64>, penalty: Float64, release: Utf8}
//! ```
//!
//! The response is clamped to the public `[lo_y, hi_y]` (default: the y column's policy bounds) and the
//! predictor to `[lo, hi]`; the fitted function `fit[k]` at `x[k]` minimises
//! `Σ pseudo_huber(y_i − f(x_i)) + (Λ/2)‖f‖²` (least squares for residuals below `huber`), released
//! with Gaussian-process noise of sensitivity `huber/Λ`.

use std::sync::LazyLock;

use datafusion::logical_expr::Documentation;

use super::aggregate::PrivateUdaf;
use super::kernel_fit::{FitFunction, Kind};
use super::params::{FunctionParams, ParamDef, ParamKind};

/// SQL name of the function.
pub const NAME: &str = "private_kernel_regression";
/// Argument positions of the boxes and the data argument each comes from (policy defaults).
pub const BOX_ARGS: &[(usize, (usize, usize))] = &[(1, (6, 7)), (0, (8, 9))];

/// Declared arguments, in positional order.
pub static PARAMS: FunctionParams = FunctionParams {
    function: NAME,
    data: &["y", "x"],
    params: &[
        ParamDef { name: "epsilon", kind: ParamKind::Float },
        ParamDef { name: "delta", kind: ParamKind::Float },
        ParamDef { name: "bandwidth", kind: ParamKind::Float },
        ParamDef { name: "penalty", kind: ParamKind::FloatOrAuto },
        ParamDef { name: "lo", kind: ParamKind::Float },
        ParamDef { name: "hi", kind: ParamKind::Float },
        ParamDef { name: "lo_y", kind: ParamKind::Float },
        ParamDef { name: "hi_y", kind: ParamKind::Float },
        ParamDef { name: "points", kind: ParamKind::Int },
        ParamDef { name: "huber", kind: ParamKind::Float },
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
        "Differentially private kernel regression of y on x: the minimiser of Σ pseudo-Huber(y − f(x)) + (Λ/2)‖f‖² over a Gaussian-kernel RKHS (bandwidth h), with y clamped to [lo_y, hi_y] and x to [lo, hi], released with Gaussian-process noise calibrated to (epsilon, delta) for the add/remove sensitivity huber·κ/Λ. Returns {x, fit, release}: the grid, the fitted function on it and the stored release's id.",
        "private_kernel_regression(y, x, epsilon, delta [, bandwidth, penalty, lo, hi, lo_y, hi_y, points, huber, calibration])",
    )
    .with_sql_example("```sql\nSELECT private_kernel_regression(y, x, 1.0, 1e-6, bandwidth => 0.05, penalty => 100, lo => 0, hi => 1, lo_y => -2, hi_y => 2) FROM t;\n```")
    .with_argument("y", "numeric response; clamped to [lo_y, hi_y]; NULL or NaN drops the row")
    .with_argument("x", "numeric predictor; clamped to [lo, hi]; NULL or NaN drops the row")
    .with_argument("epsilon", "privacy parameter ε > 0 (literal)")
    .with_argument("delta", "privacy parameter δ in [0, 1) (literal); 0: pure ε, Laplace-process noise (ICLP)")
    .with_argument("bandwidth", "Gaussian kernel bandwidth, (hi − lo)/256 ≤ bandwidth (literal; default (hi − lo)/20)")
    .with_argument("penalty", "Λ of the unnormalised objective Σ loss + (Λ/2)‖f‖², in [1e-6, 1e15] (default 100): the noise scales as 1/Λ; 'auto': chosen from a noisy row count (5 % of ε)")
    .with_argument("lo", "the x box (default: the x column's policy bounds)")
    .with_argument("hi", "lo < hi")
    .with_argument("lo_y", "the response's clamping range (default: the y column's policy bounds)")
    .with_argument("hi_y", "lo_y < hi_y")
    .with_argument("huber", "scale c of the pseudo-Huber loss c²(√(1+(r/c)²) − 1), > 0 (default (hi_y − lo_y)/2)")
    .with_argument("points", "grid points of the returned function in [2, 4096], default 101")
    .with_argument("calibration", "'analytic' (default) or 'classic' (ε ≤ 1 only)")
    .build()
});

/// The `private_kernel_regression` function (module docs).
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct Regression;

/// The `private_kernel_regression` aggregate UDF.
pub type PrivateKernelRegression = PrivateUdaf<Regression>;

impl FitFunction for Regression {
    const KIND: Kind = Kind::Regression;
    const BOXES: &'static [(usize, (usize, usize))] = BOX_ARGS;

    fn params() -> &'static FunctionParams {
        &PARAMS
    }

    fn documentation() -> &'static Documentation {
        &DOCUMENTATION
    }
}
