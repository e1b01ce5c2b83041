//! The public ranges every release accepts: ends within ±[`MAX_MAGNITUDE`] and at least
//! [`MIN_WIDTH`] apart. Inside, every length a release derives from a range (grid steps, bins,
//! leaves, padding, feature periods) and every density, band and quantile it publishes is a
//! finite double; beyond, some were measured to overflow or to vanish (a band of ∞ on a range
//! 1e-200 wide, an effective bandwidth of ∞ on one 2e200 wide: `tests/param_fuzz.rs`,
//! `extreme_ranges_are_refused_or_release_finite_numbers`).

/// Largest magnitude of a range's end (and of a norm bound such as a mean curve's clip).
pub const MAX_MAGNITUDE: f64 = 1e100;
/// Smallest width of a range (and smallest norm bound).
pub const MIN_WIDTH: f64 = 1e-100;

/// Whether `[lo, hi]` is a range every release accepts (false for NaN or infinite ends).
pub fn accepts(lo: f64, hi: f64) -> bool {
    lo.abs() <= MAX_MAGNITUDE && hi.abs() <= MAX_MAGNITUDE && hi - lo >= MIN_WIDTH
}

/// Whether a positive scale (a norm bound) is one every release accepts.
pub fn accepts_scale(v: f64) -> bool {
    (MIN_WIDTH..=MAX_MAGNITUDE).contains(&v)
}

/// Why a range was refused, for the messages.
pub fn rule() -> String {
    format!("within ±{MAX_MAGNITUDE:e} and at least {MIN_WIDTH:e} apart")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_are_inclusive_and_non_finite_ends_are_refused() {
        assert!(accepts(-1e100, 1e100) && accepts(0.0, 1e-100) && accepts(1.0, 1.0 + f64::EPSILON));
        for (lo, hi) in
            [(-1.0000000000000002e100, 0.0), (0.0, 9.9e-101), (1.0, 0.0), (f64::NAN, 1.0), (0.0, f64::INFINITY)]
        {
            assert!(!accepts(lo, hi), "[{lo}, {hi}]");
        }
        assert!(accepts_scale(1e-100) && accepts_scale(1e100) && !accepts_scale(0.0) && !accepts_scale(f64::NAN));
        assert_eq!(rule(), "within ±1e100 and at least 1e-100 apart");
    }
}
