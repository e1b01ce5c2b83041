//! The server's per-analyst state: tickets and prepared statements, each analyst's own,
//! under caps and a byte budget that are the analyst's own too.
//!
//! One analyst's requests can only ever evict that analyst's entries (oldest first): another
//! analyst's paid, unfetched result is never touched. What an entry holds is counted in bytes —
//! a planned ticket or a prepared statement its statement's text, a fetched paid ticket the
//! result it keeps for a re-fetch — and one analyst's total stays under the budget.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use tonic::Status;

/// A ticket's or prepared statement's server-side handle (random, 128 bits).
pub type Handle = [u8; 16];

/// Caps of one analyst's state.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Tickets one analyst keeps; beyond it their oldest is forgotten.
    pub tickets: usize,
    /// Prepared statements one analyst keeps open; beyond it their oldest is closed.
    pub prepared: usize,
    /// Bytes one analyst's tickets and prepared statements may hold (statement texts and
    /// results kept for a re-fetch).
    pub bytes: usize,
    /// How long a ticket can be fetched (and re-fetched) after it was issued.
    pub lifetime: Duration,
}

/// Bytes a kept plan is counted for (see [`TicketState::Planned`]).
pub const PLAN_BYTES: usize = 256 << 10;

/// One ticket: a statement planned for one analyst, and what became of it.
pub struct Ticket {
    pub issued: Instant,
    pub sql: Arc<str>,
    /// Bytes it is counted for besides its text (a kept plan).
    pub extra: usize,
    /// The schema its FlightInfo announced (DoGet sends exactly this schema).
    pub schema: SchemaRef,
    pub state: Arc<tokio::sync::Mutex<TicketState>>,
}

/// What a ticket's query has become.
pub enum TicketState {
    /// Not run yet, or public (a public query runs again at every fetch: nothing is kept). The
    /// plan made at GetFlightInfo is kept for the first fetch when the statement is short.
    Planned(Option<crate::session::PlannedQuery>),
    /// Paid and run; its result is kept for a re-fetch.
    Kept(Arc<Vec<RecordBatch>>),
    /// Paid and run; its result was not kept (larger than the analyst's budget allows): its
    /// releases are in the catalog.
    NotKept,
    /// Failed (nothing is kept but the error).
    Failed(tonic::Code, String),
}

/// An ordered, byte-counted set of one analyst's entries.
struct Entries<V> {
    map: HashMap<Handle, (V, usize)>,
    order: VecDeque<Handle>,
}

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Self { map: HashMap::new(), order: VecDeque::new() }
    }
}

impl<V> Entries<V> {
    fn remove(&mut self, h: &Handle) -> Option<(V, usize)> {
        let out = self.map.remove(h)?;
        self.order.retain(|x| x != h);
        Some(out)
    }

    /// Adds `v` (counted `bytes`) as the newest entry, first forgetting the oldest beyond `cap`;
    /// the bytes the forgotten ones were counted.
    fn push_capped(&mut self, h: Handle, v: V, bytes: usize, cap: usize) -> usize {
        let mut freed = 0;
        while self.map.len() >= cap {
            match self.pop_oldest() {
                Some((_, b)) => freed += b,
                None => break,
            }
        }
        self.order.push_back(h);
        self.map.insert(h, (v, bytes));
        freed
    }

    fn pop_oldest(&mut self) -> Option<(V, usize)> {
        while let Some(h) = self.order.pop_front() {
            if let Some(v) = self.map.remove(&h) {
                return Some(v);
            }
        }
        None
    }
}

#[derive(Default)]
struct Analyst {
    tickets: Entries<Arc<Ticket>>,
    prepared: Entries<Arc<str>>,
    bytes: usize,
}

impl Analyst {
    /// Forgets expired tickets, then the oldest entries (tickets first) until `bytes` more fit.
    fn make_room(&mut self, bytes: usize, limits: &Limits) {
        while let Some(h) = self.tickets.order.front().copied() {
            match self.tickets.map.get(&h) {
                Some((t, _)) if t.issued.elapsed() < limits.lifetime => break,
                _ => self.drop_ticket(&h),
            }
        }
        while self.bytes + bytes > limits.bytes {
            if let Some((_, b)) = self.tickets.pop_oldest() {
                self.bytes -= b;
            } else if let Some((_, b)) = self.prepared.pop_oldest() {
                self.bytes -= b;
            } else {
                break;
            }
        }
    }

    fn drop_ticket(&mut self, h: &Handle) {
        if let Some((_, b)) = self.tickets.remove(h) {
            self.bytes -= b;
        }
    }
}

/// Every analyst's tickets and prepared statements.
pub struct Registry {
    limits: Limits,
    analysts: Mutex<HashMap<String, Analyst>>,
}

fn too_large(what: &str, bytes: usize, limits: &Limits) -> Status {
    Status::resource_exhausted(format!(
        "{what} of {bytes} bytes does not fit in an analyst's memory on this server ({} bytes, \
         `dpcurve serve --max-bytes-per-analyst`): nothing was planned or charged",
        limits.bytes
    ))
}

impl Registry {
    pub fn new(limits: Limits) -> Self {
        Self { limits, analysts: Mutex::new(HashMap::new()) }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Refuses a statement too long to be kept for `analyst` at all (before it is planned).
    pub fn check_statement(&self, sql: &str) -> Result<(), Status> {
        if sql.len() > self.limits.bytes {
            return Err(too_large("a statement", sql.len(), &self.limits));
        }
        Ok(())
    }

    /// Keeps a new ticket of `analyst`, forgetting their own oldest entries to make room.
    pub fn add_ticket(&self, analyst: &str, h: Handle, ticket: Ticket) -> Result<(), Status> {
        let bytes = ticket.sql.len() + ticket.extra;
        self.check_statement(&ticket.sql)?;
        let mut all = self.analysts.lock().expect("registry");
        let a = all.entry(analyst.to_string()).or_default();
        a.make_room(bytes, &self.limits);
        a.bytes -= a.tickets.push_capped(h, Arc::new(ticket), bytes, self.limits.tickets);
        a.bytes += bytes;
        Ok(())
    }

    /// `analyst`'s ticket `h`, unless it is unknown, someone else's, or expired.
    pub fn ticket(&self, analyst: &str, h: &Handle) -> Option<Arc<Ticket>> {
        let all = self.analysts.lock().expect("registry");
        let (t, _) = all.get(analyst)?.tickets.map.get(h)?;
        (t.issued.elapsed() < self.limits.lifetime).then(|| Arc::clone(t))
    }

    /// Counts `bytes` more for ticket `h` (a result kept for a re-fetch), making room among the
    /// analyst's other entries; false (nothing counted) when it cannot fit.
    pub fn keep_result(&self, analyst: &str, h: &Handle, bytes: usize) -> bool {
        let mut all = self.analysts.lock().expect("registry");
        let Some(a) = all.get_mut(analyst) else { return false };
        let Some((t, old)) = a.tickets.remove(h) else { return false };
        a.bytes -= old;
        let total = old + bytes;
        let fits = total <= self.limits.bytes;
        let kept = if fits { total } else { old };
        a.make_room(kept, &self.limits);
        a.bytes -= a.tickets.push_capped(*h, t, kept, usize::MAX);
        a.bytes += kept;
        fits
    }

    /// Keeps a prepared statement of `analyst`, closing their own oldest to make room.
    pub fn add_prepared(&self, analyst: &str, h: Handle, sql: Arc<str>) -> Result<(), Status> {
        let bytes = sql.len();
        self.check_statement(&sql)?;
        let mut all = self.analysts.lock().expect("registry");
        let a = all.entry(analyst.to_string()).or_default();
        a.make_room(bytes, &self.limits);
        a.bytes -= a.prepared.push_capped(h, sql, bytes, self.limits.prepared);
        a.bytes += bytes;
        Ok(())
    }

    /// The text of `analyst`'s prepared statement `h`.
    pub fn prepared(&self, analyst: &str, h: &Handle) -> Option<Arc<str>> {
        let all = self.analysts.lock().expect("registry");
        all.get(analyst)?.prepared.map.get(h).map(|(s, _)| Arc::clone(s))
    }

    /// Closes `analyst`'s prepared statement `h` (if it is theirs).
    pub fn close_prepared(&self, analyst: &str, h: &Handle) {
        let mut all = self.analysts.lock().expect("registry");
        if let Some(a) = all.get_mut(analyst)
            && let Some((_, b)) = a.prepared.remove(h)
        {
            a.bytes -= b;
        }
    }

    /// Bytes `analyst`'s entries hold now.
    #[cfg(test)]
    fn bytes(&self, analyst: &str) -> usize {
        self.analysts.lock().unwrap().get(analyst).map_or(0, |a| a.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;

    fn ticket(sql: &str) -> Ticket {
        Ticket {
            issued: Instant::now(),
            sql: Arc::from(sql),
            extra: 0,
            schema: Arc::new(Schema::empty()),
            state: Arc::new(tokio::sync::Mutex::new(TicketState::Planned(None))),
        }
    }

    fn limits() -> Limits {
        Limits { tickets: 3, prepared: 2, bytes: 100, lifetime: Duration::from_secs(3600) }
    }

    #[test]
    fn one_analyst_only_ever_evicts_their_own_entries() {
        let r = Registry::new(limits());
        r.add_ticket("bob", [0; 16], ticket("SELECT 1")).unwrap();
        for i in 1..=50u8 {
            r.add_ticket("eve", [i; 16], ticket("SELECT 2")).unwrap();
            r.add_prepared("eve", [i; 16], Arc::from("SELECT 3")).unwrap();
        }
        assert!(r.ticket("bob", &[0; 16]).is_some(), "another analyst's ticket was evicted");
        assert!(r.ticket("eve", &[0; 16]).is_none() && r.ticket("bob", &[50; 16]).is_none());
        assert!(r.ticket("eve", &[50; 16]).is_some() && r.ticket("eve", &[47; 16]).is_none(), "cap of 3");
        assert!(r.prepared("eve", &[50; 16]).is_some() && r.prepared("eve", &[48; 16]).is_none(), "cap of 2");
        assert_eq!(r.bytes("eve"), 3 * 8 + 2 * 8);
        r.close_prepared("bob", &[50; 16]);
        assert!(r.prepared("eve", &[50; 16]).is_some(), "closed by someone else");
    }

    #[test]
    fn bytes_are_bounded_per_analyst() {
        let r = Registry::new(limits());
        let long = "x".repeat(101);
        assert_eq!(r.add_ticket("eve", [1; 16], ticket(&long)).unwrap_err().code(), tonic::Code::ResourceExhausted);
        r.add_ticket("eve", [1; 16], ticket(&"y".repeat(60))).unwrap();
        r.add_ticket("eve", [2; 16], ticket(&"z".repeat(60))).unwrap();
        assert!(r.ticket("eve", &[1; 16]).is_none(), "the oldest made room");
        assert_eq!(r.bytes("eve"), 60);
        assert!(r.keep_result("eve", &[2; 16], 40), "60 + 40 fits in 100");
        assert_eq!(r.bytes("eve"), 100);
        assert!(!r.keep_result("eve", &[2; 16], 1), "101 does not");
        assert_eq!(r.bytes("eve"), 100);
        r.add_ticket("bob", [3; 16], ticket(&"b".repeat(100))).unwrap();
        assert!(r.ticket("eve", &[2; 16]).is_some(), "bob's bytes are his own");
    }
}
