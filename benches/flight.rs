//! Flight SQL serving cost: queries/s and p50/p99 latency of one small private
//! query through `dpcurve serve`'s service (a real loopback socket, arrow-flight's client,
//! token check, planning at GetFlightInfo, the charge at DoGet) against the same query in
//! process (`AnalystSession::query`, same catalog, same analyst share), in the same run.
//!
//! ```text
//! cargo bench --bench flight                       # 400 queries, 1, 4, 8 and 16 clients
//! cargo bench --bench flight -- --queries 2000 --clients 1,4,8 --rows 1e5
//! cargo bench --bench flight -- --abuse --seconds 60   # another analyst attacks meanwhile
//! ```
//!
//! `--abuse`: one analyst (bob) runs the private query over and over, first alone ("quiet"),
//! then for `--seconds` while another (eve, with the default per-analyst limits) runs every
//! attack of `tests/server_abuse.rs` in a loop: statements nested 10⁵ deep, `VALUES` lists that
//! take seconds to plan, 400 MB public results abandoned after 0.3 s, 8 MiB statements, and
//! floods of free GetFlightInfo and CreatePreparedStatement calls. Bob's p50/p99 both ways.
//!
//! Both paths pay the durable ledger debit (fsync) of every release; the ratio is what the
//! network service adds on top. Concurrent debits of one process share a commit (group commit):
//! the bench also times the debit alone (`Catalog::charge_as` from 1, 4, 8, 16 threads on the
//! same catalog file, one analyst share) with the debits per commit, and prints each path's
//! throughput against its own at one client.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::{Float64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use dpcurve::policy::{Catalog, Charge};
use dpcurve::server::{ServeOptions, serve};
use dpcurve::{Admin, AnalystSession, SessionOptions};
use futures::TryStreamExt;
use tonic::transport::Channel;

const QUERY: &str = "SELECT private_kde(x, 0.05, 0.001, 0, 0, 1, 64) AS k FROM p";

struct Options {
    queries: usize,
    clients: Vec<usize>,
    rows: usize,
    abuse: bool,
    seconds: f64,
}

fn options() -> Options {
    let mut o = Options { queries: 400, clients: vec![1, 4, 8, 16], rows: 10_000, abuse: false, seconds: 60.0 };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut v = || it.next().cloned().unwrap_or_default();
        match a.as_str() {
            "--queries" => o.queries = v().parse::<f64>().expect("--queries N") as usize,
            "--clients" => o.clients = v().split(',').map(|c| c.parse().expect("--clients LIST")).collect(),
            "--rows" => o.rows = v().parse::<f64>().expect("--rows N") as usize,
            "--abuse" => o.abuse = true,
            "--seconds" => o.seconds = v().parse().expect("--seconds S"),
            "--bench" => {}
            other => eprintln!("ignoring {other}"),
        }
    }
    o
}

/// CPU time (user + system) this process has used, in seconds: the server, the clients and
/// the in-process session all run in it, so it is all the CPU the queries cost on this machine.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one plain struct that we own.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// What a run cost: (queries/s, sorted latencies, CPU ms per query, cores busy on average).
struct Run {
    qps: f64,
    latencies: Vec<Duration>,
    cpu_ms: f64,
    cores: f64,
}

/// Latencies of `queries` queries split over `clients` concurrent workers running `one`.
async fn measure<F, Fut>(queries: usize, clients: usize, one: F) -> Run
where
    F: Fn(usize) -> Fut + Send + Sync + 'static + Clone,
    Fut: std::future::Future<Output = Duration> + Send + 'static,
{
    let cpu = cpu_seconds();
    let started = Instant::now();
    let per = queries / clients;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            let mut v = Vec::with_capacity(per);
            for _ in 0..per {
                v.push(one(c).await);
            }
            v
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu;
    all.sort();
    Run { qps: all.len() as f64 / wall, cpu_ms: cpu * 1e3 / all.len() as f64, cores: cpu / wall, latencies: all }
}

/// The durable debit alone: `debits` charges of ε = 1e-6 by analyst "bench" on table "p",
/// split over `clients` threads sharing `catalog`: (debits/s, sorted latencies, debits per commit).
fn debit_only(catalog: &Catalog, debits: usize, clients: usize) -> (f64, Vec<Duration>, f64) {
    let charge = [Charge {
        table: "p".into(),
        function: "private_kde".into(),
        cost: dpcurve::mechanism::noise::budget::Budget::charge(1e-6, 0.0).unwrap(),
    }];
    let commits = catalog.debit_commits();
    let started = Instant::now();
    let mut all: Vec<Duration> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| {
                    (0..debits / clients)
                        .map(|_| {
                            let t = Instant::now();
                            catalog.charge_as(&charge, "debit bench", Some("bench")).unwrap();
                            t.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort();
    let per_commit = all.len() as f64 / (catalog.debit_commits() - commits).max(1) as f64;
    (rate, all, per_commit)
}

fn pct(v: &[Duration], p: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3
}

async fn flight_client(addr: &str, token: &str) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    c.set_token(token.to_string());
    c
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // As `dpcurve serve` does.
    dpcurve::allocator::keep_freed_memory();
    let o = options();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-data/flight");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("p.parquet");
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, false)]));
    let xs = dpcurve::datagen::mixture(o.rows, 1);
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Float64Array::from(xs))]).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(&data).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let catalog_path = dir.join("catalog.db");
    let admin = Admin::open(&catalog_path).unwrap();
    admin.register("p", data.to_str().unwrap()).await.unwrap();
    admin.make_private("p", 1000.0, 0.0).await.unwrap();
    let token = admin.add_analyst("bench").unwrap();
    admin.grant("bench", "p", 1000.0, 0.0).unwrap();
    let eve = admin.add_analyst("eve").unwrap();
    admin.grant("eve", "p", 1000.0, 0.0).unwrap();

    let (tx, rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut opts = ServeOptions::new(catalog_path.clone(), "127.0.0.1:0".parse().unwrap());
    // One analyst runs all clients here: lift the per-analyst limit above the client count (not
    // under attack: eve has the defaults).
    if !o.abuse {
        opts.max_queries_per_analyst = o.clients.iter().copied().max().unwrap_or(1);
    }
    let server = tokio::spawn(serve(
        opts,
        async move {
            let _ = stop_rx.await;
        },
        move |a| {
            let _ = tx.send(a);
        },
    ));
    let addr = rx.await.unwrap().to_string();

    let catalog = Arc::new(Catalog::open(&catalog_path).unwrap());
    let session =
        Arc::new(AnalystSession::with_principal(catalog, SessionOptions::default(), Some("bench")).await.unwrap());

    if o.abuse {
        abuse(&addr, &token, &eve, o.seconds).await;
        let _ = stop_tx.send(());
        server.await.unwrap().unwrap();
        return;
    }
    println!("flight bench: {} queries of `{QUERY}` over {} rows", o.queries, o.rows);
    println!("{:<12} {:>8} {:>10} {:>9} {:>9}", "path", "clients", "queries/s", "p50 ms", "p99 ms");
    // Warm-up: both paths open their session and caches.
    session.query(QUERY).await.unwrap();
    let mut warm = flight_client(&addr, &token).await;
    let info = warm.execute(QUERY.into(), None).await.unwrap();
    let _: Vec<RecordBatch> =
        warm.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap().try_collect().await.unwrap();

    let ledger = Catalog::open(&catalog_path).unwrap();
    let (mut base_debit, mut base_in, mut base_fl) = (f64::NAN, f64::NAN, f64::NAN);
    for &clients in &o.clients {
        let (rate, lat, per_commit) = debit_only(&ledger, o.queries, clients);
        if clients == 1 {
            base_debit = rate;
        }
        println!(
            "{:<12} {clients:>8} {rate:>10.1} {:>9.2} {:>9.2}   ({per_commit:.1} debits per commit; {:.2}× one thread's rate)",
            "debit alone",
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            rate / base_debit
        );
    }
    for &clients in &o.clients {
        let s = Arc::clone(&session);
        let inproc = measure(o.queries, clients, move |_| {
            let s = Arc::clone(&s);
            async move {
                let t = Instant::now();
                s.query(QUERY).await.unwrap();
                t.elapsed()
            }
        })
        .await;
        let mut pool = Vec::new();
        for _ in 0..clients {
            pool.push(Arc::new(tokio::sync::Mutex::new(flight_client(&addr, &token).await)));
        }
        let pool = Arc::new(pool);
        let flight = measure(o.queries, clients, move |c| {
            let pool = Arc::clone(&pool);
            async move {
                let mut client = pool[c].lock().await;
                let t = Instant::now();
                let info = client.execute(QUERY.into(), None).await.unwrap();
                let _: Vec<RecordBatch> =
                    client.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap().try_collect().await.unwrap();
                t.elapsed()
            }
        })
        .await;
        for (name, r) in [("in-process", &inproc), ("flight-sql", &flight)] {
            println!(
                "{name:<12} {clients:>8} {:>10.1} {:>9.2} {:>9.2}   (CPU {:.2} ms per query, {:.2} cores busy)",
                r.qps,
                pct(&r.latencies, 0.5),
                pct(&r.latencies, 0.99),
                r.cpu_ms,
                r.cores
            );
        }
        if clients == 1 {
            (base_in, base_fl) = (inproc.qps, flight.qps);
            // All the machine's cores busy at the CPU one query costs: no client count can go
            // above this rate, whatever the ledger does.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            println!(
                "  CPU ceiling on {cores} cores: in process {:.2}× the 1-client rate, Flight SQL {:.2}×",
                cores / (inproc.cpu_ms * 1e-3) / inproc.qps,
                cores / (flight.cpu_ms * 1e-3) / flight.qps
            );
        }
        println!(
            "  ratio flight/in-process at {clients} client(s): throughput {:.2}×, p50 latency {:.2}×; \
             throughput vs 1 client: in process {:.2}×, Flight SQL {:.2}×",
            flight.qps / inproc.qps,
            pct(&flight.latencies, 0.5) / pct(&inproc.latencies, 0.5),
            inproc.qps / base_in,
            flight.qps / base_fl
        );
    }
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

/// One private query through Flight SQL; its latency.
async fn timed_query(c: &mut FlightSqlServiceClient<Channel>) -> Duration {
    let t = Instant::now();
    let info = c.execute(QUERY.into(), None).await.unwrap();
    let _: Vec<RecordBatch> =
        c.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap().try_collect().await.unwrap();
    t.elapsed()
}

/// Bob's latencies for `seconds`.
async fn bob_for(c: &mut FlightSqlServiceClient<Channel>, seconds: f64) -> Vec<Duration> {
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut v = Vec::new();
    while Instant::now() < until {
        v.push(timed_query(c).await);
    }
    v.sort();
    v
}

/// Eve's attacks, each in a loop until `stop`; counts of requests made.
async fn attack(addr: String, token: String, kind: usize, stop: Arc<std::sync::atomic::AtomicBool>) -> usize {
    let mut c = flight_client(&addr, &token).await;
    let deep = format!("SELECT {}", vec!["1"; 100_000].join(" + "));
    let values: Vec<String> = (0..50_000).map(|i| format!("({i}.5)")).collect();
    let heavy = format!("SELECT count(*) FROM (VALUES {}) AS v(a)", values.join(", "));
    let long = format!("SELECT length('{}') AS n", "x".repeat(8 << 20));
    let mut n = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        n += 1;
        match kind {
            0 => drop(c.execute(deep.clone(), None).await),
            1 => drop(c.execute(heavy.clone(), None).await),
            2 => {
                if let Ok(info) = c.execute("SELECT * FROM generate_series(1, 50000000)".into(), None).await
                    && let Ok(mut s) = c.do_get(info.endpoint[0].ticket.clone().unwrap()).await
                {
                    let until = Instant::now() + Duration::from_millis(300);
                    while Instant::now() < until && matches!(s.try_next().await, Ok(Some(_))) {}
                }
                c = flight_client(&addr, &token).await; // abandon the stream with its connection
            }
            3 => drop(c.execute(long.clone(), None).await),
            4 => drop(c.execute("SELECT 1".into(), None).await),
            _ => drop(c.prepare("SELECT 2".into(), None).await),
        }
    }
    n
}

/// Bob's private query alone, then while eve attacks (module docs).
async fn abuse(addr: &str, bob_token: &str, eve_token: &str, seconds: f64) {
    let mut bob = flight_client(addr, bob_token).await;
    timed_query(&mut bob).await;
    let quiet = bob_for(&mut bob, seconds.min(20.0)).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attackers: Vec<_> = (0..6)
        .map(|kind| tokio::spawn(attack(addr.to_string(), eve_token.to_string(), kind, Arc::clone(&stop))))
        .collect();
    let loud = bob_for(&mut bob, seconds).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut made = Vec::new();
    for a in attackers {
        made.push(a.await.unwrap());
    }
    println!("flight abuse bench: bob's `{QUERY}` while eve attacks for {seconds} s");
    println!(
        "eve's requests: deep {}, heavy VALUES {}, 400 MB abandoned {}, 8 MiB {}, GetFlightInfo {}, prepare {}",
        made[0], made[1], made[2], made[3], made[4], made[5]
    );
    println!("{:<8} {:>8} {:>9} {:>9} {:>9}", "bob", "queries", "p50 ms", "p99 ms", "max ms");
    for (name, v) in [("quiet", &quiet), ("attacked", &loud)] {
        println!("{name:<8} {:>8} {:>9.2} {:>9.2} {:>9.2}", v.len(), pct(v, 0.5), pct(v, 0.99), pct(v, 1.0));
    }
    println!(
        "  ratio attacked/quiet: p50 {:.2}×, p99 {:.2}×",
        pct(&loud, 0.5) / pct(&quiet, 0.5),
        pct(&loud, 0.99) / pct(&quiet, 0.99)
    );
}
