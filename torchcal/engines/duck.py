"""The binned state computed by DuckDB (in-process, no server) from Parquet/CSV files, a glob
of them, or a table of a DuckDB database: one query from :func:`~torchcal.engines.sql.state_sql`,
so rows never cross into Python (docs/design.md section 6f)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torchcal.engines.sql import checked_rows_sql, header_for, state_from_rows, state_sql
from torchcal.engines.state import BinnedState

__all__ = ["NO_STATS", "available", "sample_rows", "source_sql", "state_from_duckdb"]

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
        con, src = connection, '"' + s.replace('"', '""') + '"'
        con.execute(NO_STATS)
    else:
        src = source_sql(s, table)
        con = _connect(s, table, threads)
    sql = state_sql(src, preds=preds, label=label, group=group, weight=weight, n_bins=n_bins)
    try:
        rows = con.execute(sql).fetchall()
    except duckdb.Error as e:
        msg = " ".join(str(e).split())
        raise ValueError(f"{s}: DuckDB could not compute the state: {msg}") from None
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
    return state_from_rows(rows, header)


def sample_rows(
    source: str | os.PathLike[str],
    *,
    preds: str | Sequence[str],
    label: str,
    group: str | None = None,
    size: int = 20000,
    seed: int = 0,
    table: str | None = None,
) -> dict[str, list[Any]]:
    """A seeded reservoir sample of at most ``size`` kept rows (the checks of the state),
    by ``USING SAMPLE reservoir(size ROWS) REPEATABLE (seed)`` on one thread (DuckDB's sample
    is repeatable only single-threaded), ordered by ``(p, y, g)``: the rows the temperature
    fit and the HTML page use on this path. Not the in-memory path's sample (another
    generator), so ``--fit-temperature`` numbers differ between the paths."""
    s = os.fspath(source)
    con = _connect(s, table, 1)
    with_sql = checked_rows_sql(
        source_sql(s, table), preds=preds, label=label, group=group, n_bins=10
    )
    C = 1 if isinstance(preds, str) else len(preds)
    pv = ", ".join(f"p{k}" for k in range(C))
    sql = f"""{with_sql}
SELECT {pv}, y, g FROM (SELECT {pv}, y, g FROM scored WHERE reason IS NULL)
USING SAMPLE reservoir({int(size)} ROWS) REPEATABLE ({int(seed)})"""
    try:
        rows = sorted(con.execute(sql).fetchall())
    finally:
        con.close()
    preds_out = [r[0] if C == 1 else list(r[:C]) for r in rows]
    return {
        "preds": preds_out,
        "target": [int(r[C]) for r in rows],
        "group": [r[C + 1] for r in rows],
    }
