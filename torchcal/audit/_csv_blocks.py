"""(internal) The numpy CSV engine's cutting of a file into blocks of whole records, and its
header (docs/design.md section 6c.1): a block ends only at a line break with an even number of
quote characters before it, so no record is split; memory is a block plus the longest record
(over :data:`MAX_RECORD` bytes: an error, the mark of an unclosed quote)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

PAD = 64  # zero bytes after a block, so fixed-width windows never run off the end
MAX_RECORD = 1 << 28  # bytes in one record (header or row) at most
MAX_BLOCK = 1 << 26  # bytes per block at most (the block of a long-row file stays bounded)
_COMMA, _NEWLINE, _QUOTE, _CR = 44, 10, 34, 13


@dataclass
class Block:
    """Complete records: ``body`` (line breaks made ``\\n`` unless ``quoted``), the physical
    ``line`` of its first byte and the number of ``breaks`` (line breaks) it holds."""

    body: bytes
    line: int
    breaks: int
    quoted: bool


def _cut(buf: bytes, eof: bool, first: bool = False) -> int:
    """The position after the last (``first``: the first) record end in ``buf`` (0: none yet).
    A ``\\r`` as the last byte is not an end before the end of the file (a ``\\n`` may follow);
    the ``\\r`` of a ``\\r\\n`` is not one either.

    Example:
        >>> _cut(b'a\\r\\nb,"x\\ny"\\nc', False), _cut(b'a\\r\\nb\\n', False, first=True)
        (11, 3)
    """
    lim = len(buf) - (not eof and buf.endswith(b"\r"))
    a = np.frombuffer(buf, dtype=np.uint8, count=lim)
    if b'"' not in buf and not first:
        return max(buf.rfind(b"\n", 0, lim), buf.rfind(b"\r", 0, lim)) + 1
    quotes = np.flatnonzero(a == _QUOTE)
    breaks = np.flatnonzero((a == _NEWLINE) | (a == _CR))
    if breaks.size:  # a \r followed by \n ends nothing: its \n does
        after = np.minimum(breaks + 1, lim - 1)
        breaks = breaks[~((a[breaks] == _CR) & (a[after] == _NEWLINE) & (breaks + 1 < lim))]
    outside = breaks[np.searchsorted(quotes, breaks) % 2 == 0]
    if not outside.size:
        return 0
    return int(outside[0 if first else -1]) + 1


def _breaks(body: bytes) -> int:
    return body.count(b"\n") + body.count(b"\r") - body.count(b"\r\n")


def blocks(f: io.BufferedReader, block_bytes: int, line: int = 1) -> Iterator[Block]:
    """Blocks of complete records from ``f``, about ``block_bytes`` bytes each (a last record
    without a line break gets one).

    Example:
        >>> [(b.body, b.line) for b in blocks(io.BytesIO(b"a\\nbb\\r\\nc\\rd"), 3)]
        [(b'a\\n', 1), (b'bb\\n', 2), (b'c\\n', 3), (b'd\\n', 4)]
        >>> [b.body for b in blocks(io.BytesIO(b'1,"x\\ny"\\n2,z\\n'), 4)]
        [b'1,"x\\ny"\\n', b'2,z\\n']
    """
    carry, check = b"", 2 * block_bytes
    while True:
        data = f.read(block_bytes)
        eof = not data
        buf = carry + data if carry else data
        if not buf:
            return
        if eof and not buf.endswith((b"\n", b"\r")):
            buf += b"\n"
        cut = len(buf) if eof else _cut(buf, eof)
        if cut == 0 and len(buf) >= check:  # a stray quote makes the rest look like one
            check *= 2  # record: hand it over as it is, the reader reports the quote
            problem = quote_problem(buf)
            if problem is not None and problem[1] != "a quote that is never closed":
                cut = len(buf)
        if cut == 0:
            if len(buf) > MAX_RECORD:
                raise ValueError(
                    f"line {line}: a record of more than {MAX_RECORD >> 20} MB "
                    "(is a quote not closed?)"
                )
            carry = buf
            continue
        head, carry = buf[:cut], buf[cut:]
        check = 2 * block_bytes
        quoted = b'"' in head
        if quoted:
            n = _breaks(head)
        else:
            if b"\r" in head:
                head = head.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            n = head.count(b"\n")
        yield Block(head, line, n, quoted)
        line += n
        if eof:
            return


def read_header(f: io.BufferedReader, file: str) -> tuple[list[str], int, int]:
    """The header record of ``f``: the column names (stripped), its size in bytes and the
    number of physical lines it spans."""
    buf = b""
    while True:
        data = f.read(1 << 16)
        buf += data
        cut = _cut(buf, not data, first=True)
        if cut or not data or len(buf) > MAX_RECORD:
            break
    head = buf[:cut] if cut else buf
    if len(head) > MAX_RECORD:
        raise ValueError(f"{file}: a header of more than {MAX_RECORD >> 20} MB")
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{file}: the header line is not UTF-8 text") from None
    if not text.strip():
        if buf[len(head) :].strip():
            raise ValueError(f"{file}: line 1 is blank (expected a header naming the columns)")
        raise ValueError(f"{file}: empty file (expected a header line naming the columns)")
    with _field_limit():
        try:
            row = next(csv.reader(io.StringIO(text, newline=""), strict=True))
        except csv.Error as e:
            raise ValueError(f"{file}: line 1 (the header): {e}") from None
    return [c.strip() for c in row], len(head), max(1, _breaks(head))


class _field_limit:
    """The :mod:`csv` module's field size limit (131,072 characters) lifted while inside."""

    def __enter__(self) -> None:
        self.old = csv.field_size_limit(MAX_RECORD)

    def __exit__(self, *exc: object) -> None:
        csv.field_size_limit(self.old)


def quote_problem(body: bytes) -> tuple[int, str, int] | None:
    """The first quote character of ``body`` that is not RFC 4180 quoting, what is wrong with
    it and where the quoted field it belongs to opened, or None. The readers' dialect: a field is either unquoted, holding no quote
    character at all, or quoted: a quote at its start, the same at its end right before a
    comma or line break, every quote inside doubled (``""``). (The :mod:`csv` module would take
    ``5"`` as text and a block reader cannot know where such a record ends: rejected.)

    Example:
        >>> quote_problem(b'1,"a""b"\\n2,"x\\ny"\\n') is None
        True
        >>> quote_problem(b'1,5"x\\n'), quote_problem(b'1,"a"b\\n')
        ((3, 'a quote inside an unquoted field', 3), (4, 'text after a closing quote', 2))
    """
    n = len(body)
    buf = np.frombuffer(body + bytes(PAD), dtype=np.uint8)
    a = buf[:n]
    quotes = np.flatnonzero(a == _QUOTE)
    opening, closing = quotes[0::2], quotes[1::2]
    prev = a[np.maximum(opening - 1, 0)]
    at_start = (opening == 0) | (prev == _COMMA) | (prev == _NEWLINE) | (prev == _CR)
    escaped = np.zeros(opening.size, dtype=bool)
    k = min(opening.size - 1, closing.size)
    escaped[1 : k + 1] = closing[:k] == opening[1 : k + 1] - 1  # the second quote of a ""
    nxt = buf[closing + 1]  # the padding reads as 0 after the last byte
    ok_after = (nxt == _COMMA) | (nxt == _NEWLINE) | (nxt == _CR) | (nxt == _QUOTE)
    ok_after |= closing + 1 == n
    bad = []
    if not (at_start | escaped).all():
        q = int(opening[~(at_start | escaped)][0])
        bad.append((q, "a quote inside an unquoted field", q))
    if not ok_after.all():
        k = int(np.flatnonzero(~ok_after)[0])
        bad.append((int(closing[k]), "text after a closing quote", int(opening[k])))
    if bad:
        return min(bad)
    if quotes.size % 2:
        return int(quotes[-1]), "a quote that is never closed", int(quotes[-1])
    return None
