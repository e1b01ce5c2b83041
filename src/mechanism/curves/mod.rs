//! Curves: the private mean of functional data — its covariance eigenbasis, the clipped
//! statistic, the release with a noisy count and its automatic tuning.
//! One family today; the next functional estimators go beside it.

pub mod eigenbasis;
pub mod mean_curve;
