//! GROUP BY over private keys (SPEC §7): groups appear only through DP partition selection.
//!
//! ```sql
//! SELECT city, private_kde(income, 2000, 0.5, 1e-6, select_epsilon => 0.2, select_delta => 1e-7)
//! FROM people GROUP BY city
//! ```
//!
//! When a private aggregate groups by plain columns without declared keys, the query pays for
//! a selection (`select_epsilon`, `select_delta`, on one of its private calls — or the same on
//! several — and `select_max_groups`, the public cap on released groups, default 1 000) in
//! addition to its curves: one more charge, `partition_selection`, on the table.
//!
//! Execution, after the gate's debit:
//! 1. a first pass counts each candidate group's units (after the per-unit bound of L groups,
//!    one row per unit and group; rows when the row is the unit), grouped by the key's keyed
//!    128-bit hash, never its value — a plain count, which spills to disk like any aggregate;
//! 2. the gate adds exact discrete Laplace noise of scale `L/ε_sel` to each count and keeps
//!    the groups reaching the threshold τ ([`PartitionSelection`]: a group of one unit passes
//!    with probability ≤ δ_sel/L), then the `select_max_groups` highest noisy counts among them
//!    (post-processing of the noisy counts);
//! 3. the grouped aggregate reads only rows of selected groups (a membership filter holding the
//!    selected hashes, below the per-unit bound) and releases one curve per selected group, in
//!    the order of the selected keys' values.
//!
//! The candidate keys and their counts live only inside the gate: they are never output, never
//! logged, never in an error (errors while private rows are read are withheld) and never in
//! EXPLAIN, which shows the plan, not the data. The memory rule counts `select_max_groups`
//! states. What remains observable is timing of the first pass, which grows with the number
//! of candidate groups as a scan grows with rows.

use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DataFusionError, Result, internal_err, plan_err};
use datafusion::functions_aggregate::expr_fn::count;
use datafusion::logical_expr::{
    Aggregate, ColumnarValue, Filter, LogicalPlan, LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility, col, lit,
};
use datafusion::physical_plan::ExecutionPlan;

use super::groups::MAX_GROUPS;
use super::shape::{aggregate_call, find_private_scan};
use super::units::{SampleOrder, UnitsMap, bound_rows};
use crate::functions::{PermitSlot, context_of, is_private, params_of};
use crate::mechanism::budget::Budget;
use crate::mechanism::selection::PartitionSelection;
use crate::mechanism::{Contribution, NoiseSource};

/// Released groups per call when `select_max_groups` is not given.
pub const DEFAULT_MAX_GROUPS: u64 = 1000;
const COUNT_COLUMN: &str = "__dpcurve_units";
const GROUP_KEY: &str = "__dpcurve_group_key";
/// The function name of a selection's charge in the ledger.
pub const SELECTION_CHARGE: &str = "partition_selection";

/// The selection a query asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectionArgs {
    /// What the selection costs (charged in addition to the curves).
    pub cost: Budget,
    /// At most this many groups are released.
    pub max_groups: u64,
}

/// The `select_*` arguments of `agg`'s private calls: None if no call has them; refused if
/// incomplete, out of range, or different between calls.
pub fn selection_args(agg: &Aggregate) -> Result<Option<SelectionArgs>> {
    let mut found: Option<SelectionArgs> = None;
    for e in &agg.aggr_expr {
        let Some(f) = aggregate_call(e) else { continue };
        let Some(p) = params_of(&f.func) else { continue };
        let values = p.literals_from_logical(&f.params.args)?;
        let (eps, delta) = (p.float(&values, "select_epsilon")?, p.float(&values, "select_delta")?);
        let max_groups = p.int(&values, "select_max_groups", (1, MAX_GROUPS as i64))?;
        let args = match (eps, delta) {
            (None, None) if max_groups.is_none() => continue,
            (Some(eps), Some(delta)) => {
                if !(eps.is_finite() && (1e-6..=1000.0).contains(&eps)) || !(delta > 0.0 && delta <= 0.5) {
                    return Err(p.error(format!(
                        "arguments 'select_epsilon' and 'select_delta' must be in [1e-6, 1000] and (0, 0.5], got \
                         {eps} and {delta}"
                    )));
                }
                let cost = Budget::charge(eps, delta).map_err(|e| p.error(e))?;
                SelectionArgs { cost, max_groups: max_groups.map_or(DEFAULT_MAX_GROUPS, |m| m as u64) }
            }
            _ => {
                return Err(p.error(
                    "arguments 'select_epsilon' and 'select_delta' go together (and 'select_max_groups' needs them)",
                ));
            }
        };
        match &found {
            Some(f) if f != &args => {
                return plan_err!(
                    "[rule no-group-by] the private calls of one GROUP BY share one partition selection: give \
                     select_epsilon/select_delta/select_max_groups once, or identically"
                );
            }
            _ => found = Some(args),
        }
    }
    Ok(found)
}

/// The selected keys of one execution, shared by the gate (which fills it) and the membership
/// filter (which reads it). Empty until the gate has run the selection: a plan run below the
/// gate selects nothing.
#[derive(Debug, Default)]
pub struct SelectedKeys {
    keys: Mutex<Option<HashSet<Vec<u8>>>>,
}

/// One partition selection to run in the gate before the query's rows are read.
pub struct SelectionStage {
    /// The first pass: (key hash, unit count) per candidate group.
    pub plan: LogicalPlan,
    /// Its physical plan (set by the planner).
    pub physical: Option<Arc<dyn ExecutionPlan>>,
    selection: PartitionSelection,
    max_groups: usize,
    keys: Arc<SelectedKeys>,
    noise: NoiseSource,
    /// The release permit slots of the GROUP BY's private calls: after the selection each
    /// holds exactly one permit per selected group.
    slots: Vec<Arc<PermitSlot>>,
}

impl fmt::Debug for SelectionStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SelectionStage(τ = {}, max_groups = {})", self.selection.threshold(), self.max_groups)
    }
}

impl SelectionStage {
    /// Selects from the first pass's output (`batches`): noisy count ≥ τ, then the
    /// `max_groups` highest, and hands the keys to the membership filter. Returns how many.
    pub fn select(&self, batches: &[RecordBatch]) -> Result<usize> {
        let mut rng = self.noise.release_rng().map_err(|e| DataFusionError::Execution(e.to_string()))?;
        let mut kept: Vec<(i128, Vec<u8>)> = Vec::new();
        for b in batches {
            let keys = b.column(0).as_fixed_size_binary();
            let counts = b.column(1).as_primitive::<Int64Type>();
            for row in 0..b.num_rows() {
                let key = keys.value(row).to_vec();
                let c = counts.value(row).max(0) as u64;
                let noisy = match rng.as_mut() {
                    Some(r) => self.selection.noisy_count(c, r),
                    None => c as i128, // test hook: noise off
                };
                if noisy >= self.selection.threshold() as i128 {
                    kept.push((noisy, key));
                }
            }
        }
        kept.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        kept.truncate(self.max_groups);
        let n = kept.len();
        let chosen: Vec<Vec<u8>> = kept.iter().map(|(_, k)| k.clone()).collect();
        self.slots.iter().for_each(|s| {
            s.set_available(n as u64);
            s.set_selected(chosen.clone());
        });
        *self.keys.keys.lock().map_err(|_| DataFusionError::Execution("selection lock poisoned".into()))? =
            Some(kept.into_iter().map(|(_, k)| k).collect());
        Ok(n)
    }
}

/// Rewrites every private aggregate grouped by private keys into a membership-filtered
/// aggregate over bounded rows and returns the selection stages the gate must run first. Runs
/// before the other aggregates' contribution bounding ([`super::units::bound_contributions`]
/// leaves these alone).
///
/// Candidate keys enter the first pass only as their keyed 128-bit hash (per query): its hash
/// table and, with a privacy unit, its per-unit bound hold 16 bytes per key whatever the key's
/// value, so a 10⁸-byte key in one row costs the same memory as any other key. Key values are
/// read only for the selected groups (the membership filter runs before the grouped aggregate and
/// its bound). Both passes rank a unit's groups by the same keyed order of (unit, key hash), so a
/// unit's group counted in the first pass is kept in the second: every selected group has rows.
pub fn split_selections(plan: LogicalPlan, units: &UnitsMap) -> Result<(LogicalPlan, Vec<SelectionStage>)> {
    let mut stages = Vec::new();
    let plan = plan
        .transform_up_with_subqueries(|node| {
            let LogicalPlan::Aggregate(agg) = &node else { return Ok(Transformed::no(node)) };
            if !agg.aggr_expr.iter().any(|e| aggregate_call(e).is_some_and(|f| is_private(&f.func))) {
                return Ok(Transformed::no(node));
            }
            let Some(table) = find_private_scan(&agg.input) else { return Ok(Transformed::no(node)) };
            // The guard gave the calls of a GROUP BY over private keys selection permit slots.
            let selecting = agg
                .aggr_expr
                .iter()
                .any(|e| aggregate_call(e).and_then(|f| context_of(&f.func)).is_some_and(|c| c.permits.is_selection()));
            if !selecting {
                return Ok(Transformed::no(node));
            }
            let Some(args) = selection_args(agg)? else {
                return internal_err!("a GROUP BY over private keys was priced without a selection");
            };
            let slots: Vec<Arc<PermitSlot>> = agg
                .aggr_expr
                .iter()
                .filter_map(|e| aggregate_call(e).and_then(|f| context_of(&f.func)))
                .filter_map(|c| c.permits.slot().cloned())
                .collect();
            let Some(cx) = agg.aggr_expr.iter().find_map(|e| aggregate_call(e).and_then(|f| context_of(&f.func)))
            else {
                return internal_err!("a private aggregate has no call context");
            };
            if agg.input.schema().fields().iter().any(|f| f.name() == GROUP_KEY) {
                return plan_err!("[rule no-group-by] column name '{GROUP_KEY}' is reserved");
            }
            let unit = units.get(&table);
            // Each unit reaches at most `groups` groups after bounding (1 when the row is the unit).
            let per_unit = if unit.is_some() { cx.contribution.groups } else { 1 };
            let selection =
                PartitionSelection::new(args.cost.calibration_epsilon(), args.cost.calibration_delta(), per_unit)
                    .map_err(|e| DataFusionError::Plan(format!("[rule no-group-by] {e}")))?;
            // One keyed order for the key hashes, the units' group ranks and their row samples.
            let order = SampleOrder::new(cx.noise)?;
            let hash_key = order.key();
            let order = Arc::new(ScalarUDF::from(order));
            let key_hash = order.call(agg.group_expr.clone());
            // First pass: units per candidate key hash (one kept row per unit and group: K = 1).
            let keyed = LogicalPlanBuilder::from(agg.input.as_ref().clone())
                .project(vec![key_hash.clone().alias(GROUP_KEY)])?
                .build()?;
            let counted = match unit {
                Some(u) => {
                    let first = Contribution::new(1, per_unit).map_err(|e| DataFusionError::Plan(e.to_string()))?;
                    bound_rows(&keyed, u, &table, &order, first, &[col(GROUP_KEY)])?
                }
                None => keyed,
            };
            let first_pass = LogicalPlanBuilder::from(counted)
                .aggregate(vec![col(GROUP_KEY)], vec![count(lit(1i64)).alias(COUNT_COLUMN)])?
                .build()?;
            // Second pass: the selected groups' rows only, then their bound.
            let selected = Arc::new(SelectedKeys::default());
            let member =
                ScalarUDF::from(SelectedFilter::new(Arc::clone(&selected), hash_key)).call(agg.group_expr.clone());
            let filtered = LogicalPlan::Filter(Filter::try_new(member, Arc::clone(&agg.input))?);
            let input = match unit {
                Some(u) => bound_rows(&filtered, u, &table, &order, cx.contribution, &[key_hash])?,
                None => filtered,
            };
            stages.push(SelectionStage {
                plan: first_pass,
                physical: None,
                selection,
                max_groups: args.max_groups as usize,
                keys: selected,
                noise: cx.noise,
                slots,
            });
            super::with_input(agg, Arc::new(input))
        })?
        .data;
    Ok((plan, stages))
}

/// `dpcurve_selected(g, …)`: whether the row's group was selected in this execution.
pub struct SelectedFilter {
    signature: Signature,
    keys: Arc<SelectedKeys>,
    /// The key of the keyed hash the first pass grouped by.
    hash_key: (u64, u64),
}

impl SelectedFilter {
    fn new(keys: Arc<SelectedKeys>, hash_key: (u64, u64)) -> Self {
        Self { signature: Signature::variadic_any(Volatility::Volatile), keys, hash_key }
    }

    #[cfg(feature = "cluster")]
    /// The key of the group hash (shipped with the filter).
    pub(crate) fn hash_key(&self) -> (u64, u64) {
        self.hash_key
    }

    #[cfg(feature = "cluster")]
    /// The keys selected so far (None: the selection has not run), to ship the filter to a
    /// cluster's executors after the client's gate selected them.
    pub(crate) fn selected(&self) -> Result<Option<Vec<Vec<u8>>>> {
        let guard = self.keys.keys.lock().map_err(|_| DataFusionError::Execution("selection lock poisoned".into()))?;
        Ok(guard.as_ref().map(|set| {
            let mut keys: Vec<Vec<u8>> = set.iter().cloned().collect();
            keys.sort();
            keys
        }))
    }

    #[cfg(feature = "cluster")]
    /// A filter holding `selected` (the copy decoded on an executor).
    pub(crate) fn holding(selected: Option<Vec<Vec<u8>>>, hash_key: (u64, u64)) -> Self {
        let keys = SelectedKeys { keys: Mutex::new(selected.map(|k| k.into_iter().collect())) };
        Self::new(Arc::new(keys), hash_key)
    }
}

impl fmt::Debug for SelectedFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SelectedFilter")
    }
}

impl PartialEq for SelectedFilter {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.keys, &other.keys)
    }
}

impl Eq for SelectedFilter {}

impl Hash for SelectedFilter {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.keys) as usize).hash(state)
    }
}

impl ScalarUDFImpl for SelectedFilter {
    fn name(&self) -> &str {
        "dpcurve_selected"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let columns = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<_>>>()?;
        let guard = self.keys.keys.lock().map_err(|_| DataFusionError::Execution("selection lock poisoned".into()))?;
        let out: BooleanArray = match guard.as_ref() {
            None => BooleanArray::from(vec![false; n]),
            Some(selected) => {
                let hashes = SampleOrder::with_key(self.hash_key).keys(&columns)?;
                let hashes = hashes.as_fixed_size_binary();
                (0..n).map(|i| Some(selected.contains(hashes.value(i)))).collect()
            }
        };
        debug_assert_eq!(out.len(), n);
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}
