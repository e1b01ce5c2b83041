//! The catalog's store of public values ([`PublicStore`]): simulated band quantiles and
//! eigenbases kept in a directory beside the catalog (`<catalog>.cache/`), so that a process that
//! runs one query (`dpcurve sql -c …`) does not compute them again.
//!
//! One file per key, named by a hash of the key and written atomically (temporary file, then
//! rename); each holds the key itself, the value's bytes and a checksum of both. A file that does
//! not parse, names another key or fails its checksum is ignored (the value is recomputed and the
//! file rewritten).
//!
//! **Trust.** An eigenbasis calibrates noise, so a stored one must be as trustworthy as the
//! catalog: on Unix, the directory and every file read must belong to the catalog file's owner
//! and be writable by no one else (the store creates them `0700`/`0600`); otherwise they are
//! ignored. Whoever passes that check could also rewrite the ledger itself.
//!
//! **Bounds.** At most [`MAX_ENTRIES`] files and [`MAX_BYTES`] bytes: a store that would pass
//! either is emptied first, so that many distinct parameter sets (each cheap in budget) cannot
//! fill the disk. Keys are public parameters and values functions of them: nothing in the
//! directory depends on a table's rows.

use std::hash::Hasher;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::mechanism::noise::cache::PublicStore;

/// Most files the store holds.
pub const MAX_ENTRIES: usize = 4096;
/// Most bytes the store holds.
pub const MAX_BYTES: u64 = 512 << 20;
/// Largest file read or written (the largest eigenbasis, m = 2048 with every pair kept, is 32 MiB).
const MAX_FILE: u64 = 64 << 20;
const MAGIC: &[u8] = b"dpcurve public value 2\n";
const EXTENSION: &str = "value";

/// A directory of public values beside a catalog.
#[derive(Debug, Clone)]
pub struct DiskStore {
    dir: PathBuf,
    /// The catalog file's owner (Unix): files of anyone else are not read. None: no store.
    owner: Option<u32>,
    /// Most files and bytes held ([`MAX_ENTRIES`], [`MAX_BYTES`]).
    max_entries: usize,
    max_bytes: u64,
}

fn digest(parts: &[&[u8]]) -> u128 {
    let mut h = SipHasher13::new_with_keys(0x6470_6375_7276_6531, 0x7075_626c_6963_0002);
    for p in parts {
        h.write(&(p.len() as u64).to_le_bytes());
        h.write(p);
    }
    u128::from(h.finish128())
}

#[cfg(unix)]
fn owner_of(meta: &std::fs::Metadata) -> u32 {
    std::os::unix::fs::MetadataExt::uid(meta)
}

#[cfg(not(unix))]
fn owner_of(_: &std::fs::Metadata) -> u32 {
    0
}

/// Whether no one but the owner may write (Unix: no group or world write bit).
#[cfg(unix)]
fn private_to_owner(meta: &std::fs::Metadata) -> bool {
    std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o022 == 0
}

#[cfg(not(unix))]
fn private_to_owner(_: &std::fs::Metadata) -> bool {
    true
}

impl DiskStore {
    /// The store beside the catalog file `catalog` (`<catalog>.cache/`); it reads only what the
    /// catalog file's owner wrote (no store when the catalog's owner cannot be read).
    pub fn beside(catalog: &Path) -> Self {
        let mut name = catalog.file_name().unwrap_or_default().to_os_string();
        name.push(".cache");
        let owner = std::fs::metadata(catalog).ok().map(|m| owner_of(&m));
        Self { dir: catalog.with_file_name(name), owner, max_entries: MAX_ENTRIES, max_bytes: MAX_BYTES }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{:032x}.{EXTENSION}", digest(&[key.as_bytes()])))
    }

    /// Whether `path` (not followed if a link) is a `dir`/file of the catalog's owner that no one
    /// else may write.
    fn trusted(&self, path: &Path, dir: bool) -> Option<std::fs::Metadata> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        let kind = if dir { meta.is_dir() } else { meta.is_file() };
        (kind && Some(owner_of(&meta)) == self.owner && private_to_owner(&meta)).then_some(meta)
    }

    /// (path, bytes) of every entry, temporary file and entry of the older scalar-only format
    /// (`.scalar`, never read: emptying the store removes them too).
    fn entries(&self) -> Vec<(PathBuf, u64)> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        dir.filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == EXTENSION || x == "tmp" || x == "scalar"))
            .map(|e| (e.path(), e.metadata().map_or(0, |m| m.len())))
            .collect()
    }

    fn ensure_dir(&self) -> bool {
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        let _ = builder.create(&self.dir);
        self.trusted(&self.dir, true).is_some()
    }
}

fn encode(key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 28 + key.len() + value.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(key.len() as u64).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(value);
    out.extend_from_slice(&digest(&[key.as_bytes(), value]).to_le_bytes());
    out
}

/// The (key, value) of an entry's file, if intact (for inspection; [`PublicStore::get`] also
/// checks who wrote it).
pub fn read_entry(path: &Path) -> Option<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).ok()?;
    let rest = bytes.strip_prefix(MAGIC)?;
    let len = usize::try_from(u64::from_le_bytes(rest.get(..8)?.try_into().ok()?)).ok()?;
    let key = String::from_utf8(rest.get(8..8usize.checked_add(len)?)?.to_vec()).ok()?;
    let value = decode(&bytes, &key)?;
    Some((key, value))
}

/// The value of a file's bytes if they hold `key`'s entry intact.
fn decode(bytes: &[u8], key: &str) -> Option<Vec<u8>> {
    // A length-prefixed field: (field, what follows).
    let field = |b: &[u8]| -> Option<(Vec<u8>, usize)> {
        let len = usize::try_from(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)).ok()?;
        Some((b.get(8..8usize.checked_add(len)?)?.to_vec(), 8 + len))
    };
    let rest = bytes.strip_prefix(MAGIC)?;
    let (stored_key, used) = field(rest)?;
    let (value, used_value) = field(&rest[used..])?;
    let check = &rest[used + used_value..];
    let intact = stored_key == key.as_bytes()
        && check.len() == 16
        && u128::from_le_bytes(check.try_into().ok()?) == digest(&[&stored_key, &value]);
    intact.then_some(value)
}

impl PublicStore for DiskStore {
    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.trusted(&self.dir, true)?;
        let path = self.file(key);
        if self.trusted(&path, false)?.len() > MAX_FILE {
            return None;
        }
        decode(&std::fs::read(&path).ok()?, key)
    }

    fn put(&self, key: &str, value: &[u8]) {
        let bytes = encode(key, value);
        let size = bytes.len() as u64;
        if self.owner.is_none() || size > MAX_FILE || !self.ensure_dir() {
            return;
        }
        let entries = self.entries();
        let held: u64 = entries.iter().map(|e| e.1).sum();
        if entries.len() >= self.max_entries || held + size > self.max_bytes {
            for (path, _) in entries {
                let _ = std::fs::remove_file(path);
            }
        }
        let path = self.file(key);
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("{}.{n}.tmp", std::process::id()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let written = options.open(&tmp).and_then(|mut f| f.write_all(&bytes));
        if written.is_err() || std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(tag: &str) -> DiskStore {
        let dir = std::env::temp_dir().join(format!("dpcurve-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("catalog.db"), b"").unwrap();
        DiskStore::beside(&dir.join("catalog.db"))
    }

    #[test]
    fn values_round_trip_and_damaged_files_are_ignored() {
        let s = store("round-trip");
        assert_eq!(s.dir().file_name().unwrap(), "catalog.db.cache");
        assert_eq!(s.get("band a"), None);
        s.put("band a", &2.875f64.to_le_bytes());
        s.put("basis b", &[7u8; 1000]);
        assert_eq!(s.get("band a"), Some(2.875f64.to_le_bytes().to_vec()));
        assert_eq!(s.get("basis b"), Some(vec![7u8; 1000]));
        // A flipped bit in the value fails the checksum; a file copied under another key's name
        // names the wrong key; a truncated or extended file does not parse.
        let b = s.file("basis b");
        let mut bytes = std::fs::read(&b).unwrap();
        bytes[MAGIC.len() + 8 + "basis b".len() + 8 + 500] ^= 1;
        std::fs::write(&b, &bytes).unwrap();
        assert_eq!(s.get("basis b"), None);
        std::fs::copy(s.file("band a"), s.file("band c")).unwrap();
        assert_eq!(s.get("band c"), None);
        let a = std::fs::read(s.file("band a")).unwrap();
        std::fs::write(s.file("band a"), &a[..a.len() - 1]).unwrap();
        assert_eq!(s.get("band a"), None);
        std::fs::write(s.file("band a"), [&a[..], b"x"].concat()).unwrap();
        assert_eq!(s.get("band a"), None);
        // Rewritten, it is read again.
        s.put("band a", &2.875f64.to_le_bytes());
        assert_eq!(s.get("band a"), Some(2.875f64.to_le_bytes().to_vec()));
        let _ = std::fs::remove_dir_all(s.dir().parent().unwrap());
    }

    #[cfg(unix)]
    #[test]
    fn only_files_no_one_else_may_write_are_read() {
        use std::os::unix::fs::PermissionsExt;
        let s = store("trust");
        s.put("basis", &[1, 2, 3]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(s.dir()), mode(&s.file("basis"))), (0o700, 0o600));
        assert_eq!(s.get("basis"), Some(vec![1, 2, 3]));
        // Group- or world-writable file or directory: not read (the control above reads it).
        for (path, m) in [(s.file("basis"), 0o620), (s.file("basis"), 0o602), (s.dir().to_path_buf(), 0o770)] {
            let before = std::fs::metadata(&path).unwrap().permissions();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
            assert_eq!(s.get("basis"), None, "{} at {m:o}", path.display());
            std::fs::set_permissions(&path, before).unwrap();
            assert_eq!(s.get("basis"), Some(vec![1, 2, 3]));
        }
        // A link in place of the file is not followed.
        let target = s.dir().join("elsewhere");
        std::fs::rename(s.file("basis"), &target).unwrap();
        std::os::unix::fs::symlink(&target, s.file("basis")).unwrap();
        assert_eq!(s.get("basis"), None);
        // Another owner's catalog: nothing this process wrote is read.
        let foreign = DiskStore { owner: s.owner.map(|o| o + 1), ..s.clone() };
        std::fs::remove_file(s.file("basis")).unwrap();
        s.put("basis", &[1, 2, 3]);
        assert_eq!((s.get("basis"), foreign.get("basis")), (Some(vec![1, 2, 3]), None));
        let _ = std::fs::remove_dir_all(s.dir().parent().unwrap());
    }

    #[test]
    fn the_store_is_bounded_in_files_and_bytes() {
        let s = DiskStore { max_entries: 100, max_bytes: 100_000, ..store("bounded") };
        for i in 0..110 {
            s.put(&format!("k{i}"), &(i as f64).to_le_bytes());
        }
        let n = s.entries().len();
        assert!((1..=100).contains(&n), "{n} files");
        assert_eq!(s.get("k109"), Some(109f64.to_le_bytes().to_vec()));
        let big = vec![0u8; 30_000];
        for i in 0..4 {
            s.put(&format!("big{i}"), &big);
        }
        let held: u64 = s.entries().iter().map(|e| e.1).sum();
        assert!(held <= 100_000, "{held} bytes");
        assert_eq!(s.get("big3").map(|v| v.len()), Some(big.len()));
        let _ = std::fs::remove_dir_all(s.dir().parent().unwrap());
    }
}
