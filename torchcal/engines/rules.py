"""The one table of why a row is rejected (docs/design.md sections 6c.2 and 6f).

Each :class:`RowRule` names a reason and gives its test twice, from the same definition: as a
SQL condition (:func:`sql_case`, every dialect of :mod:`torchcal.engines.sql`) and as a numpy
mask (:func:`reasons_of`, :func:`torchcal.engines.memory.state_from_arrays`). The rules run in
table order and a row counts under the first that applies. Variables on both sides: ``p`` the
prediction columns (``(N, C)``; ``C = 1`` is the binary reading), ``y`` the label, ``g`` the
group (``None``: ungrouped), ``w`` the weight (``None``: unweighted), ``u`` whether a text
confidence did not parse, ``tol`` the row-sum tolerance of the confidence reading.

A group value that is missing or only white space (Python's ``str.isspace``, the same 29
characters in SQL: :data:`WHITE_SPACE`) is ``group_null`` on every engine and reader: a name
that is only spaces is no name a report can show; any other name is kept as written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchcal.functional.calibration.weights import WEIGHT_MAX, WEIGHT_MIN

#: the characters ``str.isspace`` holds (``str.strip()`` removes them), as code points: the
#: one definition of white space for the text rules in SQL (``\s`` is ASCII in DuckDB's RE2
#: and Java's regex, Unicode in Python's ``re``)
WHITE_SPACE = (0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
               *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)  # fmt: skip
#: :data:`WHITE_SPACE` as a regular-expression class for RE2 (DuckDB, BigQuery) and Java (Spark)
WHITE_SPACE_RE = "[" + "".join(f"\\x{{{c:x}}}" for c in WHITE_SPACE) + "]"


def blank(value: object) -> bool:
    """Whether a group value is missing: ``None``, or text that is only white space.

    Example:
        >>> [blank(v) for v in (None, "", " \\t", "\\u3000", " a ", "0")]
        [True, True, True, True, False, False]
    """
    return value is None or (isinstance(value, str) and not value.strip())


@dataclass(frozen=True)
class Rows:
    """The numpy side's columns: ``p`` ``(N, C)`` float64, ``y`` float64, masks of NULL
    entries, ``g`` object names or None, ``w`` float64 or None, ``u`` unparsed mask;
    ``g_null`` the mask of missing or blank groups where a reader knows it (else it is
    computed from ``g`` by :func:`blank`)."""

    p: np.ndarray
    y: np.ndarray
    p_null: np.ndarray
    y_null: np.ndarray
    g: np.ndarray | None
    w: np.ndarray | None
    u: np.ndarray
    tol: float
    g_null: np.ndarray | None = None


@dataclass(frozen=True)
class Sql:
    """The SQL side's spellings: prediction variables ``ps``, ``isnan`` and ``inf`` of the
    dialect, the label range, ``tol``, and ``blank``: the dialect's test that a text is only
    :data:`WHITE_SPACE` (``{}`` the text; ``"FALSE"``: no test)."""

    ps: Sequence[str]
    isnan: str
    inf: str
    tol: str
    blank: str = "FALSE"


def _any(parts: Any) -> str:
    parts = list(parts)
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def _sum(p: np.ndarray) -> np.ndarray:
    total = p[:, 0].copy()
    for k in range(1, p.shape[1]):  # left to right, as the SQL adds them
        total = total + p[:, k]
    return total


def _label_bad(r: Rows) -> np.ndarray:
    C = r.p.shape[1]
    y = r.y
    ok = (y == 0) | (y == 1) if C == 1 else (y == np.floor(y)) & (y >= 0) & (y <= C - 1)
    return ~ok | r.y_null


def _weight_bad(r: Rows) -> np.ndarray:
    w = np.asarray(r.w, dtype=np.float64)
    return ~((w == 0) | ((w >= WEIGHT_MIN) & (w <= WEIGHT_MAX)))


def _group_bad(r: Rows) -> np.ndarray:
    if r.g_null is not None:
        return r.g_null
    return np.array([blank(v) for v in (r.g if r.g is not None else ())], bool)


def _label_sql(s: Sql) -> str:
    C = len(s.ps)
    if C == 1:
        return "y IS NULL OR NOT (y = 0 OR y = 1)"
    return f"y IS NULL OR NOT (y = FLOOR(y) AND y >= 0 AND y <= {C - 1})"


@dataclass(frozen=True)
class RowRule:
    """One reason: its name, what it means, when it applies (``"all"``, ``"classes"`` for
    C >= 2, ``"group"``, ``"weight"``), its SQL condition and its numpy mask."""

    reason: str
    meaning: str
    applies: str
    sql: Callable[[Sql], str]
    mask: Callable[[Rows], Any]  # a bool mask (N,)


ROW_RULES: tuple[RowRule, ...] = (
    RowRule("preds_unparsed", "a text confidence that is no number nor percent", "all",
            lambda s: "u", lambda r: r.u),
    RowRule("preds_null", "a missing prediction", "all",
            lambda s: _any(f"{v} IS NULL" for v in s.ps), lambda r: r.p_null.any(1)),
    RowRule("preds_nan", "a NaN prediction", "all",
            lambda s: _any(s.isnan.format(v) for v in s.ps), lambda r: np.isnan(r.p).any(1)),
    RowRule("preds_out_of_range", "a probability outside [0, 1]", "all",
            lambda s: _any(f"{v} < 0 OR {v} > 1" for v in s.ps),
            lambda r: ((r.p < 0) | (r.p > 1)).any(1)),
    RowRule("preds_not_normalised", "class probabilities not summing to 1 (within tol)",
            "classes", lambda s: f"ABS({' + '.join(s.ps)} - 1) > {s.tol}",
            lambda r: np.abs(_sum(r.p) - 1) > r.tol),
    RowRule("label_invalid", "a missing label, or not a class (0/1; [0, C) for C >= 2)", "all",
            _label_sql, _label_bad),
    RowRule("group_null", "a missing group, or one that is only white space", "group",
            lambda s: f"g IS NULL OR {s.blank.format('g')}",
            lambda r: _group_bad(r)),
    RowRule("weight_invalid", f"a missing or NaN weight, or one not 0 nor in [{WEIGHT_MIN:g}, "
            f"{WEIGHT_MAX:g}] (w * w would under- or overflow)", "weight",
            lambda s: f"w IS NULL OR NOT (w = 0 OR (w >= {WEIGHT_MIN!r} AND w <= {WEIGHT_MAX!r}))",
            lambda r: _weight_bad(r)),
)  # fmt: skip
#: why a row was left out, in the order the checks run (the first that applies counts)
REJECT_REASONS = tuple(r.reason for r in ROW_RULES)


def _applies(rule: RowRule, classes: int, grouped: bool, weighted: bool) -> bool:
    return {"all": True, "classes": classes >= 2, "group": grouped, "weight": weighted}[
        rule.applies
    ]


def sql_case(s: Sql, *, weighted: bool) -> str:
    """The ``CASE`` of the rules (``WHEN cond THEN 'reason'`` in table order; ungrouped
    sources have the constant group ``'all'``, so ``group_null`` never fires).

    Example:
        >>> print(sql_case(Sql(["p0"], "isnan({})", "inf", "1e-4"), weighted=False).splitlines()[2])
        WHEN isnan(p0) THEN 'preds_nan'
    """
    C = len(s.ps)
    return "\n".join(
        f"WHEN {r.sql(s)} THEN '{r.reason}'" for r in ROW_RULES if _applies(r, C, True, weighted)
    )


def reasons_of(rows: Rows) -> np.ndarray:
    """Each row's first reason as its index in :data:`REJECT_REASONS` (-1: kept).

    Example:
        >>> p = np.array([[0.5], [np.nan], [1.5], [0.2]])
        >>> z = np.zeros((4, 1), bool)
        >>> r = Rows(p, np.array([1.0, 0, 1, 2]), z, z[:, 0], None, None, z[:, 0], 1e-4)
        >>> [REJECT_REASONS[i] if i >= 0 else "kept" for i in reasons_of(r)]
        ['kept', 'preds_nan', 'preds_out_of_range', 'label_invalid']
    """
    n, C = rows.p.shape
    reason = np.full(n, -1, np.int8)
    with np.errstate(invalid="ignore"):
        for i, rule in enumerate(ROW_RULES):
            if _applies(rule, C, rows.g is not None, rows.w is not None):
                reason[(reason < 0) & rule.mask(rows)] = i
    return reason
