//! The catalog's record of private tables' verified files ([`crate::policy::verified_files`]).

use rusqlite::{OptionalExtension, params};

use super::*;
use crate::policy::verified_files::VerifiedFile;

impl Catalog {
    /// Records that the files of the private table `name` were read whole as `files` describes
    /// them (replacing an earlier verification): analyst queries may read those files, unchanged.
    pub fn record_verification(&self, name: &str, files: &[VerifiedFile]) -> Result<(), PolicyError> {
        self.with_policy_tx(name, |tx| {
            tx.execute("DELETE FROM verified_files WHERE table_name = ?1", [name]).map_err(storage)?;
            tx.execute(&format!("INSERT OR REPLACE INTO verified (table_name, at) VALUES (?1, {NOW})"), [name])
                .map_err(storage)?;
            for f in files {
                let size = i64::try_from(f.size)
                    .map_err(|_| PolicyError::Invalid(format!("file /{} is too large to record", f.path)))?;
                tx.execute(
                    "INSERT INTO verified_files (table_name, path, size, modified_ns) VALUES (?1, ?2, ?3, ?4)",
                    params![name, f.path, size, f.modified_ns],
                )
                .map_err(storage)?;
            }
            Ok(())
        })
    }

    /// The files the last verification of table `name` read (None: never verified), as a read
    /// that takes no lock.
    pub fn verified_files(&self, name: &str) -> Result<Option<Vec<VerifiedFile>>, PolicyError> {
        self.with_read(|tx| verified_files_of(tx, name))
    }
}

/// The files the last verification of table `name` read (None: never verified).
pub(super) fn verified_files_of(
    conn: &rusqlite::Connection,
    name: &str,
) -> Result<Option<Vec<VerifiedFile>>, PolicyError> {
    let verified = conn
        .query_row("SELECT 1 FROM verified WHERE table_name = ?1", [name], |_| Ok(()))
        .optional()
        .map_err(storage)?;
    if verified.is_none() {
        return Ok(None);
    }
    let mut stmt = conn
        .prepare("SELECT path, size, modified_ns FROM verified_files WHERE table_name = ?1 ORDER BY path")
        .map_err(storage)?;
    let files = stmt
        .query_map([name], |r| {
            Ok(VerifiedFile {
                path: r.get(0)?,
                size: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(u64::MAX),
                modified_ns: r.get(2)?,
            })
        })
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)?;
    Ok(Some(files))
}
