//! No data-dependent short-circuit on private rows (SPEC §0, §5.1).
//!
//! DataFusion evaluates `CASE` branches only on the rows whose condition selects them, and
//! `AND`/`OR` skip (or evaluate on fewer rows) their right side when the left decides. On private
//! rows that lets an analyst choose which rows pay for an expensive expression — `CASE WHEN name =
//! 'alice' THEN <slow> ELSE true END` costs time only when alice is present. So after the guard has
//! checked the expressions below a private aggregate, it rewrites every `CASE`, `AND` and `OR` there
//! into an eager form ([`EagerForm`]: `dpcurve_case`, `dpcurve_and`, `dpcurve_or`), a scalar
//! function whose arguments — every branch — are evaluated on every row of the batch before it
//! picks. `COALESCE`, `NVL` and `NULLIF` reach the physical plan as `CASE` (DataFusion's simplifier
//! rewrites them) or as plain functions, which evaluate all their arguments; `IN (…)` compares one
//! value with a literal list. The values are the same as before (SQL's three-valued logic for
//! `AND`/`OR`; the first true condition's branch, else the `ELSE` branch or NULL, for `CASE`).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::compute::kernels::boolean::{and_kleene, or_kleene};
use datafusion::arrow::compute::kernels::zip::zip;
use datafusion::arrow::compute::prep_null_mask_filter;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result, ScalarValue, plan_err};
use datafusion::logical_expr::expr::{Case, ScalarFunction};
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, Operator, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TryCast, Volatility,
};

/// Which eager form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Form {
    /// `dpcurve_case(cond₁, value₁, …, condₙ, valueₙ, else)`.
    Case,
    /// `dpcurve_and(a, b)` (three-valued).
    And,
    /// `dpcurve_or(a, b)` (three-valued).
    Or,
}

/// A `CASE`, `AND` or `OR` that evaluates every argument on every row (module docs).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct EagerForm {
    form: Form,
    signature: Signature,
}

impl EagerForm {
    /// The function for `form`.
    pub fn new(form: Form) -> Self {
        Self { form, signature: Signature::variadic_any(Volatility::Immutable) }
    }

    /// Which form this is.
    pub fn form(&self) -> Form {
        self.form
    }

    fn call(form: Form, args: Vec<Expr>) -> Expr {
        Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(ScalarUDF::new_from_impl(Self::new(form))), args))
    }
}

impl ScalarUDFImpl for EagerForm {
    fn name(&self) -> &str {
        match self.form {
            Form::Case => "dpcurve_case",
            Form::And => "dpcurve_and",
            Form::Or => "dpcurve_or",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match (self.form, arg_types) {
            (Form::Case, [.., last]) if arg_types.len() % 2 == 1 => Ok(last.clone()),
            (Form::And | Form::Or, [DataType::Boolean | DataType::Null, DataType::Boolean | DataType::Null]) => {
                Ok(DataType::Boolean)
            }
            _ => plan_err!("{}: unexpected arguments {arg_types:?}", self.name()),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        // Every argument as an array of the batch's length (constant branches arrive as scalars).
        let arrays = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<_>>>()?;
        let boolean = |a: &ArrayRef| -> BooleanArray {
            match a.data_type() {
                DataType::Boolean => a.as_boolean().clone(),
                _ => BooleanArray::new_null(a.len()),
            }
        };
        let out: ArrayRef = match self.form {
            Form::And => Arc::new(and_kleene(&boolean(&arrays[0]), &boolean(&arrays[1]))?),
            Form::Or => Arc::new(or_kleene(&boolean(&arrays[0]), &boolean(&arrays[1]))?),
            Form::Case => {
                let (branches, last) = arrays.split_at(arrays.len() - 1);
                let mut out = Arc::clone(&last[0]);
                // From the last branch to the first: the first true condition wins.
                for pair in branches.chunks(2).rev() {
                    let when = boolean(&pair[0]);
                    // NULL conditions do not match (arrow's helper needs a null buffer to clear).
                    let when = if when.null_count() > 0 { prep_null_mask_filter(&when) } else { when };
                    out = zip(&when, &pair[1], &out)?;
                }
                out
            }
        };
        debug_assert_eq!(out.len(), n);
        Ok(ColumnarValue::Array(out))
    }
}

/// Rewrites every `CASE`, `AND` and `OR` in `expr` (typed against `schema`) into its eager form.
pub fn eager(expr: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    expr.transform_up(|e| match e {
        Expr::BinaryExpr(BinaryExpr { left, op: op @ (Operator::And | Operator::Or), right }) => {
            let form = if op == Operator::And { Form::And } else { Form::Or };
            Ok(Transformed::yes(EagerForm::call(form, vec![*left, *right])))
        }
        Expr::Case(case) => {
            let t = Expr::Case(case.clone()).get_type(schema)?;
            let Case { expr: base, when_then_expr, else_expr } = case;
            let typed = |e: Expr| -> Result<Expr> {
                Ok(if e.get_type(schema)? == t { e } else { Expr::TryCast(TryCast::new(Box::new(e), t.clone())) })
            };
            let mut args = Vec::with_capacity(2 * when_then_expr.len() + 1);
            for (when, then) in when_then_expr {
                let cond = match &base {
                    // `CASE x WHEN v`: x = v (NULL never matches).
                    Some(x) => Expr::BinaryExpr(BinaryExpr::new(x.clone(), Operator::Eq, when)),
                    None => *when,
                };
                args.push(cond);
                args.push(typed(*then)?);
            }
            args.push(match else_expr {
                Some(e) => typed(*e)?,
                None => Expr::Literal(ScalarValue::try_from(&t)?, None),
            });
            Ok(Transformed::yes(EagerForm::call(Form::Case, args)))
        }
        other => Ok(Transformed::no(other)),
    })
}

/// A typed NULL array (for tests).
#[cfg(test)]
fn nulls(t: &DataType, n: usize) -> ArrayRef {
    datafusion::arrow::array::new_null_array(t, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::Field;
    use datafusion::config::ConfigOptions;

    fn run(form: Form, args: Vec<ArrayRef>) -> ArrayRef {
        let n = args[0].len();
        let f = EagerForm::new(form);
        let types: Vec<DataType> = args.iter().map(|a| a.data_type().clone()).collect();
        let ret = f.return_type(&types).unwrap();
        let out = f
            .invoke_with_args(ScalarFunctionArgs {
                args: args.into_iter().map(ColumnarValue::Array).collect(),
                arg_fields: types.iter().map(|t| Arc::new(Field::new("a", t.clone(), true))).collect(),
                number_rows: n,
                return_field: Arc::new(Field::new("r", ret, true)),
                config_options: Arc::new(ConfigOptions::default()),
            })
            .unwrap();
        match out {
            ColumnarValue::Array(a) => a,
            ColumnarValue::Scalar(_) => unreachable!(),
        }
    }

    #[test]
    fn eager_forms_give_sql_values() {
        let b = |v: Vec<Option<bool>>| Arc::new(BooleanArray::from(v)) as ArrayRef;
        let l = b(vec![Some(true), Some(true), Some(false), None, None, Some(false)]);
        let r = b(vec![Some(true), None, None, Some(false), Some(true), Some(false)]);
        let and = run(Form::And, vec![Arc::clone(&l), Arc::clone(&r)]);
        assert_eq!(
            and.as_boolean(),
            &BooleanArray::from(vec![Some(true), None, Some(false), Some(false), None, Some(false)])
        );
        let or = run(Form::Or, vec![l, r]);
        assert_eq!(
            or.as_boolean(),
            &BooleanArray::from(vec![Some(true), Some(true), None, None, Some(true), Some(false)])
        );
        // CASE WHEN c1 THEN 1 WHEN c2 THEN 2 ELSE NULL END
        let c1 = b(vec![Some(true), Some(false), None, Some(true)]);
        let c2 = b(vec![Some(true), Some(true), Some(true), None]);
        let one = Arc::new(Int64Array::from(vec![1; 4])) as ArrayRef;
        let two = Arc::new(Int64Array::from(vec![2; 4])) as ArrayRef;
        let out = run(Form::Case, vec![c1, one, c2, two, nulls(&DataType::Int64, 4)]);
        assert_eq!(out.as_ref(), &Int64Array::from(vec![Some(1), Some(2), Some(2), Some(1)]) as &dyn Array);
    }
}
