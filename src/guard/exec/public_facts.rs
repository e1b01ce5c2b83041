//! The public facts a planned aggregate — the privacy-unit bound, a partition selection's count —
//! plans its memory from ([`PlannedAggregateExec`] chooses from them, before any row, whether it
//! holds its keys in memory or spills them; its module docs):
//! * the most rows its input can have: the row counts in the footers of the Parquet files it scans
//!   (SPEC §0 counts the files' sizes as public; the footer's row count is read, never its
//!   statistics of values). The bound holds for an input that only scans, filters, projects,
//!   repartitions or unions — none of these makes more rows than the files have — or unnests a
//!   unit bound's kept rows (each one of its input's rows). Any other operator below (a join, an
//!   unnest of a column) leaves it unknown, and the operator then spills as for an input too large;
//! * the bytes it may hold: what the private calls' planned memory leaves of the session's limit
//!   (`passes::limits`), shared equally by the plan's planned aggregates (they may run at once),
//!   but for a count's partial phase, which holds at most a window's keys whatever the limit.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::object_store::ObjectMeta;
use datafusion::physical_plan::ExecutionPlan;

use super::planned_aggregate::{Phase, PlannedAggregateExec};
use crate::guard::ops::unit_bound;

/// Operators whose output has at most the rows of their inputs together.
const NO_MORE_ROWS: &[&str] = &[
    "FilterExec",
    "ProjectionExec",
    "RepartitionExec",
    "CoalesceBatchesExec",
    "CoalescePartitionsExec",
    "CooperativeExec",
    "UnitExchangeExec",
    "UnionExec",
];

/// A file by its store and location.
type FileKey = (String, String);

/// Every [`PlannedAggregateExec`] in `plan` with its input's public row bound and its part of `memory`
/// bytes (module docs; None: the default share of the session's limit, [`unit_bound::memory_share`]). Reads the footers of the Parquet files below the bounds, once each; other
/// plans are returned unchanged.
pub async fn with_public_facts(
    plan: Arc<dyn ExecutionPlan>,
    session: &dyn Session,
    memory: Option<u64>,
) -> Result<Arc<dyn ExecutionPlan>> {
    // A partial count holds a window's keys whatever the memory: it takes no share.
    let (mut bounds, mut planned) = (0u64, 0u64);
    plan.apply(|n| {
        if let Some(p) = n.downcast_ref::<PlannedAggregateExec>() {
            planned += 1;
            bounds += u64::from(p.phase() != Phase::Partial);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if planned == 0 {
        return Ok(plan);
    }
    // Without a plan for the private calls' memory (no privacy unit), the default share of the
    // session's limit.
    let memory = memory.or(match session.runtime_env().memory_pool.memory_limit() {
        MemoryLimit::Finite(bytes) => Some(unit_bound::memory_share(bytes) as u64),
        _ => None,
    });
    let share = memory.map(|m| m / bounds.max(1));
    let mut files: Vec<(ObjectStoreUrl, ObjectMeta)> = Vec::new();
    plan.apply(|node| {
        if let Some(bound) = node.downcast_ref::<PlannedAggregateExec>() {
            bound.children()[0].apply(|n| {
                if let Some((url, scanned)) = parquet_files(n) {
                    files.extend(scanned.into_iter().map(|m| (url.clone(), m)));
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut rows: HashMap<FileKey, u64> = HashMap::new();
    for (url, meta) in files {
        let key = (url.as_str().to_string(), meta.location.to_string());
        if rows.contains_key(&key) {
            continue;
        }
        let store = session.runtime_env().object_store(&url)?;
        let footer = DFParquetMetadata::new(store.as_ref(), &meta).fetch_metadata().await?;
        rows.insert(key, u64::try_from(footer.file_metadata().num_rows()).unwrap_or(0));
    }
    plan.transform_up(|node| {
        let Some(bound) = node.downcast_ref::<PlannedAggregateExec>() else { return Ok(Transformed::no(node)) };
        let most = most_rows(bound.children()[0], &rows);
        let share = if bound.phase() == Phase::Partial { None } else { share };
        Ok(Transformed::yes(Arc::new(bound.clone().with_rows(most).with_share(share)) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// The Parquet files a scan reads (each once, however its byte ranges are spread over
/// partitions), with their store; None for any other node.
fn parquet_files(node: &Arc<dyn ExecutionPlan>) -> Option<(ObjectStoreUrl, Vec<ObjectMeta>)> {
    let scan = node.downcast_ref::<DataSourceExec>()?;
    let config = scan.data_source().downcast_ref::<FileScanConfig>()?;
    if config.file_source().file_type() != "parquet" {
        return None;
    }
    let mut metas: Vec<ObjectMeta> = Vec::new();
    for file in config.file_groups.iter().flat_map(|g| g.iter()) {
        if !metas.iter().any(|m| m.location == file.object_meta.location) {
            metas.push(file.object_meta.clone());
        }
    }
    Some((config.object_store_url.clone(), metas))
}

/// The most rows `node` can produce: its files' rows for a Parquet scan, its inputs' together
/// for an operator of [`NO_MORE_ROWS`] or a planned aggregate (one row per key, at most one per
/// row), its input's for the unnested kept rows of a unit bound (each one of its input's rows),
/// unknown otherwise.
fn most_rows(node: &Arc<dyn ExecutionPlan>, rows: &HashMap<FileKey, u64>) -> Option<u64> {
    if let Some((url, metas)) = parquet_files(node) {
        return metas.iter().try_fold(0u64, |sum, m| {
            let n = rows.get(&(url.as_str().to_string(), m.location.to_string()))?;
            sum.checked_add(*n)
        });
    }
    if node.name() == "UnnestExec"
        && let [bound] = node.children()[..]
        && bound.downcast_ref::<PlannedAggregateExec>().is_some_and(PlannedAggregateExec::is_unit_bound)
    {
        return most_rows(bound.children()[0], rows);
    }
    if node.downcast_ref::<PlannedAggregateExec>().is_some() {
        return most_rows(node.children()[0], rows);
    }
    if !NO_MORE_ROWS.contains(&node.name()) {
        return None;
    }
    node.children().into_iter().try_fold(0u64, |sum, child| sum.checked_add(most_rows(child, rows)?))
}
