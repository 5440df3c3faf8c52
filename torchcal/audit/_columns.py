"""(internal) What every audit reader shares: the :class:`Chunk` it yields, group names to ids
(:class:`GroupIndex`) and the :class:`ReadLog` of rows it excluded. How a text value reads as a
number, a stated confidence or a label is :mod:`torchcal.engines.text` (one definition for
every reader, engine and SQL dialect; ``tests/audit/test_readers_differential.py``): the
readers call its :func:`~torchcal.engines.text.parse_value`.

:mod:`torchcal.audit.io` is the public face (it re-exports the public names); the CSV engines
(:mod:`torchcal.audit._csv`, :mod:`torchcal.audit._arrow`) and the array readers
(:mod:`torchcal.audit._arrays`) import this module, never each other's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from torchcal.engines.rules import blank


def shown(text: str, limit: int = 60) -> str:
    """``text`` as a message shows it: :func:`repr` of at most ``limit`` characters (then
    ``...``), so control characters and bytes that were not UTF-8 are escaped.

    Example:
        >>> print(shown("high"), shown("a" * 70, 8), shown("\\udcff!"), shown("a\\x1b[2J"))
        'high' 'aaaaaaaa...' '\\udcff!' 'a\\x1b[2J'
    """
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


@dataclass
class Excluded:
    """Rows of a column whose value did not parse: how many, and the first one (``where``:
    ``"line 17"`` in a CSV, ``"row 16"`` otherwise; ``text``: its value as read)."""

    column: str
    reason: str
    count: int
    where: str
    text: str


@dataclass
class ReadLog:
    """What a reader kept and left out, filled while it reads (final once it is exhausted):
    ``kept`` rows delivered, ``excluded`` rows left out by reason (a stated confidence that is
    neither a number nor a percent), ``blank_lines`` skipped in a CSV (not rows),
    ``percent`` per column: how many values were read as percents.

    Example:
        >>> log = ReadLog()
        >>> log.exclude("p", "not a number", "line 3", "high")
        >>> log.kept = 9
        >>> log.to_dict()["excluded"][0]["count"], log.rows, log.excluded_rows
        (1, 10, 1)
    """

    kept: int = 0
    excluded: dict[str, Excluded] = field(default_factory=dict)
    blank_lines: int = 0
    percent: dict[str, int] = field(default_factory=dict)
    #: rows left out by a rule of :data:`~torchcal.engines.rules.ROW_RULES` (out of range,
    #: NaN, not a class, a bad weight), by reason, and the first one as an error would say it
    rejected: dict[str, int] = field(default_factory=dict)
    first_rejected: str = ""
    first_rejected_at: int = -1  # its line (CSV) or row
    #: of the excluded rows, those whose confidence was an empty CSV field (NULL to an
    #: engine: ``preds_null``); not in :meth:`to_dict`
    missing: int = 0
    #: per column read leniently (a label, a weight): the first value that did not parse, as
    #: ``(where, text)``; the row reads NaN and a rule rejects it (not in :meth:`to_dict`)
    unparsed: dict[str, tuple[str, str]] = field(default_factory=dict)

    def exclude(self, column: str, reason: str, where: str, text: str, count: int = 1) -> None:
        """Count ``count`` rows left out; the first one's ``text`` is kept (at most 200
        characters, bytes that were not UTF-8 as ``\\xNN``)."""
        key = f"{column}: {reason}"
        if key in self.excluded:
            self.excluded[key].count += count
        else:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            self.excluded[key] = Excluded(column, reason, count, where, text[:200])

    @property
    def excluded_rows(self) -> int:
        return sum(e.count for e in self.excluded.values())

    @property
    def rows(self) -> int:
        """Data rows seen: kept plus excluded."""
        return self.kept + self.excluded_rows

    def to_dict(self) -> dict[str, object]:
        return {
            "rows": self.rows,
            "kept": self.kept,
            "excluded": [vars(e).copy() for e in self.excluded.values()],
            "blank_lines": self.blank_lines,
            "percent": dict(self.percent),
        }


@dataclass
class GroupIndex:
    """Group names to ids in order of first appearance; with ``null_blank`` a name that is
    only white space (:func:`~torchcal.engines.rules.blank`) gets the id -1 (``group_null``
    for the row rules) instead of being an error.

    Example:
        >>> g = GroupIndex(null_blank=True)
        >>> g.ids_of(["b", " ", "a"], np.array([0, 1, 2, 0])).tolist(), g.names
        ([0, -1, 1, 0], ['b', 'a'])
    """

    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    null_blank: bool = False

    def ids_of(self, uniques: Sequence[str], inverse: np.ndarray) -> np.ndarray:
        """Global ids of rows whose local value index is ``inverse`` into ``uniques``."""
        lut = np.empty(len(uniques), dtype=np.int64)
        for i, name in enumerate(uniques):
            if self.null_blank and blank(name):
                lut[i] = -1
                continue
            if name not in self.ids:
                self.ids[name] = len(self.names)
                self.names.append(name)
            lut[i] = self.ids[name]
        return lut[inverse]


@dataclass
class Chunk:
    """Rows of a file: ``columns`` maps each requested column to a float64 array (``(n,)``, or
    ``(n, C)`` for a 2-D column of an NPZ/.pt file); ``groups`` holds int64 ids into
    ``group_names`` (all names so far) or None; ``where(i)`` says where row ``i`` is in the file;
    ``done`` is the progress so far in :func:`torchcal.audit.io.progress_total`'s unit;
    ``index`` (arrays, when rows were excluded) each row's 0-based index in the file."""

    columns: dict[str, np.ndarray]
    groups: np.ndarray | None
    group_names: list[str]
    lines: np.ndarray | None  # CSV: each row's line number (where the row starts)
    offset: int  # index of the first row among all rows
    done: int
    index: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def where(self, i: int) -> str:
        if self.lines is not None:
            return f"line {int(self.lines[i])}"
        if self.index is not None:
            return f"row {int(self.index[i])}"
        return f"row {self.offset + i}"


def first_appearance(first: np.ndarray, inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Renumber distinct values (``first``: the row of each one's first occurrence, ``inverse``:
    each row's value) in order of first appearance.

    Example:
        >>> f, inv = first_appearance(np.array([1, 0]), np.array([1, 0, 1]))
        >>> f.tolist(), inv.tolist()
        ([0, 1], [0, 1, 0])
    """
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return first[order], rank[inverse]


def check_names(
    column: str,
    names: Sequence[str],
    inverse: np.ndarray,
    where: Callable[[int], str],
    null_blank: bool = False,
) -> None:
    """Group names must hold a visible character (``null_blank``: one that does not is
    ``group_null``, left to the row rules), and no NUL (``"a"`` and ``"a\\0"`` would look
    alike everywhere a name is shown, and numpy's string arrays drop trailing NULs) nor bytes
    that are not UTF-8."""
    for k, name in enumerate(names):
        problem = None
        if blank(name):
            if null_blank:
                continue
            problem = "empty group name"
        elif "\x00" in name:
            problem = f"group name {shown(name)} holds a NUL character"
        elif any("\udc80" <= ch <= "\udcff" for ch in name):
            problem = f"group name {shown(name)} is not UTF-8"
        if problem is not None:
            i = int(np.flatnonzero(inverse == k)[0])
            raise ValueError(f"{column}: {problem} at {where(i)}")
