//! Literal parameters of private aggregates.
//!
//! A private aggregate's first arguments are the data; every other argument is a public
//! parameter and must be a literal. The same parser runs twice: on the optimized logical
//! plan at planning time (the check that counts — before any budget is spent or any row
//! is read) and again on the physical expressions when an accumulator is created
//! (defence in depth). Messages name the function, the argument and the allowed range.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result, ScalarValue, plan_datafusion_err};
use datafusion::logical_expr::expr::Cast;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{Expr, Signature, Volatility};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;

use crate::mechanism::ranges;

/// What a parameter may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A real number (coerced to Float64).
    Float,
    /// A real number or the string 'auto'.
    FloatOrAuto,
    /// An integer (integer types coerced to Int64; floats must be integral).
    Int,
    /// A string (coerced to Utf8).
    Str,
    /// A boolean.
    Bool,
    /// A list of real numbers (`[0.1, 0.5]`; coerced to a list of Float64).
    FloatList,
}

/// One declared argument of a private aggregate.
#[derive(Debug, Clone, Copy)]
pub struct ParamDef {
    /// Name used for named arguments (`name => value`).
    pub name: &'static str,
    /// Its kind.
    pub kind: ParamKind,
}

/// The declared arguments of a private aggregate: the data arguments first.
#[derive(Debug, Clone, Copy)]
pub struct FunctionParams {
    /// SQL function name.
    pub function: &'static str,
    /// The data arguments' names (for messages and named arguments).
    pub data: &'static [&'static str],
    /// Parameters after the data arguments, in positional order.
    pub params: &'static [ParamDef],
    /// How many parameters are required.
    pub required: usize,
}

impl FunctionParams {
    /// All argument names, data arguments first.
    pub fn names(&self) -> Vec<String> {
        self.data.iter().chain(self.params.iter().map(|p| &p.name)).map(|n| n.to_string()).collect()
    }

    /// How many arguments are data (the rest are literal parameters).
    pub fn data_len(&self) -> usize {
        self.data.len()
    }

    /// A precise planning error about this function.
    pub fn error(&self, msg: impl std::fmt::Display) -> DataFusionError {
        plan_datafusion_err!("{}: {msg}", self.function)
    }

    /// The UDAF signature: volatile, user-defined coercion, named parameters.
    pub fn signature(&self) -> Signature {
        Signature::user_defined(Volatility::Volatile)
            .with_parameter_names(self.names())
            .expect("user-defined signatures accept parameter names")
    }

    /// Refuses DISTINCT and ORDER BY inside the call (checked again when an accumulator
    /// is created; the guard refuses them at planning time).
    pub fn check_accumulator_args(&self, args: &AccumulatorArgs) -> Result<()> {
        if args.is_distinct {
            return Err(self.error("DISTINCT is not supported"));
        }
        if !args.order_bys.is_empty() {
            return Err(self.error("ORDER BY inside the call is not supported"));
        }
        Ok(())
    }

    /// Checks the number of arguments.
    pub fn check_arity(&self, n: usize) -> Result<()> {
        let d = self.data_len();
        let (min, max) = (d + self.required, d + self.params.len());
        if (min..=max).contains(&n) {
            return Ok(());
        }
        let optional: Vec<&str> = self.params[self.required..].iter().map(|p| p.name).collect();
        let required: Vec<&str> = self.params[..self.required].iter().map(|p| p.name).collect();
        Err(self.error(format!(
            "takes {min} to {max} arguments ({}, {} [, {}]), got {n}",
            self.data.join(", "),
            required.join(", "),
            optional.join(", ")
        )))
    }

    /// The types DataFusion should cast the arguments to (UDAF `coerce_types`): `data_type`
    /// gives each data argument's (by position).
    pub fn coerce(
        &self,
        data_type: impl Fn(usize, &DataType) -> Result<DataType>,
        arg_types: &[DataType],
    ) -> Result<Vec<DataType>> {
        self.check_arity(arg_types.len())?;
        let d = self.data_len();
        let mut out = arg_types[..d].iter().enumerate().map(|(i, t)| data_type(i, t)).collect::<Result<Vec<_>>>()?;
        for (def, t) in self.params.iter().zip(&arg_types[d..]) {
            let ok = match def.kind {
                ParamKind::Float => (t.is_numeric() || t == &DataType::Null).then_some(DataType::Float64),
                ParamKind::FloatOrAuto if matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
                    Some(DataType::Utf8)
                }
                ParamKind::FloatOrAuto => (t.is_numeric() || t == &DataType::Null).then_some(DataType::Float64),
                ParamKind::Int if t.is_integer() || t == &DataType::Null => Some(DataType::Int64),
                ParamKind::Int => t.is_floating().then_some(DataType::Float64),
                ParamKind::Str => {
                    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null)
                        .then_some(DataType::Utf8)
                }
                ParamKind::Bool => matches!(t, DataType::Boolean | DataType::Null).then_some(DataType::Boolean),
                ParamKind::FloatList => match t {
                    DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
                        if f.data_type().is_numeric() || f.data_type() == &DataType::Null =>
                    {
                        Some(DataType::new_list(DataType::Float64, true))
                    }
                    DataType::Null => Some(DataType::new_list(DataType::Float64, true)),
                    _ => None,
                },
            };
            let want = match def.kind {
                ParamKind::Float => "a number",
                ParamKind::FloatOrAuto => "a number or 'auto'",
                ParamKind::Int => "an integer",
                ParamKind::Str => "a string",
                ParamKind::Bool => "a boolean",
                ParamKind::FloatList => "a list of numbers such as [0.25, 0.5, 0.75]",
            };
            out.push(ok.ok_or_else(|| self.error(format!("argument '{}' must be {want}, got type {t}", def.name)))?);
        }
        Ok(out)
    }

    /// Extracts the literal parameters from logical argument expressions (planning time).
    /// `None` marks an omitted or NULL parameter.
    pub fn literals_from_logical(&self, args: &[Expr]) -> Result<Vec<Option<ScalarValue>>> {
        self.check_arity(args.len())?;
        args[self.data_len()..]
            .iter()
            .zip(self.params)
            .map(|(e, def)| {
                logical_literal(e)
                    .ok_or_else(|| self.not_literal(def, &e.to_string()))
                    .map(|v| (!v.is_null()).then_some(v))
            })
            .collect()
    }

    /// Extracts the literal parameters from physical expressions (accumulator creation).
    pub fn literals_from_physical(&self, exprs: &[Arc<dyn PhysicalExpr>]) -> Result<Vec<Option<ScalarValue>>> {
        self.check_arity(exprs.len())?;
        exprs[self.data_len()..]
            .iter()
            .zip(self.params)
            .map(|(e, def)| match e.downcast_ref::<Literal>() {
                Some(l) => Ok((!l.value().is_null()).then(|| l.value().clone())),
                None => Err(self.not_literal(def, &e.to_string())),
            })
            .collect()
    }

    fn not_literal(&self, def: &ParamDef, got: &str) -> DataFusionError {
        self.error(format!(
            "argument '{}' must be a literal constant (a parameter may not depend on the data), got {got}",
            def.name
        ))
    }

    fn index(&self, name: &str) -> usize {
        self.params.iter().position(|p| p.name == name).expect("declared parameter")
    }

    /// A float parameter, if given.
    pub fn float(&self, values: &[Option<ScalarValue>], name: &str) -> Result<Option<f64>> {
        match values.get(self.index(name)).cloned().flatten() {
            None => Ok(None),
            Some(v) => match v.cast_to(&DataType::Float64) {
                Ok(ScalarValue::Float64(Some(f))) => Ok(Some(f)),
                _ => Err(self.error(format!("argument '{name}' must be a number, got {v}"))),
            },
        }
    }

    /// The level α of the result's simultaneous bands (`band_alpha`, default 0.05).
    pub fn band_alpha(&self, values: &[Option<ScalarValue>]) -> Result<f64> {
        match self.float(values, "band_alpha")? {
            None => Ok(crate::mechanism::noise::bands::DEFAULT_ALPHA),
            Some(a) if a > 0.0 && a < 1.0 => Ok(a),
            Some(a) => Err(self.error(format!("argument 'band_alpha' must be in the open interval (0, 1), got {a}"))),
        }
    }

    /// A required float parameter.
    pub fn required_float(&self, values: &[Option<ScalarValue>], name: &str) -> Result<f64> {
        self.float(values, name)?
            .ok_or_else(|| self.error(format!("argument '{name}' is required and may not be NULL")))
    }

    /// An integer parameter, if given; integral floats are accepted.
    pub fn int(&self, values: &[Option<ScalarValue>], name: &str, range: (i64, i64)) -> Result<Option<i64>> {
        let bad = |v: &dyn std::fmt::Display| {
            self.error(format!("argument '{name}' must be an integer in [{}, {}], got {v}", range.0, range.1))
        };
        let v = match values.get(self.index(name)).cloned().flatten() {
            None => return Ok(None),
            Some(ScalarValue::Float64(Some(f))) => {
                if f.fract() != 0.0 || !f.is_finite() || f.abs() > 9.0e15 {
                    return Err(bad(&f));
                }
                f as i64
            }
            Some(v) => match v.cast_to(&DataType::Int64) {
                Ok(ScalarValue::Int64(Some(i))) => i,
                _ => return Err(bad(&v)),
            },
        };
        if v < range.0 || v > range.1 {
            return Err(bad(&v));
        }
        Ok(Some(v))
    }

    /// A string parameter, if given.
    pub fn string(&self, values: &[Option<ScalarValue>], name: &str) -> Result<Option<String>> {
        match values.get(self.index(name)).cloned().flatten() {
            None => Ok(None),
            Some(ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s))) => {
                Ok(Some(s))
            }
            Some(v) => Err(self.error(format!("argument '{name}' must be a string, got {v}"))),
        }
    }

    /// Whether a number-or-'auto' parameter is the string 'auto' (any other string is an error).
    pub fn is_auto(&self, values: &[Option<ScalarValue>], name: &str) -> Result<bool> {
        match values.get(self.index(name)).cloned().flatten() {
            Some(ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s))) => {
                if s.eq_ignore_ascii_case("auto") {
                    Ok(true)
                } else {
                    Err(self.error(format!("argument '{name}' must be a number or 'auto', got '{s}'")))
                }
            }
            _ => Ok(false),
        }
    }

    /// The required `epsilon` of a release: from one budget unit to the per-release maximum.
    pub fn epsilon(&self, values: &[Option<ScalarValue>]) -> Result<f64> {
        use crate::mechanism::noise::budget::{MAX_EPSILON, MIN_EPSILON};
        let epsilon = self.required_float(values, "epsilon")?;
        if !(epsilon.is_finite() && (MIN_EPSILON..=MAX_EPSILON).contains(&epsilon)) {
            return Err(self.error(format!(
                "argument 'epsilon' must be a finite number in [{MIN_EPSILON:e}, {MAX_EPSILON}] (one budget unit to \
                 the per-release maximum), got {epsilon}"
            )));
        }
        Ok(epsilon)
    }

    /// The `calibration` of a Gaussian release (default 'analytic'; 'classic' only for ε ≤ 1).
    pub fn calibration(&self, values: &[Option<ScalarValue>], epsilon: f64) -> Result<crate::mechanism::Calibration> {
        use crate::mechanism::Calibration;
        let calibration = match self.string(values, "calibration")? {
            None => Calibration::Analytic,
            Some(s) => Calibration::parse(&s).ok_or_else(|| {
                self.error(format!("argument 'calibration' must be 'analytic' or 'classic', got '{s}'"))
            })?,
        };
        if calibration == Calibration::Classic && epsilon > 1.0 {
            return Err(
                self.error(crate::mechanism::noise::calibration::CalibrationError::ClassicNeedsSmallEpsilon(epsilon))
            );
        }
        Ok(calibration)
    }

    /// A public interval `[lo, hi]` from two parameters (`lo`/`hi` are their names), which the
    /// call or the table's policy must give: never the data.
    pub fn interval(&self, values: &[Option<ScalarValue>], lo: &str, hi: &str, column: &str) -> Result<(f64, f64)> {
        let (a, b) = match (self.float(values, lo)?, self.float(values, hi)?) {
            (Some(a), Some(b)) => (a, b),
            _ => {
                return Err(self.error(format!(
                    "arguments '{lo}' and '{hi}' are required: the output grid must come from public \
                     values, never from the data (add {lo} => …, {hi} => …, or have the data owner set \
                     public bounds for the {column} column in the table's policy)"
                )));
            }
        };
        if !(a.is_finite() && b.is_finite() && a < b) {
            return Err(self.error(format!(
                "arguments '{lo}' and '{hi}' must be finite numbers with {lo} < {hi}, got {lo} = {a}, {hi} = {b}"
            )));
        }
        if !ranges::accepts(a, b) {
            return Err(self.error(format!(
                "arguments '{lo}' and '{hi}' must lie {} (every derived length, density and bound is then a \
                 finite double), got {lo} = {a}, {hi} = {b}",
                ranges::rule()
            )));
        }
        Ok((a, b))
    }

    /// A list-of-numbers parameter, if given (NULL elements are an error).
    pub fn float_list(&self, values: &[Option<ScalarValue>], name: &str) -> Result<Option<Vec<f64>>> {
        let bad = |v: &dyn std::fmt::Display| {
            self.error(format!("argument '{name}' must be a list of numbers such as [0.25, 0.5, 0.75], got {v}"))
        };
        let v = match values.get(self.index(name)).cloned().flatten() {
            None => return Ok(None),
            Some(v) => v,
        };
        let list = match v.cast_to(&DataType::new_list(DataType::Float64, true)) {
            Ok(ScalarValue::List(l)) if l.len() == 1 && !l.is_null(0) => l,
            _ => return Err(bad(&v)),
        };
        let items = list.value(0);
        let items = items.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        if items.null_count() > 0 {
            return Err(bad(&v));
        }
        Ok(Some(items.values().to_vec()))
    }

    /// A boolean parameter, if given.
    pub fn boolean(&self, values: &[Option<ScalarValue>], name: &str) -> Result<Option<bool>> {
        match values.get(self.index(name)).cloned().flatten() {
            None => Ok(None),
            Some(ScalarValue::Boolean(Some(b))) => Ok(Some(b)),
            Some(v) => Err(self.error(format!("argument '{name}' must be true or false, got {v}"))),
        }
    }
}

/// The value of a logical literal, looking through casts the analyzer inserted.
fn logical_literal(e: &Expr) -> Option<ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v.clone()),
        Expr::Cast(Cast { expr, field }) => logical_literal(expr)?.cast_to(field.data_type()).ok(),
        Expr::Alias(a) => logical_literal(&a.expr),
        Expr::Negative(inner) => logical_literal(inner)?.arithmetic_negate().ok(),
        _ => None,
    }
}
