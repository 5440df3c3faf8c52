"""Segments of the audit on every engine (docs/design.md section 6g.1): the rule of each segment
column, the crosses, and the per-segment binned sums, from SQL (one ``GROUPING SETS`` query)
or from the streaming reader (:mod:`torchcal.audit.segments`).

A column's rule is fixed from its kept rows' distinct texts and counts, the same on every road
(:func:`column_rule`): a column whose every text is a finite number by the readers' rule
(:func:`~torchcal.engines.text.parse_text`) is numeric, unless its values are integers with at
most :data:`MAX_INTEGER_CODES` distinct values (codes, as integer tensors are in
:func:`~torchcal.functional.multicalibration.segment_masks`); every other column is
categorical (each text a value, ascending by code point; integer codes by value). A numeric column with at most ``bins`` distinct numbers keeps them;
otherwise it is cut at its exact ``k / bins`` quantiles of the rows (linear interpolation
between order statistics, as :func:`torch.quantile`; repeated edges merged), a bucket holding
``(e_{k-1}, e_k]`` (the first also everything below). Segments are every cross of up to
``depth`` columns (columns in the given order, values ascending), the segments with fewer than
``min_rows`` rows left out and counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchcal.engines.fine_sql import fine_of, fine_sums
from torchcal.engines.sql import _D, checked_rows_sql, text_value_sql
from torchcal.engines.text import parse_text
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.histogram_scores import FINE_BINS, MAX_FINE_GROUPS, FineHistogram

KINDS = ("category", "values", "edges")
#: an integer column with at most this many distinct values is categorical (codes)
MAX_INTEGER_CODES = 32
#: DuckDB's temporary table of the kept rows' bins, sums and segment texts
_TEMP = "torchcal_segment_rows"


@dataclass(frozen=True)
class ColumnRule:
    """How one segment column maps a text to its code: ``kind`` ``"category"`` (``values``:
    the texts ascending), ``"values"`` (``cuts``: its distinct numbers ascending) or
    ``"edges"`` (``cuts``: the inner bucket edges)."""

    name: str
    kind: str
    values: tuple[str, ...] = ()
    cuts: tuple[float, ...] = ()

    @property
    def size(self) -> int:
        """The number of codes (values or buckets)."""
        if self.kind == "category":
            return len(self.values)
        return len(self.cuts) + (self.kind == "edges")

    def label(self, code: int) -> str:
        """Code ``code`` in a segment's definition, after the column's name (``=en``,
        ``<=87``, `` in (87, 149]``, ``>871``)."""
        if self.kind == "category":
            return "=" + self.values[code]
        if self.kind == "values":
            return f"={self.cuts[code]:.6g}"
        lo = f"{self.cuts[code - 1]:.4g}" if code > 0 else None
        hi = f"{self.cuts[code]:.4g}" if code < len(self.cuts) else None
        return f"<={hi}" if lo is None else (f">{lo}" if hi is None else f" in ({lo}, {hi}]")

    def codes(self, texts: Sequence[str]) -> np.ndarray:
        """The code of each text (``-1``: a text the rule did not see)."""
        if self.kind == "category":
            pos = {t: i for i, t in enumerate(self.values)}
            return np.array([pos.get(t, -1) for t in texts], dtype=np.int64)
        v, bad = parse_text(list(texts), "number")
        cuts = np.asarray(self.cuts, dtype=np.float64)
        if self.kind == "edges":
            out = np.searchsorted(cuts, v, side="left").astype(np.int64)
        else:
            at = np.minimum(np.searchsorted(cuts, v), len(cuts) - 1)
            out = np.where(cuts[at] == v, at, -1).astype(np.int64)
        return np.where(bad | ~np.isfinite(v), -1, out)

    def to_dict(self) -> dict[str, Any]:
        """The rule as report.json lists it."""
        d: dict[str, Any] = {"column": self.name, "kind": self.kind, "size": self.size}
        if self.kind != "category":
            d["edges" if self.kind == "edges" else "values"] = list(self.cuts)
        return d


def quantile_edges(values: np.ndarray, counts: np.ndarray, bins: int) -> list[float]:
    """The ``k / bins`` quantiles (``k = 0..bins``) of the rows with sorted distinct ``values``
    repeated ``counts`` times, by :func:`torch.quantile`'s rule (``rank = q (n - 1)``, the
    order statistics below and above it, ``lerp``): equal to it on the expanded rows.

    Example:
        >>> quantile_edges(np.array([1.0, 2.0, 10.0]), np.array([2, 1, 1]), 2)
        [1.0, 1.5, 10.0]
    """
    n = int(counts.sum())
    q = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    ranks = q * (n - 1)
    below, above = ranks.to(torch.int64), ranks.ceil().to(torch.int64)
    ends = np.cumsum(counts)  # order statistic k is values[first index with ends > k]
    v_lo = torch.from_numpy(values[np.searchsorted(ends, below.numpy(), side="right")])
    v_hi = torch.from_numpy(values[np.searchsorted(ends, above.numpy(), side="right")])
    return v_lo.lerp(v_hi, ranks - below).tolist()


def column_rule(name: str, texts: Sequence[str], counts: Sequence[int], bins: int) -> ColumnRule:
    """The rule of column ``name`` from its kept rows' distinct ``texts`` and their ``counts``
    (module docstring).

    Example:
        >>> column_rule("lang", ["en", "de"], [3, 2], 4).values
        ('de', 'en')
        >>> column_rule("len", [f"{i / 2}" for i in range(8)], [1] * 8, 2).cuts
        (1.75,)
        >>> column_rule("tier", ["1", "2", "3"], [5, 5, 5], 2).kind  # integer codes
        'category'
    """
    v, bad = parse_text(list(texts), "number")
    if not texts or bad.any() or not np.isfinite(v).all():
        return ColumnRule(name, "category", tuple(sorted(texts)))
    if (v == np.round(v)).all() and np.unique(v).size <= MAX_INTEGER_CODES:  # codes
        return ColumnRule(name, "category", tuple(t for _, t in sorted(zip(v.tolist(), texts))))
    c = np.asarray(counts, dtype=np.int64)
    order = np.argsort(v, kind="stable")
    distinct, inv = np.unique(v[order], return_inverse=True)
    per = np.bincount(inv, weights=c[order]).astype(np.int64)
    if distinct.size <= bins:
        return ColumnRule(name, "values", cuts=tuple(distinct.tolist()))
    edges = sorted(set(quantile_edges(distinct, per, bins)))
    return ColumnRule(name, "edges", cuts=tuple(edges[1:-1]))


def crosses(n_columns: int, depth: int) -> list[tuple[int, ...]]:
    """The column combinations of depth 1..``depth``, in order."""
    return [
        c
        for d in range(1, min(depth, n_columns) + 1)
        for c in itertools.combinations(range(n_columns), d)
    ]


@dataclass(frozen=True)
class SegmentStats:
    """The binned sums of every kept segment: ``rules`` per column; ``cells`` ``(S, F)`` the
    code of each column in each segment (``-1``: free), in segment order; ``stats`` ``(S, 1,
    B)``; ``skipped`` segments under ``min_rows`` rows; ``depth``, ``bins``, ``min_rows``;
    ``fine`` the segments' :class:`~torchcal.functional.histogram_scores.FineHistogram` ``(S,
    FINE_BINS)`` (the resolution: distinct values, top share, AUROC), ``None`` when more than
    :data:`~torchcal.functional.histogram_scores.MAX_FINE_GROUPS` segments were found (kept or
    not; the groups' memory cap)."""

    rules: tuple[ColumnRule, ...]
    cells: torch.Tensor
    stats: BinnedStats
    skipped: int
    depth: int
    bins: int
    min_rows: int
    fine: FineHistogram | None = None

    def names(self) -> list[str]:
        """Each segment's definition (``lang=en & len=(0.2, 0.4]``)."""
        return [
            " & ".join(
                f"{self.rules[j].name}{self.rules[j].label(v)}" for j, v in enumerate(row) if v >= 0
            )
            for row in self.cells.tolist()
        ]


def finish(
    rules: Sequence[ColumnRule],
    cells: np.ndarray,
    count: np.ndarray,
    sums: np.ndarray,
    weight: np.ndarray | None,
    *,
    weight2: np.ndarray | None = None,
    fine: FineHistogram | None = None,
    depth: int,
    bins: int,
    min_rows: int,
) -> SegmentStats:
    """The :class:`SegmentStats` of found cells ``(M, F)`` (any order) with ``count`` ``(M,
    B)`` and ``sums`` ``(M, B, 4)`` (``sum c``, ``sum y``, ``sum c c``, ``sum c y``; weighted:
    times ``w``, ``weight`` ``(M, B)`` the weights and ``weight2`` their squares) and ``fine``
    ``(M, FINE_BINS)`` in the same order (or ``None``): segments in order, small ones out."""
    F = len(rules)
    rank = {c: i for i, c in enumerate(crosses(F, depth))}
    n = count.sum(1)
    keep = n >= min_rows
    free = cells < 0
    key = [rank[tuple(np.flatnonzero(~f).tolist())] for f in free]
    order = sorted(np.flatnonzero(keep).tolist(), key=lambda i: (key[i], *cells[i].tolist()))
    idx = np.asarray(order, dtype=np.int64)
    t = torch.from_numpy

    def lead(x: np.ndarray) -> torch.Tensor:
        return t(np.ascontiguousarray(x[idx]))[:, None]

    s = sums.reshape(-1, count.shape[1], 4)
    extra = {}  # the squared weights, where BinnedStats keeps them (effective sample size)
    if weight2 is not None and "weight2" in BinnedStats.__dataclass_fields__:
        extra["weight2"] = lead(weight2)
    stats = BinnedStats(
        lead(count.astype(np.int64)),
        lead(s[..., 0]), lead(s[..., 1]), lead(s[..., 2]), lead(s[..., 3]),
        weight=None if weight is None else lead(weight),
        **extra,
    )  # fmt: skip
    kept_fine = None if fine is None else fine.take(torch.from_numpy(idx))
    return SegmentStats(
        tuple(rules), t(np.ascontiguousarray(cells[idx]).reshape(-1, F)), stats,
        int((~keep & (n > 0)).sum()), depth, bins, min_rows, kept_fine,
    )  # fmt: skip


Run = Callable[[str], Sequence[Sequence[Any]]]


def _with(source: str, kw: dict[str, Any], columns: Sequence[str]) -> str:
    return checked_rows_sql(source, n_bins=kw["n_bins"], extra=tuple(columns), **_kw(kw))


def _kw(kw: dict[str, Any]) -> dict[str, Any]:
    keys = ("preds", "label", "group", "weight", "dialect", "text")
    return {k: kw[k] for k in keys}


def _bucket_sql(rule: ColumnRule, var: str, dialect: str) -> str:
    """The code expression of ``rule`` on the text column ``var`` (a category: the text; a
    number: its value, or the count of inner edges below it)."""
    if rule.kind == "category":
        return var
    value = text_value_sql(var, "number", dialect)[0]
    if rule.kind == "values":
        return value
    dbl = _D[dialect]["double"]
    terms = [f"CASE WHEN {value} > CAST('{e!r}' AS {dbl}) THEN 1 ELSE 0 END" for e in rule.cuts]
    return "(" + " + ".join(terms or ["0"]) + ")"


def segments_from_sql(
    run: Run,
    source: str,
    kw: dict[str, Any],
    columns: Sequence[str],
    *,
    depth: int,
    bins: int,
    min_rows: int,
) -> SegmentStats:
    """The segments of ``columns`` of ``source`` on a SQL engine: one query for the distinct
    texts of every column and their counts (``GROUPING SETS``; a missing value is an error),
    the rules in Python, then one ``GROUPING SETS`` query for the binned sums of every cross
    (DuckDB reads the kept rows from a temporary table written once) (``kw``: the state query's ``preds``, ``label``,
    ``group``, ``weight``, ``dialect``, ``text``, ``n_bins``)."""
    d = _D[kw["dialect"]]
    F = len(columns)
    sv = [f"s{k}" for k in range(F)]
    base = _with(source, kw, columns)
    kept = f"SELECT bin, c, o, w, {', '.join(sv)} FROM scored WHERE reason IS NULL"
    if kw["dialect"] == "duckdb":  # the kept rows once (the text parsed once), then two reads
        run(f"CREATE OR REPLACE TEMP TABLE {_TEMP} AS {base}\n{kept}")
        head, rows_of = "", _TEMP
    else:
        head, rows_of = f"{base}, seg_rows AS ({kept})\n", "seg_rows"
    sets = ", ".join(f"({v})" for v in sv)
    flags = ", ".join(f"GROUPING({v})" for v in sv)  # 0: the column is a key of the row
    rows = run(
        f"{head}SELECT {', '.join(sv)}, COUNT(*), {flags} FROM {rows_of} "
        f"GROUP BY GROUPING SETS ({sets})"
    )
    seen: list[dict[str, int]] = [{} for _ in range(F)]
    for r in rows:
        j = [int(x) for x in r[F + 1 :]].index(0)
        if r[j] is None:
            raise ValueError(f"--segments: column {columns[j]!r} has {int(r[F])} missing values")
        seen[j][str(r[j])] = seen[j].get(str(r[j]), 0) + int(r[F])
    rules = [
        column_rule(c, list(s), list(s.values()), bins) for c, s in zip(columns, seen, strict=True)
    ]
    bv = [f"b{k}" for k in range(F)]
    codes = ", ".join(
        f"{_bucket_sql(r, v, kw['dialect'])} AS {b}" for r, v, b in zip(rules, sv, bv, strict=True)
    )
    S = d["sum"]
    if kw["weight"]:
        agg = f"{S}(w * c), {S}(w * o), {S}(w * (c * c)), {S}(w * (c * o)), {S}(w), {S}(w * w)"
    else:
        null = f"CAST(NULL AS {d['double']})"
        agg = f"{S}(c), {S}(o), {S}(c * c), {S}(c * o), {null}, {null}"
    gsets = ", ".join(
        "(" + ", ".join([*(bv[j] for j in cr), "bin"]) + ")" for cr in crosses(F, depth)
    )
    q = (
        f"{head}SELECT {', '.join(bv)}, bin, COUNT(*), {agg} FROM (SELECT bin, c, o, w, {codes} "
        f"FROM {rows_of}) seg GROUP BY GROUPING SETS ({gsets})"
    )
    out = run(q)
    found = {tuple(r[:F]) for r in out}
    fine_rows = None
    if len(found) <= MAX_FINE_GROUPS:  # the fine histogram per segment (its resolution)
        FB = FINE_BINS
        fsets = ", ".join(
            "(" + ", ".join([*(bv[j] for j in cr), "k"]) + ")" for cr in crosses(F, depth)
        )
        fine_rows = run(
            f"{head}SELECT {', '.join(bv)}, k, COUNT(*), {fine_sums(S, bool(kw['weight']))} "
            f"FROM (SELECT c, o, w, "
            f"CAST(LEAST(FLOOR(c * {FB}), {FB - 1}) AS {d['int']}) AS k, {codes} "
            f"FROM {rows_of}) seg GROUP BY GROUPING SETS ({fsets})"
        )
    if not head:
        run(f"DROP TABLE {_TEMP}")
    return _cells(out, rules, kw, fine_rows, depth=depth, bins=bins, min_rows=min_rows)


def _cells(
    rows: Sequence[Sequence[Any]], rules: list[ColumnRule], kw: dict[str, Any],
    fine_rows: Sequence[Sequence[Any]] | None, **opts: int,
) -> SegmentStats:  # fmt: skip
    F, B = len(rules), int(kw["n_bins"])
    maps: list[dict[Any, int]] = []
    for rule in rules:
        if rule.kind == "category":
            maps.append({t: i for i, t in enumerate(rule.values)})
        elif rule.kind == "values":
            maps.append({v: i for i, v in enumerate(rule.cuts)})
        else:
            maps.append({})
    slot: dict[tuple[int, ...], int] = {}

    def cell_of(r: Sequence[Any]) -> tuple[int, ...]:
        cell = []
        for j in range(F):
            v = r[j]
            if v is None:
                cell.append(-1)
            elif rules[j].kind == "category":
                cell.append(maps[j][str(v)])
            elif rules[j].kind == "values":
                cell.append(maps[j][float(v)])
            else:
                cell.append(int(v))
        return tuple(cell)

    entries = []
    for r in rows:
        i = slot.setdefault(cell_of(r), len(slot))
        entries.append((i, int(r[F]), r))
    M = len(slot)
    count = np.zeros((M, B), np.int64)
    sums = np.zeros((M, B, 4), np.float64)
    weight = np.zeros((M, B), np.float64) if kw["weight"] else None
    weight2 = None if weight is None else weight.copy()
    for i, b, r in entries:
        count[i, b] = int(r[F + 1])
        sums[i, b] = [float(x) for x in r[F + 2 : F + 6]]
        if weight is not None and weight2 is not None:
            weight[i, b], weight2[i, b] = float(r[F + 6]), float(r[F + 7])
    cells = np.array(list(slot), dtype=np.int64).reshape(M, F)
    fine = None
    if fine_rows is not None:
        fcount = np.zeros((M, FINE_BINS), np.int64)
        fvals = np.zeros((7 if kw["weight"] else 3, M, FINE_BINS), np.float64)
        keys = [tuple(r[:F]) for r in fine_rows]
        lookup = {key: slot[cell_of(key)] for key in set(keys)}  # each segment parsed once
        at = np.array([lookup[key] for key in keys], dtype=np.int64)
        if at.size:
            vals = np.array([r[F:] for r in fine_rows], dtype=np.float64)  # k, n, 7 sums
            k = vals[:, 0].astype(np.int64)
            fcount[at, k] = vals[:, 1].astype(np.int64)
            fvals[:, at, k] = vals[:, 2:].T
        fine = fine_of(fcount, fvals)
    return finish(rules, cells, count, sums, weight, weight2=weight2, fine=fine, **opts)


def with_segments(result: Any, run: Run, source: str, opts: dict[str, Any] | None) -> Any:
    """``result`` (an :class:`~torchcal.engines.collect.EngineAudit`) with the segments of
    ``opts`` (``columns``, ``bins``, ``depth``, ``min_rows``, and the state query's ``kw``)
    computed by ``run``; unchanged without ``opts``."""
    if not opts:
        return result
    from dataclasses import replace

    kw = dict(opts["kw"])
    seg = segments_from_sql(
        run, source, kw, opts["columns"], depth=opts["depth"], bins=opts["bins"],
        min_rows=opts["min_rows"],
    )  # fmt: skip
    return replace(result, segments=seg)
