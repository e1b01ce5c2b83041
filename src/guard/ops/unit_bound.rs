//! `dpcurve_unit_bound`: the streaming per-unit contribution bound (SPEC §0, §7).
//!
//! An aggregate grouped by the unit's keyed hash, called as
//! `dpcurve_unit_bound(group_order, row_order, c0, c1, …)`. For its unit it keeps at most `L`
//! groups — those with the smallest `group_order` — and in each of them at most `K` rows — those
//! with the smallest `row_order` — and returns them as a list of structs `{c0, c1, …}` (the
//! guard unnests it back into rows). Both orders are keyed 128-bit hashes
//! ([`super::sample_order::SampleOrder`]), so the kept rows are a uniformly random sample of the unit's
//! rows and a function of the unit's own rows only.
//!
//! Its state is `O(K·L)` rows per unit whatever the unit's size: a unit of 10⁷ rows costs the
//! same memory as one of K·L rows (a window partition held all of them, and its sort failed under
//! the memory limit only when that unit was present). Kept rows are stored in Arrow's row
//! encoding (owned bytes, not slices that would pin whole input batches), and the number of units
//! is handled by DataFusion's hash aggregate, which spills.

use std::collections::BTreeMap;
use std::fmt;
use std::mem::{size_of, size_of_val};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanArray, FixedSizeBinaryBuilder, ListArray, StructArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::{DataFusionError, Result, ScalarValue, internal_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility};

/// The function's name.
pub const NAME: &str = "dpcurve_unit_bound";

type Key = [u8; 16];

/// The bound: at most `groups` groups per unit, `rows` rows per unit and group.
#[derive(PartialEq, Eq, Hash)]
pub struct UnitBound {
    signature: Signature,
    groups: u64,
    rows: u64,
}

impl fmt::Debug for UnitBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitBound {{ groups: {}, rows: {} }}", self.groups, self.rows)
    }
}

impl UnitBound {
    /// At most `groups` groups and `rows` rows per group (both at least 1).
    pub fn new(groups: u64, rows: u64) -> Self {
        Self { signature: Signature::variadic_any(Volatility::Immutable), groups: groups.max(1), rows: rows.max(1) }
    }

    /// (groups, rows).
    pub fn bound(&self) -> (u64, u64) {
        (self.groups, self.rows)
    }
}

/// Field names of the kept rows' struct: `c0, c1, …` (the guard renames them back).
pub fn row_field(i: usize) -> String {
    format!("c{i}")
}

fn row_fields(types: &[DataType]) -> Fields {
    types.iter().enumerate().map(|(i, t)| Field::new(row_field(i), t.clone(), true)).collect()
}

fn state_entry_fields() -> Fields {
    Fields::from(vec![
        Field::new("group_order", DataType::FixedSizeBinary(16), false),
        Field::new("row_order", DataType::FixedSizeBinary(16), false),
        Field::new("row", DataType::Binary, false),
    ])
}

impl AggregateUDFImpl for UnitBound {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if arg_types.len() < 3 {
            return internal_err!("{NAME} takes two orders and at least one column");
        }
        Ok(DataType::List(Arc::new(Field::new_list_field(DataType::Struct(row_fields(&arg_types[2..])), true))))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new_list(
            format_state_name(args.name, "kept"),
            Field::new_list_field(DataType::Struct(state_entry_fields()), true),
            true,
        ))])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(UnitBoundAccumulator { bound: self.bound_for(&args)?, sample: Sample::default() }))
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(UnitBoundGroups { bound: self.bound_for(&args)?, samples: Vec::new(), bytes: 0 }))
    }
}

impl UnitBound {
    fn bound_for(&self, args: &AccumulatorArgs) -> Result<Bound> {
        let types = args.exprs.iter().skip(2).map(|e| e.data_type(args.schema)).collect::<Result<Vec<DataType>>>()?;
        if types.is_empty() {
            return internal_err!("{NAME} takes two orders and at least one column");
        }
        let converter = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?;
        Ok(Bound { groups: self.groups as usize, rows: self.rows as usize, converter, fields: row_fields(&types) })
    }
}

/// One unit's kept groups (by group order) and, in each, its kept rows (by row order, in Arrow's
/// row encoding).
#[derive(Debug, Default)]
struct Sample {
    kept: BTreeMap<Key, Vec<(Key, OwnedRow)>>,
    /// Bytes of the kept rows.
    bytes: usize,
}

impl Sample {
    /// Offers one row (made only if it is kept) under a bound of `groups` groups and `rows` rows.
    fn offer(
        &mut self,
        (groups, rows): (usize, usize),
        group: Key,
        order: Key,
        row: impl FnOnce() -> Result<OwnedRow>,
    ) -> Result<()> {
        if !self.kept.contains_key(&group) {
            if self.kept.len() >= groups && self.kept.last_key_value().is_some_and(|(last, _)| group >= *last) {
                return Ok(());
            }
            self.kept.insert(group, Vec::with_capacity(1));
            if self.kept.len() > groups {
                if let Some((_, dropped)) = self.kept.pop_last() {
                    self.bytes -= dropped.iter().map(|(_, r)| r.as_ref().len()).sum::<usize>();
                }
            }
        }
        let kept = self.kept.get_mut(&group).expect("inserted above");
        if kept.len() >= rows && kept.last().is_some_and(|(last, _)| order >= *last) {
            return Ok(());
        }
        let at = kept.partition_point(|(o, _)| *o <= order);
        let row = row()?;
        self.bytes += row.as_ref().len();
        kept.insert(at, (order, row));
        if kept.len() > rows {
            if let Some((_, dropped)) = kept.pop() {
                self.bytes -= dropped.as_ref().len();
            }
        }
        Ok(())
    }

    fn rows(&self) -> impl Iterator<Item = (&Key, &Key, &OwnedRow)> {
        self.kept.iter().flat_map(|(g, rows)| rows.iter().map(move |(o, r)| (g, o, r)))
    }

    fn len(&self) -> usize {
        self.kept.values().map(Vec::len).sum()
    }

    fn size(&self) -> usize {
        let entries: usize = self.kept.values().map(|v| v.capacity() * size_of::<(Key, OwnedRow)>()).sum();
        size_of::<Self>() + self.bytes + entries + self.kept.len() * size_of::<(Key, Vec<()>)>()
    }
}

/// What both accumulator forms share: the bound, the row encoding, the output fields.
struct Bound {
    groups: usize,
    rows: usize,
    converter: RowConverter,
    fields: Fields,
}

impl Bound {
    fn limits(&self) -> (usize, usize) {
        (self.groups, self.rows)
    }

    /// Merges the states in `lists` (each a list of (group order, row order, encoded row)) into
    /// `samples[into(l)]` for list `l` — read from the lists' flat entries, without a sliced
    /// array per list.
    fn merge_lists(&self, lists: &ListArray, samples: &mut [Sample], into: impl Fn(usize) -> usize) -> Result<()> {
        let entries = lists.values().as_struct();
        let (g, o) = (entries.column(0).as_fixed_size_binary(), entries.column(1).as_fixed_size_binary());
        let r = entries.column(2).as_binary::<i32>();
        let parser = self.converter.parser();
        let offsets = lists.value_offsets();
        for l in 0..lists.len() {
            if lists.is_null(l) {
                continue;
            }
            let sample = &mut samples[into(l)];
            for i in offsets[l] as usize..offsets[l + 1] as usize {
                sample.offer(self.limits(), key(g.value(i))?, key(o.value(i))?, || {
                    Ok(parser.parse(r.value(i)).owned())
                })?;
            }
        }
        Ok(())
    }

    /// The kept rows of each sample, as one list of structs per sample.
    fn evaluate(&self, samples: &[Sample]) -> Result<ListArray> {
        let parser = self.converter.parser();
        let columns = self
            .converter
            .convert_rows(samples.iter().flat_map(|s| s.rows()).map(|(_, _, r)| parser.parse(r.as_ref())))?;
        let kept = StructArray::try_new(self.fields.clone(), columns, None)?;
        let field = Arc::new(Field::new_list_field(DataType::Struct(self.fields.clone()), true));
        Ok(ListArray::try_new(
            field,
            OffsetBuffer::from_lengths(samples.iter().map(Sample::len)),
            Arc::new(kept),
            None,
        )?)
    }

    /// The state of each sample: one list of (group order, row order, encoded row) per sample.
    fn state(&self, samples: &[Sample]) -> Result<ListArray> {
        let mut g = FixedSizeBinaryBuilder::new(16);
        let mut o = FixedSizeBinaryBuilder::new(16);
        let mut r = BinaryBuilder::new();
        for (group, order, row) in samples.iter().flat_map(|s| s.rows()) {
            g.append_value(group)?;
            o.append_value(order)?;
            r.append_value(row.as_ref());
        }
        let columns: Vec<ArrayRef> = vec![Arc::new(g.finish()), Arc::new(o.finish()), Arc::new(r.finish())];
        let entries = StructArray::try_new(state_entry_fields(), columns, None)?;
        let field = Arc::new(Field::new_list_field(DataType::Struct(state_entry_fields()), true));
        Ok(ListArray::try_new(
            field,
            OffsetBuffer::from_lengths(samples.iter().map(Sample::len)),
            Arc::new(entries),
            None,
        )?)
    }
}

/// One unit's sample (DataFusion's per-group form).
struct UnitBoundAccumulator {
    bound: Bound,
    sample: Sample,
}

impl fmt::Debug for UnitBoundAccumulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitBoundAccumulator {{ groups: {}, rows: {} }}", self.bound.groups, self.bound.rows)
    }
}

fn key(bytes: &[u8]) -> Result<Key> {
    bytes.try_into().map_err(|_| DataFusionError::Internal(format!("{NAME}: an order is not 16 bytes")))
}

impl Accumulator for UnitBoundAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let (groups, orders) = (values[0].as_fixed_size_binary(), values[1].as_fixed_size_binary());
        let rows = self.bound.converter.convert_columns(&values[2..])?;
        for i in 0..groups.len() {
            self.sample
                .offer(self.bound.limits(), key(groups.value(i))?, key(orders.value(i))?, || Ok(rows.row(i).owned()))?;
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.bound.merge_lists(states[0].as_list::<i32>(), std::slice::from_mut(&mut self.sample), |_| 0)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let state = self.bound.state(std::slice::from_ref(&self.sample))?;
        Ok(vec![ScalarValue::List(Arc::new(state))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::List(Arc::new(self.bound.evaluate(std::slice::from_ref(&self.sample))?)))
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.bound.converter.size() + self.sample.size()
    }
}

/// Every unit's sample, indexed by DataFusion's group index (the vectorised form the hash
/// aggregate prefers: one call per batch, not per unit).
struct UnitBoundGroups {
    bound: Bound,
    samples: Vec<Sample>,
    /// Sum of the samples' sizes.
    bytes: usize,
}

impl UnitBoundGroups {
    fn resize(&mut self, total: usize) {
        if self.samples.len() < total {
            self.samples.resize_with(total, Sample::default);
        }
    }

    fn recount(&mut self) {
        self.bytes = self.samples.iter().map(Sample::size).sum();
    }
}

impl GroupsAccumulator for UnitBoundGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        let (groups, orders) = (values[0].as_fixed_size_binary(), values[1].as_fixed_size_binary());
        let rows = self.bound.converter.convert_columns(&values[2..])?;
        for (i, &unit) in group_indices.iter().enumerate() {
            if opt_filter.is_some_and(|f| !f.value(i) || f.is_null(i)) {
                continue;
            }
            let sample = &mut self.samples[unit];
            let before = sample.size();
            sample
                .offer(self.bound.limits(), key(groups.value(i))?, key(orders.value(i))?, || Ok(rows.row(i).owned()))?;
            self.bytes = self.bytes + sample.size() - before;
        }
        Ok(())
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.resize(total_num_groups);
        let before: usize = group_indices.iter().map(|&u| self.samples[u].size()).sum();
        self.bound.merge_lists(values[0].as_list::<i32>(), &mut self.samples, |l| group_indices[l])?;
        let after: usize = group_indices.iter().map(|&u| self.samples[u].size()).sum();
        self.bytes = (self.bytes + after).saturating_sub(before);
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let emitted = emit_to.take_needed(&mut self.samples);
        self.recount();
        Ok(Arc::new(self.bound.evaluate(&emitted)?))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let emitted = emit_to.take_needed(&mut self.samples);
        self.recount();
        Ok(vec![Arc::new(self.bound.state(&emitted)?)])
    }

    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        // Each row its own unit: a list of its one entry (none when filtered out).
        let (groups, orders) = (values[0].as_fixed_size_binary(), values[1].as_fixed_size_binary());
        let rows = self.bound.converter.convert_columns(&values[2..])?;
        let samples = (0..groups.len())
            .map(|i| {
                let mut sample = Sample::default();
                if !opt_filter.is_some_and(|f| !f.value(i) || f.is_null(i)) {
                    sample.offer(self.bound.limits(), key(groups.value(i))?, key(orders.value(i))?, || {
                        Ok(rows.row(i).owned())
                    })?;
                }
                Ok(sample)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(vec![Arc::new(self.bound.state(&samples)?)])
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.bound.converter.size() + self.samples.capacity() * size_of::<Sample>() + self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{FixedSizeBinaryArray, Float64Array};

    fn keys(v: &[u8]) -> ArrayRef {
        Arc::new(FixedSizeBinaryArray::try_from_iter(v.iter().map(|b| [*b; 16])).unwrap())
    }

    fn bound(groups: usize, rows: usize) -> Bound {
        let types = vec![DataType::Float64];
        let converter = RowConverter::new(vec![SortField::new(DataType::Float64)]).unwrap();
        Bound { groups, rows, converter, fields: row_fields(&types) }
    }

    fn accumulator(groups: usize, rows: usize) -> UnitBoundAccumulator {
        UnitBoundAccumulator { bound: bound(groups, rows), sample: Sample::default() }
    }

    #[test]
    fn the_vectorised_form_equals_one_accumulator_per_unit() {
        // Two units interleaved in one batch (indices 0 and 1), split over two batches.
        let groups = keys(&[1, 2, 1, 3, 2, 1, 2, 2]);
        let orders = keys(&[6, 5, 4, 3, 2, 1, 9, 7]);
        let xs: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]));
        let units = [0usize, 1, 0, 1, 0, 1, 1, 0];
        let mut vectorised = UnitBoundGroups { bound: bound(2, 2), samples: Vec::new(), bytes: 0 };
        for (from, len) in [(0, 5), (5, 3)] {
            let cols = [groups.slice(from, len), orders.slice(from, len), xs.slice(from, len)];
            vectorised.update_batch(&cols, &units[from..from + len], None, 2).unwrap();
        }
        let out = vectorised.evaluate(EmitTo::All).unwrap();
        for unit in 0..2 {
            let mut one = accumulator(2, 2);
            let take: Vec<u32> = (0..8u32).filter(|&i| units[i as usize] == unit).collect();
            let idx = datafusion::arrow::array::UInt32Array::from(take);
            let cols: Vec<ArrayRef> = [&groups, &orders, &xs]
                .iter()
                .map(|c| datafusion::arrow::compute::take(c.as_ref(), &idx, None).unwrap())
                .collect();
            one.update_batch(&cols).unwrap();
            let got = out.as_list::<i32>().value(unit);
            let got =
                got.as_struct().column(0).as_primitive::<datafusion::arrow::datatypes::Float64Type>().values().to_vec();
            assert_eq!(got, kept_values(&mut one), "unit {unit}");
        }
        assert_eq!(vectorised.size(), size_of_val(&vectorised) + vectorised.bound.converter.size(), "all emitted");
    }

    fn kept_values(acc: &mut UnitBoundAccumulator) -> Vec<f64> {
        let ScalarValue::List(l) = acc.evaluate().unwrap() else { panic!() };
        let s = l.value(0);
        let s = s.as_struct();
        let x = s.column(0).as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        x.values().to_vec()
    }

    #[test]
    fn keeps_the_smallest_orders_in_the_smallest_groups() {
        let mut acc = accumulator(2, 2);
        // Groups 3, 1, 2 (orders), rows with orders 9..1.
        let groups = keys(&[3, 1, 2, 1, 1, 2, 3, 2]);
        let orders = keys(&[1, 9, 8, 7, 5, 6, 2, 4]);
        let xs: ArrayRef = Arc::new(Float64Array::from(vec![30.0, 19.0, 28.0, 17.0, 15.0, 26.0, 32.0, 24.0]));
        acc.update_batch(&[groups, orders, xs]).unwrap();
        // Group 3 is dropped (L = 2); group 1 keeps orders 5, 7; group 2 keeps 4, 6.
        assert_eq!(kept_values(&mut acc), vec![15.0, 17.0, 24.0, 26.0]);
    }

    #[test]
    fn state_round_trips_and_merging_equals_one_pass() {
        let groups = keys(&[1, 2, 1, 3, 2, 1]);
        let orders = keys(&[6, 5, 4, 3, 2, 1]);
        let xs: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let mut whole = accumulator(2, 2);
        whole.update_batch(&[Arc::clone(&groups), Arc::clone(&orders), Arc::clone(&xs)]).unwrap();
        let (mut a, mut b) = (accumulator(2, 2), accumulator(2, 2));
        a.update_batch(&[groups.slice(0, 3), orders.slice(0, 3), xs.slice(0, 3)]).unwrap();
        b.update_batch(&[groups.slice(3, 3), orders.slice(3, 3), xs.slice(3, 3)]).unwrap();
        let state = b.state().unwrap().remove(0).to_array().unwrap();
        a.merge_batch(&[state]).unwrap();
        assert_eq!(kept_values(&mut a), kept_values(&mut whole));
        assert_eq!(kept_values(&mut whole), vec![6.0, 3.0, 5.0, 2.0]);
    }

    #[test]
    fn memory_does_not_grow_with_the_unit() {
        let mut acc = accumulator(1, 3);
        let n = 100_000usize;
        let groups: ArrayRef = Arc::new(FixedSizeBinaryArray::try_from_iter((0..n).map(|_| [0u8; 16])).unwrap());
        let orders: ArrayRef = Arc::new(
            FixedSizeBinaryArray::try_from_iter((0..n).map(|i| (i as u128 * 7919 % 100_003).to_be_bytes())).unwrap(),
        );
        let xs: ArrayRef = Arc::new(Float64Array::from((0..n).map(|i| i as f64).collect::<Vec<_>>()));
        let before = {
            let mut small = accumulator(1, 3);
            small.update_batch(&[groups.slice(0, 3), orders.slice(0, 3), xs.slice(0, 3)]).unwrap();
            small.size()
        };
        acc.update_batch(&[groups, orders, xs]).unwrap();
        assert_eq!(kept_values(&mut acc).len(), 3);
        assert!(acc.size() <= before + 64, "{} vs {before}", acc.size());
    }
}
