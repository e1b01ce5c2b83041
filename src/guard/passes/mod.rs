//! The guard's passes over the optimized logical plan, one rule each: fill policy defaults, set
//! unit sensitivities, validate the calls, expressions and column types, check the shape and price it, enforce
//! limits; then, for execution, filter groups, give permits, split selections, bound units.

pub mod calls;
pub mod column_types;
pub mod contributions;
pub mod defaults;
pub mod expressions;
pub mod groups;
pub mod limits;
pub mod permits;
pub mod selection;
pub mod shape;
pub mod units;
