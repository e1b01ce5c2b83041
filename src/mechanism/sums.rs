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
///
/// The work does not depend on the values added: the buffer is allocated with the totals (not
/// when the first row arrives, which would make a group's first row cost an allocation its
/// absence does not), and a flush adds every entry, zero or not, without a branch on it.
#[derive(Debug, Clone)]
pub struct BufferedSums {
    totals: Vec<i128>,
    /// The plain buffer ([`Buffers::Plain`]; empty for [`Buffers::Split`]).
    pending: Vec<i64>,
    /// Entry l: (rows whose weight `unit` is split between l and l + 1, the sum of the
    /// parts that went to l + 1); one spare entry past the end, ignored ([`Buffers::Split`];
    /// empty for [`Buffers::Plain`]).
    split: Vec<[i64; 2]>,
    split_unit: i64,
    pending_rows: usize,
    flush_rows: usize,
    /// Flushes so far (the tests check that they depend on rows, not values).
    flushes: u64,
}

impl BufferedSums {
    /// Zero sums of length `len`, with the buffer `buffers` for at most `flush_rows` rows.
    pub fn new(len: usize, flush_rows: usize, buffers: Buffers) -> Self {
        assert!(flush_rows > 0);
        let (pending, split) = match buffers {
            Buffers::Plain => (vec![0; len], Vec::new()),
            Buffers::Split => (Vec::new(), vec![[0; 2]; len + 1]),
            Buffers::None => (Vec::new(), Vec::new()),
        };
        Self { totals: vec![0; len], pending, split, split_unit: 0, pending_rows: 0, flush_rows, flushes: 0 }
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
        assert!(self.pending.len() == self.totals.len(), "a statistic made with Buffers::Plain");
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
        assert!(!self.split.is_empty(), "a statistic made with Buffers::Split");
        if self.split_unit == 0 {
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
    /// caller that announces a batch's rows per group, then adds them in row order).
    #[inline(always)]
    pub fn announced_split(&mut self) -> &mut [[i64; 2]] {
        &mut self.split
    }

    /// Adds exact sums of the same length (e.g. a partial state from another partition).
    pub fn merge(&mut self, other: &[i128]) {
        add_saturating(&mut self.totals, other);
    }

    /// Adds the buffer into the totals and empties it: every entry, whatever it holds.
    pub fn flush(&mut self) {
        self.flushes += 1;
        for (t, p) in self.totals.iter_mut().zip(self.pending.iter_mut()) {
            *t = t.saturating_add(*p as i128);
            *p = 0;
        }
        let unit = self.split_unit as i128;
        if let Some((spare, entries)) = self.split.split_last_mut() {
            // Entry l's rows put `rows·unit − right` on l and `right` on l + 1 (nothing past the
            // last entry: its rows have r = 0). Zero entries add zero; no branch on them.
            let mut carry = 0i128;
            for (t, e) in self.totals.iter_mut().zip(entries.iter_mut()) {
                let [rows, right] = std::mem::take(e);
                *t = t.saturating_add(carry).saturating_add(rows as i128 * unit - right as i128);
                carry = right as i128;
            }
            *spare = [0; 2];
        }
        self.pending_rows = 0;
    }

    /// Flushes so far.
    pub fn flushes(&self) -> u64 {
        self.flushes
    }

    /// The exact sums (flushes the buffer, whether or not rows were added since the last flush).
    pub fn totals(&mut self) -> &[i128] {
        self.flush();
        &self.totals
    }

    /// Appends to `out` the exact sums [`Self::totals`] would give, in one pass that leaves this
    /// statistic as it is (for one about to be dropped: writing its buffer into its totals first
    /// would move every entry twice more). The same saturating additions in the same order as
    /// [`Self::flush`], so the values are bit-identical.
    pub fn append_totals(&self, out: &mut Vec<i128>) {
        if !self.pending.is_empty() {
            out.extend(self.totals.iter().zip(&self.pending).map(|(t, p)| t.saturating_add(*p as i128)));
        } else if let Some((_, entries)) = self.split.split_last() {
            let unit = self.split_unit as i128;
            let mut carry = 0i128;
            out.extend(self.totals.iter().zip(entries).map(|(t, &[rows, right])| {
                let t = t.saturating_add(carry).saturating_add(rows as i128 * unit - right as i128);
                carry = right as i128;
                t
            }));
        } else {
            out.extend_from_slice(&self.totals);
        }
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
    /// None: a statistic that only merges exact totals (a final phase's); adding rows to it is
    /// a caller bug.
    None,
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
        Buffers::None => totals,
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
        let mut s = BufferedSums::new(2, 4, Buffers::Plain);
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
        // Rows of weight 2^40 split (2^40 − r, r).
        let unit = 1i64 << 40;
        let mut s = BufferedSums::new(3, 1 << 22, Buffers::Split);
        let mut reference = [0i128; 3];
        for (l, r) in [(0usize, 5i64), (1, unit), (1, 0), (0, 1 << 39), (2, 0)].into_iter().cycle().take(5_000_000) {
            let b = s.buffer_split(1, unit);
            b[l][0] += 1;
            b[l][1] += r;
            reference[l] += (unit - r) as i128;
            if l < 2 {
                reference[l + 1] += r as i128;
            }
        }
        // A dropped row in the spare entry adds nothing.
        s.buffer_split(1, unit)[3] = [1, 77];
        // 5·10^6 rows > flush_rows: flushed in between, and nothing wrapped.
        assert_eq!(s.totals(), &reference[..]);
        assert_eq!(reference.iter().sum::<i128>(), 5_000_000 * unit as i128);
    }

    #[test]
    fn appended_totals_are_the_flushed_totals_bit_for_bit() {
        // Every kind of buffer, rows pending in it (after an earlier flush, and a total near
        // saturation), a dropped row in the split buffer's spare entry.
        let (len, unit) = (11, 1i64 << 40);
        for buffers in [Buffers::Plain, Buffers::Split, Buffers::None] {
            let mut s = BufferedSums::new(len, 100, buffers);
            let mut near_max = vec![0i128; len];
            near_max[3] = i128::MAX - 5;
            s.merge(&near_max);
            for (batch, rows) in [100, 37].into_iter().enumerate() {
                match buffers {
                    Buffers::Plain => {
                        let b = s.buffer(rows);
                        for (l, r) in split_rows(rows, len - 1, batch) {
                            b[l] += r + 1;
                        }
                    }
                    Buffers::Split => {
                        let b = s.buffer_split(rows, unit);
                        for (l, r) in split_rows(rows, len, batch) {
                            b[l][0] += 1;
                            b[l][1] += if l < len - 1 { r } else { 0 };
                        }
                    }
                    Buffers::None => s.merge(&vec![batch as i128 + 7; len]),
                }
            }
            let mut appended = vec![42];
            s.append_totals(&mut appended);
            let unchanged = s.flushes();
            assert_eq!(&appended[1..], s.totals(), "{buffers:?}");
            assert_eq!(s.flushes(), unchanged + 1, "appending flushed nothing");
            assert_eq!(appended[4], i128::MAX, "saturated as the flush saturates");
        }
        // Negative control: a statistic with other rows appends other totals.
        let (mut a, mut b) = (BufferedSums::new(3, 10, Buffers::Split), BufferedSums::new(3, 10, Buffers::Split));
        a.buffer_split(1, unit)[0] = [1, 5];
        b.buffer_split(1, unit)[0] = [1, 6];
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.append_totals(&mut x);
        b.append_totals(&mut y);
        assert_ne!(x, y);
    }

    #[test]
    fn planning_counts_every_buffer_a_state_can_hold() {
        for len in [1, 7, 2515] {
            for buffers in [Buffers::Plain, Buffers::Split, Buffers::None] {
                // Allocated whole when made: a first row (or merge) allocates nothing.
                let mut s = BufferedSums::new(len, 1 << 20, buffers);
                assert_eq!(s.heap_size() as u64, most_heap_bytes(len, buffers));
                match buffers {
                    Buffers::Plain => s.buffer(1)[0] += 1,
                    Buffers::Split => s.buffer_split(1, 1 << 40)[0][0] += 1,
                    Buffers::None => s.merge(&vec![1; len]),
                }
                assert_eq!(s.heap_size() as u64, most_heap_bytes(len, buffers), "{buffers:?}");
            }
        }
    }

    /// Every entry's rows, `(left entry, right part)`, for `rows` rows (the spare entry `len`
    /// for some).
    fn split_rows(rows: usize, len: usize, seed: usize) -> Vec<(usize, i64)> {
        (0..rows).map(|i| ((i * 7 + seed) % (len + 1), ((i * 13 + seed) % 1000) as i64)).collect()
    }

    #[test]
    fn the_work_depends_on_the_rows_added_not_on_their_values() {
        // Two statistics fed the same number of rows with different values — one of them all
        // dropped (the spare entry), every other entry zero — flush as often and hold the same
        // memory; their totals still differ. What a GROUP BY group costs therefore depends on
        // how many rows it is announced, never on what they are.
        let (len, unit) = (9, 1i64 << 40);
        let mut a = BufferedSums::new(len, 1000, Buffers::Split);
        let mut b = BufferedSums::new(len, 1000, Buffers::Split);
        for (batch, rows) in [700, 300, 1, 999, 1000, 0, 5].into_iter().enumerate() {
            let split = a.buffer_split(rows, unit);
            for (l, r) in split_rows(rows, len, batch) {
                split[l][0] += 1;
                split[l][1] += if l < len - 1 { r } else { 0 };
            }
            b.buffer_split(rows, unit)[len][0] += rows as i64;
        }
        let (ta, tb) = (a.totals().to_vec(), b.totals().to_vec());
        assert!(ta.iter().any(|&t| t != 0) && tb.iter().all(|&t| t == 0));
        assert_eq!((a.flushes(), a.heap_size()), (b.flushes(), b.heap_size()));
        // Reading the totals flushes whether or not rows came since the last flush.
        let before = (a.flushes(), b.flushes());
        let _ = (a.totals(), b.totals());
        assert_eq!((a.flushes(), b.flushes()), (before.0 + 1, before.1 + 1));
        // Negative control: the count does see rows — one more row over the limit is one more flush.
        let mut c = BufferedSums::new(len, 1000, Buffers::Split);
        for rows in [700, 300, 1] {
            c.buffer_split(rows, unit);
        }
        let mut d = BufferedSums::new(len, 1000, Buffers::Split);
        for rows in [700, 300] {
            d.buffer_split(rows, unit);
        }
        assert_eq!(c.flushes(), d.flushes() + 1);
    }
}
