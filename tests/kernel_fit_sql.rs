//! `private_kernel_regression` and `private_kernel_classifier` through real SQL over real Parquet
//! behind the catalog's ledger and the planner guard: the policy boxes, exact statistics across
//! files and partitions, the charge, the stored release (`release`, `release_eval`), unnesting into
//! (x, fit) rows, and the guard's refusals — including failure tricks on neighbouring tables.

mod common;

use std::sync::Arc;

use common::{TempDir, floats, write_columns};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::Float64Type;
use dpcurve::mechanism::Grid;
use dpcurve::mechanism::fits::kernel_fit::{FitLoss, FitSpec, KernelFitMechanism};
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::mechanism::{Calibration, Contribution};
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

const N: usize = 4_000;

/// x in [0, 1] from the mixture; y = 0.8·sin(2πx) + noise in about [−1.3, 1.3]; label = y > 0.
fn rows(n: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let xs = dpcurve::datagen::mixture(n, seed);
    let e = dpcurve::datagen::mixture(n, seed + 1);
    let ys = xs.iter().zip(&e).map(|(x, e)| 0.8 * (2.0 * std::f64::consts::PI * x).sin() + (e - 0.5)).collect();
    (xs, ys)
}

fn write_rows(path: &std::path::Path, xs: &[f64], ys: &[f64], region: Option<&[&str]>) {
    let label: BooleanArray = ys.iter().map(|y| Some(*y > 0.0)).collect();
    let mut cols = vec![
        ("x", Arc::new(Float64Array::from(xs.to_vec())) as ArrayRef),
        ("y", Arc::new(Float64Array::from(ys.to_vec())) as ArrayRef),
        ("label", Arc::new(label) as ArrayRef),
    ];
    if let Some(r) = region {
        cols.push(("region", Arc::new(StringArray::from(r.to_vec())) as ArrayRef));
    }
    write_columns(path, cols);
}

struct Fixture {
    dir: TempDir,
    admin: Admin,
}

/// `t` (private, x in [0, 1] and y in [−2, 2] by policy, two files), `g` (grouped by a declared
/// region), `u` (only x bounded), `h` (= `t` plus a row at (0.5, 0)), `pts` (public points).
async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    let (xs, ys) = rows(N, 11);
    std::fs::create_dir_all(dir.path("t")).unwrap();
    write_rows(&dir.path("t/a.parquet"), &xs[..N / 3], &ys[..N / 3], None);
    write_rows(&dir.path("t/b.parquet"), &xs[N / 3..], &ys[N / 3..], None);
    let regions: Vec<&str> = (0..N).map(|i| ["a", "b"][i % 2]).collect();
    write_rows(&dir.path("g.parquet"), &xs, &ys, Some(&regions));
    write_rows(&dir.path("u.parquet"), &xs, &ys, None);
    let (mut hx, mut hy) = (xs.clone(), ys.clone());
    hx.push(0.5);
    hy.push(0.0);
    write_rows(&dir.path("h.parquet"), &hx, &hy, None);
    let px = [0.0, 0.01, 0.333, 0.5, 1.0, 1.5, -0.1];
    write_rows(&dir.path("pts.parquet"), &px, &[0.0; 7], None);
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("t", &dir.str("t")).await.unwrap();
    for t in ["g", "u", "pts", "h"] {
        admin.register(t, &dir.str(&format!("{t}.parquet"))).await.unwrap();
    }
    for t in ["t", "g", "u", "h"] {
        admin.make_private(t, 20.0, 1e-3).await.unwrap();
        admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
    }
    for t in ["t", "g", "h"] {
        admin.set_bounds(t, "y", -2.0, 2.0).await.unwrap();
    }
    admin.set_keys("g", "region", &["a".into(), "b".into()]).await.unwrap();
    Fixture { dir, admin }
}

async fn session(f: &Fixture, noise: NoiseSource, partitions: usize) -> AnalystSession {
    let opts = SessionOptions { noise, target_partitions: Some(partitions), ..Default::default() };
    AnalystSession::open(&f.dir.path("catalog.db"), opts).await.unwrap()
}

fn spent(admin: &Admin, table: &str) -> Budget {
    admin.tables().unwrap().into_iter().find(|t| t.name == table).unwrap().policy.unwrap().spent
}

/// A fit result: (x, values, release id).
struct Fit {
    x: Vec<f64>,
    values: Vec<f64>,
    release: Option<String>,
}

fn fit_at(batch: &RecordBatch, col: usize, row: usize) -> Fit {
    let s = batch.column(col).as_struct();
    let list = |i: usize| s.column(i).as_list::<i32>().value(row).as_primitive::<Float64Type>().values().to_vec();
    let r = s.column_by_name("release").unwrap().as_string::<i32>();
    Fit { x: list(0), values: list(1), release: r.is_valid(row).then(|| r.value(row).to_string()) }
}

fn one(batches: &[RecordBatch]) -> Fit {
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    fit_at(batches.iter().find(|b| b.num_rows() == 1).unwrap(), 0, 0)
}

fn spec(loss: FitLoss, points: usize, bandwidth: f64, penalty: f64) -> FitSpec {
    FitSpec {
        grid: Grid { lo: 0.0, hi: 1.0, points },
        bandwidth,
        penalty,
        loss,
        y_range: if matches!(loss, FitLoss::Huber(_)) { (-2.0, 2.0) } else { (-1.0, 1.0) },
        epsilon: 1.0,
        delta: 1e-6,
        calibration: Calibration::Analytic,
    }
}

/// The noiseless fit of the mechanism on the rows, computed directly.
fn direct(spec: FitSpec, ys: &[f64], xs: &[f64]) -> Vec<f64> {
    let m = KernelFitMechanism::new(spec, Contribution::ROW).unwrap();
    let mut acc = m.accumulation();
    m.add_all(&mut acc, ys, xs);
    let s = m.solve(acc.totals());
    assert!(s.certified);
    m.post_process(&s.w.iter().map(|v| v.to_f64()).collect::<Vec<_>>()).fit
}

#[tokio::test]
async fn noiseless_fits_are_the_mechanisms_fit_of_the_rows_in_any_partitioning() {
    let f = fixture("fit-exact").await;
    let (xs, ys) = rows(N, 11);
    // Regression on the policy boxes (x in [0, 1], y in [−2, 2]; huber = 2 by default).
    let q = "SELECT private_kernel_regression(y, x, 1.0, 1e-6, bandwidth => 0.05, penalty => 5, points => 41) FROM t";
    let a = one(&session(&f, NoiseSource::Off, 1).await.query(q).await.unwrap());
    let b = one(&session(&f, NoiseSource::Off, 4).await.query(q).await.unwrap());
    assert_eq!(a.values, b.values, "exact statistics: bit-identical whatever the partitioning");
    assert_eq!((a.x.len(), a.x[0], a.x[40]), (41, 0.0, 1.0));
    // The same as the mechanism's fit up to the release lattice's rounding (noise off still rounds).
    let close = |got: &[f64], want: &[f64]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-9);
    let want = direct(spec(FitLoss::Huber(2.0), 41, 0.05, 5.0), &ys, &xs);
    assert!(close(&a.values, &want), "{:?} vs {want:?}", a.values);
    // And it is a regression: near 0.8·sin(2πx) where the mixture has data.
    for (x, v) in a.x.iter().zip(&a.values) {
        if (0.15..=0.85).contains(x) {
            let truth = 0.8 * (2.0 * std::f64::consts::PI * x).sin();
            assert!((v - truth).abs() < 0.2, "fit({x}) = {v}, truth {truth}");
        }
    }
    // The classifier on the boolean label, and on a numeric one (> 0 positive): the same fit.
    let q =
        "SELECT private_kernel_classifier(label, x, 1.0, 1e-6, bandwidth => 0.05, penalty => 5, points => 41) FROM t";
    let c = one(&session(&f, NoiseSource::Off, 3).await.query(q).await.unwrap());
    let q = "SELECT private_kernel_classifier(y, x, 1.0, 1e-6, bandwidth => 0.05, penalty => 5, points => 41) FROM t";
    let d = one(&session(&f, NoiseSource::Off, 2).await.query(q).await.unwrap());
    assert_eq!(c.values, d.values);
    let labels: Vec<f64> = ys.iter().map(|y| if *y > 0.0 { 1.0 } else { 0.0 }).collect();
    assert!(close(&c.values, &direct(spec(FitLoss::Hinge(0.1), 41, 0.05, 5.0), &labels, &xs)));
    for (x, v) in c.x.iter().zip(&c.values) {
        if (0.15..=0.4).contains(x) {
            assert!(*v > 0.0, "score({x}) = {v}: positive where sin(2πx) > 0");
        }
        if (0.6..=0.85).contains(x) {
            assert!(*v < 0.0, "score({x}) = {v}: negative where sin(2πx) < 0");
        }
    }
}

#[tokio::test]
async fn a_release_is_charged_once_stored_reread_evaluated_and_unnested_for_free() {
    let f = fixture("fit-release").await;
    let s = session(&f, NoiseSource::Os, 2).await;
    let k = one(&s.query("SELECT private_kernel_regression(y, x, 2.0, 1e-6, points => 11) AS k FROM t").await.unwrap());
    let paid = Budget::charge(2.0, 1e-6).unwrap();
    assert_eq!(spent(&f.admin, "t"), paid);
    let id = k.release.clone().expect("a catalog release has an id");

    let b =
        s.query(&format!("SELECT function, parameters FROM dpcurve.releases WHERE release = '{id}'")).await.unwrap();
    assert_eq!(b[0].column(0).as_string::<i32>().value(0), "private_kernel_regression");
    let params = b[0].column(1).as_string::<i32>().value(0);
    assert!(params.contains("\"penalty\":100.0") && params.contains("\"huber\":2.0"), "{params}");

    // Re-read whole: the same struct.
    let again = one(&s.query(&format!("SELECT private_kernel_regression FROM release('{id}')")).await.unwrap());
    assert_eq!((again.x.clone(), again.values.clone()), (k.x.clone(), k.values.clone()));

    // Evaluated anywhere in the box from the released coefficients: exactly the returned values
    // at grid points, a smooth function between, NULL outside.
    let b = s.query(&format!("SELECT x, release_eval('{id}', x) FROM pts")).await.unwrap();
    let (px, v) = (floats(&b, 0), floats(&b, 1));
    for (x, v) in px.iter().zip(&v) {
        let x = x.unwrap();
        match k.x.iter().position(|g| *g == x) {
            Some(i) => assert_eq!(*v, Some(k.values[i]), "grid point {x}"),
            None if (0.0..=1.0).contains(&x) => {
                let i = k.x.partition_point(|g| *g <= x) - 1;
                let (lo, hi) = (k.values[i].min(k.values[i + 1]), k.values[i].max(k.values[i + 1]));
                let v = v.expect("inside the box");
                assert!(v > lo - 0.5 && v < hi + 0.5, "{x}: {v} far from its neighbours [{lo}, {hi}]");
            }
            None => assert_eq!(*v, None, "outside the box {x}"),
        }
    }
    // Unnested into (x, fit) rows with plain SQL, as the README shows.
    let b = s
        .query(&format!(
            "SELECT unnest(k.x) AS x, unnest(k.fit) AS fit FROM (SELECT private_kernel_regression AS k FROM release('{id}'))"
        ))
        .await
        .unwrap();
    assert_eq!(floats(&b, 1).into_iter().map(Option::unwrap).collect::<Vec<_>>(), k.values);
    // The classifier's release too.
    let c = one(&s.query("SELECT private_kernel_classifier(label, x, 1.0, 1e-6, points => 5) FROM t").await.unwrap());
    let cid = c.release.unwrap();
    let b = s.query(&format!("SELECT release_eval('{cid}', 0.5)")).await.unwrap();
    assert_eq!(floats(&b, 0), vec![Some(c.values[2])]);
    assert_eq!(spent(&f.admin, "t"), paid.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap());
}

#[tokio::test]
async fn the_guard_refuses_what_would_leak_with_precise_messages_and_charges_nothing() {
    let f = fixture("fit-guard").await;
    let s = session(&f, NoiseSource::Os, 2).await;
    let r = "private_kernel_regression";
    let cases = [
        (format!("SELECT {r}(y, x, 1, 1) FROM t"), "argument 'delta' must be in [0, 1)"),
        (format!("SELECT {r}(y, x, 1, 1e-6, penalty => 0) FROM t"), "argument 'penalty' must be a finite number > 0"),
        (format!("SELECT {r}(y, x, 1, 1e-6, penalty => 1e-9) FROM t"), "penalty must be a number in [1e-6, 1e15]"),
        (format!("SELECT {r}(y, x, 1, 1e-6, penalty => y) FROM t"), "argument 'penalty' must be a literal constant"),
        (format!("SELECT {r}(y, x, 1, 1e-6, bandwidth => 0.001) FROM t"), "bandwidth must be at least (hi − lo)/256"),
        (format!("SELECT {r}(y, x, 1, 1e-6) FROM u"), "arguments 'lo_y' and 'hi_y' are required"),
        (format!("SELECT {r}(y, x, 1, 1e-6, huber => -1) FROM t"), "argument 'huber' must be a finite number > 0"),
        (
            format!("SELECT {r}(y, x, 1, 1e-6, penalty => 1e-4, huber => 1e-5, lo_y => 0, hi_y => 1) FROM t"),
            "huber must be at least 0.01 × (hi_y − lo_y)",
        ),
        (format!("SELECT {r}(y, x, 1, 1e-6, points => 1) FROM t"), "'points' must be an integer in [2, 4096]"),
        (format!("SELECT {r}(y, x, 1, 1e-6, width => 3) FROM t"), "unknown argument name 'width'"),
        (format!("SELECT {r}('a', x, 1, 1e-6) FROM t"), "argument 'y' must be numeric"),
        (format!("SELECT {r}(y, label, 1, 1e-6, lo => 0, hi => 1) FROM t"), "argument 'x' must be numeric"),
        (
            "SELECT private_kernel_classifier('a', x, 1, 1e-6) FROM t".into(),
            "argument 'label' must be boolean or numeric",
        ),
        (
            "SELECT private_kernel_classifier(label, x, 1, 1e-6, smoothing => 2) FROM t".into(),
            "smoothing must be a number in [0.1, 1]",
        ),
        (format!("SELECT {r}((SELECT max(y) FROM u), x, 1, 1e-6, lo_y => 0, hi_y => 1) FROM t"), "subquer"),
        (format!("SELECT {r}(y, x, 1, 1e-6) OVER () FROM t"), "window"),
        (format!("SELECT {r}(t.y, u.x, 1, 1e-6, 0.05, 1, 0, 1, -2, 2) FROM t JOIN u ON t.x = u.x"), "join"),
    ];
    for (q, want) in &cases {
        let e = s.query(q).await.expect_err(q).to_string();
        assert!(e.contains(want), "{q}: {e}");
    }
    assert_eq!(spent(&f.admin, "t"), Budget::ZERO);
    assert_eq!(spent(&f.admin, "u"), Budget::ZERO);
}

#[tokio::test]
async fn named_arguments_groups_and_an_empty_filter_still_release_once() {
    let f = fixture("fit-named").await;
    let s = session(&f, NoiseSource::TestSeed(9), 2).await;
    let a = one(&s
        .query(
            "SELECT private_kernel_regression(x => x, y => y, delta => 1e-6, epsilon => 1, points => 9, penalty => 50, \
             lo => 0.2, hi => 0.8, bandwidth => 0.04) FROM t",
        )
        .await
        .unwrap());
    let b = one(&s
        .query("SELECT private_kernel_regression(y, x, 1, 1e-6, 0.04, 50, 0.2, 0.8, -2, 2, 9) FROM t")
        .await
        .unwrap());
    assert_eq!((a.x.len(), a.x[0], a.x[8]), (9, 0.2, 0.8));
    assert_eq!(a.values, b.values, "same parameters, same test seed, same release");

    let before = spent(&f.admin, "g");
    let batches = s
        .query("SELECT region, private_kernel_classifier(label, x, 1, 1e-6, points => 5) AS k FROM g GROUP BY region ORDER BY region")
        .await
        .unwrap();
    let fits: Vec<Fit> = batches.iter().flat_map(|b| (0..b.num_rows()).map(|r| fit_at(b, 1, r))).collect();
    assert_eq!(fits.len(), 2);
    assert_eq!(spent(&f.admin, "g"), before.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap());

    let before = spent(&f.admin, "t");
    let e =
        one(&s.query("SELECT private_kernel_regression(y, x, 1, 1e-6, points => 5) FROM t WHERE x > 5").await.unwrap());
    assert_eq!(e.values.len(), 5, "no rows: the fit is 0 plus noise, released and paid like any other");
    assert_eq!(spent(&f.admin, "t"), before.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap());
}

/// The analyst's failure tricks in either data argument, on neighbouring tables `t` and `h`
/// (`h` = `t` plus a row at (0.5, 0)): an integer division by zero, an overflow, a NaN and a
/// failing cast on exactly that row. Each query runs on both tables with the same shape and one
/// charge, or is refused at planning on both with the same message and no charge.
#[tokio::test]
async fn failure_tricks_cannot_tell_neighbours_apart() {
    let f = fixture("fit-neighbours").await;
    let s = session(&f, NoiseSource::Os, 2).await;
    let tricks = [
        "CAST(1 AS INT) / CAST(round(x * 2 - 1) AS INT)",
        "CASE WHEN x = 0.5 THEN 1e308 * 10 ELSE y END",
        "CASE WHEN x = 0.5 THEN sqrt(-1.0) ELSE y END",
        "CASE WHEN x = 0.5 THEN CAST('oops' AS DOUBLE) ELSE y END",
    ];
    let mut ran = 0;
    for trick in tricks {
        for call in [
            format!("private_kernel_regression({trick}, x, 1, 1e-6, points => 5, lo_y => -2, hi_y => 2)"),
            format!("private_kernel_regression(y, {trick}, 1, 1e-6, points => 5, lo => 0, hi => 1)"),
            format!("private_kernel_classifier({trick}, x, 1, 1e-6, points => 5)"),
        ] {
            let mut outcomes = Vec::new();
            for table in ["t", "h"] {
                let before = spent(&f.admin, table);
                let q = format!("SELECT {call} FROM {table}");
                let outcome = match s.query(&q).await {
                    Ok(b) => {
                        let k = one(&b);
                        let paid = before.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap();
                        assert_eq!(spent(&f.admin, table), paid, "{q}: charged once");
                        format!("ran: {} points, stored {}", k.values.len(), k.release.is_some())
                    }
                    Err(e) => {
                        assert_eq!(spent(&f.admin, table), before, "{q}: a refusal charges nothing");
                        format!("refused: {}", e.to_string().replace(&format!("'{table}'"), "'T'"))
                    }
                };
                outcomes.push(outcome);
            }
            assert_eq!(outcomes[0], outcomes[1], "{call}");
            ran += outcomes[0].starts_with("ran") as usize;
        }
    }
    assert!(ran >= 6, "the attacks must mostly reach execution to test anything (ran {ran})");
}

/// `penalty => 'auto'`: the penalty is the plug-in rule's value for the released row count (with
/// the noise off, the exact count), the fit is the fit at that penalty, and the call is charged
/// (ε, δ) once — the count's share included. With noise, the count is noisy and so is the choice.
#[tokio::test]
async fn penalty_auto_is_the_rule_at_the_released_count_and_costs_the_call() {
    let f = fixture("fit-auto").await;
    let off = session(&f, NoiseSource::Off, 2).await;
    let q = |penalty: &str| {
        format!("SELECT private_kernel_regression(y, x, 1.0, 1e-6, penalty => {penalty}, points => 21) AS k FROM t")
    };
    let b = off.query(&q("'auto'")).await.unwrap();
    let s = b[0].column(0).as_struct();
    let chosen = s.column_by_name("penalty").unwrap().as_primitive::<Float64Type>().value(0);
    let fit_spec = FitSpec { epsilon: 0.95, ..spec(FitLoss::Huber(2.0), 21, 0.05, 100.0) };
    let want = dpcurve::mechanism::fits::kernel_fit::auto_penalty(&fit_spec, N as i64);
    assert!((chosen - want).abs() <= 1e-12 * want, "chose {chosen}, the rule at n = {N} gives {want}");
    assert!(chosen > 150.0 && chosen < 400.0, "Λ = {chosen} for n = {N}");
    let auto = one(&b);
    // The stored release says the penalty was chosen, and what the count cost.
    let id = auto.release.clone().expect("stored");
    let p = off.query(&format!("SELECT parameters FROM dpcurve.releases WHERE release = '{id}'")).await.unwrap();
    let p = p[0].column(0).as_string::<i32>().value(0).to_string();
    let json: serde_json::Value = serde_json::from_str(&p).unwrap();
    assert_eq!(json["penalty_rule"], "auto", "{p}");
    assert!((json["count_epsilon"].as_f64().unwrap() - 0.05).abs() < 1e-9, "{p}");
    assert!((json["epsilon"].as_f64().unwrap() - 0.95).abs() < 1e-9, "{p}");
    let explicit = one(&off.query(&q(&format!("{chosen:?}"))).await.unwrap());
    assert_eq!(auto.values, explicit.values, "the fit at the chosen penalty");
    // A tenth of the rows: a smaller penalty (more smoothing per row is not affordable).
    let small = off.query(&q("'auto'").replace("FROM t", "FROM t WHERE x < 0.1")).await.unwrap();
    let small =
        small[0].column(0).as_struct().column_by_name("penalty").unwrap().as_primitive::<Float64Type>().value(0);
    assert!(small < chosen, "{small} vs {chosen}");
    // Charged (ε, δ) once, with noise; the chosen penalty is near the rule at the true count.
    let s = session(&f, NoiseSource::TestSeed(4), 2).await;
    let before = spent(&f.admin, "t");
    let b = s.query(&q("'auto'")).await.unwrap();
    let noisy = b[0].column(0).as_struct().column_by_name("penalty").unwrap().as_primitive::<Float64Type>().value(0);
    assert!((noisy / want - 1.0).abs() < 0.05, "Λ = {noisy} vs {want}");
    assert_eq!(spent(&f.admin, "t"), before.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap());
    // 'auto' is the only string accepted.
    let err = s.query(&q("'fast'")).await.unwrap_err().to_string();
    assert!(err.contains("argument 'penalty' must be a number or 'auto'"), "{err}");
}

/// The pure-ε ICLP releases through SQL: `private_kde(…, mechanism => 'iclp')` and a fit with
/// `delta => 0` are charged (ε, 0), stored with their mechanism, and re-read bit for bit.
#[tokio::test]
async fn iclp_releases_are_charged_pure_epsilon_and_stored() {
    let f = fixture("fit-iclp").await;
    let s = session(&f, NoiseSource::Os, 2).await;
    let before = spent(&f.admin, "t");
    let b = s.query("SELECT private_kde(x, 0.1, 1, 0, mechanism => 'iclp', points => 33) AS k FROM t").await.unwrap();
    let k = b[0].column(0).as_struct();
    let density = k.column_by_name("density").unwrap().as_list::<i32>().value(0);
    let id = k.column_by_name("release").unwrap().as_string::<i32>().value(0).to_string();
    let params = s.query(&format!("SELECT parameters FROM dpcurve.releases WHERE release = '{id}'")).await.unwrap();
    assert!(params[0].column(0).as_string::<i32>().value(0).contains("\"mechanism\":\"iclp\""));
    let again = s.query(&format!("SELECT private_kde FROM release('{id}')")).await.unwrap();
    let again = again[0].column(0).as_struct().column_by_name("density").unwrap().as_list::<i32>().value(0);
    assert_eq!(density.as_primitive::<Float64Type>().values(), again.as_primitive::<Float64Type>().values());
    let fit = one(&s.query("SELECT private_kernel_regression(y, x, 1, 0, points => 9) FROM t").await.unwrap());
    assert_eq!(fit.values.len(), 9);
    let pure = Budget::charge(1.0, 0.0).unwrap();
    assert_eq!(spent(&f.admin, "t"), before.checked_add(&pure).unwrap().checked_add(&pure).unwrap());
    // 'iclp' is pure ε only at a numeric bandwidth and in the Gaussian RKHS space.
    let err = s.query("SELECT private_kde(x, 'auto', 1, 0, mechanism => 'iclp') FROM t").await.unwrap_err();
    assert!(err.to_string().contains("bandwidth => 'auto' releases through the pure-ε mechanism"), "{err}");
}
