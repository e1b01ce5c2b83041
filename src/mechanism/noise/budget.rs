//! Exact privacy-budget arithmetic (SPEC §4).
//!
//! Budgets are fixed-point integers: ε in units of 1e-12, δ in units of 1e-18. A query's
//! ε and δ literals are converted by taking the shortest decimal that round-trips to the
//! f64 (what the user typed: `0.1` for `0.1`) and rounding it *up* to the unit, so ten
//! charges of ε = 0.1 sum to exactly 1.0. The mechanism is then calibrated with a float
//! strictly below the charged amount ([`Budget::calibration_epsilon`]), so it never uses
//! more ε or δ than was paid.

use std::fmt;

/// Decimal digits of ε's fixed-point unit (1e-12).
pub const EPSILON_DIGITS: u32 = 12;
/// Decimal digits of δ's fixed-point unit (1e-18).
pub const DELTA_DIGITS: u32 = 18;
/// Smallest ε of one release: one budget unit.
pub const MIN_EPSILON: f64 = 1e-12;
/// Largest ε of one release or one table budget (keeps units exact in an f64 and i64).
pub const MAX_EPSILON: f64 = 1e3;

/// An amount of privacy budget, exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Budget {
    /// ε in units of 1e-12.
    pub epsilon_units: i64,
    /// δ in units of 1e-18.
    pub delta_units: i64,
}

/// A value that cannot be a budget.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetError(pub String);

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BudgetError {}

/// `x` in units of 10^-`scale`, rounded up, computed from x's shortest round-trip decimal.
/// None for negative, non-finite or too large values.
pub fn units_ceil(x: f64, scale: u32) -> Option<i64> {
    if !x.is_finite() || x < 0.0 {
        return None;
    }
    if x == 0.0 {
        return Some(0);
    }
    // "{:e}" prints the shortest decimal that round-trips, e.g. "1e-1", "4.2247e0".
    let s = format!("{x:e}");
    let (mantissa, exp) = s.split_once('e')?;
    let exp: i32 = exp.parse().ok()?;
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let significand: i128 = format!("{int}{frac}").parse().ok()?;
    // x = significand · 10^(exp − len(frac)), so units = significand · 10^power.
    let power = exp - frac.len() as i32 + scale as i32;
    let units = if power >= 0 {
        significand.checked_mul(10i128.checked_pow(power as u32)?)?
    } else if power < -38 {
        1 // a positive amount far below one unit still costs one unit
    } else {
        let d = 10i128.pow((-power) as u32);
        (significand + d - 1) / d
    };
    i64::try_from(units).ok()
}

/// The largest-ish f64 strictly below `units · 10^-scale` (two steps down from the
/// correctly rounded quotient, which absorbs both roundings).
fn below(units: i64, scale: u32) -> f64 {
    (units as f64 / 10f64.powi(scale as i32)).next_down().next_down()
}

fn fmt_units(units: i64, scale: u32) -> String {
    let s = format!("{:0>width$}", units, width = scale as usize + 1);
    let (int, frac) = s.split_at(s.len() - scale as usize);
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() { int.to_string() } else { format!("{int}.{frac}") }
}

impl Budget {
    /// No budget.
    pub const ZERO: Budget = Budget { epsilon_units: 0, delta_units: 0 };

    /// The exact charge for a release with parameters (ε, δ): ε > 0 finite and ≤
    /// [`MAX_EPSILON`], 0 ≤ δ < 1.
    pub fn charge(epsilon: f64, delta: f64) -> Result<Budget, BudgetError> {
        if !(epsilon > 0.0 && epsilon <= MAX_EPSILON) {
            return Err(BudgetError(format!("epsilon must be in (0, {MAX_EPSILON}], got {epsilon}")));
        }
        if !(0.0..1.0).contains(&delta) {
            return Err(BudgetError(format!("delta must be in [0, 1), got {delta}")));
        }
        // Below one budget unit a release would be charged (and calibrated at) more than the
        // query asked for: refuse instead of silently changing the privacy level.
        if epsilon < MIN_EPSILON {
            return Err(BudgetError(format!("epsilon must be at least 1e-12 (one budget unit), got {epsilon}")));
        }
        if delta > 0.0 && delta < 1e-18 {
            return Err(BudgetError(format!("delta must be 0 or at least 1e-18 (one budget unit), got {delta}")));
        }
        Self::total(epsilon, delta)
    }

    /// A total budget: 0 ≤ ε ≤ [`MAX_EPSILON`], 0 ≤ δ ≤ 1 (rounded up to the unit).
    pub fn total(epsilon: f64, delta: f64) -> Result<Budget, BudgetError> {
        let e = units_ceil(epsilon, EPSILON_DIGITS)
            .filter(|_| epsilon <= MAX_EPSILON)
            .ok_or_else(|| BudgetError(format!("epsilon must be a number in [0, {MAX_EPSILON}], got {epsilon}")))?;
        let d = units_ceil(delta, DELTA_DIGITS)
            .filter(|_| delta <= 1.0)
            .ok_or_else(|| BudgetError(format!("delta must be a number in [0, 1], got {delta}")))?;
        Ok(Budget { epsilon_units: e, delta_units: d })
    }

    /// ε as a float, for display.
    pub fn epsilon(&self) -> f64 {
        self.epsilon_units as f64 / 10f64.powi(EPSILON_DIGITS as i32)
    }

    /// δ as a float, for display.
    pub fn delta(&self) -> f64 {
        self.delta_units as f64 / 10f64.powi(DELTA_DIGITS as i32)
    }

    /// The ε a mechanism charged this amount is calibrated with: strictly below the charge.
    pub fn calibration_epsilon(&self) -> f64 {
        below(self.epsilon_units, EPSILON_DIGITS)
    }

    /// The δ a mechanism charged this amount is calibrated with (0 stays 0).
    pub fn calibration_delta(&self) -> f64 {
        if self.delta_units == 0 { 0.0 } else { below(self.delta_units, DELTA_DIGITS) }
    }

    /// Sum of two amounts (None on overflow).
    pub fn checked_add(&self, other: &Budget) -> Option<Budget> {
        Some(Budget {
            epsilon_units: self.epsilon_units.checked_add(other.epsilon_units)?,
            delta_units: self.delta_units.checked_add(other.delta_units)?,
        })
    }

    /// Difference (None if it would be negative in either coordinate).
    pub fn checked_sub(&self, other: &Budget) -> Option<Budget> {
        let e = self.epsilon_units.checked_sub(other.epsilon_units)?;
        let d = self.delta_units.checked_sub(other.delta_units)?;
        (e >= 0 && d >= 0).then_some(Budget { epsilon_units: e, delta_units: d })
    }

    /// Whether this amount fits within `available` in both ε and δ.
    pub fn fits_within(&self, available: &Budget) -> bool {
        self.epsilon_units <= available.epsilon_units && self.delta_units <= available.delta_units
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ε = {}, δ = {}",
            fmt_units(self.epsilon_units, EPSILON_DIGITS),
            fmt_units(self.delta_units, DELTA_DIGITS)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_literals_convert_exactly() {
        assert_eq!(units_ceil(0.1, 12), Some(100_000_000_000));
        assert_eq!(units_ceil(1.0, 12), Some(1_000_000_000_000));
        assert_eq!(units_ceil(0.3, 12), Some(300_000_000_000));
        assert_eq!(units_ceil(1e-6, 18), Some(1_000_000_000_000));
        assert_eq!(units_ceil(4.2247, 12), Some(4_224_700_000_000));
        // Finer than the unit: rounded up, never down.
        assert_eq!(units_ceil(1e-13, 12), Some(1));
        assert_eq!(units_ceil(1.0000000000001, 12), Some(1_000_000_000_001));
        assert_eq!(units_ceil(1e-300, 18), Some(1));
        assert_eq!(units_ceil(-1.0, 12), None);
        assert_eq!(units_ceil(f64::NAN, 12), None);
    }

    #[test]
    fn ten_tenths_make_exactly_one() {
        let total = Budget::total(1.0, 1e-5).unwrap();
        let q = Budget::charge(0.1, 1e-6).unwrap();
        let mut spent = Budget::ZERO;
        for _ in 0..10 {
            let next = spent.checked_add(&q).unwrap();
            assert!(next.fits_within(&total));
            spent = next;
        }
        assert_eq!(spent, total);
        assert!(!spent.checked_add(&q).unwrap().fits_within(&total));
        // The f64 sum, by contrast, is not exact.
        assert_ne!((0..10).map(|_| 0.1f64).sum::<f64>(), 1.0);
    }

    #[test]
    fn calibration_never_exceeds_the_charge() {
        for (e, d) in [(0.1, 1e-6), (1.0, 0.5), (0.3, 1e-9), (7.77, 0.0), (999.999, 0.999999)] {
            let b = Budget::charge(e, d).unwrap();
            let ce = b.calibration_epsilon();
            // Exact comparison: ce·10^12 ≤ units, checked in integer arithmetic via the
            // shortest decimal of ce rounded up.
            assert!(units_ceil(ce, EPSILON_DIGITS).unwrap() <= b.epsilon_units, "{e}");
            assert!(ce < e && e - ce < 1e-15 * e.max(1.0), "{e} → {ce}");
            let cd = b.calibration_delta();
            assert!(units_ceil(cd, DELTA_DIGITS).unwrap() <= b.delta_units, "{d}");
            assert!(cd <= d);
        }
    }

    #[test]
    fn invalid_amounts_and_display() {
        assert!(Budget::charge(0.0, 1e-6).is_err());
        assert!(Budget::charge(1.0, 1.0).is_err());
        assert!(Budget::charge(2e3, 0.0).is_err());
        assert!(Budget::total(-1.0, 0.0).is_err());
        // Below one unit: refused, never charged (and calibrated) at more than was asked.
        assert!(Budget::charge(1e-300, 1e-6).unwrap_err().to_string().contains("at least 1e-12"));
        assert!(Budget::charge(9.9e-13, 0.0).is_err());
        assert!(Budget::charge(1.0, 1e-19).unwrap_err().to_string().contains("at least 1e-18"));
        assert_eq!(Budget::charge(1e-12, 1e-18).unwrap(), Budget { epsilon_units: 1, delta_units: 1 });
        assert_eq!(Budget::total(1.5, 1e-6).unwrap().to_string(), "ε = 1.5, δ = 0.000001");
        assert_eq!(Budget::ZERO.to_string(), "ε = 0, δ = 0");
        let a = Budget::total(1.0, 0.0).unwrap();
        assert_eq!(a.checked_sub(&Budget::charge(0.25, 0.0).unwrap()).unwrap().epsilon(), 0.75);
        assert_eq!(Budget::ZERO.checked_sub(&a), None);
    }
}
