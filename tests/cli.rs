//! The `dpcurve` binary, run as a user would.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{TempDir, mixture, write_x};

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

#[test]
fn demo_writes_data_and_image_and_draws_both_curves() {
    let dir = TempDir::new("cli-demo");
    let out_dir = dir.str("demo");
    let (code, out, err) = dpcurve(&["demo", "--dir", &out_dir], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("σ = 8.0576"), "{out}");
    assert!(out.contains("* private") && out.contains("o non-private KDE"), "{out}");
    assert!(dir.path("demo/mixture.parquet").exists());
    let svg = std::fs::read_to_string(dir.path("demo/kde.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4, "two panels of two curves");
    assert!(out.contains("n = 1000 rows"), "{out}");
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
