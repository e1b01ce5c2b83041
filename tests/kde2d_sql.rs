//! `private_kde2d` through real SQL over real Parquet behind the catalog's ledger and the planner
//! guard: the policy box, exact statistics across files and partitions, the charge, the stored
//! release (`release`, `release_eval(id, x, y)`), unnesting into (x, y, density) rows, and the
//! guard's refusals.

mod common;

use std::sync::Arc;

use common::{TempDir, floats, write_columns};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, StringArray, StructArray};
use datafusion::arrow::datatypes::Float64Type;
use dpcurve::mechanism::density::kde::gaussian_kernel;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

const N: usize = 3_000;

/// Correlated pairs: x in [0, 1] from the mixture, y = 3(x − 0.5) + noise, in about [−2, 2].
fn pairs(n: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let xs = dpcurve::datagen::mixture(n, seed);
    let e = dpcurve::datagen::mixture(n, seed + 1);
    let ys = xs.iter().zip(&e).map(|(x, e)| 3.0 * (x - 0.5) + (e - 0.5)).collect();
    (xs, ys)
}

fn write_pairs(path: &std::path::Path, xs: &[f64], ys: &[f64], region: Option<&[&str]>) {
    let mut cols = vec![
        ("x", Arc::new(Float64Array::from(xs.to_vec())) as ArrayRef),
        ("y", Arc::new(Float64Array::from(ys.to_vec())) as ArrayRef),
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

/// `t` (private, x and y bounded by the policy, in two files), `g` (private, grouped by a
/// declared region), `u` (private, only x bounded), `pts` (public points).
async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    let (xs, ys) = pairs(N, 5);
    std::fs::create_dir_all(dir.path("t")).unwrap();
    write_pairs(&dir.path("t/a.parquet"), &xs[..N / 3], &ys[..N / 3], None);
    write_pairs(&dir.path("t/b.parquet"), &xs[N / 3..], &ys[N / 3..], None);
    let regions: Vec<&str> = (0..N).map(|i| ["a", "b"][i % 2]).collect();
    write_pairs(&dir.path("g.parquet"), &xs, &ys, Some(&regions));
    write_pairs(&dir.path("u.parquet"), &xs, &ys, None);
    // `h` is `t` plus one row at (0.5, 0): its neighbour for the attacks below.
    let (mut hx, mut hy) = (xs.clone(), ys.clone());
    hx.push(0.5);
    hy.push(0.0);
    write_pairs(&dir.path("h.parquet"), &hx, &hy, None);
    let (px, py): (Vec<f64>, Vec<f64>) =
        [(0.0, -2.0), (0.5, 0.0), (0.25, 1.0), (0.31, -0.77), (1.0, 2.0), (1.5, 0.0), (0.5, 2.5)].into_iter().unzip();
    write_pairs(&dir.path("pts.parquet"), &px, &py, None);
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

/// A 2-D result: (x, y, density rows, mass, release id).
struct Surface {
    x: Vec<f64>,
    y: Vec<f64>,
    density: Option<Vec<Vec<f64>>>,
    mass: f64,
    release: Option<String>,
}

fn surface(s: &StructArray, row: usize) -> Surface {
    let list = |name: &str| s.column_by_name(name).unwrap().as_list::<i32>().value(row);
    let floats = |a: ArrayRef| a.as_primitive::<Float64Type>().values().to_vec();
    let d = s.column_by_name("density").unwrap().as_list::<i32>();
    let density = d.is_valid(row).then(|| {
        let rows = d.value(row);
        let rows = rows.as_list::<i32>();
        (0..rows.len()).map(|i| floats(rows.value(i))).collect()
    });
    let r = s.column_by_name("release").unwrap().as_string::<i32>();
    Surface {
        x: floats(list("x")),
        y: floats(list("y")),
        density,
        mass: s.column_by_name("mass").unwrap().as_primitive::<Float64Type>().value(row),
        release: r.is_valid(row).then(|| r.value(row).to_string()),
    }
}

fn one(batches: &[RecordBatch]) -> Surface {
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    let b = batches.iter().find(|b| b.num_rows() == 1).unwrap();
    surface(b.column(0).as_struct(), 0)
}

#[tokio::test]
async fn the_noiseless_release_is_the_normalised_product_kernel_kde_on_the_policy_box_in_any_partitioning() {
    let f = fixture("kde2d-exact").await;
    let q = "SELECT private_kde2d(x, y, 0.08, 0.3, 1.0, 1e-6, points_x => 21, points_y => 17) FROM t";
    let one_partition = one(&session(&f, NoiseSource::Off, 1).await.query(q).await.unwrap());
    let four = one(&session(&f, NoiseSource::Off, 4).await.query(q).await.unwrap());
    // Exact fixed-point statistics: bit-identical whatever the partitioning.
    assert_eq!(one_partition.density, four.density);
    assert_eq!(one_partition.mass, four.mass);
    // The policy box: x over [0, 1], y over [−2, 2].
    let s = one_partition;
    assert_eq!((s.x.len(), s.y.len()), (21, 17));
    assert_eq!((s.x[0], s.x[20], s.y[0], s.y[16]), (0.0, 1.0, -2.0, 2.0));
    // Against the exact product-kernel KDE of the rows, normalised by its trapezoid integral.
    let (xs, ys) = pairs(N, 5);
    let exact: Vec<Vec<f64>> = s
        .x
        .iter()
        .map(|&a| {
            s.y.iter()
                .map(|&b| {
                    xs.iter().zip(&ys).map(|(x, y)| gaussian_kernel(a, *x, 0.08) * gaussian_kernel(b, *y, 0.3)).sum()
                })
                .collect()
        })
        .collect();
    let w = |k: usize, n: usize| if k == 0 || k + 1 == n { 0.5 } else { 1.0 };
    let (dx, dy) = (s.x[1] - s.x[0], s.y[1] - s.y[0]);
    let z: f64 =
        (0..21).map(|i| (0..17).map(|j| w(i, 21) * w(j, 17) * exact[i][j]).sum::<f64>()).sum::<f64>() * dx * dy;
    let density = s.density.expect("a density");
    let peak = exact.iter().flatten().fold(0.0f64, |a, v| a.max(*v)) / z;
    for i in 0..21 {
        for j in 0..17 {
            let want = exact[i][j] / z;
            assert!((density[i][j] - want).abs() <= 2e-3 * peak, "({i}, {j}): {} vs {want}", density[i][j]);
        }
    }
    // The mass is Z/(2π·h_x·h_y) of the released surface: the count of pairs, less what the
    // kernels put outside the box.
    assert!(s.mass > 0.8 * N as f64 && s.mass < 1.001 * N as f64, "mass {}", s.mass);
}

#[tokio::test]
async fn a_release_is_charged_once_stored_reread_evaluated_and_unnested_for_free() {
    let f = fixture("kde2d-release").await;
    let s = session(&f, NoiseSource::Os, 2).await;
    let k = one(&s
        .query("SELECT private_kde2d(x, y, 0.1, 0.4, 2.0, 1e-6, points_x => 16, points_y => 12) AS k FROM t")
        .await
        .unwrap());
    let paid = Budget::charge(2.0, 1e-6).unwrap();
    assert_eq!(spent(&f.admin, "t"), paid);
    let id = k.release.clone().expect("a catalog release has an id");
    let density = k.density.clone().expect("enough mass for a density");

    // Listed with its function and public parameters.
    let b =
        s.query(&format!("SELECT function, parameters FROM dpcurve.releases WHERE release = '{id}'")).await.unwrap();
    assert_eq!(b[0].column(0).as_string::<i32>().value(0), "private_kde2d");
    let params = b[0].column(1).as_string::<i32>().value(0);
    assert!(params.contains("\"bandwidth_y\":0.4") && params.contains("\"points_x\":16"), "{params}");

    // Re-read whole: the same struct.
    let again = one(&s.query(&format!("SELECT private_kde2d FROM release('{id}')")).await.unwrap());
    assert_eq!(again.density.as_ref(), Some(&density));
    assert_eq!((again.x.clone(), again.y.clone(), again.mass), (k.x.clone(), k.y.clone(), k.mass));

    // Evaluated at public points: exactly the release at grid points, bilinear between them,
    // NULL outside the box.
    let b = s.query(&format!("SELECT x, y, release_eval('{id}', x, y) FROM pts")).await.unwrap();
    let (px, py, v) = (floats(&b, 0), floats(&b, 1), floats(&b, 2));
    let at = |x: f64, y: f64| {
        let i = k.x.iter().position(|g| *g == x).unwrap();
        let j = k.y.iter().position(|g| *g == y).unwrap();
        density[i][j]
    };
    for ((x, y), v) in px.iter().zip(&py).zip(&v) {
        let (x, y) = (x.unwrap(), y.unwrap());
        match (x, y) {
            (0.0, -2.0) | (1.0, 2.0) => assert_eq!(*v, Some(at(x, y)), "grid corner ({x}, {y})"),
            (0.5, 2.5) | (1.5, 0.0) => assert_eq!(*v, None, "outside the box ({x}, {y})"),
            _ => {
                // Bilinear: between the min and max of its cell's four corners.
                let (i, j) = (k.x.partition_point(|g| *g <= x) - 1, k.y.partition_point(|g| *g <= y) - 1);
                let corners = [density[i][j], density[i + 1][j], density[i][j + 1], density[i + 1][j + 1]];
                let (lo, hi) = corners.iter().fold((f64::MAX, f64::MIN), |(a, b), c| (a.min(*c), b.max(*c)));
                let v = v.expect("inside the box");
                assert!(v >= lo - 1e-15 && v <= hi + 1e-15, "({x}, {y}): {v} outside [{lo}, {hi}]");
            }
        }
    }
    // A 2-D release needs both coordinates: a precise error, not a guess.
    let err = s.query(&format!("SELECT release_eval('{id}', 0.5)")).await.unwrap_err().to_string();
    assert!(err.contains("is a 2-D density (private_kde2d)"), "{err}");

    // Unnested into (x, y, density) rows with plain SQL, as the README shows.
    let b = s
        .query(&format!(
            "WITH r AS (SELECT private_kde2d AS k FROM release('{id}')), \
                  cols AS (SELECT unnest(k.x) AS x, unnest(k.density) AS col, k.y AS ys FROM r) \
             SELECT x, unnest(ys) AS y, unnest(col) AS density FROM cols"
        ))
        .await
        .unwrap();
    let (ux, uy, ud) = (floats(&b, 0), floats(&b, 1), floats(&b, 2));
    assert_eq!(ux.len(), 16 * 12);
    for ((x, y), d) in ux.iter().zip(&uy).zip(&ud) {
        assert_eq!(d.unwrap(), at(x.unwrap(), y.unwrap()));
    }
    // None of it spent anything.
    assert_eq!(spent(&f.admin, "t"), paid);
}

#[tokio::test]
async fn the_guard_refuses_what_would_leak_with_precise_messages_and_charges_nothing() {
    let f = fixture("kde2d-guard").await;
    let s = session(&f, NoiseSource::Os, 2).await;
    let cases = [
        ("SELECT private_kde2d(x, y, 0.1, 0.4, 1, 0) FROM t", "argument 'delta' must be in the open interval (0, 1)"),
        ("SELECT private_kde2d(x, y, 0.1, y, 1, 1e-6) FROM t", "argument 'bandwidth_y' must be a literal constant"),
        ("SELECT private_kde2d(x, y, 0, 0.4, 1, 1e-6) FROM t", "argument 'bandwidth_x' must be a finite number > 0"),
        ("SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6) FROM u", "arguments 'lo_y' and 'hi_y' are required"),
        (
            "SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6, lo_y => 1, hi_y => -1) FROM t",
            "arguments 'lo_y' and 'hi_y' must be finite numbers with lo_y < hi_y",
        ),
        (
            "SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6, points_x => 1) FROM t",
            "'points_x' must be an integer in [2, 1024]",
        ),
        ("SELECT private_kde2d(x, y, 0.0001, 0.4, 1, 1e-6) FROM t", "the 2-D statistic would need"),
        ("SELECT private_kde2d(x, 0.1, 0.4, 1, 1e-6) FROM t", "takes 6 to 18 arguments"),
        (
            "SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6, band_alpha => 1) FROM t",
            "'band_alpha' must be in the open interval (0, 1)",
        ),
        ("SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6, width => 3) FROM t", "unknown argument name 'width'"),
        ("SELECT private_kde2d(x, CAST(y AS INT), 0.1, 0.4, 1, 1e-6) FROM t", ""),
        ("SELECT private_kde2d(x, 'a', 0.1, 0.4, 1, 1e-6) FROM t", "argument 'y' must be numeric"),
        // The analyst's tricks on the second data argument: a subquery over another private
        // table, a window over private rows, a join of two private tables.
        ("SELECT private_kde2d(x, (SELECT max(x) FROM u), 0.1, 0.4, 1, 1e-6, lo_y => 0, hi_y => 1) FROM t", "subquer"),
        ("SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6) OVER () FROM t", "window"),
        ("SELECT private_kde2d(t.x, u.y, 0.1, 0.4, 1, 1e-6, 0, 1, -2, 2) FROM t JOIN u ON t.x = u.x", "join"),
    ];
    for (q, want) in cases {
        match s.query(q).await {
            Err(e) => assert!(e.to_string().contains(want), "{q}: {e}"),
            // A failing CAST is made total (TRY_CAST) by the guard: that one runs.
            Ok(_) => assert!(want.is_empty(), "{q} ran"),
        }
    }
    let paid = Budget::charge(1.0, 1e-6).unwrap();
    assert_eq!(spent(&f.admin, "t"), paid, "only the total CAST query was charged");
    assert_eq!(spent(&f.admin, "u"), Budget::ZERO);
    // A private table is still unreadable except through private aggregates.
    let err = s.query("SELECT x, y FROM t").await.unwrap_err().to_string();
    assert!(err.contains("private"), "{err}");
}

#[tokio::test]
async fn named_arguments_a_partial_box_and_groups_work_and_an_empty_table_still_releases() {
    let f = fixture("kde2d-named").await;
    let s = session(&f, NoiseSource::TestSeed(9), 2).await;
    // Named arguments in any order; x's box from the call, y's from the policy.
    let a = one(&s
        .query(
            "SELECT private_kde2d(y => y, x => x, delta => 1e-6, epsilon => 1, bandwidth_y => 0.4, bandwidth_x => 0.1, \
             points_y => 9, lo_x => 0.2, hi_x => 0.8, points_x => 7) FROM t",
        )
        .await
        .unwrap());
    let b = one(&s.query("SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6, 0.2, 0.8, -2, 2, 7, 9) FROM t").await.unwrap());
    assert_eq!((a.x.len(), a.y.len()), (7, 9));
    assert_eq!((a.x[0], a.x[6], a.y[0], a.y[8]), (0.2, 0.8, -2.0, 2.0));
    assert_eq!(a.density, b.density, "same parameters, same test seed, same release");
    assert_eq!(a.mass, b.mass);

    // One release per declared group, each charged on the table once for the query.
    let before = spent(&f.admin, "g");
    let batches = s
        .query("SELECT region, private_kde2d(x, y, 0.1, 0.4, 1, 1e-6, points_x => 8, points_y => 8) AS k FROM g GROUP BY region ORDER BY region")
        .await
        .unwrap();
    let mut regions = Vec::new();
    for batch in &batches {
        for r in 0..batch.num_rows() {
            let key = datafusion::arrow::compute::cast(batch.column(0), &datafusion::arrow::datatypes::DataType::Utf8);
            regions.push(key.unwrap().as_string::<i32>().value(r).to_string());
            let k = surface(batch.column(1).as_struct(), r);
            assert!(k.mass > 0.3 * N as f64, "each group holds half the rows: mass {}", k.mass);
        }
    }
    assert_eq!(regions, ["a", "b"]);
    assert_eq!(spent(&f.admin, "g"), before.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap());

    // A filter that keeps nothing: still one paid release (the data never decides whether a
    // query fails) whose mass is noise around 0.
    let before = spent(&f.admin, "t");
    let e = one(&s.query("SELECT private_kde2d(x, y, 0.1, 0.4, 1, 1e-6) FROM t WHERE x > 5").await.unwrap());
    assert!(e.mass.abs() < 0.02 * N as f64, "mass {}", e.mass);
    assert_eq!(spent(&f.admin, "t"), before.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap());
}

/// The analyst's attacks through the second data argument, on neighbouring tables `t` and `h`
/// (`h` = `t` plus a row at (0.5, 0)): an integer division by zero, an overflow to ±inf and a
/// NaN on exactly that row. Each query must run on both tables, produce a result of the same
/// shape, and be charged exactly once — whether a query fails may not depend on one row.
#[tokio::test]
async fn failure_tricks_on_the_second_column_cannot_tell_neighbours_apart() {
    let f = fixture("kde2d-neighbours").await;
    let s = session(&f, NoiseSource::Os, 2).await;
    let attacks = [
        "CAST(1 AS INT) / CAST(round(x * 2 - 1) AS INT)",
        "CASE WHEN x = 0.5 THEN 1e308 * 10 ELSE y END",
        "CASE WHEN x = 0.5 THEN sqrt(-1.0) ELSE y END",
        "CASE WHEN x = 0.5 THEN CAST('oops' AS DOUBLE) ELSE y END",
    ];
    let mut ran = 0;
    for attack in attacks {
        let mut outcomes = Vec::new();
        for table in ["t", "h"] {
            let before = spent(&f.admin, table);
            let q = format!(
                "SELECT private_kde2d(x, {attack}, 0.1, 0.4, 1, 1e-6, lo_y => -2, hi_y => 2, points_x => 8, \
                 points_y => 8) FROM {table}"
            );
            // Either it runs (one charge) or the planner refuses it (no charge), the same on both.
            let outcome = match s.query(&q).await {
                Ok(b) => {
                    let k = one(&b);
                    let paid = before.checked_add(&Budget::charge(1.0, 1e-6).unwrap()).unwrap();
                    assert_eq!(spent(&f.admin, table), paid, "{q}: charged once");
                    format!("ran: {} × {}, stored {}", k.x.len(), k.y.len(), k.release.is_some())
                }
                Err(e) => {
                    assert_eq!(spent(&f.admin, table), before, "{q}: a refusal charges nothing");
                    format!("refused: {}", e.to_string().replace(&format!("'{table}'"), "'T'"))
                }
            };
            outcomes.push(outcome);
        }
        assert_eq!(outcomes[0], outcomes[1], "{attack}");
        ran += outcomes[0].starts_with("ran") as usize;
    }
    assert!(ran >= 2, "the attacks must mostly reach execution to test anything");
}
