//! Cluster mode on Ballista: the rows are read and the exact partial statistics
//! computed on a cluster's executors; the release — the only step that draws noise — runs on
//! the client, under its budget gate.
//!
//! # Trust model
//! Executors and the scheduler are the data owner's machines: they read the private Parquet
//! files (as the client would) and see the exact partial statistics. What they never do is
//! touch the noise: they run only the *partial* phase of each private aggregate (accumulator
//! `update`/`state`), whose output is the exact fixed-point sufficient statistic; the merge of
//! those states, the release permit and the draw from the OS CSPRNG happen in the client's
//! final aggregate, after the client's gate has debited the ledger. A private function decoded
//! on an executor has no release permit ([`Permits::Denied`]): even a plan that asked an
//! executor to evaluate one would be refused before any noise is drawn. The guard, pricing,
//! permits and the ledger (the only writer of the catalog) stay on the client; executors never
//! open the catalog. Analysts must not reach the scheduler's port: Ballista has no
//! authentication, and anyone who can submit plans to it can read the files.
//!
//! # How a query is split
//! The client plans the query exactly as in a single process (guard, pricing, permits,
//! contribution bounding, partition selection), then [`distribute`] replaces every partial
//! aggregate that reads files — `AggregateExec(Partial)` and everything below it: scans,
//! filters, the privacy-unit bound (a hash shuffle of the rows by unit, so a unit's rows meet on
//! one executor whatever the file layout, then the bound's own operator with its memory planned
//! by the client from public facts) — with a [`ClusterExec`] leaf that submits that subtree
//! to the scheduler when it is first polled (after the debit), and streams back the partial
//! states. Fixed-point states merge by integer addition, so the client's final aggregate
//! computes bit for bit the statistic a single process computes, under any partitioning.
//!
//! dpcurve's functions travel with [`DpCodec`]: a private aggregate as its name and the
//! contribution bound the guard chose, the privacy-unit sampling order with its per-query key,
//! a partition selection's membership filter with the keys selected (by the client's gate,
//! before the subtree is submitted), and the total integer division.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlan;

use crate::guard::Distributor;

pub mod address;
pub mod codec;
pub mod nodes;
pub mod rewrite;
pub(crate) mod udfs;

pub use address::Cluster;
pub use codec::DpCodec;
pub use nodes::{ExecutorOptions, SchedulerOptions, init_logging, run_executor, run_scheduler};
pub use rewrite::{ClusterExec, distribute, uses_cluster};

#[async_trait]
impl Distributor for Cluster {
    fn distribute(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        distribute(plan, self)
    }

    fn is_used_by(&self, plan: &Arc<dyn ExecutionPlan>) -> bool {
        uses_cluster(plan)
    }

    async fn check_reachable(&self) -> Result<()> {
        Cluster::check_reachable(self).await
    }
}
