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

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, in_list};

use crate::guard::checking::Checking;
use crate::guard::ops::key_range;
use crate::guard::view::{GroupMode, KeysMap, group_mode};
use crate::guard::walk::{private_aggregate, with_input};

/// The pass.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let view = cx.view;
    cx.rewrite(|plan| filter_to_declared_keys(plan, &view.keys))
}

/// `g` is one of `keys`: `g BETWEEN lo AND hi` when the keys are every integer from lo to hi (one
/// comparison per row: [`key_range`]), else `g IN (keys)` (a hash lookup per row). A NULL `g` is in
/// neither.
fn declared(g: &Expr, keys: Vec<ScalarValue>) -> Expr {
    let integers: Option<Vec<i128>> = keys.iter().map(key_range::integer).collect();
    if let Some(mut ints) = integers.filter(|v| !v.is_empty()) {
        ints.sort_unstable();
        ints.dedup();
        let (lo, hi) = (ints[0], ints[ints.len() - 1]);
        if hi - lo + 1 == ints.len() as i128 {
            let at = |v: i128| keys.iter().find(|k| key_range::integer(k) == Some(v)).cloned().expect("a declared key");
            return key_range::in_range(g.clone(), at(lo), at(hi));
        }
    }
    in_list(g.clone(), keys.into_iter().map(|k| Expr::Literal(k, None)).collect(), false)
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
        let Some(predicate) = agg.group_expr.iter().zip(columns).map(|(g, ks)| declared(g, ks)).reduce(Expr::and)
        else {
            return Ok(Transformed::no(node));
        };
        let input = Arc::new(LogicalPlan::Filter(Filter::try_new(predicate, Arc::clone(&agg.input))?));
        with_input(agg, input)
    })
    .map(|t| t.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int32Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use datafusion::logical_expr::col;
    use datafusion::prelude::SessionContext;

    /// The values of `k ∈ {−3, …, 12, NULL}` the filter for `keys` keeps, and whether it is a range.
    async fn kept(keys: &[i32]) -> (Vec<i32>, bool) {
        let filter = declared(&col("k"), keys.iter().map(|&k| ScalarValue::Int32(Some(k))).collect());
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true)]));
        let values: Int32Array = (-3..=12).map(Some).chain([None]).collect();
        let batch = RecordBatch::try_new(schema, vec![Arc::new(values)]).unwrap();
        let ctx = SessionContext::new();
        let rows = ctx.read_batch(batch).unwrap().filter(filter.clone()).unwrap().collect().await.unwrap();
        let kept = rows.iter().flat_map(|b| b.column(0).as_primitive::<Int32Type>().values().to_vec()).collect();
        (kept, matches!(&filter, Expr::ScalarFunction(f) if f.name() == key_range::NAME))
    }

    #[tokio::test]
    async fn the_declared_keys_filter_keeps_exactly_the_declared_keys() {
        assert_eq!(kept(&[3, 1, 2, 2, 4]).await, (vec![1, 2, 3, 4], true), "a run of integers (unordered, repeated)");
        assert_eq!(kept(&[7]).await, (vec![7], true));
        assert_eq!(kept(&[0, 2, 3, 6]).await, (vec![0, 2, 3, 6], false), "a gap: a list");
        assert_eq!(kept(&[-3, 12]).await, (vec![-3, 12], false));
        // Strings are a list.
        let filter = declared(&col("r"), vec![ScalarValue::from("a"), ScalarValue::from("b")]);
        assert!(matches!(filter, Expr::InList(_)), "{filter}");
    }
}
