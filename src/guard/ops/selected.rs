//! `dpcurve_selected(g, …)`: the membership filter of a partition selection (SPEC §7). It holds
//! the key hashes the gate selected in this execution (none before the gate ran: a plan run
//! below the gate selects nothing) and keeps the rows of those groups only.

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility};

use super::sample_order::{SampleOrder, canonical_rows};

/// The name of a partition selection's count of each candidate group's units (its first pass).
pub const COUNT_COLUMN: &str = "__dpcurve_units";

/// The selected keys of one execution, shared by the gate (which fills it) and the membership
/// filter (which reads it). Empty until the gate has run the selection: a plan run below the
/// gate selects nothing.
#[derive(Debug, Default)]
pub struct SelectedKeys {
    keys: Mutex<Option<Selected>>,
}

/// What the gate selected: the key hashes, and — when the first pass counted keys by value —
/// the keys' canonical row encodings, so the filter tests a row's key without hashing it; and
/// for one integer key column, the keys themselves and whether the NULL key is among them, so
/// it tests the column's values without encoding them.
#[derive(Debug)]
struct Selected {
    hashes: KeySet,
    values: Option<HashSet<Box<[u8]>, foldhash::fast::RandomState>>,
    integers: Option<(HashSet<i64, foldhash::fast::RandomState>, bool)>,
}

/// The selected keys of one integer key column: the values, sorted, and whether the NULL key
/// was selected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntegerSelection {
    pub keys: Vec<i64>,
    pub null: bool,
}

/// An integer key column as i64 values (exact for every type here), or None for other types.
pub(crate) fn integer_keys(column: &ArrayRef) -> Option<Int64Array> {
    use DataType::*;
    matches!(column.data_type(), Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32)
        .then(|| cast(column, &Int64).ok().map(|a| a.as_primitive::<Int64Type>().clone()))
        .flatten()
}

/// Selected key hashes. They are keyed 128-bit hashes under a secret per-query key, so their
/// bits are already uniform: the set's hasher folds them instead of hashing them again.
type KeySet = HashSet<u128, BuildHasherDefault<Fold>>;

/// A hasher for keys that are already uniformly random 128-bit hashes.
#[derive(Default)]
struct Fold(u64);

impl Hasher for Fold {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = (v as u64) ^ ((v >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A 16-byte key hash as its number (big-endian, as [`SampleOrder::keys`] writes it).
fn key_number(bytes: &[u8]) -> Result<u128> {
    let bytes: [u8; 16] =
        bytes.try_into().map_err(|_| DataFusionError::Internal("a selected key hash is not 16 bytes".into()))?;
    Ok(u128::from_be_bytes(bytes))
}

impl SelectedKeys {
    fn lock(&self) -> Result<MutexGuard<'_, Option<Selected>>> {
        self.keys.lock().map_err(|_| DataFusionError::Execution("selection lock poisoned".into()))
    }

    /// Hands the selected key hashes (16 bytes each) to the filter.
    pub fn set(&self, keys: impl IntoIterator<Item = Vec<u8>>) -> Result<()> {
        let hashes = keys.into_iter().map(|k| key_number(&k)).collect::<Result<KeySet>>()?;
        *self.lock()? = Some(Selected { hashes, values: None, integers: None });
        Ok(())
    }

    /// Hands the selected key hashes and the same keys' canonical row encodings to the filter,
    /// and their values when they are one integer column ([`integer_keys`]).
    pub fn set_with_values(
        &self,
        keys: Vec<Vec<u8>>,
        values: Vec<Vec<u8>>,
        integers: Option<IntegerSelection>,
    ) -> Result<()> {
        let hashes = keys.iter().map(|k| key_number(k)).collect::<Result<KeySet>>()?;
        let values = Some(values.into_iter().map(Vec::into_boxed_slice).collect());
        let integers = integers.map(|s| (s.keys.into_iter().collect(), s.null));
        *self.lock()? = Some(Selected { hashes, values, integers });
        Ok(())
    }

    /// Hands one integer key column's selected values alone (the copy a cluster's executor gets
    /// of a selection the partial phase looks up by value; it tests no row's hash).
    pub fn set_integers(&self, selection: IntegerSelection) -> Result<()> {
        let integers = Some((selection.keys.into_iter().collect(), selection.null));
        *self.lock()? = Some(Selected { hashes: KeySet::default(), values: None, integers });
        Ok(())
    }

    /// The selection of one integer key column counted by value: nothing before the gate ran
    /// the selection (a plan run below the gate selects nothing) or when nothing was selected;
    /// None when the keys were counted by hash.
    pub fn integer_selection(&self) -> Result<Option<IntegerSelection>> {
        Ok(match self.lock()?.as_ref() {
            None => Some(IntegerSelection::default()),
            Some(Selected { integers: Some((keys, null)), .. }) => {
                let mut keys: Vec<i64> = keys.iter().copied().collect();
                keys.sort_unstable();
                Some(IntegerSelection { keys, null: *null })
            }
            Some(Selected { hashes, .. }) if hashes.is_empty() => Some(IntegerSelection::default()),
            Some(_) => None,
        })
    }
}

/// `dpcurve_selected(g, …)`: whether the row's group was selected in this execution.
pub struct SelectedFilter {
    signature: Signature,
    keys: Arc<SelectedKeys>,
    /// The key of the keyed hash the first pass grouped by.
    hash_key: (u64, u64),
}

impl SelectedFilter {
    pub fn new(keys: Arc<SelectedKeys>, hash_key: (u64, u64)) -> Self {
        Self { signature: Signature::variadic_any(Volatility::Volatile), keys, hash_key }
    }

    /// The keys this filter tests against.
    pub(crate) fn keys(&self) -> &Arc<SelectedKeys> {
        &self.keys
    }

    #[cfg(feature = "cluster")]
    /// The key of the group hash (shipped with the filter).
    pub(crate) fn hash_key(&self) -> (u64, u64) {
        self.hash_key
    }

    #[cfg(feature = "cluster")]
    /// The keys selected so far (None: the selection has not run), to ship the filter to a
    /// cluster's executors after the client's gate selected them.
    pub(crate) fn selected(&self) -> Result<Option<Vec<Vec<u8>>>> {
        let guard = self.keys.lock()?;
        Ok(guard.as_ref().map(|set| {
            let mut keys: Vec<Vec<u8>> = set.hashes.iter().map(|k| k.to_be_bytes().to_vec()).collect();
            keys.sort();
            keys
        }))
    }

    #[cfg(feature = "cluster")]
    /// A filter holding `selected` (the copy decoded on an executor).
    pub(crate) fn holding(selected: Option<Vec<Vec<u8>>>, hash_key: (u64, u64)) -> Result<Self> {
        let keys = SelectedKeys::default();
        if let Some(k) = selected {
            keys.set(k)?;
        }
        Ok(Self::new(Arc::new(keys), hash_key))
    }
}

impl fmt::Debug for SelectedFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SelectedFilter")
    }
}

impl PartialEq for SelectedFilter {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.keys, &other.keys)
    }
}

impl Eq for SelectedFilter {}

impl Hash for SelectedFilter {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.keys) as usize).hash(state)
    }
}

impl ScalarUDFImpl for SelectedFilter {
    fn name(&self) -> &str {
        "dpcurve_selected"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let columns = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<_>>>()?;
        let guard = self.keys.lock()?;
        // Each row's membership, packed straight into bits (no array of options in between).
        let bits = match guard.as_ref() {
            None => BooleanBuffer::new_unset(n),
            Some(Selected { integers: Some((integers, null)), .. })
                if let [column] = &columns[..]
                    && let Some(keys) = integer_keys(column) =>
            {
                let values = keys.values();
                match keys.null_count() {
                    0 => BooleanBuffer::collect_bool(n, |i| integers.contains(&values[i])),
                    _ => BooleanBuffer::collect_bool(n, |i| match keys.is_valid(i) {
                        true => integers.contains(&values[i]),
                        false => *null,
                    }),
                }
            }
            Some(Selected { values: Some(values), .. }) => {
                let rows = canonical_rows(&columns)?;
                BooleanBuffer::collect_bool(n, |i| values.contains(rows.row(i).as_ref()))
            }
            Some(Selected { hashes, values: None, .. }) => {
                let rows = SampleOrder::with_key(self.hash_key).hashes(&columns)?;
                BooleanBuffer::collect_bool(n, |i| hashes.contains(&rows[i]))
            }
        };
        let out = BooleanArray::new(bits, None);
        debug_assert_eq!(out.len(), n);
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::Field;
    use datafusion::config::ConfigOptions;

    use super::*;

    fn members(filter: &SelectedFilter, column: ArrayRef) -> Vec<bool> {
        let n = column.len();
        let args = ScalarFunctionArgs {
            arg_fields: vec![Arc::new(Field::new("k", column.data_type().clone(), true))],
            args: vec![ColumnarValue::Array(column)],
            number_rows: n,
            return_field: Arc::new(Field::new("m", DataType::Boolean, false)),
            config_options: Arc::new(ConfigOptions::default()),
        };
        let out = filter.invoke_with_args(args).unwrap().to_array(n).unwrap();
        out.as_boolean().iter().map(|b| b.unwrap()).collect()
    }

    #[test]
    fn integer_keys_are_tested_by_value_and_a_selected_null_key_keeps_its_rows() {
        let hash = |i: u8| vec![i; 16];
        let column: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), Some(2), None, Some(3)]));
        for null in [false, true] {
            let keys = Arc::new(SelectedKeys::default());
            assert_eq!(keys.integer_selection().unwrap(), Some(IntegerSelection::default()), "nothing before the gate");
            let filter = SelectedFilter::new(Arc::clone(&keys), (1, 2));
            assert_eq!(members(&filter, Arc::clone(&column)), [false; 4], "a plan below the gate selects nothing");
            let selection = IntegerSelection { keys: vec![3, 1], null };
            let values = vec![vec![0u8; 9]; 2 + usize::from(null)];
            let hashes = (0..values.len() as u8).map(hash).collect();
            keys.set_with_values(hashes, values, Some(selection)).unwrap();
            assert_eq!(members(&filter, Arc::clone(&column)), [true, false, null, true]);
            assert_eq!(keys.integer_selection().unwrap(), Some(IntegerSelection { keys: vec![1, 3], null }));
        }
        // Counted by hash: no integer selection, unless nothing was selected.
        let keys = SelectedKeys::default();
        keys.set(vec![hash(7)]).unwrap();
        assert_eq!(keys.integer_selection().unwrap(), None);
        keys.set(Vec::new()).unwrap();
        assert_eq!(keys.integer_selection().unwrap(), Some(IntegerSelection::default()));
    }
}
