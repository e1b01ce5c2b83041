//! Pass: fills omitted parameters of private aggregates from the table policy, on the optimized
//! plan, before the guard checks it: `lo`/`hi` of `private_kde` from the value column's
//! public bounds; the box of `private_kde2d` from the bounds of its x and y columns; `clip` of `private_mean_curve` from the curve column's bounds (a curve
//! whose values lie in [lower, upper] has norm ≤ max(|lower|, |upper|)) and `points` from
//! the table's public curve length.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::functions::policy_args_of;
use crate::guard::checking::Checking;
use crate::guard::view::PolicyView;
use crate::guard::walk::{trace_column, with_aggr_exprs};

fn is_null_literal(e: Option<&Expr>) -> bool {
    match e {
        None => true,
        Some(Expr::Literal(v, _)) => v.is_null(),
        Some(Expr::Cast(c)) => is_null_literal(Some(&c.expr)),
        _ => false,
    }
}

fn literal(v: ScalarValue) -> Expr {
    Expr::Literal(v, None)
}

/// The call with omitted policy parameters filled in (keeping the output name), or None.
fn fill(e: &Expr, input: &LogicalPlan, defaults: &PolicyView) -> Option<Expr> {
    let (inner, name) = match e {
        Expr::Alias(a) => (a.expr.as_ref(), a.name.clone()),
        other => (other, other.schema_name().to_string()),
    };
    let Expr::AggregateFunction(AggregateFunction { func, params }) = inner else { return None };
    let mut args = params.args.clone();
    let set = |args: &mut Vec<Expr>, i: usize, v: ScalarValue| {
        while args.len() <= i {
            args.push(literal(ScalarValue::Null));
        }
        args[i] = literal(v);
    };
    let policy = policy_args_of(func)?;
    let traced = |args: &[Expr], data: usize| args.get(data).and_then(|a| trace_column(a, input));
    let mut changed = false;
    // Each axis independently: its column's bounds unless the call gives that axis's box.
    for &(data, (lo_i, hi_i)) in policy.boxes {
        if is_null_literal(args.get(lo_i)) && is_null_literal(args.get(hi_i)) {
            let Some(key) = traced(&args, data) else { continue };
            let Some(&(lo, hi)) = defaults.bounds.get(&key) else { continue };
            set(&mut args, lo_i, ScalarValue::Float64(Some(lo)));
            set(&mut args, hi_i, ScalarValue::Float64(Some(hi)));
            changed = true;
        }
    }
    // A curve whose values lie in [lower, upper] has norm ≤ max(|lower|, |upper|).
    if let Some((data, clip_i)) = policy.clip
        && is_null_literal(args.get(clip_i))
        && let Some(&(lo, hi)) = traced(&args, data).and_then(|key| defaults.bounds.get(&key))
    {
        set(&mut args, clip_i, ScalarValue::Float64(Some(lo.abs().max(hi.abs()))));
        changed = true;
    }
    if let Some((data, points_i)) = policy.curve_length
        && is_null_literal(args.get(points_i))
        && let Some(&m) = traced(&args, data).and_then(|(table, _)| defaults.curve_length.get(&table))
    {
        set(&mut args, points_i, ScalarValue::Int64(Some(m)));
        changed = true;
    }
    if !changed {
        return None;
    }
    let mut new_params = params.clone();
    new_params.args = args;
    let call = Expr::AggregateFunction(AggregateFunction { func: Arc::clone(func), params: new_params });
    Some(call.alias(name))
}

/// The pass: fills omitted policy parameters of every private call.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let view = cx.view;
    cx.rewrite(|plan| apply_default_bounds(plan, view))
}

/// Rewrites every aggregate (also in subqueries) whose private calls omit their bounds.
pub fn apply_default_bounds(plan: LogicalPlan, defaults: &PolicyView) -> Result<LogicalPlan> {
    if defaults.bounds.is_empty() && defaults.curve_length.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::Aggregate(agg) = &node else { return Ok(Transformed::no(node)) };
        let new: Vec<Option<Expr>> = agg.aggr_expr.iter().map(|e| fill(e, &agg.input, defaults)).collect();
        if new.iter().all(Option::is_none) {
            return Ok(Transformed::no(node));
        }
        let aggr_expr = new.into_iter().zip(&agg.aggr_expr).map(|(n, old)| n.unwrap_or_else(|| old.clone())).collect();
        with_aggr_exprs(agg, aggr_expr)
    })
    .map(|t| t.data)
}
