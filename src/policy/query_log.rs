//! What the ledger keeps of a query's text: bounded, once per query.
//!
//! A statement can be megabytes long (a large `VALUES` list, a long literal), and one query can
//! make many private calls. The ledger keeps one `queries` row per paid execution, holding the
//! first [`HEAD_BYTES`] bytes of the statement, its length and its SHA-256, and every charge row
//! of the execution points at it. So the catalog grows by a bounded amount per query, whatever
//! the statement's length; the hash still identifies the exact statement.
//!
//! A query run for a server ticket also records the SHA-256 of the ticket's handle, so a ticket
//! that is gone (expired, or the server restarted) can still be answered with the stored
//! releases it paid for.

use sha2::{Digest, Sha256};

use super::hex::hex;

/// Bytes of a statement's text the ledger keeps (cut at a character boundary).
pub const HEAD_BYTES: usize = 4096;

/// The ledger's record of one statement: its head, length and hash, and the server ticket it
/// was planned for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryRecord {
    head: String,
    length: u64,
    sha256: [u8; 32],
    ticket: Option<[u8; 32]>,
}

impl QueryRecord {
    /// The record of `text` (its head, length and hash).
    pub fn of(text: &str) -> Self {
        let mut cut = text.len().min(HEAD_BYTES);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        Self {
            head: text[..cut].to_string(),
            length: text.len() as u64,
            sha256: Sha256::digest(text.as_bytes()).into(),
            ticket: None,
        }
    }

    /// The same record, for the server ticket with handle `handle`.
    pub fn for_ticket(self, handle: &[u8]) -> Self {
        Self { ticket: Some(ticket_hash(handle)), ..self }
    }

    /// The statement's SHA-256 (hex), as `dpcurve.releases` and `dpcurve.results` show it.
    pub fn sha256_hex(&self) -> String {
        hex(&self.sha256)
    }

    /// The text as the release log shows it: the statement, or its head and what was cut.
    pub fn display(&self) -> String {
        display(&self.head, self.length, &hex(&self.sha256))
    }

    pub(super) fn columns(&self) -> (&str, i64, String, Option<&[u8]>) {
        (
            &self.head,
            i64::try_from(self.length).unwrap_or(i64::MAX),
            hex(&self.sha256),
            self.ticket.as_ref().map(|t| t.as_slice()),
        )
    }
}

/// SHA-256 of a ticket handle (what the ledger keeps of it).
pub(super) fn ticket_hash(handle: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"dpcurve-ticket\0");
    h.update(handle);
    h.finalize().into()
}

/// The text of a stored head: whole when nothing was cut, else with its length and hash.
pub(super) fn display(head: &str, length: u64, sha256: &str) -> String {
    if head.len() as u64 >= length {
        head.to_string()
    } else {
        format!("{head}… [statement cut at {} of {length} bytes; SHA-256 {sha256}]", head.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_bounded_and_cut_at_characters() {
        let short = QueryRecord::of("SELECT 1");
        assert_eq!(short.display(), "SELECT 1");
        let long = format!("SELECT '{}'", "é".repeat(10_000));
        let r = QueryRecord::of(&long);
        assert!(r.head.len() <= HEAD_BYTES && r.head.len() >= HEAD_BYTES - 3, "{}", r.head.len());
        let shown = r.display();
        assert!(shown.contains(&format!("of {} bytes", long.len())), "{}", &shown[shown.len() - 120..]);
        assert!(shown.len() < HEAD_BYTES + 200);
        assert_ne!(QueryRecord::of(&format!("{long} ")).sha256, r.sha256, "the hash covers the whole text");
        assert_ne!(r.clone().for_ticket(&[1; 16]).ticket, r.for_ticket(&[2; 16]).ticket);
    }
}
