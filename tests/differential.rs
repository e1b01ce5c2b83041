//! A differential fuzzer (SPEC §0): generated analyst queries — a grammar over the private
//! functions, the allowlisted expressions, CASE/AND/OR, declared keys, casts of keys, partition
//! selection, a privacy unit, named parameters, ORDER BY/LIMIT above, and multi-statement strings —
//! each run on two neighbouring catalogs (with and without alice's row: a row with the only `g3`,
//! code `'01'`, flag `'t'`, and her own unit). Any difference but the released numbers (row count,
//! row order, group keys, release ids, error presence and text, charges, stored releases) fails the
//! test and prints the query. Negative control: the same generator over unguarded public copies of
//! the tables finds differences. Seeded; `DPCURVE_FUZZ_CASES=N` runs N queries (default 80).

mod common;

use common::neighbours::{Neighbours, text_rows};
use dpcurve::{DpSession, SessionOptions};
use rand::rngs::ChaCha20Rng;
use rand::{Rng, SeedableRng};

fn cases() -> usize {
    std::env::var("DPCURVE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(80)
}

fn pick<'a>(rng: &mut ChaCha20Rng, pool: &[&'a str]) -> &'a str {
    pool[rng.next_u32() as usize % pool.len()]
}

/// A boolean expression over the table's columns, `depth` levels of AND/OR/NOT/CASE deep.
fn predicate(rng: &mut ChaCha20Rng, depth: u32) -> String {
    const ATOMS: &[&str] = &[
        "name = 'alice'",
        "name <> 'alice'",
        "g = 'g3'",
        "g IN ('g0', 'g3')",
        "x > 0.5",
        "x BETWEEN 0.2 AND 0.6",
        "TRY_CAST(code AS INT) = 1",
        "CAST(code AS INT) = 1",
        "CAST(flag AS BOOLEAN)",
        "ltrim(name, 'ace') = 'li'",
        "name LIKE 'a%'",
        "name ~ '^al'",
        "upper(name) = 'ALICE'",
        "character_length(concat(name, g)) > 5",
        "coalesce(x, 0.0) < 0.3",
        "nullif(code, '01') IS NULL",
        "x / 0.0 > 1.0",
        "power(x, 0.5) > 0.7",
        "substr(name, 1, 2) = 'al'",
        "starts_with(unit, 'u1')",
    ];
    if depth == 0 || rng.next_u32().is_multiple_of(3) {
        return pick(rng, ATOMS).to_string();
    }
    let (a, b) = (predicate(rng, depth - 1), predicate(rng, depth - 1));
    match rng.next_u32() % 5 {
        0 => format!("({a} AND {b})"),
        1 => format!("({a} OR {b})"),
        2 => format!("NOT ({a})"),
        3 => format!("CASE WHEN {a} THEN {b} ELSE true END"),
        _ => format!("CASE WHEN {a} THEN x > 0.1 WHEN {b} THEN false END"),
    }
}

/// One private call (tiny ε: the catalogs' budgets last the whole run), and the key of the
/// released struct to show.
fn call(rng: &mut ChaCha20Rng, grouping: &str) -> String {
    let select = if grouping == "unit" { ", select_epsilon => 20, select_delta => 1e-9" } else { "" };
    let data = pick(rng, &["x", "CASE WHEN name = 'alice' THEN x ELSE 1.0 - x END", "coalesce(x, 0.5)"]);
    match rng.next_u32() % 8 {
        0..=3 => format!("private_kde({data}, 0.1, 1e-12, 1e-18, 0, 1, points => 16{select})"),
        4 | 5 => format!("private_kde({data}, bandwidth => 0.2, epsilon => 1e-12, delta => 0, points => 8{select})"),
        6 => format!(
            "private_kde2d({data}, x, 0.2, 0.2, 1e-12, 1e-18, lo_x => 0, hi_x => 1, lo_y => 0, hi_y => 1, \
             points_x => 6, points_y => 6{select})"
        ),
        _ => format!(
            "private_kernel_regression(x, {data}, 1e-12, 1e-18, lo => 0, hi => 1, lo_y => 0, hi_y => 1, \
             points => 5{select})"
        ),
    }
}

/// One generated statement over `table` (`p`: the row is the unit; `q`: a person is).
fn statement(rng: &mut ChaCha20Rng, table: &str) -> String {
    let grouping = pick(rng, &["", "", "g", "CAST(code AS INT)", "CAST(flag AS BOOLEAN)", "unit"]);
    let grouping = if table == "q" && grouping == "unit" { "g" } else { grouping };
    let f = call(rng, grouping);
    let pred = predicate(rng, 2);
    let field = pick(rng, &["release", "release"]);
    let inner = if grouping.is_empty() {
        format!("SELECT {f} AS k FROM {table} WHERE {pred}")
    } else {
        format!("SELECT {grouping} AS key, {f} AS k FROM {table} WHERE {pred} GROUP BY {grouping}")
    };
    let cols = if grouping.is_empty() { format!("k['{field}']") } else { format!("key, k['{field}']") };
    match rng.next_u32() % 4 {
        0 => format!("SELECT {cols} FROM ({inner})"),
        1 if !grouping.is_empty() => format!("SELECT {cols} FROM ({inner}) ORDER BY key"),
        2 => format!("SELECT {cols} FROM ({inner}) LIMIT 1"),
        _ => format!("SELECT {cols}, 1 AS one FROM ({inner})"),
    }
}

fn query(rng: &mut ChaCha20Rng) -> String {
    let table = pick(rng, &["p", "q"]);
    let first = statement(rng, table);
    if rng.next_u32().is_multiple_of(5) { format!("{first}; {}", statement(rng, "p")) } else { first }
}

#[tokio::test]
async fn generated_queries_cannot_tell_neighbours_apart() {
    let n = Neighbours::new("diff").await;
    let mut rng = ChaCha20Rng::seed_from_u64(0xd1ff);
    let (mut ok, mut refused) = (0, 0);
    for i in 0..cases() {
        let sql = query(&mut rng);
        let partitions = 1 + (i % 3);
        let (a, b) = n.observe(&sql, partitions).await;
        assert_eq!(a, b, "case {i}: the neighbours differ on\n{sql}");
        if a.error.is_none() { ok += 1 } else { refused += 1 }
    }
    eprintln!("{ok} generated queries ran, {refused} were refused, identically on both sides");
    assert!(ok > cases() / 4, "too few queries ran ({ok}): the generator tests little");
}

/// Negative control: the same generator over unguarded public copies of the tables (no gate, no
/// canonical groups, no eager forms) finds differences — the comparison is not vacuous.
#[tokio::test]
async fn on_public_copies_the_fuzzer_finds_differences() {
    let n = Neighbours::new("diff-control").await;
    let sessions: Vec<DpSession> = [&n.with, &n.without]
        .iter()
        .map(|_| DpSession::new(SessionOptions { target_partitions: Some(2), ..Default::default() }))
        .collect();
    for (s, side) in sessions.iter().zip([&n.with, &n.without]) {
        for t in ["p", "q"] {
            s.register_parquet(t, &side.0.str(&format!("{t}.parquet"))).await.unwrap();
        }
    }
    let mut rng = ChaCha20Rng::seed_from_u64(0xd1ff);
    let mut differ = 0;
    for _ in 0..cases().min(60) {
        let sql = query(&mut rng);
        let show = |r: datafusion::common::Result<Vec<datafusion::arrow::array::RecordBatch>>| match r {
            Ok(b) => {
                (text_rows(&b).len(), text_rows(&b).into_iter().map(|r| r.first().cloned()).collect::<Vec<_>>(), None)
            }
            Err(e) => (0, Vec::new(), Some(e.to_string())),
        };
        let single = sql.split(';').next().unwrap().to_string();
        let a = show(sessions[0].query(&single).await);
        let b = show(sessions[1].query(&single).await);
        if a != b {
            differ += 1;
        }
    }
    assert!(differ > 0, "unguarded copies should reveal alice through some generated query");
}
