//! [`DpCodec`]: Ballista's plan nodes plus dpcurve's functions, with what each instance carries —
//! a private aggregate as its name and contribution bound (never a permit: an executor's copy
//! cannot release), the per-unit bound, and the scalar functions of [`super::udfs`].

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use super::udfs;
use crate::functions::{CallContext, Permits, context_of, with_context};
use crate::guard::ops::sample_order::SampleOrder;
use crate::guard::ops::unit_bound::{UnitArg, UnitBound};
use crate::mechanism::{Contribution, NoiseSource};

/// Ballista's plan nodes, plus dpcurve's functions with what each instance carries.
#[derive(Debug, Default)]
pub struct DpCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

/// Payload tags: the first byte of an encoded dpcurve function.
const TAG_PRIVATE: u8 = 1;
const TAG_UNIT_BOUND: u8 = 2;

impl PhysicalExtensionCodec for DpCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.ballista.try_decode(buf, inputs, ctx, proto_converter)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        self.ballista.try_encode(node, buf, proto_converter)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(bytes) = udfs::encode(node) {
            buf.extend_from_slice(&bytes);
        }
        Ok(())
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        udfs::decode(name, buf).map(Arc::new)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(bound) = node.inner().downcast_ref::<UnitBound>() {
            let (groups, rows) = bound.bound();
            let (a, b) = bound.order().key();
            let (keys, unit) = bound.arguments();
            buf.push(TAG_UNIT_BOUND);
            for word in [groups, rows, a, b, keys as u64] {
                buf.extend_from_slice(&word.to_le_bytes());
            }
            buf.push(match unit {
                UnitArg::Hash => 0,
                UnitArg::Value => 1,
            });
            return Ok(());
        }
        if let Some(cx) = context_of(node) {
            buf.push(TAG_PRIVATE);
            buf.extend_from_slice(&cx.contribution.rows.to_le_bytes());
            buf.extend_from_slice(&cx.contribution.groups.to_le_bytes());
        }
        Ok(())
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        let bad = || DataFusionError::Internal(format!("cannot decode the aggregate function '{name}'"));
        let expected = match buf.first() {
            Some(&TAG_PRIVATE) => 17,
            Some(&TAG_UNIT_BOUND) => 42,
            _ => return Err(bad()),
        };
        if buf.len() != expected {
            return Err(bad());
        }
        let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        if buf[0] == TAG_UNIT_BOUND {
            let order = SampleOrder::with_key((word(17), word(25)));
            let keys = usize::try_from(word(33)).map_err(|_| bad())?;
            let unit = match buf[41] {
                0 => UnitArg::Hash,
                1 => UnitArg::Value,
                _ => return Err(bad()),
            };
            let bound = AggregateUDF::from(UnitBound::new(word(1), word(9), order, keys, unit));
            return if bound.name() == name { Ok(Arc::new(bound)) } else { Err(bad()) };
        }
        let contribution = Contribution::new(word(1), word(9)).map_err(|_| bad())?;
        let registered = crate::functions::private_udafs(NoiseSource::Os, Permits::Denied);
        let func = registered.iter().find(|f| f.name() == name).ok_or_else(bad)?;
        // An executor computes partial states only: it can never release (no permit).
        let cx = CallContext { noise: NoiseSource::Os, permits: Permits::Denied, contribution };
        with_context(func, cx).map(Arc::new).ok_or_else(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_aggregates_travel_with_their_contribution_and_without_permits() {
        let codec = DpCodec::default();
        let registered = crate::functions::private_udafs(NoiseSource::Os, Permits::Free);
        for func in &registered {
            let cx = CallContext {
                noise: NoiseSource::TestSeed(3),
                permits: Permits::Free,
                contribution: Contribution::new(7, 3).unwrap(),
            };
            let func = with_context(func, cx).unwrap();
            let mut buf = Vec::new();
            codec.try_encode_udaf(&func, &mut buf).unwrap();
            let back = codec.try_decode_udaf(func.name(), &buf).unwrap();
            let got = context_of(&back).unwrap();
            assert_eq!(got.contribution, Contribution::new(7, 3).unwrap());
            assert_eq!(got.permits, Permits::Denied, "an executor's copy can never release");
            assert_eq!(got.noise, NoiseSource::Os, "no test seed crosses the wire");
        }
        // Anything else is refused, not guessed.
        assert!(codec.try_decode_udaf("private_kde", &[]).is_err());
        assert!(codec.try_decode_udaf("count", &[TAG_PRIVATE; 17]).is_err());
    }
}
