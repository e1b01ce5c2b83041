//! The partial phase of a private aggregate whose groups are known before its rows are read —
//! declared keys, or the keys the gate's partition selection chose: each row's group found in a
//! table whose size the public keys fix, never one that grows with the groups rows reach.
//!
//! DataFusion's partial hash aggregate interns every row's key in a hash table (hash, probe,
//! compare) that grows as rows reach new groups: one more row reaching one more group can
//! rehash every group the partition holds, and the work of the statistics vectors behind it
//! doubles at the same counts — a step in time at a count of groups, which one row can move
//! (SPEC §0). It is also the largest single cost of `SELECT g, private_kde(x, …) … GROUP BY g`
//! after the binning. Here [`KnownKeysPartialExec`] finds a row's group in a
//! [`KeyTable`](super::key_table) built before the first row: one integer column with one
//! subtraction and one lookup in a dense table (or a small hash map when the keys are spread
//! out), any other key (several columns, text, dates) by its row encoding in a map of the
//! declared keys. It feeds the same vectorised accumulators (`GroupsAccumulator`) with every
//! group allocated from the first batch. A row whose key is not declared (or is null) goes to one
//! spare group whose state is never emitted — the same work as any row, and memory fixed by the
//! declared keys whatever the data. Each partition emits one batch: every declared group's key and
//! partial state, in declared order (groups without rows carry an empty state, which merges as
//! nothing).
//!
//! The guard filters a grouped call's rows to the declared keys (so that no undeclared key makes
//! a group). Below this operator that filter has nothing left to do: every conjunct of the
//! filter right below that reads the key columns only, and holds for every declared key, is
//! dropped (rows it would have dropped have undeclared keys, which the spare group takes), and
//! with it the filter when nothing else is left.
//!
//! Over private keys the keys are those the gate's partition selection chose. Counted by value
//! (one integer column, rows are units: `passes::selection`), the table is built from them when
//! the partition starts, and the selection's membership filter below is dropped the same way (a
//! row of an unselected key goes to the spare group; a selected NULL key is a group of its own).
//! Counted by hash (other keys, or privacy units), only the number selected is known when the
//! partition starts: the groups are [`FirstSeen`](super::key_table::FirstSeen) — the membership
//! filter stays below, and each selected key becomes a group when its first row arrives, in a
//! table with room for all of them from the start. The partition emits every group it holds: those
//! its rows reached, and for the others its type's default key with an empty state, which the final
//! phase merges like every state — into a spare group it never releases, or as nothing into the
//! default key's group when that key was selected — so a row that is the first of its group in a
//! partition adds no state to emit, serialise or merge, and none that the final phase would skip.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, new_null_array};
use datafusion::arrow::compute::{CastOptions, cast, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue, internal_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::EmitTo;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, Literal, NotExpr,
};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr, conjunction, split_conjunction};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::key_table::{FirstSeen, KeyTable};
use super::node::{batch_as, groups_accumulators, only_child};
use crate::functions::PermitSlot;
use crate::guard::ops::key_range::KeyRange;
use crate::guard::ops::selected::{IntegerSelection, SelectedFilter, SelectedKeys};

/// The public groups of a grouped private aggregate, as this operator needs them.
#[derive(Debug, Clone)]
pub enum KnownGroups {
    /// Declared keys, one tuple per group, in declared order.
    Declared(Arc<Vec<Vec<ScalarValue>>>),
    /// Keys a partition selection chooses (the call's permit slot holds them once chosen).
    Selected(Arc<PermitSlot>),
}

/// Replaces every partial phase of a private aggregate whose keys are known (`known_of`) with a
/// [`KnownKeysPartialExec`]; other nodes are returned unchanged.
pub fn known_keys_partials(
    plan: Arc<dyn ExecutionPlan>,
    known_of: impl Fn(&AggregateExec) -> Option<KnownGroups>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        if *agg.mode() != AggregateMode::Partial || !agg.group_expr().is_single() || agg.group_expr().is_empty() {
            return Ok(Transformed::no(node));
        }
        let Some(groups) = known_of(agg) else { return Ok(Transformed::no(node)) };
        let Some(exec) = KnownKeysPartialExec::try_new(agg, groups)? else { return Ok(Transformed::no(node)) };
        Ok(Transformed::new(Arc::new(exec) as Arc<dyn ExecutionPlan>, true, TreeNodeRecursion::Continue))
    })
    .map(|t| t.data)
}

/// Where the keys come from.
#[derive(Debug, Clone)]
enum Keys {
    /// The declared keys in declared order: in the key expressions' types (`declared`) and the
    /// output's (`columns`), and their table.
    Declared { declared: Vec<ArrayRef>, columns: Vec<ArrayRef>, table: Arc<KeyTable> },
    /// The values of one integer column the gate's selection chooses, read when a partition
    /// starts.
    SelectedIntegers(Arc<SelectedKeys>),
    /// Keys the gate's selection chooses by hash: how many.
    SelectedHashes(Expected),
}

/// How many groups a selection by hash chose.
#[derive(Debug, Clone)]
enum Expected {
    /// Read from the call's permit slot when a partition starts (after the gate selected).
    Slot(Arc<PermitSlot>),
    /// Known (an executor's copy, sent after the gate selected).
    Count(usize),
}

impl Expected {
    fn count(&self) -> usize {
        match self {
            Expected::Slot(slot) => slot.selected().map_or(0, |k| k.len()),
            Expected::Count(n) => *n,
        }
    }
}

/// The public keys of a [`KnownKeysPartialExec`] as plain values, to send it to a cluster's
/// executors once the gate has run any selection.
#[derive(Debug, Clone, PartialEq)]
pub enum PublicKeys {
    /// The declared tuples, one column per key expression, in its type.
    Declared(Vec<ArrayRef>),
    /// The values of one integer key column a selection chose.
    Integers(IntegerSelection),
    /// How many keys a selection chose by hash.
    Count(usize),
}

/// The partial phase of a private aggregate over known keys (module docs).
#[derive(Debug, Clone)]
pub struct KnownKeysPartialExec {
    input: Arc<dyn ExecutionPlan>,
    /// The replaced partial aggregate's grouping and input schema (to send it to a cluster).
    group_by: PhysicalGroupBy,
    input_schema: SchemaRef,
    key: Vec<Arc<dyn PhysicalExpr>>,
    aggr: Vec<Arc<AggregateFunctionExpr>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    keys: Keys,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    /// Rows emitted per partition (EXPLAIN ANALYZE).
    metrics: ExecutionPlanMetricsSet,
}

impl KnownKeysPartialExec {
    /// The replacement of `agg` (a partial phase grouped by plain expressions), or None when a
    /// key's type has no row encoding or a declared key is not one of its column's values.
    fn try_new(agg: &AggregateExec, groups: KnownGroups) -> Result<Option<Self>> {
        let input_schema = agg.input_schema();
        let key: Vec<Arc<dyn PhysicalExpr>> = agg.group_expr().expr().iter().map(|(e, _)| Arc::clone(e)).collect();
        let types = key.iter().map(|e| e.data_type(&input_schema)).collect::<Result<Vec<_>>>()?;
        if !RowConverter::supports_fields(&types.iter().map(|t| SortField::new(t.clone())).collect::<Vec<_>>()) {
            return Ok(None);
        }
        let one_integer = matches!(&types[..], [t] if t.is_integer());
        let (input, keys) = match groups {
            KnownGroups::Declared(tuples) => {
                if tuples.iter().any(|t| t.len() != key.len()) {
                    return Ok(None);
                }
                let Some(declared) = declared_columns(&tuples, &types)? else { return Ok(None) };
                let input = without_key_filters(agg.input(), &key, &declared)?;
                let Some(keys) = declared_keys(agg, declared, &types)? else { return Ok(None) };
                (input, keys)
            }
            KnownGroups::Selected(slot) => {
                // The types the selection's filter compares by value (`integer_keys`).
                let by_value = one_integer && !matches!(types[0], DataType::UInt64);
                match by_value.then(|| without_membership(agg.input(), &key[0])).transpose()?.flatten() {
                    Some((input, selected)) => (input, Keys::SelectedIntegers(selected)),
                    None if FirstSeen::holds(&types) => {
                        (Arc::clone(agg.input()), Keys::SelectedHashes(Expected::Slot(slot)))
                    }
                    None => return Ok(None),
                }
            }
        };
        Ok(Some(Self::over(agg, input, keys)))
    }

    /// The operator replacing `agg`, over `input`.
    fn over(agg: &AggregateExec, input: Arc<dyn ExecutionPlan>, keys: Keys) -> Self {
        Self {
            input,
            group_by: agg.group_expr().clone(),
            input_schema: agg.input_schema(),
            key: agg.group_expr().expr().iter().map(|(e, _)| Arc::clone(e)).collect(),
            aggr: agg.aggr_expr().to_vec(),
            filters: agg.filter_expr().to_vec(),
            keys,
            schema: agg.schema(),
            properties: Arc::clone(agg.properties()),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The operator an executor runs: `agg` (the partial aggregate [`Self::template_over`] sent)
    /// over its input as it is, with `keys` ([`Self::public_keys`]).
    pub fn shipped(agg: &AggregateExec, keys: PublicKeys) -> Result<Self> {
        let input_schema = agg.input_schema();
        let types =
            agg.group_expr().expr().iter().map(|(e, _)| e.data_type(&input_schema)).collect::<Result<Vec<_>>>()?;
        let keys = match keys {
            PublicKeys::Declared(declared) => match declared_keys(agg, declared, &types)? {
                Some(keys) => keys,
                None => return internal_err!("the declared keys sent are not values of the key columns"),
            },
            PublicKeys::Integers(selection) => {
                let selected = SelectedKeys::default();
                selected.set_integers(selection)?;
                Keys::SelectedIntegers(Arc::new(selected))
            }
            PublicKeys::Count(n) => Keys::SelectedHashes(Expected::Count(n)),
        };
        Ok(Self::over(agg, Arc::clone(agg.input()), keys))
    }

    /// The replaced partial aggregate over `input` (what a cluster's codec sends).
    pub fn template_over(&self, input: Arc<dyn ExecutionPlan>) -> Result<AggregateExec> {
        AggregateExec::try_new(
            AggregateMode::Partial,
            self.group_by.clone(),
            self.aggr.clone(),
            self.filters.clone(),
            input,
            Arc::clone(&self.input_schema),
        )
    }

    /// Its public keys as they are now (after the gate ran any selection).
    pub fn public_keys(&self) -> Result<PublicKeys> {
        Ok(match &self.keys {
            Keys::Declared { declared, .. } => PublicKeys::Declared(declared.clone()),
            Keys::SelectedIntegers(selected) => match selected.integer_selection()? {
                Some(selection) => PublicKeys::Integers(selection),
                None => return internal_err!("a partition selection over one integer key was not counted by value"),
            },
            Keys::SelectedHashes(expected) => PublicKeys::Count(expected.count()),
        })
    }
}

/// The keys of `agg` (grouped by keys of `types`) declared as `declared` (one column per key, in
/// its type), or None when a declared integer key is not an Int64.
fn declared_keys(agg: &AggregateExec, declared: Vec<ArrayRef>, types: &[DataType]) -> Result<Option<Keys>> {
    let table = match types {
        [t] if t.is_integer() => {
            let options = CastOptions { safe: true, ..Default::default() };
            let as_i64 = cast_with_options(&declared[0], &DataType::Int64, &options)?;
            if as_i64.null_count() > 0 {
                return Ok(None);
            }
            let values = as_i64.as_primitive::<Int64Type>().values().to_vec();
            KeyTable::integers(&values, values.len() as u32)
        }
        _ => KeyTable::rows(&declared, types)?,
    };
    let outputs = agg.schema();
    let columns = declared
        .iter()
        .zip(outputs.fields())
        .map(|(c, f)| cast(c, f.data_type()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Some(Keys::Declared { declared, columns, table: Arc::new(table) }))
}

impl KnownKeysPartialExec {
    /// The aggregates it evaluates on its input's rows.
    pub fn aggr_expr(&self) -> &[Arc<AggregateFunctionExpr>] {
        &self.aggr
    }
}

/// The declared tuples as one column per key of `types`, or None when a declared value is not
/// one of its column's values.
fn declared_columns(tuples: &[Vec<ScalarValue>], types: &[DataType]) -> Result<Option<Vec<ArrayRef>>> {
    let options = CastOptions { safe: true, ..Default::default() };
    let mut columns = Vec::with_capacity(types.len());
    for (c, t) in types.iter().enumerate() {
        let declared = ScalarValue::iter_to_array(tuples.iter().map(|tuple| tuple[c].clone()))?;
        let column = cast_with_options(&declared, t, &options)?;
        if column.null_count() > declared.null_count() || declared.null_count() > 0 {
            return Ok(None);
        }
        columns.push(column);
    }
    Ok(Some(columns))
}

/// A plan without a selection's membership test, and the keys that test checked.
type WithoutMembership = (Arc<dyn ExecutionPlan>, Arc<SelectedKeys>);

/// `input`, a filter holding the membership test of a partition selection on the `key` column,
/// without that test, and the keys it tests against; None for any other input.
fn without_membership(
    input: &Arc<dyn ExecutionPlan>,
    key: &Arc<dyn PhysicalExpr>,
) -> Result<Option<WithoutMembership>> {
    let (Some(filter), Some(key)) = (input.downcast_ref::<FilterExec>(), key.downcast_ref::<Column>()) else {
        return Ok(None);
    };
    if filter.projection().is_some() {
        return Ok(None);
    }
    let membership = |c: &Arc<dyn PhysicalExpr>| {
        let f = c.downcast_ref::<ScalarFunctionExpr>()?;
        let selected = f.fun().inner().downcast_ref::<SelectedFilter>()?;
        let [arg] = f.args() else { return None };
        (arg.downcast_ref::<Column>()?.index() == key.index()).then(|| Arc::clone(selected.keys()))
    };
    let conjuncts = split_conjunction(filter.predicate());
    let Some(selected) = conjuncts.iter().find_map(|c| membership(c)) else { return Ok(None) };
    let rest: Vec<Arc<dyn PhysicalExpr>> =
        conjuncts.iter().filter(|c| membership(c).is_none()).map(|c| Arc::clone(*c)).collect();
    if rest.is_empty() {
        return Ok(Some((Arc::clone(filter.input()), selected)));
    }
    let rest = FilterExec::try_new(conjunction(rest), Arc::clone(filter.input()))?
        .with_default_selectivity(filter.default_selectivity())?;
    Ok(Some((Arc::new(rest), selected)))
}

/// `input` without the conjuncts of its filter (if it is one, without projection) that read only
/// the `key` columns and hold for each of the declared tuples (`keys`, one column per key)
/// (module docs).
fn without_key_filters(
    input: &Arc<dyn ExecutionPlan>,
    key: &[Arc<dyn PhysicalExpr>],
    keys: &[ArrayRef],
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(filter) = input.downcast_ref::<FilterExec>() else { return Ok(Arc::clone(input)) };
    let Some(key) = key.iter().map(|k| k.downcast_ref::<Column>().map(Column::index)).collect::<Option<Vec<_>>>()
    else {
        return Ok(Arc::clone(input));
    };
    if filter.projection().is_some() {
        return Ok(Arc::clone(input));
    }
    // The declared tuples in the key columns, every other column null.
    let schema = filter.input().schema();
    let tuples = keys.first().map_or(0, |k| k.len());
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match key.iter().position(|&k| k == i) {
            Some(c) => cast(&keys[c], f.data_type()),
            None => Ok(new_null_array(f.data_type(), tuples)),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let nullable: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
    let probe = RecordBatch::try_new(Arc::new(Schema::new(nullable)), columns)?;
    let holds = |c: &Arc<dyn PhysicalExpr>| {
        collect_columns(c).iter().all(|col| key.contains(&col.index()))
            && deterministic(c)
            && c.evaluate(&probe)
                .and_then(|v| v.into_array(probe.num_rows()))
                .is_ok_and(|v| v.as_boolean_opt().is_some_and(|b| b.null_count() == 0 && b.true_count() == b.len()))
    };
    let conjuncts = split_conjunction(filter.predicate());
    let kept: Vec<Arc<dyn PhysicalExpr>> = conjuncts.iter().filter(|c| !holds(c)).map(|c| Arc::clone(*c)).collect();
    if kept.len() == conjuncts.len() {
        return Ok(Arc::clone(input));
    }
    if kept.is_empty() {
        return Ok(Arc::clone(filter.input()));
    }
    let rest = FilterExec::try_new(conjunction(kept), Arc::clone(filter.input()))?
        .with_default_selectivity(filter.default_selectivity())?;
    Ok(Arc::new(rest))
}

/// Whether `e` is built only of columns, literals, comparisons, logic, casts, lists and the declared
/// keys' range (no other function: nothing that could answer differently on the same key).
fn deterministic(e: &Arc<dyn PhysicalExpr>) -> bool {
    let mut only = true;
    let _ = e.apply(|n| {
        only &= n.downcast_ref::<Column>().is_some()
            || n.downcast_ref::<Literal>().is_some()
            || n.downcast_ref::<BinaryExpr>().is_some()
            || n.downcast_ref::<InListExpr>().is_some()
            || n.downcast_ref::<NotExpr>().is_some()
            || n.downcast_ref::<IsNullExpr>().is_some()
            || n.downcast_ref::<IsNotNullExpr>().is_some()
            || n.downcast_ref::<CastExpr>().is_some()
            || n.downcast_ref::<ScalarFunctionExpr>().is_some_and(|f| f.fun().inner().is::<KeyRange>());
        Ok(if only { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
    });
    only
}

/// How one partition finds its rows' groups.
enum Lookup {
    /// Every group known: the output's key columns, the table, and the group of the NULL key
    /// when it is one (else the spare group's).
    Known { columns: Vec<ArrayRef>, table: Arc<KeyTable>, null: Option<u32> },
    /// Groups made by their first row, with room for every selected one.
    FirstSeen(FirstSeen),
}

impl Lookup {
    /// The lookup of a partition, once the gate has run any selection.
    fn of(known: Keys, output_types: &[DataType], key_types: &[DataType]) -> Result<Self> {
        Ok(match known {
            Keys::Declared { columns, table, .. } => Lookup::Known { columns, table, null: None },
            Keys::SelectedIntegers(selected) => {
                let Some(IntegerSelection { keys, null }) = selected.integer_selection()? else {
                    return internal_err!("a partition selection over one integer key was not counted by value");
                };
                let table = KeyTable::integers(&keys, (keys.len() + usize::from(null)) as u32);
                let column = Int64Array::from_iter(keys.iter().copied().map(Some).chain(null.then_some(None)));
                let null = null.then_some(keys.len() as u32);
                Lookup::Known { columns: vec![cast(&column, &output_types[0])?], table: Arc::new(table), null }
            }
            Keys::SelectedHashes(expected) => Lookup::FirstSeen(FirstSeen::new(key_types, expected.count())?),
        })
    }

    /// The groups the accumulators hold (every one from the first batch; a known table's spare
    /// group last).
    fn total(&self) -> usize {
        match self {
            Lookup::Known { columns, .. } => columns.first().map_or(0, |c| c.len()) + 1,
            Lookup::FirstSeen(seen) => seen.total(),
        }
    }

    /// Each row's group into `out`.
    fn groups_of(&mut self, keys: &[ArrayRef], out: &mut Vec<usize>) -> Result<()> {
        let spare = self.total().saturating_sub(1) as u32;
        match self {
            Lookup::Known { table, null, .. } => table.groups_of(keys, spare, null.unwrap_or(spare), out),
            Lookup::FirstSeen(seen) => seen.groups_of(keys, out),
        }
    }

    /// The emitted groups' key columns and how many (the first groups: every one held, except a
    /// known table's spare group).
    fn emitted(self) -> Result<(Vec<ArrayRef>, usize)> {
        match self {
            Lookup::Known { columns, .. } => {
                let n = columns.first().map_or(0, |c| c.len());
                Ok((columns, n))
            }
            Lookup::FirstSeen(seen) => Ok((seen.columns()?, seen.total())),
        }
    }
}

impl DisplayAs for KnownKeysPartialExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.aggr.iter().map(|a| a.name()).collect();
        match &self.keys {
            Keys::Declared { columns, table, .. } => write!(
                f,
                "KnownKeysPartialExec: declared groups={} ({}), ",
                columns.first().map_or(0, |c| c.len()),
                table.kind()
            )?,
            Keys::SelectedIntegers(_) => write!(f, "KnownKeysPartialExec: selected keys, ")?,
            Keys::SelectedHashes(_) => write!(f, "KnownKeysPartialExec: selected keys (first seen), ")?,
        }
        write!(f, "aggr=[{}]", names.join(", "))
    }
}

impl ExecutionPlan for KnownKeysPartialExec {
    fn name(&self) -> &str {
        "KnownKeysPartialExec"
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

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = only_child(children, "KnownKeysPartialExec")?;
        Ok(Arc::new(Self { input, ..self.as_ref().clone() }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.input.execute(partition, context)?;
        let emitted = BaselineMetrics::new(&self.metrics, partition);
        let (key, aggr, filters) = (self.key.clone(), self.aggr.clone(), self.filters.clone());
        let (known, schema) = (self.keys.clone(), Arc::clone(&self.schema));
        let out_schema = Arc::clone(&schema);
        let input_schema = self.input.schema();
        let key_types = key.iter().map(|e| e.data_type(&input_schema)).collect::<Result<Vec<_>>>()?;
        let all = async move {
            let output_types: Vec<DataType> =
                schema.fields()[..key.len()].iter().map(|f| f.data_type().clone()).collect();
            let mut lookup = Lookup::of(known, &output_types, &key_types)?;
            let mut accs = groups_accumulators(&aggr)?;
            let arguments: Vec<Vec<Arc<dyn PhysicalExpr>>> = aggr.iter().map(|a| a.expressions()).collect();
            let mut groups = Vec::new();
            let mut update = |batch: &RecordBatch| -> Result<()> {
                let rows = batch.num_rows();
                let columns = key.iter().map(|k| k.evaluate(batch)?.into_array(rows)).collect::<Result<Vec<_>>>()?;
                lookup.groups_of(&columns, &mut groups)?;
                let total = lookup.total();
                for ((acc, args), filter) in accs.iter_mut().zip(&arguments).zip(&filters) {
                    let values = args
                        .iter()
                        .map(|e| e.evaluate(batch).and_then(|v| v.into_array(rows)))
                        .collect::<Result<Vec<ArrayRef>>>()?;
                    let filter = match filter {
                        Some(f) => Some(f.evaluate(batch)?.into_array(rows)?.as_boolean().clone()),
                        None => None,
                    };
                    acc.update_batch(&values, &groups, filter.as_ref(), total)?;
                }
                Ok(())
            };
            // Every group exists from the start, rows or not.
            update(&RecordBatch::new_empty(input.schema()))?;
            while let Some(batch) = input.next().await {
                update(&batch?)?;
            }
            let (mut columns, held) = lookup.emitted()?;
            for acc in accs.iter_mut() {
                columns.extend(acc.state(EmitTo::First(held))?);
            }
            let batch = batch_as(schema, columns)?;
            emitted.record_output(batch.num_rows());
            emitted.done();
            Ok(batch)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, futures::stream::once(all))))
    }
}
