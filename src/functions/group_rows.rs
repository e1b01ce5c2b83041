//! A batch's rows ordered by group: what the vectorised (GROUP BY) form of a private aggregate
//! hands each function, so that it reads one group's rows at a time.

use std::mem::size_of;

use datafusion::arrow::array::{Array, BooleanArray};

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
    pub(crate) fn emitted(&mut self, n: usize) {
        self.counts.drain(..n.min(self.counts.len()));
    }

    pub(crate) fn heap_size(&self) -> usize {
        self.counts.capacity() * size_of::<u32>()
            + (self.groups.capacity() + self.starts.capacity()) * size_of::<usize>()
            + self.rows.capacity() * size_of::<u32>()
    }
}
