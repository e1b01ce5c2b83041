//! The ledger under contention and under a crash: threads and OS processes sharing one
//! catalog file, concurrent queries of one process sharing commits, and a process killed with
//! SIGKILL in the middle of queries.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{TempDir, mixture, write_x};
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::policy::Catalog;
use dpcurve::{Admin, AnalystSession, SessionOptions};

const QUERY: &str = "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, 32, mechanism => 'gaussian') AS k FROM p";

async fn setup(tag: &str, epsilon: f64) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new(tag);
    let v: Vec<Option<f64>> = mixture(200, 31).into_iter().map(Some).collect();
    write_x(&dir.path("p.parquet"), &v);
    let catalog = dir.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("p", &dir.str("p.parquet")).await.unwrap();
    admin.make_private("p", epsilon, 1e-3).await.unwrap();
    (dir, catalog)
}

/// An analyst process reading `n` statements from its standard input (JSON output).
fn analyst_process(catalog: &std::path::Path, n: usize) -> std::process::Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dpcurve"))
        .args(["sql", "--catalog", &catalog.to_string_lossy(), "--format", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let script: String = (0..n).map(|_| format!("{QUERY};\n")).collect();
    std::thread::spawn(move || {
        let _ = stdin.write_all(script.as_bytes());
    });
    child
}

/// A budget that fits exactly 30 releases, raced for by 4 threads (each with its own
/// session and catalog connection) and 2 OS processes: exactly 30 succeed, and the ledger
/// shows exactly the total.
#[test]
fn threads_and_processes_racing_for_a_budget_get_exactly_what_fits() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_dir, catalog) = rt.block_on(setup("race", 3.0));
    let fits = 30;
    let started = Instant::now();
    let children: Vec<_> = (0..2).map(|_| analyst_process(&catalog, 25)).collect();
    let ok_threads = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (catalog, ok, refused) = (catalog.clone(), Arc::clone(&ok_threads), Arc::clone(&refused));
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let s = AnalystSession::open(
                        &catalog,
                        SessionOptions { target_partitions: Some(1), ..Default::default() },
                    )
                    .await
                    .unwrap();
                    for _ in 0..15 {
                        match s.query(QUERY).await {
                            Ok(_) => ok.fetch_add(1, Ordering::SeqCst),
                            Err(e) => {
                                assert!(e.to_string().contains("privacy budget exhausted"), "{e}");
                                refused.fetch_add(1, Ordering::SeqCst)
                            }
                        };
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut ok_processes = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        ok_processes += stdout.lines().filter(|l| l.starts_with("{\"k\"")).count();
        for line in stderr.lines().filter(|l| l.starts_with("error") && !l.contains("some statements failed")) {
            assert!(line.contains("privacy budget exhausted"), "{line}");
        }
    }
    let ok = ok_threads.load(Ordering::SeqCst) + ok_processes;
    let elapsed = started.elapsed();
    eprintln!(
        "race: {} thread + {ok_processes} process successes, {} thread refusals, 110 attempts in {:.2?}",
        ok_threads.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst),
        elapsed
    );
    assert_eq!(ok, fits, "exactly the releases that fit must succeed");
    let c = Catalog::open(&catalog).unwrap();
    let p = c.table("p").unwrap().unwrap().policy.unwrap();
    assert_eq!(p.spent.epsilon_units, Budget::total(3.0, 0.0).unwrap().epsilon_units);
    assert_eq!(p.spent.delta_units, Budget::total(0.0, 30e-6).unwrap().delta_units);
    assert_eq!(c.release_log(Some("p")).unwrap().len(), fits);
}

/// One process running many queries at once on one catalog connection (as `dpcurve serve`
/// does): their debits share commits (group commit), each still checked in turn against the
/// running total. A budget that fits exactly 10 releases, raced for by 32 concurrent queries
/// of one session: exactly 10 succeed, every other is refused as exhausted, and the ledger
/// shows exactly the total and 10 log entries.
#[test]
fn concurrent_queries_sharing_commits_get_exactly_what_fits() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    let (_dir, catalog) = rt.block_on(setup("group", 1.0));
    let session = Arc::new(rt.block_on(AnalystSession::open(&catalog, SessionOptions::default())).unwrap());
    let outcomes: Vec<Result<(), String>> = rt.block_on(async {
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let s = Arc::clone(&session);
                tokio::spawn(async move { s.query(QUERY).await.map(|_| ()).map_err(|e| e.to_string()) })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    for e in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        assert!(e.contains("privacy budget exhausted"), "{e}");
    }
    assert_eq!(ok, 10, "exactly the releases that fit must succeed");
    let c = Catalog::open(&catalog).unwrap();
    let p = c.table("p").unwrap().unwrap().policy.unwrap();
    assert_eq!(p.spent.epsilon_units, Budget::total(1.0, 0.0).unwrap().epsilon_units);
    assert_eq!(p.spent.delta_units, Budget::total(0.0, 10e-6).unwrap().delta_units);
    assert_eq!(c.release_log(Some("p")).unwrap().len(), 10);
}

/// A process killed with SIGKILL while running queries leaves a ledger in which every
/// query that returned rows has its charge recorded, and the catalog opens cleanly.
#[test]
fn a_process_killed_mid_query_leaves_every_returned_release_charged() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_dir, catalog) = rt.block_on(setup("kill", 100.0));
    for round in 0..3 {
        let before = Catalog::open(&catalog).unwrap().release_log(None).unwrap().len();
        let mut child = analyst_process(&catalog, 500);
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let target = 5 + 7 * round;
        let mut seen = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while seen < target && Instant::now() < deadline {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("{\"k\"") => seen += 1,
                Some(_) => {}
                None => break,
            }
        }
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        assert_eq!(seen, target, "the analyst process produced too few results");
        let c = Catalog::open(&catalog).expect("the catalog opens cleanly after a SIGKILL");
        let logged = c.release_log(None).unwrap().len() - before;
        assert!(logged >= seen, "round {round}: {seen} results returned but only {logged} charges recorded");
        let spent = c.table("p").unwrap().unwrap().policy.unwrap().spent;
        let all = c.release_log(None).unwrap().len() as i64;
        assert_eq!(spent.epsilon_units, all * Budget::charge(0.1, 1e-6).unwrap().epsilon_units);
    }
}
