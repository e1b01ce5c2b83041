//! The planner guard: checks every private aggregate call in the *optimized* logical plan
//! before any physical plan exists, so parameter mistakes and forbidden uses fail at
//! planning time, before a single row is read.
//!
//! Rules enforced here (SPEC §0, §5):
//! * parameters of private aggregates are literals in their allowed ranges;
//! * no `DISTINCT` and no `ORDER BY` inside a private aggregate call;
//! * no private aggregate used as a window function (`OVER (…)`).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, DataFusionError, Result, internal_err, plan_err};
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::expr::{AggregateFunction, WindowFunction};
use datafusion::logical_expr::{Aggregate, AggregateUDF, Expr, LogicalPlan, WindowFunctionDefinition};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use crate::functions::{PermitSlot, Permits, PrivateCall, is_private, plan_private_call, with_permits};
use crate::policy::{Catalog, Charge, QueryRecord};

pub mod bounds;
pub mod canonical_groups;
#[cfg(feature = "cluster")]
pub(crate) mod cluster_udfs;
pub mod eager;
mod exec;
pub mod expressions;
pub mod gate;
pub mod groups;
pub mod prefetch;
pub mod selection;
pub mod shape;
pub mod unit_bound;
pub mod units;

use bounds::{PolicyDefaults, apply_default_bounds};
pub use gate::{BudgetGateExec, ScopedReleases};

/// Finds and validates every private aggregate call in `plan` (including subqueries).
pub fn private_calls(plan: &LogicalPlan) -> Result<Vec<PrivateCall>> {
    let mut calls = Vec::new();
    plan.apply_with_subqueries(|node| {
        let empty = DFSchema::empty();
        let inputs = node.inputs();
        let schema = inputs.first().map(|i| i.schema().as_ref()).unwrap_or(&empty);
        node.apply_expressions(|e| {
            e.apply(|e| {
                match e {
                    Expr::AggregateFunction(AggregateFunction { func, params }) => {
                        if let Some(call) = plan_private_call(func, &params.args, schema) {
                            if params.distinct {
                                return plan_err!("{}: DISTINCT is not supported", func.name());
                            }
                            if !params.order_by.is_empty() {
                                return plan_err!("{}: ORDER BY inside the call is not supported", func.name());
                            }
                            calls.push(call?);
                        }
                    }
                    Expr::WindowFunction(w) => {
                        let WindowFunction { fun, .. } = w.as_ref();
                        if let WindowFunctionDefinition::AggregateUDF(f) = fun {
                            if is_private(f) {
                                return plan_err!(
                                    "{}: cannot be used as a window function (OVER …); \
                                     call it as an aggregate",
                                    f.name()
                                );
                            }
                        }
                    }
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    Ok(calls)
}

/// Gives every private aggregate call its release permits (SPEC §5.1): a fresh
/// [`PermitSlot`] for each call over a private table (granted by the gate, one per paid
/// execution), and no permit needed for calls over public tables. Returns the slots.
pub fn assign_permits(plan: LogicalPlan, keys: &groups::KeysMap) -> Result<(LogicalPlan, Vec<Arc<PermitSlot>>)> {
    let mut slots = Vec::new();
    let plan = plan
        .transform_up_with_subqueries(|node| {
            let LogicalPlan::Aggregate(agg) = &node else { return Ok(Transformed::no(node)) };
            if !agg.aggr_expr.iter().any(|e| shape::aggregate_call(e).is_some_and(|f| is_private(&f.func))) {
                return Ok(Transformed::no(node));
            }
            let table = shape::find_private_scan(&agg.input);
            let mode = match &table {
                Some(t) => groups::group_mode(agg, keys, t)?,
                None => groups::GroupMode::Ungrouped,
            };
            let selected = match mode {
                groups::GroupMode::Private => selection::selection_args(agg)?.map(|a| a.max_groups),
                _ => None,
            };
            let declared = match mode {
                groups::GroupMode::Declared(cols) => Some(groups::product(&cols)),
                _ => None,
            };
            map_private_calls(agg, |func, args| {
                let permits = if let Some(table) = &table {
                    let slot = match (&declared, selected) {
                        (Some(g), _) => PermitSlot::for_groups(g.clone()),
                        (None, Some(max)) => PermitSlot::for_selection(max),
                        (None, None) => PermitSlot::new(),
                    };
                    // What the call is charged: the gate keeps its releases under that ledger entry.
                    if let Some(call) = crate::functions::plan_private_call(func, args, agg.input.schema()) {
                        let call = call?;
                        slot.set_charge(crate::functions::SlotCharge {
                            table: table.clone(),
                            function: call.function.to_string(),
                            cost: call.cost,
                        });
                    }
                    slots.push(Arc::clone(&slot));
                    Permits::Slot(slot)
                } else {
                    Permits::Free
                };
                with_permits(func, permits)
                    .ok_or_else(|| DataFusionError::Internal(format!("{} is private but has no permits", func.name())))
            })
        })?
        .data;
    Ok((plan, slots))
}

/// The same aggregate with every private aggregate function instance replaced by `f(instance)`
/// (same arguments, same output schema).
pub(crate) fn map_private_calls(
    agg: &Aggregate,
    mut f: impl FnMut(&AggregateUDF, &[Expr]) -> Result<AggregateUDF>,
) -> Result<Transformed<LogicalPlan>> {
    let aggr_expr = agg
        .aggr_expr
        .iter()
        .map(|e| {
            e.clone()
                .transform_up(|e| match e {
                    Expr::AggregateFunction(AggregateFunction { func, params }) if is_private(&func) => {
                        let func = Arc::new(f(&func, &params.args)?);
                        Ok(Transformed::yes(Expr::AggregateFunction(AggregateFunction { func, params })))
                    }
                    other => Ok(Transformed::no(other)),
                })
                .map(|t| t.data)
        })
        .collect::<Result<Vec<_>>>()?;
    with_aggr_exprs(agg, aggr_expr)
}

/// The same aggregate over another input (same output schema).
pub(crate) fn with_input(agg: &Aggregate, input: Arc<LogicalPlan>) -> Result<Transformed<LogicalPlan>> {
    let rewritten =
        Aggregate::try_new_with_schema(input, agg.group_expr.clone(), agg.aggr_expr.clone(), Arc::clone(&agg.schema))?;
    Ok(Transformed::yes(LogicalPlan::Aggregate(rewritten)))
}

/// The same aggregate with new aggregate expressions (same output schema).
pub(crate) fn with_aggr_exprs(agg: &Aggregate, aggr_expr: Vec<Expr>) -> Result<Transformed<LogicalPlan>> {
    let rewritten = Aggregate::try_new_with_schema(
        Arc::clone(&agg.input),
        agg.group_expr.clone(),
        aggr_expr,
        Arc::clone(&agg.schema),
    )?;
    Ok(Transformed::yes(LogicalPlan::Aggregate(rewritten)))
}

/// The number of declared groups of each grouped private aggregate over a private table.
fn group_counts(plan: &LogicalPlan, keys: &groups::KeysMap) -> Result<Vec<u64>> {
    let mut counts = Vec::new();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Aggregate(agg) = node {
            if let Some(t) = shape::find_private_scan(&agg.input) {
                match groups::group_mode(agg, keys, &t) {
                    Ok(groups::GroupMode::Declared(cols)) => counts.push(cols.iter().map(|c| c.len() as u64).product()),
                    Ok(groups::GroupMode::Private) => {
                        if let Ok(Some(a)) = selection::selection_args(agg) {
                            counts.push(a.max_groups);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(counts)
}

/// Private calls (and partition selections) one query may make: each is a row of the release
/// log, so this bounds what one query adds to the catalog besides the releases it stores.
pub const MAX_PRIVATE_CALLS: usize = 100;

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
    pub stages: Vec<selection::SelectionStage>,
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
    /// Where partial aggregation runs (cluster mode); None: in this process.
    #[cfg(feature = "cluster")]
    cluster: Option<crate::cluster::Cluster>,
}

impl PrivacyPlanner {
    /// A planner whose private tables are charged on `ledger`, refusing queries whose
    /// private calls need more than `memory_limit` bytes.
    pub fn with_ledger(ledger: Arc<Catalog>, memory_limit: u64) -> Self {
        Self { ledger: Some(ledger), memory_limit: Some(memory_limit), ..Self::default() }
    }

    /// The same planner, running the partial phase of every aggregate that reads files on
    /// `cluster`'s executors; the final phase — merge, permit, noise — stays here, under the
    /// gate (see [`crate::cluster`]).
    #[cfg(feature = "cluster")]
    pub fn on_cluster(self, cluster: Option<crate::cluster::Cluster>) -> Self {
        Self { cluster, ..self }
    }

    /// The same planner, charging `analyst`'s shares as well as the tables' totals.
    pub fn for_analyst(self, analyst: Option<&str>) -> Self {
        Self { analyst: analyst.map(Arc::from), ..self }
    }

    /// Refuses a plan whose private calls need more memory than the session may use
    /// (SPEC §5.1): computed from the public parameters alone, at planning, before any debit.
    fn check_memory(&self, calls: &[PrivateCall], groups: &[u64], partitions: usize) -> Result<()> {
        let Some(limit) = self.memory_limit else { return Ok(()) };
        // States are per group: a grouped aggregate holds one per declared group (SPEC §7).
        let most_groups = groups.iter().copied().max().unwrap_or(1).max(1);
        let need = calls.iter().fold(0u64, |a, c| {
            let states = c.state_bytes.saturating_mul(most_groups).saturating_mul(partitions as u64 + 1);
            a.saturating_add(states.saturating_add(c.work_bytes))
        });
        if need > limit {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            let parts: Vec<String> =
                calls.iter().map(|c| format!("{} {:.1} MiB", c.function, mib(c.memory_bytes(partitions)))).collect();
            return plan_err!(
                "[rule memory-limit] the private calls of this query need {:.1} MiB (per group: {}; state × {} \
                 accumulators × up to {most_groups} groups + release), more than this session's memory limit of {:.1} MiB: use fewer or smaller calls \
                 (points, bandwidth relative to hi − lo); the data owner sets the limit with \
                 `dpcurve admin set-memory-limit`",
                mib(need),
                parts.join(", "),
                partitions + 1,
                mib(limit)
            );
        }
        Ok(())
    }

    fn defaults(&self) -> Result<PolicyDefaults> {
        let mut d = PolicyDefaults::default();
        if let Some(ledger) = &self.ledger {
            let tables = ledger.tables().map_err(|e| DataFusionError::Plan(e.to_string()))?;
            for t in tables {
                let Some(policy) = t.policy else { continue };
                if let Some(m) = policy.curve_length {
                    d.curve_length.insert(t.name.clone(), m);
                }
                for (col, b) in policy.bounds {
                    d.bounds.insert((t.name.clone(), col), b);
                }
                for (col, k) in policy.keys {
                    d.keys.insert((t.name.clone(), col), k);
                }
                if let Some(u) = policy.unit {
                    d.units.insert(t.name.clone(), u);
                }
            }
        }
        Ok(d)
    }

    /// Everything but the physical planning: the rewritten plan, its charges, and one release
    /// permit slot per charge.
    pub fn check(&self, logical_plan: &LogicalPlan, partitions: usize) -> Result<Checked> {
        let defaults = self.defaults()?;
        let plan = apply_default_bounds(logical_plan.clone(), &defaults)?;
        // A privacy unit's contribution bound sets the calls' sensitivity (SPEC §7) before
        // they are validated and priced.
        let plan = units::set_contributions(plan, &defaults.units, &defaults.keys)?;
        let calls = private_calls(&plan)?;
        // Only total, cheap expressions on private rows (SPEC §5.1); this rewrites CAST to
        // TRY_CAST and integer division to its total form.
        let plan = expressions::make_total(plan)?;
        let charges = shape::check_and_price(&plan, &defaults.keys)?;
        if charges.len() > MAX_PRIVATE_CALLS {
            return plan_err!(
                "the query makes {} private calls and partition selections; at most {MAX_PRIVATE_CALLS} are allowed \
                 in one query (each is logged in the ledger): split it into several queries",
                charges.len()
            );
        }
        self.check_memory(&calls, &group_counts(&plan, &defaults.keys)?, partitions)?;
        if self.ledger.is_none() {
            return Ok(Checked { plan, charges, slots: Vec::new(), stages: Vec::new() });
        }
        let plan = groups::filter_to_declared_keys(plan, &defaults.keys)?;
        let (plan, slots) = assign_permits(plan, &defaults.keys)?;
        // A GROUP BY over private keys: a first pass for its partition selection, and its rows
        // bounded per unit below a membership filter; then every other private aggregate bounded.
        let (plan, stages) = selection::split_selections(plan, &defaults.units)?;
        let plan = units::bound_contributions(plan, &defaults.units)?;
        let calls = charges.iter().filter(|c| c.function != selection::SELECTION_CHARGE).count();
        if slots.len() != calls || stages.len() != charges.len() - calls {
            return internal_err!(
                "{calls} private calls and {} selections were priced but {} got release permits and {} selections \
                 were planned",
                charges.len() - calls,
                slots.len(),
                stages.len()
            );
        }
        Ok(Checked { plan, charges, slots, stages })
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
        let Checked { plan, charges, slots, mut stages } = self.check(logical_plan, partitions)?;
        let planner = DefaultPhysicalPlanner::default();
        let physical = planner.create_physical_plan(&plan, session).await?;
        for stage in &mut stages {
            stage.physical = Some(planner.create_physical_plan(&stage.plan, session).await?);
        }
        // Cluster mode: partial aggregation on the executors, merge and release here.
        #[cfg(feature = "cluster")]
        let physical = match &self.cluster {
            Some(cluster) => {
                for stage in &mut stages {
                    if let Some(p) = stage.physical.take() {
                        stage.physical = Some(crate::cluster::distribute(p, cluster)?);
                    }
                }
                let physical = crate::cluster::distribute(physical, cluster)?;
                let stage_uses = stages.iter().any(|s| s.physical.as_ref().is_some_and(crate::cluster::uses_cluster));
                if stage_uses || crate::cluster::uses_cluster(&physical) {
                    cluster.check_reachable().await?;
                }
                physical
            }
            None => physical,
        };
        // Grouped private aggregates release every public group once, reached by rows or not,
        // in one canonical order (declared, or the selected keys sorted).
        let physical = canonical_groups::canonical_final_phases(physical)?;
        if charges.is_empty() || matches!(plan, LogicalPlan::Explain(_)) {
            return Ok(physical);
        }
        let Some(ledger) = &self.ledger else {
            return datafusion::common::internal_err!("a private table was planned without a ledger");
        };
        // The gate runs every release before the rest of the plan (no paid result lost).
        let physical = prefetch::prefetch_releases(physical)?;
        // The statement's record (bounded head, length, hash; the session attaches it).
        let query = session.config().get_extension::<QueryRecord>().unwrap_or_else(|| Arc::new(QueryRecord::of("")));
        Ok(Arc::new(
            BudgetGateExec::new(physical, Arc::clone(ledger), charges, slots, query)
                .with_stages(stages)
                .with_analyst(self.analyst.clone()),
        ))
    }
}
