#!/usr/bin/env python3
"""Exact prefix-noise of linear release strategies for private_cdf (no sampling), for the numbers in
docs/functions/private_cdf.md ("Where it falls short", "Releases other than trees").

    target/bench-data/venv-utility/bin/python benches/cdf_strategies.py [--leaves 1024] [--what all]

Needs NumPy (the utility bench's virtual environment has it). A strategy measures, with pure-ε
Laplace noise, the total count (the root: a share of ε) and groups of linear queries on the leaves;
each group's weights on any leaf sum to one, so with scale 1/(share·(1 − root)·ε) per group one
row costs exactly ε. The least-squares leaf estimate's covariance is (AᵀV⁻¹A)⁻¹; the rank error
sees the prefix centred by the total, P̂_j − F_j·P̂_L, so this prints its noise sd:

* "edges": root-mean-square over all edges of uniform data (F_j = j/L);
* per shape (the utility bench's mixture, claw and log-normal on their ranges): the mean sd over
  the edges where the 99 percentiles fall.

Strategies: dpcurve's tree (factors as TreeShape::for_leaves_log2 builds them, equal shares) with a
5 % and a 2 % root, the factorisations into 2-4 levels (--what shapes: 43 at 4096 leaves, ≈ 6 s
each), and the leaves plus
triangular windows (each leaf in two windows of the given half-width, weights summing to one).
"""
import argparse
import itertools
from math import erf, log, sqrt

import numpy as np


def phi(x):
    return 0.5 * (1 + erf(x / sqrt(2)))


SHAPES = {
    "mixture": ((0.0, 1.0), lambda x: 0.5 * phi((x - 0.3) / 0.1) + 0.5 * phi((x - 0.7) / 0.1)),
    "claw": ((-3.0, 3.0), lambda x: 0.5 * phi(x) + sum(0.1 * phi((x - (l / 2 - 1)) / 0.1) for l in range(5))),
    "lognormal": ((0.0, 4.0), lambda x: phi(log(x) / 0.5) if x > 0 else 0.0),
}


def edge_cdf(name, leaves):
    (lo, hi), cdf = SHAPES[name]
    f = np.array([cdf(lo + (hi - lo) * (j + 1) / leaves) for j in range(leaves)])
    f0 = cdf(lo)
    return (f - f0) / (f[-1] - f0)


def information(leaves, root, groups, eps=1.0):
    """AᵀV⁻¹A for a root with share `root` and `groups` = [(share, [weight vectors])]."""
    rest = (1 - root) * eps
    g = np.full((leaves, leaves), 1 / (2 / (root * eps) ** 2))
    for share, rows in groups:
        inv = 1 / (2 / (share * rest) ** 2)
        for w in rows:
            nz = np.nonzero(w)[0]
            g[np.ix_(nz, nz)] += inv * np.outer(w[nz], w[nz])
    return g


def tree(leaves, factors, root, weights=None):
    weights = weights or [1 / len(factors)] * len(factors)
    groups, nodes = [], 1
    for f, share in zip(factors, weights):
        nodes *= f
        width = leaves // nodes
        rows = []
        for b in range(nodes):
            w = np.zeros(leaves)
            w[b * width:(b + 1) * width] = 1
            rows.append(w)
        groups.append((share, rows))
    return information(leaves, root, groups)


def windows(leaves, half_width, leaf_share, root):
    centre = np.arange(leaves) + 0.5
    rows = [np.clip(1 - np.abs(centre - c) / half_width, 0, None) for c in np.arange(0, leaves + 1, half_width)]
    return information(leaves, root, [(leaf_share, list(np.eye(leaves))), (1 - leaf_share, rows)])


def prefix_noise(g, shapes):
    leaves = len(g)
    p = np.cumsum(np.cumsum(np.linalg.inv(g), 0), 1)
    j = np.arange(leaves)

    def var(f):
        return p[j, j] - 2 * f * p[j, leaves - 1] + f * f * p[leaves - 1, leaves - 1]

    out = {"edges": float(np.sqrt(var((j + 1) / leaves)[:-1].mean()))}
    for name, f in shapes.items():
        at = [min(int(np.searchsorted(f, q)), leaves - 2) for q in np.arange(1, 100) / 100]
        out[name] = float(np.sqrt(var(f)[at]).mean())
    return out


def default_factors(k):
    levels = max(1, (k + 2) // 4)
    base, extra = divmod(k, levels)
    return [1 << (base + (1 if l < extra else 0)) for l in range(levels)]


def show(label, numbers):
    print(f"{label:<44}" + "".join(f"{numbers[k]:>11.3f}" for k in numbers))


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--leaves", type=int, default=1024)
    a.add_argument("--what", choices=["all", "trees", "shapes", "windows"], default="all")
    o = a.parse_args()
    leaves, k = o.leaves, o.leaves.bit_length() - 1
    assert leaves == 1 << k, "--leaves must be a power of two"
    shapes = {name: edge_cdf(name, leaves) for name in SHAPES}
    print(f"{'strategy (' + str(leaves) + ' leaves, ε = 1, counts)':<44}" + "".join(f"{c:>11}" for c in ["edges", *shapes]))
    factors = default_factors(k)
    if o.what in ("all", "trees"):
        for root in (0.05, 0.02):
            show(f"tree {'·'.join(map(str, factors))}, root {root:.0%}", prefix_noise(tree(leaves, factors, root), shapes))
    if o.what in ("all", "shapes"):
        # log2 of the factors: 16–256 with two levels, 4–64 with three, 4–16 with four.
        bounds = {2: (4, 8), 3: (2, 6), 4: (2, 4)}
        for levels, (least, most) in bounds.items():
            for parts in itertools.product(range(least, most + 1), repeat=levels):
                if sum(parts) == k:
                    f = [1 << p for p in parts]
                    show(f"tree {'·'.join(map(str, f))}, root 5%", prefix_noise(tree(leaves, f, 0.05), shapes))
    if o.what in ("all", "windows"):
        for half_width, share in ((32, 0.45), (48, 0.48), (64, 0.6)):
            show(f"leaves + windows ±{half_width}, {share:.0%} on leaves, root 2%",
                 prefix_noise(windows(leaves, half_width, share, 0.02), shapes))


if __name__ == "__main__":
    main()
