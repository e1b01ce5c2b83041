//! The vectorised form of every private aggregate under GROUP BY: one [`GroupsAccumulator`]
//! holding each group's exact statistic, instead of DataFusion's adapter around one boxed
//! [`super::aggregate::PrivateAccumulator`] per group (which copies every batch into per-group
//! arrays with `take` and calls each accumulator through a trait object).
//!
//! A batch's rows are counted by group ([`GroupedBatch`]) and go to [`Release::update_groups`],
//! which a function may implement on the raw column (the binned KDE scatters each row straight
//! from the batch's f64 slice into its group) or leave to the default, which orders the rows by
//! group (a counting sort in O(rows)), takes them into arrays and calls [`Release::update`]. Statistics are exact fixed-point sums, so
//! the result is bit-identical to the per-group accumulators whatever order rows arrive in. Each
//! group releases exactly as a [`super::aggregate::PrivateAccumulator`] does: permit first, noise
//! once, stored release kept.

use std::mem::{size_of, size_of_val};

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, new_empty_array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};

use super::call::CallContext;
use super::group_rows::{GroupRows, GroupedBatch};
use super::release::{Release, Statistic, release_statistics};

/// Every group's statistic of one validated call (module docs).
pub struct PrivateGroups<C: Release> {
    function: &'static str,
    call: C,
    cx: CallContext,
    statistics: Vec<C::Statistic>,
    /// Rows of the batches since every group's buffer was last flushed.
    rows_since_flush: usize,
    /// Whether the statistics were made for merging only (a final phase's, no rows added yet).
    merging: bool,
    /// Heap bytes of `statistics`' entries.
    bytes: usize,
    rows: GroupRows,
    /// The result type (a struct) and the state columns' types, for empty outputs.
    result_type: DataType,
    state_types: Vec<DataType>,
}

impl<C: Release> PrivateGroups<C> {
    /// No groups yet.
    pub fn new(
        function: &'static str,
        call: C,
        cx: CallContext,
        result_type: DataType,
        state_types: Vec<DataType>,
    ) -> Self {
        Self {
            function,
            call,
            cx,
            statistics: Vec::new(),
            rows_since_flush: 0,
            merging: false,
            bytes: 0,
            rows: GroupRows::default(),
            result_type,
            state_types,
        }
    }

    /// The groups' statistics (tests).
    #[cfg(test)]
    pub(crate) fn statistics_mut(&mut self) -> &mut [C::Statistic] {
        &mut self.statistics
    }

    /// Statistics for up to `total_groups` groups that rows are added to (statistics made for
    /// merging only get their buffers first: a plan's phase decides this, never its data).
    pub(crate) fn grow(&mut self, total_groups: usize) -> Result<()> {
        if std::mem::take(&mut self.merging) {
            for s in &mut self.statistics {
                let merged = std::mem::replace(s, self.call.statistic());
                s.absorb(self.function, merged)?;
            }
            self.bytes = self.statistics.iter().map(Statistic::heap_size).sum();
        }
        self.push_statistics(total_groups);
        Ok(())
    }

    /// Statistics for up to `total_groups` groups that partial states are merged into: without
    /// buffers ([`Release::merged_statistic`]) while no rows were added to any.
    fn grow_merging(&mut self, total_groups: usize) {
        if self.statistics.is_empty() {
            self.merging = true;
        }
        self.push_statistics(total_groups);
    }

    fn push_statistics(&mut self, total_groups: usize) {
        while self.statistics.len() < total_groups {
            let s = if self.merging { self.call.merged_statistic() } else { self.call.statistic() };
            self.bytes += s.heap_size();
            self.statistics.push(s);
        }
    }

    /// Flushes every group's buffer when this batch's rows could overfill one: a group is
    /// announced at most the batch's rows, so no group's buffer then flushes by itself. When
    /// and how often buffers flush depends on the number of rows read, not on how they fall
    /// into groups (a group's own count would tell the time which groups its rows reached).
    fn flush_for(&mut self, rows: usize) {
        let limit = self.statistics.first().map_or(usize::MAX, Statistic::flush_rows);
        if self.rows_since_flush + rows > limit {
            self.statistics.iter_mut().for_each(Statistic::flush);
            self.rows_since_flush = 0;
        }
        self.rows_since_flush += rows;
    }

    fn take(&mut self, emit_to: EmitTo) -> Vec<C::Statistic> {
        let emitted = emit_to.take_needed(&mut self.statistics);
        if let EmitTo::First(n) = emit_to {
            self.rows.emitted(n);
        }
        self.bytes = self.bytes.saturating_sub(emitted.iter().map(Statistic::heap_size).sum());
        emitted
    }
}

impl<C: Release> std::fmt::Debug for PrivateGroups<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateGroups")
            .field("function", &self.function)
            .field("groups", &self.statistics.len())
            .finish()
    }
}

/// Heap bytes of the statistics of the groups with rows in `batch` (sizes may change when rows
/// are added).
fn touched_bytes<S: Statistic>(statistics: &[S], batch: &GroupedBatch) -> usize {
    batch.touched().map(|(g, _)| statistics[g].heap_size()).sum()
}

impl<C: Release> GroupsAccumulator for PrivateGroups<C> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups)?;
        self.flush_for(group_indices.len());
        let mut batch = GroupedBatch::new(group_indices, opt_filter, total_num_groups, &mut self.rows);
        let before = touched_bytes(&self.statistics, &batch);
        self.call.update_groups(&mut self.statistics, values, &mut batch)?;
        self.bytes = (self.bytes + touched_bytes(&self.statistics, &batch)).saturating_sub(before);
        Ok(())
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.grow_merging(total_num_groups);
        for (i, &g) in group_indices.iter().enumerate() {
            let row: Vec<ArrayRef> = values.iter().map(|a| a.slice(i, 1)).collect();
            let s = &mut self.statistics[g];
            let before = s.heap_size();
            s.merge(self.function, &row)?;
            self.bytes = (self.bytes + s.heap_size()).saturating_sub(before);
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let mut emitted = self.take(emit_to);
        if emitted.is_empty() {
            return Ok(new_empty_array(&self.result_type));
        }
        ScalarValue::iter_to_array(release_statistics(self.function, &self.call, &mut emitted, &self.cx)?)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let emitted = self.take(emit_to);
        C::Statistic::states(emitted, &self.state_types)
    }

    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        // Each row its own group: the statistic of that row alone (none when filtered out).
        let rows = values.first().map_or(0, |a| a.len());
        let states = (0..rows)
            .map(|i| {
                let mut s = self.call.statistic();
                if opt_filter.is_none_or(|f| f.is_valid(i) && f.value(i)) {
                    let row: Vec<ArrayRef> = values.iter().map(|a| a.slice(i, 1)).collect();
                    self.call.update(&mut s, &row)?;
                }
                Ok(s)
            })
            .collect::<Result<Vec<_>>>()?;
        C::Statistic::states(states, &self.state_types)
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.statistics.capacity() * size_of::<C::Statistic>() + self.bytes + self.rows.heap_size()
    }
}
