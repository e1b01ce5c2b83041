//! How far one privacy unit can move a release (SPEC §7).
//!
//! Without a privacy unit a row is the unit: it adds one value to one group. With a unit,
//! contribution bounding keeps at most `rows` rows of a unit in each group and lets it reach
//! at most `groups` groups; each group's statistic then moves by at most `rows` times a row's
//! bound (triangle inequality), and the release of all groups together — one mechanism over
//! `groups` blocks — is calibrated for that (see [`crate::mechanism::noise::lattice::LatticeMechanism::gaussian_over`]):
//! L2 sensitivity `rows·sqrt(groups)` under Gaussian noise, L1 `rows·groups` under Laplace.

/// Most rows per unit per group accepted in a policy.
pub const MAX_UNIT_ROWS: u64 = 1_000_000;

/// The public bound on one unit's contribution to one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Contribution {
    /// Rows of one unit counted in one group.
    pub rows: u64,
    /// Groups one unit's rows may reach (1 for an ungrouped call).
    pub groups: u64,
}

impl Default for Contribution {
    fn default() -> Self {
        Self::ROW
    }
}

impl Contribution {
    /// The row as the unit: one row, one group.
    pub const ROW: Self = Self { rows: 1, groups: 1 };

    /// A bound of `rows` rows in each of at most `groups` groups (both ≥ 1; rows ≤ [`MAX_UNIT_ROWS`]).
    pub fn new(rows: u64, groups: u64) -> Result<Self, String> {
        if !(1..=MAX_UNIT_ROWS).contains(&rows) || !(1..=1_000_000).contains(&groups) {
            return Err(format!(
                "a unit's contribution must be 1 to {MAX_UNIT_ROWS} rows in 1 to 1000000 groups, got {rows} rows in {groups} groups"
            ));
        }
        Ok(Self { rows, groups })
    }

    /// Factor on one row's per-group sensitivity (`rows`, exact in f64).
    pub fn per_group(&self) -> f64 {
        self.rows as f64
    }

    /// The L1 sensitivity of an integer count over all groups (`rows·groups`).
    pub fn count_l1(&self) -> u64 {
        self.rows * self.groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_validated() {
        assert!(Contribution::new(0, 1).is_err());
        assert!(Contribution::new(1, 0).is_err());
        assert!(Contribution::new(MAX_UNIT_ROWS + 1, 1).is_err());
        let c = Contribution::new(7, 3).unwrap();
        assert_eq!((c.per_group(), c.count_l1()), (7.0, 21));
        assert_eq!(Contribution::default(), Contribution::ROW);
    }
}
