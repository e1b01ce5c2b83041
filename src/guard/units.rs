//! Privacy units (SPEC §7): per-unit contribution bounding below every private aggregate over a
//! table whose policy names a unit column.
//!
//! Neighbouring tables differ by all rows of one unit (a person, a meter). Before the
//! statistic, the guard rewrites the rows reaching a private aggregate ([`bound_rows`]) to keep,
//! per unit,
//!
//! 1. at most `max_groups` groups (L) — those with the smallest `order(unit, group)`;
//! 2. at most `max_rows` rows (K) per group — those with the smallest `order(row)`;
//!
//! where `order` is [`SampleOrder`]: a 128-bit SipHash-1-3 of the values (all columns the
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

use std::collections::BTreeMap;
use std::fmt;
use std::hash::Hasher;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, FixedSizeBinaryBuilder};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, DataFusionError, Result, internal_err, plan_err};
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::{
    Aggregate, AggregateUDF, ColumnarValue, Expr, Filter, LogicalPlan, LogicalPlanBuilder, Projection,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, SubqueryAlias, TableScanBuilder, Volatility,
};
use rand::Rng;
use siphasher::sip128::{Hasher128, SipHasher13};

use super::groups::{GroupMode, KeysMap, group_mode};
use super::selection::selection_args;
use super::shape::{aggregate_call, find_private_scan};
use super::unit_bound::{self, UnitBound};
use crate::functions::{CallContext, context_of, is_private, with_context};
use crate::mechanism::{Contribution, NoiseSource};
use crate::policy::PrivacyUnit;

/// Private tables with a privacy unit: table → unit and bounds.
pub type UnitsMap = BTreeMap<String, PrivacyUnit>;

/// Column carrying the unit up to the bounding windows.
pub const UNIT_COLUMN: &str = "__dpcurve_unit";
/// The keyed 128-bit hash of the unit that the bounding windows partition by.
pub const UNIT_HASH: &str = "__dpcurve_unit_hash";
const GROUP_ORDER: &str = "__dpcurve_group_order";
const ROW_ORDER: &str = "__dpcurve_row_order";
const KEPT: &str = "__dpcurve_kept";

/// The contribution bound of a private aggregate over `unit`'s table: `max_rows` rows per
/// group, and `max_groups` groups (never more than the query has: 1 ungrouped, the number of
/// declared groups when grouped).
pub fn contribution_for(agg: &Aggregate, unit: &PrivacyUnit, keys: &KeysMap, table: &str) -> Result<Contribution> {
    // Never more groups than the query can release: 1 ungrouped, the declared groups, or the
    // selection's cap on released groups.
    let most = match group_mode(agg, keys, table) {
        Ok(GroupMode::Ungrouped) => 1,
        Ok(GroupMode::Declared(cols)) => cols.iter().map(|c| c.len() as u64).product(),
        Ok(GroupMode::Private) => selection_args(agg)?.map_or(u64::MAX, |a| a.max_groups),
        Err(_) => u64::MAX, // refused by the shape rules
    };
    let groups = (unit.max_groups.max(1) as u64).min(most.max(1));
    Contribution::new(unit.max_rows.max(1) as u64, groups)
        .map_err(|e| DataFusionError::Plan(format!("[rule privacy-unit] private table '{table}': {e}")))
}

fn private_aggregate_over<'a>(
    node: &'a LogicalPlan,
    units: &'a UnitsMap,
) -> Option<(&'a Aggregate, String, &'a PrivacyUnit)> {
    let LogicalPlan::Aggregate(agg) = node else { return None };
    if !agg.aggr_expr.iter().any(|e| aggregate_call(e).is_some_and(|f| is_private(&f.func))) {
        return None;
    }
    let table = find_private_scan(&agg.input)?;
    let unit = units.get(&table)?;
    Some((agg, table, unit))
}

/// Gives every private call over a table with a privacy unit its contribution bound, so its
/// validation, pricing and noise use the unit's sensitivity (before anything else looks at it).
pub fn set_contributions(plan: LogicalPlan, units: &UnitsMap, keys: &KeysMap) -> Result<LogicalPlan> {
    if units.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| {
        let Some((agg, table, unit)) = private_aggregate_over(&node, units) else { return Ok(Transformed::no(node)) };
        let contribution = contribution_for(agg, unit, keys, &table)?;
        super::map_private_calls(agg, |func, _| {
            let cx = context_of(func).ok_or_else(|| DataFusionError::Internal("no call context".into()))?;
            with_context(func, CallContext { contribution, ..cx.clone() })
                .ok_or_else(|| DataFusionError::Internal("no call context".into()))
        })
    })
    .map(|t| t.data)
}

/// Inserts the contribution bounding (module docs) below every private aggregate over a table
/// with a privacy unit. Runs after the shape rules, so the input is a row-wise chain; a GROUP BY
/// over private keys is bounded by its partition selection instead
/// ([`super::selection::split_selections`], which runs first).
pub fn bound_contributions(plan: LogicalPlan, units: &UnitsMap) -> Result<LogicalPlan> {
    if units.is_empty() {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| {
        let Some((agg, table, unit)) = private_aggregate_over(&node, units) else { return Ok(Transformed::no(node)) };
        let Some(cx) = agg.aggr_expr.iter().find_map(|e| aggregate_call(e).and_then(|f| context_of(&f.func))) else {
            return internal_err!("a private aggregate over '{table}' has no call context");
        };
        if cx.permits.is_selection() {
            return Ok(Transformed::no(node));
        }
        let order = Arc::new(ScalarUDF::from(SampleOrder::new(cx.noise)?));
        let bounded = bound_rows(&agg.input, unit, &table, &order, cx.contribution, &agg.group_expr)?;
        super::with_input(agg, Arc::new(bounded))
    })
    .map(|t| t.data)
}

/// The rows of `input` (a row-wise chain over `table`) bounded per unit (module docs): at most
/// `bound.groups` groups per unit — those with the smallest `order(unit hash, group_id…)` — and
/// at most `bound.rows` rows per unit and group — those with the smallest `order(row)`. Same
/// columns as `input`.
///
/// One aggregate grouped by the unit's keyed hash does it, with `O(K·L)` state per unit
/// ([`UnitBound`]); its list of kept rows is unnested back into rows. The unit enters it only as
/// its 16-byte keyed hash, never as its value.
pub(crate) fn bound_rows(
    input: &LogicalPlan,
    unit: &PrivacyUnit,
    table: &str,
    order: &Arc<ScalarUDF>,
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
    let mut keyed = original.clone();
    keyed.push(order.call(vec![Expr::Column(unit_col)]).alias(UNIT_HASH));
    let unit_hash = Expr::Column(Column::from_name(UNIT_HASH));
    let mut group_key = vec![unit_hash.clone()];
    group_key.extend(group_id.iter().cloned());
    let mut row = original.clone();
    row.push(unit_hash.clone());
    let mut args = vec![order.call(group_key), order.call(row)];
    args.extend(original.iter().cloned());
    let kept = AggregateUDF::from(UnitBound::new(bound.groups, bound.rows)).call(args).alias(KEPT);
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

/// Arrow's canonical row encoding of `columns`: equal values give equal bytes whatever the batch,
/// file or partition (what both the sampling order and the partition selection key rely on).
pub(crate) fn canonical_rows(columns: &[ArrayRef]) -> Result<Rows> {
    let fields = columns.iter().map(|a| SortField::new(a.data_type().clone())).collect();
    Ok(RowConverter::new(fields)?.convert_columns(columns)?)
}

/// `dpcurve_sample_order(col, …)`: a 128-bit keyed SipHash-1-3 of the row's values (in Arrow's
/// canonical row encoding), as 16 big-endian bytes. The key is drawn per query from the OS
/// CSPRNG (fixed under the test hooks' noise sources) and never displayed.
#[derive(PartialEq, Eq, Hash)]
pub struct SampleOrder {
    signature: Signature,
    key: (u64, u64),
}

impl fmt::Debug for SampleOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SampleOrder { key: <secret> }")
    }
}

impl SampleOrder {
    /// A fresh order: OS-keyed in production, fixed by the test seed otherwise.
    pub fn new(noise: NoiseSource) -> Result<Self> {
        let key = match noise.release_rng() {
            Ok(Some(mut rng)) => (rng.next_u64(), rng.next_u64()),
            Ok(None) => (0x5eed_0001, 0x5eed_0002),
            Err(e) => return plan_err!("{e}"),
        };
        Ok(Self::with_key(key))
    }

    /// The key (to ship the order to a cluster's executors, which read the unit's rows).
    pub(crate) fn key(&self) -> (u64, u64) {
        self.key
    }

    /// An order with a given key (tests, and the copy decoded on an executor).
    pub fn with_key(key: (u64, u64)) -> Self {
        Self { signature: Signature::variadic_any(Volatility::Immutable), key }
    }

    /// The order keys of the rows of `columns`.
    pub fn keys(&self, columns: &[ArrayRef]) -> Result<ArrayRef> {
        let rows = canonical_rows(columns)?;
        let mut out = FixedSizeBinaryBuilder::with_capacity(rows.num_rows(), 16);
        for row in rows.iter() {
            let mut h = SipHasher13::new_with_keys(self.key.0, self.key.1);
            h.write(row.as_ref());
            out.append_value(u128::from(h.finish128()).to_be_bytes())?;
        }
        Ok(Arc::new(out.finish()))
    }
}

impl ScalarUDFImpl for SampleOrder {
    fn name(&self) -> &str {
        "dpcurve_sample_order"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::FixedSizeBinary(16))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let columns = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<_>>>()?;
        Ok(ColumnarValue::Array(self.keys(&columns)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray, Float64Array, StringArray};

    fn keys(order: &SampleOrder, xs: Vec<f64>, units: Vec<&str>) -> Vec<u128> {
        let cols: Vec<ArrayRef> = vec![Arc::new(Float64Array::from(xs)), Arc::new(StringArray::from(units))];
        let k = order.keys(&cols).unwrap();
        let k = k.as_fixed_size_binary();
        (0..k.len()).map(|i| u128::from_be_bytes(k.value(i).try_into().unwrap())).collect()
    }

    #[test]
    fn the_order_is_a_keyed_function_of_the_row_values() {
        let a = SampleOrder::with_key((1, 2));
        let k1 = keys(&a, vec![0.5, 0.25, 0.5], vec!["u", "u", "u"]);
        assert_eq!(k1[0], k1[2], "identical rows tie");
        assert_ne!(k1[0], k1[1]);
        // Batch boundaries do not matter: the same row alone gets the same key.
        assert_eq!(keys(&a, vec![0.25], vec!["u"])[0], k1[1]);
        // Another key, another order.
        let b = SampleOrder::with_key((3, 4));
        assert_ne!(keys(&b, vec![0.5, 0.25], vec!["u", "u"]), k1[..2].to_vec());
        // Debug never shows the key.
        assert!(!format!("{a:?}").contains('1'));
    }

    #[test]
    fn os_keys_differ_between_queries() {
        let a = SampleOrder::new(NoiseSource::Os).unwrap();
        let b = SampleOrder::new(NoiseSource::Os).unwrap();
        assert_ne!(a.key, b.key);
        assert_eq!(
            SampleOrder::new(NoiseSource::TestSeed(3)).unwrap().key,
            SampleOrder::new(NoiseSource::TestSeed(3)).unwrap().key
        );
    }
}
