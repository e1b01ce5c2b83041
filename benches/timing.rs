//! Timing on neighbouring tables (SPEC §0): does one row change how long a query takes?
//!
//! ```text
//! cargo bench --bench timing                          # 40 alternating runs per construct
//! cargo bench --bench timing -- --runs 80 --rows 50000 --only case_ltrim,heavy_unit
//! ```
//!
//! For each construct an analyst could use to amplify one row's cost — a branch of `CASE`,
//! `AND`, `OR`, `COALESCE`, `NULLIF`, `IN`; trim sets, `LIKE` and regular expressions with their
//! automata; `concat` with literals; a heavy privacy unit — the harness writes two neighbouring
//! private tables (with and without alice, whose row is the construct's worst case), finds the
//! largest literal size the guard accepts (with `EXPLAIN`, which costs nothing), and times the
//! query on both tables in alternating order. It reports the median time of each side, their
//! ratio (with / without) and Welch's t. The goal is a ratio below 1.15 for every construct:
//! one row then costs no more than its share of the scan.
//!
//! Options: `--rows N` (rows besides alice, default 20000), `--runs N` (default 40),
//! `--heavy N` (rows of alice's unit in `heavy_unit`, default 150000), `--only LIST`,
//! `--data DIR` (default `target/bench-data/timing`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, Float64Array, StringArray};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

const KDE: &str = "private_kde(x, 0.1, 1e-9, 1e-12, 0, 1, points => 16, mechanism => 'gaussian')['mass']";

struct Options {
    rows: usize,
    runs: usize,
    heavy: usize,
    only: Option<Vec<String>>,
    data: PathBuf,
}

impl Options {
    fn parse() -> Self {
        let mut o = Options {
            rows: 20_000,
            runs: 40,
            heavy: 150_000,
            only: None,
            data: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("bench-data").join("timing"),
        };
        let mut args = std::env::args().skip(1);
        let count = |s: String| s.parse::<f64>().map(|v| v as usize).unwrap_or_else(|_| panic!("not a number: {s}"));
        while let Some(a) = args.next() {
            let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
            match a.as_str() {
                "--bench" => {}
                "--rows" => o.rows = count(value()),
                "--runs" => o.runs = count(value()),
                "--heavy" => o.heavy = count(value()),
                "--only" => o.only = Some(value().split(',').map(|s| s.trim().to_string()).collect()),
                "--data" => o.data = PathBuf::from(value()),
                other => panic!("unknown option {other} (see the header of benches/timing.rs)"),
            }
        }
        o
    }
}

/// One construct: its table (`p`: one row per unit; `u`: with a privacy unit) and its query as
/// a function of the literal size `n` (the harness takes the largest the guard accepts).
struct Construct {
    name: &'static str,
    query: fn(usize) -> String,
}

fn a(n: usize) -> String {
    "a".repeat(n)
}

/// `ltrim` of a long concatenation by a set containing alice's name's letters: her row trims to
/// the end, the others stop after the prefix.
fn trimmed(n: usize) -> String {
    format!("ltrim(concat('{}', name, '{}', name), '{}aceil') = ''", a(n), a(n), "#".repeat(n))
}

fn constructs() -> Vec<Construct> {
    vec![
        Construct {
            name: "case_ltrim",
            query: |n| format!("SELECT {KDE} FROM p WHERE CASE WHEN name = 'alice' THEN {} ELSE true END", trimmed(n)),
        },
        Construct {
            name: "and_ltrim",
            query: |n| format!("SELECT {KDE} FROM p WHERE name = 'alice' AND {}", trimmed(n)),
        },
        Construct {
            name: "or_ltrim",
            query: |n| format!("SELECT {KDE} FROM p WHERE name <> 'alice' OR {}", trimmed(n)),
        },
        Construct {
            name: "coalesce_ltrim",
            query: |n| {
                format!(
                    "SELECT {KDE} FROM p WHERE coalesce(CASE WHEN name = 'alice' THEN NULL ELSE true END, {})",
                    trimmed(n)
                )
            },
        },
        Construct {
            name: "nullif_ltrim",
            query: |n| {
                let t = trimmed(n).replace(" = ''", "");
                format!("SELECT {KDE} FROM p WHERE nullif(name, {t}) IS NOT NULL")
            },
        },
        Construct {
            name: "in_ltrim",
            query: |n| {
                let t = trimmed(n).replace(" = ''", "");
                format!("SELECT {KDE} FROM p WHERE {t} IN ('', 'x', 'y')")
            },
        },
        Construct { name: "regex", query: |n| format!("SELECT {KDE} FROM p WHERE s ~ '1[01]{{{n}}}[^01]'") },
        Construct { name: "like", query: |n| format!("SELECT {KDE} FROM p WHERE s LIKE '%1{}#%'", "_".repeat(n)) },
        Construct {
            name: "concat",
            query: |n| format!("SELECT {KDE} FROM p WHERE length(concat(s, '{}', s)) > 3", a(n)),
        },
        Construct { name: "heavy_unit", query: |_| format!("SELECT {KDE} FROM u") },
    ]
}

fn write(path: &std::path::Path, columns: Vec<(&str, ArrayRef)>) {
    let schema = Arc::new(Schema::new(
        columns.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns.into_iter().map(|(_, a)| a).collect()).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// The two neighbouring catalogs (with alice, without her).
async fn catalogs(o: &Options) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for alice in [true, false] {
        let dir = o.data.join(if alice { "with" } else { "without" });
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let n = o.rows;
        let mut name: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
        let mut s: Vec<String> = (0..n).map(|i| format!("{i:b}")).collect();
        let mut x: Vec<f64> = (0..n).map(|i| (i as f64 * 0.618).fract()).collect();
        let mut unit: Vec<String> = (0..n).map(|i| format!("u{}", i % (n / 10).max(1))).collect();
        let (mut ux, mut uu) = (x.clone(), unit.clone());
        if alice {
            name.push("alice".into());
            // The worst case for the regex and LIKE constructs: a long run of 1s and 0s.
            s.push("10".repeat(2048));
            x.push(0.5);
            unit.push("alice".into());
            uu.extend((0..o.heavy).map(|_| "alice".to_string()));
            ux.extend((0..o.heavy).map(|i| (i as f64 * 0.377).fract()));
        }
        write(
            &dir.join("p.parquet"),
            vec![
                ("name", Arc::new(StringArray::from(name)) as ArrayRef),
                ("s", Arc::new(StringArray::from(s))),
                ("x", Arc::new(Float64Array::from(x))),
            ],
        );
        // The same rows as alice's heavy unit, spread over ordinary units of K rows (`spread`):
        // what the rows cost without being one unit's.
        let spread: Vec<String> =
            uu.iter().enumerate().map(|(i, u)| if u == "alice" { format!("s{}", i / 10) } else { u.clone() }).collect();
        write(
            &dir.join("spread.parquet"),
            vec![
                ("unit", Arc::new(StringArray::from(spread)) as ArrayRef),
                ("x", Arc::new(Float64Array::from(ux.clone()))),
            ],
        );
        write(
            &dir.join("u.parquet"),
            vec![("unit", Arc::new(StringArray::from(uu)) as ArrayRef), ("x", Arc::new(Float64Array::from(ux)))],
        );
        let admin = Admin::open(&dir.join("catalog.db")).unwrap();
        for t in ["p", "u", "spread"] {
            admin.register(t, dir.join(format!("{t}.parquet")).to_str().unwrap()).await.unwrap();
            admin.make_private(t, 1000.0, 0.5).await.unwrap();
            admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
            // One public bound for both neighbours, from which the unit bound plans its memory.
            admin.set_row_bound(t, Some((o.rows + o.heavy + 1) as i64)).unwrap();
        }
        admin.set_privacy_unit("u", "unit", 10, 1).await.unwrap();
        admin.set_privacy_unit("spread", "unit", 10, 1).await.unwrap();
        out.push(dir.join("catalog.db"));
    }
    out
}

/// The largest literal size in [1, 65536] whose query the guard accepts (None: not even 1).
async fn largest_accepted(s: &AnalystSession, c: &Construct) -> Option<usize> {
    let ok = |n: usize| {
        let sql = format!("EXPLAIN {}", (c.query)(n));
        async move { s.query(&sql).await.is_ok() }
    };
    if !ok(1).await {
        return None;
    }
    let (mut lo, mut hi) = (1usize, 65_536usize);
    if ok(hi).await {
        return Some(hi);
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if ok(mid).await { lo = mid } else { hi = mid }
    }
    Some(lo)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Welch's t statistic of the difference of means (a − b).
fn welch_t(a: &[f64], b: &[f64]) -> f64 {
    let stats = |v: &[f64]| {
        let n = v.len() as f64;
        let m = v.iter().sum::<f64>() / n;
        (m, v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0), n)
    };
    let ((ma, va, na), (mb, vb, nb)) = (stats(a), stats(b));
    (ma - mb) / (va / na + vb / nb).sqrt()
}

#[tokio::main]
async fn main() {
    // As the dpcurve binary (and the cluster's processes) do.
    dpcurve::allocator::keep_freed_memory();
    let o = Options::parse();
    let dbs = catalogs(&o).await;
    let open = |db: &PathBuf| {
        let db = db.clone();
        async move {
            let opts = SessionOptions { noise: NoiseSource::Os, target_partitions: Some(2), ..Default::default() };
            AnalystSession::open(&db, opts).await.unwrap()
        }
    };
    let (with, without) = (open(&dbs[0]).await, open(&dbs[1]).await);
    println!("# Timing on neighbouring tables: {} rows (+ alice), {} alternating runs\n", o.rows, o.runs);
    println!("| construct | literal size | with alice (ms) | without (ms) | ratio | Welch t |");
    println!("|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    for c in constructs() {
        if o.only.as_ref().is_some_and(|only| !only.iter().any(|x| x == c.name)) {
            continue;
        }
        let Some(n) = largest_accepted(&with, &c).await else {
            println!("| {} | refused at every size | | | | |", c.name);
            continue;
        };
        let sql = (c.query)(n);
        // Warm-up on both sides (file metadata, caches).
        for s in [&with, &without] {
            s.query(&sql).await.unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
        let (mut tw, mut to) = (Vec::new(), Vec::new());
        for run in 0..o.runs {
            // Alternate which side goes first.
            for side in [run % 2, 1 - run % 2] {
                let s = if side == 0 { &with } else { &without };
                let t = Instant::now();
                s.query(&sql).await.unwrap_or_else(|e| panic!("{}: {e}", c.name));
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if side == 0 { tw.push(ms) } else { to.push(ms) }
            }
        }
        let ratio = median(&tw) / median(&to);
        worst = worst.max(ratio);
        let size = if c.name == "heavy_unit" { format!("{} rows", o.heavy) } else { n.to_string() };
        println!(
            "| {} | {size} | {:.2} | {:.2} | {ratio:.3} | {:.1} |",
            c.name,
            median(&tw),
            median(&to),
            welch_t(&tw, &to)
        );
    }
    println!("\nlargest ratio: {worst:.3} (goal < 1.15)");
    if o.only.as_ref().is_none_or(|only| only.iter().any(|x| x == "heavy_unit")) {
        // What remains of a heavy unit: its rows, as the same rows in ordinary units cost.
        let (heavy, spread) = (format!("SELECT {KDE} FROM u"), format!("SELECT {KDE} FROM spread"));
        let (mut th, mut ts) = (Vec::new(), Vec::new());
        for run in 0..o.runs {
            for side in [run % 2, 1 - run % 2] {
                let sql = if side == 0 { &heavy } else { &spread };
                let t = Instant::now();
                with.query(sql).await.unwrap();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if side == 0 { th.push(ms) } else { ts.push(ms) }
            }
        }
        println!(
            "\nalice's {} rows as one unit: {:.2} ms; the same rows in units of 10: {:.2} ms (ratio {:.3}, Welch t {:.1})",
            o.heavy,
            median(&th),
            median(&ts),
            median(&th) / median(&ts),
            welch_t(&th, &ts)
        );
    }
}
