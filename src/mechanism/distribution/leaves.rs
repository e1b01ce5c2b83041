//! The CDF's statistic: exact counts of the values in `L` equal leaves of `[lo, hi]`, values outside
//! counting in the end leaves, NULL-free non-finite values counting nowhere.
//!
//! **Definition** (one value): `u = max((x − lo)·L/(hi − lo), 0)`, leaf `min(⌊u⌋, L − 1)`, add
//! `1` if x is finite, else `0` (NaN gives u = 0). The loop below locates a block of values first
//! — the leaf of each, exactly the definition's, in a loop the compiler vectorises (compiled for
//! AVX2 and the baseline, chosen at run time like the KDE's binning) — then counts them, one add
//! per value: every value costs the same work.

use crate::mechanism::cpu::{Kernel, LOW_BITS, ROUND_MAGIC};

/// Values located per block (their leaves stay in L1).
const BLOCK: usize = 256;

/// Equal leaves of a range.
#[derive(Debug, Clone, Copy)]
pub struct Leaves {
    /// Left end of the range.
    pub lo: f64,
    /// Leaves per unit of the value: `L/(hi − lo)`.
    pub scale: f64,
    /// Number of leaves L (1 ≤ L ≤ 2^31).
    pub count: usize,
}

impl Leaves {
    /// Adds `values` to `counts` (length [`Leaves::count`]).
    pub fn add(&self, counts: &mut [i64], values: &[f64]) {
        self.add_with(Kernel::detect(), counts, values)
    }

    /// [`Leaves::add`] with a chosen kernel (one [`Kernel::detect`] allows).
    pub(crate) fn add_with(&self, kernel: Kernel, counts: &mut [i64], values: &[f64]) {
        assert_eq!(counts.len(), self.count, "counts of the wrong length");
        assert!((1..=1 << 31).contains(&self.count));
        let mut leaf = [0u32; BLOCK];
        let mut finite = [0i64; BLOCK];
        for block in values.chunks(BLOCK) {
            let (leaf, finite) = (&mut leaf[..block.len()], &mut finite[..block.len()]);
            match kernel {
                Kernel::Portable => locate(self, block, leaf, finite),
                // SAFETY: kernels are only chosen when the CPU has their features
                // (`Kernel::detect`, `Kernel::available`).
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 | Kernel::Avx512 => unsafe { locate_avx2(self, block, leaf, finite) },
            }
            for (&l, &f) in leaf.iter().zip(finite.iter()) {
                counts[l as usize] += f;
            }
        }
    }
}

/// Each value's leaf and whether it counts: the definition's floor, taken as the nearest integer
/// (`ROUND_MAGIC`) minus one where that rounded up — exact for every `u` in `[0, L − 1]`.
#[inline(always)]
fn locate(leaves: &Leaves, values: &[f64], leaf: &mut [u32], finite: &mut [i64]) {
    let (lo, scale, last) = (leaves.lo, leaves.scale, (leaves.count - 1) as f64);
    for ((&x, l), f) in values.iter().zip(leaf.iter_mut()).zip(finite.iter_mut()) {
        let p = (x - lo) * scale;
        let u = if p > 0.0 { p } else { 0.0 }; // NaN and −∞ give 0
        let u = if u < last { u } else { last }; // +∞ and the right end give the last leaf
        let t = u + ROUND_MAGIC;
        let nearest = t - ROUND_MAGIC; // exact
        *l = ((t.to_bits() & LOW_BITS) as u32).wrapping_sub(u32::from(nearest > u));
        *f = i64::from(x.is_finite());
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn locate_avx2(leaves: &Leaves, values: &[f64], leaf: &mut [u32], finite: &mut [i64]) {
    locate(leaves, values, leaf, finite)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one value at a time.
    fn by_definition(leaves: &Leaves, values: &[f64]) -> Vec<i64> {
        let mut counts = vec![0i64; leaves.count];
        for &x in values {
            let u = ((x - leaves.lo) * leaves.scale).max(0.0);
            counts[(u as usize).min(leaves.count - 1)] += i64::from(x.is_finite());
        }
        counts
    }

    fn awkward_values(leaves: &Leaves, n: usize) -> Vec<f64> {
        let width = 1.0 / leaves.scale;
        let hi = leaves.lo + leaves.count as f64 * width;
        let mut xs = vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            leaves.lo,
            hi,
            hi + 1e-12,
            leaves.lo - 1e-12,
            -0.0,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
        ];
        // Every leaf edge, and the doubles just either side of it.
        for j in 0..=leaves.count {
            let e = leaves.lo + j as f64 * width;
            xs.extend([e, f64::from_bits(e.to_bits() + 1), f64::from_bits(e.to_bits().saturating_sub(1))]);
        }
        xs.extend(crate::datagen::mixture(n, 5).into_iter().map(|x| x * 1.6 - 0.3));
        xs
    }

    #[test]
    fn every_kernel_counts_the_definitions_leaves() {
        for leaves in [
            Leaves { lo: -0.2, scale: 4096.0 / 1.4, count: 4096 },
            Leaves { lo: 0.0, scale: 1.0, count: 1 },
            Leaves { lo: 0.0, scale: 8.0, count: 8 },
            Leaves { lo: 1e6, scale: 65_536.0 / 3.0, count: 65_536 },
            // The widest and the narrowest ranges planning accepts (`ranges::accepts`), and beyond
            // them a width that overflowed (scale 0: (x − lo)·scale is 0, or ∞·0 = NaN) and leaves
            // of subnormal width.
            Leaves { lo: -1e100, scale: 65_536.0 / 2e100, count: 65_536 },
            Leaves { lo: 0.0, scale: 65_536.0 / 1e-100, count: 65_536 },
            Leaves { lo: -1.5e308, scale: 0.0, count: 4096 },
            Leaves { lo: 0.0, scale: 4096.0 / 1e-310, count: 4096 },
        ] {
            let xs = awkward_values(&leaves, 20_000);
            let reference = by_definition(&leaves, &xs);
            for kernel in Kernel::available() {
                let mut counts = vec![0i64; leaves.count];
                for piece in xs.chunks(1000 + 3) {
                    leaves.add_with(kernel, &mut counts, piece);
                }
                assert_eq!(counts, reference, "{kernel:?} on {leaves:?}");
            }
        }
    }

    #[test]
    fn rounding_to_the_nearest_leaf_instead_would_be_caught() {
        // The control: the nearest integer without the correction moves values in the upper
        // half of a leaf one leaf right; the edges and the sample above catch it.
        let leaves = Leaves { lo: -0.2, scale: 4096.0 / 1.4, count: 4096 };
        let xs = awkward_values(&leaves, 1000);
        let mut nearest = vec![0i64; leaves.count];
        for &x in &xs {
            let p = (x - leaves.lo) * leaves.scale;
            let u = if p > 0.0 { p } else { 0.0 }.min((leaves.count - 1) as f64);
            nearest[((u + ROUND_MAGIC).to_bits() & LOW_BITS) as usize] += i64::from(x.is_finite());
        }
        assert_ne!(nearest, by_definition(&leaves, &xs));
    }
}
