//! `private_mean_curve`: a differentially private mean of functional data (one curve per
//! row in a list column), SPEC §3.
//!
//! ```sql
//! private_mean_curve(curve, epsilon, delta
//!     [, kernel => 'matern32', range => 0.2, penalty => 0.1, eta => 1, clip => …,
//!        points => …, count_fraction => 0.1, calibration => 'analytic'])
//!   -> {t: List<Float64>, mean: List<Float64>, n: Int64}
//! ```
//! δ > 0 uses the Gaussian-process mechanism, δ = 0 the ICLP (pure ε) mechanism.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Float64Type, UInt64Type};
use datafusion::common::{Result, ScalarValue, internal_err};
use datafusion::logical_expr::Documentation;
use datafusion::logical_expr::utils::format_state_name;
use rand::rngs::ChaCha20Rng;

use super::aggregate::{PrivateSpec, PrivateUdaf};
use super::arrays::{fixed_point_state, fixed_point_type, float_list, for_each_fixed_point_row};
use super::call::{CallContext, PolicyArgs};
use super::params::{FunctionParams, ParamDef, ParamKind};
use super::release::{Release, Statistic};
use crate::mechanism::curves::mean_curve::{
    self, CovKernel, MAX_CURVE_LENGTH, MeanAccumulation, MeanCurveMechanism, MeanCurveSpec, MeanRelease, MeanState,
};
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::stored::Recipe;
use crate::mechanism::{Calibration, Contribution};

/// SQL name of the function.
pub const NAME: &str = "private_mean_curve";
/// Default kernel (see README's utility study).
pub const DEFAULT_KERNEL: CovKernel = CovKernel::Matern32;
/// Default kernel range ρ (from the utility study, `examples/utility_study.rs`).
pub const DEFAULT_RANGE: f64 = 0.2;
/// Default penalty φ (from the utility study).
pub const DEFAULT_PENALTY: f64 = 0.1;
/// Default share of ε spent on the count.
pub const DEFAULT_COUNT_FRACTION: f64 = 0.1;

/// Declared arguments, in positional order.
pub static PARAMS: FunctionParams = FunctionParams {
    function: NAME,
    data: &["curve"],
    params: &[
        ParamDef { name: "epsilon", kind: ParamKind::Float },
        ParamDef { name: "delta", kind: ParamKind::Float },
        ParamDef { name: "kernel", kind: ParamKind::Str },
        ParamDef { name: "range", kind: ParamKind::FloatOrAuto },
        ParamDef { name: "penalty", kind: ParamKind::FloatOrAuto },
        ParamDef { name: "eta", kind: ParamKind::Float },
        ParamDef { name: "clip", kind: ParamKind::Float },
        ParamDef { name: "points", kind: ParamKind::Int },
        ParamDef { name: "count_fraction", kind: ParamKind::Float },
        ParamDef { name: "calibration", kind: ParamKind::Str },
        ParamDef { name: "band_alpha", kind: ParamKind::Float },
        ParamDef { name: "select_epsilon", kind: ParamKind::Float },
        ParamDef { name: "select_delta", kind: ParamKind::Float },
        ParamDef { name: "select_max_groups", kind: ParamKind::Int },
    ],
    required: 2,
};

/// Argument positions (the curve is 0) of the parameters a policy can supply.
pub const CLIP_ARG: usize = 7;
/// Position of `points`.
pub const POINTS_ARG: usize = 8;

/// The public curve length carried by the column type (FixedSizeList), if any.
pub fn fixed_length(t: &DataType) -> Option<usize> {
    match t {
        DataType::FixedSizeList(_, n) => usize::try_from(*n).ok(),
        _ => None,
    }
}

/// Validates the literal parameters; `fixed` is the FixedSizeList length of the column.
pub fn mechanism_from_literals(
    values: &[Option<ScalarValue>],
    fixed: Option<usize>,
    contribution: Contribution,
) -> Result<(MeanCurveMechanism, Budget, Auto)> {
    let p = &PARAMS;
    let epsilon = p.epsilon(values)?;
    let delta = p.required_float(values, "delta")?;
    if !(0.0..1.0).contains(&delta) {
        return Err(
            p.error(format!("argument 'delta' must be in [0, 1), got {delta} (0 selects the pure-ε ICLP mechanism)"))
        );
    }
    let kernel = match p.string(values, "kernel")? {
        None => DEFAULT_KERNEL,
        Some(s) => CovKernel::parse(&s).ok_or_else(|| {
            p.error(format!("argument 'kernel' must be 'gaussian', 'matern52', 'matern32' or 'exponential', got '{s}'"))
        })?,
    };
    let positive = |name: &str, default: Option<f64>| -> Result<f64> {
        let v = p.float(values, name)?.or(default).ok_or_else(|| {
            p.error(format!(
                "argument '{name}' is required: give {name} => …, or have the data owner set public bounds \
                 for the column in the table's policy (the clip norm must never come from the data)"
            ))
        })?;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(p.error(format!("argument '{name}' must be a finite number > 0, got {v}")))
        }
    };
    let auto_range = p.is_auto(values, "range")?;
    let range = if auto_range { mean_curve::AUTO_PRIOR_RANGE } else { positive("range", Some(DEFAULT_RANGE))? };
    // 'auto': chosen at release from the released count (`auto_penalty`); validated here at the
    // value the rule gives for a count of 1.
    let auto_penalty = p.is_auto(values, "penalty")?;
    let penalty = if auto_penalty { DEFAULT_PENALTY } else { positive("penalty", Some(DEFAULT_PENALTY))? };
    let clip = positive("clip", None)?;
    let eta = p.float(values, "eta")?.unwrap_or(1.0);
    if !(eta.is_finite() && eta >= 1.0) {
        return Err(p.error(format!("argument 'eta' must be a finite number >= 1, got {eta}")));
    }
    let count_fraction = p.float(values, "count_fraction")?.unwrap_or(DEFAULT_COUNT_FRACTION);
    if !(count_fraction > 0.0 && count_fraction < 1.0) {
        return Err(
            p.error(format!("argument 'count_fraction' must be in the open interval (0, 1), got {count_fraction}"))
        );
    }
    let given = p.int(values, "points", (2, MAX_CURVE_LENGTH as i64))?.map(|v| v as usize);
    let points = match (given, fixed) {
        (Some(g), Some(f)) if g != f => {
            return Err(p.error(format!("argument 'points' is {g} but the column holds curves of length {f}")));
        }
        (Some(g), _) => g,
        (None, Some(f)) if (2..=MAX_CURVE_LENGTH).contains(&f) => f,
        (None, Some(f)) => {
            return Err(p.error(format!("curves of length {f} are not supported (2 to {MAX_CURVE_LENGTH} points)")));
        }
        (None, None) => {
            return Err(p.error(
                "the curve length is required: give points => m, store the column as a fixed-size \
                 list, or have the data owner set the table's public curve length",
            ));
        }
    };
    let calibration = match p.string(values, "calibration")? {
        None => Calibration::Analytic,
        Some(s) => Calibration::parse(&s)
            .ok_or_else(|| p.error(format!("argument 'calibration' must be 'analytic' or 'classic', got '{s}'")))?,
    };
    if calibration == Calibration::Classic && delta > 0.0 && epsilon > 1.0 {
        return Err(p.error(format!(
            "calibration 'classic' is only valid for epsilon <= 1, got epsilon = {epsilon}; use calibration => 'analytic'"
        )));
    }
    let cost = Budget::charge(epsilon, delta).map_err(|e| p.error(e))?;
    let spec = MeanCurveSpec {
        points,
        kernel,
        range,
        penalty,
        eta,
        clip,
        epsilon: cost.calibration_epsilon(),
        delta: cost.calibration_delta(),
        count_fraction,
        calibration,
    };
    if auto_range {
        if spec.points > mean_curve::MAX_AUTO_RANGE_POINTS {
            return Err(p.error(format!(
                "range => 'auto' compares every candidate range's eigenbasis with the prior's and supports curves of \
                 at most {} points, got {}: give a range",
                mean_curve::MAX_AUTO_RANGE_POINTS,
                spec.points
            )));
        }
        // Every candidate range must build (at planning, never at release).
        for rho in mean_curve::AUTO_RANGES {
            MeanCurveMechanism::with_contribution(MeanCurveSpec { range: rho, ..spec.clone() }, contribution)
                .map_err(|e| p.error(e))?;
        }
    }
    let auto = Auto { range: auto_range, penalty: auto_penalty };
    let spec = if auto.any() {
        let (range, penalty) = mean_curve::auto_tuning(&spec, contribution, 1, auto.range, auto.penalty);
        MeanCurveSpec { range, penalty, ..spec }
    } else {
        spec
    };
    let m = MeanCurveMechanism::with_contribution(spec, contribution).map_err(|e| p.error(e))?;
    Ok((m, cost, auto))
}

/// Which of range and penalty are 'auto' (chosen from the released count at release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Auto {
    /// `range => 'auto'`.
    pub range: bool,
    /// `penalty => 'auto'`.
    pub penalty: bool,
}

impl Auto {
    /// Whether anything is chosen at release.
    pub fn any(self) -> bool {
        self.range || self.penalty
    }
}

/// The fields of the result struct.
pub fn result_fields() -> Fields {
    Fields::from(vec![
        Field::new_list("t", Field::new_list_field(DataType::Float64, true), true),
        Field::new_list("mean", Field::new_list_field(DataType::Float64, true), true),
        Field::new("n", DataType::Int64, true),
        Field::new("release", DataType::Utf8, true),
        Field::new_list("noise_band", Field::new_list_field(DataType::Float64, true), true),
    ])
}

/// The result struct of a release: grid, mean, noisy count, the stored release's id, and the
/// half-widths of the simultaneous noise band (also what `release(id)` re-reads).
pub fn result_value(release: &MeanRelease, band: &[f64], id: Option<String>) -> Result<ScalarValue> {
    let columns: Vec<ArrayRef> = vec![
        float_list(Some(release.t.clone())),
        float_list(Some(release.mean.clone())),
        Arc::new(Int64Array::from(vec![release.n])),
        Arc::new(StringArray::from(vec![id])),
        float_list(Some(band.to_vec())),
    ];
    Ok(ScalarValue::Struct(Arc::new(StructArray::try_new(result_fields(), columns, None)?)))
}

static DOCUMENTATION: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        datafusion::logical_expr::DocSection { include: true, label: "Differentially private functions", description: None },
        "Differentially private mean of curves stored one per row in a list column (RKHS-smoothed, \
         Gaussian-process noise for delta > 0, ICLP noise for delta = 0). Returns {t, mean, n, \
         release, noise_band}: the grid, the mean, the noisy count, the stored release's id \
         (catalog sessions) and the half-widths of the simultaneous noise band.",
        "private_mean_curve(curve, epsilon, delta [, kernel, range, penalty, eta, clip, points, count_fraction, calibration])",
    )
    .with_argument("curve", "List/LargeList/FixedSizeList of numbers; rows of another length or with a non-finite value are dropped")
    .with_argument("epsilon", "ε > 0")
    .with_argument("delta", "δ in [0, 1); 0 selects the pure-ε ICLP mechanism")
    .with_argument("clip", "public norm bound τ (or from the policy bounds)")
    .with_argument("range", "kernel range ρ > 0, default 0.2, or 'auto' (chosen with the penalty from the released count; curves of at most 512 points)")
    .with_argument("penalty", "smoother penalty φ > 0, default 0.1, or 'auto' (chosen from the released count: no extra charge)")
    .with_argument("band_alpha", "level of the simultaneous noise band, in (0, 1), default 0.05")
    .build()
});

fn coerce_curve(t: &DataType) -> Result<DataType> {
    let item = |f: &FieldRef| f.data_type().is_numeric() || f.data_type() == &DataType::Null;
    let float_item = || Arc::new(Field::new_list_field(DataType::Float64, true));
    match t {
        DataType::List(f) if item(f) => Ok(DataType::List(float_item())),
        DataType::LargeList(f) if item(f) => Ok(DataType::LargeList(float_item())),
        DataType::FixedSizeList(f, n) if item(f) => Ok(DataType::FixedSizeList(float_item(), *n)),
        other => Err(PARAMS.error(format!("argument 'curve' must be a list of numbers, got type {other}"))),
    }
}

/// The `private_mean_curve` function (module docs).
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct MeanCurve;

/// The `private_mean_curve` aggregate UDF.
pub type PrivateMeanCurve = PrivateUdaf<MeanCurve>;

impl PrivateSpec for MeanCurve {
    type Call = MeanRun;

    fn params(&self) -> &'static FunctionParams {
        &PARAMS
    }

    fn documentation(&self) -> &'static Documentation {
        &DOCUMENTATION
    }

    fn coerce(&self, _: usize, t: &DataType) -> Result<DataType> {
        coerce_curve(t)
    }

    fn result_fields(&self) -> Fields {
        result_fields()
    }

    fn policy_args(&self) -> PolicyArgs {
        PolicyArgs { clip: Some((0, CLIP_ARG)), curve_length: Some((0, POINTS_ARG)), ..PolicyArgs::default() }
    }

    fn state_fields(&self, function: &str) -> Vec<FieldRef> {
        vec![
            Arc::new(Field::new_list(
                format_state_name(function, "curve_sums"),
                Field::new_list_field(fixed_point_type(), true),
                true,
            )),
            Arc::new(Field::new(format_state_name(function, "count"), DataType::UInt64, true)),
        ]
    }

    fn call(
        &self,
        values: &[Option<ScalarValue>],
        data_types: &[DataType],
        contribution: Contribution,
    ) -> Result<(MeanRun, Budget)> {
        let alpha = PARAMS.band_alpha(values)?;
        let fixed = data_types.first().and_then(fixed_length);
        let (mechanism, cost, auto) = mechanism_from_literals(values, fixed, contribution)?;
        Ok((MeanRun { mechanism, auto, alpha }, cost))
    }
}

/// A validated `private_mean_curve` call: its mechanism, what is chosen at release, and the
/// level of its band.
#[derive(Debug)]
pub struct MeanRun {
    mechanism: MeanCurveMechanism,
    /// `range`/`penalty => 'auto'`: chosen from the released count at release.
    auto: Auto,
    alpha: f64,
}

impl Statistic for MeanAccumulation {
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let state = MeanAccumulation::state(self);
        Ok(vec![fixed_point_state(&state.sums)?, ScalarValue::UInt64(Some(state.count))])
    }

    fn merge(&mut self, function: &str, states: &[ArrayRef]) -> Result<()> {
        let counts = states[1].as_primitive::<UInt64Type>();
        let len = MeanAccumulation::state(self).sums.len();
        for_each_fixed_point_row(function, &states[0], len, |row, sums| {
            MeanAccumulation::merge(self, &MeanState { sums: sums.to_vec(), count: counts.value(row) })
        })
    }

    fn heap_size(&self) -> usize {
        MeanAccumulation::heap_size(self)
    }

    fn flush(&mut self) {
        MeanAccumulation::flush(self)
    }

    fn flush_rows(&self) -> usize {
        MeanAccumulation::flush_rows(self)
    }
}

impl MeanRun {
    /// Adds the rows of a list column given as the flat child values and each row's
    /// `[start, end)` range in them (no per-row array is materialised).
    fn add_rows(
        &self,
        state: &mut MeanAccumulation,
        col: &ArrayRef,
        child: &ArrayRef,
        ranges: impl Iterator<Item = (usize, usize)>,
    ) {
        let values = child.as_primitive::<Float64Type>();
        let flat = values.values();
        let child_nulls = values.nulls().filter(|n| n.null_count() > 0);
        for (i, (start, end)) in ranges.enumerate() {
            if col.is_null(i) {
                continue;
            }
            // A NULL inside the curve makes the row unusable, like a non-finite value.
            if child_nulls.is_some_and(|n| (start..end).any(|k| n.is_null(k))) {
                continue;
            }
            state.add(&self.mechanism, &flat[start..end]);
        }
    }
}

impl Release for MeanRun {
    type Statistic = MeanAccumulation;
    type Output = (MeanRelease, Vec<f64>);

    fn statistic(&self) -> MeanAccumulation {
        MeanAccumulation::new(&self.mechanism)
    }

    fn update(&self, state: &mut MeanAccumulation, values: &[ArrayRef]) -> Result<()> {
        let col = &values[0];
        match col.data_type() {
            DataType::List(_) => {
                let list = col.as_list::<i32>();
                let ranges = list.value_offsets().windows(2).map(|w| (w[0] as usize, w[1] as usize));
                self.add_rows(state, col, list.values(), ranges);
            }
            DataType::LargeList(_) => {
                let list = col.as_list::<i64>();
                let ranges = list.value_offsets().windows(2).map(|w| (w[0] as usize, w[1] as usize));
                self.add_rows(state, col, list.values(), ranges);
            }
            DataType::FixedSizeList(..) => {
                let list = col.as_fixed_size_list();
                let m = list.value_length() as usize;
                let ranges = (0..list.len()).map(|i| {
                    let start = list.value_offset(i) as usize;
                    (start, start + m)
                });
                self.add_rows(state, col, list.values(), ranges);
            }
            other => return internal_err!("{NAME}: unexpected input type {other}"),
        }
        Ok(())
    }

    fn memory_bytes(&self) -> (u64, u64) {
        self.mechanism.memory_bytes()
    }

    fn release(
        &self,
        state: &mut MeanAccumulation,
        mut rng: Option<&mut ChaCha20Rng>,
        cx: &CallContext,
    ) -> Result<(Self::Output, Recipe)> {
        let state = MeanAccumulation::state(state);
        let (mechanism, lifted, n) = if self.auto.any() {
            // The count first; (ρ, φ) are post-processing of it; then the curve with them (the
            // same ε split as any release: the count's share, then the curve's).
            let n = self.mechanism.noisy_count(state, rng.as_deref_mut());
            let (range, penalty) =
                mean_curve::auto_tuning(self.mechanism.spec(), cx.contribution, n, self.auto.range, self.auto.penalty);
            let spec = MeanCurveSpec { range, penalty, ..self.mechanism.spec().clone() };
            // Every candidate was checked to build at planning; fall back to the planned one anyway.
            let m =
                MeanCurveMechanism::with_contribution(spec, cx.contribution).unwrap_or_else(|_| self.mechanism.clone());
            let lifted = m.noisy_curve(state, rng);
            (std::borrow::Cow::Owned(m), lifted, n)
        } else {
            let (lifted, n) = self.mechanism.noisy_coordinates(state, rng);
            (std::borrow::Cow::Borrowed(&self.mechanism), lifted, n)
        };
        // Everything from here on is post-processing of the released coordinates and count.
        let release = mechanism.post_process(&lifted, n);
        let band = mechanism.noise_band(n, self.alpha);
        let recipe = Recipe::MeanCurve {
            spec: mechanism.spec().clone(),
            contribution: cx.contribution,
            alpha: self.alpha,
            lifted,
            n,
            auto: (self.auto.range, self.auto.penalty),
        };
        Ok(((release, band), recipe))
    }

    fn result(&self, (release, band): Self::Output, id: Option<String>) -> Result<ScalarValue> {
        result_value(&release, &band, id)
    }
}
