//! DataFusion glue: the private aggregate UDFs, their literal parameters, and the
//! rewrite that lets optional arguments be named in any combination.

/// Declares a private aggregate UDF type: the struct (its signature and [`CallContext`]),
/// `Default` (OS noise), `new(noise)`, `with_permits`, `context`, `clone_with`, `udaf`, and its
/// [`PrivateFunction`] impl, which validates and prices a call with
/// `$plan(args, schema, contribution)`. The module must have `PARAMS` and import what it names.
macro_rules! private_aggregate {
    ($(#[$doc:meta])* $name:ident, $plan:expr) => {
        $(#[$doc])*
        #[derive(Debug, PartialEq, Eq, Hash)]
        pub struct $name {
            signature: datafusion::logical_expr::Signature,
            cx: crate::functions::CallContext,
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new(crate::mechanism::NoiseSource::Os)
            }
        }

        impl $name {
            /// The function, its releases drawing randomness from `noise`.
            pub fn new(noise: crate::mechanism::NoiseSource) -> Self {
                let cx = crate::functions::CallContext { noise, ..Default::default() };
                Self { signature: PARAMS.signature(), cx }
            }

            /// The same function whose releases need `permits`.
            pub fn with_permits(self, permits: crate::functions::Permits) -> Self {
                Self { cx: crate::functions::CallContext { permits, ..self.cx }, ..self }
            }

            /// What the guard decided for this call.
            pub fn context(&self) -> &crate::functions::CallContext {
                &self.cx
            }

            /// A copy with another call context.
            pub fn clone_with(&self, cx: crate::functions::CallContext) -> Self {
                Self { signature: self.signature.clone(), cx }
            }

            /// The UDF, ready to register.
            pub fn udaf(noise: crate::mechanism::NoiseSource) -> datafusion::logical_expr::AggregateUDF {
                datafusion::logical_expr::AggregateUDF::from(Self::new(noise))
            }
        }

        impl crate::functions::PrivateFunction for $name {
            fn params(&self) -> &'static crate::functions::params::FunctionParams {
                &PARAMS
            }

            fn context(&self) -> &crate::functions::CallContext {
                &self.cx
            }

            fn with_context(&self, cx: crate::functions::CallContext) -> datafusion::logical_expr::AggregateUDF {
                datafusion::logical_expr::AggregateUDF::from(self.clone_with(cx))
            }

            fn plan(
                &self,
                args: &[datafusion::logical_expr::Expr],
                schema: &datafusion::common::DFSchema,
            ) -> datafusion::common::Result<crate::functions::PrivateCall> {
                let plan: fn(
                    &[datafusion::logical_expr::Expr],
                    &datafusion::common::DFSchema,
                    crate::mechanism::Contribution,
                ) -> datafusion::common::Result<crate::functions::PrivateCall> = $plan;
                plan(args, schema, self.cx.contribution)
            }
        }
    };
}

pub mod kernel_fit;
pub mod named_args;
pub mod params;
pub mod permits;
pub mod post;
pub mod private_kde;
pub mod private_kde2d;
pub mod private_kernel_classifier;
pub mod private_kernel_regression;
pub mod private_mean_curve;
pub mod releases;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, Float64Array, ListArray};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Field};
use datafusion::common::{DFSchema, Result, ScalarValue, internal_err};
use datafusion::logical_expr::{AggregateUDF, Expr};

use crate::mechanism::budget::Budget;
use crate::mechanism::{Contribution, NoiseSource};
pub use permits::{PermitSlot, Permits, ReleaseStore, SlotCharge};
pub use private_kde::PrivateKde;
pub use private_kde2d::PrivateKde2d;
pub use private_kernel_classifier::PrivateKernelClassifier;
pub use private_kernel_regression::PrivateKernelRegression;
pub use private_mean_curve::PrivateMeanCurve;

/// One private aggregate call found in a plan, with the budget it spends.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivateCall {
    /// SQL name of the function.
    pub function: &'static str,
    /// The exact budget one release spends.
    pub cost: Budget,
    /// Bytes of one accumulator's state (a query holds one per partition, plus the final).
    pub state_bytes: u64,
    /// Bytes the release needs once (basis, transforms).
    pub work_bytes: u64,
}

impl PrivateCall {
    /// Memory the call needs with `partitions` partial accumulators (bytes).
    pub fn memory_bytes(&self, partitions: usize) -> u64 {
        self.state_bytes.saturating_mul(partitions as u64 + 1).saturating_add(self.work_bytes)
    }
}

/// The declared parameters of every private aggregate, for the named-argument rewrite.
pub fn all_params() -> [&'static params::FunctionParams; 5] {
    [
        &private_kde::PARAMS,
        &private_kde2d::PARAMS,
        &private_mean_curve::PARAMS,
        &private_kernel_regression::PARAMS,
        &private_kernel_classifier::PARAMS,
    ]
}

/// All private aggregate UDFs, drawing noise from `noise`, with `permits` (catalog
/// sessions: [`Permits::Denied`] until the guard assigns each call a slot).
pub fn private_udafs(noise: NoiseSource, permits: Permits) -> Vec<AggregateUDF> {
    vec![
        AggregateUDF::from(PrivateKde::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateKde2d::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateKernelRegression::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateKernelClassifier::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateMeanCurve::new(noise).with_permits(permits)),
    ]
}

/// What the guard decided for one private aggregate call, carried by its UDF instance: where
/// its noise comes from, its release permits, and the contribution bound of a privacy unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CallContext {
    /// Randomness of the release.
    pub noise: NoiseSource,
    /// Releases the call may make.
    pub permits: Permits,
    /// How far one privacy unit can move the release (SPEC §7).
    pub contribution: Contribution,
}

/// What the guard needs of every private aggregate, whichever function it is.
pub(crate) trait PrivateFunction: Send + Sync {
    /// The declared parameters.
    fn params(&self) -> &'static params::FunctionParams;
    /// What the guard decided for this instance.
    fn context(&self) -> &CallContext;
    /// The same function with another call context.
    fn with_context(&self, cx: CallContext) -> AggregateUDF;
    /// Validates a logical call's literal arguments (planning time) and prices it; `schema` is
    /// the input schema of the node holding the call.
    fn plan(&self, args: &[Expr], schema: &DFSchema) -> Result<PrivateCall>;
}

/// `func` as a private aggregate, or None if it is any other function.
fn as_private(func: &AggregateUDF) -> Option<&dyn PrivateFunction> {
    let inner = func.inner();
    if let Some(f) = inner.downcast_ref::<PrivateKde>() {
        return Some(f);
    }
    if let Some(f) = inner.downcast_ref::<PrivateKde2d>() {
        return Some(f);
    }
    if let Some(f) = inner.downcast_ref::<PrivateKernelRegression>() {
        return Some(f);
    }
    if let Some(f) = inner.downcast_ref::<PrivateKernelClassifier>() {
        return Some(f);
    }
    inner.downcast_ref::<PrivateMeanCurve>().map(|f| f as &dyn PrivateFunction)
}

/// The call context of a private aggregate instance, or None if `func` is not private.
pub fn context_of(func: &AggregateUDF) -> Option<&CallContext> {
    as_private(func).map(|f| f.context())
}

/// The permits of a private aggregate instance, or None if `func` is not private.
pub fn permits_of(func: &AggregateUDF) -> Option<&Permits> {
    context_of(func).map(|c| &c.permits)
}

/// The same private aggregate with another call context, or None if `func` is not private.
pub fn with_context(func: &AggregateUDF, cx: CallContext) -> Option<AggregateUDF> {
    as_private(func).map(|f| f.with_context(cx))
}

/// The same private aggregate with other permits, or None if `func` is not private.
pub fn with_permits(func: &AggregateUDF, permits: Permits) -> Option<AggregateUDF> {
    with_context(func, CallContext { permits, ..context_of(func)?.clone() })
}

/// If `func` is a private aggregate, validates its literal arguments (planning time) and
/// returns what the call spends. `None` for every other function. `schema` is the input
/// schema of the node holding the call (it gives the data argument's type).
pub fn plan_private_call(func: &AggregateUDF, args: &[Expr], schema: &DFSchema) -> Option<Result<PrivateCall>> {
    as_private(func).map(|f| f.plan(args, schema))
}

/// The declared parameters of a private aggregate, or None if `func` is not private.
pub fn params_of(func: &AggregateUDF) -> Option<&'static params::FunctionParams> {
    as_private(func).map(|f| f.params())
}

/// Whether `func` is one of the private aggregates.
pub fn is_private(func: &AggregateUDF) -> bool {
    as_private(func).is_some()
}

/// Type of fixed-point statistics in accumulator state (i128 as Decimal128(38, 0)).
pub(crate) fn fixed_point_type() -> DataType {
    DataType::Decimal128(38, 0)
}

/// A fixed-point statistic as a one-row list state value.
pub(crate) fn fixed_point_state(values: &[i128]) -> Result<ScalarValue> {
    let values = Decimal128Array::from(values.to_vec()).with_data_type(fixed_point_type());
    let field = Arc::new(Field::new_list_field(fixed_point_type(), true));
    let list = ListArray::try_new(field, OffsetBuffer::from_lengths([values.len()]), Arc::new(values), None)?;
    Ok(ScalarValue::List(Arc::new(list)))
}

/// Calls `f(row, values)` for every non-null row of a fixed-point list state column,
/// checking each has `len` entries.
pub(crate) fn for_each_fixed_point_row(
    function: &str,
    states: &ArrayRef,
    len: usize,
    mut f: impl FnMut(usize, &[i128]),
) -> Result<()> {
    let lists = states.as_list::<i32>();
    for row in 0..lists.len() {
        if lists.is_null(row) {
            continue;
        }
        let part = lists.value(row);
        let part = part.as_primitive::<Decimal128Type>();
        if part.len() != len {
            return internal_err!("{function}: partial statistic has {} entries, expected {len}", part.len());
        }
        f(row, part.values());
    }
    Ok(())
}

/// Calls `f(first, second)` on the runs of rows where both Float64 columns are non-null (the
/// two data arguments of a private aggregate; NULL in either drops the row).
pub(crate) fn for_each_valid_pair(values: &[ArrayRef], mut f: impl FnMut(&[f64], &[f64])) {
    use datafusion::arrow::datatypes::Float64Type;
    let (a, b) = (values[0].as_primitive::<Float64Type>(), values[1].as_primitive::<Float64Type>());
    let (x, y) = (a.values(), b.values());
    match NullBuffer::union(a.nulls(), b.nulls()).filter(|n| n.null_count() > 0) {
        None => f(x, y),
        Some(nulls) => {
            for (start, end) in nulls.valid_slices() {
                f(&x[start..end], &y[start..end]);
            }
        }
    }
}

/// A one-row `List<Float64>` array (a NULL list for `None`).
pub(crate) fn float_list(values: Option<Vec<f64>>) -> ArrayRef {
    let field = Arc::new(Field::new_list_field(DataType::Float64, true));
    let (len, nulls) = match &values {
        Some(v) => (v.len(), None),
        None => (0, Some(NullBuffer::new_null(1))),
    };
    let items = Float64Array::from(values.unwrap_or_default());
    Arc::new(ListArray::new(field, OffsetBuffer::from_lengths([len]), Arc::new(items), nulls))
}
