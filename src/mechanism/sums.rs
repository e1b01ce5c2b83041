//! Exact fixed-point sums with a fast buffer, shared by the statistics of the private
//! aggregates.
//!
//! The statistics are vectors of i128 (exact and associative, so partial states merge
//! bit-identically). Adding to an i128 with saturation costs several instructions per
//! entry, so hot loops add to an i64 buffer instead and the buffer is flushed into the
//! totals before it could overflow: a caller that adds at most `2^k` units per entry
//! and row sets `flush_rows = 2^(62−k)`, so a buffered entry never leaves ±2^62.
//!
//! Linear binning adds each row as a weight split between two neighbouring entries; its
//! split buffer ([`BufferedSums::buffer_split`]) records the row once, at its left entry,
//! and the flush recovers both weights exactly.

/// i128 totals plus an i64 buffer for at most `flush_rows` rows.
#[derive(Debug, Clone)]
pub struct BufferedSums {
    totals: Vec<i128>,
    /// Empty until used (a statistic that only bins linearly never needs it).
    pending: Vec<i64>,
    /// Entry l: (rows whose weight `unit` is split between l and l + 1, the sum of the
    /// parts that went to l + 1); one spare entry past the end, ignored. Empty until used.
    split: Vec<[i64; 2]>,
    split_unit: i64,
    pending_rows: usize,
    flush_rows: usize,
}

impl BufferedSums {
    /// Zero sums of length `len`, flushed every `flush_rows` rows.
    pub fn new(len: usize, flush_rows: usize) -> Self {
        assert!(flush_rows > 0);
        Self {
            totals: vec![0; len],
            pending: Vec::new(),
            split: Vec::new(),
            split_unit: 0,
            pending_rows: 0,
            flush_rows,
        }
    }

    /// The largest number of rows one [`BufferedSums::buffer`] call may announce.
    pub fn flush_rows(&self) -> usize {
        self.flush_rows
    }

    /// The buffer to add `rows` more rows to (flushed first if they would not fit).
    /// Panics if `rows > flush_rows` — a caller bug, never data-dependent.
    #[inline]
    pub fn buffer(&mut self, rows: usize) -> &mut [i64] {
        assert!(rows <= self.flush_rows, "announce at most flush_rows rows at a time");
        if self.pending.is_empty() {
            self.pending = vec![0; self.totals.len()];
        }
        if self.pending_rows + rows > self.flush_rows {
            self.flush();
        }
        self.pending_rows += rows;
        &mut self.pending
    }

    /// The split buffer (length `len() + 1`) to add `rows` more rows to, each as `(1, r)` at
    /// entry l: a weight `unit` of which `unit − r` belongs to entry l and `r` to entry l + 1
    /// (r = 0 when l is the last entry; entry `len()` is a spare for rows that add nothing).
    /// One read-modify-write per row instead of two. The same contract as
    /// [`BufferedSums::buffer`]: `flush_rows · unit ≤ 2^62`.
    #[inline]
    pub fn buffer_split(&mut self, rows: usize, unit: i64) -> &mut [[i64; 2]] {
        assert!(rows <= self.flush_rows, "announce at most flush_rows rows at a time");
        assert!(unit > 0 && (self.flush_rows as i128) * (unit as i128) <= 1 << 62, "a buffered sum could overflow");
        if self.split.is_empty() {
            self.split = vec![[0; 2]; self.totals.len() + 1];
            self.split_unit = unit;
        }
        assert_eq!(unit, self.split_unit, "one unit per buffer");
        if self.pending_rows + rows > self.flush_rows {
            self.flush();
        }
        self.pending_rows += rows;
        &mut self.split
    }

    /// The split buffer, for rows already announced with [`BufferedSums::buffer_split`] (a
    /// caller that announces a batch's rows per group, then adds them in row order). Empty
    /// before the first announcement.
    #[inline(always)]
    pub fn announced_split(&mut self) -> &mut [[i64; 2]] {
        &mut self.split
    }

    /// Adds exact sums of the same length (e.g. a partial state from another partition).
    pub fn merge(&mut self, other: &[i128]) {
        add_saturating(&mut self.totals, other);
    }

    fn flush(&mut self) {
        for (t, p) in self.totals.iter_mut().zip(self.pending.iter_mut()) {
            *t = t.saturating_add(*p as i128);
            *p = 0;
        }
        let len = self.totals.len();
        let unit = self.split_unit as i128;
        for l in 0..self.split.len().min(len) {
            let [rows, right] = std::mem::take(&mut self.split[l]);
            if rows != 0 {
                self.totals[l] = self.totals[l].saturating_add(rows as i128 * unit - right as i128);
                if l + 1 < len {
                    self.totals[l + 1] = self.totals[l + 1].saturating_add(right as i128);
                }
            }
        }
        if let Some(spare) = self.split.get_mut(len) {
            *spare = [0; 2];
        }
        self.pending_rows = 0;
    }

    /// The exact sums (flushes the buffer).
    pub fn totals(&mut self) -> &[i128] {
        if self.pending_rows > 0 {
            self.flush();
        }
        &self.totals
    }

    /// Number of sums.
    pub fn len(&self) -> usize {
        self.totals.len()
    }

    /// Whether there are no sums.
    pub fn is_empty(&self) -> bool {
        self.totals.is_empty()
    }

    /// Heap bytes held.
    pub fn heap_size(&self) -> usize {
        self.totals.capacity() * size_of::<i128>()
            + self.pending.capacity() * size_of::<i64>()
            + self.split.capacity() * size_of::<[i64; 2]>()
    }
}

/// The buffers a statistic's accumulation uses besides its totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffers {
    /// The i64 buffer ([`BufferedSums::buffer`]).
    Plain,
    /// The split buffer of linear binning ([`BufferedSums::buffer_split`]).
    Split,
}

/// The most heap bytes a [`BufferedSums`] of `len` sums holds when accumulating with `buffers`:
/// what planning budgets per state. The buffers are allocated when the first row arrives, so
/// whether a state holds them depends on the rows; planning counts them always, so that no
/// amount of data can make a query exceed the memory it was admitted with (SPEC §0).
pub fn most_heap_bytes(len: usize, buffers: Buffers) -> u64 {
    let len = len as u64;
    let totals = 16 * len;
    match buffers {
        Buffers::Plain => totals + 8 * len,
        Buffers::Split => totals + 16 * (len + 1),
    }
}

/// `a += b` element-wise, saturating (exact and order-independent below saturation).
pub fn add_saturating(a: &mut [i128], b: &[i128]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_add(*y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffered_rows_flush_before_the_buffer_could_overflow() {
        let mut s = BufferedSums::new(2, 4);
        for _ in 0..10 {
            let b = s.buffer(3);
            b[0] += 1 << 60;
            b[1] -= 1;
        }
        // Four rows of 2^60 would reach 2^62: with at most 4 rows buffered nothing wraps.
        assert_eq!(s.totals(), &[10 * (1i128 << 60), -10][..]);
        s.merge(&[i128::MAX, 0]);
        assert_eq!(s.totals()[0], i128::MAX, "totals saturate");
    }

    #[test]
    fn split_rows_flush_to_both_weights_exactly() {
        // Rows of weight 2^40 split (2^40 − r, r); the plain buffer in the same statistic.
        let unit = 1i64 << 40;
        let mut s = BufferedSums::new(3, 1 << 22);
        let mut reference = [0i128; 3];
        for (i, (l, r)) in
            [(0usize, 5i64), (1, unit), (1, 0), (0, 1 << 39), (2, 0)].into_iter().cycle().take(5_000_000).enumerate()
        {
            let b = s.buffer_split(1, unit);
            b[l][0] += 1;
            b[l][1] += r;
            reference[l] += (unit - r) as i128;
            if l < 2 {
                reference[l + 1] += r as i128;
            }
            if i % 1000 == 0 {
                s.buffer(1)[2] += 3;
                reference[2] += 3;
            }
        }
        // A dropped row in the spare entry adds nothing.
        s.buffer_split(1, unit)[3] = [1, 77];
        // 5·10^6 rows > flush_rows: flushed in between, and nothing wrapped.
        assert_eq!(s.totals(), &reference[..]);
        assert_eq!(reference.iter().sum::<i128>(), 5_000_000 * unit as i128 + 3 * 5000);
    }

    #[test]
    fn planning_counts_every_buffer_a_state_can_hold() {
        for len in [1, 7, 2515] {
            let mut plain = BufferedSums::new(len, 1 << 20);
            let empty = plain.heap_size() as u64;
            plain.buffer(1)[0] += 1;
            assert_eq!(plain.heap_size() as u64, most_heap_bytes(len, Buffers::Plain));
            assert!(empty < most_heap_bytes(len, Buffers::Plain), "a state grows when rows arrive");
            let mut split = BufferedSums::new(len, 1 << 20);
            split.buffer_split(1, 1 << 40)[0][0] += 1;
            assert_eq!(split.heap_size() as u64, most_heap_bytes(len, Buffers::Split));
        }
    }
}
