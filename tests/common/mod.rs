//! Shared helpers for integration tests: temporary directories and Parquet files.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::array::{Array, AsArray, Float64Array};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "dpcurve-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn str(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a nullable Float64 column `x` to a Parquet file, in row groups of `group` rows.
pub fn write_x(path: &Path, values: &[Option<f64>]) {
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float64, true)]));
    let file = File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), None).unwrap();
    for chunk in values.chunks(1000) {
        let b = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Float64Array::from(chunk.to_vec()))]).unwrap();
        w.write(&b).unwrap();
    }
    w.close().unwrap();
}

/// Deterministic values from the two-normal mixture.
pub fn mixture(n: usize, seed: u64) -> Vec<f64> {
    dpcurve::datagen::mixture(n, seed)
}

/// The (x, density, mass) of a one-row `private_kde` result in column 0.
pub fn kde_result(batches: &[RecordBatch]) -> (Vec<f64>, Option<Vec<f64>>, f64) {
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    let b = batches.iter().find(|b| b.num_rows() == 1).unwrap();
    let s = b.column(0).as_struct();
    let list = |name: &str| {
        let l = s.column_by_name(name).unwrap().as_list::<i32>();
        l.is_valid(0).then(|| l.value(0).as_primitive::<Float64Type>().values().to_vec())
    };
    let mass = s.column_by_name("mass").unwrap().as_primitive::<Float64Type>().value(0);
    (list("x").unwrap(), list("density"), mass)
}
