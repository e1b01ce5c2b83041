//! Releases as objects: every paid release is kept in the catalog with its id in the
//! result; `dpcurve.releases` lists them; `release(id)` re-reads one and `release_eval(id, x)`
//! evaluates it at any point — through real SQL on real Parquet, without reading data or
//! spending budget.

mod common;

use std::sync::Arc;

use common::{ListKind, TempDir, floats, write_columns, write_curves, write_x};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, StringArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

fn list(s: &datafusion::arrow::array::StructArray, name: &str) -> Option<Vec<f64>> {
    let l = s.column_by_name(name).unwrap().as_list::<i32>();
    l.is_valid(0).then(|| l.value(0).as_primitive::<Float64Type>().values().to_vec())
}

fn text(s: &datafusion::arrow::array::StructArray, name: &str) -> Option<String> {
    let c = s.column_by_name(name).unwrap().as_string::<i32>();
    c.is_valid(0).then(|| c.value(0).to_string())
}

struct Fixture {
    dir: TempDir,
    admin: Admin,
}

async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    let xs: Vec<Option<f64>> = (0..5_000).map(|i| Some(0.3 + 0.3 * ((i as f64 * 0.618_034) % 1.0))).collect();
    write_x(&dir.path("p.parquet"), &xs);
    // Public points to evaluate releases at: the grid of the release below, midpoints, and
    // points outside its range.
    let pts: Vec<f64> = (0..=100).map(|k| k as f64 / 100.0).chain([0.005, 0.4321, -0.5, 1.5]).collect();
    write_columns(&dir.path("points.parquet"), vec![("x", Arc::new(Float64Array::from(pts)) as ArrayRef)]);
    let regions: Vec<&str> = (0..5_000).map(|i| ["a", "b", "c"][i % 3]).collect();
    let rx: Vec<f64> = (0..5_000).map(|i| (i as f64 * 0.618_034) % 1.0).collect();
    write_columns(
        &dir.path("g.parquet"),
        vec![
            ("region", Arc::new(StringArray::from(regions)) as ArrayRef),
            ("x", Arc::new(Float64Array::from(rx)) as ArrayRef),
        ],
    );
    let curves: Vec<Option<Vec<f64>>> =
        (0..200).map(|i| Some((0..40).map(|k| ((k + i % 7) as f64 / 8.0).sin() * 0.4).collect())).collect();
    write_curves(&dir.path("c.parquet"), &curves, ListKind::List);
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    for t in ["p", "points", "g", "c"] {
        admin.register(t, &dir.str(&format!("{t}.parquet"))).await.unwrap();
    }
    for t in ["p", "g", "c"] {
        admin.make_private(t, 10.0, 1e-3).await.unwrap();
    }
    admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();
    admin.set_bounds("g", "x", 0.0, 1.0).await.unwrap();
    admin.set_keys("g", "region", &["a".into(), "b".into(), "c".into()]).await.unwrap();
    Fixture { dir, admin }
}

fn spent(admin: &Admin, table: &str) -> Budget {
    admin.tables().unwrap().into_iter().find(|t| t.name == table).unwrap().policy.unwrap().spent
}

#[tokio::test]
async fn a_kde_release_is_kept_listed_reread_and_evaluated_for_free() {
    let f = fixture("releases-kde").await;
    let s = AnalystSession::open(&f.dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let b = s
        .query("SELECT private_kde(x, 0.03, 1.0, 1e-6, points => 101, mechanism => 'gaussian') AS k FROM p")
        .await
        .unwrap();
    let k = b[0].column(0).as_struct();
    let id = text(k, "release").expect("a catalog release has an id");
    assert!(id.starts_with('r'), "{id}");
    let (xs, density) = (list(k, "x").unwrap(), list(k, "density").unwrap());
    let (noise_band, band) = (list(k, "noise_band").unwrap(), list(k, "band").unwrap());
    assert_eq!(noise_band.len(), 101);
    assert!(noise_band.iter().all(|w| *w > 0.0 && *w == noise_band[0]), "constant noise band");
    assert!(band.iter().zip(&noise_band).all(|(t, n)| t >= n), "the plug-in band adds sampling error");
    let paid = spent(&f.admin, "p");
    assert_eq!(paid, Budget::charge(1.0, 1e-6).unwrap());

    // Listed, with its table, function, public parameters and cost.
    let b = s
        .query(&format!(
            "SELECT table_name, function, parameters, epsilon, delta, charge, query FROM dpcurve.releases \
             WHERE release = '{id}'"
        ))
        .await
        .unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    assert_eq!(b[0].column(0).as_string::<i32>().value(0), "p");
    assert_eq!(b[0].column(1).as_string::<i32>().value(0), "private_kde");
    let params = b[0].column(2).as_string::<i32>().value(0);
    assert!(params.contains("\"bandwidth\":0.03") && params.contains("\"points\":101"), "{params}");
    assert_eq!(b[0].column(3).as_primitive::<Float64Type>().value(0), 1.0);
    assert_eq!(b[0].column(4).as_primitive::<Float64Type>().value(0), 1e-6);
    assert!(b[0].column(6).as_string::<i32>().value(0).contains("private_kde(x, 0.03"));
    // The ledger entry it names is the charge of that query.
    let log = f.admin.release_log(Some("p")).unwrap();
    assert_eq!(log.last().unwrap().id, b[0].column(5).as_primitive::<Int64Type>().value(0));

    // Evaluated over a public table of points: the release itself at its grid points (bit
    // for bit), a continuous curve between them, NULL outside [lo, hi].
    let b = s.query(&format!("SELECT x, release_eval('{id}', x) FROM points ORDER BY x")).await.unwrap();
    let at: Vec<f64> = floats(&b, 0).into_iter().map(Option::unwrap).collect();
    let ev = floats(&b, 1);
    for (x, v) in at.iter().zip(&ev) {
        if let Some(k) = xs.iter().position(|g| g == x) {
            assert_eq!(*v, Some(density[k]), "grid point {x}");
        } else if (0.0..=1.0).contains(x) {
            let k = (x * 100.0).floor() as usize;
            let (lo, hi) = (density[k].min(density[k + 1]), density[k].max(density[k + 1]));
            let v = v.unwrap();
            assert!(v > lo - 0.2 * (hi - lo) - 0.05 && v < hi + 0.2 * (hi - lo) + 0.05, "x = {x}: {v} vs [{lo}, {hi}]");
        } else {
            assert_eq!(*v, None, "outside the range at {x}");
        }
    }
    // A scalar argument works too, and so does the CLI's way of asking (plain SQL).
    let b = s.query(&format!("SELECT release_eval('{id}', 0.5)")).await.unwrap();
    assert_eq!(floats(&b, 0), vec![Some(density[50])]);

    // Re-read whole: the same struct (and so the same derived quantities), for nothing.
    let b = s.query(&format!("SELECT * FROM release('{id}')")).await.unwrap();
    let again = b[0].column(0).as_struct();
    assert_eq!(b[0].schema().field(0).name(), "private_kde");
    assert_eq!(list(again, "density").unwrap(), density);
    assert_eq!(list(again, "noise_band").unwrap(), noise_band);
    assert_eq!(text(again, "release").unwrap(), id);
    let b = s.query(&format!("SELECT curve_quantile(private_kde, 0.5) FROM release('{id}')")).await.unwrap();
    let median = floats(&b, 0)[0].unwrap();
    assert!((median - 0.45).abs() < 0.05, "{median}");
    assert_eq!(spent(&f.admin, "p"), paid, "evaluating and re-reading spent nothing");
    assert_eq!(f.admin.release_log(Some("p")).unwrap().len(), 1);

    // Unknown ids are an error naming the id, not a panic; so is a non-literal release().
    let e = s.query("SELECT release_eval('r999', 0.5)").await.unwrap_err().to_string();
    assert!(e.contains("no stored release 'r999'"), "{e}");
    let e = s.query("SELECT * FROM release('nope')").await.unwrap_err().to_string();
    assert!(e.contains("no stored release 'nope'"), "{e}");
    // release_eval is not a way to transform private rows.
    let e = s
        .query(&format!("SELECT private_kde(release_eval('{id}', x), 0.03, 1.0, 1e-6, lo => 0, hi => 1) FROM p"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("release_eval") && e.contains("allowlist"), "{e}");
    assert_eq!(spent(&f.admin, "p"), paid);

    // The default mechanism here is the pure-ε release (charged (ε, 0)); kept and evaluated the same way.
    let b = s.query("SELECT private_kde(x, 0.03, 1.0, 1e-6, points => 101) AS k FROM p").await.unwrap();
    let k = b[0].column(0).as_struct();
    let pure = text(k, "release").unwrap();
    let d2 = list(k, "density").unwrap();
    let nb = list(k, "noise_band").unwrap();
    assert!(nb.iter().all(|w| *w > 0.0) && nb.iter().any(|w| *w != nb[0]), "the pure-ε band varies between nodes");
    let b = s.query(&format!("SELECT x, release_eval('{pure}', x) FROM points ORDER BY x")).await.unwrap();
    let ev = floats(&b, 1);
    for (x, v) in floats(&b, 0).iter().zip(&ev) {
        let x = x.unwrap();
        if let Some(k) = xs.iter().position(|g| *g == x) {
            assert_eq!(*v, Some(d2[k]), "grid point {x}");
        } else {
            assert_eq!(v.is_some(), (0.0..=1.0).contains(&x), "{x}");
        }
    }
    assert_eq!(spent(&f.admin, "p"), paid.checked_add(&Budget::charge(1.0, 0.0).unwrap()).unwrap());
    let paid = spent(&f.admin, "p");

    // A new session (another process, later) reads the same release.
    drop(s);
    let s = AnalystSession::open(&f.dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let b = s.query(&format!("SELECT release_eval('{id}', 0.25)")).await.unwrap();
    assert_eq!(floats(&b, 0), vec![Some(density[25])]);
    assert_eq!(spent(&f.admin, "p"), paid, "re-reading in a new session spent nothing");
}

#[tokio::test]
async fn grouped_and_mean_curve_releases_are_kept_one_per_curve_under_one_charge() {
    let f = fixture("releases-groups").await;
    let opts = SessionOptions { noise: NoiseSource::Os, ..Default::default() };
    let s = AnalystSession::open(&f.dir.path("catalog.db"), opts).await.unwrap();
    let b = s
        .query(
            "SELECT region, private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian') AS k FROM g GROUP BY region ORDER BY region",
        )
        .await
        .unwrap();
    let mut ids = Vec::new();
    for batch in &b {
        let k = batch.column(1).as_struct();
        let r = k.column_by_name("release").unwrap().as_string::<i32>();
        ids.extend((0..batch.num_rows()).map(|i| r.value(i).to_string()));
    }
    assert_eq!(ids.len(), 3);
    let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), 3, "one release per group: {ids:?}");
    let b = s.query("SELECT DISTINCT charge, epsilon FROM dpcurve.releases WHERE table_name = 'g'").await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 1, "one charge for the three curves");
    assert_eq!(spent(&f.admin, "g"), Budget::charge(0.5, 1e-6).unwrap());

    // A mean curve: evaluated at its grid it is the release; between, the Nyström continuation.
    let b = s.query("SELECT private_mean_curve(c, 1.0, 1e-5, clip => 2.0, points => 40) AS m FROM c").await.unwrap();
    let m = b[0].column(0).as_struct();
    let id = text(m, "release").unwrap();
    let (t, mean, band) = (list(m, "t").unwrap(), list(m, "mean").unwrap(), list(m, "noise_band").unwrap());
    assert_eq!(band.len(), t.len());
    assert!(band.iter().all(|w| *w > 0.0));
    let b = s
        .query(&format!("SELECT release_eval('{id}', x) FROM points WHERE x >= 0 AND x <= 1 ORDER BY x"))
        .await
        .unwrap();
    let ev = floats(&b, 0);
    assert_eq!(ev.len(), 103);
    assert!(ev.iter().all(|v| v.is_some_and(f64::is_finite)), "defined everywhere on [0, 1]");
    let b = s.query(&format!("SELECT release_eval('{id}', {})", t[13])).await.unwrap();
    assert_eq!(floats(&b, 0), vec![Some(mean[13])], "bit-identical at a grid point");
    let b = s.query(&format!("SELECT release_eval('{id}', {})", (t[13] + t[14]) / 2.0)).await.unwrap();
    let mid = floats(&b, 0)[0].unwrap();
    let scale = mean.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    assert!((mid - (mean[13] + mean[14]) / 2.0).abs() < 0.2 * scale, "{mid} between {} and {}", mean[13], mean[14]);
    let b = s.query(&format!("SELECT * FROM release('{id}')")).await.unwrap();
    assert_eq!(b[0].schema().field(0).name(), "private_mean_curve");
    assert_eq!(list(b[0].column(0).as_struct(), "mean").unwrap(), mean);
    assert_eq!(f.admin.release_log(Some("c")).unwrap().len(), 1);
    // The admin view lists every kept release, per table.
    assert_eq!(f.admin.stored_releases(Some("g")).unwrap().len(), 3);
    assert_eq!(f.admin.stored_releases(None).unwrap().len(), 4);
}

#[tokio::test]
async fn an_automatic_bandwidth_is_chosen_privately_charged_once_and_kept() {
    let f = fixture("releases-auto").await;
    let s = AnalystSession::open(&f.dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let b = s.query("SELECT private_kde(x, 'auto', 1.0, 1e-6, points => 201) AS k FROM p").await.unwrap();
    let k = b[0].column(0).as_struct();
    let id = text(k, "release").unwrap();
    let (xs, density) = (list(k, "x").unwrap(), list(k, "density").unwrap());
    // The data sit in [0.3, 0.6] (5 000 values): the density is concentrated there.
    let inside: f64 = xs.iter().zip(&density).filter(|(x, _)| (0.3..=0.6).contains(*x)).map(|(_, d)| d * 0.005).sum();
    assert!(inside > 0.8, "{inside}");
    // One charge of (ε, 0): the count and the release are both pure ε and share the call's ε.
    assert_eq!(spent(&f.admin, "p"), Budget::charge(1.0, 0.0).unwrap());
    assert_eq!(f.admin.release_log(Some("p")).unwrap().len(), 1);
    let b = s.query(&format!("SELECT parameters FROM dpcurve.releases WHERE release = '{id}'")).await.unwrap();
    let params = b[0].column(0).as_string::<i32>().value(0).to_string();
    assert!(params.contains("\"bandwidth_rule\":\"auto\""), "{params}");
    // n·ε = 5 000: the count chose the spacing (2 % of ε), the release has the rest.
    assert!(params.contains("\"spacing_rule\":\"count\""), "{params}");
    assert!(params.contains("\"kernel\":\"gaussian6\""), "{params}");
    let count: f64 =
        params.split("\"count_epsilon\":").nth(1).unwrap().split([',', '}']).next().unwrap().parse().unwrap();
    assert!((count - 0.02).abs() < 1e-12, "{params}");
    let chosen: f64 = params.split("\"bandwidth\":").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    assert!(chosen > 0.0 && chosen < 0.25, "{chosen}");
    // Kept and evaluated like any release: bit-identical at the grid.
    let b = s.query(&format!("SELECT release_eval('{id}', {})", xs[77])).await.unwrap();
    assert_eq!(floats(&b, 0), vec![Some(density[77])]);
    // Refused before any charge: the Gaussian mechanism, and a string that is not 'auto'.
    for (sql, want) in [
        (
            "SELECT private_kde(x, 'auto', 1.0, 1e-6, mechanism => 'gaussian') FROM p",
            "bandwidth => 'auto' releases through the pure-ε mechanism",
        ),
        (
            "SELECT private_kde(x, 'fast', 1.0, 1e-6) FROM p",
            "argument 'bandwidth' must be a number or 'auto', got 'fast'",
        ),
    ] {
        let e = s.query(sql).await.unwrap_err().to_string();
        assert!(e.contains(want), "{sql}: {e}");
    }
    assert_eq!(spent(&f.admin, "p"), Budget::charge(1.0, 0.0).unwrap());
    // n·ε = 100: the reference rule chooses (the spacing rule needs a noisy count ≳ 20 200, 3 of the
    // count's noise sds above n = 5 000; a fixed test seed makes the test deterministic); two counts and
    // the release share the call's ε (7 % + 93 %), and the stored parameters say so.
    let number = |params: &str, key: &str| -> f64 {
        params.split(&format!("\"{key}\":")).nth(1).unwrap().split([',', '}']).next().unwrap().parse().unwrap()
    };
    let seeded = SessionOptions { noise: NoiseSource::TestSeed(0xa07), ..Default::default() };
    let s = AnalystSession::open(&f.dir.path("catalog.db"), seeded).await.unwrap();
    let b = s.query("SELECT private_kde(x, 'auto', 0.02, 0, points => 201) AS k FROM p").await.unwrap();
    let id = text(b[0].column(0).as_struct(), "release").unwrap();
    let b = s.query(&format!("SELECT parameters FROM dpcurve.releases WHERE release = '{id}'")).await.unwrap();
    let params = b[0].column(0).as_string::<i32>().value(0).to_string();
    assert!(params.contains("\"spacing_rule\":\"reference\""), "{params}");
    assert!((number(&params, "count_epsilon") - 0.07 * 0.02).abs() < 1e-12, "{params}");
    assert!((number(&params, "epsilon") - 0.93 * 0.02).abs() < 1e-12, "{params}");
    let both = Budget::charge(1.0, 0.0).unwrap().checked_add(&Budget::charge(0.02, 0.0).unwrap()).unwrap();
    assert_eq!(spent(&f.admin, "p"), both);
}

/// `space => 'sobolev'` (Hall §4.2): charged (ε, δ) once, rougher than the default release,
/// stored and evaluated exactly at its grid points (the Ornstein–Uhlenbeck continuation
/// between them); parameter mistakes are precise planning errors that charge nothing.
#[tokio::test]
async fn a_sobolev_release_is_charged_stored_and_evaluated_like_the_default_one() {
    let f = fixture("releases-sobolev").await;
    // A fixed test seed: the roughness comparison below is deterministic.
    let opts = SessionOptions { noise: NoiseSource::TestSeed(0x50b), ..Default::default() };
    let s = AnalystSession::open(&f.dir.path("catalog.db"), opts).await.unwrap();
    for (q, want) in [
        ("SELECT private_kde(x, 0.03, 1.0, 0, space => 'sobolev') FROM p", "needs a numeric bandwidth, delta > 0"),
        ("SELECT private_kde(x, 'auto', 1.0, 1e-6, space => 'sobolev') FROM p", "needs a numeric bandwidth"),
        ("SELECT private_kde(x, 0.03, 1.0, 1e-6, space => 'besov') FROM p", "'space' must be 'gaussian' or 'sobolev'"),
    ] {
        let e = s.query(q).await.unwrap_err().to_string();
        assert!(e.contains(want), "{q}: {e}");
    }
    assert_eq!(spent(&f.admin, "p"), Budget::ZERO);
    let q = |space: &str| {
        format!(
            "SELECT private_kde(x, 0.03, 0.1, 1e-6, points => 101, mechanism => 'gaussian', space => '{space}') AS k FROM p"
        )
    };
    let b = s.query(&q("sobolev")).await.unwrap();
    let k = b[0].column(0).as_struct();
    let (id, xs, density) = (text(k, "release").unwrap(), list(k, "x").unwrap(), list(k, "density").unwrap());
    assert!(list(k, "noise_band").unwrap()[0] > 0.0);
    assert_eq!(spent(&f.admin, "p"), Budget::charge(0.1, 1e-6).unwrap());
    let b = s.query(&format!("SELECT parameters FROM dpcurve.releases WHERE release = '{id}'")).await.unwrap();
    assert!(b[0].column(0).as_string::<i32>().value(0).contains("\"space\":\"sobolev\""));
    let b = s.query(&format!("SELECT x, release_eval('{id}', x) FROM points ORDER BY x")).await.unwrap();
    for (x, v) in floats(&b, 0).iter().zip(floats(&b, 1)) {
        let x = x.unwrap();
        match xs.iter().position(|g| *g == x) {
            Some(i) => assert_eq!(v, Some(density[i]), "grid point {x}"),
            None => assert_eq!(v.is_some(), (0.0..=1.0).contains(&x), "{x}"),
        }
    }
    // Rougher than the Gaussian-kernel release of the same data at the same small ε, where
    // noise dominates (Hall's Figure 2): the released density's squared second differences are
    // far larger.
    let b = s.query(&q("gaussian")).await.unwrap();
    let smooth = list(b[0].column(0).as_struct(), "density").unwrap();
    let rough = |d: &[f64]| d.windows(3).map(|w| (w[2] - 2.0 * w[1] + w[0]).powi(2)).sum::<f64>();
    assert!(rough(&density) > 5.0 * rough(&smooth), "{} vs {}", rough(&density), rough(&smooth));
}

#[tokio::test]
async fn a_statements_hash_finds_its_executions_whatever_its_layout() {
    let f = fixture("releases-hash").await;
    let s = AnalystSession::open(&f.dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let q = "SELECT region, private_kde(x, 0.05, 0.5, 0, points => 16) AS k FROM g GROUP BY region";
    s.query(q).await.unwrap();
    s.query("SELECT private_kde(x, 0.05, 0.5, 0, points => 16) AS k FROM p").await.unwrap();
    let hash = |sql: &str| {
        let s = &s;
        let sql = sql.replace('\'', "''");
        async move {
            let b = s.query(&format!("SELECT statement_sha256('{sql}') AS h")).await.unwrap();
            b[0].column(0).as_string::<i32>().value(0).to_string()
        }
    };
    let h = hash(q).await;
    assert_eq!(h.len(), 64);
    // Layout and keyword case do not change it; a literal does.
    let relaid = "select region,\n   private_kde(x, 0.05, 0.5, 0, points => 16) AS k\nFROM g  GROUP BY region  ";
    assert_eq!(hash(relaid).await, h);
    assert_ne!(hash(&q.replace("points => 16", "points => 17")).await, h);
    // The grouped call's three releases, under one execution, and nothing else.
    let b = s
        .query(&format!("SELECT release, execution FROM dpcurve.releases WHERE statement_sha256 = '{h}'"))
        .await
        .unwrap();
    let executions: Vec<i64> =
        b.iter().flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec()).collect();
    assert_eq!(executions.len(), 3);
    assert!(executions.iter().all(|e| *e == executions[0]));
    // Outside the server nothing keeps whole results; stored_result says so by name.
    let e = s.query(&format!("SELECT * FROM stored_result({})", executions[0])).await.unwrap_err().to_string();
    assert!(e.contains(&format!("no kept result of execution {}", executions[0])), "{e}");
    // One statement only.
    let e = s.query("SELECT statement_sha256('SELECT 1; SELECT 2')").await.unwrap_err().to_string();
    assert!(e.contains("one statement"), "{e}");
}
