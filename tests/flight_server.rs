//! `dpcurve serve` through a real Flight SQL client over a real socket: the server
//! is the shipped binary, started on a fresh catalog; the client is arrow-flight's
//! `FlightSqlServiceClient`. The Python ADBC driver's tests are in `flight_python.rs`.
#![cfg(feature = "server")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables, ProstMessageExt, TicketStatementQuery};
use arrow_flight::{FlightInfo, Ticket};
use common::{Server, TempDir, mixture, self_signed, write_columns, write_x};
use datafusion::arrow::array::{AsArray, Float64Array, RecordBatch};
use datafusion::arrow::datatypes::{Float64Type, SchemaRef};
use dpcurve::Admin;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::policy::Catalog;
use futures::TryStreamExt;
use prost::Message;
use tonic::transport::Channel;

pub async fn client(addr: &str, token: Option<&str>) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    if let Some(t) = token {
        c.set_token(t.to_string());
    }
    c
}

/// Fetches the (single) ticket of `info`: the schema the stream announced, and the rows.
pub async fn fetch(
    c: &mut FlightSqlServiceClient<Channel>,
    info: &FlightInfo,
) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut stream = c.do_get(ticket).await.map_err(|e| e.to_string())?;
    let mut batches = Vec::new();
    while let Some(b) = stream.try_next().await.map_err(|e| e.to_string())? {
        batches.push(b);
    }
    let schema = stream.schema().cloned().ok_or("no schema in the stream")?;
    Ok((schema, batches))
}

/// Plans and fetches one query.
pub async fn run(c: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let info = c.execute(sql.to_string(), None).await.map_err(|e| e.to_string())?;
    Ok(fetch(c, &info).await?.1)
}

const KDE: &str = "SELECT private_kde(x, bandwidth => 0.05, epsilon => 0.25, delta => 1e-6, lo => -0.2, hi => 1.2, \
                   points => 32) AS kde FROM mixture";

// How the client shows gRPC codes.
const UNAUTHENTICATED: &str = "valid authentication credentials";
const NOT_FOUND: &str = "requested entity was not found";
const INVALID: &str = "invalid argument";
const EXHAUSTED: &str = "resource has been exhausted";
const BUDGET: &str = "does not have permission"; // PermissionDenied: a budget or share is exhausted
const NO_SHARE: &str = "does not have permission"; // PermissionDenied: no share of the table

/// What a KDE of ε: the default mechanism is pure ε (δ = 0 is charged).
fn eps(e: f64) -> Budget {
    Budget::total(e, 0.0).unwrap()
}

struct Fixture {
    dir: TempDir,
    catalog: PathBuf,
    alice: String,
    bob: String,
    carol: String,
}

/// `mixture` (private, 2 000 rows, ε = 10), `public_x` (public); alice has a share of
/// ε = 5, bob of ε = 0.1 (less than one query), carol none.
async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    write_x(&dir.path("mixture.parquet"), &mixture(2000, 7).into_iter().map(Some).collect::<Vec<_>>());
    write_x(&dir.path("public_x.parquet"), &(0..100).map(|i| Some(i as f64)).collect::<Vec<_>>());
    let catalog = dir.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("mixture", &dir.str("mixture.parquet")).await.unwrap();
    admin.make_private("mixture", 10.0, 1e-3).await.unwrap();
    admin.set_bounds("mixture", "x", -0.2, 1.2).await.unwrap();
    admin.register("public_x", &dir.str("public_x.parquet")).await.unwrap();
    let alice = admin.add_analyst("alice").unwrap();
    let bob = admin.add_analyst("bob").unwrap();
    let carol = admin.add_analyst("carol").unwrap();
    admin.grant("alice", "mixture", 5.0, 1e-4).unwrap();
    admin.grant("bob", "mixture", 0.1, 1e-4).unwrap();
    Fixture { dir, catalog, alice, bob, carol }
}

fn spent(catalog: &Path) -> Budget {
    Catalog::open(catalog).unwrap().table("mixture").unwrap().unwrap().policy.unwrap().spent
}

fn release_id(batches: &[RecordBatch]) -> String {
    let s = batches[0].column(0).as_struct();
    s.column_by_name("release").unwrap().as_string::<i32>().value(0).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_required_and_checked_on_every_request() {
    let f = fixture("flight-auth").await;
    let server = Server::start(&f.catalog, &[]);
    for token in [None, Some("dpc1.alice.".to_string() + &"0".repeat(64)), Some(f.bob.replace("bob", "alice"))] {
        let mut c = client(&server.addr, token.as_deref()).await;
        let e = c.execute(KDE.into(), None).await.unwrap_err().to_string();
        assert!(e.contains(UNAUTHENTICATED) && e.contains("token"), "{e}");
        let e = c.get_catalogs().await.unwrap_err().to_string();
        assert!(e.contains(UNAUTHENTICATED), "metadata needs a token too: {e}");
    }
    // Basic credentials: the handshake returns the bearer token; a wrong name is refused.
    let mut c = client(&server.addr, None).await;
    let e = c.handshake("bob", &f.alice).await.unwrap_err().to_string();
    assert!(e.contains(UNAUTHENTICATED), "{e}");
    c.handshake("alice", &f.alice).await.unwrap();
    assert_eq!(c.token(), Some(&f.alice));
    assert!(run(&mut c, "SELECT count(*) FROM public_x").await.is_ok());
    // A rotated token stops working at once.
    Admin::open(&f.catalog).unwrap().rotate_token("alice").unwrap();
    let e = run(&mut c, "SELECT count(*) FROM public_x").await.unwrap_err();
    assert!(e.contains(UNAUTHENTICATED), "{e}");
    assert_eq!(spent(&f.catalog), Budget::ZERO);
    drop(f.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_is_charged_once_at_doget_refetched_free_and_bound_to_its_analyst() {
    let f = fixture("flight-ticket").await;
    let server = Server::start(&f.catalog, &[]);
    let mut alice = client(&server.addr, Some(&f.alice)).await;
    let info = alice.execute(KDE.into(), None).await.unwrap();
    assert_eq!(spent(&f.catalog), Budget::ZERO, "GetFlightInfo plans; it does not charge");
    // Another analyst, a forged and an altered ticket: the same "unknown ticket", nothing charged.
    let mut carol = client(&server.addr, Some(&f.carol)).await;
    let e = fetch(&mut carol, &info).await.unwrap_err();
    assert!(e.contains(NOT_FOUND) && e.contains("unknown or expired ticket"), "{e}");
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let any = prost_types_any(&ticket);
    let mut altered = any.clone();
    altered[0] ^= 1;
    for forged in [
        TicketStatementQuery { statement_handle: altered.into() },
        TicketStatementQuery { statement_handle: vec![7u8; 16].into() },
    ] {
        let e = match alice.do_get(Ticket::new(forged.as_any().encode_to_vec())).await {
            Err(e) => e.to_string(),
            Ok(s) => s.try_collect::<Vec<_>>().await.unwrap_err().to_string(),
        };
        assert!(e.contains("unknown or expired ticket"), "{e}");
    }
    assert_eq!(spent(&f.catalog), Budget::ZERO);
    // The owner of the ticket: charged once; a second fetch is the same release, free.
    let (schema1, first) = fetch(&mut alice, &info).await.unwrap();
    assert_eq!(spent(&f.catalog), eps(0.25));
    let (schema2, second) = fetch(&mut alice, &info).await.unwrap();
    assert_eq!(first, second, "the same stored result");
    assert_eq!(release_id(&first), release_id(&second));
    assert_eq!(schema1, schema2);
    assert_eq!(spent(&f.catalog), eps(0.25), "no second charge");
    // Two fetches of one ticket at the same time: still one charge.
    let info = alice.execute(KDE.into(), None).await.unwrap();
    let (mut a2, mut a3) = (client(&server.addr, Some(&f.alice)).await, client(&server.addr, Some(&f.alice)).await);
    let (r2, r3) = tokio::join!(fetch(&mut a2, &info), fetch(&mut a3, &info));
    assert_eq!(release_id(&r2.unwrap().1), release_id(&r3.unwrap().1));
    assert_eq!(spent(&f.catalog), eps(0.5));
    // The log says who.
    let log = Catalog::open(&f.catalog).unwrap().release_log(Some("mixture")).unwrap();
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|r| r.analyst.as_deref() == Some("alice")));
}

/// The statement handle inside a ticket.
fn prost_types_any(ticket: &Ticket) -> Vec<u8> {
    let any = arrow_flight::sql::Any::decode(ticket.ticket.clone()).unwrap();
    let t: TicketStatementQuery = any.unpack().unwrap().unwrap();
    t.statement_handle.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_info_and_doget_agree_exactly_on_schemas_nullability_included() {
    let f = fixture("flight-schema").await;
    let server = Server::start(&f.catalog, &[]);
    let mut c = client(&server.addr, Some(&f.alice)).await;
    let queries = [
        KDE,
        "SELECT unnest(kde.x) AS x, unnest(kde.density) AS d FROM (SELECT private_kde(x, 0.05, 0.25, 1e-6, \
         points => 16) AS kde FROM mixture)",
        "SELECT private_kde(x, 0.05, 0.25, 1e-6, points => 16)['mass'] AS n FROM mixture WHERE x > 0.5",
        "SELECT * FROM dpcurve.budgets",
        "SELECT * FROM dpcurve.releases",
        "SELECT x, x * 2 AS y FROM public_x WHERE x < 0", // empty
        "SELECT count(*) AS n, 1 AS one, NULL AS nothing FROM public_x",
    ];
    for q in queries {
        let info = c.execute(q.into(), None).await.unwrap_or_else(|e| panic!("{q}: {e}"));
        let announced = info.clone().try_decode_schema().unwrap();
        let (sent, batches) = fetch(&mut c, &info).await.unwrap();
        assert_eq!(&announced, sent.as_ref(), "{q}");
        for b in &batches {
            assert_eq!(b.schema().as_ref(), &announced, "{q}");
        }
    }
    // Prepared statements: the prepared schema is the executed one; each execution is a new
    // query (a new charge, a new release).
    let before = spent(&f.catalog);
    let mut stmt = c.prepare(KDE.into(), None).await.unwrap();
    let prepared_schema = stmt.dataset_schema().unwrap().clone();
    assert_eq!(spent(&f.catalog), before, "preparing charges nothing");
    let i1 = stmt.execute().await.unwrap();
    let i2 = stmt.execute().await.unwrap();
    let (s1, b1) = fetch(&mut c, &i1).await.unwrap();
    let (_, b2) = fetch(&mut c, &i2).await.unwrap();
    assert_eq!(s1.as_ref(), &prepared_schema);
    assert_ne!(release_id(&b1), release_id(&b2));
    assert_eq!(spent(&f.catalog), before.checked_add(&eps(0.5)).unwrap());
    stmt.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_keep_the_guards_messages_and_shares_are_enforced() {
    let f = fixture("flight-refusals").await;
    let server = Server::start(&f.catalog, &[]);
    let mut alice = client(&server.addr, Some(&f.alice)).await;
    for (q, needle) in [
        ("SELECT avg(x) FROM mixture", "private"),
        ("SELECT x FROM mixture", "private"),
        ("CREATE TABLE t AS SELECT 1", "not supported"),
        ("SELECT private_kde(x, 0.05, 0.25, 1e-6, points => 1) FROM mixture", "points"),
        ("SELECT 1; SELECT 2", "exactly one SQL statement"),
    ] {
        let e = alice.execute(q.into(), None).await.unwrap_err().to_string();
        assert!(e.contains(INVALID) && e.contains(needle), "{q}: {e}");
    }
    assert_eq!(spent(&f.catalog), Budget::ZERO);
    // Bob's share (0.1) does not cover a query of 0.25: refused at DoGet, nothing debited.
    let mut bob = client(&server.addr, Some(&f.bob)).await;
    let info = bob.execute(KDE.into(), None).await.unwrap();
    let e = fetch(&mut bob, &info).await.unwrap_err();
    assert!(e.contains(BUDGET) && e.contains("analyst 'bob' has exhausted their share of table 'mixture'"), "{e}");
    // Carol has no share at all.
    let mut carol = client(&server.addr, Some(&f.carol)).await;
    let e = run(&mut carol, KDE).await.unwrap_err();
    assert!(e.contains(NO_SHARE) && e.contains("analyst 'carol' has no share of table 'mixture'"), "{e}");
    assert_eq!(spent(&f.catalog), Budget::ZERO);
    // Public data needs no share.
    let n = run(&mut carol, "SELECT count(*) FROM public_x").await.unwrap();
    assert_eq!(n[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 100);
    // Each analyst sees their own share and releases.
    run(&mut alice, KDE).await.unwrap();
    let b = run(&mut alice, "SELECT share_epsilon_remaining FROM dpcurve.budgets").await.unwrap();
    assert!((b[0].column(0).as_primitive::<Float64Type>().value(0) - 4.75).abs() < 1e-12);
    let r = run(&mut carol, "SELECT count(*) FROM dpcurve.releases").await.unwrap();
    assert_eq!(r[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 0);
    let r = run(&mut alice, "SELECT count(*) FROM dpcurve.releases").await.unwrap();
    assert_eq!(r[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 1);
    // Files changed after their verification: refused while planning, free, until the data owner
    // verifies them again — which the server's cached session sees at the next query.
    write_x(&f.dir.path("mixture.parquet"), &mixture(1000, 8).into_iter().map(Some).collect::<Vec<_>>());
    let before = spent(&f.catalog);
    let e = alice.execute(KDE.into(), None).await.unwrap_err().to_string();
    assert!(e.contains(INVALID) && e.contains("[rule verified-files] private table 'mixture'"), "{e}");
    assert_eq!(spent(&f.catalog), before);
    assert_eq!(Admin::open(&f.catalog).unwrap().verify("mixture").await.unwrap(), 1);
    run(&mut alice, KDE).await.unwrap();
    assert!(spent(&f.catalog) != before);
    // A removed analyst's planned query is not charged.
    let info = alice.execute(KDE.into(), None).await.unwrap();
    Admin::open(&f.catalog).unwrap().remove_analyst("alice").unwrap();
    let before = spent(&f.catalog);
    let e = fetch(&mut alice, &info).await.unwrap_err();
    assert!(e.contains(UNAUTHENTICATED), "{e}");
    assert_eq!(spent(&f.catalog), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalogs_schemas_tables_and_sql_info() {
    let f = fixture("flight-meta").await;
    // A table whose file loses its footer after registration: listing the tables with their
    // columns leaves it out instead of failing; without columns it is listed (nothing is opened).
    write_x(&f.dir.path("broken.parquet"), &(0..100).map(|i| Some(i as f64)).collect::<Vec<_>>());
    Admin::open(&f.catalog).unwrap().register("broken", &f.dir.str("broken.parquet")).await.unwrap();
    let bytes = std::fs::read(f.dir.path("broken.parquet")).unwrap();
    std::fs::write(f.dir.path("broken.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    let server = Server::start(&f.catalog, &[]);
    let mut c = client(&server.addr, Some(&f.carol)).await;
    let info = c.get_catalogs().await.unwrap();
    let (_, b) = fetch(&mut c, &info).await.unwrap();
    assert_eq!(b[0].column(0).as_string::<i32>().value(0), "datafusion");
    let info = c.get_db_schemas(CommandGetDbSchemas { catalog: None, db_schema_filter_pattern: None }).await.unwrap();
    let (_, b) = fetch(&mut c, &info).await.unwrap();
    let schemas: Vec<&str> = b[0].column(1).as_string::<i32>().iter().flatten().collect();
    assert_eq!(schemas, ["dpcurve", "public"]);
    let info = c
        .get_tables(CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: None,
            table_name_filter_pattern: None,
            table_types: vec![],
            include_schema: true,
        })
        .await
        .unwrap();
    let announced = info.clone().try_decode_schema().unwrap();
    let (sent, b) = fetch(&mut c, &info).await.unwrap();
    assert_eq!(sent.as_ref(), &announced);
    let tables: Vec<&str> = b.iter().flat_map(|b| b.column(2).as_string::<i32>().iter().flatten()).collect();
    for t in ["mixture", "public_x", "budgets", "releases"] {
        assert!(tables.contains(&t), "{t} in {tables:?}");
    }
    assert!(!tables.contains(&"broken"), "{tables:?}");
    // Each listed table carries its columns (an IPC-encoded schema): `mixture`'s holds `x`.
    let at = tables.iter().position(|t| *t == "mixture").unwrap();
    let columns = b[0].column(4).as_binary::<i32>().value(at);
    let schema = datafusion::arrow::ipc::convert::try_schema_from_ipc_buffer(columns).unwrap();
    assert_eq!(schema.field(0).name(), "x");
    let info = c
        .get_tables(CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: None,
            table_name_filter_pattern: Some("b%".into()),
            table_types: vec![],
            include_schema: false,
        })
        .await
        .unwrap();
    let (_, b) = fetch(&mut c, &info).await.unwrap();
    let tables: Vec<&str> = b.iter().flat_map(|b| b.column(2).as_string::<i32>().iter().flatten()).collect();
    assert_eq!(tables, ["budgets", "broken"]); // by schema: dpcurve, then public
    // The statement naming it gets the reason.
    let e = run(&mut c, "SELECT count(*) FROM broken").await.unwrap_err();
    assert!(e.contains("table 'broken'") && e.contains("cannot be opened"), "{e}");
    let info = c.get_sql_info(vec![arrow_flight::sql::SqlInfo::FlightSqlServerName]).await.unwrap();
    let (_, b) = fetch(&mut c, &info).await.unwrap();
    assert_eq!(b[0].num_rows(), 1);
    let info = c.get_table_types().await.unwrap();
    let (_, b) = fetch(&mut c, &info).await.unwrap();
    assert_eq!(b[0].num_rows(), 2);
    assert_eq!(spent(&f.catalog), Budget::ZERO);
}

/// 8 clients (two per analyst) × 100 queries race for a table budget of 100 queries whose
/// four shares add up to 120: exactly 100 succeed, the table's total is spent exactly, and
/// no analyst spends more than their share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_clients_near_exhaustion_spend_exactly_the_budget() {
    let dir = TempDir::new("flight-load");
    write_x(&dir.path("p.parquet"), &mixture(200, 3).into_iter().map(Some).collect::<Vec<_>>());
    let catalog = dir.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("p", &dir.str("p.parquet")).await.unwrap();
    admin.make_private("p", 1.0, 0.0).await.unwrap();
    let names = ["a0", "a1", "a2", "a3"];
    let tokens: Vec<String> = names.iter().map(|n| admin.add_analyst(n).unwrap()).collect();
    for n in names {
        admin.grant(n, "p", 0.3, 0.0).unwrap();
    }
    let server = Server::start(&catalog, &[]);
    let q = "SELECT private_kde(x, 0.05, 0.01, 0, 0, 1, 16) AS k FROM p";
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (addr, token) = (server.addr.clone(), tokens[i / 2].clone());
        tasks.push(tokio::spawn(async move {
            let mut c = client(&addr, Some(&token)).await;
            let (mut ok, mut refused) = (0usize, 0usize);
            for _ in 0..100 {
                match run(&mut c, q).await {
                    Ok(_) => ok += 1,
                    Err(e) if e.contains(BUDGET) && e.contains("exhausted") => refused += 1,
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            (i / 2, ok, refused)
        }));
    }
    let mut per_analyst = [0usize; 4];
    let mut total_ok = 0;
    for t in tasks {
        let (a, ok, refused) = t.await.unwrap();
        assert_eq!(ok + refused, 100);
        per_analyst[a] += ok;
        total_ok += ok;
    }
    let elapsed = started.elapsed();
    assert_eq!(total_ok, 100, "exactly the queries that fit: {per_analyst:?}");
    let c = Catalog::open(&catalog).unwrap();
    assert_eq!(c.table("p").unwrap().unwrap().policy.unwrap().spent, eps(1.0));
    let analysts = c.analysts().unwrap();
    let mut share_sum = Budget::ZERO;
    for (i, a) in analysts.iter().enumerate() {
        let g = &a.grants[0];
        assert!(g.spent.fits_within(&g.total), "{} overspent: {:?}", a.name, g);
        // per_analyst[i] charges of ε = 0.01, in exact units of 1e-12.
        assert_eq!(g.spent, Budget { epsilon_units: 10_000_000_000 * per_analyst[i] as i64, delta_units: 0 });
        share_sum = share_sum.checked_add(&g.spent).unwrap();
    }
    assert_eq!(share_sum, eps(1.0));
    let log = c.release_log(Some("p")).unwrap();
    assert_eq!(log.len(), 100);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(log.iter().filter(|r| r.analyst.as_deref() == Some(n)).count(), per_analyst[i]);
    }
    eprintln!("800 queries (100 charged) by 8 clients in {elapsed:?}; per analyst {per_analyst:?}");
}

/// A server killed (SIGKILL) while a private query runs: the debit, made durable before any
/// row was read, is still in the ledger when the catalog is opened again; no release was
/// made, nothing is refunded, and a new server serves the rest of the budget.
/// A private table `fit` (x, y; 200 000 rows, ε = 3) and a token of alice, who has all of it.
async fn slow_fixture(tag: &str) -> (TempDir, PathBuf, String) {
    let dir = TempDir::new(tag);
    let n = 200_000;
    let xs: Vec<f64> = mixture(n, 5);
    let ys: Vec<f64> = xs.iter().map(|x| (6.0 * x).sin()).collect();
    write_columns(
        &dir.path("fit.parquet"),
        vec![("x", Arc::new(Float64Array::from(xs)) as _), ("y", Arc::new(Float64Array::from(ys)) as _)],
    );
    let catalog = dir.path("catalog.db");
    let admin = Admin::open(&catalog).unwrap();
    admin.register("fit", &dir.str("fit.parquet")).await.unwrap();
    admin.make_private("fit", 3.0, 1e-3).await.unwrap();
    admin.set_bounds("fit", "x", 0.0, 1.0).await.unwrap();
    admin.set_bounds("fit", "y", -1.0, 1.0).await.unwrap();
    let token = admin.add_analyst("alice").unwrap();
    admin.grant("alice", "fit", 3.0, 1e-3).unwrap();
    (dir, catalog, token)
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

/// The regression's constant-work solver runs long after the debit (hundreds of objective
/// evaluations at the narrowest bandwidth): a kill or a disconnect lands between the debit and
/// the release.
const SLOW: &str = "SELECT private_kernel_regression(y, x, 1.0, 1e-6, bandwidth => 0.004, penalty => 10) AS f FROM fit";

/// A client that goes away after its query was charged loses nothing: the query finishes on
/// the server, and fetching the ticket again returns the release, without a second charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_after_the_charge_fetches_the_release_again() {
    let (_dir, catalog, token) = slow_fixture("flight-gone").await;
    let server = Server::start(&catalog, &[]);
    let mut c = client(&server.addr, Some(&token)).await;
    let info = c.execute(SLOW.into(), None).await.unwrap();
    let info2 = info.clone();
    let fetching = tokio::spawn(async move { fetch(&mut c, &info2).await });
    wait_for_the_debit(&catalog);
    fetching.abort();
    let _ = fetching.await;
    let ledger = Catalog::open(&catalog).unwrap();
    assert!(ledger.stored_releases(Some("fit")).unwrap().is_empty(), "the client left before the release");
    let mut again = client(&server.addr, Some(&token)).await;
    let (_, batches) = fetch(&mut again, &info).await.unwrap();
    assert_eq!(release_id(&batches), ledger.stored_releases(Some("fit")).unwrap()[0].release);
    assert_eq!(ledger.release_log(Some("fit")).unwrap().len(), 1, "one charge");
}

/// A server killed (SIGKILL) while a private query runs: the debit, made durable before any
/// row was read, is still in the ledger when the catalog is opened again; no release was
/// made, nothing is refunded, and a new server serves the rest of the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_server_mid_query_loses_no_charge() {
    let (_dir, catalog, token) = slow_fixture("flight-kill").await;
    let mut server = Server::start(&catalog, &[]);
    let mut c = client(&server.addr, Some(&token)).await;
    let info = c.execute(SLOW.into(), None).await.unwrap();
    let fetching = tokio::spawn(async move { fetch(&mut c, &info).await });
    wait_for_the_debit(&catalog);
    server.kill();
    let e = fetching.await.unwrap().unwrap_err();
    assert!(!e.is_empty());
    let c = Catalog::open(&catalog).unwrap();
    let log = c.release_log(Some("fit")).unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].analyst.as_deref(), Some("alice"));
    assert_eq!(c.table("fit").unwrap().unwrap().policy.unwrap().spent, Budget::total(1.0, 1e-6).unwrap());
    assert_eq!(c.share("alice", "fit").unwrap().unwrap().spent, Budget::total(1.0, 1e-6).unwrap());
    assert!(
        c.stored_releases(Some("fit")).unwrap().is_empty(),
        "the kill came after the release: make the query slower"
    );
    // A new server on the same catalog serves what is left: exactly 2 more.
    let server = Server::start(&catalog, &[]);
    let mut c = client(&server.addr, Some(&token)).await;
    let q = "SELECT private_kernel_regression(y, x, 1.0, 1e-6, penalty => 10, points => 9) AS f FROM fit";
    assert!(run(&mut c, q).await.is_ok());
    assert!(run(&mut c, q).await.is_ok());
    let e = run(&mut c, q).await.unwrap_err();
    assert!(e.contains("exhausted"), "{e}");
}

/// A client that goes away in the middle of a large result must not take the server with it:
/// the server's next write to the closed connection (a vectored write, which raises SIGPIPE)
/// is an error on that connection only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_vanishing_mid_stream_does_not_end_the_server() {
    let f = fixture("flight-vanish").await;
    let big: Vec<Option<f64>> = (0..3_000_000).map(|i| Some(i as f64)).collect();
    write_x(&f.dir.path("big.parquet"), &big);
    Admin::open(&f.catalog).unwrap().register("big", &f.dir.str("big.parquet")).await.unwrap();
    let mut server = Server::start(&f.catalog, &[]);
    for _ in 0..3 {
        let mut c = client(&server.addr, Some(&f.carol)).await;
        let info = c.execute("SELECT x FROM big".into(), None).await.unwrap();
        let mut stream = c.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap();
        assert!(stream.try_next().await.unwrap().unwrap().num_rows() > 0);
        drop(stream);
        drop(c); // the connection closes with most of the result unsent
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(server.child.try_wait().unwrap().is_none(), "the server ended: {:?}", server.child.try_wait());
    let mut c = client(&server.addr, Some(&f.carol)).await;
    assert!(run(&mut c, "SELECT count(*) FROM public_x").await.is_ok(), "the server still answers");
}

/// More concurrent queries of one analyst than the server allows are refused at once, before
/// anything is planned or charged; other analysts are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_queries_per_analyst_are_limited() {
    let f = fixture("flight-limit").await;
    // A public table large enough that a client that does not read its stream keeps it open
    // (the result exceeds HTTP/2's flow-control windows).
    let big: Vec<Option<f64>> = (0..3_000_000).map(|i| Some(i as f64)).collect();
    write_x(&f.dir.path("big.parquet"), &big);
    Admin::open(&f.catalog).unwrap().register("big", &f.dir.str("big.parquet")).await.unwrap();
    let server = Server::start(&f.catalog, &["--max-queries-per-analyst", "1"]);
    let mut holder = client(&server.addr, Some(&f.alice)).await;
    let info = holder.execute("SELECT x FROM big".into(), None).await.unwrap();
    let mut stream = holder.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap();
    let first = stream.try_next().await.unwrap().unwrap();
    assert!(first.num_rows() > 0);
    let mut again = client(&server.addr, Some(&f.alice)).await;
    let e = again.execute(KDE.into(), None).await.unwrap_err().to_string();
    assert!(e.contains(EXHAUSTED) && e.contains("already runs 1 queries"), "{e}");
    let mut carol = client(&server.addr, Some(&f.carol)).await;
    assert!(run(&mut carol, "SELECT count(*) FROM public_x").await.is_ok(), "other analysts are not limited");
    // Once the stream is read to the end (or dropped), the slot is free again.
    let rest: Vec<RecordBatch> = stream.try_collect().await.unwrap();
    let rows: usize = rest.iter().map(|b| b.num_rows()).sum::<usize>() + first.num_rows();
    assert_eq!(rows, 3_000_000);
    let mut tries = 0;
    loop {
        match again.execute(KDE.into(), None).await {
            Ok(_) => break,
            Err(e) if tries < 100 && e.to_string().contains("already runs") => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(spent(&f.catalog), Budget::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_the_certificate_only() {
    let f = fixture("flight-tls").await;
    let (cert, key) = self_signed(&f.dir);
    let server =
        Server::start(&f.catalog, &["--tls-cert", &cert.to_string_lossy(), "--tls-key", &key.to_string_lossy()]);
    let port = server.addr.rsplit(':').next().unwrap().to_string();
    let pem = std::fs::read(&cert).unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    c.set_token(f.alice.clone());
    let kde = run(&mut c, KDE).await.unwrap();
    assert_eq!(kde[0].num_rows(), 1);
    assert_eq!(spent(&f.catalog), eps(0.25));
    // A plaintext client gets nothing from a TLS server; nor does one that trusts no such CA.
    let plain = Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect().await;
    if let Ok(channel) = plain {
        let mut c = FlightSqlServiceClient::new(channel);
        c.set_token(f.alice.clone());
        assert!(c.execute(KDE.into(), None).await.is_err());
    }
    let untrusting = tonic::transport::ClientTlsConfig::new().domain_name("localhost");
    let refused = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(untrusting)
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = refused {
        let mut c = FlightSqlServiceClient::new(channel);
        c.set_token(f.alice.clone());
        assert!(c.execute(KDE.into(), None).await.is_err(), "an unknown certificate must not be accepted");
    }
    assert_eq!(spent(&f.catalog), eps(0.25));
}

#[test]
fn sigterm_stops_the_server_gracefully() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = rt.block_on(fixture("flight-term"));
    let mut server = Server::start(&f.catalog, &[]);
    rt.block_on(async {
        let mut c = client(&server.addr, Some(&f.alice)).await;
        run(&mut c, "SELECT count(*) FROM public_x").await.unwrap();
    });
    // SAFETY: sending a signal to our own child process.
    unsafe {
        libc::kill(server.child.id() as i32, libc::SIGTERM);
    }
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(server.child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("shutting down"), "{err}");
}
