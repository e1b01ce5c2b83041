"""Private results as long DataFrames: one row per point of each curve.

A private function's result is a struct: list fields of the same length along the curve (the
first one is its axis: `x`, `t`, `p`), scalar fields (`release`, `mass`, `bandwidth`, `count`,
…), and for 2-D densities two axes `x`, `y` and surfaces given as rows (`density[i][j]` at
`(x[i], y[j])`). A 1-D curve becomes the columns `x, density, noise_band, band` (whatever its
fields are); a 2-D one the columns `x, y, density, noise_band, band`, one row per grid point.
The other columns of the result (the GROUP BY keys) repeat on every point of their curve.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pandas as pd
import pyarrow as pa


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def curve_columns(schema: pa.Schema) -> List[str]:
    """The result's curve columns: structs with at least one list field."""
    return [
        f.name
        for f in schema
        if pa.types.is_struct(f.type) and any(_is_list(f.type.field(i).type) for i in range(f.type.num_fields))
    ]


def _is_surface(t: pa.StructType) -> bool:
    return any(_is_list(t.field(i).type) and _is_list(t.field(i).type.value_type) for i in range(t.num_fields))


def _points_1d(value: Dict[str, Any], struct: pa.StructType) -> Dict[str, list]:
    lists = [struct.field(i).name for i in range(struct.num_fields) if _is_list(struct.field(i).type)]
    axis = lists[0]
    n = len(value[axis] or [])
    out = {}
    for name in lists:
        v = value[name]
        # An absent band (None) becomes a column of NaN, so every curve has the same columns.
        out[name] = [float("nan")] * n if v is None else [float("nan") if e is None else e for e in v]
        if len(out[name]) != n:
            raise ValueError(f"field {name!r} has {len(out[name])} values, the axis {axis!r} has {n}")
    return out


def _points_2d(value: Dict[str, Any], struct: pa.StructType) -> Dict[str, list]:
    xs, ys = value["x"] or [], value["y"] or []
    surfaces = [
        struct.field(i).name
        for i in range(struct.num_fields)
        if _is_list(struct.field(i).type) and _is_list(struct.field(i).type.value_type)
    ]
    out: Dict[str, list] = {"x": [x for x in xs for _ in ys], "y": [y for _ in xs for y in ys]}
    for name in surfaces:
        rows = value[name]
        out[name] = (
            [float("nan")] * (len(xs) * len(ys))
            if rows is None
            else [float("nan") if v is None else v for row in rows for v in row]
        )
    return out


def scalar_fields(struct: pa.StructType) -> List[str]:
    """A curve struct's scalar fields (release id, mass, bandwidth, …)."""
    return [struct.field(i).name for i in range(struct.num_fields) if not _is_list(struct.field(i).type)]


def curve_frame(table: pa.Table) -> pd.DataFrame:
    """The long DataFrame of a result with exactly one curve column (see the module docs).

    `attrs["curves"]` holds one dict per curve: its group key values and its scalar fields;
    for a single curve its scalar fields are also in `attrs` directly (`release`, `mass`, …).
    """
    curves = curve_columns(table.schema)
    if len(curves) != 1:
        raise ValueError(
            f"db.curve expects a result with exactly one private curve column, this one has {len(curves)} "
            f"({', '.join(curves) or 'none'}); use db.sql for other results"
        )
    column = curves[0]
    struct = table.schema.field(column).type
    keys = [f.name for f in table.schema if f.name != column]
    surface = _is_surface(struct)
    scalars = scalar_fields(struct)
    frames, metas = [], []
    for row in table.to_pylist():
        value = row[column]
        if value is None:
            continue
        points = _points_2d(value, struct) if surface else _points_1d(value, struct)
        n = len(next(iter(points.values()))) if points else 0
        frame = pd.DataFrame({**{k: [row[k]] * n for k in keys}, **points})
        frames.append(frame)
        metas.append({**{k: row[k] for k in keys}, **{s: value.get(s) for s in scalars}})
    if frames:
        df = pd.concat(frames, ignore_index=True)
    else:
        df = pd.DataFrame(columns=keys + [struct.field(i).name for i in range(struct.num_fields) if _is_list(struct.field(i).type)])
    df.attrs["column"] = column
    df.attrs["keys"] = keys
    df.attrs["surface"] = surface
    df.attrs["curves"] = metas
    if len(metas) == 1:
        for s in scalars:
            df.attrs[s] = metas[0].get(s)
    return df
