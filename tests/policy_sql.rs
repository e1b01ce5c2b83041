//! Private tables through real SQL: the shape rules of SPEC §5 (one test each), pricing
//! and exact budget arithmetic (SPEC §4), the gate, and analyst-session refusals.

mod common;

use std::sync::Arc;

use common::{TempDir, mixture, write_x};
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

struct Fixture {
    dir: TempDir,
    admin: Admin,
}

fn write_xy(path: &std::path::Path, n: usize) {
    let schema =
        Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true), Field::new("g", DataType::Int64, false)]));
    let xs = mixture(n, 21);
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(datafusion::arrow::array::Float64Array::from(xs)),
            Arc::new(datafusion::arrow::array::Int64Array::from_iter_values((0..n as i64).map(|i| i % 3))),
        ],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// A catalog with private tables `p` (x, g; bounds on x) and `q` (x), and public `pub_t`.
async fn fixture(tag: &str, p_budget: (f64, f64)) -> Fixture {
    let dir = TempDir::new(tag);
    write_xy(&dir.path("p.parquet"), 2_000);
    let q: Vec<Option<f64>> = mixture(500, 22).into_iter().map(Some).collect();
    write_x(&dir.path("q.parquet"), &q);
    write_xy(&dir.path("pub.parquet"), 300);
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("p", &dir.str("p.parquet")).await.unwrap();
    admin.register("q", &dir.str("q.parquet")).await.unwrap();
    admin.register("pub_t", &dir.str("pub.parquet")).await.unwrap();
    admin.make_private("p", p_budget.0, p_budget.1).await.unwrap();
    admin.make_private("q", 10.0, 1e-4).await.unwrap();
    admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();
    Fixture { dir, admin }
}

impl Fixture {
    async fn analyst(&self) -> AnalystSession {
        AnalystSession::open(
            &self.dir.path("catalog.db"),
            SessionOptions { noise: NoiseSource::Os, ..Default::default() },
        )
        .await
        .unwrap()
    }

    fn spent(&self, table: &str) -> Budget {
        self.admin.tables().unwrap().into_iter().find(|t| t.name == table).unwrap().policy.unwrap().spent
    }

    fn releases(&self) -> usize {
        self.admin.release_log(None).unwrap().len()
    }
}

const KDE: &str = "private_kde(x, 0.05, 0.1, 1e-6, 0, 1, 64, mechanism => 'gaussian')";

/// Asserts that `sql` fails at planning with a message containing `rule`, and that
/// nothing was charged.
async fn rejected(sql: &str, rule: &str) {
    let f = fixture("shape", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    let err = s.query(sql).await.expect_err(sql).to_string();
    assert!(err.contains(rule), "{sql}\n  got:  {err}\n  want: {rule}");
    assert_eq!(f.spent("p"), Budget::ZERO, "{sql}: a rejected query was charged");
    assert_eq!(f.spent("q"), Budget::ZERO);
    assert_eq!(f.releases(), 0);
}

macro_rules! rejects {
    ($($name:ident: $sql:expr => $rule:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            rejected($sql, $rule).await;
        }
    )*};
}

rejects! {
    raw_rows_are_refused: "SELECT x FROM p" => "[rule no-raw-rows]";
    raw_rows_through_a_cte_are_refused: "WITH c AS (SELECT * FROM p WHERE x > 0.5) SELECT * FROM c" => "[rule no-raw-rows]";
    raw_rows_in_a_view_like_subquery_are_refused: "SELECT s.x + 1 FROM (SELECT x FROM p) s ORDER BY 1 LIMIT 1" => "[rule no-raw-rows]";
    count_star_is_refused: "SELECT count(*) FROM p" => "[rule private-aggregates-only]";
    ordinary_aggregates_are_refused: "SELECT avg(x), max(x) FROM p WHERE x > 0" => "[rule private-aggregates-only]";
    distinct_rows_are_refused: "SELECT DISTINCT g FROM p" => "[rule private-aggregates-only]";
    mixing_private_and_ordinary_aggregates_is_refused:
        "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian'), count(*) FROM p" => "[rule private-aggregates-only]";
    group_by_is_refused: "SELECT g, private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p GROUP BY g" => "[rule no-group-by]";
    a_join_feeding_the_aggregate_is_refused:
        "SELECT private_kde(p.x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p JOIN pub_t ON p.g = pub_t.g" => "[rule row-wise-only] a JOIN";
    a_self_join_is_refused:
        "SELECT private_kde(a.x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p a CROSS JOIN p b" => "[rule row-wise-only] a JOIN";
    a_union_feeding_the_aggregate_is_refused:
        "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM (SELECT x FROM p UNION ALL SELECT x FROM p)" => "[rule row-wise-only] a UNION";
    distinct_below_the_aggregate_is_refused:
        "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM (SELECT DISTINCT x FROM p)" => "[rule row-wise-only]";
    limit_below_the_aggregate_is_refused:
        "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM (SELECT x FROM p LIMIT 10)" => "[rule row-wise-only]";
    order_by_with_limit_below_the_aggregate_is_refused:
        "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM (SELECT x FROM p ORDER BY x DESC LIMIT 100)" => "[rule row-wise-only]";
    window_use_of_a_private_aggregate_is_refused:
        "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') OVER () FROM p" => "private_kde: cannot be used as a window function";
    window_functions_over_private_rows_are_refused: "SELECT sum(x) OVER (ORDER BY x) FROM p" => "[rule no-raw-rows]";
    a_window_below_the_aggregate_is_refused:
        "SELECT private_kde(r, 0.05, 0.1, 1e-6, 0, 1000, mechanism => 'gaussian') FROM (SELECT row_number() OVER (ORDER BY x) AS r FROM p)" => "[rule row-wise-only] a window function";
    non_literal_parameters_are_refused: "SELECT private_kde(x, x, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p" => "argument 'bandwidth' must be a literal constant";
    a_scalar_subquery_over_private_rows_is_refused:
        "SELECT x FROM pub_t WHERE x > (SELECT max(x) FROM p)" => "[rule private-aggregates-only]";
    an_in_subquery_over_private_rows_is_refused: "SELECT x FROM pub_t WHERE x IN (SELECT x FROM p)" => "[rule no-raw-rows]";
    a_correlated_subquery_cannot_release_once_per_outer_row:
        "SELECT g, (SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian')['mass'] FROM p WHERE p.g = o.g) FROM pub_t o" => "[rule no-group-by]";
    a_lateral_join_cannot_release_once_per_outer_row:
        "SELECT * FROM (VALUES (0), (1)) v(k) CROSS JOIN LATERAL (SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian')['mass'] AS m FROM p WHERE g = v.k)" => "[rule no-group-by]";
    explain_analyze_is_refused: "EXPLAIN ANALYZE SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p" => "[rule no-explain-analyze]";
    explain_format_tree_is_refused:
        "EXPLAIN FORMAT TREE SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p" => "[rule no-physical-explain]";
    explain_format_graphviz_is_refused:
        "EXPLAIN FORMAT GRAPHVIZ SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p" => "[rule no-physical-explain]";
    a_private_release_in_a_recursive_term_is_refused:
        "WITH RECURSIVE r(i, m) AS (SELECT 0, 0.0 UNION ALL SELECT i + 1, (SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian')['mass'] FROM p) FROM r WHERE i < 200) SELECT i, m FROM r" => "[rule no-recursion]";
    a_private_release_in_a_recursive_static_term_is_refused:
        "WITH RECURSIVE r(i, m) AS (SELECT 0, private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian')['mass'] FROM p UNION ALL SELECT i + 1, m FROM r WHERE i < 3) SELECT * FROM r" => "[rule no-recursion]";
    create_external_table_is_refused:
        "CREATE EXTERNAL TABLE leak STORED AS PARQUET LOCATION '/tmp/p.parquet'" => "DDL not supported";
    create_view_is_refused: "CREATE VIEW v AS SELECT x FROM p" => "DDL not supported";
    copy_is_refused: "COPY (SELECT 1) TO '/tmp/dpcurve-copy-test.csv'" => "DML not supported";
    insert_is_refused: "INSERT INTO pub_t VALUES (1.0, 1)" => "DML not supported";
    set_is_refused: "SET datafusion.explain.logical_plan_only = false" => "Statement not supported";
}

/// SPEC §5.2: no table may reach a private table's files under another name — the same
/// path, a symbolic link to it, a relative spelling, or a directory holding it — and no file
/// is private twice (a second budget). Locations are stored canonical and absolute.
#[tokio::test]
async fn aliases_of_a_private_file_are_refused_at_registration() {
    let f = fixture("alias", (1.0, 1e-5)).await;
    let p = f.dir.str("p.parquet");
    let link = f.dir.path("link.parquet");
    std::os::unix::fs::symlink(f.dir.path("p.parquet"), &link).unwrap();
    let relative = {
        let cwd = std::env::current_dir().unwrap();
        let up = cwd.components().count() - 1;
        format!("{}{}", "../".repeat(up), p.trim_start_matches('/'))
    };
    for (name, location) in [
        ("same_path", p.clone()),
        ("symlink", link.to_string_lossy().into_owned()),
        ("relative", relative),
        ("directory", f.dir.0.to_string_lossy().into_owned()),
    ] {
        let err = f.admin.register(name, &location).await.unwrap_err().to_string();
        assert!(err.contains("reaches the files of private table 'p'"), "{name}: {err}");
    }
    // A public table registered before the file went private blocks making the other private
    // (no second budget, no public alias of a private file).
    write_x(&f.dir.path("r.parquet"), &[Some(0.5)]);
    f.admin.register("r1", &f.dir.str("r.parquet")).await.unwrap();
    f.admin.register("r2", &format!("{}/./r.parquet", f.dir.str(""))).await.unwrap();
    let err = f.admin.make_private("r1", 1.0, 0.0).await.unwrap_err().to_string();
    assert!(err.contains("shares files with table 'r2'"), "{err}");
    // Stored canonical: the spelled './' is gone.
    let r2 = f.admin.tables().unwrap().into_iter().find(|t| t.name == "r2").unwrap();
    assert_eq!(r2.location, f.dir.path("r.parquet").canonicalize().unwrap().to_string_lossy());
    // Ordinary, unrelated files still register.
    write_x(&f.dir.path("other.parquet"), &[Some(0.5)]);
    f.admin.register("other", &f.dir.str("other.parquet")).await.unwrap();
}

/// A location is the set of files DataFusion lists for it: glob syntax in a path (`*`, `?`,
/// `[`) would list other files than the one of that name — a public `p*.parquet` beside the
/// private `p.parquet` read her rows raw — so it is refused at registration, and a catalog that
/// holds one (written by an older dpcurve) opens no analyst session.
#[tokio::test]
async fn file_patterns_never_alias_a_private_file() {
    let f = fixture("glob", (1.0, 1e-5)).await;
    // Files literally named like patterns exist, so the paths canonicalise.
    write_x(&f.dir.path("p*.parquet"), &[Some(0.5)]);
    write_x(&f.dir.path("q1.parquet"), &[Some(0.5)]);
    write_x(&f.dir.path("q[1].parquet"), &[Some(0.5)]);
    write_x(&f.dir.path("p?.parquet"), &[Some(0.5)]);
    for (name, file) in [("pg", "p*.parquet"), ("qb", "q[1].parquet"), ("pq", "p?.parquet")] {
        let err = f.admin.register(name, &f.dir.str(file)).await.unwrap_err().to_string();
        assert!(err.contains("not a plain path"), "{file}: {err}");
    }
    // A pattern location already in an (older) catalog: no session opens, and it cannot go private.
    f.admin.register("q1", &f.dir.str("q1.parquet")).await.unwrap();
    let conn = set_location_behind_the_catalog(&f.dir.path("catalog.db"), "q1", &f.dir.str("q[1].parquet"));
    assert!(conn, "the catalog was edited");
    let err = f.admin.make_private("q1", 1.0, 0.0).await.unwrap_err().to_string();
    assert!(err.contains("not a plain path"), "{err}");
    let Err(err) = AnalystSession::open(&f.dir.path("catalog.db"), SessionOptions::default()).await else {
        panic!("a session opened over a pattern location");
    };
    assert!(err.to_string().contains("file pattern or URL"), "{err}");
}

/// Rewrites a table's stored location behind the catalog's back, as an older dpcurve could
/// have stored it; returns whether the row changed.
fn set_location_behind_the_catalog(db: &std::path::Path, table: &str, location: &str) -> bool {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute("UPDATE tables SET location = ?1 WHERE name = ?2", [location, table]).unwrap() == 1
}

/// Two textually identical calls in one SELECT are one call: one release (both fields come
/// from it), one charge.
#[tokio::test]
async fn identical_calls_in_one_select_are_one_release_and_one_charge() {
    let f = fixture("twin", (10.0, 1e-4)).await;
    let s = f.analyst().await;
    // Positional, named, and with the grid from the policy's bounds (the guard fills them in).
    let named = "private_kde(x, bandwidth => 0.05, epsilon => 0.1, delta => 1e-6, points => 64)";
    for sql in [
        format!("SELECT {KDE}['mass'] AS a, {KDE}['density'] AS b FROM p"),
        format!("SELECT {KDE}['release'] AS a, {KDE}['release'] AS b FROM p"),
        format!("SELECT {named}['mass'] AS a, {named}['density'] AS b FROM p"),
        format!("SELECT {named}['mass'], {named}['density'] FROM p"),
    ] {
        let call = if sql.contains("bandwidth =>") { named.to_string() } else { KDE.to_string() };
        let before = f.spent("p");
        s.query(&format!("SELECT {call} FROM p")).await.unwrap();
        let single = f.spent("p").checked_sub(&before).unwrap();
        let before = f.spent("p");
        let b = s.query(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
        let paid = f.spent("p").checked_sub(&before).unwrap();
        assert_eq!(paid, single, "{sql}: one charge, as for one call");
    }
    assert_eq!(f.releases(), 8, "one ledger entry per statement");
    assert_eq!(f.admin.stored_releases(None).unwrap().len(), 8, "one stored release per statement");
    let b = s.query(&format!("SELECT {KDE}['release'] AS a, {KDE}['release'] AS b FROM p")).await.unwrap();
    let (a, c) = (b[0].column(0).as_string::<i32>().value(0), b[0].column(1).as_string::<i32>().value(0));
    assert_eq!(a, c, "both fields are the same release");
}

/// No paid result is lost: each statement's result is handed over as it completes (a second
/// statement the budget no longer covers, or a public statement failing at run time, does not
/// take the first with it), and a query whose public part fails after its release was drawn
/// names the stored release in its error.
#[tokio::test]
async fn paid_results_survive_later_failures() {
    let f = fixture("paid", (0.1, 1e-5)).await;
    let labels = vec!["1", "2", "three"];
    common::write_columns(
        &f.dir.path("labels.parquet"),
        vec![("label", Arc::new(datafusion::arrow::array::StringArray::from(labels)) as _)],
    );
    f.admin.register("labels", &f.dir.str("labels.parquet")).await.unwrap();
    let s = f.analyst().await;
    let one = format!("SELECT {KDE} AS k FROM p");
    // 1. S1; S1 with budget for one: the first result arrives, the second is refused.
    let mut got = Vec::new();
    let err = s
        .sql_each(&format!("{one}; {one}"), &mut |r| {
            got.push(r);
            Ok(())
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("budget exhausted"), "{err}");
    assert_eq!(got.len(), 1, "the paid first result was handed over");
    assert_eq!(f.releases(), 1);
    f.admin.raise_budget("p", 1.0, 1e-4).unwrap();
    // 2. A public statement failing at run time after a paid one.
    let mut got = Vec::new();
    let bad_public = "SELECT CAST(label AS INT) AS n FROM labels";
    let err = s
        .sql_each(&format!("{one}; {bad_public}"), &mut |r| {
            got.push(r);
            Ok(())
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("three") || err.contains("Cast"), "{err}");
    assert_eq!(got.len(), 1);
    // 3. The release is drawn before the failing public part runs, and the error names it.
    let stored = f.admin.stored_releases(None).unwrap().len();
    let err = s.query(&format!("SELECT n, k FROM ({bad_public}) CROSS JOIN ({one})")).await.unwrap_err().to_string();
    let now = f.admin.stored_releases(None).unwrap();
    assert_eq!(now.len(), stored + 1, "the paid release is stored");
    let id = &now.last().unwrap().release;
    assert!(err.contains(&format!("release('{id}')")), "{err}");
    let b = s.query(&format!("SELECT * FROM release('{id}')")).await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 1, "and it is readable for free");
}

#[tokio::test]
async fn reading_a_private_file_by_path_is_refused() {
    let f = fixture("path", (1.0, 1e-5)).await;
    let s = f.analyst().await;
    let path = f.dir.str("p.parquet");
    let err = s.query(&format!("SELECT x FROM '{path}'")).await.unwrap_err().to_string();
    assert!(err.contains("not found"), "{err}");
    let err = s.query(&format!("SELECT count(*) FROM read_parquet('{path}')")).await.unwrap_err().to_string();
    assert!(err.contains("not found") || err.contains("Invalid function"), "{err}");
}

#[tokio::test]
async fn ten_releases_of_a_tenth_exhaust_a_budget_of_one_and_the_eleventh_reads_nothing() {
    let f = fixture("exact", (1.0, 1e-5)).await;
    let s = f.analyst().await;
    for _ in 0..10 {
        s.query(&format!("SELECT {KDE} FROM p")).await.unwrap();
    }
    assert_eq!(f.spent("p"), Budget::total(1.0, 1e-5).unwrap());
    // Make the file unreadable (under its verified size and modification time, so that the
    // scan plans): a refused query must fail on the budget, before reading.
    let path = f.dir.path("p.parquet");
    let meta = std::fs::metadata(&path).unwrap();
    std::fs::write(&path, vec![b'#'; meta.len() as usize]).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(meta.modified().unwrap()).unwrap();
    let err = s.query(&format!("SELECT {KDE} FROM p")).await.unwrap_err().to_string();
    assert!(
        err.contains("privacy budget exhausted on table 'p': this query costs ε = 0.1, δ = 0.000001 but only ε = 0, δ = 0 remains; nothing was read"),
        "{err}"
    );
    assert_eq!(f.releases(), 10);
    let budgets = s.budgets().unwrap();
    let p = budgets.iter().find(|b| b.0 == "p").unwrap();
    assert_eq!(p.3, Budget::ZERO);
}

#[tokio::test]
async fn each_private_table_is_charged_for_its_own_calls() {
    let f = fixture("pertable", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    s.query(
        "SELECT (SELECT private_kde(x, 0.05, 0.25, 1e-6, 0, 1, mechanism => 'gaussian')['mass'] FROM p) AS a, \
                (SELECT private_kde(x, 0.05, 0.5, 2e-6, 0, 1, mechanism => 'gaussian')['mass'] FROM q) AS b",
    )
    .await
    .unwrap();
    assert_eq!(f.spent("p"), Budget::total(0.25, 1e-6).unwrap());
    assert_eq!(f.spent("q"), Budget::total(0.5, 2e-6).unwrap());
    // Two calls on one table in one aggregate: both are charged (basic composition).
    s.query("SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian'), private_kde(x, 0.02, 0.2, 1e-6, 0, 1, mechanism => 'gaussian') FROM p")
        .await
        .unwrap();
    assert_eq!(f.spent("p"), Budget::total(0.55, 3e-6).unwrap());
    let log = f.admin.release_log(Some("p")).unwrap();
    assert_eq!(log.len(), 3);
    assert!(log[2].query.contains("private_kde(x, 0.02, 0.2"), "{}", log[2].query);
    // The same call twice in one SELECT is one release (DataFusion deduplicates it).
    s.query(&format!("SELECT {KDE}['x'], {KDE}['density'] FROM p")).await.unwrap();
    assert_eq!(f.spent("p"), Budget::total(0.65, 4e-6).unwrap());
}

#[tokio::test]
async fn a_cte_used_twice_is_charged_twice_and_optimized_away_calls_are_free() {
    let f = fixture("cte", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    s.query(&format!(
        "WITH c AS (SELECT x FROM p WHERE x > 0.2) \
         SELECT {KDE}['mass'] AS m FROM c UNION ALL SELECT {KDE}['mass'] FROM c"
    ))
    .await
    .unwrap();
    assert_eq!(f.spent("p"), Budget::total(0.2, 2e-6).unwrap());
    let before = f.spent("p");
    let b = s.query(&format!("SELECT 1 AS one FROM (SELECT {KDE} AS k FROM p)")).await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    assert_eq!(f.spent("p"), before, "a release the optimizer removed must cost nothing");
}

#[tokio::test]
async fn executing_the_same_plan_twice_pays_twice() {
    let f = fixture("twice", (5.0, 1e-4)).await;
    // One partition: the very same plan instance can run twice.
    let s = AnalystSession::open(
        &f.dir.path("catalog.db"),
        SessionOptions { target_partitions: Some(1), ..Default::default() },
    )
    .await
    .unwrap();
    let plan = s.physical_plan_for_tests(&format!("SELECT {KDE} FROM p")).await.unwrap();
    assert_eq!(f.spent("p"), Budget::ZERO, "planning alone must not charge");
    for _ in 0..2 {
        datafusion::physical_plan::collect(Arc::clone(&plan), s.task_ctx_for_tests()).await.unwrap();
    }
    assert_eq!(f.spent("p"), Budget::total(0.2, 2e-6).unwrap());
    // Several partitions: DataFusion re-runs a plan after resetting its operators' state;
    // the gate travels with the plan and charges again.
    let s = f.analyst().await;
    let plan = s.physical_plan_for_tests(&format!("SELECT {KDE} FROM p")).await.unwrap();
    datafusion::physical_plan::collect(Arc::clone(&plan), s.task_ctx_for_tests()).await.unwrap();
    let again = datafusion::physical_plan::execution_plan::reset_plan_states(plan).unwrap();
    datafusion::physical_plan::collect(again, s.task_ctx_for_tests()).await.unwrap();
    assert_eq!(f.spent("p"), Budget::total(0.4, 4e-6).unwrap());
    assert_eq!(f.releases(), 4);
}

#[tokio::test]
async fn explain_is_free_and_shows_no_physical_details() {
    let f = fixture("explain", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    let out = s.sql(&format!("EXPLAIN SELECT {KDE} FROM p")).await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&out[0].batches).unwrap().to_string();
    assert!(text.contains("logical_plan") && !text.contains("physical_plan"), "{text}");
    assert_eq!(f.spent("p"), Budget::ZERO);
}

#[tokio::test]
async fn policy_bounds_are_the_default_grid_and_other_columns_still_need_them() {
    let f = fixture("bounds", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    let b = s
        .query(
            "SELECT private_kde(x, 0.05, 0.1, 1e-6, points => 11, mechanism => 'gaussian') AS k FROM p WHERE x > 0.1",
        )
        .await
        .unwrap();
    let k = b[0].column(0).as_struct();
    let xs = k.column_by_name("x").unwrap().as_list::<i32>().value(0);
    let xs = xs.as_primitive::<Float64Type>().values().to_vec();
    assert_eq!((xs[0], xs[10]), (0.0, 1.0), "grid from the policy bounds of p.x");
    // Explicit bounds override the policy.
    let b = s
        .query("SELECT private_kde(x, 0.05, 0.1, 1e-6, -1, 2, 11, mechanism => 'gaussian') AS k FROM p")
        .await
        .unwrap();
    let xs = b[0].column(0).as_struct().column(0).as_list::<i32>().value(0);
    assert_eq!(xs.as_primitive::<Float64Type>().value(0), -1.0);
    // q.x has no bounds; an expression of x does not inherit them either.
    for sql in [
        "SELECT private_kde(x, 0.05, 0.1, 1e-6, mechanism => 'gaussian') FROM q",
        "SELECT private_kde(x * 2, 0.05, 0.1, 1e-6, mechanism => 'gaussian') FROM p",
    ] {
        let err = s.query(sql).await.unwrap_err().to_string();
        assert!(err.contains("arguments 'lo' and 'hi' are required"), "{sql}: {err}");
    }
    assert_eq!(f.spent("p"), Budget::total(0.2, 2e-6).unwrap());
}

/// `SQL1; SQL2` where SQL2 is refused: nothing runs, nothing is charged (every statement is
/// planned and guarded before the first executes); two valid statements are charged twice.
#[tokio::test]
async fn a_refused_later_statement_stops_the_whole_string_before_anything_is_charged() {
    let f = fixture("multi", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    for sql in [
        format!("SELECT {KDE} FROM p; SELECT x FROM p"),
        format!("SELECT {KDE} FROM p; SELECT {KDE} FROM p; SELECT count(*) FROM p"),
        format!("SELECT {KDE} FROM p; SELECT private_kde(x, 0, 1, 1e-6, 0, 1, mechanism => 'gaussian') FROM p"),
    ] {
        assert!(s.sql(&sql).await.is_err(), "{sql}");
        assert_eq!(f.spent("p"), Budget::ZERO, "{sql}: charged although a statement was refused");
        assert_eq!(f.releases(), 0);
    }
    let out = s.sql(&format!("SELECT {KDE} FROM p; SELECT {KDE} FROM p")).await.unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(f.spent("p"), Budget::total(0.2, 2e-6).unwrap());
}

#[tokio::test]
async fn public_tables_stay_ordinary_and_can_sit_above_private_aggregates() {
    let f = fixture("public", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    let b = s.query("SELECT g, count(*) AS n, avg(x) FROM pub_t GROUP BY g ORDER BY g").await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    let b = s
        .query(&format!(
            "SELECT pub_t.g, k.m FROM pub_t CROSS JOIN (SELECT {KDE}['mass'] AS m FROM p) k ORDER BY pub_t.g LIMIT 2"
        ))
        .await
        .unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    assert_eq!(f.spent("p"), Budget::total(0.1, 1e-6).unwrap());
    // A private aggregate over a public table is free.
    s.query("SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, mechanism => 'gaussian') FROM pub_t").await.unwrap();
    // Recursion and physical EXPLAIN formats stay available on public tables (the rules
    // no-recursion and no-physical-explain are about private tables only).
    let b = s
        .query("WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r WHERE i < 9) SELECT count(*) FROM r")
        .await
        .unwrap();
    assert_eq!(b[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 10);
    s.query("EXPLAIN FORMAT TREE SELECT avg(x) FROM pub_t").await.unwrap();
    assert_eq!(f.spent("p"), Budget::total(0.1, 1e-6).unwrap());
    // Budgets are visible to analysts.
    let b = s
        .query("SELECT table_name, epsilon_remaining, releases FROM dpcurve.budgets ORDER BY table_name")
        .await
        .unwrap();
    let names = b[0].column(0).as_string::<i32>();
    let left = b[0].column(1).as_primitive::<Float64Type>();
    assert_eq!((names.value(0), left.value(0)), ("p", 4.9));
    assert_eq!((names.value(1), left.value(1)), ("q", 10.0));
}

#[tokio::test]
async fn errors_while_reading_private_rows_do_not_show_private_values() {
    let f = fixture("sanitize", (5.0, 1e-4)).await;
    let s = f.analyst().await;
    // A cast that would fail on the data is rewritten to TRY_CAST on private rows (SPEC §5.1):
    // the query succeeds (the values that do not convert are NULL) and is charged.
    let sql =
        "SELECT private_kde(CAST(CAST(x AS VARCHAR) AS INT), 1, 0.1, 1e-6, 0, 10, mechanism => 'gaussian') FROM p";
    s.query(sql).await.unwrap();
    // On a public table the same cast fails, with DataFusion's full message.
    let err = s.query("SELECT CAST(CAST(x AS VARCHAR) AS INT) FROM pub_t").await.unwrap_err().to_string();
    assert!(err.contains("Cannot cast"), "{err}");
    assert_eq!(f.spent("p"), Budget::total(0.1, 1e-6).unwrap());
    // A file damaged after its verification is refused at planning, free ...
    let path = f.dir.path("p.parquet");
    let verified_at = std::fs::metadata(&path).unwrap().modified().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut damaged = bytes.clone();
    let mid = damaged.len() / 2;
    damaged[8..mid].fill(0xAB);
    std::fs::write(&path, &damaged).unwrap();
    let err = s.query(&format!("SELECT {KDE} FROM p")).await.unwrap_err().to_string();
    assert!(err.contains("verified-files"), "{err}");
    assert_eq!(f.spent("p"), Budget::total(0.1, 1e-6).unwrap());
    // ... and errors that can still happen while reading private rows (here: the damage kept
    // the verified size and modification time) are withheld: the message cannot quote values.
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(verified_at).unwrap();
    let err = s.query(&format!("SELECT {KDE} FROM p")).await.unwrap_err().to_string();
    assert!(err.contains("details are withheld"), "{err}");
    // The failed private query was charged (no refunds: the failure happened after the debit).
    assert_eq!(f.spent("p"), Budget::total(0.2, 2e-6).unwrap());
}

#[tokio::test]
async fn tables_are_opened_when_a_statement_names_them() {
    let f = fixture("lazy", (5.0, 1e-4)).await;
    write_xy(&f.dir.path("m.parquet"), 10);
    f.admin.register("Mixed_Case", &f.dir.str("m.parquet")).await.unwrap();
    // Two tables' files lose their footers before any session opens: the public `pub_t` and the
    // private `q`. The session still opens: a table is opened when a statement names it.
    let cut = |name: &str| {
        let bytes = std::fs::read(f.dir.path(name)).unwrap();
        let modified = std::fs::metadata(f.dir.path(name)).unwrap().modified().unwrap();
        std::fs::write(f.dir.path(name), &bytes[..bytes.len() / 2]).unwrap();
        (bytes, modified)
    };
    let (pub_bytes, q_bytes) = (cut("pub.parquet"), cut("q.parquet"));
    let s = f.analyst().await;
    // Listing the tables opens none of them: the damaged ones are listed too.
    let listed = |b: Vec<RecordBatch>| -> Vec<String> {
        b.iter().flat_map(|b| b.column(0).as_string::<i32>().iter().flatten().map(str::to_string)).collect()
    };
    let b = s
        .query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name")
        .await
        .unwrap();
    assert_eq!(listed(b), ["mixed_case", "p", "pub_t", "q"]);
    // The other tables answer, named as a statement resolves them (unquoted names fold to lower case).
    s.query(&format!("SELECT {KDE} FROM p")).await.unwrap();
    for sql in ["SELECT count(*) FROM Mixed_Case", "SELECT count(*) FROM mixed_case"] {
        let b = s.query(sql).await.unwrap();
        assert_eq!(b[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 10, "{sql}");
    }
    // A statement naming a table that cannot be opened fails at planning, with its name, before
    // any charge — a private one too.
    for (sql, table) in [("SELECT count(*) FROM pub_t".to_string(), "pub_t"), (format!("SELECT {KDE} FROM q"), "q")] {
        let err = s.query(&sql).await.unwrap_err().to_string();
        assert!(err.contains(&format!("table '{table}'")) && err.contains("cannot be opened"), "{sql}: {err}");
    }
    assert_eq!((f.spent("q"), f.spent("p")), (Budget::ZERO, Budget::total(0.1, 1e-6).unwrap()));
    assert_eq!(f.releases(), 1);
    // A failure is not kept: once the files are whole again (as verified: the same bytes and
    // modification time), the same session reads them.
    for (name, (bytes, modified)) in [("pub.parquet", pub_bytes), ("q.parquet", q_bytes)] {
        std::fs::write(f.dir.path(name), bytes).unwrap();
        std::fs::File::options().write(true).open(f.dir.path(name)).unwrap().set_modified(modified).unwrap();
    }
    let b = s.query("SELECT count(*) FROM pub_t").await.unwrap();
    assert_eq!(b[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 300);
    s.query(&format!("SELECT {KDE} FROM q")).await.unwrap();
    assert_eq!(f.spent("q"), Budget::total(0.1, 1e-6).unwrap());
    // Every table is listed, opened or not.
    let b = s
        .query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name")
        .await
        .unwrap();
    let names: Vec<&str> = b.iter().flat_map(|b| b.column(0).as_string::<i32>().iter().flatten()).collect();
    assert_eq!(names, ["mixed_case", "p", "pub_t", "q"]);
}

/// SQL folds unquoted names to lower case, so the catalog refuses names that differ only in
/// case; in a catalog written before it did, a quoted name reaches its table exactly and a name
/// folding to several tables, none of them exactly, is refused with the names to quote.
#[tokio::test]
async fn names_that_differ_only_in_case_are_one_name() {
    let f = fixture("case", (5.0, 1e-4)).await;
    let e = f.admin.register("P", &f.dir.str("pub.parquet")).await.unwrap_err().to_string();
    assert!(e.contains("a table named 'p' is already registered") && e.contains("ignoring case"), "{e}");
    f.admin.register("Ab", &f.dir.str("pub.parquet")).await.unwrap();
    let e = f.admin.register("aB", &f.dir.str("pub.parquet")).await.unwrap_err().to_string();
    assert!(e.contains("'Ab' is already registered"), "{e}");
    // An older catalog: `P` (public) beside the private `p`, and `aB` beside `Ab`.
    let conn = rusqlite::Connection::open(f.dir.path("catalog.db")).unwrap();
    let pub_location: String =
        conn.query_row("SELECT location FROM tables WHERE name = 'pub_t'", [], |r| r.get(0)).unwrap();
    for name in ["P", "aB"] {
        conn.execute(
            "INSERT INTO tables (name, location, private, registered_at) VALUES (?1, ?2, 0, 'x')",
            [name, pub_location.as_str()],
        )
        .unwrap();
    }
    drop(conn);
    let s = f.analyst().await;
    let count = |b: Vec<RecordBatch>| b[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0);
    // Quoted: exactly that table. Unquoted `P` folds to `p`, the private table: its count is refused.
    assert_eq!(count(s.query(r#"SELECT count(*) FROM "P""#).await.unwrap()), 300);
    for sql in ["SELECT count(*) FROM P", "SELECT count(*) FROM p"] {
        let e = s.query(sql).await.unwrap_err().to_string();
        assert!(e.contains("private-aggregates-only"), "{sql}: {e}");
    }
    s.query(&format!("SELECT {KDE} FROM P")).await.unwrap();
    assert_eq!(f.spent("p"), Budget::total(0.1, 1e-6).unwrap());
    // `ab` folds to both `Ab` and `aB` and is neither: refused, naming them; quoted, each answers.
    let e = s.query("SELECT count(*) FROM ab").await.unwrap_err().to_string();
    assert!(e.contains(r#"quote the one meant ("Ab", "aB")"#), "{e}");
    for sql in [r#"SELECT count(*) FROM "Ab""#, r#"SELECT count(*) FROM "aB""#] {
        assert_eq!(count(s.query(sql).await.unwrap()), 300, "{sql}");
    }
    // Listed as a statement reaches them.
    let b = s
        .query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name")
        .await
        .unwrap();
    let names: Vec<&str> = b.iter().flat_map(|b| b.column(0).as_string::<i32>().iter().flatten()).collect();
    assert_eq!(names, ["Ab", "P", "aB", "p", "pub_t", "q"]);
}

#[tokio::test]
async fn admin_refusals_are_precise() {
    let f = fixture("admin", (1.0, 1e-5)).await;
    let a = &f.admin;
    let e = a.register("p", &f.dir.str("p.parquet")).await.unwrap_err().to_string();
    assert!(e.contains("already registered"), "{e}");
    let e = a.register("r", &f.dir.str("missing.parquet")).await.unwrap_err().to_string();
    assert!(e.contains("cannot read"), "{e}");
    let e = a.set_bounds("p", "nope", 0.0, 1.0).await.unwrap_err().to_string();
    assert!(e.contains("has no column 'nope'"), "{e}");
    let e = a.set_bounds("pub_t", "x", 0.0, 1.0).await.unwrap_err().to_string();
    assert!(e.contains("is public"), "{e}");
    let e = a.make_private("p", 1.0, 0.0).await.unwrap_err().to_string();
    assert!(e.contains("already private"), "{e}");
    assert_eq!(a.raise_budget("p", 0.5, 1e-5).unwrap(), Budget::total(1.5, 2e-5).unwrap());
}

/// Writes `names` (raw bytes, written as a UTF-8 column without checking them) and `x`, plain
/// and uncompressed, to a Parquet file.
fn write_names(path: &std::path::Path, names: &[&[u8]]) {
    use datafusion::arrow::array::StringArray;
    use datafusion::arrow::buffer::{Buffer, OffsetBuffer};
    let schema = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let offsets = OffsetBuffer::from_lengths(names.iter().map(|n| n.len()));
    let values = Buffer::from(names.concat());
    // SAFETY: the array is only written to a file, never read as `str` here; writing bytes that
    // are not UTF-8 into a string column is the point (another writer could).
    let name = unsafe { StringArray::new_unchecked(offsets, values, None) };
    let x = datafusion::arrow::array::Float64Array::from_iter_values((0..names.len()).map(|i| 0.2 + 0.1 * i as f64));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(name), Arc::new(x)]).unwrap();
    let props = datafusion::parquet::file::properties::WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_compression(datafusion::parquet::basic::Compression::UNCOMPRESSED)
        .build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// A row the Parquet reader cannot decode — here a name that is not UTF-8 — would make every
/// query that reads its column fail where the neighbouring table without it succeeds (SPEC §0:
/// with certainty, ε = ∞). Making a table private reads its files whole first, and analysts'
/// queries read the verified files only, unchanged. The attack on neighbours: a private table
/// whose file later gains either a valid row or the undecodable one; every query, whether it
/// reads the column or not, is refused at planning with the same message and nothing charged,
/// until the owner verifies the files again — which the undecodable row fails. Controls: the
/// reader alone fails on the undecodable file, and the same bytes slipped in under the verified
/// size and modification time (what the check trusts) fail a query after the debit.
#[tokio::test]
async fn a_row_the_reader_cannot_decode_never_fails_a_query() {
    let dir = TempDir::new("undecodable");
    let two: [&[u8]; 2] = [b"alice", b"bob"];
    write_names(&dir.path("two.parquet"), &two);
    write_names(&dir.path("valid.parquet"), &[b"alice", b"bob", b"dave"]);
    write_names(&dir.path("undecodable.parquet"), &[b"alice", b"bob", b"\xff\xfe\xfd\xfc"]);
    let bytes = |name: &str| std::fs::read(dir.path(name)).unwrap();
    assert_eq!(bytes("valid.parquet").len(), bytes("undecodable.parquet").len());
    // Control: the reader itself fails on the undecodable row.
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_parquet("u", dir.str("undecodable.parquet"), Default::default()).await.unwrap();
    let e = ctx.sql("SELECT name FROM u WHERE name <> 'zed'").await.unwrap().collect().await.unwrap_err().to_string();
    assert!(e.contains("UTF-8"), "{e}");

    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    // A table holding the row cannot be made private: its files are read whole first.
    admin.register("u", &dir.str("undecodable.parquet")).await.unwrap();
    let e = admin.make_private("u", 10.0, 1e-4).await.unwrap_err().to_string();
    assert!(e.contains("cannot be read whole") && e.contains("UTF-8"), "{e}");
    assert!(admin.tables().unwrap().iter().find(|t| t.name == "u").unwrap().policy.is_none(), "u stays public");

    std::fs::copy(dir.path("two.parquet"), dir.path("m.parquet")).unwrap();
    admin.register("m", &dir.str("m.parquet")).await.unwrap();
    admin.make_private("m", 10.0, 1e-4).await.unwrap();
    admin.set_bounds("m", "x", 0.0, 1.0).await.unwrap();
    let spent = || admin.tables().unwrap().into_iter().find(|t| t.name == "m").unwrap().policy.unwrap().spent;
    let s = AnalystSession::open(&dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let reading = [format!("SELECT {KDE} FROM m WHERE name <> 'zed'"), format!("SELECT {KDE} FROM m")];
    for sql in &reading {
        s.query(sql).await.unwrap();
    }
    let paid = spent();
    assert_eq!(paid, Budget::total(0.2, 2e-6).unwrap());
    // The file gains a third row, valid or not: the same refusal, at planning, free.
    let mut seen = Vec::new();
    for third in ["valid.parquet", "undecodable.parquet"] {
        std::fs::write(dir.path("m.parquet"), bytes(third)).unwrap();
        for sql in &reading {
            let e = s.query(sql).await.unwrap_err().to_string();
            assert!(e.contains("its files changed after the data owner last read them whole"), "{e}");
            assert!(e.contains("verified-files") && !e.contains("m.parquet"), "{e}");
            seen.push(e);
        }
        assert_eq!(spent(), paid, "{third}: refused before the debit");
    }
    assert_eq!(seen[..2], seen[2..], "the neighbours' refusals are the same");
    // Verifying the undecodable file fails, and the table stays refused.
    let e = admin.verify("m").await.unwrap_err().to_string();
    assert!(e.contains("cannot be read whole") && e.contains("UTF-8"), "{e}");
    assert!(s.query(&reading[1]).await.unwrap_err().to_string().contains("verified-files"));
    // The valid file verifies, and the same session queries it.
    std::fs::write(dir.path("m.parquet"), bytes("valid.parquet")).unwrap();
    assert_eq!(admin.verify("m").await.unwrap(), 1);
    for sql in &reading {
        s.query(sql).await.unwrap();
    }
    let paid = spent();
    assert_eq!(paid, Budget::total(0.4, 4e-6).unwrap());
    // Control: the undecodable bytes under the verified size and modification time pass the
    // check, and the query that reads the column fails after the debit.
    let verified_at = std::fs::metadata(dir.path("m.parquet")).unwrap().modified().unwrap();
    std::fs::write(dir.path("m.parquet"), bytes("undecodable.parquet")).unwrap();
    std::fs::File::options().write(true).open(dir.path("m.parquet")).unwrap().set_modified(verified_at).unwrap();
    let e = s.query(&reading[0]).await.unwrap_err().to_string();
    assert!(e.contains("details are withheld"), "{e}");
    assert!(spent() != paid, "the failure came after the debit");
}

/// A private table over a directory: a file added after the verification is refused (without
/// its name), a file removed is not (the rest were read whole); a catalog of the format before verification
/// holds private tables no query may read until the owner verifies them.
#[tokio::test]
async fn private_directories_are_read_as_verified_and_older_catalogs_verify_first() {
    let dir = TempDir::new("verified-dir");
    std::fs::create_dir(dir.path("d")).unwrap();
    for part in ["a", "b"] {
        write_x(&dir.path(&format!("d/{part}.parquet")), &mixture(200, 3).into_iter().map(Some).collect::<Vec<_>>());
    }
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("d", &dir.str("d")).await.unwrap();
    admin.make_private("d", 10.0, 1e-4).await.unwrap();
    admin.set_bounds("d", "x", 0.0, 1.0).await.unwrap();
    assert_eq!(admin.tables().unwrap()[0].policy.as_ref().unwrap().verified.as_ref().unwrap().len(), 2);
    let s = AnalystSession::open(&dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let sql = format!("SELECT {KDE} FROM d");
    s.query(&sql).await.unwrap();
    std::fs::copy(dir.path("d/a.parquet"), dir.path("d/c.parquet")).unwrap();
    let e = s.query(&sql).await.unwrap_err().to_string();
    assert!(e.contains("its files changed") && !e.contains("c.parquet"), "{e}");
    std::fs::remove_file(dir.path("d/c.parquet")).unwrap();
    std::fs::remove_file(dir.path("d/b.parquet")).unwrap();
    s.query(&sql).await.unwrap();
    // An older catalog: no verification recorded (the upgrade adds none).
    drop(s);
    let conn = rusqlite::Connection::open(dir.path("catalog.db")).unwrap();
    conn.execute_batch("DELETE FROM verified_files; DELETE FROM verified;").unwrap();
    drop(conn);
    let s = AnalystSession::open(&dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let e = s.query(&sql).await.unwrap_err().to_string();
    assert!(e.contains("private table 'd' has not been verified") && e.contains("dpcurve admin verify d"), "{e}");
    assert_eq!(admin.verify("d").await.unwrap(), 1);
    s.query(&sql).await.unwrap();
}

/// A session that opened a private table before its files were rewritten and verified again
/// reads them with their new schema: with the old one, a column whose type changed (here `x`,
/// from numbers to text) would be cast while reading, and a value that does not convert would
/// fail the query after the debit. With the new schema the guard's total casts apply (a value
/// that does not convert is NULL) and the release is made.
#[tokio::test]
async fn a_table_verified_again_is_read_with_its_new_schema() {
    let dir = TempDir::new("verified-schema");
    write_x(&dir.path("m.parquet"), &mixture(300, 4).into_iter().map(Some).collect::<Vec<_>>());
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("m", &dir.str("m.parquet")).await.unwrap();
    admin.make_private("m", 10.0, 1e-4).await.unwrap();
    let s = AnalystSession::open(&dir.path("catalog.db"), SessionOptions::default()).await.unwrap();
    let sql = format!("SELECT {} FROM m", KDE.replacen("x,", "CAST(x AS DOUBLE),", 1));
    s.query(&sql).await.unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Utf8, false)]));
    let x = datafusion::arrow::array::StringArray::from(vec!["0.5", "not a number", "0.25"]);
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(dir.path("m.parquet")).unwrap(), Arc::clone(&schema), None).unwrap();
    w.write(&RecordBatch::try_new(schema, vec![Arc::new(x)]).unwrap()).unwrap();
    w.close().unwrap();
    assert_eq!(admin.verify("m").await.unwrap(), 1);
    let spent = || admin.tables().unwrap()[0].policy.as_ref().unwrap().spent;
    s.query(&sql).await.unwrap();
    assert_eq!(spent(), Budget::total(0.2, 2e-6).unwrap());
}
