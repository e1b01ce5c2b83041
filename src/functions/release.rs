//! What one validated call of a private aggregate is: its exact, mergeable statistic and its
//! release (noise drawn once, then post-processing), and the one way every release is made —
//! permit first, noise once, stored release kept.

use std::fmt;

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::take_arrays;
use datafusion::common::{Result, ScalarValue, exec_datafusion_err};
use rand::rngs::ChaCha20Rng;

use super::arrays::{fixed_point_state, for_each_fixed_point_row};
use super::call::CallContext;
use super::group_rows::GroupRows;
use crate::mechanism::stored::Recipe;
use crate::mechanism::sums::BufferedSums;

/// The statistic and release of one validated call.
pub trait Release: fmt::Debug + Send + Sync + 'static {
    /// The exact sufficient statistic.
    type Statistic: Statistic;
    /// What the release computes before its stored id is known.
    type Output;

    /// An empty statistic.
    fn statistic(&self) -> Self::Statistic;

    /// Adds the rows of one batch (the coerced data arguments).
    fn update(&self, statistic: &mut Self::Statistic, values: &[ArrayRef]) -> Result<()>;

    /// Adds the rows of one batch to their groups' statistics: `rows` lists each group's rows
    /// (GROUP BY's vectorised form). The default takes each group's rows into arrays and calls
    /// [`Release::update`]; a function may read the batch's columns in place instead, with the
    /// same (exact) result.
    fn update_groups(&self, statistics: &mut [Self::Statistic], values: &[ArrayRef], rows: &GroupRows) -> Result<()> {
        update_groups_by_take(self, statistics, values, rows)
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

    /// Merges the states of other accumulators (rows of the state columns).
    fn merge(&mut self, function: &str, states: &[ArrayRef]) -> Result<()>;

    /// Heap bytes held.
    fn heap_size(&self) -> usize;
}

/// The exact fixed-point sums most functions accumulate: their state is that one list.
impl Statistic for BufferedSums {
    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![fixed_point_state(self.totals())?])
    }

    fn merge(&mut self, function: &str, states: &[ArrayRef]) -> Result<()> {
        let len = self.len();
        for_each_fixed_point_row(function, &states[0], len, |_, part| BufferedSums::merge(self, part))
    }

    fn heap_size(&self) -> usize {
        BufferedSums::heap_size(self)
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
    cx.permits.take(name)?;
    let mut rng = cx.noise.release_rng().map_err(|e| exec_datafusion_err!("{name}: {e}"))?;
    let (output, recipe) = call.release(statistic, rng.as_mut(), cx)?;
    let id = cx.permits.keep(name, &recipe)?;
    call.result(output, id)
}
