//! The planner guard: checks every private aggregate call in the *optimized* logical plan
//! before any physical plan exists, so parameter mistakes and forbidden uses fail at
//! planning time, before a single row is read.
//!
//! Rules enforced here (SPEC §0, §5):
//! * parameters of private aggregates are literals in their allowed ranges;
//! * no `DISTINCT` and no `ORDER BY` inside a private aggregate call;
//! * no private aggregate used as a window function (`OVER (…)`).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, plan_err};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{Expr, LogicalPlan, WindowFunctionDefinition};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use crate::functions::{PrivateCall, is_private, plan_private_call};

/// Finds and validates every private aggregate call in `plan` (including subqueries).
pub fn private_calls(plan: &LogicalPlan) -> Result<Vec<PrivateCall>> {
    let mut calls = Vec::new();
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                match e {
                    Expr::AggregateFunction(AggregateFunction { func, params }) => {
                        if let Some(call) = plan_private_call(func, &params.args) {
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
                        if let WindowFunctionDefinition::AggregateUDF(f) = fun {
                            if is_private(f) {
                                return plan_err!(
                                    "{}: cannot be used as a window function (OVER …); \
                                     call it as an aggregate",
                                    f.name()
                                );
                            }
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

/// A `QueryPlanner` that runs the guard on the optimized plan, then plans physically.
#[derive(Debug, Default)]
pub struct PrivacyPlanner {}

#[async_trait]
impl QueryPlanner for PrivacyPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        private_calls(logical_plan)?;
        DefaultPhysicalPlanner::default().create_physical_plan(logical_plan, session).await
    }
}

/// Convenience for tests: the private calls of a SQL query's optimized plan.
pub async fn private_calls_of(state: &SessionState, plan: &LogicalPlan) -> Result<Vec<PrivateCall>> {
    private_calls(&state.optimize(plan)?)
}
