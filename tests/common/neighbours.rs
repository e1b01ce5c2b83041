//! Two catalogs with the same policies and history over neighbouring tables — with and without
//! alice's row — and what an analyst observes of a query on each, besides the released numbers.
#![allow(dead_code)]

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::DataType;
use dpcurve::{Admin, AnalystSession, NoiseSource, SessionOptions};

use super::TempDir;

/// 240 ordinary rows (g in g0..g2, code '1'/'2', flag 'true'/'false', unit u0..u59, integer day
/// 0..19 and num 0..59) and, when `alice`, her row: the only one with g3, code '01', flag 't',
/// day 99 (undeclared) and num 1000.
pub fn write(path: &std::path::Path, alice: bool) {
    let n = 240;
    let mut name: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    let mut g: Vec<String> = (0..n).map(|i| format!("g{}", i % 3)).collect();
    let mut code: Vec<String> = (0..n).map(|i| format!("{}", 1 + i % 2)).collect();
    let mut flag: Vec<String> = (0..n).map(|i| (i % 2 == 0).to_string()).collect();
    let mut unit: Vec<String> = (0..n).map(|i| format!("u{}", i % 60)).collect();
    let mut x: Vec<f64> = (0..n).map(|i| (i as f64 * 0.618).fract()).collect();
    let mut day: Vec<i64> = (0..n).map(|i| (i % 20) as i64).collect();
    let mut num: Vec<i64> = (0..n).map(|i| (i % 60) as i64).collect();
    if alice {
        // In the middle of the file: DataFusion's hash table would meet her group second.
        let at = 1;
        name.insert(at, "alice".into());
        g.insert(at, "g3".into());
        code.insert(at, "01".into());
        flag.insert(at, "t".into());
        unit.insert(at, "alice".into());
        x.insert(at, 0.5);
        day.insert(at, 99);
        num.insert(at, 1000);
    }
    let text = |v: Vec<String>| Arc::new(StringArray::from(v)) as ArrayRef;
    super::write_columns(
        path,
        vec![
            ("name", text(name)),
            ("g", text(g)),
            ("code", text(code)),
            ("flag", text(flag)),
            ("unit", text(unit)),
            ("x", Arc::new(Float64Array::from(x))),
            ("day", Arc::new(Int64Array::from(day))),
            ("num", Arc::new(Int64Array::from(num))),
        ],
    );
}

/// Two catalogs, the same policies and history, one row apart.
pub struct Neighbours {
    pub with: (TempDir, Admin),
    pub without: (TempDir, Admin),
}

impl Neighbours {
    pub async fn new(tag: &str) -> Self {
        let mut sides = Vec::new();
        for alice in [true, false] {
            let dir = TempDir::new(&format!("{tag}-{alice}"));
            write(&dir.path("p.parquet"), alice);
            write(&dir.path("q.parquet"), alice);
            let admin = Admin::open(&dir.path("catalog.db")).unwrap();
            for t in ["p", "q"] {
                admin.register(t, &dir.str(&format!("{t}.parquet"))).await.unwrap();
                admin.make_private(t, 1000.0, 1e-2).await.unwrap();
                admin.set_bounds(t, "x", 0.0, 1.0).await.unwrap();
                let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
                admin.set_keys(t, "g", &keys(&["g0", "g1", "g2", "g3"])).await.unwrap();
                admin.set_keys(t, "code", &keys(&["01", "1", "2"])).await.unwrap();
                admin.set_keys(t, "flag", &keys(&["t", "true", "false"])).await.unwrap();
                // A run of integers (filtered as a range), enough groups to release on several threads.
                admin.set_keys(t, "day", &(0..20).map(|d| d.to_string()).collect::<Vec<_>>()).await.unwrap();
                // The same public bound on both sides.
                admin.set_row_bound(t, Some(100_000)).unwrap();
            }
            // q: a person is the unit (K = 2 rows, L = 2 groups).
            admin.set_privacy_unit("q", "unit", 2, 2).await.unwrap();
            sides.push((dir, admin));
        }
        let without = sides.pop().unwrap();
        let with = sides.pop().unwrap();
        Self { with, without }
    }

    pub async fn session(side: &(TempDir, Admin), partitions: usize) -> AnalystSession {
        let opts = SessionOptions { noise: NoiseSource::Os, target_partitions: Some(partitions), ..Default::default() };
        AnalystSession::open(&side.0.path("catalog.db"), opts).await.unwrap()
    }

    /// What each side shows for `sql` (with `partitions` partitions): everything but the
    /// released numbers.
    pub async fn observe(&self, sql: &str, partitions: usize) -> (Observed, Observed) {
        let a = observe(&Self::session(&self.with, partitions).await, &self.with.1, sql).await;
        let b = observe(&Self::session(&self.without, partitions).await, &self.without.1, sql).await;
        (a, b)
    }
}

/// The text columns of the result (group keys, release ids) row by row, the row count, the
/// error, the release log's length and the stored releases' count.
#[derive(Debug, PartialEq)]
pub struct Observed {
    pub rows: Vec<Vec<String>>,
    pub error: Option<String>,
    pub charges: usize,
    pub stored: usize,
}

pub async fn observe(s: &AnalystSession, admin: &Admin, sql: &str) -> Observed {
    let (rows, error) = match s.query(sql).await {
        Ok(batches) => (text_rows(&batches), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Observed { rows, error, charges: admin.release_log(None).unwrap().len(), stored: stored(admin) }
}

pub fn stored(admin: &Admin) -> usize {
    admin.stored_releases(None).unwrap().len()
}

/// Every non-float column of every row, as text.
pub fn text_rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in batches {
        let cols: Vec<ArrayRef> = b
            .columns()
            .iter()
            .filter(|c| !matches!(c.data_type(), DataType::Float64 | DataType::Struct(_) | DataType::List(_)))
            .map(|c| datafusion::arrow::compute::cast(c, &DataType::Utf8).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            out.push(cols.iter().map(|c| c.as_string::<i32>().value(r).to_string()).collect());
        }
    }
    out
}
