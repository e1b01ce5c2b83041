//! `dpcurve_sample_order(col, …)`: the keyed order that decides which rows a privacy unit keeps
//! and which groups it reaches (SPEC §7), and the key hash of a partition selection's groups. A
//! 128-bit SipHash-1-3 of Arrow's canonical row encoding, keyed per query and never displayed.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, FixedSizeBinaryBuilder};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility};
use rand::Rng;
use siphasher::sip128::SipHasher13;

use crate::mechanism::NoiseSource;

/// Arrow's canonical row encoding of `columns`: equal values give equal bytes whatever the batch,
/// file or partition (what both the sampling order and the partition selection key rely on).
pub(crate) fn canonical_rows(columns: &[ArrayRef]) -> Result<Rows> {
    let fields = columns.iter().map(|a| SortField::new(a.data_type().clone())).collect();
    Ok(RowConverter::new(fields)?.convert_columns(columns)?)
}

/// `columns` decoded from Arrow's row format as `types`: the format gives a dictionary-encoded
/// column back as its values, which are cast back to the dictionary.
pub(crate) fn decoded_as<T: std::borrow::Borrow<DataType>>(
    columns: Vec<ArrayRef>,
    types: impl IntoIterator<Item = T>,
) -> Result<Vec<ArrayRef>> {
    columns
        .into_iter()
        .zip(types)
        .map(|(c, t)| {
            let t = t.borrow();
            Ok(if c.data_type() == t { c } else { datafusion::arrow::compute::cast(&c, t)? })
        })
        .collect()
}

/// `dpcurve_sample_order(col, …)`: a 128-bit keyed SipHash-1-3 of the row's values (in Arrow's
/// canonical row encoding), as 16 big-endian bytes. The key is drawn per query from the OS
/// CSPRNG (fixed under the test hooks' noise sources) and never displayed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SampleOrder {
    signature: Signature,
    key: (u64, u64),
}

impl fmt::Debug for SampleOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SampleOrder { key: <secret> }")
    }
}

impl SampleOrder {
    /// A fresh order: OS-keyed in production, fixed by the test seed otherwise.
    pub fn new(noise: NoiseSource) -> Result<Self> {
        let key = match noise.release_rng() {
            Ok(Some(mut rng)) => (rng.next_u64(), rng.next_u64()),
            Ok(None) => (0x5eed_0001, 0x5eed_0002),
            Err(e) => return plan_err!("{e}"),
        };
        Ok(Self::with_key(key))
    }

    /// The key (to ship the order to a cluster's executors, which read the unit's rows).
    pub(crate) fn key(&self) -> (u64, u64) {
        self.key
    }

    /// An order with a given key (tests, and the copy decoded on an executor).
    pub fn with_key(key: (u64, u64)) -> Self {
        Self { signature: Signature::variadic_any(Volatility::Immutable), key }
    }

    /// The order keys of the rows of `columns`.
    pub fn keys(&self, columns: &[ArrayRef]) -> Result<ArrayRef> {
        let hashes = self.hashes(columns)?;
        let mut out = FixedSizeBinaryBuilder::with_capacity(hashes.len(), 16);
        for h in hashes {
            out.append_value(h.to_be_bytes())?;
        }
        Ok(Arc::new(out.finish()))
    }

    /// The order keys of the rows of `columns` as numbers (the keys' bytes are their big-endian
    /// form).
    pub fn hashes(&self, columns: &[ArrayRef]) -> Result<Vec<u128>> {
        let rows = canonical_rows(columns)?;
        Ok(rows.iter().map(|row| self.hash(row.as_ref())).collect())
    }

    /// The order key of one row given in Arrow's canonical row encoding (what [`Self::hashes`]
    /// computes for each row).
    pub fn hash(&self, encoded: &[u8]) -> u128 {
        // The crate's one-shot form: the same SipHash-1-3 as writing the bytes to a hasher and
        // finishing it, without the streaming hasher's buffered tail (inlined into the caller).
        u128::from(SipHasher13::new_with_keys(self.key.0, self.key.1).hash(encoded))
    }

    /// The order key of each of the `encoded.len() / width` rows of `width` bytes stored one after
    /// another in `encoded`, appended to `out` ([`Self::hash`] of each, eight at a time).
    pub(crate) fn hash_each(&self, encoded: &[u8], width: usize, out: &mut Vec<u128>) {
        super::sip_lanes::hash_each(self.key, encoded, width, out)
    }
}

impl ScalarUDFImpl for SampleOrder {
    fn name(&self) -> &str {
        "dpcurve_sample_order"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::FixedSizeBinary(16))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let columns = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<_>>>()?;
        Ok(ColumnarValue::Array(self.keys(&columns)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray, Float64Array, StringArray};

    fn keys(order: &SampleOrder, xs: Vec<f64>, units: Vec<&str>) -> Vec<u128> {
        let cols: Vec<ArrayRef> = vec![Arc::new(Float64Array::from(xs)), Arc::new(StringArray::from(units))];
        let k = order.keys(&cols).unwrap();
        let k = k.as_fixed_size_binary();
        (0..k.len()).map(|i| u128::from_be_bytes(k.value(i).try_into().unwrap())).collect()
    }

    #[test]
    fn the_order_is_a_keyed_function_of_the_row_values() {
        let a = SampleOrder::with_key((1, 2));
        let k1 = keys(&a, vec![0.5, 0.25, 0.5], vec!["u", "u", "u"]);
        assert_eq!(k1[0], k1[2], "identical rows tie");
        assert_ne!(k1[0], k1[1]);
        // Batch boundaries do not matter: the same row alone gets the same key.
        assert_eq!(keys(&a, vec![0.25], vec!["u"])[0], k1[1]);
        // Another key, another order.
        let b = SampleOrder::with_key((3, 4));
        assert_ne!(keys(&b, vec![0.5, 0.25], vec!["u", "u"]), k1[..2].to_vec());
        // Debug never shows the key.
        assert!(!format!("{a:?}").contains('1'));
    }

    /// The one-shot hash is SipHash-1-3 of the bytes as a streaming hasher computes it, whatever
    /// the length and however the bytes are written (so every order stays what it was).
    #[test]
    fn the_order_is_the_streaming_siphash_of_the_encoding() {
        use siphasher::sip128::Hasher128;
        use std::hash::Hasher;
        let order = SampleOrder::with_key((0x0123_4567, 0x89ab_cdef));
        let bytes: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
        for len in 0..=bytes.len() {
            let msg = &bytes[..len];
            for cut in [0, len / 3, len] {
                let mut h = SipHasher13::new_with_keys(0x0123_4567, 0x89ab_cdef);
                h.write(&msg[..cut]);
                h.write(&msg[cut..]);
                assert_eq!(order.hash(msg), u128::from(h.finish128()), "{len} bytes cut at {cut}");
            }
        }
        // Control: another key gives other orders.
        assert_ne!(SampleOrder::with_key((1, 2)).hash(&bytes), order.hash(&bytes));
    }

    #[test]
    fn os_keys_differ_between_queries() {
        let a = SampleOrder::new(NoiseSource::Os).unwrap();
        let b = SampleOrder::new(NoiseSource::Os).unwrap();
        assert_ne!(a.key, b.key);
        assert_eq!(
            SampleOrder::new(NoiseSource::TestSeed(3)).unwrap().key,
            SampleOrder::new(NoiseSource::TestSeed(3)).unwrap().key
        );
    }
}
