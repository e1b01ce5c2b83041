//! Pure mathematics of the private releases: calibration, kernels and grids, the KDE
//! sufficient statistic, lifted coordinates and exact discrete samplers, randomness. No DataFusion, no I/O.
//!
//! Every mechanism is a pair: a *privacy map* from public parameters to a noise scale
//! (a plain function tested against reference values) and a *release* from a statistic,
//! the parameters and a generator to the output.

pub mod auto_bandwidth;
pub mod bands;
pub mod budget;
pub mod cache;
pub mod calibration;
pub mod contribution;
pub mod kde;
pub mod kde2d;
pub mod kde_release;
pub mod kernel_fit;
pub mod lattice;
pub mod mean_curve;
pub mod rng;
pub mod samplers;
pub mod selection;
pub mod sobolev;
pub mod stored;
pub mod sums;

pub use calibration::Calibration;
pub use contribution::Contribution;
pub use kde::{Grid, KdeLayout};
pub use kde_release::{KdeMechanism, KdeRelease, KdeSpec, Normalise};
pub use rng::NoiseSource;
