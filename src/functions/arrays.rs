//! The Arrow shapes private aggregates share: fixed-point statistics as `Decimal128(38, 0)` list
//! states, runs of valid rows of two data columns, one-row `List<Float64>` results.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, Float64Array, ListArray};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Field};
use datafusion::common::{Result, ScalarValue, internal_err};

/// Type of fixed-point statistics in accumulator state (i128 as Decimal128(38, 0)).
pub(crate) fn fixed_point_type() -> DataType {
    DataType::Decimal128(38, 0)
}

/// A fixed-point statistic as a one-row list state value.
pub(crate) fn fixed_point_state(values: &[i128]) -> Result<ScalarValue> {
    let list = fixed_point_lists(&[values], values.len(), |v, out| out.extend_from_slice(v))?;
    Ok(ScalarValue::List(Arc::new(list)))
}

/// Fixed-point statistics as a list state column, one row each, each appended by `append`
/// straight into the column's one buffer of `capacity` entries (what [`fixed_point_state`] gives
/// each, concatenated).
pub(crate) fn fixed_point_states<T>(
    statistics: &[T],
    capacity: usize,
    append: impl Fn(&T, &mut Vec<i128>),
) -> Result<ArrayRef> {
    Ok(Arc::new(fixed_point_lists(statistics, capacity, append)?))
}

fn fixed_point_lists<T>(statistics: &[T], capacity: usize, append: impl Fn(&T, &mut Vec<i128>)) -> Result<ListArray> {
    let (mut values, mut lengths) = (Vec::with_capacity(capacity), Vec::with_capacity(statistics.len()));
    for s in statistics {
        let before = values.len();
        append(s, &mut values);
        lengths.push(values.len() - before);
    }
    let values = Decimal128Array::from(values).with_data_type(fixed_point_type());
    let field = Arc::new(Field::new_list_field(fixed_point_type(), true));
    Ok(ListArray::try_new(field, OffsetBuffer::from_lengths(lengths), Arc::new(values), None)?)
}

/// Calls `f(row, values)` for every non-null row of a fixed-point list state column,
/// checking each has `len` entries.
pub(crate) fn for_each_fixed_point_row(
    function: &str,
    states: &ArrayRef,
    len: usize,
    mut f: impl FnMut(usize, &[i128]),
) -> Result<()> {
    let lists = states.as_list::<i32>();
    for row in 0..lists.len() {
        if lists.is_null(row) {
            continue;
        }
        let part = lists.value(row);
        let part = part.as_primitive::<Decimal128Type>();
        if part.len() != len {
            return internal_err!("{function}: partial statistic has {} entries, expected {len}", part.len());
        }
        f(row, part.values());
    }
    Ok(())
}

/// Calls `f(first, second)` on the runs of rows where both Float64 columns are non-null (the
/// two data arguments of a private aggregate; NULL in either drops the row).
pub(crate) fn for_each_valid_pair(values: &[ArrayRef], mut f: impl FnMut(&[f64], &[f64])) {
    use datafusion::arrow::datatypes::Float64Type;
    let (a, b) = (values[0].as_primitive::<Float64Type>(), values[1].as_primitive::<Float64Type>());
    let (x, y) = (a.values(), b.values());
    match NullBuffer::union(a.nulls(), b.nulls()).filter(|n| n.null_count() > 0) {
        None => f(x, y),
        Some(nulls) => {
            for (start, end) in nulls.valid_slices() {
                f(&x[start..end], &y[start..end]);
            }
        }
    }
}

/// A one-row `List<Float64>` array (a NULL list for `None`).
pub(crate) fn float_list(values: Option<Vec<f64>>) -> ArrayRef {
    let field = Arc::new(Field::new_list_field(DataType::Float64, true));
    let (len, nulls) = match &values {
        Some(v) => (v.len(), None),
        None => (0, Some(NullBuffer::new_null(1))),
    };
    let items = Float64Array::from(values.unwrap_or_default());
    Arc::new(ListArray::new(field, OffsetBuffer::from_lengths([len]), Arc::new(items), nulls))
}
