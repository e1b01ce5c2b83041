//! Pass: gives every private aggregate call its release permits (SPEC §5.1) — a fresh
//! [`PermitSlot`] for each call over a private table, granted by the gate once per paid
//! execution (one permit per declared group, or per selected group), and no permit needed for
//! calls over public tables.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::LogicalPlan;

use crate::functions::{PermitSlot, Permits, SlotCharge, plan_private_call, with_permits};
use crate::guard::checking::Checking;
use crate::guard::view::{GroupMode, KeysMap, group_mode, product, selection_args};
use crate::guard::walk::{find_private_scan, has_private_call, map_private_calls};

/// The pass: the plan with permits, and one slot per priced call.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let view = cx.view;
    let mut slots = Vec::new();
    cx.rewrite(|plan| {
        let (plan, found) = assign_permits(plan, &view.keys)?;
        slots = found;
        Ok(plan)
    })?;
    cx.slots = slots;
    Ok(())
}

/// Every private call with its permits; returns the slots of the calls over private tables.
pub fn assign_permits(plan: LogicalPlan, keys: &KeysMap) -> Result<(LogicalPlan, Vec<Arc<PermitSlot>>)> {
    let mut slots = Vec::new();
    let plan = plan
        .transform_up_with_subqueries(|node| {
            let LogicalPlan::Aggregate(agg) = &node else { return Ok(Transformed::no(node)) };
            if !has_private_call(agg) {
                return Ok(Transformed::no(node));
            }
            let table = find_private_scan(&agg.input);
            let mode = match &table {
                Some(t) => group_mode(agg, keys, t)?,
                None => GroupMode::Ungrouped,
            };
            let selected = match mode {
                GroupMode::Private => selection_args(agg)?.map(|a| a.max_groups),
                _ => None,
            };
            let declared = match mode {
                GroupMode::Declared(cols) => Some(product(&cols)),
                _ => None,
            };
            map_private_calls(agg, |func, args| {
                let permits = if let Some(table) = &table {
                    let slot = match (&declared, selected) {
                        (Some(g), _) => PermitSlot::for_groups(g.clone()),
                        (None, Some(max)) => PermitSlot::for_selection(max),
                        (None, None) => PermitSlot::new(),
                    };
                    // What the call is charged: the gate keeps its releases under that ledger entry.
                    if let Some(call) = plan_private_call(func, args, agg.input.schema()) {
                        let call = call?;
                        slot.set_charge(SlotCharge {
                            table: table.clone(),
                            function: call.function.to_string(),
                            cost: call.cost,
                        });
                    }
                    slots.push(Arc::clone(&slot));
                    Permits::Slot(slot)
                } else {
                    Permits::Free
                };
                with_permits(func, permits)
                    .ok_or_else(|| DataFusionError::Internal(format!("{} is private but has no permits", func.name())))
            })
        })?
        .data;
    Ok((plan, slots))
}
