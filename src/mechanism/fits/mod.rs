//! Fits: private minimisers in a Gaussian RKHS (kernel regression and classification) — the
//! losses and their binned features, the certified solver, and the Gaussian-process or
//! Laplace-process release of the fitted function.

pub mod kernel_fit;
pub mod loss;
