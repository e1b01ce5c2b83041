//! Pass: bounds each privacy unit's contribution (SPEC §7) below every private aggregate over a
//! table whose policy names a unit column, with the plan of [`bound_rows`]. A GROUP BY over
//! private keys is bounded by its partition selection instead (the selection pass runs first).

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Result, internal_err};
use datafusion::logical_expr::LogicalPlan;

use crate::functions::context_of;
use crate::guard::checking::Checking;
use crate::guard::ops::bounding::bound_rows;
use crate::guard::ops::sample_order::SampleOrder;
use crate::guard::view::UnitsMap;
use crate::guard::walk::{aggregate_call, private_aggregate, with_input};

/// The pass.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let view = cx.view;
    cx.rewrite(|plan| bound_contributions(plan, &view.units))
}

/// Inserts the contribution bounding below every private aggregate over a table with a privacy
/// unit. Runs after the shape rules, so the input is a row-wise chain.
pub fn bound_contributions(plan: LogicalPlan, units: &UnitsMap) -> Result<LogicalPlan> {
    if units.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| {
        let Some((agg, table)) = private_aggregate(&node) else { return Ok(Transformed::no(node)) };
        let Some(unit) = units.get(&table) else { return Ok(Transformed::no(node)) };
        let Some(cx) = agg.aggr_expr.iter().find_map(|e| aggregate_call(e).and_then(|f| context_of(&f.func))) else {
            return internal_err!("a private aggregate over '{table}' has no call context");
        };
        if cx.permits.is_selection() {
            return Ok(Transformed::no(node));
        }
        let order = SampleOrder::new(cx.noise)?;
        let bounded = bound_rows(&agg.input, unit, &table, &order, cx.contribution, &agg.group_expr)?;
        with_input(agg, Arc::new(bounded))
    })
    .map(|t| t.data)
}
