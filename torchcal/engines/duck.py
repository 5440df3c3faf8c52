"""The binned state computed by DuckDB (in-process, no server) from Parquet/CSV files, a glob
of them, or a table of a DuckDB database: one query from :func:`~torchcal.engines.sql.state_sql`,
so rows never cross into Python (docs/design.md section 6f)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torchcal.engines.collect import EngineAudit, collect
from torchcal.engines.sql import header_for, state_from_rows, state_sql
from torchcal.engines.state import BinnedState

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


def _text_columns(con: Any, src: str, columns: Sequence[str]) -> list[str]:
    """The ``columns`` of ``src`` DuckDB types as text (parsed by the readers' rule)."""
    import duckdb

    try:
        desc = con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()
    except duckdb.Error as e:
        raise ValueError(f"{src}: DuckDB cannot read it: {_short(e)}") from None
    types = {str(r[0]): str(r[1]).upper() for r in desc}
    missing = [c for c in columns if c not in types]
    if missing:
        raise ValueError(f"{missing[0]}: no such column in {src} (columns: {list(types)})")
    return [c for c in columns if types[c] == "VARCHAR"]


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
) -> EngineAudit:
    """The audit's state, value grid, sample and text log (:func:`~torchcal.engines.collect
    .collect`) of a Parquet/CSV path or glob, or of ``table`` in the DuckDB database
    ``source``. Text columns (every CSV column is read as text) are parsed by the readers'
    rule; a failing query is a one-line ``ValueError`` naming ``source``."""
    import duckdb

    s = os.fspath(source)
    src = source_sql(s, table)
    con = _connect(s, table, threads)
    cols = [preds] if isinstance(preds, str) else list(preds)
    used = list(dict.fromkeys(c for c in (*cols, label, group, weight) if c))
    try:
        text = _text_columns(con, src, used)

        def run(sql: str) -> list[Any]:
            return con.execute(sql).fetchall()

        return collect(
            run, src, preds=preds, label=label, group=group, weight=weight, n_bins=n_bins,
            text=text, sample_size=sample_size, seed=seed,
            producer=f"duckdb {duckdb.__version__}",
        )  # fmt: skip
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
        con, src = connection, '"' + s.replace('"', '""') + '"'
        con.execute(NO_STATS)
    else:
        src = source_sql(s, table)
        con = _connect(s, table, threads)
    cols = [preds] if isinstance(preds, str) else list(preds)
    used = list(dict.fromkeys(c for c in (*cols, label, group, weight) if c))
    try:
        text = _text_columns(con, src, used)
        sql = state_sql(
            src, preds=preds, label=label, group=group, weight=weight, n_bins=n_bins, text=text
        )
        rows = con.execute(sql).fetchall()
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
    return state_from_rows(rows, header)
