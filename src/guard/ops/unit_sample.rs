//! One privacy unit's kept rows ([`Sample`]) and the store of a partition's samples
//! ([`Samples`]), laid out so that the most bytes one row can add to them is small: the bound's
//! memory is planned from that worst case (every row a new unit), so it decides how often the
//! bound spills ([`super::unit_bound::UnitBound::most_bytes_per_row`]).
//!
//! * A unit of one row allocates nothing: its first kept group and that group's first row are held
//!   inline in its sample, and a short row's encoding inline in its entry.
//! * A unit's vector of kept groups grows by one group at a time (it never shrinks, so it is
//!   reallocated at most `L − 1` times over the unit's life); a group's kept rows at most double.
//! * The samples sit in fixed chunks, so the store never holds room for twice its units (a vector
//!   of samples doubles) nor copies them when it grows.

use std::mem::size_of;

use smallvec::SmallVec;

use super::chunked::Chunked;

/// A 128-bit order as two words, high first: it compares as the `u128` does, with 8-byte
/// alignment (a `u128` aligns to 16 and padded every kept row).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Order([u64; 2]);

impl Order {
    pub(super) const MAX: Self = Self([u64::MAX; 2]);

    pub(super) fn new(v: u128) -> Self {
        Self([(v >> 64) as u64, v as u64])
    }

    pub(super) fn get(self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }

    /// The low word (a cheap value to touch a cache line with).
    pub(super) fn low(self) -> u64 {
        self.0[1]
    }
}

/// One kept row's encoding: inline when short (most rows of a few numeric columns), so that
/// keeping and dropping rows does not allocate.
#[derive(Debug)]
enum RowBytes {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

/// The longest row encoding held inline.
pub(super) const INLINE: usize = 22;

impl RowBytes {
    fn new(row: &[u8]) -> Self {
        if row.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..row.len()].copy_from_slice(row);
            Self::Inline { len: row.len() as u8, bytes }
        } else {
            Self::Heap(row.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..*len as usize],
            Self::Heap(b) => b,
        }
    }

    /// Bytes held outside the value itself.
    fn heap(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            Self::Heap(b) => b.len(),
        }
    }
}

type Entry = (Order, RowBytes);
type Rows1 = SmallVec<[Entry; 1]>;

/// One kept group: its order and its kept rows by ascending row order (in Arrow's row encoding);
/// a group of one row allocates nothing.
#[derive(Debug)]
struct Kept {
    group: Order,
    rows: Rows1,
}

impl Kept {
    /// Heap bytes held by the group's rows.
    fn heap(&self) -> usize {
        spilled_bytes(&self.rows) + self.rows.iter().map(|(_, r)| r.heap()).sum::<usize>()
    }
}

/// Bytes of a small vector's heap buffer (none while inline).
fn spilled_bytes<A: smallvec::Array>(v: &SmallVec<A>) -> usize {
    if v.spilled() { v.capacity() * size_of::<A::Item>() } else { 0 }
}

/// One unit's kept groups, by ascending group order.
#[derive(Debug)]
pub(super) struct Sample {
    /// A row can be kept only if its group order is at most this: the `L`-th kept group's order
    /// once `L` groups are kept, the largest order before.
    threshold: Order,
    /// The unit's hash; `Order::MAX` until known (a unit whose hash is `MAX` has it computed
    /// again each time, which gives the same value).
    unit_hash: Order,
    kept: SmallVec<[Kept; 1]>,
}

impl Default for Sample {
    fn default() -> Self {
        Self { threshold: Order::MAX, unit_hash: Order::MAX, kept: SmallVec::new() }
    }
}

impl Sample {
    /// The most bytes one row can add to a store of samples: a new unit's sample (with its first
    /// group and row inline), half of a unit's first two rows when the second adds a group (its
    /// vector of groups then leaves the sample: two groups), or a kept row in a group's vector,
    /// which at most doubles — plus `per_unit` bytes held elsewhere for each unit (its key) and
    /// `row` bytes of a row encoding too long to hold inline. A unit of `r` rows over `m ≥ 2`
    /// groups holds at most `S + K·m + 2E·(r − m)` (with `S`, `K`, `E` the sizes of a sample, a
    /// group, a row entry), at most `r` times this.
    pub(super) fn most_bytes_per_row(per_unit: usize, row: usize) -> usize {
        let unit = per_unit + size_of::<Self>() + Samples::POINTER_BYTES_PER_ITEM;
        let two_groups = (unit + 2 * size_of::<Kept>()).div_ceil(2);
        unit.max(two_groups).max(2 * size_of::<Entry>()) + row
    }

    /// The unit's hash, if known.
    pub(super) fn unit_hash(&self) -> Option<u128> {
        (self.unit_hash != Order::MAX).then(|| self.unit_hash.get())
    }

    pub(super) fn set_unit_hash(&mut self, hash: u128) {
        self.unit_hash = Order::new(hash);
    }

    /// Whether a row of group order `group` could be kept.
    pub(super) fn admits(&self, group: u128) -> bool {
        Order::new(group) <= self.threshold
    }

    /// Reads the kept groups' first, middle and last orders (to bring them into the caches).
    pub(super) fn touch(&self) -> u64 {
        let kept = &self.kept;
        [0, kept.len() / 2, kept.len().saturating_sub(1)]
            .iter()
            .fold(0, |t, &at| t ^ kept.get(at).map_or(0, |k| k.group.low()))
    }

    /// Heap bytes held.
    pub(super) fn heap(&self) -> usize {
        spilled_bytes(&self.kept) + self.kept.iter().map(Kept::heap).sum::<usize>()
    }

    /// Offers one row (stored only if it is kept) under a bound of `groups` groups and `rows`
    /// rows; returns the change in heap bytes.
    pub(super) fn offer(&mut self, (groups, rows): (usize, usize), group: u128, order: u128, row: &[u8]) -> isize {
        let (group, order) = (Order::new(group), Order::new(order));
        let mut change = 0isize;
        let at = match self.kept.binary_search_by(|k| k.group.cmp(&group)) {
            Ok(at) => at,
            Err(at) if at >= groups => return 0,
            Err(at) => {
                // The largest kept group leaves first (at < groups), so the vector never grows
                // past the bound and a full sample never reallocates.
                if self.kept.len() == groups {
                    if let Some(dropped) = self.kept.pop() {
                        change -= dropped.heap() as isize;
                    }
                }
                let before = spilled_bytes(&self.kept);
                if self.kept.len() == self.kept.capacity() {
                    self.kept.reserve_exact(1);
                }
                self.kept.insert(at, Kept { group, rows: SmallVec::new() });
                if self.kept.len() == groups {
                    self.threshold = self.kept.last().map_or(Order::MAX, |k| k.group);
                }
                change += spilled_bytes(&self.kept) as isize - before as isize;
                at
            }
        };
        let kept = &mut self.kept[at];
        if kept.rows.len() >= rows && kept.rows.last().is_some_and(|(last, _)| order >= *last) {
            return change;
        }
        let (before, row) = (spilled_bytes(&kept.rows), RowBytes::new(row));
        change += row.heap() as isize;
        let pos = kept.rows.partition_point(|(o, _)| *o <= order);
        kept.rows.insert(pos, (order, row));
        if kept.rows.len() > rows {
            if let Some((_, dropped)) = kept.rows.pop() {
                change -= dropped.heap() as isize;
            }
        }
        change + spilled_bytes(&kept.rows) as isize - before as isize
    }

    /// The kept rows: (group order, row order, encoded row), by group order, then row order.
    pub(super) fn rows(&self) -> impl Iterator<Item = (u128, u128, &[u8])> {
        self.kept.iter().flat_map(|k| k.rows.iter().map(move |(o, r)| (k.group.get(), o.get(), r.as_bytes())))
    }

    /// Rows kept.
    pub(super) fn len(&self) -> usize {
        self.kept.iter().map(|k| k.rows.len()).sum()
    }
}

/// A partition's samples, indexed by the unit's group index, in chunks (the first allocated up
/// front): room for at most one chunk more than its units, and growing moves no sample.
pub(super) type Samples = Chunked<Sample, SAMPLES_PER_CHUNK>;

/// Samples per chunk of [`Samples`].
const SAMPLES_PER_CHUNK: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout the memory plan counts on: a one-row unit in 104 bytes, a group in 64.
    #[test]
    fn a_unit_of_one_row_is_one_small_sample() {
        assert_eq!(size_of::<Entry>(), 40);
        assert_eq!(size_of::<Kept>(), 64);
        assert_eq!(size_of::<Sample>(), 104);
        // With an integer unit's 65 bytes in the table: a new unit is the worst row.
        assert_eq!(Sample::most_bytes_per_row(65, 0), 170);
        let mut s = Sample::default();
        assert_eq!(s.offer((3, 10), 5, 7, &[1; INLINE]), 0, "held inline");
        assert_eq!(s.heap(), 0);
        let grew = s.offer((3, 10), 4, 7, &[1; 9]);
        assert_eq!(grew, 2 * size_of::<Kept>() as isize, "two groups leave the sample");
        assert_eq!(s.heap() as isize, grew);
        assert_eq!(s.offer((3, 10), 6, 7, &[1; 9]), size_of::<Kept>() as isize, "a third group: one more");
        let long = s.offer((3, 10), 6, 8, &[1; INLINE + 1]);
        assert_eq!(long, (2 * size_of::<Entry>() + INLINE + 1) as isize, "a second row and its bytes");
        assert_eq!(s.heap() as isize, grew + size_of::<Kept>() as isize + long);
        // A smaller fourth group drops the largest with its rows.
        let dropped = s.offer((3, 10), 1, 7, &[1; 9]);
        assert_eq!(dropped, -long);
        assert_eq!(s.rows().map(|(g, ..)| g).collect::<Vec<_>>(), [1, 4, 5]);
    }
}
