//! What the guard's passes share: the plan as rewritten so far, the policy view, the session's
//! limits, and what earlier passes found — the private calls, the charges, the release permit
//! slots and the partition selections. Each pass is a function of one [`Checking`].

use std::sync::Arc;

use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};

use super::exec::selection_stage::SelectionStage;
use super::view::PolicyView;
use crate::functions::{PermitSlot, PrivateCall};
use crate::policy::Charge;

/// One pass of the guard: checks, rewrites or adds to a [`Checking`].
pub type Pass = fn(&mut Checking<'_>) -> Result<()>;

/// What the session allows one query.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes the private calls of one query may hold (None: no limit).
    pub memory: Option<u64>,
    /// Partitions each aggregate runs in.
    pub partitions: usize,
}

/// The state the passes work on, in order.
pub struct Checking<'a> {
    /// The plan, as rewritten by the passes so far.
    pub plan: LogicalPlan,
    /// The catalog's policies.
    pub view: &'a PolicyView,
    /// The session's limits.
    pub limits: Limits,
    /// The private calls, validated.
    pub calls: Vec<PrivateCall>,
    /// What one execution debits: one charge per priced call or partition selection.
    pub charges: Vec<Charge>,
    /// One release permit slot per priced call.
    pub slots: Vec<Arc<PermitSlot>>,
    /// Partition selections the gate runs first.
    pub stages: Vec<SelectionStage>,
    /// Bytes of the memory limit the privacy-unit bounds of one plan may hold together: what
    /// the private calls' planned memory leaves (None: no limit, or no unit).
    pub unit_memory: Option<u64>,
}

impl<'a> Checking<'a> {
    /// Nothing found yet in `plan`.
    pub fn new(plan: LogicalPlan, view: &'a PolicyView, limits: Limits) -> Self {
        Self {
            plan,
            view,
            limits,
            calls: Vec::new(),
            charges: Vec::new(),
            slots: Vec::new(),
            stages: Vec::new(),
            unit_memory: None,
        }
    }

    /// Replaces the plan by `f(plan)`.
    pub fn rewrite(&mut self, f: impl FnOnce(LogicalPlan) -> Result<LogicalPlan>) -> Result<()> {
        let empty =
            LogicalPlan::EmptyRelation(EmptyRelation { produce_one_row: false, schema: Arc::new(DFSchema::empty()) });
        let plan = std::mem::replace(&mut self.plan, empty);
        self.plan = f(plan)?;
        Ok(())
    }
}
