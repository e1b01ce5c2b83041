//! `dpcurve serve`: an Arrow Flight SQL server for analysts.
//!
//! Every request carries an analyst's bearer token (`authorization: Bearer dpc1.…`), or
//! basic credentials (name, token) that the handshake exchanges for the same bearer token.
//! Each authenticated analyst gets the same read-only catalog session and planner guard as
//! the CLI, charged on the tables' totals *and* on the analyst's shares
//! ([`crate::AnalystSession::with_principal`]).
//!
//! What happens when:
//! * **GetFlightInfo** (a statement, or an execution of a prepared statement) parses, guards
//!   and prices the query — a refusal comes here and costs nothing — and returns its schema
//!   with one ticket. Nothing is charged. The ticket keeps a short statement's plan for its first
//!   fetch, and of a long statement only its text.
//! * **DoGet** on a ticket runs its query (planning the statement again when no plan was kept),
//!   streaming its batches as they come; the budget gate debits the ledger durably before any row is read. A paid query runs
//!   to the end even when its client leaves, and its result is kept with the ticket (when it
//!   fits the analyst's memory) so a re-fetch returns the very same result without a second
//!   charge; a public query runs again at every fetch.
//! * Tickets are random 128-bit server-side handles bound to the analyst who planned them:
//!   another analyst's, a forged or an expired ticket gets the same "unknown ticket" error —
//!   except that a paid ticket whose result is gone (expired, forgotten, or the server
//!   restarted) is answered with the ids of the stored releases it paid for, free to read.
//! * Everything an analyst holds is theirs alone ([`registry`]): tickets, prepared statements
//!   and kept results under per-analyst caps and a per-analyst byte budget; one analyst's
//!   requests never evict another's entries. Each analyst has a number of query slots; a slot is
//!   held by the planning and by the query task until they end.
//! * Planning runs on threads of its own and queries on a runtime of their own ([`work`]), so a
//!   long statement or a heavy query never holds up another analyst's requests.
//!
//! Errors are the session's messages (the guard's and the gate's, which never carry data)
//! with a gRPC code by kind (README, "Errors and their codes"): a refusal at planning is
//! `InvalidArgument`, an exhausted budget or share and no share at all `PermissionDenied` (ADBC's
//! drivers map it to their own status, UNAUTHORIZED; the two are told apart by the `dpcurve-error`
//! metadata entry, `budget-exhausted` or `no-share`), a server limit `ResourceExhausted`, a
//! missing or wrong token `Unauthenticated`, a ticket that is gone `NotFound`.

pub mod registry;
mod service;
pub mod status;
pub mod work;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::policy::Catalog;
use crate::session::SessionOptions;
pub use service::DpFlightSql;
pub use status::{policy_status, status_of};

/// Queries one analyst may plan or run at once unless `--max-queries-per-analyst` says otherwise.
pub const DEFAULT_MAX_QUERIES_PER_ANALYST: usize = 4;
/// Tickets one analyst keeps; beyond it their own oldest is forgotten.
pub const MAX_TICKETS_PER_ANALYST: usize = 1000;
/// Prepared statements one analyst keeps open; beyond it their own oldest is closed.
pub const MAX_PREPARED_PER_ANALYST: usize = 1000;
/// Bytes of statements and kept results one analyst may hold unless `--max-bytes-per-analyst`
/// says otherwise.
pub const DEFAULT_MAX_BYTES_PER_ANALYST: usize = 256 << 20;
/// The largest paid result kept in the catalog (`dpcurve.results`): curves are kilobytes, and
/// this bounds what one query adds to the catalog.
pub const MAX_KEPT_RESULT_BYTES: usize = 16 << 20;
/// How long a ticket can be fetched (and re-fetched) after it was issued.
pub const TICKET_LIFETIME: Duration = Duration::from_secs(3600);
/// The largest request message (a statement's text, mostly) the server reads.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How `dpcurve serve` is set up.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The catalog (and ledger) file.
    pub catalog: PathBuf,
    /// Address to listen on (port 0: any free port, reported to `on_listening`).
    pub listen: SocketAddr,
    /// PEM certificate chain and private key: serve over TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Concurrent queries per analyst (planning or running); more are refused at once.
    pub max_queries_per_analyst: usize,
    /// Bytes of statements and kept results per analyst; more are refused (or not kept).
    pub max_bytes_per_analyst: usize,
    /// Partitions of each query (None: number of cores).
    pub target_partitions: Option<usize>,
    /// Cluster mode: `df://HOST:PORT` of a Ballista scheduler.
    pub cluster: Option<String>,
}

impl ServeOptions {
    /// Options with the defaults for `catalog` and `listen`.
    pub fn new(catalog: PathBuf, listen: SocketAddr) -> Self {
        Self {
            catalog,
            listen,
            tls: None,
            max_queries_per_analyst: DEFAULT_MAX_QUERIES_PER_ANALYST,
            max_bytes_per_analyst: DEFAULT_MAX_BYTES_PER_ANALYST,
            target_partitions: None,
            cluster: None,
        }
    }
}

/// Runs the server until `shutdown` completes, then stops accepting connections and lets
/// the requests in flight finish. `on_listening` gets the bound address (useful with port 0).
pub async fn serve(
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), String> {
    let catalog = Arc::new(Catalog::open(&opts.catalog).map_err(|e| e.to_string())?);
    // Fail at start, not at the first query, when the catalog's locations are not usable.
    catalog.check_locations().map_err(|e| e.to_string())?;
    let session_options = SessionOptions {
        target_partitions: opts.target_partitions,
        noise: crate::NoiseSource::Os,
        allow_statements: false,
        cluster: opts.cluster.clone(),
    };
    // Queries run on a runtime of their own (work.rs): a heavy one never holds up the threads
    // that answer requests.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let queries = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("dpcurve-query")
        .thread_stack_size(16 << 20)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the query runtime: {e}"))?;
    let limits = registry::Limits {
        tickets: MAX_TICKETS_PER_ANALYST,
        prepared: MAX_PREPARED_PER_ANALYST,
        bytes: opts.max_bytes_per_analyst.max(1),
        lifetime: TICKET_LIFETIME,
    };
    let service =
        DpFlightSql::new(catalog, session_options, opts.max_queries_per_analyst, limits, queries.handle().clone())?;
    let served = async {
        let mut builder = Server::builder();
        if let Some((cert, key)) = &opts.tls {
            let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
            let identity = Identity::from_pem(read(cert)?, read(key)?);
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(identity))
                .map_err(|e| format!("TLS configuration: {e}"))?;
        }
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", opts.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        on_listening(addr);
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        builder
            .add_service(
                arrow_flight::flight_service_server::FlightServiceServer::new(service)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES),
            )
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| format!("server error: {e}"))
    }
    .await;
    queries.shutdown_background();
    served
}
