"""The binned state computed by DuckDB (in-process, no server) from Parquet/CSV files, a glob
of them, or a table of a DuckDB database: one query from :func:`~torchcal.engines.sql.state_sql`,
so rows never cross into Python (docs/design.md section 6f)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from torchcal.engines._names import locate_columns
from torchcal.engines.collect import EngineAudit, collect
from torchcal.engines.fine_sql import attach_fine, fine_query
from torchcal.engines.segments import with_segments
from torchcal.engines.sql import header_for, quote, state_from_rows, state_sql
from torchcal.engines.state import BinnedState, expand_paths

__all__ = ["state_from_duckdb"]

#: DuckDB (2.0.1) folds ``isnan(p)`` of a Parquet column to false from the file's min/max
#: statistics, which leave NaN out (and so would fold ``p > 1`` for a file whose only bad
#: values are NaN): every state query runs with statistics propagation off
NO_STATS = "SET disabled_optimizers = 'statistics_propagation'"

_READERS = {".parquet": "read_parquet", ".pq": "read_parquet", ".csv": "read_csv"}


def available() -> bool:
    """Whether :mod:`duckdb` can be imported."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def source_sql(source: str | os.PathLike[str], table: str | None = None) -> str:
    """The table expression of ``source``: a Parquet/CSV path or glob
    (``read_parquet('...')``/``read_csv('...')``), or with ``table`` a table of the DuckDB
    database file ``source``.

    Example:
        >>> source_sql("logs/part-*.parquet")
        "read_parquet('logs/part-*.parquet')"
    """
    s = os.fspath(source)
    if table is not None:
        parts = table.split(".")
        return "db." + ".".join('"' + p.replace('"', '""') + '"' for p in parts)
    ext = os.path.splitext(s)[1].lower()
    if ext not in _READERS:
        raise ValueError(
            f"{s}: expected a .parquet/.pq/.csv path or glob (or a DuckDB database with --table)"
        )
    if ext == ".csv":  # every field as text, parsed by the readers' rule (percents, True)
        return f"read_csv({_literal(s)}, all_varchar = true)"
    return f"{_READERS[ext]}({_literal(s)})"


def _connect(source: str, table: str | None, threads: int | None) -> Any:
    import duckdb

    con = duckdb.connect()
    con.execute(NO_STATS)
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    if table is not None:
        if not os.path.isfile(source):
            raise ValueError(f"{source}: no such DuckDB database")
        con.execute(f"ATTACH {_literal(source)} AS db (READ_ONLY)")
    return con


#: the DuckDB types whose text is a group name (docs/design.md section 6c.2: strings as
#: written, integers as their decimal digits, on every engine); other types are refused
GROUP_TYPES = ("VARCHAR", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
               "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT")  # fmt: skip


def _glob_literal(path: str) -> str:
    """``path`` as a DuckDB glob that matches only itself (``day[1].parquet`` is a file, not
    the character class ``[1]``): ``[``, ``*`` and ``?`` each inside a class."""
    return re.sub(r"[\[*?]", lambda m: f"[{m.group()}]", path)


def files_sql(files: Sequence[str]) -> str:
    """The table expression reading exactly ``files`` (Parquet or CSV, one format), each by
    its own name (glob characters escaped).

    Example:
        >>> files_sql(["day[1].parquet"])
        "read_parquet(['day[[]1].parquet'])"
    """
    exts = sorted({os.path.splitext(f)[1].lower() for f in files})
    for e in exts:
        if e not in _READERS:
            f = next(f for f in files if os.path.splitext(f)[1].lower() == e)
            raise ValueError(f"{f}: expected a .parquet/.pq/.csv file")
    if len({_READERS[e] for e in exts}) > 1:
        raise ValueError(f"source: the files mix formats ({', '.join(exts)}); audit one at a time")
    lit = "[" + ", ".join(_literal(_glob_literal(f)) for f in files) + "]"
    if exts == [".csv"]:  # every field as text, parsed by the readers' rule (percents, True)
        return f"read_csv({lit}, all_varchar = true)"
    return f"read_parquet({lit})"


def _file_columns(con: Any, path: str) -> list[str]:
    """The column names of one Parquet/CSV file exactly as written (DuckDB renames names
    that differ only in case, ``P`` -> ``P_1``, and matches names case-insensitively)."""
    import duckdb

    try:
        if os.path.splitext(path)[1].lower() == ".csv":
            row = con.execute(
                f"SELECT * FROM read_csv({_literal(_glob_literal(path))}, header = false, "
                f"all_varchar = true) LIMIT 1"
            ).fetchall()
            return [str(v) for v in row[0]] if row else []
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    except duckdb.Error as e:
        raise ValueError(f"{path}: DuckDB cannot read it: {_short(e)}") from None
    except (OSError, ValueError) as e:  # pyarrow: not a Parquet file
        raise ValueError(f"{path}: cannot read its columns: {_short(e)}") from None


def _exact_names(con: Any, files: Sequence[str], base: str, used: Sequence[str]) -> dict[str, str]:
    """For each ``used`` column, its name in DuckDB's view of ``base``: every file must hold
    it exactly once under exactly this name (names are case-sensitive, as on every other
    road); a name that differs from it only in case is told apart by position."""
    folded: dict[str, str] = {}
    for c in used:
        if folded.setdefault(c.lower(), c) != c:
            raise ValueError(
                f"{c}: the columns {folded[c.lower()]!r} and {c!r} differ only in case, which "
                f"DuckDB cannot tell apart in one query; rename one"
            )
    lists = [_file_columns(con, f) for f in files]
    twins = False
    for f, names in zip(files, lists):
        locate_columns(f, names, used)
        twins |= any(n != c and n.lower() == c.lower() for c in used for n in names)
    if not twins:
        return {c: c for c in used}
    described = [str(r[0]) for r in con.execute(f"DESCRIBE SELECT * FROM {base}").fetchall()]
    if any(names != lists[0] for names in lists) or len(described) != len(lists[0]):
        raise ValueError(
            f"{used[0]}: {files[0]} has column names that differ only in case and the files' "
            f"columns differ, so DuckDB (which matches names case-insensitively) cannot tell "
            f"them apart; rename one"
        )
    return {c: described[lists[0].index(c)] for c in used}


def _prepare(
    con: Any,
    s: str,
    table: str | None,
    used: Sequence[str],
    group: str | None,
    values: Sequence[str | None] = (),
) -> tuple[str, list[str]]:
    """The table expression of the source (a path, glob, or ``table``) with exactly the
    ``used`` columns, by their exact names, and those of them DuckDB types as text. Every
    file of a glob is checked (each column once, by its exact name) and read by its own
    name, each file once (:func:`~torchcal.engines.state.expand_paths`); the ``values``
    columns (predictions, label, weight) must be numbers or text."""
    import duckdb

    if table is not None or "://" in s:
        src = source_sql(s, table)
        try:
            desc = con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()
        except duckdb.Error as e:
            raise ValueError(f"{src}: DuckDB cannot read it: {_short(e)}") from None
        locate_columns(table or s, [str(r[0]) for r in desc], used)
    else:
        files = expand_paths(s, what="source")
        base = files_sql(files)
        names = _exact_names(con, files, base, used)
        cols = ", ".join(f"{quote(names[c], 'duckdb')} AS {quote(c, 'duckdb')}" for c in used)
        src = f"(SELECT {cols} FROM {base})"
        try:
            desc = con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()
        except duckdb.Error as e:
            raise ValueError(f"{s}: DuckDB cannot read it: {_short(e)}") from None
    types = {str(r[0]): str(r[1]).upper() for r in desc}
    for c in values:
        if c and not (types[c] in GROUP_TYPES or types[c].startswith("DECIMAL")
                      or types[c] in ("FLOAT", "DOUBLE", "BOOLEAN")):  # fmt: skip
            raise ValueError(f"{c}: expected a numeric or text column in {s}, got {types[c]}")
    if group is not None and not (types[group] in GROUP_TYPES or types[group].startswith("ENUM")):
        raise ValueError(
            f"{group}: expected group names (strings or integers), got {types[group]} (a "
            f"group's text must not depend on the engine: docs/design.md section 6c.2)"
        )
    return src, [c for c in used if types[c] == "VARCHAR"]


def _short(e: BaseException, limit: int = 200) -> str:
    msg = " ".join(str(e).split())
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def audit_duckdb(
    source: str | os.PathLike[str],
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int | None = None,
    table: str | None = None,
    threads: int | None = None,
    sample_size: int = 20000,
    seed: int = 0,
    segments: dict[str, Any] | None = None,
) -> EngineAudit:
    """The audit's state, value grid, sample and text log (:func:`~torchcal.engines.collect
    .collect`) of a Parquet/CSV path or glob, or of ``table`` in the DuckDB database
    ``source``. Text columns (every CSV column is read as text) are parsed by the readers'
    rule; a failing query is a one-line ``ValueError`` naming ``source``."""
    import duckdb

    s = os.fspath(source)
    con = _connect(s, table, threads)
    cols = [preds] if isinstance(preds, str) else list(preds)
    seg_cols = (segments or {}).get("columns", ())
    used = list(dict.fromkeys(c for c in (*cols, label, group, weight, *seg_cols) if c))
    try:
        src, text = _prepare(con, s, table, used, group, [*cols, label, weight])
        text = [c for c in text if c not in seg_cols or c in (*cols, label, group, weight)]

        def run(sql: str) -> list[Any]:
            return con.execute(sql).fetchall()

        result = collect(
            run, src, preds=preds, label=label, group=group, weight=weight, n_bins=n_bins,
            text=text, sample_size=sample_size, seed=seed,
            producer=f"duckdb {duckdb.__version__}",
        )  # fmt: skip
        kw = {"preds": preds, "label": label, "group": group, "weight": weight, "text": text}
        opts = segments and {**segments, "kw": {**kw, "dialect": "duckdb", "n_bins": n_bins or 10}}
        return with_segments(result, run, src, opts)
    except duckdb.Error as e:
        raise ValueError(f"{s}: DuckDB could not compute the state: {_short(e)}") from None
    finally:
        con.close()


def state_from_duckdb(
    source: str | os.PathLike[str],
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    weight: str | None = None,
    n_bins: int = 10,
    table: str | None = None,
    threads: int | None = None,
    connection: Any = None,
) -> BinnedState:
    """The binned state (binary reading, ``preds`` = P(y = 1)) of a Parquet/CSV path or glob,
    or of ``table`` in the DuckDB database ``source``; with ``connection`` (a
    ``duckdb.DuckDBPyConnection``) ``source`` is a table or view name of it.

    Example:
        >>> import os, tempfile
        >>> import pyarrow as pa, pyarrow.parquet as pq
        >>> d = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"p": [0.1, 1.0, float("nan")], "y": [0, 1, 1]}),
        ...                os.path.join(d, "a.parquet"))
        >>> st = state_from_duckdb(os.path.join(d, "*.parquet"), preds="p", label="y")
        >>> st.stats.count.sum().item(), st.header.rows_rejected["preds_nan"]
        (2, 1)
    """
    import duckdb

    s = os.fspath(source)
    if connection is not None:
        con = connection
        con.execute(NO_STATS)
    else:
        con = _connect(s, table, threads)
    cols = [preds] if isinstance(preds, str) else list(preds)
    used = list(dict.fromkeys(c for c in (*cols, label, group, weight) if c))
    try:
        if connection is not None:  # a table or view of the caller's connection
            src = quote(s, "duckdb")
            desc = con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()
            locate_columns(s, [str(r[0]) for r in desc], used)
            text = [c for c in used if str(dict((r[0], r[1]) for r in desc)[c]) == "VARCHAR"]
        else:
            src, text = _prepare(con, s, table, used, group, [*cols, label, weight])
        sql = state_sql(
            src, preds=preds, label=label, group=group, weight=weight, n_bins=n_bins, text=text
        )
        rows = con.execute(sql).fetchall()
        fine = fine_query(src, preds=preds, label=label, group=group, weight=weight,
                          dialect="duckdb", text=text)  # fmt: skip
        fine_rows = con.execute(fine).fetchall()  # the fine histogram (ECCE, resolution)
    except duckdb.Error as e:
        raise ValueError(f"{s}: DuckDB could not compute the state: {_short(e)}") from None
    finally:
        if connection is None:
            con.close()
    header = header_for(
        preds,
        label,
        group=group,
        weight=weight,
        n_bins=n_bins,
        producer=f"duckdb {duckdb.__version__}",
    )
    return attach_fine(state_from_rows(rows, header), fine_rows)
