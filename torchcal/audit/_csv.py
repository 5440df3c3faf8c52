"""(internal) The audit's numpy CSV engine: the file in blocks of complete records, each read
the fast way (vectorised over the bytes) when it can be, else by the :mod:`csv` module
(:mod:`torchcal.audit.io` is the public face).

Records: a record ends at a line break (``\\n``, ``\\r\\n`` or a lone ``\\r``) outside quotes; a
quoted field (RFC 4180, ``""`` for a quote) may hold commas and line breaks. Blocks are cut
only where the number of quote characters before the cut is even, so no record is ever split
(a record is held whole, however long: memory is a block plus the longest record; over
:data:`MAX_RECORD` bytes is an error, the mark of an unclosed quote). A row's *line* is the
physical line where its record starts (the header is line 1).

A block without a quote character has its line breaks made ``\\n`` and goes the fast way when
it is *plain*: no blank line, no NUL byte, and every line has exactly the header's number of
fields (one vectorised pass over the separators, :func:`split_fields`). Its numeric columns
are read by :func:`numpy.loadtxt` (the C parser; on Linux the block is handed to it as an
in-memory file with a path, which numpy reads in large chunks); the group field's bytes become
integer keys (names of at most 7 bytes packed into one ``uint64`` with their length, longer
ones compared as fixed-width bytes plus their length). Every other block, or one that a fast
step rejects, goes through :func:`slow_rows` (the :mod:`csv` module, strict quoting, values by
:func:`torchcal.engines.text.parse_value`), which also finds the exact line and value of an
error and leaves out (and logs) the rows whose stated confidence does not parse.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import numpy as np

from torchcal.audit._columns import (
    Chunk,
    GroupIndex,
    ReadLog,
    check_names,
    first_appearance,
    shown,
)
from torchcal.audit._csv_blocks import (
    PAD,
    Block,
    _breaks,
    _cut,
    _field_limit,
    blocks,
    quote_problem,
)
from torchcal.engines.text import NUMBER, STATED, parse_value

_COMMA, _NEWLINE, _QUOTE, _CR = 44, 10, 34, 13
_MEMFD = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)], dtype=np.uint64)


class Fields:
    """Separator positions of a block: ``start(j)`` / ``end(j)`` of field ``j`` per row (a
    quoted field's span holds its quotes; ``crlf``: a last field's end is before a ``\\r``);
    ``lines``: each row's start line, when the block has multi-line records (else None)."""

    def __init__(
        self,
        buf: np.ndarray,
        seps: np.ndarray,
        lines: np.ndarray | None = None,
        crlf: np.ndarray | None = None,
    ) -> None:
        self.buf = buf
        self.seps = seps  # (rows, ncols): the comma after each field, the newline after the last
        self.rows = seps.shape[0]
        self.lines = lines
        self.crlf = crlf

    def start(self, j: int) -> np.ndarray:
        if j > 0:
            return self.seps[:, j - 1] + 1
        out = np.empty(self.rows, dtype=np.int64)
        out[:1] = 0
        out[1:] = self.seps[:-1, -1] + 1
        return out

    def end(self, j: int) -> np.ndarray:
        if self.crlf is not None and j == self.seps.shape[1] - 1:
            return self.seps[:, j] - self.crlf
        return self.seps[:, j]


def quoted_fields(body: bytes, ncols: int, line: int) -> Fields | None:
    """The fields of a block with quotes (records starting at ``line``), or None unless its
    quoting is RFC 4180 (:func:`quote_problem`) -- then :func:`numpy.loadtxt` with a quote
    character, the :mod:`csv` module and these spans read it alike -- and every record has
    ``ncols`` fields (a blank line has 1).

    Example:
        >>> f = quoted_fields(b'1,"a\\nb"\\r\\n2,"x,""y"" z"\\n', 2, 2)
        >>> f.start(1).tolist(), f.end(1).tolist(), f.lines.tolist()
        ([2, 11], [7, 22], [2, 4])
        >>> quoted_fields(b'1,a"b\\n', 2, 2) is None, quoted_fields(b'1,"a"b\\n', 2, 2) is None
        (True, True)
    """
    if quote_problem(body) is not None:
        return None
    n = len(body)
    buf = np.frombuffer(body + bytes(PAD), dtype=np.uint8)
    a = buf[:n]
    quotes = np.flatnonzero(a == _QUOTE)
    cand = np.flatnonzero((a == _COMMA) | (a == _NEWLINE) | (a == _CR))
    seps = cand[np.searchsorted(quotes, cand) % 2 == 0]
    is_cr = a[seps] == _CR
    crlf_pair = is_cr & (buf[seps + 1] == _NEWLINE)
    seps = seps[~crlf_pair]  # the \n of a \r\n ends the record
    ends = (a[seps] == _NEWLINE) | (a[seps] == _CR)
    rows = int(ends.sum())
    if rows == 0 or seps.size != rows * ncols:
        return None
    seps = seps.reshape(rows, ncols)
    if not ends.reshape(rows, ncols)[:, -1].all():
        return None
    last = seps[:, -1]
    crlf = ((a[last] == _NEWLINE) & (a[np.maximum(last - 1, 0)] == _CR) & (last > 0)).astype(
        np.int64
    )
    breaks = np.flatnonzero((a == _NEWLINE) | ((a == _CR) & (buf[1 : n + 1] != _NEWLINE)))
    starts = np.empty(rows, dtype=np.int64)
    starts[0] = 0
    starts[1:] = last[:-1] + 1
    lines = line + np.searchsorted(breaks, starts)
    return Fields(buf, seps, lines, crlf)


def split_fields(body: bytes, ncols: int, rows: int) -> Fields | None:
    """The fields of a block of ``rows`` complete lines without quotes, or None when a line
    has another number of fields.

    Example:
        >>> f = split_fields(b"1,ab\\n22,c\\n", 2, 2)
        >>> f.start(1).tolist(), f.end(1).tolist()
        ([2, 8], [4, 9])
        >>> split_fields(b"1,ab,x\\n22\\n", 2, 2) is None
        True
    """
    buf = np.frombuffer(body + bytes(PAD), dtype=np.uint8)
    seps = np.flatnonzero((buf == _COMMA) | (buf == _NEWLINE))
    if seps.size != rows * ncols:
        return None
    table = seps.reshape(rows, ncols)
    # n newlines, all in the last slot of a row: every line has exactly ncols - 1 commas
    if not (buf[table[:, -1]] == _NEWLINE).all():
        return None
    return Fields(buf, table)


def _windows(buf: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """``(rows, width)`` bytes from each start (the block is padded with zeros)."""
    if width <= PAD:
        view = np.lib.stride_tricks.sliding_window_view(buf, width)
        return view[start]
    idx = np.minimum(start[:, None] + np.arange(width), buf.size - 1)
    return buf[idx]


def loadtxt_columns(
    body: bytes,
    usecols: Sequence[int],
    quoted: bool = False,
    converters: dict[int, Callable[[str], float]] | None = None,
) -> np.ndarray | None:
    """The numeric fields ``usecols`` of a block as float64 ``(rows, len(usecols))`` by
    :func:`numpy.loadtxt` (``quoted``: with ``"`` as its quote character, for a block whose
    quoting :func:`quoted_fields` has checked); None when it rejects the block (the caller
    reparses it slowly).

    Example:
        >>> loadtxt_columns(b"a,1,2.5\\nb,3,-1e2\\n", [1, 2]).tolist()
        [[1.0, 2.5], [3.0, -100.0]]
        >>> loadtxt_columns(b"a,1\\nb,x\\n", [1]) is None
        True
    """
    kw: dict[str, Any] = {"delimiter": ",", "usecols": usecols, "comments": None, "ndmin": 2}
    if converters:
        kw["converters"] = converters
    if quoted:
        kw["quotechar"] = '"'
    try:
        if not _MEMFD:
            return np.loadtxt(io.BytesIO(body), dtype=np.float64, encoding="utf-8", **kw)
        # numpy reads a *path* in large C-level chunks but iterates a file object line by
        # line (~1.7x slower): hand it the block as an in-memory file with a path
        fd = os.memfd_create("torchcal-audit-block")
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            return np.loadtxt(f"/proc/self/fd/{fd}", dtype=np.float64, encoding="utf-8", **kw)
        finally:
            os.close(fd)
    except ValueError:  # UnicodeDecodeError included
        return None


def group_keys(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """One comparable key per field: equal keys if and only if equal bytes (NUL bytes and
    lengths included).

    Example:
        >>> b = np.frombuffer(b"ab,a,ab" + bytes(PAD), dtype=np.uint8)
        >>> k = group_keys(b, np.array([0, 3, 5]), np.array([2, 4, 7]))
        >>> bool(k[0] == k[2]), bool(k[0] == k[1])
        (True, False)
    """
    length = end - start
    width = int(length.max()) if length.size else 0
    if width <= 7:  # bytes in the low 7 bytes, the length in the top one
        packed = np.ascontiguousarray(_windows(buf, start, 8)).view("<u8").ravel()
        return (packed & _BYTE_MASKS[length]) | (length.astype(np.uint64) << np.uint64(56))
    # fixed-width bytes plus the length (numpy's bytes compare without trailing NULs)
    w = np.zeros((length.size, width + 8), dtype=np.uint8)
    w[:, :width] = _windows(buf, start, width)
    w[:, :width][np.arange(width) >= length[:, None]] = 0
    w[:, width:] = length.astype("<u8").view(np.uint8).reshape(-1, 8)
    return w.view(f"S{width + 8}").ravel()


def bad_value(column: str, text: str, where: str, kind: str) -> ValueError:
    """The error for a value that does not parse as ``kind``."""
    if kind == NUMBER:
        return ValueError(f"{column}: {shown(text)} at {where} is not a number")
    if kind == STATED:
        return ValueError(f"{column}: {shown(text)} at {where} is not a number nor a percent")
    return ValueError(
        f"{column}: label {shown(text)} at {where} is not a number nor True/False "
        "(map words such as yes/no to 1/0 first)"
    )


def slow_rows(
    body: bytes,
    names: Sequence[str],
    numeric: Sequence[int],
    text: int | None,
    first_line: int,
    kinds: Sequence[str] | None = None,
    log: ReadLog | None = None,
    soft: Collection[str] = (),
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Parse a block with the :mod:`csv` module: the fields ``numeric`` (read as ``kinds``,
    default all numbers) as float64 ``(rows, len(numeric))``, the field ``text`` as strings
    (``[]`` when None) and each row's line number. Blank lines are skipped (and counted in
    ``log``); a row whose stated confidence does not parse is left out and logged; a value of a
    ``soft`` column (a label, a weight) that does not parse reads NaN, for a row rule to reject
    (the first one kept in ``log.unparsed``); any other error names the column, the value and
    the line.

    Example:
        >>> v, g, lines = slow_rows(b'1,"a,b"\\n\\n2,c\\n', ["x", "g"], [0], 1, 2)
        >>> v.ravel().tolist(), g, lines.tolist()
        ([1.0, 2.0], ['a,b', 'c'], [2, 4])
        >>> slow_rows(b"yes\\n", ["y"], [0], None, 2, ["label"], soft=["y"])[0].tolist()
        [[nan]]
    """
    kinds = [NUMBER] * len(numeric) if kinds is None else list(kinds)
    log = ReadLog() if log is None else log
    reader = csv.reader(
        io.StringIO(body.decode("utf-8", "surrogateescape"), newline=""), strict=True
    )
    values: list[list[float]] = []
    texts: list[str] = []
    lines: list[int] = []
    done = 0  # physical lines read so far
    with _field_limit():
        while True:
            line = first_line + done
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise ValueError(
                    f"line {line}: {e} (a quote is not closed where it should)"
                ) from None
            done = reader.line_num
            if not row:
                log.blank_lines += 1
                continue
            if len(row) != len(names):
                raise ValueError(
                    f"line {line}: expected {len(names)} fields (as the header), got {len(row)}"
                )
            vals = []
            for j, kind in zip(numeric, kinds):
                v = parse_value(row[j], kind)
                if v is None and kind != STATED and names[j] in soft:
                    if names[j] not in log.unparsed:
                        log.unparsed[names[j]] = (f"line {line}", row[j])
                    v = float("nan")
                if v is None:
                    if kind != STATED:
                        raise bad_value(names[j], row[j], f"line {line}", kind)
                    log.exclude(names[j], "not a number nor a percent", f"line {line}", row[j])
                    log.missing += row[j] == ""  # DuckDB reads an empty field as NULL
                    break
                if kind == STATED and "%" in row[j]:
                    log.percent[names[j]] = log.percent.get(names[j], 0) + 1
                vals.append(v)
            else:
                values.append(vals)
                if text is not None:
                    texts.append(row[text])
                lines.append(line)
    arr = np.array(values, dtype=np.float64).reshape(len(values), len(numeric))
    return arr, texts, np.array(lines, dtype=np.int64)


def read_csv(
    path: str | os.PathLike[str],
    columns: list[str],
    kinds: list[str],
    header: list[str],
    idx: list[int],
    gidx: int | None,
    block_bytes: int,
    start: int,
    first_line: int,
    log: ReadLog,
    soft: Collection[str] = (),
) -> Iterator[Chunk]:
    """The numpy engine: the data after the header (``start`` bytes, ``first_line``) in
    chunks of a block each (``soft``: see :func:`slow_rows`; the group's in ``soft``: a blank
    name is id -1)."""
    with open(path, "rb") as f:
        f.seek(start)
        null_blank = gidx is not None and header[gidx] in soft
        groups, offset = GroupIndex(null_blank=null_blank), 0
        for block in blocks(f, block_bytes, first_line):
            values, gids, lines = _block_rows(block, header, idx, kinds, gidx, groups, log, soft)
            n = values.shape[0]
            if n == 0:
                continue
            cols = {c: values[:, k] for k, c in enumerate(columns)}
            yield Chunk(cols, gids, list(groups.names), lines, offset, f.tell())
            offset += n


def _block_rows(
    block: Block,
    header: list[str],
    idx: list[int],
    kinds: list[str],
    gidx: int | None,
    groups: GroupIndex,
    log: ReadLog,
    soft: Collection[str] = (),
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """One block: the fast way when it can (plain, or quoted as RFC 4180), else (or on any
    rejection) the :mod:`csv` way."""
    body = block.body
    fields = None
    if b"\x00" in body:
        pass
    elif block.quoted:
        fields = quoted_fields(body, len(header), block.line)
    elif not body.startswith(b"\n") and b"\n\n" not in body:
        fields = split_fields(body, len(header), block.breaks)
    values = loadtxt_columns(body, idx, block.quoted) if fields is not None else None
    if values is None and fields is not None and any(k != NUMBER for k in kinds):
        # percents or True/False: loadtxt again, those columns through parse_value
        converters, percent = value_converters(header, idx, kinds)
        values = loadtxt_columns(body, idx, block.quoted, converters)
        if values is not None and values.shape[0] == fields.rows:
            for name, k in percent.items():
                if k:
                    log.percent[name] = log.percent.get(name, 0) + k
    if values is not None and fields is not None and values.shape[0] == fields.rows:
        lines = fields.lines
        if lines is None:
            lines = np.arange(block.line, block.line + fields.rows)
        if gidx is None:
            return values, None, lines
        keys = group_keys(fields.buf, fields.start(gidx), fields.end(gidx))
        return values, _keys_to_ids(body, fields, gidx, keys, groups, header, lines), lines
    problem = quote_problem(body) if block.quoted else None
    if problem is not None:  # the records before it first: an earlier error is reported first
        pos, what, opened = problem
        head = body[: _cut(body[:opened], False)]
        slow_rows(head, header, idx, gidx, block.line, kinds, ReadLog(), soft)
        at, start = (block.line + _breaks(body[:i]) for i in (pos, opened))
        where = f" (in the field quoted on line {start})" if start != at else ""
        raise ValueError(
            f"line {at}: {what}{where}: quote a field that holds a quote and double the "
            'quotes inside ("5"" screen")'
        )
    values, texts, lines = slow_rows(body, header, idx, gidx, block.line, kinds, log, soft)
    if gidx is None or not texts:
        return values, None if gidx is None else np.zeros(0, np.int64), lines
    uniques, first, inverse = np.unique(
        np.array(texts, dtype=object), return_index=True, return_inverse=True
    )
    first, inverse = first_appearance(first, inverse.reshape(-1))
    names = [str(texts[i]) for i in first]
    check_names(header[gidx], names, inverse, lambda i: f"line {int(lines[i])}", groups.null_blank)
    return values, groups.ids_of(names, inverse.reshape(-1)), lines


def value_converters(
    header: list[str], idx: list[int], kinds: list[str]
) -> tuple[dict[int, Callable[[str], float]], dict[str, int]]:
    """loadtxt converters reading the non-number columns by :func:`parse_value` (a value that
    does not parse raises: the block goes the csv way, which excludes or reports it), and the
    count of percents each one read."""
    percent: dict[str, int] = {}
    converters: dict[int, Callable[[str], float]] = {}
    for j, kind in zip(idx, kinds):
        if kind == NUMBER:
            continue
        name = header[j]
        percent[name] = 0

        def read(text: str, kind: str = kind, name: str = name) -> float:
            v = parse_value(text, kind)
            if v is None:
                raise ValueError(text)
            if kind == STATED and "%" in text:
                percent[name] += 1
            return v

        converters[j] = read
    return converters, percent


def _keys_to_ids(
    body: bytes,
    fields: Fields,
    gidx: int,
    keys: np.ndarray,
    groups: GroupIndex,
    header: list[str],
    lines: np.ndarray,
) -> np.ndarray:
    """Map group keys to global ids: the distinct keys of a small head first (searchsorted
    against them is cheap), the full np.unique only when the rest has new ones."""
    head_keys = np.unique(keys[:4096])
    pos = np.minimum(np.searchsorted(head_keys, keys), head_keys.size - 1)
    if head_keys.size <= 64 and (head_keys[pos] == keys).all():
        first = np.array([int(np.argmax(pos == k)) for k in range(head_keys.size)])
        inverse = pos
    else:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    first, inverse = first_appearance(first, inverse.reshape(-1))
    s, e = fields.start(gidx), fields.end(gidx)
    names = [_unquote(body[s[i] : e[i]]).decode("utf-8", "surrogateescape") for i in first]
    check_names(header[gidx], names, inverse, lambda i: f"line {int(lines[i])}", groups.null_blank)
    return groups.ids_of(names, inverse)


def _unquote(field: bytes) -> bytes:
    """A field's value: a quoted one without its quotes, ``""`` read as ``"``."""
    if field[:1] == b'"':
        return field[1:-1].replace(b'""', b'"')
    return field
