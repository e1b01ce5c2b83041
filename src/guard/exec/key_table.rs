//! How the partial phase over known keys ([`super::known_keys_partial`]) finds each row's group:
//! a table built from the public keys before any row is read, whose size never depends on the
//! rows (SPEC §0).
//!
//! - [`KeyTable`]: every group known up front (declared keys, or the selected values of one
//!   integer column). One integer column is looked up by value (a dense table over a run of
//!   keys, else a map), one text column by its values' bytes (no row encoding of every row's
//!   string); any other key (several columns, dates…) by its Arrow row encoding in a map of the
//!   keys' encodings. A row whose key is not one of them goes to a spare group.
//! - [`FirstSeen`]: the keys a partition selection chose by hash, whose values the partition
//!   learns from its rows. Its map and key slots are allocated for every selected group when the
//!   partition starts (the number selected is known then), so a group's first row never grows,
//!   rehashes or copies anything: it costs one insert, as a row does. Every group held is emitted,
//!   reached or not (a group no row reached with its type's default key and an empty state), so
//!   what a partition emits is the number selected whatever its rows.
//!
//! DataFusion's hash aggregate instead interns groups as rows reach them, in a table that
//! doubles: one more row reaching one more group could rehash every group the partition holds.

use std::collections::HashMap;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::{CastOptions, cast_with_options, concat};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::{Result, ScalarValue, internal_err};

use crate::guard::ops::sample_order::decoded_as;

/// Keys spanning at most this many values get a dense table (4 bytes per value in the span).
const DENSE_SPAN: i64 = 1 << 16;

type Hasher = foldhash::fast::RandomState;

/// Each known key's group (module docs).
#[derive(Debug)]
pub(super) enum KeyTable {
    /// One integer column: the group of key `min + i` at `i`; `spare` where no key is.
    Dense { min: i64, groups: Vec<u32> },
    /// One integer column, keys spread out.
    Sparse(HashMap<i64, u32, Hasher>),
    /// One text column (`Utf8`, `LargeUtf8`, `Utf8View`), by its values' bytes: the same groups
    /// as their row encoding gives, without encoding every row's string; `null` is the group of
    /// a declared NULL key (in the row encoding a NULL is a key like any other).
    Text { groups: HashMap<Box<[u8]>, u32, Hasher>, null: Option<u32> },
    /// Any key columns, by their row encoding.
    Rows { converter: RowConverter, groups: HashMap<Box<[u8]>, u32, Hasher> },
}

/// Each value of a text column (`Utf8`, `LargeUtf8`, `Utf8View`) as bytes, NULL as None, passed
/// to `each` in row order; false (nothing passed) for a column of another type.
fn each_text(column: &dyn Array, mut each: impl FnMut(Option<&[u8]>)) -> bool {
    match column.data_type() {
        DataType::Utf8 => column.as_string::<i32>().iter().for_each(|v| each(v.map(str::as_bytes))),
        DataType::LargeUtf8 => column.as_string::<i64>().iter().for_each(|v| each(v.map(str::as_bytes))),
        DataType::Utf8View => column.as_string_view().iter().for_each(|v| each(v.map(str::as_bytes))),
        _ => return false,
    }
    true
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

impl KeyTable {
    /// The table of integer `keys` (group `i` for `keys[i]`).
    pub(super) fn integers(keys: &[i64], spare: u32) -> Self {
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

    /// The table of the key tuples in `columns` (group `i` for row `i`), compared in the row
    /// encoding of `types` (the key columns' types as the rows carry them). A repeated tuple
    /// keeps its first group.
    pub(super) fn rows(columns: &[ArrayRef], types: &[DataType]) -> Result<Self> {
        if let ([column], [t]) = (columns, types)
            && is_text(t)
        {
            let mut groups = HashMap::with_capacity_and_hasher(column.len(), Hasher::default());
            let (mut null, mut g) = (None, 0u32);
            let text = each_text(column.as_ref(), |v| {
                match v {
                    Some(bytes) => {
                        groups.entry(Box::from(bytes)).or_insert(g);
                    }
                    None => {
                        null.get_or_insert(g);
                    }
                }
                g += 1;
            });
            if text {
                return Ok(KeyTable::Text { groups, null });
            }
        }
        Self::encoded(columns, types)
    }

    /// [`Self::rows`] by the row encoding whatever the key columns.
    fn encoded(columns: &[ArrayRef], types: &[DataType]) -> Result<Self> {
        let converter = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?;
        let rows = converter.convert_columns(columns)?;
        let mut groups = HashMap::with_capacity_and_hasher(rows.num_rows(), Hasher::default());
        for (g, row) in rows.iter().enumerate() {
            groups.entry(Box::from(row.as_ref())).or_insert(g as u32);
        }
        Ok(KeyTable::Rows { converter, groups })
    }

    /// A short name of the table's kind (plans).
    pub(super) fn kind(&self) -> &'static str {
        match self {
            KeyTable::Dense { .. } => "dense",
            KeyTable::Sparse(_) => "sparse",
            KeyTable::Text { .. } => "text",
            KeyTable::Rows { .. } => "rows",
        }
    }

    /// Each row's group into `out`: `spare` for a key not in the table, `null` for a NULL key
    /// of one integer column (in the row encoding a NULL is a key like any other).
    pub(super) fn groups_of(&self, keys: &[ArrayRef], spare: u32, null: u32, out: &mut Vec<usize>) -> Result<()> {
        out.clear();
        let integer = match self {
            KeyTable::Rows { converter, groups } => {
                let rows = converter.convert_columns(keys)?;
                out.extend(rows.iter().map(|r| groups.get(r.as_ref()).copied().unwrap_or(spare) as usize));
                return Ok(());
            }
            KeyTable::Text { groups, null } => {
                out.reserve(keys.first().map_or(0, |k| k.len()));
                let found = match keys {
                    [key] => each_text(key.as_ref(), |v| {
                        let g = match v {
                            Some(bytes) => groups.get(bytes).copied(),
                            None => *null,
                        };
                        out.push(g.unwrap_or(spare) as usize);
                    }),
                    _ => false,
                };
                if !found {
                    return internal_err!(
                        "a text key table looked up {} columns or a column of another type",
                        keys.len()
                    );
                }
                return Ok(());
            }
            _ => match keys {
                [key] => key,
                _ => return internal_err!("an integer key table looked up {} columns", keys.len()),
            },
        };
        let options = CastOptions { safe: true, ..Default::default() };
        // A key outside Int64 becomes null (only declared keys are looked up in UInt64 columns, and
        // they have no NULL key: so it goes to the spare group).
        let keys = cast_with_options(integer, &DataType::Int64, &options)?;
        let keys = keys.as_primitive::<Int64Type>();
        match self {
            KeyTable::Dense { min, groups } => out.extend(keys.values().iter().map(|&k| {
                let offset = k.wrapping_sub(*min) as u64;
                (if offset < groups.len() as u64 { groups[offset as usize] } else { spare }) as usize
            })),
            KeyTable::Sparse(map) => {
                out.extend(keys.values().iter().map(|k| map.get(k).copied().unwrap_or(spare) as usize))
            }
            KeyTable::Rows { .. } | KeyTable::Text { .. } => unreachable!("handled above"),
        }
        if let Some(nulls) = keys.nulls().filter(|n| n.null_count() > 0) {
            for i in nulls.iter().enumerate().filter(|(_, valid)| !valid).map(|(i, _)| i) {
                out[i] = null as usize;
            }
        }
        Ok(())
    }
}

/// The groups of a partition over keys known only by number (module docs): group `i` is the
/// `i`-th distinct key its rows brought, with room for `expected` keys from the start.
#[derive(Debug)]
pub(super) struct FirstSeen {
    converter: RowConverter,
    groups: HashMap<Box<[u8]>, u32, Hasher>,
    keys: Vec<OwnedRow>,
    expected: usize,
    /// The key of the groups no row reached: each type's default value (never NULL: a key column
    /// may be declared non-nullable).
    filler: Vec<ScalarValue>,
}

impl FirstSeen {
    /// Whether keys of `types` can be held (each has a default value: [`Self::filler`]).
    pub(super) fn holds(types: &[DataType]) -> bool {
        types.iter().all(|t| ScalarValue::new_default(t).is_ok_and(|v| !v.is_null()))
    }

    /// Room for `expected` groups of keys of `types` (which it [`Self::holds`]).
    pub(super) fn new(types: &[DataType], expected: usize) -> Result<Self> {
        Ok(Self {
            filler: types.iter().map(ScalarValue::new_default).collect::<Result<_>>()?,
            converter: RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?,
            groups: HashMap::with_capacity_and_hasher(expected, Hasher::default()),
            keys: Vec::with_capacity(expected),
            expected,
        })
    }

    /// Each row's group into `out` (a key not seen before becomes the next group).
    pub(super) fn groups_of(&mut self, keys: &[ArrayRef], out: &mut Vec<usize>) -> Result<()> {
        out.clear();
        let rows = self.converter.convert_columns(keys)?;
        for row in rows.iter() {
            let g = match self.groups.get(row.as_ref()) {
                Some(&g) => g,
                None => {
                    let g = self.keys.len() as u32;
                    self.groups.insert(Box::from(row.as_ref()), g);
                    self.keys.push(row.owned());
                    g
                }
            };
            out.push(g as usize);
        }
        Ok(())
    }

    /// Groups the accumulators hold: every expected one from the start (more only if more
    /// distinct keys came than were selected, which two keys whose 128-bit hashes collide are
    /// the only way to see).
    pub(super) fn total(&self) -> usize {
        self.expected.max(self.keys.len())
    }

    /// Groups that have rows (the first `seen()` groups; tests).
    #[cfg(test)]
    fn seen(&self) -> usize {
        self.keys.len()
    }

    /// The key columns of every group held ([`Self::total`]), in group order: the keys rows
    /// brought, then [`Self::filler`] keys for the groups no row reached (their states are empty;
    /// the final phase merges a key that was not selected into a spare group it never releases, and
    /// an empty state merges as nothing).
    pub(super) fn columns(&self) -> Result<Vec<ArrayRef>> {
        let seen = self.converter.convert_rows(self.keys.iter().map(|k| k.row()))?;
        let seen = decoded_as(seen, self.filler.iter().map(ScalarValue::data_type))?;
        let fill = self.total() - self.keys.len();
        seen.into_iter()
            .zip(&self.filler)
            .map(|(c, f)| Ok(concat(&[c.as_ref(), f.to_array_of_size(fill)?.as_ref()])?))
            .collect()
    }

    /// The capacities of the map and of the key slots (tests).
    #[cfg(test)]
    fn capacity(&self) -> (usize, usize) {
        (self.groups.capacity(), self.keys.capacity())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int32Array, Int64Array, StringArray, UInt64Array};
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    fn groups(table: &KeyTable, keys: ArrayRef, spare: u32) -> Vec<usize> {
        let mut out = vec![99; 3];
        table.groups_of(&[keys], spare, spare, &mut out).unwrap();
        out
    }

    #[test]
    fn each_declared_key_finds_its_group_and_every_other_value_the_spare() {
        // Declared order is group order; a run of keys is dense, spread keys are sparse.
        let dense = KeyTable::integers(&[5, 3, 4, -2], 4);
        assert_eq!(dense.kind(), "dense");
        let sparse = KeyTable::integers(&[5, 3, 1 << 40, i64::MIN], 4);
        assert_eq!(sparse.kind(), "sparse");
        let keys: ArrayRef = Arc::new(Int32Array::from(vec![
            Some(3),
            Some(5),
            None,
            Some(-2),
            Some(0),
            Some(6),
            Some(i32::MIN),
            Some(i32::MAX),
            Some(4),
        ]));
        assert_eq!(groups(&dense, Arc::clone(&keys), 4), [1, 0, 4, 3, 4, 4, 4, 4, 2]);
        assert_eq!(groups(&sparse, keys, 4), [1, 0, 4, 4, 4, 4, 4, 4, 4]);
        // Unsigned values beyond i64 are no declared key (never an error).
        let big: ArrayRef = Arc::new(UInt64Array::from(vec![u64::MAX, 5, (1 << 63) + 3]));
        assert_eq!(groups(&dense, Arc::clone(&big), 4), [4, 0, 4]);
        assert_eq!(groups(&sparse, big, 4), [4, 0, 4]);
        let far: ArrayRef = Arc::new(Int64Array::from(vec![1 << 40, i64::MIN, i64::MAX]));
        assert_eq!(groups(&sparse, Arc::clone(&far), 4), [2, 3, 4]);
        assert_eq!(groups(&dense, far, 4), [4, 4, 4], "wrapping offsets stay outside the table");
    }

    #[test]
    fn tuples_of_any_columns_find_their_group_and_every_other_tuple_the_spare() {
        let region: ArrayRef = Arc::new(StringArray::from(vec!["n", "s", "n", "s"]));
        let day: ArrayRef = Arc::new(Int32Array::from(vec![1, 1, 2, 2]));
        let types = [DataType::Utf8, DataType::Int32];
        let table = KeyTable::rows(&[region, day], &types).unwrap();
        assert_eq!(table.kind(), "rows");
        let rows: [ArrayRef; 2] = [
            Arc::new(StringArray::from(vec![Some("s"), Some("n"), Some("n"), None, Some("e"), Some("s"), Some("n")])),
            Arc::new(Int32Array::from(vec![Some(2), Some(1), None, Some(1), Some(1), Some(1), Some(3)])),
        ];
        let mut out = Vec::new();
        table.groups_of(&rows, 4, 9, &mut out).unwrap();
        assert_eq!(out, [3, 0, 4, 4, 4, 1, 4], "a NULL in any column is no declared tuple");
        // A one-column text key.
        let one =
            KeyTable::rows(&[Arc::new(StringArray::from(vec!["b", "a"])) as ArrayRef], &[DataType::Utf8]).unwrap();
        one.groups_of(&[Arc::new(StringArray::from(vec!["a", "c", "b"])) as ArrayRef], 2, 2, &mut out).unwrap();
        assert_eq!(out, [1, 2, 0]);
    }

    /// One text column is looked up by its bytes: every row finds the group the row encoding
    /// finds (the definition), in each string type, with a declared NULL, a repeated key, the
    /// empty string, strings longer than a view's inline twelve bytes, and undeclared values.
    /// Control: without the declared NULL a NULL row goes to the spare group.
    #[test]
    fn one_text_column_finds_the_groups_its_row_encoding_finds() {
        use datafusion::arrow::array::{LargeStringArray, StringViewArray};
        let long = "a key longer than twelve bytes";
        let declared = vec![Some("b"), None, Some(""), Some(long), Some("b"), Some("a")];
        let rows = vec![
            Some("a"),
            None,
            Some(""),
            Some("c"),
            Some(long),
            Some("a key longer than twelve bytez"),
            Some("b"),
            Some("a key"),
        ];
        let as_type = |v: &[Option<&str>], t: &DataType| -> ArrayRef {
            match t {
                DataType::Utf8 => Arc::new(StringArray::from(v.to_vec())),
                DataType::LargeUtf8 => Arc::new(LargeStringArray::from(v.to_vec())),
                _ => Arc::new(StringViewArray::from(v.to_vec())),
            }
        };
        for t in [DataType::Utf8, DataType::LargeUtf8, DataType::Utf8View] {
            let keys = as_type(&declared, &t);
            let (text, encoded) = (
                KeyTable::rows(&[Arc::clone(&keys)], std::slice::from_ref(&t)).unwrap(),
                KeyTable::encoded(&[keys], std::slice::from_ref(&t)).unwrap(),
            );
            assert_eq!((text.kind(), encoded.kind()), ("text", "rows"));
            let (mut got, mut want) = (Vec::new(), Vec::new());
            text.groups_of(&[as_type(&rows, &t)], 6, 9, &mut got).unwrap();
            encoded.groups_of(&[as_type(&rows, &t)], 6, 9, &mut want).unwrap();
            assert_eq!(got, want, "{t}");
            assert_eq!(got, [5, 1, 2, 6, 3, 6, 0, 6], "{t}");
            // Control: no declared NULL.
            let some = KeyTable::rows(&[as_type(&declared[..1], &t)], std::slice::from_ref(&t)).unwrap();
            some.groups_of(&[as_type(&rows, &t)], 6, 9, &mut got).unwrap();
            assert_eq!(got, [6, 6, 6, 6, 6, 6, 0, 6], "{t}");
        }
    }

    /// The attack on a table that grows with its groups: rows bringing one new key after another
    /// (up to all that were selected) must never grow the map or the key slots — a step in work
    /// at a count of groups (a rehash of all of them) would tell that count by timing. Control:
    /// the same keys in a map sized as DataFusion's group table is (from empty) grow many times.
    #[test]
    fn a_groups_first_row_never_grows_the_table() {
        let expected = 5_000;
        let mut seen = FirstSeen::new(&[DataType::Utf8, DataType::Int64], expected).unwrap();
        let at_start = seen.capacity();
        let mut control: HashMap<Box<[u8]>, u32, Hasher> = HashMap::default();
        let mut control_growths = 0;
        let mut out = Vec::new();
        for batch in 0..expected / 100 {
            let names: Vec<String> = (0..100).map(|i| format!("key-{}", batch * 100 + i)).collect();
            let keys: [ArrayRef; 2] =
                [Arc::new(StringArray::from(names)), Arc::new(Int64Array::from_iter_values(0..100))];
            seen.groups_of(&keys, &mut out).unwrap();
            assert_eq!(out, (batch * 100..batch * 100 + 100).collect::<Vec<_>>());
            assert_eq!(seen.capacity(), at_start, "grown after {} groups", seen.seen());
            assert_eq!(seen.total(), expected);
            for row in seen.converter.convert_columns(&keys).unwrap().iter() {
                let before = control.capacity();
                let next = control.len() as u32;
                control.insert(Box::from(row.as_ref()), next);
                control_growths += usize::from(control.capacity() != before);
            }
        }
        assert!(control_growths >= 8, "the control grows: {control_growths}");
        // A key seen again keeps its group; the key columns come back in group order.
        let again: [ArrayRef; 2] =
            [Arc::new(StringArray::from(vec!["key-7", "key-0"])), Arc::new(Int64Array::from(vec![7, 0]))];
        seen.groups_of(&again, &mut out).unwrap();
        assert_eq!(out, [7, 0]);
        let columns = seen.columns().unwrap();
        assert_eq!(columns[0].len(), expected);
        assert_eq!(columns[0].as_string::<i32>().value(4_321), "key-4321");
        assert_eq!(columns[1].as_primitive::<Int64Type>().value(4_321), 21);
        // Groups no row reached are emitted too, with NULL keys.
        let mut few = FirstSeen::new(&[DataType::Utf8, DataType::Int32], 5).unwrap();
        let empty = few.columns().unwrap();
        assert_eq!(empty[0].len(), 5, "a partition without rows emits every group");
        assert_eq!((empty[0].as_string::<i32>().value(4), empty[1].as_primitive::<Int32Type>().value(4)), ("", 0));
        let keys: [ArrayRef; 2] =
            [Arc::new(StringArray::from(vec!["b", "a", "b"])), Arc::new(Int32Array::from(vec![1, 2, 1]))];
        few.groups_of(&keys, &mut out).unwrap();
        assert_eq!(out, [0, 1, 0]);
        let columns = few.columns().unwrap();
        assert_eq!((columns[0].len(), columns[0].null_count(), few.seen(), few.total()), (5, 0, 2, 5));
        let texts: Vec<&str> = (0..5).map(|i| columns[0].as_string::<i32>().value(i)).collect();
        assert_eq!(texts, ["b", "a", "", "", ""]);
        assert!(FirstSeen::holds(&[DataType::Utf8, DataType::Int64, DataType::Date32]));
    }
}
