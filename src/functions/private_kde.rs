//! `private_kde`: a differentially private kernel density estimate as a SQL aggregate.
//!
//! ```sql
//! private_kde(value, bandwidth, epsilon, delta
//!             [, lo => …, hi => …, points => 512, calibration => 'analytic', nonneg => true,
//!              normalize => 'project', band_alpha => 0.05, select_…])
//!   -> {x: List<Float64>, density: List<Float64>, mass: Float64}
//! ```
//!
//! Accumulators carry the exact fixed-point statistic of [`KdeLayout`] between
//! partitions; the Gaussian-process noise is added once, in the final `evaluate`, and the
//! release is memoised so a repeated `evaluate` returns the same curve.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, StringArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Float64Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::Documentation;
use rand::rngs::ChaCha20Rng;

use super::aggregate::{PrivateSpec, PrivateUdaf};
use super::arrays::float_list;
use super::call::{CallContext, PolicyArgs};
use super::group_rows::GroupedBatch;
use super::params::{FunctionParams, ParamDef, ParamKind};
use super::release::Release;
use crate::mechanism::density::auto_bandwidth::AutoKde;
use crate::mechanism::density::kde::MAX_POINTS;
use crate::mechanism::density::release::{KdeBands, KdeRelease, Normalise};
use crate::mechanism::noise::budget::Budget;
use crate::mechanism::stored::Recipe;
use crate::mechanism::sums::BufferedSums;
use crate::mechanism::{Contribution, Grid, KdeLayout, KdeMechanism, KdeSpec};

/// SQL name of the function.
pub const NAME: &str = "private_kde";
/// Default number of grid points.
pub const DEFAULT_POINTS: usize = 512;

/// Declared arguments, in positional order.
pub static PARAMS: FunctionParams = FunctionParams {
    function: NAME,
    data: &["value"],
    params: &[
        ParamDef { name: "bandwidth", kind: ParamKind::FloatOrAuto },
        ParamDef { name: "epsilon", kind: ParamKind::Float },
        ParamDef { name: "delta", kind: ParamKind::Float },
        ParamDef { name: "lo", kind: ParamKind::Float },
        ParamDef { name: "hi", kind: ParamKind::Float },
        ParamDef { name: "points", kind: ParamKind::Int },
        ParamDef { name: "calibration", kind: ParamKind::Str },
        ParamDef { name: "nonneg", kind: ParamKind::Bool },
        ParamDef { name: "normalize", kind: ParamKind::Str },
        ParamDef { name: "band_alpha", kind: ParamKind::Float },
        ParamDef { name: "mechanism", kind: ParamKind::Str },
        ParamDef { name: "select_epsilon", kind: ParamKind::Float },
        ParamDef { name: "select_delta", kind: ParamKind::Float },
        ParamDef { name: "select_max_groups", kind: ParamKind::Int },
        ParamDef { name: "space", kind: ParamKind::Str },
    ],
    required: 3,
};

/// What one `private_kde` call releases: a fixed bandwidth's mechanism, or the automatic
/// bandwidth's count-release-choose (`bandwidth => 'auto'`).
#[derive(Debug, Clone)]
pub enum KdeCall {
    /// `bandwidth => h`.
    Fixed(Box<KdeMechanism>),
    /// `bandwidth => 'auto'`.
    Auto(Box<AutoKde>),
}

impl KdeCall {
    /// The layout of the accumulated statistic.
    pub fn layout(&self) -> &KdeLayout {
        match self {
            KdeCall::Fixed(m) => m.layout(),
            KdeCall::Auto(a) => a.layout(),
        }
    }

    /// Memory one call needs: (state, work).
    pub fn memory_bytes(&self) -> (u64, u64) {
        match self {
            KdeCall::Fixed(m) => m.memory_bytes(),
            KdeCall::Auto(a) => a.memory_bytes(),
        }
    }
}

/// Turns literal parameter values into a validated [`KdeCall`] and the exact budget a
/// release costs. The mechanism is calibrated with the charged (ε, δ), never more.
pub fn mechanism_from_literals(
    values: &[Option<ScalarValue>],
    contribution: Contribution,
) -> Result<(KdeCall, Budget)> {
    let p = &PARAMS;
    let auto_bandwidth = p.is_auto(values, "bandwidth")?;
    let bandwidth = if auto_bandwidth { 1.0 } else { p.required_float(values, "bandwidth")? };
    if !(bandwidth.is_finite() && bandwidth > 0.0) {
        return Err(p.error(format!("argument 'bandwidth' must be a finite number > 0, got {bandwidth}")));
    }
    let epsilon = p.epsilon(values)?;
    let delta = p.required_float(values, "delta")?;
    if !(0.0..1.0).contains(&delta) {
        return Err(
            p.error(format!("argument 'delta' must be in [0, 1) (0 selects the pure-ε mechanism), got {delta}"))
        );
    }
    let (lo, hi) = p.interval(values, "lo", "hi", "value")?;
    let points = p.int(values, "points", (2, MAX_POINTS as i64))?.unwrap_or(DEFAULT_POINTS as i64) as usize;
    let calibration = p.calibration(values, epsilon)?;
    let normalise = match (p.boolean(values, "nonneg")?, p.string(values, "normalize")?) {
        (_, Some(s)) => {
            let n = Normalise::parse(&s).ok_or_else(|| {
                p.error(format!("argument 'normalize' must be 'project', 'rescale' or 'none', got '{s}'"))
            })?;
            if p.boolean(values, "nonneg")? == Some(n == Normalise::Raw) {
                return Err(p.error(format!(
                    "arguments 'nonneg' and 'normalize' disagree (normalize => '{}' {} negative values); give one of them",
                    n.name(),
                    if n == Normalise::Raw { "keeps" } else { "removes" }
                )));
            }
            n
        }
        (Some(false), None) => Normalise::Raw,
        (Some(true) | None, None) => Normalise::Project,
    };
    let choice = match p.string(values, "mechanism")? {
        None => Mechanism::Auto,
        Some(s) => match s.to_ascii_lowercase().as_str() {
            "auto" => Mechanism::Auto,
            "gaussian" => Mechanism::Gaussian,
            "laplace" => Mechanism::Laplace,
            "iclp" => Mechanism::Iclp,
            _ => {
                return Err(p.error(format!(
                    "argument 'mechanism' must be 'auto', 'gaussian', 'laplace' or 'iclp', got '{s}'"
                )));
            }
        },
    };
    // The mechanism is calibrated with the charged (ε, δ), never more.
    let spec_for = |cost: &Budget| KdeSpec {
        grid: Grid { lo, hi, points },
        bandwidth,
        epsilon: cost.calibration_epsilon(),
        delta: cost.calibration_delta(),
        calibration,
        normalise,
    };
    let sobolev = match p.string(values, "space")? {
        None => false,
        Some(s) => match s.to_ascii_lowercase().as_str() {
            "gaussian" => false,
            "sobolev" => true,
            _ => return Err(p.error(format!("argument 'space' must be 'gaussian' or 'sobolev', got '{s}'"))),
        },
    };
    if sobolev {
        // Hall §4.2: exponential-kernel (H¹) noise, a Gaussian process at a fixed bandwidth.
        if auto_bandwidth || matches!(choice, Mechanism::Laplace | Mechanism::Iclp) || delta == 0.0 {
            return Err(p.error(
                "space => 'sobolev' adds a Gaussian process at a given bandwidth: it needs a numeric bandwidth, \
                 delta > 0 and mechanism => 'auto' or 'gaussian'",
            ));
        }
        let cost = Budget::charge(epsilon, delta).map_err(|e| p.error(e))?;
        let m = KdeMechanism::sobolev(spec_for(&cost), contribution).map_err(|e| p.error(e))?;
        return Ok((KdeCall::Fixed(Box::new(m)), cost));
    }
    if auto_bandwidth {
        // The automatic bandwidth releases through the pure-ε mechanism (count and release).
        if matches!(choice, Mechanism::Gaussian | Mechanism::Iclp) {
            return Err(p.error(
                "bandwidth => 'auto' releases through the pure-ε mechanism (a count then the release, both \
                 discrete Laplace): use mechanism => 'auto' or 'laplace', or give a bandwidth",
            ));
        }
        let cost = Budget::charge(epsilon, 0.0).map_err(|e| p.error(e))?;
        let auto = AutoKde::new(Grid { lo, hi, points }, cost.calibration_epsilon(), normalise, contribution)
            .map_err(|e| p.error(e))?;
        return Ok((KdeCall::Auto(Box::new(auto)), cost));
    }
    if choice == Mechanism::Gaussian && delta == 0.0 {
        return Err(p.error("mechanism => 'gaussian' needs delta > 0 (delta => 0 is the pure-ε Laplace mechanism)"));
    }
    // A release is charged what its mechanism uses: (ε, δ) for the Gaussian process, (ε, 0)
    // for the pure-ε release.
    let build = |delta: f64| -> Result<(KdeMechanism, Budget)> {
        let cost = Budget::charge(epsilon, delta).map_err(|e| p.error(e))?;
        Ok((KdeMechanism::with_contribution(spec_for(&cost), contribution).map_err(|e| p.error(e))?, cost))
    };
    let fixed = |r: Result<(KdeMechanism, Budget)>| r.map(|(m, c)| (KdeCall::Fixed(Box::new(m)), c));
    fixed(match choice {
        Mechanism::Gaussian => build(delta),
        Mechanism::Laplace => build(0.0),
        Mechanism::Iclp => {
            let cost = Budget::charge(epsilon, 0.0).map_err(|e| p.error(e))?;
            Ok((KdeMechanism::iclp(spec_for(&cost), contribution).map_err(|e| p.error(e))?, cost))
        }
        Mechanism::Auto if delta == 0.0 => build(0.0),
        // 'auto': whichever adds less noise to the released kernel sum for these public
        // parameters (the pure-ε one where it is available and quieter).
        Mechanism::Auto => {
            let gaussian = build(delta)?;
            match build(0.0) {
                Ok(laplace) if laplace.0.noise_variance() < gaussian.0.noise_variance() => Ok(laplace),
                _ => Ok(gaussian),
            }
        }
    })
}

/// The noise of a `private_kde` release (`mechanism => …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    /// Whichever adds less noise for the requested (ε, δ) and bandwidth.
    Auto,
    /// The Gaussian-process release (δ > 0).
    Gaussian,
    /// The pure-ε release: discrete Laplace noise on counts at nodes every ≈ h/2.
    Laplace,
    /// The pure-ε ICLP release: discrete Laplace noise on the Gaussian release's lifted
    /// coordinates (a Laplace process with the kernel's covariance).
    Iclp,
}

/// The fields of the result struct.
pub fn result_fields() -> Fields {
    Fields::from(vec![
        Field::new_list("x", Field::new_list_field(DataType::Float64, true), true),
        Field::new_list("density", Field::new_list_field(DataType::Float64, true), true),
        Field::new("mass", DataType::Float64, true),
        Field::new("release", DataType::Utf8, true),
        Field::new_list("noise_band", Field::new_list_field(DataType::Float64, true), true),
        Field::new_list("band", Field::new_list_field(DataType::Float64, true), true),
        Field::new("bandwidth", DataType::Float64, true),
    ])
}

/// The result struct of a release: grid, density, mass, the stored release's id, the
/// simultaneous bands' half-widths, and the smoothing the release applies (also what
/// `release(id)` re-reads).
pub fn result_value(release: &KdeRelease, bands: Option<&KdeBands>, id: Option<String>) -> Result<ScalarValue> {
    let columns: Vec<ArrayRef> = vec![
        float_list(Some(release.x.clone())),
        float_list(release.density.clone()),
        Arc::new(Float64Array::from(vec![release.mass])),
        Arc::new(StringArray::from(vec![id])),
        float_list(bands.map(|b| b.noise.clone())),
        float_list(bands.and_then(|b| b.total.clone())),
        Arc::new(Float64Array::from(vec![release.bandwidth])),
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
        "Differentially private kernel density estimate (Gaussian kernel) on a public grid, \
         released with Gaussian-process noise calibrated to (epsilon, delta). Returns \
         {x, density, mass, release, noise_band, band, bandwidth}: the grid, the density normalised by the \
         released curve's own integral (NULL if it holds less than one point's mass), a noisy \
         count of the values in [lo, hi], the stored release's id (catalog sessions), and the \
         half-widths of the simultaneous level-band_alpha bands for the privacy noise and for \
         noise plus sampling error, and the bandwidth: the sd of the kernel the release \
         effectively applies (the kernel's h widened by the binning; with bandwidth => 'auto' \
         the chosen scale H of its sixth-order kernel 3φ_H − 3φ_√2H + φ_√3H), which is what the bands \
         describe.",
        "private_kde(value, bandwidth, epsilon, delta [, lo, hi, points, calibration, nonneg, normalize, band_alpha])",
    )
    .with_sql_example(
        "```sql\nSELECT private_kde(x, bandwidth => 0.02, epsilon => 1.0, delta => 1e-6, lo => 0, hi => 1) FROM t;\n```",
    )
    .with_argument("value", "numeric column; NULL, NaN and ±inf rows are dropped")
    .with_argument("bandwidth", "kernel bandwidth h > 0, or 'auto' (chosen privately within the call's ε)")
    .with_argument("epsilon", "privacy parameter ε > 0 (literal)")
    .with_argument("delta", "privacy parameter δ in [0, 1) (literal); 0 selects the pure-ε release")
    .with_argument("lo", "first grid point (literal; required until the table policy has bounds)")
    .with_argument("hi", "last grid point, lo < hi (literal)")
    .with_argument("points", "grid size in [2, 65536], default 512")
    .with_argument("calibration", "'analytic' (default) or 'classic' (ε ≤ 1 only)")
    .with_argument("nonneg", "false: keep negative values (normalize => 'none'); default true")
    .with_argument("normalize", "'project' (default: L2 projection onto densities), 'rescale' (clamp, rescale) or 'none'")
    .with_argument("band_alpha", "level of the simultaneous bands, in (0, 1), default 0.05")
    .with_argument("mechanism", "'auto' (default: the one adding less noise), 'gaussian' (δ > 0), 'laplace' (pure ε: noise on node counts, charged (ε, 0)) or 'iclp' (pure ε: a Laplace process with the kernel's covariance, Lin & Reimherr §4.4)")
    .with_argument("space", "'gaussian' (default: noise from the Gaussian kernel's RKHS) or 'sobolev' (Hall §4.2: exponential-kernel noise with the H¹ sensitivity; rougher)")
    .build()
});

/// The `private_kde` function (module docs).
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct Kde;

/// The `private_kde` aggregate UDF.
pub type PrivateKde = PrivateUdaf<Kde>;

impl PrivateSpec for Kde {
    type Call = KdeRun;

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
        // lo and hi (arguments 4 and 5) from the value column's bounds.
        PolicyArgs { boxes: &[(0, (4, 5))], ..PolicyArgs::default() }
    }

    fn state_name(&self) -> &'static str {
        "kde_statistic"
    }

    fn call(
        &self,
        values: &[Option<ScalarValue>],
        _: &[DataType],
        contribution: Contribution,
    ) -> Result<(KdeRun, Budget)> {
        let alpha = PARAMS.band_alpha(values)?;
        let (mechanism, cost) = mechanism_from_literals(values, contribution)?;
        Ok((KdeRun { mechanism, alpha }, cost))
    }
}

/// A validated `private_kde` call: its mechanism and the level of its bands.
#[derive(Debug)]
pub struct KdeRun {
    mechanism: KdeCall,
    alpha: f64,
}

impl Release for KdeRun {
    type Statistic = BufferedSums;
    type Output = (KdeRelease, Option<KdeBands>);

    fn statistic(&self) -> BufferedSums {
        self.mechanism.layout().accumulation()
    }

    fn merged_statistic(&self) -> BufferedSums {
        self.mechanism.layout().merged_accumulation()
    }

    fn update(&self, state: &mut BufferedSums, values: &[ArrayRef]) -> Result<()> {
        let values = values[0].as_primitive::<Float64Type>();
        let layout = self.mechanism.layout();
        match values.nulls().filter(|n| n.null_count() > 0) {
            None => layout.accumulate(state, values.values()),
            Some(nulls) => {
                for (start, end) in nulls.valid_slices() {
                    layout.accumulate(state, &values.values()[start..end]);
                }
            }
        }
        Ok(())
    }

    fn update_groups(
        &self,
        statistics: &mut [BufferedSums],
        values: &[ArrayRef],
        batch: &mut GroupedBatch,
    ) -> Result<()> {
        let column = values[0].as_primitive::<Float64Type>();
        let layout = self.mechanism.layout();
        let nulls = column.nulls().filter(|n| n.null_count() > 0);
        let (xs, groups) = (column.values(), batch.indices());
        // Binned: each row straight into its group, in row order.
        let scattered = match (nulls, batch.filter()) {
            (None, None) => layout.scatter_rows(statistics, batch.touched(), xs, groups, |_| true),
            (nulls, filter) => layout.scatter_rows(statistics, batch.touched(), xs, groups, |i| {
                nulls.is_none_or(|n| n.is_valid(i)) && filter.is_none_or(|f| f.is_valid(i) && f.value(i))
            }),
        };
        if !scattered {
            for (g, indices) in batch.ordered().iter() {
                match nulls {
                    None => layout.accumulate_rows(&mut statistics[g], xs, indices, |_| true),
                    Some(nulls) => layout.accumulate_rows(&mut statistics[g], xs, indices, |i| nulls.is_valid(i)),
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
    ) -> Result<(Self::Output, Recipe)> {
        let state = state.totals();
        let (mechanism, lifted, layout_bandwidth) = match &self.mechanism {
            KdeCall::Fixed(m) => {
                let lifted = m.noisy_lifted(state, rng);
                (m.as_ref().clone(), lifted, None)
            }
            KdeCall::Auto(a) => {
                let (m, lifted, choice) = a.release(state, rng).map_err(|e| PARAMS.error(e))?;
                let kernel = m.node_kernel();
                (m, lifted, Some((a.layout().bandwidth(), choice.node_spacing, choice.reference, kernel)))
            }
        };
        // Everything from here on is post-processing of the released coordinates.
        let release = mechanism.post_process(&mechanism.curve_from_lifted(&lifted));
        let bands = mechanism.bands(&release, self.alpha);
        let recipe = Recipe::Kde {
            spec: mechanism.spec().clone(),
            contribution: cx.contribution,
            alpha: self.alpha,
            lifted,
            layout_bandwidth,
            sobolev: mechanism.is_sobolev(),
            iclp: mechanism.is_iclp(),
        };
        Ok(((release, bands), recipe))
    }

    fn result(&self, (release, bands): Self::Output, id: Option<String>) -> Result<ScalarValue> {
        result_value(&release, bands.as_ref(), id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::aggregate::PrivateAccumulator;
    use crate::functions::group_rows::GroupRows;
    use crate::functions::groups::PrivateGroups;
    use crate::mechanism::{Calibration, NoiseSource};
    use datafusion::arrow::array::{BooleanArray, UInt32Array};
    use datafusion::logical_expr::EmitTo;
    use datafusion::logical_expr::Volatility;
    use datafusion::logical_expr::{Accumulator, AggregateUDFImpl};
    use rand::{RngExt, SeedableRng};

    fn accumulator(noise: NoiseSource) -> PrivateAccumulator<KdeRun> {
        let spec = KdeSpec {
            grid: Grid { lo: 0.0, hi: 1.0, points: 50 },
            bandwidth: 0.1,
            epsilon: 1.0,
            delta: 1e-6,
            calibration: Calibration::Analytic,
            normalise: Normalise::Project,
        };
        let mechanism = KdeCall::Fixed(Box::new(KdeMechanism::new(spec).unwrap()));
        let run = KdeRun { mechanism, alpha: crate::mechanism::noise::bands::DEFAULT_ALPHA };
        PrivateAccumulator::new(NAME, run, CallContext { noise, ..Default::default() })
    }

    #[test]
    fn repeated_evaluate_returns_the_same_release() {
        let mut acc = accumulator(NoiseSource::Os);
        let values: ArrayRef = Arc::new(Float64Array::from(vec![0.2, 0.4, 0.4, 0.9]));
        acc.update_batch(&[values]).unwrap();
        let first = acc.evaluate().unwrap();
        assert_eq!(acc.evaluate().unwrap(), first);
        // Two fresh OS-seeded releases of the same data differ: the memo is what makes
        // the repeated evaluate stable, not a fixed seed.
        let mut other = accumulator(NoiseSource::Os);
        other.update_batch(&[Arc::new(Float64Array::from(vec![0.2, 0.4, 0.4, 0.9])) as ArrayRef]).unwrap();
        assert_ne!(other.evaluate().unwrap(), first);
    }

    #[test]
    fn state_round_trips_through_merge() {
        let mut a = accumulator(NoiseSource::TestSeed(1));
        a.update_batch(&[Arc::new(Float64Array::from(vec![0.1, 0.5, f64::NAN])) as ArrayRef]).unwrap();
        let mut b = accumulator(NoiseSource::TestSeed(1));
        b.update_batch(&[Arc::new(Float64Array::from(vec![0.7])) as ArrayRef]).unwrap();
        let mut whole = accumulator(NoiseSource::TestSeed(1));
        whole.update_batch(&[Arc::new(Float64Array::from(vec![0.1, 0.5, 0.7])) as ArrayRef]).unwrap();
        let mut merged = accumulator(NoiseSource::TestSeed(1));
        for acc in [&mut a, &mut b] {
            let state: Vec<ArrayRef> = acc.state().unwrap().iter().map(|s| s.to_array().unwrap()).collect();
            merged.merge_batch(&state).unwrap();
        }
        assert_eq!(merged.statistic().totals(), whole.statistic().totals());
        assert_eq!(merged.evaluate().unwrap(), whole.evaluate().unwrap());
    }

    #[test]
    fn nulls_are_skipped_and_the_rest_counted() {
        let mut with_nulls = accumulator(NoiseSource::TestSeed(1));
        let xs = vec![None, Some(0.1), Some(0.2), None, None, Some(0.9), Some(f64::NAN), None];
        with_nulls.update_batch(&[Arc::new(Float64Array::from(xs)) as ArrayRef]).unwrap();
        let mut dense = accumulator(NoiseSource::TestSeed(1));
        dense.update_batch(&[Arc::new(Float64Array::from(vec![0.1, 0.2, 0.9])) as ArrayRef]).unwrap();
        assert_eq!(with_nulls.statistic().totals(), dense.statistic().totals());
        let mass: i128 = dense.statistic().totals().iter().sum();
        assert_eq!(mass, 3 << 40, "three rows, one unit each");
    }

    fn run(bandwidth: f64) -> KdeRun {
        let spec = KdeSpec {
            grid: Grid { lo: 0.0, hi: 1.0, points: 50 },
            bandwidth,
            epsilon: 1.0,
            delta: 1e-6,
            calibration: Calibration::Analytic,
            normalise: Normalise::Project,
        };
        let mechanism = KdeCall::Fixed(Box::new(KdeMechanism::new(spec).unwrap()));
        KdeRun { mechanism, alpha: crate::mechanism::noise::bands::DEFAULT_ALPHA }
    }

    fn groups(run: KdeRun) -> PrivateGroups<KdeRun> {
        let cx = CallContext { noise: NoiseSource::TestSeed(3), ..Default::default() };
        let state_types = Kde.state_fields(NAME).iter().map(|f| f.data_type().clone()).collect();
        PrivateGroups::new(NAME, run, cx, DataType::Struct(Kde.result_fields()), state_types)
    }

    /// Three batches over 7 groups (the total grows between batches), with nulls, NaN, values
    /// beyond the grid and a FILTER on the second batch; `keep(batch, row)` as the filter.
    fn batches() -> Vec<(ArrayRef, Vec<usize>, Option<BooleanArray>, usize)> {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        // The last batch has fewer rows than groups (its groups are counted another way).
        (0..4)
            .map(|b| {
                let total = [5, 7, 7, 7][b];
                let len = [700, 700, 700, 5][b];
                let xs: Float64Array = (0..len)
                    .map(|i| match i % 53 {
                        0 => None,
                        1 => Some(f64::NAN),
                        2 => Some(3.0),
                        _ => Some(rng.random::<f64>() * 1.4 - 0.2),
                    })
                    .collect();
                let g = (0..len).map(|_| rng.random_range(0..total)).collect();
                let filter = (b == 1).then(|| (0..len).map(|i| (i % 3 != 0).then_some(i % 5 != 0)).collect());
                (Arc::new(xs) as ArrayRef, g, filter, total)
            })
            .collect()
    }

    #[test]
    fn the_grouped_form_equals_one_accumulator_per_group() {
        use datafusion::logical_expr::GroupsAccumulator;
        // Binned (h = 0.1: rows scattered into their groups) and exact (h = 10⁻⁵: more than 2²⁰
        // bins; rows ordered by group) layouts; the function's own update_groups and the default
        // (take, then update).
        for (h, by_take) in [(0.1, false), (0.1, true), (1e-5, false)] {
            assert_eq!(run(h).mechanism.layout().is_binned(), h > 0.01);
            let mut grouped = groups(run(h));
            let mut each: Vec<PrivateAccumulator<KdeRun>> = (0..7)
                .map(|_| {
                    let cx = CallContext { noise: NoiseSource::TestSeed(3), ..Default::default() };
                    PrivateAccumulator::new(NAME, run(h), cx)
                })
                .collect();
            for (xs, g, filter, total) in batches() {
                if by_take {
                    grouped.grow(total).unwrap();
                    let mut rows = GroupRows::default();
                    let mut batch = GroupedBatch::new(&g, filter.as_ref(), total, &mut rows);
                    let call = run(h);
                    crate::functions::release::update_groups_by_take(
                        &call,
                        grouped.statistics_mut(),
                        std::slice::from_ref(&xs),
                        batch.ordered(),
                    )
                    .unwrap();
                } else {
                    grouped.update_batch(std::slice::from_ref(&xs), &g, filter.as_ref(), total).unwrap();
                }
                for (k, acc) in each.iter_mut().enumerate() {
                    let rows: Vec<u32> = (0..g.len() as u32)
                        .filter(|&i| g[i as usize] == k)
                        .filter(|&i| filter.as_ref().is_none_or(|f| f.is_valid(i as usize) && f.value(i as usize)))
                        .collect();
                    let taken = datafusion::arrow::compute::take(&xs, &UInt32Array::from(rows), None).unwrap();
                    acc.update_batch(&[taken]).unwrap();
                }
            }
            // State round trip in a permuted group order, then release group by group.
            let state = grouped.state(EmitTo::All).unwrap();
            let order = [6, 5, 4, 3, 2, 1, 0];
            let mut merged = groups(run(h));
            merged.merge_batch(&state, &order, 7).unwrap();
            let first = merged.evaluate(EmitTo::First(3)).unwrap();
            let rest = merged.evaluate(EmitTo::All).unwrap();
            assert_eq!((first.len(), rest.len()), (3, 4));
            for (k, acc) in each.iter_mut().enumerate() {
                let at = order[k];
                let got = if at < 3 {
                    ScalarValue::try_from_array(&first, at)
                } else {
                    ScalarValue::try_from_array(&rest, at - 3)
                };
                assert_eq!(got.unwrap(), acc.evaluate().unwrap(), "h = {h}, group {k}");
            }
            // The statistics compared are not trivially empty.
            let mass: i128 = each.iter_mut().map(|a| a.statistic().totals().iter().sum::<i128>()).sum();
            assert!(mass > 0, "h = {h}");
        }
    }

    #[test]
    fn a_final_phase_merges_into_sums_without_buffers_and_rows_can_still_follow() {
        use datafusion::logical_expr::GroupsAccumulator;
        let (xs, g, filter, total) = batches().swap_remove(1);
        let mut partial = groups(run(0.1));
        partial.update_batch(std::slice::from_ref(&xs), &g, filter.as_ref(), total).unwrap();
        let state = partial.state(EmitTo::All).unwrap();
        let order: Vec<usize> = (0..total).collect();
        // Merged only: the exact totals, no split buffer (half the bytes of a statistic rows are
        // added to).
        let mut merged = groups(run(0.1));
        merged.merge_batch(&state, &order, total).unwrap();
        let len = run(0.1).mechanism.layout().state_len();
        for s in merged.statistics_mut() {
            assert_eq!(s.heap_size(), 16 * len);
        }
        // Rows after a merge: every statistic gets its buffer first and keeps what it merged.
        merged.update_batch(std::slice::from_ref(&xs), &g, filter.as_ref(), total).unwrap();
        let mut twice = groups(run(0.1));
        twice.update_batch(std::slice::from_ref(&xs), &g, filter.as_ref(), total).unwrap();
        twice.update_batch(&[xs], &g, filter.as_ref(), total).unwrap();
        for (a, b) in merged.statistics_mut().iter_mut().zip(twice.statistics_mut()) {
            assert!(a.heap_size() > 16 * len, "a statistic rows are added to has its buffer");
            assert_eq!(a.totals(), b.totals());
        }
        // Negative control: the statistics compared hold rows.
        assert!(twice.statistics_mut().iter_mut().any(|s| s.totals().iter().any(|&v| v != 0)));
    }

    #[test]
    fn when_group_buffers_flush_depends_on_the_rows_read_not_on_their_groups() {
        use datafusion::logical_expr::GroupsAccumulator;
        // Just over 2²² rows (one buffer's worth) in batches of 8 192 over 7 groups: all of them
        // in group 0, or spread over every group. One group's own row count would flush group 0
        // once in the first table and no group in the second; every group must flush exactly as
        // often, and hold as much memory, in both.
        let (batch, batches, total) = (8192usize, (1 << 22) / 8192 + 1, 7);
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let xs: Vec<f64> = (0..batch).map(|_| rng.random::<f64>()).collect();
        let column: ArrayRef = Arc::new(Float64Array::from(xs.clone()));
        let assignments: [Vec<usize>; 2] = [vec![0; batch], (0..batch).map(|i| i % total).collect()];
        let work = |groups: &mut PrivateGroups<KdeRun>| -> Vec<(u64, usize)> {
            groups.statistics_mut().iter().map(|s| (s.flushes(), s.heap_size())).collect()
        };
        let mut seen = Vec::new();
        for g in &assignments {
            let mut grouped = groups(run(0.1));
            for _ in 0..batches {
                grouped.update_batch(std::slice::from_ref(&column), g, None, total).unwrap();
            }
            seen.push(work(&mut grouped));
        }
        assert_eq!(seen[0], seen[1]);
        assert!(seen[0].iter().all(|&(flushes, _)| flushes == 1), "{:?}", seen[0]);
        // Negative control: each group's buffer counting its own rows (the statistics fed
        // directly, no group-wide flush) flushes group 0 only, and only in the first table.
        let layout = run(0.1).mechanism.layout().clone();
        let mut own = Vec::new();
        for g in &assignments {
            let mut accs: Vec<BufferedSums> = (0..total).map(|_| layout.accumulation()).collect();
            let mut counts = vec![0; total];
            g.iter().for_each(|&k| counts[k] += 1);
            for _ in 0..batches {
                let touched = counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(k, c)| (k, *c));
                assert!(layout.scatter_rows(&mut accs, touched, &xs, g, |_| true));
            }
            own.push(accs.iter().map(BufferedSums::flushes).collect::<Vec<_>>());
        }
        assert_eq!(own, [vec![1, 0, 0, 0, 0, 0, 0], vec![0; 7]]);
    }

    #[test]
    fn rows_converted_to_state_merge_into_the_same_statistic() {
        use datafusion::logical_expr::GroupsAccumulator;
        let (xs, g, filter, total) = batches().swap_remove(1);
        let mut direct = groups(run(0.1));
        direct.update_batch(std::slice::from_ref(&xs), &g, filter.as_ref(), total).unwrap();
        let mut converted = groups(run(0.1));
        let rows = converted.convert_to_state(&[xs], filter.as_ref()).unwrap();
        converted.merge_batch(&rows, &g, total).unwrap();
        assert_eq!(direct.state(EmitTo::All).unwrap(), converted.state(EmitTo::All).unwrap());
    }

    #[test]
    fn udaf_is_volatile() {
        assert_eq!(PrivateKde::default().signature().volatility, Volatility::Volatile);
    }
}
