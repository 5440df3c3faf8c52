"""Shared data of the engine tests: every bin edge k/B (float64 and float32), 0 and 1, NaN,
NULL, values outside [0, 1], bad labels, several groups (and NULL ones), integer weights
(and bad ones). Written as Parquet/CSV so every engine reads the same bytes."""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

B = 10
GROUPS = ("alpha", "beta", "gamma")


def edges(n_bins: int) -> np.ndarray:
    """k/B in float64, float32(k/B) upcast and their float64 neighbours, for every k."""
    k = np.arange(n_bins + 1, dtype=np.float64) / n_bins
    k32 = k.astype(np.float32).astype(np.float64)
    near = np.concatenate([np.nextafter(k, -np.inf), np.nextafter(k, np.inf)])
    v = np.concatenate([k, k32, near, [0.0, 1.0, -0.0]])
    return v[(v >= 0) & (v <= 1)]


def rows(n: int = 2000, seed: int = 0, *, bad: bool = True, n_bins: int = B) -> pa.Table:
    """A table with columns p (float64, nullable), p32 (float32), y (float64 label, nullable),
    g (string group, nullable), w (integer-valued float64 weight)."""
    rng = np.random.default_rng(seed)
    e = edges(n_bins)
    p = np.concatenate([np.repeat(e, 3), rng.random(n)])
    m = len(p)
    y = (rng.random(m) < p).astype(np.float64)
    g = rng.choice(GROUPS, m).astype(object)
    w = rng.integers(0, 5, m).astype(np.float64)
    p_null = np.zeros(m, bool)
    y_null = np.zeros(m, bool)
    if bad:
        idx = rng.permutation(m)[:60]
        p[idx[0:6]] = np.nan
        p[idx[6:10]] = [-0.25, 1.5, math.inf, -math.inf]
        p[idx[10:12]] = [-1e-300, 1 + 2**-52]
        p_null[idx[12:16]] = True
        y[idx[16:20]] = [2.0, -1.0, 0.5, np.nan]
        y_null[idx[20:23]] = True
        g[idx[23:26]] = None
        w[idx[26:30]] = [-1.0, np.nan, math.inf, -0.5]
    perm = rng.permutation(m)  # edges spread over the rows
    p, y, g, w, p_null, y_null = (a[perm] for a in (p, y, g, w, p_null, y_null))
    return pa.table(
        {
            "p": pa.array(p, mask=p_null),
            "p32": pa.array(p.astype(np.float32), mask=p_null),
            "y": pa.array(y, mask=y_null),
            "g": pa.array(list(g), pa.string()),
            "w": pa.array(w),
        }
    )


def arrays(table: pa.Table, preds: str = "p") -> dict[str, object]:
    """The table's columns as the arrays :func:`state_from_arrays` takes."""
    p = table.column(preds)
    y = table.column("y")
    return {
        "preds": p.to_numpy(zero_copy_only=False).astype(np.float64),
        "target": y.fill_null(0).to_numpy(zero_copy_only=False),
        "preds_null": p.is_null().to_numpy(zero_copy_only=False),
        "target_null": y.is_null().to_numpy(zero_copy_only=False),
        "groups": np.array(table.column("g").to_pylist(), dtype=object),
        "weight": table.column("w").to_numpy(),
    }


def write_parts(table: pa.Table, directory: str, parts: int = 3, csv: bool = False) -> str:
    """Split ``table`` into ``parts`` files; returns the glob."""
    os.makedirs(directory, exist_ok=True)
    edges_ = np.linspace(0, table.num_rows, parts + 1).astype(int)
    ext = "csv" if csv else "parquet"
    for i in range(parts):
        t = table.slice(edges_[i], edges_[i + 1] - edges_[i])
        path = os.path.join(directory, f"part-{i}.{ext}")
        if csv:
            pcsv.write_csv(t, path)
        else:
            pq.write_table(t, path, row_group_size=max(1, t.num_rows // 3))
    return os.path.join(directory, f"part-*.{ext}")


def class_rows(n: int = 1500, seed: int = 0, C: int = 3, *, bad: bool = True) -> pa.Table:
    """Class-probability columns q0..q{C-1} (rows summing to 1: Dirichlet draws, rows whose
    maximum sits on every edge k/B, tied maxima), a class label y and a group g; with ``bad``
    NaN, NULL, out-of-range and unnormalised rows and bad labels."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(C), n)
    k = np.arange((B + 1) // 2, B + 1) / B  # maxima on the edges >= 1/2
    e = np.zeros((len(k), C))
    e[:, 0], e[:, 1] = k, 1 - k
    ties = np.zeros((2, C))
    ties[0, :2] = 0.5
    ties[1, :] = 1 / C
    P = np.concatenate([P, e, e[:, ::-1].copy(), ties])
    m = len(P)
    y = np.array([rng.choice(C, p=row / row.sum()) for row in P], dtype=np.float64)
    g = rng.choice(GROUPS, m).astype(object)
    null = np.zeros(m, bool)
    if bad:
        idx = rng.permutation(m)[:20]
        P[idx[0], 1] = np.nan
        P[idx[1], 0] = 1.5
        P[idx[2]] = P[idx[2]] * 1.1
        null[idx[3]] = True
        y[idx[4:7]] = [C, 0.5, -1]
        g[idx[7]] = None
    perm = rng.permutation(m)
    P, y, g, null = P[perm], y[perm], g[perm], null[perm]
    cols = {f"q{j}": pa.array(P[:, j], mask=null if j == 0 else None) for j in range(C)}
    return pa.table({**cols, "y": y, "g": pa.array(list(g), pa.string())})


def class_arrays(table: pa.Table, C: int = 3) -> dict[str, object]:
    P = np.stack([table.column(f"q{j}").to_numpy(zero_copy_only=False) for j in range(C)], 1)
    return {
        "preds": P.astype(np.float64),
        "target": table.column("y").to_numpy(),
        "preds_null": table.column("q0").is_null().to_numpy(zero_copy_only=False),
        "groups": np.array(table.column("g").to_pylist(), dtype=object),
    }


def assert_reports_close(a, b, rtol=1e-12):
    """Equal report dicts: floats within ``rtol`` (relative and absolute), the rest exact."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_reports_close(a[k], b[k], rtol)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_reports_close(x, y, rtol)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=rtol), (a, b)
    else:
        assert a == b
