//! What `private_kernel_regression` and `private_kernel_classifier` share: their literal
//! parameters, the accumulator (the exact binned statistic between partitions, one release in
//! the final `evaluate`) and the result struct. The mechanism is
//! [`crate::mechanism::kernel_fit`].

use std::mem::size_of_val;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, StringArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::{Result, ScalarValue, exec_datafusion_err};
use datafusion::logical_expr::function::StateFieldsArgs;
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, Expr};

use super::params::FunctionParams;
use super::{
    PrivateCall, fixed_point_state, fixed_point_type, float_list, for_each_fixed_point_row, for_each_valid_pair,
};
use crate::functions::CallContext;
use crate::mechanism::budget::Budget;
use crate::mechanism::kernel_fit::{
    self, AUTO_COUNT_SHARE, FitAccumulation, FitLoss, FitRelease, FitSpec, KernelFitMechanism,
};
use crate::mechanism::lattice::{DD, LatticeMechanism};
use crate::mechanism::stored::Recipe;
use crate::mechanism::{Contribution, Grid};

/// Declares one of the two kernel-fit UDAFs (they differ only in their [`Kind`]): the struct via
/// `private_aggregate!` and its `AggregateUDFImpl`. The module must have `NAME`, `PARAMS` and
/// `DOCUMENTATION`.
macro_rules! kernel_fit_udaf {
    ($(#[$doc:meta])* $ty:ident, $kind:expr) => {
        private_aggregate!(
            $(#[$doc])*
            $ty,
            |args, _, contribution| $crate::functions::kernel_fit::plan_call($kind, args, contribution)
        );

        impl datafusion::logical_expr::AggregateUDFImpl for $ty {
            fn name(&self) -> &str {
                NAME
            }

            fn signature(&self) -> &datafusion::logical_expr::Signature {
                &self.signature
            }

            fn coerce_types(
                &self,
                arg_types: &[datafusion::arrow::datatypes::DataType],
            ) -> datafusion::common::Result<Vec<datafusion::arrow::datatypes::DataType>> {
                $crate::functions::kernel_fit::coerce_types($kind, arg_types)
            }

            fn return_type(
                &self,
                _arg_types: &[datafusion::arrow::datatypes::DataType],
            ) -> datafusion::common::Result<datafusion::arrow::datatypes::DataType> {
                Ok(datafusion::arrow::datatypes::DataType::Struct($crate::functions::kernel_fit::result_fields($kind)))
            }

            fn state_fields(
                &self,
                args: datafusion::logical_expr::function::StateFieldsArgs,
            ) -> datafusion::common::Result<Vec<datafusion::arrow::datatypes::FieldRef>> {
                $crate::functions::kernel_fit::state_fields(args)
            }

            fn accumulator(
                &self,
                args: datafusion::logical_expr::function::AccumulatorArgs,
            ) -> datafusion::common::Result<Box<dyn datafusion::logical_expr::Accumulator>> {
                use $crate::functions::kernel_fit::{FitAccumulator, mechanism_from_literals};
                PARAMS.check_accumulator_args(&args)?;
                let values = PARAMS.literals_from_physical(args.exprs)?;
                let (mechanism, _, count) = mechanism_from_literals($kind, &values, self.cx.contribution)?;
                Ok(Box::new(FitAccumulator::new($kind, mechanism, self.cx.clone()).with_auto_count(count)))
            }

            fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
                Some(&DOCUMENTATION)
            }
        }
    };
}
pub(crate) use kernel_fit_udaf;

/// Default number of grid points of the fitted function.
pub const DEFAULT_POINTS: usize = 101;
/// Most grid points.
pub const MAX_POINTS: usize = 4096;
/// Default bandwidth as a fraction of hi − lo.
pub const DEFAULT_BANDWIDTH_FRACTION: f64 = 0.05;
/// Default penalty Λ of the unnormalised objective.
pub const DEFAULT_PENALTY: f64 = 100.0;
/// Default smoothing of the classifier's hinge.
pub const DEFAULT_SMOOTHING: f64 = 0.1;

/// Which of the two functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `private_kernel_regression(y, x, …)`.
    Regression,
    /// `private_kernel_classifier(label, x, …)`.
    Classifier,
}

impl Kind {
    /// The SQL name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Regression => super::private_kernel_regression::NAME,
            Kind::Classifier => super::private_kernel_classifier::NAME,
        }
    }

    /// The name of the fitted values' field.
    pub fn values_field(self) -> &'static str {
        match self {
            Kind::Regression => "fit",
            Kind::Classifier => "score",
        }
    }

    fn params(self) -> &'static FunctionParams {
        match self {
            Kind::Regression => &super::private_kernel_regression::PARAMS,
            Kind::Classifier => &super::private_kernel_classifier::PARAMS,
        }
    }

    /// The kind of a stored release's loss.
    pub fn of(loss: FitLoss) -> Self {
        match loss {
            FitLoss::Huber(_) => Kind::Regression,
            FitLoss::Hinge(_) => Kind::Classifier,
        }
    }
}

/// Turns literal parameter values into a validated mechanism and the exact budget a release
/// costs (planning time; again when an accumulator is created).
pub fn mechanism_from_literals(
    kind: Kind,
    values: &[Option<ScalarValue>],
    contribution: Contribution,
) -> Result<(KernelFitMechanism, Budget, Option<LatticeMechanism>)> {
    let p = kind.params();
    let epsilon = p.epsilon(values)?;
    let delta = p.required_float(values, "delta")?;
    if !(0.0..1.0).contains(&delta) {
        return Err(p.error(format!(
            "argument 'delta' must be in [0, 1) (0 selects the pure-ε Laplace-process release), got {delta}"
        )));
    }
    let (lo, hi) = p.interval(values, "lo", "hi", "x")?;
    let positive = |name: &str, default: f64| -> Result<f64> {
        match p.float(values, name)? {
            None => Ok(default),
            Some(v) if v.is_finite() && v > 0.0 => Ok(v),
            Some(v) => Err(p.error(format!("argument '{name}' must be a finite number > 0, got {v}"))),
        }
    };
    let bandwidth = positive("bandwidth", DEFAULT_BANDWIDTH_FRACTION * (hi - lo))?;
    let auto_penalty = p.is_auto(values, "penalty")?;
    let penalty = if auto_penalty { DEFAULT_PENALTY } else { positive("penalty", DEFAULT_PENALTY)? };
    let points = p.int(values, "points", (2, MAX_POINTS as i64))?.map_or(DEFAULT_POINTS, |v| v as usize);
    let (loss, y_range) = match kind {
        Kind::Regression => {
            let (lo_y, hi_y) = p.interval(values, "lo_y", "hi_y", "y")?;
            (FitLoss::Huber(positive("huber", (hi_y - lo_y) / 2.0)?), (lo_y, hi_y))
        }
        Kind::Classifier => (FitLoss::Hinge(positive("smoothing", DEFAULT_SMOOTHING)?), (-1.0, 1.0)),
    };
    let calibration = p.calibration(values, epsilon)?;
    let cost = Budget::charge(epsilon, delta).map_err(|e| p.error(e))?;
    // 'auto': a share of ε buys a noisy row count, the penalty is the rule's value for it (chosen
    // at release); validated here at the smallest value the rule can give (a count ≤ 1), which
    // adds the most noise.
    let (fit_epsilon, count) = if auto_penalty {
        let eps_n = AUTO_COUNT_SHARE * cost.calibration_epsilon();
        let count = LatticeMechanism::integer_laplace_over(eps_n, contribution.count_l1()).map_err(|e| p.error(e))?;
        (cost.calibration_epsilon() - eps_n, Some(count))
    } else {
        (cost.calibration_epsilon(), None)
    };
    let mut spec = FitSpec {
        grid: Grid { lo, hi, points },
        bandwidth,
        penalty,
        loss,
        y_range,
        epsilon: fit_epsilon,
        delta: cost.calibration_delta(),
        calibration,
    };
    if auto_penalty {
        spec.penalty = kernel_fit::auto_penalty(&spec, 1);
    }
    Ok((KernelFitMechanism::new(spec, contribution).map_err(|e| p.error(e))?, cost, count))
}

/// Validates a logical call at planning time and returns what it costs.
pub fn plan_call(kind: Kind, args: &[Expr], contribution: Contribution) -> Result<PrivateCall> {
    let values = kind.params().literals_from_logical(args)?;
    let (mechanism, cost, _) = mechanism_from_literals(kind, &values, contribution)?;
    let (state_bytes, work_bytes) = mechanism.memory_bytes();
    Ok(PrivateCall { function: kind.name(), cost, state_bytes, work_bytes })
}

/// Both data arguments are numbers (a label may also be a boolean: true is the positive class).
pub fn coerce_types(kind: Kind, arg_types: &[DataType]) -> Result<Vec<DataType>> {
    let p = kind.params();
    p.coerce(
        |i, t| {
            if t.is_numeric() || t == &DataType::Null || (i == 0 && kind == Kind::Classifier && t == &DataType::Boolean)
            {
                Ok(DataType::Float64)
            } else {
                let what = if i == 0 && kind == Kind::Classifier { "boolean or numeric" } else { "numeric" };
                Err(p.error(format!("argument '{}' must be {what}, got type {t}", p.data[i])))
            }
        },
        arg_types,
    )
}

/// The fields of the result struct.
pub fn result_fields(kind: Kind) -> Fields {
    Fields::from(vec![
        Field::new_list("x", Field::new_list_field(DataType::Float64, true), true),
        Field::new_list(kind.values_field(), Field::new_list_field(DataType::Float64, true), true),
        Field::new("penalty", DataType::Float64, true),
        Field::new("release", DataType::Utf8, true),
    ])
}

/// The result struct of a release (also what `release(id)` re-reads).
pub fn result_value(kind: Kind, release: &FitRelease, penalty: f64, id: Option<String>) -> Result<ScalarValue> {
    let columns: Vec<ArrayRef> = vec![
        float_list(Some(release.x.clone())),
        float_list(Some(release.fit.clone())),
        Arc::new(Float64Array::from(vec![penalty])),
        Arc::new(StringArray::from(vec![id])),
    ];
    Ok(ScalarValue::Struct(Arc::new(StructArray::try_new(result_fields(kind), columns, None)?)))
}

/// The accumulator state: the exact statistic as one fixed-point list.
pub fn state_fields(args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
    Ok(vec![Arc::new(Field::new_list(
        format_state_name(args.name, "fit_statistic"),
        Field::new_list_field(fixed_point_type(), true),
        true,
    ))])
}

/// Accumulates the exact statistic; releases once.
#[derive(Debug)]
pub struct FitAccumulator {
    kind: Kind,
    mechanism: KernelFitMechanism,
    /// `penalty => 'auto'`: the noisy count's mechanism.
    auto_count: Option<LatticeMechanism>,
    state: FitAccumulation,
    cx: CallContext,
    released: Option<ScalarValue>,
}

impl FitAccumulator {
    /// A fresh accumulator for a validated call.
    pub fn new(kind: Kind, mechanism: KernelFitMechanism, cx: CallContext) -> Self {
        let state = mechanism.accumulation();
        Self { kind, mechanism, auto_count: None, state, cx, released: None }
    }

    /// With `penalty => 'auto'`: the count's mechanism.
    pub fn with_auto_count(self, count: Option<LatticeMechanism>) -> Self {
        Self { auto_count: count, ..self }
    }

    fn release(&mut self) -> Result<ScalarValue> {
        let name = self.kind.name();
        // One paid execution, one release: the permit is taken before any noise is drawn.
        self.cx.permits.take(name)?;
        let state = self.state.totals();
        let mut rng = self.cx.noise.release_rng().map_err(|e| exec_datafusion_err!("{name}: {e}"))?;
        let mechanism = match &self.auto_count {
            None => std::borrow::Cow::Borrowed(&self.mechanism),
            Some(count) => {
                // The count first; the penalty is post-processing of it; then the fit.
                let n = count.release(&[DD::from_i128(kernel_fit::row_count(state))], rng.as_mut())[0] as i64;
                let spec = FitSpec {
                    penalty: kernel_fit::auto_penalty(self.mechanism.spec(), n),
                    ..self.mechanism.spec().clone()
                };
                // Larger counts give larger penalties (less noise), which always build; fall back anyway.
                std::borrow::Cow::Owned(
                    KernelFitMechanism::new(spec, self.cx.contribution).unwrap_or_else(|_| self.mechanism.clone()),
                )
            }
        };
        let coefficients = mechanism.noisy_coefficients(state, rng.as_mut());
        // Everything from here on is post-processing of the released coefficients.
        let release = mechanism.post_process(&coefficients);
        let penalty = mechanism.spec().penalty;
        let recipe = Recipe::KernelFit {
            spec: mechanism.spec().clone(),
            contribution: self.cx.contribution,
            coefficients,
            count_epsilon: self
                .auto_count
                .as_ref()
                .map(|_| self.mechanism.spec().epsilon / (1.0 - AUTO_COUNT_SHARE) * AUTO_COUNT_SHARE),
        };
        let id = self.cx.permits.keep(name, &recipe)?;
        result_value(self.kind, &release, penalty, id)
    }
}

impl Accumulator for FitAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let (mechanism, state) = (&self.mechanism, &mut self.state);
        for_each_valid_pair(values, |y, x| mechanism.add_all(state, y, x));
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let state = &mut self.state;
        for_each_fixed_point_row(self.kind.name(), &states[0], self.mechanism.state_len(), |_, part| state.merge(part))
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![fixed_point_state(self.state.totals())?])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        if self.released.is_none() {
            self.released = Some(self.release()?);
        }
        Ok(self.released.clone().expect("set above"))
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.state.heap_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mechanism::{Calibration, NoiseSource};
    use datafusion::arrow::array::AsArray;

    fn accumulator(kind: Kind) -> FitAccumulator {
        let loss = if kind == Kind::Regression { FitLoss::Huber(1.0) } else { FitLoss::Hinge(0.1) };
        let spec = FitSpec {
            grid: Grid { lo: 0.0, hi: 1.0, points: 11 },
            bandwidth: 0.1,
            penalty: 10.0,
            loss,
            y_range: (-1.0, 1.0),
            epsilon: 1.0,
            delta: 1e-6,
            calibration: Calibration::Analytic,
        };
        let cx = CallContext { noise: NoiseSource::TestSeed(5), ..CallContext::default() };
        FitAccumulator::new(kind, KernelFitMechanism::new(spec, Contribution::ROW).unwrap(), cx)
    }

    fn batch(ys: Vec<Option<f64>>, xs: Vec<Option<f64>>) -> [ArrayRef; 2] {
        [Arc::new(Float64Array::from(ys)), Arc::new(Float64Array::from(xs))]
    }

    #[test]
    fn state_round_trips_through_merge_and_nulls_drop_rows() {
        for kind in [Kind::Regression, Kind::Classifier] {
            let mut a = accumulator(kind);
            a.update_batch(&batch(vec![Some(0.5), None, Some(-0.2)], vec![Some(0.1), Some(0.4), Some(0.6)])).unwrap();
            let mut b = accumulator(kind);
            b.update_batch(&batch(vec![Some(1.0), Some(0.3)], vec![Some(0.9), None])).unwrap();
            let mut whole = accumulator(kind);
            whole
                .update_batch(&batch(vec![Some(0.5), Some(-0.2), Some(1.0)], vec![Some(0.1), Some(0.6), Some(0.9)]))
                .unwrap();
            let mut merged = accumulator(kind);
            for acc in [&mut a, &mut b] {
                let state: Vec<ArrayRef> = acc.state().unwrap().iter().map(|s| s.to_array().unwrap()).collect();
                merged.merge_batch(&state).unwrap();
            }
            assert_eq!(merged.state.totals(), whole.state.totals());
            let mass: i128 = whole.state.totals().iter().sum();
            assert_eq!(mass, 3 << 40);
            assert_eq!(merged.evaluate().unwrap(), whole.evaluate().unwrap());
            let ScalarValue::Struct(s) = whole.evaluate().unwrap() else { panic!("a struct") };
            assert_eq!(s.column(1).as_list::<i32>().value(0).len(), 11);
            assert_eq!(s.fields()[1].name(), kind.values_field());
        }
    }
}
