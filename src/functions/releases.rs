//! Stored releases in SQL: `release_eval(id, x)` evaluates a kept release at any
//! point and `release(id)` re-reads it whole — neither reads a table nor spends budget: a
//! stored release holds only public parameters and released numbers
//! ([`crate::mechanism::stored`]), so everything here is post-processing (SPEC §0).
//!
//! ```sql
//! SELECT x, release_eval('r3', x) AS density FROM points;            -- any public points
//! SELECT x, y, release_eval('r4', x, y) FROM points2;                 -- a 2-D release
//! SELECT curve_quantile(private_kde, 0.5) FROM release('r3');        -- the whole release again
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Builder, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::mechanism::stored::{Recipe, StoredCurve};

/// Where stored releases are read from (the catalog).
pub trait ReleaseReader: Send + Sync + fmt::Debug {
    /// The release with this id, or None if there is none.
    fn load(&self, id: &str) -> std::result::Result<Option<Recipe>, String>;
}

/// Releases evaluated recently, by id (releases never change once stored).
#[derive(Debug)]
struct Curves {
    reader: Arc<dyn ReleaseReader>,
    cache: Mutex<HashMap<String, Arc<StoredCurve>>>,
}

/// Curves a session keeps ready to evaluate.
const CACHED_CURVES: usize = 64;

impl Curves {
    fn get(&self, function: &str, id: &str) -> Result<Arc<StoredCurve>> {
        if let Some(c) = self.cache.lock().expect("curve cache").get(id) {
            return Ok(Arc::clone(c));
        }
        let recipe = match self.reader.load(id) {
            Ok(Some(r)) => r,
            Ok(None) => {
                // An unknown id (or another analyst's) is the caller's mistake: a planning error.
                return plan_err!(
                    "{function}: there is no stored release '{id}' in this catalog (ids such as 'r1' are in the \
                     'release' field of a private result and in dpcurve.releases)"
                );
            }
            Err(e) => return exec_err!("{function}: cannot read stored release '{id}': {e}"),
        };
        let curve = Arc::new(
            StoredCurve::build(&recipe)
                .map_err(|e| datafusion::common::DataFusionError::Execution(format!("{function}: {e}")))?,
        );
        let mut cache = self.cache.lock().expect("curve cache");
        if cache.len() >= CACHED_CURVES {
            cache.clear();
        }
        cache.insert(id.to_string(), Arc::clone(&curve));
        Ok(curve)
    }
}

static EVAL_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        datafusion::logical_expr::DocSection {
            include: true,
            label: "Differentially private functions",
            description: None,
        },
        "The stored release with this id at x: the density of a private_kde release, the mean of a \
         private_mean_curve release. At the mechanism's lattice points exactly the release's own \
         sample path; between them its band-limited (KDE) or Nyström (mean curve) continuation, \
         the Gaussian-process conditional mean. A private_kde2d release is evaluated at (x, y): \
         exactly the released density at its grid points, bilinear interpolation between them. \
         NULL outside the release's range. No data is read and no budget spent.",
        "release_eval(release_id, x [, y])",
    )
    .with_sql_example("```sql\nSELECT x, release_eval('r3', x) FROM points;\n```")
    .with_argument("release_id", "a stored release's id (the 'release' field of a private result)")
    .with_argument("x", "a number or a column of numbers")
    .with_argument("y", "for a private_kde2d release: the second coordinate")
    .build()
});

/// `release_eval(release_id, x)`.
#[derive(Debug)]
pub struct ReleaseEval {
    signature: Signature,
    curves: Arc<Curves>,
}

impl PartialEq for ReleaseEval {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.curves, &other.curves)
    }
}

impl Eq for ReleaseEval {}

impl std::hash::Hash for ReleaseEval {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        "release_eval".hash(state)
    }
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 | DataType::Null)
}

impl ScalarUDFImpl for ReleaseEval {
    fn name(&self) -> &str {
        "release_eval"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let number = |t: &DataType| t.is_numeric() || t == &DataType::Null;
        match arg_types {
            [id, xs @ ..] if is_text(id) && matches!(xs.len(), 1 | 2) && xs.iter().all(number) => {
                Ok(std::iter::once(DataType::Utf8).chain(xs.iter().map(|_| DataType::Float64)).collect())
            }
            [id, xs @ ..] if matches!(xs.len(), 1 | 2) => {
                let got: Vec<String> = xs.iter().map(ToString::to_string).collect();
                plan_err!(
                    "release_eval(release_id, x [, y]): release_id must be a string and x, y numbers, got {id} and {}",
                    got.join(", ")
                )
            }
            other => plan_err!("release_eval(release_id, x [, y]) takes 2 or 3 arguments, got {}", other.len()),
        }
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let ids = args.args[0].to_array(rows)?;
        let xs = args.args[1].to_array(rows)?;
        let ys = args.args.get(2).map(|y| y.to_array(rows)).transpose()?;
        let (ids, xs) = (ids.as_string::<i32>(), xs.as_primitive::<Float64Type>());
        let ys = ys.as_ref().map(|y| y.as_primitive::<Float64Type>());
        let mut out = Float64Builder::with_capacity(rows);
        let mut last: Option<(String, Arc<StoredCurve>)> = None;
        for i in 0..rows {
            if ids.is_null(i) || xs.is_null(i) || ys.is_some_and(|y| y.is_null(i)) {
                out.append_null();
                continue;
            }
            let id = ids.value(i);
            let curve = match &last {
                Some((l, c)) if l == id => Arc::clone(c),
                _ => {
                    let c = self.curves.get("release_eval", id)?;
                    last = Some((id.to_string(), Arc::clone(&c)));
                    c
                }
            };
            // Whether a release is 1-D or 2-D is public (its function), so this error says
            // nothing about the data.
            match (ys, curve.is_2d()) {
                (None, false) => out.append_option(curve.eval(xs.value(i))),
                (Some(y), true) => out.append_option(curve.eval2(xs.value(i), y.value(i))),
                (None, true) => {
                    return exec_err!(
                        "release_eval: release '{id}' is a 2-D density (private_kde2d): give both coordinates, \
                         release_eval('{id}', x, y)"
                    );
                }
                (Some(_), false) => {
                    return exec_err!(
                        "release_eval: release '{id}' is a curve of one variable: give one coordinate, \
                         release_eval('{id}', x)"
                    );
                }
            }
        }
        let array: ArrayRef = Arc::new(out.finish());
        if rows == 1 && args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&array, 0)?));
        }
        Ok(ColumnarValue::Array(array))
    }

    fn documentation(&self) -> Option<&Documentation> {
        Some(&EVAL_DOC)
    }
}

/// `release(release_id)`: a one-row table holding the stored release as its function returned
/// it (column `private_kde` or `private_mean_curve`), recomputed from the stored numbers.
#[derive(Debug)]
pub struct ReleaseTable {
    curves: Arc<Curves>,
}

impl TableFunctionImpl for ReleaseTable {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let id = match args.exprs() {
            [Expr::Literal(ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)), _)] => s.clone(),
            _ => return plan_err!("release(release_id) takes one string literal, such as release('r1')"),
        };
        let curve = self.curves.get("release", &id)?;
        let (name, value) = match curve.as_ref() {
            StoredCurve::Kde { release, bands, .. } => {
                ("private_kde", super::private_kde::result_value(release, bands.as_ref(), Some(id.clone()))?)
            }
            StoredCurve::Kde2d { release, bands } => {
                ("private_kde2d", super::private_kde2d::result_value(release, bands.as_ref(), Some(id.clone()))?)
            }
            StoredCurve::KernelFit { mechanism, release, .. } => {
                let kind = super::kernel_fit::Kind::of(mechanism.spec().loss);
                let name = match kind {
                    super::kernel_fit::Kind::Regression => super::private_kernel_regression::NAME,
                    super::kernel_fit::Kind::Classifier => super::private_kernel_classifier::NAME,
                };
                (name, super::kernel_fit::result_value(kind, release, mechanism.spec().penalty, Some(id.clone()))?)
            }
            StoredCurve::MeanCurve { release, band, .. } => {
                ("private_mean_curve", super::private_mean_curve::result_value(release, band, Some(id.clone()))?)
            }
            StoredCurve::Cdf { release, probabilities: None, .. } => {
                (super::private_cdf::CDF, super::private_cdf::cdf_value(release, Some(id.clone()))?)
            }
            StoredCurve::Cdf { mechanism, release, probabilities: Some(p) } => (
                super::private_cdf::QUANTILES,
                super::private_cdf::quantiles_value(release, mechanism.spec(), p, Some(id.clone()))?,
            ),
        };
        let array = value.to_array()?;
        let schema = Arc::new(Schema::new(vec![Field::new(name, array.data_type().clone(), true)]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![array])?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}

/// `release_eval` and `release` over the stored releases of `reader`.
pub fn release_functions(reader: Arc<dyn ReleaseReader>) -> (ScalarUDF, Arc<ReleaseTable>) {
    let curves = Arc::new(Curves { reader, cache: Mutex::new(HashMap::new()) });
    let eval = ReleaseEval { signature: Signature::user_defined(Volatility::Stable), curves: Arc::clone(&curves) };
    (ScalarUDF::from(eval), Arc::new(ReleaseTable { curves }))
}
