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
use super::max_heap::{self, IndexedHeap, Keyed, Order};
use super::prefetch_hint::prefetch;

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

impl Keyed for Entry {
    fn key(&self) -> Order {
        self.0
    }
}

/// One kept group: its order and its kept rows, a max-heap by row order (in Arrow's row
/// encoding); a group of one row allocates nothing.
#[derive(Debug)]
struct Kept {
    group: Order,
    rows: Rows1,
}

impl Keyed for Kept {
    fn key(&self) -> Order {
        self.group
    }
}

impl Kept {
    fn new(group: Order) -> Self {
        Self { group, rows: SmallVec::new() }
    }

    /// Heap bytes held by the group's rows.
    fn heap(&self) -> usize {
        spilled_bytes(&self.rows) + self.rows.iter().map(|(_, r)| r.heap()).sum::<usize>()
    }

    /// Offers a row under a bound of `rows` rows; returns the change in heap bytes.
    fn offer(&mut self, rows: usize, order: Order, row: &[u8]) -> isize {
        let full = self.rows.len() >= rows;
        if full && self.rows.first().is_some_and(|(largest, _)| order >= *largest) {
            return 0;
        }
        let (before, row) = (spilled_bytes(&self.rows), RowBytes::new(row));
        let mut change = row.heap() as isize;
        if full {
            // The largest kept row leaves: the vector never grows past the bound.
            let (_, dropped) = std::mem::replace(&mut self.rows[0], (order, row));
            change -= dropped.heap() as isize;
            max_heap::sift_down(&mut self.rows, 0, |_, _, _| {});
        } else {
            self.rows.push((order, row));
            let last = self.rows.len() - 1;
            max_heap::sift_up(&mut self.rows, last, |_, _, _| {});
        }
        change + spilled_bytes(&self.rows) as isize - before as isize
    }
}

/// Bytes of a small vector's heap buffer (none while inline).
fn spilled_bytes<A: smallvec::Array>(v: &SmallVec<A>) -> usize {
    if v.spilled() { v.capacity() * size_of::<A::Item>() } else { 0 }
}

/// Groups a unit keeps in a sorted vector (inserting one shifts at most this many); beyond, an
/// indexed heap.
const FEW: usize = 16;

/// A unit's kept groups.
#[derive(Debug, Default)]
enum Groups {
    #[default]
    None,
    /// One group, inline (a unit of one row allocates nothing).
    One(Kept),
    /// Up to [`FEW`] groups by descending group order, grown one group at a time (it never
    /// shrinks, so it is reallocated at most `FEW − 1` times over the unit's life).
    Few(Vec<Kept>),
    /// More than [`FEW`] groups (only when the bound admits more).
    Many(Box<IndexedHeap<Kept>>),
}

impl Groups {
    fn slice(&self) -> &[Kept] {
        match self {
            Self::None => &[],
            Self::One(k) => std::slice::from_ref(k),
            Self::Few(v) => v,
            Self::Many(h) => h.items(),
        }
    }

    fn slice_mut(&mut self) -> &mut [Kept] {
        match self {
            Self::None => &mut [],
            Self::One(k) => std::slice::from_mut(k),
            Self::Few(v) => v,
            Self::Many(h) => h.items_mut(),
        }
    }

    /// Heap bytes of the container (not of the groups' rows).
    fn spine(&self) -> usize {
        match self {
            Self::None | Self::One(_) => 0,
            Self::Few(v) => v.capacity() * size_of::<Kept>(),
            Self::Many(h) => size_of::<IndexedHeap<Kept>>() + h.heap(),
        }
    }

    /// The largest group's order.
    fn largest(&self) -> Option<Order> {
        self.slice().first().map(|k| k.group)
    }

    /// Finds the group of order `group`, or adds it under a bound of `limit` groups (dropping the
    /// largest when full); returns its position and the bytes of the rows dropped with a group,
    /// or `None` when it cannot be kept.
    fn place(&mut self, limit: usize, group: Order) -> Option<(usize, usize)> {
        match self {
            Self::None => {
                *self = Self::One(Kept::new(group));
                Some((0, 0))
            }
            Self::One(k) if k.group == group => Some((0, 0)),
            Self::One(k) if limit == 1 => {
                if group > k.group {
                    return None;
                }
                Some((0, std::mem::replace(k, Kept::new(group)).heap()))
            }
            Self::One(_) => {
                let Self::One(k) = std::mem::take(self) else { unreachable!() };
                let mut v = Vec::with_capacity(2);
                v.push(k);
                *self = Self::Few(v);
                self.place(limit, group)
            }
            Self::Few(v) => match v.binary_search_by(|k| group.cmp(&k.group)) {
                Ok(at) => Some((at, 0)),
                Err(0) if v.len() == limit => None,
                Err(mut at) => {
                    let mut dropped = 0;
                    if v.len() == limit {
                        // The largest kept group leaves first, so the vector never grows past
                        // the bound and a full sample never reallocates.
                        dropped = v.remove(0).heap();
                        max_heap::moved(v.len());
                        at -= 1;
                    } else if v.len() == FEW {
                        *self = Self::Many(Box::new(IndexedHeap::new(std::mem::take(v))));
                        return self.place(limit, group);
                    }
                    if v.len() == v.capacity() {
                        v.reserve_exact(1);
                    }
                    max_heap::moved(v.len() - at);
                    v.insert(at, Kept::new(group));
                    Some((at, dropped))
                }
            },
            Self::Many(h) => {
                if let Some(at) = h.find(group) {
                    return Some((at, 0));
                }
                if h.len() < limit {
                    return Some((h.push(Kept::new(group)), 0));
                }
                if h.top().is_some_and(|k| group > k.group) {
                    return None;
                }
                let (dropped, at) = h.replace_top(Kept::new(group));
                Some((at, dropped.heap()))
            }
        }
    }
}

/// One unit's kept groups. The two orders every row reads (the screen) come first, in the
/// sample's first 32 bytes ([`Self::prefetch_screen`]); the groups, which only a candidate row
/// reads, after them.
#[derive(Debug)]
#[repr(C)]
pub(super) struct Sample {
    /// A row can be kept only if its group order is at most this: the `L`-th kept group's order
    /// once `L` groups are kept, the largest order before.
    threshold: Order,
    /// The unit's hash; `Order::MAX` until known (a unit whose hash is `MAX` has it computed
    /// again each time, which gives the same value).
    unit_hash: Order,
    groups: Groups,
}

impl Default for Sample {
    fn default() -> Self {
        Self { threshold: Order::MAX, unit_hash: Order::MAX, groups: Groups::None }
    }
}

impl Sample {
    /// The most bytes one row can add to a store of samples: a new unit's sample (with its first
    /// group and row inline), half of a unit's first two rows when the second adds a group (its
    /// groups then leave the sample: two groups), a unit's share of its indexed heap over more
    /// than [`FEW`] groups (each at most `2K + 16` bytes), or a kept row in a group's vector,
    /// which at most doubles — plus `per_unit` bytes held elsewhere for each unit (its key) and
    /// `row` bytes of a row encoding too long to hold inline. A unit of `r` rows over `m ≥ 2`
    /// groups holds at most `S + K·m + 2E·(r − m)` (with `S`, `K`, `E` the sizes of a sample, a
    /// group, a row entry), or `S + H + (2K + 16)·m + 2E·(r − m)` past [`FEW`] groups (`H` the
    /// heap's header), at most `r` times this.
    pub(super) fn most_bytes_per_row(per_unit: usize, row: usize, groups: usize) -> usize {
        let unit = per_unit + size_of::<Self>() + Samples::POINTER_BYTES_PER_ITEM;
        let two_groups = (unit + 2 * size_of::<Kept>()).div_ceil(2);
        let many = if groups > FEW {
            (unit + size_of::<IndexedHeap<Kept>>()).div_ceil(FEW + 1) + IndexedHeap::<Kept>::MOST_BYTES_PER_ITEM
        } else {
            0
        };
        unit.max(two_groups).max(many).max(2 * size_of::<Entry>()) + row
    }

    /// The unit's hash, if known.
    pub(super) fn unit_hash(&self) -> Option<u128> {
        (self.unit_hash != Order::MAX).then(|| self.unit_hash.get())
    }

    pub(super) fn set_unit_hash(&mut self, hash: u128) {
        self.unit_hash = Order::new(hash);
    }

    /// Asks for the cache lines of the orders a row's screen reads ([`Self::unit_hash`],
    /// [`Self::admits`]): the sample's first 32 bytes, which may straddle two lines. The line of
    /// byte 31 is the line of byte 32 (the groups) unless a line starts at byte 32 — and then
    /// all 32 bytes are in the sample's first line.
    pub(super) fn prefetch_screen(&self) {
        prefetch(self);
        prefetch(&self.groups);
    }

    /// Whether a row of group order `group` could be kept.
    pub(super) fn admits(&self, group: u128) -> bool {
        Order::new(group) <= self.threshold
    }

    /// Reads the kept groups' first, middle and last orders (to bring them into the caches).
    pub(super) fn touch(&self) -> u64 {
        let kept = self.groups.slice();
        [0, kept.len() / 2, kept.len().saturating_sub(1)]
            .iter()
            .fold(0, |t, &at| t ^ kept.get(at).map_or(0, |k| k.group.low()))
    }

    /// Heap bytes held.
    pub(super) fn heap(&self) -> usize {
        self.groups.spine() + self.groups.slice().iter().map(Kept::heap).sum::<usize>()
    }

    /// Offers one row (stored only if it is kept) under a bound of `groups` groups and `rows`
    /// rows; returns the change in heap bytes.
    pub(super) fn offer(&mut self, (groups, rows): (usize, usize), group: u128, order: u128, row: &[u8]) -> isize {
        let spine = self.groups.spine();
        let Some((at, dropped)) = self.groups.place(groups, Order::new(group)) else { return 0 };
        if self.groups.slice().len() == groups {
            self.threshold = self.groups.largest().unwrap_or(Order::MAX);
        }
        let change = self.groups.spine() as isize - spine as isize - dropped as isize;
        change + self.groups.slice_mut()[at].offer(rows, Order::new(order), row)
    }

    /// Puts the kept groups and rows in order (before [`Self::rows`]).
    pub(super) fn sort(&mut self) {
        for kept in self.groups.slice_mut() {
            max_heap::sort_descending(&mut kept.rows);
        }
        if let Groups::Many(h) = &mut self.groups {
            h.sort();
        }
    }

    /// The kept rows once sorted ([`Self::sort`]): (group order, row order, encoded row), by
    /// group order, then row order.
    pub(super) fn rows(&self) -> impl Iterator<Item = (u128, u128, &[u8])> {
        self.groups.slice().iter().rev().flat_map(|k| {
            debug_assert!(k.rows.is_sorted_by(|a, b| a.0 >= b.0), "sorted before emitted");
            k.rows.iter().rev().map(move |(o, r)| (k.group.get(), o.get(), r.as_bytes()))
        })
    }

    /// Rows kept.
    pub(super) fn len(&self) -> usize {
        self.groups.slice().iter().map(|k| k.rows.len()).sum()
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

    /// The layout the memory plan counts on: a one-row unit in 104 bytes, a group in 64; the
    /// screen's orders first.
    #[test]
    fn a_unit_of_one_row_is_one_small_sample() {
        assert_eq!(size_of::<Entry>(), 40);
        assert_eq!(size_of::<Kept>(), 64);
        assert_eq!(size_of::<Groups>(), 72);
        assert_eq!(size_of::<Sample>(), 104);
        // What a row's screen reads is the first 32 bytes, which `prefetch_screen` brings.
        assert_eq!((std::mem::offset_of!(Sample, unit_hash), std::mem::offset_of!(Sample, groups)), (16, 32));
        // With an integer unit's 65 bytes in the table: a new unit is the worst row.
        assert_eq!(Sample::most_bytes_per_row(65, 0, 3), 170);
        assert_eq!(Sample::most_bytes_per_row(65, 0, 10_000), 170, "a unit's share of many groups is less");
        assert_eq!(Sample::most_bytes_per_row(0, 0, 10_000), 153);
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
        s.sort();
        assert_eq!(s.rows().map(|(g, ..)| g).collect::<Vec<_>>(), [1, 4, 5]);
    }

    /// A 128-bit order from `i`: a splitmix64 low word (the table's hash), `high` above.
    fn order(high: u64, i: u64) -> u128 {
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (u128::from(high) << 64) | u128::from(z ^ (z >> 31))
    }

    /// Items moved while `f` runs.
    fn moves(f: impl FnOnce()) -> u64 {
        max_heap::MOVES.with(|m| m.set(0));
        f();
        max_heap::MOVES.with(|m| m.get())
    }

    /// SPEC §0: one privacy unit's rows must not cost more than `O(log)` each, or a person with
    /// many rows in one group, or many groups (the owner may allow 10⁵), takes time quadratic in
    /// their own rows — visible in the query's time. Orders ascending, descending and random.
    #[test]
    fn one_heavy_unit_costs_log_moves_a_row() {
        let n: u64 = 1 << 17;
        let bound = 3 * n * (u64::from(n.ilog2()) + 1);
        let keys: [(&str, Box<dyn Fn(u64) -> u128>); 3] = [
            ("ascending", Box::new(|i| order(i, i))),
            ("descending", Box::new(move |i| order(2 * n - i, i))),
            ("random", Box::new(|i| order(i.wrapping_mul(0x2545_f491_4f6c_dd1d), i))),
        ];
        for (name, key) in &keys {
            let limit = n as usize;
            // `n` groups kept, then `n` more that may replace them.
            let groups = moves(|| {
                let mut s = Sample::default();
                for i in 0..2 * n {
                    s.offer((limit, 1), key(i), 0, &[1]);
                }
                assert_eq!(s.len(), limit);
            });
            assert!(groups <= bound, "{name}: {groups} moves for {n} groups, bound {bound}");
            // One group: `n` rows kept, then `n` more.
            let rows = moves(|| {
                let mut s = Sample::default();
                for i in 0..2 * n {
                    s.offer((1, limit), 0, key(i), &[1]);
                }
                assert_eq!(s.len(), limit);
            });
            assert!(rows <= bound, "{name}: {rows} moves for {n} rows, bound {bound}");
        }
        // Control: the same count over a sorted vector (what kept groups and rows were) breaks
        // the bound already at 4096 random orders.
        let n = 4096u64;
        let shifted = moves(|| {
            let mut v: Vec<u128> = Vec::new();
            for i in 0..n {
                let at = v.partition_point(|&o| o <= order(i.wrapping_mul(0x2545_f491_4f6c_dd1d), i));
                max_heap::moved(v.len() - at);
                v.insert(at, order(i.wrapping_mul(0x2545_f491_4f6c_dd1d), i));
            }
        });
        assert!(shifted > 3 * n * (u64::from(n.ilog2()) + 1), "{shifted}");
    }

    /// Whatever the arrival, a sample keeps each of its `L` smallest groups' `K` smallest rows
    /// (repeats included), its reported byte changes add up to what it holds, and what it holds
    /// stays within the per-row bound after every row.
    #[test]
    fn keeps_the_bottom_k_of_the_bottom_l_and_counts_its_bytes() {
        let mut state = 7u64;
        let mut next = move || {
            state = state.wrapping_add(1);
            order(0, state) as u64
        };

        for (groups, limit_g, limit_r, n) in [
            (3, 1, 1, 200),
            (40, 2, 3, 500),
            (40, 16, 2, 900),
            (40, 17, 7, 900),
            (300, 50, 2, 3000),
            (300, 400, 1, 3000),
        ] {
            let per_row = Sample::most_bytes_per_row(0, 24, limit_g);
            let mut s = Sample::default();
            let (mut rows, mut held) = (Vec::new(), 0isize);
            for r in 1..=n {
                let g = order(5, next() % groups);
                // Rows repeat (equal rows, equal orders), and some are too long to hold inline.
                let v = next() % 50;
                let bytes = vec![v as u8; 4 + (v as usize % 3) * 10];
                let o = order(v, v);
                held += s.offer((limit_g, limit_r), g, o, &bytes);
                assert_eq!(held, s.heap() as isize, "L = {limit_g}, K = {limit_r}, row {r}");
                assert!(size_of::<Sample>() + s.heap() <= r * per_row, "row {r}: {} bytes", s.heap());
                rows.push((g, o, bytes));
            }
            let mut distinct: Vec<u128> = rows.iter().map(|r| r.0).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let mut want = Vec::new();
            for &g in distinct.iter().take(limit_g) {
                let mut of: Vec<_> = rows.iter().filter(|r| r.0 == g).map(|r| (r.0, r.1, r.2.clone())).collect();
                of.sort_by_key(|r| r.1);
                want.extend(of.into_iter().take(limit_r));
            }
            s.sort();
            let got: Vec<_> = s.rows().map(|(g, o, r)| (g, o, r.to_vec())).collect();
            assert_eq!(got, want, "L = {limit_g}, K = {limit_r}");
            assert_eq!(s.len(), want.len());
        }
    }
}
