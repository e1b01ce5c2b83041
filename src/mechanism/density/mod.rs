//! Densities: the exact KDE statistic and its lifted basis, the Gaussian-process, pure-ε and
//! ICLP releases of the 1-D KDE with their normalisation, the 2-D KDE, the Sobolev-space
//! release, and the privately chosen bandwidth.

pub mod auto_bandwidth;
pub mod basis;
pub mod binning;
pub mod error;
pub mod kde;
pub mod kde2d;
pub mod kernel;
pub mod normalise;
pub mod release;
pub mod sobolev;
