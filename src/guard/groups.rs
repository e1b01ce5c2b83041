//! `GROUP BY` over declared public keys (SPEC §7).
//!
//! A private aggregate may be grouped by plain columns of its private table whose keys the
//! data owner declared (`dpcurve admin set-keys`). The result then has exactly one row per
//! declared key (per combination of keys, for several columns), whatever the data: rows with
//! undeclared keys are dropped by a filter the guard adds below the aggregate, and groups no
//! row reached are released by [`DeclaredGroupsExec`] from an empty state — noise only. The
//! groups are disjoint, so one call costs one charge (parallel composition; the privacy unit is
//! the row). Grouping by an expression, or with `ROLLUP`/`CUBE`/`GROUPING SETS`, is refused
//! (`no-group-by`); columns without declared keys group only through a paid partition selection
//! ([`super::selection`]).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, ScalarValue, plan_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, Filter, LogicalPlan, in_list};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
};
use futures::TryStreamExt;

use super::bounds::trace_column;
use crate::functions::{is_private, permits_of};

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

/// Wraps every final grouped private aggregate of `plan` in a [`DeclaredGroupsExec`] that adds
/// the declared groups no row reached.
pub fn complete_declared_groups(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        if matches!(agg.mode(), AggregateMode::Partial) || agg.group_expr().is_empty() {
            return Ok(Transformed::no(node));
        }
        let groups = agg.aggr_expr().iter().find_map(|e| permits_of(e.fun()).and_then(|p| p.groups()));
        match groups {
            Some(groups) => Ok(Transformed::yes(Arc::new(DeclaredGroupsExec::new(Arc::clone(&node), groups)))),
            None => Ok(Transformed::no(node)),
        }
    })
    .map(|t| t.data)
}

/// Passes a grouped aggregate's rows through, then releases every declared group it did not
/// output from an empty accumulator (noise only), so the output has one row per declared group.
#[derive(Debug)]
pub struct DeclaredGroupsExec {
    input: Arc<dyn ExecutionPlan>,
    groups: Arc<Vec<Vec<ScalarValue>>>,
    properties: Arc<PlanProperties>,
}

impl DeclaredGroupsExec {
    fn new(aggregate: Arc<dyn ExecutionPlan>, groups: Arc<Vec<Vec<ScalarValue>>>) -> Self {
        let input: Arc<dyn ExecutionPlan> = if aggregate.output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(aggregate))
        } else {
            aggregate
        };
        Self::with_input(input, groups)
    }

    fn with_input(input: Arc<dyn ExecutionPlan>, groups: Arc<Vec<Vec<ScalarValue>>>) -> Self {
        // One partition, and no claimed ordering: the groups added at the end break any order
        // the aggregate had.
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self { input, groups, properties }
    }

    fn aggregate(&self) -> Result<&AggregateExec> {
        let node =
            if let Some(c) = self.input.downcast_ref::<CoalescePartitionsExec>() { c.input() } else { &self.input };
        node.downcast_ref::<AggregateExec>()
            .ok_or_else(|| DataFusionError::Internal("DeclaredGroupsExec must wrap an aggregate".into()))
    }
}

impl DisplayAs for DeclaredGroupsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeclaredGroupsExec: groups={}", self.groups.len())
    }
}

impl ExecutionPlan for DeclaredGroupsExec {
    fn name(&self) -> &str {
        "DeclaredGroupsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    #[allow(deprecated)]
    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = super::gate::only_child(children, "DeclaredGroupsExec")?;
        Ok(Arc::new(Self::with_input(input, Arc::clone(&self.groups))))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let schema = self.input.schema();
        let stream = self.input.execute(partition, context)?;
        let aggr = self.aggregate()?.aggr_expr().to_vec();
        let width = self.groups.first().map_or(0, Vec::len);
        let groups = Arc::clone(&self.groups);
        let schema2 = Arc::clone(&schema);
        let all = async move {
            let batches: Vec<RecordBatch> = stream.try_collect().await?;
            let mut seen: HashSet<Vec<ScalarValue>> = HashSet::new();
            for b in &batches {
                for row in 0..b.num_rows() {
                    let key =
                        (0..width).map(|c| ScalarValue::try_from_array(b.column(c), row)).collect::<Result<_>>()?;
                    seen.insert(key);
                }
            }
            let missing: Vec<&Vec<ScalarValue>> = groups.iter().filter(|g| !seen.contains(*g)).collect();
            let mut out = batches;
            if !missing.is_empty() {
                let mut columns = Vec::with_capacity(schema2.fields().len());
                for c in 0..width {
                    columns.push(ScalarValue::iter_to_array(missing.iter().map(|g| g[c].clone()))?);
                }
                for a in &aggr {
                    // One empty accumulator per missing group: its release is noise only, and
                    // takes one of the call's permits like any other group.
                    let values =
                        missing.iter().map(|_| a.create_accumulator()?.evaluate()).collect::<Result<Vec<_>>>()?;
                    columns.push(ScalarValue::iter_to_array(values)?);
                }
                // Group values may differ in nullability only; cast to the aggregate's schema.
                let columns = columns
                    .into_iter()
                    .zip(schema2.fields())
                    .map(|(c, f)| datafusion::arrow::compute::cast(&c, f.data_type()))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                out.push(RecordBatch::try_new(Arc::clone(&schema2), columns)?);
            }
            Ok::<_, DataFusionError>(futures::stream::iter(out.into_iter().map(Ok)))
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::once(all).try_flatten())))
    }
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
