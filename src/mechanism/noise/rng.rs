//! Where noise randomness comes from (SPEC §0, Randomness).
//!
//! Production releases draw from a ChaCha20 generator seeded from the operating system,
//! fresh for every release. A fixed seed exists only in this Rust API, for tests and
//! reproducible examples; nothing in SQL or in the CLI's query mode can reach it.

use rand::SeedableRng;
use rand::rngs::{ChaCha20Rng, SysRng};

/// The source of randomness for releases made by a session's private aggregates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NoiseSource {
    /// A fresh OS-seeded ChaCha20 generator per release (the only production setting).
    #[default]
    Os,
    /// A fixed seed: every release of the session draws the same noise. Tests only.
    TestSeed(u64),
    /// No noise at all, to compare exact statistics. Exists only with the `test-hooks`
    /// feature, which the shipped binary never enables.
    #[cfg(feature = "test-hooks")]
    Off,
}

/// The OS random source failed (not data-dependent).
#[derive(Debug, Clone)]
pub struct RngError(pub String);

impl std::fmt::Display for RngError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the operating system's random source failed: {}", self.0)
    }
}

impl std::error::Error for RngError {}

impl NoiseSource {
    /// A generator for one release, or None when noise is switched off (test hook).
    pub fn release_rng(&self) -> Result<Option<ChaCha20Rng>, RngError> {
        match self {
            NoiseSource::Os => ChaCha20Rng::try_from_rng(&mut SysRng).map(Some).map_err(|e| RngError(e.to_string())),
            NoiseSource::TestSeed(seed) => Ok(Some(ChaCha20Rng::seed_from_u64(*seed))),
            #[cfg(feature = "test-hooks")]
            NoiseSource::Off => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn os_seeded_generators_differ_and_test_seeds_repeat() {
        let a = NoiseSource::Os.release_rng().unwrap().unwrap().next_u64();
        let b = NoiseSource::Os.release_rng().unwrap().unwrap().next_u64();
        assert_ne!(a, b);
        let c = NoiseSource::TestSeed(7).release_rng().unwrap().unwrap().next_u64();
        let d = NoiseSource::TestSeed(7).release_rng().unwrap().unwrap().next_u64();
        assert_eq!(c, d);
    }
}
