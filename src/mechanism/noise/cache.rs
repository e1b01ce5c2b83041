//! A small process-wide cache for public, data-independent precomputations (KDE bases,
//! eigenbases, FFT twiddles), bounded in bytes so that an analyst cannot grow the process by
//! asking for many distinct large parameter sets (each cheap in budget). When an insertion
//! would pass the bound, the cache is emptied first (entries in use stay alive through their
//! `Arc`s). Values are computed outside the lock.
//!
//! The slowest of them also persist across processes through a [`PublicStore`] that a front end
//! installs (a catalog session: a directory beside the catalog, trusted only as far as the
//! catalog itself), so that a one-query process does not compute them again: simulated band
//! quantiles (post-processing scalars, ≈ 50 ms each) and the mean curve's eigenbases (O(m³),
//! ≈ 1 s at m = 1000). Keys are public parameters; nothing derived from data is ever stored.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, RwLock};

/// A cache's values, and the bytes they hold in all.
type Entries<K, V> = (HashMap<K, Arc<V>>, usize);

/// A byte-bounded map from public parameters to shared values.
pub struct PublicCache<K, V> {
    /// The values and their bytes in all (None until first used).
    inner: Mutex<Option<Entries<K, V>>>,
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
        if let Some((map, _)) = self.inner.lock().expect("cache lock").as_ref()
            && let Some(v) = map.get(&key)
        {
            return Ok(Arc::clone(v));
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

/// A persistent store of public values (implemented outside the mechanism layer). Values are
/// functions of their keys — public parameters — never of data.
pub trait PublicStore: Send + Sync {
    /// The stored bytes of `key`, if present, intact and trusted.
    fn get(&self, key: &str) -> Option<Vec<u8>>;
    /// Stores `value` under `key` (best effort: a failure only means recomputing later).
    fn put(&self, key: &str, value: &[u8]);
}

static STORE: RwLock<Option<Arc<dyn PublicStore>>> = RwLock::new(None);

/// Installs the process's store (None: none). Every store yields the same values (they are
/// functions of their keys), so the last one installed serves every session.
pub fn set_public_store(store: Option<Arc<dyn PublicStore>>) {
    *STORE.write().expect("store lock") = store;
}

/// The version of the band simulations' definitions, part of every stored key: bump it when a
/// simulation (its seed, draws or statistic) changes, so stored values of the old one are not used.
const SIMULATIONS: u32 = 1;

/// `name(key)` from the store when it holds a value `decode` accepts, else `compute()`'s (then
/// stored, `encode`d, unless `encode` declines it). `version` names the definition of the computation: bump it when the
/// computation changes, so values stored by the old one are not used.
pub fn stored<T>(
    name: &str,
    version: u32,
    key: &impl Debug,
    encode: impl FnOnce(&T) -> Option<Vec<u8>>,
    decode: impl FnOnce(&[u8]) -> Option<T>,
    compute: impl FnOnce() -> T,
) -> T {
    let store = STORE.read().expect("store lock").clone();
    let Some(store) = store else { return compute() };
    let key = format!("{name} v{version} {key:?}");
    if let Some(v) = store.get(&key).and_then(|bytes| decode(&bytes)) {
        return v;
    }
    let v = compute();
    if let Some(bytes) = encode(&v) {
        store.put(&key, &bytes);
    }
    v
}

/// A simulated band quantile `name(key)`: the store's value when it has a finite one, else
/// `compute()`'s (then stored, when finite).
pub fn stored_quantile(name: &str, key: &impl Debug, compute: impl FnOnce() -> f64) -> f64 {
    stored(
        name,
        SIMULATIONS,
        key,
        |v: &f64| v.is_finite().then(|| v.to_le_bytes().to_vec()),
        |b| Some(f64::from_le_bytes(b.try_into().ok()?)).filter(|v| v.is_finite()),
        compute,
    )
}

/// Little-endian f64s (the stored form of vectors).
pub fn encode_f64s(values: impl IntoIterator<Item = f64>) -> Vec<u8> {
    values.into_iter().flat_map(f64::to_le_bytes).collect()
}

/// The f64s of [`encode_f64s`]'s bytes (None unless a whole number of them).
pub fn decode_f64s(bytes: &[u8]) -> Option<Vec<f64>> {
    bytes
        .len()
        .is_multiple_of(8)
        .then(|| bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
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
