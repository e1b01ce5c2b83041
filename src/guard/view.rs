//! The policy as the guard sees it: each private table's public bounds, curve length, declared
//! group keys and privacy unit, and what they make of one aggregate — how it is grouped, the
//! partition selection it asks for, the contribution bound of its unit. Imports only [`super::walk`].

use std::collections::BTreeMap;

use datafusion::common::{DataFusionError, Result, ScalarValue, plan_err};
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable};

use super::walk::{aggregate_call, trace_column};
use crate::functions::params_of;
use crate::mechanism::Contribution;
use crate::mechanism::noise::budget::Budget;
use crate::policy::{Catalog, PrivacyUnit};

/// Public bounds per (private table, column).
pub type BoundsMap = BTreeMap<(String, String), (f64, f64)>;

/// Declared keys per (private table, column).
pub type KeysMap = BTreeMap<(String, String), Vec<String>>;

/// Private tables with a privacy unit: table → unit and bounds.
pub type UnitsMap = BTreeMap<String, PrivacyUnit>;

/// Most groups (product of the declared keys of the grouping columns) one aggregate may have.
pub const MAX_GROUPS: usize = 100_000;

/// Released groups per call when `select_max_groups` is not given.
pub const DEFAULT_MAX_GROUPS: u64 = 1000;

/// The function name of a partition selection's charge in the ledger.
pub const SELECTION_CHARGE: &str = "partition_selection";

/// What the policies of the catalog's private tables supply.
#[derive(Debug, Clone, Default)]
pub struct PolicyView {
    /// Column bounds.
    pub bounds: BoundsMap,
    /// Public curve length per table.
    pub curve_length: BTreeMap<String, i64>,
    /// Declared public group keys per (table, column).
    pub keys: KeysMap,
    /// Private tables with a privacy unit.
    pub units: UnitsMap,
    /// Every table: (name, location, its declared row bound if private; None if public).
    pub row_bounds: Vec<(String, String, Option<Option<u64>>)>,
}

impl PolicyView {
    /// The policies of `catalog`'s private tables (an empty view without a catalog).
    pub fn of(catalog: Option<&Catalog>) -> Result<Self> {
        let mut view = Self::default();
        let Some(catalog) = catalog else { return Ok(view) };
        for t in catalog.tables().map_err(|e| DataFusionError::Plan(e.to_string()))? {
            view.row_bounds.push((t.name.clone(), t.location.clone(), t.policy.as_ref().map(|p| p.row_bound)));
            let Some(policy) = t.policy else { continue };
            if let Some(m) = policy.curve_length {
                view.curve_length.insert(t.name.clone(), m);
            }
            for (col, b) in policy.bounds {
                view.bounds.insert((t.name.clone(), col), b);
            }
            for (col, k) in policy.keys {
                view.keys.insert((t.name.clone(), col), k);
            }
            if let Some(u) = policy.unit {
                view.units.insert(t.name.clone(), u);
            }
        }
        Ok(view)
    }
}

/// How a private aggregate over a private table is grouped.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupMode {
    /// No GROUP BY.
    Ungrouped,
    /// Plain columns with declared keys: the typed keys of each column.
    Declared(Vec<Vec<ScalarValue>>),
    /// Plain columns of the table, none with declared keys: groups only through DP partition
    /// selection (SPEC §7).
    Private,
}

impl GroupMode {
    /// How many groups the aggregate may release: 1 ungrouped, the declared combinations, or
    /// the selection's cap (None: a GROUP BY over private keys without a selection).
    pub fn most_groups(&self, agg: &Aggregate) -> Result<Option<u64>> {
        Ok(match self {
            GroupMode::Ungrouped => Some(1),
            GroupMode::Declared(cols) => Some(cols.iter().map(|c| c.len() as u64).product()),
            GroupMode::Private => selection_args(agg)?.map(|a| a.max_groups),
        })
    }
}

/// How `agg` over private table `table` is grouped. Refuses expressions, ROLLUP/CUBE/GROUPING
/// SETS, a mix of declared and undeclared columns, and more than [`MAX_GROUPS`] declared groups.
pub fn group_mode(agg: &Aggregate, keys: &KeysMap, table: &str) -> Result<GroupMode> {
    if agg.group_expr.is_empty() {
        return Ok(GroupMode::Ungrouped);
    }
    let mut out = Vec::with_capacity(agg.group_expr.len());
    let mut undeclared = Vec::new();
    let mut groups: usize = 1;
    for g in &agg.group_expr {
        if let Expr::GroupingSet(_) = g {
            return plan_err!(
                "[rule no-group-by] ROLLUP, CUBE and GROUPING SETS over private table '{table}' are not supported: \
                 group by plain columns"
            );
        }
        let what = g.schema_name().to_string();
        let Some(traced) = trace_column(g, &agg.input).filter(|(t, _)| t == table) else {
            return plan_err!(
                "[rule no-group-by] GROUP BY {what} over private table '{table}': only plain columns of the table \
                 can group private rows (with keys the data owner declared public — `dpcurve admin set-keys \
                 {table} COLUMN VALUE…` — or through DP partition selection with select_epsilon => …)"
            );
        };
        let Some(declared) = keys.get(&traced) else {
            undeclared.push(what);
            continue;
        };
        let t = g.get_type(agg.input.schema())?;
        let typed = declared
            .iter()
            .map(|v| {
                ScalarValue::try_from_string(v.clone(), &t)
                    .map_err(|e| DataFusionError::Plan(format!("declared key '{v}' is not a value of {t}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        // Keys are compared in the grouping expression's type: declared keys that become one
        // value there ('01' and '1' as integers, 't' and 'true' as booleans) are one group.
        let mut typed_unique: Vec<ScalarValue> = Vec::with_capacity(typed.len());
        for k in typed {
            if !typed_unique.contains(&k) {
                typed_unique.push(k);
            }
        }
        let typed = typed_unique;
        groups = groups.saturating_mul(typed.len());
        out.push(typed);
    }
    if !undeclared.is_empty() {
        if !out.is_empty() {
            return plan_err!(
                "[rule no-group-by] GROUP BY over private table '{table}' mixes columns with declared keys and \
                 columns without ({}): group by declared columns only, or by undeclared ones only (partition \
                 selection)",
                undeclared.join(", ")
            );
        }
        return Ok(GroupMode::Private);
    }
    if groups > MAX_GROUPS {
        return plan_err!(
            "[rule no-group-by] this GROUP BY over private table '{table}' has {groups} declared groups (the \
             product of the keys of its columns); at most {MAX_GROUPS}"
        );
    }
    Ok(GroupMode::Declared(out))
}

/// All combinations of the columns' keys, in declaration order.
pub fn product(columns: &[Vec<ScalarValue>]) -> Vec<Vec<ScalarValue>> {
    columns.iter().fold(vec![Vec::new()], |acc, keys| {
        acc.iter()
            .flat_map(|prefix| {
                keys.iter().map(move |k| {
                    let mut p = prefix.clone();
                    p.push(k.clone());
                    p
                })
            })
            .collect()
    })
}

/// The partition selection a query asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectionArgs {
    /// What the selection costs (charged in addition to the curves).
    pub cost: Budget,
    /// At most this many groups are released.
    pub max_groups: u64,
}

/// The `select_*` arguments of `agg`'s private calls: None if no call has them; refused if
/// incomplete, out of range, or different between calls.
pub fn selection_args(agg: &Aggregate) -> Result<Option<SelectionArgs>> {
    let mut found: Option<SelectionArgs> = None;
    for e in &agg.aggr_expr {
        let Some(f) = aggregate_call(e) else { continue };
        let Some(p) = params_of(&f.func) else { continue };
        let values = p.literals_from_logical(&f.params.args)?;
        let (eps, delta) = (p.float(&values, "select_epsilon")?, p.float(&values, "select_delta")?);
        let max_groups = p.int(&values, "select_max_groups", (1, MAX_GROUPS as i64))?;
        let args = match (eps, delta) {
            (None, None) if max_groups.is_none() => continue,
            (Some(eps), Some(delta)) => {
                if !(eps.is_finite() && (1e-6..=1000.0).contains(&eps)) || !(delta > 0.0 && delta <= 0.5) {
                    return Err(p.error(format!(
                        "arguments 'select_epsilon' and 'select_delta' must be in [1e-6, 1000] and (0, 0.5], got \
                         {eps} and {delta}"
                    )));
                }
                let cost = Budget::charge(eps, delta).map_err(|e| p.error(e))?;
                SelectionArgs { cost, max_groups: max_groups.map_or(DEFAULT_MAX_GROUPS, |m| m as u64) }
            }
            _ => {
                return Err(p.error(
                    "arguments 'select_epsilon' and 'select_delta' go together (and 'select_max_groups' needs them)",
                ));
            }
        };
        match &found {
            Some(f) if f != &args => {
                return plan_err!(
                    "[rule no-group-by] the private calls of one GROUP BY share one partition selection: give \
                     select_epsilon/select_delta/select_max_groups once, or identically"
                );
            }
            _ => found = Some(args),
        }
    }
    Ok(found)
}

/// The contribution bound of a private aggregate over `unit`'s table: `max_rows` rows per
/// group, and `max_groups` groups (never more than the query can release: 1 ungrouped, the
/// declared groups, or the selection's cap on released groups).
pub fn contribution_for(agg: &Aggregate, unit: &PrivacyUnit, keys: &KeysMap, table: &str) -> Result<Contribution> {
    let most = match group_mode(agg, keys, table) {
        Ok(mode) => mode.most_groups(agg)?.unwrap_or(u64::MAX),
        Err(_) => u64::MAX, // refused by the shape rules
    };
    let groups = (unit.max_groups.max(1) as u64).min(most.max(1));
    Contribution::new(unit.max_rows.max(1) as u64, groups)
        .map_err(|e| DataFusionError::Plan(format!("[rule privacy-unit] private table '{table}': {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_product_of_keys_lists_every_combination() {
        let a = vec![ScalarValue::from(1i64), ScalarValue::from(2i64)];
        let b = vec![ScalarValue::from("x"), ScalarValue::from("y"), ScalarValue::from("z")];
        let p = product(&[a, b]);
        assert_eq!(p.len(), 6);
        assert_eq!(p[5], vec![ScalarValue::from(2i64), ScalarValue::from("z")]);
        assert_eq!(product(&[]), vec![Vec::<ScalarValue>::new()]);
    }
}
