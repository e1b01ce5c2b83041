//! dpcurve: differentially private curves as SQL aggregates for Apache DataFusion.
//!
//! Layers, each ignorant of the one above it:
//! * [`mechanism`] — pure math: calibration, kernels, statistics, noise samplers;
//! * [`functions`] — DataFusion glue: the private aggregate UDFs;
//! * [`guard`] — plan checks run on the optimized plan before execution;
//! * [`session`] — a SQL session with all of the above installed.
#![deny(clippy::clone_on_ref_ptr)]

pub mod cli;
pub mod functions;
pub mod guard;
pub mod mechanism;
pub mod session;

pub use mechanism::NoiseSource;
pub use session::{DpSession, QueryOutput, SessionOptions};
