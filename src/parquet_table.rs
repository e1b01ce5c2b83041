//! A registered Parquet location as a table whose scans use every core.
//!
//! DataFusion's `ListingTable` gives each partition of a scan whole row groups (byte ranges of
//! the files, each row group read by the range holding its middle), so a file of one row group —
//! what arrow-rs and pyarrow write for up to 2²⁰ rows by default — is decoded by one core however
//! many the session has. [`ParquetTable`] wraps the listing table: when a scan reads at most as
//! many files as the session has partitions, it gives each of the `target_partitions`
//! partitions an equal share of the scan's rows instead — contiguous row ranges in file order,
//! selected per row group through DataFusion's own `ParquetAccessPlan` — so the pages of one row
//! group are decoded by all cores. Scans of more files keep DataFusion's distribution of files.
//!
//! **What the split depends on.** Only the files' layout: their row groups and the number of
//! rows in each, read from their footers (through DataFusion's metadata cache, which opening the
//! table filled) — never a value in them (no statistics, no pruning). The number of partitions
//! is the session's `target_partitions` whatever the files hold, each row is read by exactly one
//! partition, and the private aggregates merge exact statistics, so a release does not depend on
//! the split; how long each core decodes depends on the files' sizes, as the scan's time always
//! did (SPEC §0).
//!
//! The split parts declare their partitioning (unknown, one per part), so the optimizer neither
//! regroups them by byte ranges nor lets one partition's stream take another's part.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{ScanArgs, ScanResult, Session, TableProvider};
use datafusion::common::Result;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::datasource::physical_plan::parquet::{ParquetAccessPlan, RowGroupAccess};
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::physical_plan::{ExecutionPlan, Partitioning};

/// A Parquet listing table whose scans of few files split rows over every partition (module
/// docs); `split: false` keeps DataFusion's scans (a cluster's executors cannot read row ranges).
#[derive(Debug)]
pub struct ParquetTable {
    inner: Arc<dyn TableProvider>,
    split: bool,
}

impl ParquetTable {
    /// `inner`, a listing table over Parquet files, with its scans split by rows when `split`.
    pub fn new(inner: Arc<dyn TableProvider>, split: bool) -> Self {
        Self { inner, split }
    }
}

#[async_trait]
impl TableProvider for ParquetTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.inner.scan(state, projection, filters, limit).await?;
        self.split_rows(state, plan).await
    }

    async fn scan_with_args<'a>(&self, state: &dyn Session, args: ScanArgs<'a>) -> Result<ScanResult> {
        let plan = self.inner.scan_with_args(state, args).await?.into_inner();
        Ok(ScanResult::new(self.split_rows(state, plan).await?))
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }
}

impl ParquetTable {
    /// `plan` with its files' rows split evenly over the session's partitions, or `plan` as it
    /// is when it is not a plain scan of at most that many Parquet files.
    async fn split_rows(&self, state: &dyn Session, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let parts = state.config().target_partitions();
        let Some(config) = self.splittable(&plan, parts) else { return Ok(plan) };
        let store = state.runtime_env().object_store(&config.object_store_url)?;
        let cache = state.runtime_env().cache_manager.get_file_metadata_cache();
        let mut files = Vec::new();
        for file in config.file_groups.iter().flat_map(FileGroup::iter) {
            let metadata = DFParquetMetadata::new(store.as_ref(), &file.object_meta)
                .with_file_metadata_cache(Some(Arc::clone(&cache)))
                .fetch_metadata()
                .await?;
            let rows = metadata.row_groups().iter().map(|g| g.num_rows().max(0) as u64).collect();
            files.push((file, rows));
        }
        let groups = split_by_rows(&files, parts);
        let config = FileScanConfigBuilder::from(config.clone())
            .with_file_groups(groups)
            .with_output_partitioning(Some(Partitioning::UnknownPartitioning(parts)))
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }

    /// The scan's configuration when the scan can be split: a Parquet scan of 1 to `parts`
    /// whole files (no byte ranges, no access plans or statistics of their own), in no declared
    /// order or partitioning, with more than one partition to fill.
    fn splittable<'a>(&self, plan: &'a Arc<dyn ExecutionPlan>, parts: usize) -> Option<&'a FileScanConfig> {
        let config = plan.downcast_ref::<DataSourceExec>()?.data_source().downcast_ref::<FileScanConfig>()?;
        let files: Vec<&PartitionedFile> = config.file_groups.iter().flat_map(FileGroup::iter).collect();
        let plain = |f: &&PartitionedFile| f.range.is_none() && f.extensions.is_empty();
        (self.split
            && parts > 1
            && (1..=parts).contains(&files.len())
            && files.iter().all(plain)
            && config.output_ordering.is_empty()
            && config.output_partitioning.is_none()
            && config.file_source().is::<ParquetSource>())
        .then_some(config)
    }
}

/// `parts` file groups, group `k` reading the scan's rows `[N·k/parts, N·(k+1)/parts)` (N the
/// rows of all `files`, in order; `files` gives each file's rows per row group): a file enters a
/// group only for the rows it holds there, through an access plan that skips its other row
/// groups and selects part of a row group split between groups. Groups may be empty (fewer rows
/// than parts); the count is always `parts`.
fn split_by_rows(files: &[(&PartitionedFile, Vec<u64>)], parts: usize) -> Vec<FileGroup> {
    let total: u64 = files.iter().flat_map(|(_, rows)| rows).sum();
    let bound = |k: usize| (u128::from(total) * k as u128 / parts as u128) as u64;
    let mut groups = vec![Vec::new(); parts];
    let mut start = 0u64;
    for (file, rows) in files {
        let end = start + rows.iter().sum::<u64>();
        for (k, group) in groups.iter_mut().enumerate() {
            let (from, to) = (bound(k).max(start), bound(k + 1).min(end));
            if from >= to {
                continue;
            }
            let mut part = (*file).clone();
            part.statistics = None;
            part.extensions.insert(access_plan(rows, from - start, to - start));
            group.push(part);
        }
        start = end;
    }
    groups.into_iter().map(FileGroup::new).collect()
}

/// The access plan reading rows `[from, to)` of a file whose row groups hold `rows`.
fn access_plan(rows: &[u64], from: u64, to: u64) -> ParquetAccessPlan {
    let mut start = 0u64;
    let access = rows.iter().map(|&n| {
        let (a, b) = (from.max(start) - start, to.min(start + n).saturating_sub(start));
        start += n;
        if a >= b.min(n) {
            RowGroupAccess::Skip
        } else if a == 0 && b == n {
            RowGroupAccess::Scan
        } else {
            let mut selectors = Vec::with_capacity(3);
            if a > 0 {
                selectors.push(RowSelector::skip(a as usize));
            }
            selectors.push(RowSelector::select((b - a) as usize));
            if b < n {
                selectors.push(RowSelector::skip((n - b) as usize));
            }
            RowGroupAccess::Selection(RowSelection::from(selectors))
        }
    });
    ParquetAccessPlan::new(access.collect())
}
