//! Pass: finds every private aggregate call in the plan (also in subqueries) and validates it
//! (SPEC §0, §5): its parameters are literals in their allowed ranges; no `DISTINCT` and no
//! `ORDER BY` inside the call; never used as a window function (`OVER (…)`).

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, Result, plan_err};
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{Expr, LogicalPlan, WindowFunctionDefinition};

use crate::functions::{PrivateCall, is_private, plan_private_call};
use crate::guard::checking::Checking;

/// The pass: the validated calls.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    cx.calls = private_calls(&cx.plan)?;
    Ok(())
}

/// Finds and validates every private aggregate call in `plan` (including subqueries).
pub fn private_calls(plan: &LogicalPlan) -> Result<Vec<PrivateCall>> {
    let mut calls = Vec::new();
    plan.apply_with_subqueries(|node| {
        let empty = DFSchema::empty();
        let inputs = node.inputs();
        let schema = inputs.first().map(|i| i.schema().as_ref()).unwrap_or(&empty);
        node.apply_expressions(|e| {
            e.apply(|e| {
                match e {
                    Expr::AggregateFunction(AggregateFunction { func, params }) => {
                        if let Some(call) = plan_private_call(func, &params.args, schema) {
                            if params.distinct {
                                return plan_err!("{}: DISTINCT is not supported", func.name());
                            }
                            if !params.order_by.is_empty() {
                                return plan_err!("{}: ORDER BY inside the call is not supported", func.name());
                            }
                            calls.push(call?);
                        }
                    }
                    Expr::WindowFunction(w) => {
                        let WindowFunction { fun, .. } = w.as_ref();
                        if let WindowFunctionDefinition::AggregateUDF(f) = fun
                            && is_private(f)
                        {
                            return plan_err!(
                                "{}: cannot be used as a window function (OVER …); \
                                     call it as an aggregate",
                                f.name()
                            );
                        }
                    }
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    Ok(calls)
}
