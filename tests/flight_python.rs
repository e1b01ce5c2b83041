//! The Python ADBC Flight SQL driver against `dpcurve serve`: the test starts the
//! server on a fresh catalog and runs `tests/python/flight_client.py` with the virtual
//! environment that `.ci/python-env` makes (the test runs it first: a fresh clone needs no set-up).
#![cfg(feature = "server")]

mod common;

use std::process::Command;

use common::{Server, TempDir, mixture, python, self_signed, write_x};
use dpcurve::Admin;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::policy::Catalog;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_adbc_driver_gets_a_private_curve_with_a_token() {
    let py = python();
    let dir = TempDir::new("flight-python");
    write_x(&dir.path("mixture.parquet"), &mixture(5000, 11).into_iter().map(Some).collect::<Vec<_>>());
    let catalog = dir.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("mixture", &dir.str("mixture.parquet")).await.unwrap();
    admin.make_private("mixture", 10.0, 1e-3).await.unwrap();
    admin.set_bounds("mixture", "x", -0.2, 1.2).await.unwrap();
    let alice = admin.add_analyst("alice").unwrap();
    let bob = admin.add_analyst("bob").unwrap();
    let carol = admin.add_analyst("carol").unwrap();
    admin.grant("alice", "mixture", 1.0, 1e-4).unwrap();
    admin.grant("bob", "mixture", 0.1, 1e-4).unwrap();
    // Basic credentials for names of every length mod 3.
    let basic: Vec<String> =
        ["d", "de", "dee"].iter().map(|n| format!("{n}:{}", admin.add_analyst(n).unwrap())).collect();

    let server = Server::start(&catalog, &[]);
    let uri = format!("grpc://{}", server.addr);
    // The same catalog over TLS, with a self-signed certificate for localhost.
    let (cert, key) = self_signed(&dir);
    let tls_server =
        Server::start(&catalog, &["--tls-cert", &cert.to_string_lossy(), "--tls-key", &key.to_string_lossy()]);
    let tls_uri = format!("grpc+tls://{}", tls_server.addr.replace("127.0.0.1", "localhost"));

    let out = Command::new(py)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/flight_client.py"))
        .env("DPCURVE_URI", &uri)
        .env("DPCURVE_ALICE", &alice)
        .env("DPCURVE_BOB", &bob)
        .env("DPCURVE_CAROL", &carol)
        .env("DPCURVE_BASIC", basic.join(","))
        .env("DPCURVE_TLS_URI", &tls_uri)
        .env("DPCURVE_TLS_CA", &cert)
        .output()
        .unwrap();
    drop((server, tls_server));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "python client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");

    // What the script did, as the ledger saw it: alice spent exactly her share (4 × 0.25),
    // bob nothing, and every release is logged under alice.
    let c = Catalog::open(&catalog).unwrap();
    assert_eq!(c.share("alice", "mixture").unwrap().unwrap().spent, Budget::total(1.0, 0.0).unwrap());
    assert_eq!(c.share("bob", "mixture").unwrap().unwrap().spent, Budget::ZERO);
    let log = c.release_log(Some("mixture")).unwrap();
    assert_eq!(log.len(), 4);
    assert!(log.iter().all(|r| r.analyst.as_deref() == Some("alice")));
}
