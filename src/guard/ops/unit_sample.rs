//! One privacy unit's kept rows ([`Sample`]), what every row reads of its unit ([`Screen`]) and
//! the store of a partition's units ([`Samples`]), laid out so that a row that cannot be kept reads
//! only its unit's screen, and so that the most bytes one row can add to them is small: the bound's
//! memory is planned from that worst case (every row a new unit), so it decides how often the
//! bound spills ([`super::unit_bound::UnitBound::most_bytes_per_row`]).
//!
//! * A unit of one row allocates nothing: its first kept group and that group's first row are held
//!   inline in its sample, and a short row's encoding inline in its entry.
//! * A unit's vector of kept groups grows by one group at a time (it never shrinks, so it is
//!   reallocated at most `L − 1` times over the unit's life); a group's kept rows at most double.
//! * The screens and the samples sit in fixed chunks, so the store never holds room for twice its
//!   units (a vector of samples doubles) nor copies them when it grows.

use std::mem::size_of;

use smallvec::SmallVec;

use super::chunked::Chunked;
use super::max_heap::{self, IndexedHeap, Keyed, Order};
use super::prefetch_hint::{prefetch, prefetch_whole};

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
                Err(at) if v.len() == limit => {
                    // The largest kept group leaves and the new one takes its place, then moves
                    // down to its position one swap at a time (at most `FEW` groups of 64 bytes:
                    // moves the compiler writes in place, where removing and inserting called
                    // the library's memmove twice per displaced group). The vector never grows
                    // past the bound, so a full sample never reallocates.
                    let dropped = std::mem::replace(&mut v[0], Kept::new(group)).heap();
                    for j in 1..at {
                        v.swap(j - 1, j);
                    }
                    max_heap::moved(at);
                    Some((at - 1, dropped))
                }
                Err(_) if v.len() == FEW => {
                    *self = Self::Many(Box::new(IndexedHeap::new(std::mem::take(v))));
                    self.place(limit, group)
                }
                Err(at) => {
                    if v.len() == v.capacity() {
                        v.reserve_exact(1);
                    }
                    max_heap::moved(v.len() - at);
                    v.insert(at, Kept::new(group));
                    Some((at, 0))
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

/// What every row reads of its unit before it can be a candidate (the screen), held apart from
/// the unit's [`Sample`] in an array of its own: the unit's hash and the high word of the sample's
/// threshold. At 24 bytes a unit the screens of a partition's units take a third of the bytes of
/// their samples, and a row's screen is one or two lines that hold nothing else (the sample itself
/// is read only by a candidate). Keeping the hash costs less than hashing each row's unit again
/// (measured: one more SipHash per row costs more than the 16 bytes a unit).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(super) struct Screen {
    /// The unit's hash (`[MAX, MAX]` until known: a unit whose hash is `u128::MAX` has it
    /// computed again each time, which gives the same value).
    hash: [u64; 2],
    /// A row can be kept only if its group order's high word is at most this: the high word of
    /// the `L`-th kept group's order once `L` groups are kept, `u64::MAX` before. The sample's
    /// offer decides exactly ([`Sample::offer`]); this only rejects rows early.
    threshold: u64,
}

impl Default for Screen {
    fn default() -> Self {
        Self { hash: [u64::MAX; 2], threshold: u64::MAX }
    }
}

impl Screen {
    /// The unit's hash, if known.
    pub(super) fn unit_hash(&self) -> Option<u128> {
        let hash = (u128::from(self.hash[0]) << 64) | u128::from(self.hash[1]);
        (hash != u128::MAX).then_some(hash)
    }

    pub(super) fn set_unit_hash(&mut self, hash: u128) {
        self.hash = [(hash >> 64) as u64, hash as u64];
    }

    /// Whether a row of group order `group` could be kept: its high word is at most the
    /// threshold's (every row the sample would keep passes; a few it would not pass too).
    pub(super) fn admits(&self, group: u128) -> bool {
        (group >> 64) as u64 <= self.threshold
    }
}

/// One unit's kept groups.
#[derive(Debug, Default)]
pub(super) struct Sample {
    groups: Groups,
}

impl Sample {
    /// The most bytes one row can add to a store of samples: a new unit's sample (with its first
    /// group and row inline), half of a unit's first two rows when the second adds a group (its
    /// groups then leave the sample: two groups), a unit's share of its indexed heap over more
    /// than [`FEW`] groups (each at most `2K + 16` bytes), or a kept row in a group's vector,
    /// which at most doubles — plus the unit's [`Screen`], `per_unit` bytes held elsewhere for
    /// each unit (its key) and `row` bytes of a row encoding too long to hold inline. A unit of `r` rows over `m ≥ 2`
    /// groups holds at most `S + K·m + 2E·(r − m)` (with `S`, `K`, `E` the sizes of a sample, a
    /// group, a row entry), or `S + H + (2K + 16)·m + 2E·(r − m)` past [`FEW`] groups (`H` the
    /// heap's header), at most `r` times this.
    pub(super) fn most_bytes_per_row(per_unit: usize, row: usize, groups: usize) -> usize {
        let unit = per_unit + size_of::<Self>() + size_of::<Screen>() + Samples::POINTER_BYTES_PER_UNIT;
        let two_groups = (unit + 2 * size_of::<Kept>()).div_ceil(2);
        let many = if groups > FEW {
            (unit + size_of::<IndexedHeap<Kept>>()).div_ceil(FEW + 1) + IndexedHeap::<Kept>::MOST_BYTES_PER_ITEM
        } else {
            0
        };
        unit.max(two_groups).max(many).max(2 * size_of::<Entry>()) + row
    }

    /// Asks for the lines of the kept groups' first, middle and last orders, where an offer's
    /// search starts (reading the sample for where they are).
    pub(super) fn prefetch_kept(&self) {
        if let Groups::Few(_) | Groups::Many(_) = &self.groups {
            let kept = self.groups.slice();
            for at in [0, kept.len() / 2, kept.len().saturating_sub(1)] {
                if let Some(k) = kept.get(at) {
                    prefetch(&k.group);
                }
            }
        }
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
        let change = self.groups.spine() as isize - spine as isize - dropped as isize;
        change + self.groups.slice_mut()[at].offer(rows, Order::new(order), row)
    }

    /// The screen's threshold under a bound of `groups` groups ([`Screen::threshold`]).
    fn threshold(&self, groups: usize) -> u64 {
        match self.groups.largest() {
            Some(largest) if self.groups.slice().len() == groups => (largest.get() >> 64) as u64,
            _ => u64::MAX,
        }
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

/// A partition's units, indexed by the unit's group index: their screens and their samples, each
/// in chunks of `N` (the first allocated up front): room for at most one chunk more than its
/// units, and growing moves no sample.
pub(super) struct Units<const N: usize> {
    screens: Chunked<Screen, N>,
    samples: Chunked<Sample, N>,
}

/// The units of a partition ([`Units`] in chunks of 512).
pub(super) type Samples = Units<SAMPLES_PER_CHUNK>;

/// Units per chunk of [`Samples`].
const SAMPLES_PER_CHUNK: usize = 512;

impl<const N: usize> Units<N> {
    /// Bytes of the chunks' pointers per unit.
    pub(super) const POINTER_BYTES_PER_UNIT: usize =
        Chunked::<Screen, N>::POINTER_BYTES_PER_ITEM + Chunked::<Sample, N>::POINTER_BYTES_PER_ITEM;

    /// Empty, with room for a first chunk of units.
    pub(super) fn with_first_chunk() -> Self {
        Self { screens: Chunked::with_first_chunk(), samples: Chunked::with_first_chunk() }
    }

    /// `n` units, each with nothing kept.
    pub(super) fn of(n: usize) -> Self {
        let mut units = Self { screens: Chunked::new(), samples: Chunked::new() };
        units.resize(n);
        units
    }

    /// Holds at least `n` units (new ones with nothing kept); never shrinks.
    pub(super) fn resize(&mut self, n: usize) {
        self.screens.resize(n);
        self.samples.resize(n);
    }

    /// Bytes held by the stores (not by what the samples own: [`Sample::heap`]).
    pub(super) fn size(&self) -> usize {
        self.screens.size() + self.samples.size()
    }

    pub(super) fn screen(&self, unit: usize) -> &Screen {
        &self.screens[unit]
    }

    pub(super) fn screen_mut(&mut self, unit: usize) -> &mut Screen {
        &mut self.screens[unit]
    }

    /// Asks for the cache lines of a unit's screen (24 bytes may straddle two lines).
    pub(super) fn prefetch_screen(&self, unit: usize) {
        prefetch_whole(&self.screens[unit]);
    }

    /// Asks for the lines of a unit's sample.
    pub(super) fn prefetch_sample(&self, unit: usize) {
        prefetch_whole(&self.samples[unit]);
    }

    /// Asks for the lines of a unit's kept groups ([`Sample::prefetch_kept`]).
    pub(super) fn prefetch_kept(&self, unit: usize) {
        self.samples[unit].prefetch_kept();
    }

    /// Offers one row to a unit ([`Sample::offer`]) and moves its screen's threshold with it;
    /// returns the change in heap bytes.
    pub(super) fn offer(&mut self, unit: usize, limits: (usize, usize), group: u128, order: u128, row: &[u8]) -> isize {
        let sample = &mut self.samples[unit];
        let change = sample.offer(limits, group, order, row);
        self.screens[unit].threshold = sample.threshold(limits.0);
        change
    }

    /// The samples, by unit.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Sample> + Clone {
        self.samples.iter()
    }

    /// Puts every sample in order ([`Sample::sort`]).
    pub(super) fn sort(&mut self) {
        self.samples.iter_mut().for_each(Sample::sort);
    }

    /// Forgets every unit, keeping the chunks.
    pub(super) fn clear(&mut self) {
        self.screens.clear();
        self.samples.clear();
    }

    /// Takes out the first `n` units' samples; the others move down by `n`.
    pub(super) fn take_first(&mut self, n: usize) -> Vec<Sample> {
        self.screens.take_first(n);
        self.samples.take_first(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout the memory plan counts on: a one-row unit in a 72-byte sample and a 24-byte
    /// screen, a group in 64.
    #[test]
    fn a_unit_of_one_row_is_one_small_sample() {
        assert_eq!(size_of::<Entry>(), 40);
        assert_eq!(size_of::<Kept>(), 64);
        assert_eq!(size_of::<Groups>(), 72);
        assert_eq!(size_of::<Sample>(), 72);
        // A screen is three words, which `prefetch_screen` asks for by its first and last bytes.
        assert_eq!((size_of::<Screen>(), std::mem::offset_of!(Screen, threshold)), (24, 16));
        assert_eq!(Samples::POINTER_BYTES_PER_UNIT, 2);
        // With an integer unit's 65 bytes in the table: a new unit is the worst row.
        assert_eq!(Sample::most_bytes_per_row(65, 0, 3), 163);
        assert_eq!(Sample::most_bytes_per_row(65, 0, 10_000), 163, "a unit's share of many groups is less");
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

    /// The screen passes every row its sample would keep: fed only the rows its screen admits (the
    /// high words tie often here), a unit keeps exactly what a sample offered every row keeps.
    /// Control: a screen that also rejects a high word equal to the threshold's loses rows.
    #[test]
    fn the_screen_passes_every_row_the_sample_keeps() {
        let run = |strict: bool| {
            let mut state = 11u64;
            let (mut all, mut units, mut screened) = (Sample::default(), Units::<1>::of(1), 0);
            for i in 0..4000u64 {
                state = state.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(i);
                let (group, row) = (order(state >> 62, state % 50), order(0, i));
                all.offer((3, 2), group, row, &[1]);
                let screen = units.screen(0);
                let passes = if strict { ((group >> 64) as u64) < screen.threshold } else { screen.admits(group) };
                if passes {
                    units.offer(0, (3, 2), group, row, &[1]);
                } else {
                    screened += 1;
                }
            }
            all.sort();
            units.sort();
            let kept: Vec<_> = units.iter().flat_map(|s| s.rows().map(|(g, o, _)| (g, o))).collect();
            (all.rows().map(|(g, o, _)| (g, o)).collect::<Vec<_>>() == kept, screened)
        };
        let (same, screened) = run(false);
        assert!(same);
        assert!(screened > 2000, "the screen rejects most rows early: {screened}");
        assert!(!run(true).0, "a strict screen loses rows");
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
        type Order = Box<dyn Fn(u64) -> u128>;
        let keys: [(&str, Order); 3] = [
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
