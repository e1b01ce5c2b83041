//! Pass: what a private table may be read by (SPEC §5), checked on the optimized logical plan,
//! and what the plan costs (SPEC §4).
//!
//! A private table may appear only as
//! `scan → filters / projections → an aggregate whose every expression is private`
//! (no GROUP BY), with anything public above that aggregate. Every rejection names its
//! rule:
//!
//! | rule | what it forbids |
//! |---|---|
//! | `no-raw-rows` | rows of a private table reaching the result, a join, a window, … |
//! | `private-aggregates-only` | an ordinary aggregate (count, sum, …) over a private table |
//! | `no-group-by` | GROUP BY over a private table except by plain columns with declared public keys, or without declared keys through a paid partition selection; ROLLUP/CUBE/GROUPING SETS |
//! | `row-wise-only` | anything but filters and projections between the table and the aggregate: joins, unions, DISTINCT, LIMIT, ORDER BY, UNNEST, … |
//! | `no-explain-analyze` | EXPLAIN ANALYZE of a query reading a private table (it prints row counts) |
//! | `no-physical-explain` | EXPLAIN formats other than the (logical-only) default on a private table: `FORMAT TREE` renders the physical plan, whose file groups reveal file sizes |
//! | `no-recursion` | a private table read inside `WITH RECURSIVE`: the recursive term re-runs, so one charge could buy many releases |
//!
//! The cost is one charge per private aggregate call left in the optimized plan, on the
//! private table it reads: a CTE referenced twice is two calls; a call the optimizer
//! removed costs nothing.

use datafusion::common::format::ExplainFormat;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::{Aggregate, LogicalPlan};

use crate::functions::plan_private_call;
use crate::guard::checking::Checking;
use crate::guard::view::{GroupMode, KeysMap, SELECTION_CHARGE, group_mode, selection_args};
use crate::guard::walk::{find_private_scan, has_private_call, private_table_of};
use crate::policy::Charge;

/// The pass: the shape rules, and the charges.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    cx.charges = check_and_price(&cx.plan, &cx.view.keys)?;
    Ok(())
}

/// Checks the shape rules and returns one charge per private aggregate call that reads
/// a private table.
pub fn check_and_price(plan: &LogicalPlan, keys: &KeysMap) -> Result<Vec<Charge>> {
    let mut cx = Cx { list: Vec::new(), keys };
    visit(plan, &mut cx)?;
    Ok(cx.list)
}

/// What the walk collects (charges) and needs (declared group keys).
struct Cx<'a> {
    list: Vec<Charge>,
    keys: &'a KeysMap,
}

fn visit_subqueries(plan: &LogicalPlan, charges: &mut Cx<'_>) -> Result<()> {
    let mut subs = Vec::new();
    plan.apply_subqueries(|sub| {
        subs.push(sub.clone());
        Ok(TreeNodeRecursion::Jump)
    })?;
    subs.iter().try_for_each(|s| visit(s, charges))
}

fn visit(plan: &LogicalPlan, charges: &mut Cx<'_>) -> Result<()> {
    visit_subqueries(plan, charges)?;
    match plan {
        LogicalPlan::Aggregate(agg) => {
            if has_private_call(agg) {
                return check_private_aggregate(agg, charges);
            }
            if let Some(t) = find_private_scan(&agg.input) {
                let what = if agg.aggr_expr.is_empty() {
                    "DISTINCT or GROUP BY".to_string()
                } else {
                    agg.aggr_expr.iter().map(|e| e.schema_name().to_string()).collect::<Vec<_>>().join(", ")
                };
                return plan_err!(
                    "[rule private-aggregates-only] {what} reads private table '{t}': only private \
                     aggregates such as private_kde may read a private table"
                );
            }
            visit(&agg.input, charges)
        }
        LogicalPlan::TableScan(scan) => match private_table_of(scan) {
            Some(t) => plan_err!(
                "[rule no-raw-rows] the query reads rows of private table '{t}' outside a private \
                 aggregate: a private table can only be summarised, e.g. \
                 SELECT private_kde(col, …) FROM {t}"
            ),
            None => Ok(()),
        },
        LogicalPlan::RecursiveQuery(r) => match find_private_scan(plan) {
            Some(t) => plan_err!(
                "[rule no-recursion] recursive query '{}' reads private table '{t}': its recursive term \
                 is evaluated repeatedly, so one charge would buy many releases; read the private \
                 table outside WITH RECURSIVE",
                r.name
            ),
            None => other_inputs(plan, charges),
        },
        LogicalPlan::Explain(e) if !matches!(e.explain_format, ExplainFormat::Indent) => {
            match find_private_scan(&e.plan) {
                Some(t) => plan_err!(
                    "[rule no-physical-explain] EXPLAIN FORMAT {} is refused on private table '{t}': \
                     it renders the physical plan, which shows file sizes; use plain EXPLAIN",
                    e.explain_format
                ),
                None => other_inputs(plan, charges),
            }
        }
        LogicalPlan::Analyze(a) => match find_private_scan(&a.input) {
            Some(t) => plan_err!(
                "[rule no-explain-analyze] EXPLAIN ANALYZE is refused on private table '{t}': its \
                 metrics include exact row counts; use EXPLAIN"
            ),
            None => visit(&a.input, charges),
        },
        other => other_inputs(other, charges),
    }
}

fn other_inputs(plan: &LogicalPlan, charges: &mut Cx<'_>) -> Result<()> {
    plan.inputs().into_iter().try_for_each(|c| visit(c, charges))
}

fn check_private_aggregate(agg: &Aggregate, charges: &mut Cx<'_>) -> Result<()> {
    // Walk the row-wise chain down to the scan.
    let mut node = agg.input.as_ref();
    let table = loop {
        match node {
            LogicalPlan::Projection(p) => {
                visit_subqueries(node, charges)?;
                node = &p.input;
            }
            LogicalPlan::Filter(f) => {
                visit_subqueries(node, charges)?;
                node = &f.input;
            }
            LogicalPlan::SubqueryAlias(a) => node = &a.input,
            LogicalPlan::TableScan(scan) => {
                let t = private_table_of(scan);
                if let (Some(t), Some(n)) = (&t, scan.fetch) {
                    return plan_err!(
                        "[rule row-wise-only] a LIMIT ({n} rows) sits between private table '{t}' and \
                         its private aggregate: only filters and projections may"
                    );
                }
                break t;
            }
            other => {
                if let Some(t) = find_private_scan(other) {
                    let kind = node_kind(other);
                    return plan_err!(
                        "[rule row-wise-only] {kind} sits between private table '{t}' and a private \
                         aggregate: only filters and projections may (joins, unions, DISTINCT, LIMIT, \
                         ORDER BY and UNNEST change how many times a row counts)"
                    );
                }
                visit(other, charges)?;
                break None;
            }
        }
    };
    let Some(table) = table else {
        return Ok(()); // private aggregates over public data cost nothing
    };
    for e in &agg.aggr_expr {
        let call = crate::guard::walk::aggregate_call(e)
            .and_then(|f| plan_private_call(&f.func, &f.params.args, agg.input.schema()));
        match call {
            Some(call) => {
                let call = call?;
                charges.list.push(Charge {
                    table: table.clone(),
                    function: call.function.to_string(),
                    cost: call.cost,
                });
            }
            None => {
                return plan_err!(
                    "[rule private-aggregates-only] {} cannot be computed on private table '{table}': \
                     every aggregate that reads a private table must be private",
                    e.schema_name()
                );
            }
        }
    }
    // GROUP BY over declared public keys (SPEC §7): one release per declared group, one charge
    // per call (the groups are disjoint). Over private keys: only through a partition
    // selection, charged in addition.
    let mode = group_mode(agg, charges.keys, &table)?;
    let selection = selection_args(agg)?;
    match (mode, selection) {
        (GroupMode::Private, Some(args)) => {
            charges.list.push(Charge { table, function: SELECTION_CHARGE.into(), cost: args.cost })
        }
        (GroupMode::Private, None) => {
            let cols: Vec<String> = agg.group_expr.iter().map(|g| g.schema_name().to_string()).collect();
            return plan_err!(
                "[rule no-group-by] GROUP BY {} over private table '{table}': the column has no keys declared \
                 public, so which groups exist is private; either the data owner declares the keys (`dpcurve \
                 admin set-keys {table} COLUMN VALUE…`) or the query pays for DP partition selection: add \
                 select_epsilon => …, select_delta => … (and optionally select_max_groups => …) to the private call",
                cols.join(", ")
            );
        }
        (_, Some(_)) => {
            return plan_err!(
                "[rule no-group-by] select_epsilon/select_delta/select_max_groups apply only to a GROUP BY over \
                 columns without declared keys; this call over private table '{table}' has no such GROUP BY"
            );
        }
        _ => {}
    }
    Ok(())
}

fn node_kind(plan: &LogicalPlan) -> &'static str {
    match plan {
        LogicalPlan::Join(_) => "a JOIN",
        LogicalPlan::Union(_) => "a UNION",
        LogicalPlan::Distinct(_) => "a DISTINCT",
        LogicalPlan::Aggregate(_) => "an aggregation (DISTINCT or GROUP BY)",
        LogicalPlan::Limit(_) => "a LIMIT",
        LogicalPlan::Sort(_) => "an ORDER BY",
        LogicalPlan::Unnest(_) => "an UNNEST",
        LogicalPlan::Window(_) => "a window function",
        LogicalPlan::RecursiveQuery(_) => "a recursive query",
        LogicalPlan::Repartition(_) => "a repartition",
        _ => "an operator that is not row-wise",
    }
}
