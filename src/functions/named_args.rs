//! Named arguments in any combination for the private aggregates.
//!
//! DataFusion resolves `name => value` arguments itself, but only lets *trailing*
//! parameters be omitted: `private_kde(x, 0.1, 1, 1e-6, points => 256)` fails there
//! because `lo` and `hi` (which come before `points`) are missing. This pass runs on the
//! parsed SQL before planning and rewrites each call to a private aggregate into a purely
//! positional call, filling skipped optional parameters with NULL ("use the default").
//! It reports the same mistakes DataFusion does, with the function's name.

use std::ops::ControlFlow;

use datafusion::common::{DataFusionError, Result, plan_datafusion_err};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, Value, visit_expressions_mut,
};

use super::params::FunctionParams;

/// Rewrites the private aggregate calls in a parsed statement (see the module docs).
pub fn normalize_statement(stmt: &mut DFStatement, functions: &[&FunctionParams]) -> Result<()> {
    match stmt {
        DFStatement::Statement(s) => normalize(s.as_mut(), functions),
        DFStatement::Explain(e) => normalize_statement(e.statement.as_mut(), functions),
        _ => Ok(()),
    }
}

fn normalize<V: datafusion::sql::sqlparser::ast::VisitMut>(node: &mut V, functions: &[&FunctionParams]) -> Result<()> {
    let flow = visit_expressions_mut(node, |expr| {
        if let Expr::Function(f) = expr {
            let name = match f.name.0.as_slice() {
                [part] => part.as_ident().map(|i| i.value.to_ascii_lowercase()),
                _ => None,
            };
            if let (Some(name), FunctionArguments::List(list)) = (name, &mut f.args)
                && let Some(params) = functions.iter().find(|p| p.function == name)
                && let Err(e) = reorder(params, &mut list.args)
            {
                return ControlFlow::Break(e);
            }
        }
        ControlFlow::Continue(())
    });
    match flow {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

fn arg_name(arg: &FunctionArg) -> Option<&Ident> {
    match arg {
        FunctionArg::Named { name, .. } => Some(name),
        FunctionArg::ExprNamed { name: Expr::Identifier(name), .. } => Some(name),
        _ => None,
    }
}

fn reorder(params: &FunctionParams, args: &mut Vec<FunctionArg>) -> Result<(), DataFusionError> {
    if args.iter().all(|a| arg_name(a).is_none()) {
        return Ok(());
    }
    let names = params.names();
    let mut slots: Vec<Option<FunctionArgExpr>> = vec![None; names.len()];
    let mut seen_named = false;
    for (i, arg) in std::mem::take(args).into_iter().enumerate() {
        let (slot, value) = match arg {
            FunctionArg::Unnamed(value) => {
                if seen_named {
                    return Err(plan_datafusion_err!(
                        "{}: positional argument at position {i} follows a named argument; \
                         all positional arguments must come first",
                        params.function
                    ));
                }
                if i >= names.len() {
                    return Err(params.error(format!("too many arguments: at most {}", names.len())));
                }
                (i, value)
            }
            FunctionArg::Named { name, arg, .. } | FunctionArg::ExprNamed { name: Expr::Identifier(name), arg, .. } => {
                seen_named = true;
                let found = names.iter().position(|n| match name.quote_style {
                    Some(_) => n == &name.value,
                    None => n.eq_ignore_ascii_case(&name.value),
                });
                let Some(slot) = found else {
                    return Err(params.error(format!(
                        "unknown argument name '{}'; valid names are: {}",
                        name.value,
                        names.join(", ")
                    )));
                };
                if slots[slot].is_some() {
                    return Err(params.error(format!("argument '{}' is given more than once", names[slot])));
                }
                (slot, arg)
            }
            FunctionArg::ExprNamed { name, .. } => {
                return Err(params.error(format!("invalid argument name {name}")));
            }
        };
        slots[slot] = Some(value);
    }
    let last = slots.iter().rposition(|s| s.is_some()).unwrap_or(0);
    for (slot, name) in slots.iter().zip(&names).take(params.required + params.data_len()) {
        if slot.is_none() {
            return Err(params.error(format!("missing required argument '{name}'")));
        }
    }
    *args = slots
        .into_iter()
        .take(last + 1)
        .map(|s| FunctionArg::Unnamed(s.unwrap_or_else(|| FunctionArgExpr::Expr(Expr::Value(Value::Null.into())))))
        .collect();
    Ok(())
}
