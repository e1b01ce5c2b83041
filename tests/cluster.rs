//! Cluster mode on a loopback Ballista cluster: a `dpcurve scheduler` and two
//! `dpcurve executor` processes started by the test. With the noise off (test hook) every
//! release equals, bit for bit, the single-process release — ungrouped, grouped by declared
//! keys, with privacy units, with partition selection, over text keys read plain or as
//! dictionaries; charges are exact and made on the
//! client; private tables stay unreadable; a lost cluster fails the query after the debit,
//! without a refund and without a release.
#![cfg(feature = "cluster")]

mod common;

use common::cluster::{Cluster, free_port};

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TempDir;
use datafusion::arrow::array::{
    ArrayRef, DictionaryArray, Float64Array, Float64Builder, Int64Array, ListBuilder, StringArray, StructArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Int32Type, Schema, UInt32Type};
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

/// Four files of 1 500 rows: region a/b/c/z (z undeclared), city (3 big, many tiny), person
/// (the unit of table `u`: 1–6 rows each), x in [0, 1], a curve of 8 points. With `dictionary`
/// the text columns are written dictionary-encoded, so that they are read back as
/// dictionaries (what Parquet files written from dictionaries give a scan): the region with `UInt32`
/// keys, the city with `Int32` (8- and 16-bit keys are refused on private tables: rule
/// `narrow-dictionary`).
fn write_table(dir: &std::path::Path, dictionary: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let regions = ["a", "b", "c", "z"];
    for file in 0..4usize {
        let n = 1500;
        let base = file * n;
        let idx: Vec<usize> = (base..base + n).collect();
        let region: Vec<&str> = idx.iter().map(|i| regions[(i * 7 + i / 13) % 4]).collect();
        let city: Vec<String> =
            idx.iter().map(|i| if i % 10 < 8 { format!("big{}", i % 3) } else { format!("tiny{}", i % 997) }).collect();
        let person: Vec<i64> = idx.iter().map(|i| (i / (1 + i % 6)) as i64).collect();
        let xs =
            dpcurve::datagen::mixture(n, 40 + file as u64).into_iter().map(|v| v.clamp(0.0, 1.0)).collect::<Vec<_>>();
        let mut curves = ListBuilder::new(Float64Builder::new());
        for i in &idx {
            for t in 0..8 {
                curves.values().append_value(((i % 11) as f64 / 10.0) * (t as f64 / 7.0));
            }
            curves.append(true);
        }
        let text = |values: Vec<&str>| -> ArrayRef {
            if dictionary {
                Arc::new(values.into_iter().collect::<DictionaryArray<Int32Type>>())
            } else {
                Arc::new(StringArray::from(values))
            }
        };
        // The region, four values, with unsigned keys.
        let region: ArrayRef = if dictionary {
            Arc::new(region.into_iter().collect::<DictionaryArray<UInt32Type>>())
        } else {
            text(region)
        };
        common::write_columns(
            &dir.join(format!("part-{file}.parquet")),
            vec![
                ("region", region),
                ("city", text(city.iter().map(String::as_str).collect())),
                ("person", Arc::new(Int64Array::from(person))),
                ("x", Arc::new(Float64Array::from(xs))),
                ("load", Arc::new(curves.finish())),
            ],
        );
    }
}

struct Fixture {
    dir: TempDir,
    admin: Admin,
}

/// `p` (the row is the unit), `u` (`person` the unit: 3 rows, 2 groups), both private, `pd`
/// and `ud` (the same with dictionary-encoded text columns), `cd` (dictionary-encoded, `city` the
/// unit), and the public `open`, each over its own copy of the files.
async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    for t in ["p", "u", "pd", "ud", "cd"] {
        write_table(&dir.path(t), t.ends_with('d'));
        admin.register(t, &dir.str(t)).await.unwrap();
        admin.make_private(t, 1000.0, 1e-2).await.unwrap();
        admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
        admin.set_bounds(t, "person", 0.0, 6000.0).await.unwrap();
        admin.set_keys(t, "region", &["a".into(), "b".into(), "c".into(), "d".into()]).await.unwrap();
        // Public, and above the directory's 4 × 1 500 rows.
        admin.set_row_bound(t, Some(8000)).unwrap();
    }
    admin.set_privacy_unit("u", "person", 3, 2).await.unwrap();
    admin.set_privacy_unit("ud", "person", 3, 2).await.unwrap();
    admin.set_privacy_unit("cd", "city", 3, 2).await.unwrap();
    write_table(&dir.path("public"), false);
    admin.register("open", &dir.str("public")).await.unwrap();
    Fixture { dir, admin }
}

impl Fixture {
    async fn session(&self, noise: NoiseSource, partitions: usize, cluster: Option<String>) -> AnalystSession {
        let opts = SessionOptions { noise, target_partitions: Some(partitions), cluster, ..Default::default() };
        AnalystSession::open(&self.dir.path("catalog.db"), opts).await.unwrap()
    }

    fn spent(&self, table: &str) -> Budget {
        self.admin.tables().unwrap().into_iter().find(|t| t.name == table).unwrap().policy.unwrap().spent
    }
}

const KDE: &str = "private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian')";

/// Every query shape the cluster must reproduce.
fn queries() -> Vec<String> {
    vec![
        format!("SELECT {KDE} AS kde FROM p"),
        "SELECT private_mean_curve(load, 0.5, 1e-6, clip => 1.0, points => 8) AS m FROM p".into(),
        format!("SELECT region, {KDE} AS kde FROM p GROUP BY region ORDER BY region"),
        format!("SELECT {KDE} AS kde FROM p WHERE person / 3 <> 7 AND x > 0.1"),
        format!("SELECT {KDE} AS kde FROM u"),
        format!("SELECT region, {KDE} AS kde FROM u GROUP BY region ORDER BY region"),
        "SELECT city, private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian', \
         select_epsilon => 1, select_delta => 1e-6) AS kde FROM p GROUP BY city ORDER BY city"
            .into(),
        // A public table's aggregates are split the same way (exact ones: a float sum would depend
        // on the partitioning, as it does in a single process).
        "SELECT region, count(*) AS n, min(x) AS lo, max(person) AS hi FROM open \
         GROUP BY region ORDER BY region"
            .into(),
        // Partition selection over privacy units: its counting pass bounds the units too.
        "SELECT city, private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian', \
         select_epsilon => 1, select_delta => 1e-6) AS kde FROM u GROUP BY city ORDER BY city"
            .into(),
        // The same groupings over keys read as dictionaries: declared keys, selected keys, each
        // with rows and with privacy units as the unit of privacy.
        format!("SELECT region, {KDE} AS kde FROM pd GROUP BY region ORDER BY region"),
        format!("SELECT region, {KDE} AS kde FROM ud GROUP BY region ORDER BY region"),
        "SELECT city, private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian', \
         select_epsilon => 1, select_delta => 1e-6) AS kde FROM pd GROUP BY city ORDER BY city"
            .into(),
        "SELECT city, private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian', \
         select_epsilon => 1, select_delta => 1e-6) AS kde FROM ud GROUP BY city ORDER BY city"
            .into(),
        // A unit read as a dictionary (its rows shuffled to the executor that bounds it).
        format!("SELECT region, {KDE} AS kde FROM cd GROUP BY region ORDER BY region"),
        // The other functions' partial states: the distribution function (tree), quantiles, the
        // automatic bandwidth (count and release from one state), 2-D, regression.
        "SELECT private_cdf(x, 0.5, 0, points => 16) AS c FROM p".into(),
        "SELECT region, private_quantiles(x, [0.25, 0.5, 0.75], 0.5, 0) AS q FROM u GROUP BY region ORDER BY region"
            .into(),
        "SELECT private_kde(x, 'auto', 0.5, 0, points => 64) AS k FROM p".into(),
        "SELECT private_kde2d(x, person, 0.05, 300, 0.5, 1e-6, points_x => 16, points_y => 16) AS k FROM p".into(),
        "SELECT private_kernel_regression(person, x, 0.5, 1e-6, bandwidth => 0.05) AS f FROM p".into(),
    ]
}

/// The exact bytes of a result (Arrow IPC): equal bytes are equal bits in every double. The
/// stored release's id (`release`, which numbers releases in the catalog) is left out.
fn ipc_bytes(batches: &[RecordBatch]) -> Vec<u8> {
    let batches: Vec<RecordBatch> = batches.iter().map(without_release_ids).collect();
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new(&mut out, &batches[0].schema()).unwrap();
    for b in &batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
    drop(w);
    out
}

fn without_release_ids(batch: &RecordBatch) -> RecordBatch {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let column = match column.as_any().downcast_ref::<StructArray>() {
            Some(s) => {
                let (f, c, nulls) = s.clone().into_parts();
                let keep: Vec<usize> = (0..f.len()).filter(|&i| f[i].name() != "release").collect();
                let f: Fields = keep.iter().map(|&i| Arc::clone(&f[i])).collect();
                let c: Vec<ArrayRef> = keep.iter().map(|&i| Arc::clone(&c[i])).collect();
                Arc::new(StructArray::new(f, c, nulls)) as ArrayRef
            }
            None => Arc::clone(column),
        };
        fields.push(Field::new(field.name(), column.data_type().clone(), field.is_nullable()));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// Equal results, without printing kilobytes of bytes when they are not.
fn assert_same(got: &[RecordBatch], want: &[RecordBatch], what: &str) {
    let (g, w) = (ipc_bytes(got), ipc_bytes(want));
    if g != w {
        let first = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
        panic!("{what}: results differ (lengths {} and {}, first difference at byte {first})", g.len(), w.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noiseless_releases_on_the_cluster_equal_a_single_process_bit_for_bit() {
    let f = fixture("cluster-equal").await;
    let cluster = Cluster::start(2);
    let local = f.session(NoiseSource::Off, 3, None).await;
    let remote = f.session(NoiseSource::Off, 4, Some(cluster.url())).await;
    // The grouped calls' partial phases run on the executors over known keys, each row's group
    // found in a table sized before the first row (declared text keys by their bytes; a
    // selection's text keys in a table with room for as many as it chose).
    let known = [
        (2, "KnownKeysPartialExec: declared groups=4 (text)"),
        (5, "KnownKeysPartialExec: declared groups=4 (text)"),
        (6, "KnownKeysPartialExec: selected keys (first seen)"),
        (8, "KnownKeysPartialExec: selected keys (first seen)"),
    ];
    for (i, want) in known {
        let plan = remote.physical_plan_for_tests(&queries()[i]).await.unwrap();
        let plan = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
        let remote_part = plan.split_once("ClusterExec").unwrap_or_else(|| panic!("no cluster in\n{plan}")).1;
        assert!(remote_part.contains(want) && !plan.contains("mode=Partial"), "{want}:\n{plan}");
    }
    let mut results = Vec::new();
    for sql in queries() {
        // Every query's aggregate reads its files on the cluster.
        let plan = remote.physical_plan_for_tests(&sql).await.unwrap();
        let plan = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
        assert!(plan.contains("ClusterExec"), "{sql} runs in the client:\n{plan}");
        let want = local.query(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        let got = remote.query(&sql).await.unwrap_or_else(|e| panic!("on the cluster: {sql}: {e}"));
        assert!(!want.is_empty() && want.iter().map(|b| b.num_rows()).sum::<usize>() > 0, "{sql}");
        assert_same(&got, &want, &sql);
        results.push(got);
    }
    // The dictionary tables' keys are read as dictionaries, and release what the plain ones do.
    let file = std::fs::File::open(f.dir.path("pd").join("part-0.parquet")).unwrap();
    let schema = datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .schema()
        .clone();
    for column in ["region", "city"] {
        let t = schema.field_with_name(column).unwrap().data_type().clone();
        assert!(matches!(t, DataType::Dictionary(..)), "{column}: {t}");
    }
    // (Their result's key column is a dictionary too: compared as the plain table's text type.)
    let as_text = |batches: &[RecordBatch], text: &DataType| -> Vec<RecordBatch> {
        batches
            .iter()
            .map(|b| {
                let mut columns = b.columns().to_vec();
                columns[0] = datafusion::arrow::compute::cast(&columns[0], text).unwrap();
                let mut fields: Vec<Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
                fields[0] = Field::new(fields[0].name(), text.clone(), fields[0].is_nullable());
                RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
            })
            .collect()
    };
    for (dictionary, plain) in [(9, 2), (10, 5), (11, 6), (12, 8)] {
        assert!(matches!(results[dictionary][0].column(0).data_type(), DataType::Dictionary(..)));
        let text = results[plain][0].column(0).data_type().clone();
        // (Compared as Arrow data, bit for bit in the doubles: the cast's text views may hold
        // their bytes in other buffers than the scan's, which the IPC bytes would show.)
        let (d, p) = (as_text(&results[dictionary], &text), &results[plain]);
        assert_eq!(d.len(), p.len(), "{}", queries()[dictionary]);
        for (a, b) in d.iter().zip(p) {
            assert!(without_release_ids(a) == without_release_ids(b), "{}", queries()[dictionary]);
        }
        // Control: the comparison tells apart releases of other statistics (the rows against
        // the units' bounded rows of the same files).
        if dictionary == 9 {
            let units = as_text(&results[10], &text);
            assert!(without_release_ids(&d[0]) != without_release_ids(&units[0]), "rows and units release alike");
        }
    }
    // Negative control: the byte comparison tells apart statistics of slightly different rows.
    let all = remote.query(&queries()[0]).await.unwrap();
    // (person 100's rows: a handful out of 6 000.)
    let fewer_sql = format!("SELECT {KDE} AS kde FROM p WHERE person <> 100");
    let fewer = remote.query(&fewer_sql).await.unwrap();
    let fewer_local = local.query(&fewer_sql).await.unwrap();
    assert_same(&fewer, &fewer_local, &fewer_sql);
    assert!(ipc_bytes(&fewer) != ipc_bytes(&all), "dropping a few rows changes the statistic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_bound_each_unit_once_with_memory_planned_from_public_facts() {
    let f = fixture("cluster-units").await;
    let cluster = Cluster::start(1);
    let remote = f.session(NoiseSource::Off, 4, Some(cluster.url())).await;
    // Ungrouped and grouped: the executors run the bound's own operator over rows shuffled by
    // unit, its row bound the table's declared one (its files hold 4 × 1 500 rows) and its memory
    // planned here; DataFusion's
    // two phases (a partial sample per file, merged in a hash aggregate that spills when the
    // units no longer fit: a threshold of units) are gone.
    for sql in [&queries()[4], &queries()[5]] {
        let plan = remote.physical_plan_for_tests(sql).await.unwrap();
        let plan = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
        let remote_part = plan.split_once("ClusterExec").unwrap_or_else(|| panic!("no cluster in\n{plan}")).1;
        let bound = remote_part.find("PlannedAggregateExec: key=__dpcurve_unit_id").unwrap_or_else(|| panic!("{plan}"));
        let shuffle = remote_part.find("RepartitionExec: partitioning=Hash([__dpcurve_unit_id").expect("a shuffle");
        assert!(bound < shuffle, "the bound reads the shuffled rows\n{plan}");
        assert!(remote_part.contains("input rows <= 8000, memory <= "), "{plan}");
        assert!(!plan.contains("dpcurve_unit_bound("), "no aggregate of DataFusion's runs the bound\n{plan}");
        assert!(!plan.contains("UnitExchangeExec"), "the in-process exchange stays in process\n{plan}");
    }
    // A partition selection's first pass (with a unit, and without): its count is planned the same
    // way and runs on the executors.
    let (p_selection, u_selection) = (&queries()[6], queries()[8].clone());
    for (sql, planned) in [(p_selection, 1), (&u_selection, 2)] {
        let plan = remote.physical_plan_for_tests(sql).await.unwrap();
        let gate = plan.downcast_ref::<dpcurve::guard::BudgetGateExec>().expect("the gate at the root");
        let [first] = &gate.selection_plans()[..] else { panic!("one selection") };
        let text = datafusion::physical_plan::displayable(first.as_ref()).indent(false).to_string();
        let remote_part = text.split_once("ClusterExec").unwrap_or_else(|| panic!("no cluster in\n{text}")).1;
        assert!(remote_part.contains("aggr=[count], input rows <= 8000, memory <= "), "{text}");
        assert_eq!(remote_part.matches("PlannedAggregateExec").count(), planned, "{text}");
        assert!(!text.contains("AggregateExec: mode="), "no aggregate of DataFusion's\n{text}");
    }
}

/// Sends `signal` to every executor.
fn signal_executors(cluster: &Cluster, signal: i32) {
    for e in &cluster.executors {
        // SAFETY: kill(2) on a child process we started and have not reaped.
        assert_eq!(unsafe { libc::kill(e.id() as i32, signal) }, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_are_exact_and_made_on_the_client_and_private_tables_stay_unreadable() {
    let f = fixture("cluster-charges").await;
    let cluster = Cluster::start(2);
    let local = f.session(NoiseSource::Os, 3, None).await;
    let remote = f.session(NoiseSource::Os, 4, Some(cluster.url())).await;
    // The same release costs the same on the cluster, charged once, logged once.
    for (sql, table, cost, entries) in [
        (queries()[0].clone(), "p", (0.5, 1e-6), 1),
        (queries()[5].clone(), "u", (0.5, 1e-6), 1),
        (queries()[6].clone(), "p", (1.5, 2e-6), 2),
    ] {
        let before = (f.spent(table), f.admin.release_log(Some(table)).unwrap().len());
        local.query(&sql).await.unwrap();
        let between = (f.spent(table), f.admin.release_log(Some(table)).unwrap().len());
        remote.query(&sql).await.unwrap();
        let after = (f.spent(table), f.admin.release_log(Some(table)).unwrap().len());
        let (local_cost, remote_cost) =
            (between.0.checked_sub(&before.0).unwrap(), after.0.checked_sub(&between.0).unwrap());
        assert_eq!(remote_cost, local_cost, "{sql}");
        assert_eq!(remote_cost, Budget::charge(cost.0, cost.1).unwrap(), "{sql}");
        // One ledger entry per charge (a partition selection is a second charge).
        assert_eq!((between.1 - before.1, after.1 - between.1), (entries, entries), "{sql}");
    }
    // Whatever the guard refuses locally it refuses on the cluster, with the same words, for free.
    let spent = (f.spent("p"), f.spent("u"));
    for sql in [
        "SELECT x FROM p",
        "SELECT avg(x) FROM p",
        "SELECT count(*) FROM p",
        "SELECT region, count(*) FROM p GROUP BY region",
        "SELECT * FROM u LIMIT 1",
        "SELECT city, private_kde(x, 0.05, 0.5, 1e-6, points => 64) AS kde FROM p GROUP BY city",
        "SELECT max(x) FROM (SELECT x FROM p WHERE region = 'a') t",
    ] {
        let want = local.query(sql).await.expect_err(sql).to_string();
        let got = remote.query(sql).await.expect_err(sql).to_string();
        assert_eq!(got, want, "{sql}");
    }
    assert_eq!((f.spent("p"), f.spent("u")), spent, "refusals are free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_refusals_never_reach_the_cluster_and_a_lost_cluster_keeps_the_charge() {
    let f = fixture("cluster-faults").await;
    // No scheduler at all: refused while planning, nothing charged.
    let nowhere = f.session(NoiseSource::Os, 4, Some(format!("df://127.0.0.1:{}", free_port()))).await;
    let err = nowhere.query(&queries()[0]).await.unwrap_err().to_string();
    assert!(err.contains("is unreachable") && err.contains("nothing was charged"), "{err}");
    assert_eq!(f.spent("p"), Budget::default());

    let cluster = Cluster::start(2);
    // Ballista waits for lost executors to come back; the job timeout ends the wait.
    let remote = f.session(NoiseSource::Os, 4, Some(format!("{}?job_timeout=15", cluster.url()))).await;
    // Stopped executors cannot answer: whatever comes back now was decided on the client.
    signal_executors(&cluster, libc::SIGSTOP);
    let over = "SELECT private_kde(x, 0.05, 5000, 1e-6, points => 64) AS kde FROM p";
    let refused = tokio::time::timeout(Duration::from_secs(20), remote.query(over)).await.expect("refused at once");
    let err = refused.unwrap_err().to_string();
    assert!(err.contains("budget"), "{err}");
    assert_eq!(f.spent("p"), Budget::default(), "a refusal costs nothing");

    // A query debited, then its executors lost: it fails with the withheld error, the budget
    // stays spent, nothing is released.
    let releases = f.admin.stored_releases(Some("p")).unwrap().len();
    let task = {
        let sql = queries()[0].clone();
        tokio::spawn(async move { remote.query(&sql).await })
    };
    let start = Instant::now();
    while f.spent("p") == Budget::default() {
        assert!(start.elapsed() < Duration::from_secs(20), "the query was never debited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal_executors(&cluster, libc::SIGKILL);
    let outcome = tokio::time::timeout(Duration::from_secs(120), task).await.expect("the query ends").unwrap();
    let err = outcome.unwrap_err().to_string();
    assert!(err.contains("details are withheld") && err.contains("was spent"), "{err}");
    assert_eq!(f.spent("p"), Budget::charge(0.5, 1e-6).unwrap(), "charged once, not refunded");
    assert_eq!(f.admin.stored_releases(Some("p")).unwrap().len(), releases, "nothing released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_lost_mid_query_is_replaced_by_the_other_one_charge_one_release() {
    let f = fixture("cluster-failover").await;
    let cluster = Cluster::start(2);
    let local = f.session(NoiseSource::Off, 3, None).await;
    let remote = f.session(NoiseSource::Off, 4, Some(cluster.url())).await;
    let want = local.query(&queries()[2]).await.unwrap();
    let spent = f.spent("p");
    // Both executors frozen, the query debited and its tasks handed out; then one executor
    // dies and the other wakes up: the scheduler gives the lost tasks to the survivor.
    signal_executors(&cluster, libc::SIGSTOP);
    let task = {
        let sql = queries()[2].clone();
        tokio::spawn(async move { remote.query(&sql).await })
    };
    let start = Instant::now();
    while f.spent("p") == spent {
        assert!(start.elapsed() < Duration::from_secs(20), "the query was never debited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // SAFETY: kill(2) on children we started and have not reaped.
    unsafe {
        assert_eq!(libc::kill(cluster.executors[0].id() as i32, libc::SIGKILL), 0);
        assert_eq!(libc::kill(cluster.executors[1].id() as i32, libc::SIGCONT), 0);
    }
    let got = tokio::time::timeout(Duration::from_secs(120), task).await.expect("the query ends").unwrap().unwrap();
    assert_same(&got, &want, "after failover");
    let cost = f.spent("p").checked_sub(&spent).unwrap();
    assert_eq!(cost, Budget::charge(0.5, 1e-6).unwrap(), "charged once");
}

/// `dpcurve sql --cluster` and `dpcurve serve --cluster`, as a user runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_the_flight_server_run_on_the_cluster() {
    let f = fixture("cluster-cli").await;
    let cluster = Cluster::start(2);
    let catalog = f.dir.str("catalog.db");
    let bin = env!("CARGO_BIN_EXE_dpcurve");
    let out = Command::new(bin)
        .args(["sql", "--catalog", &catalog, "--cluster", &cluster.url(), "--plot", "-c", &queries()[0]])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("density") && stdout.lines().count() > 20, "a table and a plot: {stdout}");
    assert_eq!(f.spent("p"), Budget::charge(0.5, 1e-6).unwrap());
    // `… | head`: the reader of the output has gone before anything is written (its end of the
    // pipe is closed before the process starts). Cluster clients ignore SIGPIPE, so the write
    // fails: the process must end quietly with a SIGPIPE-like status, in every format, not
    // with an error message or a panic. The release was made, and paid.
    for format in [&["--plot"][..], &["--format", "csv"], &["--format", "json"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(bin)
            .args(["sql", "--catalog", &catalog, "--cluster", &cluster.url(), "-c", &queries()[0]])
            .args(format)
            .stdout(writer)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), stderr.as_ref()), (Some(141), ""), "{format:?}");
    }
    let one = Budget::charge(0.5, 1e-6).unwrap();
    let four = (0..3).fold(one, |b, _| b.checked_add(&one).unwrap());
    assert_eq!(f.spent("p"), four, "the closed-pipe releases were paid");
    // A malformed address is refused before anything runs.
    let out = Command::new(bin)
        .args(["sql", "--catalog", &catalog, "--cluster", "http://h:1", "-c", "SELECT 1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("df://HOST:PORT"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The Flight SQL server with a cluster behind it: an analyst's release, charged on the
    // table and on the analyst's share.
    let token = f.admin.add_analyst("alice").unwrap();
    f.admin.grant("alice", "p", 10.0, 1e-3).unwrap();
    let server = common::Server::start(&f.dir.path("catalog.db"), &["--cluster", &cluster.url()]);
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", server.addr)).unwrap().connect().await.unwrap();
    let mut client = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
    client.set_token(token);
    let info = client.execute(queries()[1].clone(), None).await.unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let batches: Vec<RecordBatch> =
        futures::TryStreamExt::try_collect(client.do_get(ticket).await.unwrap()).await.unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    assert_eq!(f.spent("p"), four.checked_add(&one).unwrap());
    let alice = f.admin.analysts().unwrap().into_iter().find(|a| a.name == "alice").unwrap();
    assert_eq!(alice.grants[0].spent, Budget::charge(0.5, 1e-6).unwrap(), "the analyst's share is charged too");
}
