//! The vectorised form of every private aggregate under GROUP BY: one [`GroupsAccumulator`]
//! holding each group's exact statistic, instead of DataFusion's adapter around one boxed
//! [`super::aggregate::PrivateAccumulator`] per group (which copies every batch into per-group
//! arrays with `take` and calls each accumulator through a trait object).
//!
//! A batch's rows are first ordered by group ([`GroupRows`], a counting sort in O(rows)); each
//! group's rows then go to [`Release::update_groups`], which a function may implement on the raw
//! column (the KDE bins straight from the batch's f64 slice) or leave to the default, which takes
//! the rows into arrays and calls [`Release::update`]. Statistics are exact fixed-point sums, so
//! the result is bit-identical to the per-group accumulators whatever order rows arrive in. Each
//! group releases exactly as a [`super::aggregate::PrivateAccumulator`] does: permit first, noise
//! once, stored release kept.

use std::mem::{size_of, size_of_val};

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, UInt32Array, new_empty_array};
use datafusion::arrow::compute::take_arrays;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};

use super::aggregate::{Release, Statistic, release_statistic};
use super::call::CallContext;

/// A batch's rows ordered by group: for each group that has rows (in order of first
/// appearance), its row indices in ascending order. Rows a FILTER clause drops are left out.
#[derive(Debug, Default)]
pub struct GroupRows {
    /// Rows per group index (all zero between batches; grows with the number of groups).
    counts: Vec<u32>,
    /// Groups with rows, in order of first appearance.
    groups: Vec<usize>,
    /// `starts[k]..starts[k + 1]` are the rows of `groups[k]` in `rows`.
    starts: Vec<usize>,
    rows: Vec<u32>,
}

impl GroupRows {
    /// Orders the rows of one batch (`group_indices[i]` is row i's group, below `total_groups`).
    pub fn order(&mut self, group_indices: &[usize], filter: Option<&BooleanArray>, total_groups: usize) {
        if self.counts.len() < total_groups {
            self.counts.resize(total_groups, 0);
        }
        self.groups.clear();
        let kept = |i: usize| filter.is_none_or(|f| f.is_valid(i) && f.value(i));
        for (i, &g) in group_indices.iter().enumerate() {
            if kept(i) {
                if self.counts[g] == 0 {
                    self.groups.push(g);
                }
                self.counts[g] += 1;
            }
        }
        self.starts.clear();
        self.starts.push(0);
        let mut end = 0;
        for &g in &self.groups {
            end += self.counts[g] as usize;
            self.starts.push(end);
        }
        // Each group's next free slot, reusing its count (reset to zero below).
        for (k, &g) in self.groups.iter().enumerate() {
            self.counts[g] = self.starts[k] as u32;
        }
        self.rows.clear();
        self.rows.resize(end, 0);
        for (i, &g) in group_indices.iter().enumerate() {
            if kept(i) {
                let slot = &mut self.counts[g];
                self.rows[*slot as usize] = i as u32;
                *slot += 1;
            }
        }
        for &g in &self.groups {
            self.counts[g] = 0;
        }
    }

    /// Each group with rows and its rows' indices in the batch.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[u32])> {
        self.groups.iter().zip(self.starts.windows(2)).map(|(&g, s)| (g, &self.rows[s[0]..s[1]]))
    }

    /// Drops the first `n` groups' scratch (their indices shift down by `n`).
    fn emitted(&mut self, n: usize) {
        self.counts.drain(..n.min(self.counts.len()));
    }

    fn heap_size(&self) -> usize {
        self.counts.capacity() * size_of::<u32>()
            + (self.groups.capacity() + self.starts.capacity()) * size_of::<usize>()
            + self.rows.capacity() * size_of::<u32>()
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

/// Every group's statistic of one validated call (module docs).
pub struct PrivateGroups<C: Release> {
    function: &'static str,
    call: C,
    cx: CallContext,
    statistics: Vec<C::Statistic>,
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

    pub(crate) fn grow(&mut self, total_groups: usize) {
        while self.statistics.len() < total_groups {
            let s = self.call.statistic();
            self.bytes += s.heap_size();
            self.statistics.push(s);
        }
    }

    fn take(&mut self, emit_to: EmitTo) -> Vec<C::Statistic> {
        let emitted = emit_to.take_needed(&mut self.statistics);
        if let EmitTo::First(n) = emit_to {
            self.rows.emitted(n);
        }
        self.bytes = self.bytes.saturating_sub(emitted.iter().map(Statistic::heap_size).sum());
        emitted
    }

    /// Heap bytes of the touched groups' statistics (sizes may change when rows are added).
    fn touched_bytes(&self) -> usize {
        self.rows.iter().map(|(g, _)| self.statistics[g].heap_size()).sum()
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

/// Columns of per-group state rows (`states[g][column]`), or empty arrays of `types`.
fn state_columns(states: Vec<Vec<ScalarValue>>, types: &[DataType]) -> Result<Vec<ArrayRef>> {
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

impl<C: Release> GroupsAccumulator for PrivateGroups<C> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        self.rows.order(group_indices, opt_filter, total_num_groups);
        let before = self.touched_bytes();
        self.call.update_groups(&mut self.statistics, values, &self.rows)?;
        self.bytes = (self.bytes + self.touched_bytes()).saturating_sub(before);
        Ok(())
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.grow(total_num_groups);
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
        let emitted = self.take(emit_to);
        if emitted.is_empty() {
            return Ok(new_empty_array(&self.result_type));
        }
        let results = emitted
            .into_iter()
            .map(|mut s| release_statistic(self.function, &self.call, &mut s, &self.cx))
            .collect::<Result<Vec<_>>>()?;
        ScalarValue::iter_to_array(results)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let emitted = self.take(emit_to);
        let states = emitted.into_iter().map(|mut s| s.state()).collect::<Result<Vec<_>>>()?;
        state_columns(states, &self.state_types)
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
                s.state()
            })
            .collect::<Result<Vec<_>>>()?;
        state_columns(states, &self.state_types)
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.statistics.capacity() * size_of::<C::Statistic>() + self.bytes + self.rows.heap_size()
    }
}
