//! Private calls read their data columns only: their literal parameters are bound into the
//! function once, at planning.
//!
//! DataFusion evaluates every argument of an aggregate for every input batch, and a literal
//! becomes a column of copies of itself (`ScalarValue::to_array_of_size`): a KDE call's six
//! parameters wrote six arrays of 8 192 values per batch, more memory traffic than its data
//! column. [`bind_parameters`] rebuilds each private call of an aggregate that reads rows
//! (partial or single phase) with its data columns as its only arguments and its parameters held
//! by the function instance ([`crate::functions::with_parameters`]); the call, its validation, its
//! state and its release are the same. Names, and so the plan's schema, do not change. Applied in
//! one process only: the cluster's codec ships a private call's arguments, not its instance.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_expr::aggregate::{AggregateExprBuilder, AggregateFunctionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateInputMode};

use crate::functions::{params_of, with_parameters};

/// Binds the parameters of every private call in an aggregate that reads rows (module docs).
pub fn bind_parameters(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        if agg.mode().input_mode() != AggregateInputMode::Raw {
            return Ok(Transformed::no(node));
        }
        let mut changed = false;
        let mut aggr = Vec::with_capacity(agg.aggr_expr().len());
        for e in agg.aggr_expr() {
            match bound(e, agg)? {
                Some(b) => {
                    aggr.push(Arc::new(b));
                    changed = true;
                }
                None => aggr.push(Arc::clone(e)),
            }
        }
        if !changed {
            return Ok(Transformed::no(node));
        }
        let rebuilt = AggregateExec::try_new(
            *agg.mode(),
            agg.group_expr().clone(),
            aggr,
            agg.filter_expr().to_vec(),
            Arc::clone(agg.input()),
            agg.input_schema(),
        )?;
        // The same columns under the same names: a parent planned against the old node reads
        // the new one alike.
        if rebuilt.schema() != agg.schema() {
            return Ok(Transformed::no(node));
        }
        Ok(Transformed::yes(Arc::new(rebuilt) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// `e` with its data columns as its only arguments, if it is a private call holding none yet.
fn bound(e: &AggregateFunctionExpr, agg: &AggregateExec) -> Result<Option<AggregateFunctionExpr>> {
    let Some(params) = params_of(e.fun()) else { return Ok(None) };
    let args = e.expressions();
    let Some(fun) = with_parameters(e.fun(), &args)? else { return Ok(None) };
    let mut builder = AggregateExprBuilder::new(Arc::new(fun), args[..params.data_len()].to_vec())
        .schema(agg.input_schema())
        .alias(e.name())
        .with_distinct(e.is_distinct())
        .with_ignore_nulls(e.ignore_nulls())
        .order_by(e.order_bys().to_vec());
    if let Some(display) = e.human_display() {
        builder = builder.human_display(display);
    }
    builder.build().map(Some)
}
