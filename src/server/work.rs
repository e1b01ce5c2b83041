//! Where the server's work runs, away from the threads that answer requests.
//!
//! * **Planning** (parsing, the guard, pricing, physical planning) is CPU work that can take
//!   seconds on a long statement and recurses as deep as the statement nests. Each planning runs
//!   on a thread of its own with a large stack (at most [`MAX_PLANNING_THREADS`] at once), so it
//!   never blocks the request threads and is scheduled by the operating system beside everyone
//!   else's.
//! * **Queries** run on a runtime of their own: each is one task that holds its analyst's slot
//!   until it ends, streams its batches to the client as they come, and — when it was paid for —
//!   runs to the end even if the client leaves, keeping its result for a re-fetch when it fits.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tonic::Status;

use super::status::status_of;
use crate::session::{AnalystSession, PlannedQuery};

/// Plannings that run at once on the whole server.
pub const MAX_PLANNING_THREADS: usize = 64;

/// Statements up to this length plan without waiting for their analyst's share of the cores:
/// planning time grows with a statement's length (its nesting is bounded at parsing).
pub const SHORT_STATEMENT: usize = 16 << 10;

/// Stack of a planning thread: room for any statement the parser lets through (virtual memory,
/// touched only as deep as a planning goes).
const PLAN_STACK: usize = 256 << 20;

/// Batches a query may run ahead of a slow client.
const AHEAD: usize = 4;

/// One of an analyst's query slots, shared by the planning and the run of one request.
pub type Slot = Arc<OwnedSemaphorePermit>;

/// How a paid query ended.
pub enum Outcome {
    /// It ran to the end; its batches if they were kept (within `keep_bytes`), and their size.
    Done(Option<Vec<RecordBatch>>, usize),
    /// It failed with this status.
    Failed(Status),
}

/// The planning threads and the query runtime.
pub struct Workers {
    planners: Arc<Semaphore>,
    /// Plannings of long statements one analyst runs at once (the rest wait): half the cores, so
    /// one analyst's long statements leave the other half to everyone else.
    per_analyst: usize,
    analysts: std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
    queries: tokio::runtime::Handle,
}

impl Workers {
    /// Workers running queries on `queries`.
    pub fn new(queries: tokio::runtime::Handle) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            planners: Arc::new(Semaphore::new(MAX_PLANNING_THREADS)),
            per_analyst: (cores / 2).max(1),
            analysts: Default::default(),
            queries,
        }
    }

    /// Plans `sql` in `analyst`'s `session` (for the server ticket `ticket`, if given) on a
    /// planning thread that holds `slot` until it ends (also when the request is cancelled
    /// meanwhile), after the analyst's earlier plannings beyond their share of the cores.
    pub async fn plan(
        &self,
        analyst: &str,
        session: Arc<AnalystSession>,
        sql: Arc<str>,
        ticket: Option<[u8; 16]>,
        slot: Slot,
    ) -> Result<PlannedQuery, Status> {
        // Long statements (the ones that can take seconds to plan) wait for the analyst's share
        // of the cores; short ones plan at once.
        let own = if sql.len() > SHORT_STATEMENT {
            let own = Arc::clone(
                self.analysts
                    .lock()
                    .expect("planning shares")
                    .entry(analyst.to_string())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.per_analyst))),
            );
            Some(own.acquire_owned().await.map_err(|_| Status::unavailable("the server is shutting down"))?)
        } else {
            None
        };
        let permit = Arc::clone(&self.planners)
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("the server is shutting down"))?;
        let (tx, rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("dpcurve-plan".into())
            .stack_size(PLAN_STACK)
            .spawn(move || {
                let held = (permit, own, slot);
                let out = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt
                        .block_on(async {
                            match &ticket {
                                Some(h) => session.plan_for_ticket(&sql, h).await,
                                None => session.plan(&sql).await,
                            }
                        })
                        .map_err(|e| status_of(&e)),
                    Err(e) => Err(Status::internal(format!("cannot start a planner: {e}"))),
                };
                // The slot is free before the answer is: the analyst's next request finds it.
                drop(held);
                let _ = tx.send(out);
            })
            .map_err(|e| Status::resource_exhausted(format!("cannot start a planning thread: {e}")))?;
        rx.await.map_err(|_| Status::internal("the planner stopped without an answer"))?
    }

    /// Runs `planned` as one task holding `slot`, sending its batches (or its error) to the
    /// returned receiver. A public query stops as soon as the receiver is gone. A paid one runs
    /// to the end whatever the client does, keeps its batches while they total at most
    /// `keep_bytes`, and hands how it ended to `done`.
    pub fn run(
        &self,
        session: Arc<AnalystSession>,
        planned: PlannedQuery,
        slot: Slot,
        keep_bytes: usize,
        done: Option<Box<dyn FnOnce(Outcome) + Send>>,
    ) -> mpsc::Receiver<Result<RecordBatch, Status>> {
        let (tx, rx) = mpsc::channel(AHEAD);
        self.queries.spawn(async move {
            let _slot = slot;
            let outcome = drive(&session, planned, &tx, done.is_some(), keep_bytes).await;
            if let (Some(done), Some(outcome)) = (done, outcome) {
                // `done` keeps the result in the catalog (a SQLite write and its fsync): on the
                // blocking pool, not on a worker the other queries share. The slot is held until
                // it has finished; if it panics, the ticket stays failed, as for a panicked query.
                let _ = tokio::task::spawn_blocking(move || done(outcome)).await;
            }
        });
        rx
    }
}

/// Drives one query; None when a public query was abandoned by its client.
async fn drive(
    session: &AnalystSession,
    planned: PlannedQuery,
    tx: &mpsc::Sender<Result<RecordBatch, Status>>,
    paid: bool,
    keep_bytes: usize,
) -> Option<Outcome> {
    let mut stream = match session.execute_stream(planned) {
        Ok(s) => s,
        Err(e) => {
            let s = status_of(&e);
            let _ = tx.send(Err(s.clone())).await;
            return Some(Outcome::Failed(s));
        }
    };
    let mut kept = paid.then(Vec::new);
    let mut bytes = 0usize;
    let mut client = true;
    loop {
        let next = if paid {
            stream.next().await
        } else {
            tokio::select! {
                biased;
                _ = tx.closed() => return None,
                next = stream.next() => next,
            }
        };
        match next {
            None => return Some(Outcome::Done(kept, bytes)),
            Some(Ok(batch)) => {
                if let Some(k) = kept.as_mut() {
                    bytes += batch.get_array_memory_size();
                    if bytes <= keep_bytes {
                        k.push(batch.clone());
                    } else {
                        kept = None;
                    }
                }
                if client && tx.send(Ok(batch)).await.is_err() {
                    client = false;
                    if !paid {
                        return None;
                    }
                }
            }
            Some(Err(e)) => {
                let s = status_of(&e);
                if client {
                    let _ = tx.send(Err(s.clone())).await;
                }
                return Some(Outcome::Failed(s));
            }
        }
    }
}
