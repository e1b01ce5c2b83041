//! Analysts' shares of private tables' budgets: what a grant is, and the checks and debits a
//! charge makes inside its transaction.

use rusqlite::{OptionalExtension, Transaction, params};

use super::error::{PolicyError, storage};
use crate::mechanism::noise::budget::Budget;

/// An analyst's share of one private table.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The private table.
    pub table: String,
    /// The share the data owner granted.
    pub total: Budget,
    /// What the analyst spent of it.
    pub spent: Budget,
}

impl Grant {
    /// What is left of the share (never negative: a share lowered below what was spent is
    /// exhausted).
    pub fn remaining(&self) -> Budget {
        self.total.checked_sub(&self.spent).unwrap_or(Budget::ZERO)
    }
}

/// Refuses unless `name` is an analyst who was not removed (inside a charge's transaction).
pub(super) fn require_active(tx: &Transaction<'_>, name: &str) -> Result<(), PolicyError> {
    let active: Option<bool> = tx
        .query_row("SELECT token_hash IS NOT NULL FROM analysts WHERE name = ?1", [name], |r| r.get(0))
        .optional()
        .map_err(storage)?;
    match active {
        Some(true) => Ok(()),
        _ => Err(PolicyError::Unauthenticated(format!("analyst '{name}' was removed or does not exist"))),
    }
}

/// Checks that `analyst`'s share of `table` covers `cost` and debits it (inside a charge's
/// transaction, which the caller commits or rolls back as a whole).
pub(super) fn debit_share(tx: &Transaction<'_>, analyst: &str, table: &str, cost: Budget) -> Result<(), PolicyError> {
    let row: Option<(i64, i64, i64, i64)> = tx
        .query_row(
            "SELECT epsilon_total, delta_total, epsilon_spent, delta_spent FROM grants
             WHERE analyst = ?1 AND table_name = ?2",
            params![analyst, table],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()
        .map_err(storage)?;
    let Some((et, dt, es, ds)) = row else {
        return Err(PolicyError::NoShare { table: table.to_string(), analyst: analyst.to_string() });
    };
    let grant = Grant {
        table: table.to_string(),
        total: Budget { epsilon_units: et, delta_units: dt },
        spent: Budget { epsilon_units: es, delta_units: ds },
    };
    let remaining = grant.remaining();
    if !cost.fits_within(&remaining) {
        return Err(PolicyError::BudgetExhausted {
            table: table.to_string(),
            analyst: Some(analyst.to_string()),
            cost,
            remaining,
        });
    }
    let new = grant.spent.checked_add(&cost).expect("fits within the share");
    tx.execute(
        "UPDATE grants SET epsilon_spent = ?3, delta_spent = ?4 WHERE analyst = ?1 AND table_name = ?2",
        params![analyst, table, new.epsilon_units, new.delta_units],
    )
    .map_err(storage)?;
    Ok(())
}
