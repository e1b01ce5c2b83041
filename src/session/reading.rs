//! How catalog sessions read Parquet files, and the data owner's verification that reads a private
//! table's files whole with exactly those settings ([`crate::policy::verified_files`]).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::cache::cache_manager::CacheManagerConfig;
use datafusion::execution::context::SessionConfig;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::physical_plan::{ExecutionPlan, execute_stream};
use futures::StreamExt;

use super::catalog_schema::parquet_provider;
use crate::guard::no_data_dependent_aggregation;
use crate::policy::VerifiedFile;
use crate::policy::verified_files::scanned_files;

/// Restricts `config` to what catalog sessions may do with private files: no Parquet statistics
/// are read at planning time, EXPLAIN prints logical plans only (physical plans show file byte
/// ranges, which reveal the size of private files), and no row-group, page or bloom-filter pruning
/// (which parts of a file a scan skips would depend on the private values in it — their min/max
/// statistics — and so would its time).
pub(super) fn catalog_config(mut config: SessionConfig) -> SessionConfig {
    config.options_mut().execution.collect_statistics = false;
    config.options_mut().explain.logical_plan_only = true;
    let parquet = &mut config.options_mut().execution.parquet;
    parquet.pruning = false;
    parquet.enable_page_index = false;
    parquet.bloom_filter_on_read = false;
    parquet.pushdown_filters = false;
    no_data_dependent_aggregation(&mut config);
    config
}

/// The runtime of a catalog session under a memory limit of `bytes` (None: unlimited). It keeps
/// no listing of a table's files from one scan to the next: every scan lists them afresh, so
/// the check of a private table's files sees them as they are.
pub(super) fn catalog_runtime(bytes: Option<usize>) -> Result<Arc<RuntimeEnv>> {
    let mut runtime =
        RuntimeEnvBuilder::new().with_cache_manager(CacheManagerConfig::default().with_list_files_cache_limit(0));
    if let Some(bytes) = bytes {
        runtime = runtime.with_memory_limit(bytes, 1.0);
    }
    runtime.build_arc()
}

/// Reads every column of every row of the Parquet file or directory at `location` as a catalog
/// session would, discarding the rows; returns the files read, as their listing described them
/// before the first was opened. Any failure of the reader is returned.
pub(super) async fn read_whole(location: &str) -> Result<Vec<VerifiedFile>> {
    let (files, scan, state) = scan_of(location).await?;
    let mut rows = execute_stream(scan, state.task_ctx())?;
    while let Some(batch) = rows.next().await {
        batch?;
    }
    Ok(files)
}

/// The files a catalog session's scan of `location` would read now (their footers are read for
/// the table's schema; no row is).
pub(super) async fn listed_files(location: &str) -> Result<Vec<VerifiedFile>> {
    Ok(scan_of(location).await?.0)
}

/// A catalog session's scan of every column at `location`, with the files it reads.
async fn scan_of(location: &str) -> Result<(Vec<VerifiedFile>, Arc<dyn ExecutionPlan>, SessionState)> {
    let state = SessionStateBuilder::new()
        .with_config(catalog_config(SessionConfig::new()))
        .with_runtime_env(catalog_runtime(None)?)
        .with_default_features()
        .build();
    let table = parquet_provider(&state, location).await?;
    let scan = table.scan(&state, None, &[], None).await?;
    Ok((scanned_files(&scan)?, scan, state))
}

#[cfg(all(test, feature = "cluster"))]
mod tests {
    use std::fs::File;

    use datafusion::arrow::array::{Float64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::config::TableParquetOptions;
    use datafusion::datasource::physical_plan::{FileScanConfig, ParquetSource};
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;
    use datafusion_proto::bytes::{
        physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
    };

    use super::*;
    use crate::cluster::DpCodec;

    /// The scan's reader settings, file schema and batch size.
    fn reader_of(plan: &Arc<dyn ExecutionPlan>) -> (TableParquetOptions, String, Option<usize>) {
        let scan = plan.downcast_ref::<DataSourceExec>().expect("a file scan");
        let config = scan.data_source().downcast_ref::<FileScanConfig>().expect("a file scan's configuration");
        let parquet = config.file_source().downcast_ref::<ParquetSource>().expect("a Parquet scan");
        (parquet.table_parquet_options().clone(), format!("{:?}", config.file_schema()), config.batch_size)
    }

    /// A cluster's executors decode a private table's files as the verification read them: the
    /// catalog sessions' reader settings travel inside the serialized scan, and an executor's own
    /// configuration (DataFusion's defaults, which prune and read page indexes) does not replace
    /// them. Control: those defaults differ from the catalog's in every setting checked.
    #[tokio::test]
    async fn executors_decode_with_the_verifications_reader_settings() {
        let dir = std::env::temp_dir().join(format!("dpcurve-reading-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.parquet");
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Float64, false),
            Field::new("name", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Float64Array::from(vec![0.25, 0.5, 0.75])),
                Arc::new(StringArray::from(vec!["alice", "bob", "carol"])),
            ],
        )
        .unwrap();
        let mut writer = ArrowWriter::try_new(File::create(&path).unwrap(), schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let (files, scan, state) = scan_of(path.to_str().unwrap()).await.unwrap();
        assert_eq!(files.len(), 1);
        let codec = DpCodec::default();
        let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&scan), &codec).unwrap();
        let executor = SessionContext::new().task_ctx();
        let shipped = physical_plan_from_bytes_with_extension_codec(&bytes, &executor, &codec).unwrap();

        let (here, there) = (reader_of(&scan), reader_of(&shipped));
        assert_eq!(there, here, "the executor's scan reads as the verification did");
        let (options, _, _) = there;
        let p = &options.global;
        assert!(!p.pruning && !p.enable_page_index && !p.bloom_filter_on_read && !p.pushdown_filters, "{p:?}");
        let defaults = SessionConfig::new();
        let d = &defaults.options().execution.parquet;
        assert!(d.pruning && d.enable_page_index && d.bloom_filter_on_read, "the control: {d:?}");
        assert_eq!(p.schema_force_view_types, state.config().options().execution.parquet.schema_force_view_types);
        // And it reads the same rows.
        let rows = |b: Vec<RecordBatch>| b.iter().map(RecordBatch::num_rows).sum::<usize>();
        assert_eq!(rows(collect(shipped, executor).await.unwrap()), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
