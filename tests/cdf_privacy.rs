//! The private CDF's privacy through its real code path: one row (one unit) moves one node per
//! level by exactly its contribution, wherever it falls (inside, on leaf edges, outside the
//! range, non-finite); the noise actually sampled implies no more than the charged ε (ρ); and an
//! empirical pure-ε audit of the adaptive release on neighbours stays within ε, with a control that
//! the same audit convicts a release whose noise is half what it claims.

use dpcurve::mechanism::distribution::release::{
    CdfMechanism, CdfNoise, CdfSpec, ROOT_SD, ROOT_SHARES, Resolution, root_share,
};
use dpcurve::mechanism::distribution::tree::TreeShape;
use dpcurve::mechanism::noise::calibration::zcdp_rho;
use dpcurve::mechanism::{Calibration, Contribution};
use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;

fn mechanism(noise: CdfNoise, epsilon: f64, resolution: Resolution, contribution: Contribution) -> CdfMechanism {
    let spec = CdfSpec {
        lo: -1.0,
        hi: 2.0,
        points: 16,
        resolution,
        noise,
        epsilon,
        delta: if noise == CdfNoise::Gaussian { 1e-6 } else { 0.0 },
        calibration: Calibration::Analytic,
    };
    CdfMechanism::new(spec, contribution).unwrap()
}

fn leaves_of(m: &CdfMechanism, xs: &[f64]) -> Vec<i128> {
    let mut s = m.statistic();
    m.accumulate(&mut s, xs);
    s.totals().to_vec()
}

#[test]
fn one_row_moves_one_node_per_level_by_one() {
    let m = mechanism(CdfNoise::Laplace, 1.0, Resolution::Auto { max_log2: 12 }, Contribution::ROW);
    let base: Vec<f64> = (0..500).map(|i| -1.2 + 3.4 * (i as f64 * 0.618).fract()).collect();
    let step = 3.0 / 4096.0;
    let extra = [
        -1.0,
        2.0,
        -1.0 + 17.0 * step,
        -1.0 + 17.0 * step - 1e-17,
        0.5,
        -1e300,
        1e300,
        f64::INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
    ];
    let before = leaves_of(&m, &base);
    for x in extra {
        let mut with = base.clone();
        with.push(x);
        let after = leaves_of(&m, &with);
        for k in 1..=12 {
            let shape = TreeShape::for_leaves_log2(k);
            let coarse = |l: &[i128]| -> Vec<i128> { l.chunks_exact(1 << (12 - k)).map(|c| c.iter().sum()).collect() };
            let (a, b) = (shape.level_counts(&coarse(&before)), shape.level_counts(&coarse(&after)));
            for (la, lb) in a.iter().zip(&b) {
                let l1: i128 = la.iter().zip(lb).map(|(p, q)| (p - q).abs()).sum();
                let want = i128::from(x.is_finite());
                assert_eq!(l1, want, "x = {x}, k = {k}: level change {l1}");
            }
        }
    }
}

#[test]
fn the_sampled_noise_implies_at_most_the_charged_privacy() {
    for contribution in [Contribution::ROW, Contribution::new(3, 4).unwrap()] {
        for epsilon in [1e-3, 0.1, 0.5, 1.0, 7.5] {
            let m = mechanism(CdfNoise::Laplace, epsilon, Resolution::Auto { max_log2: 16 }, contribution);
            for levels in 1..=4 {
                let implied = m.implied_privacy(levels);
                assert!(implied <= epsilon && implied > epsilon * (1.0 - 1e-9), "{epsilon} {levels}: {implied}");
            }
            let g = mechanism(CdfNoise::Gaussian, epsilon, Resolution::Auto { max_log2: 16 }, contribution);
            let rho = zcdp_rho(Calibration::Analytic, epsilon, 1e-6).unwrap();
            for levels in 1..=4 {
                let implied = g.implied_privacy(levels);
                // The discrete Gaussian's variance parameter is rounded up to a multiple of a power of
                // two ≥ its square root (less ρ, never more): up to ≈ 30 % at σ² ≈ 25 (ε = 1, one
                // row), under 3 % from σ² ≈ 2 500; at ε = 7.5 the root's σ² ≈ 10.6 becomes 12 and one
                // level's 0.56 becomes 1 (46 % unspent).
                let floor = if epsilon >= 5.0 {
                    0.5
                } else if epsilon >= 1.0 {
                    0.6
                } else {
                    0.95
                };
                assert!(implied <= rho && implied > rho * floor, "{epsilon} {levels}: {implied} vs ρ {rho}");
            }
        }
    }
}

/// The count's share is a function of the public budget alone: 5 % where a smaller one would make
/// the count noisier than `ROOT_SD` per unit, down to 2 % where it would not; the sampled root's
/// scale is the one that share calibrates, and a stored share outside the range is refused.
#[test]
fn the_counts_share_follows_the_budget() {
    let (least, most) = ROOT_SHARES;
    for (epsilon, want) in [(1e-12, most), (0.1, most), (0.4, most), (0.5, 0.04), (1.0, least), (1000.0, least)] {
        let share = root_share(CdfNoise::Laplace, epsilon, 0.0);
        assert!((share - want).abs() < 1e-12, "ε = {epsilon}: share {share}, want {want}");
        for contribution in [Contribution::ROW, Contribution::new(3, 4).unwrap()] {
            let m = mechanism(CdfNoise::Laplace, epsilon, Resolution::Auto { max_log2: 12 }, contribution);
            assert_eq!(m.root_share(), share);
            let (root, _) = m.laplace_scales(1).unwrap();
            let exact = contribution.count_l1() as f64 / (share * epsilon);
            assert!(root >= exact && root <= exact * (1.0 + 1e-9), "ε = {epsilon}: root scale {root} vs {exact}");
            let sd_per_unit = std::f64::consts::SQRT_2 * root / contribution.count_l1() as f64;
            assert!(sd_per_unit <= ROOT_SD * (1.0 + 1e-9) || share == most, "ε = {epsilon}: count sd {sd_per_unit}");
        }
    }
    // Gaussian noise: ρ decides; the same bound on the count's sd per unit of L2 sensitivity.
    for (epsilon, want) in [(0.01, most), (1.0, least), (1000.0, least)] {
        let rho = zcdp_rho(Calibration::Analytic, epsilon, 1e-6).unwrap();
        let share = root_share(CdfNoise::Gaussian, epsilon, rho);
        assert!((share - want).abs() < 1e-12, "Gaussian ε = {epsilon}: share {share}");
        assert_eq!(
            mechanism(CdfNoise::Gaussian, epsilon, Resolution::Auto { max_log2: 12 }, Contribution::ROW).root_share(),
            share
        );
    }
    for bad in [0.0, 0.01, 0.06, f64::NAN, f64::INFINITY] {
        let m = mechanism(CdfNoise::Laplace, 1.0, Resolution::Auto { max_log2: 12 }, Contribution::ROW);
        let e = CdfMechanism::with_root_share(m.spec().clone(), Contribution::ROW, Some(bad)).unwrap_err();
        assert!(e.contains("the count's share must be in [0.02, 0.05]"), "{bad}: {e}");
    }
    // A stored release's share is used as given, whatever the rule says today.
    let m = mechanism(CdfNoise::Laplace, 1.0, Resolution::Auto { max_log2: 12 }, Contribution::ROW);
    let legacy = CdfMechanism::with_root_share(m.spec().clone(), Contribution::ROW, Some(0.05)).unwrap();
    assert_eq!(legacy.root_share(), 0.05);
    assert!(legacy.laplace_scales(1).unwrap().0 < m.laplace_scales(1).unwrap().0);
}

/// The exact privacy loss of an output under neighbouring leaf counts `a` and `b` (Laplace noise
/// with the scales the release claims), given the resolution it released at.
fn loss(m: &CdfMechanism, a: &[i128], b: &[i128], k: u32, out: &[Vec<f64>]) -> f64 {
    let shape = TreeShape::for_leaves_log2(k);
    let (root, level) = m.laplace_scales(shape.levels()).unwrap();
    let coarse = |l: &[i128]| -> Vec<i128> { l.chunks_exact(l.len() >> k).map(|c| c.iter().sum()).collect() };
    let (la, lb) = (shape.level_counts(&coarse(a)), shape.level_counts(&coarse(b)));
    let mut total = 0.0;
    for (l, ((ya, yb), y)) in la.iter().zip(&lb).zip(out).enumerate() {
        let scale = if l == 0 { root } else { level };
        for ((p, q), v) in ya.iter().zip(yb).zip(y) {
            total += ((v - *q as f64).abs() - (v - *p as f64).abs()) / scale;
        }
    }
    total
}

/// ε lower bound from the events {loss ≥ t}: ln((p_a − 4 SE)/(p_b + 4 SE)) at three thresholds.
fn audit(claimed: &CdfMechanism, drawn: &CdfMechanism, a: &[i128], b: &[i128], n: usize, seed: u64) -> f64 {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let sample = |from: &[i128], rng: &mut ChaCha20Rng| {
        let (k, out) = drawn.release(from, Some(rng));
        loss(claimed, a, b, k, &out)
    };
    let mut pilot: Vec<f64> = (0..n / 10).map(|_| sample(a, &mut rng)).collect();
    pilot.sort_by(f64::total_cmp);
    let thresholds: Vec<f64> = [0.9, 0.97, 0.99].iter().map(|q| pilot[(q * pilot.len() as f64) as usize]).collect();
    let mut counts = [[0usize; 3]; 2];
    for (side, from) in [a, b].into_iter().enumerate() {
        for _ in 0..n {
            let l = sample(from, &mut rng);
            for (c, t) in counts[side].iter_mut().zip(&thresholds) {
                *c += usize::from(l >= *t);
            }
        }
    }
    (0..3)
        .map(|i| {
            let (pa, pb) = (counts[0][i] as f64 / n as f64, counts[1][i] as f64 / n as f64);
            let (sa, sb) = ((pa * (1.0 - pa) / n as f64).sqrt(), (pb * (1.0 - pb) / n as f64).sqrt());
            ((pa - 4.0 * sa).max(1e-300) / (pb + 4.0 * sb).max(1e-300)).ln()
        })
        .fold(f64::NEG_INFINITY, f64::max)
}

#[test]
fn an_empirical_audit_of_the_adaptive_release_stays_within_epsilon() {
    // Small counts so the released resolution varies between draws (the adaptive step is audited
    // too): at ε = 1 and ≈ 60 rows the tree has 8 leaves, sometimes 16.
    let epsilon = 1.0;
    let m = mechanism(CdfNoise::Laplace, epsilon, Resolution::Auto { max_log2: 6 }, Contribution::ROW);
    let xs: Vec<f64> = (0..60).map(|i| -1.0 + 3.0 * (i as f64 * 0.377).fract()).collect();
    let a = leaves_of(&m, &{
        let mut v = xs.clone();
        v.push(0.3);
        v
    });
    let b = leaves_of(&m, &xs);
    let found = audit(&m, &m, &a, &b, 40_000, 3);
    assert!(found <= epsilon, "the audit found ε ≥ {found} > {epsilon}");
    // Control: a release drawing half the noise it claims is convicted by the same audit.
    let loud = mechanism(CdfNoise::Laplace, 2.0 * epsilon, Resolution::Auto { max_log2: 6 }, Contribution::ROW);
    let convicted = audit(&m, &loud, &a, &b, 40_000, 4);
    assert!(convicted > epsilon, "the audit has no power: {convicted}");
}

/// The budget's accepted edges (ε = 1e-12 and 1000) with the largest contribution a unit may have:
/// the root's share makes its noise scale the largest of the release, and it must still calibrate
/// (no ∞/NaN reaches the lattice) and release only finite counts, for both noise laws.
#[test]
fn the_budget_edges_calibrate_and_release_finite_counts() {
    let heaviest = Contribution::new(dpcurve::mechanism::contribution::MAX_UNIT_ROWS, 1_000_000).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(0xED6E);
    for noise in [CdfNoise::Laplace, CdfNoise::Gaussian] {
        for epsilon in [1e-12, 1000.0] {
            for contribution in [Contribution::ROW, heaviest] {
                let m = mechanism(noise, epsilon, Resolution::Auto { max_log2: 12 }, contribution);
                let leaves = vec![3i128; m.statistic_leaves()];
                let (k, out) = m.release(&leaves, Some(&mut rng));
                assert!((3..=12).contains(&k), "{noise:?} ε = {epsilon}: 2^{k} leaves");
                assert!(
                    out.iter().flatten().all(|v| v.is_finite()),
                    "{noise:?} ε = {epsilon} {contribution:?}: a non-finite noisy count"
                );
            }
        }
    }
}
