//! Literal parameters of private aggregates.
//!
//! A private aggregate's first argument is the data; every other argument is a public
//! parameter and must be a literal. The same parser runs twice: on the optimized logical
//! plan at planning time (the check that counts — before any budget is spent or any row
//! is read) and again on the physical expressions when an accumulator is created
//! (defence in depth). Messages name the function, the argument and the allowed range.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result, ScalarValue, plan_datafusion_err};
use datafusion::logical_expr::expr::Cast;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{Expr, Signature, Volatility};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;

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
}

/// One declared argument of a private aggregate.
#[derive(Debug, Clone, Copy)]
pub struct ParamDef {
    /// Name used for named arguments (`name => value`).
    pub name: &'static str,
    /// Its kind.
    pub kind: ParamKind,
}

/// The declared arguments of a private aggregate: the data argument first.
#[derive(Debug, Clone, Copy)]
pub struct FunctionParams {
    /// SQL function name.
    pub function: &'static str,
    /// The data argument's name and whether it takes numbers or lists (for messages).
    pub data: &'static str,
    /// Parameters after the data argument, in positional order.
    pub params: &'static [ParamDef],
    /// How many parameters are required.
    pub required: usize,
}

impl FunctionParams {
    /// All argument names, data argument first.
    pub fn names(&self) -> Vec<String> {
        std::iter::once(self.data.to_string()).chain(self.params.iter().map(|p| p.name.to_string())).collect()
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
        let (min, max) = (1 + self.required, 1 + self.params.len());
        if (min..=max).contains(&n) {
            return Ok(());
        }
        let optional: Vec<&str> = self.params[self.required..].iter().map(|p| p.name).collect();
        let required: Vec<&str> = self.params[..self.required].iter().map(|p| p.name).collect();
        Err(self.error(format!(
            "takes {min} to {max} arguments ({}, {} [, {}]), got {n}",
            self.data,
            required.join(", "),
            optional.join(", ")
        )))
    }

    /// The types DataFusion should cast the arguments to (UDAF `coerce_types`).
    pub fn coerce(
        &self,
        data_type: impl Fn(&DataType) -> Result<DataType>,
        arg_types: &[DataType],
    ) -> Result<Vec<DataType>> {
        self.check_arity(arg_types.len())?;
        let mut out = vec![data_type(&arg_types[0])?];
        for (def, t) in self.params.iter().zip(&arg_types[1..]) {
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
            };
            let want = match def.kind {
                ParamKind::Float => "a number",
                ParamKind::FloatOrAuto => "a number or 'auto'",
                ParamKind::Int => "an integer",
                ParamKind::Str => "a string",
                ParamKind::Bool => "a boolean",
            };
            out.push(ok.ok_or_else(|| self.error(format!("argument '{}' must be {want}, got type {t}", def.name)))?);
        }
        Ok(out)
    }

    /// Extracts the literal parameters from logical argument expressions (planning time).
    /// `None` marks an omitted or NULL parameter.
    pub fn literals_from_logical(&self, args: &[Expr]) -> Result<Vec<Option<ScalarValue>>> {
        self.check_arity(args.len())?;
        args[1..]
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
        exprs[1..]
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
            None => Ok(crate::mechanism::bands::DEFAULT_ALPHA),
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
