//! Pass: GROUP BY over private keys (SPEC §7): groups appear only through DP partition selection.
//!
//! ```sql
//! SELECT city, private_kde(income, 2000, 0.5, 1e-6, select_epsilon => 0.2, select_delta => 1e-7)
//! FROM people GROUP BY city
//! ```
//!
//! When a private aggregate groups by plain columns without declared keys, the query pays for
//! a selection (`select_epsilon`, `select_delta`, on one of its private calls — or the same on
//! several — and `select_max_groups`, the public cap on released groups, default 1 000) in
//! addition to its curves: one more charge, `partition_selection`, on the table.
//!
//! Execution, after the gate's debit:
//! 1. a first pass counts each candidate group's units (after the per-unit bound of L groups,
//!    one row per unit and group; rows when the row is the unit), grouped by the key's keyed
//!    128-bit hash, never its value — a count whose memory and spills are planned from public
//!    facts, never from how many candidates there are (`exec::planned_aggregate`; when rows are
//!    units and the key is one fixed-width integer-like column, the count groups by the value,
//!    which takes no more memory than its hash, and hashes each candidate once; the membership
//!    filter then tests a row's key by its value, without hashing it);
//! 2. the gate adds exact discrete Laplace noise of scale `L/ε_sel` to each count and keeps
//!    the groups reaching the threshold τ ([`PartitionSelection`]: a group of one unit passes
//!    with probability ≤ δ_sel/L), then the `select_max_groups` highest noisy counts among them
//!    (post-processing of the noisy counts);
//! 3. the grouped aggregate reads only rows of selected groups (a membership filter holding the
//!    selected hashes, below the per-unit bound) and releases one curve per selected group, in
//!    the order of the selected keys' values.
//!
//! The candidate keys and their counts live only inside the gate: they are never output, never
//! logged, never in an error (errors while private rows are read are withheld) and never in
//! EXPLAIN, which shows the plan, not the data. The memory rule counts `select_max_groups`
//! states. What remains observable is timing of the first pass, which grows with the number
//! of candidate groups as a scan grows with rows.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{DataFusionError, Result, internal_err, plan_err};
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, LogicalPlanBuilder, ScalarUDF, col, lit};

use crate::functions::{PermitSlot, context_of};
use crate::guard::checking::Checking;
use crate::guard::exec::selection_stage::SelectionStage;
use crate::guard::ops::bounding::{bound_rows, integer_like};
use crate::guard::ops::sample_order::SampleOrder;
use crate::guard::ops::selected::{COUNT_COLUMN, SelectedFilter, SelectedKeys};
use crate::guard::view::{UnitsMap, selection_args};
use crate::guard::walk::{aggregate_call, private_aggregate, with_input};
use crate::mechanism::Contribution;
use crate::mechanism::selection::PartitionSelection;

const GROUP_KEY: &str = "__dpcurve_group_key";

/// The pass: the partition selections, for the gate to run first.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let view = cx.view;
    let mut stages = Vec::new();
    cx.rewrite(|plan| {
        let (plan, found) = split_selections(plan, &view.units)?;
        stages = found;
        Ok(plan)
    })?;
    cx.stages = stages;
    Ok(())
}

/// Rewrites every private aggregate grouped by private keys into a membership-filtered
/// aggregate over bounded rows and returns the selection stages the gate must run first. Runs
/// before the other aggregates' contribution bounding (the units pass leaves these alone).
///
/// Candidate keys enter the first pass only as their keyed 128-bit hash (per query): its hash
/// table and, with a privacy unit, its per-unit bound hold 16 bytes per key whatever the key's
/// value, so a 10⁸-byte key in one row costs the same memory as any other key. Key values are
/// read only for the selected groups (the membership filter runs before the grouped aggregate and
/// its bound). Both passes rank a unit's groups by the same keyed order of (unit, key hash), so a
/// unit's group counted in the first pass is kept in the second: every selected group has rows.
pub fn split_selections(plan: LogicalPlan, units: &UnitsMap) -> Result<(LogicalPlan, Vec<SelectionStage>)> {
    let mut stages = Vec::new();
    let plan = plan
        .transform_up_with_subqueries(|node| {
            let Some((agg, table)) = private_aggregate(&node) else { return Ok(Transformed::no(node)) };
            // The guard gave the calls of a GROUP BY over private keys selection permit slots.
            let selecting = agg
                .aggr_expr
                .iter()
                .any(|e| aggregate_call(e).and_then(|f| context_of(&f.func)).is_some_and(|c| c.permits.is_selection()));
            if !selecting {
                return Ok(Transformed::no(node));
            }
            let Some(args) = selection_args(agg)? else {
                return internal_err!("a GROUP BY over private keys was priced without a selection");
            };
            let slots: Vec<Arc<PermitSlot>> = agg
                .aggr_expr
                .iter()
                .filter_map(|e| aggregate_call(e).and_then(|f| context_of(&f.func)))
                .filter_map(|c| c.permits.slot().cloned())
                .collect();
            let Some(cx) = agg.aggr_expr.iter().find_map(|e| aggregate_call(e).and_then(|f| context_of(&f.func)))
            else {
                return internal_err!("a private aggregate has no call context");
            };
            if agg.input.schema().fields().iter().any(|f| f.name() == GROUP_KEY) {
                return plan_err!("[rule no-group-by] column name '{GROUP_KEY}' is reserved");
            }
            let unit = units.get(&table);
            // Each unit reaches at most `groups` groups after bounding (1 when the row is the unit).
            let per_unit = if unit.is_some() { cx.contribution.groups } else { 1 };
            let selection =
                PartitionSelection::new(args.cost.calibration_epsilon(), args.cost.calibration_delta(), per_unit)
                    .map_err(|e| DataFusionError::Plan(format!("[rule no-group-by] {e}")))?;
            // One keyed order for the key hashes, the units' group ranks and their row samples.
            let order = SampleOrder::new(cx.noise)?;
            let hash_key = order.key();
            let key_hash = ScalarUDF::from(order.clone()).call(agg.group_expr.clone());
            // First pass: units per candidate key hash (one kept row per unit and group: K = 1).
            let by_value = agg.group_expr.len() == 1 && integer_like(&agg.group_expr, agg.input.schema())?;
            let first_pass = if unit.is_none() && by_value {
                // Rows are units and the key is one fixed-width column: count by its value (16
                // bytes or fewer, as its hash would be), then hash each candidate once.
                let counted = LogicalPlanBuilder::from(agg.input.as_ref().clone())
                    .aggregate(agg.group_expr.clone(), vec![count(lit(1i64)).alias(COUNT_COLUMN)])?
                    .build()?;
                let keys: Vec<Expr> =
                    counted.schema().columns().into_iter().take(agg.group_expr.len()).map(Expr::Column).collect();
                // The keys themselves follow (the gate hands the selected ones to the filter).
                let mut columns =
                    vec![ScalarUDF::from(order.clone()).call(keys.clone()).alias(GROUP_KEY), col(COUNT_COLUMN)];
                columns.extend(keys);
                LogicalPlanBuilder::from(counted).project(columns)?.build()?
            } else {
                let keyed = LogicalPlanBuilder::from(agg.input.as_ref().clone())
                    .project(vec![key_hash.clone().alias(GROUP_KEY)])?
                    .build()?;
                let counted = match unit {
                    Some(u) => {
                        let first = Contribution::new(1, per_unit).map_err(|e| DataFusionError::Plan(e.to_string()))?;
                        bound_rows(&keyed, u, &table, &order, first, &[col(GROUP_KEY)])?
                    }
                    None => keyed,
                };
                LogicalPlanBuilder::from(counted)
                    .aggregate(vec![col(GROUP_KEY)], vec![count(lit(1i64)).alias(COUNT_COLUMN)])?
                    .build()?
            };
            // Second pass: the selected groups' rows only, then their bound.
            let selected = Arc::new(SelectedKeys::default());
            let member =
                ScalarUDF::from(SelectedFilter::new(Arc::clone(&selected), hash_key)).call(agg.group_expr.clone());
            let filtered = LogicalPlan::Filter(Filter::try_new(member, Arc::clone(&agg.input))?);
            let input = match unit {
                Some(u) => bound_rows(&filtered, u, &table, &order, cx.contribution, &[key_hash])?,
                None => filtered,
            };
            stages.push(SelectionStage::new(
                first_pass,
                selection,
                args.max_groups as usize,
                selected,
                hash_key,
                cx.noise,
                slots,
            ));
            with_input(agg, Arc::new(input))
        })?
        .data;
    Ok((plan, stages))
}
