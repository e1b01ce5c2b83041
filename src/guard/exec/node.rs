//! What the guard's physical operators share: one child, one final partition.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_expr::EquivalenceProperties;
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

/// One partition, emitted once all input is read, bounded.
pub(crate) fn single_final_partition(schema: SchemaRef) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Final,
        Boundedness::Bounded,
    ))
}
