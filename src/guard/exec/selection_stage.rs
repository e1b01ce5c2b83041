//! A partition selection the gate runs before the query's rows are read (SPEC §7): the first
//! pass's unit counts per candidate key hash, exact discrete Laplace noise, the threshold τ,
//! then the `select_max_groups` highest; the kept hashes go to the membership filter.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;

use crate::functions::PermitSlot;
use crate::guard::ops::sample_order::canonical_rows;
use crate::guard::ops::selected::{IntegerSelection, SelectedKeys, integer_keys};
use crate::mechanism::NoiseSource;
use crate::mechanism::selection::PartitionSelection;

/// One partition selection to run in the gate before the query's rows are read.
pub struct SelectionStage {
    /// The first pass: (key hash, unit count) per candidate group.
    pub plan: LogicalPlan,
    /// Its physical plan (set by the planner).
    pub physical: Option<Arc<dyn ExecutionPlan>>,
    selection: PartitionSelection,
    max_groups: usize,
    keys: Arc<SelectedKeys>,
    /// The key of the hash the first pass grouped by.
    hash_key: (u64, u64),
    noise: NoiseSource,
    /// The release permit slots of the GROUP BY's private calls: after the selection each
    /// holds exactly one permit per selected group.
    slots: Vec<Arc<PermitSlot>>,
}

impl fmt::Debug for SelectionStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SelectionStage(τ = {}, max_groups = {})", self.selection.threshold(), self.max_groups)
    }
}

impl SelectionStage {
    /// A selection whose first pass is `plan` (grouped by the key hash under `hash_key`), keeping
    /// at most `max_groups` groups into `keys` and giving each of `slots` one permit per kept group.
    pub fn new(
        plan: LogicalPlan,
        selection: PartitionSelection,
        max_groups: usize,
        keys: Arc<SelectedKeys>,
        hash_key: (u64, u64),
        noise: NoiseSource,
        slots: Vec<Arc<PermitSlot>>,
    ) -> Self {
        Self { plan, physical: None, selection, max_groups, keys, hash_key, noise, slots }
    }

    /// Selects from the first pass's output (`batches`): noisy count ≥ τ, then the
    /// `max_groups` highest, and hands the keys to the membership filter. Returns how many.
    pub fn select(&self, batches: &[RecordBatch]) -> Result<usize> {
        let mut rng = self.noise.release_rng().map_err(|e| DataFusionError::Execution(e.to_string()))?;
        // (noisy count, key hash, the key's canonical encoding when the first pass counted by value,
        // and its value (None: NULL) when that key is one integer column)
        type Candidate = (i128, Vec<u8>, Option<Vec<u8>>, Option<Option<i64>>);
        let mut kept: Vec<Candidate> = Vec::new();
        for b in batches {
            let keys = b.column(0).as_fixed_size_binary();
            let counts = b.column(1).as_primitive::<Int64Type>();
            let values = if b.num_columns() > 2 { Some(canonical_rows(&b.columns()[2..])?) } else { None };
            let integers = if b.num_columns() == 3 { integer_keys(b.column(2)) } else { None };
            for row in 0..b.num_rows() {
                let key = keys.value(row).to_vec();
                let c = counts.value(row).max(0) as u64;
                let noisy = match rng.as_mut() {
                    Some(r) => self.selection.noisy_count(c, r),
                    None => c as i128, // test hook: noise off
                };
                if noisy >= self.selection.threshold() as i128 {
                    let integer = integers.as_ref().map(|v| v.is_valid(row).then(|| v.value(row)));
                    kept.push((noisy, key, values.as_ref().map(|v| v.row(row).as_ref().to_vec()), integer));
                }
            }
        }
        kept.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        kept.truncate(self.max_groups);
        let n = kept.len();
        let chosen: Vec<Vec<u8>> = kept.iter().map(|(_, k, _, _)| k.clone()).collect();
        self.slots.iter().for_each(|s| {
            s.set_available(n as u64);
            s.set_selected(chosen.clone(), self.hash_key);
        });
        let integers = kept.iter().map(|(_, _, _, i)| *i).collect::<Option<Vec<Option<i64>>>>().map(|keys| {
            IntegerSelection { keys: keys.iter().flatten().copied().collect(), null: keys.iter().any(Option::is_none) }
        });
        match kept.iter().map(|(_, _, v, _)| v.clone()).collect::<Option<Vec<_>>>() {
            Some(values) if n > 0 => self.keys.set_with_values(chosen, values, integers)?,
            _ => self.keys.set(chosen)?,
        }
        Ok(n)
    }
}
