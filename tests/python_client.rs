//! The `dpcurve` Python package (`python/`) against `dpcurve serve`: the test makes a catalog,
//! starts the server (plain and TLS), and runs `tests/python/test_client.py` with pytest and the
//! README's tour `examples/python_tour.py` in the virtual environment `.ci/python-env` makes.
#![cfg(feature = "server")]

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{Server, TempDir, mixture, python, self_signed, write_columns};
use datafusion::arrow::array::{ArrayRef, Float64Array, ListArray, StringArray};
use datafusion::arrow::datatypes::Float64Type;
use dpcurve::Admin;

/// Runs `args` with the environment's Python; panics with its output when it fails.
fn run_python(py: &std::path::Path, args: &[&str], env: &[(&str, String)]) -> String {
    let out = Command::new(py)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("MPLBACKEND", "Agg")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{args:?} failed:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_package_speaks_in_dataframes_curves_and_exceptions() {
    let py = python();
    let dir = TempDir::new("python-client");
    let n = 3000;
    let x = mixture(n, 21);
    let y: Vec<f64> = mixture(n, 22).into_iter().map(|v| 1.0 - v).collect();
    let g: Vec<&str> = (0..n).map(|i| ["a", "b", "c"][i % 3]).collect();
    let curves = ListArray::from_iter_primitive::<Float64Type, _, _>(
        (0..n).map(|i| Some((0..20).map(move |j| Some(0.1 * ((i + j) as f64 * 0.3).sin())))),
    );
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("x", Arc::new(Float64Array::from(x))),
        ("y", Arc::new(Float64Array::from(y))),
        ("g", Arc::new(StringArray::from(g))),
        ("c", Arc::new(curves)),
    ];
    write_columns(&dir.path("patients.parquet"), columns);
    let catalog = dir.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("patients", &dir.str("patients.parquet")).await.unwrap();
    admin.make_private("patients", 1000.0, 1e-2).await.unwrap();
    admin.set_bounds("patients", "x", -0.2, 1.2).await.unwrap();
    admin.set_bounds("patients", "y", -0.2, 1.2).await.unwrap();
    admin.set_keys("patients", "g", &["a".into(), "b".into(), "c".into()]).await.unwrap();
    let mut tokens = Vec::new();
    for (name, epsilon) in [("alice", 50.0), ("erin", 50.0), ("bob", 0.1), ("carol", 0.0), ("tour", 10.0)] {
        let token = admin.add_analyst(name).unwrap();
        if epsilon > 0.0 {
            admin.grant(name, "patients", epsilon, 1e-3).unwrap();
        }
        tokens.push((format!("DPCURVE_{}", name.to_uppercase()), token));
    }

    let server = Server::start(&catalog, &[]);
    let small = Server::start(&catalog, &["--max-bytes-per-analyst", "100000"]);
    let (cert, key) = self_signed(&dir);
    let tls = Server::start(&catalog, &["--tls-cert", &cert.to_string_lossy(), "--tls-key", &key.to_string_lossy()]);
    let mut env: Vec<(&str, String)> = tokens.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    env.push(("DPCURVE_URI", format!("grpc://{}", server.addr)));
    env.push(("DPCURVE_SMALL_URI", format!("grpc://{}", small.addr)));
    env.push(("DPCURVE_TLS_URI", format!("grpc+tls://{}", tls.addr.replace("127.0.0.1", "localhost"))));
    env.push(("DPCURVE_TLS_CA", cert.to_string_lossy().into_owned()));

    let out = run_python(&py, &["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/python/test_client.py"], &env);
    assert!(out.contains("passed") && !out.contains("failed"), "{out}");

    // The README's tour, as a user runs it: it draws one figure to a PNG.
    let png = dir.path("tour.png");
    env.push(("DPCURVE_TOKEN", tokens.iter().find(|(k, _)| k == "DPCURVE_TOUR").unwrap().1.clone()));
    env.push(("DPCURVE_PNG", png.to_string_lossy().into_owned()));
    run_python(&py, &["examples/python_tour.py"], &env);
    let bytes = std::fs::read(&png).expect("the tour wrote no PNG");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "{} bytes", bytes.len());
}
