//! The files of a private table as the data owner's last verification read them whole, and the
//! check that a scan reads those files only, unchanged.
//!
//! Whether a Parquet reader can decode a row is a property of that row: a string that is not
//! UTF-8, a value too large for the reader's buffers, a page whose encoding the reader does not
//! support. A query that decoded such a row would fail, and its neighbour without the row would
//! not — "data never causes an error" (SPEC §0) broken with certainty. Nothing in a query can
//! handle that failure uniformly (it happens inside the reader, below every expression), so it
//! is ruled out before any query: making a table private reads every column of every file once
//! with the analyst sessions' reader settings, and refuses the table if any fails
//! (`dpcurve admin verify` does it again after the owner changed the files). The catalog keeps
//! each file read as (location, size, modification time) — what the store's listing gives every
//! scan anyway, so the check costs no read — and a scan of a private table whose files are not all
//! among them, unchanged, is refused at planning, before any charge. The refusal depends on the
//! files' listing only, never on a row.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::object_store::ObjectMeta;
use datafusion::physical_plan::ExecutionPlan;

/// One file as a verification read it: where the store lists it, and the size and modification
/// time it had.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct VerifiedFile {
    /// The location in its store (for local files, the absolute path without its leading '/').
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its last modification, in nanoseconds since the Unix epoch.
    pub modified_ns: i64,
}

impl VerifiedFile {
    /// The file as the store's listing describes it.
    pub fn of(meta: &ObjectMeta) -> Self {
        Self {
            path: meta.location.to_string(),
            size: meta.size,
            modified_ns: meta.last_modified.timestamp_nanos_opt().unwrap_or(i64::MIN),
        }
    }
}

/// The Parquet files a scan reads (each once, however its byte ranges are spread over
/// partitions), with their store; None for any other node.
pub fn parquet_files(node: &Arc<dyn ExecutionPlan>) -> Option<(ObjectStoreUrl, Vec<ObjectMeta>)> {
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

/// Every file the scans of `plan` read, as [`VerifiedFile`]s (sorted, each once).
pub fn scanned_files(plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<VerifiedFile>> {
    let mut files = Vec::new();
    plan.apply(|node| {
        if let Some((_, metas)) = parquet_files(node) {
            files.extend(metas.iter().map(VerifiedFile::of));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    files.sort();
    files.dedup();
    Ok(files)
}

/// Whether every one of `files` is among `verified`, with the same size and modification time.
pub fn all_verified(verified: &[VerifiedFile], files: &[VerifiedFile]) -> bool {
    let verified: BTreeSet<&VerifiedFile> = verified.iter().collect();
    files.iter().all(|file| verified.contains(file))
}

/// Refuses a scan of the private table `table` (planned as `plan`) that reads a file its last
/// verification did not read as it is now (module docs), or any file before a verification.
pub fn check_scan(table: &str, verified: Option<&[VerifiedFile]>, plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
    let Some(verified) = verified else {
        return Err(DataFusionError::Plan(format!(
            "[rule verified-files] private table '{table}' has not been verified: its files must be read whole \
             once before analysts query it, so that no row can make a query fail (the data owner runs \
             `dpcurve admin verify {table}`)"
        )));
    };
    if !all_verified(verified, &scanned_files(plan)?) {
        // One message whatever changed: the names of a private table's files are not shown.
        return Err(DataFusionError::Plan(format!(
            "[rule verified-files] private table '{table}': its files changed after the data owner last read them \
             whole (a file was added or rewritten); analysts may query it again once the data owner has run \
             `dpcurve admin verify {table}`"
        )));
    }
    Ok(())
}
