//! SQL text to statements, safely: the one entry point every front end's SQL goes through.
//!
//! A statement's syntax tree can be as deep as its text is long: `1 + 1 + … + 1`, an `OR` or
//! `||` chain, or a chain of `UNION`s parses into a left-deep tree without hitting the parser's
//! nesting limit, and every later step — planning, the guard, evaluation, even dropping the
//! tree — recurses over it. A 40 KB statement used to overflow the stack and abort the process
//! before the guard saw it. So parsing runs on a thread of its own with a large stack, and a
//! statement whose expressions nest deeper than [`MAX_DEPTH`] (or whose query combines more than
//! [`MAX_DEPTH`] set operations) is refused there, before anything else sees it, with a planning
//! error. What passes is shallow enough for every later step on an ordinary thread.

use std::collections::VecDeque;
use std::ops::ControlFlow;

use datafusion::common::{DataFusionError, Result};
use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::ast::{Expr, Query, SetExpr, Value, Visit, Visitor};
use datafusion::sql::sqlparser::dialect::GenericDialect;

use crate::functions::{all_params, named_args};

/// The refusal of a statement with `?` / `$1` placeholders.
pub const NO_PARAMETERS: &str = "bound parameters are not supported: write values as SQL literals (dpcurve's privacy \
                                 parameters must be literals, checked at planning)";

/// Deepest nesting of expressions (and longest chain of UNION/INTERSECT/EXCEPT) a statement may have.
pub const MAX_DEPTH: usize = 256;

/// Stack of the parsing thread: room for the deepest tree the parser can build from text of
/// any length a client can send (about 200 bytes of stack per level when it is dropped).
const PARSE_STACK: usize = 1 << 30;

/// Parses `sql` into statements, normalises the private functions' named arguments, and refuses
/// statements nested deeper than [`MAX_DEPTH`] (module docs).
pub fn parse(sql: &str) -> Result<VecDeque<Statement>> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("dpcurve-parse".into())
            .stack_size(PARSE_STACK)
            .spawn_scoped(s, || parse_here(sql))
            .map_err(|e| DataFusionError::Execution(format!("could not start the SQL parser: {e}")))?
            .join()
            .unwrap_or_else(|_| Err(DataFusionError::Internal("the SQL parser panicked".into())))
    })
}

/// The SHA-256 (hex) under which the ledger records `sql`, one statement: that of its parsed,
/// normalised form (so `dpcurve.releases.statement_sha256` can be matched by any client that
/// asks this, whatever the layout of its text).
pub fn statement_sha256(sql: &str) -> Result<String> {
    let statements = parse(sql)?;
    match statements.len() {
        1 => Ok(crate::policy::QueryRecord::of(&statements[0].to_string()).sha256_hex()),
        n => Err(DataFusionError::Plan(format!("statement_sha256 takes one statement, this text has {n}"))),
    }
}

/// [`parse`], on the calling thread.
fn parse_here(sql: &str) -> Result<VecDeque<Statement>> {
    let mut statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
    for (i, stmt) in statements.iter().enumerate() {
        let mut depth = Depth::default();
        let too_deep = match stmt {
            Statement::Statement(s) => s.visit(&mut depth).is_break(),
            Statement::Explain(e) => match e.statement.as_ref() {
                Statement::Statement(s) => s.visit(&mut depth).is_break(),
                _ => false,
            },
            _ => false,
        };
        if depth.placeholder {
            drop(statements);
            return Err(DataFusionError::Plan(format!("statement {}: {NO_PARAMETERS}", i + 1)));
        }
        if too_deep {
            // Dropped here, on the large stack.
            drop(statements);
            return Err(DataFusionError::Plan(format!(
                "statement {}: expressions nest deeper than {MAX_DEPTH} levels (a chain of {MAX_DEPTH} `+`, `OR`, \
                 `||` or UNIONs, for example): split the statement or use IN (…) / a CASE instead",
                i + 1
            )));
        }
    }
    let params = all_params();
    for stmt in statements.iter_mut() {
        named_args::normalize_statement(stmt, &params)?;
    }
    Ok(statements)
}

/// Tracks how deep the visitor is in nested expressions; breaks past [`MAX_DEPTH`].
#[derive(Default)]
struct Depth {
    now: usize,
    /// A `?` or `$n` placeholder was seen.
    placeholder: bool,
}

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if let Expr::Value(v) = expr
            && matches!(v.value, Value::Placeholder(_))
        {
            self.placeholder = true;
            return ControlFlow::Break(());
        }
        self.now += 1;
        if self.now > MAX_DEPTH { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }

    fn post_visit_expr(&mut self, _expr: &Expr) -> ControlFlow<()> {
        self.now -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        // Set operations chain left-deep without nesting expressions.
        let mut chain = 0;
        let mut body = query.body.as_ref();
        while let SetExpr::SetOperation { left, .. } = body {
            chain += 1;
            if chain > MAX_DEPTH {
                return ControlFlow::Break(());
            }
            body = left.as_ref();
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_chains_are_refused_and_shallow_ones_pass() {
        for (n, ok) in [(100, true), (MAX_DEPTH - 2, true), (MAX_DEPTH + 2, false), (100_000, false)] {
            let plus = format!("SELECT {}", vec!["1"; n].join(" + "));
            let ors = format!("SELECT * FROM t WHERE {}", vec!["x = 1"; n].join(" OR "));
            let cat = format!("SELECT {}", vec!["'a'"; n].join(" || "));
            let unions = vec!["SELECT 1"; n].join(" UNION ALL ");
            for sql in [plus, ors, cat, unions] {
                let r = parse(&sql);
                assert_eq!(r.is_ok(), ok, "{n} terms: {:?}", r.err());
                if !ok {
                    let e = r.unwrap_err().to_string();
                    assert!(e.contains("nest deeper than 256"), "{e}");
                }
            }
        }
    }

    #[test]
    fn placeholders_are_refused_with_the_documented_message() {
        for sql in ["SELECT ?", "SELECT x FROM t WHERE x > $1", "SELECT private_kde(x, ?, 1, 0) FROM t"] {
            let e = parse(sql).unwrap_err().to_string();
            assert!(e.contains("bound parameters are not supported"), "{sql}: {e}");
        }
        assert!(parse("SELECT '?' AS q").is_ok(), "a question mark in a string is no placeholder");
    }
}
