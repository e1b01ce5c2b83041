//! `dpcurve_unit_bound`: the streaming per-unit contribution bound (SPEC §0, §7).
//!
//! An aggregate grouped by the unit's keyed hash, called as
//! `dpcurve_unit_bound(group_order, unit_hash, c0, c1, …)`. For its unit it keeps at most `L`
//! groups — those with the smallest `group_order` — and in each of them at most `K` rows — those
//! with the smallest row order `order(c0, c1, …, unit_hash)` — and returns them as a list of
//! structs `{c0, c1, …}` (the guard unnests it back into rows). Both orders are the keyed 128-bit
//! hash [`SampleOrder`], so the kept rows are a uniformly random sample of the unit's rows and a
//! function of the unit's own rows only.
//!
//! The row order is computed here, not in the plan, and only for rows whose group can still be
//! among the unit's `L` smallest: a row whose group order is larger than the `L`-th kept group's
//! is rejected before its columns are encoded or hashed (it could never be kept, since a unit's
//! `L`-th smallest group order only decreases as rows arrive). The kept rows are exactly those
//! of the definition above, whatever the batches.
//!
//! Its state is `O(K·L)` rows per unit whatever the unit's size: a unit of 10⁷ rows costs the
//! same memory as one of K·L rows (a window partition held all of them, and its sort failed under
//! the memory limit only when that unit was present). Kept rows are stored in Arrow's row
//! encoding (owned bytes, not slices that would pin whole input batches), and the number of units
//! is handled by DataFusion's hash aggregate, which spills.

use std::fmt;
use std::mem::{size_of, size_of_val};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanArray, FixedSizeBinaryBuilder, ListArray, StructArray, UInt32Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{DataFusionError, Result, ScalarValue, internal_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility};

use super::sample_order::SampleOrder;

/// The function's name.
pub const NAME: &str = "dpcurve_unit_bound";

/// The bound: at most `groups` groups per unit, `rows` rows per unit and group, rows ordered by
/// `order`.
#[derive(PartialEq, Eq, Hash)]
pub struct UnitBound {
    signature: Signature,
    groups: u64,
    rows: u64,
    order: SampleOrder,
}

impl fmt::Debug for UnitBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitBound {{ groups: {}, rows: {} }}", self.groups, self.rows)
    }
}

impl UnitBound {
    /// At most `groups` groups and `rows` rows per group (both at least 1), rows ranked by `order`.
    pub fn new(groups: u64, rows: u64, order: SampleOrder) -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
            groups: groups.max(1),
            rows: rows.max(1),
            order,
        }
    }

    /// (groups, rows).
    pub fn bound(&self) -> (u64, u64) {
        (self.groups, self.rows)
    }

    /// The row order (to ship the bound to a cluster's executors).
    pub(crate) fn order(&self) -> &SampleOrder {
        &self.order
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
            return internal_err!("{NAME} takes the group order, the unit hash and at least one column");
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
        let types = args.exprs.iter().map(|e| e.data_type(args.schema)).collect::<Result<Vec<DataType>>>()?;
        if types.len() < 3 {
            return internal_err!("{NAME} takes the group order, the unit hash and at least one column");
        }
        Bound::new(self.groups as usize, self.rows as usize, self.order.clone(), &types[2..], &types[1])
    }
}

/// One unit's kept groups, by ascending group order.
#[derive(Debug, Default)]
struct Sample {
    kept: Vec<Kept>,
    /// Heap bytes: the kept rows and both levels of vectors.
    heap: usize,
}

/// One kept group: its order and its kept rows by ascending row order (in Arrow's row encoding).
#[derive(Debug)]
struct Kept {
    group: u128,
    rows: Vec<(u128, Box<[u8]>)>,
}

impl Kept {
    fn heap(&self) -> usize {
        self.rows.capacity() * size_of::<(u128, Box<[u8]>)>() + self.rows.iter().map(|(_, r)| r.len()).sum::<usize>()
    }
}

impl Sample {
    /// Whether a row of group `group` could be kept under a bound of `groups` groups (false: it
    /// never can, whatever rows come later).
    fn might_keep(&self, groups: usize, group: u128) -> bool {
        self.kept.len() < groups || self.kept.last().is_some_and(|k| group <= k.group)
    }

    /// Offers one row (made only if it is kept) under a bound of `groups` groups and `rows` rows;
    /// returns the change in heap bytes.
    fn offer(
        &mut self,
        (groups, rows): (usize, usize),
        group: u128,
        order: u128,
        row: impl FnOnce() -> Box<[u8]>,
    ) -> isize {
        let before = self.heap;
        let at = match self.kept.binary_search_by(|k| k.group.cmp(&group)) {
            Ok(at) => at,
            Err(at) if at >= groups => return 0,
            Err(at) => {
                let capacity = self.kept.capacity();
                self.kept.insert(at, Kept { group, rows: Vec::new() });
                if self.kept.len() > groups {
                    if let Some(dropped) = self.kept.pop() {
                        self.heap -= dropped.heap();
                    }
                }
                self.heap += (self.kept.capacity() - capacity) * size_of::<Kept>();
                at
            }
        };
        let kept = &mut self.kept[at].rows;
        if kept.len() >= rows && kept.last().is_some_and(|(last, _)| order >= *last) {
            return self.heap as isize - before as isize;
        }
        let capacity = kept.capacity();
        let row = row();
        self.heap += row.len();
        kept.insert(kept.partition_point(|(o, _)| *o <= order), (order, row));
        if kept.len() > rows {
            if let Some((_, dropped)) = kept.pop() {
                self.heap -= dropped.len();
            }
        }
        self.heap += (kept.capacity() - capacity) * size_of::<(u128, Box<[u8]>)>();
        self.heap as isize - before as isize
    }

    fn rows(&self) -> impl Iterator<Item = (u128, u128, &[u8])> {
        self.kept.iter().flat_map(|k| k.rows.iter().map(move |(o, r)| (k.group, *o, r.as_ref())))
    }

    fn len(&self) -> usize {
        self.kept.iter().map(|k| k.rows.len()).sum()
    }
}

/// What both accumulator forms share: the bound, the row order, the row encoding (the columns,
/// then the unit hash: the row order's input), the output fields.
struct Bound {
    groups: usize,
    rows: usize,
    order: SampleOrder,
    converter: RowConverter,
    fields: Fields,
}

fn order_value(bytes: &[u8]) -> Result<u128> {
    let bytes: [u8; 16] =
        bytes.try_into().map_err(|_| DataFusionError::Internal(format!("{NAME}: an order is not 16 bytes")))?;
    Ok(u128::from_be_bytes(bytes))
}

fn applied(delta: usize, change: isize) -> usize {
    delta.saturating_add_signed(change)
}

impl Bound {
    fn new(groups: usize, rows: usize, order: SampleOrder, columns: &[DataType], unit: &DataType) -> Result<Self> {
        let fields = columns.iter().chain([unit]).map(|t| SortField::new(t.clone())).collect();
        Ok(Self { groups, rows, order, converter: RowConverter::new(fields)?, fields: row_fields(columns) })
    }

    fn limits(&self) -> (usize, usize) {
        (self.groups, self.rows)
    }

    /// Offers the rows of `values` (group order, unit hash, columns…) to `samples[unit(i)]` for
    /// row `i` (None: the row is filtered out); returns the change in heap bytes. Rows whose
    /// group cannot be kept are rejected before their row is encoded and hashed.
    fn update(
        &self,
        samples: &mut [Sample],
        values: &[ArrayRef],
        unit: impl Fn(usize) -> Option<usize>,
    ) -> Result<isize> {
        let group_orders = values[0].as_fixed_size_binary();
        let mut candidates: Vec<u32> = Vec::new();
        let mut groups: Vec<u128> = Vec::new();
        for i in 0..group_orders.len() {
            let Some(u) = unit(i) else { continue };
            let group = order_value(group_orders.value(i))?;
            if samples[u].might_keep(self.groups, group) {
                candidates.push(i as u32);
                groups.push(group);
            }
        }
        if candidates.is_empty() {
            return Ok(0);
        }
        let mut columns: Vec<ArrayRef> = values[2..].to_vec();
        columns.push(Arc::clone(&values[1]));
        if candidates.len() < group_orders.len() {
            let indices = UInt32Array::from(candidates.clone());
            columns = columns.iter().map(|c| take(c.as_ref(), &indices, None)).collect::<Result<_, _>>()?;
        }
        let rows = self.converter.convert_columns(&columns)?;
        let mut change = 0;
        for (j, (&i, &group)) in candidates.iter().zip(&groups).enumerate() {
            let u = unit(i as usize).expect("a candidate row has a unit");
            let row = rows.row(j);
            let order = self.order.hash(row.as_ref());
            change += samples[u].offer(self.limits(), group, order, || row.as_ref().into());
        }
        Ok(change)
    }

    /// Merges the states in `lists` (each a list of (group order, row order, encoded row)) into
    /// `samples[into(l)]` for list `l` — read from the lists' flat entries, without a sliced
    /// array per list; returns the change in heap bytes.
    fn merge_lists(&self, lists: &ListArray, samples: &mut [Sample], into: impl Fn(usize) -> usize) -> Result<isize> {
        let entries = lists.values().as_struct();
        let (g, o) = (entries.column(0).as_fixed_size_binary(), entries.column(1).as_fixed_size_binary());
        let r = entries.column(2).as_binary::<i32>();
        let offsets = lists.value_offsets();
        let mut change = 0;
        for l in 0..lists.len() {
            if lists.is_null(l) {
                continue;
            }
            let sample = &mut samples[into(l)];
            for i in offsets[l] as usize..offsets[l + 1] as usize {
                let (group, order) = (order_value(g.value(i))?, order_value(o.value(i))?);
                change += sample.offer(self.limits(), group, order, || r.value(i).into());
            }
        }
        Ok(change)
    }

    /// The kept rows of each sample, as one list of structs per sample (the unit hash, the
    /// row encoding's last column, dropped).
    fn evaluate(&self, samples: &[Sample]) -> Result<ListArray> {
        let parser = self.converter.parser();
        let mut columns =
            self.converter.convert_rows(samples.iter().flat_map(|s| s.rows()).map(|(_, _, r)| parser.parse(r)))?;
        columns.truncate(self.fields.len());
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
            g.append_value(group.to_be_bytes())?;
            o.append_value(order.to_be_bytes())?;
            r.append_value(row);
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

impl Accumulator for UnitBoundAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.bound.update(std::slice::from_mut(&mut self.sample), values, |_| Some(0))?;
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.bound.merge_lists(states[0].as_list::<i32>(), std::slice::from_mut(&mut self.sample), |_| 0)?;
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let state = self.bound.state(std::slice::from_ref(&self.sample))?;
        Ok(vec![ScalarValue::List(Arc::new(state))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::List(Arc::new(self.bound.evaluate(std::slice::from_ref(&self.sample))?)))
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.bound.converter.size() + self.sample.heap
    }
}

/// Every unit's sample, indexed by DataFusion's group index (the vectorised form the hash
/// aggregate prefers: one call per batch, not per unit).
struct UnitBoundGroups {
    bound: Bound,
    samples: Vec<Sample>,
    /// Sum of the samples' heap bytes.
    bytes: usize,
}

fn passes(filter: Option<&BooleanArray>, i: usize) -> bool {
    filter.is_none_or(|f| f.is_valid(i) && f.value(i))
}

impl UnitBoundGroups {
    fn resize(&mut self, total: usize) {
        if self.samples.len() < total {
            self.samples.resize_with(total, Sample::default);
        }
    }

    fn recount(&mut self) {
        self.bytes = self.samples.iter().map(|s| s.heap).sum();
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
        let unit = |i: usize| passes(opt_filter, i).then(|| group_indices[i]);
        let change = self.bound.update(&mut self.samples, values, unit)?;
        self.bytes = applied(self.bytes, change);
        Ok(())
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.resize(total_num_groups);
        let change = self.bound.merge_lists(values[0].as_list::<i32>(), &mut self.samples, |l| group_indices[l])?;
        self.bytes = applied(self.bytes, change);
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
        let mut samples: Vec<Sample> = (0..values[0].len()).map(|_| Sample::default()).collect();
        self.bound.update(&mut samples, values, |i| passes(opt_filter, i).then_some(i))?;
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
    use datafusion::arrow::datatypes::Float64Type;

    const ORDER: (u64, u64) = (0x5eed_0001, 0x5eed_0002);

    fn keys(v: impl IntoIterator<Item = u128>) -> ArrayRef {
        Arc::new(FixedSizeBinaryArray::try_from_iter(v.into_iter().map(u128::to_be_bytes)).unwrap())
    }

    fn bound(groups: usize, rows: usize) -> Bound {
        let order = SampleOrder::with_key(ORDER);
        Bound::new(groups, rows, order, &[DataType::Float64], &DataType::FixedSizeBinary(16)).unwrap()
    }

    fn accumulator(groups: usize, rows: usize) -> UnitBoundAccumulator {
        UnitBoundAccumulator { bound: bound(groups, rows), sample: Sample::default() }
    }

    fn floats(a: &ArrayRef) -> Vec<f64> {
        a.as_struct().column(0).as_primitive::<Float64Type>().values().to_vec()
    }

    fn kept_values(acc: &mut UnitBoundAccumulator) -> Vec<f64> {
        let ScalarValue::List(l) = acc.evaluate().unwrap() else { panic!() };
        floats(&l.value(0))
    }

    /// The definition, computed from scratch: the `l` smallest group orders, in each the `k` rows
    /// with the smallest `order(x, unit)`, in (group, row order) order.
    fn definition(groups: &[u128], unit: u128, xs: &[f64], l: usize, k: usize) -> Vec<f64> {
        let cols: Vec<ArrayRef> = vec![Arc::new(Float64Array::from(xs.to_vec())), keys(vec![unit; xs.len()])];
        let orders = SampleOrder::with_key(ORDER).hashes(&cols).unwrap();
        let mut distinct = groups.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let mut out = Vec::new();
        for g in distinct.into_iter().take(l) {
            let mut rows: Vec<(u128, f64)> =
                (0..xs.len()).filter(|&i| groups[i] == g).map(|i| (orders[i], xs[i])).collect();
            rows.sort_by(|a, b| a.0.cmp(&b.0));
            out.extend(rows.into_iter().take(k).map(|(_, x)| x));
        }
        out
    }

    /// One unit's rows: 400 rows over 37 groups (group orders scrambled), values with repeats.
    fn one_unit() -> (Vec<u128>, u128, Vec<f64>) {
        let groups: Vec<u128> =
            (0..400u128).map(|i| (i * 7 % 37).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)).collect();
        let xs: Vec<f64> = (0..400).map(|i| f64::from(i * 13 % 101)).collect();
        (groups, 0xabcd, xs)
    }

    #[test]
    fn keeps_what_the_definition_keeps_whatever_the_batches() {
        let (groups, unit, xs) = one_unit();
        for (l, k) in [(1, 1), (2, 3), (5, 2), (40, 20), (3, 1000)] {
            let want = definition(&groups, unit, &xs, l, k);
            if k == 1000 {
                assert_eq!(want.len(), groups_sizes(&groups, l), "every row of the kept groups");
            }
            for batch in [400, 64, 7, 1] {
                let mut acc = accumulator(l, k);
                for from in (0..400).step_by(batch) {
                    let len = batch.min(400 - from);
                    let cols = [
                        keys(groups[from..from + len].iter().copied()),
                        keys(vec![unit; len]),
                        Arc::new(Float64Array::from(xs[from..from + len].to_vec())) as ArrayRef,
                    ];
                    acc.update_batch(&cols).unwrap();
                }
                assert_eq!(kept_values(&mut acc), want, "L = {l}, K = {k}, batches of {batch}");
            }
        }
    }

    /// Rows in the `l` smallest groups of `groups`.
    fn groups_sizes(groups: &[u128], l: usize) -> usize {
        let mut distinct = groups.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        groups.iter().filter(|g| distinct[..l].contains(g)).count()
    }

    #[test]
    fn the_vectorised_form_equals_one_accumulator_per_unit() {
        // Two units interleaved in one batch (indices 0 and 1), split over two batches, one row
        // filtered out.
        let (groups, _, xs) = one_unit();
        let n = 120;
        let units: Vec<usize> = (0..n).map(|i| (i * 5 / 3) % 2).collect();
        let hashes: Vec<u128> = units.iter().map(|&u| 100 + u as u128).collect();
        let filter = BooleanArray::from((0..n).map(|i| i != 17).collect::<Vec<_>>());
        let cols = [
            keys(groups[..n].iter().copied()),
            keys(hashes.iter().copied()),
            Arc::new(Float64Array::from(xs[..n].to_vec())) as ArrayRef,
        ];
        let mut vectorised = UnitBoundGroups { bound: bound(3, 2), samples: Vec::new(), bytes: 0 };
        for (from, len) in [(0, 50), (50, n - 50)] {
            let part: Vec<ArrayRef> = cols.iter().map(|c| c.slice(from, len)).collect();
            let f = filter.slice(from, len);
            vectorised.update_batch(&part, &units[from..from + len], Some(&f), 2).unwrap();
        }
        assert!(vectorised.size() > size_of_val(&vectorised) + vectorised.bound.converter.size());
        let out = vectorised.evaluate(EmitTo::All).unwrap();
        for unit in 0..2 {
            let take: Vec<usize> = (0..n).filter(|&i| units[i] == unit && i != 17).collect();
            let g: Vec<u128> = take.iter().map(|&i| groups[i]).collect();
            let x: Vec<f64> = take.iter().map(|&i| xs[i]).collect();
            let got = floats(&out.as_list::<i32>().value(unit));
            assert_eq!(got, definition(&g, 100 + unit as u128, &x, 3, 2), "unit {unit}");
        }
        assert_eq!(vectorised.size(), size_of_val(&vectorised) + vectorised.bound.converter.size(), "all emitted");
    }

    #[test]
    fn state_round_trips_and_merging_equals_one_pass() {
        let (groups, unit, xs) = one_unit();
        let cols =
            [keys(groups.iter().copied()), keys(vec![unit; 400]), Arc::new(Float64Array::from(xs.clone())) as ArrayRef];
        let mut whole = accumulator(4, 3);
        whole.update_batch(&cols).unwrap();
        let (mut a, mut b) = (accumulator(4, 3), accumulator(4, 3));
        let part = |from, len| cols.iter().map(|c| c.slice(from, len)).collect::<Vec<_>>();
        a.update_batch(&part(0, 150)).unwrap();
        b.update_batch(&part(150, 250)).unwrap();
        let state = b.state().unwrap().remove(0).to_array().unwrap();
        a.merge_batch(&[state]).unwrap();
        let want = definition(&groups, unit, &xs, 4, 3);
        assert_eq!(kept_values(&mut a), want);
        assert_eq!(kept_values(&mut whole), want);
        // Each row as its own state, merged: the same sample again.
        let groups_acc = UnitBoundGroups { bound: bound(4, 3), samples: Vec::new(), bytes: 0 };
        let states = groups_acc.convert_to_state(&cols, None).unwrap();
        let mut merged = accumulator(4, 3);
        merged.merge_batch(&states).unwrap();
        assert_eq!(kept_values(&mut merged), want);
    }

    #[test]
    fn memory_does_not_grow_with_the_unit() {
        let mut acc = accumulator(1, 3);
        let n = 100_000usize;
        let groups = keys(vec![0; n]);
        let unit = keys(vec![7; n]);
        let xs: ArrayRef = Arc::new(Float64Array::from((0..n).map(|i| i as f64).collect::<Vec<_>>()));
        let before = {
            let mut small = accumulator(1, 3);
            small.update_batch(&[groups.slice(0, 3), unit.slice(0, 3), xs.slice(0, 3)]).unwrap();
            small.size()
        };
        acc.update_batch(&[groups, unit, xs]).unwrap();
        assert_eq!(kept_values(&mut acc).len(), 3);
        assert!(acc.size() <= before + 64, "{} vs {before}", acc.size());
    }
}
