//! The partial phase of a private aggregate grouped by one integer column whose keys are known
//! before its rows are read — declared, or chosen by the partition selection the gate ran first:
//! each row's group found in a table of the keys, not by hashing.
//!
//! DataFusion's partial hash aggregate interns every row's key in a hash table (hash, probe,
//! compare) — for `SELECT g, private_kde(x, …) … GROUP BY g` the largest single cost after the
//! binning, and the same as the whole of `SELECT g, sum(x) … GROUP BY g`. Here the public groups
//! are known before any row is read (the declared keys, SPEC §7), so [`KnownKeysPartialExec`] maps
//! a key to its group with one subtraction and one lookup in a dense table (or a small hash map
//! when the keys are spread out), and feeds the same vectorised accumulators
//! (`GroupsAccumulator`) with the same group indices DataFusion would. A row whose key is not
//! declared (or is null) goes to one spare group whose state is never emitted — the same work
//! as any row, and memory fixed by the declared keys whatever the data. Each partition emits one
//! batch: every declared group's key and partial state, in declared order, as the replaced
//! partial aggregate would (groups without rows carry an empty state, which merges as nothing).
//!
//! The guard filters a grouped call's rows to the declared keys (so that no undeclared key makes
//! a group). Below this operator that filter has nothing left to do: every conjunct of the
//! filter right below that reads the key column only, and holds for every declared key, is
//! dropped (rows it would have dropped have undeclared keys, which the spare group takes), and
//! with it the filter when nothing else is left.
//!
//! Over private keys the keys are those the gate's partition selection chose, counted by value
//! (one integer column, rows are units: `passes::selection`); the table is built from them when
//! the partition starts, and the selection's membership filter below is dropped the same way (a
//! row of an unselected key goes to the spare group). A selected NULL key is a group of its own.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, new_null_array};
use datafusion::arrow::compute::{CastOptions, cast, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
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
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::node::{batch_as, groups_accumulators, only_child};
use crate::guard::ops::selected::{IntegerSelection, SelectedFilter, SelectedKeys};

/// Keys spanning at most this many values get a dense table (4 bytes per value in the span).
const DENSE_SPAN: i64 = 1 << 16;

/// The public groups of a grouped private aggregate, as this operator needs them.
#[derive(Debug, Clone)]
pub enum KnownGroups {
    /// Declared keys, one tuple per group, in declared order.
    Declared(Arc<Vec<Vec<ScalarValue>>>),
    /// Keys a partition selection chooses (found in the membership filter below).
    Selected,
}

/// Replaces every partial phase of a private aggregate grouped by one integer column whose keys
/// are known (`known_of`) with a [`KnownKeysPartialExec`]; other nodes are returned unchanged.
pub fn known_keys_partials(
    plan: Arc<dyn ExecutionPlan>,
    known_of: impl Fn(&AggregateExec) -> Option<KnownGroups>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        if *agg.mode() != AggregateMode::Partial || !agg.group_expr().is_single() || agg.group_expr().expr().len() != 1
        {
            return Ok(Transformed::no(node));
        }
        let Some(groups) = known_of(agg) else { return Ok(Transformed::no(node)) };
        let Some(exec) = KnownKeysPartialExec::try_new(agg, groups)? else { return Ok(Transformed::no(node)) };
        Ok(Transformed::new(Arc::new(exec) as Arc<dyn ExecutionPlan>, true, TreeNodeRecursion::Continue))
    })
    .map(|t| t.data)
}

/// Each declared key's group (module docs).
#[derive(Debug, Clone)]
enum KeyTable {
    /// Group of key `min + i` at `i`; `spare` where no key is declared.
    Dense {
        min: i64,
        groups: Vec<u32>,
    },
    Sparse(HashMap<i64, u32, foldhash::fast::RandomState>),
}

impl KeyTable {
    fn new(keys: &[i64], spare: u32) -> Self {
        let (min, max) = (keys.iter().min().copied().unwrap_or(0), keys.iter().max().copied().unwrap_or(0));
        match max.checked_sub(min) {
            Some(span) if span < DENSE_SPAN => {
                let mut groups = vec![spare; span as usize + 1];
                for (g, &k) in keys.iter().enumerate() {
                    groups[(k - min) as usize] = g as u32;
                }
                KeyTable::Dense { min, groups }
            }
            _ => KeyTable::Sparse(keys.iter().enumerate().map(|(g, &k)| (k, g as u32)).collect()),
        }
    }

    /// Each row's group (`spare` for an unknown key, `null` for a null one) into `out`.
    fn groups_of(&self, keys: &dyn Array, spare: u32, null: u32, out: &mut Vec<usize>) -> Result<()> {
        let options = CastOptions { safe: true, ..Default::default() };
        // A key outside Int64 becomes null (only declared keys are looked up in UInt64 columns, and
        // they have no NULL key: so it goes to the spare group).
        let keys = cast_with_options(keys, &DataType::Int64, &options)?;
        let keys = keys.as_primitive::<Int64Type>();
        out.clear();
        match self {
            KeyTable::Dense { min, groups } => out.extend(keys.values().iter().map(|&k| {
                let offset = k.wrapping_sub(*min) as u64;
                (if offset < groups.len() as u64 { groups[offset as usize] } else { spare }) as usize
            })),
            KeyTable::Sparse(map) => {
                out.extend(keys.values().iter().map(|k| map.get(k).copied().unwrap_or(spare) as usize))
            }
        }
        if let Some(nulls) = keys.nulls().filter(|n| n.null_count() > 0) {
            for i in nulls.iter().enumerate().filter(|(_, valid)| !valid).map(|(i, _)| i) {
                out[i] = null as usize;
            }
        }
        Ok(())
    }
}

/// Where the keys come from.
#[derive(Debug, Clone)]
enum Keys {
    /// The declared keys in declared order (the key column of the output) and their table.
    Declared { keys: ArrayRef, table: KeyTable },
    /// The keys the gate's selection chooses, read when a partition starts.
    Selected(Arc<SelectedKeys>),
}

/// The partial phase of a private aggregate over known integer keys (module docs).
#[derive(Debug, Clone)]
pub struct KnownKeysPartialExec {
    input: Arc<dyn ExecutionPlan>,
    key: Arc<dyn PhysicalExpr>,
    aggr: Vec<Arc<AggregateFunctionExpr>>,
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    keys: Keys,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl KnownKeysPartialExec {
    /// The replacement of `agg` (a partial phase grouped by one column), or None when its key
    /// is not an integer column, a declared key is not one of its values, or selected keys are
    /// not found in a membership filter right below.
    fn try_new(agg: &AggregateExec, groups: KnownGroups) -> Result<Option<Self>> {
        let (key, _) = &agg.group_expr().expr()[0];
        let key_type = key.data_type(&agg.input_schema())?;
        if !key_type.is_integer() {
            return Ok(None);
        }
        let (input, keys) = match groups {
            KnownGroups::Declared(tuples) => {
                if tuples.iter().any(|t| t.len() != 1) {
                    return Ok(None);
                }
                let declared = ScalarValue::iter_to_array(tuples.iter().map(|t| t[0].clone()))?;
                let options = CastOptions { safe: true, ..Default::default() };
                let keys = cast_with_options(&declared, &key_type, &options)?;
                let as_i64 = cast_with_options(&keys, &DataType::Int64, &options)?;
                if keys.null_count() > 0 || as_i64.null_count() > 0 {
                    return Ok(None);
                }
                let values = as_i64.as_primitive::<Int64Type>().values().to_vec();
                let input = without_key_filters(agg.input(), key, &keys)?;
                let keys = cast(&keys, agg.schema().field(0).data_type())?;
                (input, Keys::Declared { table: KeyTable::new(&values, values.len() as u32), keys })
            }
            KnownGroups::Selected => {
                // The types the selection's filter compares by value (`integer_keys`).
                if matches!(key_type, DataType::UInt64) {
                    return Ok(None);
                }
                let Some((input, selected)) = without_membership(agg.input(), key)? else { return Ok(None) };
                (input, Keys::Selected(selected))
            }
        };
        Ok(Some(Self {
            input,
            key: Arc::clone(key),
            aggr: agg.aggr_expr().to_vec(),
            filters: agg.filter_expr().to_vec(),
            keys,
            schema: agg.schema(),
            properties: Arc::clone(agg.properties()),
        }))
    }
}

/// `input`, a filter holding the membership test of a partition selection on the `key` column,
/// without that test, and the keys it tests against; None for any other input.
fn without_membership(
    input: &Arc<dyn ExecutionPlan>,
    key: &Arc<dyn PhysicalExpr>,
) -> Result<Option<(Arc<dyn ExecutionPlan>, Arc<SelectedKeys>)>> {
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
/// the `key` column and hold for each of the declared `keys` (module docs).
fn without_key_filters(
    input: &Arc<dyn ExecutionPlan>,
    key: &Arc<dyn PhysicalExpr>,
    keys: &ArrayRef,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(filter) = input.downcast_ref::<FilterExec>() else { return Ok(Arc::clone(input)) };
    let Some(key) = key.downcast_ref::<Column>() else { return Ok(Arc::clone(input)) };
    if filter.projection().is_some() {
        return Ok(Arc::clone(input));
    }
    // The declared keys in the key column, every other column null.
    let schema = filter.input().schema();
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| match i == key.index() {
            true => cast(keys, f.data_type()),
            false => Ok(new_null_array(f.data_type(), keys.len())),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let nullable: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
    let probe = RecordBatch::try_new(Arc::new(Schema::new(nullable)), columns)?;
    let holds = |c: &Arc<dyn PhysicalExpr>| {
        collect_columns(c).iter().all(|col| col.index() == key.index())
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

/// Whether `e` is built only of columns, literals, comparisons, logic, casts and lists (no
/// function: nothing that could answer differently on the same key).
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
            || n.downcast_ref::<CastExpr>().is_some();
        Ok(if only { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
    });
    only
}

/// The keys of a partition (the output's key column), their table, and the group of the NULL
/// key when it is one.
fn resolve(known: Keys, key_type: &DataType) -> Result<(ArrayRef, KeyTable, Option<u32>)> {
    match known {
        Keys::Declared { keys, table } => Ok((keys, table, None)),
        Keys::Selected(selected) => {
            let Some(IntegerSelection { keys, null }) = selected.integer_selection()? else {
                return internal_err!("a partition selection over one integer key was not counted by value");
            };
            let table = KeyTable::new(&keys, (keys.len() + usize::from(null)) as u32);
            let null_group = null.then_some(keys.len() as u32);
            let column = Int64Array::from_iter(keys.iter().copied().map(Some).chain(null.then_some(None)));
            Ok((cast(&column, key_type)?, table, null_group))
        }
    }
}

impl DisplayAs for KnownKeysPartialExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.aggr.iter().map(|a| a.name()).collect();
        match &self.keys {
            Keys::Declared { keys, table } => {
                let kind = match table {
                    KeyTable::Dense { .. } => "dense",
                    KeyTable::Sparse(_) => "sparse",
                };
                write!(f, "KnownKeysPartialExec: declared groups={} ({kind}), ", keys.len())?
            }
            Keys::Selected(_) => write!(f, "KnownKeysPartialExec: selected keys, ")?,
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

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.input.execute(partition, context)?;
        let (key, aggr, filters) = (Arc::clone(&self.key), self.aggr.clone(), self.filters.clone());
        let (known, schema) = (self.keys.clone(), Arc::clone(&self.schema));
        let out_schema = Arc::clone(&schema);
        let all = async move {
            let (keys, table, null) = resolve(known, schema.field(0).data_type())?;
            let declared = keys.len();
            let (spare, total) = (declared as u32, declared + 1);
            let null = null.unwrap_or(spare);
            let mut accs = groups_accumulators(&aggr)?;
            let arguments: Vec<Vec<Arc<dyn PhysicalExpr>>> = aggr.iter().map(|a| a.expressions()).collect();
            let mut groups = Vec::new();
            let mut update = |batch: &RecordBatch| -> Result<()> {
                let rows = batch.num_rows();
                let column = key.evaluate(batch)?.into_array(rows)?;
                table.groups_of(&column, spare, null, &mut groups)?;
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
            // Every group exists from the start, rows or not (its state is emitted below).
            update(&RecordBatch::new_empty(input.schema()))?;
            while let Some(batch) = input.next().await {
                update(&batch?)?;
            }
            let mut columns = vec![keys];
            for acc in accs.iter_mut() {
                for state in acc.state(EmitTo::First(declared))? {
                    columns.push(state);
                }
            }
            batch_as(schema, columns)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, futures::stream::once(all))))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int32Array, UInt64Array};

    use super::*;

    fn groups(table: &KeyTable, keys: &dyn Array, spare: u32) -> Vec<usize> {
        let mut out = vec![99; 3];
        table.groups_of(keys, spare, spare, &mut out).unwrap();
        out
    }

    #[test]
    fn each_declared_key_finds_its_group_and_every_other_value_the_spare() {
        // Declared order is group order; a run of keys is dense, spread keys are sparse.
        let dense = KeyTable::new(&[5, 3, 4, -2], 4);
        assert!(matches!(dense, KeyTable::Dense { .. }));
        let sparse = KeyTable::new(&[5, 3, 1 << 40, i64::MIN], 4);
        assert!(matches!(sparse, KeyTable::Sparse(_)));
        let keys = Int32Array::from(vec![
            Some(3),
            Some(5),
            None,
            Some(-2),
            Some(0),
            Some(6),
            Some(i32::MIN),
            Some(i32::MAX),
            Some(4),
        ]);
        assert_eq!(groups(&dense, &keys, 4), [1, 0, 4, 3, 4, 4, 4, 4, 2]);
        assert_eq!(groups(&sparse, &keys, 4), [1, 0, 4, 4, 4, 4, 4, 4, 4]);
        // Unsigned values beyond i64 are no declared key (never an error).
        let big = UInt64Array::from(vec![u64::MAX, 5, (1 << 63) + 3]);
        assert_eq!(groups(&dense, &big, 4), [4, 0, 4]);
        assert_eq!(groups(&sparse, &big, 4), [4, 0, 4]);
        let far = datafusion::arrow::array::Int64Array::from(vec![1 << 40, i64::MIN, i64::MAX]);
        assert_eq!(groups(&sparse, &far, 4), [2, 3, 4]);
        assert_eq!(groups(&dense, &far, 4), [4, 4, 4], "wrapping offsets stay outside the table");
    }
}
