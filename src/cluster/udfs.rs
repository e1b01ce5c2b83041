//! dpcurve's scalar functions on a cluster's executors: what each instance carries,
//! as bytes for the plan codec ([`super::codec::DpCodec`]).
//!
//! * the privacy-unit sampling order: its per-query key (executors read the unit's rows; the
//!   key only makes the kept rows a uniform sample, it protects nothing from them);
//! * a partition selection's membership filter: the key hashes the client's gate selected (the
//!   subtree is shipped after the gate ran the selection) and the hash's key;
//! * the total integer division and remainder;
//! * the eager `CASE`, `AND` and `OR`;
//! * the declared keys' range filter (its bounds are the call's literal arguments).

use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::ScalarUDF;

use crate::guard::ops::eager::{EagerForm, Form};
use crate::guard::ops::key_range::KeyRange;
use crate::guard::ops::sample_order::SampleOrder;
use crate::guard::ops::selected::SelectedFilter;
use crate::guard::ops::total_div::TotalIntDiv;

const TAG_ORDER: u8 = 1;
const TAG_SELECTED: u8 = 2;
const TAG_NOT_SELECTED_YET: u8 = 3;
const TAG_DIV: u8 = 4;
const TAG_MOD: u8 = 5;
const TAG_CASE: u8 = 6;
const TAG_AND: u8 = 7;
const TAG_OR: u8 = 8;
const TAG_KEY_RANGE: u8 = 9;

/// The bytes of one of dpcurve's scalar functions (None: any other function, which executors
/// find by name).
pub(crate) fn encode(udf: &ScalarUDF) -> Option<Vec<u8>> {
    let inner = udf.inner();
    if let Some(order) = inner.downcast_ref::<SampleOrder>() {
        let (a, b) = order.key();
        let mut out = vec![TAG_ORDER];
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        return Some(out);
    }
    if let Some(filter) = inner.downcast_ref::<SelectedFilter>() {
        // A poisoned lock ships "nothing selected": the filter then keeps no row.
        let (a, b) = filter.hash_key();
        return Some(match filter.selected().ok().flatten() {
            None => {
                let mut out = vec![TAG_NOT_SELECTED_YET];
                out.extend_from_slice(&a.to_le_bytes());
                out.extend_from_slice(&b.to_le_bytes());
                out
            }
            Some(keys) => {
                let mut out = vec![TAG_SELECTED];
                out.extend_from_slice(&a.to_le_bytes());
                out.extend_from_slice(&b.to_le_bytes());
                out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
                for k in keys {
                    out.extend_from_slice(&(k.len() as u64).to_le_bytes());
                    out.extend_from_slice(&k);
                }
                out
            }
        });
    }
    if let Some(div) = inner.downcast_ref::<TotalIntDiv>() {
        return Some(vec![if div.is_modulo() { TAG_MOD } else { TAG_DIV }]);
    }
    if inner.is::<KeyRange>() {
        return Some(vec![TAG_KEY_RANGE]);
    }
    if let Some(eager) = inner.downcast_ref::<EagerForm>() {
        return Some(vec![match eager.form() {
            Form::Case => TAG_CASE,
            Form::And => TAG_AND,
            Form::Or => TAG_OR,
        }]);
    }
    None
}

/// Rebuilds one of dpcurve's scalar functions from its bytes.
pub(crate) fn decode(name: &str, buf: &[u8]) -> Result<ScalarUDF> {
    let bad = || DataFusionError::Internal(format!("cannot decode the function '{name}'"));
    let mut rest = Reader(buf.get(1..).ok_or_else(bad)?);
    let udf = match buf.first() {
        Some(&TAG_ORDER) => {
            let key = (rest.word().ok_or_else(bad)?, rest.word().ok_or_else(bad)?);
            ScalarUDF::from(SampleOrder::with_key(key))
        }
        Some(&TAG_NOT_SELECTED_YET) => {
            let key = (rest.word().ok_or_else(bad)?, rest.word().ok_or_else(bad)?);
            ScalarUDF::from(SelectedFilter::holding(None, key)?)
        }
        Some(&TAG_SELECTED) => {
            let key = (rest.word().ok_or_else(bad)?, rest.word().ok_or_else(bad)?);
            let n = rest.word().ok_or_else(bad)?;
            let mut keys = Vec::new();
            for _ in 0..n {
                let len = rest.word().and_then(|l| usize::try_from(l).ok()).ok_or_else(bad)?;
                keys.push(rest.bytes(len).ok_or_else(bad)?.to_vec());
            }
            ScalarUDF::from(SelectedFilter::holding(Some(keys), key)?)
        }
        Some(&TAG_DIV) => ScalarUDF::from(TotalIntDiv::new(false)),
        Some(&TAG_MOD) => ScalarUDF::from(TotalIntDiv::new(true)),
        Some(&TAG_CASE) => ScalarUDF::from(EagerForm::new(Form::Case)),
        Some(&TAG_AND) => ScalarUDF::from(EagerForm::new(Form::And)),
        Some(&TAG_OR) => ScalarUDF::from(EagerForm::new(Form::Or)),
        Some(&TAG_KEY_RANGE) => ScalarUDF::from(KeyRange::default()),
        _ => return Err(bad()),
    };
    if !rest.0.is_empty() || udf.name() != name {
        return Err(bad());
    }
    Ok(udf)
}

/// Reads little-endian words and byte strings off the front of a buffer.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn word(&mut self) -> Option<u64> {
        let (w, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(u64::from_le_bytes(*w))
    }

    fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.0.len() < len {
            return None;
        }
        let (b, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(udf: ScalarUDF) -> ScalarUDF {
        let bytes = encode(&udf).expect("a dpcurve function");
        decode(udf.name(), &bytes).unwrap()
    }

    #[test]
    fn functions_round_trip_with_what_they_carry() {
        let order = round_trip(ScalarUDF::from(SampleOrder::with_key((11, 12))));
        assert_eq!(order.inner().downcast_ref::<SampleOrder>().unwrap().key(), (11, 12));
        let (a, b) = ([1u8; 16].to_vec(), [2u8; 16].to_vec());
        let filter =
            round_trip(ScalarUDF::from(SelectedFilter::holding(Some(vec![b.clone(), a.clone()]), (5, 6)).unwrap()));
        let got = filter.inner().downcast_ref::<SelectedFilter>().unwrap();
        assert_eq!(got.selected().unwrap(), Some(vec![a, b]));
        assert!(SelectedFilter::holding(Some(vec![b"short".to_vec()]), (5, 6)).is_err(), "keys are 16-byte hashes");
        assert_eq!(got.hash_key(), (5, 6));
        let none = round_trip(ScalarUDF::from(SelectedFilter::holding(None, (7, 8)).unwrap()));
        let none = none.inner().downcast_ref::<SelectedFilter>().unwrap();
        assert_eq!((none.selected().unwrap(), none.hash_key()), (None, (7, 8)));
        assert!(
            round_trip(ScalarUDF::from(TotalIntDiv::new(true)))
                .inner()
                .downcast_ref::<TotalIntDiv>()
                .unwrap()
                .is_modulo()
        );
        assert!(
            !round_trip(ScalarUDF::from(TotalIntDiv::new(false)))
                .inner()
                .downcast_ref::<TotalIntDiv>()
                .unwrap()
                .is_modulo()
        );
        for form in [Form::Case, Form::And, Form::Or] {
            let back = round_trip(ScalarUDF::from(EagerForm::new(form)));
            assert_eq!(back.inner().downcast_ref::<EagerForm>().unwrap().form(), form);
        }
        assert!(round_trip(ScalarUDF::from(KeyRange::default())).inner().is::<KeyRange>());
    }

    #[test]
    fn malformed_bytes_are_refused() {
        let bytes = encode(&ScalarUDF::from(SampleOrder::with_key((1, 2)))).unwrap();
        let name = ScalarUDF::from(SampleOrder::with_key((1, 2))).name().to_string();
        assert!(decode(&name, &bytes[..bytes.len() - 1]).is_err(), "truncated");
        assert!(decode("total_int_div", &bytes).is_err(), "another name");
        assert!(decode(&name, &[]).is_err());
        assert!(decode(&name, &[99]).is_err());
        assert!(encode(&datafusion::functions::math::abs()).is_none(), "built-ins go by name");
    }
}
