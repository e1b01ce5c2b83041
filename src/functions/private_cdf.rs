//! `private_cdf` and `private_quantiles`: the private distribution function of a column and
//! quantiles read from it, as SQL aggregates over one statistic and one release
//! ([`crate::mechanism::distribution`]).
//!
//! ```sql
//! private_cdf(value, epsilon, delta [, lo, hi, points => 512, leaves => 'auto', mechanism => 'auto',
//!             calibration => 'analytic', band_alpha => 0.05, select_…])
//!   -> {x, cdf, count, release, noise_band, band, leaves}
//! private_quantiles(value, [p…], epsilon, delta [, lo, hi, leaves, mechanism, calibration, band_alpha, select_…])
//!   -> {p, quantile, lower, upper, count, release, leaves}
//! ```

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Float64Type};
use datafusion::common::{Result, ScalarValue, exec_datafusion_err};
use datafusion::logical_expr::Documentation;
use rand::rngs::ChaCha20Rng;

use super::aggregate::{PrivateSpec, PrivateUdaf};
use super::arrays::float_list;
use super::call::{CallContext, PolicyArgs};
use super::params::{FunctionParams, ParamDef, ParamKind};
use super::release::Release;
use crate::mechanism::Contribution;
use crate::mechanism::distribution::release::{
    CdfMechanism, CdfNoise, CdfRelease, CdfSpec, DEFAULT_MAX_LOG2, DEFAULT_POINTS, MAX_POINTS, Resolution,
};
use crate::mechanism::distribution::tree::MAX_LEAVES_LOG2;
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::stored::Recipe;
use crate::mechanism::sums::BufferedSums;

/// SQL name of the CDF function.
pub const CDF: &str = "private_cdf";
/// SQL name of the quantiles function.
pub const QUANTILES: &str = "private_quantiles";
/// Most probabilities one `private_quantiles` call releases.
pub const MAX_PROBABILITIES: usize = 10_000;

const TAIL: [ParamDef; 7] = [
    ParamDef { name: "leaves", kind: ParamKind::FloatOrAuto },
    ParamDef { name: "mechanism", kind: ParamKind::Str },
    ParamDef { name: "calibration", kind: ParamKind::Str },
    ParamDef { name: "band_alpha", kind: ParamKind::Float },
    ParamDef { name: "select_epsilon", kind: ParamKind::Float },
    ParamDef { name: "select_delta", kind: ParamKind::Float },
    ParamDef { name: "select_max_groups", kind: ParamKind::Int },
];

/// Declared arguments of `private_cdf`, in positional order.
pub static CDF_PARAMS: FunctionParams = FunctionParams {
    function: CDF,
    data: &["value"],
    params: &[
        ParamDef { name: "epsilon", kind: ParamKind::Float },
        ParamDef { name: "delta", kind: ParamKind::Float },
        ParamDef { name: "lo", kind: ParamKind::Float },
        ParamDef { name: "hi", kind: ParamKind::Float },
        ParamDef { name: "points", kind: ParamKind::Int },
        TAIL[0],
        TAIL[1],
        TAIL[2],
        TAIL[3],
        TAIL[4],
        TAIL[5],
        TAIL[6],
    ],
    required: 2,
};

/// Declared arguments of `private_quantiles`, in positional order.
pub static QUANTILES_PARAMS: FunctionParams = FunctionParams {
    function: QUANTILES,
    data: &["value"],
    params: &[
        ParamDef { name: "probabilities", kind: ParamKind::FloatList },
        ParamDef { name: "epsilon", kind: ParamKind::Float },
        ParamDef { name: "delta", kind: ParamKind::Float },
        ParamDef { name: "lo", kind: ParamKind::Float },
        ParamDef { name: "hi", kind: ParamKind::Float },
        TAIL[0],
        TAIL[1],
        TAIL[2],
        TAIL[3],
        TAIL[4],
        TAIL[5],
        TAIL[6],
    ],
    required: 3,
};

/// Validates the shared literal parameters and calibrates the release; the budget is what its
/// noise is calibrated for (ε alone for discrete Laplace).
fn mechanism_from_literals(
    p: &FunctionParams,
    values: &[Option<ScalarValue>],
    points: usize,
    contribution: Contribution,
) -> Result<(CdfMechanism, Budget)> {
    let epsilon = p.epsilon(values)?;
    let delta = p.required_float(values, "delta")?;
    if !(0.0..1.0).contains(&delta) {
        return Err(p.error(format!(
            "argument 'delta' must be in [0, 1) (0 selects discrete Laplace noise, pure ε), got {delta}"
        )));
    }
    let (lo, hi) = p.interval(values, "lo", "hi", "value")?;
    let resolution = if p.is_auto(values, "leaves")? {
        Resolution::Auto { max_log2: DEFAULT_MAX_LOG2 }
    } else {
        match p.float(values, "leaves")? {
            None => Resolution::Auto { max_log2: DEFAULT_MAX_LOG2 },
            Some(l) => {
                let log2 = l.log2();
                if !(l.is_finite() && log2.fract() == 0.0 && (1.0..=f64::from(MAX_LEAVES_LOG2)).contains(&log2)) {
                    return Err(p.error(format!(
                        "argument 'leaves' must be 'auto' or a power of two from 2 to {}, got {l}",
                        1u64 << MAX_LEAVES_LOG2
                    )));
                }
                Resolution::Fixed { log2: log2 as u32 }
            }
        }
    };
    let calibration = p.calibration(values, epsilon)?;
    let choice = p.string(values, "mechanism")?.map(|s| s.to_ascii_lowercase());
    let build = |noise: CdfNoise| -> Result<(CdfMechanism, Budget)> {
        let cost =
            Budget::charge(epsilon, if noise == CdfNoise::Gaussian { delta } else { 0.0 }).map_err(|e| p.error(e))?;
        let spec = CdfSpec {
            lo,
            hi,
            points,
            resolution,
            noise,
            epsilon: cost.calibration_epsilon(),
            delta: cost.calibration_delta(),
            calibration,
        };
        Ok((CdfMechanism::new(spec, contribution).map_err(|e| p.error(e))?, cost))
    };
    match choice.as_deref() {
        Some("laplace") => build(CdfNoise::Laplace),
        Some("gaussian") if delta == 0.0 => {
            Err(p.error("mechanism => 'gaussian' needs delta > 0 (delta => 0 is the pure-ε Laplace mechanism)"))
        }
        Some("gaussian") => build(CdfNoise::Gaussian),
        None | Some("auto") if delta == 0.0 => build(CdfNoise::Laplace),
        // Whichever adds less noise to the deepest tree the call may release (public).
        None | Some("auto") => {
            let laplace = build(CdfNoise::Laplace)?;
            match build(CdfNoise::Gaussian) {
                Ok(g) if g.0.deepest_level_variance() < laplace.0.deepest_level_variance() => Ok(g),
                _ => Ok(laplace),
            }
        }
        Some(other) => {
            Err(p.error(format!("argument 'mechanism' must be 'auto', 'laplace' or 'gaussian', got '{other}'")))
        }
    }
}

/// The probabilities of a `private_quantiles` call: 1 to [`MAX_PROBABILITIES`] numbers in [0, 1].
fn probabilities(values: &[Option<ScalarValue>]) -> Result<Vec<f64>> {
    let p = &QUANTILES_PARAMS;
    let probs = p
        .float_list(values, "probabilities")?
        .ok_or_else(|| p.error("argument 'probabilities' is required: a list such as [0.25, 0.5, 0.75]"))?;
    if probs.is_empty() || probs.len() > MAX_PROBABILITIES {
        return Err(p.error(format!(
            "argument 'probabilities' must hold 1 to {MAX_PROBABILITIES} probabilities, got {}",
            probs.len()
        )));
    }
    if let Some(bad) = probs.iter().find(|q| !(0.0..=1.0).contains(*q)) {
        return Err(p.error(format!("argument 'probabilities' must hold numbers in [0, 1], got {bad}")));
    }
    Ok(probs)
}

/// What a call releases: the distribution function, or quantiles read from it.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// `private_cdf`.
    Cdf,
    /// `private_quantiles` at these probabilities.
    Quantiles(Vec<f64>),
}

/// A validated call of either function.
#[derive(Debug)]
pub struct CdfRun {
    mechanism: CdfMechanism,
    alpha: f64,
    output: Output,
}

impl Release for CdfRun {
    type Statistic = BufferedSums;
    type Output = CdfRelease;

    fn statistic(&self) -> BufferedSums {
        self.mechanism.statistic()
    }

    fn merged_statistic(&self) -> BufferedSums {
        self.mechanism.merged_statistic()
    }

    fn update(&self, state: &mut BufferedSums, values: &[ArrayRef]) -> Result<()> {
        let values = values[0].as_primitive::<Float64Type>();
        match values.nulls().filter(|n| n.null_count() > 0) {
            None => self.mechanism.accumulate(state, values.values()),
            Some(nulls) => {
                for (start, end) in nulls.valid_slices() {
                    self.mechanism.accumulate(state, &values.values()[start..end]);
                }
            }
        }
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
    ) -> Result<(CdfRelease, Recipe)> {
        let (log2, levels) = self.mechanism.release(state.totals(), rng);
        // Everything from here on is post-processing of the released levels.
        let release = self
            .mechanism
            .post_process(log2, &levels, self.alpha)
            .map_err(|e| exec_datafusion_err!("{}: {e}", self.name()))?;
        let recipe = Recipe::Cdf {
            spec: self.mechanism.spec().clone(),
            contribution: cx.contribution,
            alpha: self.alpha,
            leaves_log2: log2,
            root_share: self.mechanism.root_share(),
            levels: levels.concat(),
            probabilities: match &self.output {
                Output::Cdf => None,
                Output::Quantiles(p) => Some(p.clone()),
            },
        };
        Ok((release, recipe))
    }

    fn result(&self, release: CdfRelease, id: Option<String>) -> Result<ScalarValue> {
        match &self.output {
            Output::Cdf => cdf_value(&release, id),
            Output::Quantiles(p) => quantiles_value(&release, self.mechanism.spec(), p, id),
        }
    }
}

impl CdfRun {
    fn name(&self) -> &'static str {
        match self.output {
            Output::Cdf => CDF,
            Output::Quantiles(_) => QUANTILES,
        }
    }
}

/// The fields of `private_cdf`'s result.
pub fn cdf_fields() -> Fields {
    let list = |name: &str| Field::new_list(name, Field::new_list_field(DataType::Float64, true), true);
    Fields::from(vec![
        list("x"),
        list("cdf"),
        Field::new("count", DataType::Float64, true),
        Field::new("release", DataType::Utf8, true),
        list("noise_band"),
        list("band"),
        Field::new("leaves", DataType::Int64, true),
    ])
}

/// The fields of `private_quantiles`' result.
pub fn quantiles_fields() -> Fields {
    let list = |name: &str| Field::new_list(name, Field::new_list_field(DataType::Float64, true), true);
    Fields::from(vec![
        list("p"),
        list("quantile"),
        list("lower"),
        list("upper"),
        Field::new("count", DataType::Float64, true),
        Field::new("release", DataType::Utf8, true),
        Field::new("leaves", DataType::Int64, true),
    ])
}

fn common(release: &CdfRelease, id: Option<String>) -> (ArrayRef, ArrayRef, ArrayRef) {
    (
        Arc::new(Float64Array::from(vec![release.count])),
        Arc::new(StringArray::from(vec![id])),
        Arc::new(Int64Array::from(vec![release.leaves as i64])),
    )
}

/// `private_cdf`'s result struct for a release (also what `release(id)` re-reads).
pub fn cdf_value(release: &CdfRelease, id: Option<String>) -> Result<ScalarValue> {
    let curve = release.curve.as_ref();
    let (count, id, leaves) = common(release, id);
    let columns: Vec<ArrayRef> = vec![
        float_list(Some(release.x.clone())),
        float_list(curve.map(|c| c.cdf.clone())),
        count,
        id,
        float_list(curve.map(|c| c.noise_band.clone())),
        float_list(curve.map(|c| c.band.clone())),
        leaves,
    ];
    Ok(ScalarValue::Struct(Arc::new(StructArray::try_new(cdf_fields(), columns, None)?)))
}

/// `private_quantiles`' result struct for a release at `probabilities`.
pub fn quantiles_value(
    release: &CdfRelease,
    spec: &CdfSpec,
    probabilities: &[f64],
    id: Option<String>,
) -> Result<ScalarValue> {
    let q = release.curve.as_ref().map(|c| c.quantiles(probabilities, spec.lo, spec.hi));
    let (count, id, leaves) = common(release, id);
    let columns: Vec<ArrayRef> = vec![
        float_list(Some(probabilities.to_vec())),
        float_list(q.as_ref().map(|q| q.values.clone())),
        float_list(q.as_ref().map(|q| q.lower.clone())),
        float_list(q.as_ref().map(|q| q.upper.clone())),
        count,
        id,
        leaves,
    ];
    Ok(ScalarValue::Struct(Arc::new(StructArray::try_new(quantiles_fields(), columns, None)?)))
}

fn documentation(
    name: &'static str,
    description: &'static str,
    syntax: &'static str,
    example: &'static str,
) -> Documentation {
    let b = Documentation::builder(
        datafusion::logical_expr::DocSection {
            include: true,
            label: "Differentially private functions",
            description: None,
        },
        description,
        syntax,
    )
    .with_sql_example(example)
    .with_argument(
        "value",
        "numeric column; NULL, NaN and ±inf rows are dropped, values outside [lo, hi] count at the nearest end",
    );
    let b = if name == QUANTILES {
        b.with_argument("probabilities", "literal list of probabilities in [0, 1], such as [0.25, 0.5, 0.75]")
    } else {
        b.with_argument("points", "grid size in [2, 65536], default 512")
    };
    b.with_argument("epsilon", "privacy parameter ε > 0 (literal)")
        .with_argument("delta", "δ in [0, 1) (literal); 0 selects discrete Laplace noise (pure ε)")
        .with_argument("lo", "left end of the range (literal; or the table policy's bounds)")
        .with_argument("hi", "right end of the range, lo < hi")
        .with_argument(
            "leaves",
            "'auto' (default: 8 to 4096 leaves, chosen from the released count) or a power of two from 2 to 65536",
        )
        .with_argument(
            "mechanism",
            "'auto' (default: the one adding less noise), 'laplace' (pure ε) or 'gaussian' (δ > 0)",
        )
        .with_argument(
            "calibration",
            "'analytic' (default) or 'classic' (ε ≤ 1): the zCDP conversion of Gaussian noise",
        )
        .with_argument("band_alpha", "level of the simultaneous bands, in (0, 1), default 0.05")
        .build()
}

static CDF_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    documentation(
        CDF,
        "Differentially private distribution function of a column on a public range: a hierarchical histogram \
         released with exact discrete noise, made consistent by least squares, projected onto distribution \
         functions and interpolated monotonically. Returns {x, cdf, count, release, noise_band, band, leaves}: the \
         grid, the CDF on it (NULL below one point of mass), the consistent noisy count, the stored release's id, \
         the half-widths of the simultaneous level-band_alpha bands for the data's CDF and for the population's, \
         and the leaves of the released tree.",
        "private_cdf(value, epsilon, delta [, lo, hi, points, leaves, mechanism, calibration, band_alpha])",
        "```sql\nSELECT private_cdf(x, epsilon => 1.0, delta => 0, lo => 0, hi => 1) FROM t;\n```",
    )
});

static QUANTILES_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    documentation(
        QUANTILES,
        "Differentially private quantiles of a column: the quantiles of private_cdf's distribution function (one \
         release, any number of probabilities) with simultaneous bounds for the population's quantiles. Returns \
         {p, quantile, lower, upper, count, release, leaves}.",
        "private_quantiles(value, probabilities, epsilon, delta [, lo, hi, leaves, mechanism, calibration, band_alpha])",
        "```sql\nSELECT private_quantiles(x, [0.25, 0.5, 0.75], 1.0, 0, lo => 0, hi => 1) FROM t;\n```",
    )
});

/// The `private_cdf` function (module docs).
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct Cdf;

/// The `private_cdf` aggregate UDF.
pub type PrivateCdf = PrivateUdaf<Cdf>;

impl PrivateSpec for Cdf {
    type Call = CdfRun;

    fn params(&self) -> &'static FunctionParams {
        &CDF_PARAMS
    }

    fn documentation(&self) -> &'static Documentation {
        &CDF_DOC
    }

    fn result_fields(&self) -> Fields {
        cdf_fields()
    }

    fn policy_args(&self) -> PolicyArgs {
        // lo and hi (arguments 3 and 4) from the value column's bounds.
        PolicyArgs { boxes: &[(0, (3, 4))], ..PolicyArgs::default() }
    }

    fn state_name(&self) -> &'static str {
        "cdf_statistic"
    }

    fn call(
        &self,
        values: &[Option<ScalarValue>],
        _: &[DataType],
        contribution: Contribution,
    ) -> Result<(CdfRun, Budget)> {
        let p = &CDF_PARAMS;
        let alpha = p.band_alpha(values)?;
        let points = p.int(values, "points", (2, MAX_POINTS as i64))?.unwrap_or(DEFAULT_POINTS as i64) as usize;
        let (mechanism, cost) = mechanism_from_literals(p, values, points, contribution)?;
        Ok((CdfRun { mechanism, alpha, output: Output::Cdf }, cost))
    }
}

/// The `private_quantiles` function (module docs).
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct Quantiles;

/// The `private_quantiles` aggregate UDF.
pub type PrivateQuantiles = PrivateUdaf<Quantiles>;

impl PrivateSpec for Quantiles {
    type Call = CdfRun;

    fn params(&self) -> &'static FunctionParams {
        &QUANTILES_PARAMS
    }

    fn documentation(&self) -> &'static Documentation {
        &QUANTILES_DOC
    }

    fn result_fields(&self) -> Fields {
        quantiles_fields()
    }

    fn policy_args(&self) -> PolicyArgs {
        // lo and hi (arguments 4 and 5) from the value column's bounds.
        PolicyArgs { boxes: &[(0, (4, 5))], ..PolicyArgs::default() }
    }

    fn state_name(&self) -> &'static str {
        "cdf_statistic"
    }

    fn call(
        &self,
        values: &[Option<ScalarValue>],
        _: &[DataType],
        contribution: Contribution,
    ) -> Result<(CdfRun, Budget)> {
        let p = &QUANTILES_PARAMS;
        let probs = probabilities(values)?;
        let alpha = p.band_alpha(values)?;
        let (mechanism, cost) = mechanism_from_literals(p, values, 2, contribution)?;
        Ok((CdfRun { mechanism, alpha, output: Output::Quantiles(probs) }, cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mechanism::Calibration;

    #[test]
    fn a_final_phase_merges_into_exact_counts_without_a_buffer() {
        for noise in [CdfNoise::Laplace, CdfNoise::Gaussian] {
            let spec = CdfSpec {
                lo: 0.0,
                hi: 1.0,
                points: 16,
                resolution: Resolution::Fixed { log2: 6 },
                noise,
                epsilon: 1.0,
                delta: if noise == CdfNoise::Gaussian { 1e-6 } else { 0.0 },
                calibration: Calibration::Analytic,
            };
            let mechanism = CdfMechanism::new(spec, Contribution::ROW).unwrap();
            let run = CdfRun { mechanism, alpha: 0.05, output: Output::Cdf };
            let values: ArrayRef = Arc::new(Float64Array::from_iter_values((0..40).map(|i| i as f64 / 40.0)));
            crate::functions::release::assert_merges_without_buffers(&run, &[values]);
        }
    }
}
