//! Privacy units (SPEC §7) through real SQL on a catalog: a unit's contribution is bounded to
//! `max_rows` rows per group in at most `max_groups` groups, chosen by a keyed hash (never by row
//! order), identically under any file layout and partitioning; the noise is calibrated for the
//! bound; one charge per call.

mod common;

use std::sync::Arc;

use common::TempDir;
use datafusion::arrow::array::{
    ArrayRef, AsArray, DictionaryArray, Float64Array, Float64Builder, Int64Array, ListBuilder, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type};
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

/// K and L of the policy.
const MAX_ROWS: i64 = 4;
const MAX_GROUPS: i64 = 2;
/// The fixtures' declared row bound (public: the same for neighbours).
const ROW_BOUND: i64 = 100_000;

#[derive(Clone)]
struct Row {
    meter: String,
    region: &'static str,
    x: f64,
    curve: [f64; 8],
}

/// 200 ordinary meters with 5 rows each; with `big`, one meter with 1 000 rows: its first 10
/// rows (in file order) at x = 0.1, the other 990 at x = 0.9, spread over the four regions.
fn rows(big: bool) -> Vec<Row> {
    let regions = ["a", "b", "c", "d"];
    let mut out = Vec::new();
    for m in 0..200 {
        for j in 0..5 {
            let i = m * 5 + j;
            let x = ((i * 37) % 101) as f64 / 100.0 * 0.6 + 0.2;
            out.push(Row {
                meter: format!("m{m}"),
                region: regions[(m + j) % 3],
                x,
                curve: std::array::from_fn(|t| x * t as f64 / 7.0),
            });
        }
    }
    if big {
        for i in 0..1000 {
            let x = if i < 10 { 0.1 } else { 0.9 };
            out.push(Row { meter: "big".into(), region: regions[i % 4], x, curve: [2.0; 8] });
        }
    }
    out
}

fn write(path: &std::path::Path, rows: &[Row]) {
    write_with(path, rows, false)
}

/// [`write`], with the text columns (the unit `meter` and the key `region`) dictionary-encoded
/// when `dictionary` is set.
fn write_with(path: &std::path::Path, rows: &[Row], dictionary: bool) {
    let text = |values: Vec<&str>| -> ArrayRef {
        if dictionary {
            Arc::new(values.into_iter().collect::<DictionaryArray<Int32Type>>())
        } else {
            Arc::new(StringArray::from(values))
        }
    };
    let mut curves = ListBuilder::new(Float64Builder::new());
    for r in rows {
        curves.values().append_slice(&r.curve);
        curves.append(true);
    }
    let curves = curves.finish();
    common::write_columns(
        path,
        vec![
            ("meter", text(rows.iter().map(|r| r.meter.as_str()).collect())),
            // The same unit as an integer id (grouped by value inside the bound, not by its hash).
            (
                "meter_id",
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| match r.meter.strip_prefix('m') {
                    Some(m) => m.parse::<i64>().unwrap(),
                    None => 1_000_000,
                }))),
            ),
            ("region", text(rows.iter().map(|r| r.region).collect())),
            ("x", Arc::new(Float64Array::from(rows.iter().map(|r| r.x).collect::<Vec<_>>()))),
            ("load", Arc::new(curves)),
        ],
    );
}

struct Fixture {
    dir: TempDir,
    admin: Admin,
}

/// Tables: `with` (the big meter in), `without` (neighbour: the big meter out), `shuffled`
/// (`with` in reverse order over three files), and `rowwise` (`with` without a privacy unit);
/// `with_id` and `without_id` are `with` and `without` with the unit named by its integer id.
async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    let with = rows(true);
    write(&dir.path("with.parquet"), &with);
    write(&dir.path("without.parquet"), &rows(false));
    write(&dir.path("rowwise.parquet"), &with);
    write(&dir.path("with_id.parquet"), &with);
    write(&dir.path("without_id.parquet"), &rows(false));
    std::fs::create_dir_all(dir.path("shuffled")).unwrap();
    let mut reversed = with.clone();
    reversed.reverse();
    for (i, part) in reversed.chunks(reversed.len() / 3 + 1).enumerate() {
        write(&dir.path(&format!("shuffled/part{i}.parquet")), part);
    }
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    for t in ["with", "without", "rowwise", "shuffled", "with_id", "without_id"] {
        let location = if t == "shuffled" { dir.str("shuffled") } else { dir.str(&format!("{t}.parquet")) };
        admin.register(t, &location).await.unwrap();
        admin.make_private(t, 1000.0, 1e-2).await.unwrap();
        admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
        admin.set_keys(t, "region", &["a".into(), "b".into(), "c".into(), "d".into()]).await.unwrap();
        if t.ends_with("_id") {
            admin.set_privacy_unit(t, "meter_id", MAX_ROWS, MAX_GROUPS).await.unwrap();
        } else if t != "rowwise" {
            admin.set_privacy_unit(t, "meter", MAX_ROWS, MAX_GROUPS).await.unwrap();
        }
        // One public bound for neighbours with and without the big meter.
        admin.set_row_bound(t, Some(ROW_BOUND)).unwrap();
    }
    Fixture { dir, admin }
}

impl Fixture {
    async fn session(&self, noise: NoiseSource, partitions: usize) -> AnalystSession {
        let opts = SessionOptions { noise, target_partitions: Some(partitions), ..Default::default() };
        AnalystSession::open(&self.dir.path("catalog.db"), opts).await.unwrap()
    }

    fn spent(&self, table: &str) -> Budget {
        self.admin.tables().unwrap().into_iter().find(|t| t.name == table).unwrap().policy.unwrap().spent
    }
}

const KDE: &str = "private_kde(x, 0.02, 1.0, 1e-6, points => 101, mechanism => 'gaussian')";
const MEAN: &str = "private_mean_curve(load, 1.0, 1e-6, points => 8, clip => 10)";

/// The bytes the plan's unit bound may hold, from its `EXPLAIN` line.
fn memory_share_of(plan: &str) -> u64 {
    let at = plan.find("memory <= ").unwrap_or_else(|| panic!("no memory share in\n{plan}")) + "memory <= ".len();
    plan[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

fn one_f64(b: &[RecordBatch]) -> f64 {
    b[0].column(0).as_primitive::<Float64Type>().value(0)
}

/// The noiseless kernel sum (density × mass) on the grid.
async fn kernel_sum(s: &AnalystSession, table: &str) -> Vec<f64> {
    let b = s.query(&format!("SELECT r['density'], r['mass'] FROM (SELECT {KDE} AS r FROM {table})")).await.unwrap();
    let d = b[0].column(0).as_list::<i32>().value(0);
    let mass = b[0].column(1).as_primitive::<Float64Type>().value(0);
    d.as_primitive::<Float64Type>().values().iter().map(|v| v * mass).collect()
}

#[tokio::test]
async fn a_unit_with_1000_rows_moves_a_release_by_at_most_its_bound() {
    let f = fixture("units-bound").await;
    let s = f.session(NoiseSource::Off, 2).await;
    let mass = |t: &'static str| {
        let s = &s;
        async move { one_f64(&s.query(&format!("SELECT {KDE}['mass'] FROM {t}")).await.unwrap()) }
    };
    let n = |t: &'static str| {
        let s = &s;
        async move {
            let b = s.query(&format!("SELECT {MEAN}['n'] FROM {t}")).await.unwrap();
            b[0].column(0).as_primitive::<Int64Type>().value(0)
        }
    };
    // Negative control: without the unit the same table moves by the big meter's 1 000 rows (and
    // every ordinary meter counts 5 rows).
    let rowwise = mass("rowwise").await;
    assert!((rowwise - 2000.0).abs() < 1e-3, "{rowwise}");
    // The unit named by its string (grouped by its hash) and by its integer id (grouped by value).
    for (with_t, without_t) in [("with", "without"), ("with_id", "without_id")] {
        // Every ordinary meter has 5 rows, more than K = 4: each keeps exactly 4.
        let (with, without) = (mass(with_t).await, mass(without_t).await);
        assert!((without - 800.0).abs() < 1e-6, "{without_t}: 200 meters × 4 rows: {without}");
        // (up to the kernel mass beyond hi = 1 of the rows at 0.9: 4·1e-6 at most)
        assert!(
            (with - without - MAX_ROWS as f64).abs() < 1e-5,
            "{with_t}: the big meter adds exactly K rows: {with} vs {without}"
        );
        assert_eq!((n(with_t).await, n(without_t).await), (804, 800));
        // The kept rows are a random sample, not the first rows in file order: the big meter's
        // first 10 rows sit at x = 0.1, its other 990 at 0.9; taking the first K would put all 4 at
        // 0.1.
        let diff: Vec<f64> =
            kernel_sum(&s, with_t).await.iter().zip(kernel_sum(&s, without_t).await).map(|(a, b)| a - b).collect();
        let at = |x: f64| diff[(x * 100.0).round() as usize];
        let per_row = 1.0 / (0.02 * (2.0 * std::f64::consts::PI).sqrt());
        let (low, high) = (at(0.1) / per_row, at(0.9) / per_row);
        assert!(
            low < 1.5 && high > 2.5 && (low + high - 4.0).abs() < 0.05,
            "{with_t}: rows at 0.1: {low:.3}, at 0.9: {high:.3}"
        );
    }
}

#[tokio::test]
async fn grouped_releases_keep_at_most_max_groups_per_unit_and_charge_once() {
    let f = fixture("units-groups").await;
    let s = f.session(NoiseSource::Off, 3).await;
    let per_region = |t: &'static str| {
        let s = &s;
        async move {
            let b = s
                .query(&format!("SELECT region, {KDE}['mass'] FROM {t} GROUP BY region ORDER BY region"))
                .await
                .unwrap();
            let b = &b[0];
            let g = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
            let g: Vec<String> = g.as_string::<i32>().iter().map(|v| v.unwrap().to_string()).collect();
            let m = b.column(1).as_primitive::<Float64Type>().values().to_vec();
            (g, m)
        }
    };
    // The unit by its string (hash) and by its integer id (value).
    for (with_t, without_t) in [("with", "without"), ("with_id", "without_id")] {
        let (groups, with) = per_region(with_t).await;
        let (_, without) = per_region(without_t).await;
        assert_eq!(groups, ["a", "b", "c", "d"]);
        let moved: Vec<f64> = with.iter().zip(&without).map(|(a, b)| a - b).collect();
        // The big meter has 250 rows in each of the four regions; it reaches exactly L = 2 of them
        // with K = 4 rows each.
        let reached: Vec<&f64> = moved.iter().filter(|d| d.abs() > 1e-9).collect();
        assert_eq!(reached.len(), MAX_GROUPS as usize, "{with_t}: {moved:?}");
        assert!(reached.iter().all(|d| (**d - MAX_ROWS as f64).abs() < 1e-5), "{with_t}: {moved:?}");
    }
    // The mean curve works grouped with units too.
    let b = s.query(&format!("SELECT region, {MEAN}['n'] FROM with GROUP BY region ORDER BY region")).await.unwrap();
    assert_eq!(b[0].num_rows(), 4);
    // …and by private keys through partition selection (noise off: only the meter whose row count
    // reaches τ = 15 when the row is the unit).
    let b = s
        .query(
            "SELECT meter, private_mean_curve(load, 1.0, 1e-6, points => 8, clip => 10, select_epsilon => 1, \
             select_delta => 1e-6)['n'] FROM rowwise GROUP BY meter",
        )
        .await
        .unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    assert_eq!(b[0].column(1).as_primitive::<Int64Type>().value(0), 1000);
    // One charge per call, as for declared keys: the noise, not the charge, covers L groups.
    assert_eq!(f.spent("with"), Budget::charge(2.0, 2e-6).unwrap());
    assert_eq!(f.spent("with_id"), Budget::charge(1.0, 1e-6).unwrap());
}

#[tokio::test]
async fn the_bounded_statistic_does_not_depend_on_files_order_or_partitions() {
    let f = fixture("units-partitions").await;
    let mut seen: Option<(u64, Vec<u64>, Vec<u64>)> = None;
    for partitions in [1, 2, 4] {
        let s = f.session(NoiseSource::Off, partitions).await;
        for table in ["with", "shuffled"] {
            let mass = one_f64(&s.query(&format!("SELECT {KDE}['mass'] FROM {table}")).await.unwrap()).to_bits();
            let b = s.query(&format!("SELECT {MEAN}['mean'] FROM {table}")).await.unwrap();
            let mean = b[0].column(0).as_list::<i32>().value(0);
            let mean: Vec<u64> = mean.as_primitive::<Float64Type>().values().iter().map(|v| v.to_bits()).collect();
            let b =
                s.query(&format!("SELECT {KDE}['mass'] FROM {table} GROUP BY region ORDER BY region")).await.unwrap();
            let grouped: Vec<u64> =
                b[0].column(0).as_primitive::<Float64Type>().values().iter().map(|v| v.to_bits()).collect();
            let now = (mass, mean, grouped);
            match &seen {
                None => seen = Some(now),
                Some(first) => assert_eq!(first, &now, "{table} with {partitions} partitions"),
            }
        }
    }
}

/// The noise is calibrated for the unit's bound: with K = 4, L = 1 (ungrouped) the mean curve's
/// count has discrete Laplace noise of scale 4/ε_n instead of 1/ε_n (sd 56.6 vs 14.1 at ε_n = 0.1).
#[tokio::test]
async fn the_noise_scales_with_the_units_bound() {
    let f = fixture("units-noise").await;
    // One session per draw, each with its own fixed seed: the draws are independent and the
    // test is deterministic (an OS-seeded run once drew a sample sd 1.47× the truth).
    let sd = |t: &'static str, first_seed: u64| {
        let f = &f;
        async move {
            let mut v = Vec::new();
            for i in 0..60 {
                let s = f.session(NoiseSource::TestSeed(first_seed + i), 2).await;
                let b = s.query(&format!("SELECT {MEAN}['n'] FROM {t}")).await.unwrap();
                v.push(b[0].column(0).as_primitive::<Int64Type>().value(0) as f64);
            }
            let m = v.iter().sum::<f64>() / v.len() as f64;
            (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
        }
    };
    let (unit, row) = (sd("with", 1_000).await, sd("rowwise", 2_000).await);
    // 60 draws: the sample sd is within ±40 % of the truth (≈ 3 standard errors for Laplace noise).
    assert!(unit > 34.0 && unit < 80.0, "unit sd {unit}");
    assert!(row > 8.0 && row < 20.0, "row sd {row}");
}

#[tokio::test]
async fn unit_policy_is_validated_and_the_rewrite_leaks_nothing() {
    let f = fixture("units-policy").await;
    let e = f.admin.set_privacy_unit("with", "nope", 5, 1).await.unwrap_err().to_string();
    assert!(e.contains("has no column"), "{e}");
    let e = f.admin.set_privacy_unit("with", "meter", 0, 1).await.unwrap_err().to_string();
    assert!(e.contains("--max-rows must be in [1, 1000000]"), "{e}");
    let unit = f.admin.tables().unwrap().into_iter().find(|t| t.name == "with").unwrap().policy.unwrap().unit.unwrap();
    assert_eq!((unit.column.as_str(), unit.max_rows, unit.max_groups), ("meter", MAX_ROWS, MAX_GROUPS));
    let s = f.session(NoiseSource::Os, 2).await;
    // EXPLAIN shows the bounding but never the sampling key, and costs nothing.
    let b = s.query(&format!("EXPLAIN SELECT region, {KDE} FROM with GROUP BY region")).await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&b).unwrap().to_string();
    assert!(
        text.contains("dpcurve_unit_bound") && text.contains("dpcurve_sample_order") && !text.contains("row_number"),
        "{text}"
    );
    assert!(!text.to_lowercase().contains("key"), "{text}");
    // An integer unit is grouped by its value; its hash is computed inside the bound.
    let b = s.query(&format!("EXPLAIN SELECT region, {KDE} FROM with_id GROUP BY region")).await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&b).unwrap().to_string();
    assert!(text.contains("meter_id AS __dpcurve_unit_id") && !text.contains("dpcurve_sample_order"), "{text}");
    // Reserved names cannot be smuggled in to confuse the rewrite.
    let e = s
        .query("SELECT private_kde(__dpcurve_unit, 0.02, 1.0, 1e-6, lo => 0, hi => 2, mechanism => 'gaussian') FROM (SELECT x + 1 AS __dpcurve_unit FROM with)")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("reserved"), "{e}");
    // Raw rows stay unreadable; the unit column is no loophole.
    let e = s.query("SELECT meter FROM with").await.unwrap_err().to_string();
    assert!(e.contains("[rule no-raw-rows]"), "{e}");
    assert_eq!(f.spent("with"), Budget::ZERO);
}

/// `private_kde2d` is bounded per unit like the 1-D functions: with K = 4 rows per meter the big
/// meter adds exactly 4 rows of mass (noise off), without the unit its 1 000 rows.
#[tokio::test]
async fn a_2d_release_is_bounded_per_unit_too() {
    let f = fixture("units-kde2d").await;
    let s = f.session(NoiseSource::Off, 2).await;
    let mass = |t: &'static str| {
        let s = &s;
        async move {
            let q =
                format!("SELECT private_kde2d(x, 1 - x, 0.02, 0.02, 1.0, 1e-6, lo_y => 0, hi_y => 1)['mass'] FROM {t}");
            one_f64(&s.query(&q).await.unwrap())
        }
    };
    let (with, without, rowwise) = (mass("with").await, mass("without").await, mass("rowwise").await);
    assert!((without - 800.0).abs() < 1e-3, "200 meters × 4 rows: {without}");
    assert!((with - without - MAX_ROWS as f64).abs() < 1e-3, "the big meter adds exactly K rows: {with} vs {without}");
    // Negative control: without the unit every row counts.
    assert!((rowwise - 2000.0).abs() < 1e-2, "{rowwise}");
}

/// On more than one partition the bound runs in one phase: the rows are repartitioned by the unit
/// and each unit is bounded once (no partial samples built per file partition and merged), by the
/// bound's own aggregate (whose unit, its value or its hash, is of a fixed width). The statistic
/// itself is the same under every partitioning (the test above).
#[tokio::test]
async fn the_bound_runs_in_one_phase_over_rows_repartitioned_by_unit() {
    let f = fixture("units-one-phase").await;
    for table in ["with", "with_id"] {
        let s = f.session(NoiseSource::Off, 3).await;
        let sql = format!("SELECT region, {KDE}['mass'] FROM {table} GROUP BY region");
        let plan = s.physical_plan_for_tests(&sql).await.unwrap();
        let text = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
        let lines: Vec<&str> = text.lines().collect();
        let bounds: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains("dpcurve_unit_bound")).collect();
        assert_eq!(bounds.len(), 1, "{table}: one bound in\n{text}");
        let at = bounds[0];
        assert!(lines[at].contains("PlannedAggregateExec: key=__dpcurve_unit_id"), "{table}: {}\n{text}", lines[at]);
        assert!(
            lines[at + 1].contains("UnitExchangeExec: partitioning=Hash([__dpcurve_unit_id"),
            "{table}: rows repartitioned by the unit below the bound\n{text}"
        );
    }
}

/// Partition selection over a table with privacy units: its counting pass bounds each unit too
/// (in one phase, over rows exchanged by unit, like the release's pass). The selected groups and
/// their statistics are the same under every partitioning.
#[tokio::test]
async fn a_selection_over_units_does_not_depend_on_partitions() {
    let dir = TempDir::new("units-selection");
    let n = 6000;
    // 600 units of 10 rows over keys k0…k3 (k3 rare: 40 units), each unit's rows in two keys.
    let unit: Vec<i64> = (0..n).map(|i| (i % 600) as i64).collect();
    let key: Vec<String> = (0..n)
        .map(|i| if i % 600 < 40 && i % 2 == 0 { "k3".to_string() } else { format!("k{}", (i / 600) % 3) })
        .collect();
    let x: Vec<f64> = (0..n).map(|i| (i as f64 * 0.618).fract()).collect();
    common::write_columns(
        &dir.path("t.parquet"),
        vec![
            ("u", Arc::new(Int64Array::from(unit)) as ArrayRef),
            ("k", Arc::new(StringArray::from(key))),
            ("x", Arc::new(Float64Array::from(x))),
        ],
    );
    let admin = common::private_t(&dir).await;
    admin.set_privacy_unit("t", "u", MAX_ROWS, MAX_GROUPS).await.unwrap();
    let sql = "SELECT k, private_kde(x, 0.02, 1.0, 1e-6, points => 101, mechanism => 'gaussian', \
               select_epsilon => 1.0, select_delta => 1e-6)['mass'] AS m FROM t GROUP BY k ORDER BY k";
    let mut seen: Option<Vec<(String, u64)>> = None;
    for partitions in [1, 2, 4] {
        let opts =
            SessionOptions { noise: NoiseSource::Off, target_partitions: Some(partitions), ..Default::default() };
        let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
        let b = s.query(sql).await.unwrap();
        let now: Vec<(String, u64)> = b
            .iter()
            .flat_map(|b| {
                let k = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
                let (k, m) = (k.as_string::<i32>(), b.column(1).as_primitive::<Float64Type>());
                (0..b.num_rows()).map(|i| (k.value(i).to_string(), m.value(i).to_bits())).collect::<Vec<_>>()
            })
            .collect();
        assert!(now.len() >= 3, "{partitions} partitions: the common keys are selected: {now:?}");
        match &seen {
            None => seen = Some(now),
            Some(first) => assert_eq!(first, &now, "{partitions} partitions"),
        }
    }
}

/// The analyst composes whatever they like above unit-bounded calls: unions, self-joins, sorts and
/// limits over several partitions. Each exchange below a bound has bounded queues, which would hang
/// a consumer that read its partitions one after another; none of these shapes may hang, and with
/// or without the heavy meter they give the same keys, row counts and outcomes.
#[tokio::test]
async fn composed_queries_over_bounded_units_end_alike_on_neighbours() {
    let f = fixture("units-composed").await;
    let grouped = |t: &str| format!("SELECT region, {KDE}['mass'] AS m FROM {t} GROUP BY region");
    let shapes = |t: &str| {
        vec![
            format!("SELECT {KDE}['mass'] AS m FROM {t} UNION ALL SELECT {KDE}['mass'] FROM {t}"),
            format!("SELECT * FROM ({}) UNION ALL SELECT * FROM ({}) ORDER BY 1", grouped(t), grouped(t)),
            format!(
                "SELECT a.region, a.m, v.r FROM ({}) a CROSS JOIN (VALUES (1), (2)) v(r) ORDER BY 1, 2",
                grouped(t)
            ),
            format!("SELECT region FROM ({}) ORDER BY m DESC LIMIT 1", grouped(t)),
            format!("WITH g AS ({}) SELECT region, m FROM g WHERE m > -1e300 ORDER BY region", grouped(t)),
        ]
    };
    for partitions in [3, 4] {
        let s = f.session(NoiseSource::Off, partitions).await;
        for (with, without) in shapes("with").into_iter().zip(shapes("without")) {
            let mut seen = Vec::new();
            for sql in [&with, &without] {
                let out = tokio::time::timeout(std::time::Duration::from_secs(120), s.query(sql))
                    .await
                    .unwrap_or_else(|_| panic!("{sql}: hung with {partitions} partitions"));
                seen.push(
                    out.map(|b| b.iter().map(|b| b.num_rows()).sum::<usize>())
                        .map_err(|e| e.to_string().replace("'without'", "'with'")),
                );
            }
            assert_eq!(seen[0], seen[1], "{with} with {partitions} partitions: the neighbours differ");
            assert!(seen[0].is_ok(), "{with}: {:?}", seen[0]);
        }
    }
}

/// The one-row result of `sql` as a float, and how many times its unit bound wrote its states
/// to disk (the operator's `spill_count`, summed over partitions).
async fn mass_and_spills(s: &AnalystSession, sql: &str) -> datafusion::common::Result<(f64, usize)> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let plan = s.physical_plan_for_tests(sql).await?;
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), s.task_ctx_for_tests()).await?;
    let mut spills = 0;
    plan.apply(|node| {
        if node.name() == "PlannedAggregateExec" {
            spills += node.metrics().and_then(|m| m.spill_count()).unwrap_or(0);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok((one_f64(&batches), spills))
}

/// More units than the memory limit holds: the bound's states spill to disk instead of failing,
/// and keep exactly the rows they keep in memory. 4.8·10⁵ units under the smallest limit (64 MiB;
/// their states could need ≈ 78 MB: 163 bytes a row), by integer id (grouped by value) and by string (grouped by hash):
/// the released mass is bit-identical to a session whose limit holds them all, and a neighbour
/// with one more, heavy unit (20 000 rows) succeeds too and moves the mass by its one kept row.
/// The operator's metrics show that it spilled under the small limit and not under the large one.
/// (Negative control run: a build whose spilled states lose one unit's rows fails the comparison.)
#[tokio::test]
async fn more_units_than_memory_holds_spill_and_keep_the_same_rows() {
    let dir = TempDir::new("units-spill");
    let units = 480_000usize;
    let ids: Vec<i64> = (0..units).map(|i| (i * 7919 % units) as i64).collect();
    // Inside [0.2, 0.8]: every row's kernel lies in the range.
    let xs: Vec<f64> = (0..units).map(|i| 0.2 + 0.6 * (i % 997) as f64 / 997.0).collect();
    common::write_columns(
        &dir.path("t.parquet"),
        vec![
            ("id", Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
            ("name", Arc::new(StringArray::from_iter_values(ids.iter().map(|i| format!("meter-{i}"))))),
            ("x", Arc::new(Float64Array::from(xs.clone()))),
        ],
    );
    std::fs::copy(dir.path("t.parquet"), dir.path("t2.parquet")).unwrap();
    // The neighbour with alice: the same units and one more with 20 000 rows, spilled with the rest.
    let heavy = 20_000usize;
    common::write_columns(
        &dir.path("t3.parquet"),
        vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(ids.iter().copied().chain(std::iter::repeat_n(-1, heavy))))
                    as ArrayRef,
            ),
            ("x", Arc::new(Float64Array::from_iter_values(xs.iter().copied().chain(std::iter::repeat_n(0.5, heavy))))),
        ],
    );
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    for (t, unit, file) in
        [("by_id", "id", "t.parquet"), ("by_name", "name", "t2.parquet"), ("with_alice", "id", "t3.parquet")]
    {
        admin.register(t, &dir.str(file)).await.unwrap();
        admin.make_private(t, 1000.0, 1e-2).await.unwrap();
        admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
        admin.set_privacy_unit(t, unit, 1, 1).await.unwrap();
        let rows = if t == "with_alice" { units + heavy } else { units };
        admin.set_row_bound(t, Some(rows as i64)).unwrap();
    }
    let opts = || SessionOptions { noise: NoiseSource::Off, target_partitions: Some(2), ..Default::default() };
    let mut masses = Vec::new();
    for limit in [4u64 << 30, 64 << 20] {
        admin.set_memory_limit(limit).unwrap();
        let s = AnalystSession::open(&dir.path("catalog.db"), opts()).await.unwrap();
        for t in ["by_id", "by_name"] {
            let sql = format!("SELECT {KDE}['mass'] FROM {t}");
            let (mass, spills) =
                mass_and_spills(&s, &sql).await.unwrap_or_else(|e| panic!("{t} under {limit} bytes: {e}"));
            // The operator's own count: it spilled under the small limit only (control: the large one).
            assert_eq!(spills > 0, limit == 64 << 20, "{t} under {limit} bytes spilled {spills} times");
            masses.push((t, limit, mass));
            // Whether it spills is decided from the table's declared row bound, not the units:
            // the neighbour without unit 17 (WHERE) spills exactly as often.
            let plan = s.physical_plan_for_tests(&sql).await.unwrap();
            let text = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
            assert!(text.contains(&format!("input rows <= {units}")), "{t}: the declared bound\n{text}");
            // Its memory: what the call's planned memory leaves of the limit, at least half; a
            // second, larger call leaves it less.
            let share = memory_share_of(&text);
            assert!(share >= limit / 2 && share < limit, "{t} under {limit} bytes: share {share}");
            let two = format!("SELECT {KDE}['mass'], private_kde(x, 0.01, 1.0, 1e-6, points => 2001)['mass'] FROM {t}");
            let plan = s.physical_plan_for_tests(&two).await.unwrap();
            let smaller =
                memory_share_of(&datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string());
            assert!(smaller >= limit / 2 && smaller < share, "{t} under {limit} bytes: {smaller} vs {share}");
            let id = if t == "by_id" { "id" } else { "name" };
            let without = format!(
                "SELECT {KDE}['mass'] FROM {t} WHERE {id} <> {}",
                if t == "by_id" { "17" } else { "'meter-17'" }
            );
            let (_, spills_without) = mass_and_spills(&s, &without).await.unwrap();
            assert_eq!(spills_without, spills, "{t} under {limit} bytes: the neighbour spills differently");
        }
    }
    // Under the smallest limit, alice's 20 000 rows change neither whether the query succeeds nor
    // more than her one kept row (K = 1, L = 1).
    let s = AnalystSession::open(&dir.path("catalog.db"), opts()).await.unwrap();
    let with_alice = one_f64(&s.query(&format!("SELECT {KDE}['mass'] FROM with_alice")).await.unwrap());
    let (_, _, by_id_smallest) = masses[2];
    assert!((with_alice - by_id_smallest - 1.0).abs() < 1e-6, "alice adds one row: {with_alice} vs {by_id_smallest}");
    for (t, limit, mass) in &masses {
        assert!((mass / units as f64 - 1.0).abs() < 1e-9, "{t} under {limit} bytes: one row per unit: {mass}");
    }
    assert_eq!(masses[0].2.to_bits(), masses[2].2.to_bits(), "by id: {masses:?}");
    assert_eq!(masses[1].2.to_bits(), masses[3].2.to_bits(), "by name: {masses:?}");
}

/// The lines of a physical plan that show what a planned aggregate planned from: its input's
/// most rows and its memory.
async fn planned_lines(s: &AnalystSession, sql: &str) -> datafusion::common::Result<Vec<String>> {
    let plan = s.physical_plan_for_tests(sql).await?;
    let text = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
    Ok(text.lines().filter(|l| l.contains("PlannedAggregateExec")).map(|l| l.trim().to_string()).collect())
}

/// The analyst's attack on a plan made from the files: a unit bound (or a partition selection's
/// count) choosing between memory and disk from the footers' row count, against a threshold the
/// query moves (the memory its private calls leave: `points`), lets timing queries of growing
/// `points` bisect for the private row count. A private table's rows are planned from the row
/// bound its policy declares instead: two neighbours (`a`, and `b` with one more unit of one
/// row) plan every query alike — unknown without a declaration, the bound with one — and spill
/// alike. A bound below the files' rows refuses the query at planning, before any charge, naming
/// the bound and not the count. Control: planned from the footers (`scan_rows` returning them),
/// the neighbours' plan lines differ (`input rows <= 3000` against `<= 3001`).
#[tokio::test]
async fn neighbours_plan_alike_from_the_declared_row_bound_never_the_files() {
    let dir = TempDir::new("units-row-bound");
    let n = 3000usize;
    for (t, extra) in [("a", 0), ("b", 1)] {
        let rows = n + extra;
        common::write_columns(
            &dir.path(&format!("{t}.parquet")),
            vec![
                ("u", Arc::new(Int64Array::from_iter_values((0..rows).map(|i| (i / 3) as i64))) as ArrayRef),
                ("g", Arc::new(StringArray::from_iter_values((0..rows).map(|i| format!("k{}", i % 7))))),
                (
                    "x",
                    Arc::new(Float64Array::from_iter_values((0..rows).map(|i| 0.2 + 0.6 * (i % 101) as f64 / 101.0))),
                ),
            ],
        );
    }
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    for t in ["a", "b"] {
        admin.register(t, &dir.str(&format!("{t}.parquet"))).await.unwrap();
        admin.make_private(t, 1000.0, 1e-2).await.unwrap();
        admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
        admin.set_privacy_unit(t, "u", 2, 2).await.unwrap();
    }
    admin.set_memory_limit(64 << 20).unwrap();
    let opts = || SessionOptions { noise: NoiseSource::Off, target_partitions: Some(2), ..Default::default() };
    let queries = |t: &str| {
        let mut q: Vec<String> = [101, 2001, 20001]
            .iter()
            .map(|p| format!("SELECT private_kde(x, 0.02, 1.0, 1e-6, points => {p})['mass'] FROM {t}"))
            .collect();
        // A partition selection over the private key `g`: its counts are planned the same way.
        q.push(format!(
            "SELECT g, private_kde(x, 0.02, 1.0, 1e-6, points => 101, select_epsilon => 1, select_delta => 1e-6)['mass'] \
             FROM {t} GROUP BY g ORDER BY g"
        ));
        q
    };
    // Unknown rows spill; a bound the memory holds does not; one it cannot hold spills (the metric's
    // control: the layout follows the declaration, the same rows either way).
    for (declared, spill) in [(None, true), (Some(n as i64 + 1), false), (Some(10_000_000), true)] {
        if let Some(rows) = declared {
            for t in ["a", "b"] {
                admin.set_row_bound(t, Some(rows)).unwrap();
            }
        }
        let s = AnalystSession::open(&dir.path("catalog.db"), opts()).await.unwrap();
        for (qa, qb) in queries("a").into_iter().zip(queries("b")) {
            let (la, lb) = (planned_lines(&s, &qa).await.unwrap(), planned_lines(&s, &qb).await.unwrap());
            assert!(!la.is_empty(), "{qa}: no planned aggregate");
            assert_eq!(la, lb, "{qa} with {declared:?} declared: the neighbours plan differently");
            let want = match declared {
                None => "input rows unknown".to_string(),
                Some(rows) => format!("input rows <= {rows}"),
            };
            assert!(la.iter().all(|l| l.contains(&want)), "{qa}: {want}\n{la:#?}");
            if !qa.contains("GROUP BY") {
                let (_, sa) = mass_and_spills(&s, &qa).await.unwrap();
                let (_, sb) = mass_and_spills(&s, &qb).await.unwrap();
                assert_eq!(sa, sb, "{qa} with {declared:?} declared: the neighbours spill differently");
                assert_eq!(sa > 0, spill, "{qa} with {declared:?}: {sa} spills");
            }
        }
    }
    // A bound below the files' rows: refused at planning, uncharged, the count not shown.
    admin.set_row_bound("b", Some(n as i64)).unwrap();
    let s = AnalystSession::open(&dir.path("catalog.db"), opts()).await.unwrap();
    let spent = || admin.tables().unwrap().into_iter().find(|t| t.name == "b").unwrap().policy.unwrap().spent;
    let before = spent();
    for q in queries("b") {
        let e = s.query(&q).await.unwrap_err().to_string();
        assert!(e.contains(&format!("table 'b' holds more rows than its policy's row bound ({n})")), "{q}: {e}");
        assert!(!e.contains(&(n + 1).to_string()), "{q}: the error shows the row count: {e}");
    }
    assert_eq!(spent(), before, "a refused query was charged");
    admin.set_row_bound("b", Some(n as i64 + 1)).unwrap();
    let s = AnalystSession::open(&dir.path("catalog.db"), opts()).await.unwrap();
    for q in queries("b") {
        s.query(&q).await.unwrap_or_else(|e| panic!("{q}: {e}"));
    }
}

/// A unit and a key read as dictionaries (Parquet written from dictionary-encoded text) bound
/// and release exactly what the same columns read as plain text do: ungrouped and grouped
/// KDEs and mean curves, on one and three partitions, noise off, every printed digit equal.
/// Control: the dictionary file's columns do come back as dictionaries.
#[tokio::test]
async fn a_dictionary_encoded_unit_and_key_bound_what_plain_text_does() {
    let dir = TempDir::new("units-dictionary");
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    for (t, dictionary) in [("plain", false), ("dict", true)] {
        write_with(&dir.path(&format!("{t}.parquet")), &rows(true), dictionary);
        admin.register(t, &dir.str(&format!("{t}.parquet"))).await.unwrap();
        admin.make_private(t, 1000.0, 1e-2).await.unwrap();
        admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
        admin.set_keys(t, "region", &["a".into(), "b".into(), "c".into(), "d".into()]).await.unwrap();
        admin.set_privacy_unit(t, "meter", MAX_ROWS, MAX_GROUPS).await.unwrap();
    }
    for partitions in [1, 3] {
        let opts =
            SessionOptions { noise: NoiseSource::Off, target_partitions: Some(partitions), ..Default::default() };
        let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
        let b = s.query(&format!("SELECT region, {KDE}['mass'] FROM dict GROUP BY region")).await.unwrap();
        assert!(matches!(b[0].schema().field(0).data_type(), DataType::Dictionary(..)), "{:?}", b[0].schema());
        for query in [
            format!("SELECT {KDE}['mass'] AS mass FROM {{t}}"),
            format!("SELECT region, {KDE}['mass'] AS mass FROM {{t}} GROUP BY region ORDER BY region"),
            format!(
                "SELECT region, {MEAN}['mean'] AS mean, {MEAN}['n'] AS n FROM {{t}} GROUP BY region ORDER BY region"
            ),
        ] {
            let mut printed = Vec::new();
            for t in ["plain", "dict"] {
                let b = s.query(&query.replace("{t}", t)).await.unwrap();
                printed.push(datafusion::arrow::util::pretty::pretty_format_batches(&b).unwrap().to_string());
            }
            assert!(printed[0].contains('|') && printed[0].lines().count() >= 5, "{}", printed[0]);
            assert_eq!(printed[0], printed[1], "{query} on {partitions} partitions");
        }
    }
}
