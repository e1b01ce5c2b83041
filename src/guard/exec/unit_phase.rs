//! The privacy-unit bound in one phase: rows sent to the partition of their unit, then each
//! unit bounded once (SPEC §7).
//!
//! DataFusion plans the bound's aggregate in two phases: a partial sample of every unit per
//! file partition, merged after a repartition of the samples. Each phase offers rows to the
//! unit's sample (most of the bound's cost: a unit's `L` smallest group orders change about
//! `L·ln(rows/L)` times), so with P partitions a unit is sampled P + 1 times. In one process
//! [`single_phase_aggregates`] plans it once instead: the rows go to the partition of their unit
//! ([`UnitExchangeExec`]) and one aggregate per partition bounds each unit it receives (DataFusion's
//! `SinglePartitioned` mode, run by [`PlannedAggregateExec`] when the unit is of a fixed-width type — the
//! unit's value or its hash, always). The kept rows are the same (the bound does not depend on batches or
//! partitions).
//!
//! A partition selection's first pass, a count grouped by the candidate key, is run by the same
//! operator: DataFusion's count would spill when the candidate groups no longer fit. In this
//! process it keeps two phases — a partial count per file partition passing on each window's keys
//! and counts, the counts exchanged by key, a final count adding them — since a key's rows, unlike
//! a unit's, need not meet to be counted; on a cluster, one phase over rows shuffled by key. Over
//! one partition DataFusion plans either aggregate in one phase of its own (`Single`), which the
//! operator replaces too.
//!
//! On a cluster the same one phase runs on the executors, over rows the cluster shuffles by unit
//! ([`Exchange::Shuffle`]). DataFusion's two phases would merge the samples in its hash aggregate,
//! which spills (or, on an executor without a memory limit, grows) when the units no longer fit:
//! a threshold of units, observable in the running time (SPEC §0). [`PlannedAggregateExec`] plans its
//! memory from public facts wherever it runs.
//!
//! The exchange has **bounded** queues. DataFusion's `RepartitionExec` lets a queue grow while
//! another is empty (to avoid deadlocks between consumers that wait on each other); routed by
//! unit, one large unit would then be buffered in memory while its partition's bound works
//! through it — memory growing with one unit's rows, which the bound exists to prevent. Here a
//! sender waits while its destination holds [`QUEUE_BATCHES`] batches, so what is buffered is at
//! most that many batches per queue whatever the units. Waiting is safe because each queue has
//! one consumer, the bound's aggregate, which reads its input to the end before it emits, and
//! every operator above it polls all of its partitions concurrently.

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::UInt32Array;
use datafusion::arrow::compute::take_arrays;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::hash_utils::create_hashes;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::repartition::{REPARTITION_RANDOM_STATE, RepartitionExec};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
};
use futures::StreamExt;
use tokio::sync::mpsc;

use super::node::{apply_each, only_child};
use super::planned_aggregate::{self, Phase, PlannedAggregateExec};

/// Batches a queue of the exchange holds before its senders wait.
pub const QUEUE_BATCHES: usize = 2;

/// How the rows reach the partition of their unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// In this process: [`UnitExchangeExec`], with bounded queues (module docs).
    InProcess,
    /// On a cluster: DataFusion's hash `RepartitionExec`, which the cluster's planner cuts into a
    /// shuffle stage (its writers spill every so many buffered bytes, its readers read files), so
    /// a unit's rows meet on one executor whatever the file layout.
    Shuffle,
}

/// Replaces every two-phase aggregate that [`PlannedAggregateExec`] runs — the unit bound and a
/// partition selection's count (partial → repartition of states → final) — by one phase over rows
/// sent by `exchange` to the partition of their key (module docs), run by that operator, except a
/// count in this process, whose two phases that operator runs with [`UnitExchangeExec`] between
/// them; and the same aggregate planned in one phase over one partition (`Single`) by that operator
/// over it. Other plans are returned unchanged.
pub fn single_phase_aggregates(plan: Arc<dyn ExecutionPlan>, exchange: Exchange) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(last) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        if !last.aggr_expr().iter().any(|e| planned_aggregate::runs(e)) {
            return Ok(Transformed::no(node));
        }
        let (input, first) = match last.mode() {
            AggregateMode::Single if last.input().output_partitioning().partition_count() == 1 => {
                (Arc::clone(last.input()), last)
            }
            AggregateMode::FinalPartitioned => {
                let Some(states) = last.input().downcast_ref::<RepartitionExec>() else {
                    return Ok(Transformed::no(node));
                };
                let Partitioning::Hash(state_keys, partitions) = states.partitioning() else {
                    return Ok(Transformed::no(node));
                };
                let Some(first) = states.input().downcast_ref::<AggregateExec>() else {
                    return Ok(Transformed::no(node));
                };
                if *first.mode() != AggregateMode::Partial {
                    return Ok(Transformed::no(node));
                }
                // A selection's count in this process: counted per partition as the rows come,
                // the partial counts exchanged by key and added up (module docs).
                if exchange == Exchange::InProcess
                    && let Some(partial) = PlannedAggregateExec::try_new(first)?
                    && partial.phase() == Phase::Partial
                {
                    let exchanged = Arc::new(UnitExchangeExec::new(Arc::new(partial), state_keys.clone(), *partitions));
                    let total = same_calls(last, AggregateMode::FinalPartitioned, exchanged)?;
                    if let Some(total) = PlannedAggregateExec::try_new(&total)? {
                        return Ok(Transformed::yes(Arc::new(total) as Arc<dyn ExecutionPlan>));
                    }
                }
                let keys = first.group_expr().expr().iter().map(|(e, _)| Arc::clone(e)).collect();
                let input = Arc::clone(first.input());
                let rows: Arc<dyn ExecutionPlan> = match exchange {
                    Exchange::InProcess => Arc::new(UnitExchangeExec::new(input, keys, *partitions)),
                    Exchange::Shuffle => {
                        Arc::new(RepartitionExec::try_new(input, Partitioning::Hash(keys, *partitions))?)
                    }
                };
                (rows, first)
            }
            _ => return Ok(Transformed::no(node)),
        };
        let one = same_calls(first, AggregateMode::SinglePartitioned, input)?;
        // The same aggregate with its own key table and planned spill, when it can hold the key.
        Ok(Transformed::yes(match PlannedAggregateExec::try_new(&one)? {
            Some(own) => Arc::new(own) as Arc<dyn ExecutionPlan>,
            None => Arc::new(one),
        }))
    })
    .map(|t| t.data)
}

/// `agg`'s groups and calls in `mode` over `input` (its rows' schema unchanged).
fn same_calls(agg: &AggregateExec, mode: AggregateMode, input: Arc<dyn ExecutionPlan>) -> Result<AggregateExec> {
    AggregateExec::try_new(
        mode,
        agg.group_expr().clone(),
        agg.aggr_expr().to_vec(),
        agg.filter_expr().to_vec(),
        input,
        agg.input_schema(),
    )
}

/// Rows sent to the output partition of their unit's hash (DataFusion's hash partitioning, so the
/// partition is a function of the unit's value), through queues of at most [`QUEUE_BATCHES`]
/// batches (module docs).
pub struct UnitExchangeExec {
    input: Arc<dyn ExecutionPlan>,
    units: Vec<Arc<dyn PhysicalExpr>>,
    properties: Arc<PlanProperties>,
    /// Batches a queue holds before its senders wait ([`QUEUE_BATCHES`]).
    queue: usize,
    /// Started by the first `execute`: each output partition's queue, taken by its stream.
    running: Mutex<Option<Running>>,
}

struct Running {
    outputs: Vec<Option<mpsc::Receiver<Result<RecordBatch>>>>,
    senders: Arc<Vec<SpawnedTask<()>>>,
}

impl fmt::Debug for UnitExchangeExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitExchangeExec {{ partitions: {} }}", self.partitions())
    }
}

impl UnitExchangeExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, units: Vec<Arc<dyn PhysicalExpr>>, partitions: usize) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::Hash(units.clone(), partitions),
            input.pipeline_behavior(),
            input.boundedness(),
        ));
        Self { input, units, properties, queue: QUEUE_BATCHES, running: Mutex::new(None) }
    }

    fn partitions(&self) -> usize {
        self.properties.partitioning.partition_count()
    }

    /// Starts one sender per input partition (each routes its batches' rows by unit).
    fn start(&self, context: &Arc<TaskContext>) -> Result<Running> {
        let n = self.partitions();
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(self.queue)).unzip();
        let mut senders = Vec::new();
        for p in 0..self.input.output_partitioning().partition_count() {
            let mut input = self.input.execute(p, Arc::clone(context))?;
            let mut router = Router::new(self.units.clone(), n);
            let txs = txs.clone();
            senders.push(SpawnedTask::spawn(async move {
                while let Some(batch) = input.next().await {
                    let routed = batch.and_then(|b| router.route(&b));
                    match routed {
                        Ok(parts) => {
                            for (to, part) in parts {
                                // A closed queue: its consumer is gone (the query ended); the
                                // other partitions still want their rows.
                                let _ = txs[to].send(Ok(part)).await;
                            }
                        }
                        Err(e) => {
                            let e = Arc::new(e);
                            for tx in &txs {
                                let _ = tx.send(Err(DataFusionError::Shared(Arc::clone(&e)))).await;
                            }
                            return;
                        }
                    }
                    if txs.iter().all(mpsc::Sender::is_closed) {
                        return;
                    }
                }
            }));
        }
        Ok(Running { outputs: rxs.into_iter().map(Some).collect(), senders: Arc::new(senders) })
    }
}

/// Each row's output partition, as DataFusion's hash partitioning computes it (`RepartitionExec`'s
/// hash of the unit, modulo the partitions), and a batch's rows in one `take`, grouped by
/// partition in their order ([`grouped`]), where DataFusion's partitioner pushes each row's index
/// onto its partition's vector (a load, a compare and a store of the vector's length per row)
/// and then concatenates them.
struct Router {
    units: Vec<Arc<dyn PhysicalExpr>>,
    partitions: usize,
    hashes: Vec<u64>,
    of: Vec<u32>,
}

/// The rows' indices grouped by partition (`of[i]` is row i's), each partition's in row order, and
/// where each partition's start (`partitions + 1` offsets). Up to [`PASSES_UP_TO`] partitions, one
/// pass per partition writes every index and advances only past its own (no branch, no counter in
/// memory); more partitions are counted, then placed (a counting sort).
fn grouped(of: &[u32], partitions: usize) -> (Vec<u32>, Vec<usize>) {
    let rows = of.len();
    let mut start = vec![0usize; partitions + 1];
    if partitions <= PASSES_UP_TO {
        // One slot past the rows: a pass writes at its next position whether or not the row is
        // its own, and the last pass's last write may fall there.
        let mut order = vec![0u32; rows + 1];
        let mut at = 0;
        for (p, first) in start.iter_mut().take(partitions).enumerate() {
            *first = at;
            for (i, &q) in of.iter().enumerate() {
                order[at] = i as u32;
                at += usize::from(q == p as u32);
            }
        }
        start[partitions] = at;
        order.truncate(rows);
        return (order, start);
    }
    for &p in of {
        start[p as usize + 1] += 1;
    }
    for p in 0..partitions {
        start[p + 1] += start[p];
    }
    let mut at = start.clone();
    let mut order = vec![0u32; rows];
    for (i, &p) in of.iter().enumerate() {
        order[at[p as usize]] = i as u32;
        at[p as usize] += 1;
    }
    (order, start)
}

/// Partitions up to which [`grouped`] makes one pass per partition.
const PASSES_UP_TO: usize = 8;

impl Router {
    fn new(units: Vec<Arc<dyn PhysicalExpr>>, partitions: usize) -> Self {
        assert!(partitions > 0 && partitions <= u32::MAX as usize, "partitions");
        Self { units, partitions, hashes: Vec::new(), of: Vec::new() }
    }

    /// `batch`'s rows as one batch per partition that has any, in row order.
    fn route(&mut self, batch: &RecordBatch) -> Result<Vec<(usize, RecordBatch)>> {
        let rows = batch.num_rows();
        if self.partitions == 1 {
            return Ok(if rows > 0 { vec![(0, batch.clone())] } else { Vec::new() });
        }
        let arrays = self.units.iter().map(|e| e.evaluate(batch)?.into_array(rows)).collect::<Result<Vec<_>>>()?;
        self.hashes.clear();
        self.hashes.resize(rows, 0);
        create_hashes(&arrays, REPARTITION_RANDOM_STATE.random_state(), &mut self.hashes)?;
        let n = self.partitions as u64;
        self.of.clear();
        if n.is_power_of_two() {
            self.of.extend(self.hashes.iter().map(|h| (h & (n - 1)) as u32));
        } else {
            self.of.extend(self.hashes.iter().map(|h| (h % n) as u32));
        }
        let (order, start) = grouped(&self.of, self.partitions);
        let columns = take_arrays(batch.columns(), &UInt32Array::from(order), None)?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let grouped = RecordBatch::try_new_with_options(batch.schema(), columns, &options)?;
        Ok((0..self.partitions)
            .filter(|&p| start[p + 1] > start[p])
            .map(|p| (p, grouped.slice(start[p], start[p + 1] - start[p])))
            .collect())
    }
}

impl DisplayAs for UnitExchangeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "UnitExchangeExec: partitioning={}, queue={} batches", self.properties.partitioning, self.queue)
    }
}

impl ExecutionPlan for UnitExchangeExec {
    fn name(&self) -> &str {
        "UnitExchangeExec"
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
        apply_each(&self.units, f)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = only_child(children, "UnitExchangeExec")?;
        Ok(Arc::new(Self::new(input, self.units.clone(), self.partitions())))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut running = self.running.lock().map_err(|_| DataFusionError::Internal("exchange poisoned".into()))?;
        if running.is_none() {
            *running = Some(self.start(&context)?);
        }
        let Running { outputs, senders } = running.as_mut().expect("started above");
        let Some(mut rx) = outputs.get_mut(partition).and_then(Option::take) else {
            return Err(DataFusionError::Internal(format!("UnitExchangeExec: partition {partition} executed twice")));
        };
        // The stream keeps the senders alive; the last stream dropped stops them.
        let senders = Arc::clone(senders);
        let batches = futures::stream::poll_fn(move |cx| {
            let _alive = &senders;
            rx.poll_recv(cx)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), batches)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
    use datafusion::execution::TaskContext;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};

    use super::*;

    /// One partition of `batches` batches of `rows` rows, unit `unit(batch, row)`; counts the
    /// batches taken from it, and fails at batch `fail` if given.
    struct Source {
        schema: SchemaRef,
        batches: usize,
        rows: usize,
        unit: fn(usize, usize) -> i64,
        fail: Option<usize>,
        taken: Arc<AtomicUsize>,
        properties: Arc<PlanProperties>,
    }

    impl Source {
        fn new(batches: usize, rows: usize, unit: fn(usize, usize) -> i64, fail: Option<usize>) -> Arc<Self> {
            let schema = Arc::new(Schema::new(vec![Field::new("u", DataType::Int64, false)]));
            let properties = Arc::new(PlanProperties::new(
                EquivalenceProperties::new(Arc::clone(&schema)),
                Partitioning::UnknownPartitioning(1),
                EmissionType::Incremental,
                Boundedness::Bounded,
            ));
            Arc::new(Self { schema, batches, rows, unit, fail, taken: Arc::default(), properties })
        }
    }

    impl fmt::Debug for Source {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Source")
        }
    }

    impl DisplayAs for Source {
        fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("Source")
        }
    }

    impl ExecutionPlan for Source {
        fn name(&self) -> &str {
            "Source"
        }

        fn properties(&self) -> &Arc<PlanProperties> {
            &self.properties
        }

        fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
            vec![]
        }

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
        ) -> Result<TreeNodeRecursion> {
            Ok(TreeNodeRecursion::Continue)
        }

        fn with_new_children(self: Arc<Self>, _c: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
            Ok(self)
        }

        fn execute(&self, _partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
            let (schema, rows, unit, fail, taken) =
                (Arc::clone(&self.schema), self.rows, self.unit, self.fail, Arc::clone(&self.taken));
            let batches = futures::stream::iter(0..self.batches).map(move |b| {
                taken.fetch_add(1, Ordering::SeqCst);
                if fail == Some(b) {
                    return Err(DataFusionError::Execution("the source failed".into()));
                }
                let units = Int64Array::from_iter_values((0..rows).map(|r| unit(b, r)));
                Ok(RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(units)])?)
            });
            Ok(Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), batches)))
        }
    }

    fn exchange(source: &Arc<Source>, partitions: usize) -> UnitExchangeExec {
        let unit = col("u", &source.schema).unwrap();
        UnitExchangeExec::new(Arc::clone(source) as Arc<dyn ExecutionPlan>, vec![unit], partitions)
    }

    async fn units(stream: SendableRecordBatchStream) -> Result<Vec<i64>> {
        let batches: Vec<RecordBatch> = stream.collect::<Vec<_>>().await.into_iter().collect::<Result<_>>()?;
        Ok(batches.iter().flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec()).collect())
    }

    /// Every row arrives once, and all rows of a unit in the same partition.
    #[tokio::test]
    async fn every_row_goes_once_to_its_units_partition() {
        let source = Source::new(40, 100, |b, r| ((b * 100 + r) % 997) as i64, None);
        let exchange = exchange(&source, 3);
        let ctx = Arc::new(TaskContext::default());
        let streams: Vec<_> = (0..3).map(|p| exchange.execute(p, Arc::clone(&ctx)).unwrap()).collect();
        let parts = futures::future::join_all(streams.into_iter().map(units)).await;
        let parts: Vec<Vec<i64>> = parts.into_iter().collect::<Result<_>>().unwrap();
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 4000);
        assert!(parts.iter().all(|p| !p.is_empty()), "997 units over 3 partitions");
        for (p, part) in parts.iter().enumerate() {
            for (q, other) in parts.iter().enumerate().filter(|(q, _)| *q != p) {
                assert!(part.iter().all(|u| !other.contains(u)), "a unit in partitions {p} and {q}");
            }
        }
        let mut all: Vec<i64> = parts.concat();
        all.sort_unstable();
        let mut expected: Vec<i64> = (0..4000).map(|i| (i % 997) as i64).collect();
        expected.sort_unstable();
        assert_eq!(all, expected);
        assert!(exchange.execute(0, ctx).is_err(), "a partition executes once");
    }

    /// The router sends each row where DataFusion's hash partitioner does, in the same order, for
    /// power-of-two partition counts and others, NULL units, several unit columns and one row.
    #[test]
    fn rows_go_where_datafusions_hash_partitioning_sends_them() {
        use datafusion::arrow::array::StringArray;
        use datafusion::physical_plan::metrics::Time;
        use datafusion::physical_plan::repartition::BatchPartitioner;
        let schema = Arc::new(Schema::new(vec![
            Field::new("u", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("i", DataType::Int64, false),
        ]));
        for rows in [1usize, 7, 1000] {
            let u = Int64Array::from_iter((0..rows).map(|i| (i % 11 != 3).then_some((i * 7919 % 503) as i64)));
            let s = StringArray::from_iter((0..rows).map(|i| (i % 5 != 0).then(|| format!("k{}", i % 37))));
            let i = Int64Array::from_iter_values(0..rows as i64);
            let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(u), Arc::new(s), Arc::new(i)]).unwrap();
            for units in [vec!["u"], vec!["u", "s"]] {
                let exprs: Vec<Arc<dyn PhysicalExpr>> = units.iter().map(|c| col(c, &schema).unwrap()).collect();
                for partitions in [1, 2, 3, 4, 7, 8, 9, 16] {
                    let ours = Router::new(exprs.clone(), partitions).route(&batch).unwrap();
                    let mut theirs =
                        BatchPartitioner::new_hash_partitioner(exprs.clone(), partitions, Time::new()).unwrap();
                    let theirs: Vec<(usize, RecordBatch)> =
                        theirs.partition_iter(batch.clone()).unwrap().collect::<Result<_>>().unwrap();
                    let rows_of = |parts: &[(usize, RecordBatch)]| -> Vec<(usize, Vec<i64>)> {
                        let mut out: Vec<_> = parts
                            .iter()
                            .map(|(p, b)| (*p, b.column(2).as_primitive::<Int64Type>().values().to_vec()))
                            .collect();
                        out.sort();
                        out
                    };
                    assert_eq!(rows_of(&ours), rows_of(&theirs), "{rows} rows by {units:?} over {partitions}");
                    for (_, b) in &ours {
                        assert_eq!(b.schema(), schema);
                    }
                }
            }
        }
    }

    /// Polls each partition of `exchange` (one unit in every row of `source`) up to its first
    /// batch, yielding to the senders in between; returns whether each ended and how many input
    /// batches were read by then, then reads everything and checks that every row arrived.
    async fn read_while_one_partition_waits(source: &Arc<Source>, exchange: &UnitExchangeExec) -> (Vec<bool>, usize) {
        let ctx = Arc::new(TaskContext::default());
        let mut streams: Vec<_> = (0..2).map(|p| exchange.execute(p, Arc::clone(&ctx)).unwrap()).collect();
        let mut ends = Vec::new();
        for s in &mut streams {
            let mut ended = false;
            for _ in 0..2000 {
                tokio::task::yield_now().await;
                match futures::poll!(s.next()) {
                    std::task::Poll::Ready(None) => {
                        ended = true;
                        break;
                    }
                    std::task::Poll::Ready(Some(b)) => {
                        assert_eq!(b.unwrap().num_rows(), source.rows);
                        break;
                    }
                    std::task::Poll::Pending => {}
                }
            }
            ends.push(ended);
        }
        let taken = source.taken.load(Ordering::SeqCst);
        let rows: usize =
            futures::future::join_all(streams.into_iter().map(units)).await.into_iter().map(|u| u.unwrap().len()).sum();
        assert_eq!(rows + source.rows, source.batches * source.rows, "every row but the batch polled above");
        (ends, taken)
    }

    /// One unit in every row: while its partition is not read, the senders wait — the input is
    /// read no further than the queue's batches (and one batch in hand) instead of being buffered
    /// whole, and the partition without rows cannot end; once it is read, everything arrives.
    /// Control: with queues as long as the input, the same schedule reads the input whole.
    #[tokio::test]
    async fn a_large_unit_waits_in_its_queue_instead_of_filling_memory() {
        let source = Source::new(200, 50, |_, _| 7, None);
        let (ends, taken) = read_while_one_partition_waits(&source, &exchange(&source, 2)).await;
        assert!(taken <= QUEUE_BATCHES + 3, "{taken} of 200 batches read while the unit's partition waited");
        assert_eq!(ends, [false, false], "no partition ends while the senders wait");
        let source = Source::new(200, 50, |_, _| 7, None);
        let unbounded = UnitExchangeExec { queue: 1000, ..exchange(&source, 2) };
        let (ends, taken) = read_while_one_partition_waits(&source, &unbounded).await;
        assert_eq!(taken, 200, "the control buffers the whole input");
        assert!(ends.contains(&true), "the control's empty partition ends");
    }

    /// An input error reaches every partition.
    #[tokio::test]
    async fn an_input_error_reaches_every_partition() {
        let source = Source::new(10, 20, |b, r| (b * 20 + r) as i64, Some(4));
        let exchange = exchange(&source, 2);
        let ctx = Arc::new(TaskContext::default());
        let streams: Vec<_> = (0..2).map(|p| exchange.execute(p, Arc::clone(&ctx)).unwrap()).collect();
        for err in futures::future::join_all(streams.into_iter().map(units)).await {
            let err = err.unwrap_err();
            assert!(err.to_string().contains("the source failed"), "{err}");
        }
    }
}
