"""The binned state as one SQL query, generated from the one bin rule for each dialect.

:func:`state_sql` writes a ``SELECT`` that reads the prediction, label (and optional group and
weight) columns of a source, checks every row, bins it and sums it, grouped by
``(reason, group, bin)``: rows never leave the engine, and the result has one row per
non-empty cell plus one row per (reason, group) of rejected rows. The rule, as in
:func:`torchcal.functional.calibration.bin_ids` (docs/design.md sections 3 and 6e):

* ``c = CAST(p AS DOUBLE)`` **before** ``* B`` (a FLOAT column times ``B`` in float32 moves
  ``0.3 * 10`` across the edge); ``bin = CAST(LEAST(FLOOR(c * B), B - 1) AS INTEGER)``, so
  ``1.0`` is in the last bin (``width_bucket`` puts it in bin ``B + 1``);
* rows are rejected, first reason first: ``preds_null``, ``preds_nan``, ``preds_out_of_range``
  (outside [0, 1]), ``label_invalid`` (NULL or not 0/1), ``group_null``, ``weight_invalid``
  (NULL, NaN, negative or infinite); they are counted by reason and enter no sum;
* per cell: ``COUNT(*)`` (an integer), the sums of ``c``, ``y``, ``c * c``, ``c * y`` (weighted:
  ``w * c``, ``w * y``, ``w * (c * c)``, ``w * (c * y)`` and ``w``), the NLL ``-ln(q)`` with
  ``q = c`` if ``y = 1`` else ``1 - c`` (``+inf`` at ``q = 0``; weight 0 adds 0) and the right
  decisions ``(c >= 0.5) = (y = 1)``.

Dialects: ``duckdb`` (``fsum``: compensated sums), ``spark``, ``bigquery``, ``snowflake``
(plain ``SUM``; the engine's order decides the last bits; merging states is exact).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from torchcal.engines.state import REJECT_REASONS, UNGROUPED, BinnedState, StateHeader
from torchcal.functional._validation import check_int
from torchcal.functional.calibration.binning import BinnedStats

__all__ = ["DIALECTS", "quote", "state_from_rows", "state_sql"]

DIALECTS = ("duckdb", "spark", "bigquery", "snowflake")

_D = {  # per dialect: the few spellings that differ
    "duckdb": {
        "double": "DOUBLE",
        "int": "INTEGER",
        "str": "VARCHAR",
        "isnan": "isnan({})",
        "sum": "fsum",
        "q": '"',
    },
    "spark": {
        "double": "DOUBLE",
        "int": "INT",
        "str": "STRING",
        "isnan": "isnan({})",
        "sum": "SUM",
        "q": "`",
    },
    "bigquery": {
        "double": "FLOAT64",
        "int": "INT64",
        "str": "STRING",
        "isnan": "IS_NAN({})",
        "sum": "SUM",
        "q": "`",
    },
    "snowflake": {
        "double": "DOUBLE",
        "int": "INTEGER",
        "str": "VARCHAR",
        "isnan": "({} = 'NaN'::DOUBLE)",
        "sum": "SUM",
        "q": '"',
    },
}


def quote(name: str, dialect: str) -> str:
    """``name`` as a quoted identifier of ``dialect`` (the quote character doubled inside).

    Example:
        >>> print(quote('a"b', "duckdb"), quote("p", "spark"))
        "a""b" `p`
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"column: expected a non-empty name, got {name!r}")
    q = _D[dialect]["q"]
    return q + name.replace(q, q + q) + q


def state_sql(
    source: str,
    *,
    preds: str,
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int = 10,
    dialect: str = "duckdb",
) -> str:
    """The query computing the binned state of ``source`` (a table name or a table expression
    such as ``read_parquet('x/*.parquet')``; inserted as given) in ``dialect``.

    Output columns: ``reason`` (NULL for kept rows), ``grp`` (the group as a string, ``'all'``
    without ``group``), ``bin`` (NULL for rejected rows), ``n``, ``sum_c``, ``sum_y``,
    ``sum_c2``, ``sum_cy``, ``sum_w`` (NULL when unweighted), ``nll``, ``hits``.

    Example:
        >>> sql = state_sql("t", preds="p", label="y", n_bins=10)
        >>> "LEAST(FLOOR(c * 10), 9)" in sql and "CAST(\\"p\\" AS DOUBLE)" in sql
        True
    """
    if dialect not in DIALECTS:
        raise ValueError(f"dialect: expected one of {DIALECTS}, got {dialect!r}")
    B = check_int("n_bins", n_bins, minimum=1)
    d = _D[dialect]
    dbl, S = d["double"], d["sum"]
    inf = f"CAST('inf' AS {dbl})"
    col = {"p": quote(preds, dialect), "y": quote(label, dialect)}
    g = f"CAST({quote(group, dialect)} AS {d['str']})" if group else "'all'"
    w = f"CAST({quote(weight, dialect)} AS {dbl})" if weight else f"CAST(1 AS {dbl})"
    isnan = d["isnan"].format("c")
    checks = [
        "WHEN c IS NULL THEN 'preds_null'",
        f"WHEN {isnan} THEN 'preds_nan'",
        "WHEN c < 0 OR c > 1 THEN 'preds_out_of_range'",
        "WHEN y IS NULL OR NOT (y = 0 OR y = 1) THEN 'label_invalid'",
        "WHEN g IS NULL THEN 'group_null'",
    ]
    if weight:
        checks.append(f"WHEN w IS NULL OR NOT (w >= 0 AND w < {inf}) THEN 'weight_invalid'")
    case = "\n".join("      " + c for c in checks)
    if weight:
        sums = (
            f"{S}(w * c) AS sum_c, {S}(w * y) AS sum_y, {S}(w * (c * c)) AS sum_c2, "
            f"{S}(w * (c * y)) AS sum_cy, {S}(w) AS sum_w, "
            f"{S}(CASE WHEN w = 0 THEN 0 ELSE w * nll END) AS nll, {S}(w * hit) AS hits"
        )
    else:
        sums = (
            f"{S}(c) AS sum_c, {S}(y) AS sum_y, {S}(c * c) AS sum_c2, {S}(c * y) AS sum_cy, "
            f"CAST(NULL AS {dbl}) AS sum_w, {S}(nll) AS nll, {S}(hit) AS hits"
        )
    sql = f"""WITH src AS (
  SELECT CAST({col["p"]} AS {dbl}) AS c, CAST({col["y"]} AS {dbl}) AS y, {g} AS g, {w} AS w
  FROM {source}
), checked AS (
  SELECT c, y, g, w, CASE
{case}
    END AS reason
  FROM src
), kept AS (
  SELECT reason, g,
    CASE WHEN reason IS NULL THEN CAST(LEAST(FLOOR(c * {B}), {B - 1}) AS {d["int"]}) END AS bin,
    CASE WHEN reason IS NULL THEN c END AS c,
    CASE WHEN reason IS NULL THEN y END AS y,
    CASE WHEN reason IS NULL THEN w END AS w,
    CASE WHEN reason IS NOT NULL THEN NULL
      WHEN (CASE WHEN y = 1 THEN c ELSE 1 - c END) > 0
      THEN -LN(CASE WHEN y = 1 THEN c ELSE 1 - c END) ELSE {inf} END AS nll,
    CASE WHEN reason IS NOT NULL THEN NULL
      WHEN (c >= 0.5) = (y = 1) THEN CAST(1 AS {dbl}) ELSE CAST(0 AS {dbl}) END AS hit
  FROM checked
)
SELECT reason, g AS grp, bin, COUNT(*) AS n, {sums}
FROM kept
GROUP BY reason, g, bin"""
    return re.sub(r"[ \t]+\n", "\n", sql)


def state_from_rows(rows: Iterable[Sequence[Any]], header: StateHeader) -> BinnedState:
    """The :class:`~torchcal.engines.state.BinnedState` of the rows :func:`state_sql` returns
    (``header`` gives the configuration; ``rows_seen``/``rows_rejected`` are filled in)."""
    rows = list(rows)
    rejected = dict.fromkeys(REJECT_REASONS, 0)
    kept = []
    for r in rows:
        if r[0] is None:
            kept.append(r)
        else:
            rejected[r[0]] += int(r[3])
    seen = sum(int(r[3]) for r in rows)
    names = sorted({str(r[1]) for r in kept}) or [UNGROUPED]
    pos = {g: i for i, g in enumerate(names)}
    B = header.n_bins
    shape = (len(names), 1, B)
    count = np.zeros(shape, np.int64)
    vals = np.zeros((7, *shape), np.float64)  # sum_c, sum_y, sum_c2, sum_cy, sum_w, nll, hits
    for r in kept:
        gi, b = pos[str(r[1])], int(r[2])
        count[gi, 0, b] = int(r[3])
        vals[:, gi, 0, b] = [np.nan if v is None else float(v) for v in r[4:11]]
    t = [torch.from_numpy(v.copy()) for v in vals]
    weighted = header.weight is not None
    stats = BinnedStats(torch.from_numpy(count), *t[:4], weight=t[4] if weighted else None)
    h = StateHeader(**{**header.__dict__, "rows_seen": seen, "rows_rejected": rejected})
    return BinnedState(h, tuple(names), stats, t[5], t[6])
