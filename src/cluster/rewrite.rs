//! The client's rewrite: every partial aggregate that reads files becomes a [`ClusterExec`]
//! leaf that submits that subtree to the scheduler when first polled (below the gate: after the
//! debit) and streams the partial states back.

use std::fmt;
use std::sync::Arc;

use ballista_core::config::BallistaConfig;
use ballista_core::execution_plans::execute_physical_plan;
use ballista_core::extension::SessionConfigExt;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionConfig;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties, SendableRecordBatchStream, displayable,
};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::{StreamExt, TryStreamExt};

use super::address::Cluster;
use super::codec::DpCodec;
use crate::guard::exec::known_keys_partial::KnownKeysPartialExec;
use crate::guard::exec::planned_aggregate::PlannedAggregateExec;

/// Whether a plan sends work to a cluster.
pub fn uses_cluster(plan: &Arc<dyn ExecutionPlan>) -> bool {
    contains(plan, "ClusterExec")
}

/// Whether the subtree reads any file (a scan of a table).
fn reads_files(plan: &Arc<dyn ExecutionPlan>) -> bool {
    contains(plan, "DataSourceExec")
}

/// Whether a node named `name` is in the subtree.
fn contains(plan: &Arc<dyn ExecutionPlan>, name: &str) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        found = node.name() == name;
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// Sends the partial phase of every aggregate that reads files to `cluster`: an
/// `AggregateExec(Partial)` becomes a [`ClusterExec`] of itself; a single-phase aggregate
/// (DataFusion combines the phases when nothing lies between them) is split into a partial
/// phase on the cluster and a final phase here. The final phases — merge and release — stay on
/// the client.
pub fn distribute(plan: Arc<dyn ExecutionPlan>, cluster: &Cluster) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        // A one-phase aggregate with its memory planned (a partition selection's count), under
        // no aggregate that would take it along: sent whole, with its public facts.
        // So is the partial phase over known keys (with its keys).
        let whole = node.downcast_ref::<PlannedAggregateExec>().is_some()
            || node.downcast_ref::<KnownKeysPartialExec>().is_some();
        if whole && reads_files(&node) {
            let remote: Arc<dyn ExecutionPlan> = Arc::new(ClusterExec::new(node, cluster.clone()));
            return Ok(Transformed::new(remote, true, TreeNodeRecursion::Jump));
        }
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        if !reads_files(agg.input()) {
            return Ok(Transformed::no(node));
        }
        let replaced: Arc<dyn ExecutionPlan> = match agg.mode() {
            AggregateMode::Partial => Arc::new(ClusterExec::new(Arc::clone(&node), cluster.clone())),
            AggregateMode::Single | AggregateMode::SinglePartitioned => {
                let partial = Arc::new(AggregateExec::try_new(
                    AggregateMode::Partial,
                    agg.group_expr().clone(),
                    agg.aggr_expr().to_vec(),
                    agg.filter_expr().to_vec(),
                    Arc::clone(agg.input()),
                    agg.input_schema(),
                )?);
                let remote: Arc<dyn ExecutionPlan> = Arc::new(ClusterExec::new(partial, cluster.clone()));
                let input_schema = remote.schema();
                Arc::new(AggregateExec::try_new(
                    AggregateMode::Final,
                    agg.group_expr().as_final(),
                    agg.aggr_expr().to_vec(),
                    agg.filter_expr().to_vec(),
                    remote,
                    input_schema,
                )?)
            }
            // A final phase: its partial phase is further down.
            _ => return Ok(Transformed::no(node)),
        };
        Ok(Transformed::new(replaced, true, TreeNodeRecursion::Jump))
    })
    .map(|t| t.data)
}

/// A partial aggregate run on the cluster: a leaf that, when first polled, submits its
/// subtree to the scheduler and streams the partial states back (one partition).
#[derive(Debug)]
pub struct ClusterExec {
    remote: Arc<dyn ExecutionPlan>,
    cluster: Cluster,
    properties: Arc<PlanProperties>,
}

impl ClusterExec {
    fn new(remote: Arc<dyn ExecutionPlan>, cluster: Cluster) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(remote.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self { remote, cluster, properties }
    }
}

impl DisplayAs for ClusterExec {
    /// The cluster, then (except in the tree rendering) the plan its executors run, one operator
    /// after the other from the top, on one line.
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterExec: {}", self.cluster)?;
        if matches!(t, DisplayFormatType::TreeRender) {
            return Ok(());
        }
        let remote = displayable(self.remote.as_ref()).indent(matches!(t, DisplayFormatType::Verbose)).to_string();
        let operators: Vec<&str> = remote.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        write!(f, ", runs [{}]", operators.join("; "))
    }
}

impl ExecutionPlan for ClusterExec {
    fn name(&self) -> &str {
        "ClusterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() { Ok(self) } else { plan_err!("ClusterExec has no children") }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return datafusion::common::internal_err!("ClusterExec has one partition, asked for {partition}");
        }
        let remote = Arc::clone(&self.remote);
        let url = self.cluster.scheduler_url.clone();
        let partitions = context.session_config().target_partitions();
        let schema = remote.schema();
        let deadline = tokio::time::Instant::now() + self.cluster.job_timeout;
        let timeout = self.cluster.job_timeout.as_secs();
        // The job is submitted on the first poll: below the gate, that is after the debit.
        let submit = async move {
            let mut config = SessionConfig::new_with_ballista().with_target_partitions(partitions);
            crate::guard::no_data_dependent_aggregation(&mut config);
            let session_id = format!("dpcurve-{}", uuid_like());
            execute_physical_plan::<PhysicalPlanNode>(
                url,
                &BallistaConfig::default(),
                remote,
                &DpCodec::default(),
                session_id,
                config,
            )
            .await
        };
        let declared = Arc::clone(&schema);
        let results = futures::stream::once(submit)
            .try_flatten()
            .map(move |batch| batch.and_then(|b| as_declared(b, &declared)))
            .boxed();
        // Every batch must arrive before the deadline; past it the query fails (and, below the
        // gate, the analyst sees the withheld error: the budget was spent).
        let bounded = futures::stream::unfold(Some(results), move |state| async move {
            let mut results = state?;
            match tokio::time::timeout_at(deadline, results.next()).await {
                Ok(Some(item)) => Some((item, Some(results))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(DataFusionError::Execution(format!("the cluster did not finish the job within {timeout} s"))),
                    None,
                )),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, bounded)))
    }
}

/// `batch` with the declared schema's column types: an executor's Flight stream sends every
/// dictionary column as its values (arrow-flight's encoder hydrates dictionaries), so a group key
/// read as a dictionary arrives as plain text and is encoded again here. Whether a column is cast
/// is a function of the plan's types only, and the batch keeps its own fields otherwise (their
/// nullability is not checked again: a check that rows could fail). Re-encoding fails only for a
/// batch with more distinct values than the dictionary's key type indexes: a private table's
/// columns have 32- or 64-bit keys (narrower ones are refused while planning, rule
/// `narrow-dictionary`), which index any batch; a public table's keys may fail, as they would in
/// one process reading the file.
fn as_declared(batch: RecordBatch, declared: &SchemaRef) -> Result<RecordBatch> {
    let schema = batch.schema();
    if schema.fields().iter().zip(declared.fields()).all(|(a, b)| a.data_type() == b.data_type()) {
        return Ok(batch);
    }
    let (mut fields, mut columns) = (Vec::new(), Vec::new());
    for ((field, column), want) in schema.fields().iter().zip(batch.columns()).zip(declared.fields()) {
        let t = want.data_type();
        fields.push(field.as_ref().clone().with_data_type(t.clone()));
        columns.push(if column.data_type() == t { Arc::clone(column) } else { cast(column, t)? });
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())), columns)?)
}

/// A session id for the scheduler (not secret: it names the job there).
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}
