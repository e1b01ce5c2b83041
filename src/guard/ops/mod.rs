//! The functions and operators the passes put into a plan, which run below the gate: eager
//! `CASE`/`AND`/`OR`, total integer division, the declared keys' range filter, the keyed sample order, the per-unit bound and
//! the partition selection's membership filter, and the prefetch hint their tables use. Import nothing
//! above them in `guard/`.

pub mod bounding;
pub(crate) mod chunked;
pub(crate) mod chunked_count;
pub mod eager;
pub mod key_range;
mod max_heap;
pub(crate) mod prefetch_hint;
pub mod sample_order;
pub mod selected;
mod sip_lanes;
pub mod total_div;
pub mod unit_bound;
mod unit_sample;
