//! The ledger's release side: the log of charged releases, and the stored releases — written once
//! per paid execution, read again for free by id, by table, or by the ticket that paid for them.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};

use super::*;

impl Catalog {
    /// The release log, oldest first, optionally for one table.
    pub fn release_log(&self, table: Option<&str>) -> Result<Vec<ReleaseRecord>, PolicyError> {
        let conn = self.conn.lock().expect("catalog lock");
        let mut stmt = conn
            .prepare(
                "SELECT r.id, r.at, r.table_name, r.function, r.epsilon, r.delta, q.head, q.length, q.sha256,
                        r.analyst
                 FROM releases r JOIN queries q ON q.id = r.query_id
                 WHERE ?1 IS NULL OR r.table_name = ?1 ORDER BY r.id",
            )
            .map_err(storage)?;
        stmt.query_map([table], |r| {
            Ok(ReleaseRecord {
                id: r.get(0)?,
                at: r.get(1)?,
                table: r.get(2)?,
                function: r.get(3)?,
                cost: Budget { epsilon_units: r.get(4)?, delta_units: r.get(5)? },
                query: query_text(r, 6)?,
                analyst: r.get(9)?,
            })
        })
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)
    }

    /// Number of logged releases per table.
    pub fn release_counts(&self) -> Result<BTreeMap<String, i64>, PolicyError> {
        let conn = self.conn.lock().expect("catalog lock");
        let mut stmt =
            conn.prepare("SELECT table_name, count(*) FROM releases GROUP BY table_name").map_err(storage)?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(storage)?
            .collect::<Result<BTreeMap<_, _>, _>>()
            .map_err(storage)
    }

    /// Keeps one release: its public parameters and released numbers, under the charge that
    /// paid for it, at the reserved `id` (see [`Catalog::charge_reserving`]; None: the next
    /// free one). Returns its id (`r<n>`).
    pub fn store_release(
        &self,
        id: Option<i64>,
        charge_id: i64,
        table: &str,
        function: &str,
        parameters: &str,
        data: &[u8],
    ) -> Result<String, PolicyError> {
        let mut ids = self.store_releases(charge_id, table, [(id, function, parameters, data)])?;
        Ok(ids.pop().expect("one release stored"))
    }

    /// Keeps several releases of one charge in one transaction (one commit for all the groups of
    /// a grouped call), each as [`Catalog::store_release`] keeps one: `(reserved id, function,
    /// parameters, data)`. Returns their ids in order; none is kept if one cannot be.
    pub fn store_releases<'a>(
        &self,
        charge_id: i64,
        table: &str,
        releases: impl IntoIterator<Item = (Option<i64>, &'a str, &'a str, &'a [u8])>,
    ) -> Result<Vec<String>, PolicyError> {
        self.with_store(|conn| {
            let tx = conn.unchecked_transaction().map_err(storage)?;
            let mut ids = Vec::new();
            {
                let mut insert = tx
                    .prepare_cached(&format!(
                        "INSERT INTO stored_releases (id, charge_id, at, table_name, function, parameters, data)
                         VALUES (?6, ?1, {NOW}, ?2, ?3, ?4, ?5)"
                    ))
                    .map_err(storage)?;
                for (id, function, parameters, data) in releases {
                    insert.execute(params![charge_id, table, function, parameters, data, id]).map_err(storage)?;
                    ids.push(format!("{RELEASE_ID_PREFIX}{}", tx.last_insert_rowid()));
                }
            }
            tx.commit().map_err(storage)?;
            Ok(ids)
        })
    }

    /// A stored release's function, parameters and released numbers; None if there is none
    /// with that id.
    pub fn stored_release(&self, id: &str) -> Result<Option<(String, String, Vec<u8>)>, PolicyError> {
        self.stored_release_of(id, None)
    }

    /// [`Catalog::stored_release`] as seen by a session: an analyst's session sees only the
    /// releases that analyst paid for (None: the table owner's session, which sees all).
    pub fn stored_release_of(
        &self,
        id: &str,
        analyst: Option<&str>,
    ) -> Result<Option<(String, String, Vec<u8>)>, PolicyError> {
        let Some(n) = id.strip_prefix(RELEASE_ID_PREFIX).and_then(|n| n.parse::<i64>().ok()) else {
            return Ok(None);
        };
        let conn = self.conn.lock().expect("catalog lock");
        conn.query_row(
            "SELECT s.function, s.parameters, s.data FROM stored_releases s JOIN releases r ON r.id = s.charge_id
             WHERE s.id = ?1 AND (?2 IS NULL OR r.analyst = ?2)",
            params![n, analyst],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(storage)
    }

    /// The stored releases, oldest first, optionally of one table (without their numbers).
    pub fn stored_releases(&self, table: Option<&str>) -> Result<Vec<StoredReleaseRecord>, PolicyError> {
        self.stored_releases_of(table, None)
    }

    /// The stored releases of the executions `analyst` paid for with the server ticket whose
    /// handle is `handle` (none: that ticket never ran a paid query of theirs).
    pub fn releases_of_ticket(&self, analyst: &str, handle: &[u8]) -> Result<Vec<String>, PolicyError> {
        let ticket = crate::policy::query_log::ticket_hash(handle);
        let conn = self.conn.lock().expect("catalog lock");
        let mut stmt = conn
            .prepare(
                "SELECT s.id FROM queries q JOIN releases r ON r.query_id = q.id
                 JOIN stored_releases s ON s.charge_id = r.id
                 WHERE q.ticket = ?1 AND q.analyst = ?2 ORDER BY s.id",
            )
            .map_err(storage)?;
        stmt.query_map(params![ticket.as_slice(), analyst], |r| {
            Ok(format!("{RELEASE_ID_PREFIX}{}", r.get::<_, i64>(0)?))
        })
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)
    }
    /// [`Catalog::stored_releases`] as seen by a session: an analyst's session lists only that
    /// analyst's releases (None: all).
    pub fn stored_releases_of(
        &self,
        table: Option<&str>,
        analyst: Option<&str>,
    ) -> Result<Vec<StoredReleaseRecord>, PolicyError> {
        let conn = self.conn.lock().expect("catalog lock");
        let mut stmt = conn
            .prepare(
                "SELECT s.id, s.at, s.table_name, s.function, s.parameters, r.epsilon, r.delta, s.charge_id, q.head,
                        q.length, q.sha256, r.analyst, q.id
                 FROM stored_releases s JOIN releases r ON r.id = s.charge_id JOIN queries q ON q.id = r.query_id
                 WHERE (?1 IS NULL OR s.table_name = ?1) AND (?2 IS NULL OR r.analyst = ?2) ORDER BY s.id",
            )
            .map_err(storage)?;
        stmt.query_map(params![table, analyst], |r| {
            Ok(StoredReleaseRecord {
                release: format!("{RELEASE_ID_PREFIX}{}", r.get::<_, i64>(0)?),
                at: r.get(1)?,
                table: r.get(2)?,
                function: r.get(3)?,
                parameters: r.get(4)?,
                cost: Budget { epsilon_units: r.get(5)?, delta_units: r.get(6)? },
                charge: r.get(7)?,
                query: query_text(r, 8)?,
                analyst: r.get(11)?,
                execution: r.get(12)?,
                statement_sha256: r.get(10)?,
            })
        })
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)
    }

    /// The release store's own connection (`synchronous = NORMAL`: a kept release or result
    /// is a convenience, the charge before it was fsynced).
    fn with_store<T>(&self, f: impl FnOnce(&Connection) -> Result<T, PolicyError>) -> Result<T, PolicyError> {
        let mut guard = self.store.lock().expect("release store lock");
        if guard.is_none() {
            let conn = Connection::open_with_flags(
                &self.path,
                OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(storage)?;
            conn.busy_timeout(BUSY_TIMEOUT).map_err(storage)?;
            conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;").map_err(storage)?;
            *guard = Some(conn);
        }
        f(guard.as_ref().expect("opened above"))
    }

    /// Keeps the result (an Arrow IPC stream) of the paid execution that `analyst` ran with the
    /// server ticket whose handle is `handle`. Returns the execution, None when that ticket ran
    /// no paid query of theirs. A result is kept once; a second call changes nothing.
    pub fn store_result(&self, analyst: &str, handle: &[u8], data: &[u8]) -> Result<Option<i64>, PolicyError> {
        let ticket = crate::policy::query_log::ticket_hash(handle);
        self.with_store(|conn| {
            let execution: Option<i64> = conn
                .query_row(
                    "SELECT id FROM queries WHERE ticket = ?1 AND analyst = ?2 ORDER BY id DESC LIMIT 1",
                    params![ticket.as_slice(), analyst],
                    |r| r.get(0),
                )
                .optional()
                .map_err(storage)?;
            let Some(execution) = execution else { return Ok(None) };
            conn.execute(
                &format!("INSERT OR IGNORE INTO query_results (query_id, at, bytes, data) VALUES (?1, {NOW}, ?2, ?3)"),
                params![execution, data.len() as i64, data],
            )
            .map_err(storage)?;
            Ok(Some(execution))
        })
    }

    /// The kept result of an execution (None: none kept, or another analyst's; `analyst` None:
    /// the table owner's session, which sees all).
    pub fn stored_result_of(&self, execution: i64, analyst: Option<&str>) -> Result<Option<Vec<u8>>, PolicyError> {
        let conn = self.conn.lock().expect("catalog lock");
        conn.query_row(
            "SELECT k.data FROM query_results k JOIN queries q ON q.id = k.query_id
             WHERE k.query_id = ?1 AND (?2 IS NULL OR q.analyst = ?2)",
            params![execution, analyst],
            |r| r.get(0),
        )
        .optional()
        .map_err(storage)
    }

    /// The kept results, oldest first, as a session sees them (`analyst` None: all).
    pub fn stored_results_of(&self, analyst: Option<&str>) -> Result<Vec<StoredResultRecord>, PolicyError> {
        let conn = self.conn.lock().expect("catalog lock");
        let mut stmt = conn
            .prepare(
                "SELECT k.query_id, k.at, q.sha256, q.head, q.length, q.sha256, k.bytes, q.analyst
                 FROM query_results k JOIN queries q ON q.id = k.query_id
                 WHERE ?1 IS NULL OR q.analyst = ?1 ORDER BY k.query_id",
            )
            .map_err(storage)?;
        stmt.query_map(params![analyst], |r| {
            Ok(StoredResultRecord {
                execution: r.get(0)?,
                at: r.get(1)?,
                statement_sha256: r.get(2)?,
                query: query_text(r, 3)?,
                bytes: r.get(6)?,
                analyst: r.get(7)?,
            })
        })
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)
    }
}
