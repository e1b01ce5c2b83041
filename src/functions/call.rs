//! What every private aggregate call is to the rest of dpcurve: what the guard decided for it (its
//! noise source, release permits and contribution bound), what it costs, and the interface through
//! which the guard validates and prices it whichever function it is.

use std::sync::Arc;

use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::{AggregateUDF, Expr};
use datafusion::physical_expr::PhysicalExpr;

use super::params::FunctionParams;
use super::permits::Permits;
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::{Contribution, NoiseSource};

/// One private aggregate call found in a plan, with the budget it spends.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivateCall {
    /// SQL name of the function.
    pub function: &'static str,
    /// The exact budget one release spends.
    pub cost: Budget,
    /// Bytes of one accumulator's state (a query holds one per partition, plus the final).
    pub state_bytes: u64,
    /// Bytes the release needs once (basis, transforms).
    pub work_bytes: u64,
}

impl PrivateCall {
    /// Memory the call needs with `partitions` partial accumulators (bytes).
    pub fn memory_bytes(&self, partitions: usize) -> u64 {
        self.state_bytes.saturating_mul(partitions as u64 + 1).saturating_add(self.work_bytes)
    }
}

/// What the guard decided for one private aggregate call, carried by its UDF instance: where
/// its noise comes from, its release permits, and the contribution bound of a privacy unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CallContext {
    /// Randomness of the release.
    pub noise: NoiseSource,
    /// Releases the call may make.
    pub permits: Permits,
    /// How far one privacy unit can move the release (SPEC §7).
    pub contribution: Contribution,
}

/// What a function takes from the table policy when a call omits it, as argument positions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyArgs {
    /// `(data argument, (lo, hi))`: a box (or range) from the data column's public bounds; each
    /// axis only when the call gives neither end.
    pub boxes: &'static [(usize, (usize, usize))],
    /// `(data argument, clip)`: a norm bound `max(|lower|, |upper|)` from the column's bounds.
    pub clip: Option<(usize, usize)>,
    /// `(data argument, points)`: the public curve length of the column's table.
    pub curve_length: Option<(usize, usize)>,
}

/// What the guard needs of every private aggregate, whichever function it is.
pub(crate) trait PrivateFunction: Send + Sync {
    /// The declared parameters.
    fn params(&self) -> &'static FunctionParams;
    /// What the table policy supplies when a call omits it.
    fn policy_args(&self) -> PolicyArgs;
    /// What the guard decided for this instance.
    fn context(&self) -> &CallContext;
    /// The same function with another call context.
    fn with_context(&self, cx: CallContext) -> AggregateUDF;
    /// The same call taking its literal parameters from `args` (its physical arguments, data
    /// columns first) once, so its physical arguments can be its data columns only: DataFusion
    /// evaluates every argument for every batch, a literal as a column of copies. None when
    /// this instance already holds its parameters.
    fn with_parameters(&self, args: &[Arc<dyn PhysicalExpr>]) -> Result<Option<AggregateUDF>>;
    /// Validates a logical call's literal arguments (planning time) and prices it; `schema` is
    /// the input schema of the node holding the call.
    fn plan(&self, args: &[Expr], schema: &DFSchema) -> Result<PrivateCall>;
}
