//! Free post-processing of released curves (`curve_*`): through SQL on a private table, above the
//! private aggregate, at no extra charge; values checked against the data with the noise off.

mod common;

use common::{TempDir, write_x};
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Float64Type;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

#[tokio::test]
async fn quantiles_moments_and_integrals_of_a_release_cost_nothing_more() {
    let dir = TempDir::new("post-sql");
    // 10 000 values evenly spread over [0.2, 0.6]: median 0.4, mean 0.4, var 0.0133…
    let xs: Vec<Option<f64>> = (0..10_000).map(|i| Some(0.2 + 0.4 * (i as f64 + 0.5) / 10_000.0)).collect();
    write_x(&dir.path("p.parquet"), &xs);
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("p", &dir.str("p.parquet")).await.unwrap();
    admin.make_private("p", 10.0, 1e-3).await.unwrap();
    admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();
    let sql = "SELECT curve_quantile(k, 0.5), curve_quantile(k, 0.1), curve_cdf(k, 0.3), curve_mean(k), \
               curve_var(k), curve_integral(k, 0.2, 0.6), curve_mode(k), curve_quantile(k, 2) \
               FROM (SELECT private_kde(x, 0.005, 1.0, 1e-6, points => 1001) AS k FROM p)";
    for noise in [NoiseSource::Off, NoiseSource::Os] {
        let opts = SessionOptions { noise, ..Default::default() };
        let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
        let b = s.query(sql).await.unwrap();
        let v = |i: usize| b[0].column(i).as_primitive::<Float64Type>().value(0);
        // Bandwidth 0.005 smooths the edges a little; with the noise on (ε = 1, n = 10⁴) the
        // curve moves by a fraction of a percent of its mass.
        let tol = if matches!(noise, NoiseSource::Os) { 0.02 } else { 0.003 };
        assert!((v(0) - 0.4).abs() < tol, "median {}", v(0));
        assert!((v(1) - 0.24).abs() < tol, "10 % quantile {}", v(1));
        assert!((v(2) - 0.25).abs() < tol * 2.0, "cdf(0.3) {}", v(2));
        assert!((v(3) - 0.4).abs() < tol, "mean {}", v(3));
        assert!((v(4) - 0.4f64.powi(2) / 12.0).abs() < tol, "var {}", v(4));
        assert!((v(5) - 0.9).abs() < 0.1, "integral over the data ≈ the density's mass there: {}", v(5));
        assert!((0.2..=0.6).contains(&v(6)), "mode {}", v(6));
        assert!(b[0].column(7).is_null(0), "p outside [0, 1] is NULL");
    }
    // Two releases, two charges: the post-processing itself costs nothing.
    let spent = admin.tables().unwrap()[0].policy.as_ref().unwrap().spent;
    // (The default mechanism is the pure-ε release here, which needs no δ.)
    assert_eq!(spent, Budget::charge(2.0, 0.0).unwrap());
    // A non-curve argument is a planning error.
    let s = AnalystSession::open(&dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let e = s.query("SELECT curve_mean(1.0)").await.unwrap_err().to_string();
    assert!(e.contains("must be a curve"), "{e}");
    // A hand-built struct of the wrong item type is refused at planning (never a panic); one of
    // the right shape is evaluated like a release.
    let e = s.query("SELECT curve_mean(named_struct('x', [1, 2], 'density', [1, 1]))").await.unwrap_err().to_string();
    assert!(e.contains("must be a curve"), "{e}");
    let b = s
        .query("SELECT curve_mean(named_struct('x', [0.0, 1.0, 2.0], 'density', [0.0, 1.0, 0.0])), curve_integral(named_struct('x', [0.0, 1.0, 2.0], 'density', [0.0, 1.0, 0.0]), 0, 1)")
        .await
        .unwrap();
    assert!((b[0].column(0).as_primitive::<Float64Type>().value(0) - 1.0).abs() < 1e-12);
    assert_eq!(b[0].column(1).as_primitive::<Float64Type>().value(0), 0.5);
    // List forms: several quantiles at once (NULL for p outside [0, 1]) and the derivative.
    let tri = "named_struct('x', [0.0, 0.5, 1.0], 'density', [0.0, 2.0, 0.0])";
    let b = s.query(&format!("SELECT curve_quantiles({tri}, [0.125, 0.5, 7]), curve_derivative({tri})")).await.unwrap();
    let q = b[0].column(0).as_list::<i32>().value(0);
    let q = q.as_primitive::<Float64Type>();
    assert!((q.value(0) - 0.25).abs() < 1e-12 && (q.value(1) - 0.5).abs() < 1e-12 && q.is_null(2), "{q:?}");
    let d = b[0].column(1).as_list::<i32>().value(0);
    assert_eq!(d.as_primitive::<Float64Type>().values().to_vec(), vec![4.0, 0.0, -4.0]);
}
