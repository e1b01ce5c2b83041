//! Pass: `GROUP BY` over declared public keys (SPEC §7).
//!
//! A private aggregate may be grouped by plain columns of its private table whose keys the
//! data owner declared (`dpcurve admin set-keys`). The result then has exactly one row per
//! declared key (per combination of keys, for several columns), whatever the data: rows with
//! undeclared keys are dropped by a filter the guard adds below the aggregate, and every declared
//! group — reached by rows or not (then from an empty state: noise only) — is released once, in
//! declared order, by [`CanonicalGroupsExec`](crate::guard::exec::canonical_groups::CanonicalGroupsExec). The
//! groups are disjoint, so one call costs one charge (parallel composition; the privacy unit is
//! the row). Grouping by an expression, or with `ROLLUP`/`CUBE`/`GROUPING SETS`, is refused
//! (`no-group-by`); columns without declared keys group only through a paid partition selection
//! ([`super::selection`]).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::Transformed;
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, in_list};

use crate::guard::checking::Checking;
use crate::guard::view::{GroupMode, KeysMap, group_mode};
use crate::guard::walk::{private_aggregate, with_input};

/// The pass.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let view = cx.view;
    cx.rewrite(|plan| filter_to_declared_keys(plan, &view.keys))
}

/// Adds `g IN (declared keys)` below every grouped private aggregate over a private table, so
/// rows with undeclared keys are dropped (they would otherwise make groups appear).
pub fn filter_to_declared_keys(plan: LogicalPlan, keys: &KeysMap) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let Some((agg, table)) = private_aggregate(&node) else { return Ok(Transformed::no(node)) };
        if agg.group_expr.is_empty() {
            return Ok(Transformed::no(node));
        }
        let GroupMode::Declared(columns) = group_mode(agg, keys, &table)? else { return Ok(Transformed::no(node)) };
        let Some(predicate) = agg
            .group_expr
            .iter()
            .zip(columns)
            .map(|(g, ks)| in_list(g.clone(), ks.into_iter().map(|k| Expr::Literal(k, None)).collect(), false))
            .reduce(Expr::and)
        else {
            return Ok(Transformed::no(node));
        };
        let input = Arc::new(LogicalPlan::Filter(Filter::try_new(predicate, Arc::clone(&agg.input))?));
        with_input(agg, input)
    })
    .map(|t| t.data)
}
