//! Scans of few Parquet files split their rows evenly over every partition
//! (`dpcurve::parquet_table`): each row read once, the same share per partition, the same
//! partition count for neighbouring tables, and a private release identical to the unsplit one.

mod common;

use std::fs::File;
use std::sync::Arc;

use common::TempDir;
use datafusion::arrow::array::{Array, AsArray, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::SessionContext;
use dpcurve::{Admin, AnalystSession, DpSession, NoiseSource, SessionOptions};
use futures::StreamExt;

/// Writes ids `first..first + n` (column `id`) and `x = id / 1000 mod 1` in row groups of at
/// most `group` rows.
fn write_ids(path: &std::path::Path, first: i64, n: i64, group: usize) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(group)).build();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), Arc::clone(&schema), Some(props)).unwrap();
    let ids: Vec<i64> = (first..first + n).collect();
    for chunk in ids.chunks(997) {
        let x: Vec<f64> = chunk.iter().map(|i| (*i as f64 / 1000.0).fract()).collect();
        let columns: Vec<Arc<dyn Array>> =
            vec![Arc::new(Int64Array::from(chunk.to_vec())), Arc::new(Float64Array::from(x))];
        w.write(&RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()).unwrap();
    }
    w.close().unwrap();
}

fn session(partitions: usize) -> DpSession {
    DpSession::new(SessionOptions { target_partitions: Some(partitions), ..Default::default() })
}

/// The plan's file scans.
fn scans(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut found = Vec::new();
    plan.apply(|node| {
        if node.downcast_ref::<DataSourceExec>().is_some() {
            found.push(Arc::clone(node));
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    found
}

/// The rows each partition of `scan` reads, as sorted ids.
async fn ids_per_partition(scan: &Arc<dyn ExecutionPlan>) -> Vec<Vec<i64>> {
    let ctx = SessionContext::new();
    let mut out = Vec::new();
    for k in 0..scan.output_partitioning().partition_count() {
        let mut stream = scan.execute(k, ctx.task_ctx()).unwrap();
        let mut ids = Vec::new();
        while let Some(batch) = stream.next().await {
            let batch = batch.unwrap();
            let column = batch.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            ids.extend(column.values().iter().copied());
        }
        ids.sort_unstable();
        out.push(ids);
    }
    out
}

/// Every row read exactly once, each partition a share of ⌊N/P⌋ or ⌈N/P⌉ rows.
fn assert_even_split(parts: &[Vec<i64>], n: i64, partitions: usize) {
    assert_eq!(parts.len(), partitions);
    let mut all: Vec<i64> = parts.concat();
    all.sort_unstable();
    assert_eq!(all, (0..n).collect::<Vec<_>>(), "every row exactly once");
    let (lo, hi) = (n as usize / partitions, (n as usize).div_ceil(partitions));
    for p in parts {
        assert!((lo..=hi).contains(&p.len()), "a partition of {} rows; N = {n}, P = {partitions}", p.len());
    }
}

#[tokio::test]
async fn one_row_group_is_decoded_by_every_partition() {
    let dir = TempDir::new("split-one");
    write_ids(&dir.path("t.parquet"), 0, 10_000, 1 << 20);
    for partitions in [2, 3, 4] {
        let s = session(partitions);
        s.register_parquet("t", &dir.str("t.parquet")).await.unwrap();
        let plan = s.physical_plan_for_tests("SELECT id FROM t").await.unwrap();
        let [scan] = scans(&plan).try_into().unwrap();
        assert_eq!(scan.output_partitioning().partition_count(), partitions);
        assert_even_split(&ids_per_partition(&scan).await, 10_000, partitions);
        // Through SQL: every row once.
        let b = s.query("SELECT count(*), count(DISTINCT id), sum(id) FROM t").await.unwrap();
        let col = |i: usize| b[0].column(i).as_primitive::<Int64Type>().value(0);
        assert_eq!((col(0), col(1), col(2)), (10_000, 10_000, 10_000 * 9_999 / 2));
    }
    // Control: one partition reads the one row group whole, as DataFusion does.
    let s = session(1);
    s.register_parquet("t", &dir.str("t.parquet")).await.unwrap();
    let plan = s.physical_plan_for_tests("SELECT id FROM t").await.unwrap();
    let [scan] = scans(&plan).try_into().unwrap();
    let config = scan.downcast_ref::<DataSourceExec>().unwrap().data_source().downcast_ref::<FileScanConfig>().unwrap();
    assert!(config.file_groups[0].files()[0].extensions.is_empty(), "one partition needs no row ranges");
}

#[tokio::test]
async fn rows_of_several_files_and_row_groups_are_read_once_and_evenly() {
    let dir = TempDir::new("split-many");
    std::fs::create_dir(dir.path("t")).unwrap();
    // Row groups of 7, 1 000 and 4 096 rows; a file of one row; 9 372 rows in all.
    write_ids(&dir.path("t/a.parquet"), 0, 3_000, 1_000);
    write_ids(&dir.path("t/b.parquet"), 3_000, 1, 7);
    write_ids(&dir.path("t/c.parquet"), 3_001, 71, 7);
    write_ids(&dir.path("t/d.parquet"), 3_072, 6_300, 4_096);
    for partitions in [4, 5, 7] {
        let s = session(partitions);
        s.register_parquet("t", &dir.str("t")).await.unwrap();
        let plan = s.physical_plan_for_tests("SELECT id, x FROM t").await.unwrap();
        let [scan] = scans(&plan).try_into().unwrap();
        assert_eq!(scan.output_partitioning().partition_count(), partitions);
        assert_even_split(&ids_per_partition(&scan).await, 9_372, partitions);
    }
    // More files than partitions: DataFusion's distribution of whole files is kept.
    let s = session(2);
    s.register_parquet("t", &dir.str("t")).await.unwrap();
    let plan = s.physical_plan_for_tests("SELECT id FROM t").await.unwrap();
    let [scan] = scans(&plan).try_into().unwrap();
    let config = scan.downcast_ref::<DataSourceExec>().unwrap().data_source().downcast_ref::<FileScanConfig>().unwrap();
    assert!(config.file_groups.iter().flat_map(|g| g.iter()).all(|f| f.extensions.is_empty()));
    let parts = ids_per_partition(&scan).await;
    assert_eq!(parts.concat().len(), 9_372);
}

#[tokio::test]
async fn neighbouring_tables_get_the_same_partitions() {
    // 0, 1, 2, 3 and 5 000 / 5 001 rows: the scan has the session's partitions whatever the rows.
    for (n, m) in [(0, 1), (1, 2), (2, 3), (5_000, 5_001)] {
        let shapes = futures::future::join_all([n, m].map(|rows| async move {
            let dir = TempDir::new("split-nb");
            write_ids(&dir.path("t.parquet"), 0, rows, 1 << 20);
            let s = session(4);
            s.register_parquet("t", &dir.str("t.parquet")).await.unwrap();
            let plan = s.physical_plan_for_tests("SELECT sum(x) FROM t").await.unwrap();
            let ids = s.physical_plan_for_tests("SELECT id FROM t").await.unwrap();
            let [scan] = scans(&ids).try_into().unwrap();
            assert_eq!(ids_per_partition(&scan).await.concat(), (0..rows).collect::<Vec<_>>());
            let [scan] = scans(&plan).try_into().unwrap();
            (
                scan.output_partitioning().partition_count(),
                datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string().lines().count(),
            )
        }))
        .await;
        assert_eq!(shapes[0], shapes[1], "{n} and {m} rows are planned alike");
        assert_eq!(shapes[0].0, 4);
    }
}

/// A catalog with `t` private over `dir/t.parquet` (x bounded to [0, 1]).
async fn private_table(dir: &TempDir) -> Admin {
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("t", &dir.str("t.parquet")).await.unwrap();
    admin.make_private("t", 1000.0, 1e-2).unwrap();
    admin.set_bounds("t", "x", 0.0, 1.0).await.unwrap();
    admin
}

#[tokio::test]
async fn a_release_does_not_depend_on_the_split() {
    let dir = TempDir::new("split-release");
    write_ids(&dir.path("t.parquet"), 0, 20_000, 1 << 20);
    let _admin = private_table(&dir).await;
    let sql = "SELECT private_kde(x, 0.05, 1.0, 1e-6, 0, 1, points => 32, mechanism => 'gaussian') AS k FROM t";
    let mut curves = Vec::new();
    for partitions in [1, 2, 4] {
        let opts = SessionOptions {
            noise: NoiseSource::TestSeed(7),
            target_partitions: Some(partitions),
            ..Default::default()
        };
        let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
        let plan = s.physical_plan_for_tests(sql).await.unwrap();
        let [scan] = scans(&plan).try_into().unwrap();
        assert_eq!(scan.output_partitioning().partition_count(), partitions, "the catalog's scans split too");
        curves.push(common::kde_result(&s.query(sql).await.unwrap()).1.unwrap());
    }
    assert_eq!(curves[0], curves[1]);
    assert_eq!(curves[0], curves[2]);
    // Control: another seed's release differs, so equal curves are not equal by construction.
    let opts = SessionOptions { noise: NoiseSource::TestSeed(8), target_partitions: Some(2), ..Default::default() };
    let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
    assert_ne!(curves[0], common::kde_result(&s.query(sql).await.unwrap()).1.unwrap());
}
