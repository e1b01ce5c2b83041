//! Tests of the parent module.

use super::*;
use crate::mechanism::noise::calibration::CalibrationError;

fn spec() -> KdeSpec {
    KdeSpec {
        grid: Grid { lo: 0.0, hi: 1.0, points: 201 },
        bandwidth: 0.05,
        epsilon: 1.0,
        delta: 1e-6,
        calibration: Calibration::Analytic,
        normalise: Normalise::Rescale,
    }
}

#[test]
fn privacy_map_uses_unit_sensitivity() {
    let m = KdeMechanism::new(spec()).unwrap();
    assert!(m.layout().is_binned());
    // Δ of the lifted coordinates is 1 up to the (1 + e^-50) periodisation and slack.
    assert!((m.stat_sensitivity() - 1.0).abs() < 1e-9, "{}", m.stat_sensitivity());
    // σ = 4.5309 (discrete zCDP calibration at ε = 1, δ = 1e-6), rounded up on the
    // lattice by at most a factor 1 + 1/σ_L.
    let s = m.sigma();
    assert!((4.53087..4.53089).contains(&s), "{s}");
    let classic = KdeMechanism::sigma_for(&KdeSpec { calibration: Calibration::Classic, ..spec() }).unwrap();
    assert!((5.38677..5.3868).contains(&classic), "{classic}");
    let bad = KdeMechanism::sigma_for(&KdeSpec { calibration: Calibration::Classic, epsilon: 2.0, ..spec() });
    assert!(matches!(bad, Err(MechanismError::Calibration(CalibrationError::ClassicNeedsSmallEpsilon(_)))));
}

#[test]
fn a_units_bound_scales_the_noise_by_rows_times_sqrt_groups() {
    let row = KdeMechanism::new(spec()).unwrap().sigma();
    for (rows, groups) in [(1, 1), (4, 1), (4, 9), (100, 2)] {
        let c = Contribution::new(rows, groups).unwrap();
        let s = KdeMechanism::with_contribution(spec(), c).unwrap().sigma();
        let want = row * rows as f64 * (groups as f64).sqrt();
        // Exact up to the lattice rounding of the variance (relative 1e-6 here).
        assert!(s >= want * (1.0 - 1e-6) && s < want * (1.0 + 1e-4), "{rows}×√{groups}: {s} vs {want}");
    }
    // Negative control: the bound is not ignored.
    let c = Contribution::new(4, 1).unwrap();
    assert!(KdeMechanism::with_contribution(spec(), c).unwrap().sigma() > 3.9 * row);
}

#[test]
fn noiseless_release_is_the_normalised_kde_with_the_right_mass() {
    let m = KdeMechanism::new(spec()).unwrap();
    let xs: Vec<f64> = (0..400).map(|i| 0.3 + 0.4 * (i as f64 / 399.0)).collect();
    let mut st = m.layout().empty_state();
    m.layout().add_all(&mut st, &xs);
    let r = m.release::<rand::rngs::ChaCha20Rng>(&st, None);
    let d = r.density.unwrap();
    assert!((trapezoid(&d, 0.005) - 1.0).abs() < 1e-12);
    // All 400 points lie ≥ 0.2 = 4h inside [0, 1], so their mass is almost entirely inside.
    assert!((r.mass - 400.0).abs() < 0.5, "mass {}", r.mass);
}

#[test]
fn too_little_mass_gives_null_density_not_an_error() {
    let m = KdeMechanism::new(spec()).unwrap();
    let st = m.layout().empty_state();
    let r = m.release::<rand::rngs::ChaCha20Rng>(&st, None);
    assert_eq!(r.density, None);
    assert_eq!(r.mass, 0.0);
    // Negative noisy sums (possible with an empty table) are handled the same way.
    let r = m.post_process(&vec![-3.0; 201]);
    assert_eq!(r.density, None);
    assert!(r.mass < 0.0);
}

#[test]
fn nonneg_clamps_before_normalising() {
    let m = KdeMechanism::new(spec()).unwrap();
    let mut s = vec![10.0; 201];
    s[3] = -50.0;
    let r = m.post_process(&s);
    let d = r.density.unwrap();
    assert_eq!(d[3], 0.0);
    assert!((trapezoid(&d, 0.005) - 1.0).abs() < 1e-12);
    let m2 = KdeMechanism::new(KdeSpec { normalise: Normalise::Raw, ..spec() }).unwrap();
    assert!(m2.post_process(&s).density.unwrap()[3] < 0.0);
}

#[test]
fn the_projection_is_the_closest_density_on_the_grid() {
    let m = KdeMechanism::new(KdeSpec { normalise: Normalise::Project, ..spec() }).unwrap();
    let xs: Vec<f64> = (0..201).map(|k| k as f64 / 200.0).collect();
    // A noisy bump with negative tails.
    let s: Vec<f64> = xs
        .iter()
        .enumerate()
        .map(|(k, x)| 50.0 * (-(x - 0.5f64).powi(2) / 0.01).exp() - 3.0 + (k % 7) as f64)
        .collect();
    let r = m.post_process(&s);
    let f = r.density.clone().unwrap();
    assert!(f.iter().all(|v| *v >= 0.0));
    assert!((trapezoid(&f, 0.005) - 1.0).abs() < 1e-12, "{}", trapezoid(&f, 0.005));
    assert!(r.shift > 0.0);
    // f = max(g − c, 0): on the support it is g shifted by c; off it, g ≤ c.
    let z = trapezoid(&s, 0.005);
    for (fk, sk) in f.iter().zip(&s) {
        let g = sk / z;
        if *fk > 0.0 {
            assert!((fk - (g - r.shift)).abs() < 1e-12);
        } else {
            assert!(g <= r.shift + 1e-12);
        }
    }
    // Closer to g (discrete L2) than clamp-and-rescale, which is also a density.
    let rescaled = KdeMechanism::new(spec()).unwrap().post_process(&s).density.unwrap();
    let dist = |d: &[f64]| d.iter().zip(&s).map(|(a, b)| (a - b / z).powi(2)).sum::<f64>();
    assert!(dist(&f) < dist(&rescaled), "{} vs {}", dist(&f), dist(&rescaled));
    // A nonnegative g is its own projection.
    let pos: Vec<f64> = xs.iter().map(|x| 1.0 + x).collect();
    let rp = m.post_process(&pos);
    assert!(rp.shift.abs() < 1e-12, "{}", rp.shift);
}

#[test]
fn the_noise_band_covers_sampled_noise_and_half_of_it_does_not() {
    use rand::SeedableRng;
    // Through the real discrete Gaussian sampler: over 2 000 releases of one state, the
    // sup over the grid of |S̃ − S| stays inside the level-0.05 band in ≥ 94 % of them;
    // a band 20 % narrower under-covers.
    for bandwidth in [0.05, 0.004] {
        let m = KdeMechanism::new(KdeSpec { bandwidth, ..spec() }).unwrap();
        let xs: Vec<f64> = (0..300).map(|i| (i as f64 * 0.618).fract()).collect();
        let mut st = m.layout().empty_state();
        m.layout().add_all(&mut st, &xs);
        let exact = m.noisy_sum::<rand::rngs::ChaCha20Rng>(&st, None);
        let half = m.noise_threshold(0.05) * m.sigma();
        let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(12);
        let (cov, neg) = bands::coverage(2000, || {
            let noisy = m.noisy_sum(&st, Some(&mut rng));
            noisy.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / half
        });
        eprintln!("kde noise band h = {bandwidth}: coverage {cov}, 20 %-narrower control {neg}");
        assert!(cov >= 0.94, "h = {bandwidth}: coverage {cov}");
        assert!(neg < 0.94, "h = {bandwidth}: a band 20 % narrower covers {neg}");
        // In density units the band is the same threshold over the release's normaliser.
        let r = m.post_process(&exact);
        let b = m.bands(&r, 0.05).unwrap();
        assert!((b.noise[7] - half / r.normaliser).abs() < 1e-12 * b.noise[7]);
        assert!(b.total.unwrap().iter().zip(&b.noise).all(|(t, n)| t >= n));
    }
}

fn pure(spec: KdeSpec) -> KdeMechanism {
    KdeMechanism::new(KdeSpec { delta: 0.0, ..spec }).unwrap()
}

#[test]
fn the_pure_epsilon_release_has_l1_sensitivity_one_through_the_real_path() {
    // Neighbouring tables (one value added, anywhere — in range, at a bin edge, far
    // outside) move the node counts by exactly one unit of L1 mass, or none if dropped.
    let m = pure(spec());
    assert!(m.is_pure_epsilon());
    let base: Vec<f64> = (0..500).map(|i| (i as f64 * 0.618).fract()).collect();
    let mut st = m.layout().empty_state();
    m.layout().add_all(&mut st, &base);
    let w0: Vec<f64> = m.lifted(&st).iter().map(|d| d.to_f64()).collect();
    for extra in [0.5, 0.123_456_7, 0.0, 1.0, -0.39, 1.39, 7.0] {
        let mut st1 = st.clone();
        m.layout().add_all(&mut st1, &[extra]);
        let w1: Vec<f64> = m.lifted(&st1).iter().map(|d| d.to_f64()).collect();
        let l1: f64 = w0.iter().zip(&w1).map(|(a, b)| (a - b).abs()).sum();
        let dropped = !(-0.4..=1.4).contains(&extra);
        let want = if dropped { 0.0 } else { 1.0 };
        assert!((l1 - want).abs() < 1e-9, "x = {extra}: L1 change {l1}");
    }
    // The Laplace scale is the L1 sensitivity (1 + slack) over ε.
    assert!((m.sigma() / std::f64::consts::SQRT_2 - 1.0).abs() < 1e-6, "{}", m.sigma());
    // Node spacing ≤ h/2 and > h/4.
    let n = m.laplace.as_ref().unwrap();
    assert!(n.spacing <= 0.025 + 1e-12 && n.spacing > 0.0125, "{}", n.spacing);
    // A bandwidth too small for bins is refused with a precise message, never a panic.
    let tiny = KdeMechanism::new(KdeSpec { delta: 0.0, bandwidth: 1e-7, ..spec() }).unwrap_err().to_string();
    assert!(tiny.contains("pure-ε KDE (delta => 0) needs a bandwidth of at least"), "{tiny}");
}

#[test]
fn the_pure_epsilon_noise_band_covers_and_half_of_it_does_not() {
    use rand::SeedableRng;
    let m = pure(spec());
    let xs: Vec<f64> = (0..300).map(|i| (i as f64 * 0.618).fract()).collect();
    let mut st = m.layout().empty_state();
    m.layout().add_all(&mut st, &xs);
    let exact = m.noisy_sum::<rand::rngs::ChaCha20Rng>(&st, None);
    let r = m.post_process(&exact);
    let band = m.bands(&r, 0.05).unwrap().noise;
    // Back to kernel-sum units.
    let half: Vec<f64> = band.iter().map(|b| b * r.normaliser).collect();
    let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(21);
    let (cov, neg) = bands::coverage(2000, || {
        let noisy = m.noisy_sum(&st, Some(&mut rng));
        noisy.iter().zip(&exact).zip(&half).map(|((a, b), w)| (a - b).abs() / w).fold(0.0, f64::max)
    });
    eprintln!("pure-ε kde noise band: coverage {cov}, 20 %-narrower control {neg}");
    assert!(cov >= 0.94, "coverage {cov}");
    assert!(neg < 0.94, "a band 20 % narrower covers {neg}");
}

#[test]
fn at_equal_epsilon_the_pure_release_is_quieter_than_the_gaussian_one() {
    // The noise each adds to the kernel sum (σ² vs σ_L²·ΣK²) and the resulting error of
    // the released density against the noiseless one, n = 1000, ε = 1 (δ = 1e-6 for the
    // Gaussian release). Negative control: at ε = 1 but δ = 0.3 the Gaussian one is quieter.
    use rand::SeedableRng;
    let g = KdeMechanism::new(spec()).unwrap();
    let l = pure(spec());
    assert!(l.noise_variance() < g.noise_variance(), "{} vs {}", l.noise_variance(), g.noise_variance());
    let loose = KdeMechanism::new(KdeSpec { delta: 0.3, ..spec() }).unwrap();
    assert!(loose.noise_variance() < l.noise_variance(), "{} vs {}", loose.noise_variance(), l.noise_variance());
    let xs: Vec<f64> = (0..1000).map(|i| 0.5 + 0.15 * ((i as f64 * 0.618).fract() - 0.5) * 2.0).collect();
    let ise = |m: &KdeMechanism| {
        let mut st = m.layout().empty_state();
        m.layout().add_all(&mut st, &xs);
        let truth = m.post_process(&m.noisy_sum::<rand::rngs::ChaCha20Rng>(&st, None)).density.unwrap();
        let mut rng = rand::rngs::ChaCha20Rng::seed_from_u64(4);
        (0..40)
            .map(|_| {
                let d = m.release(&st, Some(&mut rng)).density.unwrap();
                d.iter().zip(&truth).map(|(a, b)| (a - b).powi(2)).sum::<f64>() * 0.005
            })
            .sum::<f64>()
            / 40.0
    };
    let (eg, el) = (ise(&g), ise(&l));
    eprintln!("n = 1000, ε = 1: ISE Gaussian {eg:.4}, pure ε {el:.4}, ratio {:.2}", eg / el);
    assert!(el < eg, "{el} vs {eg}");
}

#[test]
fn an_iclp_band_is_simulated_only_on_circles_it_can_afford() {
    // The band's simulation is ≥ 500 syntheses on the circle: above ICLP_BAND_MAX_CIRCLE points
    // the release carries no band (public parameters decide), below it one.
    let with_density = |m: &KdeMechanism| {
        let xs: Vec<f64> = (0..400).map(|i| (i as f64 * 0.618).fract()).collect();
        let mut st = m.layout().empty_state();
        m.layout().add_all(&mut st, &xs);
        m.post_process(&m.noisy_sum::<rand::rngs::ChaCha20Rng>(&st, None))
    };
    let small = KdeMechanism::iclp(KdeSpec { delta: 0.0, ..spec() }, Contribution::ROW).unwrap();
    assert!(small.basis.m <= ICLP_BAND_MAX_CIRCLE);
    assert!(small.bands(&with_density(&small), 0.05).is_some());
    // Binned (the grid step below h) on a circle of ≥ 2^17 lattice points.
    let grid = Grid { lo: 0.0, hi: 1.0, points: 16384 };
    let wide =
        KdeMechanism::iclp(KdeSpec { delta: 0.0, bandwidth: 1.5e-4, grid, ..spec() }, Contribution::ROW).unwrap();
    assert!(wide.basis.m > ICLP_BAND_MAX_CIRCLE, "{}", wide.basis.m);
    let release = with_density(&wide);
    assert!(release.density.is_some());
    assert!(wide.bands(&release, 0.05).is_none());
}

#[test]
fn the_planned_state_covers_what_accumulating_rows_holds() {
    // Binned (the split buffer) and exact (the i64 buffer) layouts: a state holds its buffers
    // from the start (a first row allocates nothing), and planning must have counted them.
    for (grid, h) in [(Grid { lo: 0.0, hi: 1.0, points: 256 }, 0.02), (Grid { lo: 0.0, hi: 1e6, points: 100 }, 1e-3)] {
        let m = KdeMechanism::new(KdeSpec { grid, bandwidth: h, ..spec() }).unwrap();
        assert_eq!(m.layout().is_binned(), grid.points == 256);
        let mut acc = m.layout().accumulation();
        let before = acc.heap_size() as u64;
        m.layout().accumulate(&mut acc, &[0.5, 0.25, 0.75, 1e5]);
        let (planned, _) = m.memory_bytes();
        assert_eq!(acc.heap_size() as u64, before, "the buffers are allocated with the state");
        assert!(before > 16 * m.layout().state_len() as u64, "the totals and a buffer");
        assert!(acc.heap_size() as u64 <= planned, "{} held, {planned} planned", acc.heap_size());
    }
}

/// The band's root sum of squares agrees with `hypot` to a rounding or two, and does not overflow
/// where the squares would.
#[test]
fn the_bands_root_sum_square_is_hypot() {
    for (a, b) in [(0.0, 0.0), (1.0, 0.0), (0.0, 4.0), (3.0, 16.0), (1e-300, 1e-300), (2.5e7, 3.1e9), (1e149, 1e299)] {
        let want = f64::hypot(a, f64::sqrt(b));
        assert!((root_sum_square(a, b) - want).abs() <= 4.0 * f64::EPSILON * want, "{a} {b}");
    }
    for (a, b) in [(1e200, 1.0), (1.0, 1e305), (1e170, 1e302), (f64::MAX, f64::MAX)] {
        let r = root_sum_square(a, b);
        assert!(r.is_finite() && r == f64::hypot(a, b.sqrt()), "{a} {b}: {r}");
    }
    // Negative control: the plain formula overflows there.
    assert!(!(1e200f64 * 1e200 + 1.0).sqrt().is_finite());
}

/// The pure-ε release at the fixed bandwidth's nodes (h/2 apart), its statistic on the finer
/// bins `r` to a node (as the automatic bandwidth's is).
fn on_fine_bins(spec: KdeSpec) -> KdeMechanism {
    let spec = KdeSpec { delta: 0.0, ..spec };
    let layout = KdeLayout::new(spec.grid, spec.bandwidth).unwrap();
    let h = spec.bandwidth;
    KdeMechanism::pure_epsilon_on(spec, layout, Contribution::ROW, h / 2.0).unwrap()
}

/// The fixed bandwidth's pure-ε release counts each row straight onto its nodes: the same nodes
/// as the release that bins rows onto the finer bins and re-bins them (so a stored release
/// evaluates as before), the same node counts up to each row's 2^-40 rounding, and the same
/// noiseless curve — for values anywhere (bin and node edges, the range's ends, outside it). A
/// statistic on nodes one bin too far apart is caught.
#[test]
fn the_fixed_pure_epsilon_release_counts_rows_on_its_nodes() {
    let mut zones = 0;
    for spec in [
        spec(),
        KdeSpec { grid: Grid { lo: -0.2, hi: 1.2, points: 1024 }, bandwidth: 0.02, ..spec() },
        KdeSpec { grid: Grid { lo: 0.0, hi: 1.0, points: 4001 }, bandwidth: 0.05, ..spec() },
        KdeSpec { grid: Grid { lo: -3.0, hi: 40.0, points: 64 }, bandwidth: 0.4, ..spec() },
    ] {
        let (m, f) = (pure(spec.clone()), on_fine_bins(spec.clone()));
        let (n, fine) = (m.laplace.clone().unwrap(), f.laplace.clone().unwrap());
        assert_eq!(m.nodes(), f.nodes(), "the same nodes");
        assert_eq!((n.r, m.layout().state_len()), (1, n.nodes), "one entry per node");
        assert!(
            fine.r > 1 && f.layout().state_len() > (fine.r - 1) * n.nodes,
            "{} bins, r = {}",
            f.layout().state_len(),
            fine.r
        );
        let (lo, hi, h) = (spec.grid.lo, spec.grid.hi, spec.bandwidth);
        let (o, s) = (n.origin, n.spacing);
        let mut xs: Vec<f64> =
            (0..20_000).map(|i| lo - 9.0 * h + (i as f64 * 0.618_034).fract() * (hi - lo + 18.0 * h)).collect();
        // Node and fine-bin edges, the ends of the bins, the grid's ends, non-finite values.
        let bs = s / fine.r as f64;
        for j in [0, 1, 2, n.nodes / 2, n.nodes - 2, n.nodes - 1] {
            xs.extend([o + j as f64 * s, o + j as f64 * s + bs, o + (j as f64 + 0.5) * s]);
        }
        let last_fine = o + (f.layout().state_len() - 1) as f64 * bs;
        xs.extend([last_fine, last_fine + 0.5 * bs, lo, hi, f64::NAN, f64::INFINITY, -f64::INFINITY]);
        // Values between the last fine bin and the last node: kept on the nodes only.
        let kept = |layout: &KdeLayout, x: f64| {
            let (o, s, bins) = layout.bins().unwrap();
            let p = (x - o) * (1.0 / s);
            p >= 0.0 && p <= (bins - 1) as f64
        };
        let beyond = |x: f64| kept(m.layout(), x) && !kept(f.layout(), x);
        let inside: Vec<f64> = xs.iter().copied().filter(|&x| !beyond(x)).collect();
        let count = |m: &KdeMechanism, xs: &[f64]| {
            let mut st = m.layout().empty_state();
            m.layout().add_all(&mut st, xs);
            st
        };
        let lifted = |m: &KdeMechanism, st: &[i128]| -> Vec<f64> { m.lifted(st).iter().map(|d| d.to_f64()).collect() };
        let (st, fst) = (count(&m, &inside), count(&f, &inside));
        let (w, fw) = (lifted(&m, &st), lifted(&f, &fst));
        let worst = w.iter().zip(&fw).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst <= inside.len() as f64 * 2f64.powi(-39), "node counts differ by {worst}");
        let (c, fc) =
            (m.release::<rand::rngs::ChaCha20Rng>(&st, None), f.release::<rand::rngs::ChaCha20Rng>(&fst, None));
        let gap = c.density.unwrap().iter().zip(fc.density.unwrap()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(gap < 1e-9, "noiseless curves differ by {gap}");
        // Every value kept adds one row's mass: those past the last fine bin, not past the last
        // node, on the nodes only.
        let added = xs.iter().filter(|&&x| kept(m.layout(), x)).count() as f64
            - xs.iter().filter(|&&x| kept(f.layout(), x)).count() as f64;
        assert!(added >= 1.0 || n.nodes == (f.layout().state_len() - 1) / fine.r + 1, "{added}");
        let total = |v: Vec<f64>| v.iter().sum::<f64>();
        let gained = total(lifted(&m, &count(&m, &xs))) - total(lifted(&f, &count(&f, &xs)));
        assert!((gained - added).abs() < 1e-6, "{gained} vs {added}");
        // Neighbouring tables differing by one value where only the nodes count it (past the last
        // fine bin), at the last node, just past it, and NaN: the node counts move by exactly one
        // row's mass in L1, or not at all.
        let last_node = o + (n.nodes - 1) as f64 * s;
        let l1 = |extra: f64| {
            let (a, b) = (count(&m, &inside), count(&m, &[inside.as_slice(), &[extra]].concat()));
            lifted(&m, &a).iter().zip(lifted(&m, &b)).map(|(x, y)| (x - y).abs()).sum::<f64>()
        };
        if last_node > last_fine {
            let zone = 0.5 * (last_fine + last_node);
            assert!(beyond(zone));
            zones += 1;
            assert!((l1(zone) - 1.0).abs() < 1e-9, "{}", l1(zone));
        }
        assert!(!kept(m.layout(), last_node + 0.5 * s) && !kept(m.layout(), f64::NAN));
        for extra in [last_node, last_node + 0.5 * s, f64::NAN, lo, hi] {
            let want = if kept(m.layout(), extra) { 1.0 } else { 0.0 };
            assert!((l1(extra) - want).abs() < 1e-9, "x = {extra}: {} (want {want})", l1(extra));
        }
        // Control: nodes one fine bin farther apart are a different statistic.
        let wrong = f.layout().coarsened(fine.r + 1).unwrap();
        let mut wst = wrong.empty_state();
        wrong.add_all(&mut wst, &xs);
        let moved = wst
            .iter()
            .zip(&st)
            .map(|(&a, &b)| ((a - b) as f64 / crate::mechanism::density::kde::FIXED_ONE).abs())
            .fold(0.0, f64::max);
        assert!(moved > 1.0, "{moved}");
    }
    assert!(zones >= 1, "no geometry has values only its nodes count");
}

/// The node counts a pure-ε release lifts are the re-binning `Σ v_l·weight` in exact integers:
/// equal to the overflow-checked sums on states of any size a table within `ROW_LIMIT` rows
/// reaches, and finite (no overflow, no panic) on states beyond it.
#[test]
fn the_pure_epsilon_rebinning_is_exact_and_saturates() {
    // The re-binning of bins `r > 1` to a node: the automatic bandwidth's statistic (the
    // fixed bandwidth's counts rows on its nodes, r = 1).
    let m = on_fine_bins(spec());
    let n = m.laplace.clone().unwrap();
    assert!(n.r > 1, "{}", n.r);
    let reference = |state: &[i128]| -> Vec<f64> {
        let mut c = vec![0i128; n.nodes];
        for (l, &v) in state.iter().enumerate() {
            let (i, r) = (l / n.r, (l % n.r) as i128);
            c[i] = c[i].saturating_add(v.saturating_mul(n.r as i128 - r));
            if r > 0 {
                c[i + 1] = c[i + 1].saturating_add(v.saturating_mul(r));
            }
        }
        let inv_r = DD::from_i128(n.r as i128).recip();
        c.iter().map(|&u| DD::from_i128(u).scale_pow2(-40).mul(inv_r).to_f64()).collect()
    };
    let len = m.layout().empty_state().len();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for scale in [1i128, 1 << 40, 1 << 60, 1 << 70] {
        // Entries up to 2^23·scale ≤ 2^93.
        let state: Vec<i128> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x as i64 as i128 >> 40) * scale
            })
            .collect();
        let got: Vec<f64> = m.lifted(&state).iter().map(|d| d.to_f64()).collect();
        assert_eq!(got, reference(&state), "scale {scale}");
    }
    // Beyond any table's reach the counts saturate instead of overflowing.
    let extreme: Vec<i128> = (0..len).map(|l| if l % 3 == 0 { i128::MIN } else { i128::MAX }).collect();
    assert!(m.lifted(&extreme).iter().all(|d| d.to_f64().is_finite()));
    // Negative control: an unchecked multiply of those entries overflows.
    assert!(i128::MAX.checked_mul(n.r as i128).is_none());
}

/// The projection's shift sums the values from the largest down, equal values in the order of
/// their positions: bit-equal to the stable sort of positions, on values with many ties and
/// unequal weights.
#[test]
fn the_projection_orders_ties_by_position() {
    let reference = |g: &[f64], w: &[f64], cell: f64, ties_reversed: bool| -> f64 {
        let mut order: Vec<usize> = (0..g.len()).collect();
        order.sort_by(|&a, &b| g[b].total_cmp(&g[a]));
        if ties_reversed {
            order.reverse();
            order.sort_by(|&a, &b| g[b].total_cmp(&g[a]));
        }
        let (mut big_w, mut big_g) = (0.0, 0.0);
        for (j, &k) in order.iter().enumerate() {
            big_w += w[k];
            big_g += w[k] * g[k];
            let c = (big_g - 1.0 / cell) / big_w;
            if c >= order.get(j + 1).map_or(f64::NEG_INFINITY, |&i| g[i]) {
                return c.max(0.0);
            }
        }
        0.0
    };
    let (mut differs, mut x) = (0, 12345u64);
    for case in 0..400 {
        let n = 3 + case % 60;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as f64 / (1u64 << 31) as f64
        };
        // Few distinct values, some negative (ties everywhere, a positive shift), weights of a
        // trapezoid or of a product rule, and a cell that makes the integral 1.
        let g: Vec<f64> = (0..n).map(|_| (next() * 5.0).floor() * 0.7 - 0.6).collect();
        let w: Vec<f64> = (0..n).map(|_| [0.25, 0.5, 1.0, 0.3][(next() * 4.0) as usize]).collect();
        let integral = g.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>();
        if integral <= 0.0 {
            continue;
        }
        let cell = 1.0 / integral;
        let got = projection_shift_weighted(&g, &w, cell);
        assert_eq!(got.to_bits(), reference(&g, &w, cell, false).to_bits(), "case {case}");
        differs += usize::from(got.to_bits() != reference(&g, &w, cell, true).to_bits());
    }
    // Negative control: summing ties in the other order changes some shifts' last bits.
    assert!(differs > 0, "the tie order never mattered: the test cannot tell orders apart");
}

/// The projection's sort key orders values as `total_cmp` does, signed zeros, infinities and
/// NaNs included.
#[test]
fn the_projections_sort_key_is_total_cmp() {
    let values = [
        f64::NEG_INFINITY,
        -1e300,
        -1.5,
        -f64::MIN_POSITIVE,
        -0.0,
        0.0,
        5e-324,
        0.1,
        2.0,
        f64::INFINITY,
        f64::NAN,
        -f64::NAN,
    ];
    for a in values {
        for b in values {
            let key = |v: f64| super::super::normalise::total_order_key(v);
            assert_eq!(key(a).cmp(&key(b)), a.total_cmp(&b), "{a} {b}");
        }
    }
}

/// A pure-ε release's kernel sum at a point, summed in lanes, is the sum of every tap (full
/// lanes and the rest), at any offset into the node counts.
#[test]
fn a_tap_sum_adds_every_tap() {
    let w: Vec<f64> = (0..40).map(|i| ((i * 37 % 11) as f64 - 4.5) * 1.25).collect();
    for len in 0..=13 {
        for first in [0, 3, 20] {
            let t = Taps { first, weights: (0..len).map(|i| 0.5 + i as f64 * 0.25).collect() };
            let plain: f64 = (0..len).map(|i| t.weights[i] * w[first + i]).sum();
            let got = tap_sum(&t, &w);
            assert!((got - plain).abs() <= 1e-12 * (1.0 + plain.abs()), "len {len} at {first}: {got} vs {plain}");
        }
    }
    // Negative control: a sum that dropped the last partial lane would differ (len 7, first 3).
    let t = Taps { first: 3, weights: (0..7).map(|i| 0.5 + i as f64 * 0.25).collect() };
    let full_lanes: f64 = (0..4).map(|i| t.weights[i] * w[3 + i]).sum();
    assert!((tap_sum(&t, &w) - full_lanes).abs() > 1e-6);
}

#[test]
fn the_circle_is_synthesised_with_one_plan_per_basis_that_gives_a_fresh_plans_bits() {
    use rustfft::num_complex::Complex;
    let m = KdeMechanism::new(spec()).unwrap();
    let basis = m.basis();
    let kept = basis.inverse_fft();
    assert!(Arc::ptr_eq(&kept, &basis.inverse_fft()), "planned once per basis");
    // The kept plan and a fresh one of the same size give the same bits.
    let fresh = rustfft::FftPlanner::new().plan_fft_inverse(basis.circle());
    let mut a: Vec<Complex<f64>> =
        (0..basis.circle()).map(|k| Complex::new((k % 5) as f64 - 2.0, (k % 3) as f64)).collect();
    let (mut b, input) = (a.clone(), a.clone());
    kept.process(&mut a);
    fresh.process(&mut b);
    assert!(a.iter().zip(&b).all(|(x, y)| x.re.to_bits() == y.re.to_bits() && x.im.to_bits() == y.im.to_bits()));
    // Control: the transform did something (the input was not left as it was).
    assert!(a.iter().zip(&input).any(|(x, i)| x != i));
}
