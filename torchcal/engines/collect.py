"""Everything a SQL engine computes for an audit, from the queries of
:mod:`torchcal.engines.sql` (docs/design.md section 6f): the binned state, the exact per-value
counts on the 0.01 grid when every kept confidence sits on it (so a stated-confidence grid gets
one bin per value on every road), a seeded sample of kept rows (the report's confidence
concentration, the HTML diagram, the temperature fit) and what the text columns held
(percents read, values that are no number). ``run`` is the engine: a function from a query to
its rows (DuckDB's ``execute(sql).fetchall()``, Spark's ``sql(q).collect()``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchcal.engines.fine_sql import with_fine
from torchcal.engines.sql import (
    _D,
    _as_columns,
    checked_rows_sql,
    header_for,
    quote,
    state_from_rows,
    state_sql,
    text_value_sql,
)
from torchcal.engines.state import UNGROUPED, BinnedState

#: the finest value grid whose counts are kept (values k / GRID; the audit's too)
GRID = 100
#: |c * GRID - round(c * GRID)| at most this: on the grid (the streaming audit's rule)
GRID_TOL = 1e-9 * GRID

Run = Callable[[str], Sequence[Sequence[Any]]]


@dataclass(frozen=True)
class EngineAudit:
    """What :func:`collect` returns: ``state``; ``grid`` ``(names, count, pos, weight,
    weight2)`` arrays ``(G, GRID + 1)`` (``weight``, ``weight2`` the sums of w and w * w, None
    unweighted) or None; ``sample`` (``preds``,
    ``target``, ``group`` lists, ordered by the seeded key) or None; ``text`` per text
    prediction column ``{percent, unparsed, missing, example}``."""

    state: BinnedState
    grid: tuple[list[str], np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None] | None
    sample: dict[str, list[Any]] | None
    text: dict[str, dict[str, Any]]
    segments: Any = None  # engines/segments.SegmentStats with --segments


def collect(
    run: Run,
    source: str,
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int | None = None,
    dialect: str = "duckdb",
    text: Sequence[str] = (),
    sample_size: int = 20000,
    seed: int = 0,
    producer: str = "sql",
) -> EngineAudit:
    """Run the audit's queries on ``source`` (a table expression) through ``run``.
    ``n_bins=None``: 10 bins, and the value grid when every kept confidence is on the 0.01
    grid (then the state is recomputed at the grid's bins, ``1 / step + 1``, so a written
    state has the report's bins)."""
    kw: dict[str, Any] = {"preds": preds, "label": label, "group": group, "weight": weight}
    kw.update(dialect=dialect, text=tuple(text))
    B = 10 if n_bins is None else n_bins
    state = _state(run, source, B, producer, kw)
    kept = int(state.stats.count.sum())
    grid = None
    if n_bins is None and kept:
        grid = _grid(run, source, kw)
        step = None if grid is None else _step(grid[1])
        if step is not None:
            state = _state(run, source, round(1 / step) + 1, producer, kw)
        else:
            grid = None
    state = with_fine(run, source, kw, state)  # the fine histogram (global ECCE, resolution)
    sample = _sample(run, source, kw, sample_size, seed, kept) if kept and sample_size else None
    text_log = _text_log(run, source, preds, text, dialect)
    return EngineAudit(state, grid, sample, text_log)


def _state(run: Run, source: str, B: int, producer: str, kw: dict[str, Any]) -> BinnedState:
    rows = run(state_sql(source, n_bins=B, **kw))
    header = header_for(
        kw["preds"], kw["label"], group=kw["group"], weight=kw["weight"], n_bins=B,
        producer=producer,
    )  # fmt: skip
    return state_from_rows(rows, header)


def _step(count: np.ndarray) -> float | None:
    used = np.flatnonzero(count.sum(0) > 0)
    for g in (10, 5):
        if used.size and (used % g == 0).all():
            return g / GRID
    return None


def _grid(
    run: Run, source: str, kw: dict[str, Any]
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None] | None:
    """The per-(group, value) counts, or None when a kept confidence is off the 0.01 grid
    (found by a query that stops at the first such row)."""
    d = _D[kw["dialect"]]
    with_sql = checked_rows_sql(source, n_bins=10, **kw)
    off = f"ABS(c * {GRID} - ROUND(c * {GRID})) > {GRID_TOL!r}"
    probe = f"{with_sql}\nSELECT COUNT(*) FROM (SELECT 1 FROM scored WHERE reason IS NULL AND {off} LIMIT 1) t"
    if int(run(probe)[0][0]):
        return None
    S = d["sum"]
    sums = (
        f"{S}(w * o), {S}(w), {S}(w * w)"
        if kw["weight"]
        else "SUM(o), CAST(NULL AS DOUBLE), CAST(NULL AS DOUBLE)"
    )
    q = (
        f"{with_sql}\nSELECT g, CAST(ROUND(c * {GRID}) AS {d['int']}) AS k, COUNT(*), {sums} "
        f"FROM scored WHERE reason IS NULL GROUP BY g, k"
    )
    rows = run(q)
    names = sorted({str(r[0]) for r in rows}) or [UNGROUPED]
    pos_of = {g: i for i, g in enumerate(names)}
    count = np.zeros((len(names), GRID + 1), np.int64)
    pos = np.zeros((len(names), GRID + 1), np.float64)
    wsum = np.zeros((len(names), GRID + 1), np.float64) if kw["weight"] else None
    w2sum = None if wsum is None else wsum.copy()
    for g, k, n, p, w, w2 in rows:
        i = pos_of[str(g)]
        count[i, int(k)] = int(n)
        pos[i, int(k)] = float(p)
        if wsum is not None and w2sum is not None:
            wsum[i, int(k)] = float(w)
            w2sum[i, int(k)] = float(w2)
    return names, count, pos, wsum, w2sum


def _sample(
    run: Run, source: str, kw: dict[str, Any], size: int, seed: int, kept: int
) -> dict[str, list[Any]]:
    """At most ``size`` kept rows: those with the smallest seeded hash of their values (the
    predictions and the label; ties by the values and the group; the
    decimal text of ``seed`` is hashed with them: any integer, no two seeds alike), so the
    sample is the same for any thread count or file order; all kept rows when there are
    at most ``size``. DuckDB's hash is uniform on [0, 2^64): rows above 4 ``size`` / ``kept``
    of that range are dropped before the sort (the same rows unless fewer than ``size`` pass,
    then the query runs again without the cut)."""
    d = _D[kw["dialect"]]
    C = len(_as_columns(kw["preds"]))
    pv = ", ".join(f"p{k}" for k in range(C))
    key = d["hash"].format(f"{pv}, y, '{int(seed)}'")  # the group breaks ties (cheaper)
    with_sql = checked_rows_sql(source, n_bins=10, **kw)
    want = min(size, kept)
    # -0.0 and 0.0 tie in ORDER BY (and in DuckDB's hash): their text breaks the tie
    signs = ", ".join(f"CAST(p{k} AS {d['str']})" for k in range(C))

    def query(cut: str) -> list[Any]:
        return list(run(
            f"{with_sql}\nSELECT {pv}, y, g FROM scored WHERE reason IS NULL{cut} "
            f"ORDER BY {key}, {pv}, y, g, {signs} LIMIT {int(size)}"
        ))  # fmt: skip

    rows: list[Any] = []
    if kw["dialect"] == "duckdb" and 4 * size < kept:
        rows = query(f" AND {key} < CAST({(1 << 64) * 4 * size // kept} AS UBIGINT)")
    if len(rows) < want:
        rows = query("")
    return {
        "preds": [r[0] if C == 1 else list(r[:C]) for r in rows],
        "target": [int(r[C]) for r in rows],
        "group": [str(r[C + 1]) for r in rows],
    }


def _text_log(
    run: Run, source: str, preds: str | Sequence[str], text: Sequence[str], dialect: str
) -> dict[str, dict[str, Any]]:
    """Per text prediction column: values read as percents, unparsed values (and the
    smallest one, as an example), missing values."""
    cols = [c for c in _as_columns(preds) if c in set(text)]
    if not cols:
        return {}
    parts = []
    for c in cols:
        _, bad, pct = text_value_sql(c, "stated", dialect)
        col = quote(c, dialect)
        parts.append(
            f"SUM(CASE WHEN {pct} THEN 1 ELSE 0 END), SUM(CASE WHEN {bad} THEN 1 ELSE 0 END), "
            f"MIN(CASE WHEN {bad} THEN {col} END), SUM(CASE WHEN {col} IS NULL THEN 1 ELSE 0 END)"
        )
    row = run(f"SELECT {', '.join(parts)} FROM {source}")[0]
    out = {}
    for i, c in enumerate(cols):
        p, u, ex, miss = row[4 * i : 4 * i + 4]
        out[c] = {"percent": int(p or 0), "unparsed": int(u or 0), "example": ex,
                  "missing": int(miss or 0)}  # fmt: skip
    return out
