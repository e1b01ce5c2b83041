//! What `private_kernel_regression` and `private_kernel_classifier` share: their literal
//! parameters, the call (the exact binned statistic between partitions, one release in the
//! final `evaluate`) and the result struct. Each function is a [`FitFunction`]: its kind, its
//! declared parameters and its documentation. The mechanism is
//! [`crate::mechanism::fits::kernel_fit`].

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Array, StringArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::Documentation;
use rand::rngs::ChaCha20Rng;

use super::aggregate::PrivateSpec;
use super::arrays::{float_list, for_each_valid_pair};
use super::call::{CallContext, PolicyArgs};
use super::params::FunctionParams;
use super::release::Release;
use crate::mechanism::fits::kernel_fit::{self, AUTO_COUNT_SHARE, FitLoss, FitRelease, FitSpec, KernelFitMechanism};
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::noise::double_double::DD;
use crate::mechanism::noise::lattice::LatticeMechanism;
use crate::mechanism::stored::Recipe;
use crate::mechanism::sums::BufferedSums;
use crate::mechanism::{Contribution, Grid};

/// One of the two kernel-fit functions: everything else they share.
pub trait FitFunction: fmt::Debug + Default + PartialEq + Eq + Hash + Send + Sync + 'static {
    /// Regression or classifier.
    const KIND: Kind;
    /// The declared parameters.
    fn params() -> &'static FunctionParams;
    /// The reference documentation.
    fn documentation() -> &'static Documentation;
    /// `(data argument, (lo, hi))` of the boxes the policy's bounds supply.
    const BOXES: &'static [(usize, (usize, usize))];
}

impl<F: FitFunction> PrivateSpec for F {
    type Call = FitRun;

    fn params(&self) -> &'static FunctionParams {
        F::params()
    }

    fn documentation(&self) -> &'static Documentation {
        F::documentation()
    }

    fn coerce(&self, i: usize, t: &DataType) -> Result<DataType> {
        let (p, classifier) = (F::params(), F::KIND == Kind::Classifier);
        // Both data arguments are numbers (a label may also be a boolean: true is the positive class).
        if t.is_numeric() || t == &DataType::Null || (i == 0 && classifier && t == &DataType::Boolean) {
            Ok(DataType::Float64)
        } else {
            let what = if i == 0 && classifier { "boolean or numeric" } else { "numeric" };
            Err(p.error(format!("argument '{}' must be {what}, got type {t}", p.data[i])))
        }
    }

    fn result_fields(&self) -> Fields {
        result_fields(F::KIND)
    }

    fn policy_args(&self) -> PolicyArgs {
        PolicyArgs { boxes: F::BOXES, ..PolicyArgs::default() }
    }

    fn state_name(&self) -> &'static str {
        "fit_statistic"
    }

    fn call(
        &self,
        values: &[Option<ScalarValue>],
        _: &[DataType],
        contribution: Contribution,
    ) -> Result<(FitRun, Budget)> {
        let (mechanism, cost, auto_count) = mechanism_from_literals(F::KIND, F::params(), values, contribution)?;
        Ok((FitRun { kind: F::KIND, mechanism, auto_count }, cost))
    }
}

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
    /// The name of the fitted values' field.
    pub fn values_field(self) -> &'static str {
        match self {
            Kind::Regression => "fit",
            Kind::Classifier => "score",
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
    p: &FunctionParams,
    values: &[Option<ScalarValue>],
    contribution: Contribution,
) -> Result<(KernelFitMechanism, Budget, Option<LatticeMechanism>)> {
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

/// A validated kernel-fit call.
#[derive(Debug)]
pub struct FitRun {
    kind: Kind,
    mechanism: KernelFitMechanism,
    /// `penalty => 'auto'`: the noisy count's mechanism.
    auto_count: Option<LatticeMechanism>,
}

impl FitRun {
    /// A call with a fixed penalty (tests).
    pub fn new(kind: Kind, mechanism: KernelFitMechanism) -> Self {
        Self { kind, mechanism, auto_count: None }
    }
}

impl Release for FitRun {
    type Statistic = BufferedSums;
    type Output = (FitRelease, f64);

    fn statistic(&self) -> BufferedSums {
        self.mechanism.accumulation()
    }

    fn merged_statistic(&self) -> BufferedSums {
        self.mechanism.merged_accumulation()
    }

    fn update(&self, state: &mut BufferedSums, values: &[ArrayRef]) -> Result<()> {
        for_each_valid_pair(values, |y, x| self.mechanism.add_all(state, y, x));
        Ok(())
    }

    fn memory_bytes(&self) -> (u64, u64) {
        self.mechanism.memory_bytes()
    }

    fn release(
        &self,
        state: &mut BufferedSums,
        mut rng: Option<&mut ChaCha20Rng>,
        cx: &CallContext,
    ) -> Result<(Self::Output, Recipe)> {
        let state = state.totals();
        let mechanism = match &self.auto_count {
            None => std::borrow::Cow::Borrowed(&self.mechanism),
            Some(count) => {
                // The count first; the penalty is post-processing of it; then the fit.
                let n = count.release(&[DD::from_i128(kernel_fit::row_count(state))], rng.as_deref_mut())[0] as i64;
                let spec = FitSpec {
                    penalty: kernel_fit::auto_penalty(self.mechanism.spec(), n),
                    ..self.mechanism.spec().clone()
                };
                // Larger counts give larger penalties (less noise), which always build; fall back anyway.
                std::borrow::Cow::Owned(
                    KernelFitMechanism::new(spec, cx.contribution).unwrap_or_else(|_| self.mechanism.clone()),
                )
            }
        };
        let coefficients = mechanism.noisy_coefficients(state, rng);
        // Everything from here on is post-processing of the released coefficients.
        let release = mechanism.post_process(&coefficients);
        let penalty = mechanism.spec().penalty;
        let recipe = Recipe::KernelFit {
            spec: mechanism.spec().clone(),
            contribution: cx.contribution,
            coefficients,
            count_epsilon: self
                .auto_count
                .as_ref()
                .map(|_| self.mechanism.spec().epsilon / (1.0 - AUTO_COUNT_SHARE) * AUTO_COUNT_SHARE),
        };
        Ok(((release, penalty), recipe))
    }

    fn result(&self, (release, penalty): Self::Output, id: Option<String>) -> Result<ScalarValue> {
        result_value(self.kind, &release, penalty, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::aggregate::PrivateAccumulator;
    use crate::mechanism::{Calibration, NoiseSource};
    use datafusion::arrow::array::AsArray;
    use datafusion::logical_expr::Accumulator;

    fn accumulator(kind: Kind) -> PrivateAccumulator<FitRun> {
        let cx = CallContext { noise: NoiseSource::TestSeed(5), ..CallContext::default() };
        PrivateAccumulator::new("private_kernel_fit", run(kind), cx)
    }

    fn run(kind: Kind) -> FitRun {
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
        FitRun::new(kind, KernelFitMechanism::new(spec, Contribution::ROW).unwrap())
    }

    #[test]
    fn a_final_phase_merges_into_exact_sums_without_a_buffer() {
        for kind in [Kind::Regression, Kind::Classifier] {
            let ys = (0..40).map(|i| Some(if i % 3 == 0 { 1.0 } else { -1.0 })).collect();
            let values = batch(ys, (0..40).map(|i| Some(i as f64 / 40.0)).collect());
            crate::functions::release::assert_merges_without_buffers(&run(kind), &values);
        }
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
            assert_eq!(merged.statistic().totals(), whole.statistic().totals());
            let mass: i128 = whole.statistic().totals().iter().sum();
            assert_eq!(mass, 3 << 40);
            assert_eq!(merged.evaluate().unwrap(), whole.evaluate().unwrap());
            let ScalarValue::Struct(s) = whole.evaluate().unwrap() else { panic!("a struct") };
            assert_eq!(s.column(1).as_list::<i32>().value(0).len(), 11);
            assert_eq!(s.fields()[1].name(), kind.values_field());
        }
    }
}
