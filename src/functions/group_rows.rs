//! A batch's rows by group: what the vectorised (GROUP BY) form of a private aggregate hands
//! each function. A function may scatter the rows straight into their groups (each row's group
//! is `indices()[row]`), or read one group's rows at a time ([`GroupedBatch::ordered`], a
//! counting sort done only when asked for).

use std::mem::size_of;

use datafusion::arrow::array::{Array, BooleanArray};

/// One batch's group indices and FILTER, with the scratch that orders its rows by group.
#[derive(Debug)]
pub struct GroupedBatch<'a> {
    indices: &'a [usize],
    filter: Option<&'a BooleanArray>,
    rows: &'a mut GroupRows,
    placed: bool,
}

impl<'a> GroupedBatch<'a> {
    /// The batch whose row i belongs to group `indices[i]` (below `total_groups`), `filter`
    /// dropping rows (a FILTER clause), with `rows` as scratch: counts each group's rows.
    pub fn new(
        indices: &'a [usize],
        filter: Option<&'a BooleanArray>,
        total_groups: usize,
        rows: &'a mut GroupRows,
    ) -> Self {
        rows.count(indices, total_groups);
        Self { indices, filter, rows, placed: false }
    }

    /// Each row's group.
    pub fn indices(&self) -> &[usize] {
        self.indices
    }

    /// The FILTER clause's mask (a row is kept where it is valid and true).
    pub fn filter(&self) -> Option<&BooleanArray> {
        self.filter
    }

    /// Each group with rows in the batch (in order of first appearance) and how many, FILTER
    /// ignored: the groups a scatter may write to, and at most how many rows each gets.
    pub fn touched(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.rows.groups.iter().map(|&g| (g, self.rows.counts[g] as usize))
    }

    /// The rows the FILTER keeps, by group (ordered on the first call).
    pub fn ordered(&mut self) -> &GroupRows {
        if !self.placed {
            self.rows.place(self.indices, self.filter);
            self.placed = true;
        }
        self.rows
    }
}

/// A batch's rows ordered by group: for each group that has rows (in order of first
/// appearance), its row indices in ascending order. Rows a FILTER clause drops are left out.
#[derive(Debug, Default)]
pub struct GroupRows {
    /// Rows per group index in the batch counted last (zero for every other group).
    counts: Vec<u32>,
    /// Groups with rows, in order of first appearance.
    groups: Vec<usize>,
    /// `starts[k]..ends[k]` are the kept rows of `groups[k]` in `rows`.
    starts: Vec<usize>,
    ends: Vec<usize>,
    rows: Vec<u32>,
}

impl GroupRows {
    /// Counts the rows of one batch per group (`group_indices[i]` is row i's group, below
    /// `total_groups`), forgetting the batch before.
    fn count(&mut self, group_indices: &[usize], total_groups: usize) {
        for &g in &self.groups {
            self.counts[g] = 0;
        }
        self.groups.clear();
        self.starts.clear();
        self.ends.clear();
        if self.counts.len() < total_groups {
            self.counts.resize(total_groups, 0);
        }
        for &g in group_indices {
            if self.counts[g] == 0 {
                self.groups.push(g);
            }
            self.counts[g] += 1;
        }
    }

    /// Places the counted batch's kept rows by group.
    fn place(&mut self, group_indices: &[usize], filter: Option<&BooleanArray>) {
        self.starts.clear();
        let mut end = 0;
        for &g in &self.groups {
            self.starts.push(end);
            end += self.counts[g] as usize;
        }
        // Each group's next free slot, in its count (restored below).
        for (&g, &start) in self.groups.iter().zip(&self.starts) {
            self.counts[g] = start as u32;
        }
        self.rows.clear();
        self.rows.resize(end, 0);
        let kept = |i: usize| filter.is_none_or(|f| f.is_valid(i) && f.value(i));
        for (i, &g) in group_indices.iter().enumerate() {
            if kept(i) {
                let slot = &mut self.counts[g];
                self.rows[*slot as usize] = i as u32;
                *slot += 1;
            }
        }
        self.ends.clear();
        self.ends.extend(self.groups.iter().map(|&g| self.counts[g] as usize));
        let next_starts = self.starts.iter().skip(1).copied().chain([end]);
        for ((&g, &start), next) in self.groups.iter().zip(&self.starts).zip(next_starts) {
            self.counts[g] = (next - start) as u32;
        }
    }

    /// Each group with kept rows and their indices in the batch.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[u32])> {
        self.groups
            .iter()
            .zip(self.starts.iter().zip(&self.ends))
            .filter(|(_, (s, e))| e > s)
            .map(|(&g, (&s, &e))| (g, &self.rows[s..e]))
    }

    /// Drops the first `n` groups' scratch (their indices shift down by `n`).
    pub(crate) fn emitted(&mut self, n: usize) {
        for &g in &self.groups {
            self.counts[g] = 0;
        }
        self.groups.clear();
        self.starts.clear();
        self.ends.clear();
        self.counts.drain(..n.min(self.counts.len()));
    }

    pub(crate) fn heap_size(&self) -> usize {
        self.counts.capacity() * size_of::<u32>()
            + (self.groups.capacity() + self.starts.capacity() + self.ends.capacity()) * size_of::<usize>()
            + self.rows.capacity() * size_of::<u32>()
    }
}
