//! Pass: what one query may hold (SPEC §5.1). At most [`MAX_PRIVATE_CALLS`] private calls and
//! partition selections, and no more memory for their states than the session's limit —
//! computed from the public parameters alone, at planning, before any debit.

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::LogicalPlan;

use crate::functions::PrivateCall;
use crate::functions::release::releases_at_once;
use crate::guard::checking::Checking;
use crate::guard::ops::unit_bound::memory_share;
use crate::guard::view::{GroupMode, KeysMap, UnitsMap, group_mode};
use crate::guard::walk::find_private_scan;

/// Private calls (and partition selections) one query may make: each is a row of the release
/// log, so this bounds what one query adds to the catalog besides the releases it stores.
pub const MAX_PRIVATE_CALLS: usize = 100;

/// The pass.
pub fn run(cx: &mut Checking<'_>) -> Result<()> {
    if cx.charges.len() > MAX_PRIVATE_CALLS {
        return plan_err!(
            "the query makes {} private calls and partition selections; at most {MAX_PRIVATE_CALLS} are allowed \
             in one query (each is logged in the ledger): split it into several queries",
            cx.charges.len()
        );
    }
    let Some(limit) = cx.limits.memory else { return Ok(()) };
    let groups = group_counts(&cx.plan, &cx.view.keys)?;
    // Over a table with a privacy unit, the calls get at most half the limit and the unit bound
    // what they leave (at least the other half).
    if !reads_units(&cx.plan, &cx.view.units) {
        check_memory(&cx.calls, &groups, cx.limits.partitions, (limit, "this session's memory limit"))?;
        return Ok(());
    }
    let half = limit - memory_share(limit as usize) as u64;
    let of = "the half of this session's memory limit a query over a privacy unit leaves them";
    let need = check_memory(&cx.calls, &groups, cx.limits.partitions, (half, of))?;
    cx.unit_memory = Some(limit - need);
    Ok(())
}

/// Whether a private aggregate of `plan` reads a table with a privacy unit (and so runs above
/// the unit bound).
fn reads_units(plan: &LogicalPlan, units: &UnitsMap) -> bool {
    plan.exists(|node| {
        Ok(matches!(node, LogicalPlan::Aggregate(agg)
            if find_private_scan(&agg.input).is_some_and(|t| units.contains_key(&t))))
    })
    .unwrap_or(true)
}

/// The number of groups of each grouped private aggregate over a private table: its declared
/// groups, or its partition selection's cap.
fn group_counts(plan: &LogicalPlan, keys: &KeysMap) -> Result<Vec<u64>> {
    let mut counts = Vec::new();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Aggregate(agg) = node
            && let Some(t) = find_private_scan(&agg.input)
            && let Ok(mode @ (GroupMode::Declared(_) | GroupMode::Private)) = group_mode(agg, keys, &t)
            && let Ok(Some(n)) = mode.most_groups(agg)
        {
            counts.push(n);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(counts)
}

/// The bytes the calls' states (per group, per accumulator) and release work need; refuses them
/// when that exceeds `limit` bytes (`of` says what that limit is).
fn check_memory(calls: &[PrivateCall], groups: &[u64], partitions: usize, (limit, of): (u64, &str)) -> Result<u64> {
    // States are per group: a grouped aggregate holds one per declared group (SPEC §7).
    let most_groups = groups.iter().copied().max().unwrap_or(1).max(1);
    // A grouped call draws several groups' releases at once, each with its own work.
    let at_once = releases_at_once(usize::try_from(most_groups).unwrap_or(usize::MAX)) as u64;
    // A partial accumulator over declared keys also holds one spare group for the rows of no
    // declared key (exec::known_keys_partial).
    let spare = if groups.is_empty() { 0 } else { partitions as u64 };
    let accumulated = most_groups.saturating_mul(partitions as u64 + 1).saturating_add(spare);
    let need = calls.iter().fold(0u64, |a, c| {
        let states = c.state_bytes.saturating_mul(accumulated);
        a.saturating_add(states.saturating_add(c.work_bytes.saturating_mul(at_once)))
    });
    if need > limit {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let parts: Vec<String> =
            calls.iter().map(|c| format!("{} {:.1} MiB", c.function, mib(c.memory_bytes(partitions)))).collect();
        return plan_err!(
            "[rule memory-limit] the private calls of this query need {:.1} MiB (per group: {}; state × {} \
             accumulators × up to {most_groups} groups, a spare group per partial accumulator + release × {at_once} at once), more than the {:.1} MiB of {of}: use fewer or smaller calls \
             (points, bandwidth relative to hi − lo); the data owner sets the limit with \
             `dpcurve admin set-memory-limit`",
            mib(need),
            parts.join(", "),
            partitions + 1,
            mib(limit)
        );
    }
    Ok(need)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mechanism::noise::budget::Budget;

    #[test]
    fn a_grouped_calls_releases_at_once_each_count_their_work() {
        let call = PrivateCall {
            function: "private_kde",
            cost: Budget::charge(1.0, 0.0).unwrap(),
            state_bytes: 1 << 10,
            work_bytes: 8 << 20,
        };
        let states = (1u64 << 10) * (100 * 3 + 2);
        let at_once = releases_at_once(100) as u64;
        // Exactly what 100 groups over 2 partitions need passes; a byte less is refused.
        let need = states + (8 << 20) * at_once;
        assert_eq!(check_memory(std::slice::from_ref(&call), &[100], 2, (need, "")).unwrap(), need);
        let e = check_memory(std::slice::from_ref(&call), &[100], 2, (need - 1, "")).unwrap_err().to_string();
        assert!(e.contains(&format!("release × {at_once} at once")), "{e}");
        // One release's work alone is too little wherever two releases run at once.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        assert_eq!(at_once, cores.min(100 / 8));
        assert_eq!(
            check_memory(std::slice::from_ref(&call), &[100], 2, (states + (8 << 20), "")).is_ok(),
            at_once == 1
        );
        // Ungrouped: one release.
        assert!(check_memory(std::slice::from_ref(&call), &[], 2, ((1 << 10) * 3 + (8 << 20), "")).is_ok());
    }
}
