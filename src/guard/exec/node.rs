//! What the guard's physical operators share: one child, one final partition, visiting their
//! expressions, the vectorised accumulators of an aggregate's calls, and a batch in the exact
//! types of its schema.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::GroupsAccumulator;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::{EquivalenceProperties, GroupsAccumulatorAdapter, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{ExecutionPlan, Partitioning, PlanProperties};

/// The single child of a one-input operator rebuilt by `with_new_children`.
pub(crate) fn only_child(children: Vec<Arc<dyn ExecutionPlan>>, name: &str) -> Result<Arc<dyn ExecutionPlan>> {
    let mut it = children.into_iter();
    match (it.next(), it.next()) {
        (Some(c), None) => Ok(c),
        _ => Err(DataFusionError::Internal(format!("{name} takes exactly one child"))),
    }
}

/// `f` on each of `exprs` in turn until it returns `Stop` (an operator's `apply_expressions`).
pub(crate) fn apply_each<'a>(
    exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
    f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
) -> Result<TreeNodeRecursion> {
    for e in exprs {
        if f(e)? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
    }
    Ok(TreeNodeRecursion::Continue)
}

/// One partition, emitted once all input is read, bounded.
pub(crate) fn single_final_partition(schema: SchemaRef) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Final,
        Boundedness::Bounded,
    ))
}

/// One vectorised accumulator per aggregate call (DataFusion's adapter for a call without one).
pub(crate) fn groups_accumulators(aggr: &[Arc<AggregateFunctionExpr>]) -> Result<Vec<Box<dyn GroupsAccumulator>>> {
    aggr.iter()
        .map(|a| match a.groups_accumulator_supported() {
            true => a.create_groups_accumulator(),
            false => {
                let a = Arc::clone(a);
                Ok(Box::new(GroupsAccumulatorAdapter::new(move || a.create_accumulator()))
                    as Box<dyn GroupsAccumulator>)
            }
        })
        .collect()
}

/// `columns` as a batch of `schema` (they may differ from it in nullability or dictionary
/// encoding only).
pub(crate) fn batch_as(schema: SchemaRef, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    let columns = columns
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| cast(&c, f.data_type()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(schema, columns)?)
}
