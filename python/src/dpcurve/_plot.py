"""Plots of curve DataFrames (matplotlib, the `plot` extra)."""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd

# The band columns are half-widths around the curve; `lower`/`upper` (quantiles) are bounds.
_BANDS = (("band", 0.18, "simultaneous band (noise and smoothing)"), ("noise_band", 0.32, "noise band"))


def _value_column(df: pd.DataFrame, axis: str) -> str:
    skip = {axis, "y", "band", "noise_band", "lower", "upper"} | set(df.attrs.get("keys", []))
    for c in df.columns:
        if c not in skip and pd.api.types.is_float_dtype(df[c]):
            return c
    raise ValueError("no curve values to plot")


def plot(df: pd.DataFrame, ax: Optional[Any] = None, title: Optional[str] = None):
    """A matplotlib Figure of a curve DataFrame (`Database.curve`, `Database.release`): the curve
    with its bands shaded, one line per group; a 2-D density as a heat map with a colour bar
    (one panel per group)."""


    import matplotlib.pyplot as plt

    keys = list(df.attrs.get("keys", []))
    groups = list(df.groupby(keys, sort=False, dropna=False)) if keys else [(None, df)]
    if df.attrs.get("surface"):
        return _heatmaps(df, groups, keys, title)
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
    else:
        fig = ax.figure
    axis = df.columns[len(keys)] if len(df.columns) > len(keys) else "x"
    value = _value_column(df, axis)
    for key, g in groups:
        label = None if key is None else ", ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        (line,) = ax.plot(g[axis], g[value], label=label, linewidth=1.6)
        colour = line.get_color()
        for name, alpha, what in _BANDS:
            if name in g and g[name].notna().any():
                ax.fill_between(
                    g[axis], g[value] - g[name], g[value] + g[name], color=colour, alpha=alpha, linewidth=0,
                    label=what if key is None else None,
                )
        if "lower" in g and "upper" in g and g["lower"].notna().any():
            ax.fill_between(g[axis], g["lower"], g["upper"], color=colour, alpha=0.25, linewidth=0,
                            label="interval" if key is None else None)
    ax.set_xlabel(axis)
    ax.set_ylabel(value)
    if title or df.attrs.get("release"):
        ax.set_title(title or f"{value} — release {df.attrs.get('release')}")
    if len(groups) > 1 or any(n in df and df[n].notna().any() for n, _, _ in _BANDS):
        ax.legend(frameon=False, fontsize="small")
    fig.tight_layout()
    return fig


def _heatmaps(df: pd.DataFrame, groups, keys, title):
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(groups)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.4), squeeze=False)
    value = "density" if "density" in df else _value_column(df, "x")
    for ax, (key, g) in zip(axes[0], groups):
        xs, ys = np.unique(g["x"].to_numpy()), np.unique(g["y"].to_numpy())
        grid = g.pivot_table(index="y", columns="x", values=value, dropna=False).reindex(index=ys, columns=xs)
        mesh = ax.pcolormesh(xs, ys, grid.to_numpy(), shading="nearest", cmap="viridis")
        fig.colorbar(mesh, ax=ax, label=value)
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        if key is not None:
            ax.set_title(", ".join(str(k) for k in (key if isinstance(key, tuple) else (key,))))
        elif title:
            ax.set_title(title)
    fig.tight_layout()
    return fig
