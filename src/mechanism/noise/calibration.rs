//! Noise calibration for the Gaussian mechanism (SPEC §1).
//!
//! Two privacy maps from (sensitivity Δ, ε, δ) to a noise scale σ:
//!
//! * [`analytic_sigma`] — Balle & Wang (2018), Thm 8: the smallest σ with
//!   `Φ(Δ/(2σ) − εσ/Δ) − e^ε·Φ(−Δ/(2σ) − εσ/Δ) ≤ δ`. Exact for every ε > 0.
//! * [`classic_sigma`] — the papers' `σ = Δ·sqrt(2·ln(2/δ))/ε` (Hall et al. 2013),
//!   proven only for ε ≤ 1, so larger ε is refused.
//!
//! Both are plain functions of public parameters: nothing here ever sees data.

use std::fmt;

/// Which formula turns (Δ, ε, δ) into σ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Calibration {
    /// Balle–Wang analytic Gaussian mechanism (the default).
    Analytic,
    /// `σ = Δ·sqrt(2 ln(2/δ))/ε`, valid for ε ≤ 1 only.
    Classic,
}

impl Calibration {
    /// The SQL spelling of this calibration.
    pub fn name(self) -> &'static str {
        match self {
            Calibration::Analytic => "analytic",
            Calibration::Classic => "classic",
        }
    }

    /// Parses the SQL spelling (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "analytic" => Some(Calibration::Analytic),
            "classic" => Some(Calibration::Classic),
            _ => None,
        }
    }
}

/// Why a calibration cannot be computed. Only ever about public parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum CalibrationError {
    /// ε must be a finite number > 0.
    Epsilon(f64),
    /// δ must lie in the open interval (0, 1).
    Delta(f64),
    /// Δ must be a finite number > 0.
    Sensitivity(f64),
    /// The classic formula is only proven for ε ≤ 1.
    ClassicNeedsSmallEpsilon(f64),
}

impl fmt::Display for CalibrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CalibrationError::Epsilon(e) => write!(f, "epsilon must be a finite number > 0, got {e}"),
            CalibrationError::Delta(d) => write!(f, "delta must be in (0, 1), got {d}"),
            CalibrationError::Sensitivity(s) => {
                write!(f, "sensitivity must be a finite number > 0, got {s}")
            }
            CalibrationError::ClassicNeedsSmallEpsilon(e) => write!(
                f,
                "calibration 'classic' is only valid for epsilon <= 1, got epsilon = {e}; \
                 use calibration => 'analytic'"
            ),
        }
    }
}

impl std::error::Error for CalibrationError {}

fn check(sensitivity: f64, epsilon: f64, delta: f64) -> Result<(), CalibrationError> {
    if !(epsilon.is_finite() && epsilon > 0.0) {
        return Err(CalibrationError::Epsilon(epsilon));
    }
    if !(delta > 0.0 && delta < 1.0) {
        return Err(CalibrationError::Delta(delta));
    }
    if !(sensitivity.is_finite() && sensitivity > 0.0) {
        return Err(CalibrationError::Sensitivity(sensitivity));
    }
    Ok(())
}

/// σ for sensitivity Δ under the chosen calibration.
pub fn sigma(calibration: Calibration, sensitivity: f64, epsilon: f64, delta: f64) -> Result<f64, CalibrationError> {
    match calibration {
        Calibration::Analytic => analytic_sigma(sensitivity, epsilon, delta),
        Calibration::Classic => classic_sigma(sensitivity, epsilon, delta),
    }
}

/// The papers' calibration `σ = Δ·sqrt(2·ln(2/δ))/ε`; refuses ε > 1.
pub fn classic_sigma(sensitivity: f64, epsilon: f64, delta: f64) -> Result<f64, CalibrationError> {
    check(sensitivity, epsilon, delta)?;
    if epsilon > 1.0 {
        return Err(CalibrationError::ClassicNeedsSmallEpsilon(epsilon));
    }
    Ok(sensitivity * (2.0 * (2.0 / delta).ln()).sqrt() / epsilon)
}

/// The exact δ achieved by Gaussian noise of scale σ on a statistic of sensitivity Δ
/// at privacy level ε (Balle & Wang 2018, Thm 8). Decreasing in σ.
pub fn analytic_delta(sigma: f64, sensitivity: f64, epsilon: f64) -> f64 {
    let mu = sensitivity / sigma;
    let a = mu / 2.0 - epsilon / mu;
    let b = -mu / 2.0 - epsilon / mu;
    // e^ε·Φ(b) evaluated in log space so that large ε neither overflows nor cancels.
    let first = normal_cdf(a);
    let second = (epsilon + log_normal_cdf(b)).exp();
    (first - second).max(0.0)
}

/// Relative width of the final bracket of the σ search.
const SIGMA_REL_TOL: f64 = 1e-12;
/// Relative margin added to the analytic σ: the f64 evaluation of [`analytic_delta`]
/// subtracts nearly equal numbers, so a bracket end that passes the test can lie up to a
/// few 1e-12 (relative) below the true minimum; 1e-9 more is always on the safe side.
const ANALYTIC_SIGMA_MARGIN: f64 = 1e-9;

/// Smallest σ with `analytic_delta(σ) ≤ δ`, returned from the safe (upper) side of the
/// bracket, so the returned σ always satisfies the condition.
pub fn analytic_sigma(sensitivity: f64, epsilon: f64, delta: f64) -> Result<f64, CalibrationError> {
    check(sensitivity, epsilon, delta)?;
    // Work with Δ = 1 and scale at the end: privacy depends only on Δ/σ.
    let ok = |s: f64| analytic_delta(s, 1.0, epsilon) <= delta;
    let mut hi = 1.0_f64;
    while !ok(hi) {
        hi *= 2.0;
    }
    let mut lo = hi / 2.0;
    while ok(lo) && lo > 1e-300 {
        hi = lo;
        lo /= 2.0;
    }
    // Invariant: ok(hi), !ok(lo) (or lo is negligibly small).
    while hi / lo - 1.0 > SIGMA_REL_TOL {
        let mid = (lo * hi).sqrt();
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * (1.0 + ANALYTIC_SIGMA_MARGIN) * sensitivity)
}

/// ln δ of the ρ-zCDP → (ε, δ)-DP conversion at order α > 1 (Canonne, Kamath & Steinke
/// 2020, Prop. 12 / Cor. 13): `δ = exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α`. Every α > 1 gives
/// a valid δ, so an imperfect choice of α only costs utility, never privacy.
fn zcdp_log_delta_at(rho: f64, epsilon: f64, alpha: f64) -> f64 {
    (alpha - 1.0) * (alpha * rho - epsilon) + alpha * (-1.0 / alpha).ln_1p() - (alpha - 1.0).ln()
}

/// ln of the smallest δ the conversion gives for ρ-zCDP at ε (α optimised by bisection
/// on the derivative, as in the authors' reference code).
pub fn zcdp_log_delta(rho: f64, epsilon: f64) -> f64 {
    if !(rho > 0.0) {
        return f64::NEG_INFINITY;
    }
    let (mut lo, mut hi) = (1.0 + 1e-9, (epsilon + 1.0) / (2.0 * rho) + 2.0);
    for _ in 0..200 {
        let alpha = 0.5 * (lo + hi);
        let derivative = (2.0 * alpha - 1.0) * rho - epsilon + (-1.0 / alpha).ln_1p();
        if derivative < 0.0 { lo = alpha } else { hi = alpha }
    }
    zcdp_log_delta_at(rho, epsilon, 0.5 * (lo + hi)).min(0.0)
}

/// Margin in ln δ for the f64 evaluation of [`zcdp_log_delta`] (its terms are O(100) at
/// most, each computed to ~1e-15 relative).
const ZCDP_LOG_MARGIN: f64 = 1e-9;

/// The largest ρ whose zCDP guarantee implies (ε, δ)-DP, from the safe side: the computed
/// ln δ is at least [`ZCDP_LOG_MARGIN`] below ln δ, and ρ is then lowered by 1e-9.
/// `Classic` additionally caps ρ at the papers' `ε²/(4 ln(2/δ))` (σ = Δ·sqrt(2 ln(2/δ))/ε).
pub fn zcdp_rho(calibration: Calibration, epsilon: f64, delta: f64) -> Result<f64, CalibrationError> {
    // Every accumulator of a query (each partition and the final one) calibrates again:
    // keep the last results (public values only) instead of re-running the bisections.
    type Key = (Calibration, u64, u64);
    static CACHE: std::sync::Mutex<Vec<(Key, f64)>> = std::sync::Mutex::new(Vec::new());
    let key = (calibration, epsilon.to_bits(), delta.to_bits());
    if let Some((_, rho)) = CACHE.lock().expect("rho cache").iter().find(|(k, _)| *k == key) {
        return Ok(*rho);
    }
    let rho = zcdp_rho_uncached(calibration, epsilon, delta)?;
    let mut cache = CACHE.lock().expect("rho cache");
    if cache.len() >= 64 {
        cache.remove(0);
    }
    cache.push((key, rho));
    Ok(rho)
}

fn zcdp_rho_uncached(calibration: Calibration, epsilon: f64, delta: f64) -> Result<f64, CalibrationError> {
    check(1.0, epsilon, delta)?;
    if calibration == Calibration::Classic && epsilon > 1.0 {
        return Err(CalibrationError::ClassicNeedsSmallEpsilon(epsilon));
    }
    let target = delta.ln() - ZCDP_LOG_MARGIN;
    let ok = |rho: f64| zcdp_log_delta(rho, epsilon) <= target;
    // ρ ≤ ε always suffices as an upper bracket (δ(ρ = ε) ≥ 1/e·… > δ for δ < 0.1; else double).
    let mut hi = epsilon.max(1e-300);
    while ok(hi) {
        hi *= 2.0;
    }
    let mut lo = hi / 2.0;
    while !ok(lo) {
        hi = lo;
        lo /= 2.0;
        // ε so small that ρ underflows (subnormal ε): no finite noise scale exists.
        if lo < 1e-290 {
            return Err(CalibrationError::Epsilon(epsilon));
        }
    }
    // At most ~60 halvings of the log-width reach the tolerance; the cap is a backstop.
    for _ in 0..400 {
        if hi / lo - 1.0 <= SIGMA_REL_TOL {
            break;
        }
        let mid = (lo * hi).sqrt();
        if ok(mid) { lo = mid } else { hi = mid }
    }
    let mut rho = lo * (1.0 - 1e-9);
    if calibration == Calibration::Classic {
        rho = rho.min(epsilon * epsilon / (4.0 * (2.0 / delta).ln()));
    }
    Ok(rho)
}

/// σ of an exact discrete Gaussian mechanism with L2 sensitivity Δ at (ε, δ): `Δ/sqrt(2ρ)`
/// with ρ from [`zcdp_rho`] (before the lattice's rounding of σ², which only adds noise).
pub fn discrete_sigma(
    calibration: Calibration,
    sensitivity: f64,
    epsilon: f64,
    delta: f64,
) -> Result<f64, CalibrationError> {
    check(sensitivity, epsilon, delta)?;
    Ok(sensitivity / (2.0 * zcdp_rho(calibration, epsilon, delta)?).sqrt())
}

/// The ε at which a Gaussian mechanism with `μ = Δ/σ` achieves δ (the inverse of
/// [`analytic_delta`] in ε). Used by privacy audits to turn an estimated μ into ε.
pub fn epsilon_for_mu(mu: f64, delta: f64) -> f64 {
    if !(mu > 0.0) {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0, 1.0);
    while analytic_delta(1.0 / mu, 1.0, hi) > delta {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if analytic_delta(1.0 / mu, 1.0, mid) > delta { lo = mid } else { hi = mid }
    }
    hi
}

/// Standard normal CDF Φ(x), accurate in relative terms in both tails.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// ln Φ(x), accurate for very negative x where Φ underflows.
pub fn log_normal_cdf(x: f64) -> f64 {
    if x > -30.0 {
        normal_cdf(x).ln()
    } else {
        // Asymptotic series (Abramowitz & Stegun 26.2.12); the first omitted term is
        // 945/x^10 < 2e-12 relative for x ≤ −30.
        let x2 = x * x;
        let series = 1.0 - 1.0 / x2 + 3.0 / (x2 * x2) - 15.0 / (x2 * x2 * x2) + 105.0 / (x2 * x2 * x2 * x2);
        -0.5 * x2 - (-x).ln() - 0.5 * (2.0 * std::f64::consts::PI).ln() + series.ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §1 reference values for Δ = 1 (4 significant digits as printed there).
    #[test]
    fn analytic_matches_spec_reference_values() {
        for (eps, delta, expected) in [(1.0, 1e-6, 4.2247), (0.5, 1e-5, 7.0318), (1.0, 0.1, 1.0859)] {
            let s = analytic_sigma(1.0, eps, delta).unwrap();
            assert!((s - expected).abs() < 5e-4, "eps={eps} delta={delta}: {s} vs {expected}");
        }
    }

    /// Further values from the notes' scipy table (numerics-and-noise.md §4).
    #[test]
    fn analytic_matches_scipy_table() {
        for (eps, delta, expected) in
            [(0.1, 1e-5, 30.7496), (2.0, 1e-5, 1.9938), (5.0, 1e-5, 0.8919), (0.1, 1e-6, 36.3047), (5.0, 1e-6, 0.9800)]
        {
            let s = analytic_sigma(1.0, eps, delta).unwrap();
            assert!((s - expected).abs() / expected < 1e-4, "eps={eps} delta={delta}: {s}");
        }
    }

    #[test]
    fn analytic_sigma_is_tight_and_on_the_safe_side() {
        for &(eps, delta) in &[(0.01, 1e-9), (0.3, 1e-6), (1.0, 1e-5), (4.0, 0.2), (50.0, 1e-8)] {
            let s = analytic_sigma(1.0, eps, delta).unwrap();
            assert!(analytic_delta(s, 1.0, eps) <= delta, "not private at {eps},{delta}");
            // 0.01 % less noise must already violate δ: the answer is tight.
            assert!(analytic_delta(s * (1.0 - 1e-4), 1.0, eps) > delta, "not tight at {eps},{delta}");
        }
    }

    #[test]
    fn analytic_scales_linearly_in_sensitivity() {
        let a = analytic_sigma(1.0, 0.7, 1e-6).unwrap();
        let b = analytic_sigma(3.5, 0.7, 1e-6).unwrap();
        assert!((b / a - 3.5).abs() < 1e-9);
    }

    #[test]
    fn classic_matches_formula_and_rejects_large_epsilon() {
        let s = classic_sigma(1.0, 1.0, 1e-5).unwrap();
        // Hall et al. column of the notes' table: 4.9409 at (1, 1e-5); 53.8677 at (0.1, 1e-6).
        assert!((s - 4.9409).abs() < 1e-4, "{s}");
        let s = classic_sigma(1.0, 0.1, 1e-6).unwrap();
        assert!((s - 53.8677).abs() < 1e-3, "{s}");
        assert_eq!(classic_sigma(1.0, 1.5, 1e-5), Err(CalibrationError::ClassicNeedsSmallEpsilon(1.5)));
        // The classic σ is always at least the analytic one in this range.
        for eps in [0.1, 0.5, 1.0] {
            assert!(classic_sigma(1.0, eps, 1e-6).unwrap() > analytic_sigma(1.0, eps, 1e-6).unwrap());
        }
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        assert!(matches!(analytic_sigma(1.0, 0.0, 1e-6), Err(CalibrationError::Epsilon(_))));
        assert!(matches!(analytic_sigma(1.0, f64::NAN, 1e-6), Err(CalibrationError::Epsilon(_))));
        assert!(matches!(analytic_sigma(1.0, 1.0, 0.0), Err(CalibrationError::Delta(_))));
        assert!(matches!(analytic_sigma(1.0, 1.0, 1.0), Err(CalibrationError::Delta(_))));
        assert!(matches!(analytic_sigma(0.0, 1.0, 0.5), Err(CalibrationError::Sensitivity(_))));
    }

    #[test]
    fn epsilon_for_mu_inverts_the_calibration() {
        let s = analytic_sigma(1.0, 0.7, 1e-6).unwrap();
        assert!((epsilon_for_mu(1.0 / s, 1e-6) - 0.7).abs() < 1e-6);
        assert_eq!(epsilon_for_mu(0.0, 1e-6), 0.0);
    }

    /// The authors' reference code (cdp2adp.py) gives cdp_delta(ρ=0.025, ε=1) = 1.33613e-6
    /// and cdp_rho(ε=1, δ=1e-6) = 0.0243560; our conversion agrees and is on the safe side.
    #[test]
    fn zcdp_conversion_matches_the_reference_and_is_safe() {
        let d = zcdp_log_delta(0.025, 1.0).exp();
        assert!((d / 1.33613e-6 - 1.0).abs() < 1e-4, "{d}");
        let rho = zcdp_rho(Calibration::Analytic, 1.0, 1e-6).unwrap();
        assert!(zcdp_log_delta(rho, 1.0) <= (1e-6f64).ln(), "{rho}");
        assert!((rho / 0.0243560 - 1.0).abs() < 1e-5, "{rho}");
        assert!(zcdp_log_delta(rho * 1.0001, 1.0) > (1e-6f64).ln(), "tight: {rho}");
        // σ for Δ = 1 (README "Privacy"): 4.5309 at (1, 1e-6), 7.6672 at (0.5, 1e-5).
        assert!((discrete_sigma(Calibration::Analytic, 1.0, 1.0, 1e-6).unwrap() - 4.5309).abs() < 1e-3);
        assert!((discrete_sigma(Calibration::Analytic, 1.0, 0.5, 1e-5).unwrap() - 7.6672).abs() < 1e-3);
        // Discrete σ is larger than the continuous analytic σ, by a bounded overhead.
        for (eps, delta) in [(1.0, 1e-6), (0.5, 1e-5), (0.1, 1e-9), (5.0, 1e-6)] {
            let d = discrete_sigma(Calibration::Analytic, 1.0, eps, delta).unwrap();
            let a = analytic_sigma(1.0, eps, delta).unwrap();
            assert!(d > a && d < 1.3 * a, "({eps}, {delta}): {d} vs {a}");
        }
        // Classic: never less noise than the papers' formula, and refused for ε > 1.
        let c = discrete_sigma(Calibration::Classic, 1.0, 0.5, 1e-5).unwrap();
        assert!(c >= classic_sigma(1.0, 0.5, 1e-5).unwrap());
        assert!(discrete_sigma(Calibration::Classic, 1.0, 2.0, 1e-5).is_err());
        // Tiny ε (one budget unit) is calibrated, not refused; a subnormal ε is an error, not a hang.
        assert!(discrete_sigma(Calibration::Analytic, 1.0, 1e-12, 1e-18).unwrap().is_finite());
        assert!(matches!(zcdp_rho(Calibration::Analytic, 5e-324, 1e-6), Err(CalibrationError::Epsilon(_))));
        assert!(matches!(zcdp_rho(Calibration::Analytic, 1e-300, 0.5), Err(CalibrationError::Epsilon(_))));
    }

    /// Negative control: a conversion that dropped the (1 − 1/α)^α/(α − 1) factor would
    /// claim too small a δ at the same ρ; the reference value tells them apart.
    #[test]
    fn zcdp_reference_value_detects_a_wrong_conversion() {
        let (rho, eps) = (0.025f64, 1.0f64);
        let alpha = 10.0f64;
        let wrong = ((alpha - 1.0) * (alpha * rho - eps)).exp();
        assert!((wrong / 1.33613e-6 - 1.0).abs() > 0.1);
    }

    #[test]
    fn log_normal_cdf_is_continuous_across_the_switch() {
        let below = log_normal_cdf(-30.0 - 1e-9);
        let above = log_normal_cdf(-30.0 + 1e-9);
        assert!((below - above).abs() / above.abs() < 1e-9, "{below} {above}");
        assert!((log_normal_cdf(0.0) - 0.5f64.ln()).abs() < 1e-15);
    }
}
