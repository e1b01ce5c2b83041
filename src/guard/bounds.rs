//! Fills omitted parameters of private aggregates from the table policy, on the optimized
//! plan, before the guard checks it: `lo`/`hi` of `private_kde` from the value column's
//! public bounds; the box of `private_kde2d` from the bounds of its x and y columns; `clip` of `private_mean_curve` from the curve column's bounds (a curve
//! whose values lie in [lower, upper] has norm ≤ max(|lower|, |upper|)) and `points` from
//! the table's public curve length.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::functions::{
    private_kde, private_kde2d, private_kernel_classifier, private_kernel_regression, private_mean_curve,
};
use crate::policy::table::as_private;

/// Public bounds per (private table, column).
pub type BoundsMap = BTreeMap<(String, String), (f64, f64)>;

/// What the policies of the catalog's private tables supply.
#[derive(Debug, Clone, Default)]
pub struct PolicyDefaults {
    /// Column bounds.
    pub bounds: BoundsMap,
    /// Public curve length per table.
    pub curve_length: BTreeMap<String, i64>,
    /// Declared public group keys per (table, column).
    pub keys: super::groups::KeysMap,
    /// Private tables with a privacy unit.
    pub units: super::units::UnitsMap,
}

/// The private table and column a value expression reads directly (through casts,
/// aliases, projections, filters and subquery aliases), if any.
pub(crate) fn trace_column(expr: &Expr, plan: &LogicalPlan) -> Option<(String, String)> {
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

fn literal(v: ScalarValue) -> Expr {
    Expr::Literal(v, None)
}

/// The argument positions `(data argument, (lo, hi))` of the boxes a function takes from its
/// data columns' policy bounds (functions with more than one data column).
fn box_args(func: &datafusion::logical_expr::AggregateUDF) -> Option<&'static [(usize, (usize, usize))]> {
    let inner = func.inner();
    if inner.is::<private_kde2d::PrivateKde2d>() {
        Some(private_kde2d::BOX_ARGS)
    } else if inner.is::<private_kernel_regression::PrivateKernelRegression>() {
        Some(private_kernel_regression::BOX_ARGS)
    } else if inner.is::<private_kernel_classifier::PrivateKernelClassifier>() {
        Some(private_kernel_classifier::BOX_ARGS)
    } else {
        None
    }
}

/// The call with omitted policy parameters filled in (keeping the output name), or None.
fn fill(e: &Expr, input: &LogicalPlan, defaults: &PolicyDefaults) -> Option<Expr> {
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
    let mut changed = false;
    if func.inner().is::<private_kde::PrivateKde>() {
        let (lo_i, hi_i) = (4, 5); // argument positions of lo and hi (value is 0)
        if is_null_literal(args.get(lo_i)) && is_null_literal(args.get(hi_i)) {
            let key = trace_column(args.first()?, input)?;
            let &(lo, hi) = defaults.bounds.get(&key)?;
            set(&mut args, lo_i, ScalarValue::Float64(Some(lo)));
            set(&mut args, hi_i, ScalarValue::Float64(Some(hi)));
            changed = true;
        }
    } else if let Some(boxes) = box_args(func) {
        // Each axis independently: its column's bounds unless the call gives that axis's box.
        for &(data, (lo_i, hi_i)) in boxes {
            if is_null_literal(args.get(lo_i)) && is_null_literal(args.get(hi_i)) {
                let Some(key) = args.get(data).and_then(|a| trace_column(a, input)) else { continue };
                let Some(&(lo, hi)) = defaults.bounds.get(&key) else { continue };
                set(&mut args, lo_i, ScalarValue::Float64(Some(lo)));
                set(&mut args, hi_i, ScalarValue::Float64(Some(hi)));
                changed = true;
            }
        }
    } else if func.inner().is::<private_mean_curve::PrivateMeanCurve>() {
        let key = trace_column(args.first()?, input)?;
        if is_null_literal(args.get(private_mean_curve::CLIP_ARG)) {
            if let Some(&(lo, hi)) = defaults.bounds.get(&key) {
                set(&mut args, private_mean_curve::CLIP_ARG, ScalarValue::Float64(Some(lo.abs().max(hi.abs()))));
                changed = true;
            }
        }
        if is_null_literal(args.get(private_mean_curve::POINTS_ARG)) {
            if let Some(&m) = defaults.curve_length.get(&key.0) {
                set(&mut args, private_mean_curve::POINTS_ARG, ScalarValue::Int64(Some(m)));
                changed = true;
            }
        }
    }
    if !changed {
        return None;
    }
    let mut new_params = params.clone();
    new_params.args = args;
    let call = Expr::AggregateFunction(AggregateFunction { func: Arc::clone(func), params: new_params });
    Some(call.alias(name))
}

/// Rewrites every aggregate (also in subqueries) whose private calls omit their bounds.
pub fn apply_default_bounds(plan: LogicalPlan, defaults: &PolicyDefaults) -> Result<LogicalPlan> {
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
        super::with_aggr_exprs(agg, aggr_expr)
    })
    .map(|t| t.data)
}
