//! The planner guard: every private aggregate call in the *optimized* logical plan is checked
//! before any physical plan exists, so parameter mistakes and forbidden uses fail at planning
//! time, before a single row is read; then the plan is priced, and a gate at the root of its
//! physical plan debits the ledger before the first row is read.
//!
//! The guard is a pipeline of passes over one [`Checking`] state, in the order of [`CHECKS`]
//! (always) and [`EXECUTION`] (plans that will run against the ledger). Each pass is one file of
//! `passes/`, and imports only the ground: [`walk`] (plan walking), [`view`] (the policy as the
//! guard sees it), [`checking`], and the functions and operators it puts into plans (`ops/`,
//! `exec/`). A new rule is one new file and one line in a list below.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::{Result, internal_err};
use datafusion::execution::context::{QueryPlanner, SessionConfig};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use crate::functions::PermitSlot;
use crate::policy::{Catalog, Charge, QueryRecord};

pub mod checking;
pub mod exec;
pub mod ops;
pub mod passes;
pub mod view;
pub mod walk;

use checking::{Checking, Limits, Pass};
use exec::canonical_groups::{canonical_final_phases, known_groups_of};
pub use exec::gate::{BudgetGateExec, ScopedReleases};
use exec::known_keys_partial::known_keys_partials;
use exec::parameters::bind_parameters;
use exec::prefetch::prefetch_releases;
use exec::public_facts::with_public_facts;
pub use exec::public_facts::{DeclaredRows, RowsOf};
use exec::selection_stage::SelectionStage;
use exec::unit_phase::{Exchange, single_phase_aggregates};
pub use passes::limits::MAX_PRIVATE_CALLS;
use view::{PolicyView, SELECTION_CHARGE};

/// The passes every plan goes through, in order: what a query may do, and what it costs.
pub const CHECKS: &[(&str, Pass)] = &[
    ("fill parameters the policy supplies", passes::defaults::run),
    ("set privacy units' sensitivity", passes::contributions::run),
    ("validate private calls", passes::calls::run),
    ("total, cheap expressions on private rows", passes::expressions::run),
    ("columns the reader could fail on", passes::column_types::run),
    ("shape rules and pricing", passes::shape::run),
    ("calls and memory per query", passes::limits::run),
];

/// The passes a plan that runs against the ledger goes through next: how it is executed.
pub const EXECUTION: &[(&str, Pass)] = &[
    ("drop rows with undeclared group keys", passes::groups::run),
    ("release permits", passes::permits::run),
    ("partition selections", passes::selection::run),
    ("bound each privacy unit's contribution", passes::units::run),
];

/// The hash aggregate's partial phase always aggregates: DataFusion otherwise stops
/// pre-aggregating once more than 80 % of the first 10⁵ rows' groups are distinct and passes each
/// row on as its own state — a switch of time and memory (one full statistic per row for a private
/// aggregate) decided by the data (SPEC §0). Every session that runs private plans sets it, in
/// this process and on a cluster's executors.
pub fn no_data_dependent_aggregation(config: &mut SessionConfig) {
    config.options_mut().execution.skip_partial_aggregation_probe_ratio_threshold = 1.0;
}

/// Where partial aggregation runs when it does not run in this process (a cluster's executors).
/// The final phase — merge, permit, noise — always stays here, under the gate.
#[async_trait]
pub trait Distributor: std::fmt::Debug + Send + Sync {
    /// The plan with every partial aggregate that reads files sent elsewhere.
    fn distribute(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>>;
    /// Whether `plan` sends anything elsewhere.
    fn is_used_by(&self, plan: &Arc<dyn ExecutionPlan>) -> bool;
    /// Fails (at planning, before any debit) when the executors cannot be reached.
    async fn check_reachable(&self) -> Result<()>;
}

/// What the guard made of a plan: the plan to run, its charges, one release permit slot per
/// priced call, and the partition selections the gate runs first.
pub struct Checked {
    /// The rewritten logical plan.
    pub plan: LogicalPlan,
    /// What one execution debits.
    pub charges: Vec<Charge>,
    /// One per priced call.
    pub slots: Vec<Arc<PermitSlot>>,
    /// Partition selections (GROUP BY over private keys).
    pub stages: Vec<SelectionStage>,
    /// Bytes the privacy-unit bounds of one plan may hold together (None: no limit, or no unit).
    pub unit_memory: Option<u64>,
    /// What bounds each catalog table's rows (a private table's declared bound, a public one's
    /// footers), which planned aggregates plan their memory from.
    pub declared: DeclaredRows,
}

/// A `QueryPlanner` that fills policy defaults, runs the guard on the optimized plan,
/// prices it, plans physically, and puts a [`BudgetGateExec`] at the root of every plan
/// that reads a private table. Nothing is debited here: planning also serves EXPLAIN, and a
/// planned query may never run; the gate debits when the plan executes.
#[derive(Debug, Default)]
pub struct PrivacyPlanner {
    ledger: Option<Arc<Catalog>>,
    memory_limit: Option<u64>,
    /// The analyst whose releases these are (None: the table owner's session).
    analyst: Option<Arc<str>>,
    /// Where partial aggregation runs; None: in this process.
    distributor: Option<Arc<dyn Distributor>>,
}

impl PrivacyPlanner {
    /// A planner whose private tables are charged on `ledger`, refusing queries whose
    /// private calls need more than `memory_limit` bytes.
    pub fn with_ledger(ledger: Arc<Catalog>, memory_limit: u64) -> Self {
        Self { ledger: Some(ledger), memory_limit: Some(memory_limit), ..Self::default() }
    }

    /// The same planner, running the partial phase of every aggregate that reads files where
    /// `distributor` sends it; the final phase — merge, permit, noise — stays here, under the gate.
    pub fn distributed(self, distributor: Option<Arc<dyn Distributor>>) -> Self {
        Self { distributor, ..self }
    }

    /// The same planner, charging `analyst`'s shares as well as the tables' totals.
    pub fn for_analyst(self, analyst: Option<&str>) -> Self {
        Self { analyst: analyst.map(Arc::from), ..self }
    }

    /// Everything but the physical planning: the passes of [`CHECKS`], then — with a ledger —
    /// those of [`EXECUTION`]: the rewritten plan, its charges, one release permit slot per
    /// priced call and the partition selections.
    pub fn check(&self, logical_plan: &LogicalPlan, partitions: usize) -> Result<Checked> {
        let view = PolicyView::of(self.ledger.as_deref())?;
        let limits = Limits { memory: self.memory_limit, partitions };
        let mut cx = Checking::new(logical_plan.clone(), &view, limits);
        let passes = if self.ledger.is_some() { [CHECKS, EXECUTION].concat() } else { CHECKS.to_vec() };
        for (_, pass) in passes {
            pass(&mut cx)?;
        }
        let Checking { plan, charges, slots, stages, unit_memory, .. } = cx;
        if self.ledger.is_some() {
            let calls = charges.iter().filter(|c| c.function != SELECTION_CHARGE).count();
            if slots.len() != calls || stages.len() != charges.len() - calls {
                return internal_err!(
                    "{calls} private calls and {} selections were priced but {} got release permits and {} \
                     selections were planned",
                    charges.len() - calls,
                    slots.len(),
                    stages.len()
                );
            }
        }
        let declared = match self.ledger {
            Some(_) => DeclaredRows::new(view.row_bounds.iter().map(|(name, location, bound)| {
                (name.clone(), location.clone(), bound.map_or(RowsOf::Footers, RowsOf::Declared))
            })),
            None => DeclaredRows::default(),
        };
        Ok(Checked { plan, charges, slots, stages, unit_memory, declared })
    }
}

#[async_trait]
impl QueryPlanner for PrivacyPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let partitions = session.config().target_partitions();
        let Checked { plan, charges, slots, mut stages, unit_memory, declared } =
            self.check(logical_plan, partitions)?;
        let planner = DefaultPhysicalPlanner::default();
        let physical = planner.create_physical_plan(&plan, session).await?;
        for stage in &mut stages {
            stage.physical = Some(planner.create_physical_plan(&stage.plan, session).await?);
        }
        // Partial aggregation elsewhere (a cluster's executors), merge and release here. Each
        // privacy unit is bounded once there too, by the bound's own operator over rows the
        // cluster shuffles by unit, its memory planned here from public facts.
        let physical = match &self.distributor {
            Some(d) => {
                for stage in &mut stages {
                    if let Some(p) = stage.physical.take() {
                        let p = with_public_facts(
                            single_phase_aggregates(p, Exchange::Shuffle)?,
                            session,
                            unit_memory,
                            &declared,
                        );
                        stage.physical = Some(d.distribute(p.await?)?);
                    }
                }
                let physical = single_phase_aggregates(physical, Exchange::Shuffle)?;
                let physical = with_public_facts(physical, session, unit_memory, &declared).await?;
                // Grouped calls' final phases stay here; their partial phases over known keys
                // travel as such (below).
                let physical =
                    known_keys_partials(canonical_final_phases(physical, Exchange::Shuffle)?, known_groups_of)?;
                let physical = d.distribute(physical)?;
                let stage_uses = stages.iter().any(|s| s.physical.as_ref().is_some_and(|p| d.is_used_by(p)));
                if stage_uses || d.is_used_by(&physical) {
                    d.check_reachable().await?;
                }
                physical
            }
            // In this process: each privacy unit bounded once, over rows repartitioned by unit (in
            // the partition selections' counting passes too); private calls read only their data.
            None => {
                for stage in &mut stages {
                    if let Some(p) = stage.physical.take() {
                        let p = single_phase_aggregates(p, Exchange::InProcess)?;
                        stage.physical =
                            Some(bind_parameters(with_public_facts(p, session, unit_memory, &declared).await?)?);
                    }
                }
                let physical = single_phase_aggregates(physical, Exchange::InProcess)?;
                bind_parameters(with_public_facts(physical, session, unit_memory, &declared).await?)?
            }
        };
        // Grouped private aggregates release every public group once, reached by rows or not,
        // in one canonical order (declared, or the selected keys sorted); their partial phases over
        // known keys (declared or selected) find each row's group in a table sized by the keys
        // before any row is read, not one that grows.
        let physical = match &self.distributor {
            Some(_) => physical,
            None => known_keys_partials(canonical_final_phases(physical, Exchange::InProcess)?, known_groups_of)?,
        };
        if charges.is_empty() || matches!(plan, LogicalPlan::Explain(_)) {
            return Ok(physical);
        }
        let Some(ledger) = &self.ledger else {
            return internal_err!("a private table was planned without a ledger");
        };
        // The gate runs every release before the rest of the plan (no paid result lost).
        let physical = prefetch_releases(physical)?;
        // The statement's record (bounded head, length, hash; the session attaches it).
        let query = session.config().get_extension::<QueryRecord>().unwrap_or_else(|| Arc::new(QueryRecord::of("")));
        Ok(Arc::new(
            BudgetGateExec::new(physical, Arc::clone(ledger), charges, slots, query)
                .with_stages(stages)
                .with_analyst(self.analyst.clone()),
        ))
    }
}
