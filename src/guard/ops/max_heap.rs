//! Binary max-heaps ordered by a 128-bit keyed order, for the unit bound's bottom-K samples: a
//! full sample's largest kept item is at the root, so admitting one more item costs `O(log K)`
//! whatever the bound (a sorted vector costs `O(K)` a row, so one privacy unit with many rows or
//! groups would take time quadratic in its own rows, SPEC §0). A heap sorted descending is still
//! a heap, which is how samples are emitted in order.
//!
//! [`IndexedHeap`] also finds an item by its order, through a table of positions hashed by the
//! order's low word (a keyed hash, so no row can choose its slot).

use std::mem::size_of;

/// A 128-bit order as two words, high first: it compares as the `u128` does, with 8-byte
/// alignment (a `u128` aligns to 16 and padded every kept row).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Order([u64; 2]);

impl Order {
    pub(super) fn new(v: u128) -> Self {
        Self([(v >> 64) as u64, v as u64])
    }

    pub(super) fn get(self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }

    /// The low word (a cheap value to touch a cache line with, and a uniform hash).
    pub(super) fn low(self) -> u64 {
        self.0[1]
    }
}

/// An item of a heap: what it is ordered by.
pub(super) trait Keyed {
    fn key(&self) -> Order;
}

#[cfg(test)]
thread_local! {
    /// Items swapped by the sifts (and shifted by callers that count theirs): the unit of work
    /// the tests bound.
    pub(super) static MOVES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `n` items moved (tests only).
#[inline]
pub(super) fn moved(n: usize) {
    #[cfg(test)]
    MOVES.with(|m| m.set(m.get() + n as u64));
    #[cfg(not(test))]
    let _ = n;
}

/// Restores the heap from position `i` up; `swapped(v, a, b)` follows each swap.
pub(super) fn sift_up<T: Keyed>(v: &mut [T], mut i: usize, mut swapped: impl FnMut(&[T], usize, usize)) {
    while i > 0 {
        let parent = (i - 1) / 2;
        if v[parent].key() >= v[i].key() {
            break;
        }
        v.swap(parent, i);
        moved(2);
        swapped(v, parent, i);
        i = parent;
    }
}

/// Restores the heap from position `i` down; `swapped(v, a, b)` follows each swap.
pub(super) fn sift_down<T: Keyed>(v: &mut [T], mut i: usize, mut swapped: impl FnMut(&[T], usize, usize)) {
    loop {
        let left = 2 * i + 1;
        if left >= v.len() {
            break;
        }
        let child = if left + 1 < v.len() && v[left + 1].key() > v[left].key() { left + 1 } else { left };
        if v[child].key() <= v[i].key() {
            break;
        }
        v.swap(i, child);
        moved(2);
        swapped(v, i, child);
        i = child;
    }
}

/// Sorts descending by order (a valid heap, and reversed the ascending order samples are emitted
/// in); items of equal order keep no particular order.
pub(super) fn sort_descending<T: Keyed>(v: &mut [T]) {
    if !v.is_sorted_by(|a, b| a.key() >= b.key()) {
        v.sort_unstable_by_key(|t| std::cmp::Reverse(t.key()));
    }
}

/// A max-heap whose items are found by their order (orders are distinct). Its table of positions
/// is a power of two at least twice the items, probed linearly from the order's low word.
#[derive(Debug)]
pub(super) struct IndexedHeap<T> {
    items: Vec<T>,
    /// Position + 1 of an item, 0 for an empty slot.
    slots: Vec<u32>,
}

impl<T: Keyed> IndexedHeap<T> {
    /// The most bytes an item adds: a vector of items at most doubles, and the table of
    /// positions is at most four times the items (it doubles when they reach half of it).
    pub(super) const MOST_BYTES_PER_ITEM: usize = 2 * size_of::<T>() + 4 * size_of::<u32>();

    /// A heap of `items` (distinct orders).
    pub(super) fn new(mut items: Vec<T>) -> Self {
        for i in (0..items.len() / 2).rev() {
            sift_down(&mut items, i, |_, _, _| {});
        }
        let mut heap = Self { items, slots: Vec::new() };
        heap.reindex();
        heap
    }

    fn reindex(&mut self) {
        let want = (2 * self.items.len()).next_power_of_two().max(16);
        self.slots.clear();
        self.slots.resize(want, 0);
        for at in 0..self.items.len() {
            let s = self.vacant(self.items[at].key());
            self.slots[s] = at as u32 + 1;
        }
    }

    fn home(&self, key: Order) -> usize {
        key.low() as usize & (self.slots.len() - 1)
    }

    /// The first empty slot on `key`'s probe.
    fn vacant(&self, key: Order) -> usize {
        let mask = self.slots.len() - 1;
        let mut s = self.home(key);
        while self.slots[s] != 0 {
            s = (s + 1) & mask;
        }
        s
    }

    /// The slot on `key`'s probe holding position `at`.
    fn slot_of(&self, key: Order, at: usize) -> usize {
        let mask = self.slots.len() - 1;
        let mut s = self.home(key);
        while self.slots[s] as usize != at + 1 {
            s = (s + 1) & mask;
        }
        s
    }

    /// Empties slot `hole`, moving back the entries after it that may fill it.
    fn remove_slot(&mut self, mut hole: usize) {
        let mask = self.slots.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let at = self.slots[j] as usize;
            if at == 0 {
                break;
            }
            let home = self.home(self.items[at - 1].key());
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = at as u32;
                hole = j;
            }
        }
        self.slots[hole] = 0;
    }

    /// Re-points the slots after a swap of the items at `a` and `b`.
    fn swap_slots(slots: &mut [u32], items: &[T], a: usize, b: usize) {
        let mask = slots.len() - 1;
        let find = |key: Order, at: usize| {
            let mut s = key.low() as usize & mask;
            while slots[s] as usize != at + 1 {
                s = (s + 1) & mask;
            }
            s
        };
        // The item now at `a` was at `b`, and the other way round.
        let (sa, sb) = (find(items[a].key(), b), find(items[b].key(), a));
        slots.swap(sa, sb);
    }

    fn sift_up(&mut self, at: usize) {
        let Self { items, slots } = self;
        sift_up(items, at, |v, a, b| Self::swap_slots(slots, v, a, b));
    }

    fn sift_down(&mut self, at: usize) {
        let Self { items, slots } = self;
        sift_down(items, at, |v, a, b| Self::swap_slots(slots, v, a, b));
    }

    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// The largest item.
    pub(super) fn top(&self) -> Option<&T> {
        self.items.first()
    }

    /// The position of the item of order `key`.
    pub(super) fn find(&self, key: Order) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let mut s = self.home(key);
        loop {
            match self.slots[s] as usize {
                0 => return None,
                at if self.items[at - 1].key() == key => return Some(at - 1),
                _ => s = (s + 1) & mask,
            }
        }
    }

    /// Adds `item` (an order not held); returns its position.
    pub(super) fn push(&mut self, item: T) -> usize {
        let key = item.key();
        if 2 * (self.items.len() + 1) > self.slots.len() {
            self.items.push(item);
            self.reindex();
        } else {
            let s = self.vacant(item.key());
            self.items.push(item);
            self.slots[s] = self.items.len() as u32;
        }
        self.sift_up(self.items.len() - 1);
        self.find(key).expect("just added")
    }

    /// Replaces the largest item by `item` (an order not held, smaller than the largest); returns
    /// the replaced item and the new one's position.
    pub(super) fn replace_top(&mut self, item: T) -> (T, usize) {
        let (old_key, key) = (self.items[0].key(), item.key());
        let s = self.slot_of(old_key, 0);
        self.remove_slot(s);
        let s = self.vacant(key);
        self.slots[s] = 1;
        let old = std::mem::replace(&mut self.items[0], item);
        self.sift_down(0);
        (old, self.find(key).expect("just added"))
    }

    /// The items, largest first once [`Self::sort`] has run.
    pub(super) fn items(&self) -> &[T] {
        &self.items
    }

    /// The items, mutably (their orders must not change).
    pub(super) fn items_mut(&mut self) -> &mut [T] {
        &mut self.items
    }

    /// Sorts the items descending (still a heap) and re-indexes them.
    pub(super) fn sort(&mut self) {
        if !self.items.is_sorted_by(|a, b| a.key() >= b.key()) {
            sort_descending(&mut self.items);
            self.reindex();
        }
    }

    /// Heap bytes held (not by what the items own).
    pub(super) fn heap(&self) -> usize {
        self.items.capacity() * size_of::<T>() + self.slots.capacity() * size_of::<u32>()
    }
}
