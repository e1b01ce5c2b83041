//! The catalog's store of public scalars ([`ScalarStore`]): simulated band quantiles kept in a
//! directory beside the catalog (`<catalog>.cache/`), so that a process that runs one query
//! (`dpcurve sql -c …`) does not simulate a band again.
//!
//! One small file per key, named by a hash of the key and written atomically (temporary file,
//! then rename); each holds the key itself, the value's bits and a checksum of both, and a file
//! that does not parse, names another key or fails its checksum is ignored (the value is
//! recomputed and the file rewritten). At most [`MAX_ENTRIES`] files: a store that reaches it
//! is emptied first, so that many distinct parameter sets (each cheap in budget) cannot fill the
//! disk. Keys are public parameters and values simulations from public seeds: nothing in the
//! directory depends on a table's rows.

use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::mechanism::noise::cache::ScalarStore;

/// Most files the store holds.
pub const MAX_ENTRIES: usize = 4096;
/// Largest file read (an entry is ≈ 200 bytes).
const MAX_FILE: u64 = 4096;
const HEADER: &str = "dpcurve public scalar 1";

/// A directory of public scalars.
#[derive(Debug, Clone)]
pub struct DiskScalars {
    dir: PathBuf,
}

fn digest(text: &str) -> u128 {
    let mut h = SipHasher13::new_with_keys(0x6470_6375_7276_6531, 0x7075_626c_6963_0001);
    h.write(text.as_bytes());
    u128::from(h.finish128())
}

impl DiskScalars {
    /// The store beside the catalog file `catalog` (`<catalog>.cache/`).
    pub fn beside(catalog: &Path) -> Self {
        let mut name = catalog.file_name().unwrap_or_default().to_os_string();
        name.push(".cache");
        Self { dir: catalog.with_file_name(name) }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{:032x}.scalar", digest(key)))
    }

    fn entries(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        dir.filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "scalar" || x == "tmp"))
            .collect()
    }
}

fn body(key: &str, bits: u64) -> String {
    format!("{key}\n{bits:016x}")
}

impl ScalarStore for DiskScalars {
    fn get(&self, key: &str) -> Option<f64> {
        let path = self.file(key);
        if std::fs::metadata(&path).ok()?.len() > MAX_FILE {
            return None;
        }
        let text = std::fs::read_to_string(&path).ok()?;
        let mut lines = text.lines();
        if lines.next()? != HEADER || lines.next()? != key {
            return None;
        }
        let bits = u64::from_str_radix(lines.next()?, 16).ok()?;
        let check = u128::from_str_radix(lines.next()?, 16).ok()?;
        if lines.next().is_some() || check != digest(&body(key, bits)) {
            return None;
        }
        let value = f64::from_bits(bits);
        value.is_finite().then_some(value)
    }

    fn put(&self, key: &str, value: f64) {
        if !value.is_finite() || std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        let entries = self.entries();
        if entries.len() >= MAX_ENTRIES {
            for e in entries {
                let _ = std::fs::remove_file(e);
            }
        }
        let bits = value.to_bits();
        let text = format!("{HEADER}\n{}\n{:032x}\n", body(key, bits), digest(&body(key, bits)));
        let path = self.file(key);
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("{}.{n}.tmp", std::process::id()));
        if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(tag: &str) -> DiskScalars {
        let dir = std::env::temp_dir().join(format!("dpcurve-scalars-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        DiskScalars::beside(&dir.join("catalog.db"))
    }

    #[test]
    fn values_round_trip_and_damaged_files_are_ignored() {
        let s = store("round-trip");
        assert_eq!(s.dir().file_name().unwrap(), "catalog.db.cache");
        assert_eq!(s.get("band a"), None);
        s.put("band a", 2.875);
        s.put("band b", 1.0 / 3.0);
        assert_eq!((s.get("band a"), s.get("band b")), (Some(2.875), Some(1.0 / 3.0)));
        // A flipped digit in the value fails the checksum; a file copied under another key's
        // name names the wrong key; a truncated file does not parse.
        let a = s.file("band a");
        let text = std::fs::read_to_string(&a).unwrap();
        std::fs::write(&a, text.replacen("4007", "4008", 1)).unwrap();
        assert_eq!(s.get("band a"), None);
        std::fs::copy(s.file("band b"), s.file("band c")).unwrap();
        assert_eq!(s.get("band c"), None);
        std::fs::write(s.file("band b"), &std::fs::read(s.file("band b")).unwrap()[..20]).unwrap();
        assert_eq!(s.get("band b"), None);
        // Rewritten, it is read again; non-finite values are never stored.
        s.put("band a", 2.875);
        assert_eq!(s.get("band a"), Some(2.875));
        s.put("band nan", f64::NAN);
        assert_eq!(s.get("band nan"), None);
        let _ = std::fs::remove_dir_all(s.dir().parent().unwrap());
    }

    #[test]
    fn the_store_is_bounded() {
        let s = store("bounded");
        for i in 0..MAX_ENTRIES + 10 {
            s.put(&format!("k{i}"), i as f64);
        }
        let n = s.entries().len();
        assert!((1..=MAX_ENTRIES).contains(&n), "{n} files");
        assert_eq!(s.get(&format!("k{}", MAX_ENTRIES + 9)), Some((MAX_ENTRIES + 9) as f64));
        let _ = std::fs::remove_dir_all(s.dir().parent().unwrap());
    }
}
