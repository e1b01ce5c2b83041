//! dpcurve: differentially private curves as SQL aggregates for Apache DataFusion.
//!
//! Layers, each ignorant of the one above it:
//! * [`mechanism`] — pure math: calibration, kernels, statistics, noise samplers;
//! * [`functions`] — DataFusion glue: the private aggregate UDFs;
//! * [`policy`] — catalog, privacy policies and the durable budget ledger;
//! * [`guard`] — plan checks and pricing on the optimized plan, and the execution gate;
//! * [`session`] — a SQL session with all of the above installed.
#![deny(clippy::clone_on_ref_ptr)]
// Parameters are validated as `!(lo <= x && x <= hi)`, which rejects NaN; clippy's suggested
// rewrites of these negations (`x < lo || x > hi`) would accept it.
#![allow(clippy::neg_cmp_op_on_partial_ord, clippy::nonminimal_bool)]

pub mod allocator;
pub mod cli;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod datagen;
pub mod functions;
pub mod guard;
pub mod mechanism;
pub mod policy;
#[cfg(feature = "server")]
pub mod server;
pub mod session;
pub mod statements;

pub use mechanism::NoiseSource;
pub use session::{Admin, AnalystSession, DpSession, QueryOutput, SessionOptions};
