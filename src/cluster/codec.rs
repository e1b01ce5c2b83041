//! [`DpCodec`]: Ballista's plan nodes plus dpcurve's functions, with what each instance carries —
//! a private aggregate as its name and contribution bound (never a permit: an executor's copy
//! cannot release), the per-unit bound's function, the operator of planned memory (the unit bound, a
//! selection's count) with the public facts its memory was planned from, and the scalar functions of [`super::udfs`].

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::PhysicalPlanNode;
use prost::Message;

use super::udfs;
use crate::functions::{CallContext, Permits, context_of, with_context};
use crate::guard::exec::planned_aggregate::PlannedAggregateExec;
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

/// The prefix of an encoded [`PlannedAggregateExec`]. Ballista's own nodes are protobuf messages, whose
/// first byte is the key of a field numbered below 16, never 0xFF.
const PLANNED_AGGREGATE: &[u8] = b"\xffdpcurve-planned-aggregate\x01";

impl DpCodec {
    /// A [`PlannedAggregateExec`] as its one-phase aggregate over an empty input of the same schema (its
    /// real input travels as the node's input), then its public facts: the input's row bound and
    /// its share of the memory limit, planned by the client.
    fn encode_planned(
        &self,
        planned: &PlannedAggregateExec,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let empty = Arc::new(EmptyExec::new(planned.children()[0].schema()));
        let template: Arc<dyn ExecutionPlan> = Arc::new(planned.aggregate_over(empty)?);
        let proto = proto_converter.execution_plan_to_proto(&template, self)?;
        buf.extend_from_slice(PLANNED_AGGREGATE);
        for fact in [planned.rows(), planned.share()] {
            buf.push(u8::from(fact.is_some()));
            buf.extend_from_slice(&fact.unwrap_or(0).to_le_bytes());
        }
        proto.encode(buf).map_err(|e| DataFusionError::Internal(format!("cannot encode the planned aggregate: {e}")))
    }

    /// The inverse of [`Self::encode_planned`], over `inputs[0]`.
    fn decode_planned(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let bad = |what: &str| DataFusionError::Internal(format!("cannot decode the planned aggregate: {what}"));
        let ([input], Some((facts, proto))) = (inputs, buf.split_at_checked(18)) else {
            return Err(bad("expected one input and its public facts"));
        };
        let fact = |at: usize| -> Result<Option<u64>> {
            let word = u64::from_le_bytes(facts[at + 1..at + 9].try_into().expect("8 bytes"));
            match facts[at] {
                0 => Ok(None),
                1 => Ok(Some(word)),
                _ => Err(bad("a public fact is neither present nor absent")),
            }
        };
        let proto = PhysicalPlanNode::decode(proto).map_err(|e| bad(&e.to_string()))?;
        let template = proto_converter.proto_to_execution_plan(&proto, &PhysicalPlanDecodeContext::new(ctx, self))?;
        let recompute = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        let agg = template.replace_children(vec![Arc::clone(input)], recompute)?;
        let agg = agg.downcast_ref::<AggregateExec>().ok_or_else(|| bad("not an aggregate"))?;
        let bound = PlannedAggregateExec::try_new(agg)?.ok_or_else(|| bad("not a one-phase aggregate it runs"))?;
        Ok(Arc::new(bound.with_rows(fact(0)?).with_share(fact(9)?)))
    }
}

impl PhysicalExtensionCodec for DpCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match buf.strip_prefix(PLANNED_AGGREGATE) {
            Some(rest) => self.decode_planned(rest, inputs, ctx, proto_converter),
            None => self.ballista.try_decode(buf, inputs, ctx, proto_converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        match node.downcast_ref::<PlannedAggregateExec>() {
            Some(bound) => self.encode_planned(bound, buf, proto_converter),
            None => self.ballista.try_encode(node, buf, proto_converter),
        }
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

    /// Each output row (key, value) as text, sorted (a spilled operator emits its files in any order).
    fn rows_of(batches: Vec<datafusion::arrow::array::RecordBatch>) -> Vec<String> {
        use datafusion::arrow::util::display::array_value_to_string;
        let mut out = Vec::new();
        for b in &batches {
            for i in 0..b.num_rows() {
                let row = b.columns().iter().map(|c| array_value_to_string(c, i).unwrap()).collect::<Vec<_>>();
                out.push(row.join(" | "));
            }
        }
        out.sort();
        out
    }

    /// The planned operator (the unit bound, a selection's count) reaches an executor with the
    /// public facts its memory was planned from, and computes there what it computes here.
    #[tokio::test]
    async fn the_planned_aggregate_travels_with_its_public_facts() {
        use datafusion::physical_plan::{collect, displayable};
        use datafusion_proto::physical_plan::DefaultPhysicalProtoConverter;

        use crate::guard::exec::planned_aggregate::testing::{aggregate, count_of};

        let codec = DpCodec::default();
        let converter = DefaultPhysicalProtoConverter {};
        // (An executor's registry: DataFusion's own functions, such as `count`.)
        let ctx = datafusion::prelude::SessionContext::new().task_ctx();
        let counted = count_of((0..2100).map(|i| (i % 50 != 0).then_some(i * 7919 % 300)).collect());
        for agg in [aggregate(300), counted] {
            let input = Arc::clone(agg.input());
            for (rows, share) in [(Some(2100), Some(1 << 20)), (None, Some(5)), (Some(u64::MAX), None), (None, None)] {
                let sent =
                    Arc::new(PlannedAggregateExec::try_new(&agg).unwrap().unwrap().with_rows(rows).with_share(share));
                let mut buf = Vec::new();
                codec.try_encode(Arc::clone(&sent) as Arc<dyn ExecutionPlan>, &mut buf, &converter).unwrap();
                let got = codec.try_decode(&buf, std::slice::from_ref(&input), &ctx, &converter).unwrap();
                let planned = got.downcast_ref::<PlannedAggregateExec>().expect("the planned operator");
                assert_eq!((planned.rows(), planned.share()), (rows, share));
                let shown = |p: &dyn ExecutionPlan| displayable(p).indent(true).to_string();
                assert_eq!(shown(got.as_ref()), shown(sent.as_ref()));
                let want =
                    rows_of(collect(Arc::clone(&sent) as Arc<dyn ExecutionPlan>, Arc::clone(&ctx)).await.unwrap());
                assert_eq!(rows_of(collect(got, Arc::clone(&ctx)).await.unwrap()), want);
                assert!(want.len() > 200, "most of the 300 keys and the NULL one");
                // A damaged payload is refused, not guessed; without the prefix it is Ballista's.
                for bad in [&buf[..PLANNED_AGGREGATE.len() + 10], &buf[PLANNED_AGGREGATE.len()..]] {
                    assert!(codec.try_decode(bad, std::slice::from_ref(&input), &ctx, &converter).is_err());
                }
            }
        }
    }
}
