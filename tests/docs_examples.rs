//! The book cannot rot: every ```` ```sql runnable ```` block of README.md and docs/ runs, as
//! written, through the shipped binary in an analyst session on the catalog `dpcurve demo` writes
//! (`dpcurve sql --catalog DIR/catalog.db -c BLOCK`), and prints a result.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::TempDir;

/// One runnable example: where it is written, and its SQL.
struct Example {
    place: String,
    sql: String,
}

/// The ```` ```sql runnable ```` blocks of one Markdown file.
fn runnable_blocks(path: &Path) -> Vec<Example> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut current {
            None if line.trim_start().starts_with("```sql runnable") => current = Some((i + 1, String::new())),
            Some((start, sql)) if line.trim_start().starts_with("```") => {
                out.push(Example { place: format!("{}:{start}", path.display()), sql: std::mem::take(sql) });
                current = None;
            }
            Some((_, sql)) => {
                sql.push_str(line);
                sql.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "{}: a runnable block is not closed", path.display());
    out
}

/// README.md and every page under docs/, in a fixed order.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md")];
    let mut stack = vec![root.join("docs")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages[1..].sort();
    pages
}

fn dpcurve(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dpcurve")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs one example on `catalog`: Ok(its output) or Err(why it failed).
fn run(catalog: &str, example: &Example) -> Result<String, String> {
    let (ok, out, err) = dpcurve(&["sql", "--catalog", catalog, "-c", &example.sql]);
    if !ok {
        return Err(format!("{}: failed: {err}\n{}", example.place, example.sql));
    }
    if out.trim().is_empty() {
        return Err(format!("{}: printed nothing\n{}", example.place, example.sql));
    }
    Ok(out)
}

#[test]
fn every_runnable_example_of_the_book_runs_on_the_demo_catalog() {
    let dir = TempDir::new("docs-examples");
    let demo = dir.str("demo");
    let (ok, _, err) = dpcurve(&["demo", "--dir", &demo]);
    assert!(ok, "dpcurve demo failed: {err}");
    let catalog = format!("{demo}/catalog.db");
    // The examples spend budget; the data owner gives the tables enough for all of them.
    for table in ["mixture", "curves"] {
        let (ok, _, err) =
            dpcurve(&["admin", "--catalog", &catalog, "raise-budget", table, "--epsilon", "100", "--delta", "0.001"]);
        assert!(ok, "{err}");
    }

    let examples: Vec<Example> = pages().iter().flat_map(|p| runnable_blocks(p)).collect();
    let covered: std::collections::BTreeSet<&str> =
        examples.iter().map(|e| e.place.rsplit_once(':').map_or("", |(p, _)| p)).collect();
    // Every function page and the front page show something that runs.
    for page in [
        "README.md",
        "private_kde.md",
        "private_kde2d.md",
        "private_kernel_regression.md",
        "private_mean_curve.md",
        "private_cdf.md",
        "releases.md",
        "post-processing.md",
        "groups-and-units.md",
    ] {
        assert!(covered.iter().any(|p| p.ends_with(page)), "no runnable example on {page}: {covered:?}");
    }
    let failures: Vec<String> = examples.iter().filter_map(|e| run(&catalog, e).err()).collect();
    assert!(failures.is_empty(), "{} of {} examples failed:\n{}", failures.len(), examples.len(), failures.join("\n"));

    // Negative control: the harness notices an example that does not run, and one whose table the
    // demo does not have.
    for broken in [
        "SELECT private_kde(nope, 'auto', 0.5, 0) AS kde FROM mixture;",
        "SELECT private_kde(x, 'auto', 0.5, 0) AS kde FROM patients;",
        "SELECT x FROM mixture;",
    ] {
        let example = Example { place: "control".into(), sql: broken.into() };
        assert!(run(&catalog, &example).is_err(), "{broken}");
    }
    // … and the block parser finds blocks (and only runnable ones).
    let page = dir.path("page.md");
    std::fs::write(&page, "```sql\nSELECT 1;\n```\n```sql runnable\nSELECT 2;\n```\n").unwrap();
    let blocks = runnable_blocks(&page);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].sql, "SELECT 2;\n");
}
