//! `private_kde2d`: a differentially private 2-D kernel density estimate as a SQL aggregate
//! (Hall et al. §4.1 with the diagonal bandwidth of §4.1.1; SPEC §2 "Two dimensions").
//!
//! ```sql
//! private_kde2d(x, y, bandwidth_x, bandwidth_y, epsilon, delta
//!               [, lo_x => …, hi_x => …, lo_y => …, hi_y => …, points_x => 64, points_y => 64,
//!                calibration => 'analytic', normalize => 'project', select_…])
//!   -> {x: List<Float64>, y: List<Float64>, density: List<List<Float64>>, mass: Float64,
//!       release: Utf8}
//! ```
//!
//! `density[i][j]` is the density at `(x[i], y[j])`. Accumulators carry the exact fixed-point
//! statistic of [`Kde2dMechanism`] (linear binning on the product lattice) between partitions;
//! the noise — an exact discrete Gaussian on the Kronecker-structured lifted coordinates — is
//! added once, in the final `evaluate`, and the release is memoised. A row is dropped when either
//! value is NULL, NaN or ±inf, or farther than 8 bandwidths outside its axis's range.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, Float64Array, Float64Builder, ListBuilder, StringArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::Documentation;
use rand::rngs::ChaCha20Rng;

use super::aggregate::{PrivateSpec, PrivateUdaf};
use super::arrays::{float_list, for_each_valid_pair};
use super::call::{CallContext, PolicyArgs};
use super::params::{FunctionParams, ParamDef, ParamKind};
use super::release::Release;
use crate::mechanism::density::kde2d::{Kde2dBands, Kde2dMechanism, Kde2dRelease, Kde2dSpec};
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::stored::Recipe;
use crate::mechanism::sums::BufferedSums;
use crate::mechanism::{Contribution, Grid, Normalise};

/// SQL name of the function.
pub const NAME: &str = "private_kde2d";
/// Default number of grid points along each axis.
pub const DEFAULT_POINTS: usize = 64;
/// Most grid points along one axis.
pub const MAX_POINTS: usize = 1024;
/// Argument positions of the box (x and y are 0 and 1), for the policy defaults.
pub const BOX_ARGS: &[(usize, (usize, usize))] = &[(0, (6, 7)), (1, (8, 9))];

/// Declared arguments, in positional order.
pub static PARAMS: FunctionParams = FunctionParams {
    function: NAME,
    data: &["x", "y"],
    params: &[
        ParamDef { name: "bandwidth_x", kind: ParamKind::Float },
        ParamDef { name: "bandwidth_y", kind: ParamKind::Float },
        ParamDef { name: "epsilon", kind: ParamKind::Float },
        ParamDef { name: "delta", kind: ParamKind::Float },
        ParamDef { name: "lo_x", kind: ParamKind::Float },
        ParamDef { name: "hi_x", kind: ParamKind::Float },
        ParamDef { name: "lo_y", kind: ParamKind::Float },
        ParamDef { name: "hi_y", kind: ParamKind::Float },
        ParamDef { name: "points_x", kind: ParamKind::Int },
        ParamDef { name: "points_y", kind: ParamKind::Int },
        ParamDef { name: "calibration", kind: ParamKind::Str },
        ParamDef { name: "normalize", kind: ParamKind::Str },
        ParamDef { name: "band_alpha", kind: ParamKind::Float },
        ParamDef { name: "select_epsilon", kind: ParamKind::Float },
        ParamDef { name: "select_delta", kind: ParamKind::Float },
        ParamDef { name: "select_max_groups", kind: ParamKind::Int },
    ],
    required: 4,
};

/// Turns literal parameter values into a validated mechanism and the exact budget a release
/// costs (the mechanism is calibrated with the charged (ε, δ), never more).
pub fn mechanism_from_literals(
    values: &[Option<ScalarValue>],
    contribution: Contribution,
) -> Result<(Kde2dMechanism, Budget)> {
    let p = &PARAMS;
    let bandwidth = |name: &str| -> Result<f64> {
        let h = p.required_float(values, name)?;
        if h.is_finite() && h > 0.0 {
            Ok(h)
        } else {
            Err(p.error(format!("argument '{name}' must be a finite number > 0, got {h}")))
        }
    };
    let (bandwidth_x, bandwidth_y) = (bandwidth("bandwidth_x")?, bandwidth("bandwidth_y")?);
    let epsilon = p.epsilon(values)?;
    let delta = p.required_float(values, "delta")?;
    if !(delta > 0.0 && delta < 1.0) {
        return Err(p.error(format!(
            "argument 'delta' must be in the open interval (0, 1) (the 2-D release adds a Gaussian field), got {delta}"
        )));
    }
    let (lo_x, hi_x) = p.interval(values, "lo_x", "hi_x", "x")?;
    let (lo_y, hi_y) = p.interval(values, "lo_y", "hi_y", "y")?;
    let points = |name: &str| -> Result<usize> {
        Ok(p.int(values, name, (2, MAX_POINTS as i64))?.map_or(DEFAULT_POINTS, |v| v as usize))
    };
    let (points_x, points_y) = (points("points_x")?, points("points_y")?);
    let calibration = p.calibration(values, epsilon)?;
    let normalise = match p.string(values, "normalize")? {
        None => Normalise::Project,
        Some(s) => Normalise::parse(&s).ok_or_else(|| {
            p.error(format!("argument 'normalize' must be 'project', 'rescale' or 'none', got '{s}'"))
        })?,
    };
    let cost = Budget::charge(epsilon, delta).map_err(|e| p.error(e))?;
    let spec = Kde2dSpec {
        grid_x: Grid { lo: lo_x, hi: hi_x, points: points_x },
        grid_y: Grid { lo: lo_y, hi: hi_y, points: points_y },
        bandwidth_x,
        bandwidth_y,
        epsilon: cost.calibration_epsilon(),
        delta: cost.calibration_delta(),
        calibration,
        normalise,
    };
    Ok((Kde2dMechanism::new(spec, contribution).map_err(|e| p.error(e))?, cost))
}

fn rows_field(name: &str) -> Field {
    Field::new_list(name, Field::new_list_field(DataType::new_list(DataType::Float64, true), true), true)
}

fn float_rows_field() -> Field {
    rows_field("density")
}

/// A list of rows (`[i][j]`), NULL when absent, with the declared field names.
fn float_rows(name: &str, rows: Option<&Vec<Vec<f64>>>) -> Result<ArrayRef> {
    let mut builder = ListBuilder::new(ListBuilder::new(Float64Builder::new()));
    match rows {
        Some(rows) => {
            for row in rows {
                builder.values().values().append_slice(row);
                builder.values().append(true);
            }
            builder.append(true);
        }
        None => builder.append(false),
    }
    let array: ArrayRef = Arc::new(builder.finish());
    // The builder's field names differ from the declared ones only in name ("item"): cast.
    Ok(datafusion::arrow::compute::cast(&array, rows_field(name).data_type())?)
}

/// The fields of the result struct.
pub fn result_fields() -> Fields {
    Fields::from(vec![
        Field::new_list("x", Field::new_list_field(DataType::Float64, true), true),
        Field::new_list("y", Field::new_list_field(DataType::Float64, true), true),
        float_rows_field(),
        Field::new("mass", DataType::Float64, true),
        Field::new("release", DataType::Utf8, true),
        rows_field("noise_band"),
        rows_field("band"),
    ])
}

/// The result struct of a release and its bands (also what `release(id)` re-reads).
pub fn result_value(release: &Kde2dRelease, bands: Option<&Kde2dBands>, id: Option<String>) -> Result<ScalarValue> {
    let columns: Vec<ArrayRef> = vec![
        float_list(Some(release.x.clone())),
        float_list(Some(release.y.clone())),
        float_rows("density", release.density.as_ref())?,
        Arc::new(Float64Array::from(vec![release.mass])),
        Arc::new(StringArray::from(vec![id])),
        float_rows("noise_band", bands.map(|b| &b.noise))?,
        float_rows("band", bands.and_then(|b| b.total.as_ref()))?,
    ];
    Ok(ScalarValue::Struct(Arc::new(StructArray::try_new(result_fields(), columns, None)?)))
}

static DOCUMENTATION: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        datafusion::logical_expr::DocSection {
            include: true,
            label: "Differentially private functions",
            description: None,
        },
        "Differentially private 2-D kernel density estimate (product Gaussian kernel with \
         bandwidths h_x, h_y) on a public points_x × points_y grid over the box [lo_x, hi_x] × \
         [lo_y, hi_y], released with a Gaussian field whose covariance is the product kernel, \
         calibrated to (epsilon, delta). Returns {x, y, density, mass, release, noise_band, band}: \
         the grids, density[i][j] at (x[i], y[j]) normalised by the released surface's own \
         integral (NULL if it holds less than one point's mass), a noisy count of the pairs in the \
         box, the stored release's id (catalog sessions), and the half-widths [i][j] of the \
         simultaneous level-band_alpha bands for the privacy noise and for noise plus sampling \
         error.",
        "private_kde2d(x, y, bandwidth_x, bandwidth_y, epsilon, delta [, lo_x, hi_x, lo_y, hi_y, points_x, points_y, calibration, normalize, band_alpha])",
    )
    .with_sql_example(
        "```sql\nSELECT private_kde2d(x, y, 0.05, 0.05, 1.0, 1e-6, lo_x => 0, hi_x => 1, lo_y => 0, hi_y => 1) FROM t;\n```",
    )
    .with_argument("x", "numeric column; a row with NULL, NaN or ±inf in x or y is dropped")
    .with_argument("y", "numeric column")
    .with_argument("bandwidth_x", "kernel bandwidth along x, > 0 (literal)")
    .with_argument("bandwidth_y", "kernel bandwidth along y, > 0 (literal)")
    .with_argument("epsilon", "privacy parameter ε > 0 (literal)")
    .with_argument("delta", "privacy parameter δ in (0, 1) (literal)")
    .with_argument("lo_x", "box along x (literals; default: the x column's policy bounds)")
    .with_argument("hi_x", "lo_x < hi_x")
    .with_argument("lo_y", "box along y (default: the y column's policy bounds)")
    .with_argument("hi_y", "lo_y < hi_y")
    .with_argument("points_x", "grid points along x in [2, 1024], default 64")
    .with_argument("points_y", "grid points along y in [2, 1024], default 64")
    .with_argument("calibration", "'analytic' (default) or 'classic' (ε ≤ 1 only)")
    .with_argument("normalize", "'project' (default: L2 projection onto densities), 'rescale' or 'none'")
    .with_argument("band_alpha", "level of the simultaneous bands, in (0, 1), default 0.05")
    .build()
});

/// The `private_kde2d` function (module docs).
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct Kde2d;

/// The `private_kde2d` aggregate UDF.
pub type PrivateKde2d = PrivateUdaf<Kde2d>;

impl PrivateSpec for Kde2d {
    type Call = Kde2dRun;

    fn params(&self) -> &'static FunctionParams {
        &PARAMS
    }

    fn documentation(&self) -> &'static Documentation {
        &DOCUMENTATION
    }

    fn result_fields(&self) -> Fields {
        result_fields()
    }

    fn policy_args(&self) -> PolicyArgs {
        PolicyArgs { boxes: BOX_ARGS, ..PolicyArgs::default() }
    }

    fn state_name(&self) -> &'static str {
        "kde2d_statistic"
    }

    fn call(
        &self,
        values: &[Option<ScalarValue>],
        _: &[DataType],
        contribution: Contribution,
    ) -> Result<(Kde2dRun, Budget)> {
        let (mechanism, cost) = mechanism_from_literals(values, contribution)?;
        Ok((Kde2dRun { mechanism, alpha: PARAMS.band_alpha(values)? }, cost))
    }
}

/// A validated `private_kde2d` call: its mechanism and the level of its bands.
#[derive(Debug)]
pub struct Kde2dRun {
    mechanism: Kde2dMechanism,
    alpha: f64,
}

impl Kde2dRun {
    /// The call's mechanism.
    pub fn mechanism(&self) -> &Kde2dMechanism {
        &self.mechanism
    }
}

impl Release for Kde2dRun {
    type Statistic = BufferedSums;
    type Output = (Kde2dRelease, Option<Kde2dBands>);

    fn statistic(&self) -> BufferedSums {
        self.mechanism.accumulation()
    }

    fn merged_statistic(&self) -> BufferedSums {
        self.mechanism.merged_accumulation()
    }

    fn update(&self, state: &mut BufferedSums, values: &[ArrayRef]) -> Result<()> {
        for_each_valid_pair(values, |x, y| self.mechanism.add_all(state, x, y));
        Ok(())
    }

    fn memory_bytes(&self) -> (u64, u64) {
        self.mechanism.memory_bytes()
    }

    fn release(
        &self,
        state: &mut BufferedSums,
        rng: Option<&mut ChaCha20Rng>,
        cx: &CallContext,
    ) -> Result<(Self::Output, Recipe)> {
        let m = &self.mechanism;
        let lifted = m.noisy_lifted(state.totals(), rng);
        // Everything from here on is post-processing of the released coordinates.
        let surface = m.surface_from_lifted(&lifted);
        let release = m.post_process(&surface);
        let bands = m.bands(&release, self.alpha);
        let recipe =
            Recipe::Kde2d { spec: m.spec().clone(), contribution: cx.contribution, alpha: self.alpha, surface };
        Ok(((release, bands), recipe))
    }

    fn result(&self, (release, bands): Self::Output, id: Option<String>) -> Result<ScalarValue> {
        result_value(&release, bands.as_ref(), id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::Permits;
    use crate::functions::aggregate::PrivateAccumulator;
    use crate::mechanism::{Calibration, NoiseSource};
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::logical_expr::Volatility;
    use datafusion::logical_expr::{Accumulator, AggregateUDFImpl};

    fn accumulator(noise: NoiseSource) -> PrivateAccumulator<Kde2dRun> {
        accumulator_with(spec(), CallContext { noise, ..CallContext::default() })
    }

    fn spec() -> Kde2dSpec {
        Kde2dSpec {
            grid_x: Grid { lo: 0.0, hi: 1.0, points: 12 },
            grid_y: Grid { lo: 0.0, hi: 2.0, points: 10 },
            bandwidth_x: 0.2,
            bandwidth_y: 0.4,
            epsilon: 1.0,
            delta: 1e-6,
            calibration: Calibration::Analytic,
            normalise: Normalise::Project,
        }
    }

    fn run(spec: Kde2dSpec) -> Kde2dRun {
        let mechanism = Kde2dMechanism::new(spec, Contribution::ROW).unwrap();
        Kde2dRun { mechanism, alpha: crate::mechanism::noise::bands::DEFAULT_ALPHA }
    }

    fn accumulator_with(spec: Kde2dSpec, cx: CallContext) -> PrivateAccumulator<Kde2dRun> {
        PrivateAccumulator::new(NAME, run(spec), cx)
    }

    #[test]
    fn a_final_phase_merges_into_exact_sums_without_a_buffer() {
        let (xs, ys): (Vec<f64>, Vec<f64>) = (0..40).map(|i| (i as f64 / 40.0, (i % 7) as f64 / 3.5)).unzip();
        let values: [ArrayRef; 2] = [Arc::new(Float64Array::from(xs)), Arc::new(Float64Array::from(ys))];
        crate::functions::release::assert_merges_without_buffers(&run(spec()), &values);
    }

    #[test]
    fn the_skeleton_refuses_without_a_permit_and_releases_once_with_one() {
        let batch = || -> Vec<ArrayRef> {
            vec![Arc::new(Float64Array::from(vec![0.2, 0.5])), Arc::new(Float64Array::from(vec![1.0, 1.5]))]
        };
        // No permit: evaluate fails, and keeps failing (nothing was released or memoised).
        let spec = accumulator(NoiseSource::Os).call().mechanism().spec().clone();
        let mut denied = accumulator_with(spec, CallContext { permits: Permits::Denied, ..CallContext::default() });
        denied.update_batch(&batch()).unwrap();
        assert!(denied.evaluate().is_err());
        assert!(denied.evaluate().is_err());
        // With the permit: one release, returned again by a second evaluate (OS noise, so only the
        // memo can make them equal; a second accumulator's release differs).
        let mut free = accumulator(NoiseSource::Os);
        free.update_batch(&batch()).unwrap();
        let first = free.evaluate().unwrap();
        assert_eq!(free.evaluate().unwrap(), first);
        let mut other = accumulator(NoiseSource::Os);
        other.update_batch(&batch()).unwrap();
        assert_ne!(other.evaluate().unwrap(), first);
    }

    fn batch(xs: Vec<Option<f64>>, ys: Vec<Option<f64>>) -> [ArrayRef; 2] {
        [Arc::new(Float64Array::from(xs)), Arc::new(Float64Array::from(ys))]
    }

    #[test]
    fn state_round_trips_through_merge() {
        let mut a = accumulator(NoiseSource::TestSeed(1));
        a.update_batch(&batch(vec![Some(0.1), Some(0.5)], vec![Some(1.0), Some(0.2)])).unwrap();
        let mut b = accumulator(NoiseSource::TestSeed(1));
        b.update_batch(&batch(vec![Some(0.7)], vec![Some(1.9)])).unwrap();
        let mut whole = accumulator(NoiseSource::TestSeed(1));
        whole
            .update_batch(&batch(vec![Some(0.1), Some(0.5), Some(0.7)], vec![Some(1.0), Some(0.2), Some(1.9)]))
            .unwrap();
        let mut merged = accumulator(NoiseSource::TestSeed(1));
        for acc in [&mut a, &mut b] {
            let state: Vec<ArrayRef> = acc.state().unwrap().iter().map(|s| s.to_array().unwrap()).collect();
            merged.merge_batch(&state).unwrap();
        }
        assert_eq!(merged.statistic().totals(), whole.statistic().totals());
        assert_eq!(merged.evaluate().unwrap(), whole.evaluate().unwrap());
        assert_eq!(merged.evaluate().unwrap(), whole.evaluate().unwrap(), "memoised");
    }

    #[test]
    fn a_row_with_a_null_or_nan_in_either_column_is_dropped() {
        let mut with_gaps = accumulator(NoiseSource::TestSeed(1));
        with_gaps
            .update_batch(&batch(
                vec![Some(0.1), None, Some(0.3), Some(0.4), Some(f64::NAN), Some(0.9)],
                vec![Some(0.5), Some(0.5), None, Some(1.5), Some(0.5), Some(f64::INFINITY)],
            ))
            .unwrap();
        let mut dense = accumulator(NoiseSource::TestSeed(1));
        dense.update_batch(&batch(vec![Some(0.1), Some(0.4)], vec![Some(0.5), Some(1.5)])).unwrap();
        assert_eq!(with_gaps.statistic().totals(), dense.statistic().totals());
        let mass: i128 = dense.statistic().totals().iter().sum();
        assert_eq!(mass, 2 << 40, "two rows, one unit each");
    }

    #[test]
    fn the_result_has_a_row_per_x_and_a_value_per_y() {
        let mut acc = accumulator(NoiseSource::TestSeed(3));
        let n = 400;
        let xs = (0..n).map(|i| Some(0.5 + 0.2 * ((i as f64) * 0.37).sin())).collect();
        let ys = (0..n).map(|i| Some(1.0 + 0.5 * ((i as f64) * 0.61).cos())).collect();
        acc.update_batch(&batch(xs, ys)).unwrap();
        let ScalarValue::Struct(s) = acc.evaluate().unwrap() else { panic!("a struct") };
        let density = s.column(2).as_list::<i32>().value(0);
        let rows = density.as_list::<i32>();
        assert_eq!(rows.len(), 12);
        assert!((0..12).all(|i| rows.value(i).len() == 10));
        assert_eq!(s.column(0).as_list::<i32>().value(0).len(), 12);
        assert_eq!(s.column(1).as_list::<i32>().value(0).len(), 10);
    }

    #[test]
    fn udaf_is_volatile_and_names_its_two_data_arguments() {
        let f = PrivateKde2d::default();
        assert_eq!(f.signature().volatility, Volatility::Volatile);
        let err = f
            .coerce_types(&[
                DataType::Float64,
                DataType::Utf8,
                DataType::Float64,
                DataType::Float64,
                DataType::Float64,
                DataType::Float64,
            ])
            .unwrap_err();
        assert!(err.to_string().contains("argument 'y' must be numeric"), "{err}");
    }
}
