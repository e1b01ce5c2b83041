//! What one validated call of a private aggregate is: its exact, mergeable statistic and its
//! release (noise drawn once, then post-processing), and the one way every release is made —
//! permit first, noise once, stored release kept.

use std::fmt;

use datafusion::arrow::array::{ArrayRef, UInt32Array, new_empty_array};
use datafusion::arrow::compute::take_arrays;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue, exec_datafusion_err};
use rand::rngs::ChaCha20Rng;

use super::arrays::{fixed_point_state, fixed_point_states, for_each_fixed_point_row};
use super::call::CallContext;
use super::group_rows::{GroupRows, GroupedBatch};
use super::release_threads::{in_parallel, threads_for};
use crate::mechanism::stored::Recipe;
use crate::mechanism::sums::BufferedSums;

/// The statistic and release of one validated call.
pub trait Release: fmt::Debug + Send + Sync + 'static {
    /// The exact sufficient statistic.
    type Statistic: Statistic;
    /// What the release computes before its stored id is known.
    type Output: Send;

    /// An empty statistic.
    fn statistic(&self) -> Self::Statistic;

    /// An empty statistic that partial states are merged into (a final phase's, which adds no
    /// rows): by default [`Release::statistic`]; a statistic that buffers rows may leave its
    /// buffers out.
    fn merged_statistic(&self) -> Self::Statistic {
        self.statistic()
    }

    /// Adds the rows of one batch (the coerced data arguments).
    fn update(&self, statistic: &mut Self::Statistic, values: &[ArrayRef]) -> Result<()>;

    /// Adds the rows of one batch to their groups' statistics (GROUP BY's vectorised form). The
    /// default takes each group's rows into arrays and calls [`Release::update`]; a function may
    /// read the batch's columns in place instead (by group, or scattering rows in row order),
    /// with the same (exact) result.
    fn update_groups(
        &self,
        statistics: &mut [Self::Statistic],
        values: &[ArrayRef],
        batch: &mut GroupedBatch,
    ) -> Result<()> {
        update_groups_by_take(self, statistics, values, batch.ordered())
    }

    /// Memory one call needs: (one accumulator's state, the release's work), in bytes.
    fn memory_bytes(&self) -> (u64, u64);

    /// Draws the noise (from `rng`; None only under the noiseless test hook) and post-processes:
    /// the output and what a stored release keeps.
    fn release(
        &self,
        statistic: &mut Self::Statistic,
        rng: Option<&mut ChaCha20Rng>,
        cx: &CallContext,
    ) -> Result<(Self::Output, Recipe)>;

    /// The result struct, with the stored release's id (catalog sessions).
    fn result(&self, output: Self::Output, id: Option<String>) -> Result<ScalarValue>;
}

/// An exact, mergeable statistic: what partial accumulators hand each other, merged exactly.
pub trait Statistic: fmt::Debug + Send + Sync + 'static {
    /// The accumulator state.
    fn state(&mut self) -> Result<Vec<ScalarValue>>;

    /// The state columns of several statistics, one row each (a partial phase's output): by
    /// default each statistic's [`Statistic::state`], gathered column by column.
    fn states(statistics: Vec<Self>, types: &[DataType]) -> Result<Vec<ArrayRef>>
    where
        Self: Sized,
    {
        let states = statistics.into_iter().map(|mut s| s.state()).collect::<Result<Vec<_>>>()?;
        if states.is_empty() {
            return Ok(types.iter().map(new_empty_array).collect());
        }
        let mut columns: Vec<Vec<ScalarValue>> = vec![Vec::with_capacity(states.len()); types.len()];
        for row in states {
            for (c, v) in columns.iter_mut().zip(row) {
                c.push(v);
            }
        }
        columns.into_iter().map(ScalarValue::iter_to_array).collect()
    }

    /// Merges the states of other accumulators (rows of the state columns).
    fn merge(&mut self, function: &str, states: &[ArrayRef]) -> Result<()>;

    /// Merges another statistic of the same call (by default through its state).
    fn absorb(&mut self, function: &str, mut other: Self) -> Result<()>
    where
        Self: Sized,
    {
        let states = other.state()?.iter().map(ScalarValue::to_array).collect::<Result<Vec<_>>>()?;
        self.merge(function, &states)
    }

    /// Heap bytes held.
    fn heap_size(&self) -> usize;

    /// Adds what a buffer holds into the exact totals.
    fn flush(&mut self);

    /// The most rows the buffer holds between two flushes.
    fn flush_rows(&self) -> usize;
}

/// The exact fixed-point sums most functions accumulate: their state is that one list.
impl Statistic for BufferedSums {
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![fixed_point_state(self.totals())?])
    }

    /// Every statistic's totals written straight into one list column (no value per group),
    /// buffers included, in one pass over each statistic.
    fn states(statistics: Vec<Self>, _types: &[DataType]) -> Result<Vec<ArrayRef>> {
        let capacity = statistics.iter().map(BufferedSums::len).sum();
        Ok(vec![fixed_point_states(&statistics, capacity, BufferedSums::append_totals)?])
    }

    fn merge(&mut self, function: &str, states: &[ArrayRef]) -> Result<()> {
        let len = self.len();
        for_each_fixed_point_row(function, &states[0], len, |_, part| BufferedSums::merge(self, part))
    }

    fn absorb(&mut self, _function: &str, mut other: Self) -> Result<()> {
        BufferedSums::merge(self, other.totals());
        Ok(())
    }

    fn heap_size(&self) -> usize {
        BufferedSums::heap_size(self)
    }

    fn flush(&mut self) {
        BufferedSums::flush(self)
    }

    fn flush_rows(&self) -> usize {
        BufferedSums::flush_rows(self)
    }
}

/// The default [`Release::update_groups`]: each group's rows taken into arrays, then
/// [`Release::update`].
pub fn update_groups_by_take<C: Release + ?Sized>(
    call: &C,
    statistics: &mut [C::Statistic],
    values: &[ArrayRef],
    rows: &GroupRows,
) -> Result<()> {
    for (g, indices) in rows.iter() {
        let taken = take_arrays(values, &UInt32Array::from(indices.to_vec()), None)?;
        call.update(&mut statistics[g], &taken)?;
    }
    Ok(())
}

/// Releases one statistic of `call` (SPEC §5.1: the permit is taken before any noise is drawn;
/// the stored release is kept before the result is returned).
pub(crate) fn release_statistic<C: Release>(
    name: &'static str,
    call: &C,
    statistic: &mut C::Statistic,
    cx: &CallContext,
) -> Result<ScalarValue> {
    Ok(release_statistics(name, call, std::slice::from_mut(statistic), cx)?.pop().expect("one release"))
}

/// Releases the statistics of a grouped call, in their order: each drawn as
/// [`release_statistic`] draws one (permit first, fresh noise), on up to the machine's cores at
/// once when there are many groups (a release's work depends on public parameters only, and
/// how many releases there are is public: the declared or selected groups); then all kept in
/// one transaction, numbered in this order, before any result is returned.
pub(crate) fn release_statistics<C: Release>(
    name: &'static str,
    call: &C,
    statistics: &mut [C::Statistic],
    cx: &CallContext,
) -> Result<Vec<ScalarValue>> {
    let draw = |s: &mut C::Statistic| -> Result<(C::Output, Recipe)> {
        cx.permits.take(name)?;
        let mut rng = cx.noise.release_rng().map_err(|e| exec_datafusion_err!("{name}: {e}"))?;
        call.release(s, rng.as_mut(), cx)
    };
    let drawn = in_parallel(statistics, RELEASES_PER_THREAD, |part| part.iter_mut().map(draw).collect())?;
    let ids = cx.permits.keep_all(name, &drawn.iter().map(|(_, recipe)| recipe).collect::<Vec<_>>())?;
    drawn.into_iter().zip(ids).map(|((output, _), id)| call.result(output, id)).collect()
}

/// Releases a thread of [`release_statistics`] takes at least (fewer run on the caller's).
const RELEASES_PER_THREAD: usize = 8;

/// How many releases of a call with `groups` groups are drawn at once, at most: what the
/// planner multiplies a release's work memory by.
pub(crate) fn releases_at_once(groups: usize) -> usize {
    threads_for(groups, RELEASES_PER_THREAD)
}

/// Checks `call`'s [`Release::merged_statistic`]: exact sums without a buffer (16 bytes an entry,
/// less than a statistic rows are added to) that hold, once a statistic of `values` is merged
/// into them, exactly its totals; the totals are not all zero (control: the comparison sees rows).
#[cfg(test)]
pub(crate) fn assert_merges_without_buffers<C: Release<Statistic = BufferedSums>>(call: &C, values: &[ArrayRef]) {
    let mut rows = call.statistic();
    call.update(&mut rows, values).unwrap();
    let mut merged = call.merged_statistic();
    let len = rows.totals().len();
    assert_eq!(merged.heap_size(), 16 * len, "exact sums only");
    assert!(call.statistic().heap_size() > merged.heap_size(), "a statistic rows are added to has a buffer");
    let totals = rows.totals().to_vec();
    Statistic::absorb(&mut merged, "test", rows).unwrap();
    assert_eq!(merged.totals(), totals.as_slice());
    assert!(totals.iter().any(|&v| v != 0), "control: the statistic holds rows");
}
