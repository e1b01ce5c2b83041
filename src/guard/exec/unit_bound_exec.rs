//! The privacy-unit bound's own aggregate: each partition's units found in a [`UnitTable`]
//! instead of DataFusion's hash aggregate, their samples kept by the bound's accumulator, and
//! more units than the memory limit holds spilled to disk in partitions of the units' hashes.
//!
//! [`super::unit_phase`] plans the bound in one phase: rows exchanged by unit, then one aggregate
//! per partition grouped by the unit (DataFusion's `SinglePartitioned` mode) whose only call is
//! `dpcurve_unit_bound`. That aggregate spends most of its time finding each row's unit — the
//! units' samples evict DataFusion's interning table from the caches, and it waits on its misses
//! one row at a time. [`UnitBoundExec`] replaces it with the same output (one row per unit: the
//! unit and its kept rows) from the same accumulator (`GroupsAccumulator` of the bound, fed the
//! same group indices in the same order), finding units with prefetches ([`UnitTable`]).
//!
//! **Memory.** After every batch the table and the samples are charged to the query's memory
//! pool. When they no longer fit, every unit's sample (the accumulator's state) is written to one
//! of 16 files chosen by a hash of its unit, the table is emptied and reading goes on. At the end
//! the rest is written too, and each file is read back alone (on the blocking pool) — its samples merged per unit,
//! exactly as partial states merge — and emitted; a file whose units still do not fit is split
//! again, 16 ways, by another hash of the unit. A unit's sample is at most K·L rows whatever its size, so
//! how much fits depends on the number of units and the limit, never on one unit's rows; the
//! kept rows do not depend on when or whether anything spilled (merging samples keeps exactly
//! what one pass keeps).

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_arrays;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::spill_file::{SpillFile, SpillWriter};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::{RecordBatchReceiverStream, RecordBatchStreamAdapter};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::node::{apply_each, batch_as, groups_accumulators, only_child};
use super::unit_table::{MAX_LEVELS, PARTITION_BITS, UnitTable, key_width};
use crate::guard::ops::unit_bound;

/// The bound's one-phase aggregate with its own unit table and spill (module docs).
#[derive(Debug, Clone)]
pub struct UnitBoundExec {
    input: Arc<dyn ExecutionPlan>,
    unit: Arc<dyn PhysicalExpr>,
    bound: Arc<AggregateFunctionExpr>,
    unit_type: DataType,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    /// `spill_count`: times the samples were written out; `partition_splits`: spill files split
    /// again because their units did not fit.
    metrics: ExecutionPlanMetricsSet,
}

impl UnitBoundExec {
    /// The operator for `agg` when it is the bound's one-phase aggregate (`SinglePartitioned`,
    /// grouped by one unit of a fixed-width type, one unfiltered `dpcurve_unit_bound` call);
    /// None for any other aggregate.
    pub fn try_new(agg: &AggregateExec) -> Result<Option<Self>> {
        let groups = agg.group_expr();
        let ([(unit, _)], [bound], [None]) = (groups.expr(), agg.aggr_expr(), agg.filter_expr()) else {
            return Ok(None);
        };
        if *agg.mode() != AggregateMode::SinglePartitioned
            || !groups.is_single()
            || bound.fun().name() != unit_bound::NAME
        {
            return Ok(None);
        }
        let unit_type = unit.data_type(&agg.input_schema())?;
        if key_width(&unit_type).is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            input: Arc::clone(agg.input()),
            unit: Arc::clone(unit),
            bound: Arc::clone(bound),
            unit_type,
            schema: agg.schema(),
            properties: Arc::clone(agg.properties()),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    /// The schema of a spill file: the unit, then the bound's state.
    fn spill_schema(&self) -> Result<SchemaRef> {
        let mut fields = vec![Arc::new(Field::new("unit", self.unit_type.clone(), true))];
        fields.extend(self.bound.state_fields()?);
        Ok(Arc::new(Schema::new(fields)))
    }
}

impl DisplayAs for UnitBoundExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitBoundExec: unit={}, aggr=[{}]", self.unit, unit_bound::NAME)
    }
}

impl ExecutionPlan for UnitBoundExec {
    fn name(&self) -> &str {
        "UnitBoundExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        apply_each(std::iter::once(&self.unit).chain(self.bound.expressions().iter()), f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = only_child(children, "UnitBoundExec")?;
        Ok(Arc::new(Self { input, metrics: ExecutionPlanMetricsSet::new(), ..self.as_ref().clone() }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let reservation = MemoryConsumer::new(format!("UnitBoundExec[{partition}]"))
            .with_can_spill(true)
            .register(context.memory_pool());
        let run = Run {
            input: Some(input),
            unit: Arc::clone(&self.unit),
            arguments: self.bound.expressions(),
            table: UnitTable::new(&self.unit_type)?,
            bound: groups_accumulators(std::slice::from_ref(&self.bound))?.remove(0),
            groups: Vec::new(),
            reservation,
            context,
            schema: Arc::clone(&self.schema),
            spill_schema: self.spill_schema()?,
            spilled: None,
            files: Vec::new(),
            output: VecDeque::new(),
            spills: MetricBuilder::new(&self.metrics).spill_count(partition),
            splits: MetricBuilder::new(&self.metrics).counter("partition_splits", partition),
        };
        let batches =
            futures::stream::try_unfold(run, |mut run| async move { Ok(run.next().await?.map(|batch| (batch, run))) });
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), batches)))
    }
}

/// One partition's execution.
struct Run {
    /// The rows, until all are read.
    input: Option<SendableRecordBatchStream>,
    unit: Arc<dyn PhysicalExpr>,
    arguments: Vec<Arc<dyn PhysicalExpr>>,
    table: UnitTable,
    bound: Box<dyn GroupsAccumulator>,
    /// Scratch: one batch's group indices.
    groups: Vec<usize>,
    reservation: MemoryReservation,
    context: Arc<TaskContext>,
    schema: SchemaRef,
    spill_schema: SchemaRef,
    /// The level-0 spill files, once anything spilled.
    spilled: Option<Partitions>,
    /// Spill files still to merge and emit, with their level.
    files: Vec<(Arc<dyn SpillFile>, u32)>,
    /// Emitted batches not yet returned.
    output: VecDeque<RecordBatch>,
    spills: Count,
    splits: Count,
}

impl Run {
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(batch) = self.output.pop_front() {
                return Ok(Some(batch));
            }
            if let Some(mut input) = self.input.take() {
                while let Some(batch) = input.next().await {
                    self.update(&batch?)?;
                }
                match self.spilled.take() {
                    None => self.emit()?,
                    Some(mut partitions) => {
                        self.spill_into(&mut partitions)?;
                        self.files.extend(partitions.finish()?);
                    }
                }
                continue;
            }
            let Some((file, level)) = self.files.pop() else {
                self.reservation.free();
                return Ok(None);
            };
            self.merge(&file, level).await?;
        }
    }

    fn size(&self) -> usize {
        self.table.size() + self.bound.size()
    }

    fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        let unit = self.unit.evaluate(batch)?.into_array(n)?;
        let arguments =
            self.arguments.iter().map(|e| e.evaluate(batch)?.into_array(n)).collect::<Result<Vec<ArrayRef>>>()?;
        self.table.groups_of(unit.as_ref(), &mut self.groups)?;
        self.bound.update_batch(&arguments, &self.groups, None, self.table.len())?;
        if self.reservation.try_resize(self.size()).is_err() {
            let mut partitions = match self.spilled.take() {
                Some(p) => p,
                None => Partitions::new(0, Arc::clone(&self.spill_schema)),
            };
            self.spill_into(&mut partitions)?;
            self.spilled = Some(partitions);
            self.fit()?;
        }
        Ok(())
    }

    /// Charges what is held now, which must fit (an emptied table and accumulator).
    fn fit(&mut self) -> Result<()> {
        self.reservation.try_resize(self.size()).map_err(|e| {
            DataFusionError::ResourcesExhausted(format!(
                "the privacy-unit bound cannot hold one batch of units in the memory limit: {e}"
            ))
        })
    }

    /// Writes every unit's sample to its partition's file and empties the table.
    fn spill_into(&mut self, partitions: &mut Partitions) -> Result<()> {
        self.spills.add(1);
        let at = partitions.level;
        let parts = self.table.group_partitions(at);
        let mut columns = vec![self.table.keys()?];
        columns.extend(self.bound.state(EmitTo::All)?);
        self.table.reset();
        partitions.write(&RecordBatch::try_new(Arc::clone(&self.spill_schema), columns)?, &parts, &self.context)
    }

    /// Every unit's kept rows, in batches of the session's size; empties the table.
    fn emit(&mut self) -> Result<()> {
        let kept = self.bound.evaluate(EmitTo::All)?;
        let units = self.table.keys()?;
        self.table.reset();
        let batch = batch_as(Arc::clone(&self.schema), vec![units, kept])?;
        let size = self.context.session_config().batch_size().max(1);
        for from in (0..batch.num_rows()).step_by(size) {
            self.output.push_back(batch.slice(from, size.min(batch.num_rows() - from)));
        }
        self.fit()
    }

    /// Merges one spill file's samples per unit and emits them; when they do not fit, splits what
    /// is merged and what is left of the file by the next level's partitions.
    async fn merge(&mut self, file: &Arc<dyn SpillFile>, level: u32) -> Result<()> {
        let path: &Path = file.path().ok_or_else(|| DataFusionError::Internal("a spill file without a path".into()))?;
        let mut batches = read_spill(path.to_path_buf(), Arc::clone(&self.spill_schema));
        let mut split: Option<Partitions> = None;
        let mut parts = Vec::new();
        while let Some(batch) = batches.next().await {
            let batch = batch?;
            if let Some(finer) = &mut split {
                self.table.partitions_of(batch.column(0).as_ref(), finer.level, &mut parts)?;
                finer.write(&batch, &parts, &self.context)?;
                continue;
            }
            self.table.groups_of(batch.column(0).as_ref(), &mut self.groups)?;
            self.bound.merge_batch(&batch.columns()[1..], &self.groups, self.table.len())?;
            if self.reservation.try_resize(self.size()).is_err() {
                if level + 1 >= MAX_LEVELS {
                    return Err(DataFusionError::ResourcesExhausted(
                        "the privacy-unit bound cannot hold one unit's sample in the memory limit".into(),
                    ));
                }
                self.splits.add(1);
                let mut finer = Partitions::new(level + 1, Arc::clone(&self.spill_schema));
                self.spill_into(&mut finer)?;
                self.fit()?;
                split = Some(finer);
            }
        }
        match split {
            Some(mut finer) => self.files.extend(finer.finish()?),
            None => self.emit()?,
        }
        Ok(())
    }
}

/// The batches of the spill file at `path`, read and decoded on the blocking pool (a file read
/// does not hold up a worker that other partitions' tasks share), one batch ahead.
fn read_spill(path: PathBuf, schema: SchemaRef) -> SendableRecordBatchStream {
    let mut builder = RecordBatchReceiverStream::builder(schema, 1);
    let tx = builder.tx();
    builder.spawn_blocking(move || {
        for batch in StreamReader::try_new(BufReader::new(File::open(&path)?), None)? {
            if tx.blocking_send(batch.map_err(DataFusionError::from)).is_err() {
                break; // the merge stopped (its query failed or was cancelled)
            }
        }
        Ok(())
    });
    builder.build()
}

/// The spill files of one level: one per partition of that level, opened when first written.
struct Partitions {
    level: u32,
    schema: SchemaRef,
    files: Vec<Option<(Arc<dyn SpillFile>, StreamWriter<BufWriter<Box<dyn SpillWriter>>>)>>,
}

impl Partitions {
    fn new(level: u32, schema: SchemaRef) -> Self {
        Self { level, schema, files: (0..1 << PARTITION_BITS).map(|_| None).collect() }
    }

    /// Appends each row of `batch` to the file of its partition `parts[row]`.
    fn write(&mut self, batch: &RecordBatch, parts: &[usize], context: &TaskContext) -> Result<()> {
        for (p, slot) in self.files.iter_mut().enumerate() {
            let rows: Vec<u32> = (0..parts.len()).filter(|&i| parts[i] == p).map(|i| i as u32).collect();
            if rows.is_empty() {
                continue;
            }
            let columns = take_arrays(batch.columns(), &UInt32Array::from(rows), None)?;
            let part = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
            if slot.is_none() {
                let file = context.runtime_env().disk_manager.create_tmp_file("dpcurve unit bound")?;
                let writer = StreamWriter::try_new(BufWriter::new(file.open_writer()?), &self.schema)?;
                *slot = Some((file, writer));
            }
            let (_, writer) = slot.as_mut().expect("opened above");
            writer.write(&part)?;
        }
        Ok(())
    }

    /// The files written, finished, with their level.
    fn finish(&mut self) -> Result<Vec<(Arc<dyn SpillFile>, u32)>> {
        let mut done = Vec::new();
        for (file, writer) in self.files.iter_mut().filter_map(Option::take) {
            let mut out = writer.into_inner()?.into_inner().map_err(|e| DataFusionError::IoError(e.into_error()))?;
            out.finish()?;
            done.push((file, self.level));
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use datafusion::arrow::array::{Array, AsArray, Float64Array, Int64Array};
    use datafusion::arrow::datatypes::{Float64Type, Int64Type};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::logical_expr::AggregateUDF;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::aggregates::PhysicalGroupBy;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionConfig;

    use super::*;
    use crate::guard::ops::sample_order::SampleOrder;
    use crate::guard::ops::unit_bound::{UnitArg, UnitBound};

    /// `units` units (every 50th row's unit NULL) of 1–13 rows over 7 groups, in batches of 500
    /// rows: the bound's one-phase aggregate as DataFusion plans it.
    fn aggregate(units: i64) -> AggregateExec {
        let schema = Arc::new(Schema::new(vec![
            Field::new("u", DataType::Int64, true),
            Field::new("g", DataType::Int64, false),
            Field::new("x", DataType::Float64, false),
        ]));
        let rows = units * 7;
        let u = Int64Array::from_iter((0..rows).map(|i| (i % 50 != 0).then_some((i * 7919) % units)));
        let g = Int64Array::from_iter_values((0..rows).map(|i| i * 31 % 7));
        let x = Float64Array::from_iter_values((0..rows).map(|i| (i * 13 % 1009) as f64));
        let all = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(u), Arc::new(g), Arc::new(x)]).unwrap();
        let batches: Vec<RecordBatch> =
            (0..rows as usize).step_by(500).map(|from| all.slice(from, 500.min(rows as usize - from))).collect();
        let input = MemorySourceConfig::try_new_exec(&[batches], Arc::clone(&schema), None).unwrap();
        let udf = UnitBound::new(2, 3, SampleOrder::with_key((11, 12)), 1, UnitArg::Value);
        let args = ["u", "g", "x"].map(|c| col(c, &schema).unwrap()).to_vec();
        let bound = AggregateExprBuilder::new(Arc::new(AggregateUDF::from(udf)), args)
            .schema(Arc::clone(&schema))
            .alias("kept")
            .build()
            .unwrap();
        let groups = PhysicalGroupBy::new_single(vec![(col("u", &schema).unwrap(), "u".into())]);
        AggregateExec::try_new(
            AggregateMode::SinglePartitioned,
            groups,
            vec![Arc::new(bound)],
            vec![None],
            input,
            schema,
        )
        .unwrap()
    }

    /// Each unit's kept values (NULL unit: None), in the order kept.
    async fn kept(plan: Arc<dyn ExecutionPlan>, memory: Option<usize>) -> HashMap<Option<i64>, Vec<f64>> {
        let mut runtime = RuntimeEnvBuilder::new();
        if let Some(bytes) = memory {
            runtime = runtime.with_memory_limit(bytes, 1.0);
        }
        let context = TaskContext::default()
            .with_session_config(SessionConfig::new().with_batch_size(300))
            .with_runtime(runtime.build_arc().unwrap());
        let mut out = HashMap::new();
        for batch in collect(plan, Arc::new(context)).await.unwrap() {
            let units = batch.column(0).as_primitive::<Int64Type>();
            let lists = batch.column(1).as_list::<i32>();
            for i in 0..batch.num_rows() {
                let values = lists.value(i);
                let x = values.as_struct().column(0).as_primitive::<Float64Type>().values().to_vec();
                let unit = units.is_valid(i).then(|| units.value(i));
                assert!(out.insert(unit, x).is_none(), "unit {unit:?} emitted twice");
            }
        }
        out
    }

    fn counts(exec: &UnitBoundExec) -> (usize, usize) {
        let m = exec.metrics().unwrap();
        (m.spill_count().unwrap_or(0), m.sum_by_name("partition_splits").map_or(0, |v| v.as_usize()))
    }

    /// The operator keeps what DataFusion's aggregate keeps, unit by unit — in memory, spilled,
    /// and spilled with files split again because their units did not fit either.
    #[tokio::test]
    async fn keeps_what_the_aggregate_keeps_in_memory_and_spilled() {
        let agg = aggregate(12_000);
        let want = kept(Arc::new(agg.clone()), None).await;
        assert!(want.len() > 11_000 && want.contains_key(&None), "units and the NULL unit: {}", want.len());
        assert!(want.values().all(|x| !x.is_empty() && x.len() <= 6));
        for (memory, spilled, split) in
            [(None, false, false), (Some(1 << 20), true, false), (Some(96 << 10), true, true)]
        {
            let exec = Arc::new(UnitBoundExec::try_new(&agg).unwrap().expect("a unit of a fixed-width type"));
            let got = kept(Arc::clone(&exec) as Arc<dyn ExecutionPlan>, memory).await;
            assert!(got == want, "under {memory:?} bytes");
            let (spills, splits) = counts(&exec);
            assert_eq!(
                (spills > 0, splits > 0),
                (spilled, split),
                "under {memory:?}: {spills} spills, {splits} splits"
            );
        }
    }
}
