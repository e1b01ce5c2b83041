//! `GROUP BY` over declared public keys (SPEC §7).
//!
//! A private aggregate may be grouped by plain columns of its private table whose keys the
//! data owner declared (`dpcurve admin set-keys`). The result then has exactly one row per
//! declared key (per combination of keys, for several columns), whatever the data: rows with
//! undeclared keys are dropped by a filter the guard adds below the aggregate, and every declared
//! group — reached by rows or not (then from an empty state: noise only) — is released once, in
//! declared order, by [`super::canonical_groups::CanonicalGroupsExec`]. The
//! groups are disjoint, so one call costs one charge (parallel composition; the privacy unit is
//! the row). Grouping by an expression, or with `ROLLUP`/`CUBE`/`GROUPING SETS`, is refused
//! (`no-group-by`); columns without declared keys group only through a paid partition selection
//! ([`super::selection`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{DataFusionError, Result, ScalarValue, plan_err};
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, Filter, LogicalPlan, in_list};

use super::bounds::trace_column;
use crate::functions::is_private;

/// Declared keys per (private table, column).
pub type KeysMap = BTreeMap<(String, String), Vec<String>>;

/// Most groups (product of the declared keys of the grouping columns) one aggregate may have.
pub const MAX_GROUPS: usize = 100_000;

/// How a private aggregate over a private table is grouped.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupMode {
    /// No GROUP BY.
    Ungrouped,
    /// Plain columns with declared keys: the typed keys of each column.
    Declared(Vec<Vec<ScalarValue>>),
    /// Plain columns of the table, none with declared keys: groups only through DP partition
    /// selection (SPEC §7, [`super::selection`]).
    Private,
}

/// How `agg` over private table `table` is grouped. Refuses expressions, ROLLUP/CUBE/GROUPING
/// SETS, a mix of declared and undeclared columns, and more than [`MAX_GROUPS`] declared groups.
pub fn group_mode(agg: &Aggregate, keys: &KeysMap, table: &str) -> Result<GroupMode> {
    if agg.group_expr.is_empty() {
        return Ok(GroupMode::Ungrouped);
    }
    let mut out = Vec::with_capacity(agg.group_expr.len());
    let mut undeclared = Vec::new();
    let mut groups: usize = 1;
    for g in &agg.group_expr {
        if let Expr::GroupingSet(_) = g {
            return plan_err!(
                "[rule no-group-by] ROLLUP, CUBE and GROUPING SETS over private table '{table}' are not supported: \
                 group by plain columns"
            );
        }
        let what = g.schema_name().to_string();
        let Some(traced) = trace_column(g, &agg.input).filter(|(t, _)| t == table) else {
            return plan_err!(
                "[rule no-group-by] GROUP BY {what} over private table '{table}': only plain columns of the table \
                 can group private rows (with keys the data owner declared public — `dpcurve admin set-keys \
                 {table} COLUMN VALUE…` — or through DP partition selection with select_epsilon => …)"
            );
        };
        let Some(declared) = keys.get(&traced) else {
            undeclared.push(what);
            continue;
        };
        let t = g.get_type(agg.input.schema())?;
        let typed = declared
            .iter()
            .map(|v| {
                ScalarValue::try_from_string(v.clone(), &t)
                    .map_err(|e| DataFusionError::Plan(format!("declared key '{v}' is not a value of {t}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        // Keys are compared in the grouping expression's type: declared keys that become one
        // value there ('01' and '1' as integers, 't' and 'true' as booleans) are one group.
        let mut typed_unique: Vec<ScalarValue> = Vec::with_capacity(typed.len());
        for k in typed {
            if !typed_unique.contains(&k) {
                typed_unique.push(k);
            }
        }
        let typed = typed_unique;
        groups = groups.saturating_mul(typed.len());
        out.push(typed);
    }
    if !undeclared.is_empty() {
        if !out.is_empty() {
            return plan_err!(
                "[rule no-group-by] GROUP BY over private table '{table}' mixes columns with declared keys and \
                 columns without ({}): group by declared columns only, or by undeclared ones only (partition \
                 selection)",
                undeclared.join(", ")
            );
        }
        return Ok(GroupMode::Private);
    }
    if groups > MAX_GROUPS {
        return plan_err!(
            "[rule no-group-by] this GROUP BY over private table '{table}' has {groups} declared groups (the \
             product of the keys of its columns); at most {MAX_GROUPS}"
        );
    }
    Ok(GroupMode::Declared(out))
}

/// The typed declared keys of each grouping column of `agg` over private table `table`, or
/// None when it has no GROUP BY or groups by private keys.
pub fn declared_groups(agg: &Aggregate, keys: &KeysMap, table: &str) -> Result<Option<Vec<Vec<ScalarValue>>>> {
    Ok(match group_mode(agg, keys, table)? {
        GroupMode::Declared(k) => Some(k),
        _ => None,
    })
}

/// All combinations of the columns' keys, in declaration order.
pub fn product(columns: &[Vec<ScalarValue>]) -> Vec<Vec<ScalarValue>> {
    columns.iter().fold(vec![Vec::new()], |acc, keys| {
        acc.iter()
            .flat_map(|prefix| {
                keys.iter().map(move |k| {
                    let mut p = prefix.clone();
                    p.push(k.clone());
                    p
                })
            })
            .collect()
    })
}

/// Adds `g IN (declared keys)` below every grouped private aggregate over a private table, so
/// rows with undeclared keys are dropped (they would otherwise make groups appear).
pub fn filter_to_declared_keys(plan: LogicalPlan, keys: &KeysMap) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::Aggregate(agg) = &node else { return Ok(Transformed::no(node)) };
        if agg.group_expr.is_empty()
            || !agg.aggr_expr.iter().any(|e| super::shape::aggregate_call(e).is_some_and(|f| is_private(&f.func)))
        {
            return Ok(Transformed::no(node));
        }
        let Some(table) = super::shape::find_private_scan(&agg.input) else { return Ok(Transformed::no(node)) };
        let Some(columns) = declared_groups(agg, keys, &table)? else { return Ok(Transformed::no(node)) };
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
        super::with_input(agg, input)
    })
    .map(|t| t.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_product_of_keys_lists_every_combination() {
        let a = vec![ScalarValue::from(1i64), ScalarValue::from(2i64)];
        let b = vec![ScalarValue::from("x"), ScalarValue::from("y"), ScalarValue::from("z")];
        let p = product(&[a, b]);
        assert_eq!(p.len(), 6);
        assert_eq!(p[5], vec![ScalarValue::from(2i64), ScalarValue::from("z")]);
        assert_eq!(product(&[]), vec![Vec::<ScalarValue>::new()]);
    }
}
