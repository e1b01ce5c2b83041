//! Release permits: one charge, one release (SPEC §5.1).
//!
//! In a catalog session every private aggregate call that reads a private table gets its
//! own [`PermitSlot`] from the guard; the budget gate grants the slot one permit per
//! execution, after the ledger debit; the accumulator's final evaluation takes one before it
//! draws any noise, and fails without one. So no plan shape — a re-executed subtree, a
//! recursive term, a join that runs its input twice — can release more often than it paid.
//! The UDFs registered in a catalog session are [`Permits::Denied`] until the guard assigns
//! slots (fail closed); calls over public tables become [`Permits::Free`].

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::common::{Result, ScalarValue, exec_datafusion_err, exec_err};

use crate::mechanism::noise::budget::Budget;
use crate::mechanism::stored::Recipe;

/// Where paid releases are kept (the catalog, in catalog sessions).
pub trait ReleaseStore: Send + Sync + std::fmt::Debug {
    /// Keeps `recipes` under the ledger entry `charge` of `table`, at the reserved ids
    /// `first_id`, `first_id + 1`, …, all or none; returns the releases' ids in order.
    fn store(
        &self,
        first_id: i64,
        charge: i64,
        table: &str,
        recipes: &[&Recipe],
    ) -> std::result::Result<Vec<String>, String>;
}

/// What one private call is charged: the gate matches it with the ledger entry it debits.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotCharge {
    /// The private table.
    pub table: String,
    /// The private function.
    pub function: String,
    /// What one execution of the call costs.
    pub cost: Budget,
}

/// Where the releases of one paid execution go: the store, the ledger entry, and the first of
/// the release ids reserved for this call in this execution.
type Ticket = (Arc<dyn ReleaseStore>, i64, i64);

/// One private call's permits: granted by the gate, taken by the release.
#[derive(Debug)]
pub struct PermitSlot {
    id: u64,
    available: AtomicU64,
    /// Releases one paid execution makes: 1, or the number of declared groups.
    per_execution: u64,
    /// The declared groups of a grouped call (SPEC §7), one key tuple each.
    groups: Option<Arc<Vec<Vec<ScalarValue>>>>,
    /// A grant replaces what is left instead of adding to it (partition selection: at most the
    /// public cap of groups per execution, however few were selected).
    replace: bool,
    /// What the call is charged (set by the guard).
    charge: OnceLock<SlotCharge>,
    /// Where this execution's releases are kept (set by the gate after the debit).
    ticket: Mutex<Option<Ticket>>,
    /// Releases kept in this execution: the next one gets the reserved id `first + kept`.
    kept: AtomicU64,
    /// What a partition selection chose in this execution.
    selected: Mutex<Option<Selection>>,
}

/// The key hashes a partition selection chose, sorted, and the key of that hash (to tell a
/// selected group's rows from others after the selection).
type Selection = (Arc<Vec<Vec<u8>>>, (u64, u64));

impl PermitSlot {
    /// A new slot with no permit, for an ungrouped call (one release per execution).
    pub fn new() -> Arc<Self> {
        Self::make(1, None)
    }

    /// A new slot for a call grouped by declared keys: one release per group per execution.
    pub fn for_groups(groups: Vec<Vec<ScalarValue>>) -> Arc<Self> {
        Self::make(groups.len() as u64, Some(Arc::new(groups)))
    }

    /// A new slot for a call grouped by private keys: at most `max_groups` releases (the
    /// selected groups) per execution.
    pub fn for_selection(max_groups: u64) -> Arc<Self> {
        let slot = Self::make(max_groups, None);
        Arc::new(Self { replace: true, ..Arc::into_inner(slot).expect("fresh") })
    }

    fn make(per_execution: u64, groups: Option<Arc<Vec<Vec<ScalarValue>>>>) -> Arc<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        Arc::new(Self {
            id,
            available: AtomicU64::new(0),
            per_execution,
            groups,
            replace: false,
            charge: OnceLock::new(),
            ticket: Mutex::new(None),
            kept: AtomicU64::new(0),
            selected: Mutex::new(None),
        })
    }

    /// Records what the call is charged (the guard, once).
    pub fn set_charge(&self, charge: SlotCharge) {
        let _ = self.charge.set(charge);
    }

    /// What the call is charged, if the guard recorded it.
    pub fn charge(&self) -> Option<&SlotCharge> {
        self.charge.get()
    }

    /// Where the releases of the execution just paid are kept (the gate, after the debit), and
    /// the first of the [`PermitSlot::per_execution`] release ids reserved for them.
    pub fn set_ticket(&self, store: Arc<dyn ReleaseStore>, charge_id: i64, first_release: i64) {
        *self.ticket.lock().expect("ticket lock") = Some((store, charge_id, first_release));
        self.kept.store(0, Ordering::SeqCst);
    }

    /// The ids of the releases kept so far in this execution (all paid and stored).
    pub fn kept_ids(&self) -> Vec<i64> {
        let first = self.ticket.lock().expect("ticket lock").as_ref().map(|t| t.2);
        let kept = self.kept.load(Ordering::SeqCst).min(self.per_execution);
        first.map(|f| (0..kept as i64).map(|i| f + i).collect()).unwrap_or_default()
    }

    /// Releases one paid execution may make (the ids the gate reserves for the call).
    pub fn per_execution(&self) -> u64 {
        self.per_execution
    }

    /// Records the key hashes a partition selection chose (16 bytes each, under the keyed
    /// hash `hash_key`), sorted.
    pub fn set_selected(&self, mut keys: Vec<Vec<u8>>, hash_key: (u64, u64)) {
        keys.sort();
        *self.selected.lock().expect("selection lock") = Some((Arc::new(keys), hash_key));
    }

    /// The key hashes the partition selection of this execution chose, sorted (None before it
    /// ran).
    pub fn selected(&self) -> Option<Arc<Vec<Vec<u8>>>> {
        self.selected.lock().expect("selection lock").as_ref().map(|(k, _)| Arc::clone(k))
    }

    /// The key of the selection's keyed hash (None before it ran).
    pub fn selection_hash_key(&self) -> Option<(u64, u64)> {
        self.selected.lock().expect("selection lock").as_ref().map(|(_, h)| *h)
    }

    /// One more execution is paid for (the gate, after the debit): one release per group.
    pub fn grant(&self) {
        if self.replace {
            self.available.store(self.per_execution, Ordering::SeqCst);
        } else {
            self.available.fetch_add(self.per_execution, Ordering::SeqCst);
        }
    }

    /// Sets the permits left for this execution (partition selection: exactly the groups
    /// selected, so nothing is left over for anything else).
    pub fn set_available(&self, n: u64) {
        self.available.store(n.min(self.per_execution), Ordering::SeqCst);
    }

    /// Takes one permit; false if none is left.
    pub fn take(&self) -> bool {
        self.available.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }

    /// Whether this is the slot of a call grouped by private keys (partition selection).
    pub fn is_selection(&self) -> bool {
        self.replace
    }

    /// Permits granted and not yet used.
    pub fn available(&self) -> u64 {
        self.available.load(Ordering::SeqCst)
    }
}

/// Whether a private aggregate's releases need permits.
#[derive(Debug, Clone, Default)]
pub enum Permits {
    /// No permit needed: sessions without a catalog, and calls over public tables.
    #[default]
    Free,
    /// Every release refused: a catalog session's registered UDF before the guard gave the
    /// call its slot.
    Denied,
    /// One release per permit granted to this slot.
    Slot(Arc<PermitSlot>),
}

impl Permits {
    /// Takes the permit for one release, or fails (before any noise is drawn).
    pub fn take(&self, function: &str) -> Result<()> {
        match self {
            Permits::Free => Ok(()),
            Permits::Slot(s) if s.take() => Ok(()),
            Permits::Slot(_) => exec_err!(
                "{function}: no release permit left — this execution already released this call once; a \
                 release is drawn once per paid execution (SPEC §5.1)"
            ),
            Permits::Denied => {
                exec_err!("{function}: no release permit — the call was not priced by the planner guard")
            }
        }
    }

    /// Keeps a release made under a permit (catalog sessions) and returns its id; None for
    /// releases that are not kept (sessions without a catalog, calls over public tables).
    pub fn keep(&self, function: &str, recipe: &Recipe) -> Result<Option<String>> {
        Ok(self.keep_all(function, &[recipe])?.pop().flatten())
    }

    /// Keeps releases made under permits, in order (one transaction), and returns their ids
    /// (all None when releases are not kept), as [`Permits::keep`] does for one.
    pub fn keep_all(&self, function: &str, recipes: &[&Recipe]) -> Result<Vec<Option<String>>> {
        let unkept = || Ok(vec![None; recipes.len()]);
        let Permits::Slot(slot) = self else { return unkept() };
        if recipes.is_empty() {
            return Ok(Vec::new());
        }
        let ticket = slot.ticket.lock().expect("ticket lock").clone();
        let Some(charge) = slot.charge() else { return unkept() };
        let Some((store, charge_id, first)) = ticket else {
            return datafusion::common::internal_err!(
                "{function}: a priced release has no ledger entry to be kept under"
            );
        };
        // Releases are numbered in the order the call evaluates them, which the plan fixes
        // (groups in their canonical order), from the ids reserved for this call.
        let n = recipes.len() as u64;
        let index = slot.kept.fetch_add(n, Ordering::SeqCst);
        if index + n > slot.per_execution {
            return exec_err!("{function}: more releases than this execution paid for");
        }
        let ids = store
            .store(first + index as i64, charge_id, &charge.table, recipes)
            .map_err(|e| exec_datafusion_err!("{function}: the release was drawn but could not be stored: {e}"))?;
        Ok(ids.into_iter().map(Some).collect())
    }

    /// The slot, if the call has one.
    pub fn slot(&self) -> Option<&Arc<PermitSlot>> {
        match self {
            Permits::Slot(s) => Some(s),
            _ => None,
        }
    }

    /// Whether the call is grouped by private keys (its slot is a partition selection's).
    pub fn is_selection(&self) -> bool {
        matches!(self, Permits::Slot(s) if s.is_selection())
    }

    /// The declared groups of a grouped call.
    pub fn groups(&self) -> Option<Arc<Vec<Vec<ScalarValue>>>> {
        match self {
            Permits::Slot(s) => s.groups.clone(),
            _ => None,
        }
    }

    fn key(&self) -> u64 {
        match self {
            Permits::Free => 0,
            Permits::Denied => u64::MAX,
            Permits::Slot(s) => s.id,
        }
    }
}

impl PartialEq for Permits {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Permits {}

impl Hash for Permits {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_gives_one_release_per_grant() {
        let s = PermitSlot::new();
        let p = Permits::Slot(Arc::clone(&s));
        assert!(p.take("f").is_err(), "no grant, no release");
        s.grant();
        p.take("f").unwrap();
        assert!(p.take("f").is_err(), "one grant, one release");
        s.grant();
        s.grant();
        assert_eq!(s.available(), 2);
        assert!(Permits::Denied.take("f").is_err());
        Permits::Free.take("f").unwrap();
        assert_ne!(Permits::Slot(PermitSlot::new()), Permits::Slot(PermitSlot::new()));
    }
}
