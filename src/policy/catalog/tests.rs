//! Tests of the catalog and ledger.

use super::*;
use crate::policy::QueryRecord;

/// The release log of formats 1–4 (the whole statement in every row).
const V4_RELEASES: &str = "CREATE TABLE releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    table_name TEXT NOT NULL,
    function TEXT NOT NULL,
    epsilon INTEGER NOT NULL,
    delta INTEGER NOT NULL,
    query TEXT NOT NULL,
    analyst TEXT
);
";

/// Turns a current catalog into the format-4 layout (with foreign keys off).
const TO_FORMAT_4: &str = "PRAGMA foreign_keys = OFF; DROP TABLE verified_files; DROP TABLE verified; ALTER TABLE policies DROP COLUMN row_bound; DROP TABLE query_results; CREATE TABLE r4 (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, \
        table_name TEXT NOT NULL, function TEXT NOT NULL, epsilon INTEGER NOT NULL, delta INTEGER NOT NULL, \
        query TEXT NOT NULL, analyst TEXT); \
        INSERT INTO r4 SELECT r.id, r.at, r.table_name, r.function, r.epsilon, r.delta, q.head, r.analyst \
        FROM releases r JOIN queries q ON q.id = r.query_id; \
        DROP TABLE releases; DROP TABLE queries; ALTER TABLE r4 RENAME TO releases; \
        UPDATE meta SET value = '4' WHERE key = 'version';";

fn temp(name: &str) -> PathBuf {
    fresh_test_path(name)
}

fn b(e: f64, d: f64) -> Budget {
    Budget::total(e, d).unwrap()
}

#[test]
fn ten_charges_of_a_tenth_exhaust_one_exactly() {
    let p = temp("exact");
    let c = Catalog::create_or_open(&p).unwrap();
    c.register_table("t", "/data/t.parquet").unwrap();
    c.make_private("t", b(1.0, 1e-5)).unwrap();
    let charge = Charge { table: "t".into(), function: "private_kde".into(), cost: Budget::charge(0.1, 1e-6).unwrap() };
    for _ in 0..10 {
        c.charge(std::slice::from_ref(&charge), "q").unwrap();
    }
    let err = c.charge(std::slice::from_ref(&charge), "q").unwrap_err();
    assert!(matches!(&err, PolicyError::BudgetExhausted { remaining, .. } if *remaining == Budget::ZERO), "{err}");
    assert!(err.to_string().contains("this query costs ε = 0.1, δ = 0.000001 but only ε = 0, δ = 0 remains"), "{err}");
    let t = c.table("t").unwrap().unwrap();
    assert_eq!(t.policy.unwrap().spent, b(1.0, 1e-5));
    assert_eq!(c.release_log(Some("t")).unwrap().len(), 10);
}

#[test]
fn a_refused_query_debits_nothing_on_any_table() {
    let p = temp("atomic");
    let c = Catalog::create_or_open(&p).unwrap();
    for (t, e) in [("a", 1.0), ("b", 0.05)] {
        c.register_table(t, &format!("/data/{t}.parquet")).unwrap();
        c.make_private(t, b(e, 1e-5)).unwrap();
    }
    let cost = Budget::charge(0.1, 1e-6).unwrap();
    let charges = [
        Charge { table: "a".into(), function: "f".into(), cost },
        Charge { table: "b".into(), function: "f".into(), cost },
    ];
    assert!(c.charge(&charges, "q").is_err());
    for t in c.tables().unwrap() {
        assert_eq!(t.policy.unwrap().spent, Budget::ZERO);
    }
    assert!(c.release_log(None).unwrap().is_empty());
}

#[test]
fn locations_overlap_by_path_components() {
    assert!(locations_overlap("/d/p.parquet", "/d/p.parquet"));
    assert!(locations_overlap("/d", "/d/p.parquet"));
    assert!(locations_overlap("/d/sub/p.parquet", "/d"));
    assert!(!locations_overlap("/d/p.parquet", "/d/p.parquet2"));
    assert!(!locations_overlap("/data/a", "/data/ab"));
}

#[test]
fn policies_bounds_and_reopening() {
    let p = temp("reopen");
    {
        let c = Catalog::create_or_open(&p).unwrap();
        c.register_table("t", "/x").unwrap();
        assert!(c.register_table("t", "/y").is_err());
        assert!(c.register_table("bad name", "/y").is_err());
        assert!(c.set_bounds("t", "x", 0.0, 1.0).is_err(), "public tables have no policy");
        c.make_private("t", b(1.0, 0.0)).unwrap();
        assert!(c.make_private("t", b(1.0, 0.0)).is_err());
        c.set_bounds("t", "x", -1.0, 2.0).unwrap();
        c.set_bounds("t", "x", 0.0, 1.0).unwrap();
        assert!(c.set_bounds("t", "x", 1.0, 1.0).is_err());
        // Bounds every call would refuse as its range are refused here, with the rule.
        for (lo, hi) in [(-1e200, 1e200), (0.0, 1e-200)] {
            let err = c.set_bounds("t", "x", lo, hi).unwrap_err().to_string();
            assert!(err.contains("within ±1e100 and at least 1e-100 apart"), "{err}");
        }
        c.set_bounds("t", "x", -1e100, 1e100).unwrap();
        c.set_bounds("t", "x", 0.0, 1.0).unwrap();
        c.set_curve_length("t", 100).unwrap();
        // The declared row bound: in range, on a private table, replaced by the next declaration.
        for bad in [0, -5, MAX_ROW_BOUND + 1] {
            let err = c.set_row_bound("t", Some(bad)).unwrap_err().to_string();
            assert!(err.contains("the row bound must be in [1, 9007199254740992]"), "{err}");
        }
        c.set_row_bound("t", Some(10)).unwrap();
        c.set_row_bound("t", None).unwrap();
        assert_eq!(c.table("t").unwrap().unwrap().policy.unwrap().row_bound, None);
        c.set_row_bound("t", Some(1_000_000)).unwrap();
        assert!(c.set_row_bound("nope", Some(10)).is_err());
        assert_eq!(c.raise_budget("t", b(0.5, 1e-6)).unwrap(), b(1.5, 1e-6));
        assert!(c.raise_budget("nope", b(0.5, 0.0)).is_err());
    }
    let c = Catalog::open(&p).unwrap();
    let t = c.table("t").unwrap().unwrap();
    let policy = t.policy.unwrap();
    assert_eq!(policy.total, b(1.5, 1e-6));
    assert_eq!(policy.bounds.get("x"), Some(&(0.0, 1.0)));
    assert_eq!(policy.curve_length, Some(100));
    assert_eq!(policy.row_bound, Some(1_000_000));
}

/// Analyst sessions (and the server) open a catalog at a cost that does not grow with its logs:
/// they check its header, schema, format and policy tables, not the pages of the release log or
/// the kept results; the data owner's opens run SQLite's quick_check of every page. Shown with a
/// damaged page of a large kept result: the analyst's open succeeds (it did not read that page)
/// and the data owner's is refused; undamaged, both open. (Damage in a policy table is refused by
/// both: `foreign_corrupt_and_other_version_files_are_refused`.)
#[test]
fn only_the_data_owners_open_reads_the_logs_pages() {
    let path = temp("damaged-log-page");
    {
        let c = Catalog::create_or_open(&path).unwrap();
        c.register_table("p", "/data/p.parquet").unwrap();
        c.make_private("p", b(10.0, 0.0)).unwrap();
        c.add_analyst("alice").unwrap();
        c.grant("alice", "p", b(5.0, 0.0)).unwrap();
        let kde = Charge { table: "p".into(), function: "private_kde".into(), cost: b(0.5, 0.0) };
        let ticket = [7u8; 16];
        let record = QueryRecord::of("SELECT private_kde(x) FROM p").for_ticket(&ticket);
        c.charge_reserving(std::slice::from_ref(&kde), &record, Some("alice"), 1).unwrap();
        c.store_result("alice", &ticket, &vec![0x5a; 1 << 20]).unwrap().unwrap();
    }
    Connection::open(&path).unwrap().execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let page: i64 = Connection::open(&path).unwrap().query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    let page = page as usize;
    let intact = std::fs::read(&path).unwrap();
    let pages = intact.len() / page;
    assert!(pages > 200, "{pages} pages");
    // An overflow page of the kept result in the middle of the file: its next-page pointer out of range.
    let mut damaged = intact.clone();
    let at = (pages / 2) * page;
    damaged[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    std::fs::write(&path, &damaged).unwrap();
    let analyst = Catalog::open(&path);
    assert!(analyst.is_ok(), "{:?}", analyst.err());
    drop(analyst);
    let owner = Catalog::create_or_open(&path).unwrap_err().to_string();
    assert!(owner.contains("integrity check failed"), "{owner}");
    // Control: the same file undamaged passes the data owner's check.
    std::fs::write(&path, &intact).unwrap();
    assert!(Catalog::create_or_open(&path).is_ok());
}

/// An analyst's open only reads: it succeeds while another process holds the write lock (a debit
/// being committed), instead of waiting for it; the data owner's open needs the lock.
#[test]
fn an_analysts_open_does_not_wait_for_the_write_lock() {
    let path = temp("locked");
    drop(Catalog::create_or_open(&path).unwrap());
    let writer = Connection::open(&path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    let opened = Catalog::open(&path);
    assert!(opened.is_ok(), "{:?}", opened.err());
    writer.execute_batch("COMMIT").unwrap();
}

#[test]
fn foreign_corrupt_and_other_version_files_are_refused() {
    let missing = temp("missing");
    assert!(Catalog::open(&missing).unwrap_err().to_string().contains("no catalog at"));

    let garbage = temp("garbage");
    std::fs::write(&garbage, vec![b'x'; 8192]).unwrap();
    let e = Catalog::open(&garbage).unwrap_err().to_string();
    assert!(e.contains("is not a usable dpcurve catalog") && e.contains("corrupted"), "{e}");

    let foreign = temp("foreign");
    Connection::open(&foreign).unwrap().execute_batch("CREATE TABLE x (a INTEGER)").unwrap();
    let before = std::fs::read(&foreign).unwrap();
    let e = Catalog::open(&foreign).unwrap_err().to_string();
    assert!(e.contains("no dpcurve metadata"), "{e}");
    let e = Catalog::create_or_open(&foreign).unwrap_err().to_string();
    assert!(e.contains("no dpcurve metadata"), "{e}");
    // Refused files are not modified: not switched to WAL, not grown.
    assert_eq!(std::fs::read(&foreign).unwrap(), before, "a foreign database was modified");
    let empty = temp("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(Catalog::open(&empty).unwrap_err().to_string().contains("the file is empty"));
    assert!(Catalog::create_or_open(&empty).unwrap_err().to_string().contains("the file is empty"));
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "an empty file grew");
    assert!(std::fs::read(&garbage).unwrap().iter().all(|b| *b == b'x'));

    let old = temp("old");
    drop(Catalog::create_or_open(&old).unwrap());
    Connection::open(&old).unwrap().execute("UPDATE meta SET value = '0' WHERE key = 'version'", []).unwrap();
    let e = Catalog::open(&old).unwrap_err().to_string();
    assert!(e.contains("written by an older version of dpcurve (catalog format 0)"), "{e}");

    // Format 1 (before group keys): analysts refuse it unmodified; the data owner's open upgrades it.
    let v1 = temp("v1");
    {
        // The format-1 schema as dpcurve wrote it before group keys and privacy units.
        let conn = Connection::open(&v1).unwrap();
        let v1_schema = SCHEMA
                .replace(",\n    row_bound INTEGER CHECK (row_bound >= 1)", "")
                .replace(",\n    unit_column TEXT,\n    unit_max_rows INTEGER CHECK (unit_max_rows >= 1),\n    unit_max_groups INTEGER CHECK (unit_max_groups >= 1)", "")
                .replace(
                    "CREATE TABLE group_keys (\n    table_name TEXT NOT NULL REFERENCES tables(name),\n    column_name TEXT NOT NULL,\n    value TEXT NOT NULL,\n    PRIMARY KEY (table_name, column_name, value)\n);\n",
                    "",
                );
        let v1_schema = v1_schema[..v1_schema.find("CREATE TABLE queries").unwrap()].to_string()
            + &V4_RELEASES.replace(",\n    analyst TEXT\n", "\n");
        assert!(!v1_schema.contains("unit_column") && !v1_schema.contains("group_keys"));
        conn.execute_batch(&v1_schema).unwrap();
        conn.execute("INSERT INTO meta VALUES ('format', ?1), ('version', '1')", [FORMAT_NAME]).unwrap();
        conn.execute("INSERT INTO tables VALUES ('t', '/data/t.parquet', 0, 'then')", []).unwrap();
    }
    let e = Catalog::open(&v1).unwrap_err().to_string();
    assert!(e.contains("catalog format 1") && e.contains("any `dpcurve admin` command upgrades it"), "{e}");
    let c = Catalog::create_or_open(&v1).unwrap();
    assert_eq!(c.tables().unwrap()[0].location, "/data/t.parquet");
    c.make_private("t", Budget::total(1.0, 0.0).unwrap()).unwrap();
    c.set_keys("t", "g", &["a".into(), "b".into()]).unwrap();
    c.set_privacy_unit("t", "person", 3, 1).unwrap();
    drop(c);
    let t = &Catalog::open(&v1).unwrap().tables().unwrap()[0];
    assert_eq!(t.policy.as_ref().unwrap().keys["g"], vec!["a".to_string(), "b".to_string()]);
    assert_eq!(t.policy.as_ref().unwrap().unit.as_ref().unwrap().max_rows, 3);

    // Format 2 (before stored releases): the same, and the upgrade adds the release store.
    let v2 = temp("v2");
    drop(Catalog::create_or_open(&v2).unwrap());
    Connection::open(&v2)
        .unwrap()
        .execute_batch(&format!(
            "{TO_FORMAT_4} DROP TABLE stored_releases; DROP TABLE grants; DROP TABLE analysts; \
                     ALTER TABLE releases DROP COLUMN analyst; UPDATE meta SET value = '2' WHERE key = 'version';"
        ))
        .unwrap();
    let e = Catalog::open(&v2).unwrap_err().to_string();
    assert!(e.contains("catalog format 2") && e.contains("upgrades it to format 8"), "{e}");
    let c = Catalog::create_or_open(&v2).unwrap();
    c.register_table("p", "/data/p.parquet").unwrap();
    c.make_private("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
    let cost = Budget::charge(0.5, 0.0).unwrap();
    let ids = c.charge(&[Charge { table: "p".into(), function: "private_kde".into(), cost }], "q").unwrap();
    let id = c.store_release(None, ids[0], "p", "private_kde", "{}", &[1, 2, 3]).unwrap();
    drop(c);
    let c = Catalog::open(&v2).unwrap();
    assert_eq!(c.stored_release(&id).unwrap().unwrap().2, vec![1, 2, 3]);
    assert_eq!(c.stored_releases(Some("p")).unwrap()[0].cost, cost);
    assert_eq!(c.stored_release("r999").unwrap(), None);
    assert_eq!(c.stored_release("x1").unwrap(), None);
    drop(c);

    // Format 3 (before analysts): its releases stay the owner's; the upgrade adds analysts.
    let v3 = temp("v3");
    {
        let c = Catalog::create_or_open(&v3).unwrap();
        c.register_table("p", "/data/p.parquet").unwrap();
        c.make_private("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
        c.charge(&[Charge { table: "p".into(), function: "private_kde".into(), cost }], "q").unwrap();
    }
    Connection::open(&v3)
        .unwrap()
        .execute_batch(&format!(
            "{TO_FORMAT_4} DROP TABLE grants; DROP TABLE analysts; ALTER TABLE releases DROP COLUMN \
                     analyst; UPDATE meta SET value = '3' WHERE key = 'version';"
        ))
        .unwrap();
    let e = Catalog::open(&v3).unwrap_err().to_string();
    assert!(e.contains("catalog format 3") && e.contains("upgrades it to format 8"), "{e}");
    let c = Catalog::create_or_open(&v3).unwrap();
    c.add_analyst("alice").unwrap();
    c.grant("alice", "p", Budget::total(1.0, 0.0).unwrap()).unwrap();
    c.charge_as(&[Charge { table: "p".into(), function: "private_kde".into(), cost }], "q", Some("alice")).unwrap();
    let who: Vec<Option<String>> = c.release_log(None).unwrap().into_iter().map(|r| r.analyst).collect();
    assert_eq!(who, vec![None, Some("alice".to_string())]);

    // Format 4 (the whole statement in every release row): each row's text moves to `queries`.
    let v4 = temp("v4");
    {
        let c = Catalog::create_or_open(&v4).unwrap();
        c.register_table("p", "/data/p.parquet").unwrap();
        c.make_private("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
        let kde = Charge { table: "p".into(), function: "private_kde".into(), cost };
        let ids = c.charge(&[kde.clone(), kde], "SELECT old").unwrap();
        c.store_release(None, ids[1], "p", "private_kde", "{}", &[7]).unwrap();
    }
    Connection::open(&v4).unwrap().execute_batch(TO_FORMAT_4).unwrap();
    let e = Catalog::open(&v4).unwrap_err().to_string();
    assert!(e.contains("catalog format 4") && e.contains("upgrades it to format 8"), "{e}");
    let c = Catalog::create_or_open(&v4).unwrap();
    let log = c.release_log(None).unwrap();
    assert_eq!(log.iter().map(|r| r.query.as_str()).collect::<Vec<_>>(), ["SELECT old", "SELECT old"]);
    assert_eq!(c.stored_releases(None).unwrap()[0].query, "SELECT old");
    c.raise_budget("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
    c.charge(&[Charge { table: "p".into(), function: "private_kde".into(), cost }], "SELECT new").unwrap();
    assert_eq!(c.release_log(None).unwrap().last().unwrap().query, "SELECT new");

    // Format 5 (before kept results): the upgrade adds them; earlier releases keep their executions.
    let v5 = temp("v5");
    {
        let c = Catalog::create_or_open(&v5).unwrap();
        c.register_table("p", "/data/p.parquet").unwrap();
        c.make_private("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
        let ids = c.charge(&[Charge { table: "p".into(), function: "private_kde".into(), cost }], "q5").unwrap();
        c.store_release(None, ids[0], "p", "private_kde", "{}", &[5]).unwrap();
    }
    Connection::open(&v5)
        .unwrap()
        .execute_batch(
            "DROP TABLE verified_files; DROP TABLE verified; ALTER TABLE policies DROP COLUMN row_bound; \
             DROP TABLE query_results; UPDATE meta SET value = '5' WHERE \
             key = 'version';",
        )
        .unwrap();
    let e = Catalog::open(&v5).unwrap_err().to_string();
    assert!(e.contains("catalog format 5") && e.contains("upgrades it to format 8"), "{e}");
    let c = Catalog::create_or_open(&v5).unwrap();
    let old = &c.stored_releases(None).unwrap()[0];
    assert_eq!((old.query.as_str(), old.statement_sha256.len()), ("q5", 64));
    assert!(c.stored_results_of(None).unwrap().is_empty());

    // Format 6 (before declared row bounds): the upgrade keeps the policy and declares none.
    let v6 = temp("v6");
    {
        let c = Catalog::create_or_open(&v6).unwrap();
        c.register_table("p", "/data/p.parquet").unwrap();
        c.make_private("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
        c.set_curve_length("p", 7).unwrap();
    }
    Connection::open(&v6)
        .unwrap()
        .execute_batch(
            "DROP TABLE verified_files; DROP TABLE verified; ALTER TABLE policies DROP COLUMN row_bound; \
             UPDATE meta SET value = '6' WHERE key = 'version';",
        )
        .unwrap();
    let e = Catalog::open(&v6).unwrap_err().to_string();
    assert!(e.contains("catalog format 6") && e.contains("upgrades it to format 8"), "{e}");
    let c = Catalog::create_or_open(&v6).unwrap();
    let policy = c.table("p").unwrap().unwrap().policy.unwrap();
    assert_eq!((policy.curve_length, policy.row_bound), (Some(7), None));
    c.set_row_bound("p", Some(5)).unwrap();
    assert_eq!(Catalog::open(&v6).unwrap().table("p").unwrap().unwrap().policy.unwrap().row_bound, Some(5));

    // Format 7 (before verified files): the upgrade records no verification, so the private
    // table's files must be read whole before analysts query it; one recorded is kept.
    let v7 = temp("v7");
    {
        let c = Catalog::create_or_open(&v7).unwrap();
        c.register_table("p", "/data/p.parquet").unwrap();
        c.make_private("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
        c.set_row_bound("p", Some(9)).unwrap();
    }
    Connection::open(&v7)
        .unwrap()
        .execute_batch(
            "DROP TABLE verified_files; DROP TABLE verified; UPDATE meta SET value = '7' WHERE key = 'version';",
        )
        .unwrap();
    let e = Catalog::open(&v7).unwrap_err().to_string();
    assert!(e.contains("catalog format 7") && e.contains("upgrades it to format 8"), "{e}");
    let c = Catalog::create_or_open(&v7).unwrap();
    let policy = c.table("p").unwrap().unwrap().policy.unwrap();
    assert_eq!((policy.row_bound, policy.verified), (Some(9), None));
    assert_eq!(c.verified_files("p").unwrap(), None);
    let file = VerifiedFile { path: "data/p.parquet".into(), size: 12, modified_ns: 34 };
    c.record_verification("p", std::slice::from_ref(&file)).unwrap();
    assert_eq!(Catalog::open(&v7).unwrap().verified_files("p").unwrap(), Some(vec![file]));
    c.record_verification("p", &[]).unwrap();
    assert_eq!(c.verified_files("p").unwrap(), Some(vec![]), "verified with no files is not unverified");
    c.register_table("pub_t", "/data/pub.parquet").unwrap();
    assert!(c.record_verification("pub_t", &[]).unwrap_err().to_string().contains("is public"));

    // A valid catalog whose pages were damaged.
    let damaged = temp("damaged");
    {
        let c = Catalog::create_or_open(&damaged).unwrap();
        for i in 0..200 {
            c.register_table(&format!("t{i}"), &"/some/long/location/".repeat(20)).unwrap();
        }
    }
    let conn = Connection::open(&damaged).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    drop(conn);
    let mut bytes = std::fs::read(&damaged).unwrap();
    let len = bytes.len();
    for b in &mut bytes[len / 2..len / 2 + 3000] {
        *b = 0xA5;
    }
    std::fs::write(&damaged, bytes).unwrap();
    assert!(Catalog::open(&damaged).is_err());
}

#[test]
fn a_kept_result_belongs_to_the_execution_its_ticket_paid_for_and_to_its_analyst() {
    let c = Catalog::create_or_open(&temp("kept-results")).unwrap();
    c.register_table("p", "/data/p.parquet").unwrap();
    c.make_private("p", b(10.0, 0.0)).unwrap();
    for a in ["alice", "bob"] {
        c.add_analyst(a).unwrap();
        c.grant(a, "p", b(5.0, 0.0)).unwrap();
    }
    let kde = Charge { table: "p".into(), function: "private_kde".into(), cost: b(0.5, 0.0) };
    let (ticket, other) = ([7u8; 16], [8u8; 16]);
    let record = QueryRecord::of("SELECT private_kde(x) FROM p").for_ticket(&ticket);
    let (ids, _) = c.charge_reserving(std::slice::from_ref(&kde), &record, Some("alice"), 1).unwrap();
    let id = c.store_release(None, ids[0], "p", "private_kde", "{}", &[1]).unwrap();
    // Another ticket, or another analyst's claim on this one: nothing is kept.
    assert_eq!(c.store_result("alice", &other, b"x").unwrap(), None);
    assert_eq!(c.store_result("bob", &ticket, b"x").unwrap(), None);
    let execution = c.store_result("alice", &ticket, b"ipc bytes").unwrap().unwrap();
    // Kept once: a second store changes nothing.
    assert_eq!(c.store_result("alice", &ticket, b"other").unwrap(), Some(execution));
    assert_eq!(c.stored_result_of(execution, Some("alice")).unwrap().as_deref(), Some(&b"ipc bytes"[..]));
    assert_eq!(c.stored_result_of(execution, None).unwrap().as_deref(), Some(&b"ipc bytes"[..]));
    assert_eq!(c.stored_result_of(execution, Some("bob")).unwrap(), None, "another analyst's");
    assert_eq!(c.stored_result_of(execution + 1, Some("alice")).unwrap(), None);
    let listed = c.stored_results_of(Some("alice")).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].execution, listed[0].bytes), (execution, 9));
    assert_eq!(listed[0].statement_sha256, record.sha256_hex());
    assert!(c.stored_results_of(Some("bob")).unwrap().is_empty());
    // The release names the same execution and statement.
    let r = c.stored_releases_of(None, Some("alice")).unwrap();
    assert_eq!((r[0].release.as_str(), r[0].execution), (id.as_str(), execution));
    assert_eq!(r[0].statement_sha256, record.sha256_hex());
}
