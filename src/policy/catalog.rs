//! The catalog and budget ledger: one SQLite file (SPEC §4).
//!
//! It holds the registered tables (name, Parquet location, public or private), each
//! private table's policy (total ε and δ, public column bounds, public curve length), the
//! budget spent so far, and the release log. The file runs in WAL mode with
//! `synchronous = FULL`, so a committed debit survives a crash; every check-and-debit is
//! made in a `BEGIN IMMEDIATE` transaction, so processes sharing the file serialise on it
//! (concurrent debits of one process share one: `debits`).
//! A file that is not a dpcurve catalog, has another format version, or fails SQLite's
//! integrity check is refused with a clear message (fail closed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

pub use super::error::PolicyError;
use super::error::storage;
use super::locations::{check_location_syntax, locations_overlap};
use super::schema::{
    POLICY_TABLES, SCHEMA, UPGRADE_1_TO_2, UPGRADE_2_TO_3, UPGRADE_3_TO_4, UPGRADE_4_TO_5, UPGRADE_5_TO_6,
    UPGRADE_6_TO_7, UPGRADE_7_TO_8,
};
use super::verified_files::VerifiedFile;
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::ranges;

/// The catalog format this version reads and writes.
pub const FORMAT_VERSION: i64 = 8;

/// Most public keys one column may declare.
pub const MAX_KEYS: usize = 100_000;

/// Largest row bound a table may declare (2⁵³: every count below it is exact as a double too).
pub const MAX_ROW_BOUND: i64 = 1 << 53;
/// Memory limit of analyst sessions unless the data owner sets another: 2 GiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 2 << 30;
/// Smallest memory limit the data owner may set.
pub const MIN_MEMORY_LIMIT: u64 = 64 << 20;
/// Largest memory limit the data owner may set.
pub const MAX_MEMORY_LIMIT: u64 = 1 << 40;
const FORMAT_NAME: &str = "dpcurve-catalog";
/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// A private table's policy and spending.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Total budget the data owner allows.
    pub total: Budget,
    /// Budget spent so far.
    pub spent: Budget,
    /// Public bounds per column: (lower, upper).
    pub bounds: BTreeMap<String, (f64, f64)>,
    /// Public curve length for list columns.
    pub curve_length: Option<i64>,
    /// Declared public group keys per column (as text, in the column's type's SQL spelling).
    pub keys: BTreeMap<String, Vec<String>>,
    /// The privacy unit, if neighbouring tables differ by a whole unit rather than a row.
    pub unit: Option<PrivacyUnit>,
    /// The most rows the table's files hold together, as the data owner declares it: the public
    /// fact from which queries that bound units or select groups plan their memory (SPEC §0: the
    /// row count itself is private).
    pub row_bound: Option<u64>,
    /// The files its last verification read whole ([`Catalog::record_verification`]); None until one
    /// did. Analyst queries read these files only, unchanged.
    pub verified: Option<Vec<VerifiedFile>>,
}

/// A privacy unit (SPEC §7): the column identifying a person or device, and the public bounds
/// on one unit's contribution to a release.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivacyUnit {
    /// The unit column.
    pub column: String,
    /// At most this many rows of a unit count in one release.
    pub max_rows: i64,
    /// At most this many groups of a grouped release receive a unit's rows.
    pub max_groups: i64,
}

impl Policy {
    /// What is left (never negative).
    pub fn remaining(&self) -> Budget {
        self.total.checked_sub(&self.spent).unwrap_or(Budget::ZERO)
    }
}

/// A registered table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableInfo {
    /// SQL name.
    pub name: String,
    /// Parquet file or directory.
    pub location: String,
    /// The policy if the table is private.
    pub policy: Option<Policy>,
}

/// One entry of the release log.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleaseRecord {
    /// Sequence number.
    pub id: i64,
    /// UTC time of the debit (ISO 8601).
    pub at: String,
    /// Table charged.
    pub table: String,
    /// Private function released.
    pub function: String,
    /// What the release cost.
    pub cost: Budget,
    /// The SQL text of the query.
    pub query: String,
    /// The analyst whose session made it (None: the table owner's session).
    pub analyst: Option<String>,
}

/// Prefix of stored release ids (`r1`, `r2`, …).
pub const RELEASE_ID_PREFIX: &str = "r";

/// One stored release, without its numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredReleaseRecord {
    /// Its id (`r<n>`), the `release` field of the result.
    pub release: String,
    /// UTC time it was stored (ISO 8601).
    pub at: String,
    /// The private table.
    pub table: String,
    /// The private function.
    pub function: String,
    /// Public parameters (JSON).
    pub parameters: String,
    /// What the call that made it cost (shared by the groups of a grouped call).
    pub cost: Budget,
    /// The release log entry of that charge.
    pub charge: i64,
    /// The SQL text of the query.
    pub query: String,
    /// The analyst whose session made it (None: the table owner's session).
    pub analyst: Option<String>,
    /// The paid execution of the query that made it (shared by the releases of one query).
    pub execution: i64,
    /// The SHA-256 of the query's whole text (hex).
    pub statement_sha256: String,
}

/// A paid execution whose result a server kept ([`Catalog::store_result`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResultRecord {
    /// The execution (the `execution` of its releases in `dpcurve.releases`).
    pub execution: i64,
    /// UTC time the result was kept (ISO 8601).
    pub at: String,
    /// The SHA-256 of the query's whole text (hex).
    pub statement_sha256: String,
    /// The SQL text of the query (bounded as in the release log).
    pub query: String,
    /// Size of the kept Arrow IPC stream.
    pub bytes: i64,
    /// The analyst who paid.
    pub analyst: Option<String>,
}

/// One release to debit.
#[derive(Debug, Clone, PartialEq)]
pub struct Charge {
    /// Private table charged.
    pub table: String,
    /// Private function.
    pub function: String,
    /// Its cost.
    pub cost: Budget,
}

/// How much of the file opening a catalog checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// SQLite's `quick_check` of every page: the data owner's opens (`dpcurve admin`). It reads
    /// the whole file, which grows with the release log and kept results.
    Whole,
    /// The header, the schema, the format and the pages of the [`POLICY_TABLES`] (whose size the
    /// data owner sets): analyst sessions and the server, so that opening does not grow with the
    /// logs. SQLite still detects damage in every page a statement reads (that statement fails);
    /// the data owner's commands check them all.
    Format,
    /// The header, the schema and the format: a second connection to a file just checked.
    Schema,
}

/// The catalog/ledger file.
#[derive(Debug)]
pub struct Catalog {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// A second connection for stored releases, committing without fsync (`synchronous =
    /// NORMAL` in WAL mode: atomic, durable at the next checkpoint). The ledger's debits keep
    /// `FULL`; a crash can lose the most recently stored releases, never a charge.
    store: Mutex<Option<Connection>>,
    /// Concurrent debits waiting to share the next commit (group commit).
    debits: debits::DebitQueue,
}

/// The release log's text of a query from its (head, length, sha256) columns at `at`.
fn query_text(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<String> {
    let head: String = row.get(at)?;
    let length: i64 = row.get(at + 1)?;
    let sha256: String = row.get(at + 2)?;
    Ok(super::query_log::display(&head, u64::try_from(length).unwrap_or(0), &sha256))
}

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// Reserves `n` consecutive ids of `stored_releases` (moves its AUTOINCREMENT counter past
/// them) and returns the first. Inside a write transaction, so two executions never share one.
fn reserve_release_ids(tx: &rusqlite::Transaction<'_>, n: u64) -> Result<i64, PolicyError> {
    let seq: i64 = tx
        .query_row("SELECT seq FROM sqlite_sequence WHERE name = 'stored_releases'", [], |r| r.get(0))
        .optional()
        .map_err(storage)?
        .unwrap_or(0);
    let max: i64 =
        tx.query_row("SELECT COALESCE(MAX(id), 0) FROM stored_releases", [], |r| r.get(0)).map_err(storage)?;
    let first = seq.max(max) + 1;
    if n == 0 {
        return Ok(first);
    }
    let n = i64::try_from(n).map_err(|_| PolicyError::Invalid("too many releases in one query".into()))?;
    let last = first + n - 1;
    let updated =
        tx.execute("UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'stored_releases'", [last]).map_err(storage)?;
    if updated == 0 {
        tx.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('stored_releases', ?1)", [last])
            .map_err(storage)?;
    }
    Ok(first)
}

impl Catalog {
    /// Opens a catalog, creating an empty one if the file does not exist (data owners).
    pub fn create_or_open(path: &Path) -> Result<Catalog, PolicyError> {
        Self::open_impl(path, true)
    }

    /// Opens an existing catalog (analyst sessions never create one).
    pub fn open(path: &Path) -> Result<Catalog, PolicyError> {
        Self::open_impl(path, false)
    }

    fn open_impl(path: &Path, create: bool) -> Result<Catalog, PolicyError> {
        let exists = path.exists();
        if !exists && !create {
            return Err(PolicyError::Catalog(format!(
                "no catalog at {}: create one with `dpcurve admin --catalog {} register …`",
                path.display(),
                path.display()
            )));
        }
        let not_catalog =
            |why: String| PolicyError::Catalog(format!("{} is not a usable dpcurve catalog: {why}", path.display()));
        if exists {
            // Validate an existing file through a read-only connection first: a file that is
            // not a dpcurve catalog (of this format) is refused without a single byte of it —
            // journal mode, header, size — being changed.
            let ro =
                Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                    .map_err(|e| not_catalog(e.to_string()))?;
            ro.busy_timeout(BUSY_TIMEOUT).map_err(storage)?;
            let check = if create { Check::Whole } else { Check::Format };
            Self::validate(&ro, create, check).map_err(|e| match e {
                PolicyError::Catalog(m) => not_catalog(m),
                other => other,
            })?;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | if create { OpenFlags::SQLITE_OPEN_CREATE } else { OpenFlags::empty() };
        let conn = Connection::open_with_flags(path, flags).map_err(|e| not_catalog(e.to_string()))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(storage)?;
        let mode: String =
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(|e| not_catalog(e.to_string()))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(not_catalog(format!("cannot switch to WAL journaling (got {mode})")));
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;").map_err(storage)?;
        let catalog = Catalog {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            store: Mutex::new(None),
            debits: debits::DebitQueue::default(),
        };
        catalog.init_or_check(create).map_err(|e| match e {
            PolicyError::Catalog(m) => not_catalog(m),
            other => other,
        })?;
        Ok(catalog)
    }

    /// Checks, without writing, that `conn` holds a dpcurve catalog of this format — intact in
    /// every page when `check` is [`Check::Whole`].
    fn validate(conn: &Connection, upgradable: bool, check: Check) -> Result<(), PolicyError> {
        let damaged =
            |e: rusqlite::Error| PolicyError::Catalog(format!("{e} (the file is corrupted or is not a catalog)"));
        if check == Check::Whole {
            let result: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(damaged)?;
            if result != "ok" {
                return Err(PolicyError::Catalog(format!("integrity check failed: {result}")));
            }
        }
        // Reading the header and the schema is where a non-database file is detected.
        let objects: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0)).map_err(damaged)?;
        if check == Check::Format {
            for table in POLICY_TABLES {
                let present: bool = conn
                    .query_row(
                        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                        [table],
                        |r| r.get(0),
                    )
                    .map_err(damaged)?;
                if present {
                    let result: String =
                        conn.query_row(&format!("PRAGMA quick_check({table})"), [], |r| r.get(0)).map_err(damaged)?;
                    if result != "ok" {
                        return Err(PolicyError::Catalog(format!("integrity check failed: {result}")));
                    }
                }
            }
        }
        if objects == 0 {
            return Err(PolicyError::Catalog("the file is empty (not a catalog); choose a new path".into()));
        }
        let meta = |key: &str| -> Result<Option<String>, PolicyError> {
            conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional().map_err(|_| {
                PolicyError::Catalog("it has no dpcurve metadata (another application's database?)".into())
            })
        };
        if meta("format")?.as_deref() != Some(FORMAT_NAME) {
            return Err(PolicyError::Catalog("it has no dpcurve metadata (another application's database?)".into()));
        }
        let version: i64 = meta("version")?.and_then(|v| v.parse().ok()).unwrap_or(-1);
        if (1..FORMAT_VERSION).contains(&version) && upgradable {
            return Ok(()); // the data owner's open upgrades it (init_or_check)
        }
        if (1..FORMAT_VERSION).contains(&version) {
            return Err(PolicyError::Catalog(format!(
                "it was written by an older version of dpcurve (catalog format {version}); any `dpcurve admin` \
                 command upgrades it to format {FORMAT_VERSION} (analyst sessions never modify a catalog's format)"
            )));
        }
        if version != FORMAT_VERSION {
            let who = if version < FORMAT_VERSION { "an older" } else { "a newer" };
            return Err(PolicyError::Catalog(format!(
                "it was written by {who} version of dpcurve (catalog format {version}); this dpcurve reads \
                 format {FORMAT_VERSION} only and will not modify the file"
            )));
        }
        Ok(())
    }

    fn init_or_check(&self, create: bool) -> Result<(), PolicyError> {
        let mut conn = self.conn.lock().expect("catalog lock");
        // The data owner's open may create or upgrade the schema: it holds the write lock from the
        // start. An analyst's only reads, and does not wait for other processes' debits.
        let behavior = if create { TransactionBehavior::Immediate } else { TransactionBehavior::Deferred };
        let tx = conn.transaction_with_behavior(behavior).map_err(storage)?;
        let objects: i64 = tx.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0)).map_err(storage)?;
        if objects == 0 {
            // A file this process just created (existing files were validated read-only).
            if !create {
                return Err(PolicyError::Catalog("the file is empty".into()));
            }
            tx.execute_batch(SCHEMA).map_err(storage)?;
            tx.execute(
                "INSERT INTO meta VALUES ('format', ?1), ('version', ?2)",
                params![FORMAT_NAME, FORMAT_VERSION.to_string()],
            )
            .map_err(storage)?;
            tx.commit().map_err(storage)?;
            return Ok(());
        }
        let version: Option<String> = tx
            .query_row("SELECT value FROM meta WHERE key = 'version'", [], |r| r.get(0))
            .optional()
            .map_err(storage)?;
        let old = version.as_deref().and_then(|v| v.parse::<i64>().ok()).filter(|v| (1..FORMAT_VERSION).contains(v));
        if let (true, Some(old)) = (create, old) {
            if old == 1 {
                tx.execute_batch(UPGRADE_1_TO_2).map_err(storage)?;
            }
            if old <= 2 {
                tx.execute_batch(UPGRADE_2_TO_3).map_err(storage)?;
            }
            if old <= 3 {
                tx.execute_batch(UPGRADE_3_TO_4).map_err(storage)?;
            }
            if old <= 4 {
                tx.execute_batch(UPGRADE_4_TO_5).map_err(storage)?;
            }
            if old <= 5 {
                tx.execute_batch(UPGRADE_5_TO_6).map_err(storage)?;
            }
            if old <= 6 {
                tx.execute_batch(UPGRADE_6_TO_7).map_err(storage)?;
            }
            tx.execute_batch(UPGRADE_7_TO_8).map_err(storage)?;
            tx.commit().map_err(storage)?;
            return Self::validate(&conn, false, Check::Schema);
        }
        drop(tx);
        // Its pages were checked through the read-only connection a moment ago.
        Self::validate(&conn, false, Check::Schema)
    }

    /// Benchmarks only: commit without fsync (`synchronous = OFF`) to measure what
    /// durability costs. dpcurve itself never calls this.
    #[doc(hidden)]
    pub fn disable_fsync_for_benchmarks(&self) -> Result<(), PolicyError> {
        self.conn.lock().expect("catalog lock").execute_batch("PRAGMA synchronous = OFF").map_err(storage)
    }

    /// Path of the catalog file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn with_tx<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, PolicyError>,
    ) -> Result<T, PolicyError> {
        let mut conn = self.conn.lock().expect("catalog lock");
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(storage)?;
        let out = f(&tx)?;
        tx.commit().map_err(storage)?;
        Ok(out)
    }

    /// Runs `f` in a read-only (deferred) transaction: a consistent snapshot that takes no write
    /// lock, so reads never wait for, or hold up, another process's debit.
    pub(super) fn with_read<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, PolicyError>,
    ) -> Result<T, PolicyError> {
        let mut conn = self.conn.lock().expect("catalog lock");
        let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(storage)?;
        f(&tx)
    }

    /// (name, location, private) of every registered table.
    fn locations(tx: &rusqlite::Transaction<'_>) -> Result<Vec<(String, String, bool)>, PolicyError> {
        let mut stmt = tx.prepare("SELECT name, location, private FROM tables").map_err(storage)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)? == 1)))
            .map_err(storage)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(storage)
    }

    fn require_table(tx: &rusqlite::Transaction<'_>, name: &str) -> Result<bool, PolicyError> {
        tx.query_row("SELECT private FROM tables WHERE name = ?1", [name], |r| r.get::<_, i64>(0))
            .optional()
            .map_err(storage)?
            .map(|p| p == 1)
            .ok_or_else(|| PolicyError::Invalid(format!("no table named '{name}' in the catalog")))
    }

    /// Runs `f` in a write transaction on the policy of the private table `name`; a public or
    /// unknown table is refused.
    fn with_policy_tx<T>(
        &self,
        name: &str,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, PolicyError>,
    ) -> Result<T, PolicyError> {
        self.with_tx(|tx| {
            if !Self::require_table(tx, name)? {
                return Err(PolicyError::Invalid(format!("table '{name}' is public; make it private first")));
            }
            f(tx)
        })
    }

    /// Sets the policy columns of `assignments` (SQL, `?1` being the table's name) of the private
    /// table `name`.
    fn update_policy(
        &self,
        name: &str,
        assignments: &'static str,
        values: impl rusqlite::Params,
    ) -> Result<(), PolicyError> {
        self.with_policy_tx(name, |tx| {
            tx.execute(&format!("UPDATE policies SET {assignments} WHERE table_name = ?1"), values).map_err(storage)?;
            Ok(())
        })
    }

    /// Registers a Parquet location under a name, as a public table. The location must not
    /// reach a private table's files (SPEC §5.2): not the same path, not a directory holding
    /// them, not a file inside a private directory. Callers pass canonical absolute paths
    /// ([`crate::Admin::register`] resolves them), so aliases through symbolic links and
    /// relative paths compare equal.
    pub fn register_table(&self, name: &str, location: &str) -> Result<(), PolicyError> {
        validate_name(name)?;
        check_location_syntax(location)?;
        self.with_tx(|tx| {
            let all = Self::locations(tx)?;
            // SQL folds an unquoted name to lower case, so names differing only in case would
            // shadow each other in statements: they count as the same name.
            if let Some((n, _, _)) = all.iter().find(|(n, _, _)| n.eq_ignore_ascii_case(name)) {
                return Err(PolicyError::Invalid(if n == name {
                    format!("a table named '{name}' is already registered")
                } else {
                    format!(
                        "a table named '{n}' is already registered; table names are compared ignoring case \
                         (SQL folds unquoted names to lower case)"
                    )
                }));
            }
            for (other, loc, private) in all {
                if private && locations_overlap(location, &loc) {
                    return Err(PolicyError::Invalid(format!(
                        "location {location} reaches the files of private table '{other}' ({loc}): a table \
                         may not read a private table's files except through its policy"
                    )));
                }
            }
            let n = tx
                .execute(
                    &format!("INSERT OR IGNORE INTO tables (name, location, private, registered_at) VALUES (?1, ?2, 0, {NOW})"),
                    params![name, location],
                )
                .map_err(storage)?;
            if n == 0 {
                return Err(PolicyError::Invalid(format!("a table named '{name}' is already registered")));
            }
            Ok(())
        })
    }

    /// Makes a table private with a total budget. A private table cannot be made public
    /// again or re-registered: its spending history stays in force.
    pub fn make_private(&self, name: &str, total: Budget) -> Result<(), PolicyError> {
        self.with_tx(|tx| {
            if Self::require_table(tx, name)? {
                return Err(PolicyError::Invalid(format!(
                    "table '{name}' is already private; use raise-budget to add budget"
                )));
            }
            let all = Self::locations(tx)?;
            let mine = all.iter().find(|(n, _, _)| n == name).map(|(_, l, _)| l.clone()).unwrap_or_default();
            check_location_syntax(&mine)?;
            for (other, loc, _) in &all {
                if other != name && locations_overlap(&mine, loc) {
                    return Err(PolicyError::Invalid(format!(
                        "table '{name}' ({mine}) shares files with table '{other}' ({loc}): a private table's \
                         files must be reachable through it alone (remove or re-register '{other}' first)"
                    )));
                }
            }
            tx.execute("UPDATE tables SET private = 1 WHERE name = ?1", [name]).map_err(storage)?;
            tx.execute(
                "INSERT INTO policies (table_name, epsilon_total, delta_total) VALUES (?1, ?2, ?3)",
                params![name, total.epsilon_units, total.delta_units],
            )
            .map_err(storage)?;
            Ok(())
        })
    }

    /// Adds budget to a private table.
    pub fn raise_budget(&self, name: &str, extra: Budget) -> Result<Budget, PolicyError> {
        self.with_policy_tx(name, |tx| {
            let (e, d): (i64, i64) = tx
                .query_row("SELECT epsilon_total, delta_total FROM policies WHERE table_name = ?1", [name], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(storage)?;
            let total = Budget { epsilon_units: e, delta_units: d }
                .checked_add(&extra)
                .filter(|b| b.delta_units <= 10i64.pow(18))
                .ok_or_else(|| {
                    PolicyError::Invalid("the raised budget would exceed the largest allowed total".into())
                })?;
            tx.execute(
                "UPDATE policies SET epsilon_total = ?2, delta_total = ?3 WHERE table_name = ?1",
                params![name, total.epsilon_units, total.delta_units],
            )
            .map_err(storage)?;
            Ok(total)
        })
    }

    /// Sets the public bounds of a column of a private table.
    pub fn set_bounds(&self, name: &str, column: &str, lower: f64, upper: f64) -> Result<(), PolicyError> {
        if !(lower.is_finite() && upper.is_finite() && lower < upper) {
            return Err(PolicyError::Invalid(format!(
                "bounds must be finite numbers with lower < upper, got lower = {lower}, upper = {upper}"
            )));
        }
        // Bounds become the calls' ranges: refuse here what every call would refuse.
        if !ranges::accepts(lower, upper) {
            return Err(PolicyError::Invalid(format!(
                "bounds must lie {} (the ranges the releases accept), got lower = {lower}, upper = {upper}",
                ranges::rule()
            )));
        }
        self.with_tx(|tx| {
            if !Self::require_table(tx, name)? {
                return Err(PolicyError::Invalid(format!(
                    "table '{name}' is public; bounds belong to a private table's policy"
                )));
            }
            tx.execute(
                "INSERT INTO column_bounds VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (table_name, column_name) DO UPDATE SET lower = excluded.lower, upper = excluded.upper",
                params![name, column, lower, upper],
            )
            .map_err(storage)?;
            Ok(())
        })
    }

    /// Sets the public curve length of a private table's list columns.
    pub fn set_curve_length(&self, name: &str, length: i64) -> Result<(), PolicyError> {
        if !(2..=1_000_000).contains(&length) {
            return Err(PolicyError::Invalid(format!("curve length must be in [2, 1000000], got {length}")));
        }
        self.update_policy(name, "curve_length = ?2", params![name, length])
    }

    /// Declares a private table's privacy unit: the column identifying a unit and the bounds on
    /// its contribution (rows per release, groups per release).
    pub fn set_privacy_unit(
        &self,
        name: &str,
        column: &str,
        max_rows: i64,
        max_groups: i64,
    ) -> Result<(), PolicyError> {
        if !(1..=1_000_000).contains(&max_rows) || !(1..=100_000).contains(&max_groups) {
            return Err(PolicyError::Invalid(format!(
                "--max-rows must be in [1, 1000000] and --max-groups in [1, 100000], got {max_rows} and {max_groups}"
            )));
        }
        self.update_policy(
            name,
            "unit_column = ?2, unit_max_rows = ?3, unit_max_groups = ?4",
            params![name, column, max_rows, max_groups],
        )
    }

    /// Declares the most rows a private table's files hold together (module docs of
    /// `guard::exec::public_facts`): a public bound the data owner chooses, not the count; None
    /// withdraws the declaration.
    pub fn set_row_bound(&self, name: &str, rows: Option<i64>) -> Result<(), PolicyError> {
        if let Some(rows) = rows.filter(|r| !(1..=MAX_ROW_BOUND).contains(r)) {
            return Err(PolicyError::Invalid(format!("the row bound must be in [1, {MAX_ROW_BOUND}], got {rows}")));
        }
        self.update_policy(name, "row_bound = ?2", params![name, rows])
    }

    /// Declares the public group keys of a private table's column (replacing earlier ones; an
    /// empty list removes the declaration). Values are stored as given; the caller checks
    /// that they parse as the column's type.
    pub fn set_keys(&self, name: &str, column: &str, values: &[String]) -> Result<(), PolicyError> {
        if values.len() > MAX_KEYS {
            return Err(PolicyError::Invalid(format!("at most {MAX_KEYS} keys per column, got {}", values.len())));
        }
        if let Some(v) = values.iter().find(|v| v.len() > 1024) {
            return Err(PolicyError::Invalid(format!("keys are limited to 1024 bytes, got one of {}", v.len())));
        }
        self.with_policy_tx(name, |tx| {
            tx.execute("DELETE FROM group_keys WHERE table_name = ?1 AND column_name = ?2", params![name, column])
                .map_err(storage)?;
            for v in values {
                tx.execute("INSERT OR IGNORE INTO group_keys VALUES (?1, ?2, ?3)", params![name, column, v])
                    .map_err(storage)?;
            }
            Ok(())
        })
    }

    /// The memory limit of analyst sessions on this catalog, in bytes (the default,
    /// [`DEFAULT_MEMORY_LIMIT`], unless the data owner set another).
    pub fn memory_limit(&self) -> Result<u64, PolicyError> {
        let conn = self.conn.lock().expect("catalog lock");
        let v: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'memory_limit'", [], |r| r.get(0))
            .optional()
            .map_err(storage)?;
        Ok(v.and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_MEMORY_LIMIT))
    }

    /// Sets the memory limit of analyst sessions (bytes, in [64 MiB, 1 TiB]).
    pub fn set_memory_limit(&self, bytes: u64) -> Result<(), PolicyError> {
        if !(MIN_MEMORY_LIMIT..=MAX_MEMORY_LIMIT).contains(&bytes) {
            return Err(PolicyError::Invalid(format!(
                "the memory limit must be between 64 MiB and 1 TiB, got {bytes} bytes"
            )));
        }
        self.with_tx(|tx| {
            tx.execute("INSERT OR REPLACE INTO meta VALUES ('memory_limit', ?1)", [bytes.to_string()])
                .map_err(storage)?;
            Ok(())
        })
    }

    /// Checks, as a session opens, that every location is absolute and that no table reaches a
    /// private table's files (files can appear in a directory, and links be created, after
    /// registration — SPEC §5.2).
    pub fn check_locations(&self) -> Result<(), PolicyError> {
        let tables = self.tables()?;
        for t in &tables {
            if !Path::new(&t.location).is_absolute() {
                return Err(PolicyError::Catalog(format!(
                    "table '{}' has the relative location '{}' (written by an older dpcurve); the data owner \
                     must run `dpcurve admin --catalog … migrate-locations [BASE_DIR]` first",
                    t.name, t.location
                )));
            }
        }
        for t in &tables {
            if check_location_syntax(&t.location).is_err() {
                return Err(PolicyError::Catalog(format!(
                    "table '{}' has the location '{}', which DataFusion would read as a file pattern or URL \
                     (registered by an older dpcurve); analyst sessions stay closed until the data owner \
                     re-registers it under a plain path",
                    t.name, t.location
                )));
            }
        }
        for p in tables.iter().filter(|t| t.policy.is_some()) {
            for t in tables.iter().filter(|t| t.name != p.name) {
                if locations_overlap(&t.location, &p.location) {
                    return Err(PolicyError::Catalog(format!(
                        "table '{}' ({}) reaches files of private table '{}' ({}) — a file or symbolic link \
                         added since registration? Analyst sessions stay closed until the data owner fixes it",
                        t.name, t.location, p.name, p.location
                    )));
                }
            }
        }
        Ok(())
    }

    /// Tables whose stored location is relative (catalogs written before locations were
    /// canonical): (name, location).
    pub fn relative_locations(&self) -> Result<Vec<(String, String)>, PolicyError> {
        Ok(self
            .tables()?
            .into_iter()
            .filter(|t| !Path::new(&t.location).is_absolute())
            .map(|t| (t.name, t.location))
            .collect())
    }

    /// Replaces a table's stored location by `canonical` (migration of relative locations),
    /// refusing if it would reach a private table's files.
    pub fn relocate(&self, name: &str, canonical: &str) -> Result<(), PolicyError> {
        check_location_syntax(canonical)?;
        self.with_tx(|tx| {
            let all = Self::locations(tx)?;
            let Some((_, _, private)) = all.iter().find(|(n, _, _)| n == name) else {
                return Err(PolicyError::Invalid(format!("no table named '{name}'")));
            };
            for (other, loc, other_private) in &all {
                if other != name && (*private || *other_private) && locations_overlap(canonical, loc) {
                    return Err(PolicyError::Invalid(format!(
                        "{canonical} shares files with table '{other}' ({loc}); a private table's files must be \
                         reachable through it alone"
                    )));
                }
            }
            tx.execute("UPDATE tables SET location = ?2 WHERE name = ?1", params![name, canonical]).map_err(storage)?;
            Ok(())
        })
    }

    /// All registered tables with their policies, by name.
    pub fn tables(&self) -> Result<Vec<TableInfo>, PolicyError> {
        let conn = self.conn.lock().expect("catalog lock");
        let mut stmt = conn
            .prepare(
                "SELECT t.name, t.location, t.private, p.epsilon_total, p.delta_total, p.epsilon_spent,
                        p.delta_spent, p.curve_length, p.unit_column, p.unit_max_rows, p.unit_max_groups,
                        p.row_bound
                 FROM tables t LEFT JOIN policies p ON p.table_name = t.name ORDER BY t.name",
            )
            .map_err(storage)?;
        let rows = stmt
            .query_map([], |r| {
                let private: i64 = r.get(2)?;
                let policy = if private == 1 {
                    Some(Policy {
                        total: Budget { epsilon_units: r.get(3)?, delta_units: r.get(4)? },
                        spent: Budget { epsilon_units: r.get(5)?, delta_units: r.get(6)? },
                        bounds: BTreeMap::new(),
                        curve_length: r.get(7)?,
                        keys: BTreeMap::new(),
                        unit: match r.get::<_, Option<String>>(8)? {
                            Some(column) => Some(PrivacyUnit {
                                column,
                                max_rows: r.get(9)?,
                                max_groups: r.get::<_, Option<i64>>(10)?.unwrap_or(1),
                            }),
                            None => None,
                        },
                        row_bound: r.get::<_, Option<i64>>(11)?.and_then(|n| u64::try_from(n).ok()),
                        verified: None,
                    })
                } else {
                    None
                };
                Ok(TableInfo { name: r.get(0)?, location: r.get(1)?, policy })
            })
            .map_err(storage)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(storage)?;
        let mut bounds_stmt =
            conn.prepare("SELECT table_name, column_name, lower, upper FROM column_bounds").map_err(storage)?;
        let bounds: Vec<(String, String, f64, f64)> = bounds_stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(storage)?
            .collect::<Result<_, _>>()
            .map_err(storage)?;
        let mut tables = rows;
        for (t, c, lo, hi) in bounds {
            if let Some(p) = tables.iter_mut().find(|x| x.name == t).and_then(|x| x.policy.as_mut()) {
                p.bounds.insert(c, (lo, hi));
            }
        }
        let mut keys_stmt = conn
            .prepare("SELECT table_name, column_name, value FROM group_keys ORDER BY table_name, column_name, value")
            .map_err(storage)?;
        let keys: Vec<(String, String, String)> = keys_stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(storage)?
            .collect::<Result<_, _>>()
            .map_err(storage)?;
        for (t, c, v) in keys {
            if let Some(p) = tables.iter_mut().find(|x| x.name == t).and_then(|x| x.policy.as_mut()) {
                p.keys.entry(c).or_default().push(v);
            }
        }
        for t in &mut tables {
            if let Some(p) = t.policy.as_mut() {
                p.verified = verified::verified_files_of(&conn, &t.name)?;
            }
        }
        Ok(tables)
    }

    /// One table, if registered.
    pub fn table(&self, name: &str) -> Result<Option<TableInfo>, PolicyError> {
        Ok(self.tables()?.into_iter().find(|t| t.name == name))
    }
}

fn validate_name(name: &str) -> Result<(), PolicyError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(PolicyError::Invalid(format!(
            "table name '{name}' must start with a letter or '_' and contain only letters, digits and '_'"
        )))
    }
}

mod debits;
mod releases;
#[cfg(test)]
mod tests;
mod verified;

/// Tests: a path for a fresh catalog file named after `tag` (the file and its WAL removed).
#[cfg(test)]
pub(crate) fn fresh_test_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("dpcurve-cat-{tag}-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", p.display()));
    }
    p
}
