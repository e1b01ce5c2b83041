//! `total_int_div` and `total_int_mod`: integer `/` and `%` that cannot fail (SPEC §5.1). The
//! expressions pass puts them in place of integer division on private rows, so a zero divisor
//! in one row gives NULL instead of failing the query.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use datafusion::arrow::datatypes::{self as adt, ArrowNativeTypeOp, DataType};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility};

/// Integer `/` or `%` that is total: NULL when the divisor is 0, and wrapping (like `+ − *`)
/// for `MIN / -1`. The guard substitutes it for integer division on private rows.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TotalIntDiv {
    modulo: bool,
    signature: Signature,
}

impl TotalIntDiv {
    /// The division (`modulo` false) or remainder function.
    pub fn new(modulo: bool) -> Self {
        Self { modulo, signature: Signature::any(2, Volatility::Immutable) }
    }

    #[cfg(feature = "cluster")]
    /// Whether this is the remainder.
    pub(crate) fn is_modulo(&self) -> bool {
        self.modulo
    }
}

fn divide<T: ArrowPrimitiveType>(a: &ArrayRef, b: &ArrayRef, modulo: bool) -> ArrayRef {
    let a = a.as_any().downcast_ref::<PrimitiveArray<T>>().expect("checked type");
    let b = b.as_any().downcast_ref::<PrimitiveArray<T>>().expect("checked type");
    let out: PrimitiveArray<T> = a
        .iter()
        .zip(b.iter())
        .map(|(x, y)| match (x, y) {
            (Some(x), Some(y)) if !y.is_zero() => Some(if modulo { x.mod_wrapping(y) } else { x.div_wrapping(y) }),
            _ => None,
        })
        .collect();
    Arc::new(out)
}

impl ScalarUDFImpl for TotalIntDiv {
    fn name(&self) -> &str {
        if self.modulo { "total_int_mod" } else { "total_int_div" }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [a, b] if a == b && a.is_integer() => Ok(a.clone()),
            _ => plan_err!("{} takes two integers of the same type, got {arg_types:?}", self.name()),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let (a, b) = (&arrays[0], &arrays[1]);
        let m = self.modulo;
        let out = match a.data_type() {
            DataType::Int8 => divide::<adt::Int8Type>(a, b, m),
            DataType::Int16 => divide::<adt::Int16Type>(a, b, m),
            DataType::Int32 => divide::<adt::Int32Type>(a, b, m),
            DataType::Int64 => divide::<adt::Int64Type>(a, b, m),
            DataType::UInt8 => divide::<adt::UInt8Type>(a, b, m),
            DataType::UInt16 => divide::<adt::UInt16Type>(a, b, m),
            DataType::UInt32 => divide::<adt::UInt32Type>(a, b, m),
            DataType::UInt64 => divide::<adt::UInt64Type>(a, b, m),
            other => return plan_err!("{}: not an integer type: {other}", self.name()),
        };
        Ok(ColumnarValue::Array(out))
    }
}
