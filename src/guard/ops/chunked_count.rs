//! A partition selection's count of rows per candidate group, in fixed chunks ([`Chunked`]): what
//! DataFusion's `count` computes, without its vector of counts, which doubles — copying every
//! group's count when one more group crosses a power of two, a step of `O(groups)` time at a count
//! of groups that an analyst filtering rows with WHERE could time (SPEC §0). One more group costs
//! at most one chunk, and the planned memory counts 8 bytes a group (not 16).

use std::mem::size_of_val;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::Result;
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};

use super::chunked::Chunked;
use super::unit_bound::passes;

/// Counts per chunk.
const COUNTS_PER_CHUNK: usize = 4096;

/// Each group's count of non-NULL values (module docs).
pub(crate) struct ChunkedCount {
    counts: Chunked<i64, COUNTS_PER_CHUNK>,
}

impl ChunkedCount {
    /// The most bytes one more group adds: its count and its share of the chunks' pointers.
    pub(crate) const BYTES_PER_GROUP: usize =
        size_of::<i64>() + Chunked::<i64, COUNTS_PER_CHUNK>::POINTER_BYTES_PER_ITEM;

    /// No group yet, with its first chunk (so that what it holds empty includes one chunk).
    pub(crate) fn new() -> Self {
        Self { counts: Chunked::with_first_chunk() }
    }

    fn emit(&mut self, emit_to: EmitTo) -> ArrayRef {
        let counts: Int64Array = match emit_to {
            // Every group: the chunks stay for the groups that follow (a spill window's).
            EmitTo::All => {
                let out = self.counts.iter().copied().collect();
                self.counts.clear();
                out
            }
            EmitTo::First(n) => self.counts.take_first(n).into_iter().collect(),
        };
        Arc::new(counts)
    }
}

impl std::fmt::Debug for ChunkedCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkedCount {{ groups: {} }}", self.counts.len())
    }
}

impl GroupsAccumulator for ChunkedCount {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.counts.resize(total_num_groups);
        let nulls = values[0].logical_nulls();
        for (i, &g) in group_indices.iter().enumerate() {
            if passes(opt_filter, i) && nulls.as_ref().is_none_or(|n| n.is_valid(i)) {
                self.counts[g] += 1;
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.counts.resize(total_num_groups);
        let partial = values[0].as_primitive::<Int64Type>();
        for (i, &g) in group_indices.iter().enumerate() {
            if partial.is_valid(i) {
                self.counts[g] += partial.value(i);
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.emit(emit_to))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.emit(emit_to)])
    }

    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        // Each row its own group: a count of 1 or 0.
        let nulls = values[0].logical_nulls();
        let counts: Int64Array = (0..values[0].len())
            .map(|i| i64::from(passes(opt_filter, i) && nulls.as_ref().is_none_or(|n| n.is_valid(i))))
            .collect();
        Ok(vec![Arc::new(counts)])
    }

    fn size(&self) -> usize {
        size_of_val(self) + self.counts.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(a: &ArrayRef) -> Vec<i64> {
        a.as_primitive::<Int64Type>().values().to_vec()
    }

    /// Counts non-NULL values that pass the filter, merges partial counts, emits all or the
    /// first groups — across chunks.
    #[test]
    fn counts_as_count_does_across_chunks() {
        let n = 3 * COUNTS_PER_CHUNK + 7;
        let groups: Vec<usize> = (0..2 * n).map(|i| i % n).collect();
        let values: ArrayRef = Arc::new(Int64Array::from_iter((0..2 * n).map(|i| (i % 5 != 0).then_some(1))));
        let filter = BooleanArray::from_iter((0..2 * n).map(|i| Some(i % 7 != 0)));
        let want: Vec<i64> =
            (0..n).map(|g| [g, g + n].iter().filter(|&&i| i % 5 != 0 && i % 7 != 0).count() as i64).collect();
        let mut a = ChunkedCount::new();
        a.update_batch(&[Arc::clone(&values)], &groups, Some(&filter), n).unwrap();
        let state = a.state(EmitTo::All).unwrap();
        assert_eq!(ints(&state[0]), want);
        assert_eq!(a.counts.len(), 0, "emptied");
        // Merged twice into one group each: doubled.
        let mut b = ChunkedCount::new();
        b.merge_batch(&state, &(0..n).collect::<Vec<_>>(), n).unwrap();
        b.merge_batch(&state, &(0..n).collect::<Vec<_>>(), n).unwrap();
        let first = b.evaluate(EmitTo::First(5)).unwrap();
        assert_eq!(ints(&first), want[..5].iter().map(|c| 2 * c).collect::<Vec<_>>());
        let rest = b.evaluate(EmitTo::All).unwrap();
        assert_eq!(ints(&rest), want[5..].iter().map(|c| 2 * c).collect::<Vec<_>>());
        // Each row as its own state, merged: the counts again.
        let rows = a.convert_to_state(&[values], Some(&filter)).unwrap();
        let mut c = ChunkedCount::new();
        c.merge_batch(&rows, &groups, n).unwrap();
        assert_eq!(ints(&c.evaluate(EmitTo::All).unwrap()), want);
    }

    /// SPEC §0: one more group adds at most one chunk and never moves the counts; what it holds
    /// is within the bytes a group adds, plus the first chunk.
    #[test]
    fn one_more_group_adds_at_most_a_chunk() {
        let mut a = ChunkedCount::new();
        let empty = a.size();
        let one: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let mut steps = Vec::new();
        for g in 0..5 * COUNTS_PER_CHUNK {
            let before = a.size();
            a.update_batch(&[Arc::clone(&one)], &[g], None, g + 1).unwrap();
            if a.size() != before {
                steps.push((g, a.size() - before));
            }
            assert!(a.size() <= empty + (g + 1) * ChunkedCount::BYTES_PER_GROUP + COUNTS_PER_CHUNK * 8);
        }
        // A chunk at each multiple of the chunk's size (the directory of chunks also grows then).
        assert!(steps.iter().all(|&(g, bytes)| g % COUNTS_PER_CHUNK == 0 && bytes <= COUNTS_PER_CHUNK * 8 + 64));
        assert_eq!(steps.len(), 4, "{steps:?}");
    }
}
