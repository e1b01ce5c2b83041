//! `declared_key_range(g, lo, hi)`: whether an integer key lies in `[lo, hi]` (NULL for a NULL
//! key), the filter the groups pass puts below a grouped private aggregate when the declared keys
//! are every integer from lo to hi. It answers as `g BETWEEN lo AND hi` does, in one pass of one
//! unsigned comparison per row (`g − lo ≤ hi − lo`, wrapping), compiled for AVX-512 and AVX2 and
//! chosen at run time: DataFusion's `BETWEEN` runs two comparison kernels and an `AND`, compiled
//! for the baseline target, where a 64-bit comparison is not vectorised.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, ArrowPrimitiveType, AsArray, BooleanArray};
use datafusion::arrow::buffer::{BooleanBuffer, MutableBuffer};
use datafusion::arrow::datatypes::{self as adt, DataType};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::mechanism::cpu::Kernel;

/// The function's name in plans.
pub const NAME: &str = "declared_key_range";

/// `declared_key_range(key, lo, hi)` (module docs).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct KeyRange {
    signature: Signature,
}

impl Default for KeyRange {
    fn default() -> Self {
        Self { signature: Signature::any(3, Volatility::Immutable) }
    }
}

/// The filter `key ∈ [lo, hi]` over integer literals `lo ≤ hi` (the declared keys' range).
pub fn in_range(key: Expr, lo: ScalarValue, hi: ScalarValue) -> Expr {
    ScalarUDF::from(KeyRange::default()).call(vec![key, Expr::Literal(lo, None), Expr::Literal(hi, None)])
}

/// The value of a non-null integer literal, widened.
pub(crate) fn integer(v: &ScalarValue) -> Option<i128> {
    Some(match v {
        ScalarValue::Int8(Some(v)) => *v as i128,
        ScalarValue::Int16(Some(v)) => *v as i128,
        ScalarValue::Int32(Some(v)) => *v as i128,
        ScalarValue::Int64(Some(v)) => *v as i128,
        ScalarValue::UInt8(Some(v)) => *v as i128,
        ScalarValue::UInt16(Some(v)) => *v as i128,
        ScalarValue::UInt32(Some(v)) => *v as i128,
        ScalarValue::UInt64(Some(v)) => *v as i128,
        _ => return None,
    })
}

/// A native integer as a 64-bit word (sign-extended for signed types). The words of a type's
/// values keep their order up to a rotation, so `w − lo ≤ hi − lo` (wrapping) tests `lo ≤ w ≤ hi`.
trait Word: Copy {
    fn word(self) -> u64;
    const MIN: i128;
    const MAX: i128;
}

macro_rules! words {
    ($($t:ty => $via:ty),*) => {$(
        impl Word for $t {
            #[inline(always)]
            fn word(self) -> u64 {
                self as $via as u64
            }
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        }
    )*};
}
words!(i8 => i64, i16 => i64, i32 => i64, i64 => i64, u8 => u64, u16 => u64, u32 => u64, u64 => u64);

/// The word of `v`, a value of `T`'s range, as `T` maps it: its low 64 bits.
fn word_of(v: i128) -> u64 {
    v as u64
}

/// Bit `i` set when `values[i]`'s word minus `lo` is at most `span` (wrapping).
#[inline(always)]
fn bits<T: Word>(values: &[T], lo: u64, span: u64) -> BooleanBuffer {
    let mut out = MutableBuffer::new(values.len().div_ceil(64) * 8);
    let chunks = values.chunks_exact(64);
    let rest = chunks.remainder();
    for chunk in chunks {
        let mut packed = 0u64;
        for (b, v) in chunk.iter().enumerate() {
            packed |= u64::from(v.word().wrapping_sub(lo) <= span) << b;
        }
        out.push(packed);
    }
    if !rest.is_empty() {
        let mut packed = 0u64;
        for (b, v) in rest.iter().enumerate() {
            packed |= u64::from(v.word().wrapping_sub(lo) <= span) << b;
        }
        out.push(packed);
    }
    BooleanBuffer::new(out.into(), 0, values.len())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn bits_avx2<T: Word>(values: &[T], lo: u64, span: u64) -> BooleanBuffer {
    bits(values, lo, span)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2")]
fn bits_avx512<T: Word>(values: &[T], lo: u64, span: u64) -> BooleanBuffer {
    bits(values, lo, span)
}

/// Whether each key of `keys` lies in `[lo, hi]` with `kernel`; NULL where the key is NULL.
fn range_with<T>(kernel: Kernel, keys: &ArrayRef, lo: i128, hi: i128) -> BooleanArray
where
    T: ArrowPrimitiveType,
    T::Native: Word,
{
    let keys = keys.as_primitive::<T>();
    let nulls = keys.nulls().cloned();
    // The range within the type's values: empty when it misses them all.
    let (lo, hi) = (lo.max(<T::Native as Word>::MIN), hi.min(<T::Native as Word>::MAX));
    if lo > hi {
        return BooleanArray::new(BooleanBuffer::new_unset(keys.len()), nulls);
    }
    let (lo, span) = (word_of(lo), word_of(hi).wrapping_sub(word_of(lo)));
    let values = keys.values().as_ref();
    let bits = match kernel {
        Kernel::Portable => bits(values, lo, span),
        // SAFETY: `Kernel::detect` chose these only where the CPU has the instructions (and
        // `Kernel::available` in tests).
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { bits_avx2(values, lo, span) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { bits_avx512(values, lo, span) },
    };
    BooleanArray::new(bits, nulls)
}

/// [`range_with`] for any integer key type.
fn range(kernel: Kernel, keys: &ArrayRef, lo: i128, hi: i128) -> Result<BooleanArray> {
    Ok(match keys.data_type() {
        DataType::Int8 => range_with::<adt::Int8Type>(kernel, keys, lo, hi),
        DataType::Int16 => range_with::<adt::Int16Type>(kernel, keys, lo, hi),
        DataType::Int32 => range_with::<adt::Int32Type>(kernel, keys, lo, hi),
        DataType::Int64 => range_with::<adt::Int64Type>(kernel, keys, lo, hi),
        DataType::UInt8 => range_with::<adt::UInt8Type>(kernel, keys, lo, hi),
        DataType::UInt16 => range_with::<adt::UInt16Type>(kernel, keys, lo, hi),
        DataType::UInt32 => range_with::<adt::UInt32Type>(kernel, keys, lo, hi),
        DataType::UInt64 => range_with::<adt::UInt64Type>(kernel, keys, lo, hi),
        other => return exec_err!("{NAME} takes an integer key, got {other}"),
    })
}

impl ScalarUDFImpl for KeyRange {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [k, lo, hi] if k.is_integer() && lo.is_integer() && hi.is_integer() => Ok(DataType::Boolean),
            _ => plan_err!("{NAME} takes an integer key and two integer bounds, got {arg_types:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [key, lo, hi] = args.args.as_slice() else { return exec_err!("{NAME} takes three arguments") };
        let bound = |v: &ColumnarValue| match v {
            ColumnarValue::Scalar(s) => integer(s),
            ColumnarValue::Array(_) => None,
        };
        let (Some(lo), Some(hi)) = (bound(lo), bound(hi)) else {
            return exec_err!("{NAME} takes two non-null integer literals as its bounds");
        };
        let keys = key.to_array(args.number_rows)?;
        Ok(ColumnarValue::Array(Arc::new(range(Kernel::detect(), &keys, lo, hi)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, PrimitiveArray, UInt64Array};

    /// `BETWEEN`'s answer, one key at a time.
    fn between(keys: &[Option<i128>], lo: i128, hi: i128) -> Vec<Option<bool>> {
        keys.iter().map(|k| k.map(|k| lo <= k && k <= hi)).collect()
    }

    fn answers(kernel: Kernel, keys: &ArrayRef, lo: i128, hi: i128) -> Vec<Option<bool>> {
        range(kernel, keys, lo, hi).unwrap().iter().collect()
    }

    fn check<T>(values: Vec<Option<T::Native>>, ranges: &[(i128, i128)])
    where
        T: ArrowPrimitiveType,
        T::Native: Word + Into<i128>,
    {
        let wide: Vec<Option<i128>> = values.iter().map(|v| v.map(Into::into)).collect();
        let keys: ArrayRef = Arc::new(PrimitiveArray::<T>::from_iter(values));
        for kernel in Kernel::available() {
            for &(lo, hi) in ranges {
                assert_eq!(answers(kernel, &keys, lo, hi), between(&wide, lo, hi), "{kernel:?} [{lo}, {hi}]");
            }
        }
    }

    /// Every integer type, every kernel the CPU runs, keys at and beside each bound and at the
    /// type's ends, NULLs, lengths that leave a partial word of bits.
    #[test]
    fn the_range_answers_as_between_for_every_integer_type() {
        let i64s: Vec<Option<i64>> =
            [i64::MIN, i64::MIN + 1, -101, -100, -99, -1, 0, 1, 98, 99, 100, i64::MAX - 1, i64::MAX]
                .into_iter()
                .map(Some)
                .chain([None])
                .cycle()
                .take(14 * 9 + 5)
                .collect();
        let ranges = [
            (-100, 99),
            (0, 0),
            (i64::MIN as i128, i64::MAX as i128),
            (i64::MIN as i128, -100),
            (99, i64::MAX as i128),
            (5, 4),
        ];
        check::<adt::Int64Type>(i64s, &ranges);
        let i8s: Vec<Option<i8>> = (i8::MIN..=i8::MAX).map(Some).chain([None]).collect();
        check::<adt::Int8Type>(i8s, &[(-100, 99), (-1000, 1000), (-1000, -200), (200, 1000), (-128, -128), (127, 127)]);
        let i16s: Vec<Option<i16>> = (-300i16..300).map(Some).collect();
        check::<adt::Int16Type>(i16s, &[(-100, 99), (0, 299)]);
        let i32s: Vec<Option<i32>> = [i32::MIN, -1, 0, 7, i32::MAX].into_iter().map(Some).cycle().take(67).collect();
        check::<adt::Int32Type>(i32s, &[(-1, 7), (i32::MIN as i128, 0)]);
        let u8s: Vec<Option<u8>> = (0..=u8::MAX).map(Some).chain([None]).collect();
        check::<adt::UInt8Type>(u8s, &[(0, 99), (-5, 3), (250, 300), (-10, -1)]);
        let u16s: Vec<Option<u16>> = (0..1000).map(Some).collect();
        check::<adt::UInt16Type>(u16s, &[(10, 999)]);
        let u32s: Vec<Option<u32>> = [0, 1, u32::MAX - 1, u32::MAX].into_iter().map(Some).cycle().take(70).collect();
        check::<adt::UInt32Type>(u32s, &[(1, u32::MAX as i128 - 1)]);
        let u64s: Vec<Option<u64>> =
            [0, 1, 1 << 63, (1 << 63) + 1, u64::MAX].into_iter().map(Some).cycle().take(130).collect();
        let keys: ArrayRef = Arc::new(UInt64Array::from(u64s.clone()));
        let wide: Vec<Option<i128>> = u64s.iter().map(|v| v.map(i128::from)).collect();
        for kernel in Kernel::available() {
            for (lo, hi) in [(0, 1), (1, 1 << 63), (1 << 63, u64::MAX as i128), (0, u64::MAX as i128)] {
                assert_eq!(answers(kernel, &keys, lo, hi), between(&wide, lo, hi), "{kernel:?} [{lo}, {hi}]");
            }
        }
    }

    /// Negative control: the keys above sit on and beside every bound, so a range one short at
    /// either end (an off-by-one in the span or the start) is caught.
    #[test]
    fn a_range_one_short_at_either_end_is_caught() {
        let keys: Vec<Option<i128>> = [-101i64, -100, -99, 98, 99, 100].iter().map(|&k| Some(k as i128)).collect();
        let array: ArrayRef = Arc::new(Int64Array::from(vec![-101i64, -100, -99, 98, 99, 100]));
        for kernel in Kernel::available() {
            assert_eq!(answers(kernel, &array, -100, 99), between(&keys, -100, 99));
            assert_ne!(answers(kernel, &array, -100, 98), between(&keys, -100, 99));
            assert_ne!(answers(kernel, &array, -99, 99), between(&keys, -100, 99));
        }
    }
}
