//! Noise: exact discrete samplers and their randomness, releases as post-processing of an
//! exact lattice mechanism (their coordinates computed in double-double), Gaussian calibration, exact budget arithmetic, simultaneous-band
//! thresholds, and the cache of public precomputations they share.

pub mod bands;
pub mod budget;
pub mod cache;
pub mod calibration;
pub mod double_double;
pub mod lattice;
pub mod rng;
pub mod samplers;
