//! One skeleton for every private aggregate. A private function is three things:
//!
//! * a [`PrivateSpec`]: its declared parameters, the types of its data arguments, its result
//!   struct, and how literal parameters become a validated call and the exact budget it costs;
//! * the call's [`Release`] (`release.rs`): the exact, mergeable (fixed-point) [`Statistic`] it
//!   accumulates and the release — noise drawn once, then post-processing — with what the stored
//!   release keeps;
//! * its documentation.
//!
//! Everything else — the UDAF, its call context (noise source, release permits, a privacy unit's
//! contribution bound), planning-time validation and pricing, the accumulator with its permit
//! taken before any noise and its one memoised release — is [`PrivateUdaf`] and
//! [`PrivateAccumulator`], written once here (and, under GROUP BY, `groups.rs`).

use std::fmt;
use std::hash::Hash;
use std::mem::size_of_val;
use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::{DFSchema, Result, ScalarValue, internal_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, Expr, ExprSchemable, GroupsAccumulator, Signature,
};

use datafusion::physical_expr::PhysicalExpr;

use super::arrays::fixed_point_type;
use super::call::{CallContext, PolicyArgs, PrivateCall, PrivateFunction};
use super::groups::PrivateGroups;
use super::params::FunctionParams;
use super::permits::Permits;
use super::release::{Release, Statistic, release_statistic};
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::{Contribution, NoiseSource};

/// What one private aggregate function is (module docs).
pub trait PrivateSpec: fmt::Debug + Default + PartialEq + Eq + Hash + Send + Sync + 'static {
    /// A validated call: its mechanism for given literal parameters.
    type Call: Release;

    /// The declared parameters; `params().function` is the SQL name.
    fn params(&self) -> &'static FunctionParams;

    /// The reference documentation.
    fn documentation(&self) -> &'static Documentation;

    /// The type data argument `i` is coerced to, or why `t` is refused (default: any number, as
    /// Float64).
    fn coerce(&self, i: usize, t: &DataType) -> Result<DataType> {
        let p = self.params();
        if t.is_numeric() || t == &DataType::Null {
            Ok(DataType::Float64)
        } else {
            Err(p.error(format!("argument '{}' must be numeric, got type {t}", p.data[i])))
        }
    }

    /// The fields of the result struct.
    fn result_fields(&self) -> Fields;

    /// What the table policy supplies when a call omits it (default: nothing).
    fn policy_args(&self) -> PolicyArgs {
        PolicyArgs::default()
    }

    /// The name of the accumulator state's fixed-point list (functions whose [`Statistic`] has
    /// more columns give [`PrivateSpec::state_fields`] instead).
    fn state_name(&self) -> &'static str {
        "statistic"
    }

    /// The accumulator state's columns.
    fn state_fields(&self, function: &str) -> Vec<FieldRef> {
        vec![Arc::new(Field::new_list(
            format_state_name(function, self.state_name()),
            Field::new_list_field(fixed_point_type(), true),
            true,
        ))]
    }

    /// Validates the literal parameters (`values`, positional) for data arguments of
    /// `data_types` and returns the call with the exact budget one release spends; calibrated
    /// for `contribution`. Runs at planning time and again for every accumulator.
    fn call(
        &self,
        values: &[Option<ScalarValue>],
        data_types: &[DataType],
        contribution: Contribution,
    ) -> Result<(Self::Call, Budget)>;
}

/// The aggregate UDF of a private function: its spec and what the guard decided for this call.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PrivateUdaf<S: PrivateSpec> {
    spec: S,
    signature: Signature,
    cx: CallContext,
    /// The call's literal parameters, when its physical arguments are its data columns only
    /// ([`PrivateFunction::with_parameters`]); None when they are in its arguments.
    parameters: Option<Vec<Option<ScalarValue>>>,
}

impl<S: PrivateSpec> Default for PrivateUdaf<S> {
    fn default() -> Self {
        Self::new(NoiseSource::Os)
    }
}

impl<S: PrivateSpec> PrivateUdaf<S> {
    /// The function, its releases drawing randomness from `noise`.
    pub fn new(noise: NoiseSource) -> Self {
        let spec = S::default();
        let signature = spec.params().signature();
        Self { spec, signature, cx: CallContext { noise, ..Default::default() }, parameters: None }
    }

    /// The same function whose releases need `permits`.
    pub fn with_permits(self, permits: Permits) -> Self {
        Self { cx: CallContext { permits, ..self.cx }, ..self }
    }

    /// What the guard decided for this call.
    pub fn context(&self) -> &CallContext {
        &self.cx
    }

    /// The UDF, ready to register.
    pub fn udaf(noise: NoiseSource) -> AggregateUDF {
        AggregateUDF::from(Self::new(noise))
    }

    /// The call of a physical aggregate expression (validated again).
    fn physical_call(&self, args: &AccumulatorArgs) -> Result<S::Call> {
        let p = self.spec.params();
        p.check_accumulator_args(args)?;
        let values = match &self.parameters {
            Some(values) if args.exprs.len() == p.data_len() => values.clone(),
            Some(_) => return internal_err!("{}: parameters given twice", p.function),
            None => p.literals_from_physical(args.exprs)?,
        };
        let data_types: Vec<DataType> =
            args.expr_fields.iter().take(p.data.len()).map(|f| f.data_type().clone()).collect();
        Ok(self.call(&values, &data_types)?.0)
    }

    /// The call for literal `values` and data arguments of `data_types`.
    pub fn call(&self, values: &[Option<ScalarValue>], data_types: &[DataType]) -> Result<(S::Call, Budget)> {
        self.spec.call(values, data_types, self.cx.contribution)
    }
}

impl<S: PrivateSpec> PrivateFunction for PrivateUdaf<S> {
    fn params(&self) -> &'static FunctionParams {
        self.spec.params()
    }

    fn context(&self) -> &CallContext {
        &self.cx
    }

    fn policy_args(&self) -> PolicyArgs {
        self.spec.policy_args()
    }

    fn with_context(&self, cx: CallContext) -> AggregateUDF {
        let parameters = self.parameters.clone();
        AggregateUDF::from(Self { spec: S::default(), signature: self.signature.clone(), cx, parameters })
    }

    fn with_parameters(&self, args: &[Arc<dyn PhysicalExpr>]) -> Result<Option<AggregateUDF>> {
        if self.parameters.is_some() {
            return Ok(None);
        }
        let parameters = Some(self.spec.params().literals_from_physical(args)?);
        let (signature, cx) = (self.signature.clone(), self.cx.clone());
        Ok(Some(AggregateUDF::from(Self { spec: S::default(), signature, cx, parameters })))
    }

    fn plan(&self, args: &[Expr], schema: &DFSchema) -> Result<PrivateCall> {
        let p = self.spec.params();
        let values = p.literals_from_logical(args)?;
        let data_types: Vec<DataType> =
            args.iter().take(p.data.len()).map(|a| a.get_type(schema).unwrap_or(DataType::Null)).collect();
        let (call, cost) = self.call(&values, &data_types)?;
        let (state_bytes, work_bytes) = call.memory_bytes();
        Ok(PrivateCall { function: p.function, cost, state_bytes, work_bytes })
    }
}

impl<S: PrivateSpec> AggregateUDFImpl for PrivateUdaf<S> {
    fn name(&self) -> &str {
        self.spec.params().function
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.spec.params().coerce(|i, t| self.spec.coerce(i, t), arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Struct(self.spec.result_fields()))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(self.spec.state_fields(args.name))
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let call = self.physical_call(&args)?;
        Ok(Box::new(PrivateAccumulator::new(self.spec.params().function, call, self.cx.clone())))
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let call = self.physical_call(&args)?;
        let function = self.spec.params().function;
        let state_types = self.spec.state_fields(function).iter().map(|f| f.data_type().clone()).collect();
        let result_type = DataType::Struct(self.spec.result_fields());
        Ok(Box::new(PrivateGroups::new(function, call, self.cx.clone(), result_type, state_types)))
    }

    fn documentation(&self) -> Option<&Documentation> {
        Some(self.spec.documentation())
    }
}

/// Accumulates a call's exact statistic; releases once (SPEC §5.1: one paid execution, one
/// release — the permit is taken before any noise is drawn, and a repeated evaluation returns
/// the same release).
#[derive(Debug)]
pub struct PrivateAccumulator<C: Release> {
    function: &'static str,
    call: C,
    statistic: C::Statistic,
    cx: CallContext,
    released: Option<ScalarValue>,
}

impl<C: Release> PrivateAccumulator<C> {
    /// A fresh accumulator for a validated call.
    pub fn new(function: &'static str, call: C, cx: CallContext) -> Self {
        let statistic = call.statistic();
        Self { function, call, statistic, cx, released: None }
    }

    /// The validated call.
    pub fn call(&self) -> &C {
        &self.call
    }

    /// The statistic accumulated so far.
    pub fn statistic(&mut self) -> &mut C::Statistic {
        &mut self.statistic
    }
}

impl<C: Release> Accumulator for PrivateAccumulator<C> {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.call.update(&mut self.statistic, values)
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.statistic.merge(self.function, states)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.statistic.state()
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        if self.released.is_none() {
            self.released = Some(release_statistic(self.function, &self.call, &mut self.statistic, &self.cx)?);
        }
        Ok(self.released.clone().expect("set above"))
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.statistic.heap_size()
    }
}
