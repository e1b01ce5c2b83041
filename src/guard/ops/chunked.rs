//! A vector in fixed chunks of `N` items: it never holds room for twice its items (a vector
//! doubles) nor moves them when it grows, so a planned operator can bound its memory by its items
//! alone — at most one chunk more. Used where the memory plan counts every byte a row can add
//! (the unit bound's samples, the unit table's keys).

use std::mem::size_of;
use std::ops::{Index, IndexMut};

/// The items, indexed from 0 (module docs).
pub(crate) struct Chunked<T, const N: usize> {
    chunks: Vec<Box<[T]>>,
    len: usize,
}

impl<T: Default, const N: usize> Chunked<T, N> {
    const SHIFT: u32 = {
        assert!(N.is_power_of_two());
        N.trailing_zeros()
    };
    /// Bytes of the chunks' pointers per item: a vector of them at most doubles (two pointers
    /// per chunk), rounded up.
    pub(crate) const POINTER_BYTES_PER_ITEM: usize = (2 * size_of::<Box<[T]>>()).div_ceil(N);
    /// Bytes of one chunk.
    pub(crate) const CHUNK_BYTES: usize = N * size_of::<T>();

    /// Empty, without a chunk.
    pub(crate) fn new() -> Self {
        Self { chunks: Vec::new(), len: 0 }
    }

    /// Empty, with its first chunk.
    pub(crate) fn with_first_chunk() -> Self {
        Self { chunks: vec![Self::chunk()], len: 0 }
    }

    fn chunk() -> Box<[T]> {
        (0..N).map(|_| T::default()).collect()
    }

    /// Items held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Holds at least `len` items (new ones the default); never shrinks.
    pub(crate) fn resize(&mut self, len: usize) {
        while self.chunks.len() * N < len {
            self.chunks.push(Self::chunk());
        }
        self.len = self.len.max(len);
    }

    /// Appends `item`.
    pub(crate) fn push(&mut self, item: T) {
        let at = self.len;
        self.resize(at + 1);
        self[at] = item;
    }

    /// Bytes held by the store (not by what its items own).
    pub(crate) fn size(&self) -> usize {
        self.chunks.capacity() * size_of::<Box<[T]>>() + self.chunks.len() * Self::CHUNK_BYTES
    }

    /// The items, by index.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> + Clone {
        self.chunks.iter().flat_map(|c| c.iter()).take(self.len)
    }

    /// The items, by index, mutably.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.chunks.iter_mut().flat_map(|c| c.iter_mut()).take(self.len)
    }

    /// Resets every item to the default and forgets them, keeping the chunks.
    pub(crate) fn clear(&mut self) {
        for i in 0..self.len {
            self[i] = T::default();
        }
        self.len = 0;
    }

    /// Forgets every item and frees the chunks.
    pub(crate) fn free(&mut self) {
        *self = Self::new();
    }

    /// Takes out the first `n` items; the others move down by `n`.
    pub(crate) fn take_first(&mut self, n: usize) -> Vec<T> {
        let n = n.min(self.len);
        let taken = (0..n).map(|i| std::mem::take(&mut self[i])).collect();
        for i in n..self.len {
            let moved = std::mem::take(&mut self[i]);
            self[i - n] = moved;
        }
        self.len -= n;
        taken
    }
}

impl<T: Default, const N: usize> Index<usize> for Chunked<T, N> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        debug_assert!(i < self.len);
        &self.chunks[i >> Self::SHIFT][i & (N - 1)]
    }
}

impl<T: Default, const N: usize> IndexMut<usize> for Chunked<T, N> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        debug_assert!(i < self.len);
        &mut self.chunks[i >> Self::SHIFT][i & (N - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_across_chunks_and_moves_down_what_is_left() {
        let mut s = Chunked::<u64, 512>::with_first_chunk();
        assert_eq!(s.size(), size_of::<Box<[u64]>>() + 512 * 8);
        let n = 3 * 512 + 5;
        s.resize(n - 1);
        s.push(0);
        assert_eq!((s.chunks.len(), s.len()), (4, n));
        for i in 0..n {
            s[i] = i as u64 + 1;
        }
        assert!(s.iter().copied().eq(1..=n as u64));
        let first = s.take_first(700);
        assert!(first.into_iter().eq(1..=700));
        assert_eq!((s.len(), s[0], s[n - 701]), (n - 700, 701, n as u64));
        s.clear();
        s.resize(2);
        assert_eq!((s.len(), s[1], s.chunks.len()), (2, 0, 4), "emptied, room kept");
        s.free();
        assert_eq!((s.len(), s.size()), (0, 0));
    }
}
