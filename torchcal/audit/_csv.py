"""(internal) The audit's CSV parsing: one block of complete lines at a time, vectorised over
the bytes (the reader's hot path; :mod:`torchcal.audit.io` is the public face).

A block goes the fast way when it is *plain*: no quote character, and (with a group column)
every line has exactly the header's number of fields. Its numeric columns are read by
:func:`numpy.loadtxt` (the C parser; on Linux the block is handed to it as an in-memory
file with a path, which numpy reads in large chunks); the group field's bytes become
integer keys in one vectorised pass over the separators (names of at most 7 bytes packed into
one ``uint64`` with their length, longer ones compared as fixed-width bytes). A block that is
not plain, or that either step rejects, goes through the :mod:`csv` module row by row, which
also finds the exact line and value of an error.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["PAD", "Fields", "blocks", "split_fields", "loadtxt_columns", "group_keys", "slow_rows"]

PAD = 64  # zero bytes after a block, so fixed-width windows never run off the end
_COMMA, _NEWLINE = 44, 10
_MEMFD = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")
_BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)], dtype=np.uint64)


def blocks(f: io.BufferedReader, block_bytes: int) -> Iterator[bytes]:
    """Blocks of complete lines from ``f`` of about ``block_bytes`` bytes, each ending with a
    newline (one is added after a last line without it); ``\\r\\n`` becomes ``\\n``.

    Example:
        >>> list(blocks(io.BytesIO(b"a\\nbb\\r\\nc"), 3))
        [b'a\\n', b'bb\\n', b'c\\n']
    """
    carry = b""
    while True:
        data = f.read(block_bytes)
        if not data:
            if carry:
                yield carry.replace(b"\r\n", b"\n") + b"\n"
            return
        buf = carry + data
        cut = buf.rfind(b"\n") + 1
        carry = buf[cut:]
        if cut:
            head = buf[:cut]
            yield head.replace(b"\r\n", b"\n") if b"\r" in head else head


class Fields:
    """Separator positions of a plain block: ``start(j)`` / ``end(j)`` of field ``j`` per row."""

    def __init__(self, buf: np.ndarray, seps: np.ndarray) -> None:
        self.buf = buf
        self.seps = seps  # (rows, ncols): the comma after each field, the newline after the last
        self.rows = seps.shape[0]

    def start(self, j: int) -> np.ndarray:
        if j > 0:
            return self.seps[:, j - 1] + 1
        out = np.empty(self.rows, dtype=np.int64)
        out[:1] = 0
        out[1:] = self.seps[:-1, -1] + 1
        return out

    def end(self, j: int) -> np.ndarray:
        return self.seps[:, j]


def split_fields(body: bytes, ncols: int, rows: int) -> Fields | None:
    """The fields of a block of ``rows`` complete lines without quotes, or None when a line
    has another number of fields (or is blank).

    Example:
        >>> f = split_fields(b"1,ab\\n22,c\\n", 2, 2)
        >>> f.start(1).tolist(), f.end(1).tolist()
        ([2, 8], [4, 9])
    """
    buf = np.frombuffer(body + bytes(PAD), dtype=np.uint8)
    seps = np.flatnonzero((buf == _COMMA) | (buf == _NEWLINE))
    if seps.size != rows * ncols:
        return None
    seps = seps.reshape(rows, ncols)
    # n newlines, all in the last slot of a row: every line has exactly ncols - 1 commas
    if not (buf[seps[:, -1]] == _NEWLINE).all():
        return None
    return Fields(buf, seps)


def _windows(buf: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """``(rows, width)`` bytes from each start (the block is padded with zeros)."""
    if width <= PAD:
        view = np.lib.stride_tricks.sliding_window_view(buf, width)
        return view[start]
    idx = np.minimum(start[:, None] + np.arange(width), buf.size - 1)
    return buf[idx]


def loadtxt_columns(body: bytes, usecols: Sequence[int]) -> np.ndarray | None:
    """The numeric fields ``usecols`` of a block as float64 ``(rows, len(usecols))`` by
    :func:`numpy.loadtxt`; None when it rejects the block (the caller reparses it slowly).

    Example:
        >>> loadtxt_columns(b"a,1,2.5\\nb,3,-1e2\\n", [1, 2]).tolist()
        [[1.0, 2.5], [3.0, -100.0]]
        >>> loadtxt_columns(b"a,1\\nb,x\\n", [1]) is None
        True
    """
    kw = {"delimiter": ",", "usecols": usecols, "comments": None, "ndmin": 2}
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
    except ValueError:
        return None


def group_keys(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """One comparable key per field: equal keys if and only if equal bytes.

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
    w = _windows(buf, start, width).copy()
    w[np.arange(width) >= length[:, None]] = 0
    return w.view(f"S{width}").ravel()


def slow_rows(
    body: bytes,
    names: Sequence[str],
    numeric: Sequence[int],
    text: int | None,
    first_line: int,
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Parse a block with the :mod:`csv` module: the fields ``numeric`` as float64
    ``(rows, len(numeric))``, the field ``text`` as strings (``[]`` when None) and each row's
    file line number. Blank lines are skipped. Errors name the column, the value and the line.

    Example:
        >>> v, g, lines = slow_rows(b'1,"a,b"\\n\\n2,c\\n', ["x", "g"], [0], 1, 2)
        >>> v.ravel().tolist(), g, lines.tolist()
        ([1.0, 2.0], ['a,b', 'c'], [2, 4])
    """
    reader = csv.reader(io.StringIO(body.decode("utf-8"), newline=""))
    values: list[list[float]] = []
    texts: list[str] = []
    lines: list[int] = []
    for row in reader:
        line = first_line + reader.line_num - 1
        if not row:
            continue
        if len(row) != len(names):
            raise ValueError(
                f"line {line}: expected {len(names)} fields (as the header), got {len(row)}"
            )
        vals = []
        for j in numeric:
            try:
                vals.append(float(row[j]))
            except ValueError:
                raise ValueError(f"{names[j]}: {row[j]!r} at line {line} is not a number") from None
        values.append(vals)
        if text is not None:
            texts.append(row[text])
        lines.append(line)
    arr = np.array(values, dtype=np.float64).reshape(len(values), len(numeric))
    return arr, texts, np.array(lines, dtype=np.int64)
