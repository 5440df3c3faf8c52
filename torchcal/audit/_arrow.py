"""(internal) The audit's fast CSV path: :mod:`pyarrow`'s streaming CSV reader (see
:mod:`torchcal.audit.io`, which falls back to the numpy path of :mod:`torchcal.audit._csv`).

The reader is configured so that every file it accepts is read exactly as the numpy path reads
it, with row ``i`` on line ``i + 2``: it reads only files without a quote character (one
:func:`has_quote` scan of the file first; a quoted field may hold line breaks, which pyarrow's
parallel reader would need ``newlines_in_values``, and slower, for), with quoting off, empty
lines errors (not skipped), no value read as null, every row checked for the header's number
of fields. Its number syntax is a subset of the numpy path's (tested); a group name with a NUL
character is left to the numpy path. Anything else it cannot read raises :class:`Fallback`
and the caller reads the rest the numpy way, which also finds the exact line and value of an
error (or leaves out a stated confidence that does not parse).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from torchcal.audit._columns import Chunk, GroupIndex, check_names

BLOCK = 1 << 20  # bytes per pyarrow block (a row longer than that: a fallback)


class Fallback(Exception):
    """pyarrow cannot read (the rest of) the file exactly as the numpy path would."""


def available() -> bool:
    """Whether :mod:`pyarrow` (with its CSV module) can be imported.

    Example:
        >>> isinstance(available(), bool)
        True
    """
    try:
        import pyarrow.csv  # noqa: F401
    except ImportError:
        return False
    return True


def has_quote(path: str | os.PathLike[str]) -> bool:
    """Whether the file holds a ``"`` anywhere (one memchr-speed scan of a memory map).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        ...     _ = f.write(b'a,b\\n1,"x"\\n'); f.flush()
        ...     has_quote(f.name)
        True
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b'"') >= 0


def read_csv(
    path: str | os.PathLike[str],
    header: list[str],
    columns: list[str],
    idx: list[int],
    gidx: int | None,
    chunk_rows: int,
    null_blank: bool = False,
) -> Iterator[Chunk]:
    """Chunks of ``chunk_rows`` rows (the last one shorter): the numeric fields ``idx`` (named
    ``columns``) as float64 and the field ``gidx``'s names as ids in order of first
    appearance (``null_blank``: a blank name is id -1, ``group_null``). Raises
    :class:`Fallback` (after the chunks it could read) where pyarrow cannot go on.

    pyarrow reads ahead some 35 blocks whatever their size, so its blocks stay small
    (:data:`BLOCK`) and their rows are gathered into chunks here.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/x.csv", "w") as f:
        ...     _ = f.write("id,g,p\\n0,b,0.5\\n1,a,0.25\\n2,b,1\\n")
        >>> cs = list(read_csv(f"{d}/x.csv", ["id", "g", "p"], ["p"], [2], 1, 2))
        >>> [c.columns["p"].tolist() for c in cs], cs[1].groups.tolist(), cs[1].group_names
        ([[0.5, 0.25], [1.0]], [0], ['b', 'a'])
    """
    if gidx is not None and gidx in idx:
        raise Fallback("the group column is also a numeric column")
    if has_quote(path):
        raise Fallback("a quote character: quoted fields are the numpy path's")
    groups, offset, held = GroupIndex(null_blank=null_blank), 0, 0
    pending: list[tuple[dict[str, np.ndarray], np.ndarray | None]] = []
    done = 0
    batches = _batches(path, header, columns, idx, gidx, groups)
    while True:
        nxt = next(batches, None)
        if nxt is not None:
            cols, gids, done = nxt
            pending.append((cols, gids))
            held += len(gids if gids is not None else next(iter(cols.values())))
            if held < chunk_rows:
                continue
        if not held:
            return
        cols = {c: _cat([p[0][c] for p in pending]) for c in columns}
        gids = None if gidx is None else _cat([p[1] for p in pending])
        k = held if nxt is None else held - held % chunk_rows  # rows to hand out now
        for s in range(0, k, chunk_rows):
            e = min(k, s + chunk_rows)
            sub = {c: v[s:e] for c, v in cols.items()}
            g = None if gids is None else gids[s:e]
            lines = np.arange(offset + s + 2, offset + e + 2)
            yield Chunk(sub, g, list(groups.names), lines, offset + s, done)
        pending = [({c: v[k:] for c, v in cols.items()}, None if gids is None else gids[k:])]
        offset, held = offset + k, held - k


def _cat(parts: list[Any]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _batches(
    path: str | os.PathLike[str],
    header: list[str],
    columns: list[str],
    idx: list[int],
    gidx: int | None,
    groups: GroupIndex,
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None, int]]:
    """pyarrow's batches as (numeric columns, group ids, bytes read so far)."""
    import pyarrow as pa
    import pyarrow.csv as pc

    names = [f"c{j}" for j in range(len(header))]
    types = {names[j]: pa.float64() for j in idx}
    wanted = [names[j] for j in dict.fromkeys(idx)]
    if gidx is not None:
        types[names[gidx]] = pa.dictionary(pa.int32(), pa.string())
        wanted.append(names[gidx])
    read = pc.ReadOptions(block_size=BLOCK, column_names=names, skip_rows=1)
    parse = pc.ParseOptions(quote_char=False, newlines_in_values=False, ignore_empty_lines=False)
    convert = pc.ConvertOptions(
        include_columns=wanted,
        column_types=types,
        null_values=[],
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )
    offset = 0
    with pa.OSFile(os.fspath(path)) as src:
        try:
            reader = pc.open_csv(
                src, read_options=read, parse_options=parse, convert_options=convert
            )
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                cols = {c: _numpy(batch.column(names[j])) for c, j in zip(columns, idx)}
                gids = None
                if gidx is not None:
                    gids = _group_ids(batch.column(names[gidx]), header[gidx], groups, offset)
                offset += batch.num_rows
                yield cols, gids, src.tell()
        except pa.ArrowException as e:  # what pyarrow cannot parse or convert
            raise Fallback(str(e)) from None


def _numpy(array: Any, kind: Any = np.float64) -> np.ndarray:
    """A read-only numpy view of a pyarrow array of dtype ``kind`` without nulls
    (``Array.to_numpy`` would import pandas: ~0.4 s)."""
    dtype = np.dtype(kind)
    if array.type.bit_width != 8 * dtype.itemsize or array.null_count:
        raise Fallback(f"unexpected column type {array.type}")
    buf = array.buffers()[1]
    return np.frombuffer(buf, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _group_ids(column: Any, name: str, groups: GroupIndex, offset: int) -> np.ndarray:
    """Global ids of a batch's dictionary-encoded column (pyarrow builds the dictionary in
    order of first appearance); a name holding a NUL is the numpy path's to report."""
    values = column.dictionary.to_pylist()
    if any("\x00" in v for v in values):
        raise Fallback("a NUL in a group name")
    inverse = _numpy(column.indices, np.int32)
    check_names(name, values, inverse, lambda i: f"line {offset + i + 2}", groups.null_blank)
    return groups.ids_of(values, inverse)
