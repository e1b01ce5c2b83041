//! Which aggregates are private: the registered functions, and how the guard and the cluster
//! codec find a private call's parameters, context and price from an `AggregateUDF`. A new private
//! function is one line in each list here.

use std::sync::Arc;

use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::{AggregateUDF, Expr};
use datafusion::physical_expr::PhysicalExpr;

use super::call::{CallContext, PolicyArgs, PrivateCall, PrivateFunction};
use super::params::FunctionParams;
use super::permits::Permits;
use super::private_cdf::{self, PrivateCdf, PrivateQuantiles};
use super::private_kde::{self, PrivateKde};
use super::private_kde2d::{self, PrivateKde2d};
use super::private_kernel_classifier::{self, PrivateKernelClassifier};
use super::private_kernel_regression::{self, PrivateKernelRegression};
use super::private_mean_curve::{self, PrivateMeanCurve};
use crate::mechanism::NoiseSource;

/// The declared parameters of every private aggregate, for the named-argument rewrite.
pub fn all_params() -> [&'static FunctionParams; 7] {
    [
        &private_cdf::CDF_PARAMS,
        &private_cdf::QUANTILES_PARAMS,
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
        AggregateUDF::from(PrivateCdf::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateQuantiles::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateKde::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateKde2d::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateKernelRegression::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateKernelClassifier::new(noise).with_permits(permits.clone())),
        AggregateUDF::from(PrivateMeanCurve::new(noise).with_permits(permits)),
    ]
}

/// `func` as a private aggregate, or None if it is any other function.
fn as_private(func: &AggregateUDF) -> Option<&dyn PrivateFunction> {
    let inner = func.inner();
    if let Some(f) = inner.downcast_ref::<PrivateCdf>() {
        return Some(f);
    }
    if let Some(f) = inner.downcast_ref::<PrivateQuantiles>() {
        return Some(f);
    }
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

/// The same private call holding the literal parameters of its physical arguments `args` (so its
/// arguments can be its data columns only), or None if `func` is not private or already holds
/// them; an error if a parameter is not a literal.
pub fn with_parameters(func: &AggregateUDF, args: &[Arc<dyn PhysicalExpr>]) -> Result<Option<AggregateUDF>> {
    match as_private(func) {
        Some(f) => f.with_parameters(args),
        None => Ok(None),
    }
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
pub fn params_of(func: &AggregateUDF) -> Option<&'static FunctionParams> {
    as_private(func).map(|f| f.params())
}

/// What the table policy supplies to a private aggregate's omitted arguments, or None if `func` is
/// not private.
pub fn policy_args_of(func: &AggregateUDF) -> Option<PolicyArgs> {
    as_private(func).map(|f| f.policy_args())
}

/// Whether `func` is one of the private aggregates.
pub fn is_private(func: &AggregateUDF) -> bool {
    as_private(func).is_some()
}
