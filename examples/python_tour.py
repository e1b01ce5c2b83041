"""A tour of dpcurve's Python client (README, "Python"). Run against a `dpcurve serve`:

    DPCURVE_URI=grpc://127.0.0.1:31337 DPCURVE_TOKEN=… python examples/python_tour.py

It expects a private table `patients` with a column `x` (bounds set by the data owner) and
draws the private density with its bands to DPCURVE_PNG (default kde.png).
"""

import os

import matplotlib

matplotlib.use("Agg")

import dpcurve

db = dpcurve.connect(os.environ.get("DPCURVE_URI", "grpc://127.0.0.1:31337"), token=os.environ["DPCURVE_TOKEN"])

# A private density: one row per grid point, its bands as columns, what it cost in attrs.
kde = db.curve("SELECT private_kde(x, 'auto', 0.5, 0) AS k FROM patients")
print(kde.head())
print({k: kde.attrs[k] for k in ("release", "mechanism", "epsilon", "delta", "bandwidth", "reused")})

# Running the same cell again does not pay again: the kept result comes back.
again = db.curve("SELECT private_kde(x, 'auto', 0.5, 0) AS k FROM patients")
print("reused:", again.attrs["reused"])

# What is left, what is stored, and a stored release read back for free.
print(db.budgets()[["table_name", "share_epsilon_remaining"]])
print(db.releases()[["release", "function", "epsilon", "delta"]].tail())
stored = db.release(kde.attrs["release"])

# Refusals are exceptions a program can catch.
try:
    db.sql("SELECT x FROM patients")
except dpcurve.Refused as e:
    print("refused by rule", e.rule)

fig = dpcurve.plot(kde)
fig.savefig(os.environ.get("DPCURVE_PNG", "kde.png"), dpi=120)
db.close()
