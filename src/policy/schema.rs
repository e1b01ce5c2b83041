//! The catalog's SQL: the schema of the current format, and the upgrade from each older format
//! to the next (each ends by writing its version into `meta`).

/// The tables the data owner's configuration fills (tables, budgets, bounds, keys, analysts and
/// their shares): every open checks their pages. The logs (statements, releases, stored releases,
/// kept results) grow with use and are checked page by page only by the data owner's opens.
pub(crate) const POLICY_TABLES: [&str; 9] =
    ["meta", "tables", "policies", "column_bounds", "group_keys", "analysts", "grants", "verified", "verified_files"];

/// The queries whose executions were charged (format 5, [`super::query_log`]): each statement's
/// bounded head, once per execution, in the schema and in the upgrade from format 4.
macro_rules! queries_table {
    () => {
        "
CREATE TABLE queries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    analyst TEXT,
    head TEXT NOT NULL,
    length INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    ticket BLOB
);
CREATE INDEX queries_ticket ON queries(ticket) WHERE ticket IS NOT NULL;
"
    };
}

/// The stored releases' table (format 3), in the schema and in the upgrade from format 2.
macro_rules! stored_releases_table {
    () => {
        "
CREATE TABLE stored_releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    charge_id INTEGER NOT NULL REFERENCES releases(id),
    at TEXT NOT NULL,
    table_name TEXT NOT NULL,
    function TEXT NOT NULL,
    parameters TEXT NOT NULL,
    data BLOB NOT NULL
);
"
    };
}

/// The results of paid executions a server kept (format 6), in the schema and in the upgrade
/// from format 5: the Arrow IPC stream of the rows the analyst was sent, read again for free.
macro_rules! query_results_table {
    () => {
        "
CREATE TABLE query_results (
    query_id INTEGER PRIMARY KEY REFERENCES queries(id),
    at TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    data BLOB NOT NULL
);
"
    };
}

/// The files of private tables as their last verification read them whole (format 8,
/// [`super::verified_files`]): a table verified with no files has its mark in `verified`.
macro_rules! verified_files_table {
    () => {
        "
CREATE TABLE verified (
    table_name TEXT PRIMARY KEY REFERENCES tables(name),
    at TEXT NOT NULL
);
CREATE TABLE verified_files (
    table_name TEXT NOT NULL REFERENCES verified(table_name),
    path TEXT NOT NULL,
    size INTEGER NOT NULL CHECK (size >= 0),
    modified_ns INTEGER NOT NULL,
    PRIMARY KEY (table_name, path)
);
"
    };
}

/// Analysts and their shares of private tables' budgets (format 4), in the schema
/// and in the upgrade from format 3.
macro_rules! analysts_tables {
    () => {
        "
CREATE TABLE analysts (
    name TEXT PRIMARY KEY,
    salt BLOB NOT NULL,
    token_hash BLOB,
    added_at TEXT NOT NULL,
    removed_at TEXT
);
CREATE TABLE grants (
    analyst TEXT NOT NULL REFERENCES analysts(name),
    table_name TEXT NOT NULL REFERENCES tables(name),
    epsilon_total INTEGER NOT NULL CHECK (epsilon_total >= 0),
    delta_total INTEGER NOT NULL CHECK (delta_total >= 0),
    epsilon_spent INTEGER NOT NULL DEFAULT 0 CHECK (epsilon_spent >= 0),
    delta_spent INTEGER NOT NULL DEFAULT 0 CHECK (delta_spent >= 0),
    PRIMARY KEY (analyst, table_name)
);
"
    };
}

pub(super) const SCHEMA: &str = concat!(
    "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE tables (
    name TEXT PRIMARY KEY,
    location TEXT NOT NULL,
    private INTEGER NOT NULL DEFAULT 0 CHECK (private IN (0, 1)),
    registered_at TEXT NOT NULL
);
CREATE TABLE policies (
    table_name TEXT PRIMARY KEY REFERENCES tables(name),
    epsilon_total INTEGER NOT NULL CHECK (epsilon_total >= 0),
    delta_total INTEGER NOT NULL CHECK (delta_total >= 0),
    epsilon_spent INTEGER NOT NULL DEFAULT 0 CHECK (epsilon_spent >= 0 AND epsilon_spent <= epsilon_total),
    delta_spent INTEGER NOT NULL DEFAULT 0 CHECK (delta_spent >= 0 AND delta_spent <= delta_total),
    curve_length INTEGER,
    unit_column TEXT,
    unit_max_rows INTEGER CHECK (unit_max_rows >= 1),
    unit_max_groups INTEGER CHECK (unit_max_groups >= 1),
    row_bound INTEGER CHECK (row_bound >= 1)
);
CREATE TABLE column_bounds (
    table_name TEXT NOT NULL REFERENCES tables(name),
    column_name TEXT NOT NULL,
    lower REAL NOT NULL,
    upper REAL NOT NULL,
    PRIMARY KEY (table_name, column_name)
);
CREATE TABLE group_keys (
    table_name TEXT NOT NULL REFERENCES tables(name),
    column_name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (table_name, column_name, value)
);
",
    queries_table!(),
    "CREATE TABLE releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    table_name TEXT NOT NULL,
    function TEXT NOT NULL,
    epsilon INTEGER NOT NULL,
    delta INTEGER NOT NULL,
    analyst TEXT,
    query_id INTEGER REFERENCES queries(id)
);
",
    stored_releases_table!(),
    analysts_tables!(),
    query_results_table!(),
    verified_files_table!()
);

/// Upgrades a format-7 catalog (before verified files) to format 8: no private table is verified
/// yet, so none can be queried until `dpcurve admin verify` reads its files whole.
pub(super) const UPGRADE_7_TO_8: &str =
    concat!(verified_files_table!(), "UPDATE meta SET value = '8' WHERE key = 'version';\n");

/// Upgrades a format-6 catalog (before declared row bounds) to format 7: no table declares one.
pub(super) const UPGRADE_6_TO_7: &str = "
ALTER TABLE policies ADD COLUMN row_bound INTEGER CHECK (row_bound >= 1);
UPDATE meta SET value = '7' WHERE key = 'version';
";

/// Upgrades a format-5 catalog (before kept results) to format 6.
pub(super) const UPGRADE_5_TO_6: &str =
    concat!(query_results_table!(), "UPDATE meta SET value = '6' WHERE key = 'version';\n");

/// Upgrades a format-3 catalog (before analysts) to format 4: releases made so far were the
/// table owner's sessions' (analyst NULL).
pub(super) const UPGRADE_3_TO_4: &str = concat!(
    "ALTER TABLE releases ADD COLUMN analyst TEXT;\n",
    analysts_tables!(),
    "UPDATE meta SET value = '4' WHERE key = 'version';\n"
);

/// Upgrades a format-4 catalog (whole statement text in every release row) to format 5: each
/// old row's text moves to a `queries` row of its own, whole (it was written whole).
pub(super) const UPGRADE_4_TO_5: &str = concat!(
    queries_table!(),
    "ALTER TABLE releases ADD COLUMN query_id INTEGER REFERENCES queries(id);
INSERT INTO queries (id, at, analyst, head, length, sha256)
    SELECT id, at, analyst, query, length(CAST(query AS BLOB)), '' FROM releases;
UPDATE releases SET query_id = id;
ALTER TABLE releases DROP COLUMN query;
UPDATE meta SET value = '5' WHERE key = 'version';
"
);

/// Upgrades a format-2 catalog (before stored releases) to format 3.
pub(super) const UPGRADE_2_TO_3: &str =
    concat!(stored_releases_table!(), "UPDATE meta SET value = '3' WHERE key = 'version';\n");

/// Upgrades a format-1 catalog (before declared group keys and privacy units) to format 2.
pub(super) const UPGRADE_1_TO_2: &str = "
ALTER TABLE policies ADD COLUMN unit_column TEXT;
ALTER TABLE policies ADD COLUMN unit_max_rows INTEGER CHECK (unit_max_rows >= 1);
ALTER TABLE policies ADD COLUMN unit_max_groups INTEGER CHECK (unit_max_groups >= 1);
CREATE TABLE group_keys (
    table_name TEXT NOT NULL REFERENCES tables(name),
    column_name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (table_name, column_name, value)
);
UPDATE meta SET value = '2' WHERE key = 'version';
";
