//! `dpcurve serve`: an Arrow Flight SQL server for analysts (issue 14).
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
//!   with one ticket. Nothing is charged.
//! * **DoGet** on a ticket runs the query once: the budget gate debits the ledger durably
//!   before any row is read. The result is kept with the ticket, so fetching the same ticket
//!   again returns the very same result (the same stored release) without a second charge.
//! * Tickets are random 128-bit server-side handles bound to the analyst who planned them:
//!   another analyst's, a forged or an expired ticket gets the same "unknown ticket" error.
//! * The FlightInfo's schema is the physical plan's output schema, which is exactly the
//!   schema of the batches DoGet sends (ADBC drivers reject any difference, nullability
//!   included).
//!
//! Errors are the session's messages (the guard's and the gate's, which never carry data)
//! with a gRPC code by kind: a refusal at planning is `InvalidArgument`, an exhausted budget
//! `ResourceExhausted`, a missing or wrong token `Unauthenticated`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult,
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandPreparedStatementQuery, CommandStatementQuery, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage, SchemaAsIpc, Ticket,
};
use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

/// Basic credentials' base64: the standard alphabet, with or without padding.
const BASIC: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::DataFusionError;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use rand::{Rng, SeedableRng};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::metadata::MetadataValue;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::policy::{Catalog, PolicyError};
use crate::session::{AnalystSession, PlannedQuery, SessionOptions};

/// Queries one analyst may run at once unless `--max-queries-per-analyst` says otherwise.
pub const DEFAULT_MAX_QUERIES_PER_ANALYST: usize = 4;
/// Tickets (planned or fetched queries) the server keeps; the oldest are forgotten first.
pub const MAX_TICKETS: usize = 10_000;
/// How long a ticket can be fetched (and re-fetched) after it was issued.
pub const TICKET_LIFETIME: Duration = Duration::from_secs(3600);
/// Prepared statements the server keeps open; the oldest are closed first.
pub const MAX_PREPARED: usize = 10_000;

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
    /// Partitions of each query (None: number of cores).
    pub target_partitions: Option<usize>,
    /// Cluster mode: `df://HOST:PORT` of a Ballista scheduler (issue 15).
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
            target_partitions: None,
            cluster: None,
        }
    }
}

type HandleBytes = [u8; 16];

/// One ticket: a planned query, or its result once fetched.
struct TicketEntry {
    analyst: String,
    issued: Instant,
    state: Arc<tokio::sync::Mutex<TicketState>>,
}

enum TicketState {
    Planned(Arc<AnalystSession>, PlannedQuery),
    Done(SchemaRef, Arc<Vec<RecordBatch>>),
    Failed(tonic::Code, String),
}

struct PreparedEntry {
    analyst: String,
    sql: String,
}

/// Bounded maps in insertion order: the oldest entries are dropped first.
struct Bounded<V> {
    map: HashMap<HandleBytes, V>,
    order: VecDeque<HandleBytes>,
    cap: usize,
}

impl<V> Bounded<V> {
    fn new(cap: usize) -> Self {
        Self { map: HashMap::new(), order: VecDeque::new(), cap }
    }

    fn insert(&mut self, k: HandleBytes, v: V) {
        while self.map.len() >= self.cap {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        self.order.push_back(k);
        self.map.insert(k, v);
    }

    fn remove(&mut self, k: &HandleBytes) -> Option<V> {
        self.order.retain(|x| x != k);
        self.map.remove(k)
    }
}

/// The analyst's cached session and the registrations it was opened with.
struct CachedSession {
    registrations: Vec<(String, String, bool)>,
    session: Arc<AnalystSession>,
}

/// The Flight SQL service.
pub struct DpFlightSql {
    catalog: Arc<Catalog>,
    options: SessionOptions,
    max_queries: usize,
    sessions: tokio::sync::Mutex<HashMap<String, CachedSession>>,
    tickets: Mutex<Bounded<Arc<TicketEntry>>>,
    prepared: Mutex<Bounded<PreparedEntry>>,
    limits: Mutex<HashMap<String, Arc<Semaphore>>>,
    handles: Mutex<rand::rngs::ChaCha20Rng>,
}

fn sql_info() -> &'static SqlInfoData {
    static INFO: std::sync::OnceLock<SqlInfoData> = std::sync::OnceLock::new();
    INFO.get_or_init(|| {
        let mut b = SqlInfoDataBuilder::new();
        b.append(SqlInfo::FlightSqlServerName, "dpcurve");
        b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        b.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
        b.append(SqlInfo::FlightSqlServerReadOnly, true);
        b.append(SqlInfo::FlightSqlServerSql, true);
        b.append(SqlInfo::FlightSqlServerSubstrait, false);
        b.append(SqlInfo::FlightSqlServerTransaction, 0i32);
        b.append(SqlInfo::FlightSqlServerCancel, false);
        b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
        b.append(SqlInfo::SqlDdlCatalog, false);
        b.append(SqlInfo::SqlDdlSchema, false);
        b.append(SqlInfo::SqlDdlTable, false);
        b.build().expect("static SQL info")
    })
}

/// The gRPC status of a session error: the session's message, a code by kind.
pub fn status_of(e: &DataFusionError) -> Status {
    let message = e.to_string();
    match e.find_root() {
        DataFusionError::ResourcesExhausted(m) if m.contains("was removed or does not exist") => {
            Status::unauthenticated(message)
        }
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(message),
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => Status::invalid_argument(message),
        _ => Status::internal(message),
    }
}

fn policy_status(e: PolicyError) -> Status {
    match e {
        PolicyError::Unauthenticated(m) => Status::unauthenticated(m),
        other => Status::internal(other.to_string()),
    }
}

fn unknown_ticket() -> Status {
    Status::not_found(
        "unknown or expired ticket: tickets are issued by GetFlightInfo to the analyst who asked, and kept for an hour",
    )
}

fn handle_of(bytes: &[u8]) -> Option<HandleBytes> {
    bytes.try_into().ok()
}

type DoGetStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send + 'static>>;

/// The Flight data of `batches` with `schema` (dictionaries sent as they are, so the schema
/// message is exactly `schema`), holding `permit` until the stream ends.
fn flight_stream(schema: SchemaRef, batches: Vec<RecordBatch>, permit: Option<OwnedSemaphorePermit>) -> DoGetStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .with_dictionary_handling(DictionaryHandling::Resend)
        .build(futures::stream::iter(batches.into_iter().map(Ok)))
        .map_err(Status::from)
        .map(move |item| {
            let _held = &permit;
            item
        });
    Box::pin(stream)
}

impl DpFlightSql {
    /// The service over an opened catalog.
    pub fn new(catalog: Arc<Catalog>, options: SessionOptions, max_queries: usize) -> Result<Self, String> {
        let rng = rand::rngs::ChaCha20Rng::try_from_rng(&mut rand::rngs::SysRng)
            .map_err(|e| format!("the operating system's random source failed: {e}"))?;
        Ok(Self {
            catalog,
            options,
            max_queries: max_queries.max(1),
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            tickets: Mutex::new(Bounded::new(MAX_TICKETS)),
            prepared: Mutex::new(Bounded::new(MAX_PREPARED)),
            limits: Mutex::new(HashMap::new()),
            handles: Mutex::new(rng),
        })
    }

    fn new_handle(&self) -> HandleBytes {
        let mut h = [0u8; 16];
        self.handles.lock().expect("handle generator").fill_bytes(&mut h);
        h
    }

    /// The bearer (or basic) credentials of a request: (token, name given with basic auth).
    fn credentials<T>(request: &Request<T>) -> Result<(String, Option<String>), Status> {
        let missing = || {
            Status::unauthenticated(
                "no token: send the header 'authorization: Bearer <token>' (ADBC: \
                 adbc.flight.sql.authorization_header), or basic credentials (name, token)",
            )
        };
        let header = request.metadata().get("authorization").ok_or_else(missing)?;
        let header = header.to_str().map_err(|_| missing())?;
        if let Some(token) = header.strip_prefix("Bearer ").or_else(|| header.strip_prefix("bearer ")) {
            return Ok((token.trim().to_string(), None));
        }
        if let Some(b64) = header.strip_prefix("Basic ").or_else(|| header.strip_prefix("basic ")) {
            // Padded or not: clients differ (ADBC's Go driver sends `name:token` unpadded).
            let bytes = BASIC.decode(b64.trim()).map_err(|_| missing())?;
            let text = String::from_utf8(bytes).map_err(|_| missing())?;
            let (name, token) = text.split_once(':').ok_or_else(missing)?;
            return Ok((token.to_string(), Some(name.to_string())));
        }
        Err(missing())
    }

    /// The analyst a request is authenticated as.
    async fn analyst<T>(&self, request: &Request<T>) -> Result<String, Status> {
        let (token, claimed) = Self::credentials(request)?;
        let catalog = Arc::clone(&self.catalog);
        let name = tokio::task::spawn_blocking(move || catalog.authenticate(&token))
            .await
            .map_err(|e| Status::internal(format!("authentication task failed: {e}")))?
            .map_err(policy_status)?;
        if claimed.is_some_and(|c| c != name) {
            return Err(Status::unauthenticated(crate::policy::analysts::BAD_TOKEN));
        }
        Ok(name)
    }

    /// One of the analyst's concurrent-query slots, or a refusal.
    fn slot(&self, analyst: &str) -> Result<OwnedSemaphorePermit, Status> {
        let sem = Arc::clone(
            self.limits
                .lock()
                .expect("limits")
                .entry(analyst.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.max_queries))),
        );
        sem.try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "analyst '{analyst}' already runs {} queries on this server (its limit per analyst); nothing was \
                 planned or charged — retry when one has finished",
                self.max_queries
            ))
        })
    }

    /// The analyst's session, reopened when the data owner registered, removed or made
    /// private a table since it was opened.
    async fn session(&self, analyst: &str) -> Result<Arc<AnalystSession>, Status> {
        let catalog = Arc::clone(&self.catalog);
        let registrations = tokio::task::spawn_blocking(move || catalog.tables())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(policy_status)?
            .into_iter()
            .map(|t| (t.name, t.location, t.policy.is_some()))
            .collect::<Vec<_>>();
        let mut sessions = self.sessions.lock().await;
        if let Some(c) = sessions.get(analyst).filter(|c| c.registrations == registrations) {
            return Ok(Arc::clone(&c.session));
        }
        let session = AnalystSession::with_principal(Arc::clone(&self.catalog), self.options.clone(), Some(analyst))
            .await
            .map_err(|e| status_of(&e))?;
        let session = Arc::new(session);
        sessions.insert(analyst.to_string(), CachedSession { registrations, session: Arc::clone(&session) });
        Ok(session)
    }

    /// Plans `sql` for `analyst` and issues a ticket for one execution.
    async fn plan_ticket(
        &self,
        analyst: String,
        sql: &str,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let _slot = self.slot(&analyst)?;
        let session = self.session(&analyst).await?;
        let planned = session.plan(sql).await.map_err(|e| status_of(&e))?;
        let schema = planned.schema();
        let handle = self.new_handle();
        let entry = TicketEntry {
            analyst,
            issued: Instant::now(),
            state: Arc::new(tokio::sync::Mutex::new(TicketState::Planned(session, planned))),
        };
        self.tickets.lock().expect("tickets").insert(handle, Arc::new(entry));
        let ticket = TicketStatementQuery { statement_handle: handle.to_vec().into() };
        let ticket = Ticket::new(ticket.as_any().encode_to_vec());
        let info = FlightInfo::new()
            .try_with_schema(&schema)
            .map_err(|e| Status::internal(format!("cannot encode the result schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
            .with_descriptor(descriptor)
            .with_ordered(true);
        Ok(Response::new(info))
    }

    fn schema_bytes(schema: &datafusion::arrow::datatypes::Schema) -> Result<prost::bytes::Bytes, Status> {
        let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(|e: datafusion::arrow::error::ArrowError| Status::internal(e.to_string()))?;
        Ok(bytes)
    }

    /// A FlightInfo whose ticket is the command itself (metadata requests: free, public).
    fn metadata_info(
        schema: &datafusion::arrow::datatypes::Schema,
        ticket: Vec<u8>,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| Status::internal(e.to_string()))?
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }

    /// GetFlightInfo of a metadata command: authenticated, free, its ticket the command itself.
    async fn metadata_flight_info<M: ProstMessageExt>(
        &self,
        cmd: &M,
        schema: &datafusion::arrow::datatypes::Schema,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.analyst(&request).await?;
        Self::metadata_info(schema, cmd.as_any().encode_to_vec(), request.into_inner())
    }

    fn one_batch<E: std::fmt::Display>(batch: Result<RecordBatch, E>) -> Result<Response<DoGetStream>, Status> {
        let batch = batch.map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(flight_stream(batch.schema(), vec![batch], None)))
    }
}

#[tonic::async_trait]
impl FlightSqlService for DpFlightSql {
    type FlightService = DpFlightSql;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>, Status> {
        self.analyst(&request).await?;
        let (token, _) = Self::credentials(&request)?;
        let reply = HandshakeResponse { protocol_version: 0, payload: token.clone().into_bytes().into() };
        let mut response: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(futures::stream::iter(vec![Ok(reply)])));
        let bearer = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::unauthenticated(crate::policy::analysts::BAD_TOKEN))?;
        response.metadata_mut().insert("authorization", bearer);
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let analyst = self.analyst(&request).await?;
        self.plan_ticket(analyst, &query.query, request.into_inner()).await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let analyst = self.analyst(&request).await?;
        let sql = handle_of(&cmd.prepared_statement_handle)
            .and_then(|h| {
                let prepared = self.prepared.lock().expect("prepared");
                prepared.map.get(&h).filter(|p| p.analyst == analyst).map(|p| p.sql.clone())
            })
            .ok_or_else(|| Status::not_found("unknown or closed prepared statement"))?;
        // Each execution of a prepared statement is a new query: a new plan, a new ticket.
        self.plan_ticket(analyst, &sql, request.into_inner()).await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let analyst = self.analyst(&request).await?;
        let entry = handle_of(&ticket.statement_handle)
            .and_then(|h| self.tickets.lock().expect("tickets").map.get(&h).cloned())
            .filter(|e| e.analyst == analyst && e.issued.elapsed() < TICKET_LIFETIME)
            .ok_or_else(unknown_ticket)?;
        let permit = self.slot(&analyst)?;
        let mut state = Arc::clone(&entry.state).lock_owned().await;
        if let TicketState::Planned(..) = &*state {
            // The query runs in its own task, which holds the ticket until its result is kept:
            // a client that goes away after the charge does not lose the release — fetching
            // the ticket again returns it.
            let run = tokio::spawn(async move {
                let placeholder =
                    TicketState::Failed(tonic::Code::Internal, "the ticket's query did not finish".into());
                if let TicketState::Planned(session, planned) = std::mem::replace(&mut *state, placeholder) {
                    let schema = planned.schema();
                    *state = match session.execute(planned).await {
                        Ok(batches) => TicketState::Done(schema, Arc::new(batches)),
                        Err(e) => {
                            let s = status_of(&e);
                            TicketState::Failed(s.code(), s.message().to_string())
                        }
                    };
                }
                state
            });
            state = run.await.map_err(|_| Status::internal("the ticket's query did not finish"))?;
        }
        match &*state {
            TicketState::Done(schema, batches) => {
                Ok(Response::new(flight_stream(Arc::clone(schema), batches.as_ref().clone(), Some(permit))))
            }
            TicketState::Failed(code, message) => Err(Status::new(*code, message.clone())),
            TicketState::Planned(..) => Err(Status::internal("the ticket was not run")),
        }
    }

    async fn do_get_prepared_statement(
        &self,
        _query: CommandPreparedStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Err(Status::invalid_argument(
            "fetch the ticket of the prepared statement's FlightInfo (GetFlightInfo runs the guard and issues it)",
        ))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let analyst = self.analyst(&request).await?;
        if query.transaction_id.is_some() {
            return Err(Status::invalid_argument("dpcurve sessions are read-only and have no transactions"));
        }
        // Planned now so that a refusal comes at prepare time; each execution plans again.
        let schema = {
            let _slot = self.slot(&analyst)?;
            let session = self.session(&analyst).await?;
            session.plan(&query.query).await.map_err(|e| status_of(&e))?.schema()
        };
        let handle = self.new_handle();
        self.prepared.lock().expect("prepared").insert(handle, PreparedEntry { analyst, sql: query.query });
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.to_vec().into(),
            dataset_schema: Self::schema_bytes(&schema)?,
            parameter_schema: Self::schema_bytes(&datafusion::arrow::datatypes::Schema::empty())?,
        })
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let analyst = self.analyst(&request).await?;
        let known = handle_of(&query.prepared_statement_handle)
            .is_some_and(|h| self.prepared.lock().expect("prepared").map.get(&h).is_some_and(|p| p.analyst == analyst));
        if !known {
            return Err(Status::not_found("unknown or closed prepared statement"));
        }
        // Parameters are not supported (dpcurve's privacy parameters must be literals); an
        // empty parameter set — what some drivers send before every execution — is accepted.
        let data = request.into_inner().into_inner();
        let mut batches = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            data.map_err(arrow_flight::error::FlightError::from),
        );
        while let Some(b) = batches.next().await {
            let b = b.map_err(|e| Status::invalid_argument(e.to_string()))?;
            if b.num_rows() > 0 || b.num_columns() > 0 {
                return Err(Status::invalid_argument(
                    "bound parameters are not supported: write values as SQL literals (dpcurve's privacy \
                     parameters must be literals, checked at planning)",
                ));
            }
        }
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(query.prepared_statement_handle) })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        let analyst = self.analyst(&request).await?;
        if let Some(h) = handle_of(&query.prepared_statement_handle) {
            let mut prepared = self.prepared.lock().expect("prepared");
            if prepared.map.get(&h).is_some_and(|p| p.analyst == analyst) {
                prepared.remove(&h);
            }
        }
        Ok(())
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_flight_info(&query, query.clone().into_builder(sql_info()).schema().as_ref(), request).await
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.analyst(&request).await?;
        Self::one_batch(query.into_builder(sql_info()).build())
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_flight_info(&query, &query.clone().into_builder().schema(), request).await
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.analyst(&request).await?;
        let mut b = query.into_builder();
        b.append("datafusion");
        Self::one_batch(b.build())
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_flight_info(&query, &query.clone().into_builder().schema(), request).await
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.analyst(&request).await?;
        let mut b = query.into_builder();
        b.append("datafusion", "dpcurve");
        b.append("datafusion", "public");
        Self::one_batch(b.build())
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_flight_info(&query, &query.clone().into_builder().schema(), request).await
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let analyst = self.analyst(&request).await?;
        let session = self.session(&analyst).await?;
        let tables = session.table_schemas().await.map_err(|e| status_of(&e))?;
        let mut b = query.into_builder();
        for (schema_name, table, kind, schema) in tables {
            b.append("datafusion", schema_name, table, kind, &schema).map_err(|e| Status::internal(e.to_string()))?;
        }
        Self::one_batch(b.build())
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_flight_info(&query, &query.clone().into_builder().schema(), request).await
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.analyst(&request).await?;
        let mut b = query.into_builder();
        b.append("TABLE");
        b.append("VIEW");
        Self::one_batch(b.build())
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
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
    let service = DpFlightSql::new(catalog, session_options, opts.max_queries_per_analyst)?;
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
        .add_service(FlightServiceServer::new(service).max_decoding_message_size(64 << 20))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| format!("server error: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_maps_forget_the_oldest_first() {
        let mut b = Bounded::new(3);
        for i in 0u8..5 {
            b.insert([i; 16], i);
        }
        assert_eq!(b.map.len(), 3);
        assert!(!b.map.contains_key(&[0; 16]) && !b.map.contains_key(&[1; 16]));
        assert_eq!(b.remove(&[3; 16]), Some(3));
        b.insert([9; 16], 9);
        assert!(b.map.contains_key(&[2; 16]), "removal made room: nothing else was dropped");
    }

    #[test]
    fn credentials_are_bearer_or_basic() {
        let mut r = Request::new(());
        assert_eq!(DpFlightSql::credentials(&r).unwrap_err().code(), tonic::Code::Unauthenticated);
        r.metadata_mut().insert("authorization", "Bearer dpc1.a.00".parse().unwrap());
        assert_eq!(DpFlightSql::credentials(&r).unwrap(), ("dpc1.a.00".into(), None));
        let basic = base64::engine::general_purpose::STANDARD.encode("alice:dpc1.alice.ff");
        r.metadata_mut().insert("authorization", format!("Basic {basic}").parse().unwrap());
        assert_eq!(DpFlightSql::credentials(&r).unwrap(), ("dpc1.alice.ff".into(), Some("alice".into())));
        // Names of every length mod 3, padded and unpadded.
        for name in ["a", "ab", "abc"] {
            let text = format!("{name}:dpc1.{name}.ff");
            for b64 in [
                base64::engine::general_purpose::STANDARD.encode(&text),
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(&text),
            ] {
                r.metadata_mut().insert("authorization", format!("Basic {b64}").parse().unwrap());
                let got = DpFlightSql::credentials(&r).unwrap_or_else(|e| panic!("{b64}: {e}"));
                assert_eq!(got, (format!("dpc1.{name}.ff"), Some(name.to_string())), "{b64}");
            }
        }
        r.metadata_mut().insert("authorization", "Digest x".parse().unwrap());
        assert!(DpFlightSql::credentials(&r).is_err());
    }
}
