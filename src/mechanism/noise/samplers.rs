//! Exact discrete samplers (SPEC §6; Canonne, Kamath & Steinke 2020, "CKS20").
//!
//! Every sampler here uses only integer arithmetic on uniformly random bits from the
//! generator it is given (production: ChaCha20 seeded from the OS, see [`crate::mechanism::noise::rng`]).
//! No floating-point operation is involved, so the distribution of every output is exactly
//! the one stated, with no holes or biased low bits (Mironov 2012).
//!
//! * [`uniform_below`] — rejection sampling of a uniform integer in `[0, n)`.
//! * [`bernoulli_exp`] — `Bernoulli(exp(−a/b))` for a rational `a/b ≥ 0` (CKS20 Alg. 1).
//! * [`discrete_laplace`] — `P(y) ∝ exp(−|y|·den/num)` on ℤ (CKS20 Alg. 2).
//! * [`discrete_gaussian`] — `P(y) ∝ exp(−y²/(2S))` on ℤ for an integer variance parameter
//!   `S = t·s` with `t` a power of two (CKS20 Alg. 3, with the Laplace proposal's scale `t`).
//!
//! Exactness has one caveat, shared by every sampler that loops on random bits: counters
//! are `u128` and saturate. A counter can only get near saturation after more than 2^64
//! loop iterations, an event whose probability is below `exp(−2^64)` and which would take
//! longer than the age of the universe to occur.
//!
//! Timing: the number of rejected rounds is independent of the accepted value, but the
//! accepted round's cost depends on it (CKS20 §5.3). What timing can reveal is about the
//! noise, summed over hundreds of coordinates per release; see README "Privacy".

use rand::Rng;

/// A uniform integer in `[0, n)`; `n` must be positive (every caller passes a constant or
/// a product of positive constants).
pub fn uniform_below<R: Rng + ?Sized>(rng: &mut R, n: u128) -> u128 {
    debug_assert!(n > 0);
    if n == 1 {
        return 0;
    }
    let bits = 128 - (n - 1).leading_zeros();
    let mask = if bits == 128 { u128::MAX } else { (1u128 << bits) - 1 };
    loop {
        let r =
            if bits <= 64 { rng.next_u64() as u128 } else { ((rng.next_u64() as u128) << 64) | rng.next_u64() as u128 }
                & mask;
        if r < n {
            return r;
        }
    }
}

/// `Bernoulli(a/b)` for `0 ≤ a ≤ b`, `b > 0`.
pub fn bernoulli_ratio<R: Rng + ?Sized>(rng: &mut R, a: u128, b: u128) -> bool {
    uniform_below(rng, b) < a
}

/// `Bernoulli(exp(−a/b))` for `a/b ∈ [0, 1]`: CKS20 Algorithm 1, first case. Draws
/// `Bernoulli(γ/k)` for k = 1, 2, … until one fails and returns whether the number of
/// successes is even. `Bernoulli(γ/k)` is drawn as `Bernoulli(γ) ∧ Bernoulli(1/k)`, so no
/// product `b·k` can overflow.
fn bernoulli_exp_unit<R: Rng + ?Sized>(rng: &mut R, a: u128, b: u128) -> bool {
    let mut k: u128 = 1;
    loop {
        if !(bernoulli_ratio(rng, a, b) && bernoulli_ratio(rng, 1, k)) {
            return k % 2 == 1;
        }
        k = k.saturating_add(1);
    }
}

/// `Bernoulli(exp(−1))`.
fn bernoulli_exp_minus_one<R: Rng + ?Sized>(rng: &mut R) -> bool {
    bernoulli_exp_unit(rng, 1, 1)
}

/// `Bernoulli(exp(−(q + r/b)))` for an integer part `q` and a fraction `r/b < 1`.
fn bernoulli_exp_split<R: Rng + ?Sized>(rng: &mut R, q: u128, r: u128, b: u128) -> bool {
    let mut i: u128 = 0;
    while i < q {
        if !bernoulli_exp_minus_one(rng) {
            return false;
        }
        i += 1;
    }
    bernoulli_exp_unit(rng, r, b)
}

/// `Bernoulli(exp(−a/b))` for any rational `a/b ≥ 0` (CKS20 Algorithm 1).
pub fn bernoulli_exp<R: Rng + ?Sized>(rng: &mut R, a: u128, b: u128) -> bool {
    bernoulli_exp_split(rng, a / b, a % b, b)
}

/// A discrete Laplace sample: `P(y) ∝ exp(−|y|/scale)` on ℤ with `scale = num/den > 0`
/// (CKS20 Algorithm 2). Adding it to an integer statistic of L1 sensitivity Δ is
/// `(Δ·den/num)`-DP, exactly.
pub fn discrete_laplace<R: Rng + ?Sized>(rng: &mut R, num: u128, den: u128) -> i128 {
    debug_assert!(num > 0 && den > 0);
    loop {
        let u = uniform_below(rng, num);
        if !bernoulli_exp(rng, u, num) {
            continue;
        }
        let mut v: u128 = 0;
        while bernoulli_exp_minus_one(rng) {
            v = v.saturating_add(1);
        }
        let x = u.saturating_add(num.saturating_mul(v));
        let y = (x / den).min(i128::MAX as u128) as i128;
        let negative = rng.next_u32() & 1 == 1;
        if negative && y == 0 {
            continue;
        }
        return if negative { -y } else { y };
    }
}

/// The parameters of an exact discrete Gaussian `N_ℤ(0, S)`: `S = 2^t_log2 · s`.
/// Choosing `S` as a multiple of the proposal scale `t = 2^t_log2` keeps every quantity of
/// the acceptance test an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscreteGaussian {
    t_log2: u32,
    s: u128,
}

/// Largest variance parameter supported: `S < 2^112` (σ < 2^56 lattice units).
pub const MAX_DG_VARIANCE_LOG2: u32 = 112;

impl DiscreteGaussian {
    /// The discrete Gaussian with the smallest admissible variance parameter `S ≥ min_variance`
    /// (`min_variance` ≥ 1, in lattice units squared). `S` is rounded up to a multiple of a
    /// power of two `t ≥ sqrt(S)`, which only adds noise. None if `S` would exceed 2^112.
    pub fn at_least(min_variance: u128) -> Option<Self> {
        let v = min_variance.max(1);
        if v >= 1u128 << MAX_DG_VARIANCE_LOG2 {
            return None;
        }
        // t = 2^⌈log2 sqrt(v)⌉ ≥ sqrt(v); then s = ⌈v/t⌉, S = t·s ≥ v and t ≥ sqrt(S)/√2.
        let bits = 128 - (v - 1).leading_zeros(); // v ≤ 2^bits
        let t_log2 = bits.div_ceil(2);
        let t = 1u128 << t_log2;
        Some(Self { t_log2, s: v.div_ceil(t) })
    }

    /// The variance parameter S (σ² in lattice units).
    pub fn variance(&self) -> u128 {
        self.s << self.t_log2
    }

    /// One sample (CKS20 Algorithm 3): a discrete Laplace proposal with scale `t`, accepted
    /// with probability `exp(−(|y| − S/t)²/(2S))` = `exp(−(|y| − s)²/(2S))`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> i128 {
        let t = 1u128 << self.t_log2;
        let two_s = self.variance() << 1;
        loop {
            let y = discrete_laplace(rng, t, 1);
            let x = y.unsigned_abs().abs_diff(self.s);
            let (q, r) = square_divrem(x, two_s);
            if bernoulli_exp_split(rng, q, r, two_s) {
                return y;
            }
        }
    }
}

/// `(⌊x²/d⌋, x² mod d)` with the 256-bit square, the quotient saturated at u128::MAX
/// (which changes nothing: the caller's loop would need that many iterations to notice).
fn square_divrem(x: u128, d: u128) -> (u128, u128) {
    if x < 1u128 << 64 {
        let sq = x * x;
        return (sq / d, sq % d);
    }
    let (hi, lo) = mul_wide(x, x);
    div_wide(hi, lo, d)
}

/// The 256-bit product of two u128 values, as (high, low) halves.
fn mul_wide(a: u128, b: u128) -> (u128, u128) {
    let (a1, a0) = (a >> 64, a & u64::MAX as u128);
    let (b1, b0) = (b >> 64, b & u64::MAX as u128);
    let (p00, p01, p10, p11) = (a0 * b0, a0 * b1, a1 * b0, a1 * b1);
    let mid = (p00 >> 64) + (p01 & u64::MAX as u128) + (p10 & u64::MAX as u128);
    let lo = (p00 & u64::MAX as u128) | (mid << 64);
    let hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    (hi, lo)
}

/// `(hi·2^128 + lo) / d` (quotient saturated at u128::MAX) and the exact remainder, by
/// shift-and-subtract. Only reached for astronomically unlikely proposals.
fn div_wide(hi: u128, lo: u128, d: u128) -> (u128, u128) {
    let mut rem: u128 = 0;
    let mut quot_hi_nonzero = false;
    let mut quot: u128 = 0;
    for i in (0..256).rev() {
        let bit = if i >= 128 { (hi >> (i - 128)) & 1 } else { (lo >> i) & 1 };
        // rem < d ≤ 2^128 − 1, so 2·rem + bit may need 129 bits: track the carry.
        let carry = rem >> 127;
        rem = (rem << 1) | bit;
        let q_bit = if carry == 1 || rem >= d {
            rem = rem.wrapping_sub(d);
            1
        } else {
            0
        };
        if i >= 128 {
            quot_hi_nonzero |= q_bit == 1;
        } else {
            quot |= q_bit << i;
        }
    }
    (if quot_hi_nonzero { u128::MAX } else { quot }, rem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::ChaCha20Rng;

    fn rng(seed: u64) -> ChaCha20Rng {
        ChaCha20Rng::seed_from_u64(seed)
    }

    /// Pearson χ² of observed counts against expected probabilities over `support`
    /// (the rest lumped into one cell). Returns (χ², degrees of freedom).
    fn chi_square(
        counts: &std::collections::HashMap<i128, u64>,
        pmf: impl Fn(i128) -> f64,
        support: i128,
    ) -> (f64, usize) {
        let n: u64 = counts.values().sum();
        let mut chi = 0.0;
        let mut cells = 0;
        let mut rest_obs = n as f64;
        let mut rest_p = 1.0;
        for y in -support..=support {
            let p = pmf(y);
            let e = p * n as f64;
            if e < 20.0 {
                continue;
            }
            let o = *counts.get(&y).unwrap_or(&0) as f64;
            chi += (o - e) * (o - e) / e;
            rest_obs -= o;
            rest_p -= p;
            cells += 1;
        }
        let e = rest_p * n as f64;
        if e > 20.0 {
            chi += (rest_obs - e) * (rest_obs - e) / e;
            cells += 1;
        }
        (chi, cells - 1)
    }

    /// χ² critical value at p ≈ 1e-6 (Wilson–Hilferty), so a correct sampler fails with
    /// probability 1e-6 for a given seed — and the seeds are fixed.
    fn chi_critical(df: usize) -> f64 {
        let k = df as f64;
        let z = 4.75;
        k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
    }

    fn histogram(n: usize, mut f: impl FnMut() -> i128) -> std::collections::HashMap<i128, u64> {
        let mut h = std::collections::HashMap::new();
        for _ in 0..n {
            *h.entry(f()).or_insert(0) += 1;
        }
        h
    }

    fn dg_pmf(variance: f64) -> impl Fn(i128) -> f64 {
        let z: f64 = (-2000..=2000).map(|y: i64| (-(y * y) as f64 / (2.0 * variance)).exp()).sum();
        move |y| (-(y * y) as f64 / (2.0 * variance)).exp() / z
    }

    fn dl_pmf(scale: f64) -> impl Fn(i128) -> f64 {
        let q = (-1.0 / scale).exp();
        move |y| (1.0 - q) / (1.0 + q) * q.powi(y.unsigned_abs() as i32)
    }

    #[test]
    fn uniform_below_is_uniform_and_in_range() {
        let mut r = rng(1);
        for n in [1u128, 2, 3, 7, 1000, (1 << 64) + 5, u128::MAX] {
            for _ in 0..200 {
                assert!(uniform_below(&mut r, n) < n);
            }
        }
        let h = histogram(600_000, || uniform_below(&mut r, 6) as i128);
        let (chi, df) = chi_square(&h, |y| if (0..6).contains(&y) { 1.0 / 6.0 } else { 0.0 }, 6);
        assert_eq!(df, 5);
        assert!(chi < chi_critical(df), "χ² = {chi}");
    }

    #[test]
    fn bernoulli_exp_has_the_exact_rate() {
        // P = exp(−γ) for γ below, at and above 1; 400 000 draws each: 5 SE ≈ 0.004.
        for (a, b) in [(1u128, 3u128), (1, 1), (7, 2), (0, 5), (25, 4)] {
            let mut r = rng(2 + a as u64);
            let n = 400_000;
            let hits = (0..n).filter(|_| bernoulli_exp(&mut r, a, b)).count() as f64 / n as f64;
            let p = (-(a as f64) / b as f64).exp();
            let se = (p * (1.0 - p) / n as f64).sqrt().max(1e-6);
            assert!((hits - p).abs() < 5.0 * se, "exp(−{a}/{b}): {hits} vs {p}");
        }
    }

    #[test]
    fn discrete_laplace_matches_its_closed_form() {
        for (num, den) in [(1u128, 1u128), (5, 2), (3, 10), (40, 1)] {
            let scale = num as f64 / den as f64;
            let mut r = rng(10 + num as u64);
            let h = histogram(400_000, || discrete_laplace(&mut r, num, den));
            let (chi, df) = chi_square(&h, dl_pmf(scale), 400);
            assert!(chi < chi_critical(df), "scale {scale}: χ² = {chi} on {df} df");
            // Negative control: the same draws against a 5 % larger scale are rejected.
            let (bad, _) = chi_square(&h, dl_pmf(scale * 1.05), 400);
            assert!(bad > chi_critical(df), "scale {scale}: a 5 % wrong scale went unnoticed ({bad})");
        }
    }

    #[test]
    fn discrete_gaussian_matches_its_closed_form() {
        for v in [1u128, 2, 3, 10, 57, 400] {
            let dg = DiscreteGaussian::at_least(v).unwrap();
            let s = dg.variance() as f64;
            assert!(dg.variance() >= v && (dg.variance() as f64) < 2.0 * v as f64 + 2.0);
            let mut r = rng(20 + v as u64);
            let h = histogram(400_000, || dg.sample(&mut r));
            let (chi, df) = chi_square(&h, dg_pmf(s), 2000);
            assert!(chi < chi_critical(df), "S = {s}: χ² = {chi} on {df} df");
            let (bad, _) = chi_square(&h, dg_pmf(s * 1.05), 2000);
            assert!(bad > chi_critical(df), "S = {s}: a 5 % wrong variance went unnoticed ({bad})");
        }
    }

    /// Negative control for the χ² machinery: a floating-point Gaussian rounded to the
    /// nearest integer is a different distribution for small σ, and the test sees it.
    #[test]
    fn chi_square_rejects_a_rounded_continuous_gaussian() {
        use rand_distr::{Distribution, StandardNormal};
        let s = 0.6f64;
        let mut r = rng(30);
        let h = histogram(400_000, || {
            let z: f64 = StandardNormal.sample(&mut r);
            (z * s.sqrt()).round() as i128
        });
        let (chi, df) = chi_square(&h, dg_pmf(s), 50);
        assert!(chi > chi_critical(df), "rounded Gaussian not detected: χ² = {chi}");
    }

    #[test]
    fn large_variances_are_exact_in_mean_and_variance() {
        // S near the top of the supported range: no overflow, the right spread.
        for log2 in [40u32, 80, 110] {
            let dg = DiscreteGaussian::at_least(1u128 << log2).unwrap();
            let sd = (dg.variance() as f64).sqrt();
            let mut r = rng(log2 as u64);
            let n = 20_000;
            let (mut m, mut q) = (0.0, 0.0);
            for _ in 0..n {
                let y = dg.sample(&mut r) as f64 / sd;
                m += y;
                q += y * y;
            }
            let (mean, var) = (m / n as f64, q / n as f64);
            assert!(mean.abs() < 5.0 / (n as f64).sqrt(), "2^{log2}: mean {mean}");
            assert!((var - 1.0).abs() < 5.0 * (2.0 / n as f64).sqrt(), "2^{log2}: var {var}");
        }
        assert!(DiscreteGaussian::at_least(1u128 << 112).is_none());
    }

    #[test]
    fn wide_arithmetic_agrees_with_the_definition() {
        let cases = [(u128::MAX, 3u128), (1u128 << 100, (1u128 << 101) + 7), (123_456_789_012_345_678_901u128, 999)];
        for (x, d) in cases {
            let (hi, lo) = mul_wide(x, x);
            // Check (hi, lo) = x² via a 64-bit-limb schoolbook product.
            let limbs = |v: u128| [v as u64 as u128, v >> 64];
            let (a, b) = (limbs(x), limbs(x));
            let mut acc = [0u128; 4];
            for i in 0..2 {
                for j in 0..2 {
                    let p = a[i] * b[j];
                    acc[i + j] += p & u64::MAX as u128;
                    acc[i + j + 1] += p >> 64;
                }
            }
            for i in 0..3 {
                acc[i + 1] += acc[i] >> 64;
                acc[i] &= u64::MAX as u128;
            }
            assert_eq!(lo, acc[0] | (acc[1] << 64));
            assert_eq!(hi, acc[2] | (acc[3] << 64));
            let (q, r) = div_wide(hi, lo, d);
            assert!(r < d);
            if hi < d {
                // q·d + r = x² (mod 2^256), checked through the wide product.
                let (qh, ql) = mul_wide(q, d);
                let (sum, carry) = ql.overflowing_add(r);
                assert_eq!((qh + carry as u128, sum), (hi, lo));
            } else {
                assert_eq!(q, u128::MAX, "quotient saturates");
            }
        }
        assert_eq!(square_divrem(10, 7), (14, 2));
    }
}
