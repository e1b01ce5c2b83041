//! Distribution functions: the private CDF and quantiles from a hierarchical histogram
//! (`tree`: its shape and least-squares estimate; `monotone`: the isotonic projection and the
//! monotone interpolant; `release`: calibration, the adaptive release and its bands).

pub mod monotone;
pub mod release;
pub mod tree;
