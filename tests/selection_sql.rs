//! GROUP BY over private keys (SPEC §7) through real SQL: groups appear only through DP
//! partition selection, charged in addition; unselected keys appear nowhere; with a privacy unit
//! the selection counts units, not rows.

mod common;

use std::sync::Arc;

use common::TempDir;
use datafusion::arrow::array::{ArrayRef, AsArray, Float64Array, StringArray};
use datafusion::arrow::datatypes::Float64Type;
use dpcurve::mechanism::noise::budget::Budget;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

/// Cities: big1 (500 rows), big2 (300), small (3), lone (1), spam (1 000 rows of one person).
fn write(path: &std::path::Path) {
    let mut city = Vec::new();
    let mut person = Vec::new();
    let mut x = Vec::new();
    for (name, rows) in [("big1", 500), ("big2", 300), ("small", 3), ("lone", 1)] {
        for i in 0..rows {
            city.push(name.to_string());
            person.push(format!("{name}-{i}"));
            x.push((i % 97) as f64 / 97.0);
        }
    }
    for i in 0..1000 {
        city.push("spam".into());
        person.push("spammer".into());
        x.push((i % 13) as f64 / 13.0);
    }
    common::write_columns(
        path,
        vec![
            ("city", Arc::new(StringArray::from(city)) as ArrayRef),
            ("person", Arc::new(StringArray::from(person))),
            ("x", Arc::new(Float64Array::from(x))),
        ],
    );
}

struct Fixture {
    dir: TempDir,
    admin: Admin,
}

/// `rows` (the row is the unit) and `people` (the same file's copy with `person` as the unit).
async fn fixture(tag: &str) -> Fixture {
    let dir = TempDir::new(tag);
    write(&dir.path("rows.parquet"));
    write(&dir.path("people.parquet"));
    let admin = Admin::open(&dir.path("catalog.db")).unwrap();
    for t in ["rows", "people"] {
        admin.register(t, &dir.str(&format!("{t}.parquet"))).await.unwrap();
        admin.make_private(t, 1000.0, 1e-2).await.unwrap();
        admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
        // Public, and above the files' 1 804 rows.
        admin.set_row_bound(t, Some(2000)).unwrap();
    }
    admin.set_privacy_unit("people", "person", 2, 1).await.unwrap();
    Fixture { dir, admin }
}

impl Fixture {
    async fn session(&self, noise: NoiseSource) -> AnalystSession {
        let opts = SessionOptions { noise, target_partitions: Some(2), ..Default::default() };
        AnalystSession::open(&self.dir.path("catalog.db"), opts).await.unwrap()
    }

    fn spent(&self, table: &str) -> Budget {
        self.admin.tables().unwrap().into_iter().find(|t| t.name == table).unwrap().policy.unwrap().spent
    }
}

/// τ = 15 for (1, 1e-6) with one group per unit (mechanism::selection's reference value).
const SELECT: &str = "select_epsilon => 1, select_delta => 1e-6";

fn kde(extra: &str) -> String {
    format!("private_kde(x, 0.05, 0.5, 1e-6, points => 64, {extra}, mechanism => 'gaussian')")
}

/// (city, mass) rows, sorted by city.
async fn cities(s: &AnalystSession, sql: &str) -> Vec<(String, f64)> {
    common::keyed_values(&s.query(sql).await.unwrap())
}

#[tokio::test]
async fn only_groups_above_the_threshold_appear_and_the_selection_is_charged() {
    let f = fixture("sel-threshold").await;
    let s = f.session(NoiseSource::Off).await;
    let sql = format!("SELECT city, {}['mass'] FROM rows GROUP BY city", kde(SELECT));
    let got = cities(&s, &sql).await;
    // Noise off: exactly the groups whose count reaches τ = 15.
    let names: Vec<&str> = got.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["big1", "big2", "spam"]);
    // Each selected group's curve is the ungrouped curve filtered to it.
    for (c, m) in &got {
        let one =
            s.query(&format!("SELECT {}['mass'] FROM rows WHERE city = '{c}'", kde("nonneg => true"))).await.unwrap();
        assert_eq!(m.to_bits(), one[0].column(0).as_primitive::<Float64Type>().value(0).to_bits(), "{c}");
    }
    // The curve (0.5, 1e-6) plus the selection (1, 1e-6) for the grouped query, plus 3 ungrouped.
    let curve = Budget::charge(0.5, 1e-6).unwrap();
    let selection = Budget::charge(1.0, 1e-6).unwrap();
    let want = Budget::charge(2.0 + 1.0, 4e-6 + 1e-6).unwrap();
    assert_eq!(f.spent("rows"), want, "{curve} + {selection} + 3 × {curve}");
    let log = f.admin.release_log(Some("rows")).unwrap();
    assert_eq!(log.iter().filter(|r| r.function == "partition_selection").count(), 1);
    // A public cap on released groups: the highest noisy counts win.
    let top = cities(
        &s,
        &format!("SELECT city, {}['mass'] FROM rows GROUP BY city", kde(&format!("{SELECT}, select_max_groups => 1"))),
    )
    .await;
    assert_eq!(top.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(), ["spam"]);
    // Two selections under one UNION ALL (two partitions: DataFusion interleaves the grouped
    // inputs), each choosing its own groups.
    let one = format!("SELECT * FROM (SELECT city, {}['mass'] AS m FROM rows GROUP BY city)", kde(SELECT));
    let both = cities(&s, &format!("{one} UNION ALL {one} ORDER BY 1")).await;
    let names: Vec<&str> = both.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["big1", "big1", "big2", "big2", "spam", "spam"]);
}

#[tokio::test]
async fn with_a_unit_the_selection_counts_people_not_rows() {
    let f = fixture("sel-unit").await;
    let s = f.session(NoiseSource::Off).await;
    let sql = |t: &str| format!("SELECT city, {}['mass'] FROM {t} GROUP BY city", kde(SELECT));
    // One person with 1 000 rows is one unit: 'spam' is not selected. Negative control: when the
    // row is the unit, it is.
    let people: Vec<String> = cities(&s, &sql("people")).await.into_iter().map(|(c, _)| c).collect();
    assert_eq!(people, ["big1", "big2"]);
    let rows: Vec<String> = cities(&s, &sql("rows")).await.into_iter().map(|(c, _)| c).collect();
    assert!(rows.contains(&"spam".to_string()));
}

/// The first pass's count (and, with a unit, its bound) is the planned operator, whose memory and
/// spills follow from the table's declared row bound and the memory limit, never from how many candidate groups
/// the rows have (DataFusion's aggregate spilled when they no longer fit: one more group could make
/// the query spill and run visibly longer) — over one partition too, where DataFusion plans one
/// phase of its own; over two, a partial count holding at most a window's keys comes first.
#[tokio::test]
async fn the_first_pass_counts_with_memory_planned_from_public_facts() {
    let f = fixture("sel-planned").await;
    for partitions in [1, 2] {
        let opts =
            SessionOptions { noise: NoiseSource::Off, target_partitions: Some(partitions), ..Default::default() };
        let s = AnalystSession::open(&f.dir.path("catalog.db"), opts).await.unwrap();
        // Over two partitions the count runs in two phases: counts per partition as the rows come,
        // exchanged by key, added up.
        for (t, planned) in [("rows", partitions), ("people", partitions + 1)] {
            let sql = format!("SELECT city, {}['mass'] FROM {t} GROUP BY city", kde(SELECT));
            let plan = s.physical_plan_for_tests(&sql).await.unwrap();
            let gate = plan.downcast_ref::<dpcurve::guard::BudgetGateExec>().expect("the gate at the root");
            let [first] = &gate.selection_plans()[..] else { panic!("one selection") };
            let text = datafusion::physical_plan::displayable(first.as_ref()).indent(false).to_string();
            assert!(text.contains("aggr=[count], input rows <= 2000, memory <= "), "{t}, {partitions}:\n{text}");
            assert_eq!(text.matches("PlannedAggregateExec").count(), planned, "{t}, {partitions}:\n{text}");
            assert!(!text.contains("AggregateExec: mode="), "{t}, {partitions}: no aggregate of DataFusion's\n{text}");
            let phases = text.contains("aggr=[count], input rows <= 2000, partial, every 32768 rows")
                && text.contains("aggr=[count], input rows <= 2000, memory <= ")
                && text.contains(", final");
            assert_eq!(phases, partitions == 2, "{t}, {partitions}:\n{text}");
            // The release's own bound too.
            let main = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
            assert!(t == "rows" || main.contains("aggr=[dpcurve_unit_bound], input rows <= 2000"), "{main}");
        }
    }
}

#[tokio::test]
async fn unselected_keys_appear_nowhere_and_rare_groups_stay_hidden_with_noise() {
    let f = fixture("sel-hidden").await;
    let s = f.session(NoiseSource::Os).await;
    let sql = format!("SELECT city, {}['mass'] FROM rows GROUP BY city", kde(SELECT));
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..20 {
        for (c, _) in cities(&s, &sql).await {
            *seen.entry(c).or_insert(0) += 1;
        }
    }
    // Counts 3 and 1 pass τ = 15 with probability < 1e-5 each run; 300 and more almost surely.
    assert!(!seen.contains_key("small") && !seen.contains_key("lone"), "{seen:?}");
    assert_eq!((seen["big1"], seen["big2"], seen["spam"]), (20, 20, 20), "{seen:?}");
    let b = s.query(&format!("EXPLAIN {sql}")).await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&b).unwrap().to_string();
    assert!(text.contains("dpcurve_selected"), "{text}");
    for hidden in ["small", "lone", "big1"] {
        assert!(!text.contains(hidden), "{text}");
    }
    // Below the gate nothing is selected and nothing released; after a paid execution the
    // selection's permits are used up exactly, so a re-run below the gate cannot release again.
    let plan = s.physical_plan_for_tests(&sql).await.unwrap();
    let below = Arc::clone(plan.children()[0]);
    let b = datafusion::physical_plan::collect(Arc::clone(&below), s.task_ctx_for_tests()).await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    let spent = f.spent("rows");
    let plan = datafusion::physical_plan::execution_plan::reset_plan_states(plan).unwrap();
    let b = datafusion::physical_plan::collect(Arc::clone(&plan), s.task_ctx_for_tests()).await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 3, "paid: big1, big2, spam");
    assert_ne!(f.spent("rows"), spent);
    let below = datafusion::physical_plan::execution_plan::reset_plan_states(Arc::clone(plan.children()[0])).unwrap();
    let e = datafusion::physical_plan::collect(below, s.task_ctx_for_tests()).await.unwrap_err().to_string();
    assert!(e.contains("no release permit"), "{e}");
}

#[tokio::test]
async fn private_keys_without_a_selection_and_misplaced_arguments_are_refused() {
    let f = fixture("sel-refused").await;
    f.admin.set_keys("rows", "person", &["a".into()]).await.unwrap();
    let s = f.session(NoiseSource::Os).await;
    let refused = [
        (format!("SELECT city, {} FROM rows GROUP BY city", kde("nonneg => true")), "select_epsilon =>"),
        (format!("SELECT {} FROM rows", kde(SELECT)), "apply only to a GROUP BY"),
        (format!("SELECT person, {} FROM rows GROUP BY person", kde(SELECT)), "apply only to a GROUP BY"),
        (format!("SELECT city, person, {} FROM rows GROUP BY city, person", kde(SELECT)), "mixes columns"),
        (format!("SELECT city, {} FROM rows GROUP BY city", kde("select_epsilon => 1")), "go together"),
        (
            format!("SELECT city, {} FROM rows GROUP BY city", kde("select_epsilon => 1, select_delta => 0.9")),
            "(0, 0.5]",
        ),
        (
            format!(
                "SELECT city, {}, {} FROM rows GROUP BY city",
                kde(SELECT),
                kde("select_epsilon => 2, select_delta => 1e-6")
            ),
            "share one partition selection",
        ),
        (format!("SELECT upper(city), {} FROM rows GROUP BY upper(city)", kde(SELECT)), "plain columns"),
    ];
    for (sql, want) in &refused {
        let e = s.query(sql).await.unwrap_err().to_string();
        assert!(e.contains(want), "{sql}: {e}");
    }
    // Memory: the cap on released groups counts as groups.
    f.admin.set_memory_limit(64 << 20).unwrap();
    let s = f.session(NoiseSource::Os).await;
    let e = s
        .query(&format!(
            "SELECT city, private_kde(x, 0.001, 0.5, 1e-6, points => 4096, {SELECT}, select_max_groups => 5000, mechanism => 'gaussian') FROM rows GROUP BY city"
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("[rule memory-limit]") && e.contains("5000 groups"), "{e}");
    assert_eq!(f.spent("rows"), Budget::ZERO);
}

#[tokio::test]
async fn integer_keys_counted_by_value_select_exactly_what_hashed_keys_select() {
    // The same groups under an integer key (counted by value, then hashed; the membership filter
    // tests the selected values themselves unless the NULL key is among them) and under a string
    // key (hashed on every row): code 1 has exactly τ = 15 rows, code 2 one fewer, code 3 many,
    // and a NULL key (one group under both: its own value, its own hash) 20 rows (selected) or 5.
    for (null_rows, want) in [(20, &["", "1", "3"][..]), (5, &["1", "3"][..])] {
        let dir = TempDir::new(&format!("sel-int-keys-{null_rows}"));
        let (mut code, mut name, mut x) = (Vec::new(), Vec::new(), Vec::new());
        for (c, rows) in [(Some(1i64), 15), (Some(2), 14), (Some(3), 200), (None, null_rows)] {
            for i in 0..rows {
                code.push(c);
                name.push(c.map(|c| format!("c{c}")));
                x.push((i % 31) as f64 / 31.0);
            }
        }
        common::write_columns(
            &dir.path("t.parquet"),
            vec![
                ("code", Arc::new(datafusion::arrow::array::Int64Array::from(code)) as ArrayRef),
                ("name", Arc::new(StringArray::from(name))),
                ("x", Arc::new(Float64Array::from(x))),
            ],
        );
        common::private_t(&dir).await;
        let opts = SessionOptions { noise: NoiseSource::Off, target_partitions: Some(2), ..Default::default() };
        let s = AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap();
        let by = |k: &str| format!("SELECT {k}, {}['mass'] FROM t GROUP BY {k}", kde(SELECT));
        let codes = cities(&s, &by("code")).await;
        let names = cities(&s, &by("name")).await;
        // The integer key's selected groups are found in a table of the selected values (the
        // membership filter is dropped: unselected rows go to a spare group never released).
        let shown = |sql: String| {
            let s = &s;
            async move {
                let plan = s.physical_plan_for_tests(&sql).await.unwrap();
                datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string()
            }
        };
        let plan = shown(by("code")).await;
        assert!(
            plan.contains("KnownKeysPartialExec: selected keys") && !plan.contains("dpcurve_selected(code"),
            "{plan}"
        );
        let plan = shown(by("name")).await;
        assert!(
            plan.contains("KnownKeysPartialExec: selected keys (first seen)") && plan.contains("dpcurve_selected(name"),
            "{plan}"
        );
        // (A NULL key reads as "" here.)
        assert_eq!(codes.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(), want, "count ≥ τ = 15 exactly");
        assert_eq!(names.len(), codes.len());
        for ((c, a), (n, b)) in codes.iter().zip(&names) {
            assert_eq!(if c.is_empty() { String::new() } else { format!("c{c}") }, *n);
            assert_eq!(a.to_bits(), b.to_bits(), "group {c}: the same rows");
            assert!(*a > 14.0, "group {c} has its rows: {a}");
        }
    }
}

/// The attack on the table lookup of selected integer keys: key types at the edges of what the
/// lookup takes (Int8 with a selected NULL key; UInt64, which it leaves to DataFusion, with keys
/// beyond i64) and one extra row of an unselected key (her own key, or the extreme values) must
/// change nothing observable: the same rows in the same order, the same errors (none), on 1 and
/// 3 partitions.
#[tokio::test]
async fn selection_over_edge_integer_types_shows_nothing_of_one_row() {
    use datafusion::arrow::array::{Int8Array, UInt64Array};
    let mut outcomes = Vec::new();
    for alice in [false, true] {
        let dir = TempDir::new(&format!("sel-edge-int-{alice}"));
        let (mut small, mut big, mut x) = (Vec::new(), Vec::new(), Vec::new());
        for (s, b, rows) in [(Some(-128i8), Some(u64::MAX), 30), (Some(127), Some(1u64 << 63), 30), (None, None, 30)] {
            for i in 0..rows {
                small.push(s);
                big.push(b);
                x.push((i % 17) as f64 / 17.0);
            }
        }
        if alice {
            small.insert(7, Some(0));
            big.insert(7, Some(u64::MAX - 1));
            x.insert(7, 0.5);
        }
        common::write_columns(
            &dir.path("t.parquet"),
            vec![
                ("small", Arc::new(Int8Array::from(small)) as ArrayRef),
                ("big", Arc::new(UInt64Array::from(big))),
                ("x", Arc::new(Float64Array::from(x))),
            ],
        );
        common::private_t(&dir).await;
        let mut seen = Vec::new();
        for partitions in [1, 3] {
            let s = noise_off(&dir, partitions).await;
            for k in ["small", "big"] {
                let sql = format!("SELECT {k}, {}['mass'] FROM t GROUP BY {k} ORDER BY {k}", kde(SELECT));
                let out = s
                    .query(&sql)
                    .await
                    .map(|b| common::keyed_values(&b).into_iter().map(|(k, m)| (k, m.to_bits())).collect::<Vec<_>>());
                let plan = s.physical_plan_for_tests(&sql).await.unwrap();
                let plan = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
                assert_eq!(plan.contains("KnownKeysPartialExec: selected keys,"), k == "small", "{plan}");
                assert_eq!(plan.contains("KnownKeysPartialExec: selected keys (first seen)"), k == "big", "{plan}");
                let out = out.map_err(|e| e.to_string());
                let rows = out.as_ref().expect("no error").len();
                assert_eq!(rows, 3, "{k}: the three keys of 30 rows (NULL included), her key never");
                let masses = out.as_ref().unwrap().iter().map(|(_, m)| f64::from_bits(*m));
                assert!(
                    masses.clone().all(|m| m > 25.0),
                    "{k}: each group has its 30 rows: {:?}",
                    masses.collect::<Vec<_>>()
                );
                seen.push((k, partitions, out));
            }
        }
        outcomes.push(seen);
    }
    assert_eq!(outcomes[0], outcomes[1], "the neighbours differ");
}

/// Rows each partition of the (first) partial phase over known keys emitted in the execution of
/// `plan` just run, by partition.
fn emitted_per_partition(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> Vec<usize> {
    use datafusion::physical_plan::ExecutionPlan;
    use datafusion::physical_plan::metrics::MetricValue;
    use dpcurve::guard::exec::known_keys_partial::KnownKeysPartialExec;
    fn find(p: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        match p.downcast_ref::<KnownKeysPartialExec>() {
            Some(_) => Some(Arc::clone(p)),
            None => p.children().into_iter().find_map(find),
        }
    }
    let partial = find(plan).expect("a partial phase over known keys");
    let mut rows = vec![0; partial.properties().output_partitioning().partition_count()];
    for m in partial.metrics().expect("metrics").iter() {
        if let (MetricValue::OutputRows(n), Some(p)) = (m.value(), m.partition()) {
            rows[p] += n.value();
        }
    }
    rows
}

/// The state rows the final phase of `plan` merged, and how many of them were a public group's.
fn final_phase_merges(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> (usize, usize) {
    use datafusion::physical_plan::ExecutionPlan;
    use dpcurve::guard::exec::canonical_groups::CanonicalGroupsExec;
    fn find(p: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        match p.downcast_ref::<CanonicalGroupsExec>() {
            Some(_) => Some(Arc::clone(p)),
            None => p.children().into_iter().find_map(find),
        }
    }
    let last = find(plan).expect("a canonical final phase");
    let metrics = last.metrics().expect("metrics");
    let count = |name: &str| metrics.sum_by_name(name).map_or(0, |v| v.as_usize());
    (count("merged_states"), count("group_states"))
}

/// Keys selected by hash (text) are learnt by each partition from its rows, in a table with room
/// for every selected key from the start; and every partition emits a state for every selected
/// group, reached or not (the groups no row reached with NULL keys and empty states, which the
/// final phase merges into a spare group it never releases). The attack: a row that is the first
/// of its group in a partition made that partition emit, serialise and merge one more state (tens
/// of µs for a large KDE): a step in time that one row moves; and, once every partition emitted
/// every group, the final phase skipped the filler states and merged only the reached ones.
/// Here three partitions of which two read no rows emit as many states as were selected, and
/// the final phase merges every one of them, on neighbours with and without one more row of a
/// selected key and of an unselected one; the releases are the same as the integer key's.
/// Controls: DataFusion's partial phase over the same rows emits only the groups it reached (none
/// on the empty partitions), and fewer of the merged states than were merged are a public
/// group's.
#[tokio::test]
async fn keys_selected_by_hash_emit_every_selected_group_in_every_partition() {
    let mut outcomes = Vec::new();
    for alice in [false, true] {
        let dir = TempDir::new(&format!("sel-first-seen-{alice}"));
        let (mut name, mut x) = (Vec::new(), Vec::new());
        for (k, rows) in [("c0", 30), ("c1", 40), ("c2", 30), ("c3", 50), ("r0", 2), ("r1", 3)] {
            for i in 0..rows {
                name.push(k.to_string());
                x.push((i % 31) as f64 / 31.0);
            }
        }
        if alice {
            name.insert(3, "c2".into());
            x.insert(3, 0.5);
            name.insert(50, "r2".into());
            x.insert(50, 0.25);
        }
        common::write_columns(
            &dir.path("t.parquet"),
            vec![("name", Arc::new(StringArray::from(name)) as ArrayRef), ("x", Arc::new(Float64Array::from(x)))],
        );
        common::private_t(&dir).await;
        let mut seen = Vec::new();
        for partitions in [1, 3] {
            let s = noise_off(&dir, partitions).await;
            let sql = format!("SELECT name, {}['mass'] FROM t GROUP BY name ORDER BY name", kde(SELECT));
            let plan = s.physical_plan_for_tests(&sql).await.unwrap();
            let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
            assert!(shown.contains("KnownKeysPartialExec: selected keys (first seen)"), "{shown}");
            let out = datafusion::physical_plan::collect(Arc::clone(&plan), s.task_ctx_for_tests()).await.unwrap();
            let groups: Vec<String> = common::keyed_values(&out).into_iter().map(|(k, _)| k).collect();
            assert_eq!(groups, ["c0", "c1", "c2", "c3"], "τ = 15: the four large keys");
            let emitted = emitted_per_partition(&plan);
            assert_eq!(emitted, vec![4; partitions], "every selected group in every partition");
            let (merged, of_groups) = final_phase_merges(&plan);
            assert_eq!(merged, 4 * partitions, "the final phase merges every state row");
            if partitions == 3 {
                assert!(of_groups < merged, "control: some merged states are fillers ({of_groups} of {merged})");
            }
            seen.push(emitted);
            seen.push(vec![merged]);
            // Control: DataFusion's partial phase over the selected keys' rows reaches no group
            // on a partition without rows.
            if partitions == 3 {
                let sql = "SELECT name, sum(x) FROM t WHERE name IN ('c0', 'c1', 'c2', 'c3') GROUP BY name";
                let reached = common::datafusion_partial_rows(&dir.str("t.parquet"), 3, sql).await;
                assert!(reached.contains(&0) && reached.contains(&4), "control: {reached:?}");
            }
        }
        outcomes.push(seen);
    }
    assert_eq!(outcomes[0], outcomes[1], "the neighbours differ");
}

/// A key column read as a dictionary (a Parquet file written from dictionary-encoded text)
/// selects and releases the same groups, bit for bit, as the same keys read as plain text: the
/// final phase recognises a selected group by hashing the partial phase's key column, which must
/// encode a dictionary's value as the text itself. Control: the two files' key columns do have
/// different types.
#[tokio::test]
async fn dictionary_encoded_keys_select_and_release_what_plain_text_keys_do() {
    use datafusion::arrow::array::DictionaryArray;
    use datafusion::arrow::datatypes::Int32Type;
    let text = |values: Vec<String>, dictionary: bool| -> ArrayRef {
        if dictionary {
            Arc::new(values.iter().map(String::as_str).collect::<DictionaryArray<Int32Type>>())
        } else {
            Arc::new(StringArray::from(values))
        }
    };
    // Per privacy unit or not: each unit (a dictionary-encoded column too) keeps all its rows.
    for unit in [false, true] {
        let mut results = Vec::new();
        for dictionary in [false, true] {
            let dir = TempDir::new(&format!("sel-dictionary-{dictionary}-{unit}"));
            let (mut name, mut person, mut x) = (Vec::new(), Vec::new(), Vec::new());
            for (k, rows) in [("c0", 30), ("c1", 40), ("c2", 30), ("c3", 50), ("r0", 2), ("r1", 3)] {
                for i in 0..rows {
                    name.push(k.to_string());
                    person.push(format!("{k}-{i}"));
                    x.push((i % 31) as f64 / 31.0);
                }
            }
            common::write_columns(
                &dir.path("t.parquet"),
                vec![
                    ("name", text(name, dictionary)),
                    ("person", text(person, dictionary)),
                    ("x", Arc::new(Float64Array::from(x))),
                ],
            );
            let admin = common::private_t(&dir).await;
            if unit {
                admin.set_privacy_unit("t", "person", 1, 1).await.unwrap();
            }
            for partitions in [1, 3] {
                let s = noise_off(&dir, partitions).await;
                let sql = format!("SELECT name, {}['mass'] FROM t GROUP BY name ORDER BY name", kde(SELECT));
                let plan = s.physical_plan_for_tests(&sql).await.unwrap();
                let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(false).to_string();
                assert!(shown.contains("KnownKeysPartialExec: selected keys (first seen)"), "{shown}");
                let out = s.query(&sql).await.unwrap();
                let key_type = out[0].schema().field(0).data_type().clone();
                assert_eq!(
                    matches!(key_type, datafusion::arrow::datatypes::DataType::Dictionary(..)),
                    dictionary,
                    "{key_type}"
                );
                let got: Vec<(String, u64)> =
                    common::keyed_values(&out).into_iter().map(|(k, v)| (k, v.to_bits())).collect();
                results.push(got);
            }
        }
        let names: Vec<&str> = results[0].iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["c0", "c1", "c2", "c3"], "τ = 15: the four large keys (unit {unit})");
        assert!(results.iter().all(|r| *r == results[0]), "unit {unit}: {results:?}");
    }
}

/// A noise-off analyst session on the catalog in `dir`, over `partitions` partitions.
async fn noise_off(dir: &TempDir, partitions: usize) -> AnalystSession {
    let opts = SessionOptions { noise: NoiseSource::Off, target_partitions: Some(partitions), ..Default::default() };
    AnalystSession::open(&dir.path("catalog.db"), opts).await.unwrap()
}
