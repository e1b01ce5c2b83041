//! Pass: total, cheap expressions only on private rows (SPEC §5.1, rule `total-expressions-only`).
//!
//! Everything evaluated on a private row before its release — filters (also those pushed into
//! the scan), projections, the arguments and `FILTER (WHERE …)` of a private aggregate, grouping
//! expressions — is chosen by the analyst and evaluated on private values, and whether the query
//! fails and how long it takes are observable. So, after the optimizer and before pricing, the
//! guard rewrites and checks every such expression:
//!
//! * **Rewrites** to the total form the user meant: `CAST` → `TRY_CAST` (a value that does not
//!   convert becomes NULL instead of failing the query); integer `/` and `%` → [`TotalIntDiv`]
//!   (NULL when the divisor is 0, wrapping like `+ − *` for `MIN / -1`).
//! * **Allowlist**: column references, literals, comparisons, `AND`/`OR`/`NOT`, `IS [NOT] NULL`
//!   and friends, `CASE`, `IN (…)`, `BETWEEN`, `LIKE`/`ILIKE` and `~` with literal patterns
//!   (compiled at planning by the same code that runs them), float arithmetic, integer `+ − *`
//!   (wrapping), bitwise `& | ^`, `||`, `TRY_CAST` between scalar types, and the functions of
//!   [`FUNCTIONS`] (each checked to be total on extreme inputs by `tests/total_expressions.rs`).
//!   Everything else is refused, naming the rule and the offending function or operator.
//! * **Cost bound**: every value of a row counts one unit (literals one unit per KiB); a
//!   function costs the size of its inputs and produces at most a known multiple of it. The
//!   sum over all expressions on private rows must stay ≤ [`COST_LIMIT`] units, so no
//!   expression can amplify the time one row takes (nested `concat` through projections,
//!   megabyte literals, …).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Scalar, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, Result, ScalarValue, plan_err};
use datafusion::logical_expr::expr::{AggregateFunction, Alias, ScalarFunction};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    BinaryExpr, Cast, ColumnarValue, Expr, ExprSchemable, Like, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF,
    TryCast,
};

use crate::functions::is_private;
use crate::guard::checking::Checking;
use crate::guard::ops::eager::eager;
use crate::guard::ops::total_div::TotalIntDiv;
use crate::guard::walk::private_aggregate;

/// Most units (one per value of a row, one per KiB of literal) the expressions evaluated on
/// one private row may cost.
pub const COST_LIMIT: u64 = 1024;

/// Longest string literal (bytes) in an expression on private rows; longer ones are refused
/// (they would make a row's cost depend on the analyst's literal, not on the row).
pub const LITERAL_LIMIT: usize = 64 * 1024;

/// How a function on the allowlist may be called and what it costs.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// Total for all argument types; output no larger than the largest argument.
    Any,
    /// Numeric: every argument must be a float (or a literal); output one unit.
    Float,
    /// Linear in its string arguments; output at most `k` times the largest argument.
    Text(u64),
    /// Output is the sum of its arguments (`concat`).
    Concat,
    /// Arguments after the first must be literals accepted by the function's validator.
    LiteralTail(fn(&str, &[ScalarValue]) -> Option<String>),
    /// `date_part(part, value)`: a literal part, validated at planning by running the
    /// function once; the value a date or timestamp.
    DatePart,
}

/// The functions allowed on private rows. Names are DataFusion's canonical names (aliases
/// such as `pow`, `char_length`, `instr` resolve to these).
pub const FUNCTIONS: &[(&str, Rule)] = &[
    // conditional
    ("coalesce", Rule::Any),
    ("nullif", Rule::Any),
    ("nvl", Rule::Any),
    ("nvl2", Rule::Any),
    ("greatest", Rule::Any),
    ("least", Rule::Any),
    // floating-point math (integers are cast to DOUBLE by the planner for most of these)
    ("abs", Rule::Float),
    ("acos", Rule::Float),
    ("acosh", Rule::Float),
    ("asin", Rule::Float),
    ("asinh", Rule::Float),
    ("atan", Rule::Float),
    ("atan2", Rule::Float),
    ("atanh", Rule::Float),
    ("cbrt", Rule::Float),
    ("ceil", Rule::Float),
    ("cos", Rule::Float),
    ("cosh", Rule::Float),
    ("cot", Rule::Float),
    ("degrees", Rule::Float),
    ("exp", Rule::Float),
    ("floor", Rule::Float),
    ("isnan", Rule::Float),
    ("iszero", Rule::Float),
    ("ln", Rule::Float),
    ("log", Rule::Float),
    ("log10", Rule::Float),
    ("log2", Rule::Float),
    ("nanvl", Rule::Float),
    ("power", Rule::Float),
    ("radians", Rule::Float),
    ("round", Rule::LiteralTail(round_digits)),
    ("signum", Rule::Float),
    ("sin", Rule::Float),
    ("sinh", Rule::Float),
    ("tan", Rule::Float),
    ("tanh", Rule::Float),
    ("trunc", Rule::LiteralTail(round_digits)),
    // strings: linear time, bounded output
    ("lower", Rule::Text(3)),
    ("upper", Rule::Text(3)),
    ("initcap", Rule::Text(3)),
    ("character_length", Rule::Text(1)),
    ("octet_length", Rule::Text(1)),
    ("bit_length", Rule::Text(1)),
    ("starts_with", Rule::Text(1)),
    ("ends_with", Rule::Text(1)),
    ("strpos", Rule::Text(1)),
    ("contains", Rule::Text(1)),
    ("reverse", Rule::Text(1)),
    ("ascii", Rule::Text(1)),
    ("concat", Rule::Concat),
    ("concat_ws", Rule::Concat),
    ("btrim", Rule::LiteralTail(any_literal)),
    ("ltrim", Rule::LiteralTail(any_literal)),
    ("rtrim", Rule::LiteralTail(any_literal)),
    ("substr", Rule::LiteralTail(substr_args)),
    ("left", Rule::LiteralTail(count_arg)),
    ("right", Rule::LiteralTail(count_arg)),
    ("split_part", Rule::LiteralTail(split_part_args)),
    // dates and times
    ("date_part", Rule::DatePart),
];

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

fn is_decimal(t: &DataType) -> bool {
    matches!(t, DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..))
}

fn int_literal(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::Int8(Some(x)) => Some(*x as i64),
        ScalarValue::Int16(Some(x)) => Some(*x as i64),
        ScalarValue::Int32(Some(x)) => Some(*x as i64),
        ScalarValue::Int64(Some(x)) => Some(*x),
        ScalarValue::UInt8(Some(x)) => Some(*x as i64),
        ScalarValue::UInt16(Some(x)) => Some(*x as i64),
        ScalarValue::UInt32(Some(x)) => Some(*x as i64),
        ScalarValue::UInt64(Some(x)) => i64::try_from(*x).ok(),
        _ => None,
    }
}

/// Largest count/position a string function may be given (1 Mi characters).
const COUNT_LIMIT: i64 = 1 << 20;

fn any_literal(_f: &str, _args: &[ScalarValue]) -> Option<String> {
    None
}

fn round_digits(f: &str, args: &[ScalarValue]) -> Option<String> {
    match args.first().map(int_literal) {
        None => None,
        Some(Some(d)) if (-400..=400).contains(&d) => None,
        _ => Some(format!("{f}: the number of digits must be an integer literal in [-400, 400]")),
    }
}

fn substr_args(f: &str, args: &[ScalarValue]) -> Option<String> {
    let start = args.first().and_then(int_literal);
    let len = args.get(1).map(int_literal);
    match (start, len) {
        (Some(s), None) if s.abs() <= COUNT_LIMIT => None,
        (Some(s), Some(Some(n))) if s.abs() <= COUNT_LIMIT && (0..=COUNT_LIMIT).contains(&n) => None,
        _ => Some(format!(
            "{f}: the start must be an integer literal in [-{COUNT_LIMIT}, {COUNT_LIMIT}] and the length an \
             integer literal in [0, {COUNT_LIMIT}]"
        )),
    }
}

fn count_arg(f: &str, args: &[ScalarValue]) -> Option<String> {
    match args.first().and_then(int_literal) {
        Some(n) if (0..=COUNT_LIMIT).contains(&n) => None,
        _ => Some(format!("{f}: the count must be an integer literal in [0, {COUNT_LIMIT}]")),
    }
}

fn split_part_args(f: &str, args: &[ScalarValue]) -> Option<String> {
    let delim_ok = matches!(args.first(), Some(v) if !v.is_null());
    match args.get(1).and_then(int_literal) {
        Some(n) if delim_ok && n != 0 && n.abs() <= COUNT_LIMIT => None,
        _ => Some(format!(
            "{f}: the delimiter must be a string literal and the field an integer literal in \
             [-{COUNT_LIMIT}, {COUNT_LIMIT}] other than 0"
        )),
    }
}

/// The refusal every check raises.
fn refuse<T>(table: &str, what: &str, why: &str) -> Result<T> {
    plan_err!(
        "[rule total-expressions-only] {what} cannot be evaluated on rows of private table '{table}': {why}. \
         Only total, cheap expressions may run on private rows (comparisons, AND/OR/NOT, CASE, IN, BETWEEN, \
         LIKE with a literal pattern, arithmetic on floats, integer + - * / %, TRY_CAST and the functions \
         listed in the README)"
    )
}

/// The pass: every expression on private rows checked and rewritten to its total form.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    cx.rewrite(make_total)
}

/// Rewrites one expression to its total form (see the module documentation).
fn rewrite(expr: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    expr.transform_up(|e| match e {
        Expr::Cast(Cast { expr, field }) => {
            Ok(Transformed::yes(Expr::TryCast(TryCast::new(expr, field.data_type().clone()))))
        }
        Expr::BinaryExpr(BinaryExpr { left, op: op @ (Operator::Divide | Operator::Modulo), right }) => {
            let (lt, rt) = (left.get_type(schema)?, right.get_type(schema)?);
            if !(lt.is_integer() && rt.is_integer()) {
                return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })));
            }
            let t = Expr::BinaryExpr(BinaryExpr { left: left.clone(), op, right: right.clone() }).get_type(schema)?;
            let cast = |e: Box<Expr>, from: &DataType| {
                if *from == t { *e } else { Expr::TryCast(TryCast::new(e, t.clone())) }
            };
            let udf = Arc::new(ScalarUDF::new_from_impl(TotalIntDiv::new(op == Operator::Modulo)));
            Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
                udf,
                vec![cast(left, &lt), cast(right, &rt)],
            ))))
        }
        other => Ok(Transformed::no(other)),
    })
}

/// The checker of one chain: the private table's name, output sizes of the columns seen so
/// far, and the cost accumulated.
struct Checker<'a> {
    table: &'a str,
    sizes: HashMap<String, u64>,
    cost: u64,
}

/// The text of a string scalar.
fn scalar_str(v: &ScalarValue) -> Option<&str> {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => Some(s),
        _ => None,
    }
}

/// States of the automaton the regular expression engine builds for `pattern` (a Thompson NFA,
/// the structure its matchers walk); a pattern that does not compile counts as the limit.
fn automaton_states(pattern: &str, case_insensitive: bool) -> u64 {
    use regex_automata::nfa::thompson::NFA;
    let syntax = regex_automata::util::syntax::Config::new().case_insensitive(case_insensitive);
    match NFA::compiler().syntax(syntax).build(pattern) {
        Ok(nfa) => nfa.states().len().max(1) as u64,
        Err(_) => COST_LIMIT + 1,
    }
}

fn literal_units(v: &ScalarValue) -> u64 {
    let len = match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => s.len(),
        ScalarValue::Binary(Some(b)) | ScalarValue::LargeBinary(Some(b)) | ScalarValue::BinaryView(Some(b)) => b.len(),
        _ => 0,
    };
    1 + (len / 1024) as u64
}

fn literal_value(e: &Expr) -> Option<&ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v),
        Expr::Alias(Alias { expr, .. }) => literal_value(expr),
        _ => None,
    }
}

fn literal_str(e: &Expr) -> Option<&str> {
    match literal_value(e)? {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => Some(s),
        _ => None,
    }
}

/// Whether a cast between these types cannot fail in `TRY_CAST` (safe) mode: scalar types
/// only (numbers, booleans, strings, dates, timestamps) and lists of numbers, but not dates or
/// timestamps to strings (`tests/hostile_sql.rs` found those fail on extreme values).
fn castable(from: &DataType, to: &DataType) -> bool {
    fn scalar(t: &DataType) -> bool {
        t.is_numeric()
            || matches!(
                t,
                DataType::Boolean
                    | DataType::Utf8
                    | DataType::LargeUtf8
                    | DataType::Utf8View
                    | DataType::Date32
                    | DataType::Date64
                    | DataType::Timestamp(..)
                    | DataType::Null
            )
    }
    fn numeric_list(t: &DataType) -> bool {
        match t {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                f.data_type().is_numeric() || numeric_list(f.data_type())
            }
            _ => false,
        }
    }
    let temporal = |t: &DataType| matches!(t, DataType::Date32 | DataType::Date64 | DataType::Timestamp(..));
    let string = |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    // Dates and timestamps outside chrono's range fail to format even in TRY_CAST mode.
    if temporal(from) && string(to) {
        return false;
    }
    // …and so do second/milli/microsecond timestamps to dates.
    if matches!(from, DataType::Timestamp(u, _) if *u != datafusion::arrow::datatypes::TimeUnit::Nanosecond)
        && matches!(to, DataType::Date32 | DataType::Date64)
    {
        return false;
    }
    (scalar(from) && scalar(to)) || (numeric_list(from) && numeric_list(to))
}

impl Checker<'_> {
    fn charge(&mut self, units: u64) -> Result<()> {
        self.cost = self.cost.saturating_add(units);
        if self.cost > COST_LIMIT {
            return refuse(
                self.table,
                "this query",
                &format!(
                    "the expressions on each private row would cost more than {COST_LIMIT} units (one unit per \
                     value of the row, per KiB of literal and per step that copies them)"
                ),
            );
        }
        Ok(())
    }

    fn all(&mut self, es: &[Expr], schema: &DFSchema) -> Result<Vec<u64>> {
        es.iter().map(|e| self.check(e, schema)).collect()
    }

    /// Checks `e` and returns the size bound (units) of its value.
    fn check(&mut self, e: &Expr, schema: &DFSchema) -> Result<u64> {
        let t = self.table;
        let size = match e {
            Expr::Column(c) => *self.sizes.get(&c.name).unwrap_or(&1),
            Expr::Literal(v, _) => {
                let units = literal_units(v);
                if let Some(s) = literal_str(e).filter(|s| s.len() > LITERAL_LIMIT) {
                    return refuse(
                        t,
                        "a string literal",
                        &format!("it has {} bytes (at most {LITERAL_LIMIT})", s.len()),
                    );
                }
                units
            }
            Expr::Alias(a) => self.check(&a.expr, schema)?,
            Expr::Not(x)
            | Expr::IsNull(x)
            | Expr::IsNotNull(x)
            | Expr::IsTrue(x)
            | Expr::IsFalse(x)
            | Expr::IsUnknown(x)
            | Expr::IsNotTrue(x)
            | Expr::IsNotFalse(x)
            | Expr::IsNotUnknown(x) => {
                self.check(x, schema)?;
                1
            }
            Expr::Negative(x) => {
                let xt = x.get_type(schema)?;
                if !(xt.is_integer() || is_float(&xt)) {
                    return refuse(t, "unary minus", &format!("it is allowed on integers and floats, not on {xt}"));
                }
                self.check(x, schema)?
            }
            Expr::BinaryExpr(b) => self.binary(b, schema)?,
            Expr::Like(l) => self.like(l, schema, "LIKE")?,
            Expr::SimilarTo(_) => return refuse(t, "SIMILAR TO", "it compiles a regular expression per value"),
            Expr::Between(b) => {
                let s = self.all(&[(*b.expr).clone(), (*b.low).clone(), (*b.high).clone()], schema)?;
                self.charge(s.iter().sum())?;
                1
            }
            Expr::Case(c) => {
                let mut out = 1;
                if let Some(x) = &c.expr {
                    self.check(x, schema)?;
                }
                for (w, th) in &c.when_then_expr {
                    self.check(w, schema)?;
                    out = out.max(self.check(th, schema)?);
                }
                if let Some(x) = &c.else_expr {
                    out = out.max(self.check(x, schema)?);
                }
                out
            }
            Expr::Cast(c) => {
                // Only reached for casts the rewrite could not turn into TRY_CAST.
                return refuse(t, &format!("CAST to {}", c.field.data_type()), "a CAST can fail; use TRY_CAST");
            }
            Expr::TryCast(c) => {
                let from = c.expr.get_type(schema)?;
                if !castable(&from, c.field.data_type()) {
                    return refuse(
                        t,
                        &format!("TRY_CAST from {from} to {}", c.field.data_type()),
                        "only casts between numbers, booleans, strings, dates and timestamps (and lists of numbers) \
                         are allowed",
                    );
                }
                let s = self.check(&c.expr, schema)?;
                self.charge(s)?;
                s.max(1)
            }
            Expr::InList(l) => {
                let s = self.check(&l.expr, schema)?;
                let mut max_literal = 0;
                for x in &l.list {
                    match literal_value(x) {
                        Some(v) => max_literal = max_literal.max(literal_units(v)),
                        None => {
                            let xs = self.check(x, schema)?;
                            self.charge(s + xs)?;
                        }
                    }
                }
                self.charge(s + max_literal)?;
                1
            }
            Expr::ScalarFunction(f) => self.function(f, schema)?,
            Expr::AggregateFunction(AggregateFunction { func, params }) => {
                if is_private(func) {
                    self.all(&params.args, schema)?;
                    if let Some(f) = &params.filter {
                        self.check(f, schema)?;
                    }
                }
                // Other aggregates over private rows are refused by the shape rules.
                1
            }
            Expr::GroupingSet(_) => {
                return plan_err!(
                    "[rule no-group-by] ROLLUP, CUBE and GROUPING SETS over private table '{t}' are not supported: \
                     group by plain columns with declared keys"
                );
            }
            Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) | Expr::SetComparison(_) => {
                return refuse(t, "a subquery", "subqueries may not be evaluated per private row");
            }
            other => {
                let name = other.variant_name();
                return refuse(t, &format!("expression {name}"), "it is not on the list of total expressions");
            }
        };
        Ok(size)
    }

    fn like(&mut self, l: &Like, schema: &DFSchema, what: &str) -> Result<u64> {
        let t = self.table;
        let Some(pattern) = literal_str(&l.pattern) else {
            return refuse(
                t,
                &format!("{what} with a pattern that is not a string literal"),
                "patterns built from data can fail to compile and cost unbounded time",
            );
        };
        if pattern.len() > 1024 {
            return refuse(t, &format!("{what} pattern"), "patterns are limited to 1024 bytes");
        }
        if l.escape_char.is_some_and(|c| c != '\\') {
            return refuse(t, &format!("{what} … ESCAPE"), "only the default escape character (\\) is supported");
        }
        // Compile it now with the kernel that will run it, so a bad pattern fails at planning
        // whatever the data.
        let probe = StringArray::from(vec!["probe"]);
        let pat = Scalar::new(StringArray::from(vec![pattern]));
        let compiled = if l.case_insensitive {
            datafusion::arrow::compute::kernels::comparison::ilike(&probe, &pat)
        } else {
            datafusion::arrow::compute::kernels::comparison::like(&probe, &pat)
        };
        if let Err(e) = compiled {
            return refuse(t, &format!("{what} '{pattern}'"), &format!("the pattern does not compile: {e}"));
        }
        let s = self.check(&l.expr, schema)?;
        // The matcher may try every pattern position at every string position (`_` runs between
        // `%`s compile to a regular expression): the worst case is the product.
        self.charge(s.saturating_mul(pattern.chars().count().max(1) as u64))?;
        Ok(1)
    }

    fn binary(&mut self, b: &BinaryExpr, schema: &DFSchema) -> Result<u64> {
        use Operator::*;
        let t = self.table;
        let (lt, rt) = (b.left.get_type(schema)?, b.right.get_type(schema)?);
        match b.op {
            Eq | NotEq | Lt | LtEq | Gt | GtEq | IsDistinctFrom | IsNotDistinctFrom | And | Or => {
                let s = self.check(&b.left, schema)? + self.check(&b.right, schema)?;
                self.charge(s)?;
                Ok(1)
            }
            Plus | Minus | Multiply | Divide | Modulo => {
                let ok = |x: &DataType| is_float(x) || (x.is_integer() && !matches!(b.op, Divide | Modulo));
                if !(ok(&lt) && ok(&rt)) {
                    let why = if is_decimal(&lt) || is_decimal(&rt) {
                        "decimal arithmetic can overflow; TRY_CAST to DOUBLE first".to_string()
                    } else {
                        format!("arithmetic is allowed on integers and floats, not on {lt} and {rt}")
                    };
                    return refuse(t, &format!("operator {}", b.op), &why);
                }
                let s = self.check(&b.left, schema)? + self.check(&b.right, schema)?;
                self.charge(s)?;
                Ok(1)
            }
            BitwiseAnd | BitwiseOr | BitwiseXor if lt.is_integer() && rt.is_integer() => {
                let s = self.check(&b.left, schema)? + self.check(&b.right, schema)?;
                self.charge(s)?;
                Ok(1)
            }
            StringConcat => {
                let s = self.check(&b.left, schema)? + self.check(&b.right, schema)?;
                self.charge(s)?;
                Ok(s)
            }
            LikeMatch | ILikeMatch | NotLikeMatch | NotILikeMatch => {
                let l = Like::new(
                    matches!(b.op, NotLikeMatch | NotILikeMatch),
                    b.left.clone(),
                    b.right.clone(),
                    None,
                    matches!(b.op, ILikeMatch | NotILikeMatch),
                );
                self.like(&l, schema, "LIKE")
            }
            RegexMatch | RegexIMatch | RegexNotMatch | RegexNotIMatch => {
                let Some(pattern) = literal_str(&b.right) else {
                    return refuse(
                        t,
                        &format!("operator {} with a pattern that is not a string literal", b.op),
                        "patterns built from data can fail to compile and cost unbounded time",
                    );
                };
                if pattern.len() > 1024 {
                    return refuse(t, &format!("operator {}", b.op), "patterns are limited to 1024 bytes");
                }
                let flag = matches!(b.op, RegexIMatch | RegexNotIMatch).then_some("i");
                let probe = StringArray::from(vec!["probe"]);
                if let Err(e) =
                    datafusion::arrow::compute::kernels::regexp::regexp_is_match_scalar(&probe, pattern, flag)
                {
                    return refuse(t, &format!("pattern '{pattern}'"), &format!("it does not compile: {e}"));
                }
                let s = self.check(&b.left, schema)?;
                // A regular expression's time is at worst the string's size times its automaton's
                // states (`[01]{200}` is 15 bytes but 200 repetitions).
                self.charge(s.saturating_mul(automaton_states(pattern, flag.is_some())))?;
                Ok(1)
            }
            op => refuse(t, &format!("operator {op}"), &format!("it is not total on {lt} and {rt}")),
        }
    }

    fn function(&mut self, f: &ScalarFunction, schema: &DFSchema) -> Result<u64> {
        let t = self.table;
        let name = f.func.name();
        if f.func.inner().is::<TotalIntDiv>() {
            let s: u64 = self.all(&f.args, schema)?.iter().sum();
            self.charge(s)?;
            return Ok(1);
        }
        let Some(&(_, rule)) = FUNCTIONS.iter().find(|(n, _)| *n == name) else {
            return refuse(
                t,
                &format!("function {name}"),
                "it is not on the allowlist of total, cheap functions (it could fail on some values or take time \
                 an analyst can amplify)",
            );
        };
        let sizes = self.all(&f.args, schema)?;
        let total: u64 = sizes.iter().sum();
        let max = sizes.iter().copied().max().unwrap_or(1);
        self.charge(total.max(1))?;
        match rule {
            Rule::Any => Ok(max),
            Rule::Float => {
                for a in &f.args {
                    let at = a.get_type(schema)?;
                    if literal_value(a).is_none() && !is_float(&at) {
                        return refuse(
                            t,
                            &format!("function {name} on {at}"),
                            "numeric functions are allowed on floats only (integer versions can overflow); \
                             TRY_CAST the argument to DOUBLE",
                        );
                    }
                }
                Ok(1)
            }
            Rule::Text(k) => Ok(max.saturating_mul(k)),
            Rule::Concat => Ok(total),
            Rule::LiteralTail(validate) => {
                let mut tail = Vec::new();
                for a in f.args.iter().skip(1) {
                    match literal_value(a) {
                        Some(v) => tail.push(v.clone()),
                        None => {
                            return refuse(
                                t,
                                &format!("function {name}"),
                                "its arguments after the first must be literals",
                            );
                        }
                    }
                }
                if let Some(why) = validate(name, &tail) {
                    return refuse(t, &format!("function {name}"), &why);
                }
                if matches!(name, "btrim" | "ltrim" | "rtrim") {
                    // Each character of the string is looked up in the set: the true cost is the
                    // product of their sizes (a 30 000-character set over a long string took seconds).
                    let set = tail.first().and_then(scalar_str).map_or(1, |s| s.chars().count().max(1) as u64);
                    self.charge(sizes[0].saturating_mul(set))?;
                }
                Ok(max)
            }
            Rule::DatePart => self.date_part(f, schema).map(|()| 1),
        }
    }

    fn date_part(&mut self, f: &ScalarFunction, schema: &DFSchema) -> Result<()> {
        let t = self.table;
        let Some(part) = f.args.first().and_then(literal_value) else {
            return refuse(t, "function date_part", "the part must be a string literal");
        };
        let Some(arg) = f.args.get(1) else { return refuse(t, "function date_part", "it takes two arguments") };
        let at = arg.get_type(schema)?;
        if !matches!(at, DataType::Date32 | DataType::Date64 | DataType::Timestamp(..)) {
            return refuse(t, &format!("date_part on {at}"), "it is allowed on date and timestamp columns");
        }
        let probe = ScalarValue::new_zero(&at).or_else(|_| ScalarValue::try_from(&at))?;
        let probe = probe.to_array_of_size(1)?;
        let args = vec![ColumnarValue::Scalar(part.clone()), ColumnarValue::Array(probe)];
        let arg_fields = vec![
            Arc::new(datafusion::arrow::datatypes::Field::new("part", part.data_type(), true)),
            Arc::new(datafusion::arrow::datatypes::Field::new("value", at.clone(), true)),
        ];
        let return_field = f.func.return_field_from_args(datafusion::logical_expr::ReturnFieldArgs {
            arg_fields: &arg_fields,
            scalar_arguments: &[Some(part), None],
        });
        let ok = return_field.and_then(|rf| {
            f.func.invoke_with_args(ScalarFunctionArgs {
                args,
                arg_fields,
                number_rows: 1,
                return_field: rf,
                config_options: Arc::new(Default::default()),
            })
        });
        if let Err(e) = ok {
            return refuse(t, &format!("date_part({part}, …)"), &format!("the part is not valid: {e}"));
        }
        Ok(())
    }
}

/// Rewrites and checks every expression evaluated on private rows below each private
/// aggregate in `plan` (and its subqueries).
pub fn make_total(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_down_with_subqueries(|node| {
        let Some((_, table)) = private_aggregate(&node) else { return Ok(Transformed::no(node)) };
        let mut checker = Checker { table: &table, sizes: HashMap::new(), cost: 0 };
        let new = chain(node, &mut checker)?;
        Ok(Transformed::new(new, true, TreeNodeRecursion::Jump))
    })
    .map(|t| t.data)
}

/// Rewrites and checks `node` and the row-wise chain below it, bottom up.
fn chain(node: LogicalPlan, checker: &mut Checker) -> Result<LogicalPlan> {
    let row_wise = matches!(
        node,
        LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Aggregate(_)
    );
    let node = if row_wise { node.map_children(|c| chain(c, checker).map(Transformed::yes))?.data } else { node };
    match &node {
        LogicalPlan::TableScan(scan) => {
            for f in scan.projected_schema.fields() {
                checker.sizes.insert(f.name().clone(), 1);
            }
        }
        LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::Aggregate(_) => {}
        LogicalPlan::SubqueryAlias(_) => return node.recompute_schema(),
        _ => return Ok(node), // anything else is left to the shape rules
    }
    // Expressions are typed against the node's input (a scan's filters against its source).
    let schema = match &node {
        LogicalPlan::TableScan(scan) => {
            DFSchema::try_from_qualified_schema(scan.table_name.clone(), &scan.source.schema())?
        }
        other => other.inputs()[0].schema().as_ref().clone(),
    };
    let preserver = NamePreserver::new(&node);
    let node = node
        .map_expressions(|e| {
            let saved = preserver.save(&e);
            let rewritten = rewrite(e, &schema)?;
            Ok(rewritten.update_data(|e| saved.restore(e)))
        })?
        .data;
    let mut out_sizes = Vec::new();
    node.apply_expressions(|e| {
        out_sizes.push(checker.check(e, &schema)?);
        Ok(TreeNodeRecursion::Continue)
    })?;
    if let LogicalPlan::Projection(p) = &node {
        checker.sizes = p.schema.fields().iter().map(|f| f.name().clone()).zip(out_sizes).collect();
    }
    // Checked: now no data-dependent short-circuit — every branch on every row.
    let node = node
        .map_expressions(|e| {
            let saved = preserver.save(&e);
            let rewritten = eager(e, &schema)?;
            Ok(rewritten.update_data(|e| saved.restore(e)))
        })?
        .data;
    node.recompute_schema()
}
