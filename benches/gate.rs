//! Overhead of the budget gate: the same `private_kde` query on a public table (no gate)
//! and on a private table (gate: one durable SQLite transaction per query), with the
//! ledger committing with fsync (production) and without (to isolate the fsync cost).
//! Run with `cargo bench --bench gate` (add `-- N` for N queries per variant).

use std::sync::Arc;
use std::time::Instant;

use dpcurve::policy::Catalog;
use dpcurve::{Admin, AnalystSession, SessionOptions};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200);
    let dir = std::env::temp_dir().join(format!("dpcurve-gate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("d.parquet");
    dpcurve::cli::demo::write_parquet(&data, &dpcurve::datagen::mixture(1_000, 3)).unwrap();
    let path = dir.join("catalog.db");
    let admin = Admin::open(&path).unwrap();
    admin.register("public_t", &data.to_string_lossy()).await.unwrap();
    admin.register("private_t", &data.to_string_lossy()).await.unwrap();
    admin.make_private("private_t", 1000.0, 0.5).unwrap();
    let opts = || SessionOptions { target_partitions: Some(1), ..Default::default() };
    let durable = AnalystSession::open(&path, opts()).await.unwrap();
    let nosync_catalog = Arc::new(Catalog::open(&path).unwrap());
    nosync_catalog.disable_fsync_for_benchmarks().unwrap();
    let nosync = AnalystSession::with_catalog(nosync_catalog, opts()).await.unwrap();
    let q = |t: &str| format!("SELECT private_kde(x, 0.05, 0.001, 1e-9, 0, 1, 64) FROM {t}");

    let variants: [(&str, &AnalystSession, String); 3] = [
        ("public table (no gate)", &durable, q("public_t")),
        ("private table, fsync", &durable, q("private_t")),
        ("private table, no fsync", &nosync, q("private_t")),
    ];
    let mut times = vec![Vec::with_capacity(n); 3];
    for (_, s, sql) in &variants {
        s.query(sql).await.unwrap(); // warm up
    }
    for _ in 0..n {
        // Interleave the variants so drift in the machine affects all equally.
        for (i, (_, s, sql)) in variants.iter().enumerate() {
            let t = Instant::now();
            s.query(sql).await.unwrap();
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let base = median(times[0].clone());
    println!("{n} queries per variant, median milliseconds per query");
    for (i, (name, _, _)) in variants.iter().enumerate() {
        let m = median(times[i].clone());
        println!("{name:<26} {m:>8.3} ms   added by the gate: {:>7.3} ms   ({:.2}x)", m - base, m / base);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
