#!/usr/bin/env python3
"""Peers of private_kde for accuracy (not speed), for benches/utility.rs.

    python3 benches/utility_peers.py --venv DIR --jobs JOBS.json

Creates a virtual environment in DIR on first use and installs OpenDP, diffprivlib, pyarrow and
numpy into it from PyPI, then re-runs itself there. JOBS.json is written by the utility bench:

    {"grid": [x, ...], "jobs": [{"file": F.parquet, "key": "...", "lo": lo, "hi": hi,
      "truth": [f(x), ...], "epsilons": [...], "quantile_epsilons": [...]}, ...]}

For every job and ε it prints one JSON line per (peer, public parameter):
    {"key": ..., "epsilon": e, "peer": name, "param": p, "ise": v}
and, for every ε in quantile_epsilons, one line per (quantile peer, parameter):
    {"key": ..., "epsilon": e, "peer": name, "param": p, "rank_error": v}
The bench picks each peer's best parameter (lowest mean over the repetitions) per cell: the
peers are *tuned with the truth*, which no real analyst can do; dpcurve's side is not.
A single line "SKIP <reason>" means the environment could not be set up.

Every peer spends exactly ε (pure ε-DP, add/remove-one neighbours, like private_kde's pure-ε
release):
* "opendp histogram": equal-width bin counts with OpenDP's discrete Laplace (make_laplace on
  an integer vector, L1 sensitivity 1, scale found by OpenDP's binary search), negative counts
  clamped, normalised to a density. Parameter: bins.
* "diffprivlib histogram": diffprivlib.tools.histogram (truncated geometric noise), normalised.
  Parameter: bins.
* "smoothed Laplace histogram": the OpenDP histogram's noisy counts convolved with a Gaussian
  kernel of sd s (post-processing), clamped and normalised. Parameters: bins x s.
* quantiles, "opendp b-ary tree": OpenDP's recipe for many quantiles — bin counts, a b-ary tree
  (branching from choose_branching_factor), Laplace noise, make_consistent_b_ary_tree,
  make_quantiles_from_counts (linear). Parameter: leaf count.
* quantiles, "opendp quantile (EM)": OpenDP's quantile release, make_private_quantile's
  pipeline (make_quantile_score_candidates, then make_noisy_max with negate=True: the
  exponential mechanism) once per percentile at ε/99 each (basic composition). Parameter:
  number of equally spaced candidates.
The exact bin counts and quantile scores are computed with numpy (deterministic transformations;
the scores are checked against OpenDP's own transformation on a sample in every run); all noise
is drawn by the peer library with its own privacy maps.
"""

import argparse
import json
import os
import subprocess
import sys

# diffprivlib 0.6.6 imports a name scikit-learn 1.8 removed.
PACKAGES = ["numpy", "pyarrow", "opendp", "diffprivlib", "scikit-learn<1.8"]
ALPHAS = [p / 100 for p in range(1, 100)]


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--venv", required=True)
    p.add_argument("--jobs", required=True)
    return p.parse_args()


def skip(reason):
    print("SKIP " + reason, flush=True)
    sys.exit(0)


def ensure_venv(venv):
    """Returns the venv's python, creating the environment when needed."""
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".dpcurve-utility-ready")
    if os.path.exists(marker):
        return python
    print("utility peers: creating a virtual environment in %s (one time) ..." % venv, file=sys.stderr)
    try:
        if not os.path.exists(python):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, stdout=sys.stderr)
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"] + PACKAGES,
            check=True,
            stdout=sys.stderr,
            timeout=900,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        skip("could not set up the Python environment (%s)" % e)
    open(marker, "w").close()
    return python


def run(args):
    try:
        import warnings

        import numpy as np
        import opendp.prelude as dp
        import pyarrow.parquet as pq
        from diffprivlib.tools import histogram as dpl_histogram
    except ImportError as e:
        skip("packages missing in the environment (%s)" % e)
    warnings.filterwarnings("ignore")
    dp.enable_features("contrib")

    with open(args.jobs) as f:
        spec = json.load(f)
    grid = np.array(spec["grid"])
    step = grid[1] - grid[0]
    int_space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)
    laplace_cache = {}

    def opendp_laplace(eps):
        """OpenDP's (discrete) Laplace on an integer count vector, calibrated to ε at d_in = 1."""
        if eps not in laplace_cache:
            laplace_cache[eps] = dp.binary_search_chain(
                lambda s: dp.m.make_laplace(*int_space, scale=s), d_in=1, d_out=eps
            )
        return laplace_cache[eps]

    tree_cache = {}
    float_space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()
    em_cache = {}

    def em_scorer(cands, alpha):
        """OpenDP's score transformation, and its integer scale D: score = |(D - a)·lt - a·gt|."""
        key = (len(cands), cands[0], cands[-1], alpha)
        if key not in em_cache:
            sc = dp.t.make_quantile_score_candidates(*float_space, candidates=list(map(float, cands)), alpha=alpha)
            d = round(sc.map(1) / max(alpha, 1 - alpha))
            em_cache[key] = (sc, d, round(alpha * d))
        return em_cache[key]

    def em_scores(xs, cands, alpha):
        _, d, a = em_scorer(cands, alpha)
        lt = np.searchsorted(xs, cands, side="left").astype(object)
        gt = (len(xs) - np.searchsorted(xs, cands, side="right")).astype(object)
        return [abs((d - a) * l - a * g) for l, g in zip(lt, gt)]

    noisy_max_cache = {}

    def em_release(cands, alpha, eps, scores):
        sc, _, _ = em_scorer(cands, alpha)
        key = (len(cands), cands[0], cands[-1], alpha, eps)
        if key not in noisy_max_cache:
            noisy_max_cache[key] = dp.binary_search_chain(
                lambda s: dp.m.make_noisy_max(sc.output_domain, sc.output_metric, dp.max_divergence(), scale=s, negate=True),
                d_in=sc.map(1),
                d_out=eps,
            )
        return cands[noisy_max_cache[key](scores)]

    checked = set()

    def opendp_tree(leaves, b, eps):
        key = (leaves, b, eps)
        if key not in tree_cache:
            tree = dp.t.make_b_ary_tree(*int_space, leaf_count=leaves, branching_factor=b)
            tree_cache[key] = dp.binary_search_chain(lambda s: tree >> dp.m.then_laplace(scale=s), d_in=1, d_out=eps)
        return tree_cache[key]

    def as_density(counts, edges):
        """Step density on the evaluation grid from (noisy) counts: clamp, normalise."""
        c = np.maximum(np.asarray(counts, dtype=float), 0.0)
        total = c.sum()
        width = edges[1] - edges[0]
        if total <= 0:
            return np.full_like(grid, 1.0 / (edges[-1] - edges[0]))
        idx = np.clip(np.searchsorted(edges, grid, side="right") - 1, 0, len(c) - 1)
        return c[idx] / (total * width)

    def smoothed(counts, edges, s):
        """Counts at bin centres convolved with a Gaussian of sd s, clamped and normalised on the grid."""
        centres = (edges[:-1] + edges[1:]) / 2
        z = (grid[:, None] - centres[None, :]) / s
        f = (np.exp(-0.5 * z * z) / (s * np.sqrt(2 * np.pi))) @ np.asarray(counts, dtype=float)
        f = np.maximum(f, 0.0)
        mass = f.sum() * step
        return f / mass if mass > 0 else np.full_like(grid, 1.0 / (grid[-1] - grid[0]))

    def ise(f, truth):
        return float(((f - truth) ** 2).sum() * step)

    def emit(**row):
        print(json.dumps(row), flush=True)

    for job in spec["jobs"]:
        x = pq.read_table(job["file"], columns=["x"]).column("x").to_numpy()
        lo, hi = job["lo"], job["hi"]
        truth = np.array(job["truth"])
        key = job["key"]
        seed = abs(hash(key)) % (2**32)
        for eps in job["epsilons"]:
            lap = opendp_laplace(eps)
            for bins in [4, 8, 16, 20, 32, 64, 128, 256, 512, 1024]:
                edges = np.linspace(lo, hi, bins + 1)
                exact, _ = np.histogram(x, bins=edges)
                noisy = np.array(lap([int(c) for c in exact]))
                emit(key=key, epsilon=eps, peer="opendp histogram", param="bins=%d" % bins,
                     ise=ise(as_density(noisy, edges), truth))
                dpl, _ = dpl_histogram(x, epsilon=eps, bins=bins, range=(lo, hi), random_state=seed + bins)
                emit(key=key, epsilon=eps, peer="diffprivlib histogram", param="bins=%d" % bins,
                     ise=ise(as_density(dpl, edges), truth))
                if bins >= 16:
                    width = (hi - lo) / bins
                    for s in (hi - lo) * np.geomspace(1 / 512, 1 / 4, 19):
                        if s < width / 4:
                            continue
                        emit(key=key, epsilon=eps, peer="smoothed Laplace histogram",
                             param="bins=%d,s=%.4g" % (bins, s), ise=ise(smoothed(noisy, edges, s), truth))
        if job["quantile_epsilons"]:
            xs = np.sort(x)
            n = len(xs)
            b = dp.t.choose_branching_factor(size_guess=n)
            for eps in job["quantile_epsilons"]:
                for leaves in [16, 64, 256, 1024, 4096]:
                    edges = np.linspace(lo, hi, leaves + 1)
                    exact, _ = np.histogram(x, bins=edges)
                    noisy = opendp_tree(leaves, b, eps)([int(c) for c in exact])
                    leaf = dp.t.make_consistent_b_ary_tree(branching_factor=b)(noisy)
                    qs = dp.t.make_quantiles_from_counts(list(map(float, edges)), ALPHAS)(
                        [max(float(c), 0.0) for c in leaf]
                    )
                    ranks = np.searchsorted(xs, np.array(qs), side="right") / n
                    emit(key=key, epsilon=eps, peer="opendp b-ary tree", param="leaves=%d" % leaves,
                         rank_error=float(np.mean(np.abs(ranks - np.array(ALPHAS)))))
            for count in [256, 1024, 4096]:
                cands = np.linspace(lo, hi, count)
                if count not in checked:
                    # The numpy scores are OpenDP's: checked on a sample of this file.
                    sample = np.sort(x[:2000])
                    for alpha in (ALPHAS[0], ALPHAS[36], ALPHAS[49]):
                        sc, _, _ = em_scorer(cands, alpha)
                        if list(sc(list(map(float, sample)))) != em_scores(sample, cands, alpha):
                            skip("numpy quantile scores differ from OpenDP's")
                    checked.add(count)
                scores = [em_scores(xs, cands, alpha) for alpha in ALPHAS]
                for eps in job["quantile_epsilons"]:
                    qs = [em_release(cands, alpha, eps / len(ALPHAS), sc) for alpha, sc in zip(ALPHAS, scores)]
                    ranks = np.searchsorted(xs, np.array(qs), side="right") / n
                    emit(key=key, epsilon=eps, peer="opendp quantile (EM)", param="candidates=%d" % count,
                         rank_error=float(np.mean(np.abs(ranks - np.array(ALPHAS)))))


def main():
    args = parse()
    python = ensure_venv(args.venv)
    if os.path.realpath(sys.prefix) != os.path.realpath(args.venv):
        os.execv(python, [python] + sys.argv)
    run(args)


if __name__ == "__main__":
    main()
