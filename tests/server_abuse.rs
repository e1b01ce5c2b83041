//! `dpcurve serve` against an analyst who tries to take it down, starve the others, or rob them
//! of a paid result: the shipped binary, real sockets, arrow-flight's Flight SQL client. Each
//! test is one attack; each fails on a server that plans on its request threads, keeps whole
//! results, shares its ticket and prepared-statement tables between analysts, frees a slot with
//! the response stream, or logs every statement whole.
#![cfg(feature = "server")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::{FlightInfo, Ticket};
use common::{Server, TempDir, mixture, write_columns, write_x};
use datafusion::arrow::array::{AsArray, Float64Array, RecordBatch};
use dpcurve::Admin;
use dpcurve::policy::Catalog;
use futures::TryStreamExt;
use tonic::transport::Channel;

async fn client(addr: &str, token: &str) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    c.set_token(token.to_string());
    c
}

async fn fetch(c: &mut FlightSqlServiceClient<Channel>, ticket: Ticket) -> Result<Vec<RecordBatch>, tonic::Status> {
    let stream = c.do_get(ticket).await.map_err(status)?;
    stream.try_collect().await.map_err(status)
}

fn status(e: arrow_flight::error::FlightError) -> tonic::Status {
    tonic::Status::from(e)
}

fn ticket(info: &FlightInfo) -> Ticket {
    info.endpoint[0].ticket.clone().unwrap()
}

async fn run(c: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<RecordBatch>, tonic::Status> {
    let info = c.execute(sql.to_string(), None).await.map_err(status)?;
    fetch(c, ticket(&info)).await
}

/// The server process's (current, peak) resident memory in bytes.
fn rss(server: &Server) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let kb = |key: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key}"));
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

fn alive(server: &mut Server) {
    assert!(server.child.try_wait().unwrap().is_none(), "the server ended: {:?}", server.child.try_wait());
}

struct Fixture {
    _dir: TempDir,
    catalog: PathBuf,
    eve: String,
    bob: String,
}

/// `mixture` (private, 2 000 rows, ε = 100), `fit` (private, 200 000 rows: a slow regression);
/// eve (the attacker) and bob each have a share of both.
async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    write_x(&dir.path("mixture.parquet"), &mixture(2000, 7).into_iter().map(Some).collect::<Vec<_>>());
    let xs: Vec<f64> = mixture(200_000, 5);
    let ys: Vec<f64> = xs.iter().map(|x| (6.0 * x).sin()).collect();
    write_columns(
        &dir.path("fit.parquet"),
        vec![("x", Arc::new(Float64Array::from(xs)) as _), ("y", Arc::new(Float64Array::from(ys)) as _)],
    );
    let catalog = dir.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("mixture", &dir.str("mixture.parquet")).await.unwrap();
    admin.make_private("mixture", 100.0, 1e-3).await.unwrap();
    admin.set_bounds("mixture", "x", -0.2, 1.2).await.unwrap();
    admin.register("fit", &dir.str("fit.parquet")).await.unwrap();
    admin.make_private("fit", 100.0, 1e-3).await.unwrap();
    admin.set_bounds("fit", "x", 0.0, 1.0).await.unwrap();
    admin.set_bounds("fit", "y", -1.0, 1.0).await.unwrap();
    let eve = admin.add_analyst("eve").unwrap();
    let bob = admin.add_analyst("bob").unwrap();
    for who in ["eve", "bob"] {
        admin.grant(who, "mixture", 50.0, 1e-4).unwrap();
        admin.grant(who, "fit", 50.0, 1e-4).unwrap();
    }
    Fixture { _dir: dir, catalog, eve, bob }
}

const KDE: &str = "SELECT private_kde(x, 0.05, 0.01, 0, -0.2, 1.2, 16) AS k FROM mixture";

/// Runs long after its debit (hundreds of objective evaluations at the narrowest bandwidth).
const SLOW: &str = "SELECT private_kernel_regression(y, x, 1.0, 1e-6, bandwidth => 0.004, penalty => 10) AS f FROM fit";

fn release_id(batches: &[RecordBatch]) -> String {
    let s = batches[0].column(0).as_struct();
    s.column_by_name("release").unwrap().as_string::<i32>().value(0).to_string()
}

/// Statements nested as deep as text allows are refused (InvalidArgument), free, and the server
/// keeps serving; statements just under the limit plan on the planning threads' large stacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_statements_are_refused_and_the_server_keeps_serving() {
    let f = fixture("abuse-deep").await;
    let mut server = Server::start(&f.catalog, &[]);
    let mut eve = client(&server.addr, &f.eve).await;
    let chain = |n: usize| vec!["1"; n].join(" + ");
    for sql in [
        format!("SELECT {}", chain(100_000)),
        format!("SELECT private_kde(x + {}, 0.05, 0.1, 0) FROM mixture", chain(100_000)),
        format!("SELECT * FROM mixture WHERE {}", vec!["x = 1"; 100_000].join(" OR ")),
    ] {
        let e = eve.execute(sql, None).await.map_err(status).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        assert!(e.message().contains("nest deeper than 256"), "{e}");
    }
    // Just under the limit, in nested calls: planned (and run) without a crash.
    let nested = (0..45).fold(format!("x + {} - 200", chain(200)), |acc, _| format!("abs({acc})"));
    let sql = format!("SELECT private_kde({nested} - 0.5, 0.05, 0.01, 0, -0.2, 1.2, 16) AS k FROM mixture");
    run(&mut eve, &sql).await.unwrap();
    let n = run(&mut eve, &format!("SELECT {} AS n", chain(250))).await.unwrap();
    assert_eq!(n[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 250);
    alive(&mut server);
    let mut bob = client(&server.addr, &f.bob).await;
    run(&mut bob, "SELECT 1").await.unwrap();
}

/// A `VALUES` list of 5·10⁴ rows, 8 at once: each takes the planner seconds. Another analyst's
/// trivial queries meanwhile are not queued behind them (their slowest takes a small fraction of
/// one heavy planning; planning on the request threads makes it wait for whole plannings).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_analysts_heavy_planning_does_not_hold_up_another() {
    let f = fixture("abuse-plan").await;
    let server = Server::start(&f.catalog, &["--max-queries-per-analyst", "8"]);
    let values: Vec<String> = (0..50_000).map(|i| format!("({i}.5)")).collect();
    let heavy = format!("SELECT count(*) FROM (VALUES {}) AS v(a)", values.join(", "));
    // One heavy planning alone, for scale.
    let mut eve = client(&server.addr, &f.eve).await;
    let t = Instant::now();
    eve.execute(heavy.clone(), None).await.unwrap();
    let alone = t.elapsed();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut attackers = Vec::new();
    for _ in 0..8 {
        let (addr, token, sql, stop) = (server.addr.clone(), f.eve.clone(), heavy.clone(), Arc::clone(&stop));
        attackers.push(tokio::spawn(async move {
            let mut c = client(&addr, &token).await;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = c.execute(sql.clone(), None).await;
            }
        }));
    }
    tokio::time::sleep(alone / 2).await;
    let mut bob = client(&server.addr, &f.bob).await;
    let mut times = Vec::new();
    let until = Instant::now() + alone * 3;
    while Instant::now() < until || times.len() < 20 {
        let t = Instant::now();
        run(&mut bob, "SELECT 1").await.unwrap();
        times.push(t.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for a in attackers {
        a.await.unwrap();
    }
    times.sort();
    let p99 = times[times.len() * 99 / 100];
    eprintln!(
        "one heavy planning alone: {alone:?}; bob's SELECT 1 under 8 of them: p50 {:?}, p99 {p99:?}, n {}",
        times[times.len() / 2],
        times.len()
    );
    assert!(alone > Duration::from_millis(500), "the heavy statement is not heavy here: {alone:?}");
    assert!(p99 < alone / 10, "bob waited behind eve's planning: p99 {p99:?} vs one planning {alone:?}");
}

/// A public result of 400 MB streams through a server whose peak memory stays far below it;
/// planned tickets keep only their statement, under the analyst's byte budget; a statement
/// larger than the budget is refused (ResourceExhausted), nothing planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_bounded_per_analyst_and_results_stream() {
    let f = fixture("abuse-memory").await;
    let server = Server::start(&f.catalog, &["--max-bytes-per-analyst", &(64u64 << 20).to_string()]);
    let mut eve = client(&server.addr, &f.eve).await;
    run(&mut eve, "SELECT 1").await.unwrap();
    let (base, _) = rss(&server);
    // 5·10⁷ rows of Int64: 400 MB, read and dropped batch by batch.
    let info = eve.execute("SELECT * FROM generate_series(1, 50000000)".into(), None).await.unwrap();
    let mut stream = eve.do_get(ticket(&info)).await.unwrap();
    let mut rows = 0usize;
    while let Some(b) = stream.try_next().await.unwrap() {
        rows += b.num_rows();
    }
    assert_eq!(rows, 50_000_000);
    let (_, peak) = rss(&server);
    eprintln!("400 MB streamed: server RSS {} MB before, peak {} MB", base >> 20, peak >> 20);
    assert!(peak < base + (150 << 20), "the server held the result: peak {} MB", peak >> 20);
    // Planned tickets of a 2 MiB statement: 40, then 120 more. A server that kept every plan
    // would hold gigabytes; the budget (64 MiB) keeps the newest 32 statements' text, so memory
    // stops growing with the number of tickets.
    let big = format!("SELECT length('{}') AS n", "x".repeat(2 << 20));
    let mut infos = Vec::new();
    let plan = |n: usize| {
        let (mut eve, big) = (eve.clone(), big.clone());
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(eve.execute(big.clone(), None).await.unwrap());
            }
            out
        }
    };
    infos.extend(plan(40).await);
    let (after40, _) = rss(&server);
    infos.extend(plan(120).await);
    let (after200, _) = rss(&server);
    eprintln!("planned tickets of 2 MiB: server RSS {} MB after 40, {} MB after 160", after40 >> 20, after200 >> 20);
    assert!(after200 < after40 + (100 << 20), "memory grows with planned tickets: {after40} → {after200}");
    let newest = fetch(&mut eve, ticket(infos.last().unwrap())).await.unwrap();
    assert_eq!(newest[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int32Type>().value(0), 2 << 20);
    let oldest = fetch(&mut eve, ticket(&infos[0])).await.unwrap_err();
    assert_eq!(oldest.code(), tonic::Code::NotFound, "{oldest}");
    // One statement larger than the whole budget.
    let huge = format!("SELECT length('{}') AS n", "x".repeat(65 << 20));
    let e = eve.execute(huge, None).await.map_err(status).unwrap_err();
    assert!(matches!(e.code(), tonic::Code::ResourceExhausted | tonic::Code::OutOfRange), "{e}");
}

/// Thousands of free requests by one analyst evict neither another analyst's paid, fetched
/// ticket nor their prepared statement; a paid ticket gone with a restart is answered with the
/// stored release it paid for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_analyst_evicts_another_and_a_lost_ticket_names_its_release() {
    let f = fixture("abuse-evict").await;
    let mut server = Server::start(&f.catalog, &["--max-queries-per-analyst", "8"]);
    let mut bob = client(&server.addr, &f.bob).await;
    let paid = bob.execute(KDE.into(), None).await.unwrap();
    let first = fetch(&mut bob, ticket(&paid)).await.unwrap();
    let mut prepared = bob.prepare("SELECT count(*) AS n FROM generate_series(1, 10)".into(), None).await.unwrap();
    let charges = Catalog::open(&f.catalog).unwrap().release_log(None).unwrap().len();
    // Eve: 10 050 GetFlightInfo and 10 050 CreatePreparedStatement calls, 8 at a time.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (addr, token) = (server.addr.clone(), f.eve.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = client(&addr, &token).await;
            for _ in 0..1257 {
                c.execute("SELECT 1".into(), None).await.unwrap();
                c.prepare("SELECT 2".into(), None).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let again = fetch(&mut bob, ticket(&paid)).await.unwrap();
    assert_eq!(release_id(&again), release_id(&first), "bob's paid result was evicted by eve");
    let n = fetch(&mut bob, ticket(&prepared.execute().await.unwrap())).await.unwrap();
    assert_eq!(n[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 10);
    assert_eq!(Catalog::open(&f.catalog).unwrap().release_log(None).unwrap().len(), charges, "charged again");
    // A restart forgets every ticket; the paid one is answered with its stored release.
    server.kill();
    let server = Server::start(&f.catalog, &[]);
    let mut bob = client(&server.addr, &f.bob).await;
    let e = fetch(&mut bob, ticket(&paid)).await.unwrap_err();
    let id = release_id(&first);
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    assert!(e.message().contains(&format!("release('{id}')")), "{e}");
    let detail = |e: &tonic::Status, k: &str| e.metadata().get(k).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(detail(&e, "dpcurve-error").as_deref(), Some("result-stored"));
    assert_eq!(detail(&e, "dpcurve-releases"), Some(id.clone()));
    let stored = run(&mut bob, &format!("SELECT * FROM release('{id}')")).await.unwrap();
    assert_eq!(stored[0].num_rows(), 1);
    // Eve, holding bob's ticket, learns nothing of it.
    let mut eve = client(&server.addr, &f.eve).await;
    let e = fetch(&mut eve, ticket(&paid)).await.unwrap_err();
    assert!(e.message().contains("unknown or expired ticket") && !e.message().contains(&id), "{e}");
    assert_eq!(detail(&e, "dpcurve-error").as_deref(), Some("unknown-ticket"));
    assert_eq!(detail(&e, "dpcurve-releases"), None);
}

/// Waits until the ledger shows a charge on `fit`.
fn wait_for_the_debit(catalog: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let ledger = Catalog::open(catalog).unwrap();
    while ledger.release_log(Some("fit")).unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the query was never charged");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A paid query whose client left holds its analyst's slot until it has finished (with one
/// slot, the analyst's next query is refused meanwhile), then frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_held_until_the_query_task_ends() {
    let f = fixture("abuse-slot").await;
    let server = Server::start(&f.catalog, &["--max-queries-per-analyst", "1"]);
    let mut eve = client(&server.addr, &f.eve).await;
    let info = eve.execute(SLOW.into(), None).await.unwrap();
    let t = ticket(&info);
    let fetching = tokio::spawn(async move { fetch(&mut eve, t).await });
    wait_for_the_debit(&f.catalog);
    tokio::time::sleep(Duration::from_millis(300)).await;
    fetching.abort();
    let _ = fetching.await;
    let ledger = Catalog::open(&f.catalog).unwrap();
    assert!(ledger.stored_releases(Some("fit")).unwrap().is_empty(), "the query ended too soon for this test");
    let mut eve = client(&server.addr, &f.eve).await;
    let e = eve.execute("SELECT 1".into(), None).await.map_err(status).unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "the slot was freed with the stream: {e}");
    assert!(e.message().contains("already runs 1 queries"), "{e}");
    // Once the query has finished (its release stored), the slot is free again.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match eve.execute("SELECT 1".into(), None).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline && e.to_string().contains("already runs") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ledger.stored_releases(Some("fit")).unwrap().len(), 1, "the slot came back before the release");
}

fn disk_size(catalog: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", catalog.display()));
    std::fs::metadata(catalog).unwrap().len() + std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

/// Paid queries with 8 MiB statements: 10 through the server grow the catalog by less than
/// 1 MB, and the ledger entries of 1 000 more (the same bounded record per query, written by the
/// ledger's own debit) by less than 10 MB: the ledger keeps each statement once, its first
/// 4 KiB and a hash, whatever its length and however many private calls it makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_statements_cannot_fill_the_disk() {
    let f = fixture("abuse-ledger").await;
    let server = Server::start(&f.catalog, &[]);
    let mut eve = client(&server.addr, &f.eve).await;
    run(&mut eve, KDE).await.unwrap();
    let before = disk_size(&f.catalog);
    let padding = "x".repeat(8 << 20);
    let statement = |i: usize| {
        format!(
            "SELECT private_kde(x, 0.05, 1e-6, 0, -0.2, 1.2, 4) AS k, private_kde(x, 0.05, 1e-6, 0, -0.2, 1.2, 5) AS \
             k2, length('{padding}') AS n{i} FROM mixture"
        )
    };
    for i in 0..10 {
        run(&mut eve, &statement(i)).await.unwrap();
    }
    let grown = disk_size(&f.catalog) - before;
    eprintln!("10 queries with 8 MiB statements through the server grew the catalog by {grown} bytes");
    assert!(grown < 1 << 20, "10 queries grew the catalog by {grown} bytes");
    let ledger = Catalog::open(&f.catalog).unwrap();
    let log = ledger.release_log(Some("mixture")).unwrap();
    assert_eq!(log.len(), 21);
    let last = &log.last().unwrap().query;
    assert!(last.contains("statement cut at") && last.contains("SHA-256"), "{}", &last[last.len() - 200..]);
    // 1 000 more debits of such a statement, as the gate makes them.
    let record = dpcurve::policy::QueryRecord::of(&statement(10));
    let kde = |_| dpcurve::policy::Charge {
        table: "mixture".into(),
        function: "private_kde".into(),
        cost: dpcurve::mechanism::noise::budget::Budget::charge(1e-6, 0.0).unwrap(),
    };
    let charges: Vec<_> = (0..2).map(kde).collect();
    let before = disk_size(&f.catalog);
    for _ in 0..1000 {
        ledger.charge_reserving(&charges, &record, Some("eve"), 2).unwrap();
    }
    let grown = disk_size(&f.catalog) - before;
    eprintln!("1 000 more debits of 8 MiB statements grew the catalog by {grown} bytes");
    assert!(grown < 10_000_000, "{grown} bytes");
}
