//! `dpcurve_unit_bound`: the streaming per-unit contribution bound (SPEC §0, §7).
//!
//! An aggregate grouped by the unit's keyed hash, called as
//! `dpcurve_unit_bound(group_order, row_order, c0, c1, …)`. For its unit it keeps at most `L`
//! groups — those with the smallest `group_order` — and in each of them at most `K` rows — those
//! with the smallest `row_order` — and returns them as a list of structs `{c0, c1, …}` (the
//! guard unnests it back into rows). Both orders are keyed 128-bit hashes
//! ([`super::units::SampleOrder`]), so the kept rows are a uniformly random sample of the unit's
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

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, FixedSizeBinaryBuilder, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::utils::SingleRowListArrayBuilder;
use datafusion::common::{DataFusionError, Result, ScalarValue, internal_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{Accumulator, AggregateUDFImpl, Signature, Volatility};

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
        let types = args.exprs.iter().skip(2).map(|e| e.data_type(args.schema)).collect::<Result<Vec<DataType>>>()?;
        if types.is_empty() {
            return internal_err!("{NAME} takes two orders and at least one column");
        }
        let converter = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?;
        Ok(Box::new(UnitBoundAccumulator {
            groups: self.groups as usize,
            rows: self.rows as usize,
            converter,
            fields: row_fields(&types),
            kept: BTreeMap::new(),
            bytes: 0,
        }))
    }
}

/// One unit's kept groups (by group order) and rows (by row order, in row encoding).
struct UnitBoundAccumulator {
    groups: usize,
    rows: usize,
    converter: RowConverter,
    fields: Fields,
    kept: BTreeMap<Key, Vec<(Key, OwnedRow)>>,
    /// Bytes of the kept rows.
    bytes: usize,
}

impl fmt::Debug for UnitBoundAccumulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitBoundAccumulator {{ groups: {}, rows: {} }}", self.groups, self.rows)
    }
}

fn key(bytes: &[u8]) -> Result<Key> {
    bytes.try_into().map_err(|_| DataFusionError::Internal(format!("{NAME}: an order is not 16 bytes")))
}

impl UnitBoundAccumulator {
    /// Offers one row (made only if it is kept).
    fn offer(&mut self, group: Key, order: Key, row: impl FnOnce(&RowConverter) -> Result<OwnedRow>) -> Result<()> {
        if !self.kept.contains_key(&group) {
            if self.kept.len() >= self.groups && self.kept.last_key_value().is_some_and(|(last, _)| group >= *last) {
                return Ok(());
            }
            self.kept.insert(group, Vec::with_capacity(1));
            if self.kept.len() > self.groups {
                if let Some((_, dropped)) = self.kept.pop_last() {
                    self.bytes -= dropped.iter().map(|(_, r)| r.as_ref().len()).sum::<usize>();
                }
            }
        }
        let rows = self.kept.get_mut(&group).expect("inserted above");
        if rows.len() >= self.rows && rows.last().is_some_and(|(last, _)| order >= *last) {
            return Ok(());
        }
        let at = rows.partition_point(|(o, _)| *o <= order);
        let row = row(&self.converter)?;
        self.bytes += row.as_ref().len();
        rows.insert(at, (order, row));
        if rows.len() > self.rows {
            if let Some((_, dropped)) = rows.pop() {
                self.bytes -= dropped.as_ref().len();
            }
        }
        Ok(())
    }

    fn kept_rows(&self) -> impl Iterator<Item = (&Key, &Key, &OwnedRow)> {
        self.kept.iter().flat_map(|(g, rows)| rows.iter().map(move |(o, r)| (g, o, r)))
    }
}

impl Accumulator for UnitBoundAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let (groups, orders) = (values[0].as_fixed_size_binary(), values[1].as_fixed_size_binary());
        let columns = &values[2..];
        for i in 0..groups.len() {
            let (g, o) = (key(groups.value(i))?, key(orders.value(i))?);
            // Only rows that are kept (at the moment) are encoded: a unit of n rows in random
            // order replaces its sample O(K·L·log n) times.
            let row = |converter: &RowConverter| {
                let one: Vec<ArrayRef> = columns.iter().map(|c| c.slice(i, 1)).collect();
                Ok(converter.convert_columns(&one)?.row(0).owned())
            };
            self.offer(g, o, row)?;
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let lists = states[0].as_list::<i32>();
        let parser = self.converter.parser();
        for l in 0..lists.len() {
            if lists.is_null(l) {
                continue;
            }
            let entries = lists.value(l);
            let entries = entries.as_struct();
            let (g, o, r) =
                (entries.column(0).as_fixed_size_binary(), entries.column(1).as_fixed_size_binary(), entries.column(2));
            let r = r.as_binary::<i32>();
            for i in 0..entries.len() {
                self.offer(key(g.value(i))?, key(o.value(i))?, |_| Ok(parser.parse(r.value(i)).owned()))?;
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let mut g = FixedSizeBinaryBuilder::new(16);
        let mut o = FixedSizeBinaryBuilder::new(16);
        let mut r = BinaryBuilder::new();
        for (group, order, row) in self.kept_rows() {
            g.append_value(group)?;
            o.append_value(order)?;
            r.append_value(row.as_ref());
        }
        let columns: Vec<ArrayRef> = vec![Arc::new(g.finish()), Arc::new(o.finish()), Arc::new(r.finish())];
        let entries = StructArray::try_new(state_entry_fields(), columns, None)?;
        Ok(vec![SingleRowListArrayBuilder::new(Arc::new(entries)).build_list_scalar()])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let parser = self.converter.parser();
        let columns = self.converter.convert_rows(self.kept_rows().map(|(_, _, r)| parser.parse(r.as_ref())))?;
        let kept = StructArray::try_new(self.fields.clone(), columns, None)?;
        Ok(ScalarValue::List(Arc::new(SingleRowListArrayBuilder::new(Arc::new(kept)).build_list_array())))
    }

    fn size(&self) -> usize {
        let entries: usize = self.kept.values().map(|v| v.capacity() * size_of::<(Key, OwnedRow)>()).sum();
        size_of_val(self) + self.converter.size() + self.bytes + entries + self.kept.len() * size_of::<(Key, Vec<()>)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{FixedSizeBinaryArray, Float64Array};

    fn keys(v: &[u8]) -> ArrayRef {
        Arc::new(FixedSizeBinaryArray::try_from_iter(v.iter().map(|b| [*b; 16])).unwrap())
    }

    fn accumulator(groups: usize, rows: usize) -> UnitBoundAccumulator {
        let types = vec![DataType::Float64];
        UnitBoundAccumulator {
            groups,
            rows,
            converter: RowConverter::new(vec![SortField::new(DataType::Float64)]).unwrap(),
            fields: row_fields(&types),
            kept: BTreeMap::new(),
            bytes: 0,
        }
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
