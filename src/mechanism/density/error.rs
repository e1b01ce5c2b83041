//! What can be wrong with a density release's public parameters, found before any data is read.

use std::fmt;

use crate::mechanism::density::kde::KdeError;
use crate::mechanism::noise::calibration::CalibrationError;
use crate::mechanism::noise::lattice::LatticeError;

/// A parameter problem, found before any data is read.
#[derive(Debug, Clone, PartialEq)]
pub enum MechanismError {
    /// ε, δ or calibration.
    Calibration(CalibrationError),
    /// Bandwidth, range or points.
    Kde(KdeError),
    /// The noise cannot be generated for these parameters.
    Noise(String),
}

impl fmt::Display for MechanismError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MechanismError::Calibration(e) => e.fmt(f),
            MechanismError::Kde(e) => e.fmt(f),
            MechanismError::Noise(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for MechanismError {}

impl From<LatticeError> for MechanismError {
    fn from(e: LatticeError) -> Self {
        MechanismError::Noise(e.0)
    }
}
