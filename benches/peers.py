#!/usr/bin/env python3
"""Peers of private_kde, timed end to end (Parquet file -> curve on a grid), for benches/perf.rs.

    python3 benches/peers.py --venv DIR --file F.parquet --bandwidth 0.02 --points 1024 --reps 7

Creates a virtual environment in DIR on first use and installs KDEpy, statsmodels, pyarrow and
numpy into it from PyPI, then re-runs itself there. Prints one JSON line per peer:
{"name": ..., "ms": [per-repetition milliseconds]}, or a single line "SKIP <reason>" when the
environment cannot be set up (no venv module, no network, a failed install).
Each repetition re-reads the file with pyarrow (page cache warm, like the SQL side).
"""

import argparse
import json
import os
import subprocess
import sys
import time

PACKAGES = ["numpy", "pyarrow", "KDEpy", "statsmodels"]


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--venv", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--bandwidth", type=float, required=True)
    p.add_argument("--points", type=int, required=True)
    p.add_argument("--reps", type=int, default=7)
    return p.parse_args()


def skip(reason):
    print("SKIP " + reason, flush=True)
    sys.exit(0)


def ensure_venv(venv):
    """Returns the venv's python, creating the environment when needed."""
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".dpcurve-ready")
    if os.path.exists(marker):
        return python
    print("peers: creating a virtual environment in %s (one time) ..." % venv, file=sys.stderr)
    try:
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


def timed(reps, f):
    f()  # warm-up (imports, page cache)
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def run(args):
    try:
        import numpy as np
        import pyarrow.parquet as pq
        from KDEpy import FFTKDE
        from statsmodels.nonparametric.kde import KDEUnivariate
    except ImportError as e:
        skip("packages missing in the environment (%s)" % e)

    def read():
        return pq.read_table(args.file, columns=["x"]).column("x").to_numpy()

    def kdepy():
        x = read()
        grid, y = FFTKDE(kernel="gaussian", bw=args.bandwidth).fit(x).evaluate(args.points)
        return y

    def statsmodels():
        x = read()
        kde = KDEUnivariate(x)
        kde.fit(kernel="gau", bw=args.bandwidth, fft=True, gridsize=args.points)
        return kde.density

    def floor():
        return np.sum(read())

    peers = [
        ("pyarrow read + numpy sum (Python floor)", floor),
        ("KDEpy FFTKDE", kdepy),
        ("statsmodels KDEUnivariate(fft)", statsmodels),
    ]
    for name, f in peers:
        print(json.dumps({"name": name, "ms": timed(args.reps, f)}), flush=True)


def main():
    args = parse()
    venv = os.path.abspath(args.venv)
    if os.path.realpath(sys.prefix) != os.path.realpath(venv):
        python = ensure_venv(venv)
        os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])
    run(args)


if __name__ == "__main__":
    main()
