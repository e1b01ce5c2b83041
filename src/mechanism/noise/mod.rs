//! Noise: exact discrete samplers and their randomness, releases as post-processing of an
//! exact lattice mechanism, Gaussian calibration, exact budget arithmetic, simultaneous-band
//! thresholds, and the cache of public precomputations they share.

pub mod bands;
pub mod budget;
pub mod cache;
pub mod calibration;
pub mod lattice;
pub mod rng;
pub mod samplers;
