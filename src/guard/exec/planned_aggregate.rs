//! An aggregate grouped by one key of a fixed width whose memory is planned from public facts:
//! each partition's keys found in a [`UnitTable`] instead of DataFusion's hash aggregate, their
//! states kept by the call's `GroupsAccumulator`, and — when the input's rows could hold more than
//! the memory limit allows — spilled to disk in partitions of the keys' hashes, on a schedule fixed
//! before the first row. It runs two calls, each the only one of its aggregate:
//! * the privacy-unit bound (`dpcurve_unit_bound`, grouped by the unit: its value or its hash);
//! * a partition selection's count of each candidate group (`count`, aliased
//!   [`selected::COUNT_COLUMN`], grouped by the key's keyed hash or its integer value).
//!
//! [`super::unit_phase`] plans the bound in one phase: rows exchanged by key, then one aggregate per
//! partition grouped by the key (DataFusion's `SinglePartitioned` mode). In this process the count
//! runs in two ([`Phase`]): each file partition counts its rows' keys as they come and passes the
//! counts on every [`PARTIAL_WINDOW`] rows — a window's keys, at most its rows, so the partial phase's
//! memory is bounded by a constant and reserved whole before its first row — then the counts are
//! exchanged by key and added up by a final phase planned like the one phase (exchanging the rows
//! themselves cost more than counting them). How many counts a window passes on is its number of
//! keys: the count's time grows with the candidate groups, as it did before, never with a threshold. DataFusion's own aggregate
//! would spend most of the bound's time finding each row's unit — the units' samples evict its
//! interning table from the caches, and it waits on its misses one row at a time — and would spill
//! when its groups no longer fit, a threshold the rows decide. [`PlannedAggregateExec`] computes the
//! same output (one row per key: the key and the call's value) from the same accumulator (for the
//! count, [`ChunkedCount`]: DataFusion's count without a doubling vector), fed the same group
//! indices in the same order, finding keys with prefetches ([`UnitTable`]).
//!
//! **Memory, decided before the first row (SPEC §0).** Whether and when it spills must not
//! depend on the rows: spilling when the keys no longer fit would make the running time jump at
//! a count of units (or of candidate groups), which an analyst who filters rows with WHERE could
//! bisect for. So the [`Layout`] is chosen from public facts only — the most rows the input can
//! have (the row counts in the Parquet footers of the files it scans, [`super::public_facts`]), the
//! most bytes a row can add to the state (a new key's table slot, [`UnitTable::most_bytes_per_unit`],
//! and the call's growth: [`UnitBound::most_bytes_per_row`], or a count's 8 bytes in chunks,
//! [`ChunkedCount`]), the bytes of the session's memory limit it may hold (for the bound, what the
//! private calls above leave it, planned from their public parameters; at least half,
//! [`unit_bound::memory_share`]) and the number of partitions:
//! * **in memory** when every row of the input could be a key of its own and still fit: nothing
//!   is written;
//! * **spilled** otherwise: every `window` rows a partition reads, its keys' states (the
//!   accumulator's state) are written to files chosen by a keyed hash of the key, and the table
//!   is emptied — so the memory held is at most a window's; at the end the rest is written too.
//!   The files of each level are split again by the next level's bits until the last level, whose
//!   files are each read back alone (on the blocking pool), merged per key exactly as partial
//!   states merge, and emitted. The number of levels (at most two) and their bits are chosen so that a last-level
//!   file of a maximal input holds a quarter of the share on average: with the hash's key unknown,
//!   one holding more than the share is as likely as a hash collision (its memory is then
//!   charged beyond the limit, never a failure).
//!
//! Either way the work depends on the number of rows read (one row more, one window boundary
//! moved by one row) and on the keys written (each a bounded cost), never on a threshold of keys
//! or memory; the pool's accounting is infallible, so no data-dependent failure either. The
//! output does not depend on the layout (merging states gives exactly what one pass gives). Kept
//! columns of variable width (strings, a mean curve's lists) have no public bound on their bytes: a window
//! then holds what its rows hold, bounded by the files' sizes only.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray, RecordBatch, UInt32Array};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryReservation};
use datafusion::execution::spill_file::{SpillFile, SpillWriter};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::{RecordBatchReceiverStream, RecordBatchStreamAdapter};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::node::{apply_each, batch_as, groups_accumulators, only_child};
use super::unit_table::{LEVEL_BITS, UnitTable, key_width};
use crate::guard::ops::chunked_count::ChunkedCount;
use crate::guard::ops::selected;
use crate::guard::ops::unit_bound::{self, UnitBound};

/// A one-phase aggregate with its own key table and planned spill (module docs).
#[derive(Debug, Clone)]
pub struct PlannedAggregateExec {
    input: Arc<dyn ExecutionPlan>,
    /// The schema of the aggregate's rows (for a final phase, the partial phase's input's).
    input_schema: SchemaRef,
    key: Arc<dyn PhysicalExpr>,
    call: Arc<AggregateFunctionExpr>,
    kind: Call,
    phase: Phase,
    key_type: DataType,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    /// The most rows the input can have, from public facts (None: unknown, so spilled).
    rows: Option<u64>,
    /// The bytes of the memory limit it may hold, planned from public parameters (None:
    /// [`unit_bound::memory_share`] of the pool's limit).
    share: Option<u64>,
    /// `spill_count`: times the states were written out; `partition_splits`: spill files split
    /// by the next level's bits; `peak_bytes`: the most the table and the states held.
    metrics: ExecutionPlanMetricsSet,
}

impl PlannedAggregateExec {
    /// The operator for `agg` when it is the one-phase aggregate (`SinglePartitioned`, grouped by
    /// one key of a fixed-width type) of one unfiltered call it runs, or a phase of a selection's
    /// count (`Partial`, `FinalPartitioned`; module docs); None for any other aggregate. Its
    /// input's rows are unknown until [`Self::with_rows`].
    pub fn try_new(agg: &AggregateExec) -> Result<Option<Self>> {
        let groups = agg.group_expr();
        let ([(key, _)], [call], [None]) = (groups.expr(), agg.aggr_expr(), agg.filter_expr()) else {
            return Ok(None);
        };
        let Some(kind) = Call::of(call) else { return Ok(None) };
        let phase = match (agg.mode(), kind) {
            (AggregateMode::SinglePartitioned, _) => Phase::One,
            (AggregateMode::Partial, Call::Count) => Phase::Partial,
            (AggregateMode::FinalPartitioned, Call::Count) => Phase::Final,
            _ => return Ok(None),
        };
        if !groups.is_single() {
            return Ok(None);
        }
        // The key over the operator's own input (a final phase's: the partial phase's output).
        let key_type = key.data_type(&agg.input().schema())?;
        if key_width(&key_type).is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            input: Arc::clone(agg.input()),
            input_schema: agg.input_schema(),
            key: Arc::clone(key),
            call: Arc::clone(call),
            kind,
            phase,
            key_type,
            schema: agg.schema(),
            properties: Arc::clone(agg.properties()),
            rows: None,
            share: None,
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    /// Whether it runs the privacy-unit bound (else a partition selection's count).
    pub fn is_unit_bound(&self) -> bool {
        self.kind == Call::UnitBound
    }

    /// The phase of its aggregate it computes.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The same operator over an input of at most `rows` rows, a public bound.
    pub fn with_rows(self, rows: Option<u64>) -> Self {
        Self { rows, ..self }
    }

    /// The input's public row bound.
    pub fn rows(&self) -> Option<u64> {
        self.rows
    }

    /// The same operator holding at most `share` bytes of the memory limit (all partitions).
    pub fn with_share(self, share: Option<u64>) -> Self {
        Self { share, ..self }
    }

    /// The bytes of the memory limit it holds at most, as planned (None: not planned).
    pub fn share(&self) -> Option<u64> {
        self.share
    }

    /// The aggregate (or phase of one) this operator computes, over `input` (of the same schema as
    /// its own): what [`Self::try_new`] takes back. A cluster's codec sends the operator as that
    /// aggregate over an empty input, with its public facts.
    pub fn aggregate_over(&self, input: Arc<dyn ExecutionPlan>) -> Result<AggregateExec> {
        let name = self.schema.field(0).name().clone();
        let mode = match self.phase {
            Phase::One => AggregateMode::SinglePartitioned,
            Phase::Partial => AggregateMode::Partial,
            Phase::Final => AggregateMode::FinalPartitioned,
        };
        AggregateExec::try_new(
            mode,
            PhysicalGroupBy::new_single(vec![(Arc::clone(&self.key), name)]),
            vec![Arc::clone(&self.call)],
            vec![None],
            input,
            Arc::clone(&self.input_schema),
        )
    }

    /// What each row of its input gives the call: the call's arguments, or for a final phase the
    /// partial phase's state columns (after the key).
    fn arguments(&self) -> Result<Vec<Arc<dyn PhysicalExpr>>> {
        if self.phase != Phase::Final {
            return Ok(self.call.expressions());
        }
        let schema = self.input.schema();
        let states = self.call.state_fields()?.len();
        Ok((1..=states).map(|i| Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>).collect())
    }

    /// The schema of a spill file: the key, then the call's state.
    fn spill_schema(&self) -> Result<SchemaRef> {
        let mut fields = vec![Arc::new(Field::new("key", self.key_type.clone(), true))];
        fields.extend(self.call.state_fields()?);
        Ok(Arc::new(Schema::new(fields)))
    }

    /// The most bytes one row adds (a key's entry and the call's growth) and whether that is a
    /// bound (kept columns of fixed width).
    fn bytes_per_row(&self, table: &UnitTable) -> Result<(usize, bool)> {
        let per_key = table.most_bytes_per_unit();
        match self.kind {
            Call::UnitBound => {
                let Some(udf) = self.call.fun().inner().downcast_ref::<UnitBound>() else {
                    return Err(DataFusionError::Internal(format!("{} is not the unit bound", self.call.fun().name())));
                };
                let schema = self.input.schema();
                let types = self.call.expressions().iter().map(|e| e.data_type(&schema)).collect::<Result<Vec<_>>>()?;
                udf.most_bytes_per_row(&types, per_key)
            }
            // One count per key, in chunks.
            Call::Count => Ok((per_key + ChunkedCount::BYTES_PER_GROUP, true)),
        }
    }
}

/// Whether `call` is one the operator runs (when it is its aggregate's only call, grouped by one
/// key of a fixed width).
pub fn runs(call: &AggregateFunctionExpr) -> bool {
    Call::of(call).is_some()
}

/// The calls the operator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// `dpcurve_unit_bound`, grouped by the unit.
    UnitBound,
    /// A partition selection's `count` of candidate groups ([`selected::COUNT_COLUMN`]), grouped
    /// by the group's key.
    Count,
}

impl Call {
    fn of(call: &AggregateFunctionExpr) -> Option<Self> {
        if call.fun().inner().downcast_ref::<UnitBound>().is_some() {
            return Some(Self::UnitBound);
        }
        let counts = call.fun().name() == "count" && call.name() == selected::COUNT_COLUMN && !call.is_distinct();
        counts.then_some(Self::Count)
    }

    fn name(self) -> &'static str {
        match self {
            Self::UnitBound => unit_bound::NAME,
            Self::Count => "count",
        }
    }
}

/// The phase of its aggregate an operator computes. The bound always runs in one phase; a
/// selection's count in one phase over one partition, else in two in this process (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Rows in (all of a key's in its partition), each key's value out.
    One,
    /// A count's partial phase: a partition's rows in, as they come; every [`PARTIAL_WINDOW`] rows
    /// the window's keys and their counts go on, and its table is emptied.
    Partial,
    /// A count's final phase: partial counts exchanged by key in, each key's total out.
    Final,
}

/// Rows of a partition a partial count holds before it passes their keys' counts on: its memory
/// is at most this many keys', whatever the rows (module docs).
pub const PARTIAL_WINDOW: usize = 1 << 15;

impl DisplayAs for PlannedAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PlannedAggregateExec: key={}, aggr=[{}]", self.key, self.kind.name())?;
        match self.rows {
            Some(rows) => write!(f, ", input rows <= {rows}"),
            None => write!(f, ", input rows unknown"),
        }?;
        if let Some(bytes) = self.share {
            write!(f, ", memory <= {bytes}")?;
        }
        match self.phase {
            Phase::One => Ok(()),
            Phase::Partial => write!(f, ", partial, every {PARTIAL_WINDOW} rows"),
            Phase::Final => write!(f, ", final"),
        }
    }
}

impl ExecutionPlan for PlannedAggregateExec {
    fn name(&self) -> &str {
        "PlannedAggregateExec"
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
        apply_each(std::iter::once(&self.key).chain(self.call.expressions().iter()), f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = only_child(children, "PlannedAggregateExec")?;
        Ok(Arc::new(Self { input, metrics: ExecutionPlanMetricsSet::new(), ..self.as_ref().clone() }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let reservation = MemoryConsumer::new(format!("PlannedAggregateExec[{partition}]"))
            .with_can_spill(true)
            .register(context.memory_pool());
        let table = UnitTable::new(&self.key_type)?;
        let accumulator: Box<dyn GroupsAccumulator> = match self.kind {
            Call::UnitBound => groups_accumulators(std::slice::from_ref(&self.call))?.remove(0),
            Call::Count => Box::new(ChunkedCount::new()),
        };
        let (per_row, exact) = self.bytes_per_row(&table)?;
        let batch = context.session_config().batch_size().max(1);
        // The planned share, within the pool's limit if it has one (an executor's pool may not:
        // the share planned by the client still holds there).
        let planned = self.share.map(|share| usize::try_from(share).unwrap_or(usize::MAX));
        let limit = match (context.memory_pool().memory_limit(), planned) {
            (MemoryLimit::Finite(bytes), Some(share)) => Some(share.min(bytes)),
            (MemoryLimit::Finite(bytes), None) => Some(unit_bound::memory_share(bytes)),
            (_, planned) => planned,
        };
        let (table, layout, floor) = match self.phase {
            // A partial count holds at most a window's keys, whatever the share: reserved whole.
            Phase::Partial => {
                let table = table.sized_for(Some(PARTIAL_WINDOW as u64));
                let floor = PARTIAL_WINDOW * per_row + table.most_fixed_bytes(batch) + accumulator.size();
                (table, Layout::Emitting { window: PARTIAL_WINDOW }, floor)
            }
            Phase::One | Phase::Final => {
                // The most units a partition holds at once: all the input's rows, or what its share holds.
                let most_units = [self.rows, limit.map(|l| (l / per_row.max(1)) as u64)].into_iter().flatten().min();
                let table = table.sized_for(most_units);
                let layout = Layout::of(&Facts {
                    rows: self.rows,
                    per_row,
                    exact,
                    fixed: table.most_fixed_bytes(batch) + accumulator.size(),
                    share: limit,
                    partitions: self.properties.partitioning.partition_count().max(1),
                });
                (table, layout, 0)
            }
        };
        let run = Run {
            input: Some(input),
            started: false,
            key: Arc::clone(&self.key),
            arguments: self.arguments()?,
            merges: self.phase == Phase::Final,
            states: self.phase == Phase::Partial,
            table,
            accumulator,
            groups: Vec::new(),
            reservation,
            floor,
            context,
            schema: Arc::clone(&self.schema),
            spill_schema: self.spill_schema()?,
            layout,
            in_window: 0,
            spilled: None,
            files: Vec::new(),
            output: VecDeque::new(),
            spills: MetricBuilder::new(&self.metrics).spill_count(partition),
            splits: MetricBuilder::new(&self.metrics).counter("partition_splits", partition),
            peak: MetricBuilder::new(&self.metrics).gauge("peak_bytes", partition),
        };
        let batches =
            futures::stream::try_unfold(run, |mut run| async move { Ok(run.next().await?.map(|batch| (batch, run))) });
        Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), batches)))
    }
}

/// The public facts a partition's [`Layout`] is chosen from.
#[derive(Debug, Clone, Copy)]
struct Facts {
    /// The most rows the input (all partitions) can have; None: unknown.
    rows: Option<u64>,
    /// The most bytes one row adds to the state, and whether that is a bound (fixed width).
    per_row: usize,
    exact: bool,
    /// The most bytes a partition holds besides its rows' (empty table and accumulator).
    fixed: usize,
    /// The operator's share of the memory limit, for all partitions (None: no limit).
    share: Option<usize>,
    partitions: usize,
}

/// How a partition holds its units, fixed before its first row (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// Every key in memory.
    InMemory,
    /// Samples written every `window` rows to files of `bits[0]` bits; a file of level `l` split
    /// by `bits[l + 1]` more while there is a next level, then merged.
    Spilled { window: usize, bits: Vec<u32> },
    /// A partial phase's: every `window` rows the keys' states are passed on and the table emptied.
    Emitting { window: usize },
}

/// The most bits of all levels together: at most 2¹⁶ last-level files per partition. Every file
/// of a level is split into all of the next level's (module docs), so each level more multiplies
/// the files by 256 whatever the rows; an input whose public bound would need more bits (a
/// declared row bound far above the rows) has last-level files that may hold more than the share —
/// charged beyond the limit, never a failure.
const MOST_BITS: u32 = 2 * LEVEL_BITS;

/// The fewest rows between spills (a limit too small for the fixed bytes is not refused: the
/// accounting is infallible).
const MIN_WINDOW: usize = 1024;

impl Layout {
    fn of(f: &Facts) -> Self {
        let Some(share) = f.share else { return Self::InMemory };
        let per_row = f.per_row.max(1) as f64;
        // All partitions' rows together are at most the input's.
        let most = f.rows.map(|r| r as f64 * per_row + (f.partitions * f.fixed) as f64);
        if f.exact && most.is_some_and(|m| m <= share as f64) {
            return Self::InMemory;
        }
        let own = share / f.partitions;
        let window = (own.saturating_sub(f.fixed) as f64 / per_row) as usize;
        // A last-level file of a maximal input holds a quarter of a partition's share on average.
        let total = f.rows.map_or(f64::INFINITY, |r| r as f64 * per_row);
        let files = (4.0 * total / own.max(1) as f64).max(1.0);
        let mut need = if files.is_finite() { (files.log2().ceil() as u32).min(MOST_BITS) } else { LEVEL_BITS };
        let mut bits = Vec::new();
        loop {
            let b = need.min(LEVEL_BITS);
            bits.push(b);
            need -= b;
            if need == 0 {
                break;
            }
        }
        Self::Spilled { window: window.max(MIN_WINDOW), bits }
    }
}

/// One partition's execution.
struct Run {
    /// The rows, until all are read.
    input: Option<SendableRecordBatchStream>,
    /// Whether the first row was asked for (the spill files are opened then).
    started: bool,
    key: Arc<dyn PhysicalExpr>,
    arguments: Vec<Arc<dyn PhysicalExpr>>,
    /// Whether its input's rows are partial states to merge (a final phase).
    merges: bool,
    /// Whether it emits its keys' states, not their values (a partial phase).
    states: bool,
    table: UnitTable,
    accumulator: Box<dyn GroupsAccumulator>,
    /// Scratch: one batch's group indices.
    groups: Vec<usize>,
    reservation: MemoryReservation,
    /// Bytes held whatever the rows (a partial phase reserves its window's bound whole).
    floor: usize,
    context: Arc<TaskContext>,
    schema: SchemaRef,
    spill_schema: SchemaRef,
    layout: Layout,
    /// Rows read since the last spill.
    in_window: usize,
    /// The level-0 spill files, while rows are read (spilled layout).
    spilled: Option<Partitions>,
    /// Spill files still to split or merge, with their level.
    files: Vec<(Arc<dyn SpillFile>, u32)>,
    /// Emitted batches not yet returned.
    output: VecDeque<RecordBatch>,
    spills: Count,
    splits: Count,
    peak: Gauge,
}

impl Run {
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(batch) = self.output.pop_front() {
                return Ok(Some(batch));
            }
            if self.input.is_some() {
                if !self.started {
                    self.started = true;
                    if let Layout::Spilled { bits, .. } = &self.layout {
                        self.spilled =
                            Some(Partitions::new(0, bits[0], Arc::clone(&self.spill_schema), &self.context)?);
                    }
                    self.charge();
                }
                // One batch at a time: a partial phase's windows go on as they fill.
                let next = self.input.as_mut().expect("checked above").next().await;
                match next {
                    Some(batch) => self.update(&batch?)?,
                    None => {
                        self.input = None;
                        match self.spilled.take() {
                            None => self.emit(false)?,
                            Some(mut partitions) => {
                                self.spill_into(&mut partitions)?;
                                self.files.extend(partitions.finish()?);
                            }
                        }
                    }
                }
                continue;
            }
            let Some((file, level)) = self.files.pop() else {
                self.reservation.free();
                return Ok(None);
            };
            match &self.layout {
                Layout::Spilled { bits, .. } if (level as usize + 1) < bits.len() => {
                    let next = bits[level as usize + 1];
                    self.split(&file, level + 1, next).await?;
                }
                _ => self.merge(&file).await?,
            }
        }
    }

    fn size(&self) -> usize {
        self.table.size() + self.accumulator.size()
    }

    /// Charges what is held now to the pool, infallibly: the layout bounded it before any row (a
    /// partial phase charges its bound whole, whatever it holds).
    fn charge(&mut self) {
        let size = self.size();
        self.reservation.resize(size.max(self.floor));
        self.peak.set_max(size);
    }

    /// Adds a batch's rows, spilling (spilled layout) or passing the keys' states on (a partial
    /// phase's) at every window's last row.
    fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        let window = match &self.layout {
            Layout::InMemory => return self.add(batch),
            Layout::Spilled { window, .. } | Layout::Emitting { window } => *window,
        };
        let mut from = 0;
        while from < batch.num_rows() {
            let take = (batch.num_rows() - from).min(window - self.in_window);
            self.add(&batch.slice(from, take))?;
            (from, self.in_window) = (from + take, self.in_window + take);
            if self.in_window == window {
                if let Layout::Emitting { .. } = self.layout {
                    self.emit(true)?;
                } else {
                    let mut partitions =
                        self.spilled.take().ok_or_else(|| DataFusionError::Internal("no spill files".into()))?;
                    self.spill_into(&mut partitions)?;
                    self.spilled = Some(partitions);
                }
                self.in_window = 0;
            }
        }
        Ok(())
    }

    fn add(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        let key = self.key.evaluate(batch)?.into_array(n)?;
        let arguments =
            self.arguments.iter().map(|e| e.evaluate(batch)?.into_array(n)).collect::<Result<Vec<ArrayRef>>>()?;
        self.table.groups_of(key.as_ref(), &mut self.groups)?;
        if self.merges {
            self.accumulator.merge_batch(&arguments, &self.groups, self.table.len())?;
        } else {
            self.accumulator.update_batch(&arguments, &self.groups, None, self.table.len())?;
        }
        self.charge();
        Ok(())
    }

    /// Writes every key's state to its partition's file and empties the table.
    fn spill_into(&mut self, partitions: &mut Partitions) -> Result<()> {
        self.spills.add(1);
        let parts = self.table.group_partitions(partitions.level, partitions.bits);
        let mut columns = vec![self.table.keys()?];
        columns.extend(self.accumulator.state(EmitTo::All)?);
        self.table.clear();
        partitions.write(&RecordBatch::try_new(Arc::clone(&self.spill_schema), columns)?, &parts)?;
        self.charge();
        Ok(())
    }

    /// Every key's value (a partial phase: its state), in batches of the session's size; empties
    /// the table, keeping its room when more rows follow (`keep_room`) and freeing it otherwise.
    fn emit(&mut self, keep_room: bool) -> Result<()> {
        let mut columns = vec![self.table.keys()?];
        if self.states {
            columns.extend(self.accumulator.state(EmitTo::All)?);
        } else {
            columns.push(self.accumulator.evaluate(EmitTo::All)?);
        }
        if keep_room {
            self.table.clear();
        } else {
            self.table.reset();
        }
        let batch = batch_as(Arc::clone(&self.schema), columns)?;
        let size = self.context.session_config().batch_size().max(1);
        for from in (0..batch.num_rows()).step_by(size) {
            self.output.push_back(batch.slice(from, size.min(batch.num_rows() - from)));
        }
        self.charge();
        Ok(())
    }

    /// Splits one spill file by `level`'s `bits` into files of that level, to merge or split later.
    async fn split(&mut self, file: &Arc<dyn SpillFile>, level: u32, bits: u32) -> Result<()> {
        self.splits.add(1);
        let mut finer = Partitions::new(level, bits, Arc::clone(&self.spill_schema), &self.context)?;
        let mut batches = read_spill(spill_path(file)?, Arc::clone(&self.spill_schema));
        let mut parts = Vec::new();
        while let Some(batch) = batches.next().await {
            let batch = batch?;
            self.table.partitions_of(batch.column(0).as_ref(), level, bits, &mut parts)?;
            finer.write(&batch, &parts)?;
        }
        self.files.extend(finer.finish()?);
        Ok(())
    }

    /// Merges one last-level spill file's states per key and emits them.
    async fn merge(&mut self, file: &Arc<dyn SpillFile>) -> Result<()> {
        let mut batches = read_spill(spill_path(file)?, Arc::clone(&self.spill_schema));
        while let Some(batch) = batches.next().await {
            let batch = batch?;
            self.table.groups_of(batch.column(0).as_ref(), &mut self.groups)?;
            self.accumulator.merge_batch(&batch.columns()[1..], &self.groups, self.table.len())?;
            self.charge();
        }
        self.emit(false)
    }
}

fn spill_path(file: &Arc<dyn SpillFile>) -> Result<PathBuf> {
    let path: &Path = file.path().ok_or_else(|| DataFusionError::Internal("a spill file without a path".into()))?;
    Ok(path.to_path_buf())
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

type Writer = StreamWriter<BufWriter<Box<dyn SpillWriter>>>;

/// The spill files of one level, `2^bits` of them, all opened at once and each written at every
/// spill (an empty batch when no key falls in it): how many files are opened and written
/// depends on the layout and the spills, not on which partitions the units fall in.
struct Partitions {
    level: u32,
    bits: u32,
    schema: SchemaRef,
    files: Vec<(Arc<dyn SpillFile>, Writer)>,
}

impl Partitions {
    fn new(level: u32, bits: u32, schema: SchemaRef, context: &TaskContext) -> Result<Self> {
        let files = (0..1usize << bits)
            .map(|_| {
                let file = context.runtime_env().disk_manager.create_tmp_file("dpcurve planned aggregate")?;
                let writer = StreamWriter::try_new(BufWriter::new(file.open_writer()?), &schema)?;
                Ok((file, writer))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { level, bits, schema, files })
    }

    /// Appends each row of `batch` to the file of its partition `parts[row]`.
    fn write(&mut self, batch: &RecordBatch, parts: &[usize]) -> Result<()> {
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); self.files.len()];
        for (i, &p) in parts.iter().enumerate() {
            rows[p].push(i as u32);
        }
        for ((_, writer), rows) in self.files.iter_mut().zip(rows) {
            let rows = UInt32Array::from(rows);
            let columns = batch.columns().iter().map(|c| take_rows(c, &rows)).collect::<Result<Vec<_>>>()?;
            writer.write(&RecordBatch::try_new(Arc::clone(&self.schema), columns)?)?;
        }
        Ok(())
    }

    /// The files written, finished, with their level.
    fn finish(self) -> Result<Vec<(Arc<dyn SpillFile>, u32)>> {
        let mut done = Vec::new();
        for (file, writer) in self.files {
            let mut out = writer.into_inner()?.into_inner().map_err(|e| DataFusionError::IoError(e.into_error()))?;
            out.finish()?;
            done.push((file, self.level));
        }
        Ok(done)
    }
}

/// `column`'s rows at `rows`. A list (the samples) is taken through its entries: the list kernel
/// extends entry by entry, which costs more than the rest of a spill; its entries' columns have
/// kernels that copy a whole index array at once.
fn take_rows(column: &ArrayRef, rows: &UInt32Array) -> Result<ArrayRef> {
    let Some(list) = column.as_list_opt::<i32>() else { return Ok(take(column, rows, None)?) };
    if list.null_count() > 0 {
        return Ok(take(column, rows, None)?);
    }
    let offsets = list.value_offsets();
    let mut entries = Vec::new();
    let mut lengths = Vec::with_capacity(rows.len());
    for &r in rows.values() {
        let (from, to) = (offsets[r as usize] as u32, offsets[r as usize + 1] as u32);
        entries.extend(from..to);
        lengths.push((to - from) as usize);
    }
    let values = take(list.values(), &UInt32Array::from(entries), None)?;
    let field = match list.data_type() {
        DataType::List(field) => Arc::clone(field),
        other => return Err(DataFusionError::Internal(format!("a list of type {other}"))),
    };
    Ok(Arc::new(ListArray::try_new(field, OffsetBuffer::from_lengths(lengths), values, None)?))
}

/// The bound's one-phase aggregate over rows built in memory, for tests here and of the codecs
/// that send the operator elsewhere.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::functions_aggregate::count::count_udaf;
    use datafusion::logical_expr::AggregateUDF;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::{col, lit};
    use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};

    use crate::guard::ops::sample_order::SampleOrder;
    use crate::guard::ops::selected::COUNT_COLUMN;
    use crate::guard::ops::unit_bound::{UnitArg, UnitBound};

    /// `units` units (every 50th row's unit NULL) of 1–13 rows over 7 groups, in batches of 500
    /// rows: the bound's one-phase aggregate as DataFusion plans it.
    pub fn aggregate(units: i64) -> AggregateExec {
        let rows = units * 7;
        aggregate_of((0..rows).map(|i| (i % 50 != 0).then_some((i * 7919) % units)).collect())
    }

    /// A partition selection's one-phase count over rows of keys `k` (every other column as in
    /// [`aggregate_of`]), grouped by the key.
    pub fn count_of(k: Vec<Option<i64>>) -> AggregateExec {
        let unit = aggregate_of(k);
        let schema = unit.input_schema();
        let count = AggregateExprBuilder::new(count_udaf(), vec![lit(1i64)])
            .schema(Arc::clone(&schema))
            .alias(COUNT_COLUMN)
            .build()
            .unwrap();
        AggregateExec::try_new(
            AggregateMode::SinglePartitioned,
            unit.group_expr().clone(),
            vec![Arc::new(count)],
            vec![None],
            Arc::clone(unit.input()),
            schema,
        )
        .unwrap()
    }

    /// The bound's one-phase aggregate over rows of units `u` (row `i` in group `i·31 mod 7`, of
    /// value `i·13 mod 1009`), in batches of 500 rows.
    pub fn aggregate_of(u: Vec<Option<i64>>) -> AggregateExec {
        let schema = Arc::new(Schema::new(vec![
            Field::new("u", DataType::Int64, true),
            Field::new("g", DataType::Int64, false),
            Field::new("x", DataType::Float64, false),
        ]));
        let rows = u.len() as i64;
        let g = Int64Array::from_iter_values((0..rows).map(|i| i * 31 % 7));
        let x = Float64Array::from_iter_values((0..rows).map(|i| (i * 13 % 1009) as f64));
        let all =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(u)), Arc::new(g), Arc::new(x)])
                .unwrap();
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
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Float64Type, Int64Type};
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionConfig;

    use super::testing::{aggregate, aggregate_of, count_of};
    use super::*;

    /// A task under a memory limit of `memory` bytes (None: no limit), in batches of 300 rows.
    fn context(memory: Option<usize>) -> Arc<TaskContext> {
        let mut runtime = RuntimeEnvBuilder::new();
        if let Some(bytes) = memory {
            runtime = runtime.with_memory_limit(bytes, 1.0);
        }
        let context = TaskContext::default()
            .with_session_config(SessionConfig::new().with_batch_size(300))
            .with_runtime(runtime.build_arc().unwrap());
        Arc::new(context)
    }

    /// Each key's count (NULL key: None).
    async fn counted(plan: Arc<dyn ExecutionPlan>, memory: Option<usize>) -> HashMap<Option<i64>, i64> {
        let mut out = HashMap::new();
        for batch in collect(plan, context(memory)).await.unwrap() {
            let (keys, counts) =
                (batch.column(0).as_primitive::<Int64Type>(), batch.column(1).as_primitive::<Int64Type>());
            for i in 0..batch.num_rows() {
                let key = keys.is_valid(i).then(|| keys.value(i));
                assert!(out.insert(key, counts.value(i)).is_none(), "key {key:?} emitted twice");
            }
        }
        out
    }

    /// Each unit's kept values (NULL unit: None), in the order kept.
    async fn kept(plan: Arc<dyn ExecutionPlan>, memory: Option<usize>) -> HashMap<Option<i64>, Vec<f64>> {
        let mut out = HashMap::new();
        for batch in collect(plan, context(memory)).await.unwrap() {
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

    /// (spills, splits, peak bytes) of a run.
    fn counts(exec: &PlannedAggregateExec) -> (usize, usize, usize) {
        let m = exec.metrics().unwrap();
        let get = |name| m.sum_by_name(name).map_or(0, |v| v.as_usize());
        (m.spill_count().unwrap_or(0), get("partition_splits"), get("peak_bytes"))
    }

    fn exec(agg: &AggregateExec, rows: Option<u64>) -> Arc<PlannedAggregateExec> {
        Arc::new(PlannedAggregateExec::try_new(agg).unwrap().expect("a unit of a fixed-width type").with_rows(rows))
    }

    /// The operator keeps what DataFusion's aggregate keeps, unit by unit — in memory, spilled, and
    /// spilled over two levels of files — and which of these it does follows from the public row
    /// bound and the memory limit.
    #[test]
    fn lists_are_taken_as_the_kernel_takes_them() {
        use datafusion::arrow::array::ListArray;
        let lists =
            [Some(vec![Some(1), Some(2)]), Some(vec![]), Some(vec![Some(3)]), Some(vec![Some(4), None, Some(6)])];
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>(lists);
        let rows = UInt32Array::from(vec![2, 0, 2, 1]);
        for column in [Arc::new(list.clone()) as ArrayRef, Arc::new(list.slice(1, 3))] {
            let taken = take_rows(&column, &rows).unwrap();
            assert_eq!(*taken, *take(&column, &rows, None).unwrap());
            assert_eq!(taken.as_list::<i32>().value_length(1), if column.len() == 4 { 2 } else { 0 });
        }
    }

    #[tokio::test]
    async fn keeps_what_the_aggregate_keeps_in_memory_and_spilled() {
        let agg = aggregate(12_000);
        let rows = Some(84_000);
        let want = kept(Arc::new(agg.clone()), None).await;
        assert!(want.len() > 11_000 && want.contains_key(&None), "units and the NULL unit: {}", want.len());
        assert!(want.values().all(|x| !x.is_empty() && x.len() <= 6));
        // (the pool's limit, the planned share, the input's row bound): spilled, split.
        for (memory, share, rows, spilled, split) in [
            (None, None, rows, false, false),
            (Some(1 << 30), None, rows, false, false),
            (Some(1 << 30), None, None, true, false),
            (Some(16 << 20), None, rows, true, false),
            (Some(1 << 18), None, rows, true, true),
            // A planned share holds in a pool without a limit (a cluster's executor) and within
            // a pool's smaller limit.
            (None, Some(8 << 20), rows, true, false),
            (None, Some(1 << 30), rows, false, false),
            (Some(1 << 20), Some(1 << 30), rows, true, false),
        ] {
            let exec = Arc::new(exec(&agg, rows).as_ref().clone().with_share(share));
            let got = kept(Arc::clone(&exec) as Arc<dyn ExecutionPlan>, memory).await;
            assert!(got == want, "under {memory:?} bytes, a share of {share:?}, {rows:?} rows");
            let (spills, splits, _) = counts(&exec);
            assert_eq!(
                (spills > 0, splits > 0),
                (spilled, split),
                "under {memory:?} bytes, a share of {share:?}, {rows:?} rows: {spills} spills, {splits} splits"
            );
        }
    }

    /// A public bound far above any input (a declared row bound of 2⁵³) splits into at most two
    /// levels, 2¹⁶ last-level files per partition: each level more would multiply the files every
    /// spill writes by 256 whatever the rows. Control: a bound that needs fewer bits gets them all.
    #[test]
    fn a_bound_far_above_the_rows_spills_into_at_most_two_levels() {
        let facts = |rows: u64| Facts {
            rows: Some(rows),
            per_row: 163,
            exact: true,
            fixed: 1 << 10,
            share: Some(1 << 24),
            partitions: 2,
        };
        let bits = |rows| match Layout::of(&facts(rows)) {
            Layout::Spilled { bits, .. } => bits,
            other => panic!("{rows} rows: {other:?}"),
        };
        assert_eq!(bits(1 << 53), [8, 8]);
        assert_eq!(bits(u64::MAX), [8, 8]);
        // 10⁶ rows of 163 bytes in a share of 8 MiB a partition: 4·163 MB / 8 MiB ≈ 78 files, 7 bits.
        assert_eq!(bits(1_000_000), [7]);
        assert_eq!(bits(50_000_000), [8, 4]);
    }

    /// SPEC §0 on neighbouring inputs: the same file with and without one unit's rows (what a
    /// WHERE clause selects), under a memory limit between what their units hold. A bound that
    /// spilled when its units no longer fit would spill for one and not the other; this one spills
    /// and splits the same number of times for both. The control shows the limit does separate
    /// them: the larger one's units alone hold more than it.
    #[tokio::test]
    async fn neighbours_spill_alike_where_their_units_straddle_the_limit() {
        let others: Vec<Option<i64>> = (0..767 * 6).map(|i| Some((i * 7919) % 767)).collect();
        let mut with = others.clone();
        with.extend([Some(10_000); 6]);
        let (d, d1) = (aggregate_of(others), aggregate_of(with));
        let file_rows = Some(767 * 6 + 6);
        // The units' bytes in memory, each input alone.
        let (peak, peak1) = (
            {
                let e = exec(&d, file_rows);
                kept(Arc::clone(&e) as Arc<dyn ExecutionPlan>, None).await;
                counts(&e).2
            },
            {
                let e = exec(&d1, file_rows);
                kept(Arc::clone(&e) as Arc<dyn ExecutionPlan>, None).await;
                counts(&e).2
            },
        );
        assert!(peak1 > peak, "control: {peak} vs {peak1} bytes");
        let limit = (peak + peak1) / 2;
        let (e, e1) = (exec(&d, file_rows), exec(&d1, file_rows));
        let (got, got1) = (
            kept(Arc::clone(&e) as Arc<dyn ExecutionPlan>, Some(limit)).await,
            kept(Arc::clone(&e1) as Arc<dyn ExecutionPlan>, Some(limit)).await,
        );
        assert_eq!((got.len() + 1, got1.len()), (768, 768));
        let ((spills, splits, _), (spills1, splits1, _)) = (counts(&e), counts(&e1));
        assert_eq!((spills, splits), (spills1, splits1), "under {limit} bytes");
        assert!(spills > 0, "the limit is below what the input's rows could hold");
    }

    /// A selection's count in two phases — partial counts passed on every [`PARTIAL_WINDOW`] rows,
    /// exchanged by key, added up — gives the one phase's counts, over few keys and over keys that
    /// fill every window; a partial phase holds at most a window's keys, which bounds its memory
    /// whatever the rows, and it passes on no more rows than a window has keys.
    #[tokio::test]
    async fn a_count_in_two_phases_counts_as_one_phase_does() {
        use crate::guard::exec::unit_phase::UnitExchangeExec;
        let rows = 3 * PARTIAL_WINDOW as i64 + 17;
        for keys in [100, 1_000_000] {
            let one = count_of((0..rows).map(|i| (i % 97 != 0).then_some((i * 7919) % keys)).collect());
            let want = counted(Arc::new(one.clone()), None).await;
            assert_eq!(want.values().sum::<i64>(), rows);
            let partial = AggregateExec::try_new(
                AggregateMode::Partial,
                one.group_expr().clone(),
                one.aggr_expr().to_vec(),
                vec![None],
                Arc::clone(one.input()),
                one.input_schema(),
            )
            .unwrap();
            let partial =
                Arc::new(PlannedAggregateExec::try_new(&partial).unwrap().unwrap().with_rows(Some(rows as u64)));
            assert_eq!(partial.phase(), Phase::Partial);
            let key = datafusion::physical_expr::expressions::col("u", &partial.schema()).unwrap();
            let exchanged = Arc::new(UnitExchangeExec::new(Arc::clone(&partial) as _, vec![key], 3));
            let total = AggregateExec::try_new(
                AggregateMode::FinalPartitioned,
                one.group_expr().as_final(),
                one.aggr_expr().to_vec(),
                vec![None],
                exchanged,
                one.input_schema(),
            )
            .unwrap();
            let total = exec(&total, Some(rows as u64));
            assert_eq!(total.phase(), Phase::Final);
            let got = counted(Arc::clone(&total) as Arc<dyn ExecutionPlan>, None).await;
            assert!(got == want, "{keys} keys: {} counts against {}", got.len(), want.len());
            // What the partial phase held and passed on.
            let table = UnitTable::new(&DataType::Int64).unwrap();
            let (per_row, _) = partial.bytes_per_row(&table).unwrap();
            let bound = PARTIAL_WINDOW * per_row + table.most_fixed_bytes(300) + 64 * 1024;
            let peak = counts(&partial).2;
            assert!(peak <= bound, "{keys} keys: {peak} > {bound} bytes");
            let alone = Arc::new(partial.as_ref().clone()) as Arc<dyn ExecutionPlan>;
            let passed: usize = collect(alone, context(None)).await.unwrap().iter().map(RecordBatch::num_rows).sum();
            if keys == 100 {
                assert!(passed <= 4 * 101, "four windows of at most 101 keys: {passed} rows");
            } else {
                // Control: nearly every row's key is new to its window (1 in 97 is NULL), and a
                // window of such keys holds nearly what the bound allows.
                assert!(
                    passed as i64 * 100 > rows * 95 && peak * 2 > PARTIAL_WINDOW * per_row,
                    "{passed} rows, {peak} bytes"
                );
            }
        }
    }

    /// A partition selection's count: the counts DataFusion's aggregate gives, in memory and
    /// spilled; its bytes per row bound what it holds; and neighbouring inputs whose candidate
    /// groups straddle the limit spill alike (one more group used to make the count spill).
    #[tokio::test]
    async fn counts_as_the_aggregate_does_and_neighbours_spill_alike() {
        let keys = |n: i64| (0..n * 6).map(|i| (i % 97 != 0).then_some((i * 7919) % n)).collect::<Vec<_>>();
        let (d, file_rows) = (count_of(keys(20_000)), Some(120_000));
        let want = counted(Arc::new(d.clone()), None).await;
        assert!(want.len() == 20_001 && want.values().sum::<i64>() == 120_000, "{}", want.len());
        for (memory, rows, spilled) in
            [(None, file_rows, false), (Some(64 << 20), file_rows, false), (Some(1 << 20), file_rows, true)]
        {
            let e = exec(&d, rows);
            assert!(counted(Arc::clone(&e) as Arc<dyn ExecutionPlan>, memory).await == want, "under {memory:?} bytes");
            assert_eq!(counts(&e).0 > 0, spilled, "under {memory:?} bytes");
        }
        // Every row a key of its own: what it holds stays within the rows' bound.
        let distinct = count_of((0..50_000).map(Some).collect());
        let e = exec(&distinct, Some(50_000));
        counted(Arc::clone(&e) as Arc<dyn ExecutionPlan>, None).await;
        let table = UnitTable::new(&DataType::Int64).unwrap();
        let (per_row, exact) = e.bytes_per_row(&table).unwrap();
        let fixed = table.most_fixed_bytes(300) + 64;
        let peak = counts(&e).2;
        assert!(exact && peak <= 50_000 * per_row + fixed, "{peak} > 50 000 × {per_row} + {fixed}");
        assert!(peak * 4 > 50_000 * per_row, "control: the bound is not loose ({peak} vs {per_row} per row)");
        // Neighbours: one more candidate group, the limit between what each holds. What a count
        // holds steps up where its vectors double or the new key's shard of the table grows:
        // find a key count where one more key steps up.
        let peak = |agg: AggregateExec, rows: u64| async move {
            let e = exec(&agg, Some(rows));
            counted(Arc::clone(&e) as Arc<dyn ExecutionPlan>, None).await;
            counts(&e).2
        };
        // The same rows but six: an existing group's or a new one's (so the rows read are equal
        // and only the groups differ), under the same bound on the rows.
        let pair = |lo: i64| {
            let (mut without, mut with) = (keys(lo), keys(lo));
            without.extend([Some(0); 6]);
            with.extend([Some(10_000_000); 6]);
            (count_of(without), count_of(with))
        };
        let rows = 1100 * 6 + 6;
        let file_rows = Some(rows);
        let mut found = None;
        for lo in 1010..1040 {
            let (d, d1) = pair(lo);
            let peaks = [peak(d.clone(), rows).await, peak(d1.clone(), rows).await];
            assert!(peaks[1] >= peaks[0], "{peaks:?} bytes");
            if peaks[1] > peaks[0] {
                found = Some((lo, d, d1, peaks));
                break;
            }
        }
        let (lo, d, d1, peaks) = found.expect("control: one more key steps up what the count holds");
        let limit = (peaks[0] + peaks[1]) / 2;
        let (e, e1) = (exec(&d, file_rows), exec(&d1, file_rows));
        let (got, got1) = (
            counted(Arc::clone(&e) as Arc<dyn ExecutionPlan>, Some(limit)).await,
            counted(Arc::clone(&e1) as Arc<dyn ExecutionPlan>, Some(limit)).await,
        );
        assert_eq!((got.len() + 1, got1.len()), (lo as usize + 2, lo as usize + 2));
        let ((spills, splits, _), (spills1, splits1, _)) = (counts(&e), counts(&e1));
        assert_eq!((spills, splits), (spills1, splits1), "under {limit} bytes");
        assert!(spills > 0, "the limit is below what the input's rows could hold");
    }
}
