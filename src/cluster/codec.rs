//! [`DpCodec`]: Ballista's plan nodes plus dpcurve's functions, with what each instance carries —
//! a private aggregate as its name and contribution bound (never a permit: an executor's copy
//! cannot release), the per-unit bound's function, the operator of planned memory (the unit bound, a
//! selection's count) with the public facts its memory was planned from, the partial phase over known
//! keys with its keys (declared, or as many as the gate's selection chose), and the scalar functions
//! of [`super::udfs`].

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
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
use crate::guard::exec::known_keys_partial::{KnownKeysPartialExec, PublicKeys};
use crate::guard::exec::planned_aggregate::PlannedAggregateExec;
use crate::guard::ops::sample_order::SampleOrder;
use crate::guard::ops::selected::IntegerSelection;
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

/// The prefix of an encoded [`KnownKeysPartialExec`] (as [`PLANNED_AGGREGATE`]).
const KNOWN_KEYS: &[u8] = b"\xffdpcurve-known-keys\x01";

/// Which public keys follow [`KNOWN_KEYS`].
const KEYS_DECLARED: u8 = 0;
const KEYS_INTEGERS: u8 = 1;
const KEYS_COUNT: u8 = 2;

fn bad_keys(what: &str) -> DataFusionError {
    DataFusionError::Internal(format!("cannot decode the partial phase over known keys: {what}"))
}

/// Reads a little-endian u64 at the front of `buf`.
fn take_u64(buf: &mut &[u8]) -> Result<u64> {
    let (word, rest) = buf.split_at_checked(8).ok_or_else(|| bad_keys("truncated"))?;
    *buf = rest;
    Ok(u64::from_le_bytes(word.try_into().expect("8 bytes")))
}

/// `keys` as bytes: a tag, then the declared columns as an Arrow IPC stream (length first), or a
/// selection's integer keys (NULL flag, count, values), or a selection's count.
fn encode_keys(keys: &PublicKeys, buf: &mut Vec<u8>) -> Result<()> {
    match keys {
        PublicKeys::Declared(columns) => {
            let fields: Vec<Field> = columns
                .iter()
                .enumerate()
                .map(|(i, c)| Field::new(format!("k{i}"), c.data_type().clone(), true))
                .collect();
            let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns.clone())?;
            let mut ipc = Vec::new();
            let mut writer = StreamWriter::try_new(&mut ipc, &batch.schema())?;
            writer.write(&batch)?;
            writer.finish()?;
            drop(writer);
            buf.push(KEYS_DECLARED);
            buf.extend_from_slice(&(ipc.len() as u64).to_le_bytes());
            buf.extend_from_slice(&ipc);
        }
        PublicKeys::Integers(IntegerSelection { keys, null }) => {
            buf.push(KEYS_INTEGERS);
            buf.push(u8::from(*null));
            buf.extend_from_slice(&(keys.len() as u64).to_le_bytes());
            keys.iter().for_each(|k| buf.extend_from_slice(&k.to_le_bytes()));
        }
        PublicKeys::Count(n) => {
            buf.push(KEYS_COUNT);
            buf.extend_from_slice(&(*n as u64).to_le_bytes());
        }
    }
    Ok(())
}

/// The inverse of [`encode_keys`]; `buf` is left at what follows.
fn decode_keys(buf: &mut &[u8]) -> Result<PublicKeys> {
    let (&tag, rest) = buf.split_first().ok_or_else(|| bad_keys("no keys"))?;
    *buf = rest;
    Ok(match tag {
        KEYS_DECLARED => {
            let len = usize::try_from(take_u64(buf)?).map_err(|_| bad_keys("too long"))?;
            let (ipc, rest) = buf.split_at_checked(len).ok_or_else(|| bad_keys("truncated"))?;
            *buf = rest;
            let mut reader = StreamReader::try_new(ipc, None)?;
            let batch = reader.next().ok_or_else(|| bad_keys("no declared keys"))??;
            PublicKeys::Declared(batch.columns().to_vec())
        }
        KEYS_INTEGERS => {
            let (&null, rest) = buf.split_first().ok_or_else(|| bad_keys("truncated"))?;
            *buf = rest;
            let null = match null {
                0 => false,
                1 => true,
                _ => return Err(bad_keys("the NULL key is neither selected nor not")),
            };
            let n = take_u64(buf)?;
            if n > (buf.len() / 8) as u64 {
                return Err(bad_keys("truncated"));
            }
            let keys = (0..n).map(|_| take_u64(buf).map(|w| w as i64)).collect::<Result<Vec<_>>>()?;
            PublicKeys::Integers(IntegerSelection { keys, null })
        }
        KEYS_COUNT => PublicKeys::Count(usize::try_from(take_u64(buf)?).map_err(|_| bad_keys("too many"))?),
        _ => return Err(bad_keys("unknown keys")),
    })
}

impl DpCodec {
    /// `aggregate` (its input replaced by an empty one of the same schema: the real input travels
    /// as the node's input) as a protobuf message appended to `buf`.
    fn encode_template(
        &self,
        aggregate: impl FnOnce(Arc<dyn ExecutionPlan>) -> Result<AggregateExec>,
        input: &Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let template: Arc<dyn ExecutionPlan> = Arc::new(aggregate(Arc::new(EmptyExec::new(input.schema())))?);
        let proto = proto_converter.execution_plan_to_proto(&template, self)?;
        proto.encode(buf).map_err(|e| DataFusionError::Internal(format!("cannot encode an aggregate's template: {e}")))
    }

    /// The inverse of [`Self::encode_template`]: the aggregate in `proto`, over `input`.
    fn decode_template(
        &self,
        proto: &[u8],
        input: &Arc<dyn ExecutionPlan>,
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let bad = |what: &str| DataFusionError::Internal(format!("cannot decode an aggregate's template: {what}"));
        let proto = PhysicalPlanNode::decode(proto).map_err(|e| bad(&e.to_string()))?;
        let template = proto_converter.proto_to_execution_plan(&proto, &PhysicalPlanDecodeContext::new(ctx, self))?;
        let recompute = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        let agg = template.replace_children(vec![Arc::clone(input)], recompute)?;
        match agg.downcast_ref::<AggregateExec>() {
            Some(_) => Ok(agg),
            None => Err(bad("not an aggregate")),
        }
    }

    /// A [`PlannedAggregateExec`] as its one-phase aggregate over an empty input of the same schema (its
    /// real input travels as the node's input), then its public facts: the input's row bound and
    /// its share of the memory limit, planned by the client.
    fn encode_planned(
        &self,
        planned: &PlannedAggregateExec,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        buf.extend_from_slice(PLANNED_AGGREGATE);
        for fact in [planned.rows(), planned.share()] {
            buf.push(u8::from(fact.is_some()));
            buf.extend_from_slice(&fact.unwrap_or(0).to_le_bytes());
        }
        self.encode_template(|empty| planned.aggregate_over(empty), planned.children()[0], buf, proto_converter)
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
        let agg = self.decode_template(proto, input, ctx, proto_converter)?;
        let agg = agg.downcast_ref::<AggregateExec>().ok_or_else(|| bad("not an aggregate"))?;
        let bound = PlannedAggregateExec::try_new(agg)?.ok_or_else(|| bad("not a one-phase aggregate it runs"))?;
        Ok(Arc::new(bound.with_rows(fact(0)?).with_share(fact(9)?)))
    }
}

impl DpCodec {
    /// A [`KnownKeysPartialExec`] as its public keys (now: after the gate ran any selection), then
    /// the partial aggregate it replaced over an empty input of the same schema.
    fn encode_known_keys(
        &self,
        partial: &KnownKeysPartialExec,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        buf.extend_from_slice(KNOWN_KEYS);
        encode_keys(&partial.public_keys()?, buf)?;
        self.encode_template(|empty| partial.template_over(empty), partial.children()[0], buf, proto_converter)
    }

    /// The inverse of [`Self::encode_known_keys`], over `inputs[0]`.
    fn decode_known_keys(
        &self,
        mut buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = inputs else { return Err(bad_keys("expected one input")) };
        let keys = decode_keys(&mut buf)?;
        let agg = self.decode_template(buf, input, ctx, proto_converter)?;
        let agg = agg.downcast_ref::<AggregateExec>().ok_or_else(|| bad_keys("not an aggregate"))?;
        Ok(Arc::new(KnownKeysPartialExec::shipped(agg, keys)?))
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
        if let Some(rest) = buf.strip_prefix(PLANNED_AGGREGATE) {
            return self.decode_planned(rest, inputs, ctx, proto_converter);
        }
        match buf.strip_prefix(KNOWN_KEYS) {
            Some(rest) => self.decode_known_keys(rest, inputs, ctx, proto_converter),
            None => self.ballista.try_decode(buf, inputs, ctx, proto_converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if let Some(bound) = node.downcast_ref::<PlannedAggregateExec>() {
            return self.encode_planned(bound, buf, proto_converter);
        }
        match node.downcast_ref::<KnownKeysPartialExec>() {
            Some(partial) => self.encode_known_keys(partial, buf, proto_converter),
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

    /// The partial phase over known keys reaches an executor with its keys (declared, a
    /// selection's integer values with its NULL key, or a selection's count) and computes there
    /// what it computes here; a damaged payload is refused.
    #[tokio::test]
    async fn the_known_keys_partial_travels_with_its_keys() {
        use datafusion::arrow::array::{ArrayRef, Int64Array};
        use datafusion::physical_plan::aggregates::AggregateMode;
        use datafusion::physical_plan::{collect, displayable};
        use datafusion_proto::physical_plan::DefaultPhysicalProtoConverter;

        use crate::guard::exec::planned_aggregate::testing::count_of;

        let codec = DpCodec::default();
        let converter = DefaultPhysicalProtoConverter {};
        let ctx = datafusion::prelude::SessionContext::new().task_ctx();
        let counted = count_of((0..2100).map(|i| (i % 50 != 0).then_some(i * 7919 % 300)).collect());
        let input = Arc::clone(counted.input());
        let partial = AggregateExec::try_new(
            AggregateMode::Partial,
            counted.group_expr().clone(),
            counted.aggr_expr().to_vec(),
            counted.filter_expr().to_vec(),
            Arc::clone(&input),
            counted.input_schema(),
        )
        .unwrap();
        let declared: ArrayRef = Arc::new(Int64Array::from(vec![3, 299, 1000, 0]));
        for keys in [
            PublicKeys::Declared(vec![declared]),
            PublicKeys::Integers(IntegerSelection { keys: vec![1, 2, 250], null: true }),
            PublicKeys::Count(40),
        ] {
            let sent = Arc::new(KnownKeysPartialExec::shipped(&partial, keys.clone()).unwrap());
            let mut buf = Vec::new();
            codec.try_encode(Arc::clone(&sent) as Arc<dyn ExecutionPlan>, &mut buf, &converter).unwrap();
            let got = codec.try_decode(&buf, std::slice::from_ref(&input), &ctx, &converter).unwrap();
            let known = got.downcast_ref::<KnownKeysPartialExec>().expect("the known keys' partial");
            assert_eq!(known.public_keys().unwrap(), keys);
            let shown = |p: &dyn ExecutionPlan| displayable(p).indent(true).to_string();
            assert_eq!(shown(got.as_ref()), shown(sent.as_ref()));
            let want = rows_of(collect(Arc::clone(&sent) as Arc<dyn ExecutionPlan>, Arc::clone(&ctx)).await.unwrap());
            assert_eq!(rows_of(collect(got, Arc::clone(&ctx)).await.unwrap()), want);
            // Every declared or selected key (its group empty or not); every key rows reach when
            // the selection's keys are known only by number (most of the 300 and the NULL one).
            match &keys {
                PublicKeys::Count(_) => assert!(want.len() > 200, "{want:?}"),
                _ => assert_eq!(want.len(), 4, "{keys:?}: {want:?}"),
            }
            // A damaged payload is refused, not guessed.
            let mut unknown = buf.clone();
            unknown[KNOWN_KEYS.len()] = 9;
            for bad in [&buf[..KNOWN_KEYS.len() + 5], &unknown[..]] {
                assert!(codec.try_decode(bad, std::slice::from_ref(&input), &ctx, &converter).is_err());
            }
        }
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
