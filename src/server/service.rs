//! The Flight SQL service: authentication, tickets, prepared statements and metadata.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
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
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::arrow::record_batch::RecordBatch;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use rand::{Rng, SeedableRng};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use super::registry::{Handle, Limits, PLAN_BYTES, Registry, Ticket as TicketEntry, TicketState};
use super::status::{policy_status, status_of};
use super::work::{Outcome, Slot, Workers};
use crate::policy::Catalog;
use crate::session::{AnalystSession, SessionOptions};

/// Basic credentials' base64: the standard alphabet, with or without padding.
const BASIC: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Longest statement whose plan a ticket keeps for its first fetch.
const KEPT_PLAN_STATEMENT: usize = 16 << 10;

/// Largest descriptor a FlightInfo echoes back.
const ECHOED_DESCRIPTOR: usize = 64 << 10;

/// Stored releases a "ticket is gone" message lists at most.
const LISTED_RELEASES: usize = 20;

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
    registry: Arc<Registry>,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
    handles: Mutex<rand::rngs::ChaCha20Rng>,
    workers: Workers,
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

fn unknown_ticket() -> Status {
    let mut status = Status::not_found(
        "unknown or expired ticket: tickets are issued by GetFlightInfo to the analyst who asked, and kept for an hour",
    );
    status.metadata_mut().insert("dpcurve-error", MetadataValue::from_static("unknown-ticket"));
    status
}

/// Stores a paid ticket's result in the catalog, up to [`super::MAX_KEPT_RESULT_BYTES`] (a failure
/// only costs the free re-read: logged).
fn keep_durably(catalog: Arc<Catalog>, analyst: &str, handle: Handle, schema: &SchemaRef, batches: &[RecordBatch]) {
    let stored = crate::policy::results::encode(schema, batches).map_err(|e| e.to_string()).and_then(|data| {
        if data.len() > super::MAX_KEPT_RESULT_BYTES {
            return Ok(None); // too large to keep: its releases are stored
        }
        catalog.store_result(analyst, &handle, &data).map_err(|e| e.to_string())
    });
    if let Err(e) = stored {
        eprintln!("dpcurve serve: a paid result could not be kept in the catalog: {e}");
    }
}

fn unknown_prepared() -> Status {
    Status::not_found("unknown or closed prepared statement")
}

fn handle_of(bytes: &[u8]) -> Option<Handle> {
    bytes.try_into().ok()
}

type DoGetStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send + 'static>>;

/// The Flight data of `batches` with `schema` (dictionaries sent as they are, so the schema
/// message is exactly `schema`).
fn flight_stream(
    schema: SchemaRef,
    batches: impl Stream<Item = Result<RecordBatch, Status>> + Send + 'static,
) -> DoGetStream {
    let batches = batches.map(|b| b.map_err(|s| FlightError::Tonic(Box::new(s))));
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .with_dictionary_handling(DictionaryHandling::Resend)
        .build(batches)
        .map(|item| item.map_err(Status::from));
    Box::pin(stream)
}

/// The batches a query task sends, as a stream.
fn received(rx: mpsc::Receiver<Result<RecordBatch, Status>>) -> impl Stream<Item = Result<RecordBatch, Status>> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

impl DpFlightSql {
    /// The service over an opened catalog, running queries on `queries`.
    pub fn new(
        catalog: Arc<Catalog>,
        options: SessionOptions,
        max_queries: usize,
        limits: Limits,
        queries: tokio::runtime::Handle,
    ) -> Result<Self, String> {
        let rng = rand::rngs::ChaCha20Rng::try_from_rng(&mut rand::rngs::SysRng)
            .map_err(|e| format!("the operating system's random source failed: {e}"))?;
        Ok(Self {
            catalog,
            options,
            max_queries: max_queries.max(1),
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            registry: Arc::new(Registry::new(limits)),
            slots: Mutex::new(HashMap::new()),
            handles: Mutex::new(rng),
            workers: Workers::new(queries),
        })
    }

    fn new_handle(&self) -> Handle {
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
            .map_err(|e| policy_status(&e))?;
        if claimed.is_some_and(|c| c != name) {
            return Err(Status::unauthenticated(crate::policy::analysts::BAD_TOKEN));
        }
        Ok(name)
    }

    /// One of the analyst's query slots, or a refusal. It is held by the planning and the
    /// query task it is given to until they end.
    fn slot(&self, analyst: &str) -> Result<Slot, Status> {
        let sem = Arc::clone(
            self.slots
                .lock()
                .expect("slots")
                .entry(analyst.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.max_queries))),
        );
        let permit: OwnedSemaphorePermit = sem.try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "analyst '{analyst}' already runs {} queries on this server (its limit per analyst); nothing was \
                 planned or charged — retry when one has finished",
                self.max_queries
            ))
        })?;
        Ok(Arc::new(permit))
    }

    /// The analyst's session, reopened when the data owner registered, removed or made
    /// private a table since it was opened.
    async fn session(&self, analyst: &str) -> Result<Arc<AnalystSession>, Status> {
        let catalog = Arc::clone(&self.catalog);
        let registrations = tokio::task::spawn_blocking(move || catalog.tables())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| policy_status(&e))?
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

    /// Plans `sql` for `analyst` (a refusal comes here, free) and issues a ticket that keeps
    /// only the statement's text.
    async fn plan_ticket(
        &self,
        analyst: String,
        sql: Arc<str>,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        self.registry.check_statement(&sql)?;
        let slot = self.slot(&analyst)?;
        let session = self.session(&analyst).await?;
        let handle = self.new_handle();
        let planned = self.workers.plan(&analyst, session, Arc::clone(&sql), Some(handle), slot).await?;
        let schema = planned.schema();
        // A short statement's plan is kept for the first fetch (counted as PLAN_BYTES); a long
        // one's is planned again then, so a ticket holds no more than its text.
        let (kept, extra) = if sql.len() <= KEPT_PLAN_STATEMENT { (Some(planned), PLAN_BYTES) } else { (None, 0) };
        let entry = TicketEntry {
            issued: Instant::now(),
            sql,
            extra,
            schema: Arc::clone(&schema),
            state: Arc::new(tokio::sync::Mutex::new(TicketState::Planned(kept))),
        };
        self.registry.add_ticket(&analyst, handle, entry)?;
        let ticket = TicketStatementQuery { statement_handle: handle.to_vec().into() };
        let ticket = Ticket::new(ticket.as_any().encode_to_vec());
        let info = FlightInfo::new()
            .try_with_schema(&schema)
            .map_err(|e| Status::internal(format!("cannot encode the result schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
            .with_ordered(true);
        // The descriptor echoes the statement: not megabytes of it (clients read 4 MiB by default).
        let info = if descriptor.cmd.len() <= ECHOED_DESCRIPTOR { info.with_descriptor(descriptor) } else { info };
        Ok(Response::new(info))
    }

    /// The answer to a ticket the server does not hold: the stored releases its query paid
    /// for, if it was one of `analyst`'s paid tickets, else "unknown ticket".
    async fn gone(&self, analyst: &str, handle: Option<Handle>) -> Status {
        let Some(handle) = handle else { return unknown_ticket() };
        let catalog = Arc::clone(&self.catalog);
        let who = analyst.to_string();
        let ids = tokio::task::spawn_blocking(move || catalog.releases_of_ticket(&who, &handle)).await;
        let ids = match ids {
            Ok(Ok(ids)) if !ids.is_empty() => ids,
            Ok(Err(e)) => return policy_status(&e),
            _ => return unknown_ticket(),
        };
        let mut reads: Vec<String> = ids.iter().take(LISTED_RELEASES).map(|id| format!("release('{id}')")).collect();
        if ids.len() > LISTED_RELEASES {
            reads.push(format!("… ({} in all; SELECT * FROM dpcurve.releases lists them)", ids.len()));
        }
        let mut status = Status::not_found(format!(
            "this ticket's result is no longer kept here (tickets expire after an hour, an analyst's oldest are \
             forgotten past their limits, a restart forgets them all), but its query was paid for and its releases \
             are stored: read them for free with SELECT * FROM {}",
            reads.join(", ")
        ));
        // For programs: the kind, and the stored releases' ids (the first LISTED_RELEASES).
        let listed: Vec<&str> = ids.iter().take(LISTED_RELEASES).map(String::as_str).collect();
        status.metadata_mut().insert("dpcurve-error", MetadataValue::from_static("result-stored"));
        if let Ok(v) = MetadataValue::try_from(listed.join(",")) {
            status.metadata_mut().insert("dpcurve-releases", v);
        }
        status
    }

    /// Runs a ticket's statement (planned again, for this fetch) and streams its result.
    async fn run_ticket(
        &self,
        analyst: &str,
        handle: Handle,
        entry: Arc<TicketEntry>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut state = Arc::clone(&entry.state).lock_owned().await;
        match &*state {
            TicketState::Kept(batches) => {
                let batches = batches.as_ref().clone();
                return Ok(Response::new(flight_stream(
                    Arc::clone(&entry.schema),
                    futures::stream::iter(batches.into_iter().map(Ok)),
                )));
            }
            TicketState::NotKept => return Err(self.gone(analyst, Some(handle)).await),
            TicketState::Failed(code, message) => return Err(Status::new(*code, message.clone())),
            TicketState::Planned(_) => {}
        }
        let slot = self.slot(analyst)?;
        let session = self.session(analyst).await?;
        let kept = match &mut *state {
            TicketState::Planned(kept) => kept.take(),
            _ => None,
        };
        let planned = match kept {
            Some(p) => p,
            None => {
                self.workers
                    .plan(analyst, Arc::clone(&session), Arc::clone(&entry.sql), Some(handle), Arc::clone(&slot))
                    .await?
            }
        };
        if planned.schema() != entry.schema {
            return Err(Status::failed_precondition(
                "the catalog changed since this ticket was issued (its result schema differs): plan the statement again",
            ));
        }
        let keep = self.registry.limits().bytes;
        let rx = if planned.is_charged() {
            // Paid: the task holds the ticket until its result is kept, so a re-fetch waits for it
            // and a client that leaves after the charge does not lose the release.
            // Until it has ended, a ticket whose task vanished (a panic) is never run (charged) again.
            *state = TicketState::Failed(tonic::Code::Internal, "the ticket's query did not finish".into());
            let registry = Arc::clone(&self.registry);
            let who = analyst.to_string();
            let (catalog, schema) = (Arc::clone(&self.catalog), Arc::clone(&entry.schema));
            let done = move |outcome: Outcome| {
                if let Outcome::Done(Some(batches), _) = &outcome {
                    // Kept in the catalog too (as the analyst was sent it), so `dpcurve.results` and
                    // `stored_result` give it back after the ticket is forgotten or the server restarts.
                    keep_durably(catalog, &who, handle, &schema, batches);
                }
                *state = match outcome {
                    Outcome::Done(Some(batches), bytes) if registry.keep_result(&who, &handle, bytes) => {
                        TicketState::Kept(Arc::new(batches))
                    }
                    Outcome::Done(..) => TicketState::NotKept,
                    Outcome::Failed(s) => TicketState::Failed(s.code(), s.message().to_string()),
                };
            };
            self.workers.run(session, planned, slot, keep, Some(Box::new(done)))
        } else {
            drop(state);
            self.workers.run(session, planned, slot, 0, None)
        };
        // The first batch (or the error) before the response, so a refusal at the debit comes as
        // the call's status.
        let mut rx = rx;
        let first = rx.recv().await;
        let first = match first {
            Some(Err(s)) => return Err(s),
            Some(Ok(b)) => Some(Ok(b)),
            None => None,
        };
        let batches = futures::stream::iter(first).chain(received(rx));
        Ok(Response::new(flight_stream(Arc::clone(&entry.schema), batches)))
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
        Ok(Response::new(flight_stream(batch.schema(), futures::stream::iter([Ok(batch)]))))
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
        self.plan_ticket(analyst, Arc::from(query.query), request.into_inner()).await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let analyst = self.analyst(&request).await?;
        let sql = handle_of(&cmd.prepared_statement_handle)
            .and_then(|h| self.registry.prepared(&analyst, &h))
            .ok_or_else(unknown_prepared)?;
        // Each execution of a prepared statement is a new query: a new plan, a new ticket.
        self.plan_ticket(analyst, sql, request.into_inner()).await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let analyst = self.analyst(&request).await?;
        let handle = handle_of(&ticket.statement_handle);
        match handle.and_then(|h| self.registry.ticket(&analyst, &h)) {
            Some(entry) => self.run_ticket(&analyst, handle.expect("known"), entry).await,
            None => Err(self.gone(&analyst, handle).await),
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
        let sql: Arc<str> = Arc::from(query.query);
        self.registry.check_statement(&sql)?;
        // Planned now so that a refusal comes at prepare time; each execution plans again.
        let slot = self.slot(&analyst)?;
        let session = self.session(&analyst).await?;
        let schema = self.workers.plan(&analyst, session, Arc::clone(&sql), None, slot).await?.schema();
        let handle = self.new_handle();
        self.registry.add_prepared(&analyst, handle, sql)?;
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
        let known =
            handle_of(&query.prepared_statement_handle).is_some_and(|h| self.registry.prepared(&analyst, &h).is_some());
        if !known {
            return Err(unknown_prepared());
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
                return Err(Status::invalid_argument(crate::statements::NO_PARAMETERS));
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
            self.registry.close_prepared(&analyst, &h);
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
        self.metadata_flight_info(&query, &query.into_builder().schema(), request).await
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
        let tables = session.table_schemas(query.include_schema).await.map_err(|e| status_of(&e))?;
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
        self.metadata_flight_info(&query, &query.into_builder().schema(), request).await
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

#[cfg(test)]
mod tests {
    use super::*;

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
