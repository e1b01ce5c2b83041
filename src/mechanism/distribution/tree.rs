//! The hierarchical histogram behind the private CDF: a tree over `2^k` equal leaves with
//! branching factors near 16, its level sums, and the efficient (generalised least-squares)
//! estimate of the leaf counts from noisy counts at every level.
//!
//! **Shape.** With per-level noise of equal budget, the average variance of a prefix count after
//! least squares is lowest for branching factors near 16 (Qardaji, Yang & Li 2013); a numerical
//! optimisation of the per-level weights over every factorisation of `2^k` (`k ≤ 10`, exact
//! prefix variances of the estimator below) found the best tree within 1 % of "factors as equal as
//! possible, `round(k/4)` levels below the root, uniform weights", which is what
//! [`TreeShape::for_leaves_log2`] builds (larger factors on top); at `k = 12` the same computation
//! over 43 factorisations found 16·16·16 with uniform weights best.
//!
//! **Estimate** (Hay et al. 2010; Honaker 2015 for unequal variances). Level `l` holds noisy
//! counts `y` with variance `v_l`, the same for every node of the level. Bottom-up, each node
//! combines its own count with the sum of its children's estimates by inverse variance; top-down,
//! each node's final estimate spreads its parent's surplus equally over its siblings (they share
//! one variance). The result is the minimum-variance unbiased linear estimate of the leaf counts
//! given all levels, and it is consistent: every node equals the sum of its children.

/// The branching factors of a tree, from the root down; the leaves are their product.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TreeShape {
    factors: Vec<usize>,
}

/// The finest resolution a tree may have: `2^MAX_LEAVES_LOG2` leaves.
pub const MAX_LEAVES_LOG2: u32 = 16;

impl TreeShape {
    /// The tree over `2^k` leaves (1 ≤ k ≤ [`MAX_LEAVES_LOG2`]): `max(1, round(k/4))` levels below
    /// the root, branching factors powers of two as equal as possible, larger ones on top.
    pub fn for_leaves_log2(k: u32) -> Self {
        assert!((1..=MAX_LEAVES_LOG2).contains(&k), "leaves 2^{k} out of range");
        let levels = ((k + 2) / 4).max(1);
        let (base, extra) = (k / levels, k % levels);
        let factors = (0..levels).map(|l| 1usize << (base + u32::from(l < extra))).collect();
        Self { factors }
    }

    /// The branching factors, root first.
    pub fn factors(&self) -> &[usize] {
        &self.factors
    }

    /// Levels below the root.
    pub fn levels(&self) -> usize {
        self.factors.len()
    }

    /// Number of leaves.
    pub fn leaves(&self) -> usize {
        self.factors.iter().product()
    }

    /// Nodes per level, the root's (1) first.
    pub fn level_sizes(&self) -> Vec<usize> {
        let mut sizes = vec![1];
        for f in &self.factors {
            sizes.push(sizes.last().expect("root") * f);
        }
        sizes
    }

    /// Every level's counts from the leaf counts, the root first (exact integer sums).
    pub fn level_counts(&self, leaves: &[i128]) -> Vec<Vec<i128>> {
        assert_eq!(leaves.len(), self.leaves());
        let mut levels = vec![leaves.to_vec()];
        for f in self.factors.iter().rev() {
            let below = levels.last().expect("leaves");
            levels.push(below.chunks_exact(*f).map(|c| c.iter().fold(0i128, |a, b| a.saturating_add(*b))).collect());
        }
        levels.reverse();
        levels
    }

    /// The least-squares leaf counts from noisy counts `y` at every level (root first, in the
    /// shape of [`Self::level_sizes`]) with per-level variances `variance` (module docs).
    #[allow(clippy::needless_range_loop)] // a level indexes its values and its branching factor
    pub fn estimate_leaves(&self, y: &[Vec<f64>], variance: &[f64]) -> Vec<f64> {
        let depth = self.levels();
        assert!(y.len() == depth + 1 && variance.len() == depth + 1);
        // Bottom-up: z combines a node's own count with its children's; w is z's variance.
        let mut z: Vec<Vec<f64>> = vec![Vec::new(); depth + 1];
        let mut w = vec![0.0; depth + 1];
        z[depth] = y[depth].clone();
        w[depth] = variance[depth];
        for l in (0..depth).rev() {
            let b = self.factors[l];
            let children = b as f64 * w[l + 1];
            let own = variance[l];
            // Weight of the node's own count: children / (own + children) (inverse variances).
            let a = children / (own + children);
            z[l] = y[l]
                .iter()
                .zip(z[l + 1].chunks_exact(b))
                .map(|(yv, c)| a * yv + (1.0 - a) * c.iter().sum::<f64>())
                .collect();
            w[l] = own * children / (own + children);
        }
        // Top-down: each node's final value spreads its parent's surplus over its siblings.
        let mut u = z[0].clone();
        for l in 1..=depth {
            let b = self.factors[l - 1];
            let mut next = Vec::with_capacity(z[l].len());
            for (parent, c) in u.iter().zip(z[l].chunks_exact(b)) {
                let share = (parent - c.iter().sum::<f64>()) / b as f64;
                next.extend(c.iter().map(|v| v + share));
            }
            u = next;
        }
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_factors_near_sixteen_and_the_right_leaves() {
        for k in 1..=MAX_LEAVES_LOG2 {
            let s = TreeShape::for_leaves_log2(k);
            assert_eq!(s.leaves(), 1 << k, "{k}");
            assert!(s.factors().windows(2).all(|w| w[0] >= w[1]), "larger factors on top: {:?}", s.factors());
            let (min, max) = (s.factors().iter().min().unwrap(), s.factors().iter().max().unwrap());
            assert!(max / min <= 2, "factors as equal as possible: {:?}", s.factors());
        }
        assert_eq!(TreeShape::for_leaves_log2(8).factors(), &[16, 16]);
        assert_eq!(TreeShape::for_leaves_log2(12).factors(), &[16, 16, 16]);
        assert_eq!(TreeShape::for_leaves_log2(3).factors(), &[8]);
        assert_eq!(TreeShape::for_leaves_log2(10).factors(), &[16, 8, 8]);
    }

    #[test]
    fn level_counts_are_exact_sums() {
        let s = TreeShape::for_leaves_log2(6);
        let leaves: Vec<i128> = (0..64).map(|i| i * i).collect();
        let levels = s.level_counts(&leaves);
        assert_eq!(levels.len(), s.levels() + 1);
        assert_eq!(levels[0], vec![leaves.iter().sum::<i128>()]);
        for (l, size) in s.level_sizes().iter().enumerate() {
            assert_eq!(levels[l].len(), *size);
            assert_eq!(levels[l].iter().sum::<i128>(), levels[0][0]);
        }
    }

    /// Brute-force weighted least squares on a small tree: the two-pass estimate must equal it.
    #[test]
    fn the_two_pass_estimate_is_weighted_least_squares() {
        let s = TreeShape { factors: vec![3, 2] };
        let sizes = s.level_sizes();
        let y: Vec<Vec<f64>> = vec![vec![20.0], vec![5.5, 9.0, 4.0], vec![1.0, 3.0, 4.5, 2.0, 0.5, 4.0]];
        let var = [4.0, 1.5, 0.7];
        let u = s.estimate_leaves(&y, &var);
        // Normal equations over the 6 leaf unknowns: every node is the sum of its leaves.
        let leaves = 6;
        let mut a = [[0.0f64; 6]; 6];
        let mut rhs = [0.0f64; 6];
        for (l, size) in sizes.iter().enumerate() {
            let width = leaves / size;
            for (node, yv) in y[l].iter().enumerate() {
                let cols: Vec<usize> = (node * width..(node + 1) * width).collect();
                for &i in &cols {
                    rhs[i] += yv / var[l];
                    for &j in &cols {
                        a[i][j] += 1.0 / var[l];
                    }
                }
            }
        }
        // Gaussian elimination.
        for c in 0..leaves {
            let p = (c..leaves).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs())).unwrap();
            a.swap(c, p);
            rhs.swap(c, p);
            let pivot = a[c];
            for r in 0..leaves {
                if r != c {
                    let f = a[r][c] / pivot[c];
                    for (x, p) in a[r].iter_mut().zip(&pivot).take(leaves) {
                        *x -= f * p;
                    }
                    rhs[r] -= f * rhs[c];
                }
            }
        }
        for i in 0..leaves {
            let exact = rhs[i] / a[i][i];
            assert!((u[i] - exact).abs() < 1e-9, "leaf {i}: {} vs {exact}", u[i]);
        }
        // Negative control: equal weights give a different answer here.
        let equal = s.estimate_leaves(&y, &[1.0, 1.0, 1.0]);
        assert!(equal.iter().zip(&u).any(|(a, b)| (a - b).abs() > 1e-3));
    }

    #[test]
    fn noiseless_counts_come_back_exactly() {
        let s = TreeShape::for_leaves_log2(9);
        let leaves: Vec<i128> = (0..512).map(|i| (i * 7919) % 13).collect();
        let y: Vec<Vec<f64>> = s.level_counts(&leaves).iter().map(|l| l.iter().map(|&c| c as f64).collect()).collect();
        let u = s.estimate_leaves(&y, &vec![2.0; s.levels() + 1]);
        for (a, b) in u.iter().zip(&leaves) {
            assert!((a - *b as f64).abs() < 1e-9);
        }
    }
}
