"""Readers for ``torchcal audit``: named columns of a CSV, NPZ, ``.pt`` or Parquet file, in
chunks, with the group column's names mapped to integer ids.

:func:`read_columns` streams any of the four formats as :class:`Chunk` s; :func:`read_predictions`
adds the audit's checks (probabilities in [0, 1], finite logits, labels in the classes) and
yields tensors ready for :meth:`torchcal.audit.Auditor.update`.

- **CSV** (``.csv``): streamed in blocks of about ``chunk_rows`` lines: memory is a block or
  two, whatever the file's size. A header line names the columns. Two engines read it alike
  (``engine=``, default :data:`CSV_ENGINE` ``"auto"``):

  - **pyarrow** (the fast path, used when :mod:`pyarrow` is installed): its streaming CSV
    reader (``pyarrow.csv.open_csv``: blocks of ``chunk_rows`` lines or 1 MB, only the needed
    columns, the group column dictionary-encoded, parsing in pyarrow's threads), set up so that
    what it accepts it reads exactly as the numpy path: quoting off, blank lines and empty
    values are errors, nothing is null. See :mod:`torchcal.audit._arrow`.
  - **numpy** (the fallback, standard library and numpy only): see :mod:`torchcal.audit._csv`
    (plain blocks go through :func:`numpy.loadtxt` and a vectorised pass over the bytes; quoted
    fields through :mod:`csv`).

  Where pyarrow cannot go on (a quote, a blank line, a value it cannot parse, a ragged row), the
  numpy path reads the rest of the file (re-reading from the top, skipping the rows already
  delivered), so the error messages, which give the value and the file's line number (the
  header is line 1), are the numpy path's whichever engine runs. Both give the same rows,
  group ids and reports (``tests/audit/test_io_engines.py``).
  ``benchmarks/bench_audit.py`` measures both against :func:`numpy.loadtxt`.
- **NPZ** (``.npz``) and **.pt** (a ``dict`` of tensors, arrays or, for the group column, a list of
  strings, loaded with ``weights_only=True``): each key is a column; the prediction column may
  also be one ``(N, C)`` array. Held in memory, then chunked. Messages give the 0-based index.
- **Parquet** (``.parquet``, ``.pq``): streamed by row groups with :mod:`pyarrow` when it is
  installed (a clear error otherwise).

Group values (strings, or integers read as their decimal names) get ids in order of first
appearance, stable across chunks. Every error is a :class:`ValueError` whose message starts with
the column (or the file) it is about.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from torchcal.audit import _csv

__all__ = [
    "FORMATS",
    "Chunk",
    "GroupIndex",
    "Batch",
    "read_columns",
    "read_predictions",
    "progress_total",
]

FORMATS = {".csv": "csv", ".npz": "npz", ".pt": "pt", ".pth": "pt", ".parquet": "parquet"}
FORMATS[".pq"] = "parquet"
DEFAULT_CHUNK_ROWS = 1 << 20
ENGINES = ("auto", "pyarrow", "numpy")
#: the CSV engine when none is given ("auto": pyarrow when it is installed, else numpy)
CSV_ENGINE = "auto"


@dataclass
class GroupIndex:
    """Group names to ids in order of first appearance.

    Example:
        >>> g = GroupIndex()
        >>> g.ids_of(["b", "a"], np.array([0, 1, 0])).tolist(), g.names
        ([0, 1, 0], ['b', 'a'])
    """

    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)

    def ids_of(self, uniques: Sequence[str], inverse: np.ndarray) -> np.ndarray:
        """Global ids of rows whose local value index is ``inverse`` into ``uniques``."""
        lut = np.empty(len(uniques), dtype=np.int64)
        for i, name in enumerate(uniques):
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
    ``done`` is the progress so far in :func:`progress_total`'s unit."""

    columns: dict[str, np.ndarray]
    groups: np.ndarray | None
    group_names: list[str]
    lines: np.ndarray | None  # CSV: each row's line number
    offset: int  # index of the first row among all rows
    done: int

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def where(self, i: int) -> str:
        if self.lines is not None:
            return f"line {int(self.lines[i])}"
        return f"row {self.offset + i}"


def file_format(path: str | os.PathLike[str]) -> str:
    """The reader for ``path``'s extension.

    Example:
        >>> file_format("a/b.CSV")
        'csv'
    """
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext not in FORMATS:
        known = ", ".join(sorted(FORMATS))
        raise ValueError(
            f"{os.fspath(path)}: unknown file type {ext or '(none)'!r} (known: {known})"
        )
    return FORMATS[ext]


def progress_total(path: str | os.PathLike[str]) -> tuple[int, str]:
    """The size of the reading job and its unit: bytes for CSV, rows otherwise (0 = unknown)."""
    kind = file_format(path)
    if not os.path.isfile(path):
        return 0, "B" if kind == "csv" else "rows"
    if kind == "csv":
        return os.path.getsize(path), "B"
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows, "rows"
        except Exception:  # the reader reports the problem
            return 0, "rows"
    return 0, "rows"


def read_columns(
    path: str | os.PathLike[str],
    columns: Sequence[str],
    *,
    group: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    engine: str | None = None,
) -> Iterator[Chunk]:
    """Stream the numeric ``columns`` (and the ``group`` column's ids) of a file in chunks of
    about ``chunk_rows`` rows (see the module docstring for the formats). ``engine`` (CSV
    only): ``"auto"`` (pyarrow when installed, else numpy), ``"pyarrow"`` or ``"numpy"``;
    ``None`` = :data:`CSV_ENGINE`.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/x.csv", "w") as f:
        ...     _ = f.write("id,domain,p\\n0,math,0.9\\n1,qa,0.2\\n2,math,0.5\\n")
        >>> [c.columns["p"].tolist() for c in read_columns(f"{d}/x.csv", ["p"], chunk_rows=2)]
        [[0.9, 0.2], [0.5]]
        >>> c = next(read_columns(f"{d}/x.csv", ["p"], group="domain"))
        >>> c.groups.tolist(), c.group_names
        ([0, 1, 0], ['math', 'qa'])
    """
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows: expected a positive integer, got {chunk_rows}")
    engine = CSV_ENGINE if engine is None else engine
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {ENGINES}, got {engine!r}")
    kind = file_format(path)
    if not os.path.isfile(path):
        raise ValueError(f"{os.fspath(path)}: no such file")
    if kind == "csv":
        if engine == "pyarrow":
            from torchcal.audit._arrow import available

            if not available():
                raise ValueError("engine: 'pyarrow' needs pyarrow (pip install pyarrow)")
        return _read_csv(path, list(columns), group, int(chunk_rows), engine)
    from torchcal.audit._arrays import read_arrays, read_parquet

    if kind == "parquet":
        return read_parquet(path, list(columns), group, int(chunk_rows))
    return read_arrays(path, kind, list(columns), group, int(chunk_rows))


@dataclass
class Batch:
    """Checked tensors for the Auditor: ``preds`` float64 ``(n,)`` or ``(n, C)``, ``target``
    int64, ``groups`` int64 ids or None, with ``group_names`` so far."""

    preds: Tensor
    target: Tensor
    groups: Tensor | None
    group_names: list[str]
    done: int


def read_predictions(
    path: str | os.PathLike[str],
    *,
    preds: Sequence[str],
    label: str,
    group: str | None = None,
    input: str = "probs",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    engine: str | None = None,
) -> Iterator[Batch]:
    """:func:`read_columns` plus the audit's checks: ``preds`` names one column (binary:
    P(y = 1), or a 2-D NPZ/.pt array) or C >= 2 columns (the classes' probabilities or logits);
    labels must be 0/1 (binary) or class indices in [0, C); probabilities must lie in [0, 1],
    logits be finite. Errors name the column, the value and where it is.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/x.csv", "w") as f:
        ...     _ = f.write("p,y\\n0.9,1\\n0.2,2\\n")
        >>> next(read_predictions(f"{d}/x.csv", preds=["p"], label="y"))
        Traceback (most recent call last):
        ...
        ValueError: y: label 2 at line 3 is not a class (expected 0 or 1)
    """
    if input not in ("probs", "logits"):
        raise ValueError(f"input: expected 'probs' or 'logits', got {input!r}")
    names = list(dict.fromkeys([*preds, label]))
    chunks = read_columns(path, names, group=group, chunk_rows=chunk_rows, engine=engine)
    for chunk in chunks:
        p = _stack_preds(chunk, list(preds))
        _check_preds(chunk, p, list(preds), input)
        y = _check_labels(chunk, chunk.columns[label], label, 1 if p.ndim == 1 else p.shape[1])
        groups = None if chunk.groups is None else torch.from_numpy(chunk.groups)
        yield Batch(torch.from_numpy(p), torch.from_numpy(y), groups, chunk.group_names, chunk.done)


def _stack_preds(chunk: Chunk, preds: list[str]) -> np.ndarray:
    cols = [chunk.columns[c] for c in preds]
    if len(cols) == 1:
        p = cols[0]
        if p.ndim == 2 and p.shape[1] == 1:
            p = p[:, 0]
        p = np.ascontiguousarray(p)
        return p if p.flags.writeable else p.copy()  # pyarrow's buffers are read-only
    if any(c.ndim != 1 for c in cols):
        raise ValueError(f"{preds[0]}: expected one 1-D column per class when several are named")
    return np.ascontiguousarray(np.stack(cols, axis=1))


def _first(chunk: Chunk, bad: np.ndarray) -> tuple[int, str]:
    i = int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(1))[0])
    return i, chunk.where(i)


def _check_preds(chunk: Chunk, p: np.ndarray, names: list[str], input: str) -> None:
    """Probabilities in [0, 1], logits finite; name the column and the row of the first bad one."""
    if p.size and np.isfinite(lo := p.min()) and np.isfinite(hi := p.max()):  # no NaN/inf
        if input == "logits" or (lo >= 0.0 and hi <= 1.0):
            return  # the usual case: two passes, no temporaries
    if input == "probs":
        bad = ~((p >= 0.0) & (p <= 1.0))  # NaN is bad too
        what = "is not a probability (expected a value in [0, 1])"
    else:
        bad = ~np.isfinite(p)
        what = "is not a finite logit"
    if bad.any():
        i, where = _first(chunk, bad)
        j = int(np.flatnonzero(bad[i].reshape(-1))[0]) if p.ndim == 2 else 0
        col = names[j] if len(names) > 1 else names[0]
        value = p[i, j] if p.ndim == 2 else p[i]
        raise ValueError(f"{col}: value {float(value)!r} at {where} {what}")


def _check_labels(chunk: Chunk, y: np.ndarray, name: str, num_classes: int) -> np.ndarray:
    """Labels: 0/1 for one prediction column, else integers in [0, C)."""
    top = 1 if num_classes == 1 else num_classes - 1
    if y.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D label column, got shape {tuple(y.shape)}")
    ints = y.astype(np.int64)
    if y.size and y.min() >= 0 and y.max() <= top and np.array_equal(ints, y):
        return ints  # the usual case (NaN fails min/max)
    bad = ~((y >= 0) & (y <= top) & (np.floor(y) == y))
    if bad.any():
        i, where = _first(chunk, bad)
        expected = "0 or 1" if num_classes == 1 else f"an integer class in [0, {top}]"
        v = float(y[i])
        shown = int(v) if v.is_integer() else v
        raise ValueError(f"{name}: label {shown} at {where} is not a class (expected {expected})")
    return y.astype(np.int64)


# ---------------------------------------------------------------------------------------- CSV


def _header(path: str | os.PathLike[str], line: bytes) -> list[str]:
    if not line.strip():
        raise ValueError(
            f"{os.fspath(path)}: empty file (expected a header line naming the columns)"
        )
    text = line.decode("utf-8-sig").rstrip("\r\n")
    return [c.strip() for c in next(csv.reader([text]))]


def locate_columns(path: str | os.PathLike[str], header: list[str], wanted: list[str]) -> list[int]:
    idx = []
    for name in wanted:
        if name not in header:
            cols = ", ".join(header)
            raise ValueError(f"{name}: no such column in {os.fspath(path)} (columns: {cols})")
        idx.append(header.index(name))
    return idx


def _read_csv(
    path: str | os.PathLike[str],
    columns: list[str],
    group: str | None,
    chunk_rows: int,
    engine: str,
) -> Iterator[Chunk]:
    with open(path, "rb") as f:
        head = f.readline()
        header = _header(path, head)
        idx = locate_columns(path, header, columns)
        gidx = None if group is None else locate_columns(path, header, [group])[0]
        sample = f.read(1 << 16)
    per_row = max(8, len(sample) // max(1, sample.count(b"\n")))
    numpy_csv = (header, idx, gidx, chunk_rows * per_row, len(head))
    rows = 0
    if engine != "numpy":
        from torchcal.audit import _arrow

        if engine == "pyarrow" or _arrow.available():
            try:
                for chunk in _arrow.read_csv(path, header, columns, idx, gidx, chunk_rows):
                    yield chunk
                    rows += chunk.rows
            except _arrow.Fallback:
                pass  # the rest the numpy way (which names the line and value of an error)
            else:
                if rows == 0:
                    raise ValueError(f"{os.fspath(path)}: no data rows after the header")
                return
    for chunk in _read_csv_numpy(path, columns, *numpy_csv):
        if chunk.offset + chunk.rows > rows:  # rows already read by pyarrow are skipped
            yield _skip(chunk, rows - chunk.offset) if chunk.offset < rows else chunk
            rows = chunk.offset + chunk.rows
    if rows == 0:
        raise ValueError(f"{os.fspath(path)}: no data rows after the header")


def _skip(chunk: Chunk, k: int) -> Chunk:
    """``chunk`` without its first ``k`` rows."""
    cols = {c: v[k:] for c, v in chunk.columns.items()}
    g = None if chunk.groups is None else chunk.groups[k:]
    lines = None if chunk.lines is None else chunk.lines[k:]
    return Chunk(cols, g, chunk.group_names, lines, chunk.offset + k, chunk.done)


def _read_csv_numpy(
    path: str | os.PathLike[str],
    columns: list[str],
    header: list[str],
    idx: list[int],
    gidx: int | None,
    block_bytes: int,
    start: int,
) -> Iterator[Chunk]:
    with open(path, "rb") as f:
        f.seek(start)
        groups, line, offset = GroupIndex(), 2, 0
        for body in _csv.blocks(f, block_bytes):
            rows_in_block = body.count(b"\n")
            values, gids, lines = _csv_block(body, rows_in_block, header, idx, gidx, groups, line)
            n = values.shape[0]
            line += rows_in_block
            if n == 0:
                continue
            cols = {c: values[:, k] for k, c in enumerate(columns)}
            yield Chunk(cols, gids, list(groups.names), lines, offset, f.tell())
            offset += n


def _csv_block(
    body: bytes,
    rows: int,
    header: list[str],
    idx: list[int],
    gidx: int | None,
    groups: GroupIndex,
    first_line: int,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """One block of ``rows`` lines: the fast way when plain, else (or on any rejection) the
    :mod:`csv` way."""
    plain = b"\n\n" not in body and not body.startswith(b"\n") and b'"' not in body
    fields = _csv.split_fields(body, len(header), rows) if plain and gidx is not None else None
    values = _csv.loadtxt_columns(body, idx) if plain and (gidx is None or fields) else None
    if values is not None and values.shape[0] == rows:
        lines = np.arange(first_line, first_line + rows)
        if gidx is None:
            return values, None, lines
        assert fields is not None
        keys = _csv.group_keys(fields.buf, fields.start(gidx), fields.end(gidx))
        return values, _keys_to_ids(body, fields, gidx, keys, groups, header, lines), lines
    values, texts, lines = _csv.slow_rows(body, header, idx, gidx, first_line)
    if gidx is None:
        return values, None, lines
    uniques, first, inverse = np.unique(
        np.array(texts, dtype=object), return_index=True, return_inverse=True
    )
    first, inverse = first_appearance(first, inverse.reshape(-1))
    names = [str(texts[i]) for i in first]
    check_names(header[gidx], names, inverse, lambda i: f"line {int(lines[i])}")
    return values, groups.ids_of(names, inverse.reshape(-1)), lines


def _keys_to_ids(
    body: bytes,
    fields: _csv.Fields,
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
    names = [body[s[i] : e[i]].decode("utf-8") for i in first]
    check_names(header[gidx], names, inverse, lambda i: f"line {int(lines[i])}")
    return groups.ids_of(names, inverse)


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
    column: str, names: list[str], inverse: np.ndarray, where: Callable[[int], str]
) -> None:
    for k, name in enumerate(names):
        if not name.strip():
            i = int(np.flatnonzero(inverse == k)[0])
            raise ValueError(f"{column}: empty group name at {where(i)}")
