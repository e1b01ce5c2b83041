//! The `dpcurve` binary, run as a user would.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{TempDir, mixture, write_x};
use dpcurve::mechanism::noise::cache::PublicStore;
use dpcurve::policy::public_store::{DiskStore, read_entry};

fn dpcurve(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dpcurve"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn data(dir: &TempDir) -> String {
    let v: Vec<Option<f64>> = mixture(5_000, 9).into_iter().map(Some).collect();
    write_x(&dir.path("d.parquet"), &v);
    format!("t={}", dir.str("d.parquet"))
}

/// Runs `dpcurve admin --catalog CAT ARGS…`.
fn admin_cmd(cat: &str, args: &[&str]) -> (i32, String, String) {
    let mut full = vec!["admin", "--catalog", cat];
    full.extend_from_slice(args);
    dpcurve(&full, None)
}

/// A catalog `catalog.db` in `dir` with one private table `p`: `n` mixture draws (seed `seed`)
/// in column `x`, total budget (`epsilon`, `delta`). Returns the catalog's path.
fn private_table(dir: &TempDir, n: usize, seed: u64, epsilon: &str, delta: &str) -> String {
    let v: Vec<Option<f64>> = mixture(n, seed).into_iter().map(Some).collect();
    write_x(&dir.path("p.parquet"), &v);
    let cat = dir.str("catalog.db");
    assert_eq!(admin_cmd(&cat, &["register", "p", &dir.str("p.parquet")]).0, 0);
    assert_eq!(admin_cmd(&cat, &["make-private", "p", "--epsilon", epsilon, "--delta", delta]).0, 0);
    cat
}

const KDE: &str = "SELECT private_kde(x, bandwidth => 0.05, epsilon => 1, delta => 1e-6, lo => 0, hi => 1, points => 32) AS kde FROM t";

#[test]
fn json_output_is_one_parsable_object_per_row_per_line() {
    let dir = TempDir::new("cli-json");
    let table = data(&dir);
    let sql = format!("{KDE}; SELECT x FROM t ORDER BY x LIMIT 3");
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "--format", "json", "-c", &sql], None);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let kde: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(kde["kde"]["x"].as_array().unwrap().len(), 32);
    assert_eq!(kde["kde"]["density"].as_array().unwrap().len(), 32);
    assert!(kde["kde"]["mass"].as_f64().unwrap() > 4_000.0);
    for l in &lines[1..] {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["x"].is_f64());
    }
}

#[test]
fn table_and_csv_output() {
    let dir = TempDir::new("cli-table");
    let table = data(&dir);
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "-c", KDE], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("| kde") && out.contains("(32 values)") && out.contains("1 row"), "{out}");
    let (code, out, _) =
        dpcurve(&["sql", "--table", &table, "--format", "csv", "-c", "SELECT 1 AS a, 'x,y' AS b"], None);
    assert_eq!(code, 0);
    assert_eq!(out, "a,b\n1,\"x,y\"\n");
}

#[test]
fn file_of_statements_plot_and_svg() {
    let dir = TempDir::new("cli-file");
    let table = data(&dir);
    std::fs::write(dir.path("q.sql"), format!("-- two statements\nSELECT 42 AS answer;\n{KDE};\n")).unwrap();
    let svg = dir.str("out.svg");
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "-f", &dir.str("q.sql"), "--plot", "--svg", &svg], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("42"));
    assert!(out.contains("kde row 1 (density)"), "{out}");
    assert!(out.lines().filter(|l| l.contains('|')).count() > 10, "no plot drawn:\n{out}");
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert!(doc.starts_with("<svg") && doc.contains("<polyline"));
    // The release's simultaneous band is drawn: shaded in SVG, dotted in the terminal.
    assert!(doc.contains(r#"<polygon class="band""#), "no band in the SVG");
    assert!(out.contains(". = band") && out.lines().any(|l| l.contains("|") && l.contains('.')), "{out}");
}

/// A release in a catalog session is kept: `admin releases` lists it and `dpcurve sql`
/// evaluates it at new points without a charge.
#[test]
fn stored_releases_are_listed_and_evaluated_from_the_cli() {
    let dir = TempDir::new("cli-releases");
    let cat = private_table(&dir, 2_000, 3, "1", "1e-6");
    let admin = |args: &[&str]| admin_cmd(&cat, args);
    let sql =
        "SELECT k.release FROM (SELECT private_kde(x, 0.05, 0.5, 1e-7, lo => -3, hi => 3, points => 64) AS k FROM p)";
    let (code, out, err) = dpcurve(&["sql", "--catalog", &cat, "-c", sql, "--format", "csv"], None);
    assert_eq!(code, 0, "{err}");
    let id = out.lines().nth(1).unwrap().trim().to_string();
    assert!(id.starts_with('r'), "{out}");
    let (code, out, _) = admin(&["releases"]);
    assert_eq!(code, 0);
    assert!(out.contains(&id) && out.contains("private_kde") && out.contains("\"bandwidth\":0.05"), "{out}");
    assert!(admin(&["releases", "p"]).1.contains(&id));
    assert!(!admin(&["releases", "other"]).1.contains(&id));
    let svg = dir.str("r.svg");
    let eval = format!(
        "SELECT value / 10.0 AS x, release_eval('{id}', value / 10.0) AS density FROM generate_series(-30, 30)"
    );
    let (code, out, err) = dpcurve(&["sql", "--catalog", &cat, "-c", &eval, "--plot", "--svg", &svg], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().filter(|l| l.contains('|')).count() > 10, "no plot:\n{out}");
    let (_, out, _) = admin(&["log"]);
    assert_eq!(out.lines().count(), 1, "one charge only: {out}");
}

#[test]
fn repl_reads_statements_from_a_pipe_and_reports_errors() {
    let dir = TempDir::new("cli-repl");
    let table = data(&dir);
    let input = "SELECT 1 AS one;\nSELECT private_kde(x, -1, 1, 1e-6, 0, 1)\n  FROM t;\nSELECT 2 AS two;\n";
    let (code, out, err) = dpcurve(&["sql", "--table", &table], Some(input));
    assert!(out.contains("one") && out.contains("two"), "{out}");
    assert!(err.contains("argument 'bandwidth' must be a finite number > 0"), "{err}");
    assert_eq!(code, 1, "a failed statement in piped input gives a non-zero exit code");
}

#[test]
fn bad_usage_and_query_errors_have_exit_codes() {
    let (code, _, err) = dpcurve(&["sql", "--format", "xml"], None);
    assert_eq!(code, 2);
    assert!(err.contains("unknown format 'xml'"));
    let (code, _, err) = dpcurve(&["sql", "-c", "SELECT private_kde(1.0, 0.1, 1, 1e-6)"], None);
    assert_eq!(code, 1);
    assert!(err.contains("arguments 'lo' and 'hi' are required"), "{err}");
    let (code, out, _) = dpcurve(&["help"], None);
    assert_eq!(code, 0);
    assert!(out.contains("dpcurve demo"));
}

/// A statement whose expressions nest 10⁵ deep (`1 + 1 + …`, an OR chain in a WHERE, a `||`
/// chain, UNIONs) is refused with a planning error and exit status 1 — it used to overflow the
/// stack and abort the process (status 134) before the guard saw it.
#[test]
fn deeply_nested_statements_are_refused_not_a_crash() {
    let dir = TempDir::new("cli-deep");
    let t = data(&dir);
    let n = 100_000;
    for sql in [
        format!("SELECT {}", vec!["1"; n].join(" + ")),
        format!("SELECT count(*) FROM t WHERE {}", vec!["x = 1"; n].join(" OR ")),
        format!("SELECT {}", vec!["'a'"; n].join(" || ")),
        vec!["SELECT 1"; n].join(" UNION ALL "),
    ] {
        // 0.4–0.9 MB: more than one command-line argument may hold, so from a file.
        let file = dir.path("deep.sql");
        std::fs::write(&file, &sql).unwrap();
        let (code, _, err) = dpcurve(&["sql", "--table", &t, "-f", &file.to_string_lossy()], None);
        assert_eq!(code, 1, "{}: {err}", &sql[..40]);
        assert!(err.contains("nest deeper than 256"), "{err}");
    }
    // Ordinary depth still runs.
    let (code, out, err) = dpcurve(&["sql", "-c", &format!("SELECT {} AS s", vec!["1"; 200].join(" + "))], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("200"), "{out}");
}

#[test]
fn demo_writes_data_and_image_and_draws_both_curves() {
    let dir = TempDir::new("cli-demo");
    let out_dir = dir.str("demo");
    let (code, out, err) = dpcurve(&["demo", "--dir", &out_dir], None);
    assert_eq!(code, 0, "{err}");
    // The product at its best: the automatic bandwidth and the default mechanism.
    assert!(out.contains("private_kde(x, bandwidth => 'auto', epsilon => 0.5, delta => 0)"), "{out}");
    assert!(!out.contains("mechanism =>"), "the default mechanism: {out}");
    assert!(out.contains("* private_kde   o true density   (# = overlap, . = band)"), "{out}");
    assert!(dir.path("demo/mixture.parquet").exists());
    let svg = std::fs::read_to_string(dir.path("demo/kde.svg")).unwrap();
    // Four panels: two densities with the truth, one curve per component, the mean curve with the
    // sample mean; every release drawn with its band shaded.
    assert_eq!(svg.matches("<polyline").count(), 8, "{svg}");
    assert_eq!(svg.matches(r#"class="band""#).count(), 5, "one band per release: {svg}");
    // One grouped curve per declared key, in declared order.
    assert!(out.contains("GROUP BY component") && out.contains("* component=left   o component=right"), "{out}");
    assert!(
        out.contains("private_mean_curve") && out.contains("budget of 'curves': spent ε = 1, δ = 0.00001"),
        "{out}"
    );
    assert!(out.contains("n = 1000 rows"), "{out}");
    // Three pure-ε releases of ε = 0.5 (the grouped one is one charge: its groups are disjoint).
    assert!(out.contains("remaining ε = 0.5, δ = 0.00001"), "{out}");
    assert!(dir.path("demo/catalog.db").exists());
}

#[test]
fn example_sql_file_runs() {
    let dir = TempDir::new("cli-examples");
    let v: Vec<Option<f64>> = mixture(5_000, 10).into_iter().map(Some).collect();
    write_x(&dir.path("m.parquet"), &v);
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/kde_examples.sql");
    let table = format!("mixture={}", dir.str("m.parquet"));
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "--format", "csv", "-f", file], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("x,density") && out.contains("n_estimate"), "{out}");
}

/// `S1; S1` with budget for one: the first (paid) result is printed before the second is
/// refused — it used to be discarded with the error.
#[test]
fn each_statement_is_printed_as_it_completes() {
    let dir = TempDir::new("cli-each");
    let cat = private_table(&dir, 500, 13, "0.1", "1e-5");
    let one = "SELECT private_kde(x, 0.05, 0.1, 1e-6, 0, 1, 16)['release'] AS r FROM p";
    let (code, out, err) =
        dpcurve(&["sql", "--catalog", &cat, "--format", "json", "-c", &format!("{one}; {one}")], None);
    assert_eq!(code, 1, "{err}");
    assert!(out.starts_with("{\"r\":\"r1\"}"), "the first result is shown: {out}");
    assert!(err.contains("privacy budget exhausted"), "{err}");
}

/// The data owner's and the analyst's workflow end to end through the binary, as README
/// documents it: make a table private, query it until the budget runs out, see the refusal.
#[test]
fn admin_and_analyst_workflow_until_the_budget_runs_out() {
    let dir = TempDir::new("cli-catalog");
    let v: Vec<Option<f64>> = mixture(2_000, 12).into_iter().map(Some).collect();
    write_x(&dir.path("p.parquet"), &v);
    let cat = dir.str("catalog.db");
    let admin = |args: &[&str]| admin_cmd(&cat, args);
    let (code, out, err) = admin(&["register", "patients", &dir.str("p.parquet")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("registered 'patients'"));
    assert_eq!(admin(&["make-private", "patients", "--epsilon", "0.3", "--delta", "1e-5"]).0, 0);
    assert_eq!(admin(&["set-bounds", "patients", "x", "0", "1"]).0, 0);
    let (code, _, err) = admin(&["set-bounds", "patients", "age", "0", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("has no column 'age'"), "{err}");

    let query = "SELECT private_kde(x, bandwidth => 0.05, epsilon => 0.1, delta => 1e-6) AS kde FROM patients";
    for _ in 0..3 {
        let (code, out, err) = dpcurve(&["sql", "--catalog", &cat, "--format", "json", "-c", query], None);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("{\"kde\""), "{out}");
    }
    let (code, _, err) = dpcurve(&["sql", "--catalog", &cat, "-c", query], None);
    assert_eq!(code, 1);
    assert!(
        err.contains("privacy budget exhausted on table 'patients'") && err.contains("only ε = 0, δ = 0.00001 remains"),
        "{err}"
    );
    let (code, _, err) = dpcurve(&["sql", "--catalog", &cat, "-c", "SELECT x FROM patients"], None);
    assert_eq!(code, 1);
    assert!(err.contains("[rule no-raw-rows]"), "{err}");
    let (_, out, _) = dpcurve(
        &[
            "sql",
            "--catalog",
            &cat,
            "--format",
            "csv",
            "-c",
            "SELECT table_name, epsilon_remaining FROM dpcurve.budgets",
        ],
        None,
    );
    assert_eq!(out, "table_name,epsilon_remaining\npatients,0.0\n");

    let (code, out, _) = admin(&["list"]);
    assert_eq!(code, 0);
    assert!(out.contains("patients") && out.contains("private") && out.contains("x ∈ [0, 1]"), "{out}");
    assert!(out.contains("1 verified file(s)"), "{out}");
    let (_, out, _) = admin(&["log", "patients"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    // The default mechanism picks the pure-ε release here: charged (ε, 0).
    assert!(out.contains("private_kde") && out.contains("ε = 0.1, δ = 0 "), "{out}");
    assert_eq!(admin(&["raise-budget", "patients", "--epsilon", "0.2"]).0, 0);
    assert_eq!(dpcurve(&["sql", "--catalog", &cat, "-c", query], None).0, 0);
    // Files rewritten after their verification: refused, free, until `verify` reads them again.
    write_x(&dir.path("p.parquet"), &v[..1_000]);
    let (code, _, err) = dpcurve(&["sql", "--catalog", &cat, "-c", query], None);
    assert_eq!(code, 1);
    assert!(err.contains("rule verified-files"), "{err}");
    let (_, out, _) = admin(&["list"]);
    assert!(out.contains("FILES CHANGED since verified (admin verify)"), "{out}");
    assert!(err.contains("dpcurve admin verify patients"), "{err}");
    let (code, out, err) = admin(&["verify", "patients"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("'patients': 1 file(s) read whole"), "{out}");
    assert_eq!(dpcurve(&["sql", "--catalog", &cat, "-c", query], None).0, 0);
    let (code, _, err) = admin(&["verify", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no table named 'nope'"), "{err}");

    let (code, _, err) = dpcurve(&["sql", "--catalog", &cat, "--table", "t=x.parquet"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--table cannot be used with --catalog"));
    let (code, _, err) = dpcurve(&["sql", "--catalog", &dir.str("nope.db"), "-c", "SELECT 1"], None);
    assert_eq!(code, 1);
    assert!(err.contains("no catalog at"), "{err}");
}

#[test]
fn mean_curve_example_sql_file_runs() {
    let dir = TempDir::new("cli-mc-examples");
    let curves = dpcurve::datagen::karhunen_loeve_curves(200, 100, 3);
    dpcurve::cli::demo::write_curves_parquet(&dir.path("c.parquet"), &curves).unwrap();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/mean_curve_examples.sql");
    let table = format!("curves={}", dir.str("c.parquet"));
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "--format", "csv", "-f", file], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("t,mean") && out.contains("n_estimate"), "{out}");
    assert!(out.lines().filter(|l| l.starts_with("0.") || l.starts_with("1.")).count() >= 100, "{out}");
}

/// `dpcurve … | true`: when the reader of the output is gone, the process ends quietly
/// (SIGPIPE's default action) — never with a panic on the broken pipe. The pipe's read end is
/// closed before the process starts, so every write fails.
#[test]
fn a_closed_output_pipe_ends_the_process_without_a_panic() {
    let dir = TempDir::new("cli-pipe");
    let v: Vec<Option<f64>> = mixture(100, 3).into_iter().map(Some).collect();
    write_x(&dir.path("p.parquet"), &v);
    let cat = dir.str("catalog.db");
    let (code, _, err) = dpcurve(&["admin", "--catalog", &cat, "register", "t", &dir.str("p.parquet")], None);
    assert_eq!(code, 0, "{err}");
    for args in [
        vec!["admin", "--catalog", &cat, "list"],
        vec!["sql", "-c", "SELECT * FROM unnest(range(0, 1000))"],
        vec!["help"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_dpcurve"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: exit by panic");
    }
}

#[test]
fn admin_memory_limit_keys_and_locations_commands() {
    let dir = TempDir::new("cli-admin-more");
    let cat = private_table(&dir, 500, 3, "1", "1e-6");
    let admin = |args: &[&str]| admin_cmd(&cat, args);
    let (code, out, err) = admin(&["set-memory-limit", "512MiB"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("512 MiB"), "{out}");
    let (code, _, err) = admin(&["set-memory-limit", "1KiB"]);
    assert_eq!(code, 1);
    assert!(err.contains("between 64 MiB and 1 TiB"), "{err}");
    let (code, _, err) = admin(&["set-memory-limit", "lots"]);
    assert_eq!(code, 2, "{err}");
    // x is Float64: keys cannot be declared on it.
    let (code, _, err) = admin(&["set-keys", "p", "x", "1", "2"]);
    assert_eq!(code, 1);
    assert!(err.contains("group keys can be declared for integer, string"), "{err}");
    let (code, out, _) = admin(&["list"]);
    assert_eq!(code, 0);
    assert!(out.contains("memory limit: 512 MiB"), "{out}");
    // Keys from a public table's column, and a privacy unit, through the binary.
    write_x(&dir.path("pub.parquet"), &[Some(1.0), Some(2.0)]);
    assert_eq!(admin(&["register", "pub", &dir.str("pub.parquet")]).0, 0);
    let (code, _, err) = admin(&["set-keys", "p", "x", "--from", "pub.x"]);
    assert_eq!(code, 1);
    assert!(err.contains("group keys can be declared for integer, string"), "{err}");
    let (code, out, err) = admin(&["set-privacy-unit", "p", "x", "--max-rows", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("at most 3 rows per unit and group, in at most 1 groups"), "{out}");
    assert!(admin(&["list"]).1.contains("unit x (≤ 3 rows, ≤ 1 groups)"));
    let (code, _, err) = admin(&["set-privacy-unit", "p", "x"]);
    assert_eq!(code, 2, "{err}");
    // The public row bound: set, listed, refused out of range, on a public table, or not a number.
    let (code, out, err) = admin(&["set-row-bound", "p", "1000"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("'p' holds at most 1000 rows (public)"), "{out}");
    assert!(admin(&["list"]).1.contains("≤ 1000 rows"));
    let (code, _, err) = admin(&["set-row-bound", "p", "0"]);
    assert_eq!(code, 1);
    assert!(err.contains("the row bound must be in [1, 9007199254740992], got 0"), "{err}");
    let (code, _, err) = admin(&["set-row-bound", "pub", "10"]);
    assert_eq!(code, 1);
    assert!(err.contains("table 'pub' is public; make it private first"), "{err}");
    let (code, _, err) = admin(&["set-row-bound", "p", "many"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = admin(&["set-row-bound", "p", "none"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("'p' declares no row bound"), "{out}");
    assert!(!admin(&["list"]).1.contains("≤ 1000 rows"));
    let (code, out, err) = admin(&["migrate-locations"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("already absolute"), "{out}");
}

/// A grouped result plots one curve per group, each named by its group.
#[test]
fn grouped_curves_are_plotted_one_per_group() {
    let dir = TempDir::new("cli-grouped-plot");
    let table = data(&dir);
    let svg = dir.str("g.svg");
    let sql = "SELECT x > 0.5 AS upper_half, private_kde(x, 0.05, 1, 1e-6, lo => 0, hi => 1, points => 32) AS kde \
               FROM t GROUP BY x > 0.5 ORDER BY upper_half";
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "-c", sql, "--plot", "--svg", &svg], None);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("kde [upper_half=false] (density)") && out.contains("kde [upper_half=true] (density)"),
        "{out}"
    );
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(doc.matches("<polyline").count(), 2, "{doc}");
}

/// A 2-D density is drawn as a heat map: shaded characters in the terminal, coloured cells in
/// the SVG — not mistaken for a curve of y against x.
#[test]
fn a_2d_density_is_drawn_as_a_heat_map() {
    use std::sync::Arc;
    let dir = TempDir::new("cli-kde2d");
    let xs = mixture(4_000, 21);
    let ys: Vec<f64> = xs.iter().zip(mixture(4_000, 22)).map(|(x, e)| x + 0.3 * (e - 0.5)).collect();
    common::write_columns(
        &dir.path("p.parquet"),
        vec![
            ("x", Arc::new(datafusion::arrow::array::Float64Array::from(xs)) as _),
            ("y", Arc::new(datafusion::arrow::array::Float64Array::from(ys)) as _),
        ],
    );
    let table = format!("p={}", dir.str("p.parquet"));
    let svg = dir.str("k.svg");
    let sql = "SELECT private_kde2d(x, y, 0.06, 0.06, 2, 1e-6, lo_x => 0, hi_x => 1, lo_y => -0.2, hi_y => 1.2, \
               points_x => 30, points_y => 20) AS k FROM p";
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "-c", sql, "--plot", "--svg", &svg], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("k row 1 (density)"), "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(" |")).collect();
    assert!(rows.len() >= 24, "no heat map:\n{out}");
    assert!(rows.iter().any(|l| l.contains('@')) && out.contains("shades"), "{out}");
    // Its band: named under the terminal map, and in the SVG.
    assert!(out.contains("band ± up to") && out.contains("grid points clear of 0"), "{out}");
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(doc.matches(r#"class="cell""#).count(), 30 * 20, "one cell per grid point");
    assert!(doc.contains(r#"class="band-caption""#), "the band is named in the picture");
    assert!(!doc.contains("<polyline"), "not drawn as a curve");
}

/// A kernel regression and a classifier are drawn as curves of x (terminal and SVG), one per call.
#[test]
fn kernel_fits_are_plotted_as_curves() {
    use std::sync::Arc;
    let dir = TempDir::new("cli-kernel-fit");
    let xs = mixture(3_000, 31);
    let ys: Vec<f64> = xs.iter().map(|x| (6.0 * x).sin()).collect();
    common::write_columns(
        &dir.path("r.parquet"),
        vec![
            ("x", Arc::new(datafusion::arrow::array::Float64Array::from(xs)) as _),
            ("y", Arc::new(datafusion::arrow::array::Float64Array::from(ys)) as _),
        ],
    );
    let table = format!("r={}", dir.str("r.parquet"));
    let svg = dir.str("f.svg");
    let sql = "SELECT private_kernel_regression(y, x, 2, 1e-6, lo => 0, hi => 1, lo_y => -1, hi_y => 1) AS f, \
               private_kernel_classifier(y > 0, x, 2, 1e-6, lo => 0, hi => 1) AS c FROM r";
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "-c", sql, "--plot", "--svg", &svg], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("f row 1 (fit)") && out.contains("c row 2 (score)"), "{out}");
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(doc.matches("<polyline").count(), 2, "{doc}");
}

#[test]
fn admin_analyst_commands_print_the_token_once_and_list_shares() {
    let dir = TempDir::new("cli-analysts");
    write_x(&dir.path("d.parquet"), &mixture(500, 3).into_iter().map(Some).collect::<Vec<_>>());
    let cat = dir.str("cat.db");
    assert_eq!(admin_cmd(&cat, &["register", "t", &dir.str("d.parquet")]).0, 0);
    assert_eq!(admin_cmd(&cat, &["make-private", "t", "--epsilon", "2", "--delta", "1e-5"]).0, 0);
    let (code, token, err) = admin_cmd(&cat, &["add-analyst", "alice"]);
    assert_eq!(code, 0, "{err}");
    let token = token.trim();
    assert!(token.starts_with("dpc1.alice.") && !token.contains(' '), "stdout is the token alone: {token}");
    assert!(err.contains("shown only now"), "{err}");
    let catalog = dpcurve::policy::Catalog::open(std::path::Path::new(&cat)).unwrap();
    assert_eq!(catalog.authenticate(token).unwrap(), "alice");
    let (code, _, err) = admin_cmd(&cat, &["grant", "alice", "t", "--epsilon", "0.5", "--delta", "1e-6"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = admin_cmd(&cat, &["grant", "bob", "t", "--epsilon", "0.5", "--delta", "0"]);
    assert!(code != 0 && err.contains("no active analyst named 'bob'"), "{err}");
    let (_, list, _) = admin_cmd(&cat, &["analysts"]);
    assert!(list.contains("alice") && list.contains("active") && list.contains("0.5"), "{list}");
    let (code, new_token, _) = admin_cmd(&cat, &["rotate-token", "alice"]);
    assert_eq!(code, 0);
    assert!(catalog.authenticate(token).is_err() && catalog.authenticate(new_token.trim()).is_ok());
    assert_eq!(admin_cmd(&cat, &["remove-analyst", "alice"]).0, 0);
    assert!(catalog.authenticate(new_token.trim()).is_err());
    let (_, list, _) = admin_cmd(&cat, &["analysts"]);
    assert!(list.contains("removed"), "{list}");
    // The table owner's CLI session still works, and its releases are logged as the owner's.
    let (code, _, err) =
        dpcurve(&["sql", "--catalog", &cat, "-c", "SELECT private_kde(x, 0.05, 0.5, 0, 0, 1, 16) AS k FROM t"], None);
    assert_eq!(code, 0, "{err}");
    let (_, log, _) = admin_cmd(&cat, &["log"]);
    assert!(log.contains("(owner)"), "{log}");
}

/// A CDF and quantiles are drawn as curves with their bands (half-widths for the CDF, the lower
/// and upper quantile bounds for the quantiles), terminal and SVG.
#[test]
fn distribution_functions_and_quantiles_are_plotted_with_their_bands() {
    let dir = TempDir::new("cli-cdf");
    let table = data(&dir);
    let svg = dir.str("c.svg");
    let sql = "SELECT private_cdf(x, 1, 0, lo => 0, hi => 1, points => 64) AS c, \
               private_quantiles(x, [0.05, 0.25, 0.5, 0.75, 0.95], 1, 0, lo => 0, hi => 1) AS q FROM t";
    let (code, out, err) = dpcurve(&["sql", "--table", &table, "-c", sql, "--plot", "--svg", &svg], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("c row 1 (cdf)") && out.contains("q row 2 (quantile)"), "{out}");
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(doc.matches("<polyline").count(), 2, "{doc}");
    assert_eq!(doc.matches(r#"<polygon class="band""#).count(), 2, "both bands are shaded: {doc}");
}

/// Simulated band quantiles persist beside the catalog (`catalog.db.cache/`): a second process
/// reads them instead of simulating again, and a damaged cache is ignored and rewritten — with
/// the same band every time.
/// The one row of `sql` (a band list, then a number) run in its own `dpcurve sql` process.
fn band_and_scale(cat: &str, sql: &str) -> (Vec<f64>, f64) {
    let (code, out, err) = dpcurve(&["sql", "--catalog", cat, "-c", sql, "--format", "csv"], None);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().nth(1).unwrap_or_else(|| panic!("{out}"));
    let (band, scale) = row.trim_start_matches("\"[").split_once("]\",").unwrap();
    (band.split(", ").map(|v| v.parse::<f64>().unwrap()).collect(), scale.parse().unwrap())
}

/// Equal up to rounding (relative 1e-9).
fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-9 * x.abs())
}

#[test]
fn band_simulations_are_cached_beside_the_catalog() {
    let dir = TempDir::new("cli-band-cache");
    let cat = private_table(&dir, 2_000, 5, "10", "1e-6");
    let sql = "SELECT k['noise_band'] AS band, k['mass'] AS mass FROM (SELECT private_kde(x, 0.05, 0.5, 0, \
               lo => -3, hi => 3, points => 64) AS k FROM p)";
    // The band of the kernel sum (the density's band times the released mass): a function of
    // public parameters only, so equal across releases up to rounding.
    let run = || -> Vec<f64> {
        let (band, mass) = band_and_scale(&cat, sql);
        band.iter().map(|b| b * mass).collect()
    };
    let cache = dir.path("catalog.db.cache");
    assert!(!cache.exists());
    let cold = run();
    assert_eq!(cold.len(), 64);
    let files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().unwrap() == "value")
            .collect()
    };
    assert_eq!(files().len(), 1, "one simulated quantile stored");
    let stored = std::fs::read(&files()[0]).unwrap();
    let (key, value) = read_entry(&files()[0]).unwrap();
    assert!(key.starts_with("kde-laplace-band v1 "), "{key}");
    let warm = run();
    assert!(same(&warm, &cold), "the stored quantile gives the same band: {warm:?} vs {cold:?}");
    for f in files() {
        std::fs::write(f, "not a value").unwrap();
    }
    let rebuilt = run();
    assert!(same(&rebuilt, &cold), "a damaged entry is recomputed: {rebuilt:?} vs {cold:?}");
    assert_eq!(std::fs::read(&files()[0]).unwrap(), stored, "and rewritten");
    // The stored value is what the band uses: an intact entry holding twice the quantile doubles
    // the band (a negative control for the comparisons above, which a cache never read would pass).
    let q = f64::from_le_bytes(value.try_into().unwrap());
    DiskStore::beside(&dir.path("catalog.db")).put(&key, &(2.0 * q).to_le_bytes());
    let doubled: Vec<f64> = cold.iter().map(|b| 2.0 * b).collect();
    let read = run();
    assert!(same(&read, &doubled), "{read:?} vs {doubled:?}");
}

/// The mean curve's eigenbasis (O(m³): ≈ 1 s at m = 1000) is stored beside the catalog and read by
/// the next process — only when no one but the catalog's owner could have written it, since a
/// basis calibrates the noise.
#[cfg(unix)]
#[test]
fn eigenbases_are_stored_beside_the_catalog_and_trusted_only_from_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("cli-eigen-cache");
    let curves = dpcurve::datagen::karhunen_loeve_curves(300, 60, 3);
    dpcurve::cli::demo::write_curves_parquet(&dir.path("c.parquet"), &curves).unwrap();
    let cat = dir.str("catalog.db");
    assert_eq!(admin_cmd(&cat, &["register", "c", &dir.str("c.parquet")]).0, 0);
    assert_eq!(admin_cmd(&cat, &["make-private", "c", "--epsilon", "100", "--delta", "1e-3"]).0, 0);
    let sql = "SELECT m['noise_band'] AS band, m['n'] AS n FROM (SELECT private_mean_curve(c, 1, 1e-6, \
               clip => 4, range => 0.3) AS m FROM c)";
    // The band times the released count: a function of public parameters and the basis only.
    let run = || -> Vec<f64> {
        let (band, n) = band_and_scale(&cat, sql);
        band.iter().map(|b| b * n.max(1.0)).collect()
    };
    let cold = run();
    assert_eq!(cold.len(), 60);
    let cache = dir.path("catalog.db.cache");
    let basis = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| read_entry(p).is_some_and(|(k, _)| k.starts_with("eigenbasis v1 ")))
        .expect("the eigenbasis is stored");
    let (key, value) = read_entry(&basis).unwrap();
    assert_eq!(std::fs::metadata(&basis).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(same(&run(), &cold), "the stored basis gives the same band");
    // A planted basis (λ × 4: other noise, another band) in a file only the owner may write is read:
    // the control that shows the store is used ...
    let mut f: Vec<f64> = value.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    let j = f[1] as usize;
    f[3..3 + j].iter_mut().for_each(|l| *l *= 4.0);
    let planted: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
    let store = DiskStore::beside(&dir.path("catalog.db"));
    store.put(&key, &planted);
    let read = run();
    assert!(!same(&read, &cold), "the planted basis is read: {read:?}");
    // ... and the same file writable by the group is not: the basis is computed again.
    std::fs::set_permissions(&basis, std::fs::Permissions::from_mode(0o660)).unwrap();
    assert!(same(&run(), &cold), "a basis others could have written is not trusted");
    assert_eq!(read_entry(&basis).unwrap().1, value, "and it is rewritten");
    assert_eq!(std::fs::metadata(&basis).unwrap().permissions().mode() & 0o777, 0o600);
}
