//! The public facts a planned aggregate — the privacy-unit bound, a partition selection's count —
//! plans its memory from ([`PlannedAggregateExec`] chooses from them, before any row, whether it
//! holds its keys in memory or spills them; its module docs):
//! * the most rows its input can have. A private table's rows are bounded by the **row bound its
//!   policy declares** (`dpcurve admin set-row-bound`), never by its files: the row count is
//!   private (SPEC §0), and a layout chosen from the footers' counts would flip from in memory to
//!   spilled at a count of rows that the query itself moves (the bytes a row may add, the memory
//!   the private calls leave), so an analyst could bisect for the count by timing queries. A
//!   private table without a declared bound is of unknown size. Its footers are still read, only
//!   to refuse, at planning and before any charge, a query over files that hold more rows than
//!   the declared bound (what the owner declared is then wrong; the refusal says so and depends on
//!   nothing but that public bound). A public table's rows are its footers' counts. The bound holds
//!   for an input that only scans, filters, projects, repartitions or unions — none of these makes
//!   more rows than the files have — or unnests a unit bound's kept rows (each one of its input's
//!   rows). Any other operator below (a join, an unnest of a column) leaves it unknown, and the
//!   operator then spills as for an input too large;
//! * the bytes it may hold: what the private calls' planned memory leaves of the session's limit
//!   (`passes::limits`), shared equally by the plan's planned aggregates (they may run at once),
//!   but for a count's partial phase, which holds at most a window's keys whatever the limit.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, plan_err};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::object_store::ObjectMeta;
use datafusion::physical_plan::ExecutionPlan;

use super::planned_aggregate::{Phase, PlannedAggregateExec};
use crate::guard::ops::unit_bound;
use crate::policy::verified_files::parquet_files;

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

/// What bounds a catalog table's rows (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsOf {
    /// A public table: its files' footers.
    Footers,
    /// A private table: the bound its policy declares (None: none declared).
    Declared(Option<u64>),
}

/// The catalog's tables with their locations and what bounds their rows (module docs). A file
/// of no table (a session without a catalog, a location this process cannot resolve) bounds
/// nothing: its scan's rows are unknown.
#[derive(Debug, Clone, Default)]
pub struct DeclaredRows {
    /// (table, its location, what bounds its rows); the locations are resolved only for a plan
    /// with a planned aggregate ([`Self::resolved`]), not for every statement.
    tables: Vec<(String, String, RowsOf)>,
    /// Without a catalog every table is public: footers bound every scan.
    catalog: bool,
}

impl DeclaredRows {
    /// The catalog's tables `(name, location, what bounds their rows)`; a location DataFusion
    /// cannot read is left out (such a table cannot be scanned either).
    pub fn new(tables: impl IntoIterator<Item = (String, String, RowsOf)>) -> Self {
        Self { tables: tables.into_iter().collect(), catalog: true }
    }

    /// The tables with their locations as DataFusion lists them.
    fn resolved(&self) -> Resolved<'_> {
        let tables = self
            .tables
            .iter()
            .filter_map(|(name, location, rows)| Some((name.as_str(), ListingTableUrl::parse(location).ok()?, *rows)))
            .collect();
        Resolved { tables, catalog: self.catalog }
    }
}

/// [`DeclaredRows`] with each location parsed once for one plan.
struct Resolved<'a> {
    tables: Vec<(&'a str, ListingTableUrl, RowsOf)>,
    catalog: bool,
}

impl Resolved<'_> {
    /// The table whose location holds the file `meta` of the store `url`, with what bounds its
    /// rows; None if no table does.
    fn table_of(&self, url: &ObjectStoreUrl, meta: &ObjectMeta) -> Option<(&str, RowsOf)> {
        if !self.catalog {
            return Some(("", RowsOf::Footers));
        }
        self.tables
            .iter()
            .find(|(_, at, _)| at.object_store() == *url && at.contains(&meta.location, false))
            .map(|(name, _, rows)| (*name, *rows))
    }
}

/// Every [`PlannedAggregateExec`] in `plan` with its input's public row bound (`declared` for
/// private tables' files) and its part of `memory` bytes (module docs; None: the default share of
/// the session's limit, [`unit_bound::memory_share`]). Reads the footers of the Parquet files below
/// the bounds, once each; other plans are returned unchanged.
pub async fn with_public_facts(
    plan: Arc<dyn ExecutionPlan>,
    session: &dyn Session,
    memory: Option<u64>,
    declared: &DeclaredRows,
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
    let declared = declared.resolved();
    plan.transform_up(|node| {
        let Some(bound) = node.downcast_ref::<PlannedAggregateExec>() else { return Ok(Transformed::no(node)) };
        let most = most_rows(bound.children()[0], &rows, &declared)?;
        let share = if bound.phase() == Phase::Partial { None } else { share };
        Ok(Transformed::yes(Arc::new(bound.clone().with_rows(most).with_share(share)) as Arc<dyn ExecutionPlan>))
    })
    .map(|t| t.data)
}

/// The most rows `node` can produce: for a Parquet scan, its private table's declared bound
/// (refused if its files hold more) or a public table's footers' rows; its inputs' together for
/// an operator of [`NO_MORE_ROWS`] or a planned aggregate (one row per key, at most one per row),
/// its input's for the unnested kept rows of a unit bound (each one of its input's rows), unknown
/// otherwise.
fn most_rows(
    node: &Arc<dyn ExecutionPlan>,
    rows: &HashMap<FileKey, u64>,
    declared: &Resolved<'_>,
) -> Result<Option<u64>> {
    if let Some((url, metas)) = parquet_files(node) {
        return scan_rows(&url, &metas, rows, declared);
    }
    if node.name() == "UnnestExec"
        && let [bound] = node.children()[..]
        && bound.downcast_ref::<PlannedAggregateExec>().is_some_and(PlannedAggregateExec::is_unit_bound)
    {
        return most_rows(bound.children()[0], rows, declared);
    }
    if node.downcast_ref::<PlannedAggregateExec>().is_some() {
        return most_rows(node.children()[0], rows, declared);
    }
    if !NO_MORE_ROWS.contains(&node.name()) {
        return Ok(None);
    }
    let mut sum = Some(0u64);
    for child in node.children() {
        let child = most_rows(child, rows, declared)?;
        sum = sum.zip(child).and_then(|(a, b)| a.checked_add(b));
    }
    Ok(sum)
}

/// The most rows a scan of the files `metas` of the store `url` can produce (module docs): the
/// declared bound of the private table they belong to — refused when their footers hold more —,
/// their footers' rows when they are a public table's, unknown otherwise (files of no table, or of
/// several).
fn scan_rows(
    url: &ObjectStoreUrl,
    metas: &[ObjectMeta],
    rows: &HashMap<FileKey, u64>,
    declared: &Resolved<'_>,
) -> Result<Option<u64>> {
    let footers = metas.iter().try_fold(0u64, |sum, m| {
        let n = rows.get(&(url.as_str().to_string(), m.location.to_string()))?;
        sum.checked_add(*n)
    });
    let mut owners = metas.iter().map(|m| declared.table_of(url, m));
    let Some(Some((table, bound))) = owners.next() else {
        // No file (nothing to read), or a file of no table.
        return Ok(if metas.is_empty() { Some(0) } else { None });
    };
    if !owners.all(|o| o.is_some_and(|(t, _)| t == table)) {
        return Ok(None);
    }
    match bound {
        RowsOf::Footers => Ok(footers),
        RowsOf::Declared(None) => Ok(None),
        RowsOf::Declared(Some(most)) if footers.is_none_or(|n| n > most) => plan_err!(
            "table '{table}' holds more rows than its policy's row bound ({most}): the bound is public and must \
             hold for every file of the table; the data owner raises it with `dpcurve admin set-row-bound {table} \
             ROWS`"
        ),
        RowsOf::Declared(most) => Ok(most),
    }
}
