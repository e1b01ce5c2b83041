//! Releases first, everything else after: no paid result is lost to a later failure.
//!
//! A query can pay for a release and then fail in a part that has nothing to do with it — a
//! `CAST` over a public table joined to the release, a public subquery — and the release, drawn
//! and charged, would never reach the analyst. So every private aggregate's final phase (the node
//! that releases) is wrapped in a [`PrefetchExec`]; after the debit and the partition selections,
//! the gate runs each of them to completion, innermost first, and keeps their rows (one row per
//! public group: small). Only then does the rest of the plan run, reading the kept rows. If the
//! rest fails, every release is already stored, and the gate's error names them.

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};

use super::canonical_groups::CanonicalGroupsExec;
use super::node::{only_child, single_final_partition};
use crate::functions::{Permits, permits_of};

/// Wraps the releasing node of every private aggregate over a private table (an ungrouped
/// aggregate's final phase, or a [`CanonicalGroupsExec`]) in a [`PrefetchExec`].
pub fn prefetch_releases(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let releases = if node.downcast_ref::<CanonicalGroupsExec>().is_some() {
            true
        } else if let Some(agg) = node.downcast_ref::<AggregateExec>() {
            !matches!(agg.mode(), AggregateMode::Partial | AggregateMode::PartialReduce)
                && agg.aggr_expr().iter().any(|e| matches!(permits_of(e.fun()), Some(Permits::Slot(_))))
        } else {
            false
        };
        if !releases {
            return Ok(Transformed::no(node));
        }
        Ok(Transformed::yes(Arc::new(PrefetchExec::new(node)) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// The prefetch nodes of `plan`, innermost first (a release another release's input depends on
/// is fetched before it).
pub fn prefetches(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
    fn walk(node: &Arc<dyn ExecutionPlan>, out: &mut Vec<Arc<dyn ExecutionPlan>>) {
        for c in node.children() {
            walk(c, out);
        }
        if node.downcast_ref::<PrefetchExec>().is_some() {
            out.push(Arc::clone(node));
        }
    }
    let mut out = Vec::new();
    walk(plan, &mut out);
    out
}

/// Runs a prefetch node's input to completion and keeps its rows (the gate, after the debit).
pub async fn fill(node: &Arc<dyn ExecutionPlan>, context: Arc<TaskContext>) -> Result<()> {
    let Some(p) = node.downcast_ref::<PrefetchExec>() else {
        return Err(DataFusionError::Internal("not a prefetch node".into()));
    };
    let batches = datafusion::physical_plan::collect(Arc::clone(&p.input), context).await?;
    *p.kept.lock().map_err(|_| DataFusionError::Internal("prefetch lock poisoned".into()))? = Some(batches);
    Ok(())
}

/// A release computed ahead of the rest of the plan (module docs): yields the rows the gate
/// kept (once), or runs its input when nothing is kept (a plan run without its gate).
#[derive(Debug)]
pub struct PrefetchExec {
    input: Arc<dyn ExecutionPlan>,
    kept: Arc<Mutex<Option<Vec<RecordBatch>>>>,
    properties: Arc<PlanProperties>,
}

impl PrefetchExec {
    fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let input: Arc<dyn ExecutionPlan> = if input.output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(input))
        } else {
            input
        };
        Self::with_input(input, Arc::new(Mutex::new(None)))
    }

    fn with_input(input: Arc<dyn ExecutionPlan>, kept: Arc<Mutex<Option<Vec<RecordBatch>>>>) -> Self {
        let properties = single_final_partition(input.schema());
        Self { input, kept, properties }
    }
}

impl DisplayAs for PrefetchExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrefetchExec")
    }
}

impl ExecutionPlan for PrefetchExec {
    fn name(&self) -> &str {
        "PrefetchExec"
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
        let input = only_child(children, "PrefetchExec")?;
        Ok(Arc::new(Self::with_input(input, Arc::clone(&self.kept))))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        // Taken, not copied: the kept rows are this execution's, read once; a second run of the
        // subtree (below the gate, or re-executed) runs its input and finds no permit.
        let kept = self.kept.lock().map_err(|_| DataFusionError::Internal("prefetch lock poisoned".into()))?.take();
        match kept {
            Some(batches) => Ok(Box::pin(RecordBatchStreamAdapter::new(
                self.input.schema(),
                futures::stream::iter(batches.into_iter().map(Ok)),
            ))),
            None => self.input.execute(partition, context),
        }
    }
}
