//! `private_mean_curve` through real SQL over real Parquet list columns.

mod common;

use common::{ListKind, TempDir, mean_result, write_curves};
use datafusion::common::DataFusionError;
use dpcurve::datagen::{karhunen_loeve_curves, true_mean};
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, DpSession, NoiseSource, SessionOptions};

fn session(noise: NoiseSource, partitions: usize) -> DpSession {
    DpSession::new(SessionOptions { target_partitions: Some(partitions), noise, allow_statements: true, cluster: None })
}

async fn table(
    dir: &TempDir,
    name: &str,
    curves: &[Option<Vec<f64>>],
    kind: ListKind,
    noise: NoiseSource,
) -> DpSession {
    let file = format!("{name}.parquet");
    write_curves(&dir.path(&file), curves, kind);
    let s = session(noise, 2);
    s.register_parquet(name, &dir.str(&file)).await.unwrap();
    s
}

fn curves(n: usize, m: usize, seed: u64) -> Vec<Option<Vec<f64>>> {
    karhunen_loeve_curves(n, m, seed).into_iter().map(Some).collect()
}

const Q: &str = "private_mean_curve(c, 1.0, 1e-5, clip => 0.5, points => 50)";

#[tokio::test]
async fn list_types_named_arguments_and_noiseless_accuracy() {
    let dir = TempDir::new("mc-types");
    let data = curves(400, 50, 1);
    let mut results = Vec::new();
    for (name, kind) in [("l", ListKind::List), ("ll", ListKind::LargeList), ("f", ListKind::Fixed(50))] {
        let s = table(&dir, name, &data, kind, NoiseSource::Off).await;
        results.push(mean_result(&s.query(&format!("SELECT {Q} FROM {name}")).await.unwrap()));
        if let ListKind::Fixed(_) = kind {
            // The fixed-size list carries m, so points may be omitted.
            let r = mean_result(&s.query("SELECT private_mean_curve(c, 1.0, 1e-5, clip => 0.5) FROM f").await.unwrap());
            assert_eq!(r, results[0]);
        }
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
    let (t, _, n) = &results[0];
    assert_eq!((t.len(), *n), (50, 400));
    // With a light penalty the noiseless estimate is close to the true mean (the default
    // penalty shrinks more: that bias buys less noise, see the utility study).
    let s = table(&dir, "acc", &data, ListKind::List, NoiseSource::Off).await;
    let (_, mean, _) = mean_result(
        &s.query("SELECT private_mean_curve(c, 1.0, 1e-5, clip => 0.5, points => 50, penalty => 1e-4) FROM acc")
            .await
            .unwrap(),
    );
    let truth = true_mean(50);
    let err = (mean.iter().zip(&truth).map(|(a, b)| (a - b).powi(2)).sum::<f64>() / 50.0).sqrt();
    assert!(err < 0.02, "L2 error of the noiseless estimate {err}");

    let s = table(&dir, "seeded", &data, ListKind::List, NoiseSource::TestSeed(5)).await;
    let a = mean_result(
        &s.query("SELECT private_mean_curve(c, 1.0, 1e-5, 'matern32', 0.2, 0.1, 1, 0.5, 50) FROM seeded")
            .await
            .unwrap(),
    );
    let b = mean_result(
        &s.query("SELECT private_mean_curve(c, points => 50, clip => 0.5, delta => 1e-5, epsilon => 1.0) FROM seeded")
            .await
            .unwrap(),
    );
    assert_eq!(a, b, "named and positional arguments with the same defaults give the same release");
}

#[tokio::test]
async fn wrong_length_null_and_non_finite_rows_are_dropped() {
    let dir = TempDir::new("mc-drop");
    let clean = curves(200, 50, 2);
    let mut dirty = clean.clone();
    dirty.push(Some(vec![0.1; 49]));
    dirty.push(Some(vec![0.1; 51]));
    dirty.push(None);
    let mut nan = vec![0.1; 50];
    nan[10] = f64::NAN;
    dirty.push(Some(nan));
    let mut inf = vec![0.1; 50];
    inf[0] = f64::INFINITY;
    dirty.push(Some(inf));
    dirty.push(Some(vec![]));
    let a = table(&dir, "clean", &clean, ListKind::List, NoiseSource::Off).await;
    let b = table(&dir, "dirty", &dirty, ListKind::List, NoiseSource::Off).await;
    let ra = mean_result(&a.query(&format!("SELECT {Q} FROM clean")).await.unwrap());
    let rb = mean_result(&b.query(&format!("SELECT {Q} FROM dirty")).await.unwrap());
    assert_eq!(ra, rb);
    // Huge curves are clipped, never an error.
    let big: Vec<Option<Vec<f64>>> = vec![Some(vec![1e300; 50]), Some(vec![-1e308; 50])];
    let c = table(&dir, "big", &big, ListKind::List, NoiseSource::Os).await;
    c.query(&format!("SELECT {Q} FROM big")).await.unwrap();
}

#[tokio::test]
async fn empty_inputs_release_without_error() {
    let dir = TempDir::new("mc-empty");
    let s = table(&dir, "t", &curves(50, 50, 3), ListKind::List, NoiseSource::Off).await;
    let (_, mean, n) = mean_result(&s.query(&format!("SELECT {Q} FROM t WHERE c[1] > 100")).await.unwrap());
    assert_eq!(n, 0);
    assert!(mean.iter().all(|v| *v == 0.0));
    let e = table(&dir, "e", &[], ListKind::Fixed(50), NoiseSource::Os).await;
    let (_, mean, n) = mean_result(&e.query("SELECT private_mean_curve(c, 1.0, 0, clip => 1) FROM e").await.unwrap());
    assert!(mean.iter().all(|v| v.is_finite()), "n = {n}");
}

#[tokio::test]
async fn multi_file_multi_partition_statistic_is_exact() {
    let dir = TempDir::new("mc-multi");
    std::fs::create_dir_all(dir.path("parts")).unwrap();
    let data = curves(900, 50, 4);
    for (i, chunk) in data.chunks(200).enumerate() {
        write_curves(&dir.path(&format!("parts/p{i}.parquet")), chunk, ListKind::List);
    }
    write_curves(&dir.path("one.parquet"), &data, ListKind::List);
    let mut results = Vec::new();
    for (p, path) in [(1, "one.parquet"), (4, "parts"), (3, "parts")] {
        let s = session(NoiseSource::Off, p);
        s.register_parquet("t", &dir.str(path)).await.unwrap();
        results.push(mean_result(&s.query(&format!("SELECT {Q} FROM t")).await.unwrap()));
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

#[tokio::test]
async fn parameter_errors_fail_at_planning_with_precise_messages() {
    let dir = TempDir::new("mc-errors");
    let s = table(&dir, "t", &curves(20, 50, 5), ListKind::List, NoiseSource::Os).await;
    std::fs::write(dir.path("t.parquet"), b"no longer parquet").unwrap();
    let cases = [
        ("private_mean_curve(c, 1.0, 1e-5, points => 50)", "argument 'clip' is required"),
        ("private_mean_curve(c, 1.0, 1e-5, clip => 1)", "the curve length is required"),
        (
            "private_mean_curve(c, 0, 1e-5, clip => 1, points => 50)",
            "argument 'epsilon' must be a finite number in [1e-12, 1000]",
        ),
        ("private_mean_curve(c, 1, 1, clip => 1, points => 50)", "argument 'delta' must be in [0, 1)"),
        ("private_mean_curve(c, 1, -0.1, clip => 1, points => 50)", "argument 'delta' must be in [0, 1)"),
        (
            "private_mean_curve(c, 1, 1e-5, kernel => 'rbf', clip => 1, points => 50)",
            "argument 'kernel' must be 'gaussian', 'matern52', 'matern32' or 'exponential', got 'rbf'",
        ),
        (
            "private_mean_curve(c, 1, 1e-5, range => 0, clip => 1, points => 50)",
            "argument 'range' must be a finite number > 0, got 0",
        ),
        (
            "private_mean_curve(c, 1, 1e-5, penalty => -1, clip => 1, points => 50)",
            "argument 'penalty' must be a finite number > 0, got -1",
        ),
        (
            "private_mean_curve(c, 1, 1e-5, eta => 0.5, clip => 1, points => 50)",
            "argument 'eta' must be a finite number >= 1, got 0.5",
        ),
        (
            "private_mean_curve(c, 1, 1e-5, clip => -1, points => 50)",
            "argument 'clip' must be a finite number > 0, got -1",
        ),
        (
            "private_mean_curve(c, 1, 1e-5, clip => 1, points => 1)",
            "argument 'points' must be an integer in [2, 2048], got 1",
        ),
        (
            "private_mean_curve(c, 1, 1e-5, clip => 1, points => 50, count_fraction => 1)",
            "argument 'count_fraction' must be in the open interval (0, 1), got 1",
        ),
        (
            "private_mean_curve(c, 2, 1e-5, clip => 1, points => 50, calibration => 'classic')",
            "calibration 'classic' is only valid for epsilon <= 1",
        ),
        ("private_mean_curve(c, 1, 1e-5, clip => c[1], points => 50)", "argument 'clip' must be a literal constant"),
        (
            "private_mean_curve(c[1], 1, 1e-5, clip => 1, points => 50)",
            "argument 'curve' must be a list of numbers, got type Float64",
        ),
        ("private_mean_curve(c, 1, 1e-5, clip => 1, points => 50) OVER ()", "cannot be used as a window function"),
    ];
    for (call, want) in cases {
        let sql = format!("SELECT {call} FROM t");
        let err = s.query(&sql).await.expect_err(&sql);
        let msg = err.to_string();
        assert!(matches!(err.find_root(), DataFusionError::Plan(_)), "{sql}: not a planning error: {msg}");
        assert!(msg.contains(want), "{sql}:\n  got:  {msg}\n  want: {want}");
    }
}

#[tokio::test]
async fn private_tables_are_charged_and_policy_supplies_clip_and_length() {
    let dir = TempDir::new("mc-policy");
    write_curves(&dir.path("g.parquet"), &curves(300, 40, 6), ListKind::List);
    let cat = dir.path("catalog.db");
    let admin = Admin::open(&cat).unwrap();
    admin.register("growth", &dir.str("g.parquet")).await.unwrap();
    admin.make_private("growth", 2.0, 1e-4).await.unwrap();
    let s = AnalystSession::open(&cat, SessionOptions::default()).await.unwrap();
    let err = s.query("SELECT private_mean_curve(c, 0.5, 1e-6) FROM growth").await.unwrap_err().to_string();
    assert!(err.contains("argument 'clip' is required"), "{err}");
    admin.set_bounds("growth", "c", -0.4, 0.6).await.unwrap();
    admin.set_curve_length("growth", 40).unwrap();
    let s = AnalystSession::open(&cat, SessionOptions::default()).await.unwrap();
    let (t, _, n) = mean_result(&s.query("SELECT private_mean_curve(c, 0.5, 1e-6) FROM growth").await.unwrap());
    assert_eq!(t.len(), 40);
    assert!((n - 300).abs() < 200, "noisy count {n}");
    s.query("SELECT private_mean_curve(c, 0.25, 0) FROM growth").await.unwrap();
    let spent = admin.tables().unwrap().into_iter().find(|t| t.name == "growth").unwrap().policy.unwrap().spent;
    assert_eq!(spent, Budget::total(0.75, 1e-6).unwrap());
    let err = s.query("SELECT c FROM growth").await.unwrap_err().to_string();
    assert!(err.contains("[rule no-raw-rows]"), "{err}");
}

/// `penalty => 'auto'`: φ is the plug-in rule's value at the released count (noise off: the exact
/// count), and the release equals the one at that φ. More curves, a smaller φ.
#[tokio::test]
async fn penalty_auto_is_the_rule_at_the_released_count() {
    use dpcurve::mechanism::curves::mean_curve::{CovKernel, MeanCurveSpec, auto_penalty};
    use dpcurve::mechanism::{Calibration, Contribution};
    let dir = TempDir::new("mc-auto");
    let s = table(&dir, "a", &curves(2_000, 50, 12), ListKind::List, NoiseSource::Off).await;
    let spec = MeanCurveSpec {
        points: 50,
        kernel: CovKernel::Matern32,
        range: 0.2,
        penalty: 0.1,
        eta: 1.0,
        clip: 0.5,
        epsilon: 1.0,
        delta: 1e-5,
        count_fraction: 0.1,
        calibration: Calibration::Analytic,
    };
    let phi = auto_penalty(&spec, Contribution::ROW, 2_000);
    let phi_small = auto_penalty(&spec, Contribution::ROW, 100);
    assert!(phi < 0.02 && phi_small > 4.0 * phi, "φ(2000) = {phi}, φ(100) = {phi_small}");
    let auto = mean_result(
        &s.query("SELECT private_mean_curve(c, 1.0, 1e-5, clip => 0.5, points => 50, penalty => 'auto') FROM a")
            .await
            .unwrap(),
    );
    let explicit = mean_result(
        &s.query(&format!(
            "SELECT private_mean_curve(c, 1.0, 1e-5, clip => 0.5, points => 50, penalty => {phi:?}) FROM a"
        ))
        .await
        .unwrap(),
    );
    assert_eq!(auto, explicit);
    let err = s
        .query("SELECT private_mean_curve(c, 1.0, 1e-5, clip => 0.5, points => 50, penalty => 'x') FROM a")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("must be a number or 'auto'"), "{err}");
}
