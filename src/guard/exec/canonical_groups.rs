//! The final phase of every grouped private aggregate, in one canonical public order
//! (SPEC §0, §7).
//!
//! DataFusion's hash aggregate emits groups in the order its hash table holds them — the order
//! the rows arrived in, a function of the data — and evaluates (so releases, and numbers the
//! releases) in that order. For a private aggregate that order is observable: which group comes
//! first, and which release id it gets, would tell whether one row exists. So the final phase of
//! a grouped private aggregate is not DataFusion's: [`CanonicalGroupsExec`] reads the partial
//! states, merges each group's into its accumulators, and then evaluates **every** public group —
//! the declared keys in their declared order, or the keys a partition selection chose, sorted —
//! exactly once, in that order, whether rows reached it or not (an empty group is released from an
//! empty state: noise only). The output is one batch with one row per public group; release ids are
//! taken in the same order from the block the gate reserved with the debit.
//!
//! Group keys are compared in Arrow's row encoding of the grouping expression's type (after
//! planning: a key the data owner declared as text is compared as the value it is in that type);
//! a state row whose key is not a public group (a selection's filler rows: the selected groups a
//! partition's rows did not reach) is merged like every other, into a spare group that is never
//! evaluated, so the final phase's work depends on how many state rows the partial phases emit (a
//! fact of the plan), never on which of them a partition's rows reached.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::EmitTo;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::{InterleaveExec, UnionExec};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::StreamExt;

use super::known_keys_partial::KnownGroups;
use super::node::{batch_as, groups_accumulators, only_child, single_final_partition};
use super::unit_phase::Exchange;
use crate::functions::{PermitSlot, permits_of};
use crate::guard::ops::sample_order::SampleOrder;

/// The public groups of a grouped private aggregate.
#[derive(Debug, Clone)]
enum PublicGroups {
    /// Declared keys, one tuple per group, in declared order.
    Declared(Arc<Vec<Vec<ScalarValue>>>),
    /// The keys the execution's partition selection chose (read from the call's permit slot
    /// when the gate has run the selection), sorted.
    Selected(Arc<PermitSlot>),
}

/// Replaces the final phase of every grouped private aggregate of `plan` by a
/// [`CanonicalGroupsExec`] (a single-phase aggregate is split into DataFusion's partial phase
/// and this final phase). It reads every partition of its input, so in this process it reads the
/// partial phase's partitions as they come, each run on its own task (`CoalescePartitionsExec`),
/// instead of the repartition of the states by key that the final phase was planned over (which
/// copies every state twice: `Exchange::InProcess`); on a cluster that repartition is the stage
/// boundary the partial phase's executors write to, and stays.
pub fn canonical_final_phases(plan: Arc<dyn ExecutionPlan>, exchange: Exchange) -> Result<Arc<dyn ExecutionPlan>> {
    unions_over_grouped_releases(plan)?
        .transform_up(|node| {
            let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
            let Some(groups) = public_groups(agg) else { return Ok(Transformed::no(node)) };
            let states: Arc<dyn ExecutionPlan> = match agg.mode() {
                AggregateMode::Final | AggregateMode::FinalPartitioned => match exchange {
                    Exchange::InProcess => match agg.input().downcast_ref::<RepartitionExec>() {
                        Some(repartition) => Arc::new(CoalescePartitionsExec::new(Arc::clone(repartition.input()))),
                        None => Arc::clone(agg.input()),
                    },
                    Exchange::Shuffle => Arc::clone(agg.input()),
                },
                AggregateMode::Single | AggregateMode::SinglePartitioned => Arc::new(AggregateExec::try_new(
                    AggregateMode::Partial,
                    agg.group_expr().clone(),
                    agg.aggr_expr().to_vec(),
                    agg.filter_expr().to_vec(),
                    Arc::clone(agg.input()),
                    agg.input_schema(),
                )?),
                _ => return Ok(Transformed::no(node)),
            };
            let exec = CanonicalGroupsExec {
                width: agg.group_expr().expr().len(),
                aggr: agg.aggr_expr().to_vec(),
                schema: agg.schema(),
                properties: single_final_partition(agg.schema()),
                input: states,
                groups,
                metrics: ExecutionPlanMetricsSet::new(),
            };
            Ok(Transformed::new(Arc::new(exec), true, TreeNodeRecursion::Continue))
        })
        .map(|t| t.data)
}

/// The public groups of `agg` when it is a grouped private aggregate.
fn public_groups(agg: &AggregateExec) -> Option<PublicGroups> {
    if agg.group_expr().is_empty() {
        return None;
    }
    agg.aggr_expr().iter().find_map(|e| {
        let permits = permits_of(e.fun())?;
        match (permits.groups(), permits.slot()) {
            (Some(g), _) => Some(PublicGroups::Declared(g)),
            (None, Some(slot)) if slot.is_selection() => Some(PublicGroups::Selected(Arc::clone(slot))),
            _ => None,
        }
    })
}

/// The public groups of `agg` when it is a grouped private aggregate, as the partial phase over
/// known keys takes them.
pub fn known_groups_of(agg: &AggregateExec) -> Option<KnownGroups> {
    Some(match public_groups(agg)? {
        PublicGroups::Declared(keys) => KnownGroups::Declared(keys),
        PublicGroups::Selected(slot) => KnownGroups::Selected(slot),
    })
}

/// DataFusion interleaves a union whose inputs share one hash partitioning (an `InterleaveExec`
/// keeps it without a shuffle). A grouped private aggregate's final phase becomes one partition
/// here, so a union above one can no longer be interleaved: it becomes a plain union
/// repartitioned to the same partitioning, the property its parent was planned against (its rows
/// are one per public group: small).
fn unions_over_grouped_releases(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    fn releases_groups(node: &Arc<dyn ExecutionPlan>) -> bool {
        node.downcast_ref::<AggregateExec>().is_some_and(|a| public_groups(a).is_some())
            || node.children().into_iter().any(releases_groups)
    }
    plan.transform_up(|node| {
        let Some(interleave) = node.downcast_ref::<InterleaveExec>() else { return Ok(Transformed::no(node)) };
        if !interleave.inputs().iter().any(releases_groups) {
            return Ok(Transformed::no(node));
        }
        let partitioning = interleave.properties().output_partitioning().clone();
        let union = UnionExec::try_new(interleave.inputs().clone())?;
        Ok(Transformed::yes(Arc::new(RepartitionExec::try_new(union, partitioning)?) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// Merges the partial states of a grouped private aggregate and releases every public group once,
/// in canonical order (module docs).
#[derive(Debug)]
pub struct CanonicalGroupsExec {
    /// The partial phase: group columns, then each aggregate's state fields.
    input: Arc<dyn ExecutionPlan>,
    /// Number of group columns.
    width: usize,
    aggr: Vec<Arc<AggregateFunctionExpr>>,
    groups: PublicGroups,
    /// The replaced final aggregate's output schema.
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    /// `merged_states`: state rows merged; `group_states`: those of them a public group's.
    metrics: ExecutionPlanMetricsSet,
}

impl DisplayAs for CanonicalGroupsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.groups {
            PublicGroups::Declared(g) => write!(f, "CanonicalGroupsExec: declared groups={}", g.len()),
            PublicGroups::Selected(_) => write!(f, "CanonicalGroupsExec: selected groups, sorted"),
        }
    }
}

impl ExecutionPlan for CanonicalGroupsExec {
    fn name(&self) -> &str {
        "CanonicalGroupsExec"
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
        let input = only_child(children, "CanonicalGroupsExec")?;
        Ok(Arc::new(Self {
            input,
            width: self.width,
            aggr: self.aggr.clone(),
            groups: self.groups.clone(),
            schema: Arc::clone(&self.schema),
            properties: Arc::clone(&self.properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let merged_states = MetricBuilder::new(&self.metrics).counter("merged_states", partition);
        let group_states = MetricBuilder::new(&self.metrics).counter("group_states", partition);
        let parts = self.input.output_partitioning().partition_count();
        let streams = (0..parts).map(|p| self.input.execute(p, Arc::clone(&context))).collect::<Result<Vec<_>>>()?;
        let input_schema = self.input.schema();
        let key_types: Vec<DataType> =
            input_schema.fields()[..self.width].iter().map(|f| f.data_type().clone()).collect();
        let (width, aggr, groups, schema) =
            (self.width, self.aggr.clone(), self.groups.clone(), Arc::clone(&self.schema));
        let out_schema = Arc::clone(&schema);
        let all = async move {
            let converter = RowConverter::new(key_types.iter().map(|t| SortField::new(t.clone())).collect())?;
            let mut merged = futures::stream::select_all(streams);
            // The public groups, indexed in canonical order: declared, in declared order; or
            // selected, found in the states (the membership filter lets only the selected groups'
            // rows through, and every selected group has rows) and sorted once all are seen.
            let mut pending = Vec::new();
            let (encoded, key_columns) = match &groups {
                PublicGroups::Declared(tuples) => declared_groups(tuples, &converter, &key_types)?,
                PublicGroups::Selected(slot) => {
                    // A state row's key is a selected group's when its keyed hash was selected
                    // (a partial phase emits the groups no row reached under a filler key).
                    // Every state row's key is noted the same way, a filler's too (the same work
                    // whichever groups a partition's rows reached), with whether it was selected.
                    let chosen = SelectedHashes::of(slot);
                    let mut keys = std::collections::BTreeMap::<Vec<u8>, bool>::new();
                    while let Some(batch) = merged.next().await {
                        let batch = batch?;
                        let columns = &batch.columns()[..width];
                        let selected = chosen.contains(columns)?;
                        let rows = converter.convert_columns(columns)?;
                        for (key, selected) in rows.iter().zip(selected) {
                            *keys.entry(key.as_ref().to_vec()).or_default() |= selected;
                        }
                        pending.push(batch);
                    }
                    // Sorted by value; never more than were selected (two keys whose 128-bit
                    // hashes collide, probability 2⁻¹²⁸ per pair, are the only way to see more).
                    let selected = slot.selected().map_or(0, |k| k.len());
                    let keys: Vec<Vec<u8>> =
                        keys.into_iter().filter(|(_, chosen)| *chosen).map(|(k, _)| k).take(selected).collect();
                    let parser = converter.parser();
                    let columns = converter.convert_rows(keys.iter().map(|k| parser.parse(k)))?;
                    (keys, columns)
                }
            };
            let index: HashMap<&[u8], usize> = encoded.iter().enumerate().map(|(i, k)| (k.as_slice(), i)).collect();
            let groups = encoded.len();
            // One vectorised accumulator per aggregate over the public groups and one spare group
            // (index `groups`, never evaluated) that takes every other state row (DataFusion's
            // adapter for an aggregate without one).
            let (spare, total) = (groups, groups + 1);
            let mut accs = groups_accumulators(&aggr)?;
            let widths: Vec<usize> =
                aggr.iter().map(|a| a.state_fields().map(|f| f.len())).collect::<Result<Vec<_>>>()?;
            // Merges a batch of partial states as it is, every row of it: a public group's row into
            // its group, any other (a selection's filler rows, the groups no row of a partition
            // reached) into the spare, so the work is a function of the batch's length, never of
            // which of its rows a partition's data reached. Every group exists from the first
            // merge on, rows or not.
            let mut merge = |batch: &RecordBatch| -> Result<()> {
                let rows = converter.convert_columns(&batch.columns()[..width])?;
                let group_indices: Vec<usize> =
                    rows.iter().map(|key| index.get(key.as_ref()).copied().unwrap_or(spare)).collect();
                merged_states.add(batch.num_rows());
                group_states.add(group_indices.iter().filter(|&&g| g != spare).count());
                let mut offset = width;
                for (acc, n) in accs.iter_mut().zip(&widths) {
                    acc.merge_batch(&batch.columns()[offset..offset + n], &group_indices, total)?;
                    offset += n;
                }
                Ok(())
            };
            merge(&RecordBatch::new_empty(Arc::clone(&input_schema)))?;
            for batch in &pending {
                merge(batch)?;
            }
            while let Some(batch) = merged.next().await {
                merge(&batch?)?;
            }
            if groups == 0 {
                return Ok::<_, DataFusionError>(RecordBatch::new_empty(schema));
            }
            // Every public group, in canonical order, exactly once (an empty group is released
            // from an empty state); the spare stays behind, unreleased.
            let mut columns = key_columns;
            for acc in accs.iter_mut() {
                columns.push(acc.evaluate(EmitTo::First(groups))?);
            }
            batch_as(schema, columns)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, futures::stream::once(all))))
    }
}

/// The key hashes a partition selection chose, and the keyed hash that computes them.
struct SelectedHashes {
    hashes: HashSet<u128>,
    order: Option<SampleOrder>,
}

impl SelectedHashes {
    /// What `slot`'s selection chose (nothing before it ran).
    fn of(slot: &PermitSlot) -> Self {
        let hashes = slot
            .selected()
            .map(|keys| {
                keys.iter().filter_map(|k| <[u8; 16]>::try_from(k.as_slice()).ok()).map(u128::from_be_bytes).collect()
            })
            .unwrap_or_default();
        Self { hashes, order: slot.selection_hash_key().map(SampleOrder::with_key) }
    }

    /// Whether each row of the key `columns` is a selected key.
    fn contains(&self, columns: &[ArrayRef]) -> Result<Vec<bool>> {
        let rows = columns.first().map_or(0, |c| c.len());
        Ok(match &self.order {
            Some(order) => order.hashes(columns)?.iter().map(|h| self.hashes.contains(h)).collect(),
            None => vec![false; rows],
        })
    }
}

/// The declared groups in declared order: each one's key in `converter`'s row encoding, and the
/// key columns (one array per group column, one row per group).
fn declared_groups(
    tuples: &[Vec<ScalarValue>],
    converter: &RowConverter,
    key_types: &[DataType],
) -> Result<(Vec<Vec<u8>>, Vec<ArrayRef>)> {
    if tuples.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let columns = key_types
        .iter()
        .enumerate()
        .map(|(c, t)| Ok(cast(&ScalarValue::iter_to_array(tuples.iter().map(|g| g[c].clone()))?, t)?))
        .collect::<Result<Vec<ArrayRef>>>()?;
    let rows = converter.convert_columns(&columns)?;
    Ok((rows.iter().map(|r| r.as_ref().to_vec()).collect(), columns))
}
