//! A small process-wide cache for public, data-independent precomputations (KDE bases,
//! eigenbases, FFT twiddles), bounded in bytes so that an analyst cannot grow the process by
//! asking for many distinct large parameter sets (each cheap in budget). When an insertion
//! would pass the bound, the cache is emptied first (entries in use stay alive through their
//! `Arc`s). Values are computed outside the lock.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// A byte-bounded map from public parameters to shared values.
pub struct PublicCache<K, V> {
    inner: Mutex<Option<(HashMap<K, Arc<V>>, usize)>>,
    limit: usize,
}

impl<K: Eq + Hash, V> PublicCache<K, V> {
    /// An empty cache holding at most `limit` bytes (as reported by the `bytes` argument of
    /// [`PublicCache::get_or_try_insert`]).
    pub const fn new(limit: usize) -> Self {
        Self { inner: Mutex::new(None), limit }
    }

    /// The cached value for `key`, or `build()`'s (cached if it fits: `bytes(&value)` ≤ limit).
    pub fn get_or_try_insert<E>(
        &self,
        key: K,
        bytes: impl Fn(&V) -> usize,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<Arc<V>, E> {
        if let Some((map, _)) = self.inner.lock().expect("cache lock").as_ref() {
            if let Some(v) = map.get(&key) {
                return Ok(Arc::clone(v));
            }
        }
        let value = Arc::new(build()?);
        let size = bytes(&value);
        if size > self.limit {
            return Ok(value);
        }
        let mut guard = self.inner.lock().expect("cache lock");
        let (map, used) = guard.get_or_insert_with(|| (HashMap::new(), 0));
        if let Some(v) = map.get(&key) {
            return Ok(Arc::clone(v)); // another thread built it meanwhile
        }
        if *used + size > self.limit {
            map.clear();
            *used = 0;
        }
        *used += size;
        map.insert(key, Arc::clone(&value));
        Ok(value)
    }

    /// Empties the cache (benchmarks time uncached work with it).
    pub fn clear(&self) {
        *self.inner.lock().expect("cache lock") = None;
    }

    /// Bytes currently held.
    pub fn bytes(&self) -> usize {
        self.inner.lock().expect("cache lock").as_ref().map_or(0, |(_, b)| *b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_holds_and_values_are_shared() {
        let c: PublicCache<u32, Vec<u8>> = PublicCache::new(1000);
        let a = c.get_or_try_insert::<()>(1, |v| v.len(), || Ok(vec![0; 600])).unwrap();
        let b = c.get_or_try_insert::<()>(1, |v| v.len(), || panic!("cached")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        c.get_or_try_insert::<()>(2, |v| v.len(), || Ok(vec![0; 600])).unwrap();
        assert!(c.bytes() <= 1000, "{}", c.bytes());
        let big = c.get_or_try_insert::<()>(3, |v| v.len(), || Ok(vec![0; 5000])).unwrap();
        assert_eq!(big.len(), 5000);
        assert!(c.bytes() <= 1000);
        assert_eq!(c.get_or_try_insert::<&str>(4, |v| v.len(), || Err("no")).unwrap_err(), "no");
    }
}
