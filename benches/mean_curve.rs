//! Time per `private_mean_curve` query at m = 100 and m = 1000, with the eigendecomposition
//! cached (warm) and recomputed (cold), against the cheapest plain aggregate over the same
//! list column (`count(c)`) as the scan floor. Run: `cargo bench --bench mean_curve`.

use std::time::Instant;

use dpcurve::mechanism::mean_curve::Eigenbasis;
use dpcurve::{DpSession, SessionOptions};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let reps = 5;
    println!("median of {reps} runs, milliseconds per query");
    for (m, n) in [(100usize, 20_000usize), (1000, 2_000)] {
        let path = std::env::temp_dir().join(format!("dpcurve-bench-curves-{m}-{n}.parquet"));
        if !path.exists() {
            let curves = dpcurve::datagen::karhunen_loeve_curves(n, m, 5);
            dpcurve::cli::demo::write_curves_parquet(&path, &curves).unwrap();
        }
        let s = DpSession::new(SessionOptions::default());
        s.register_parquet("t", &path.to_string_lossy()).await.unwrap();
        let q = "SELECT private_mean_curve(c, 1.0, 1e-5, clip => 0.5) FROM t";
        let floor_q = "SELECT count(c) FROM t";
        let mut time = |sql: &'static str, cold: bool| {
            let s = &s;
            async move {
                let mut v = Vec::new();
                for _ in 0..reps {
                    if cold {
                        Eigenbasis::clear_cache();
                    }
                    let t = Instant::now();
                    s.query(sql).await.unwrap();
                    v.push(t.elapsed().as_secs_f64() * 1e3);
                }
                median(v)
            }
        };
        s.query(q).await.unwrap();
        let floor = time(floor_q, false).await;
        let warm = time(q, false).await;
        let cold = time(q, true).await;
        let _ = &mut time;
        println!(
            "m = {m:>4}, {n:>6} curves: count(c) {floor:>8.2} | private_mean_curve warm {warm:>8.2} ({:.2}x) | cold {cold:>8.2} ({:.2}x)",
            warm / floor,
            cold / floor
        );
    }
}
