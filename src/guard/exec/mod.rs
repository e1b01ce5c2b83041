//! The gate and its execution stages: the budget gate at the root of every plan that reads a
//! private table, the release prefetch, the canonical final phase of grouped aggregates, and the
//! partition selections the gate runs first; the privacy-unit bound and a selection's count planned
//! in one phase, with their own key table and spill decided from the input's public row bound, and
//! private calls' parameters bound once.

pub mod canonical_groups;
pub mod gate;
pub(crate) mod key_table;
pub mod known_keys_partial;
pub(crate) mod node;
pub mod parameters;
pub mod planned_aggregate;
pub mod prefetch;
pub mod public_facts;
pub mod selection_stage;
pub mod unit_phase;
pub mod unit_table;
