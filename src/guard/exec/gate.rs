//! The execution gate: the root of every plan that reads a private table. On execution it
//! debits the ledger — atomically and durably — before any child operator is created,
//! so no row is read unless the budget was paid. Errors raised while private rows are
//! being read are replaced by a message without their details.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::{FutureExt, StreamExt, TryStreamExt};

use super::node::only_child;
use super::selection_stage::SelectionStage;
use crate::functions::{PermitSlot, ReleaseStore};
use crate::mechanism::stored::Recipe;
use crate::policy::{Catalog, Charge, QueryRecord};

impl crate::functions::releases::ReleaseReader for Catalog {
    fn load(&self, id: &str) -> std::result::Result<Option<Recipe>, String> {
        match self.stored_release(id).map_err(|e| e.to_string())? {
            None => Ok(None),
            Some((function, parameters, data)) => Recipe::decode(&function, &parameters, &data).map(Some),
        }
    }
}

/// The stored releases one session may read: an analyst's own, or all of them in
/// the table owner's sessions.
#[derive(Debug)]
pub struct ScopedReleases {
    /// The catalog.
    pub catalog: Arc<Catalog>,
    /// The session's analyst (None: the table owner's session).
    pub analyst: Option<String>,
}

impl crate::functions::releases::ReleaseReader for ScopedReleases {
    fn load(&self, id: &str) -> std::result::Result<Option<Recipe>, String> {
        match self.catalog.stored_release_of(id, self.analyst.as_deref()).map_err(|e| e.to_string())? {
            None => Ok(None),
            Some((function, parameters, data)) => Recipe::decode(&function, &parameters, &data).map(Some),
        }
    }
}

impl ReleaseStore for Catalog {
    fn store(
        &self,
        first_id: i64,
        charge: i64,
        table: &str,
        recipes: &[&Recipe],
    ) -> std::result::Result<Vec<String>, String> {
        let encoded: Vec<(&str, String, Vec<u8>)> =
            recipes.iter().map(|r| (r.function(), r.parameters(), r.data())).collect();
        let rows =
            encoded.iter().enumerate().map(|(i, (f, p, d))| (Some(first_id + i as i64), *f, p.as_str(), d.as_slice()));
        self.store_releases(charge, table, rows).map_err(|e| e.to_string())
    }
}

/// Debits `charges` once per execution, grants each priced call one release permit, then
/// runs `input` (always one output partition, so every `execute` is one execution and pays).
#[derive(Debug)]
pub struct BudgetGateExec {
    input: Arc<dyn ExecutionPlan>,
    ledger: Arc<Catalog>,
    charges: Arc<Vec<Charge>>,
    slots: Arc<Vec<Arc<PermitSlot>>>,
    query: Arc<QueryRecord>,
    /// Partition selections to run after the debit, before the input (SPEC §7).
    stages: Arc<Vec<SelectionStage>>,
    /// Whose share is charged besides the tables' totals (None: the table owner's session).
    analyst: Option<Arc<str>>,
}

impl BudgetGateExec {
    /// Wraps `input`; multi-partition inputs are coalesced first.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        ledger: Arc<Catalog>,
        charges: Vec<Charge>,
        slots: Vec<Arc<PermitSlot>>,
        query: Arc<QueryRecord>,
    ) -> Self {
        let input: Arc<dyn ExecutionPlan> = if input.output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(input))
        } else {
            input
        };
        Self {
            input,
            ledger,
            charges: Arc::new(charges),
            slots: Arc::new(slots),
            query,
            stages: Arc::new(Vec::new()),
            analyst: None,
        }
    }

    /// The same gate, charging `analyst`'s shares too.
    pub fn with_analyst(self, analyst: Option<Arc<str>>) -> Self {
        Self { analyst, ..self }
    }

    /// The same gate, running `stages` (partition selections) after the debit.
    pub fn with_stages(self, stages: Vec<SelectionStage>) -> Self {
        Self { stages: Arc::new(stages), ..self }
    }

    /// The physical plans of its partition selections' first passes (their counts).
    pub fn selection_plans(&self) -> Vec<Arc<dyn ExecutionPlan>> {
        self.stages.iter().filter_map(|s| s.physical.clone()).collect()
    }

    /// What one execution debits.
    pub fn charges(&self) -> &[Charge] {
        &self.charges
    }

    fn tables(&self) -> String {
        let t: std::collections::BTreeSet<&str> = self.charges.iter().map(|c| c.table.as_str()).collect();
        t.into_iter().collect::<Vec<_>>().join("', '")
    }
}

impl DisplayAs for BudgetGateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c: Vec<String> = self.charges.iter().map(|c| format!("{}: {} ({})", c.table, c.function, c.cost)).collect();
        write!(f, "BudgetGateExec: charges=[{}]", c.join("; "))
    }
}

/// The error analysts see when reading private rows failed after the debit.
pub fn withheld(tables: &str) -> DataFusionError {
    DataFusionError::Execution(format!(
        "the query failed while reading private table '{tables}'; the details are withheld because \
         they could contain private values (the budget for this query was spent)"
    ))
}

/// [`withheld`], naming the releases this execution paid for and kept (they are stored: the
/// analyst reads them free).
fn withheld_after(tables: &str, slots: &[Arc<PermitSlot>]) -> DataFusionError {
    let ids: Vec<String> = slots
        .iter()
        .flat_map(|s| s.kept_ids())
        .map(|i| format!("{}{i}", crate::policy::catalog::RELEASE_ID_PREFIX))
        .collect();
    if ids.is_empty() {
        return withheld(tables);
    }
    let first = ids[0].clone();
    DataFusionError::Execution(format!(
        "the query failed after its releases were drawn; the details are withheld because they could \
         contain private values. The budget was spent and the releases are kept: {} — read them free \
         with SELECT * FROM release('{first}')",
        ids.join(", ")
    ))
}

impl ExecutionPlan for BudgetGateExec {
    fn name(&self) -> &str {
        "BudgetGateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    #[allow(deprecated)]
    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let input = only_child(children, "BudgetGateExec")?;
        Ok(Arc::new(Self {
            input,
            ledger: Arc::clone(&self.ledger),
            charges: Arc::clone(&self.charges),
            slots: Arc::clone(&self.slots),
            query: Arc::clone(&self.query),
            stages: Arc::clone(&self.stages),
            analyst: self.analyst.clone(),
        }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = Arc::clone(&self.input);
        let ledger = Arc::clone(&self.ledger);
        let charges = Arc::clone(&self.charges);
        let query = Arc::clone(&self.query);
        let slots = Arc::clone(&self.slots);
        let stages = Arc::clone(&self.stages);
        let tables = self.tables();
        let store = Arc::clone(&self.ledger);
        let charges_for_slots = Arc::clone(&self.charges);
        let analyst = self.analyst.clone();
        // Every release of one execution gets an id reserved with the debit: the calls in plan
        // order, each call's groups in their canonical order.
        let releases: u64 = self.slots.iter().map(|s| s.per_execution()).sum();
        let debit_then_read = async move {
            let debit = tokio::task::spawn_blocking(move || {
                ledger.charge_reserving(&charges, &query, analyst.as_deref(), releases)
            })
            .await
            .map_err(|e| DataFusionError::Execution(format!("budget ledger task failed: {e}")))?;
            let (entries, mut first_release) = debit.map_err(|e| DataFusionError::External(Box::new(e)))?;
            // Each call's releases are kept under the ledger entry of its charge:
            // slots and charges are matched by (table, function, cost), each entry used once.
            let mut used = vec![false; charges_for_slots.len()];
            for slot in slots.iter() {
                let Some(c) = slot.charge() else { continue };
                let found = charges_for_slots
                    .iter()
                    .enumerate()
                    .position(|(i, k)| !used[i] && k.table == c.table && k.function == c.function && k.cost == c.cost);
                let Some(i) = found else {
                    return Err(DataFusionError::Internal("a release permit has no matching charge".into()));
                };
                used[i] = true;
                slot.set_ticket(Arc::clone(&store) as Arc<dyn ReleaseStore>, entries[i], first_release);
                first_release += slot.per_execution() as i64;
            }
            // Paid: each private call may now release once (SPEC §5.1).
            slots.iter().for_each(|s| s.grant());
            // Partition selections: count candidate groups, select with noise, hand the selected
            // keys to the membership filters. Nothing of it leaves the gate; a failure is withheld.
            for stage in stages.iter() {
                let Some(plan) = stage.physical.clone() else { return Err(withheld(&tables)) };
                let selected =
                    std::panic::AssertUnwindSafe(datafusion::physical_plan::collect(plan, Arc::clone(&context)))
                        .catch_unwind()
                        .await;
                let batches = match selected {
                    Ok(Ok(b)) => b,
                    _ => return Err(withheld(&tables)),
                };
                stage.select(&batches).map_err(|_| withheld(&tables))?;
            }
            // Releases first (innermost first): whatever fails later, what was paid is kept.
            for node in super::prefetch::prefetches(&input) {
                let filled = std::panic::AssertUnwindSafe(super::prefetch::fill(&node, Arc::clone(&context)))
                    .catch_unwind()
                    .await;
                if !matches!(filled, Ok(Ok(()))) {
                    return Err(withheld_after(&tables, &slots));
                }
            }
            // Only now is the rest created: no scan exists before the debit is durable.
            let stream = input.execute(partition, context).map_err(|_| withheld_after(&tables, &slots))?;
            let tables2 = tables.clone();
            let slots2 = Arc::clone(&slots);
            // A panic while private rows are read (a DataFusion or arrow kernel on a value it
            // cannot handle) becomes the same withheld error instead of ending the process.
            let caught = std::panic::AssertUnwindSafe(stream).catch_unwind().map(move |r| match r {
                Ok(Ok(batch)) => Ok(batch),
                Ok(Err(_)) | Err(_) => Err(withheld_after(&tables2, &slots2)),
            });
            Ok::<_, DataFusionError>(caught.boxed())
        };
        let schema = self.input.schema();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::once(debit_then_read).try_flatten())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mechanism::noise::budget::Budget;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::test::exec::PanicExec;

    #[tokio::test]
    async fn a_panic_below_the_gate_is_a_withheld_error_after_the_debit() {
        let path = std::env::temp_dir().join(format!("dpcurve-gate-panic-{}.db", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let ledger = Arc::new(Catalog::create_or_open(&path).unwrap());
        ledger.register_table("p", "/nowhere/p.parquet").unwrap();
        ledger.make_private("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true)]));
        for partitions in [1, 2] {
            let panics = Arc::new(PanicExec::new(Arc::clone(&schema), partitions));
            let cost = Budget::charge(0.1, 0.0).unwrap();
            let charges = vec![Charge { table: "p".into(), function: "private_kde".into(), cost }];
            let gate = Arc::new(BudgetGateExec::new(
                panics,
                Arc::clone(&ledger),
                charges,
                vec![],
                Arc::new(QueryRecord::of("q")),
            ));
            let ctx = Arc::new(TaskContext::default());
            let err = datafusion::physical_plan::collect(gate, ctx).await.unwrap_err().to_string();
            assert!(err.contains("details are withheld"), "{err}");
        }
        let spent = ledger.tables().unwrap()[0].policy.as_ref().unwrap().spent;
        assert_eq!(spent, Budget::total(0.2, 0.0).unwrap(), "charged before reading, not refunded");
        let _ = std::fs::remove_file(&path);
    }
}
