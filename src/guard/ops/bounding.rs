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
//! The bound streams: one aggregate grouped by the unit's 16-byte keyed hash whose state is the
//! K·L kept rows of each unit ([`UnitBound`]), whatever the unit's size or value — a unit of 10⁷
//! rows, or a 10⁸-byte unit value, costs what any other unit costs, so whether the query fits in
//! the memory limit does not depend on one unit. The number of units is the aggregate's number of
//! groups, which spills to disk like any aggregate.
//!
//! Rows whose unit is NULL form one unit together (the conservative reading).

use std::sync::Arc;

use datafusion::common::{Column, Result, internal_err, plan_err};
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::{
    AggregateUDF, Expr, Filter, LogicalPlan, LogicalPlanBuilder, Projection, ScalarUDF, SubqueryAlias, TableScanBuilder,
};

use super::sample_order::SampleOrder;
use super::unit_bound::{self, UnitBound};
use crate::mechanism::Contribution;
use crate::policy::PrivacyUnit;

/// Column carrying the unit up to the bound.
pub const UNIT_COLUMN: &str = "__dpcurve_unit";
/// The keyed 128-bit hash of the unit that the bound groups by.
pub const UNIT_HASH: &str = "__dpcurve_unit_hash";
const GROUP_ORDER: &str = "__dpcurve_group_order";
const ROW_ORDER: &str = "__dpcurve_row_order";
const KEPT: &str = "__dpcurve_kept";

/// The rows of `input` (a row-wise chain over `table`) bounded per unit (module docs): at most
/// `bound.groups` groups per unit — those with the smallest `order(unit hash, group_id…)` — and
/// at most `bound.rows` rows per unit and group — those with the smallest `order(row)`. Same
/// columns as `input`.
///
/// One aggregate grouped by the unit's keyed hash does it, with `O(K·L)` state per unit
/// ([`UnitBound`]); its list of kept rows is unnested back into rows. The unit enters it only as
/// its 16-byte keyed hash, never as its value.
pub fn bound_rows(
    input: &LogicalPlan,
    unit: &PrivacyUnit,
    table: &str,
    order: &SampleOrder,
    bound: Contribution,
    group_id: &[Expr],
) -> Result<LogicalPlan> {
    for f in input.schema().fields() {
        if [UNIT_COLUMN, UNIT_HASH, GROUP_ORDER, ROW_ORDER, KEPT].contains(&f.name().as_str()) {
            return plan_err!("[rule privacy-unit] column name '{}' is reserved", f.name());
        }
    }
    let schema = input.schema();
    let original: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
    let (input, unit_col) = with_unit(input, &unit.column, table)?;
    let order_fn = ScalarUDF::from(order.clone());
    let mut keyed = original.clone();
    keyed.push(order_fn.call(vec![Expr::Column(unit_col)]).alias(UNIT_HASH));
    let unit_hash = Expr::Column(Column::from_name(UNIT_HASH));
    let mut group_key = vec![unit_hash.clone()];
    group_key.extend(group_id.iter().cloned());
    // The row order, order(row…, unit hash), is computed inside the bound, for candidate rows only.
    let mut args = vec![order_fn.call(group_key), unit_hash.clone()];
    args.extend(original.iter().cloned());
    let kept = AggregateUDF::from(UnitBound::new(bound.groups, bound.rows, order.clone())).call(args).alias(KEPT);
    let unnested = LogicalPlanBuilder::from(input)
        .project(keyed)?
        .aggregate(vec![unit_hash], vec![kept])?
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
