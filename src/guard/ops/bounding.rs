//! Privacy units (SPEC §7): the logical plan that bounds each unit's contribution below a
//! private aggregate over a table whose policy names a unit column.
//!
//! Neighbouring tables differ by all rows of one unit (a person, a meter). Before the
//! statistic, the guard rewrites the rows reaching a private aggregate ([`bound_rows`]) to keep,
//! per unit,
//!
//! 1. at most `max_groups` groups (L) — those with the smallest `order(unit, group)`;
//! 2. at most `max_rows` rows (K) per group — those with the smallest `order(row)`;
//!
//! where `order` is [`SampleOrder`](super::sample_order::SampleOrder): a 128-bit SipHash-1-3 of the values (all columns the
//! aggregate reads, and the unit), keyed per query from the OS CSPRNG. A unit's kept rows are
//! therefore a uniformly random sample of its rows (never the first ones in file order), and a
//! function of the unit's own rows only — so the bound holds whatever the other rows are, and
//! the kept set does not depend on files, partitions or batch boundaries (the hash ties only for
//! rows identical in every column the aggregate reads, which contribute identically; two groups
//! whose orders collide, with probability 2⁻¹²⁸, share one group's K rows, which only lowers the
//! unit's contribution). The private call's noise is calibrated for the bound
//! ([`crate::mechanism::Contribution`]): each group's statistic moves by at most K rows, and one
//! unit reaches at most L groups.
//!
//! The bound streams: one aggregate grouped by the unit (its 16-byte keyed hash, or its value when
//! that is an integer-like type of at most 16 bytes) whose state is the
//! K·L kept rows of each unit ([`UnitBound`]), whatever the unit's size or value — a unit of 10⁷
//! rows, or a 10⁸-byte unit value, costs what any other unit costs, so whether the query fits in
//! the memory limit does not depend on one unit. The number of units is the aggregate's number of
//! groups, which spills to disk (in one process by the bound's own aggregate, in partitions of the
//! units' hashes).
//!
//! Rows whose unit is NULL form one unit together (the conservative reading).

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema, Result, internal_err, plan_err};
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::{
    AggregateUDF, Expr, ExprSchemable, Filter, LogicalPlan, LogicalPlanBuilder, Projection, ScalarUDF, SubqueryAlias,
    TableScanBuilder,
};

use super::sample_order::SampleOrder;
use super::unit_bound::{self, UnitArg, UnitBound};
use crate::mechanism::Contribution;
use crate::policy::PrivacyUnit;

/// Column carrying the unit up to the bound.
pub const UNIT_COLUMN: &str = "__dpcurve_unit";
/// What the bound groups by: the unit's keyed 128-bit hash, or its integer-like value.
pub const UNIT_KEY: &str = "__dpcurve_unit_id";
/// Prefix of the group-key columns handed to the bound.
const GROUP_KEY: &str = "__dpcurve_bound_group_";
const KEPT: &str = "__dpcurve_kept";

/// The rows of `input` (a row-wise chain over `table`) bounded per unit (module docs): at most
/// `bound.groups` groups per unit — those with the smallest `order(unit hash, group_id…)` — and
/// at most `bound.rows` rows per unit and group — those with the smallest `order(row)`. Same
/// columns as `input`.
///
/// One aggregate grouped by the unit's keyed hash does it, with `O(K·L)` state per unit
/// ([`UnitBound`]); its list of kept rows is unnested back into rows. The unit enters it as its
/// 16-byte keyed hash, or as its value when that is integer-like and at most 16 bytes wide: never
/// as a value whose size could depend on one unit.
pub fn bound_rows(
    input: &LogicalPlan,
    unit: &PrivacyUnit,
    table: &str,
    order: &SampleOrder,
    bound: Contribution,
    group_id: &[Expr],
) -> Result<LogicalPlan> {
    for f in input.schema().fields() {
        if [UNIT_COLUMN, UNIT_KEY, KEPT].contains(&f.name().as_str()) || f.name().starts_with(GROUP_KEY) {
            return plan_err!("[rule privacy-unit] column name '{}' is reserved", f.name());
        }
    }
    let schema = input.schema();
    let original: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
    let (input, unit_col) = with_unit(input, &unit.column, table)?;
    // Units of an integer-like type are grouped by their value (as many bytes as their hash, or
    // fewer) and hashed once per unit inside the bound; any other unit by its hash.
    let unit_value = Expr::Column(unit_col);
    let (unit_key, unit_arg) = if integer_like(std::slice::from_ref(&unit_value), input.schema())? {
        (unit_value, UnitArg::Value)
    } else {
        (ScalarUDF::from(order.clone()).call(vec![unit_value]), UnitArg::Hash)
    };
    let mut keyed = original.clone();
    keyed.push(unit_key.alias(UNIT_KEY));
    keyed.extend(group_id.iter().enumerate().map(|(i, k)| k.clone().alias(format!("{GROUP_KEY}{i}"))));
    let unit_key = Expr::Column(Column::from_name(UNIT_KEY));
    // Both orders are computed inside the bound: order(unit hash, group key…) per row, the row
    // order order(row…, unit hash) only for rows whose group can still be kept.
    let mut args = vec![unit_key.clone()];
    args.extend((0..group_id.len()).map(|i| Expr::Column(Column::from_name(format!("{GROUP_KEY}{i}")))));
    args.extend(original.iter().cloned());
    let udf = UnitBound::new(bound.groups, bound.rows, order.clone(), group_id.len(), unit_arg);
    let kept = AggregateUDF::from(udf).call(args).alias(KEPT);
    let unnested = LogicalPlanBuilder::from(input)
        .project(keyed)?
        .aggregate(vec![unit_key], vec![kept])?
        .unnest_column(Column::from_name(KEPT))?
        .build()?;
    // The kept struct's fields, back under the input's (qualified) names.
    let kept_col = Expr::Column(Column::from_name(KEPT));
    let restored = schema
        .iter()
        .enumerate()
        .map(|(i, (qualifier, field))| {
            get_field(kept_col.clone(), unit_bound::row_field(i)).alias_qualified(qualifier.cloned(), field.name())
        })
        .collect::<Vec<_>>();
    LogicalPlanBuilder::from(unnested).project(restored)?.build()
}

/// The same row-wise chain with the unit column carried to its top; returns the column's name
/// there.
fn with_unit(plan: &LogicalPlan, unit: &str, table: &str) -> Result<(LogicalPlan, Column)> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let schema = scan.source.schema();
            let Ok(index) = schema.index_of(unit) else {
                return plan_err!(
                    "[rule privacy-unit] the privacy unit column '{unit}' of private table '{table}' does not exist; \
                     the data owner must fix it with `dpcurve admin set-privacy-unit`"
                );
            };
            let projection = scan.projection.clone().map(|mut p| {
                if !p.contains(&index) {
                    p.push(index);
                }
                p
            });
            let rebuilt = TableScanBuilder::from(scan.clone()).with_projection(projection).build()?;
            Ok((LogicalPlan::TableScan(rebuilt), Column::new(Some(scan.table_name.clone()), unit)))
        }
        LogicalPlan::Filter(f) => {
            let (child, col) = with_unit(&f.input, unit, table)?;
            Ok((LogicalPlan::Filter(Filter::try_new(f.predicate.clone(), Arc::new(child))?), col))
        }
        LogicalPlan::Projection(p) => {
            let (child, col) = with_unit(&p.input, unit, table)?;
            let mut expr = p.expr.clone();
            expr.push(Expr::Column(col).alias(UNIT_COLUMN));
            Ok((LogicalPlan::Projection(Projection::try_new(expr, Arc::new(child))?), Column::from_name(UNIT_COLUMN)))
        }
        LogicalPlan::SubqueryAlias(a) => {
            let (child, col) = with_unit(&a.input, unit, table)?;
            let rebuilt = SubqueryAlias::try_new(Arc::new(child), a.alias.clone())?;
            Ok((LogicalPlan::SubqueryAlias(rebuilt), Column::new(Some(a.alias.clone()), col.name)))
        }
        other => {
            internal_err!("contribution bounding met {} between a private table and its aggregate", other.display())
        }
    }
}

/// Whether every expression has a fixed-width type of at most 16 bytes whose values group
/// exactly as their canonical encodings do (integers, decimals, dates, times, durations,
/// booleans — not floats, whose grouping and encoding may disagree on −0 and NaN payloads): such
/// values can be grouped by value instead of by their keyed hash, with the same groups and no
/// more bytes per group.
pub fn integer_like(exprs: &[Expr], schema: &DFSchema) -> Result<bool> {
    for e in exprs {
        let t = e.get_type(schema)?;
        let fixed = t == DataType::Boolean || (t.primitive_width().is_some_and(|w| w <= 16) && !t.is_floating());
        if !fixed {
            return Ok(false);
        }
    }
    Ok(true)
}
