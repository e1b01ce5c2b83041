//! Cluster scaling: one private KDE over `--rows` rows (default 10⁸) in process and
//! on loopback Ballista clusters of 1 and 2 executors, all in the same run, with a plain scan
//! (`sum(x)`, no privacy) as the baseline of what reading the files costs.
//!
//! ```text
//! cargo bench --bench cluster                          # 10⁸ rows, 3 runs per setting
//! cargo bench --bench cluster -- --rows 1e7 --runs 5
//! ```
//!
//! The data (8 Parquet files, one double column in [0, 1]) is written once under the target
//! directory and reused. On a 2-core machine the executors share the same two cores, so
//! "2 executors" shows the cost of the distribution machinery, not a speed-up; the README's
//! paper estimate extrapolates from the per-row and per-task costs measured here.

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use datafusion::arrow::array::{Float64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use dpcurve::{Admin, AnalystSession, DpSession, SessionOptions};

const QUERY: &str = "SELECT private_kde(x, 0.05, 0.001, 0, 0, 1, 64) AS k FROM p";
const FILES: usize = 8;

struct Options {
    rows: usize,
    runs: usize,
}

fn options() -> Options {
    let mut o = Options { rows: 100_000_000, runs: 3 };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut v = || it.next().cloned().unwrap_or_default();
        match a.as_str() {
            "--rows" => o.rows = v().parse::<f64>().expect("--rows N") as usize,
            "--runs" => o.runs = v().parse().expect("--runs N"),
            "--bench" => {}
            other => eprintln!("ignoring {other}"),
        }
    }
    o
}

/// `rows` values of a two-bump mixture in [0, 1] (a fast deterministic generator: the bench
/// measures throughput, the values only need a realistic spread).
fn write_data(dir: &Path, rows: usize) {
    if dir.join("done").exists() {
        return;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, false)]));
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let started = Instant::now();
    for f in 0..FILES {
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), None).unwrap();
        let mut left = rows / FILES + usize::from(f < rows % FILES);
        while left > 0 {
            let n = left.min(1 << 20);
            let xs: Vec<f64> = (0..n)
                .map(|_| {
                    let (u, v) = (next(), next());
                    let centre = if u < 0.4 { 0.3 } else { 0.7 };
                    (centre + (v - 0.5) * 0.3).clamp(0.0, 1.0)
                })
                .collect();
            w.write(&RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Float64Array::from(xs))]).unwrap())
                .unwrap();
            left -= n;
        }
        w.close().unwrap();
    }
    std::fs::write(dir.join("done"), b"").unwrap();
    eprintln!("wrote {rows} rows in {FILES} files in {:.1} s", started.elapsed().as_secs_f64());
}

/// The median of `runs` timings of `one`.
async fn median<F, Fut>(runs: usize, mut one: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        one().await;
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

async fn private_kde(catalog: &Path, partitions: usize, cluster: Option<String>, runs: usize) -> Duration {
    let opts = SessionOptions { target_partitions: Some(partitions), cluster, ..Default::default() };
    let session = AnalystSession::open(catalog, opts).await.unwrap();
    session.query(QUERY).await.unwrap(); // warm-up (file metadata, connections)
    median(runs, || async { assert_eq!(session.query(QUERY).await.unwrap()[0].num_rows(), 1) }).await
}

#[tokio::main]
async fn main() {
    // As the dpcurve binary (and the cluster's processes) do.
    dpcurve::allocator::keep_freed_memory();
    let o = options();
    let data = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cluster-bench-{}", o.rows));
    write_data(&data, o.rows);
    let work = common::TempDir::new("cluster-bench");
    let catalog = work.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("p", &data.to_string_lossy()).await.unwrap();
    admin.make_private("p", 1000.0, 0.5).await.unwrap();
    admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();

    let scan = {
        let s = DpSession::new(SessionOptions { target_partitions: Some(2), ..Default::default() });
        s.register_parquet("t", &data.to_string_lossy()).await.unwrap();
        s.query("SELECT sum(x) FROM t").await.unwrap();
        median(o.runs, || async {
            s.query("SELECT sum(x) FROM t").await.unwrap();
        })
        .await
    };
    let local = private_kde(&catalog, 2, None, o.runs).await;
    let mut rows = vec![("scan, sum(x), in process, 2 partitions".to_string(), scan)];
    rows.push(("private_kde, in process, 2 partitions".into(), local));
    for (executors, tasks) in [(1, 2), (2, 1), (2, 2)] {
        let cluster = Cluster::start_with(executors, tasks);
        let t = private_kde(&catalog, executors * tasks, Some(cluster.url()), o.runs).await;
        rows.push((format!("private_kde, cluster: {executors} executor(s) × {tasks} task(s)"), t));
    }
    let one = rows[2].1.as_secs_f64();
    println!("\n{} rows, {} runs (median), 64 points", o.rows, o.runs);
    println!("| setting | time | rows/s | vs in process | vs 1 executor |");
    println!("|---|---|---|---|---|");
    for (name, t) in &rows {
        let s = t.as_secs_f64();
        println!(
            "| {name} | {s:.2} s | {:.1} M | {:.2}× | {:.2}× |",
            o.rows as f64 / s / 1e6,
            s / local.as_secs_f64(),
            s / one
        );
    }
}
