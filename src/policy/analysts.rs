//! Analysts, their bearer tokens and their shares of private tables' budgets.
//!
//! An analyst is a name in the catalog with a bearer token. The token is shown once, when it
//! is made (`dpcurve admin add-analyst` / `rotate-token`); the catalog keeps only a random
//! salt and `SHA-256(domain ‖ salt ‖ secret)`. Tokens carry 256 random bits from the
//! operating system, so a fast hash is enough (no password-stretching is needed for secrets
//! that cannot be guessed), and hashes are compared in constant time.
//!
//! A grant gives an analyst a share (ε, δ) of one private table's budget. A release made in an
//! analyst's session is charged on the table's total *and* on the analyst's share, in the same
//! transaction ([`super::Catalog::charge_as`]); an analyst without a share of a private table
//! cannot spend on it. Shares may add up to more than the table's total: the total still
//! bounds what all analysts together can spend. The table owner's sessions (the CLI with
//! `--catalog`, the library's [`crate::AnalystSession::open`]) have no principal and are
//! charged on the totals only.

use rusqlite::{OptionalExtension, params};
use sha2::{Digest, Sha256};

use super::catalog::{Catalog, PolicyError};
use super::error::storage;
use super::hex::{hex, unhex};
pub use super::shares::Grant;
use super::shares::require_active;
use crate::mechanism::noise::budget::Budget;

/// What every token starts with (and its format version).
pub const TOKEN_PREFIX: &str = "dpc1";
const HASH_DOMAIN: &[u8] = b"dpcurve analyst token v1\0";
const SECRET_BYTES: usize = 32;
const SALT_BYTES: usize = 16;

/// An analyst of the catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalystInfo {
    /// The analyst's name (the principal recorded in the release log).
    pub name: String,
    /// When the analyst was added (UTC, ISO 8601).
    pub added_at: String,
    /// When the analyst was removed, if so (a removed name is never reused).
    pub removed_at: Option<String>,
    /// Shares of private tables.
    pub grants: Vec<Grant>,
}

fn random_bytes<const N: usize>() -> Result<[u8; N], PolicyError> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::ChaCha20Rng::try_from_rng(&mut rand::rngs::SysRng)
        .map_err(|e| PolicyError::Storage(format!("the operating system's random source failed: {e}")))?;
    let mut out = [0u8; N];
    rng.fill_bytes(&mut out);
    Ok(out)
}

fn hash(salt: &[u8], secret: &[u8]) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(HASH_DOMAIN);
    h.update(salt);
    h.update(secret);
    h.finalize().to_vec()
}

/// Equality of two byte strings in time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The (name, secret) of a token `dpc1.NAME.HEX`, if it has that shape.
fn parse_token(token: &str) -> Option<(&str, Vec<u8>)> {
    let rest = token.trim().strip_prefix(TOKEN_PREFIX)?.strip_prefix('.')?;
    let (name, secret) = rest.rsplit_once('.')?;
    let secret = unhex(secret).filter(|s| s.len() == SECRET_BYTES)?;
    (!name.is_empty()).then_some((name, secret))
}

/// The message of every failed authentication: it does not say whether the name exists.
pub const BAD_TOKEN: &str = "invalid or revoked token (ask the data owner for a token: `dpcurve admin add-analyst`)";

fn validate_analyst_name(name: &str) -> Result<(), PolicyError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(PolicyError::Invalid(format!(
            "analyst name '{name}' must start with a letter and contain only letters, digits, '_' and '-' \
             (at most 64)"
        )))
    }
}

impl Catalog {
    /// Adds an analyst and returns their bearer token — the only time it is shown.
    pub fn add_analyst(&self, name: &str) -> Result<String, PolicyError> {
        validate_analyst_name(name)?;
        let (salt, secret) = (random_bytes::<SALT_BYTES>()?, random_bytes::<SECRET_BYTES>()?);
        self.with_tx(|tx| {
            let existing: Option<bool> = tx
                .query_row("SELECT removed_at IS NOT NULL FROM analysts WHERE name = ?1", [name], |r| r.get(0))
                .optional()
                .map_err(storage)?;
            match existing {
                Some(false) => {
                    return Err(PolicyError::Invalid(format!(
                        "analyst '{name}' already exists (rotate-token gives them a new token)"
                    )));
                }
                Some(true) => {
                    return Err(PolicyError::Invalid(format!(
                        "analyst '{name}' was removed; names are not reused, so the release log keeps one \
                         meaning per name — choose another name"
                    )));
                }
                None => {}
            }
            tx.execute(
                "INSERT INTO analysts (name, salt, token_hash, added_at) \
                 VALUES (?1, ?2, ?3, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                params![name, salt.to_vec(), hash(&salt, &secret)],
            )
            .map_err(storage)?;
            Ok(())
        })?;
        Ok(format!("{TOKEN_PREFIX}.{name}.{}", hex(&secret)))
    }

    /// Gives an analyst a new token; the old one stops working at once.
    pub fn rotate_token(&self, name: &str) -> Result<String, PolicyError> {
        let (salt, secret) = (random_bytes::<SALT_BYTES>()?, random_bytes::<SECRET_BYTES>()?);
        self.with_tx(|tx| {
            require_active(tx, name).map_err(|_| PolicyError::Invalid(format!("no active analyst named '{name}'")))?;
            tx.execute(
                "UPDATE analysts SET salt = ?2, token_hash = ?3 WHERE name = ?1",
                params![name, salt.to_vec(), hash(&salt, &secret)],
            )
            .map_err(storage)?;
            Ok(())
        })?;
        Ok(format!("{TOKEN_PREFIX}.{name}.{}", hex(&secret)))
    }

    /// Removes an analyst: the token stops working at once (also for queries already planned
    /// but not yet charged); their grants and release log entries stay, under their name.
    pub fn remove_analyst(&self, name: &str) -> Result<(), PolicyError> {
        self.with_tx(|tx| {
            require_active(tx, name).map_err(|_| PolicyError::Invalid(format!("no active analyst named '{name}'")))?;
            tx.execute(
                "UPDATE analysts SET token_hash = NULL, removed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') \
                 WHERE name = ?1",
                [name],
            )
            .map_err(storage)?;
            Ok(())
        })
    }

    /// Sets an analyst's share of a private table's budget to `total` (what was already spent
    /// of the share stays spent; a share set below it is exhausted).
    pub fn grant(&self, name: &str, table: &str, total: Budget) -> Result<(), PolicyError> {
        self.with_tx(|tx| {
            require_active(tx, name).map_err(|_| PolicyError::Invalid(format!("no active analyst named '{name}'")))?;
            let private: Option<i64> = tx
                .query_row("SELECT private FROM tables WHERE name = ?1", [table], |r| r.get(0))
                .optional()
                .map_err(storage)?;
            match private {
                None => return Err(PolicyError::Invalid(format!("no table named '{table}' in the catalog"))),
                Some(0) => {
                    return Err(PolicyError::Invalid(format!(
                        "table '{table}' is public: every analyst reads it without a budget"
                    )));
                }
                Some(_) => {}
            }
            tx.execute(
                "INSERT INTO grants (analyst, table_name, epsilon_total, delta_total) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (analyst, table_name) DO UPDATE
                 SET epsilon_total = excluded.epsilon_total, delta_total = excluded.delta_total",
                params![name, table, total.epsilon_units, total.delta_units],
            )
            .map_err(storage)?;
            Ok(())
        })
    }

    /// Every analyst (removed ones included) with their shares, by name.
    pub fn analysts(&self) -> Result<Vec<AnalystInfo>, PolicyError> {
        self.with_read(|tx| {
            let mut stmt =
                tx.prepare("SELECT name, added_at, removed_at FROM analysts ORDER BY name").map_err(storage)?;
            let mut out: Vec<AnalystInfo> = stmt
                .query_map([], |r| {
                    Ok(AnalystInfo { name: r.get(0)?, added_at: r.get(1)?, removed_at: r.get(2)?, grants: vec![] })
                })
                .map_err(storage)?
                .collect::<Result<_, _>>()
                .map_err(storage)?;
            let mut stmt = tx
                .prepare(
                    "SELECT analyst, table_name, epsilon_total, delta_total, epsilon_spent, delta_spent FROM grants
                     ORDER BY analyst, table_name",
                )
                .map_err(storage)?;
            let grants: Vec<(String, Grant)> = stmt
                .query_map([], |r| {
                    Ok((
                        r.get(0)?,
                        Grant {
                            table: r.get(1)?,
                            total: Budget { epsilon_units: r.get(2)?, delta_units: r.get(3)? },
                            spent: Budget { epsilon_units: r.get(4)?, delta_units: r.get(5)? },
                        },
                    ))
                })
                .map_err(storage)?
                .collect::<Result<_, _>>()
                .map_err(storage)?;
            for (name, g) in grants {
                if let Some(a) = out.iter_mut().find(|a| a.name == name) {
                    a.grants.push(g);
                }
            }
            Ok(out)
        })
    }

    /// The analyst a bearer token belongs to, or [`BAD_TOKEN`] (the same message whether the
    /// name is unknown, removed or the secret wrong; the hash is computed and compared in
    /// every case).
    pub fn authenticate(&self, token: &str) -> Result<String, PolicyError> {
        let bad = || PolicyError::Unauthenticated(BAD_TOKEN.into());
        let (name, secret) = parse_token(token).ok_or_else(bad)?;
        let row: Option<(Vec<u8>, Option<Vec<u8>>)> = self.with_read(|tx| {
            tx.query_row("SELECT salt, token_hash FROM analysts WHERE name = ?1", [name], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .map_err(storage)
        })?;
        let (salt, stored) = match row {
            Some((salt, Some(stored))) => (salt, stored),
            _ => (vec![0u8; SALT_BYTES], vec![0xffu8; 32]), // same work, never equal
        };
        if constant_time_eq(&hash(&salt, &secret), &stored) { Ok(name.to_string()) } else { Err(bad()) }
    }

    /// An analyst's share of a table, if granted.
    pub fn share(&self, analyst: &str, table: &str) -> Result<Option<Grant>, PolicyError> {
        Ok(self
            .analysts()?
            .into_iter()
            .find(|a| a.name == analyst)
            .and_then(|a| a.grants.into_iter().find(|g| g.table == table)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Charge;

    fn catalog(name: &str) -> Catalog {
        let c = Catalog::create_or_open(&crate::policy::catalog::fresh_test_path(&format!("analysts-{name}"))).unwrap();
        for t in ["p", "q"] {
            c.register_table(t, &format!("/data/{t}.parquet")).unwrap();
            c.make_private(t, Budget::total(1.0, 1e-5).unwrap()).unwrap();
        }
        c.register_table("public", "/data/public.parquet").unwrap();
        c
    }

    fn kde(table: &str, eps: f64) -> Charge {
        Charge { table: table.into(), function: "private_kde".into(), cost: Budget::charge(eps, 0.0).unwrap() }
    }

    #[test]
    fn tokens_authenticate_their_analyst_only_and_are_stored_hashed() {
        let c = catalog("tokens");
        let alice = c.add_analyst("alice").unwrap();
        let bob = c.add_analyst("bob").unwrap();
        assert!(alice.starts_with("dpc1.alice.") && alice.len() == "dpc1.alice.".len() + 64, "{alice}");
        assert_eq!(c.authenticate(&alice).unwrap(), "alice");
        assert_eq!(c.authenticate(&bob).unwrap(), "bob");
        // Bob's secret under Alice's name, a flipped digit, garbage: one message for all.
        let bob_secret = bob.rsplit_once('.').unwrap().1;
        let mut flipped = alice.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        for bad in [
            format!("dpc1.alice.{bob_secret}"),
            String::from_utf8(flipped).unwrap(),
            "dpc1.carol.00".into(),
            "".into(),
            "Bearer x".into(),
        ] {
            let e = c.authenticate(&bad).unwrap_err();
            assert_eq!(e, PolicyError::Unauthenticated(BAD_TOKEN.into()), "{bad}");
        }
        // Only a salted hash is in the file: the secret's bytes (hex or raw) appear nowhere.
        let conn = rusqlite::Connection::open(c.path()).unwrap();
        let dump: Vec<(String, Vec<u8>, Vec<u8>)> = conn
            .prepare("SELECT name, salt, token_hash FROM analysts")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let secret = unhex(alice.rsplit_once('.').unwrap().1).unwrap();
        for (_, salt, h) in &dump {
            assert_eq!(salt.len(), SALT_BYTES);
            assert!(!h.windows(8).any(|w| secret.windows(8).any(|s| s == w)));
        }
        assert_ne!(dump[0].1, dump[1].1, "every analyst has their own salt");
        // Rotation: the old token stops working, the new one works; removal ends both.
        let alice2 = c.rotate_token("alice").unwrap();
        assert!(c.authenticate(&alice).is_err());
        assert_eq!(c.authenticate(&alice2).unwrap(), "alice");
        c.remove_analyst("alice").unwrap();
        assert!(c.authenticate(&alice2).is_err());
        assert!(c.add_analyst("alice").unwrap_err().to_string().contains("names are not reused"));
        assert!(c.add_analyst("bob").unwrap_err().to_string().contains("already exists"));
        assert!(c.add_analyst("no spaces").is_err());
        assert!(c.rotate_token("alice").is_err());
    }

    #[test]
    fn a_charge_needs_room_on_the_total_and_on_the_share_and_debits_both_atomically() {
        let c = catalog("shares");
        c.add_analyst("alice").unwrap();
        c.add_analyst("bob").unwrap();
        // No share: refused, nothing debited.
        let e = c.charge_as(&[kde("p", 0.1)], "q", Some("alice")).unwrap_err();
        assert!(matches!(e, PolicyError::NoShare { .. }), "{e:?}");
        assert!(e.to_string().contains("analyst 'alice' has no share of table 'p'"), "{e}");
        assert!(c.grant("alice", "public", Budget::total(1.0, 0.0).unwrap()).is_err());
        c.grant("alice", "p", Budget::total(0.3, 0.0).unwrap()).unwrap();
        c.grant("bob", "p", Budget::total(0.9, 0.0).unwrap()).unwrap();
        c.grant("bob", "q", Budget::total(0.05, 0.0).unwrap()).unwrap();
        for _ in 0..3 {
            c.charge_as(&[kde("p", 0.1)], "q", Some("alice")).unwrap();
        }
        let e = c.charge_as(&[kde("p", 0.1)], "q", Some("alice")).unwrap_err();
        assert!(matches!(&e, PolicyError::BudgetExhausted { analyst: Some(a), .. } if a == "alice"), "{e}");
        // Bob: his share of p is 0.9 but the table has only 0.7 left: the total refuses.
        for _ in 0..7 {
            c.charge_as(&[kde("p", 0.1)], "q", Some("bob")).unwrap();
        }
        let e = c.charge_as(&[kde("p", 0.1)], "q", Some("bob")).unwrap_err();
        assert!(matches!(&e, PolicyError::BudgetExhausted { analyst: None, .. }), "{e}");
        // A query over p and q where q's share is too small debits neither.
        c.raise_budget("p", Budget::total(1.0, 0.0).unwrap()).unwrap();
        let before = c.analysts().unwrap();
        assert!(c.charge_as(&[kde("p", 0.1), kde("q", 0.1)], "q", Some("bob")).is_err());
        assert_eq!(c.analysts().unwrap(), before);
        assert_eq!(c.table("q").unwrap().unwrap().policy.unwrap().spent, Budget::ZERO);
        let alice = c.share("alice", "p").unwrap().unwrap();
        assert_eq!((alice.spent, alice.remaining()), (Budget::total(0.3, 0.0).unwrap(), Budget::ZERO));
        // The owner's session: totals only. The log says who.
        c.charge(&[kde("p", 0.1)], "q").unwrap();
        let who: Vec<Option<String>> = c.release_log(Some("p")).unwrap().into_iter().map(|r| r.analyst).collect();
        assert_eq!(who.iter().filter(|w| w.as_deref() == Some("alice")).count(), 3);
        assert_eq!(who.iter().filter(|w| w.as_deref() == Some("bob")).count(), 7);
        assert_eq!(who.last().unwrap(), &None);
        // A removed analyst's planned query cannot be charged.
        c.remove_analyst("bob").unwrap();
        let e = c.charge_as(&[kde("p", 0.1)], "q", Some("bob")).unwrap_err();
        assert!(matches!(e, PolicyError::Unauthenticated(_)), "{e}");
        // Lowering a share below what was spent exhausts it (and is allowed).
        c.grant("alice", "p", Budget::total(0.1, 0.0).unwrap()).unwrap();
        assert_eq!(c.share("alice", "p").unwrap().unwrap().remaining(), Budget::ZERO);
    }
}
