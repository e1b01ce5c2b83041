//! Pass: private columns the Parquet reader could fail on, by the data (SPEC §0).
//!
//! A Parquet file written from a dictionary-encoded Arrow column (a pandas categorical, say)
//! carries that column's Arrow type, and DataFusion reads it back with the same dictionary
//! index type. With an 8- or 16-bit index the read fails as soon as a row group's dictionary
//! (or one batch's values) holds more distinct values than the reader lets the index number —
//! 127 for `Int8`, 255 for `UInt8`, 32 767 for `Int16`, 65 535 for `UInt16` (the dictionary's
//! length must fit the index type; `tests/groups_sql.rs` reads 127 and fails at 128) — so one
//! added row with one new value could turn a release into a failure after the debit. A 32- or
//! 64-bit index numbers every dictionary a Parquet page can hold (at most 2³¹ − 1 entries).
//!
//! So a query that reads such a column of a private table — in its projection, or as the
//! privacy unit the execution passes add — is refused here, before any row is read, naming the
//! column and how the data owner rewrites it. The decision depends on the table's schema only.
//!
//! | rule | what it forbids |
//! |---|---|
//! | `narrow-dictionary` | reading a private column whose dictionary index is 8 or 16 bits wide |

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::LogicalPlan;

use crate::guard::checking::Checking;
use crate::guard::walk::private_table_of;

/// The pass.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    let units = &cx.view.units;
    let mut refused = None;
    cx.plan.apply_with_subqueries(|node| {
        let LogicalPlan::TableScan(scan) = node else { return Ok(TreeNodeRecursion::Continue) };
        let Some(table) = private_table_of(scan) else { return Ok(TreeNodeRecursion::Continue) };
        let source = scan.source.schema();
        let unit = units.get(&table).map(|u| u.column.as_str());
        let read = scan
            .projected_schema
            .fields()
            .iter()
            .map(|f| f.as_ref())
            .chain(unit.and_then(|u| source.field_with_name(u).ok()));
        for field in read {
            if let Some(index) = narrow_index(field.data_type()) {
                refused = Some((table, field.name().clone(), field.data_type().clone(), index));
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match refused {
        None => Ok(()),
        Some((table, column, t, index)) => plan_err!(
            "[rule narrow-dictionary] column '{column}' of private table '{table}' is {t}: Parquet \
             reads it with a {index} index, which fails when a row group holds more distinct values \
             than the index numbers — so whether a query fails would depend on the data; the data \
             owner rewrites the file with 32-bit dictionary indices (pyarrow: \
             pa.dictionary(pa.int32(), pa.string())) or as plain values"
        ),
    }
}

/// The index type of a dictionary anywhere in `t` (lists, structs, maps) that is 8 or 16 bits
/// wide.
pub fn narrow_index(t: &DataType) -> Option<DataType> {
    match t {
        DataType::Dictionary(index, values) => {
            if matches!(index.as_ref(), DataType::Int8 | DataType::UInt8 | DataType::Int16 | DataType::UInt16) {
                Some(index.as_ref().clone())
            } else {
                narrow_index(values)
            }
        }
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => narrow_index(f.data_type()),
        DataType::Struct(fields) => fields.iter().find_map(|f| narrow_index(f.data_type())),
        DataType::Union(fields, _) => fields.iter().find_map(|(_, f)| narrow_index(f.data_type())),
        DataType::RunEndEncoded(_, values) => narrow_index(values.data_type()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{Field, Fields};

    use super::*;

    fn dict(index: DataType) -> DataType {
        DataType::Dictionary(Box::new(index), Box::new(DataType::Utf8))
    }

    #[test]
    fn eight_and_sixteen_bit_indices_are_narrow_wherever_they_sit() {
        for index in [DataType::Int8, DataType::UInt8, DataType::Int16, DataType::UInt16] {
            assert_eq!(narrow_index(&dict(index.clone())), Some(index.clone()));
            let listed = DataType::List(Arc::new(Field::new("item", dict(index.clone()), true)));
            assert_eq!(narrow_index(&listed), Some(index.clone()), "in a list");
            let nested = DataType::Struct(Fields::from(vec![Field::new("a", listed, true)]));
            assert_eq!(narrow_index(&nested), Some(index), "in a struct");
        }
        for wide in [DataType::Int32, DataType::UInt32, DataType::Int64, DataType::UInt64] {
            assert_eq!(narrow_index(&dict(wide)), None);
        }
        assert_eq!(narrow_index(&DataType::Utf8), None);
        assert_eq!(narrow_index(&DataType::Int8), None, "a plain 8-bit integer is no dictionary");
    }
}
