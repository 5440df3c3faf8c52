"""(internal) Columns by their exact names, on every road (docs/design.md section 6c.2): a
requested column must be in the source's header exactly once, under exactly this name
(names are case-sensitive everywhere, although DuckDB and Spark match identifiers without
case); the readers of :mod:`torchcal.audit` and the engines share this one check."""

from __future__ import annotations

from collections.abc import Sequence


def locate_columns(file: str, header: Sequence[str], wanted: Sequence[str]) -> list[int]:
    """The index of each ``wanted`` column in ``header``: an error names a missing column, or
    one whose name the header holds twice (which one is meant cannot be known).

    Example:
        >>> locate_columns("x.csv", ["a", "p", "a"], ["p"])
        [1]
        >>> locate_columns("x.csv", ["a", "p", "a"], ["a"])
        Traceback (most recent call last):
        ...
        ValueError: a: 2 columns of this name in x.csv (columns 1 and 3): rename one
    """
    idx = []
    for name in wanted:
        at = [j for j, h in enumerate(header) if h == name]
        if not at:
            cols = ", ".join(header)
            raise ValueError(f"{name}: no such column in {file} (columns: {cols})")
        if len(at) > 1:
            where = ", ".join(str(j + 1) for j in at[:-1]) + f" and {at[-1] + 1}"
            raise ValueError(
                f"{name}: {len(at)} columns of this name in {file} (columns {where}): rename one"
            )
        idx.append(at[0])
    return idx
