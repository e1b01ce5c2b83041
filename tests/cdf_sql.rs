//! `private_cdf` and `private_quantiles` through real SQL over real Parquet files: accuracy of
//! the noiseless release, argument handling, bands that contain the estimates, grouped and
//! unit-bounded calls on a catalog, stored releases read back and evaluated.

mod common;

use std::sync::Arc;

use common::{TempDir, mixture, write_x};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::common::DataFusionError;
use dpcurve::{Admin, AnalystSession, DpSession, NoiseSource, SessionOptions};

fn session(noise: NoiseSource) -> DpSession {
    DpSession::new(SessionOptions { target_partitions: Some(2), noise, allow_statements: true, cluster: None })
}

async fn table(dir: &TempDir, values: &[f64], noise: NoiseSource) -> DpSession {
    let v: Vec<Option<f64>> = values.iter().map(|&x| Some(x)).collect();
    write_x(&dir.path("t.parquet"), &v);
    let s = session(noise);
    s.register_parquet("t", &dir.str("t.parquet")).await.unwrap();
    s
}

/// A list field of a one-row struct result in column `col`.
fn list(b: &[RecordBatch], col: usize, name: &str) -> Option<Vec<f64>> {
    let b = b.iter().find(|b| b.num_rows() > 0).unwrap();
    let l = b.column(col).as_struct().column_by_name(name).unwrap().as_list::<i32>();
    l.is_valid(0).then(|| l.value(0).as_primitive::<Float64Type>().values().to_vec())
}

fn scalar(b: &[RecordBatch], name: &str) -> f64 {
    let b = b.iter().find(|b| b.num_rows() > 0).unwrap();
    b.column(0).as_struct().column_by_name(name).unwrap().as_primitive::<Float64Type>().value(0)
}

fn leaves(b: &[RecordBatch]) -> i64 {
    let b = b.iter().find(|b| b.num_rows() > 0).unwrap();
    b.column(0).as_struct().column_by_name("leaves").unwrap().as_primitive::<Int64Type>().value(0)
}

fn empirical(sorted: &[f64], x: f64) -> f64 {
    sorted.partition_point(|v| *v <= x) as f64 / sorted.len() as f64
}

#[tokio::test]
async fn the_noiseless_release_is_the_data_cdf_and_its_quantiles() {
    let dir = TempDir::new("cdf-exact");
    let mut xs = mixture(20_000, 3);
    let s = table(&dir, &xs, NoiseSource::Off).await;
    xs.sort_by(f64::total_cmp);
    let b =
        s.query("SELECT private_cdf(x, 1.0, 0, lo => 0, hi => 1, points => 101, leaves => 1024) FROM t").await.unwrap();
    let (x, cdf) = (list(&b, 0, "x").unwrap(), list(&b, 0, "cdf").unwrap());
    assert_eq!((x.len(), leaves(&b), scalar(&b, "count")), (101, 1024, 20_000.0));
    let worst = x.iter().zip(&cdf).map(|(x, f)| (f - empirical(&xs, *x)).abs()).fold(0.0, f64::max);
    assert!(worst < 2e-3, "noiseless CDF off the data's by {worst}");
    assert!(cdf.windows(2).all(|w| w[0] <= w[1]) && cdf[0] == 0.0 && cdf[100] == 1.0);

    let probs = [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99];
    let b = s
        .query("SELECT private_quantiles(x, [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99], 1.0, 0, lo => 0, hi => 1, leaves => 1024) FROM t")
        .await
        .unwrap();
    let (p, q) = (list(&b, 0, "p").unwrap(), list(&b, 0, "quantile").unwrap());
    assert_eq!(p, probs);
    for (p, q) in p.iter().zip(&q) {
        let rank = empirical(&xs, *q);
        assert!((rank - p).abs() < 2e-3, "quantile {p}: rank {rank}");
    }
}

#[tokio::test]
async fn arguments_named_or_positional_and_precise_refusals() {
    let dir = TempDir::new("cdf-args");
    let s = table(&dir, &mixture(2_000, 1), NoiseSource::TestSeed(7)).await;
    let a = s.query("SELECT private_cdf(x, 1.0, 0, 0, 1, 64) FROM t").await.unwrap();
    let b = s
        .query("SELECT private_cdf(x, points => 64, hi => 1, lo => 0, delta => 0, epsilon => 1) FROM t")
        .await
        .unwrap();
    assert_eq!(list(&a, 0, "cdf"), list(&b, 0, "cdf"));
    let c = s
        .query("SELECT private_cdf(x, 1.0, 0, 0, 1, 64, mechanism => 'laplace', leaves => 'auto') FROM t")
        .await
        .unwrap();
    assert_eq!(list(&a, 0, "cdf"), list(&c, 0, "cdf"), "the defaults are laplace and 'auto'");
    let d = s.query("SELECT private_cdf(x, 1.0, 0, 0, 1, 64, leaves => 8) FROM t").await.unwrap();
    assert_ne!(list(&a, 0, "cdf"), list(&d, 0, "cdf"), "another parameter, another release");
    assert_eq!(leaves(&d), 8);

    for (sql, want) in [
        ("private_cdf(x, 1.0, 0, 0, 1, leaves => 100)", "'leaves' must be 'auto' or a power of two"),
        ("private_cdf(x, 1.0, 0, 0, 1, leaves => 131072)", "'leaves' must be 'auto' or a power of two"),
        ("private_cdf(x, 1.0, 0, 0, 1, leaves => 'many')", "'leaves' must be a number or 'auto'"),
        ("private_cdf(x, 1.0, 0)", "arguments 'lo' and 'hi' are required"),
        ("private_cdf(x, 1.0, 0, 1, 0)", "lo < hi"),
        ("private_cdf(x, 1.0, 1.5, 0, 1)", "'delta' must be in [0, 1)"),
        ("private_cdf(x, 1.0, 0, 0, 1, mechanism => 'gaussian')", "needs delta > 0"),
        ("private_cdf(x, 1.0, 0, 0, 1, mechanism => 'exponential')", "'mechanism' must be"),
        ("private_cdf(x, 2.0, 1e-6, 0, 1, calibration => 'classic')", "only valid for epsilon <= 1"),
        ("private_cdf(x, 1.0, 0, 0, 1, points => 1)", "'points' must be an integer in [2, 65536]"),
        ("private_cdf(x, 1.0, 0, 0, 1, band_alpha => 1)", "'band_alpha' must be in the open interval"),
        ("private_quantiles(x, [0.5, 1.5], 1.0, 0, 0, 1)", "numbers in [0, 1], got 1.5"),
        ("private_quantiles(x, 0.5, 1.0, 0, 0, 1)", "must be a list of numbers"),
        ("private_quantiles(x, [0.5], 1.0, 0)", "arguments 'lo' and 'hi' are required"),
        ("private_quantiles(x, [0.5], 1.0, 0, 0, 1, points => 5)", "points"),
    ] {
        let err = s.query(&format!("SELECT {sql} FROM t")).await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataFusionError::Plan(_) | DataFusionError::Execution(_)), "{sql}: {err:?}");
        assert!(msg.contains(want), "{sql}: {msg}");
    }
}

#[tokio::test]
async fn bands_hold_the_estimates_and_unnest_into_rows() {
    let dir = TempDir::new("cdf-bands");
    let s = table(&dir, &mixture(5_000, 2), NoiseSource::Os).await;
    let b = s.query("SELECT private_cdf(x, 1.0, 1e-6, 0, 1, 64, mechanism => 'gaussian') FROM t").await.unwrap();
    let (cdf, nb, band) =
        (list(&b, 0, "cdf").unwrap(), list(&b, 0, "noise_band").unwrap(), list(&b, 0, "band").unwrap());
    assert!(nb.iter().zip(&band).all(|(n, b)| *n > 0.0 && b > n), "the population band is wider");
    assert!(cdf.windows(2).all(|w| w[0] <= w[1]));
    let q =
        s.query("SELECT private_quantiles(x, [0.05, 0.5, 0.95], 1.0, 0, lo => 0, hi => 1) AS q FROM t").await.unwrap();
    let (est, lower, upper) =
        (list(&q, 0, "quantile").unwrap(), list(&q, 0, "lower").unwrap(), list(&q, 0, "upper").unwrap());
    for i in 0..3 {
        assert!(lower[i] <= est[i] && est[i] <= upper[i] && upper[i] - lower[i] < 0.5, "{lower:?} {est:?} {upper:?}");
    }
    let rows = s
        .query(
            "SELECT unnest(c.x) AS x, unnest(c.cdf) AS cdf, unnest(c.band) AS band \
             FROM (SELECT private_cdf(x, 1.0, 0, 0, 1, 32) AS c FROM t)",
        )
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 32);
}

#[tokio::test]
async fn a_small_table_gets_a_coarse_tree_and_a_large_one_a_fine_tree() {
    let dir = TempDir::new("cdf-auto");
    let small = table(&dir, &mixture(200, 4), NoiseSource::TestSeed(1)).await;
    let b = small.query("SELECT private_cdf(x, 0.5, 0, 0, 1) FROM t").await.unwrap();
    let coarse = leaves(&b);
    let dir2 = TempDir::new("cdf-auto-large");
    let large = table(&dir2, &mixture(200_000, 4), NoiseSource::TestSeed(1)).await;
    let b = large.query("SELECT private_cdf(x, 0.5, 0, 0, 1) FROM t").await.unwrap();
    let fine = leaves(&b);
    // 2^k ≈ max(sqrt(ñ·ε'), ñ·ε'²/72), ε' = 0.95·ε: 8 at 200 rows, 512 at 200 000.
    assert!(coarse <= 16 && fine >= 128, "{coarse} {fine}");
}

/// A catalog table with declared groups and a privacy unit.
async fn catalog(dir: &TempDir) -> (Admin, AnalystSession) {
    let n = 4000;
    let xs: Vec<f64> = mixture(n, 9).into_iter().map(|v| v.clamp(0.0, 1.0)).collect();
    let region: Vec<&str> = (0..n).map(|i| ["a", "b", "z"][i % 3]).collect();
    let person: Vec<i64> = (0..n as i64).map(|i| i / 4).collect();
    common::write_columns(
        &dir.path("p.parquet"),
        vec![
            ("region", Arc::new(StringArray::from(region)) as ArrayRef),
            ("person", Arc::new(datafusion::arrow::array::Int64Array::from(person))),
            ("x", Arc::new(Float64Array::from(xs))),
        ],
    );
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("p", &dir.str("p.parquet")).await.unwrap();
    admin.make_private("p", 10.0, 1e-3).await.unwrap();
    admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();
    admin.set_keys("p", "region", &["a".into(), "b".into(), "c".into()]).await.unwrap();
    let opts = SessionOptions { noise: NoiseSource::Os, target_partitions: Some(2), ..Default::default() };
    let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
    (admin, s)
}

#[tokio::test]
async fn grouped_calls_take_the_policy_bounds_and_stored_releases_read_back() {
    let dir = TempDir::new("cdf-catalog");
    let (_admin, s) = catalog(&dir).await;
    let b = s
        .query("SELECT region, private_quantiles(x, [0.5], 0.5, 0) AS q FROM p GROUP BY region ORDER BY region")
        .await
        .unwrap();
    let b = b.iter().find(|b| b.num_rows() > 0).unwrap();
    let regions: Vec<String> = (0..b.num_rows())
        .map(|i| datafusion::arrow::util::display::array_value_to_string(b.column(0), i).unwrap())
        .collect();
    assert_eq!(regions, ["a", "b", "c"], "declared keys, the empty one included, z dropped");
    let q = b.column(1).as_struct();
    let ids = q.column_by_name("release").unwrap().as_string::<i32>();
    let id = ids.value(0).to_string();

    // The stored release reads back identically and evaluates as its distribution function.
    let back = s.query(&format!("SELECT * FROM release('{id}')")).await.unwrap();
    let back_q = list(&back, 0, "quantile");
    let first = q.column_by_name("quantile").unwrap().as_list::<i32>();
    assert_eq!(back_q, first.is_valid(0).then(|| first.value(0).as_primitive::<Float64Type>().values().to_vec()));
    let c = s.query("SELECT private_cdf(x, 0.5, 0, points => 33) AS c FROM p").await.unwrap();
    let cid = c[0].column(0).as_struct().column_by_name("release").unwrap().as_string::<i32>().value(0).to_string();
    let (x, cdf) = (list(&c, 0, "x").unwrap(), list(&c, 0, "cdf").unwrap());
    let eval = s.query(&format!("SELECT release_eval('{cid}', {})", x[10])).await.unwrap();
    let v = eval[0].column(0).as_primitive::<Float64Type>().value(0);
    assert_eq!(v, cdf[10], "the stored CDF at a grid point is the returned value");
    let outside = s.query(&format!("SELECT release_eval('{cid}', 2.0)")).await.unwrap();
    assert!(outside[0].column(0).is_null(0));
}
