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

    /// Each group with rows in the batch and how many, FILTER ignored (in ascending order
    /// when the batch has at least as many rows as there are groups, else in order of first
    /// appearance): the groups a scatter may write to, and at most how many rows each gets.
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

/// A batch's rows ordered by group: for each group that has rows (in the order of
/// [`GroupedBatch::touched`]), its row indices in ascending order. Rows a FILTER clause drops are left out.
#[derive(Debug, Default)]
pub struct GroupRows {
    /// Rows per group index in the batch counted last (zero for every other group).
    counts: Vec<u32>,
    /// Groups with rows (see [`GroupedBatch::touched`] for their order).
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
        if total_groups <= group_indices.len() {
            // Few groups for the batch: one add per row, no branch on whether a group is new,
            // then one pass over the groups to list those with rows. The condition keeps that
            // pass no longer than the batch: with more groups than rows (units, many keys) it
            // would cost every batch the group count, a time that grows with the data.
            for &g in group_indices {
                self.counts[g] += 1;
            }
            let counts = &self.counts;
            self.groups.extend((0..total_groups).filter(|&g| counts[g] > 0));
        } else {
            for &g in group_indices {
                if self.counts[g] == 0 {
                    self.groups.push(g);
                }
                self.counts[g] += 1;
            }
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

#[cfg(test)]
mod tests {
    use rand::rngs::ChaCha20Rng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    /// Checks one counted batch against its definition: every group with rows listed once with
    /// its row count, and its kept rows in ascending order.
    fn check(batch: &mut GroupedBatch, indices: &[usize], keep: &dyn Fn(usize) -> bool) {
        let touched: Vec<(usize, usize)> = batch.touched().collect();
        let mut listed: Vec<usize> = touched.iter().map(|&(g, _)| g).collect();
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(listed.len(), touched.len(), "a group listed twice");
        for &(g, n) in &touched {
            assert_eq!(n, indices.iter().filter(|&&h| h == g).count(), "rows of group {g}");
        }
        assert_eq!(touched.iter().map(|&(_, n)| n).sum::<usize>(), indices.len());
        let mut placed = 0;
        for (g, rows) in batch.ordered().iter() {
            let want: Vec<u32> = (0..indices.len()).filter(|&i| indices[i] == g && keep(i)).map(|i| i as u32).collect();
            assert_eq!(rows, &want[..], "kept rows of group {g}");
            placed += rows.len();
        }
        assert_eq!(placed, (0..indices.len()).filter(|&i| keep(i)).count());
    }

    #[test]
    fn each_batch_is_counted_and_ordered_by_group_whatever_its_size() {
        // Batches with more rows than groups (counted branch-free, groups listed in ascending
        // order) and with fewer (groups listed as they appear), one scratch for all of them: a
        // batch must forget the one before.
        let filter: BooleanArray = (0..1000).map(|i| (i % 7 != 0).then_some(i % 3 != 0)).collect();
        let keep = |i: usize| filter.is_valid(i) && filter.value(i);
        let mut scratch = GroupRows::default();
        let mut rng = ChaCha20Rng::seed_from_u64(17);
        for (len, total) in [(1000, 10), (5, 300), (1000, 1000), (0, 4), (999, 1000), (40, 3), (1, 1)] {
            let indices: Vec<usize> = (0..len).map(|_| rng.random_range(0..total)).collect();
            let mut batch = GroupedBatch::new(&indices, None, total, &mut scratch);
            check(&mut batch, &indices, &|_| true);
            if total <= len {
                let order: Vec<usize> = batch.touched().map(|(g, _)| g).collect();
                assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
            }
            let mask = filter.slice(0, len);
            let mut batch = GroupedBatch::new(&indices, Some(&mask), total, &mut scratch);
            check(&mut batch, &indices, &keep);
        }
        // Negative control: the definition above catches a row placed in the wrong group.
        let indices = [0, 1, 1, 0];
        let mut batch = GroupedBatch::new(&indices, None, 2, &mut scratch);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&mut batch, &[0, 1, 0, 0], &|_| true);
        }));
        assert!(caught.is_err());
    }
}
