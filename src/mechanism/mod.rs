//! Pure mathematics of the private releases: exact discrete noise and its calibration
//! (`noise/`), one folder per estimator family (`density/`, `distribution/`, `curves/`, `fits/`), and what they
//! share: contribution bounds, accepted ranges, fixed-point sums, partition selection, stored releases. No DataFusion, no I/O.
//!
//! Every mechanism is a pair: a *privacy map* from public parameters to a noise scale
//! (a plain function tested against reference values) and a *release* from a statistic,
//! the parameters and a generator to the output.

pub mod contribution;
pub(crate) mod cpu;
pub mod curves;
pub mod density;
pub mod distribution;
pub mod fits;
pub mod noise;
pub mod ranges;
pub mod selection;
pub mod stored;
pub mod sums;

pub use contribution::Contribution;
pub use density::kde::{Grid, KdeLayout};
pub use density::release::{KdeMechanism, KdeRelease, KdeSpec, Normalise};
pub use noise::calibration::Calibration;
pub use noise::rng::NoiseSource;
