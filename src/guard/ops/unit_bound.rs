//! `dpcurve_unit_bound`: the streaming per-unit contribution bound (SPEC §0, §7).
//!
//! An aggregate grouped by the unit, called as `dpcurve_unit_bound(unit, k0, k1, …, c0, c1, …)`
//! where `unit` is what the aggregate groups by, the `k`s are the group key the private aggregate
//! above groups by and the `c`s the columns it reads. For its unit it keeps at most `L` groups —
//! those with the smallest group order `order(unit hash, k0, k1, …)` — and in each of them at most
//! `K` rows — those with the smallest row order `order(c0, c1, …, unit hash)` — and returns them as
//! a list of structs `{c0, c1, …}` (the guard unnests it back into rows). `order` is the keyed
//! 128-bit hash [`SampleOrder`] of the values' canonical row encoding and the unit hash is
//! `order(unit)`, so the kept rows are a uniformly random sample of the unit's rows and a function
//! of the unit's own rows only.
//!
//! `unit` is either the unit's hash (computed in the plan: any unit type) or, for units of an
//! integer-like type of at most 16 bytes, the unit's value ([`UnitArg`]): the aggregate then groups
//! by the value and the hash is computed here once per unit instead of once per row. Either way
//! a unit costs the same fixed number of bytes as a group key.
//!
//! Both orders are computed here, the row order only for rows whose group can still be among the
//! unit's `L` smallest: a row whose group order is larger than the `L`-th kept group's is rejected
//! before its columns are encoded or hashed (it could never be kept, since a unit's `L`-th smallest
//! group order only decreases as rows arrive). The kept rows are exactly those of the definition
//! above, whatever the batches.
//!
//! Its state is `O(K·L)` rows per unit whatever the unit's size: a unit of 10⁷ rows costs the
//! same memory as one of K·L rows (a window partition held all of them, and its sort failed under
//! the memory limit only when that unit was present). Kept rows are stored in Arrow's row
//! encoding (owned bytes, not slices that would pin whole input batches). The number of units is
//! the aggregate's number of groups: the bound's own aggregate (`guard::exec::planned_aggregate`,
//! in one process and on a cluster's executors) holds them and spills them by hash partitions on a
//! schedule planned from public facts.

use std::fmt;
use std::mem::size_of_val;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanArray, FixedSizeBinaryBuilder, ListArray, StructArray, UInt32Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{DataFusionError, Result, ScalarValue, internal_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility};

use super::sample_order::{SampleOrder, decoded_as};
use super::unit_sample::{INLINE, Sample, Samples, Units};

/// The function's name.
pub const NAME: &str = "dpcurve_unit_bound";

/// Rows between a unit sample's prefetch and its use.
const AHEAD: usize = 8;

/// Rows whose group orders are hashed together.
const BLOCK: usize = 256;

/// What the first argument (and the aggregate's grouping) carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnitArg {
    /// The unit's keyed hash, 16 bytes computed in the plan (any unit type).
    Hash,
    /// The unit's own value, of an integer-like type of at most 16 bytes: hashed here, once per
    /// unit.
    Value,
}

/// The bound: at most `groups` groups per unit, `rows` rows per unit and group, both ranked by
/// `order`; `keys` group-key arguments follow the unit.
#[derive(PartialEq, Eq, Hash)]
pub struct UnitBound {
    signature: Signature,
    groups: u64,
    rows: u64,
    order: SampleOrder,
    keys: usize,
    unit: UnitArg,
}

impl fmt::Debug for UnitBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitBound {{ groups: {}, rows: {}, unit: {:?} }}", self.groups, self.rows, self.unit)
    }
}

impl UnitBound {
    /// At most `groups` groups and `rows` rows per group (both at least 1), ranked by `order`,
    /// over arguments `(unit, k0 … k{keys-1}, c0, c1, …)`.
    pub fn new(groups: u64, rows: u64, order: SampleOrder, keys: usize, unit: UnitArg) -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
            groups: groups.max(1),
            rows: rows.max(1),
            order,
            keys,
            unit,
        }
    }

    /// (groups, rows).
    pub fn bound(&self) -> (u64, u64) {
        (self.groups, self.rows)
    }

    /// The order (to ship the bound to a cluster's executors).
    #[cfg(feature = "cluster")]
    pub(crate) fn order(&self) -> &SampleOrder {
        &self.order
    }

    /// (group-key arguments, what the unit argument carries).
    pub fn arguments(&self) -> (usize, UnitArg) {
        (self.keys, self.unit)
    }

    /// The most bytes one row can add to the groups accumulator's state, with `per_unit` more
    /// bytes held elsewhere for each unit (its key in the operator's table), when the arguments
    /// are of `types` ([`Sample::most_bytes_per_row`]), and whether that is a bound: it is when
    /// the kept columns are of fixed width; for others it counts a value of variable width as
    /// empty (its bytes have no public bound). Besides these, the state holds what it holds
    /// empty (its `size()` then: one chunk of samples). `tests::a_rows_bytes_stay_within_the_bound`
    /// checks it against `size()` on the inputs that grow the state most.
    pub fn most_bytes_per_row(&self, types: &[DataType], per_unit: usize) -> Result<(usize, bool)> {
        let (width, fixed) = row_width(self.columns(types)?);
        let row = if width <= INLINE && fixed { 0 } else { width };
        Ok((Sample::most_bytes_per_row(per_unit, row, usize::try_from(self.groups).unwrap_or(usize::MAX)), fixed))
    }

    fn columns<'a, T>(&self, args: &'a [T]) -> Result<&'a [T]> {
        match args.get(1 + self.keys..) {
            Some(columns) if !columns.is_empty() => Ok(columns),
            _ => internal_err!("{NAME} takes the unit, {} group keys and at least one column", self.keys),
        }
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
        let columns = self.columns(arg_types)?;
        Ok(DataType::List(Arc::new(Field::new_list_field(DataType::Struct(row_fields(columns)), true))))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new_list(
            format_state_name(args.name, "kept"),
            Field::new_list_field(DataType::Struct(state_entry_fields()), true),
            true,
        ))])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(UnitBoundAccumulator::new(self.bound_for(&args)?)))
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(UnitBoundGroups::new(self.bound_for(&args)?)))
    }
}

impl UnitBound {
    fn bound_for(&self, args: &AccumulatorArgs) -> Result<Bound> {
        let types = args.exprs.iter().map(|e| e.data_type(args.schema)).collect::<Result<Vec<DataType>>>()?;
        let columns = self.columns(&types)?;
        Bound::new(self, &types[0], &types[1..1 + self.keys], columns)
    }
}

/// What both accumulator forms share: the bound, the order, the row encodings (of the unit
/// when it comes as its value, of the group keys, of the columns), the output fields.
struct Bound {
    groups: usize,
    rows: usize,
    order: SampleOrder,
    /// The unit's encoding when it comes as its value (None: it comes as its hash).
    unit: Option<RowConverter>,
    /// The group keys' encoding (None: no group keys).
    keys: Option<RowConverter>,
    /// Whether every group key's encoding has one width (so every row's group order message
    /// does: they are hashed side by side).
    fixed_keys: bool,
    /// Whether every column's encoding has one width (so every row order message does).
    fixed_columns: bool,
    /// Where the columns start among the arguments (after the unit and the group keys).
    first_column: usize,
    columns: RowConverter,
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

/// Bytes of one row of `types` in Arrow's row encoding (a validity byte, then the value), and
/// whether every type is of fixed width; a value of variable width counts as empty.
pub fn row_width(types: &[DataType]) -> (usize, bool) {
    types.iter().fold((0, true), |(w, fixed), t| match t {
        DataType::Boolean => (w + 2, fixed),
        DataType::Null => (w + 1, fixed),
        DataType::FixedSizeBinary(n) => (w + 1 + usize::try_from(*n).unwrap_or(0), fixed),
        t => match t.primitive_width() {
            Some(v) => (w + 1 + v, fixed),
            None => (w + 1, false),
        },
    })
}

/// The unit bound's share of a memory limit of `limit` bytes: half. The planner gives private
/// calls over a table with a privacy unit the other half.
pub const fn memory_share(limit: usize) -> usize {
    limit / 2
}

fn converter(types: &[DataType]) -> Result<Option<RowConverter>> {
    if types.is_empty() {
        return Ok(None);
    }
    Ok(Some(RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?))
}

/// Appends the canonical row encoding of a non-null 16-byte hash (a `FixedSizeBinary(16)`
/// value: a validity byte, then the bytes) to `out`.
fn push_hash(out: &mut Vec<u8>, hash: u128) {
    out.push(1);
    out.extend_from_slice(&hash.to_be_bytes());
}

impl Bound {
    fn new(udf: &UnitBound, unit: &DataType, keys: &[DataType], columns: &[DataType]) -> Result<Self> {
        let unit = match udf.unit {
            UnitArg::Hash if *unit == DataType::FixedSizeBinary(16) => None,
            UnitArg::Hash => return internal_err!("{NAME}: a unit hash is not 16 bytes"),
            UnitArg::Value => converter(std::slice::from_ref(unit))?,
        };
        Ok(Self {
            groups: udf.groups as usize,
            rows: udf.rows as usize,
            order: udf.order.clone(),
            unit,
            keys: converter(keys)?,
            fixed_keys: row_width(keys).1,
            fixed_columns: row_width(columns).1,
            first_column: 1 + keys.len(),
            columns: converter(columns)?.ok_or_else(|| DataFusionError::Internal(format!("{NAME}: no column")))?,
            fields: row_fields(columns),
        })
    }

    fn limits(&self) -> (usize, usize) {
        (self.groups, self.rows)
    }

    fn encoders_size(&self) -> usize {
        [&self.unit, &self.keys].iter().filter_map(|c| c.as_ref()).map(RowConverter::size).sum::<usize>()
            + self.columns.size()
    }

    /// The order of each message of `messages` (ending at `ends`), appended to `out`: side by
    /// side when every message has one width (`fixed`: a fact of the key types), else one at a
    /// time.
    fn hash_all(&self, fixed: bool, messages: &[u8], ends: &[usize], out: &mut Vec<u128>) {
        match (fixed, ends.first()) {
            (true, Some(&width)) => self.order.hash_each(messages, width, out),
            _ => out.extend(
                ends.iter().scan(0, |from, &to| Some(self.order.hash(&messages[std::mem::replace(from, to)..to]))),
            ),
        }
    }

    /// Offers the rows of `values` (unit, group keys…, columns…) to `samples[unit(i)]` for row
    /// `i` (None: the row is filtered out); returns the change in heap bytes. Rows whose group
    /// cannot be kept are rejected before their columns are encoded and hashed.
    fn update<const N: usize>(
        &self,
        samples: &mut Units<N>,
        values: &[ArrayRef],
        unit: impl Fn(usize) -> Option<usize>,
    ) -> Result<isize> {
        let n = values[0].len();
        let keys: Option<Rows> = match &self.keys {
            Some(c) => Some(c.convert_columns(&values[1..self.first_column])?),
            None => None,
        };
        // Each row's unit hash: the plan's column (read once per batch as an array, not per row),
        // or the unit's screen, hashed from the unit's value (`units`) the first time it is seen.
        let from_plan = match &self.unit {
            None => Some(values[0].as_fixed_size_binary()),
            Some(_) => None,
        };
        let mut units: Option<Rows> = None;
        // Each candidate row's index, group order and unit hash, with room for every row (what a
        // batch allocates does not depend on how many of its rows are candidates).
        let (mut candidates, mut groups, mut unit_hashes) =
            (Vec::<u32>::with_capacity(n), Vec::<u128>::with_capacity(n), Vec::<u128>::with_capacity(n));
        // The rows' group orders, a block of rows at a time: each row's message (its unit's hash,
        // then its group key) is written first, then the block's messages are hashed side by side
        // (when the keys are of fixed width: a fact of their type), then each row is screened.
        let mut messages = Vec::with_capacity(BLOCK * 64);
        let (mut rows, mut ends, mut orders) =
            (Vec::with_capacity(BLOCK), Vec::with_capacity(BLOCK), Vec::with_capacity(BLOCK));
        // Candidates before this index have had their kept groups asked for.
        let mut kept_asked = 0;
        for start in (0..n).step_by(BLOCK) {
            messages.clear();
            rows.clear();
            ends.clear();
            orders.clear();
            for i in start..(start + BLOCK).min(n) {
                // The screen of a row a few rows ahead is requested now, so that the units'
                // screens (larger than the nearest caches) arrive in parallel instead of one miss
                // per row.
                if let Some(ahead) = (i + AHEAD < n).then(|| unit(i + AHEAD)).flatten() {
                    samples.prefetch_screen(ahead);
                }
                let Some(u) = unit(i) else { continue };
                // The screen is read once: no offer moves a threshold before the batch's rows are screened.
                let screen = *samples.screen(u);
                let unit_hash = match (from_plan, &self.unit) {
                    // The plan computed it: read in the row's order, not from the unit's screen.
                    (Some(plan), _) => order_value(plan.value(i))?,
                    (None, unit) => match screen.unit_hash() {
                        Some(h) => h,
                        None => {
                            if units.is_none() {
                                let c = unit.as_ref().expect("a unit that is not a hash comes as its value");
                                units = Some(c.convert_columns(&values[..1])?);
                            }
                            let h = self.order.hash(units.as_ref().expect("encoded above").row(i).as_ref());
                            samples.screen_mut(u).set_unit_hash(h);
                            h
                        }
                    },
                };
                push_hash(&mut messages, unit_hash);
                if let Some(k) = &keys {
                    messages.extend_from_slice(k.row(i).as_ref());
                }
                rows.push((i, u, unit_hash, screen));
                ends.push(messages.len());
            }
            self.hash_all(self.fixed_keys, &messages, &ends, &mut orders);
            // The kept groups of the earlier blocks' candidates, whose samples were asked for a
            // block ago, are asked for now: a few lines at a time between the blocks' hashing,
            // rather than all of a batch's at once (which waits on the memory system's queue).
            for &i in &candidates[kept_asked..] {
                samples.prefetch_kept(unit(i as usize).expect("a candidate row has a unit"));
            }
            kept_asked = candidates.len();
            for (&(i, u, unit_hash, screen), &group) in rows.iter().zip(&orders) {
                if screen.admits(group) {
                    samples.prefetch_sample(u);
                    candidates.push(i as u32);
                    groups.push(group);
                    unit_hashes.push(unit_hash);
                }
            }
        }
        if candidates.is_empty() {
            return Ok(0);
        }
        // Every candidate's sample was asked for when it passed its screen, and the kept groups
        // of all but the last block's candidates during the next block; the last block's are
        // asked for now, so that they arrive while the rows are encoded and hashed, instead of
        // one cache miss at a time in the offers below.
        for &i in &candidates[kept_asked..] {
            samples.prefetch_kept(unit(i as usize).expect("a candidate row has a unit"));
        }
        let mut columns: Vec<ArrayRef> = values[self.first_column..].to_vec();
        if candidates.len() < n {
            let indices = UInt32Array::from(candidates.clone());
            columns = columns.iter().map(|c| take(c.as_ref(), &indices, None)).collect::<Result<_, _>>()?;
        }
        let rows = self.columns.convert_columns(&columns)?;
        // The candidates' row orders (each row's encoded columns, then its unit's hash): side by
        // side when the columns are of fixed width (a fact of their type: the messages take at
        // most a batch's rows of that width), else one at a time in one row's scratch, so that a
        // long value is not copied twice.
        orders.clear();
        let message = |j: usize, into: &mut Vec<u8>| {
            into.extend_from_slice(rows.row(j).as_ref());
            push_hash(into, unit_hashes[j]);
        };
        if self.fixed_columns {
            messages.clear();
            (0..candidates.len()).for_each(|j| message(j, &mut messages));
            self.order.hash_each(&messages, messages.len() / candidates.len(), &mut orders);
        } else {
            let mut scratch = Vec::new();
            orders.extend((0..candidates.len()).map(|j| {
                scratch.clear();
                message(j, &mut scratch);
                self.order.hash(&scratch)
            }));
        }
        let mut change = 0;
        for (j, ((&i, &group), &order)) in candidates.iter().zip(&groups).zip(&orders).enumerate() {
            let u = unit(i as usize).expect("a candidate row has a unit");
            change += samples.offer(u, self.limits(), group, order, rows.row(j).as_ref());
        }
        Ok(change)
    }

    /// Merges the states in `lists` (each a list of (group order, row order, encoded row)) into
    /// `samples[into(l)]` for list `l` — read from the lists' flat entries, without a sliced
    /// array per list; returns the change in heap bytes.
    fn merge_lists<const N: usize>(
        &self,
        lists: &ListArray,
        samples: &mut Units<N>,
        into: impl Fn(usize) -> usize,
    ) -> Result<isize> {
        let entries = lists.values().as_struct();
        let (g, o) = (entries.column(0).as_fixed_size_binary(), entries.column(1).as_fixed_size_binary());
        let r = entries.column(2).as_binary::<i32>();
        let offsets = lists.value_offsets();
        let mut change = 0;
        for l in 0..lists.len() {
            if lists.is_null(l) {
                continue;
            }
            let unit = into(l);
            for i in offsets[l] as usize..offsets[l + 1] as usize {
                let (group, order) = (order_value(g.value(i))?, order_value(o.value(i))?);
                change += samples.offer(unit, self.limits(), group, order, r.value(i));
            }
        }
        Ok(change)
    }

    fn emit<'a>(&self, samples: impl Iterator<Item = &'a Sample> + Clone, what: Emitted) -> Result<ListArray> {
        match what {
            Emitted::Values => self.evaluate(samples),
            Emitted::State => self.state(samples),
        }
    }

    /// The kept rows of each sample, as one list of structs per sample (the unit hash, the
    /// row encoding's last column, dropped).
    fn evaluate<'a>(&self, samples: impl Iterator<Item = &'a Sample> + Clone) -> Result<ListArray> {
        let parser = self.columns.parser();
        let columns =
            self.columns.convert_rows(samples.clone().flat_map(|s| s.rows()).map(|(_, _, r)| parser.parse(r)))?;
        let columns = decoded_as(columns, self.fields.iter().map(|f| f.data_type()))?;
        let kept = StructArray::try_new(self.fields.clone(), columns, None)?;
        let field = Arc::new(Field::new_list_field(DataType::Struct(self.fields.clone()), true));
        Ok(ListArray::try_new(field, OffsetBuffer::from_lengths(samples.map(Sample::len)), Arc::new(kept), None)?)
    }

    /// The state of each sample: one list of (group order, row order, encoded row) per sample.
    fn state<'a>(&self, samples: impl Iterator<Item = &'a Sample> + Clone) -> Result<ListArray> {
        let mut g = FixedSizeBinaryBuilder::new(16);
        let mut o = FixedSizeBinaryBuilder::new(16);
        let mut r = BinaryBuilder::new();
        for (group, order, row) in samples.clone().flat_map(|s| s.rows()) {
            g.append_value(group.to_be_bytes())?;
            o.append_value(order.to_be_bytes())?;
            r.append_value(row);
        }
        let columns: Vec<ArrayRef> = vec![Arc::new(g.finish()), Arc::new(o.finish()), Arc::new(r.finish())];
        let entries = StructArray::try_new(state_entry_fields(), columns, None)?;
        let field = Arc::new(Field::new_list_field(DataType::Struct(state_entry_fields()), true));
        Ok(ListArray::try_new(field, OffsetBuffer::from_lengths(samples.map(Sample::len)), Arc::new(entries), None)?)
    }
}

/// One unit's sample (DataFusion's per-group form).
struct UnitBoundAccumulator {
    bound: Bound,
    unit: Units<1>,
}

impl UnitBoundAccumulator {
    fn new(bound: Bound) -> Self {
        Self { bound, unit: Units::of(1) }
    }
}

impl fmt::Debug for UnitBoundAccumulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitBoundAccumulator {{ groups: {}, rows: {} }}", self.bound.groups, self.bound.rows)
    }
}

impl Accumulator for UnitBoundAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.bound.update(&mut self.unit, values, |_| Some(0))?;
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.bound.merge_lists(states[0].as_list::<i32>(), &mut self.unit, |_| 0)?;
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.unit.sort();
        let state = self.bound.state(self.unit.iter())?;
        Ok(vec![ScalarValue::List(Arc::new(state))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.unit.sort();
        Ok(ScalarValue::List(Arc::new(self.bound.evaluate(self.unit.iter())?)))
    }

    fn size(&self) -> usize {
        size_of_val(self)
            + self.bound.encoders_size()
            + self.unit.size()
            + self.unit.iter().map(Sample::heap).sum::<usize>()
    }
}

/// Every unit's sample, indexed by DataFusion's group index (the vectorised form the hash
/// aggregate prefers: one call per batch, not per unit).
struct UnitBoundGroups {
    bound: Bound,
    samples: Samples,
    /// Sum of the samples' heap bytes.
    bytes: usize,
}

/// What a sample is emitted as: its kept rows, or its state.
#[derive(Clone, Copy)]
enum Emitted {
    Values,
    State,
}

/// `samples`, each sorted for emission.
fn sorted(mut samples: Vec<Sample>) -> Vec<Sample> {
    samples.iter_mut().for_each(Sample::sort);
    samples
}

/// Whether row `i` passes an aggregate's filter (a NULL does not).
pub(super) fn passes(filter: Option<&BooleanArray>, i: usize) -> bool {
    filter.is_none_or(|f| f.is_valid(i) && f.value(i))
}

impl UnitBoundGroups {
    fn new(bound: Bound) -> Self {
        Self { bound, samples: Samples::with_first_chunk(), bytes: 0 }
    }

    fn recount(&mut self) {
        self.bytes = self.samples.iter().map(Sample::heap).sum();
    }

    /// The first `n` samples or all of them, sorted, as values or states; emitting all keeps the
    /// store's room for the units that follow (a spill window's).
    fn emit(&mut self, emit_to: EmitTo, what: Emitted) -> Result<ListArray> {
        let out = match emit_to {
            EmitTo::All => {
                self.samples.sort();
                let out = self.bound.emit(self.samples.iter(), what)?;
                self.samples.clear();
                out
            }
            EmitTo::First(n) => self.bound.emit(sorted(self.samples.take_first(n)).iter(), what)?,
        };
        self.recount();
        Ok(out)
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
        self.samples.resize(total_num_groups);
        let unit = |i: usize| passes(opt_filter, i).then(|| group_indices[i]);
        let change = self.bound.update(&mut self.samples, values, unit)?;
        self.bytes = applied(self.bytes, change);
        Ok(())
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.samples.resize(total_num_groups);
        let change = self.bound.merge_lists(values[0].as_list::<i32>(), &mut self.samples, |l| group_indices[l])?;
        self.bytes = applied(self.bytes, change);
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(Arc::new(self.emit(emit_to, Emitted::Values)?))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![Arc::new(self.emit(emit_to, Emitted::State)?)])
    }

    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        // Each row its own unit: a list of its one entry (none when filtered out).
        let mut samples = Samples::of(values[0].len());
        self.bound.update(&mut samples, values, |i| passes(opt_filter, i).then_some(i))?;
        samples.sort();
        Ok(vec![Arc::new(self.bound.state(samples.iter())?)])
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.bound.encoders_size() + self.samples.size() + self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{FixedSizeBinaryArray, Float64Array, Int64Array};
    use datafusion::arrow::datatypes::Float64Type;

    const ORDER: (u64, u64) = (0x5eed_0001, 0x5eed_0002);

    fn order() -> SampleOrder {
        SampleOrder::with_key(ORDER)
    }

    fn hashes(v: impl IntoIterator<Item = u128>) -> ArrayRef {
        Arc::new(FixedSizeBinaryArray::try_from_iter(v.into_iter().map(u128::to_be_bytes)).unwrap())
    }

    fn ints(v: impl IntoIterator<Item = i64>) -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(v))
    }

    /// The unit argument of `units` in mode `arg`: the unit's hash, or its value.
    fn unit_column(arg: UnitArg, units: &[i64]) -> ArrayRef {
        match arg {
            UnitArg::Value => ints(units.iter().copied()),
            UnitArg::Hash => hashes(order().hashes(&[ints(units.iter().copied())]).unwrap()),
        }
    }

    fn bound(arg: UnitArg, groups: usize, rows: usize) -> Bound {
        let udf = UnitBound::new(groups as u64, rows as u64, order(), 1, arg);
        let unit = match arg {
            UnitArg::Hash => DataType::FixedSizeBinary(16),
            UnitArg::Value => DataType::Int64,
        };
        Bound::new(&udf, &unit, &[DataType::Int64], &[DataType::Float64]).unwrap()
    }

    fn accumulator(arg: UnitArg, groups: usize, rows: usize) -> UnitBoundAccumulator {
        UnitBoundAccumulator::new(bound(arg, groups, rows))
    }

    fn floats(a: &ArrayRef) -> Vec<f64> {
        a.as_struct().column(0).as_primitive::<Float64Type>().values().to_vec()
    }

    fn kept_values(acc: &mut UnitBoundAccumulator) -> Vec<f64> {
        let ScalarValue::List(l) = acc.evaluate().unwrap() else { panic!() };
        floats(&l.value(0))
    }

    /// The definition, computed from scratch with the plan-level order function: with
    /// h = order(unit), the `l` groups with the smallest order(h, g), in each the `k` rows with
    /// the smallest order(x, h), in (group order, row order) order.
    fn definition(unit: i64, gs: &[i64], xs: &[f64], l: usize, k: usize) -> Vec<f64> {
        let n = xs.len();
        let h = hashes(order().hashes(&[ints(vec![unit; n])]).unwrap());
        let group_orders = order().hashes(&[Arc::clone(&h), ints(gs.iter().copied())]).unwrap();
        let row_orders = order().hashes(&[Arc::new(Float64Array::from(xs.to_vec())), h]).unwrap();
        let mut distinct = group_orders.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let mut out = Vec::new();
        for g in distinct.into_iter().take(l) {
            let mut rows: Vec<(u128, f64)> =
                (0..n).filter(|&i| group_orders[i] == g).map(|i| (row_orders[i], xs[i])).collect();
            rows.sort_by_key(|a| a.0);
            out.extend(rows.into_iter().take(k).map(|(_, x)| x));
        }
        out
    }

    /// 400 rows over 37 groups, values with repeats.
    fn rows() -> (Vec<i64>, Vec<f64>) {
        ((0..400).map(|i| i * 7 % 37).collect(), (0..400).map(|i| f64::from(i * 13 % 101)).collect())
    }

    fn batch(arg: UnitArg, units: &[i64], gs: &[i64], xs: &[f64]) -> Vec<ArrayRef> {
        vec![unit_column(arg, units), ints(gs.iter().copied()), Arc::new(Float64Array::from(xs.to_vec()))]
    }

    #[test]
    fn keeps_what_the_definition_keeps_whatever_the_batches() {
        let (gs, xs) = rows();
        for arg in [UnitArg::Hash, UnitArg::Value] {
            for (l, k) in [(1, 1), (2, 3), (5, 2), (17, 5), (25, 4), (40, 20), (3, 1000)] {
                let want = definition(42, &gs, &xs, l, k);
                if k == 1000 {
                    // Every row of the kept groups: 400 rows over 37 groups, 10 or 11 each.
                    assert!((30..=33).contains(&want.len()), "{}", want.len());
                }
                for size in [400, 64, 7, 1] {
                    let mut acc = accumulator(arg, l, k);
                    for from in (0..400).step_by(size) {
                        let to = (from + size).min(400);
                        acc.update_batch(&batch(arg, &vec![42; to - from], &gs[from..to], &xs[from..to])).unwrap();
                    }
                    assert_eq!(kept_values(&mut acc), want, "{arg:?}, L = {l}, K = {k}, batches of {size}");
                }
            }
        }
    }

    /// Keys and columns of variable width (text) take the one-at-a-time hashes, not the lanes:
    /// the same rows as the definition (and, control, not the same as a bound of one row less).
    #[test]
    fn keeps_what_the_definition_keeps_with_text_keys_and_columns() {
        use datafusion::arrow::array::StringArray;
        let n = 300;
        let gs: ArrayRef = Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("g{}", i * 7 % 23))));
        let xs: ArrayRef = Arc::new(StringArray::from_iter_values((0..n).map(|i| "v".repeat(i * 13 % 29))));
        let h = hashes(order().hashes(&[ints(vec![42; n])]).unwrap());
        let group_orders = order().hashes(&[Arc::clone(&h), Arc::clone(&gs)]).unwrap();
        let row_orders = order().hashes(&[Arc::clone(&xs), h]).unwrap();
        let (l, k) = (4, 3);
        let mut distinct = group_orders.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let want: Vec<String> = distinct[..l]
            .iter()
            .flat_map(|&g| {
                let mut rows: Vec<(u128, usize)> =
                    (0..n).filter(|&i| group_orders[i] == g).map(|i| (row_orders[i], i)).collect();
                rows.sort_unstable();
                rows.into_iter().take(k).map(|(_, i)| xs.as_string::<i32>().value(i).to_string())
            })
            .collect();
        for (rows, equal) in [(k, true), (k - 1, false)] {
            let udf = UnitBound::new(l as u64, rows as u64, order(), 1, UnitArg::Value);
            let bound = Bound::new(&udf, &DataType::Int64, &[DataType::Utf8], &[DataType::Utf8]).unwrap();
            assert!(!bound.fixed_keys && !bound.fixed_columns);
            let mut acc = UnitBoundAccumulator::new(bound);
            for from in (0..n).step_by(64) {
                let len = 64.min(n - from);
                acc.update_batch(&[ints(vec![42; len]), gs.slice(from, len), xs.slice(from, len)]).unwrap();
            }
            let ScalarValue::List(kept) = acc.evaluate().unwrap() else { panic!() };
            let kept = kept.value(0);
            let got: Vec<String> =
                kept.as_struct().column(0).as_string::<i32>().iter().map(|v| v.unwrap().to_string()).collect();
            assert_eq!(got == want, equal, "K = {rows}");
        }
    }

    #[test]
    fn the_vectorised_form_equals_the_definition_per_unit() {
        // Three units interleaved, two batches, one row filtered out.
        let (gs, xs) = rows();
        let n = 300;
        let units: Vec<usize> = (0..n).map(|i| (i * 5 / 3) % 3).collect();
        let values: Vec<i64> = units.iter().map(|&u| 100 + u as i64).collect();
        let filter = BooleanArray::from((0..n).map(|i| i != 17).collect::<Vec<_>>());
        for arg in [UnitArg::Hash, UnitArg::Value] {
            let cols = batch(arg, &values, &gs[..n], &xs[..n]);
            let mut vectorised = UnitBoundGroups::new(bound(arg, 3, 2));
            let empty = vectorised.size();
            for (from, len) in [(0, 50), (50, n - 50)] {
                let part: Vec<ArrayRef> = cols.iter().map(|c| c.slice(from, len)).collect();
                vectorised.update_batch(&part, &units[from..from + len], Some(&filter.slice(from, len)), 3).unwrap();
            }
            assert!(vectorised.size() > empty);
            let out = vectorised.evaluate(EmitTo::All).unwrap();
            for unit in 0..3 {
                let rows: Vec<usize> = (0..n).filter(|&i| units[i] == unit && i != 17).collect();
                let g: Vec<i64> = rows.iter().map(|&i| gs[i]).collect();
                let x: Vec<f64> = rows.iter().map(|&i| xs[i]).collect();
                let got = floats(&out.as_list::<i32>().value(unit));
                assert_eq!(got, definition(100 + unit as i64, &g, &x, 3, 2), "{arg:?}, unit {unit}");
            }
            assert_eq!(vectorised.size(), empty, "all emitted");
        }
    }

    #[test]
    fn state_round_trips_and_merging_equals_one_pass() {
        let (gs, xs) = rows();
        // A few groups (a sorted vector), and more than a sorted vector holds (an indexed heap).
        for (l, k) in [(4, 3), (20, 6)] {
            for arg in [UnitArg::Hash, UnitArg::Value] {
                let cols = batch(arg, &[9; 400], &gs, &xs);
                let want = definition(9, &gs, &xs, l, k);
                let (mut a, mut b) = (accumulator(arg, l, k), accumulator(arg, l, k));
                let part = |from, len| cols.iter().map(|c| c.slice(from, len)).collect::<Vec<_>>();
                a.update_batch(&part(0, 150)).unwrap();
                b.update_batch(&part(150, 250)).unwrap();
                let state = b.state().unwrap().remove(0).to_array().unwrap();
                a.merge_batch(&[state]).unwrap();
                assert_eq!(kept_values(&mut a), want, "{arg:?}, L = {l}");
                // Each row as its own state, merged: the same sample again.
                let groups = UnitBoundGroups::new(bound(arg, l, k));
                let states = groups.convert_to_state(&cols, None).unwrap();
                let mut merged = accumulator(arg, l, k);
                merged.merge_batch(&states).unwrap();
                assert_eq!(kept_values(&mut merged), want, "{arg:?}, L = {l}");
            }
        }
    }

    #[test]
    fn memory_does_not_grow_with_the_unit() {
        let n = 100_000usize;
        let cols = batch(UnitArg::Value, &vec![7; n], &vec![0; n], &(0..n).map(|i| i as f64).collect::<Vec<_>>());
        let before = {
            let mut small = accumulator(UnitArg::Value, 1, 3);
            small.update_batch(&cols.iter().map(|c| c.slice(0, 3)).collect::<Vec<_>>()).unwrap();
            small.size()
        };
        let mut acc = accumulator(UnitArg::Value, 1, 3);
        acc.update_batch(&cols).unwrap();
        assert_eq!(kept_values(&mut acc).len(), 3);
        assert!(acc.size() <= before + 64, "{} vs {before}", acc.size());
    }

    /// A row of fixed-width columns is as long in Arrow's row encoding as `row_width` says.
    #[test]
    fn the_row_width_is_the_encodings() {
        let columns: Vec<ArrayRef> = vec![
            ints([1, -2]),
            Arc::new(Float64Array::from(vec![1.5, f64::NAN])),
            Arc::new(BooleanArray::from(vec![Some(true), None])),
            hashes([3, 4]),
        ];
        let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
        let rows = converter(&types).unwrap().unwrap().convert_columns(&columns).unwrap();
        let (want, fixed) = row_width(&types);
        assert!(fixed && rows.iter().all(|r| r.as_ref().len() == want), "{want}");
        assert!(!row_width(&[DataType::Float64, DataType::Utf8]).1);
    }

    /// `most_bytes_per_row` bounds what the state grows by per row on the inputs that grow it most
    /// (every row a new unit; units of two rows in two groups; units of many rows over many
    /// groups, rows arriving in descending order so each is kept and replaces another; rows too
    /// long to hold inline), and is within 5 % of what one of them holds (the control: a bound 5 %
    /// smaller fails there).
    #[test]
    fn a_rows_bytes_stay_within_the_bound() {
        let narrow = [DataType::Int64, DataType::Int64, DataType::Float64];
        let wide = [DataType::Int64, DataType::Int64, DataType::Float64, DataType::Float64, DataType::Float64];
        let n = 60_000usize;
        let distinct: Vec<i64> = (0..n as i64).collect();
        let few: Vec<i64> = (0..n as i64).map(|i| i % 97).collect();
        let pairs: Vec<i64> = (0..n as i64).map(|i| i / 2).collect();
        // Units of 17 rows in 17 groups: just past what a sorted vector of groups holds.
        let seventeen: Vec<i64> = (0..n as i64).map(|i| i / 17).collect();
        let groups: Vec<i64> = (0..n as i64).map(|i| i % 41).collect();
        let xs: Vec<f64> = (0..n).map(|i| (n - i) as f64).collect();
        // Up to 3 groups a unit, within 5 %; up to 100 (an indexed heap of groups), within 7 %.
        for (l, within) in [(3, 1.05), (100, 1.07)] {
            let udf = UnitBound::new(l, 10, order(), 1, UnitArg::Value);
            let mut tightest = f64::INFINITY;
            for types in [&narrow[..], &wide[..]] {
                for units in [&distinct, &pairs, &few, &seventeen] {
                    let (per_row, fixed) = udf.most_bytes_per_row(types, 0).unwrap();
                    assert!(fixed);
                    let columns = types.len() - 2;
                    let mut acc = UnitBoundGroups::new(Bound::new(&udf, &types[0], &types[1..2], &types[2..]).unwrap());
                    let base = acc.size();
                    for from in (0..n).step_by(1000) {
                        let to = from + 1000;
                        let mut values =
                            vec![ints(units[from..to].iter().copied()), ints(groups[from..to].iter().copied())];
                        for _ in 0..columns {
                            values.push(Arc::new(Float64Array::from(xs[from..to].to_vec())));
                        }
                        let indices: Vec<usize> = units[from..to].iter().map(|&u| u as usize).collect();
                        let total = units[..to].iter().max().map_or(0, |&u| u as usize + 1);
                        acc.update_batch(&values, &indices, None, total).unwrap();
                        let grown = acc.size() - base;
                        let most = to * per_row;
                        assert!(grown <= most, "L = {l}, {types:?}: {grown} bytes after {to} rows, bound {most}");
                        tightest = tightest.min(most as f64 / grown as f64);
                    }
                }
            }
            assert!(tightest < within, "L = {l}: the bound is {tightest}× the most any input held");
            assert!(!udf.most_bytes_per_row(&[DataType::Int64, DataType::Int64, DataType::Utf8], 0).unwrap().1);
        }
    }
}
