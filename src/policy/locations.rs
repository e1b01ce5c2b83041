//! Where tables' files are (SPEC §5.2): whether two locations reach a common file — by path, or
//! on disk through every symbolic link — and which locations DataFusion would read as a pattern
//! or a URL (refused).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::error::PolicyError;

/// Whether two locations reach common files: equal paths, or one is a directory holding the
/// other (compared by path components, so `/a/b` does not hold `/a/bc`), or — walking both
/// on disk and resolving every symbolic link — some file is reached from both (SPEC §5.2).
pub fn locations_overlap(a: &str, b: &str) -> bool {
    // A location DataFusion would read as a pattern may list any file: it overlaps everything.
    if has_pattern_syntax(a) || has_pattern_syntax(b) {
        return true;
    }
    let (pa, pb) = (Path::new(a), Path::new(b));
    pa.starts_with(pb) || pb.starts_with(pa) || !reached_files(a).is_disjoint(&reached_files(b))
}

/// Characters that make DataFusion read a path as a glob pattern (`?`, `*`, `[`), so that it
/// lists every file the pattern matches instead of the file of that name.
const PATTERN_CHARS: [char; 3] = ['?', '*', '['];

/// Whether `location` is not a plain path: it holds glob syntax, or it is a URL (`scheme://…`).
pub fn has_pattern_syntax(location: &str) -> bool {
    location.contains(PATTERN_CHARS) || location.contains("://")
}

/// Refuses a location that DataFusion would not read as exactly the file or directory of that
/// name (SPEC §5.2): glob characters and URLs. A location is the set of files DataFusion lists
/// for it, and only for plain paths is that the set [`reached_files`] computes.
pub fn check_location_syntax(location: &str) -> Result<(), PolicyError> {
    if has_pattern_syntax(location) {
        return Err(PolicyError::Invalid(format!(
            "location {location} is not a plain path: DataFusion reads `?`, `*` and `[` as a file pattern \
             and `scheme://` as a URL, which can list other tables' files; rename the file or directory (or \
             link it under a plain name) and register that"
        )));
    }
    Ok(())
}

/// The identity of a file: (device, inode) on Unix — so hard links, which are the same file
/// under another name, are recognised — and the canonical path elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum FileId {
    /// Device and inode numbers.
    Inode(u64, u64),
    /// Canonical path (platforms without inode numbers).
    Path(PathBuf),
}

fn file_id(real: &Path) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(real).ok()?;
        Some(FileId::Inode(m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        Some(FileId::Path(real.to_path_buf()))
    }
}

/// Every file a location reaches: the file itself, or all files under the directory
/// (recursively, following symbolic links to files and directories, each directory once),
/// identified so that symbolic and hard links to the same file compare equal. Unreadable
/// entries reach nothing.
pub fn reached_files(location: &str) -> BTreeSet<FileId> {
    let mut files = BTreeSet::new();
    let mut seen_dirs = BTreeSet::new();
    let mut stack = vec![PathBuf::from(location)];
    while let Some(p) = stack.pop() {
        let Ok(real) = std::fs::canonicalize(&p) else { continue };
        if real.is_dir() {
            if seen_dirs.insert(real.clone())
                && let Ok(entries) = std::fs::read_dir(&real)
            {
                stack.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        } else if let Some(id) = file_id(&real) {
            files.insert(id);
        }
    }
    files
}
