//! The ground of the guard: walking and rebuilding logical plans. Which private table a plan
//! reads, which column a value comes from, the aggregate call inside an expression, and an
//! aggregate rebuilt with another input or other calls. Imports nothing else from `guard/`.

use std::sync::Arc;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, AggregateUDF, Expr, LogicalPlan, TableScan};

use crate::functions::is_private;
use crate::policy::table::as_private;

/// The catalog name of the private table a scan reads, if it is private.
pub fn private_table_of(scan: &TableScan) -> Option<String> {
    let provider = source_as_provider(&scan.source).ok()?;
    as_private(provider.as_ref()).map(|t| t.name().to_string())
}

/// The first private table read anywhere in `plan`, including its subqueries.
pub fn find_private_scan(plan: &LogicalPlan) -> Option<String> {
    let mut found = None;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && let Some(t) = private_table_of(scan)
        {
            found = Some(t);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The aggregate function call inside an aggregate expression (looking through aliases).
pub fn aggregate_call(e: &Expr) -> Option<&AggregateFunction> {
    match e {
        Expr::AggregateFunction(f) => Some(f),
        Expr::Alias(a) => aggregate_call(&a.expr),
        _ => None,
    }
}

/// Whether `agg` makes at least one private aggregate call.
pub fn has_private_call(agg: &Aggregate) -> bool {
    agg.aggr_expr.iter().any(|e| aggregate_call(e).is_some_and(|f| is_private(&f.func)))
}

/// `node` as an aggregate making private calls over a private table: the aggregate and the table.
pub fn private_aggregate(node: &LogicalPlan) -> Option<(&Aggregate, String)> {
    let LogicalPlan::Aggregate(agg) = node else { return None };
    if !has_private_call(agg) {
        return None;
    }
    Some((agg, find_private_scan(&agg.input)?))
}

/// The private table and column a value expression reads directly (through casts,
/// aliases, projections, filters and subquery aliases), if any.
pub fn trace_column(expr: &Expr, plan: &LogicalPlan) -> Option<(String, String)> {
    let mut col: Column = match expr {
        Expr::Column(c) => c.clone(),
        Expr::Cast(c) => return trace_column(&c.expr, plan),
        Expr::TryCast(c) => return trace_column(&c.expr, plan),
        Expr::Alias(a) => return trace_column(&a.expr, plan),
        _ => return None,
    };
    let mut node = plan;
    loop {
        match node {
            LogicalPlan::Projection(p) => {
                let i = p.schema.index_of_column(&col).ok()?;
                let mut e = &p.expr[i];
                while let Expr::Alias(a) = e {
                    e = &a.expr;
                }
                match e {
                    Expr::Column(c) => col = c.clone(),
                    _ => return None,
                }
                node = &p.input;
            }
            LogicalPlan::Filter(f) => node = &f.input,
            LogicalPlan::SubqueryAlias(a) => {
                let i = a.schema.index_of_column(&col).ok()?;
                let (q, f) = a.input.schema().qualified_field(i);
                col = Column::new(q.cloned(), f.name());
                node = &a.input;
            }
            LogicalPlan::TableScan(scan) => {
                scan.projected_schema.index_of_column(&col).ok()?;
                return Some((private_table_of(scan)?, col.name));
            }
            _ => return None,
        }
    }
}

/// The same aggregate with every private aggregate function instance replaced by `f(instance)`
/// (same arguments, same output schema).
pub fn map_private_calls(
    agg: &Aggregate,
    mut f: impl FnMut(&AggregateUDF, &[Expr]) -> Result<AggregateUDF>,
) -> Result<Transformed<LogicalPlan>> {
    let aggr_expr = agg
        .aggr_expr
        .iter()
        .map(|e| {
            e.clone()
                .transform_up(|e| match e {
                    Expr::AggregateFunction(AggregateFunction { func, params }) if is_private(&func) => {
                        let func = Arc::new(f(&func, &params.args)?);
                        Ok(Transformed::yes(Expr::AggregateFunction(AggregateFunction { func, params })))
                    }
                    other => Ok(Transformed::no(other)),
                })
                .map(|t| t.data)
        })
        .collect::<Result<Vec<_>>>()?;
    with_aggr_exprs(agg, aggr_expr)
}

/// The same aggregate over another input (same output schema).
pub fn with_input(agg: &Aggregate, input: Arc<LogicalPlan>) -> Result<Transformed<LogicalPlan>> {
    let rewritten =
        Aggregate::try_new_with_schema(input, agg.group_expr.clone(), agg.aggr_expr.clone(), Arc::clone(&agg.schema))?;
    Ok(Transformed::yes(LogicalPlan::Aggregate(rewritten)))
}

/// The same aggregate with new aggregate expressions (same output schema).
pub fn with_aggr_exprs(agg: &Aggregate, aggr_expr: Vec<Expr>) -> Result<Transformed<LogicalPlan>> {
    let rewritten = Aggregate::try_new_with_schema(
        Arc::clone(&agg.input),
        agg.group_expr.clone(),
        aggr_expr,
        Arc::clone(&agg.schema),
    )?;
    Ok(Transformed::yes(LogicalPlan::Aggregate(rewritten)))
}
