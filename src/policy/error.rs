//! The catalog's and ledger's errors.

use std::fmt;

use crate::mechanism::noise::budget::Budget;

/// Errors of the catalog and ledger. None carries private data: everything in them is
/// table names, public parameters and budget amounts.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyError {
    /// The file cannot be used as a catalog (missing, corrupt, wrong format or version).
    Catalog(String),
    /// A request about tables or policies that cannot be carried out.
    Invalid(String),
    /// The budget does not cover a query; nothing was debited.
    BudgetExhausted {
        /// The table whose budget is too small.
        table: String,
        /// Set when it is this analyst's share of the table that is too small.
        analyst: Option<String>,
        /// What the query would cost on that table.
        cost: Budget,
        /// What is left on that table.
        remaining: Budget,
    },
    /// The analyst was granted no share of the table; nothing was debited.
    NoShare {
        /// The table.
        table: String,
        /// The analyst.
        analyst: String,
    },
    /// SQLite failed (I/O, locking).
    Storage(String),
    /// A bearer token or analyst that does not authenticate (the message never says which part
    /// was wrong).
    Unauthenticated(String),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Catalog(m) | PolicyError::Invalid(m) => f.write_str(m),
            PolicyError::BudgetExhausted { table, analyst: None, cost, remaining } => write!(
                f,
                "privacy budget exhausted on table '{table}': this query costs {cost} but only {remaining} \
                 remains; nothing was read (a data owner can raise the budget)"
            ),
            PolicyError::BudgetExhausted { table, analyst: Some(a), cost, remaining } => write!(
                f,
                "analyst '{a}' has exhausted their share of table '{table}': this query costs {cost} but only \
                 {remaining} remains of the share; nothing was read (the data owner can grant more)"
            ),
            PolicyError::NoShare { table, analyst } => write!(
                f,
                "analyst '{analyst}' has no share of table '{table}': nothing was read (the data owner grants one \
                 with `dpcurve admin grant {analyst} {table} --epsilon E --delta D`)"
            ),
            PolicyError::Storage(m) => write!(f, "catalog storage error: {m}"),
            PolicyError::Unauthenticated(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for PolicyError {}

/// A SQLite failure as a catalog storage error.
pub(super) fn storage(e: rusqlite::Error) -> PolicyError {
    PolicyError::Storage(e.to_string())
}
