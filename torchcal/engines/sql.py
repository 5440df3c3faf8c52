"""The binned state as one SQL query, generated from the one bin rule for each dialect.

:func:`state_sql` writes a ``SELECT`` that reads the prediction, label (and optional group and
weight) columns of a source, checks every row, bins it and sums it, grouped by
``(reason, group, bin)``: rows never leave the engine, and the result has one row per
non-empty cell plus one row per (reason, group) of rejected rows. The rule, as in
:func:`torchcal.functional.calibration.binning.bin_ids` (docs/design.md sections 3 and 6e):

* ``c = CAST(p AS DOUBLE)`` **before** ``* B`` (a FLOAT column times ``B`` in float32 moves
  ``0.3 * 10`` across the edge); ``bin = CAST(LEAST(FLOOR(c * B), B - 1) AS INTEGER)``, so
  ``1.0`` is in the last bin (``width_bucket`` puts it in bin ``B + 1``);
* rows are rejected, first reason first: ``preds_null``, ``preds_nan``, ``preds_out_of_range``
  (outside [0, 1]), ``label_invalid`` (NULL or not 0/1), ``group_null``, ``weight_invalid``
  (NULL, NaN, or not 0 nor in [1e-100, 1e100]); they are counted by reason and enter no sum;
* per cell: ``COUNT(*)`` (an integer), the sums of ``c``, ``y``, ``c * c``, ``c * y`` (weighted:
  ``w * c``, ``w * y``, ``w * (c * c)``, ``w * (c * y)``, ``w`` and ``w * w``), the NLL ``-ln(q)`` with
  ``q = c`` if ``y = 1`` else ``1 - c`` (``+inf`` at ``q = 0``; weight 0 adds 0) and the right
  decisions ``(c >= 0.5) = (y = 1)``.

Dialects: ``duckdb`` (``fsum``: compensated sums), ``spark``, ``bigquery``, ``snowflake``
(plain ``SUM``; the engine's order decides the last bits; merging states is exact).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from torchcal.engines._state_checks import check_cells
from torchcal.engines.rules import WHITE_SPACE, WHITE_SPACE_RE, Sql, sql_case
from torchcal.engines.state import REJECT_REASONS, UNGROUPED, BinnedState, StateHeader
from torchcal.engines.text import NAN_PAYLOAD_RE, NUMBER_RE, PERCENT_RE, TEXT_KINDS
from torchcal.functional._checks import check_int
from torchcal.functional._validation import probability_sum_tolerance
from torchcal.functional.calibration.binning import BinnedStats

__all__ = ["state_sql"]

DIALECTS = ("duckdb", "spark", "bigquery", "snowflake")

_WS = WHITE_SPACE_RE  # white space as Python's str.strip() sees it (\s is ASCII in RE2, Java)
_F = _WS.replace("{", "{{").replace("}", "}}")  # inside a template of str.format
_FS = _F.replace("\\", "\\\\")  # ... in Spark's literals (it unescapes backslashes)
#: whether text ``{0}`` may start with white space (a byte comparison: every white-space code
#: point is <= U+0020 or >= U+0085), so the regular expression runs on few rows (10^7 group
#: names: 0.05 s against 0.4 s for the regular expression on every row, DuckDB 2.0.1)
_EDGE = "({0} < '!' OR {0} >= chr(133))"
_ENDS = f"{_EDGE} OR {_EDGE.format('right({0}, 1)')}"  # ... or end with it
_D = {  # per dialect: the few spellings that differ
    "duckdb": {
        "double": "DOUBLE",
        "int": "INTEGER",
        "str": "VARCHAR",
        "isnan": "isnan({})",
        "sum": "fsum",
        "q": '"',
        "match": "regexp_full_match({}, '{}')",
        "strip": f"CASE WHEN {_ENDS} THEN regexp_replace({{0}}, '^{_F}+|{_F}+$', '', 'g') "
        "ELSE {0} END",
        "blank": f"({_EDGE} AND regexp_full_match({{0}}, '{_F}*'))",
        "hash": "hash({})",
    },
    "spark": {
        "double": "DOUBLE",
        "int": "INT",
        "str": "STRING",
        "isnan": "isnan({})",
        "sum": "SUM",
        "q": "`",
        "match": "({} RLIKE '^(?:{})$')",
        "strip": f"CASE WHEN {_ENDS} THEN regexp_replace({{0}}, '^{_FS}+|{_FS}+$', '') "
        "ELSE {0} END",
        "blank": f"({_EDGE} AND {{0}} RLIKE '^{_FS}*$')",
        "hash": "xxhash64({})",
    },
    "bigquery": {
        "double": "FLOAT64",
        "int": "INT64",
        "str": "STRING",
        "isnan": "IS_NAN({})",
        "sum": "SUM",
        "q": "`",
        "blank": f"REGEXP_CONTAINS({{}}, r'^{_F}*$')",
    },
    "snowflake": {
        "double": "DOUBLE",
        "int": "INTEGER",
        "str": "VARCHAR",
        "isnan": "({} = 'NaN'::DOUBLE)",
        "sum": "SUM",
        "q": '"',
        "blank": f"(TRIM({{}}, {' || '.join(f'CHR({c})' for c in WHITE_SPACE)}) = '')",
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


def _as_columns(preds: str | Sequence[str]) -> list[str]:
    cols = [preds] if isinstance(preds, str) else list(preds)
    if not cols:
        raise ValueError("preds: expected a column name or C >= 2 class columns, got none")
    return cols


def _regex(pattern: str, dialect: str) -> str:
    """``pattern`` inside a SQL string literal of ``dialect`` (``\\s``: Python's white space,
    :data:`~torchcal.engines.rules.WHITE_SPACE`; Spark unescapes backslashes)."""
    pattern = pattern.replace("\\s", _WS)
    if dialect == "spark":
        pattern = pattern.replace("\\", "\\\\")
    return pattern.replace("'", "''")


def text_value_sql(column: str, kind: str, dialect: str) -> tuple[str, str, str]:
    """Three SQL expressions over a text column: its value as DOUBLE by the readers' rule for
    ``kind`` (NULL when blank or unparsed), whether it is unparsed (text that is no value),
    and whether it was read as a percent. A percent is the decimal's digits divided by the
    power of ten once (``85.5%`` = 855 / 1000: one rounding, as ``Decimal / 100``, for up to
    15 digits).

    Example:
        >>> v, bad, pct = text_value_sql("p", "stated", "duckdb")
        >>> "regexp_full_match" in v and "%" in pct
        True
    """
    if kind not in TEXT_KINDS:
        raise ValueError(f"kind: expected one of {TEXT_KINDS}, got {kind!r}")
    d = _D[dialect]
    if "match" not in d:
        raise ValueError(f"dialect: {dialect!r} reads numeric columns only (no text parsing)")
    dbl = d["double"]
    t = d["strip"].format(quote(column, dialect))
    is_num = d["match"].format(t, _regex(NUMBER_RE, dialect))
    is_nan = d["match"].format(t, _regex(NAN_PAYLOAD_RE, dialect))
    # (condition, value), first match wins
    forms = [(is_num, f"CAST({t} AS {dbl})"), (is_nan, f"CAST('NaN' AS {dbl})")]
    pct = "FALSE"
    if kind == "label":
        forms.append((f"lower({t}) = 'true'", f"CAST(1 AS {dbl})"))
        forms.append((f"lower({t}) = 'false'", f"CAST(0 AS {dbl})"))
    if kind == "stated":
        pct = d["match"].format(t, _regex(PERCENT_RE, dialect))
        tail = _regex(r"\s*%$", dialect)
        core = f"regexp_replace({t}, '{tail}', '')"
        pos = "strpos" if dialect == "duckdb" else "instr"
        frac = f"(CASE WHEN {pos}({core}, '.') > 0 THEN length({core}) - {pos}({core}, '.') ELSE 0 END)"
        digits = f"CAST(replace({core}, '.', '') AS {dbl})"
        forms.append((pct, f"{digits} / POWER(10, {frac} + 2)"))
    value = "CASE " + " ".join(f"WHEN {c} THEN {v}" for c, v in forms) + " END"
    unparsed = f"({t} IS NOT NULL AND NOT ({' OR '.join(c for c, _ in forms)}))"
    return value, unparsed, f"COALESCE({pct}, FALSE)"


def checked_rows_sql(
    source: str,
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int = 10,
    dialect: str = "duckdb",
    text: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> str:
    """The ``WITH`` clause shared by :func:`state_sql` and the queries of the sample and the
    value grid: CTEs ``src`` (casts; columns named in ``text`` are parsed by the readers' rule,
    :func:`text_value_sql`), ``checked`` (``reason``), ``conf`` (``c``) and ``kept`` /
    ``scored`` (``bin``, ``c``, ``o`` the outcome, ``w``, ``nll``, ``hit``; NULL on rejected
    rows); ``extra`` columns ride along as text ``s0``, ``s1``, ... (the segments)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect: expected one of {DIALECTS}, got {dialect!r}")
    B = check_int("n_bins", n_bins, minimum=1)
    cols = _as_columns(preds)
    C = len(cols)
    d = _D[dialect]
    dbl = d["double"]
    inf = f"CAST('inf' AS {dbl})"
    as_text = set(text)

    def value(col: str, kind: str) -> str:
        if col in as_text:
            return text_value_sql(col, kind, dialect)[0]
        return f"CAST({quote(col, dialect)} AS {dbl})"

    g = f"CAST({quote(group, dialect)} AS {d['str']})" if group else "'all'"
    w = value(weight, "number") if weight else f"CAST(1 AS {dbl})"
    ps = [f"p{k}" for k in range(C)]
    cast = ", ".join(f"{value(c, 'stated')} AS {v}" for c, v in zip(cols, ps))
    unparsed = [text_value_sql(c, "stated", dialect)[1] for c in cols if c in as_text]
    bad_text = f"({' OR '.join(unparsed)})" if unparsed else "FALSE"
    tol = repr(float(probability_sum_tolerance(torch.float64, C)))
    rules = sql_case(Sql(ps, d["isnan"], inf, tol, d["blank"]), weighted=bool(weight))
    checks = rules.splitlines()
    case = "\n".join("      " + c for c in checks)
    pv = ", ".join(ps)
    ex = "".join(f", s{k}" for k in range(len(extra)))
    ex_src = "".join(
        f", CAST({quote(c, dialect)} AS {d['str']}) AS s{k}" for k, c in enumerate(extra)
    )
    if C == 1:
        conf = "p0"
        outcome = "CASE WHEN reason IS NULL THEN y END"
        q = "(CASE WHEN y = 1 THEN c ELSE 1 - c END)"
        hit = f"""CASE WHEN reason IS NOT NULL THEN NULL
      WHEN (c >= 0.5) = (y = 1) THEN CAST(1 AS {dbl}) ELSE CAST(0 AS {dbl}) END"""
    else:
        conf = f"GREATEST({pv})"
        first = " ".join(f"WHEN {v} = c THEN {k}" for k, v in enumerate(ps))
        outcome = f"""CASE WHEN reason IS NOT NULL THEN NULL
      WHEN (CASE {first} END) = y THEN CAST(1 AS {dbl}) ELSE CAST(0 AS {dbl}) END"""
        q = "(CASE " + " ".join(f"WHEN y = {k} THEN {v}" for k, v in enumerate(ps)) + " END)"
        hit = "o"
    sql = f"""WITH src AS (
  SELECT {cast}, {value(label, "label")} AS y, {g} AS g, {w} AS w, {bad_text} AS u{ex_src}
  FROM {source}
), checked AS (
  SELECT {pv}, y, g, w{ex}, CASE
{case}
    END AS reason
  FROM src
), conf AS (
  SELECT reason, g, y, w, {pv}{ex}, CASE WHEN reason IS NULL THEN {conf} END AS c
  FROM checked
), kept AS (
  SELECT reason, g, y, {pv}{ex},
    CAST(LEAST(FLOOR(c * {B}), {B - 1}) AS {d["int"]}) AS bin,
    c,
    {outcome} AS o,
    CASE WHEN reason IS NULL THEN w END AS w,
    CASE WHEN reason IS NOT NULL THEN NULL
      WHEN {q} > 0 THEN -LN({q}) ELSE {inf} END AS nll
  FROM conf
), scored AS (
  SELECT reason, g, y, {pv}{ex}, bin, c, o, w, nll, {hit} AS hit
  FROM kept
)"""
    return re.sub(r"[ \t]+\n", "\n", sql)


def state_sql(
    source: str,
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int = 10,
    dialect: str = "duckdb",
    text: Sequence[str] = (),
) -> str:
    """The query computing the binned state of ``source`` (a table name or a table expression
    such as ``read_parquet('x/*.parquet')``; inserted as given) in ``dialect``. ``preds``: one
    P(y = 1) column (binary reading, 0/1 labels) or C >= 2 class-probability columns (the
    confidence reading: ``c`` the row maximum, the outcome whether the first arg-max is the
    label, rows summing to 1 within the in-memory tolerance, else ``preds_not_normalised``).

    Output columns: ``reason`` (NULL for kept rows), ``grp`` (the group as a string, ``'all'``
    without ``group``), ``bin`` (NULL for rejected rows), ``n``, ``sum_c``, ``sum_y``,
    ``sum_c2``, ``sum_cy``, ``sum_w`` (NULL when unweighted), ``nll`` (over the rows whose
    label got a probability above 0), ``hits``, ``saturated`` (kept rows with a probability
    exactly 0 or 1), ``sum_w2`` (the sum of ``w * w``; NULL when unweighted), ``nll_inf``
    (the rows, weight above 0, whose label got probability 0: their NLL is infinite, counted
    apart as the in-process audit counts them). Columns named
    in ``text`` are text parsed by the readers' rule (:func:`text_value_sql`; a value that is
    no number nor percent is ``preds_unparsed``).

    Example:
        >>> sql = state_sql("t", preds="p", label="y", n_bins=10)
        >>> "LEAST(FLOOR(c * 10), 9)" in sql and "CAST(\\"p\\" AS DOUBLE)" in sql
        True
    """
    with_sql = checked_rows_sql(
        source,
        preds=preds,
        label=label,
        group=group,
        weight=weight,
        n_bins=n_bins,
        dialect=dialect,
        text=text,
    )
    d = _D[dialect]
    dbl, S = d["double"], d["sum"]
    inf = f"CAST('inf' AS {dbl})"
    if weight:
        sums = (
            f"{S}(w * c) AS sum_c, {S}(w * o) AS sum_y, {S}(w * (c * c)) AS sum_c2, "
            f"{S}(w * (c * o)) AS sum_cy, {S}(w) AS sum_w, "
            f"{S}(CASE WHEN w = 0 OR nll = {inf} THEN 0 ELSE w * nll END) AS nll, "
            f"{S}(w * hit) AS hits"
        )
        n_inf = f"SUM(CASE WHEN w > 0 AND nll = {inf} THEN 1 ELSE 0 END)"
    else:
        sums = (
            f"{S}(c) AS sum_c, {S}(o) AS sum_y, {S}(c * c) AS sum_c2, {S}(c * o) AS sum_cy, "
            f"CAST(NULL AS {dbl}) AS sum_w, {S}(CASE WHEN nll = {inf} THEN 0 ELSE nll END) "
            f"AS nll, {S}(hit) AS hits"
        )
        n_inf = f"SUM(CASE WHEN nll = {inf} THEN 1 ELSE 0 END)"

    pv = [f"p{k}" for k in range(len(_as_columns(preds)))]
    edge = " OR ".join(f"{v} = 0 OR {v} = 1" for v in pv)
    sat = f"SUM(CASE WHEN reason IS NULL AND ({edge}) THEN 1 ELSE 0 END) AS saturated"
    w2 = f"{S}(w * w)" if weight else f"CAST(NULL AS {dbl})"
    return f"""{with_sql}
SELECT reason, g AS grp, bin, COUNT(*) AS n, {sums}, {sat}, {w2} AS sum_w2, {n_inf} AS nll_inf
FROM scored
GROUP BY reason, g, bin"""


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
    check_cells(len(names), 1, B, "groups")  # before allocating
    shape = (len(names), 1, B)
    count = np.zeros(shape, np.int64)
    # sum_c, sum_y, sum_c2, sum_cy, sum_w, nll, hits, sum_w2, nll_inf (after saturated)
    vals = np.zeros((9, *shape), np.float64)
    for r in kept:
        gi, b = pos[str(r[1])], int(r[2])
        count[gi, 0, b] = int(r[3])
        got = [*r[4:11], r[12] if len(r) > 12 else None, r[13] if len(r) > 13 else 0]
        vals[:, gi, 0, b] = [np.nan if v is None else float(v) for v in got]
    t = [torch.from_numpy(v.copy()) for v in vals]
    weighted = header.weight is not None
    stats = BinnedStats(
        torch.from_numpy(count), t[0], t[1], t[2], t[3],
        weight=t[4] if weighted else None, weight2=t[7] if weighted else None,
    )  # fmt: skip
    sat = sum(int(r[11] or 0) for r in kept if len(r) > 11)
    h = replace(header, rows_seen=seen, rows_rejected=rejected, rows_saturated=sat)
    return BinnedState(h, tuple(names), stats, t[5], t[6], nll_inf=t[8])


def header_for(
    preds: str | Sequence[str],
    label: str,
    *,
    group: str | None,
    weight: str | None,
    n_bins: int,
    producer: str,
) -> StateHeader:
    """The header of a state computed from these columns (the reading from their number)."""
    cols = _as_columns(preds)
    return StateHeader(
        n_bins=n_bins,
        reading="binary" if len(cols) == 1 else "confidence",
        num_classes=len(cols),
        columns={"preds": cols, "label": label},
        group=group,
        weight=weight,
        producer=producer,
    )
