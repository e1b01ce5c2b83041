//! Pass: gives every private call over a table with a privacy unit its contribution bound
//! (SPEC §7) — `K` rows per group, `L` groups — so that its validation, pricing and noise use the
//! unit's sensitivity. Runs before anything else looks at the calls.

use datafusion::common::tree_node::Transformed;
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::LogicalPlan;

use crate::functions::{CallContext, context_of, with_context};
use crate::guard::checking::Checking;
use crate::guard::view::{KeysMap, UnitsMap, contribution_for};
use crate::guard::walk::{map_private_calls, private_aggregate};

/// The pass.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let view = cx.view;
    cx.rewrite(|plan| set_contributions(plan, &view.units, &view.keys))
}

/// Every private call over a table with a privacy unit, with the unit's contribution bound.
pub fn set_contributions(plan: LogicalPlan, units: &UnitsMap, keys: &KeysMap) -> Result<LogicalPlan> {
    if units.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| {
        let Some((agg, table)) = private_aggregate(&node) else { return Ok(Transformed::no(node)) };
        let Some(unit) = units.get(&table) else { return Ok(Transformed::no(node)) };
        let contribution = contribution_for(agg, unit, keys, &table)?;
        map_private_calls(agg, |func, _| {
            let cx = context_of(func).ok_or_else(|| DataFusionError::Internal("no call context".into()))?;
            with_context(func, CallContext { contribution, ..cx.clone() })
                .ok_or_else(|| DataFusionError::Internal("no call context".into()))
        })
    })
    .map(|t| t.data)
}
