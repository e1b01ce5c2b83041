//! The table that finds each row's privacy unit among the units a partition has seen: units of
//! one fixed-width type (an integer-like value of at most 16 bytes, or the unit's 16-byte keyed
//! hash) held inline as 128-bit words in an open-addressing table.
//!
//! It replaces DataFusion's group-value interning for the unit bound ([`super::planned_aggregate`]),
//! where the units' states (tens of bytes each, for 10⁵–10⁶ units) evict every table from the
//! caches: DataFusion's interning then waits on two dependent cache misses per row (its hash
//! table, then its values to compare). Here a slot holds the key itself, and a batch's keys are
//! hashed first so that the slot of a row a few rows ahead is prefetched while this row is
//! probed — the misses overlap instead of being paid one at a time. The group of a unit is the
//! order in which it was first seen (as DataFusion numbers groups); NULL is one unit of its own.
//!
//! The slots are split into shards by the hash's top bits, each doubling alone ([`Sharded`]), so
//! that one more unit never rehashes every unit: the time a table takes is a sum of bounded
//! costs per unit, without a step at a count of units (SPEC §0).

use std::hash::BuildHasher;
use std::mem::size_of;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayData, ArrayRef, AsArray, BooleanArray, make_array};
use datafusion::arrow::buffer::{MutableBuffer, NullBuffer};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, internal_err};

use crate::guard::ops::chunked::Chunked;
use crate::guard::ops::prefetch_hint::prefetch;

/// Rows between a slot's prefetch and its probe: a probe takes a few nanoseconds, a miss to
/// memory a hundred or more.
const AHEAD: usize = 64;
/// The most bits of a hash that choose a spill partition at one level (256 files).
pub const LEVEL_BITS: u32 = 8;

/// Bytes of one unit key of type `t` when this table can hold it: booleans, fixed-width
/// primitives of at most 16 bytes whose values group as their bits do (integers, decimals, dates,
/// times, durations — not floats: −0 and NaN payloads), and 16-byte binaries (the unit's keyed
/// hash).
pub fn key_width(t: &DataType) -> Option<usize> {
    match t {
        DataType::Boolean => Some(1),
        DataType::FixedSizeBinary(16) => Some(16),
        t if t.is_floating() => None,
        t => t.primitive_width().filter(|w| *w <= 16),
    }
}

/// A slot of the table: a unit's key and its group (`EMPTY` when free), aligned to its own size
/// so that no slot straddles two cache lines (one prefetch fetches it whole).
trait Slot: Copy {
    const FREE: Self;
    fn new(key: u128, group: u32) -> Self;
    fn group(&self) -> u32;
    fn key(&self) -> u128;
}

/// Keys of at most 8 bytes (the common unit: an integer): 16 bytes a slot.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Narrow {
    key: u64,
    group: u32,
}

impl Slot for Narrow {
    const FREE: Self = Self { key: 0, group: EMPTY };
    fn new(key: u128, group: u32) -> Self {
        Self { key: key as u64, group }
    }
    fn group(&self) -> u32 {
        self.group
    }
    fn key(&self) -> u128 {
        u128::from(self.key)
    }
}

/// Keys of 9–16 bytes (a unit's hash, 128-bit integers and decimals): 32 bytes a slot.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Wide {
    key: u128,
    group: u32,
}

impl Slot for Wide {
    const FREE: Self = Self { key: 0, group: EMPTY };
    fn new(key: u128, group: u32) -> Self {
        Self { key, group }
    }
    fn group(&self) -> u32 {
        self.group
    }
    fn key(&self) -> u128 {
        self.key
    }
}

const EMPTY: u32 = u32::MAX;

/// Each group's key, in chunks (never room for twice the units).
type Keys = Chunked<u128, 1024>;

/// Units a shard holds when a partition holds the most units it can: the most one more unit can
/// make the table rehash.
pub const SHARD_UNITS: u64 = 256;
/// The most shards a table has (16 MiB of directory).
const MOST_SHARDS: usize = 1 << 20;
/// Shards of a table whose most units are unknown.
const DEFAULT_SHARDS: usize = 1 << 12;

/// The number of shards for a partition that holds at most `most_units` units at once: enough
/// that each holds about [`SHARD_UNITS`] then (a power of two).
pub fn shards_for(most_units: Option<u64>) -> usize {
    match most_units {
        None => DEFAULT_SHARDS,
        Some(u) => usize::try_from(u.div_ceil(SHARD_UNITS)).unwrap_or(MOST_SHARDS).next_power_of_two().min(MOST_SHARDS),
    }
}

/// The slots, split into shards chosen by a hash's top bits, each an open-addressing table that
/// doubles alone (at most 3/4 full): one more unit rehashes at most its shard's units, never the
/// table's. One table that doubled rehashed every unit when one more crossed 3/4 of a power of
/// two — a step of `O(units)` time an analyst filtering units with WHERE could time for a count
/// (SPEC §0). The number of shards comes from public facts ([`UnitTable::sized_for`]).
struct Sharded<S> {
    shards: Vec<Box<[S]>>,
    /// Units in each shard.
    used: Vec<u32>,
    /// log₂ of the number of shards.
    bits: u32,
    /// Slots in all shards.
    slots: usize,
}

impl<S: Slot> Sharded<S> {
    fn new(shards: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        Self {
            shards: (0..shards).map(|_| Box::default()).collect(),
            used: vec![0; shards],
            bits: shards.trailing_zeros(),
            slots: 0,
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> usize {
        if self.bits == 0 { 0 } else { (hash >> (64 - self.bits)) as usize }
    }

    fn bytes(&self) -> usize {
        self.slots * size_of::<S>() + Self::directory_bytes(self.shards.len())
    }

    fn directory_bytes(shards: usize) -> usize {
        shards * (size_of::<Box<[S]>>() + size_of::<u32>())
    }

    /// Empties every shard, keeping its room.
    fn clear(&mut self) {
        for shard in &mut self.shards {
            shard.fill(S::FREE);
        }
        self.used.fill(0);
    }

    /// Doubles shard `s` (at least 2 slots), placing its units again.
    fn grow(&mut self, s: usize, hash: &impl Fn(u128) -> u64) {
        let size = (2 * self.shards[s].len()).max(2);
        let old = std::mem::replace(&mut self.shards[s], vec![S::FREE; size].into_boxed_slice());
        self.slots += size - old.len();
        let (slots, mask) = (&mut self.shards[s], size - 1);
        #[cfg(test)]
        tests::REHASHED.with(|r| r.borrow_mut().push(self.used[s]));
        for slot in old.iter().filter(|slot| slot.group() != EMPTY) {
            let mut at = hash(slot.key()) as usize & mask;
            while slots[at].group() != EMPTY {
                at = (at + 1) & mask;
            }
            slots[at] = *slot;
        }
    }
}

/// The slots, of the width the units need.
enum Slots {
    Narrow(Sharded<Narrow>),
    Wide(Sharded<Wide>),
}

impl Slots {
    fn new(width: usize, shards: usize) -> Self {
        if width <= 8 { Self::Narrow(Sharded::new(shards)) } else { Self::Wide(Sharded::new(shards)) }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::Narrow(t) => t.bytes(),
            Self::Wide(t) => t.bytes(),
        }
    }

    fn shards(&self) -> usize {
        match self {
            Self::Narrow(t) => t.shards.len(),
            Self::Wide(t) => t.shards.len(),
        }
    }

    fn clear(&mut self) {
        match self {
            Self::Narrow(t) => t.clear(),
            Self::Wide(t) => t.clear(),
        }
    }
}

/// What one batch's probe reads and adds to: the batch's keys and their hashes, its NULLs, and
/// the table's units.
struct Batch<'a> {
    words: &'a [u128],
    hashes: &'a [u64],
    nulls: Option<NullBuffer>,
    keys: &'a mut Keys,
    null: &'a mut Option<u32>,
}

/// Each row's group in `out`, adding the units not seen before; the slot of the row `AHEAD`
/// rows on is prefetched while this row is probed (its shard's entry `AHEAD` rows before that).
fn probe<S: Slot>(t: &mut Sharded<S>, b: Batch<'_>, out: &mut Vec<usize>, hash: impl Fn(u128) -> u64) {
    for (i, &word) in b.words.iter().enumerate() {
        if let Some(&h) = b.hashes.get(i + 2 * AHEAD) {
            prefetch(&t.shards[t.shard(h)]);
        }
        if let Some(&h) = b.hashes.get(i + AHEAD) {
            let shard = &t.shards[t.shard(h)];
            if !shard.is_empty() {
                prefetch(&shard[h as usize & (shard.len() - 1)]);
            }
        }
        if b.nulls.as_ref().is_some_and(|v| v.is_null(i)) {
            let group = *b.null.get_or_insert_with(|| {
                b.keys.push(0);
                (b.keys.len() - 1) as u32
            });
            out.push(group as usize);
            continue;
        }
        let h = b.hashes[i];
        let s = t.shard(h);
        let found = {
            let slots = &t.shards[s];
            let mask = slots.len().wrapping_sub(1);
            let mut at = h as usize & mask;
            loop {
                match slots.get(at) {
                    Some(slot) if slot.group() == EMPTY => break None,
                    Some(slot) if slot.key() == word => break Some(slot.group()),
                    Some(_) => at = (at + 1) & mask,
                    None => break None,
                }
            }
        };
        let group = match found {
            Some(group) => group,
            None => {
                // A new unit: its shard stays at most 3/4 full.
                if 4 * (t.used[s] as usize + 1) > 3 * t.shards[s].len() {
                    t.grow(s, &hash);
                }
                let slots = &mut t.shards[s];
                let mask = slots.len() - 1;
                let mut at = h as usize & mask;
                while slots[at].group() != EMPTY {
                    at = (at + 1) & mask;
                }
                let group = b.keys.len() as u32;
                slots[at] = S::new(word, group);
                t.used[s] += 1;
                b.keys.push(word);
                group
            }
        };
        out.push(group as usize);
    }
}

/// The units of one partition (module docs).
pub struct UnitTable {
    data_type: DataType,
    width: usize,
    slots: Slots,
    /// Each group's key.
    keys: Keys,
    /// The group of the NULL unit, once seen.
    null: Option<u32>,
    /// The slots' hash: seeded at random per table, so that no units can be chosen to collide;
    /// fixed in this crate's unit tests, so that runs over neighbouring inputs place their common
    /// units alike and hold bytes in the same order as their units.
    hasher: foldhash::fast::SeedableRandomState,
    /// Chooses spill partitions: a hash of (level, unit) with full avalanche, so each level's
    /// partitions are independent of the earlier levels' and split any file of them evenly.
    partitioner: foldhash::quality::RandomState,
    /// Scratch: one batch's keys and hashes.
    words: Vec<u128>,
    hashes: Vec<u64>,
}

impl UnitTable {
    /// An empty table for units of type `data_type` (one [`key_width`] accepts), its hashes
    /// seeded at random.
    pub fn new(data_type: &DataType) -> Result<Self> {
        let Some(width) = key_width(data_type) else {
            return internal_err!("the unit table cannot hold units of type {data_type}");
        };
        Ok(Self {
            data_type: data_type.clone(),
            width,
            slots: Slots::new(width, 1),
            keys: Keys::new(),
            null: None,
            hasher: if cfg!(test) {
                foldhash::fast::SeedableRandomState::fixed()
            } else {
                foldhash::fast::SeedableRandomState::random()
            },
            partitioner: foldhash::quality::RandomState::default(),
            words: Vec::new(),
            hashes: Vec::new(),
        })
    }

    /// The same empty table, in as many shards as a partition that holds at most `most_units`
    /// units at once needs ([`shards_for`]; a public bound: the rows its input can have, or
    /// what its memory share holds).
    pub fn sized_for(self, most_units: Option<u64>) -> Self {
        Self { slots: Slots::new(self.width, shards_for(most_units)), ..self }
    }

    /// Units seen (groups numbered 0…len−1).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no unit was seen.
    pub fn is_empty(&self) -> bool {
        self.keys.len() == 0
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        self.slots.bytes()
            + self.keys.size()
            + self.words.capacity() * size_of::<u128>()
            + self.hashes.capacity() * size_of::<u64>()
    }

    /// The most bytes one more unit adds to [`Self::size`]: at most 8/3 slots (at most 3/4 of a
    /// power of two in use) and its key (in chunks, with their pointers). Besides these, a table
    /// holds at most [`Self::most_fixed_bytes`].
    pub fn most_bytes_per_unit(&self) -> usize {
        3 * self.slot_bytes() + size_of::<u128>() + Keys::POINTER_BYTES_PER_ITEM
    }

    /// The most bytes a table holds besides its units': its shards' directory, a batch's scratch
    /// (`batch` rows) and one chunk of keys.
    pub fn most_fixed_bytes(&self, batch: usize) -> usize {
        let directory = match &self.slots {
            Slots::Narrow(_) => Sharded::<Narrow>::directory_bytes(self.slots.shards()),
            Slots::Wide(_) => Sharded::<Wide>::directory_bytes(self.slots.shards()),
        };
        directory + Keys::CHUNK_BYTES + 2 * batch * (size_of::<u128>() + size_of::<u64>())
    }

    fn slot_bytes(&self) -> usize {
        if self.width <= 8 { size_of::<Narrow>() } else { size_of::<Wide>() }
    }

    /// Forgets every unit and keeps the table's room (the next window's units fill it again).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.keys.clear();
        self.null = None;
    }

    /// Forgets every unit and frees the table.
    pub fn reset(&mut self) {
        self.slots = Slots::new(self.width, self.slots.shards());
        self.keys.free();
        self.null = None;
        self.words = Vec::new();
        self.hashes = Vec::new();
    }

    /// The spill partition of `unit` (None: the NULL unit) at `level`, one of `2^bits`: the top
    /// `bits` bits of a hash of both (the hash's key drawn with the table).
    fn partition(&self, unit: Option<u128>, level: u32, bits: u32) -> usize {
        match bits {
            0 => 0,
            b => (self.partitioner.hash_one((level, unit)) >> (64 - b.min(LEVEL_BITS))) as usize,
        }
    }

    /// Reads `array`'s keys into `self.words` (a NULL reads as 0: the caller checks validity).
    fn read(&mut self, array: &dyn Array) -> Result<()> {
        if array.data_type() != &self.data_type {
            return internal_err!("a unit of type {} in a table of {}", array.data_type(), self.data_type);
        }
        self.words.clear();
        if let Some(b) = array.as_boolean_opt() {
            self.words.extend(b.values().iter().map(u128::from));
            return Ok(());
        }
        let data = array.to_data();
        let w = self.width;
        let Some(buffer) = data.buffers().first() else { return internal_err!("a fixed-width unit without values") };
        let bytes = &buffer.as_slice()[data.offset() * w..(data.offset() + data.len()) * w];
        match w {
            8 => {
                self.words.extend(bytes.chunks_exact(8).map(|c| u128::from(u64::from_le_bytes(c.try_into().unwrap()))))
            }
            16 => self.words.extend(bytes.chunks_exact(16).map(|c| u128::from_le_bytes(c.try_into().unwrap()))),
            _ => self.words.extend(bytes.chunks_exact(w).map(|c| {
                let mut k = [0; 16];
                k[..w].copy_from_slice(c);
                u128::from_le_bytes(k)
            })),
        }
        Ok(())
    }

    /// Each row's group in `out` (cleared first), adding the units not seen before.
    pub fn groups_of(&mut self, array: &dyn Array, out: &mut Vec<usize>) -> Result<()> {
        self.read(array)?;
        self.hashes.clear();
        let hasher = &self.hasher;
        self.hashes.extend(self.words.iter().map(|&k| hasher.hash_one(k)));
        out.clear();
        out.reserve(self.words.len());
        let batch = Batch {
            words: &self.words,
            hashes: &self.hashes,
            nulls: array.logical_nulls().filter(|n| n.null_count() > 0),
            keys: &mut self.keys,
            null: &mut self.null,
        };
        let hash = |k: u128| hasher.hash_one(k);
        match &mut self.slots {
            Slots::Narrow(slots) => probe(slots, batch, out, hash),
            Slots::Wide(slots) => probe(slots, batch, out, hash),
        }
        Ok(())
    }

    /// The spill partition of each of `array`'s rows at `level` (0, 1, …) among `2^bits`: a file
    /// of one level's partition is split by the next level's, independent of it.
    pub fn partitions_of(&mut self, array: &dyn Array, level: u32, bits: u32, out: &mut Vec<usize>) -> Result<()> {
        self.read(array)?;
        let nulls = array.logical_nulls().filter(|n| n.null_count() > 0);
        out.clear();
        for (i, &k) in self.words.iter().enumerate() {
            let unit = (!nulls.as_ref().is_some_and(|v| v.is_null(i))).then_some(k);
            out.push(self.partition(unit, level, bits));
        }
        Ok(())
    }

    /// The spill partition of each group's unit at `level` among `2^bits`.
    pub fn group_partitions(&self, level: u32, bits: u32) -> Vec<usize> {
        (0..self.keys.len())
            .map(|g| self.partition((self.null != Some(g as u32)).then_some(self.keys[g]), level, bits))
            .collect()
    }

    /// Each group's unit, as an array of the table's type (group `g` at index `g`).
    pub fn keys(&self) -> Result<ArrayRef> {
        let nulls = self.null.map(|n| NullBuffer::from_iter((0..self.keys.len()).map(|g| g != n as usize)));
        if self.data_type == DataType::Boolean {
            let values = BooleanArray::from_iter(self.keys.iter().map(|&k| Some(k != 0)));
            return Ok(Arc::new(BooleanArray::new(values.values().clone(), nulls)));
        }
        let mut values = MutableBuffer::new(self.keys.len() * self.width);
        for k in self.keys.iter() {
            values.extend_from_slice(&k.to_le_bytes()[..self.width]);
        }
        let data =
            ArrayData::builder(self.data_type.clone()).len(self.keys.len()).add_buffer(values.into()).nulls(nulls);
        Ok(make_array(data.build()?))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use datafusion::arrow::array::{Decimal128Array, FixedSizeBinaryArray, Int8Array, Int64Array, UInt16Array};
    use datafusion::common::ScalarValue;

    fn table(t: &DataType) -> UnitTable {
        UnitTable::new(t).unwrap()
    }

    /// Units of at most 8 bytes take 16-byte slots, wider ones 32: the same units, half the table.
    #[test]
    fn narrow_units_take_half_the_table() {
        let (ints, decimals) = (Int64Array::from_iter_values(0..5000), Decimal128Array::from_iter_values(0..5000));
        let (mut narrow, mut wide) = (table(ints.data_type()), table(decimals.data_type()));
        let mut out = Vec::new();
        narrow.groups_of(&ints, &mut out).unwrap();
        wide.groups_of(&decimals, &mut out).unwrap();
        assert_eq!((narrow.len(), wide.len()), (5000, 5000));
        let (Slots::Narrow(n), Slots::Wide(w)) = (&narrow.slots, &wide.slots) else { panic!("slot widths") };
        assert_eq!((n.slots * size_of::<Narrow>() * 2, n.slots), (w.slots * size_of::<Wide>(), w.slots));
        // What the memory plan counts per unit (docs/groups-and-units.md): 8/3 slots and a key.
        assert_eq!((narrow.most_bytes_per_unit(), wide.most_bytes_per_unit()), (65, 113));
    }

    /// Groups numbered in order of first appearance, NULL one group, keys rebuilt exactly.
    fn check(array: ArrayRef) {
        let mut t = table(array.data_type());
        let half = array.len() / 2;
        let (mut got, mut second) = (Vec::new(), Vec::new());
        t.groups_of(&array.slice(0, half), &mut got).unwrap();
        t.groups_of(&array.slice(half, array.len() - half), &mut second).unwrap();
        got.extend(&second);
        // The definition: a unit's group is the rank of its first appearance (NULL equals NULL).
        let mut seen: HashMap<ScalarValue, usize> = HashMap::new();
        let mut firsts = Vec::new();
        let want: Vec<usize> = (0..array.len())
            .map(|i| {
                let v = ScalarValue::try_from_array(&array, i).unwrap();
                *seen.entry(v.clone()).or_insert_with(|| {
                    firsts.push(v);
                    firsts.len() - 1
                })
            })
            .collect();
        assert_eq!(got, want, "{}", array.data_type());
        // Seen again: the same groups, no new unit.
        t.groups_of(&array, &mut second).unwrap();
        assert_eq!((&second, t.len()), (&want, firsts.len()));
        let keys = t.keys().unwrap();
        let rebuilt: Vec<ScalarValue> =
            (0..keys.len()).map(|g| ScalarValue::try_from_array(&keys, g).unwrap()).collect();
        assert_eq!(rebuilt, firsts, "{}", array.data_type());
        // Cleared: no unit left, the room kept, the groups numbered from scratch again.
        let room = t.slots.bytes();
        t.clear();
        assert_eq!((t.len(), t.slots.bytes()), (0, room));
        t.groups_of(&array, &mut second).unwrap();
        assert_eq!((second, t.len()), (want, firsts.len()), "{} after clear", array.data_type());
    }

    #[test]
    fn finds_every_unit_of_every_fixed_width_type() {
        let ints: Vec<Option<i64>> = (0..5000).map(|i| (i % 97 != 5).then_some((i * 7919) % 1201 - 600)).collect();
        check(Arc::new(Int64Array::from(ints.clone())));
        check(Arc::new(Int8Array::from_iter(ints.iter().map(|v| v.map(|v| (v % 100) as i8)))));
        check(Arc::new(UInt16Array::from_iter(ints.iter().map(|v| v.map(|v| (v + 600) as u16)))));
        check(Arc::new(
            Decimal128Array::from_iter(ints.iter().map(|v| v.map(|v| i128::from(v) << 70)))
                .with_precision_and_scale(38, 2)
                .unwrap(),
        ));
        check(Arc::new(BooleanArray::from_iter(ints.iter().map(|v| v.map(|v| v % 3 == 0)))));
        let hashes = ints.iter().map(|v| v.map(|v| (u128::from(v as u64) * 0x9e37_79b9_7f4a_7c15_u128).to_be_bytes()));
        check(Arc::new(FixedSizeBinaryArray::try_from_sparse_iter_with_size(hashes, 16).unwrap()));
        // Control: a table that ignored the high word would merge units differing only there.
        let wide = Decimal128Array::from_iter_values([1i128, 1 + (1 << 100)]);
        let mut out = Vec::new();
        table(wide.data_type()).groups_of(&wide, &mut out).unwrap();
        assert_eq!(out, [0, 1]);
    }

    #[test]
    fn partitions_refine_by_level_and_agree_with_groups() {
        let units = Int64Array::from_iter((0..20_000).map(|i| (i % 499 != 0).then_some(i)));
        let mut t = table(units.data_type());
        let mut groups = Vec::new();
        t.groups_of(&units, &mut groups).unwrap();
        let (mut p0, mut p1) = (Vec::new(), Vec::new());
        t.partitions_of(&units, 0, 4, &mut p0).unwrap();
        t.partitions_of(&units, 1, 4, &mut p1).unwrap();
        let (g0, g1) = (t.group_partitions(0, 4), t.group_partitions(1, 4));
        for i in 0..units.len() {
            assert_eq!((p0[i], p1[i]), (g0[groups[i]], g1[groups[i]]), "row {i}");
        }
        let used = |p: &[usize]| (0..16).filter(|q| p.contains(q)).count();
        assert_eq!((used(&p0), used(&p1)), (16, 16), "all partitions used at both levels");
        // Within one level-0 partition the next level still splits the units.
        let inside: Vec<usize> = (0..units.len()).filter(|&i| p0[i] == 3).map(|i| p1[i]).collect();
        assert_eq!(used(&inside), 16);
    }

    /// What `most_bytes_per_unit` and `most_fixed_bytes` promise holds for every count of new
    /// units, narrow and wide, and is within 4× of what a table holds at some count (the control).
    #[test]
    fn a_units_bytes_stay_within_the_bound() {
        for t in [DataType::Int64, DataType::Decimal128(38, 0)] {
            let mut table = table(&t);
            let (per_unit, fixed) = (table.most_bytes_per_unit(), table.most_fixed_bytes(777));
            let mut out = Vec::new();
            let mut tightest = f64::INFINITY;
            for from in (0..200_000i64).step_by(777) {
                let keys: ArrayRef = match &t {
                    DataType::Int64 => Arc::new(Int64Array::from_iter_values(from..from + 777)),
                    _ => Arc::new(
                        Decimal128Array::from_iter_values((from..from + 777).map(i128::from))
                            .with_precision_and_scale(38, 0)
                            .unwrap(),
                    ),
                };
                table.groups_of(keys.as_ref(), &mut out).unwrap();
                let bound = fixed + table.len() * per_unit;
                assert!(table.size() <= bound, "{t}: {} bytes for {} units, bound {bound}", table.size(), table.len());
                tightest = tightest.min((table.len() * per_unit) as f64 / table.size() as f64);
            }
            assert!(tightest < 4.0, "{t}: the bound is {tightest}× what the table held");
        }
    }

    thread_local! {
        /// The units of each shard rehashed, in order (`Sharded::grow`).
        pub(super) static REHASHED: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// SPEC §0: one more unit must not make the table rehash every unit (a step of `O(units)`
    /// time at a count of units, which WHERE could bisect for). Sized for 2·10⁵ units, a table
    /// fed 2·10⁵ units one row at a time rehashes at most about a shard's units at once, and a
    /// neighbour with one more unit rehashes as much in all give or take one shard.
    #[test]
    fn one_more_unit_rehashes_at_most_a_shard() {
        let most = 200_000u64;
        // Units `from..to`, one row at a time; the units of each shard rehashed meanwhile.
        let feed = |t: &mut UnitTable, from: i64, to: i64| {
            let mut out = Vec::new();
            REHASHED.with(|r| r.borrow_mut().clear());
            for u in from..to {
                t.groups_of(&Int64Array::from_iter_values([u * 7919 + 13]), &mut out).unwrap();
            }
            assert_eq!(t.len(), to as usize);
            REHASHED.with(|r| r.take())
        };
        let mut sized = table(&DataType::Int64).sized_for(Some(most));
        let steps = feed(&mut sized, 0, most as i64);
        let (largest, total) =
            (steps.iter().max().copied().unwrap_or(0), steps.iter().map(|&u| u64::from(u)).sum::<u64>());
        assert!(u64::from(largest) <= 2 * SHARD_UNITS, "{largest} units rehashed at once");
        assert!(total <= 2 * most, "{total} rehashed in all");
        // A shard's rehashing depends on its own units only, so a neighbour with one unit more
        // rehashes at most one shard more: here, the next unit.
        let next = feed(&mut sized, most as i64, most as i64 + 1);
        assert!(next.iter().all(|&u| u64::from(u) <= 2 * SHARD_UNITS), "{next:?}");
        // Control: one shard (a table not sized for its units) rehashes more than half of them at once.
        let one = feed(&mut table(&DataType::Int64), 0, most as i64);
        assert!(one.iter().any(|&u| u64::from(u) > most / 2), "{:?}", one.iter().max());
        assert_eq!(shards_for(Some(most)), 1024);
        assert_eq!((shards_for(None), shards_for(Some(u64::MAX))), (DEFAULT_SHARDS, MOST_SHARDS));
    }
}
