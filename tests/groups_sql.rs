//! GROUP BY over declared public keys (SPEC §7), through real SQL on a catalog: one row per
//! declared key (empty groups included, noise only), undeclared keys dropped, one charge per
//! call, the statistic of each group equal to the ungrouped query filtered to that key (noise
//! off), and refusals of everything else.

mod common;

use std::sync::Arc;

use common::TempDir;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Float64Builder, Int64Array, ListBuilder, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

/// 3 000 rows: region in a/b/c/z (z undeclared), weekday 0..7, x in [0, 1], a curve of 8 points.
fn write_table(path: &std::path::Path) {
    let n = 3000;
    let regions = ["a", "b", "c", "z"];
    let region: Vec<&str> = (0..n).map(|i| regions[(i * 7 + i / 13) % 4]).collect();
    let weekday: Vec<i64> = (0..n).map(|i| (i % 7) as i64).collect();
    let xs = dpcurve::datagen::mixture(n, 5).into_iter().map(|v| v.clamp(0.0, 1.0)).collect::<Vec<_>>();
    let mut curves = ListBuilder::new(Float64Builder::new());
    for i in 0..n {
        for t in 0..8 {
            curves.values().append_value(((i % 11) as f64 / 10.0) * (t as f64 / 7.0));
        }
        curves.append(true);
    }
    let curves = curves.finish();
    common::write_columns(
        path,
        vec![
            ("region", Arc::new(StringArray::from(region)) as ArrayRef),
            ("weekday", Arc::new(Int64Array::from(weekday))),
            ("x", Arc::new(Float64Array::from(xs))),
            ("load", Arc::new(curves)),
        ],
    );
}

struct Fixture {
    dir: TempDir,
    admin: Admin,
}

async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    write_table(&dir.path("p.parquet"));
    let admin = private_p(&dir).await;
    Fixture { dir, admin }
}

/// A catalog in `dir` where `p.parquet` is the private table `p`: x in [0, 1], regions a–d and
/// weekdays 0–6 declared.
async fn private_p(dir: &TempDir) -> Admin {
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("p", &dir.str("p.parquet")).await.unwrap();
    admin.make_private("p", 100.0, 1e-3).await.unwrap();
    admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();
    admin.set_keys("p", "region", &["a".into(), "b".into(), "c".into(), "d".into()]).await.unwrap();
    admin.set_keys("p", "weekday", &(0..7).map(|d| d.to_string()).collect::<Vec<_>>()).await.unwrap();
    admin
}

/// Writes `p.parquet` in `dir` with columns `region`, `weekday` and `x`, then makes it the private
/// table `p` ([`private_p`]).
async fn write_private_p(dir: &TempDir, region: StringArray, weekday: Vec<i64>, x: Vec<f64>) -> Admin {
    common::write_columns(
        &dir.path("p.parquet"),
        vec![
            ("region", Arc::new(region) as ArrayRef),
            ("weekday", Arc::new(Int64Array::from(weekday))),
            ("x", Arc::new(Float64Array::from(x))),
        ],
    );
    private_p(dir).await
}

impl Fixture {
    async fn session(&self, noise: NoiseSource, partitions: usize) -> AnalystSession {
        let opts = SessionOptions { noise, target_partitions: Some(partitions), ..Default::default() };
        AnalystSession::open(&self.dir.path("catalog.db"), opts).await.unwrap()
    }

    fn spent(&self) -> Budget {
        self.admin.tables().unwrap()[0].policy.as_ref().unwrap().spent
    }
}

const KDE: &str = "private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian')";

/// (group, mass) rows of a grouped KDE query.
async fn masses(s: &AnalystSession, sql: &str) -> Vec<(String, f64)> {
    common::keyed_values(&s.query(sql).await.unwrap())
}

#[tokio::test]
async fn one_row_per_declared_key_and_one_charge_per_call() {
    let f = fixture("groups-keys").await;
    let s = f.session(NoiseSource::Os, 2).await;
    let rows = masses(&s, &format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region")).await;
    let keys: Vec<&str> = rows.iter().map(|(g, _)| g.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c", "d"], "declared keys only, the empty one included, z dropped");
    // ORDER BY above the groups sees the added ones too.
    let b =
        s.query(&format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region ORDER BY region DESC")).await.unwrap();
    let order: Vec<String> = b
        .iter()
        .flat_map(|b| {
            let c = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
            c.as_string::<i32>().iter().map(|v| v.unwrap().to_string()).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(order, ["d", "c", "b", "a"]);
    assert_eq!(f.spent(), Budget::charge(1.0, 2e-6).unwrap(), "parallel composition: one charge per call");
    // Two calls, two charges; grouping by two columns gives the product of their keys.
    let b = s
        .query(&format!(
            "SELECT region, weekday, {KDE}['mass'], private_kde(x, 0.1, 0.5, 1e-6, points => 16, mechanism => 'gaussian')['mass'] \
             FROM p GROUP BY region, weekday"
        ))
        .await
        .unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 4 * 7);
    assert_eq!(f.spent(), Budget::charge(2.0, 4e-6).unwrap());
    // Mean curves per weekday.
    let b = s
        .query("SELECT weekday, private_mean_curve(load, 0.5, 1e-6, clip => 1.0, points => 8)['n'] AS n FROM p GROUP BY weekday")
        .await
        .unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 7);
    assert_eq!(f.spent(), Budget::charge(2.5, 5e-6).unwrap());
    assert_eq!(f.admin.release_log(None).unwrap().len(), 5, "one log entry per call");
}

#[tokio::test]
async fn each_group_is_exactly_the_filtered_query_and_empty_groups_are_noise_only() {
    let f = fixture("groups-exact").await;
    for partitions in [1, 3] {
        let s = f.session(NoiseSource::Off, partitions).await;
        let grouped = masses(&s, &format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region")).await;
        for (g, m) in &grouped {
            let one = s.query(&format!("SELECT {KDE}['mass'] FROM p WHERE region = '{g}'")).await.unwrap();
            let alone = one[0].column(0).as_primitive::<Float64Type>().value(0);
            assert_eq!(m.to_bits(), alone.to_bits(), "group {g} with {partitions} partitions");
        }
        let d = grouped.iter().find(|(g, _)| g == "d").unwrap().1;
        assert_eq!(d, 0.0, "an empty group's statistic is zero (its release is noise only)");
        assert!(grouped.iter().filter(|(g, _)| g != "d").all(|(_, m)| *m > 500.0), "{grouped:?}");
    }
    // With noise on, the empty group gets a noisy, nonzero value.
    let s = f.session(NoiseSource::Os, 2).await;
    let rows = masses(&s, &format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region")).await;
    assert_ne!(rows.iter().find(|(g, _)| g == "d").unwrap().1, 0.0);
}

#[tokio::test]
async fn many_groups_released_at_once_each_get_their_own_statistic_and_id_in_order() {
    // 4 regions × 7 weekdays = 28 groups: enough for the releases to be drawn on several threads
    // (at least 8 per thread). Each group's (noiseless) mass is its own filtered query's, and the
    // stored ids run in the output's (declared) order.
    let f = fixture("groups-many").await;
    for partitions in [1, 3] {
        let s = f.session(NoiseSource::Off, partitions).await;
        let b = s
            .query(&format!(
                "SELECT CAST(region AS VARCHAR) || '/' || CAST(weekday AS VARCHAR) AS g, k['mass'] AS m,                  k['release'] AS r FROM (SELECT region, weekday, {KDE} AS k FROM p GROUP BY region, weekday)"
            ))
            .await
            .unwrap();
        let mut rows = Vec::new();
        for b in &b {
            let g = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
            let r = datafusion::arrow::compute::cast(b.column(2), &DataType::Utf8).unwrap();
            for i in 0..b.num_rows() {
                rows.push((
                    g.as_string::<i32>().value(i).to_string(),
                    b.column(1).as_primitive::<Float64Type>().value(i),
                    r.as_string::<i32>().value(i)[1..].parse::<i64>().unwrap(),
                ));
            }
        }
        assert_eq!(rows.len(), 28);
        assert!(rows.windows(2).all(|w| w[1].2 == w[0].2 + 1), "ids in output order: {rows:?}");
        for (g, m, _) in &rows {
            let (region, weekday) = g.split_once('/').unwrap();
            let one = s
                .query(&format!("SELECT {KDE}['mass'] FROM p WHERE region = '{region}' AND weekday = {weekday}"))
                .await
                .unwrap();
            let alone = one[0].column(0).as_primitive::<Float64Type>().value(0);
            assert_eq!(m.to_bits(), alone.to_bits(), "group {g}, {partitions} partitions");
            assert_eq!(*m == 0.0, region == "d", "group {g}: {m}");
        }
    }
}

#[tokio::test]
async fn integer_keys_keep_exactly_their_rows_as_a_range_or_with_gaps() {
    // The guard tests a run of integer keys as a range (BETWEEN) and other keys as a list (IN):
    // either way each group is exactly its filtered query and the undeclared weekdays (outside
    // the run, or in its gap) add nothing, with 1 and 3 partitions. (The final phase releases
    // the declared groups only, so a filter that kept too much would not show here: the
    // filter's own unit test, `the_declared_keys_filter_keeps_exactly_the_declared_keys`, does.)
    let f = fixture("groups-int-keys").await;
    for keys in [vec![1, 2, 3, 4, 5], vec![0, 2, 3, 6], vec![3, 4, 5, 1, 2]] {
        f.admin.set_keys("p", "weekday", &keys.iter().map(|d| d.to_string()).collect::<Vec<_>>()).await.unwrap();
        for partitions in [1, 3] {
            let s = f.session(NoiseSource::Off, partitions).await;
            let grouped = masses(&s, &format!("SELECT weekday, {KDE}['mass'] FROM p GROUP BY weekday")).await;
            let mut declared: Vec<String> = keys.iter().map(|d| d.to_string()).collect();
            let mut seen: Vec<String> = grouped.iter().map(|(g, _)| g.clone()).collect();
            declared.sort();
            seen.sort();
            assert_eq!(seen, declared, "one row per declared key, {keys:?}");
            let mut total = 0.0;
            for (g, m) in &grouped {
                let one = s.query(&format!("SELECT {KDE}['mass'] FROM p WHERE weekday = {g}")).await.unwrap();
                let alone = one[0].column(0).as_primitive::<Float64Type>().value(0);
                assert_eq!(m.to_bits(), alone.to_bits(), "weekday {g}, keys {keys:?}, {partitions} partitions");
                assert!(*m > 300.0, "weekday {g} has rows: {m}");
                total += m;
            }
            // Every weekday has 3000/7 rows; the undeclared ones add nothing.
            let expected = keys.len() as f64 * 3000.0 / 7.0;
            assert!((total - expected).abs() < 10.0, "{keys:?}: {total} vs {expected}");
        }
    }
}

/// Over declared integer keys the partial phase finds each row's group in a table of the keys
/// (dense for a run, a map for spread keys): each group is still exactly its filtered query,
/// with an aggregate FILTER clause too, and a declared key without rows is released from an
/// empty state.
#[tokio::test]
async fn declared_integer_keys_are_looked_up_not_hashed() {
    let f = fixture("groups-int-table").await;
    let plain = "private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian')";
    let filtered = format!("{plain} FILTER (WHERE x > 0.3)");
    for (keys, kind) in [(vec![6i64, 1, 2, 3], "dense"), (vec![5, 1_000_000_000_000, 0, -7], "sparse")] {
        f.admin.set_keys("p", "weekday", &keys.iter().map(|d| d.to_string()).collect::<Vec<_>>()).await.unwrap();
        for partitions in [1, 3] {
            let s = f.session(NoiseSource::Off, partitions).await;
            for call in [plain.to_string(), filtered.clone()] {
                let sql = format!("SELECT weekday, {call}['mass'] FROM p GROUP BY weekday");
                let plan = s.physical_plan_for_tests(&sql).await.unwrap();
                let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
                assert!(shown.contains(&format!("KnownKeysPartialExec: declared groups=4 ({kind})")), "{shown}");
                assert!(!shown.contains("mode=Partial"), "{shown}");
                let grouped = masses(&s, &sql).await;
                assert_eq!(grouped.len(), 4);
                for (g, m) in &grouped {
                    let where_ = if call.contains("FILTER") { " AND x > 0.3" } else { "" };
                    let one =
                        s.query(&format!("SELECT {plain}['mass'] FROM p WHERE weekday = {g}{where_}")).await.unwrap();
                    let alone = one[0].column(0).as_primitive::<Float64Type>().value(0);
                    assert_eq!(m.to_bits(), alone.to_bits(), "weekday {g}, {keys:?}, {partitions} partitions, {call}");
                    let has_rows = (0..7).contains(&g.parse::<i64>().unwrap());
                    assert_eq!(*m > 100.0, has_rows, "weekday {g}: {m}");
                }
            }
        }
    }
    // The guard's filter to the declared keys is dropped below the lookup (undeclared keys go to
    // a spare group that is never released); an analyst's condition on the key that some declared
    // key fails stays, and that key's group is released from an empty state.
    let s = f.session(NoiseSource::Off, 2).await;
    let sql = format!("SELECT weekday, {plain}['mass'] FROM p GROUP BY weekday");
    let shown = datafusion::physical_plan::displayable(s.physical_plan_for_tests(&sql).await.unwrap().as_ref())
        .indent(false)
        .to_string();
    assert!(!shown.contains("FilterExec"), "{shown}");
    // So is the range a run of keys is tested as (one comparison per row), which another plan —
    // a privacy unit's, say — keeps as its filter.
    f.admin.set_keys("p", "weekday", &["2", "0", "1", "3"].map(String::from)).await.unwrap();
    let ranged = f.session(NoiseSource::Off, 2).await;
    let sql = format!("SELECT weekday, {plain}['mass'] FROM p GROUP BY weekday");
    let shown = datafusion::physical_plan::displayable(ranged.physical_plan_for_tests(&sql).await.unwrap().as_ref())
        .indent(false)
        .to_string();
    assert!(!shown.contains("FilterExec") && shown.contains("declared groups=4 (dense)"), "{shown}");
    f.admin.set_keys("p", "weekday", &["5", "1000000000000", "0", "-7"].map(String::from)).await.unwrap();
    let sql = format!(
        "SELECT weekday, {plain}['mass'] FROM p WHERE weekday >= 0 AND weekday > -7 AND x >= 0 GROUP BY weekday"
    );
    let shown = datafusion::physical_plan::displayable(s.physical_plan_for_tests(&sql).await.unwrap().as_ref())
        .indent(false)
        .to_string();
    // (The analyst's AND is the guard's strict one, a function: kept whole.)
    assert!(shown.contains("FilterExec: dpcurve_and(weekday@0 >= 0, x@1 >= 0)"), "{shown}");
    let rows = masses(&s, &sql).await;
    let alone = |g: i64| {
        let s = &s;
        async move {
            let one = s.query(&format!("SELECT {plain}['mass'] FROM p WHERE weekday = {g}")).await.unwrap();
            one[0].column(0).as_primitive::<Float64Type>().value(0).to_bits()
        }
    };
    let want = [("-7", 0), ("0", alone(0).await), ("1000000000000", 0), ("5", alone(5).await)];
    assert_eq!(rows.iter().map(|(k, m)| (k.as_str(), m.to_bits())).collect::<Vec<_>>(), want);
    // One text key is looked up by its bytes, several keys by their row encoding.
    let s = f.session(NoiseSource::Off, 2).await;
    for (by, kind) in [("region", "(text)"), ("region, weekday", "(rows)")] {
        let sql = format!("SELECT {by}, {KDE}['mass'] FROM p GROUP BY {by}");
        let plan = s.physical_plan_for_tests(&sql).await.unwrap();
        let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
        assert!(shown.contains("KnownKeysPartialExec: declared groups=") && shown.contains(kind), "{shown}");
    }
    assert!(!shown.contains("mode=Partial"), "{shown}");
}

/// A key column read as a dictionary (a Parquet file written from dictionary-encoded text) holds
/// and releases the same declared groups, bit for bit, as the same keys read as plain text, on
/// one and on three partitions. Control: the two files' key columns do have different types.
#[tokio::test]
async fn dictionary_encoded_declared_keys_release_what_plain_text_keys_do() {
    use datafusion::arrow::array::DictionaryArray;
    use datafusion::arrow::datatypes::Int32Type;
    let mut results = Vec::new();
    let mut printed = Vec::new();
    for dictionary in [false, true] {
        let dir = TempDir::new(&format!("groups-dictionary-{dictionary}"));
        let region: Vec<&str> = (0..900).map(|i| ["a", "b", "c"][i % 3]).collect();
        let weekday: Vec<i64> = (0..900).map(|i| (i % 7) as i64).collect();
        let x: Vec<f64> = (0..900).map(|i| (i % 101) as f64 / 100.0).collect();
        let y: Vec<f64> = (0..900).map(|i| ((i * 37) % 89) as f64 / 88.0).collect();
        let mut load = ListBuilder::new(Float64Builder::new());
        for i in 0..900 {
            load.values().append_slice(&std::array::from_fn::<f64, 8, _>(|t| ((i % 11) * t) as f64 / 70.0));
            load.append(true);
        }
        let keys: ArrayRef = if dictionary {
            Arc::new(region.into_iter().collect::<DictionaryArray<Int32Type>>())
        } else {
            Arc::new(StringArray::from(region))
        };
        common::write_columns(
            &dir.path("p.parquet"),
            vec![
                ("region", keys),
                ("weekday", Arc::new(Int64Array::from(weekday))),
                ("x", Arc::new(Float64Array::from(x))),
                ("y", Arc::new(Float64Array::from(y))),
                ("load", Arc::new(load.finish())),
            ],
        );
        private_p(&dir).await.set_bounds("p", "y", 0.0, 1.0).await.unwrap();
        for partitions in [1, 3] {
            let opts =
                SessionOptions { noise: NoiseSource::Off, target_partitions: Some(partitions), ..Default::default() };
            let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
            let sql = format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region");
            let plan = s.physical_plan_for_tests(&sql).await.unwrap();
            let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
            // Plain text by its bytes, a dictionary by its row encoding.
            let kind = if dictionary { "rows" } else { "text" };
            assert!(shown.contains(&format!("KnownKeysPartialExec: declared groups=4 ({kind})")), "{shown}");
            let out = s.query(&sql).await.unwrap();
            let key_type = out[0].schema().field(0).data_type().clone();
            assert_eq!(matches!(key_type, DataType::Dictionary(..)), dictionary, "{key_type}");
            let got: Vec<(String, u64)> =
                common::keyed_values(&out).into_iter().map(|(k, v)| (k, v.to_bits())).collect();
            results.push(got);
            // The 2-D density and the mean curve per group, every printed digit.
            for sql in [
                "SELECT region, private_kde2d(x, y, 0.1, 0.1, 0.5, 1e-6, points_x => 6, points_y => 5) AS k \
                 FROM p GROUP BY region ORDER BY region",
                "SELECT region, private_mean_curve(load, 0.5, 1e-6, clip => 1.0, points => 8) AS m \
                 FROM p GROUP BY region ORDER BY region",
            ] {
                let out = s.query(sql).await.unwrap();
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&out).unwrap().to_string();
                assert_eq!(text.lines().count(), 4 + 4, "{text}");
                assert!(text.contains("density: [[") || text.contains("n: 300"), "{text}");
                // Release ids (and so the table's padding) differ between the runs; every value
                // else is compared.
                let text: String = text
                    .split("release: r")
                    .enumerate()
                    .map(|(i, part)| if i == 0 { part } else { part.trim_start_matches(|c: char| c.is_ascii_digit()) })
                    .collect();
                let text: Vec<String> = text
                    .lines()
                    .filter(|l| !l.starts_with('+'))
                    .map(|l| l.split_whitespace().collect::<String>())
                    .collect();
                printed.push(text);
            }
        }
    }
    let names: Vec<&str> = results[0].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"], "every declared group");
    assert!(results.iter().all(|r| *r == results[0]), "{results:?}");
    let (plain, dictionary) = printed.split_at(printed.len() / 2);
    assert_eq!(plain, dictionary);
    assert_eq!(plain[0], plain[2], "the 2-D densities on one and three partitions");
}

/// Writes `p.parquet` in `dir`: `region` dictionary-encoded with `index` keys, holding `distinct`
/// values in one row group (written in batches of at most 100 values each, which an `Int8`
/// dictionary array can hold), and `x`.
fn write_dictionary_table(dir: &TempDir, index: DataType, distinct: usize) {
    use datafusion::arrow::array::DictionaryArray;
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::Int32Type;
    let t = DataType::Dictionary(Box::new(index), Box::new(DataType::Utf8));
    let schema =
        Arc::new(Schema::new(vec![Field::new("region", t.clone(), false), Field::new("x", DataType::Float64, false)]));
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(dir.path("p.parquet")).unwrap(), Arc::clone(&schema), None).unwrap();
    for first in (0..distinct).step_by(100) {
        let keys: Vec<String> =
            (first..(first + 100).min(distinct)).flat_map(|k| std::iter::repeat_n(format!("k{k}"), 3)).collect();
        let x: Vec<f64> = (0..keys.len()).map(|i| (i % 101) as f64 / 100.0).collect();
        let region = keys.iter().map(String::as_str).collect::<DictionaryArray<Int32Type>>();
        let region = cast(&region, &t).unwrap();
        w.write(&RecordBatch::try_new(Arc::clone(&schema), vec![region, Arc::new(Float64Array::from(x))]).unwrap())
            .unwrap();
    }
    w.close().unwrap();
}

/// A column stored as a dictionary with 8- or 16-bit keys (a pandas categorical) cannot be read
/// once a row group holds more distinct values than the keys number: Parquet's reader fails. On
/// a private table one added row with a 128th region would turn a release into a failure after
/// the debit (SPEC §0; the reader takes an `Int8` dictionary of at most 127 values). The attack,
/// on neighbouring tables of 127 and 128 regions in one row group (`Int8` keys): the 128-region
/// table cannot be made private (its files are read whole first, and fail); over the 127-region
/// one every query that reads the column is refused while planning, whatever its values, with
/// nothing charged — declared keys, a selection, a filter on it, the column as privacy unit — and
/// so are `set-keys` and `set-privacy-unit` on it; a query that does not read it releases.
/// Controls: DataFusion itself reads the 127-region table and fails on the 128-region one (the
/// attack works without the rules), and the same tables with `Int32` keys release 200 declared
/// keys.
#[tokio::test]
async fn narrow_dictionary_columns_of_private_tables_are_refused_before_the_debit_whatever_their_values() {
    let kde = "private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian')";
    let reading = [
        format!("SELECT region, {kde}['mass'] FROM p GROUP BY region"),
        format!(
            "SELECT region, {}['mass'] FROM p GROUP BY region",
            kde.replace("points", "select_epsilon => 1, select_delta => 1e-6, points")
        ),
        format!("SELECT {kde}['mass'] FROM p WHERE region <> 'k7'"),
    ];
    for distinct in [127, 128] {
        let dir = TempDir::new(&format!("groups-narrow-dictionary-{distinct}"));
        write_dictionary_table(&dir, DataType::Int8, distinct);
        // Control: the reader alone fails on the neighbour only.
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_parquet("p", dir.str("p.parquet"), Default::default()).await.unwrap();
        let raw = ctx.sql("SELECT region FROM p").await.unwrap().collect().await;
        match &raw {
            Ok(b) => assert_eq!((distinct, b.iter().map(|b| b.num_rows()).sum::<usize>()), (127, 3 * 127)),
            Err(e) => assert!(distinct == 128 && e.to_string().contains("dictionary too large for index type"), "{e}"),
        }
        let admin = Admin::open(&dir.path("catalog.db")).unwrap();
        admin.register("p", &dir.str("p.parquet")).await.unwrap();
        if distinct == 128 {
            let e = admin.make_private("p", 100.0, 1e-3).await.unwrap_err().to_string();
            assert!(e.contains("cannot be read whole") && e.contains("dictionary too large for index type"), "{e}");
            assert!(admin.tables().unwrap()[0].policy.is_none(), "the table stays public");
            continue;
        }
        admin.make_private("p", 100.0, 1e-3).await.unwrap();
        admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();
        let keys: Vec<String> = (0..127).map(|k| format!("k{k}")).collect();
        let e = admin.set_keys("p", "region", &keys).await.unwrap_err().to_string();
        assert!(e.contains("narrow-dictionary") && e.contains("'region'"), "{e}");
        let e = admin.set_privacy_unit("p", "region", 1, 1).await.unwrap_err().to_string();
        assert!(e.contains("narrow-dictionary"), "{e}");
        let opts = SessionOptions { noise: NoiseSource::Off, ..Default::default() };
        let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
        let spent = || admin.tables().unwrap()[0].policy.as_ref().unwrap().spent;
        for sql in &reading {
            let e = s.query(sql).await.unwrap_err().to_string();
            assert!(e.contains("[rule narrow-dictionary] column 'region' of private table 'p'"), "{sql}: {e}");
            assert_eq!(spent(), Budget::ZERO, "{sql}: refused before the debit");
        }
        let out = s.query(&format!("SELECT {kde}['mass'] FROM p")).await.unwrap();
        assert_eq!(out[0].num_rows(), 1, "a query that does not read the column releases");
        assert!(spent() != Budget::ZERO);
    }
    // Control: 32-bit keys read any row group, and 200 declared keys release.
    let dir = TempDir::new("groups-wide-dictionary");
    write_dictionary_table(&dir, DataType::Int32, 200);
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    admin.register("p", &dir.str("p.parquet")).await.unwrap();
    admin.make_private("p", 100.0, 1e-3).await.unwrap();
    admin.set_bounds("p", "x", 0.0, 1.0).await.unwrap();
    admin.set_keys("p", "region", &(0..200).map(|k| format!("k{k}")).collect::<Vec<_>>()).await.unwrap();
    let opts = SessionOptions { noise: NoiseSource::Off, ..Default::default() };
    let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
    let out = s.query(&reading[0]).await.unwrap();
    assert_eq!(out.iter().map(|b| b.num_rows()).sum::<usize>(), 200);
}

/// Declared keys over several columns, or text: each row's group is found by its row encoding in
/// a table of the declared tuples, so every declared group exists in every partition from the
/// first row on. Each group is still exactly its filtered query (with an aggregate FILTER too,
/// on 1 and 3 partitions). The attack: a neighbour whose one row is the first of a declared
/// group (region 'd') must not change what the partial phase holds and emits (a group table
/// that grows as rows reach groups steps at a count of groups: SPEC §0). Control: DataFusion's
/// partial aggregate over the same two files emits one more group on the neighbour.
#[tokio::test]
async fn declared_keys_of_any_columns_hold_every_group_from_the_start() {
    let plain = "private_kde(x, 0.05, 0.5, 1e-6, points => 64, mechanism => 'gaussian')";
    let filtered = format!("{plain} FILTER (WHERE x > 0.3)");
    let mut held = Vec::new();
    let mut control = Vec::new();
    for alice in [false, true] {
        let dir = TempDir::new(&format!("groups-rows-{alice}"));
        let n = 2000;
        let mut region: Vec<&str> = (0..n).map(|i| ["a", "b", "c"][i % 3]).collect();
        let mut weekday: Vec<i64> = (0..n).map(|i| (i % 7) as i64).collect();
        let mut x: Vec<f64> = (0..n).map(|i| (i % 101) as f64 / 100.0).collect();
        if alice {
            region.insert(1234, "d");
            weekday.insert(1234, 3);
            x.insert(1234, 0.5);
        }
        write_private_p(&dir, StringArray::from(region), weekday, x).await;
        let mut seen = Vec::new();
        for partitions in [1, 3] {
            let opts =
                SessionOptions { noise: NoiseSource::Off, target_partitions: Some(partitions), ..Default::default() };
            let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
            for (by, groups, kind) in [("region", 4, "text"), ("region, weekday", 28, "rows")] {
                for call in [plain.to_string(), filtered.clone()] {
                    let sql = format!("SELECT {by}, {call}['mass'] FROM p GROUP BY {by}");
                    let plan = s.physical_plan_for_tests(&sql).await.unwrap();
                    let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
                    assert!(
                        shown.contains(&format!("KnownKeysPartialExec: declared groups={groups} ({kind})")),
                        "{shown}"
                    );
                    assert!(!shown.contains("mode=Partial"), "{shown}");
                    let rows = common::partial_rows(&plan, s.task_ctx_for_tests()).await;
                    assert!(rows.iter().all(|&r| r == groups), "every declared group in every partition: {rows:?}");
                    seen.push((sql.clone(), partitions, rows));
                    let out = s.query(&sql).await.unwrap();
                    assert_eq!(out.iter().map(|b| b.num_rows()).sum::<usize>(), groups);
                    // Each group is its filtered query.
                    let where_ = if call.contains("FILTER") { " AND x > 0.3" } else { "" };
                    for b in &out {
                        for r in 0..b.num_rows() {
                            let mut conditions = Vec::new();
                            let keys = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
                            let region = keys.as_string::<i32>().value(r).to_string();
                            conditions.push(format!("region = '{region}'"));
                            if by.contains("weekday") {
                                conditions
                                    .push(format!("weekday = {}", b.column(1).as_primitive::<Int64Type>().value(r)));
                            }
                            let mass = b.column(b.num_columns() - 1).as_primitive::<Float64Type>().value(r);
                            let one = s
                                .query(&format!(
                                    "SELECT {plain}['mass'] FROM p WHERE {}{where_}",
                                    conditions.join(" AND ")
                                ))
                                .await
                                .unwrap();
                            let alone = one[0].column(0).as_primitive::<Float64Type>().value(0);
                            assert_eq!(
                                mass.to_bits(),
                                alone.to_bits(),
                                "{sql}: {conditions:?}, {partitions} partitions"
                            );
                            let hers = alice && (conditions.len() == 1 || conditions[1] == "weekday = 3");
                            assert_eq!(mass > 0.0, region != "d" || hers, "{sql}: {conditions:?}: {mass}");
                        }
                    }
                }
            }
            // Control: DataFusion's own partial aggregate over the same file interns only the groups
            // that rows reach.
            let sql = "SELECT region, sum(x) FROM t WHERE region IN ('a', 'b', 'c', 'd') GROUP BY region";
            let rows = common::datafusion_partial_rows(&dir.str("p.parquet"), partitions, sql).await;
            control.push(rows.iter().sum::<usize>());
        }
        held.push(seen);
    }
    assert_eq!(held[0], held[1], "the partial phases of the neighbours differ");
    assert_eq!(control, [3, 3, 4, 4], "control: DataFusion's partial phase holds her group only on her table");
}

#[tokio::test]
async fn grouping_by_anything_else_is_refused_before_any_charge() {
    let f = fixture("groups-refused").await;
    let s = f.session(NoiseSource::Os, 2).await;
    let refused = [
        (format!("SELECT x > 0.5, {KDE} FROM p GROUP BY x > 0.5"), "[rule no-group-by]"),
        (format!("SELECT upper(region), {KDE} FROM p GROUP BY upper(region)"), "[rule no-group-by]"),
        (format!("SELECT x, {KDE} FROM p GROUP BY x"), "declared public"),
        (format!("SELECT region, {KDE} FROM p GROUP BY ROLLUP(region)"), "ROLLUP"),
        (format!("SELECT region, weekday, {KDE} FROM p GROUP BY CUBE(region, weekday)"), "ROLLUP"),
        (format!("SELECT region, count(*), {KDE} FROM p GROUP BY region"), "[rule private-aggregates-only]"),
    ];
    for (sql, want) in &refused {
        let e = s.query(sql).await.unwrap_err().to_string();
        assert!(e.contains(want), "{sql}: {e}");
    }
    assert_eq!(f.spent(), Budget::ZERO);
    // Keys are validated against the column type, and only private tables have keys.
    let e = f.admin.set_keys("p", "weekday", &["monday".into()]).await.unwrap_err().to_string();
    assert!(e.contains("not a value of Int64"), "{e}");
    let e = f.admin.set_keys("p", "nope", &["a".into()]).await.unwrap_err().to_string();
    assert!(e.contains("has no column"), "{e}");
}

#[tokio::test]
async fn keys_from_a_public_table_and_memory_per_group() {
    let f = fixture("groups-from").await;
    // A public table of region names.
    let schema = Arc::new(Schema::new(vec![Field::new("name", DataType::Utf8, false)]));
    let names = StringArray::from(vec!["a", "b", "e"]);
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(names) as ArrayRef]).unwrap();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(f.dir.path("regions.parquet")).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    f.admin.register("regions", &f.dir.str("regions.parquet")).await.unwrap();
    assert_eq!(f.admin.set_keys_from("p", "region", "regions", "name").await.unwrap(), 3);
    let s = f.session(NoiseSource::Off, 2).await;
    let rows = masses(&s, &format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region")).await;
    assert_eq!(rows.iter().map(|(g, _)| g.as_str()).collect::<Vec<_>>(), ["a", "b", "e"]);
    assert_eq!(rows[2].1, 0.0);
    let e = f.admin.set_keys_from("p", "region", "p", "region").await.unwrap_err().to_string();
    assert!(e.contains("is private"), "{e}");
    // States are per group: 500 weekday keys × a large KDE state do not fit 64 MiB.
    f.admin.set_keys("p", "weekday", &(0..500).map(|d| d.to_string()).collect::<Vec<_>>()).await.unwrap();
    f.admin.set_memory_limit(64 << 20).unwrap();
    let s = f.session(NoiseSource::Os, 2).await;
    let e = s
        .query("SELECT weekday, private_kde(x, 0.001, 0.5, 1e-6, points => 4096, mechanism => 'gaussian') FROM p GROUP BY weekday")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("[rule memory-limit]") && e.contains("500 groups"), "{e}");
    let b = s.query(&format!("SELECT weekday, {KDE}['mass'] FROM p GROUP BY weekday")).await.unwrap();
    let weekdays = b.iter().map(|b| b.num_rows()).sum::<usize>();
    assert_eq!(weekdays, 500);
    let _ = b[0].column(0).as_primitive::<Int64Type>().value(0);
    let _ = b[0].column(1).is_null(0);
}

/// One charge, one release per group: a grouped plan's private subtree run below the gate has no
/// permits (nothing was paid), and the gate grants exactly one per declared group.
#[tokio::test]
async fn a_grouped_subtree_below_the_gate_cannot_release() {
    let f = fixture("groups-permits").await;
    let s = f.session(NoiseSource::Os, 2).await;
    let plan =
        s.physical_plan_for_tests(&format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region")).await.unwrap();
    assert_eq!(plan.name(), "BudgetGateExec");
    let below = Arc::clone(plan.children()[0]);
    let err = datafusion::physical_plan::collect(below, s.task_ctx_for_tests()).await.unwrap_err();
    assert!(err.to_string().contains("no release permit"), "{err}");
    assert_eq!(f.spent(), Budget::ZERO);
    let plan = datafusion::physical_plan::execution_plan::reset_plan_states(plan).unwrap();
    let b = datafusion::physical_plan::collect(plan, s.task_ctx_for_tests()).await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 4, "four declared groups, four releases, one charge");
    assert_eq!(f.spent(), Budget::charge(0.5, 1e-6).unwrap());
}

/// Grouped calls composed by UNION ALL, with one or several partitions: DataFusion may interleave
/// the union's hash-partitioned children, which the canonical final phases (one partition each)
/// no longer are; the query must still run, with each call's groups once and its own charge.
#[tokio::test]
async fn unions_of_grouped_calls_run_under_any_partitioning() {
    let f = fixture("groups-union").await;
    let grouped = format!("SELECT region, {KDE}['mass'] AS m FROM p GROUP BY region");
    let shapes = [
        format!("SELECT * FROM ({grouped}) UNION ALL SELECT * FROM ({grouped}) ORDER BY 1"),
        format!("{grouped} UNION ALL {grouped}"),
        format!("SELECT a.region, a.m - b.m FROM ({grouped}) a JOIN ({grouped}) b ON a.region = b.region"),
    ];
    let mut seen = Vec::new();
    for partitions in [1, 2, 4] {
        let s = f.session(NoiseSource::Off, partitions).await;
        let mut now = Vec::new();
        for sql in &shapes {
            let b = s.query(sql).await.unwrap_or_else(|e| panic!("{sql} with {partitions} partitions: {e}"));
            now.push(common::keyed_values(&b).into_iter().map(|(k, v)| (k, v.to_bits())).collect::<Vec<_>>());
        }
        match seen.is_empty() {
            true => seen = now,
            false => assert_eq!(seen, now, "{partitions} partitions"),
        }
    }
    let keys: Vec<&str> = seen[0].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "a", "b", "b", "c", "c", "d", "d"]);
    assert_eq!(seen[1], seen[0], "the same rows without ORDER BY");
    assert!(seen[2].iter().map(|(k, d)| (k.as_str(), f64::from_bits(*d))).eq(["a", "b", "c", "d"].map(|k| (k, 0.0))));
}

/// A private call's literal parameters are bound into its function once: the aggregates that
/// read rows evaluate its data column only (DataFusion would otherwise build a column of copies
/// of every literal for every batch). Grouped and ungrouped, the same release either way.
#[tokio::test]
async fn private_calls_read_only_their_data_columns() {
    use datafusion::physical_plan::ExecutionPlan;
    use datafusion::physical_plan::aggregates::AggregateExec;
    fn row_readers(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<(String, usize)>) {
        let mut read = |aggr: &[Arc<datafusion::physical_expr::aggregate::AggregateFunctionExpr>]| {
            out.extend(aggr.iter().map(|e| (e.fun().name().to_string(), e.expressions().len())))
        };
        if let Some(agg) = plan.downcast_ref::<AggregateExec>()
            && agg.mode().input_mode() == datafusion::physical_plan::aggregates::AggregateInputMode::Raw
        {
            read(agg.aggr_expr());
        }
        if let Some(partial) = plan.downcast_ref::<dpcurve::guard::exec::known_keys_partial::KnownKeysPartialExec>() {
            read(partial.aggr_expr());
        }
        for c in plan.children() {
            row_readers(c, out);
        }
    }
    let f = fixture("groups-params").await;
    let s = f.session(NoiseSource::Off, 2).await;
    for sql in [
        format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region"),
        format!("SELECT {KDE}['mass'] FROM p"),
        "SELECT private_mean_curve(load, 0.5, 1e-6, clip => 1.0, points => 8)['n'] FROM p".to_string(),
    ] {
        let plan = s.physical_plan_for_tests(&sql).await.unwrap();
        let mut readers = Vec::new();
        row_readers(&plan, &mut readers);
        assert!(!readers.is_empty(), "{sql}: {readers:?}");
        assert!(readers.iter().all(|(_, args)| *args == 1), "{sql}: one data column each: {readers:?}");
    }
    // The statistic is the same as the filtered query's (the test above, here ungrouped vs grouped).
    let grouped = masses(&s, &format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region")).await;
    let one = s.query(&format!("SELECT {KDE}['mass'] FROM p WHERE region = 'a'")).await.unwrap();
    assert_eq!(grouped[0].1.to_bits(), one[0].column(0).as_primitive::<Float64Type>().value(0).to_bits());
}

/// Declared text keys are looked up by their bytes: a neighbouring table with one more row whose
/// key is not declared — a new value, NULL, a prefix of a declared key, one 64 KiB long — releases
/// the declared groups exactly as without it (noise off: every bit), in the same rows and order.
/// Control: one more row with a declared key changes its group's mass.
#[tokio::test]
async fn one_row_with_an_undeclared_text_key_changes_nothing_released() {
    let long = "z".repeat(1 << 16);
    let extras: [Option<Option<&str>>; 6] =
        [None, Some(Some("zz")), Some(None), Some(Some("")), Some(Some(long.as_str())), Some(Some("b"))];
    let mut results = Vec::new();
    for (v, extra) in extras.iter().enumerate() {
        let dir = TempDir::new(&format!("groups-text-neighbour-{v}"));
        let mut region: Vec<Option<&str>> = (0..300).map(|i| Some(["a", "b", "c"][i % 3])).collect();
        let mut x: Vec<f64> = (0..300).map(|i| (i % 101) as f64 / 100.0).collect();
        if let Some(key) = extra {
            region.insert(150, *key);
            x.insert(150, 0.5);
        }
        let weekday: Vec<i64> = (0..region.len()).map(|i| (i % 7) as i64).collect();
        write_private_p(&dir, StringArray::from(region), weekday, x).await;
        let mut run = Vec::new();
        for partitions in [1, 3] {
            let opts =
                SessionOptions { noise: NoiseSource::Off, target_partitions: Some(partitions), ..Default::default() };
            let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
            let out = s.query(&format!("SELECT region, {KDE}['mass'] FROM p GROUP BY region")).await.unwrap();
            let got: Vec<(String, u64)> =
                common::keyed_values(&out).into_iter().map(|(k, v)| (k, v.to_bits())).collect();
            run.push(got);
        }
        assert_eq!(run[0], run[1], "extra {v}: partitions change the release");
        results.push(run.swap_remove(0));
    }
    assert_eq!(results[0].len(), 4, "{:?}", results[0]);
    for (v, r) in results.iter().enumerate().take(5).skip(1) {
        assert_eq!(r, &results[0], "an undeclared key (extra {v}) moved a release or a row");
    }
    // Control: a declared key's row is counted.
    assert_ne!(results[5], results[0]);
}
