//! A first benchmark of `private_kde`: time against the scan floor (`sum(x)`) on the same
//! Parquet file, and the Gaussian-process sampler, reported as ratios measured in the same
//! run. Run with `cargo bench --bench kde` (add `-- ROWS` to change the table size).

use std::time::Instant;

use dpcurve::mechanism::gp::GpSampler;
use dpcurve::{DpSession, SessionOptions};
use rand::SeedableRng;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn time_query(s: &DpSession, sql: &str, reps: usize) -> (f64, f64, f64) {
    s.query(sql).await.unwrap(); // warm the page cache and the plan path
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        s.query(sql).await.unwrap();
        times.push(t.elapsed().as_secs_f64());
    }
    let lo = times.iter().cloned().fold(f64::MAX, f64::min);
    let hi = times.iter().cloned().fold(0.0, f64::max);
    (median(times), lo, hi)
}

#[tokio::main]
async fn main() {
    let rows: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2_000_000);
    let path = std::env::temp_dir().join(format!("dpcurve-bench-{rows}.parquet"));
    if !path.exists() {
        dpcurve::cli::demo::write_parquet(&path, &dpcurve::datagen::mixture(rows, 7)).unwrap();
    }
    let s = DpSession::new(SessionOptions::default());
    s.register_parquet("t", &path.to_string_lossy()).await.unwrap();
    let reps = 7;
    println!("rows = {rows}, {reps} repetitions, median [min, max] seconds");
    let base = time_query(&s, "SELECT sum(x) FROM t", reps).await;
    println!("sum(x)       {:.4} [{:.4}, {:.4}]   1.00x", base.0, base.1, base.2);
    for (name, sql) in [
        ("count(*)", "SELECT count(*) FROM t"),
        ("private_kde", "SELECT private_kde(x, 0.02, 1, 1e-6, 0, 1) FROM t"),
        ("private_kde 4096", "SELECT private_kde(x, 0.02, 1, 1e-6, 0, 1, 4096) FROM t"),
    ] {
        let t = time_query(&s, sql, reps).await;
        println!("{name:<16} {:.4} [{:.4}, {:.4}]   {:.2}x", t.0, t.1, t.2, t.0 / base.0);
    }
    println!("\nGP noise (circulant embedding), h = grid range / 50");
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(1);
    for g in [256usize, 1024, 4096, 16384] {
        let sampler = GpSampler::new(g, 50.0 / (g - 1) as f64).unwrap();
        let n = 50;
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(sampler.sample(&mut rng));
        }
        println!("G = {g:>6}: {:.3} ms per sample", 1e3 * t.elapsed().as_secs_f64() / n as f64);
    }
}
