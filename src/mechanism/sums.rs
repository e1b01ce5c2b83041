//! Exact fixed-point sums with a fast buffer, shared by the statistics of the private
//! aggregates.
//!
//! The statistics are vectors of i128 (exact and associative, so partial states merge
//! bit-identically). Adding to an i128 with saturation costs several instructions per
//! entry, so hot loops add to an i64 buffer instead and the buffer is flushed into the
//! totals before it could overflow: a caller that adds at most `2^k` units per entry
//! and row sets `flush_rows = 2^(62−k)`, so a buffered entry never leaves ±2^62.

/// i128 totals plus an i64 buffer for at most `flush_rows` rows.
#[derive(Debug, Clone)]
pub struct BufferedSums {
    totals: Vec<i128>,
    pending: Vec<i64>,
    pending_rows: usize,
    flush_rows: usize,
}

impl BufferedSums {
    /// Zero sums of length `len`, flushed every `flush_rows` rows.
    pub fn new(len: usize, flush_rows: usize) -> Self {
        assert!(flush_rows > 0);
        Self { totals: vec![0; len], pending: vec![0; len], pending_rows: 0, flush_rows }
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
        if self.pending_rows + rows > self.flush_rows {
            self.flush();
        }
        self.pending_rows += rows;
        &mut self.pending
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
        self.totals.capacity() * size_of::<i128>() + self.pending.capacity() * size_of::<i64>()
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
}
