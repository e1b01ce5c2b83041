//! Charging: the check-and-debit of one execution, and group commit of concurrent ones.
//!
//! Every debit is durable (`synchronous = FULL`: an fsync per commit) before the execution
//! reads a row. One fsync per debit bounds a busy server by the disk, so concurrent debits of
//! one process share a commit: each execution queues its request; one call at a time commits,
//! taking every queued request into one `BEGIN IMMEDIATE` transaction, while the others wait
//! for the end of that commit — then either their outcome is there, or one of them commits
//! the requests that queued meanwhile.
//! Each is checked, in queue order, against the running totals and shares (the earlier ones'
//! debits included) inside its own savepoint: one refused rolls back alone and is reported to
//! its execution alone. The transaction commits once, and only then does any of them proceed.
//! A request's result does not depend on which others shared its commit, only on the order in
//! which the debits were made — as without batching. Processes sharing the file still
//! serialise on `BEGIN IMMEDIATE`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rusqlite::{OptionalExtension, params};

use super::*;
use crate::policy::query_log::QueryRecord;
use crate::policy::shares::{debit_share, require_active};

/// What a committed debit returns: the charges' log ids and the first reserved release id.
type Debited = (Vec<i64>, i64);

/// One execution's debit waiting for a commit, and its result once committed.
#[derive(Debug)]
struct Pending {
    charges: Vec<Charge>,
    query: QueryRecord,
    analyst: Option<String>,
    releases: u64,
    outcome: Mutex<Option<Result<Debited, PolicyError>>>,
}

/// Debits waiting for the next commit of this process's ledger connection.
#[derive(Debug, Default)]
pub(super) struct DebitQueue {
    state: Mutex<QueueState>,
    /// Signalled when a commit has ended (its debits have their outcomes).
    committed: Condvar,
    commits: AtomicU64,
}

/// Marks the end of a commit and wakes the calls waiting for it.
struct CommitEnd<'a>(&'a DebitQueue);

impl Drop for CommitEnd<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.committing = false;
        self.0.committed.notify_all();
    }
}

#[derive(Debug, Default)]
struct QueueState {
    /// Debits not yet taken into a commit, in arrival order.
    pending: Vec<Arc<Pending>>,
    /// Whether a call is committing (it took the pending debits and holds or awaits the
    /// connection): the others wait for its end instead of for the connection.
    committing: bool,
}

impl Catalog {
    /// Checks and debits all charges of one query execution of the table owner's session
    /// (no analyst): see [`Catalog::charge_as`].
    pub fn charge(&self, charges: &[Charge], query: &str) -> Result<Vec<i64>, PolicyError> {
        self.charge_as(charges, query, None)
    }

    /// Checks and debits all charges of one query execution atomically and durably: either
    /// every table has room for its total — and, for an analyst, the analyst's share of every
    /// table has room too — and everything is debited and logged (under the analyst's name),
    /// or nothing changes and the first table without room is reported. Returns the release
    /// log's id of each charge, in order.
    pub fn charge_as(&self, charges: &[Charge], query: &str, analyst: Option<&str>) -> Result<Vec<i64>, PolicyError> {
        self.charge_reserving(charges, &QueryRecord::of(query), analyst, 0).map(|(ids, _)| ids)
    }

    /// [`Catalog::charge_as`], and in the same transaction reserves `releases` consecutive
    /// stored-release ids for this execution: returns the charges' log ids and the first
    /// reserved release id. The execution numbers its releases from that id in a canonical
    /// order fixed by the plan (call, then group), so the ids an analyst sees never depend on
    /// the order in which the data made the releases finish; unused ids stay unused.
    ///
    /// Concurrent calls of one process share a commit (module docs); each returns only once
    /// its debit is durable.
    pub fn charge_reserving(
        &self,
        charges: &[Charge],
        query: &QueryRecord,
        analyst: Option<&str>,
        releases: u64,
    ) -> Result<Debited, PolicyError> {
        let me = Arc::new(Pending {
            charges: charges.to_vec(),
            query: query.clone(),
            analyst: analyst.map(str::to_string),
            releases,
            outcome: Mutex::new(None),
        });
        let queue = &self.debits;
        let mut state = queue.state.lock().expect("debit queue lock");
        state.pending.push(Arc::clone(&me));
        loop {
            if let Some(done) = me.outcome.lock().expect("debit lock").take() {
                return done;
            }
            if state.committing {
                // Another call is committing; this debit is in its batch or in the next one.
                state = queue.committed.wait(state).expect("debit queue lock");
                continue;
            }
            // This call commits everything waiting, its own debit included.
            state.committing = true;
            let batch = std::mem::take(&mut state.pending);
            drop(state);
            {
                // Ends the commit for the waiting calls even if this one unwinds.
                let _end = CommitEnd(queue);
                let outcomes = {
                    let mut conn = self.conn.lock().expect("catalog lock");
                    Self::commit_batch(&mut conn, &batch)
                };
                queue.commits.fetch_add(1, Ordering::Relaxed);
                for (p, outcome) in batch.iter().zip(outcomes) {
                    *p.outcome.lock().expect("debit lock") = Some(outcome);
                }
            }
            state = queue.state.lock().expect("debit queue lock");
        }
    }

    /// Debits `batch` in order in one transaction, each in its own savepoint; one commit. A
    /// failed commit fails every debit of the batch (none of them happened).
    fn commit_batch(conn: &mut Connection, batch: &[Arc<Pending>]) -> Vec<Result<Debited, PolicyError>> {
        let mut run = || -> Result<Vec<Result<Debited, PolicyError>>, PolicyError> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(storage)?;
            let mut outcomes = Vec::with_capacity(batch.len());
            for p in batch {
                tx.execute_batch("SAVEPOINT debit").map_err(storage)?;
                let outcome = debit(&tx, p);
                let end = if outcome.is_ok() { "RELEASE debit" } else { "ROLLBACK TO debit; RELEASE debit" };
                tx.execute_batch(end).map_err(storage)?;
                outcomes.push(outcome);
            }
            tx.commit().map_err(storage)?;
            Ok(outcomes)
        };
        run().unwrap_or_else(|e| batch.iter().map(|_| Err(e.clone())).collect())
    }

    /// How many ledger commits this process has made for debits (each one fsync), for the
    /// benchmarks: fewer than the debits when concurrent ones shared commits.
    #[doc(hidden)]
    pub fn debit_commits(&self) -> u64 {
        self.debits.commits.load(Ordering::Relaxed)
    }
}

/// The check-and-debit of one execution inside the open transaction `tx`.
fn debit(tx: &rusqlite::Transaction<'_>, p: &Pending) -> Result<Debited, PolicyError> {
    let mut per_table: BTreeMap<&str, Budget> = BTreeMap::new();
    for c in &p.charges {
        let e = per_table.entry(&c.table).or_default();
        *e = e.checked_add(&c.cost).ok_or_else(|| PolicyError::Invalid("query cost overflows".into()))?;
    }
    let analyst = p.analyst.as_deref();
    if let Some(a) = analyst {
        require_active(tx, a)?;
    }
    for (&table, &cost) in &per_table {
        let row: Option<(i64, i64, i64, i64)> = tx
            .query_row(
                "SELECT epsilon_total, delta_total, epsilon_spent, delta_spent FROM policies WHERE table_name = ?1",
                [table],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(storage)?;
        let (et, dt, es, ds) =
            row.ok_or_else(|| PolicyError::Invalid(format!("table '{table}' has no privacy policy in the catalog")))?;
        let total = Budget { epsilon_units: et, delta_units: dt };
        let spent = Budget { epsilon_units: es, delta_units: ds };
        let remaining = total.checked_sub(&spent).unwrap_or(Budget::ZERO);
        if !cost.fits_within(&remaining) {
            return Err(PolicyError::BudgetExhausted { table: table.to_string(), analyst: None, cost, remaining });
        }
        if let Some(a) = analyst {
            debit_share(tx, a, table, cost)?;
        }
        let new = spent.checked_add(&cost).expect("fits within the total");
        tx.execute(
            "UPDATE policies SET epsilon_spent = ?2, delta_spent = ?3 WHERE table_name = ?1",
            params![table, new.epsilon_units, new.delta_units],
        )
        .map_err(storage)?;
    }
    // The statement once per execution, bounded (query_log): its charges point at it.
    let (head, length, sha256, ticket) = p.query.columns();
    tx.execute(
        &format!("INSERT INTO queries (at, analyst, head, length, sha256, ticket) VALUES ({NOW}, ?1, ?2, ?3, ?4, ?5)"),
        params![analyst, head, length, sha256, ticket],
    )
    .map_err(storage)?;
    let query_id = tx.last_insert_rowid();
    let mut ids = Vec::with_capacity(p.charges.len());
    for c in &p.charges {
        tx.execute(
            &format!(
                "INSERT INTO releases (at, table_name, function, epsilon, delta, analyst, query_id) \
                 VALUES ({NOW}, ?1, ?2, ?3, ?4, ?5, ?6)"
            ),
            params![c.table, c.function, c.cost.epsilon_units, c.cost.delta_units, analyst, query_id],
        )
        .map_err(storage)?;
        ids.push(tx.last_insert_rowid());
    }
    let first = reserve_release_ids(tx, p.releases)?;
    Ok((ids, first))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(tag: &str) -> Catalog {
        let c = Catalog::create_or_open(&fresh_test_path(&format!("group-{tag}"))).unwrap();
        c.register_table("t", "/data/t.parquet").unwrap();
        c.register_table("u", "/data/u.parquet").unwrap();
        c.make_private("t", Budget::total(1.0, 0.0).unwrap()).unwrap();
        c.make_private("u", Budget::total(1.0, 0.0).unwrap()).unwrap();
        c
    }

    fn charge(table: &str, e: f64) -> Charge {
        Charge { table: table.into(), function: "private_kde".into(), cost: Budget::charge(e, 0.0).unwrap() }
    }

    /// Runs `requests` (analyst, charges) while the connection is busy: the first takes its
    /// own debit and waits for the connection, the others queue behind it in order and share
    /// the next commit. Their results, in order, and the commits made.
    fn queued(c: &Catalog, requests: &[(Option<&str>, Vec<Charge>)]) -> (Vec<Result<Vec<i64>, PolicyError>>, u64) {
        let before = c.debit_commits();
        let results = std::thread::scope(|s| {
            let busy = c.conn.lock().unwrap();
            let handles: Vec<_> = requests
                .iter()
                .enumerate()
                .map(|(i, (analyst, charges))| {
                    let h = s.spawn(move || c.charge_as(charges, "q", *analyst));
                    loop {
                        let st = c.debits.state.lock().unwrap();
                        if st.committing && st.pending.len() == i {
                            break;
                        }
                        drop(st);
                        std::thread::yield_now();
                    }
                    h
                })
                .collect();
            drop(busy);
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (results, c.debit_commits() - before)
    }

    fn remaining(r: &Result<Vec<i64>, PolicyError>) -> Budget {
        match r {
            Err(PolicyError::BudgetExhausted { remaining, .. }) => *remaining,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn queued_debits_share_one_commit_each_checked_in_order_against_the_total() {
        // Against the running total ε = 1, in queue order: 0.3 (alone in the first commit), then
        // together 0.3 fits, 0.5 no longer does (0.4 left), 0.2 and 0.2 fit (exactly), 0.1 does
        // not. Two commits; the refused ones debit and log nothing and do not undo the others.
        // (A build that commits each debit alone makes six commits; one that aborts the batch
        // on a refusal loses the fitting debits after it; one that checks the batch against the
        // total before it lets 0.5 through.)
        let c = catalog("total");
        let requests: Vec<_> = [0.3, 0.3, 0.5, 0.2, 0.2, 0.1].iter().map(|&e| (None, vec![charge("t", e)])).collect();
        let (results, commits) = queued(&c, &requests);
        let fitted: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(fitted, [true, true, false, true, true, false], "{results:?}");
        assert_eq!(commits, 2, "one commit for the first, one for the five queued behind it");
        assert_eq!(remaining(&results[2]), Budget::total(0.4, 0.0).unwrap());
        assert_eq!(remaining(&results[5]), Budget::ZERO);
        assert_eq!(c.table("t").unwrap().unwrap().policy.unwrap().spent, Budget::total(1.0, 0.0).unwrap());
        assert_eq!(c.release_log(Some("t")).unwrap().len(), 4);
    }

    #[test]
    fn queued_debits_are_checked_against_each_analysts_running_share_and_refusals_stay_whole() {
        // Shares of t: alice 0.5, bob 0.9; of u: bob 0.05. In one commit after the first:
        // alice 0.3 fits, alice 0.3 exceeds her share (0.2 left), bob 0.3 fits, bob's query
        // over t and u is refused by his share of u and debits t neither, alice 0.2 fits her
        // share exactly, bob 0.7 exceeds both his share (0.6 left) and t's running total (1 in
        // all, 0.2 left after the others), which is checked first.
        let c = catalog("shares");
        c.add_analyst("alice").unwrap();
        c.add_analyst("bob").unwrap();
        c.grant("alice", "t", Budget::total(0.5, 0.0).unwrap()).unwrap();
        c.grant("bob", "t", Budget::total(0.9, 0.0).unwrap()).unwrap();
        c.grant("bob", "u", Budget::total(0.05, 0.0).unwrap()).unwrap();
        let requests = [
            (Some("alice"), vec![charge("t", 0.3)]),
            (Some("alice"), vec![charge("t", 0.3)]),
            (Some("bob"), vec![charge("t", 0.3)]),
            (Some("bob"), vec![charge("t", 0.1), charge("u", 0.1)]),
            (Some("alice"), vec![charge("t", 0.2)]),
            (Some("bob"), vec![charge("t", 0.7)]),
        ];
        let (results, commits) = queued(&c, &requests);
        let fitted: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(fitted, [true, false, true, false, true, false], "{results:?}");
        assert_eq!(commits, 2);
        assert!(matches!(&results[1], Err(PolicyError::BudgetExhausted { analyst: Some(a), .. }) if a == "alice"));
        assert_eq!(remaining(&results[1]), Budget::total(0.2, 0.0).unwrap());
        assert!(matches!(&results[3], Err(PolicyError::BudgetExhausted { analyst: Some(a), .. }) if a == "bob"));
        assert!(matches!(&results[5], Err(PolicyError::BudgetExhausted { analyst: None, .. })));
        assert_eq!(remaining(&results[5]), Budget::total(0.2, 0.0).unwrap());
        assert_eq!(c.table("t").unwrap().unwrap().policy.unwrap().spent, Budget::total(0.8, 0.0).unwrap());
        assert_eq!(c.table("u").unwrap().unwrap().policy.unwrap().spent, Budget::ZERO);
        assert_eq!(c.release_log(Some("t")).unwrap().len(), 3);
    }
}
