//! DP partition selection (SPEC §7, GROUP BY over private keys): a group may appear only if
//! its unit count plus exact discrete Laplace noise reaches a threshold.
//!
//! Each unit reaches at most `max_groups` groups, so adding or removing one unit changes the
//! vector of group counts by at most `max_groups` in L1: noise of scale `max_groups/ε` makes
//! the noisy counts of the groups both neighbours have ε-DP. A group only one neighbour has
//! holds that unit alone (count 1), and there are at most `max_groups` of them; the threshold τ
//! makes each appear with probability at most `δ/max_groups`, so the selection is (ε, δ)-DP.
//! With `p = exp(−1/scale)`, `P(Z ≥ k) = p^k/(1+p)` for `k ≥ 1`, so τ is the smallest integer
//! with `p^(τ−1)/(1+p) ≤ δ/max_groups`, computed for the rational scale actually sampled.
//! SQL: `guard::selection` (GROUP BY over columns without declared keys).

use rand::Rng;

use crate::mechanism::noise::lattice::rational_at_least;
use crate::mechanism::noise::samplers::discrete_laplace;

/// A calibrated partition selection.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionSelection {
    num: u128,
    den: u128,
    max_groups: u64,
    threshold: i64,
}

impl PartitionSelection {
    /// Calibrates the selection for `(epsilon, delta)` when a unit reaches at most
    /// `max_groups` groups. ε in [1e-6, 1000], δ in (0, 0.5], max_groups in [1, 10^5].
    pub fn new(epsilon: f64, delta: f64, max_groups: u64) -> Result<Self, String> {
        if !(1e-6..=1000.0).contains(&epsilon) || !(delta > 0.0 && delta <= 0.5) || !(1..=100_000).contains(&max_groups)
        {
            return Err(format!(
                "partition selection needs ε in [1e-6, 1000], δ in (0, 0.5] and max_groups in [1, 100000]; got \
                 {epsilon}, {delta}, {max_groups}"
            ));
        }
        let (num, den) = rational_at_least(max_groups as f64 / epsilon * (1.0 + 1e-12))
            .ok_or_else(|| format!("ε = {epsilon} is out of range"))?;
        let mut s = Self { num, den, max_groups, threshold: 1 };
        // ln P(1 + Z ≥ τ) = (τ−1)·ln p − ln(1+p); start from the closed form, then step up
        // until the bound holds with a relative margin for the logarithms' rounding.
        let ln_p = s.ln_p();
        let target = (delta / max_groups as f64).ln();
        let start = ((target + (1.0 + ln_p.exp()).ln()) / ln_p).ceil().max(0.0);
        s.threshold = 1 + start as i64;
        while s.ln_release_probability(1) > target - 1e-9 * target.abs() {
            s.threshold += 1;
        }
        Ok(s)
    }

    fn ln_p(&self) -> f64 {
        -(self.den as f64) / (self.num as f64)
    }

    /// The threshold τ: a group appears iff count + Z ≥ τ.
    pub fn threshold(&self) -> i64 {
        self.threshold
    }

    /// The scale of the discrete Laplace noise (≥ max_groups/ε).
    pub fn scale(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// The most groups one unit may reach.
    pub fn max_groups(&self) -> u64 {
        self.max_groups
    }

    /// ln P(count + Z ≥ τ), exactly from the closed form of the discrete Laplace tail.
    pub fn ln_release_probability(&self, count: u64) -> f64 {
        let ln_p = self.ln_p();
        let p = ln_p.exp();
        let k = self.threshold - count as i64; // need Z ≥ k
        if k >= 1 {
            k as f64 * ln_p - (1.0 + p).ln()
        } else {
            // 1 − P(Z ≥ 1 − k) = 1 − p^(1−k)/(1+p)
            (1.0 - ((1 - k) as f64 * ln_p).exp() / (1.0 + p)).ln()
        }
    }

    /// ln P(count + Z < τ) = ln P(Z ≥ count + 1 − τ) (Z is symmetric), from the closed form in
    /// both regimes so neither tail loses precision.
    pub fn ln_withhold_probability(&self, count: u64) -> f64 {
        let ln_p = self.ln_p();
        let p = ln_p.exp();
        let k = count as i64 + 1 - self.threshold; // need Z ≥ k
        if k >= 1 { k as f64 * ln_p - (1.0 + p).ln() } else { (1.0 - ((1 - k) as f64 * ln_p).exp() / (1.0 + p)).ln() }
    }

    /// Whether a group with `count` units is released (draws exact discrete Laplace noise).
    pub fn keeps<R: Rng + ?Sized>(&self, count: u64, rng: &mut R) -> bool {
        self.noisy_count(count, rng) >= self.threshold as i128
    }

    /// `count + Z` with exact discrete Laplace noise Z: the group is released iff it reaches
    /// [`Self::threshold`]; ranking released groups by it is post-processing.
    pub fn noisy_count<R: Rng + ?Sized>(&self, count: u64, rng: &mut R) -> i128 {
        (count as i128).saturating_add(discrete_laplace(rng, self.num, self.den))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::ChaCha20Rng;

    #[test]
    fn the_threshold_is_the_smallest_that_bounds_a_lone_units_group_by_delta() {
        for (eps, delta, groups) in [(1.0, 1e-6, 1), (0.1, 1e-5, 1), (1.0, 1e-9, 7), (5.0, 1e-3, 100)] {
            let s = PartitionSelection::new(eps, delta, groups).unwrap();
            let bound = (delta / groups as f64).ln();
            assert!(s.ln_release_probability(1) <= bound, "{eps} {delta} {groups}");
            // Negative control: one lower would not bound it.
            let lower = PartitionSelection { threshold: s.threshold - 1, ..s.clone() };
            assert!(lower.ln_release_probability(1) > bound, "τ is not tight for {eps} {delta} {groups}");
        }
        // Reference value: ε = 1, δ = 1e-6, one group per unit: scale 1, p = e^-1,
        // τ = 1 + ceil((ln 1e-6 + ln(1 + e^-1)) / -1) = 1 + ceil(13.50) = 15.
        assert_eq!(PartitionSelection::new(1.0, 1e-6, 1).unwrap().threshold(), 15);
        assert!(PartitionSelection::new(1.0, 0.0, 1).is_err());
        assert!(PartitionSelection::new(f64::NAN, 1e-6, 1).is_err());
    }

    #[test]
    fn counts_of_neighbouring_tables_are_released_within_e_to_the_epsilon() {
        // ε audit on the exact release probabilities: counts c and c+1 (L = 1).
        let eps = 0.7;
        let s = PartitionSelection::new(eps, 1e-4, 1).unwrap();
        for c in 1..(3 * s.threshold() as u64) {
            let (a, b) = (s.ln_release_probability(c), s.ln_release_probability(c + 1));
            assert!((b - a) <= eps + 1e-9, "c = {c}: ratio e^{}", b - a);
            let (na, nb) = (s.ln_withhold_probability(c), s.ln_withhold_probability(c + 1));
            assert!((na - nb) <= eps + 1e-9, "c = {c}: withheld ratio e^{}", na - nb);
            assert!((a.exp() + na.exp() - 1.0).abs() < 1e-12, "the two closed forms add up to one");
        }
        // Negative control: half the noise scale breaks the bound somewhere.
        let mut half = s.clone();
        half.num /= 2;
        let worst = (1..(3 * s.threshold() as u64))
            .map(|c| half.ln_release_probability(c + 1) - half.ln_release_probability(c))
            .fold(f64::MIN, f64::max);
        assert!(worst > eps * 1.5, "{worst}");
    }

    /// Statistical ε audit through the sampler: neighbouring counts c and c + 1 (one unit more)
    /// are released at rates whose ratio stays within e^ε (95 % confidence intervals from 400 000
    /// draws each, fixed seed), for the counts where both rates are measurable; a group only one
    /// neighbour has (count 1) is released at a rate below δ. Negative control: the sampler at a
    /// third of the scale shows a ratio beyond e^ε.
    #[test]
    fn statistical_epsilon_audit_of_the_sampler() {
        let (eps, delta) = (0.5, 0.02);
        let s = PartitionSelection::new(eps, delta, 1).unwrap();
        let mut rng = ChaCha20Rng::seed_from_u64(2026);
        let n = 400_000;
        let rate = |s: &PartitionSelection, c: u64, rng: &mut ChaCha20Rng| {
            (0..n).filter(|_| s.keeps(c, rng)).count() as f64 / n as f64
        };
        // Lower confidence bound of ln(p_b/p_a) from the two binomial estimates (delta method).
        let low_log_ratio = |a: f64, b: f64| {
            let se = ((1.0 - a) / (a * n as f64) + (1.0 - b) / (b * n as f64)).sqrt();
            (b / a).ln() - 1.96 * se
        };
        let tau = s.threshold() as u64;
        for c in [tau - 4, tau - 2, tau, tau + 2] {
            let (a, b) = (rate(&s, c, &mut rng), rate(&s, c + 1, &mut rng));
            assert!(low_log_ratio(a, b) <= eps, "c = {c}: {a} → {b}");
            let (wa, wb) = (1.0 - a, 1.0 - b);
            assert!(low_log_ratio(wb, wa) <= eps, "withheld, c = {c}: {wa} → {wb}");
        }
        assert!(rate(&s, 1, &mut rng) <= delta, "a lone unit's group");
        let mut third = s.clone();
        third.num /= 3;
        let c = tau - 3;
        let (a, b) = (rate(&third, c, &mut rng), rate(&third, c + 1, &mut rng));
        assert!(low_log_ratio(a, b) > eps, "the audit must catch a third of the noise: {a} → {b}");
    }

    #[test]
    fn sampled_release_rates_match_the_closed_form() {
        // δ large enough that the rates are measurable: 200 000 draws per count, fixed seed.
        let s = PartitionSelection::new(0.5, 0.05, 1).unwrap();
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let n = 200_000;
        for c in [1u64, s.threshold() as u64, s.threshold() as u64 + 4] {
            let hits = (0..n).filter(|_| s.keeps(c, &mut rng)).count() as f64;
            let p = s.ln_release_probability(c).exp();
            let sd = (p * (1.0 - p) / n as f64).sqrt();
            assert!((hits / n as f64 - p).abs() < 5.0 * sd + 1e-9, "count {c}: {} vs {p}", hits / n as f64);
        }
        // Negative control: a sampler at half the scale gives a visibly different rate.
        let mut half = s.clone();
        half.num /= 2;
        let c = s.threshold() as u64 - 3;
        let hits = (0..n).filter(|_| half.keeps(c, &mut rng)).count() as f64 / n as f64;
        let p = s.ln_release_probability(c).exp();
        assert!((hits - p).abs() > 10.0 * (p * (1.0 - p) / n as f64).sqrt(), "{hits} vs {p}");
    }
}
