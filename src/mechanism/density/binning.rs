//! Linear binning, the hot loop of every binned density statistic: one value `x` on bins
//! `origin + j/inv_spacing` puts the weights `2^40 − r` and `r` on its two nearest bins `l`
//! and `l + 1` (exact integers that sum to one unit of mass).
//!
//! `linear_bin` is the definition, one value at a time. `LinearBins` computes the same
//! numbers for a block of values at once (a loop the compiler vectorises; on x86-64 it is
//! compiled three times — AVX-512, AVX2, baseline — and the widest the CPU offers is chosen
//! at run time) and records each value as `(1, r)` at its left bin in a split buffer
//! ([`crate::mechanism::sums::BufferedSums::buffer_split`]): one read-modify-write per row
//! instead of two. The flush turns the pairs back into the weights above, so the statistic
//! is bit-identical to adding every value with `linear_bin`. A dropped value (NaN, ±∞,
//! outside the bins) goes to a spare entry past the last bin, which the flush ignores:
//! every value costs the same work, whatever it is.
//!
//! Under GROUP BY, [`LinearBins::scatter`] adds a whole batch in row order, each row to its
//! group's split buffer: no ordering of the rows by group, no gather.

use crate::mechanism::cpu::{Kernel, LOW_BITS, ROUND_MAGIC};
use crate::mechanism::sums::BufferedSums;

/// The weight of one whole row, in the statistic's units (2^-40 of a row).
pub const UNIT: i64 = 1 << 40;
const FIXED_ONE: f64 = UNIT as f64;

/// Linear binning of one value on bins `origin + j/inv_spacing`, `j < nbins`: the left bin
/// `l` and the weights (in units of 2^-40) that go to bins `l` and `l + 1`; they sum to
/// exactly `2^40`. `ok` is false (and the weights must be ignored) for NaN, ±inf and
/// values outside the bins — branch-free, so the hot loop does not mispredict on data.
#[inline(always)]
pub(crate) fn linear_bin(x: f64, origin: f64, inv_spacing: f64, nbins: usize) -> (usize, i64, i64, bool) {
    let p = (x - origin) * inv_spacing;
    let ok = p >= 0.0 && p <= (nbins - 1) as f64;
    let p = if ok { p } else { 0.0 };
    // l = the integer nearest p − 1/2, at most nbins − 2, so l ∈ [p − 1, p] and the
    // fraction p − l ∈ [0, 1] (on a bin edge either neighbour gives the same weights).
    let t = (p - 0.5).min((nbins - 2) as f64) + ROUND_MAGIC;
    let l = t - ROUND_MAGIC; // exact
    let right = ((p - l) * FIXED_ONE + ROUND_MAGIC).to_bits() & LOW_BITS;
    ((t.to_bits() & LOW_BITS) as usize, UNIT - right as i64, right as i64, ok)
}

/// Values located per block: small enough for the block's indices and weights to stay in
/// L1, large enough to amortise the dispatch.
const BLOCK: usize = 256;

/// Bins `origin + j/inv_spacing`, `j < nbins` (2 ≤ nbins ≤ 2^31), binned a block at a time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinearBins {
    pub origin: f64,
    pub inv_spacing: f64,
    pub nbins: usize,
}

impl LinearBins {
    /// Length of the split buffer these bins write: one entry per bin and the spare.
    pub(crate) fn split_len(&self) -> usize {
        self.nbins + 1
    }

    /// Adds `values` to the split buffer `split` (length [`LinearBins::split_len`]).
    pub(crate) fn add(&self, split: &mut [[i64; 2]], values: &[f64]) {
        self.add_with(Kernel::detect(), split, values)
    }

    /// Adds the values an iterator yields (gathered a block at a time), as [`LinearBins::add`].
    pub(crate) fn add_iter(&self, split: &mut [[i64; 2]], values: impl Iterator<Item = f64>) {
        let kernel = Kernel::detect();
        let mut block = [0.0; BLOCK];
        let mut n = 0;
        for x in values {
            block[n] = x;
            n += 1;
            if n == BLOCK {
                self.add_with(kernel, split, &block);
                n = 0;
            }
        }
        self.add_with(kernel, split, &block[..n]);
    }

    /// [`LinearBins::add`] with a chosen kernel (it must be one [`Kernel::detect`] allows).
    pub(crate) fn add_with(&self, kernel: Kernel, split: &mut [[i64; 2]], values: &[f64]) {
        assert_eq!(split.len(), self.split_len(), "split buffer of the wrong length");
        assert!((2..=1 << 31).contains(&self.nbins));
        let mut left = [0u32; BLOCK];
        let mut right = [0i64; BLOCK];
        for block in values.chunks(BLOCK) {
            let (left, right) = (&mut left[..block.len()], &mut right[..block.len()]);
            self.locate_with(kernel, block, left, right);
            for (&l, &r) in left.iter().zip(right.iter()) {
                let entry = &mut split[l as usize];
                entry[0] += 1;
                entry[1] += r;
            }
        }
    }
}

impl LinearBins {
    /// Adds row i of `values` to the split buffer of `accs[groups[i]]` (GROUP BY: a batch's rows
    /// scattered into their groups in row order), a row where `keep(i)` is false to that
    /// buffer's spare entry (the same work as any row). Every group's rows must have been
    /// announced ([`BufferedSums::buffer_split`], this layout's unit), which flushes a buffer
    /// before it could overflow. Each group's statistic is bit-identical to
    /// [`LinearBins::add`] of its kept values.
    pub(crate) fn scatter(
        &self,
        accs: &mut [BufferedSums],
        values: &[f64],
        groups: &[usize],
        keep: impl Fn(usize) -> bool,
    ) {
        self.scatter_with(Kernel::detect(), accs, values, groups, keep)
    }

    /// [`LinearBins::scatter`] with a chosen kernel (one [`Kernel::detect`] allows).
    pub(crate) fn scatter_with(
        &self,
        kernel: Kernel,
        accs: &mut [BufferedSums],
        values: &[f64],
        groups: &[usize],
        keep: impl Fn(usize) -> bool,
    ) {
        assert_eq!(values.len(), groups.len(), "one group per value");
        assert!((2..=1 << 31).contains(&self.nbins));
        let spare = self.nbins as u32;
        let mut left = [0u32; BLOCK];
        let mut right = [0i64; BLOCK];
        for (b, (block, block_groups)) in values.chunks(BLOCK).zip(groups.chunks(BLOCK)).enumerate() {
            let (left, right) = (&mut left[..block.len()], &mut right[..block.len()]);
            self.locate_with(kernel, block, left, right);
            for (j, ((&l, &r), &g)) in left.iter().zip(right.iter()).zip(block_groups).enumerate() {
                let kept = keep(b * BLOCK + j);
                let entry = &mut accs[g].announced_split()[if kept { l } else { spare } as usize];
                entry[0] += 1;
                entry[1] += if kept { r } else { 0 };
            }
        }
    }

    /// Each value's left bin and right weight ([`locate`]) with a chosen kernel.
    #[inline(always)]
    fn locate_with(&self, kernel: Kernel, block: &[f64], left: &mut [u32], right: &mut [i64]) {
        match kernel {
            Kernel::Portable => locate(self, block, left, right),
            // SAFETY: these kernels are only chosen when the CPU has the features they are
            // compiled for (`Kernel::detect`, `Kernel::available`).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { locate_avx2(self, block, left, right) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { locate_avx512(self, block, left, right) },
        }
    }
}

/// For each value: its left bin (the spare entry `nbins` when it is dropped) and the weight
/// its right neighbour gets — `linear_bin`'s arithmetic, operation for operation (no
/// fused multiply-add, so every kernel gives the same bits).
#[inline(always)]
fn locate(bins: &LinearBins, values: &[f64], left: &mut [u32], right: &mut [i64]) {
    let (origin, inv, spare) = (bins.origin, bins.inv_spacing, bins.nbins as u32);
    let (top, last_left) = ((bins.nbins - 1) as f64, (bins.nbins - 2) as f64);
    for ((&x, l), r) in values.iter().zip(left.iter_mut()).zip(right.iter_mut()) {
        let p = (x - origin) * inv;
        let ok = p >= 0.0 && p <= top;
        let p = if ok { p } else { 0.0 };
        let t = (p - 0.5).min(last_left) + ROUND_MAGIC;
        let lf = t - ROUND_MAGIC;
        let w = ((p - lf) * FIXED_ONE + ROUND_MAGIC).to_bits() & LOW_BITS;
        *l = if ok { (t.to_bits() & LOW_BITS) as u32 } else { spare };
        *r = if ok { w as i64 } else { 0 };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn locate_avx2(bins: &LinearBins, values: &[f64], left: &mut [u32], right: &mut [i64]) {
    locate(bins, values, left, right)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2")]
fn locate_avx512(bins: &LinearBins, values: &[f64], left: &mut [u32], right: &mut [i64]) {
    locate(bins, values, left, right)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mechanism::sums::{BufferedSums, Buffers};

    /// The statistic of `values` added one at a time with the definition.
    fn by_definition(bins: &LinearBins, values: &[f64]) -> Vec<i128> {
        let mut state = vec![0i128; bins.nbins];
        for &x in values {
            let (l, a, b, ok) = linear_bin(x, bins.origin, bins.inv_spacing, bins.nbins);
            if ok {
                state[l] += a as i128;
                state[l + 1] += b as i128;
            }
        }
        state
    }

    fn awkward_values(bins: &LinearBins, n: usize) -> Vec<f64> {
        let spacing = 1.0 / bins.inv_spacing;
        let end = bins.origin + (bins.nbins - 1) as f64 * spacing;
        let mut xs = vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            bins.origin,
            end,
            end + 1e-12,
            bins.origin - 1e-12,
            bins.origin + 0.5 * spacing,
            -0.0,
            f64::MAX,
            f64::MIN_POSITIVE,
        ];
        xs.extend((0..bins.nbins).map(|j| bins.origin + j as f64 * spacing));
        xs.extend(crate::datagen::mixture(n, 5).into_iter().map(|x| x * 1.3 - 0.1));
        xs
    }

    #[test]
    fn every_kernel_gives_the_definitions_statistic_bit_for_bit() {
        for bins in [
            LinearBins { origin: -0.2, inv_spacing: 1.0 / 0.0007, nbins: 2515 },
            LinearBins { origin: 0.0, inv_spacing: 1.0, nbins: 2 },
            LinearBins { origin: 1e6, inv_spacing: 3.0e-5, nbins: 77 },
        ] {
            let xs = awkward_values(&bins, 20_000);
            let reference = by_definition(&bins, &xs);
            assert!(reference.iter().filter(|&&v| v != 0).count() > 1);
            for kernel in Kernel::available() {
                // Through the buffer and its flush, in uneven pieces (partial blocks).
                let mut acc = BufferedSums::new(bins.nbins, 1 << 22, Buffers::Split);
                for piece in xs.chunks(1000 + 3) {
                    bins.add_with(kernel, acc.buffer_split(piece.len(), UNIT), piece);
                }
                assert_eq!(acc.totals(), &reference[..], "{kernel:?} on {bins:?}");
                let mut acc = BufferedSums::new(bins.nbins, 1 << 22, Buffers::Split);
                bins.add_iter(acc.buffer_split(xs.len(), UNIT), xs.iter().copied());
                assert_eq!(acc.totals(), &reference[..], "gathered, on {bins:?}");
            }
        }
    }

    #[test]
    fn scattering_into_groups_gives_each_group_its_own_statistic() {
        // Rows of 5 groups in row order (one group never has a row), a third of them dropped:
        // each group's statistic is the definition's on its kept values, with every kernel.
        let bins = LinearBins { origin: -0.2, inv_spacing: 1.0 / 0.0007, nbins: 2515 };
        let xs = awkward_values(&bins, 20_000);
        let groups: Vec<usize> = (0..xs.len()).map(|i| [0, 1, 1, 3, 4, 4, 4][(i * 7 + i / 3) % 7]).collect();
        let keep = |i: usize| i % 3 != 1;
        for kernel in Kernel::available() {
            let mut accs: Vec<BufferedSums> =
                (0..5).map(|_| BufferedSums::new(bins.nbins, 1 << 22, Buffers::Split)).collect();
            for (piece, piece_groups) in xs.chunks(1000 + 3).zip(groups.chunks(1000 + 3)) {
                for (g, acc) in accs.iter_mut().enumerate() {
                    let rows = piece_groups.iter().filter(|&&h| h == g).count();
                    if rows > 0 {
                        acc.buffer_split(rows, UNIT);
                    }
                }
                let start = piece.as_ptr() as usize - xs.as_ptr() as usize;
                let offset = start / size_of::<f64>();
                bins.scatter_with(kernel, &mut accs, piece, piece_groups, |i| keep(offset + i));
            }
            for (g, acc) in accs.iter_mut().enumerate() {
                let mine: Vec<f64> = (0..xs.len()).filter(|&i| groups[i] == g && keep(i)).map(|i| xs[i]).collect();
                assert_eq!(acc.totals(), &by_definition(&bins, &mine)[..], "{kernel:?}, group {g}");
                assert_eq!(mine.is_empty(), g == 2);
            }
        }
    }

    #[test]
    fn a_kernel_that_moved_one_weight_would_be_caught() {
        // Negative control for the comparison above: a statistic off by one unit somewhere
        // differs from the definition's.
        let bins = LinearBins { origin: -0.2, inv_spacing: 1.0 / 0.0007, nbins: 2515 };
        let xs = awkward_values(&bins, 1000);
        let mut acc = BufferedSums::new(bins.nbins, 1 << 22, Buffers::Split);
        bins.add(acc.buffer_split(xs.len(), UNIT), &xs);
        acc.buffer_split(1, UNIT)[7][1] += 1;
        assert_ne!(acc.totals(), &by_definition(&bins, &xs)[..]);
    }
}
