//! `private_kde` through real SQL over real Parquet files.

mod common;

use common::{TempDir, kde_result, mixture, write_x};
use datafusion::common::DataFusionError;
use dpcurve::{DpSession, NoiseSource, SessionOptions};

fn session(noise: NoiseSource, partitions: usize) -> DpSession {
    DpSession::new(SessionOptions { target_partitions: Some(partitions), noise, allow_statements: true, cluster: None })
}

async fn table(dir: &TempDir, name: &str, values: &[Option<f64>], noise: NoiseSource) -> DpSession {
    write_x(&dir.path(&format!("{name}.parquet")), values);
    let s = session(noise, 2);
    s.register_parquet(name, &dir.str(&format!("{name}.parquet"))).await.unwrap();
    s
}

fn some(v: &[f64]) -> Vec<Option<f64>> {
    v.iter().map(|&x| Some(x)).collect()
}

#[tokio::test]
async fn positional_and_named_arguments_give_the_same_release() {
    let dir = TempDir::new("named");
    let s = table(&dir, "t", &some(&mixture(2_000, 1)), NoiseSource::TestSeed(42)).await;
    let queries = [
        "SELECT private_kde(x, 0.05, 1.0, 1e-6, 0.0, 1.0, 256, 'analytic', true) FROM t",
        "SELECT private_kde(x, 0.05, 1.0, 1e-6, 0, 1, 256) FROM t",
        "SELECT private_kde(value => x, bandwidth => 0.05, epsilon => 1.0, delta => 1e-6, lo => 0, hi => 1, points => 256) FROM t",
        "SELECT private_kde(x, points => 256, hi => 1, lo => 0, delta => 0.000001, epsilon => 1, bandwidth => 0.025 * 2) FROM t",
        "SELECT PRIVATE_KDE(x, 0.05, 1, 1e-6, lo => 0, hi => 1, points => 256, nonneg => true) FROM t",
        "SELECT private_kde(x, 0.05, 1, 1e-6, 0, 1, points := 256, calibration => 'ANALYTIC') FROM t",
        "SELECT private_kde(x, 0.05, 1, 1e-6, 0, 1, points := 256, mechanism => 'AUTO', normalize => 'project') FROM t",
    ];
    let first = kde_result(&s.query(queries[0]).await.unwrap());
    assert_eq!(first.0.len(), 256);
    assert!(first.1.is_some());
    for q in &queries[1..] {
        assert_eq!(kde_result(&s.query(q).await.unwrap()), first, "{q}");
    }
    // A different parameter changes the release (the comparison above is not vacuous).
    let other = kde_result(
        &s.query("SELECT private_kde(x, 0.05, 1, 1e-6, 0, 1, 256, normalize => 'rescale') FROM t").await.unwrap(),
    );
    assert_ne!(other, first);
}

#[tokio::test]
async fn result_is_a_struct_that_unnests_into_rows() {
    let dir = TempDir::new("unnest");
    let s = table(&dir, "t", &some(&mixture(5_000, 2)), NoiseSource::Os).await;
    let b = s
        .query(
            "SELECT unnest(kde.x) AS x, unnest(kde.density) AS density \
             FROM (SELECT private_kde(x, bandwidth => 0.05, epsilon => 1, delta => 1e-6, lo => 0, hi => 1, points => 64) AS kde FROM t)",
        )
        .await
        .unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 64);
    assert_eq!(b[0].schema().field(0).name(), "x");
    // Field access and the three fields.
    let b = s
        .query("SELECT r['mass'] AS mass, array_length(r['x']) AS n FROM (SELECT private_kde(x, 0.05, 1, 1e-6, 0, 1) AS r FROM t)")
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&b).unwrap().to_string();
    assert!(text.contains("512"), "default grid has 512 points: {text}");
}

#[tokio::test]
async fn density_integrates_to_one_and_mass_estimates_the_count() {
    let dir = TempDir::new("mass");
    let s = table(&dir, "t", &some(&mixture(20_000, 3)), NoiseSource::TestSeed(3)).await;
    let (x, d, mass) =
        kde_result(&s.query("SELECT private_kde(x, 0.02, 1, 1e-6, -0.5, 1.5, 400) FROM t").await.unwrap());
    let d = d.unwrap();
    let step = x[1] - x[0];
    let integral = step * (d.iter().sum::<f64>() - 0.5 * (d[0] + d[d.len() - 1]));
    assert!((integral - 1.0).abs() < 1e-9, "{integral}");
    assert!(d.iter().all(|v| *v >= 0.0));
    // σ ≈ 4.2 on the kernel sum gives a mass error of a few units at most.
    assert!((mass - 20_000.0).abs() < 50.0, "mass {mass}");
}

/// Every parameter mistake fails at planning time with a message naming the function,
/// the argument and the allowed range — even when the table's file has become unreadable,
/// which shows the error comes before any row is read.
#[tokio::test]
async fn parameter_errors_fail_at_planning_with_precise_messages() {
    let dir = TempDir::new("errors");
    let s = table(&dir, "t", &some(&mixture(100, 4)), NoiseSource::Os).await;
    std::fs::write(dir.path("t.parquet"), b"this is no longer a parquet file").unwrap();
    let ok = "SELECT private_kde(x, 0.1, 1, 1e-6, 0, 1) FROM t";
    let read_err = s.query(ok).await.unwrap_err().to_string();
    assert!(!read_err.contains("private_kde:"), "a valid query reaches the (broken) file: {read_err}");
    let cases = [
        ("private_kde(x, 0, 1, 1e-6, 0, 1)", "argument 'bandwidth' must be a finite number > 0, got 0"),
        ("private_kde(x, -0.1, 1, 1e-6, 0, 1)", "argument 'bandwidth' must be a finite number > 0"),
        ("private_kde(x, 'NaN'::double, 1, 1e-6, 0, 1)", "argument 'bandwidth' must be a finite number > 0, got NaN"),
        (
            "private_kde(x, 0.1, 0, 1e-6, 0, 1)",
            "argument 'epsilon' must be a finite number in [1e-12, 1000] (one budget unit to the per-release maximum), got 0",
        ),
        (
            "private_kde(x, 0.1, 5000, 1e-6, 0, 1)",
            "argument 'epsilon' must be a finite number in [1e-12, 1000] (one budget unit to the per-release maximum), got 5000",
        ),
        ("private_kde(x, 0.1, -2, 1e-6, 0, 1)", "argument 'epsilon' must be a finite number in [1e-12, 1000]"),
        ("private_kde(x, 0.1, 1e-300, 1e-6, 0, 1)", "argument 'epsilon' must be a finite number in [1e-12, 1000]"),
        (
            "private_kde(x, 0.1, 1, -1e-9, 0, 1)",
            "argument 'delta' must be in [0, 1) (0 selects the pure-ε mechanism), got -0.000000001",
        ),
        (
            "private_kde(x, 0.1, 1, 1, 0, 1)",
            "argument 'delta' must be in [0, 1) (0 selects the pure-ε mechanism), got 1",
        ),
        ("private_kde(x, 0.1, 1, 0, 0, 1, mechanism => 'gaussian')", "mechanism => 'gaussian' needs delta > 0"),
        (
            "private_kde(x, 0.1, 1, 1e-6, 0, 1, mechanism => 'fourier')",
            "argument 'mechanism' must be 'auto', 'gaussian', 'laplace' or 'iclp', got 'fourier'",
        ),
        ("private_kde(x, 0.1, 1, 1e-6, 1, 0)", "'lo' and 'hi' must be finite numbers with lo < hi, got lo = 1, hi = 0"),
        ("private_kde(x, 0.1, 1, 1e-6, 0, 0)", "with lo < hi"),
        ("private_kde(x, 0.1, 1, 1e-6)", "arguments 'lo' and 'hi' are required"),
        ("private_kde(x, 0.1, 1, 1e-6, lo => 0)", "arguments 'lo' and 'hi' are required"),
        ("private_kde(x, 0.1, 1, 1e-6, 0, 1, 1)", "argument 'points' must be an integer in [2, 65536], got 1"),
        ("private_kde(x, 0.1, 1, 1e-6, 0, 1, 65537)", "argument 'points' must be an integer in [2, 65536], got 65537"),
        ("private_kde(x, 0.1, 1, 1e-6, 0, 1, 100.5)", "argument 'points' must be an integer in [2, 65536], got 100.5"),
        (
            "private_kde(x, 0.1, 1, 1e-6, 0, 1, calibration => 'gauss')",
            "argument 'calibration' must be 'analytic' or 'classic', got 'gauss'",
        ),
        (
            "private_kde(x, 0.1, 2, 1e-6, 0, 1, calibration => 'classic')",
            "calibration 'classic' is only valid for epsilon <= 1, got epsilon = 2",
        ),
        ("private_kde(x, 0.1, 1, 1e-6, 0, 1, nonneg => 'yes')", "argument 'nonneg' must be a boolean"),
        ("private_kde(x, x, 1, 1e-6, 0, 1)", "argument 'bandwidth' must be a literal constant"),
        ("private_kde(x, 0.1, 1 + x, 1e-6, 0, 1)", "argument 'epsilon' must be a literal constant"),
        ("private_kde(x, 0.1, 1, 1e-6, 0, max(x))", ""),
        ("private_kde(x, 0.1, NULL, 1e-6, 0, 1)", "argument 'epsilon' is required and may not be NULL"),
        ("private_kde(x, 0.1, 1)", "takes 4 to 16 arguments"),
        (
            "private_kde(x, 0.1, 1, 1e-6, 0, 1, normalize => 'softmax')",
            "argument 'normalize' must be 'project', 'rescale' or 'none', got 'softmax'",
        ),
        (
            "private_kde(x, 0.1, 1, 1e-6, 0, 1, nonneg => false, normalize => 'project')",
            "arguments 'nonneg' and 'normalize' disagree",
        ),
        (
            "private_kde(x, 0.1, 1, 1e-6, 0, 1, band_alpha => 1.5)",
            "argument 'band_alpha' must be in the open interval (0, 1), got 1.5",
        ),
        (
            "private_kde(x, 0.1, 1, 1e-6, 0, 1, 10, 'analytic', true, 'project', 0.05, 'auto', 5, 1e-6, 10, 'gaussian', 7)",
            "takes 4 to 16 arguments",
        ),
        (
            "private_kde(x, 0.1, 1, 1e-6, 0, 1, 10, 'analytic', true, 'project', 0.05, 'auto', 5, 1e-6, 10, 'gaussian', 7, nonneg => true)",
            "too many arguments",
        ),
        ("private_kde('a', 0.1, 1, 1e-6, 0, 1)", "argument 'value' must be numeric, got type Utf8"),
        (
            "private_kde(x, bw => 0.1, epsilon => 1, delta => 1e-6)",
            "unknown argument name 'bw'; valid names are: value, bandwidth",
        ),
        ("private_kde(x, 0.1, 1, 1e-6, lo => 0, lo => 1)", "argument 'lo' is given more than once"),
        ("private_kde(x, 0.1, 1, 1e-6, lo => 0, 1)", "positional argument at position 5 follows a named argument"),
        ("private_kde(x, epsilon => 1, delta => 1e-6, lo => 0, hi => 1)", "missing required argument 'bandwidth'"),
        ("private_kde(DISTINCT x, 0.1, 1, 1e-6, 0, 1)", "DISTINCT is not supported"),
        ("private_kde(x, 0.1, 1, 1e-6, 0, 1 ORDER BY x)", "ORDER BY inside the call is not supported"),
        (
            "private_kde(x, 1e6, 1, 1e-6, 0, 1, 65536)",
            "the bandwidth is too wide for a grid of 65536 points: the noise needs",
        ),
    ];
    for (call, want) in cases {
        let sql = format!("SELECT {call} FROM t");
        let err = s.query(&sql).await.expect_err(&sql);
        let msg = err.to_string();
        assert!(matches!(err.find_root(), DataFusionError::Plan(_)), "{sql}: not a planning error: {msg}");
        assert!(msg.contains("private_kde") || want.is_empty(), "{sql}: {msg}");
        assert!(msg.contains(want), "{sql}:\n  got:  {msg}\n  want: {want}");
        assert!(!msg.contains("Parquet") && !msg.contains("parquet"), "{sql} read the file: {msg}");
    }
}

#[tokio::test]
async fn window_use_is_rejected_at_planning() {
    let dir = TempDir::new("window");
    let s = table(&dir, "t", &some(&[0.5, 0.6]), NoiseSource::Os).await;
    for sql in [
        "SELECT private_kde(x, 0.1, 1, 1e-6, 0, 1) OVER () FROM t",
        "SELECT private_kde(x, 0.1, 1, 1e-6, 0, 1) OVER (ORDER BY x) FROM t",
        "SELECT count(*) FROM t WHERE x > (SELECT max(r['mass']) FROM (SELECT private_kde(x, 0.1, 1, 1e-6, 0, 1) OVER () AS r FROM t))",
    ] {
        let msg = s.query(sql).await.expect_err(sql).to_string();
        assert!(msg.contains("private_kde: cannot be used as a window function"), "{sql}: {msg}");
    }
}

/// The statistic ignores NULL, NaN and ±inf rows entirely, and no value makes a query fail.
#[tokio::test]
async fn non_finite_null_and_extreme_rows_are_dropped_silently() {
    let dir = TempDir::new("nonfinite");
    let clean = mixture(3_000, 5);
    let mut dirty: Vec<Option<f64>> = some(&clean);
    for (i, v) in [None, Some(f64::NAN), Some(f64::INFINITY), Some(f64::NEG_INFINITY), None, Some(-f64::NAN)]
        .into_iter()
        .enumerate()
    {
        dirty.insert(i * 400, v);
    }
    let a = table(&dir, "clean", &some(&clean), NoiseSource::Off).await;
    let b = table(&dir, "dirty", &dirty, NoiseSource::Off).await;
    let q = |t: &str| format!("SELECT private_kde(x, 0.03, 1, 1e-6, 0, 1, 300) FROM {t}");
    assert_eq!(kde_result(&a.query(&q("clean")).await.unwrap()), kde_result(&b.query(&q("dirty")).await.unwrap()));

    // Values that could break naive arithmetic: huge, tiny, subnormal, signed zero.
    let extreme = some(&[f64::MAX, f64::MIN, 1e-310, -0.0, 5e-324, 1e300, -1e300, 0.5]);
    let c = table(&dir, "extreme", &extreme, NoiseSource::Os).await;
    c.query(&q("extreme")).await.unwrap();
    let all_bad: Vec<Option<f64>> = vec![Some(f64::NAN), None, Some(f64::INFINITY)];
    let d = table(&dir, "bad", &all_bad, NoiseSource::Os).await;
    d.query(&q("bad")).await.unwrap();
}

#[tokio::test]
async fn empty_tables_and_empty_filters_release_without_error() {
    let dir = TempDir::new("empty");
    let s = table(&dir, "t", &some(&mixture(1_000, 6)), NoiseSource::Off).await;
    let e = table(&dir, "e", &[], NoiseSource::Off).await;
    let q = "SELECT private_kde(x, 0.05, 1, 1e-6, 0, 1) FROM";
    // Noise off: nothing in range, so the curve has no mass and the density is NULL.
    for (sess, sql) in [(&s, format!("{q} t WHERE x > 100")), (&e, format!("{q} e"))] {
        let (x, density, mass) = kde_result(&sess.query(&sql).await.unwrap());
        assert_eq!(x.len(), 512);
        assert_eq!(density, None, "{sql}");
        assert_eq!(mass, 0.0);
    }
    // With real noise the query still succeeds (density may or may not be NULL).
    let noisy = table(&dir, "e2", &[], NoiseSource::Os).await;
    let (_, _, mass) = kde_result(&noisy.query(&format!("{q} e2")).await.unwrap());
    assert!(mass.is_finite());
}

/// Partial/final aggregation over several files and partitions gives exactly the same
/// sufficient statistic (bit-identical output with the noise off) as one partition.
#[tokio::test]
async fn multi_file_multi_partition_statistic_is_exact() {
    let dir = TempDir::new("multi");
    std::fs::create_dir_all(dir.path("parts")).unwrap();
    let all = mixture(40_000, 7);
    for (i, chunk) in all.chunks(9_000).enumerate() {
        write_x(&dir.path(&format!("parts/part-{i}.parquet")), &some(chunk));
    }
    write_x(&dir.path("single.parquet"), &some(&all));
    let q = "SELECT private_kde(x, 0.01, 1, 1e-6, -0.2, 1.2, 1000) FROM t";
    let mut results = Vec::new();
    for (partitions, path) in [(1, "single.parquet"), (4, "parts"), (2, "parts"), (3, "single.parquet")] {
        let s = session(NoiseSource::Off, partitions);
        s.register_parquet("t", &dir.str(path)).await.unwrap();
        if partitions == 4 {
            let plan = s.sql(&format!("EXPLAIN {q}")).await.unwrap();
            let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan[0].batches).unwrap().to_string();
            assert!(text.contains("mode=Partial"), "expected partial aggregation:\n{text}");
        }
        results.push(kde_result(&s.query(q).await.unwrap()));
    }
    for r in &results[1..] {
        assert_eq!(r, &results[0]);
    }
    // And the noiseless release is the binned KDE of all rows (mass ≈ count in range).
    assert!((results[0].2 - 40_000.0).abs() < 5.0, "{}", results[0].2);
}

#[tokio::test]
async fn filters_and_expressions_feed_the_aggregate() {
    let dir = TempDir::new("filter");
    let s = table(&dir, "t", &some(&mixture(10_000, 8)), NoiseSource::Off).await;
    let (_, _, m1) =
        kde_result(&s.query("SELECT private_kde(x, 0.02, 1, 1e-6, 0, 1) FROM t WHERE x < 0.5").await.unwrap());
    let (_, _, m2) = kde_result(
        &s.query("SELECT private_kde(x, 0.02, 1, 1e-6, 0, 1) FILTER (WHERE x >= 0.5) FROM t").await.unwrap(),
    );
    assert!((m1 + m2 - 10_000.0).abs() < 100.0, "{m1} + {m2}");
    // A row-wise expression as the value argument, and an integer column type.
    let (_, _, m3) = kde_result(&s.query("SELECT private_kde(1 - x, 0.02, 1, 1e-6, 0, 1) FROM t").await.unwrap());
    assert!((m3 - m1 - m2).abs() < 100.0);
    s.query("SELECT private_kde(CAST(x * 100 AS INT), 2, 1, 1e-6, 0, 100) FROM t").await.unwrap();
    // A bandwidth far below the grid step (exact evaluation mode) also works.
    s.query("SELECT private_kde(x, 1e-9, 1, 1e-6, 0, 1000000, 65536) FROM t").await.unwrap();
}
