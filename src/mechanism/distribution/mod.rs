//! Distribution functions: the private CDF and quantiles from a hierarchical histogram
//! (`tree`: its shape and least-squares estimate; `monotone`: the isotonic projection and the
//! monotone interpolant; `release`: calibration, the adaptive release and its bands; `band`: the
//! bands' simulated threshold; `leaves`: the statistic's counting loop).

pub mod band;
pub mod leaves;
pub mod monotone;
pub mod release;
pub mod tree;
