//! Double-double arithmetic (≈ 104 significant bits) and the discrete Fourier transform in it:
//! what computes a release's lifted coordinates from its exact statistic with a stated,
//! data-independent error bound (SPEC §6; [`super::lattice`] rounds them to its lattice).

use std::sync::Arc;

use crate::mechanism::noise::cache::PublicCache;

/// Relative accuracy assumed of every double-double operation (the true bound is ≈ 2^-104).
pub const DD_OP_ERR: f64 = 7.888609052210118e-31; // 2^-100

/// A double-double number `hi + lo` with `|lo| ≤ ulp(hi)/2`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DD {
    /// Leading part.
    pub hi: f64,
    /// Trailing part.
    pub lo: f64,
}

#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

#[inline(always)]
fn quick_two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    (s, b - (s - a))
}

/// Above this magnitude Dekker's `(2^27 + 1)·a` would overflow: split a scaled copy (exact below
/// `2^1023·(2 − 2^-26)`, where the 26-bit head would round past the largest double).
const SPLIT_LIMIT: f64 = 6.69692879491417e299; // 2^996

#[inline(always)]
fn split(a: f64) -> (f64, f64) {
    if a.abs() > SPLIT_LIMIT {
        // Exact: scaling by a power of two loses nothing at this magnitude.
        let (hi, lo) = split(a * 3.725290298461914e-9); // 2^-28
        return (hi * 268_435_456.0, lo * 268_435_456.0);
    }
    let t = 134_217_729.0 * a; // 2^27 + 1 (Dekker); no FMA on the baseline target
    let hi = t - (t - a);
    (hi, a - hi)
}

#[inline(always)]
fn two_prod(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    let (ah, al) = split(a);
    let (bh, bl) = split(b);
    (p, ((ah * bh - p) + ah * bl + al * bh) + al * bl)
}

/// How a product's rounding error `a·b − fl(a·b)` is computed. Both ways give it exactly (for
/// products that neither overflow nor underflow), so every kernel gives the same bits.
trait ExactProduct {
    fn two_prod(a: f64, b: f64) -> (f64, f64);
}

/// Dekker's splitting: any x86-64 (the baseline target has no fused multiply-add).
struct Dekker;

impl ExactProduct for Dekker {
    #[inline(always)]
    fn two_prod(a: f64, b: f64) -> (f64, f64) {
        two_prod(a, b)
    }
}

/// One fused multiply-add, inside functions compiled for a CPU that has it (outside them
/// `mul_add` would call the C library's software `fma`).
#[cfg(target_arch = "x86_64")]
struct Fused;

#[cfg(target_arch = "x86_64")]
impl ExactProduct for Fused {
    #[inline(always)]
    fn two_prod(a: f64, b: f64) -> (f64, f64) {
        let p = a * b;
        (p, a.mul_add(b, -p))
    }
}

impl DD {
    /// An exact f64.
    pub const fn from_f64(x: f64) -> Self {
        DD { hi: x, lo: 0.0 }
    }

    /// An integer, exact when `|v| < 2^106`.
    pub fn from_i128(v: i128) -> Self {
        let hi = v as f64;
        let lo = v.saturating_sub(hi as i128) as f64;
        let (hi, lo) = quick_two_sum(hi, lo);
        DD { hi, lo }
    }

    /// The nearest f64.
    pub fn to_f64(self) -> f64 {
        self.hi + self.lo
    }

    /// Multiplication by a power of two (exact).
    pub fn scale_pow2(self, p: i32) -> Self {
        let f = 2f64.powi(p);
        DD { hi: self.hi * f, lo: self.lo * f }
    }

    /// Accurate addition (relative error ≤ 3·2^-106).
    #[inline]
    #[allow(clippy::should_implement_trait)] // named like the operator it computes, in double-double
    pub fn add(self, b: DD) -> DD {
        let (s1, s2) = two_sum(self.hi, b.hi);
        let (t1, t2) = two_sum(self.lo, b.lo);
        let (s1, s2) = quick_two_sum(s1, s2 + t1);
        let (hi, lo) = quick_two_sum(s1, s2 + t2);
        DD { hi, lo }
    }

    /// Negation.
    #[inline]
    #[allow(clippy::should_implement_trait)] // named like the operator it computes, in double-double
    pub fn neg(self) -> DD {
        DD { hi: -self.hi, lo: -self.lo }
    }

    /// Subtraction.
    #[inline]
    #[allow(clippy::should_implement_trait)] // named like the operator it computes, in double-double
    pub fn sub(self, b: DD) -> DD {
        self.add(b.neg())
    }

    /// Multiplication.
    #[inline]
    #[allow(clippy::should_implement_trait)] // named like the operator it computes, in double-double
    pub fn mul(self, b: DD) -> DD {
        self.mul_by::<Dekker>(b)
    }

    /// Multiplication with a given way of computing the exact product (the same bits).
    #[inline(always)]
    fn mul_by<P: ExactProduct>(self, b: DD) -> DD {
        let (p, e) = P::two_prod(self.hi, b.hi);
        let (hi, lo) = quick_two_sum(p, e + (self.hi * b.lo + self.lo * b.hi));
        DD { hi, lo }
    }

    /// Multiplication by an f64.
    #[inline]
    pub fn mul_f64(self, b: f64) -> DD {
        let (p, e) = two_prod(self.hi, b);
        let (hi, lo) = quick_two_sum(p, e + self.lo * b);
        DD { hi, lo }
    }

    /// Square root of a positive value (one Newton correction of the f64 root).
    pub fn sqrt(self) -> DD {
        let x = self.hi.sqrt();
        let r = self.sub(DD::from_f64(x).mul_f64(x));
        let (hi, lo) = quick_two_sum(x, r.hi / (2.0 * x));
        DD { hi, lo }
    }

    /// Reciprocal (two Newton corrections of the f64 reciprocal).
    pub fn recip(self) -> DD {
        let mut y = DD::from_f64(1.0 / self.hi);
        for _ in 0..2 {
            // y ← y + y·(1 − a·y)
            let e = DD::from_f64(1.0).sub(self.mul(y));
            y = y.add(y.mul(e));
        }
        y
    }

    /// Division by a small integer (for Taylor coefficients; one Newton correction).
    fn div_f64(self, b: f64) -> DD {
        let q1 = self.hi / b;
        let r = self.sub(DD::from_f64(b).mul_f64(q1));
        let q2 = r.hi / b;
        let (hi, lo) = quick_two_sum(q1, q2);
        DD { hi, lo }
    }
}

/// 2π as a double-double.
const TWO_PI: DD = DD { hi: std::f64::consts::TAU, lo: 2.4492935982947064e-16 };
/// √2 as a double-double.
pub const SQRT_2: DD = DD { hi: std::f64::consts::SQRT_2, lo: -9.667293313452913e-17 };

/// cos θ and sin θ for 0 ≤ θ ≤ π/4 by Taylor series in double-double (27 terms: the
/// first omitted one is below 2^-110).
fn cos_sin_small(theta: DD) -> (DD, DD) {
    let t2 = theta.mul(theta);
    let (mut c, mut s) = (DD::from_f64(1.0), theta);
    let (mut tc, mut ts) = (DD::from_f64(1.0), theta);
    for k in 1..=14 {
        let k = k as f64;
        tc = tc.mul(t2).div_f64(-(2.0 * k - 1.0) * (2.0 * k));
        ts = ts.mul(t2).div_f64(-(2.0 * k) * (2.0 * k + 1.0));
        c = c.add(tc);
        s = s.add(ts);
    }
    (c, s)
}

/// `exp(−2πi·k/m)` for k < m/2, m a power of two ≥ 8, in double-double (built once per m, into
/// [`stage_twiddles`]).
fn build_twiddles(m: usize) -> Vec<(DD, DD)> {
    let eighth = m / 8;
    // First octant: (cos, sin) of 2πj/m for j ≤ m/8.
    let oct: Vec<(DD, DD)> = (0..=eighth).map(|j| cos_sin_small(TWO_PI.mul_f64(j as f64 / m as f64))).collect();
    let quarter = |k: usize| -> (DD, DD) {
        // (cos, sin) of 2πk/m for k ≤ m/4 from the octant table.
        if k <= eighth {
            oct[k]
        } else {
            let (c, s) = oct[m / 4 - k];
            (s, c)
        }
    };
    let table: Vec<(DD, DD)> = (0..m / 2)
        .map(|k| {
            let (c, s) = if k <= m / 4 {
                quarter(k)
            } else {
                let (c, s) = quarter(k - m / 4);
                (s.neg(), c)
            };
            (c, s.neg()) // exp(−iθ) = cos θ − i sin θ
        })
        .collect();
    table
}

/// Bound on `‖fl(Q·x) − Q·x‖₂ / ‖x‖₂` for the orthonormal real coordinates computed by
/// [`real_dft_coordinates`] (Higham, Thm 24.2: log2(m)·η with η ≈ 7 ops' error; twice that).
pub fn dft_relative_error(m: usize) -> f64 {
    (m.max(2) as f64).log2() * 16.0 * DD_OP_ERR + 4.0 * DD_OP_ERR
}

/// The complex DFT `F_k = Σ_j x_j·exp(−2πi·jk/m)`, for `k < outputs` (at most m), of a real
/// double-double vector of power-of-two length m ≥ 8 (iterative radix-2), in double-double.
///
/// Only the butterflies the first `outputs` frequencies depend on run: a sub-transform of length
/// L feeds the outputs below `outputs` only through its own outputs below `min(L, outputs)`, so a
/// stage of blocks of length L computes `min(L/2, outputs)` butterflies per block — with the same
/// operations, hence the same bits, as the full transform. The values are held as four planes
/// (leading and trailing words of the real and imaginary parts) so that a stage's butterflies
/// are lane-wise operations, compiled for AVX-512 or AVX2 with fused multiply-adds and chosen at
/// run time; every kernel gives the same bits ([`ExactProduct`]; IEEE operations lane by lane,
/// never contracted).
pub fn dd_fft(x: &[DD], outputs: usize) -> Vec<(DD, DD)> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the kernel is compiled for.
            return unsafe { dd_fft_avx512(x, outputs) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { dd_fft_avx2(x, outputs) };
        }
    }
    dd_fft_with::<Dekker>(x, outputs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn dd_fft_avx512(x: &[DD], outputs: usize) -> Vec<(DD, DD)> {
    dd_fft_with::<Fused>(x, outputs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dd_fft_avx2(x: &[DD], outputs: usize) -> Vec<(DD, DD)> {
    dd_fft_with::<Fused>(x, outputs)
}

/// Double-double complex values as four planes: the real part's leading and trailing words, then
/// the imaginary part's.
#[derive(Clone, Default)]
struct Planes([Vec<f64>; 4]);

impl Planes {
    fn zeros(n: usize) -> Self {
        Self(std::array::from_fn(|_| vec![0.0; n]))
    }

    fn set(&mut self, i: usize, (re, im): (DD, DD)) {
        let [rh, rl, ih, il] = &mut self.0;
        (rh[i], rl[i], ih[i], il[i]) = (re.hi, re.lo, im.hi, im.lo);
    }

    fn get(&self, i: usize) -> (DD, DD) {
        let [rh, rl, ih, il] = &self.0;
        (DD { hi: rh[i], lo: rl[i] }, DD { hi: ih[i], lo: il[i] })
    }
}

/// The twiddles of every stage of a length-m transform as planes: for blocks of length L
/// (2, 4, …, m), `exp(−2πi·k/L)` for k < L/2 from offset L/2 − 1 (m − 1 entries in all).
fn stage_twiddles(m: usize) -> Arc<Planes> {
    static CACHE: PublicCache<usize, Planes> = PublicCache::new(256 << 20);
    CACHE
        .get_or_try_insert(
            m,
            |t| t.0.iter().map(|p| 8 * p.len()).sum(),
            || {
                let tw = build_twiddles(m);
                let mut planes = Planes::zeros(m - 1);
                let mut len = 2;
                while len <= m {
                    let half = len / 2;
                    for k in 0..half {
                        planes.set(half - 1 + k, tw[k * (m / len)]);
                    }
                    len <<= 1;
                }
                Ok::<_, std::convert::Infallible>(planes)
            },
        )
        .unwrap_or_else(|e| match e {})
}

#[inline(always)]
fn dd_fft_with<P: ExactProduct>(x: &[DD], outputs: usize) -> Vec<(DD, DD)> {
    let m = x.len();
    assert!(m.is_power_of_two() && m >= 8, "dd_fft needs a power of two ≥ 8");
    let outputs = outputs.min(m);
    let bits = m.trailing_zeros();
    let mut a = Planes::zeros(m);
    for (j, v) in x.iter().enumerate() {
        a.set(j.reverse_bits() >> (usize::BITS - bits), (*v, DD::default()));
    }
    let tw = stage_twiddles(m);
    let mut len = 2;
    while len <= m {
        let half = len / 2;
        let n = half.min(outputs);
        let w = tw.0.each_ref().map(|p| &p[half - 1..half - 1 + n]);
        for start in (0..m).step_by(len) {
            let [rh, rl, ih, il] = &mut a.0;
            let (rh0, rh1) = rh[start..start + len].split_at_mut(half);
            let (rl0, rl1) = rl[start..start + len].split_at_mut(half);
            let (ih0, ih1) = ih[start..start + len].split_at_mut(half);
            let (il0, il1) = il[start..start + len].split_at_mut(half);
            butterflies::<P>(
                w,
                [&mut rh0[..n], &mut rl0[..n], &mut ih0[..n], &mut il0[..n]],
                [&mut rh1[..n], &mut rl1[..n], &mut ih1[..n], &mut il1[..n]],
            );
        }
        len <<= 1;
    }
    (0..outputs).map(|k| a.get(k)).collect()
}

/// `(a, b) ← (a + w·b, a − w·b)` lane by lane over equally long planes.
#[inline(always)]
fn butterflies<P: ExactProduct>(w: [&[f64]; 4], a: [&mut [f64]; 4], b: [&mut [f64]; 4]) {
    let n = w[0].len();
    let [wrh, wrl, wih, wil] = w.map(|p| &p[..n]);
    let [arh, arl, aih, ail] = a.map(|p| &mut p[..n]);
    let [brh, brl, bih, bil] = b.map(|p| &mut p[..n]);
    for k in 0..n {
        let (wr, wi) = (DD { hi: wrh[k], lo: wrl[k] }, DD { hi: wih[k], lo: wil[k] });
        let (br, bi) = (DD { hi: brh[k], lo: brl[k] }, DD { hi: bih[k], lo: bil[k] });
        // t = w·b
        let tr = wr.mul_by::<P>(br).sub(wi.mul_by::<P>(bi));
        let ti = wr.mul_by::<P>(bi).add(wi.mul_by::<P>(br));
        let (ar, ai) = (DD { hi: arh[k], lo: arl[k] }, DD { hi: aih[k], lo: ail[k] });
        let (sr, si, dr, di) = (ar.add(tr), ai.add(ti), ar.sub(tr), ai.sub(ti));
        (arh[k], arl[k], aih[k], ail[k]) = (sr.hi, sr.lo, si.hi, si.lo);
        (brh[k], brl[k], bih[k], bil[k]) = (dr.hi, dr.lo, di.hi, di.lo);
    }
}

/// Orthonormal real-DFT coordinates, for the frequencies `0..=kmax` (kmax ≤ m/2), of a real
/// vector of length `m = stride·x.len()` that is zero except at multiples of `stride`, where it
/// takes the values `x` (`x.len()` a power of two ≥ 8; `kmax < x.len()` when stride > 1).
/// Returns `[a_0, a_1, b_1, …, a_kmax, b_kmax]` where `a_0 = F_0/√m`,
/// `a_k = √(2/m)·Re F_k`, `b_k = −√(2/m)·Im F_k` (and `a_{m/2} = F_{m/2}/√m` with no `b`):
/// the coefficients in the basis `1/√m`, `√(2/m)·cos(2πjk/m)`, `√(2/m)·sin(2πjk/m)`,
/// `(−1)^j/√m`. The DFT of length m of such a vector is the DFT of length `x.len()` of x,
/// taken at `k mod x.len()`.
pub fn real_dft_coordinates(x: &[DD], stride: usize, kmax: usize) -> Vec<DD> {
    let m = x.len() * stride;
    assert!(kmax <= m / 2 && (stride == 1 || kmax < x.len()), "frequency out of range");
    let f = dd_fft(x, kmax + 1);
    let inv_sqrt_m = DD::from_f64(m as f64).sqrt().recip();
    let sqrt_2_over_m = SQRT_2.mul(inv_sqrt_m);
    let mut out = Vec::with_capacity(2 * kmax + 1);
    for (k, (re, im)) in f.iter().enumerate().take(kmax + 1) {
        if k == 0 || 2 * k == m {
            out.push(re.mul(inv_sqrt_m));
        } else {
            out.push(re.mul(sqrt_2_over_m));
            out.push(im.mul(sqrt_2_over_m).neg());
        }
    }
    out
}

/// Number of real coordinates for frequencies `0..=kmax` of a length-m real DFT.
pub fn real_coordinate_count(m: usize, kmax: usize) -> usize {
    if 2 * kmax == m { m } else { 2 * kmax + 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::ChaCha20Rng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn products_of_huge_operands_stay_exact_and_finite() {
        // Dekker's split overflowed to NaN above 1.34e300.
        for a in [1.5e300, -1.7e308, 6.7e299, 1.79e308] {
            let (p, e) = two_prod(a, 0.75);
            assert!(p.is_finite() && e.is_finite(), "{a}: {p} {e}");
            assert_eq!(p, a * 0.75);
            let (h, l) = split(a);
            assert_eq!(h + l, a);
        }
        let x = DD { hi: 1.5e300, lo: 1e284 }.mul(DD::from_f64(3.0));
        assert!(x.hi.is_finite() && x.lo.is_finite(), "{x:?}");
    }

    #[test]
    fn double_double_arithmetic_carries_104_bits() {
        let third = DD::from_f64(1.0).div_f64(3.0);
        let back = third.mul_f64(3.0).sub(DD::from_f64(1.0));
        assert!(back.to_f64().abs() < 1e-31, "{back:?}");
        let big = DD::from_i128((1i128 << 100) + 12345);
        assert_eq!(big.sub(DD::from_f64(2f64.powi(100))).to_f64(), 12345.0);
        let (c, s) = cos_sin_small(DD::from_f64(0.5));
        let one = c.mul(c).add(s.mul(s)).sub(DD::from_f64(1.0));
        assert!(one.to_f64().abs() < 1e-30, "{one:?}");
        assert!((s.to_f64() - 0.5f64.sin()).abs() < 2e-16);
    }

    #[test]
    fn dd_fft_matches_a_direct_dft_to_double_double_accuracy() {
        let m = 64;
        let x: Vec<DD> = (0..m).map(|j| DD::from_i128(((j * 7919) % 101) as i128 - 50)).collect();
        let f = dd_fft(&x, m);
        for k in [0usize, 1, 5, 31, 32, 63] {
            // Direct sum with dd twiddles from the same table (exact index arithmetic).
            let tw = build_twiddles(m);
            let (mut re, mut im) = (DD::default(), DD::default());
            for (j, v) in x.iter().enumerate() {
                let idx = (j * k) % m;
                let (c, s) = if idx < m / 2 { tw[idx] } else { (tw[idx - m / 2].0.neg(), tw[idx - m / 2].1.neg()) };
                re = re.add(v.mul(c));
                im = im.add(v.mul(s));
            }
            assert!(re.sub(f[k].0).to_f64().abs() < 1e-26, "k={k}");
            assert!(im.sub(f[k].1).to_f64().abs() < 1e-26, "k={k}");
            // And an f64 direct DFT agrees to f64 accuracy.
            let (fr, fi) = x.iter().enumerate().fold((0.0, 0.0), |(a, b), (j, v)| {
                let t = -2.0 * std::f64::consts::PI * (j * k) as f64 / m as f64;
                (a + v.hi * t.cos(), b + v.hi * t.sin())
            });
            assert!((fr - f[k].0.to_f64()).abs() < 1e-9 && (fi - f[k].1.to_f64()).abs() < 1e-9);
        }
    }

    #[test]
    fn every_transform_kernel_and_every_pruning_gives_the_same_bits() {
        // Values over many magnitudes, signs and trailing parts (the statistic's entries are
        // integers scaled by 2^-40; twiddles and lifts are anything in [-1, 1]).
        let m = 256;
        let mut rng = ChaCha20Rng::seed_from_u64(0x5eed);
        let x: Vec<DD> = (0..m)
            .map(|_| {
                let v = DD::from_i128(((rng.next_u64() as i128) << 37) - (1i128 << 100) + rng.next_u64() as i128);
                v.scale_pow2((rng.next_u64() % 180) as i32 - 140)
            })
            .collect();
        let full = dd_fft_with::<Dekker>(&x, m);
        // Every kernel this CPU can run, the portable one included.
        type Transform = fn(&[DD], usize) -> Vec<(DD, DD)>;
        let mut kernels: Vec<(&str, Transform)> =
            vec![("portable", |x: &[DD], n: usize| dd_fft_with::<Dekker>(x, n)), ("dispatched", dd_fft)];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                // SAFETY: the CPU has the features.
                kernels.push(("avx2", |x: &[DD], n: usize| unsafe { dd_fft_avx2(x, n) }));
            }
            if has!("avx512f") && has!("fma") {
                // SAFETY: as above.
                kernels.push(("avx512", |x: &[DD], n: usize| unsafe { dd_fft_avx512(x, n) }));
            }
        }
        for (name, kernel) in kernels {
            for outputs in [1, 3, 8, 100, 128, 129, 256] {
                let pruned = kernel(&x, outputs);
                assert_eq!(pruned.len(), outputs);
                for k in 0..outputs {
                    let (a, b) = (full[k], pruned[k]);
                    assert_eq!(bits(a), bits(b), "{name}, outputs {outputs}, k {k}: {a:?} vs {b:?}");
                }
            }
        }
        // Negative control: a kernel that drops the products' rounding errors is caught.
        let naive = dd_fft_with::<Naive>(&x, m);
        assert!((0..m).any(|k| bits(naive[k]) != bits(full[k])));
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            for (a, b) in x.iter().zip(x.iter().rev()) {
                // SAFETY: the CPU has fused multiply-add.
                let fused = unsafe { fused_product(a.hi, b.hi) };
                assert_eq!(fused.1.to_bits(), two_prod(a.hi, b.hi).1.to_bits(), "{a:?}·{b:?}");
            }
        }
    }

    fn bits((re, im): (DD, DD)) -> [u64; 4] {
        [re.hi, re.lo, im.hi, im.lo].map(f64::to_bits)
    }

    /// A product without its rounding error (the negative control).
    struct Naive;

    impl ExactProduct for Naive {
        fn two_prod(a: f64, b: f64) -> (f64, f64) {
            (a * b, 0.0)
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    fn fused_product(a: f64, b: f64) -> (f64, f64) {
        <Fused as ExactProduct>::two_prod(a, b)
    }

    #[test]
    fn real_coordinates_are_orthonormal() {
        // Parseval: ‖coords‖ = ‖x‖ when all frequencies are kept; a unit impulse has
        // coordinates equal to the basis vectors at 0.
        for m in [16usize, 32, 1024] {
            let mut x = vec![DD::default(); m];
            x[3] = DD::from_f64(1.0);
            let c = real_dft_coordinates(&x, 1, m / 2);
            assert_eq!(c.len(), real_coordinate_count(m, m / 2));
            let norm2 = c.iter().fold(DD::default(), |a, v| a.add(v.mul(*v)));
            assert!(norm2.sub(DD::from_f64(1.0)).to_f64().abs() < 1e-28, "m={m}: {norm2:?}");
            let t = 2.0 * std::f64::consts::PI * 3.0 / m as f64;
            assert!((c[1].to_f64() - (2.0 / m as f64).sqrt() * t.cos()).abs() < 1e-15);
            assert!((c[2].to_f64() - (2.0 / m as f64).sqrt() * t.sin()).abs() < 1e-15);
        }
    }

    /// A strided vector's coordinates equal those of the full vector (compressed FFT).
    #[test]
    fn strided_coordinates_match_the_full_transform() {
        let (n, stride) = (16usize, 3usize);
        let x: Vec<DD> = (0..n).map(|j| DD::from_f64((j * j % 7) as f64 - 2.5)).collect();
        let mut full = vec![DD::default(); n * stride];
        for (j, v) in x.iter().enumerate() {
            full[j * stride] = *v;
        }
        // Direct f64 coordinates of the full (non power-of-two) vector.
        let m = n * stride;
        let got = real_dft_coordinates(&x, stride, 5);
        for k in 0..=5usize {
            let (mut a, mut b) = (0.0, 0.0);
            for (j, v) in full.iter().enumerate() {
                let t = 2.0 * std::f64::consts::PI * (j * k) as f64 / m as f64;
                a += v.hi * t.cos();
                b += v.hi * t.sin();
            }
            let s = if k == 0 { (1.0 / m as f64).sqrt() } else { (2.0 / m as f64).sqrt() };
            let idx = if k == 0 { 0 } else { 2 * k - 1 };
            assert!((got[idx].to_f64() - s * a).abs() < 1e-12, "k={k}");
            if k > 0 {
                assert!((got[idx + 1].to_f64() - s * b).abs() < 1e-12, "k={k}");
            }
        }
        let r = DD::from_f64(3.0).sqrt();
        assert!(r.mul(r).sub(DD::from_f64(3.0)).to_f64().abs() < 1e-30);
        assert!(DD::from_f64(3.0).recip().mul_f64(3.0).sub(DD::from_f64(1.0)).to_f64().abs() < 1e-30);
    }
}
