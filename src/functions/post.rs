//! Free post-processing of released curves (SPEC §0): scalar functions of a release struct that
//! read no data and spend no budget. Usable anywhere above the private aggregate:
//!
//! ```sql
//! SELECT curve_quantile(kde, 0.5) AS median, curve_cdf(kde, 0.3), curve_mode(kde),
//!        curve_mean(kde), curve_var(kde), curve_integral(kde, 0.2, 0.4)
//! FROM (SELECT private_kde(x, 0.02, 1.0, 1e-6, 0, 1) AS kde FROM t);
//! ```
//!
//! A curve is a struct with a grid list (`x`, or `t` for mean curves) and a value list
//! (`density`, or `mean`), read as the piecewise-linear interpolant of its points (zero outside
//! the grid). Integrals of that interpolant are exact (trapezoid rule per segment, closed-form
//! moments); `curve_cdf`, `curve_quantile`, `curve_mean` and `curve_var` normalise by the integral
//! over the grid and are NULL when it is not positive; `curve_quantile` inverts the piecewise-
//! quadratic CDF exactly and is NULL for p outside [0, 1]. NULL curves and NULL arguments give NULL.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Float64Builder, ListBuilder, StructArray};
use datafusion::arrow::datatypes::{DataType, Float64Type};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

/// Which post-processing function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CurveFn {
    /// `curve_integral(curve, a, b)`.
    Integral,
    /// `curve_cdf(curve, x)`.
    Cdf,
    /// `curve_quantile(curve, p)`.
    Quantile,
    /// `curve_mode(curve)`.
    Mode,
    /// `curve_mean(curve)`.
    Mean,
    /// `curve_var(curve)`.
    Var,
}

impl CurveFn {
    const ALL: [CurveFn; 6] =
        [CurveFn::Integral, CurveFn::Cdf, CurveFn::Quantile, CurveFn::Mode, CurveFn::Mean, CurveFn::Var];

    fn name(self) -> &'static str {
        match self {
            CurveFn::Integral => "curve_integral",
            CurveFn::Cdf => "curve_cdf",
            CurveFn::Quantile => "curve_quantile",
            CurveFn::Mode => "curve_mode",
            CurveFn::Mean => "curve_mean",
            CurveFn::Var => "curve_var",
        }
    }

    /// Number of numeric arguments after the curve.
    fn numbers(self) -> usize {
        match self {
            CurveFn::Integral => 2,
            CurveFn::Cdf | CurveFn::Quantile => 1,
            _ => 0,
        }
    }

    /// The value at one curve and its numeric arguments.
    pub fn eval(self, c: &Curve, args: &[f64]) -> Option<f64> {
        match self {
            CurveFn::Integral => Some(c.integral(args[0], args[1])),
            CurveFn::Cdf => Some(c.integral(f64::NEG_INFINITY, args[0]) / c.total()?),
            CurveFn::Quantile => c.quantile(args[0]),
            CurveFn::Mode => c.mode(),
            CurveFn::Mean => Some(c.moment(1) / c.total()?),
            CurveFn::Var => {
                let t = c.total()?;
                let m = c.moment(1) / t;
                Some((c.moment(2) / t - m * m).max(0.0))
            }
        }
    }
}

/// All post-processing functions, ready to register.
pub fn curve_udfs() -> Vec<ScalarUDF> {
    let mut out: Vec<ScalarUDF> = CurveFn::ALL.iter().map(|&k| ScalarUDF::from(CurveUdf::new(k))).collect();
    out.push(ScalarUDF::from(CurveListUdf::new(ListFn::Quantiles)));
    out.push(ScalarUDF::from(CurveListUdf::new(ListFn::Derivative)));
    out
}

/// A released curve: grid points (increasing) and values.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Grid.
    pub xs: Vec<f64>,
    /// Values on the grid.
    pub ys: Vec<f64>,
}

impl Curve {
    /// ∫ from a to b of the piecewise-linear interpolant (zero outside the grid; a > b gives the
    /// negative).
    pub fn integral(&self, a: f64, b: f64) -> f64 {
        if a > b {
            return -self.integral(b, a);
        }
        let mut sum = 0.0;
        for i in 1..self.xs.len() {
            let (x0, x1) = (self.xs[i - 1], self.xs[i]);
            let (lo, hi) = (a.max(x0), b.min(x1));
            if hi > lo && x1 > x0 {
                sum += (hi - lo) * (self.at(i, lo) + self.at(i, hi)) / 2.0;
            }
        }
        sum
    }

    /// The interpolant on segment i (between points i−1 and i) at x.
    fn at(&self, i: usize, x: f64) -> f64 {
        let (x0, x1, y0, y1) = (self.xs[i - 1], self.xs[i], self.ys[i - 1], self.ys[i]);
        y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    }

    /// ∫ over the grid, if positive.
    pub fn total(&self) -> Option<f64> {
        let t = self.integral(f64::NEG_INFINITY, f64::INFINITY);
        (t > 0.0 && t.is_finite()).then_some(t)
    }

    /// ∫ x^k f(x) dx over the grid (k = 1, 2), exact for the linear interpolant.
    pub fn moment(&self, k: i32) -> f64 {
        let mut sum = 0.0;
        for i in 1..self.xs.len() {
            let (x0, x1, y0, y1) = (self.xs[i - 1], self.xs[i], self.ys[i - 1], self.ys[i]);
            let h = x1 - x0;
            if h <= 0.0 {
                continue;
            }
            // f(x) = y0 + s(x − x0): ∫ x^k f = y0·[x^{k+1}/(k+1)] + s·∫ x^k (x − x0).
            let s = (y1 - y0) / h;
            let p = |e: i32| (x1.powi(e) - x0.powi(e)) / e as f64;
            sum += (y0 - s * x0) * p(k + 1) + s * p(k + 2);
        }
        sum
    }

    /// The derivative of the curve at its grid points: central differences inside, one-sided at
    /// the ends (the slope of the interpolant's adjacent segments, averaged inside).
    pub fn derivative(&self) -> Vec<f64> {
        let n = self.xs.len();
        (0..n)
            .map(|i| {
                let (a, b) = (i.saturating_sub(1), (i + 1).min(n - 1));
                (self.ys[b] - self.ys[a]) / (self.xs[b] - self.xs[a])
            })
            .collect()
    }

    /// The grid point with the largest value (the first of ties).
    pub fn mode(&self) -> Option<f64> {
        let mut best: Option<(f64, f64)> = None;
        for (&x, &y) in self.xs.iter().zip(&self.ys) {
            if best.is_none_or(|(_, b)| y > b) {
                best = Some((x, y));
            }
        }
        best.map(|b| b.0)
    }

    /// The p-quantile of the normalised interpolant (exact inversion of its piecewise-quadratic
    /// CDF); None for p outside [0, 1] or a non-positive total.
    pub fn quantile(&self, p: f64) -> Option<f64> {
        let total = self.total()?;
        if !(0.0..=1.0).contains(&p) {
            return None;
        }
        let target = p * total;
        let mut acc = 0.0;
        for i in 1..self.xs.len() {
            let (x0, x1, y0, y1) = (self.xs[i - 1], self.xs[i], self.ys[i - 1], self.ys[i]);
            let h = x1 - x0;
            let area = h * (y0 + y1) / 2.0;
            if h > 0.0 && acc + area >= target && area > 0.0 {
                // Solve y0·u + s·u²/2 = need for u in [0, h], s = (y1 − y0)/h.
                let need = target - acc;
                let s = (y1 - y0) / h;
                let u = if s.abs() < 1e-300 {
                    need / y0
                } else {
                    let disc = (y0 * y0 + 2.0 * s * need).max(0.0);
                    // The root that is continuous in s (no cancellation): 2·need/(y0 + √disc).
                    2.0 * need / (y0 + disc.sqrt())
                };
                return Some(x0 + u.clamp(0.0, h));
            }
            acc += area;
        }
        self.xs.last().copied()
    }
}

/// The `curve_*` scalar UDFs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CurveUdf {
    kind: CurveFn,
    signature: Signature,
}

impl CurveUdf {
    fn new(kind: CurveFn) -> Self {
        Self { kind, signature: Signature::user_defined(Volatility::Immutable) }
    }
}

/// Checks a `curve_*` call has `want` arguments, the first a curve struct; returns its type.
fn curve_arg(function: &str, arg_types: &[DataType], want: usize) -> Result<DataType> {
    if arg_types.len() != want {
        return plan_err!("{function} takes {want} arguments, got {}", arg_types.len());
    }
    if curve_fields(&arg_types[0]).is_none() {
        return plan_err!(
            "{function}: the first argument must be a curve (the struct private_kde or private_mean_curve returns), \
             got {}",
            arg_types[0]
        );
    }
    Ok(arg_types[0].clone())
}

/// The (grid, values) list columns of a curve struct: `x`/`t` and `density`/`mean`/`fit`/`score`.
fn curve_fields(t: &DataType) -> Option<(usize, usize)> {
    let DataType::Struct(fields) = t else { return None };
    let find = |names: &[&str]| {
        fields.iter().position(|f| {
            names.contains(&f.name().as_str())
                && matches!(f.data_type(), DataType::List(item) if item.data_type() == &DataType::Float64)
        })
    };
    Some((find(&["x", "t"])?, find(&["density", "mean", "fit", "score"])?))
}

impl ScalarUDFImpl for CurveUdf {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let mut out = vec![curve_arg(self.name(), arg_types, 1 + self.kind.numbers())?];
        for (i, t) in arg_types.iter().enumerate().skip(1) {
            if t.is_numeric() || t == &DataType::Null {
                out.push(DataType::Float64);
            } else {
                return plan_err!("{}: argument {} must be a number, got {t}", self.name(), i + 1);
            }
        }
        Ok(out)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<ArrayRef>>>()?;
        let curves = curves_of(self.name(), &arrays[0])?;
        let numbers = arrays[1..]
            .iter()
            .map(|a| datafusion::arrow::compute::cast(a, &DataType::Float64))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let numbers: Vec<&Float64Array> = numbers.iter().map(|a| a.as_primitive::<Float64Type>()).collect();
        let out: Float64Array = curves
            .iter()
            .enumerate()
            .map(|(r, curve)| {
                if numbers.iter().any(|a| a.is_null(r)) {
                    return None;
                }
                let a: Vec<f64> = numbers.iter().map(|a| a.value(r)).collect();
                self.kind.eval(curve.as_ref()?, &a).filter(|v| v.is_finite())
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// The curve of each row of a curve-struct column (None for NULL, ragged or too short curves).
fn curves_of(function: &str, array: &ArrayRef) -> Result<Vec<Option<Curve>>> {
    let Some((xi, yi)) = curve_fields(array.data_type()) else {
        return exec_err!("{function}: not a curve");
    };
    let s: &StructArray = array.as_struct();
    let (xs, ys) = (s.column(xi).as_list::<i32>(), s.column(yi).as_list::<i32>());
    let values = |l: &datafusion::arrow::array::ListArray, r: usize| -> Option<Vec<f64>> {
        if l.is_null(r) {
            return None;
        }
        let v = l.value(r);
        let v = v.as_primitive::<Float64Type>();
        (v.null_count() == 0).then(|| v.values().to_vec())
    };
    Ok((0..array.len())
        .map(|r| {
            if s.is_null(r) {
                return None;
            }
            let c = Curve { xs: values(xs, r)?, ys: values(ys, r)? };
            (c.xs.len() == c.ys.len() && c.xs.len() >= 2).then_some(c)
        })
        .collect())
}

/// List-valued post-processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListFn {
    /// `curve_quantiles(curve, [p, …])`: the quantiles at each p (NULL entries for p outside [0, 1]).
    Quantiles,
    /// `curve_derivative(curve)`: the derivative at the grid points.
    Derivative,
}

/// `curve_quantiles` and `curve_derivative`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CurveListUdf {
    kind: ListFn,
    signature: Signature,
}

impl CurveListUdf {
    fn new(kind: ListFn) -> Self {
        Self { kind, signature: Signature::user_defined(Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for CurveListUdf {
    fn name(&self) -> &str {
        match self.kind {
            ListFn::Quantiles => "curve_quantiles",
            ListFn::Derivative => "curve_derivative",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let want = if self.kind == ListFn::Quantiles { 2 } else { 1 };
        let mut out = vec![curve_arg(self.name(), arg_types, want)?];
        if want == 2 {
            match &arg_types[1] {
                DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
                    if f.data_type().is_numeric() || f.data_type() == &DataType::Null =>
                {
                    out.push(DataType::new_list(DataType::Float64, true))
                }
                other => return plan_err!("{}: argument 2 must be a list of numbers, got {other}", self.name()),
            }
        }
        Ok(out)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::new_list(DataType::Float64, true))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<ArrayRef>>>()?;
        let curves = curves_of(self.name(), &arrays[0])?;
        let mut out = ListBuilder::new(Float64Builder::new());
        for (r, curve) in curves.iter().enumerate() {
            let Some(curve) = curve else {
                out.append(false);
                continue;
            };
            match self.kind {
                ListFn::Derivative => {
                    out.values().append_values(&curve.derivative(), &vec![true; curve.xs.len()]);
                    out.append(true);
                }
                ListFn::Quantiles => {
                    let ps = arrays[1].as_list::<i32>();
                    if ps.is_null(r) {
                        out.append(false);
                        continue;
                    }
                    let ps = ps.value(r);
                    let ps = datafusion::arrow::compute::cast(&ps, &DataType::Float64)?;
                    for p in ps.as_primitive::<Float64Type>() {
                        out.values().append_option(p.and_then(|p| curve.quantile(p)));
                    }
                    out.append(true);
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The uniform density on [0, 2] on a grid of 5 points, and a triangle on [0, 1].
    fn uniform() -> Curve {
        Curve { xs: vec![0.0, 0.5, 1.0, 1.5, 2.0], ys: vec![0.5; 5] }
    }

    fn triangle() -> Curve {
        Curve { xs: vec![0.0, 0.5, 1.0], ys: vec![0.0, 2.0, 0.0] }
    }

    #[test]
    fn integrals_moments_and_quantiles_are_exact_for_the_interpolant() {
        let u = uniform();
        assert!((u.total().unwrap() - 1.0).abs() < 1e-15);
        assert!((u.integral(0.25, 0.75) - 0.25).abs() < 1e-15);
        assert!((u.integral(-5.0, 0.5) - 0.25).abs() < 1e-15, "zero outside the grid");
        assert!((CurveFn::Mean.eval(&u, &[]).unwrap() - 1.0).abs() < 1e-14);
        assert!((CurveFn::Var.eval(&u, &[]).unwrap() - 1.0 / 3.0).abs() < 1e-14);
        assert!((u.quantile(0.3).unwrap() - 0.6).abs() < 1e-14);
        let t = triangle();
        // Triangle on [0, 1], peak 2 at 1/2: CDF(x) = 2x² on [0, 1/2]; median 1/2; var 1/24.
        assert!((CurveFn::Cdf.eval(&t, &[0.25]).unwrap() - 0.125).abs() < 1e-15);
        assert!((t.quantile(0.125).unwrap() - 0.25).abs() < 1e-14);
        assert!((t.quantile(0.5).unwrap() - 0.5).abs() < 1e-14);
        assert!((t.quantile(0.875).unwrap() - 0.75).abs() < 1e-14);
        assert!((CurveFn::Var.eval(&t, &[]).unwrap() - 1.0 / 24.0).abs() < 1e-14);
        assert_eq!(t.mode(), Some(0.5));
        assert_eq!(t.quantile(1.5), None);
        // Quantile and CDF invert each other.
        for p in [0.01, 0.2, 0.5, 0.77, 0.99] {
            let q = t.quantile(p).unwrap();
            assert!((CurveFn::Cdf.eval(&t, &[q]).unwrap() - p).abs() < 1e-12, "{p}");
        }
        assert_eq!(t.derivative(), vec![4.0, 0.0, -4.0]);
        // A curve without positive mass has no CDF.
        let zero = Curve { xs: vec![0.0, 1.0], ys: vec![0.0, 0.0] };
        assert_eq!(CurveFn::Cdf.eval(&zero, &[0.5]), None);
    }
}
