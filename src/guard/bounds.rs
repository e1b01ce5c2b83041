//! Fills omitted grid bounds of private aggregates from the table policy's public column
//! bounds (`lo`/`hi` of `private_kde`), on the optimized plan, before the guard checks it.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan};

use crate::functions::private_kde;
use crate::policy::table::as_private;

/// Public bounds per (private table, column).
pub type BoundsMap = BTreeMap<(String, String), (f64, f64)>;

/// The private table and column a value expression reads directly (through casts,
/// aliases, projections, filters and subquery aliases), if any.
fn trace_column(expr: &Expr, plan: &LogicalPlan) -> Option<(String, String)> {
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
                let provider = source_as_provider(&scan.source).ok()?;
                let table = as_private(provider.as_ref())?;
                return Some((table.name().to_string(), col.name));
            }
            _ => return None,
        }
    }
}

fn is_null_literal(e: Option<&Expr>) -> bool {
    match e {
        None => true,
        Some(Expr::Literal(v, _)) => v.is_null(),
        Some(Expr::Cast(c)) => is_null_literal(Some(&c.expr)),
        _ => false,
    }
}

/// `private_kde` with omitted `lo`/`hi` gets the bounds of its value column, keeping the
/// aggregate's output name.
fn fill(e: &Expr, input: &LogicalPlan, bounds: &BoundsMap) -> Option<Expr> {
    let (inner, name) = match e {
        Expr::Alias(a) => (a.expr.as_ref(), a.name.clone()),
        other => (other, other.schema_name().to_string()),
    };
    let Expr::AggregateFunction(AggregateFunction { func, params }) = inner else { return None };
    if !func.inner().is::<private_kde::PrivateKde>() {
        return None;
    }
    let (lo_i, hi_i) = (4, 5); // argument positions of lo and hi (value is 0)
    if !(is_null_literal(params.args.get(lo_i)) && is_null_literal(params.args.get(hi_i))) {
        return None;
    }
    let key = trace_column(params.args.first()?, input)?;
    let &(lo, hi) = bounds.get(&key)?;
    let mut args = params.args.clone();
    while args.len() <= hi_i {
        args.push(Expr::Literal(ScalarValue::Float64(None), None));
    }
    args[lo_i] = Expr::Literal(ScalarValue::Float64(Some(lo)), None);
    args[hi_i] = Expr::Literal(ScalarValue::Float64(Some(hi)), None);
    let mut new_params = params.clone();
    new_params.args = args;
    let call = Expr::AggregateFunction(AggregateFunction { func: Arc::clone(func), params: new_params });
    Some(call.alias(name))
}

/// Rewrites every aggregate (also in subqueries) whose private calls omit their bounds.
pub fn apply_default_bounds(plan: LogicalPlan, bounds: &BoundsMap) -> Result<LogicalPlan> {
    if bounds.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::Aggregate(agg) = &node else { return Ok(Transformed::no(node)) };
        let new: Vec<Option<Expr>> = agg.aggr_expr.iter().map(|e| fill(e, &agg.input, bounds)).collect();
        if new.iter().all(Option::is_none) {
            return Ok(Transformed::no(node));
        }
        let aggr_expr = new.into_iter().zip(&agg.aggr_expr).map(|(n, old)| n.unwrap_or_else(|| old.clone())).collect();
        let rewritten = Aggregate::try_new_with_schema(
            Arc::clone(&agg.input),
            agg.group_expr.clone(),
            aggr_expr,
            Arc::clone(&agg.schema),
        )?;
        Ok(Transformed::yes(LogicalPlan::Aggregate(rewritten)))
    })
    .map(|t| t.data)
}
