"""Readers for ``torchcal audit``: named columns of a CSV, NPZ, ``.pt`` or Parquet file, in
chunks, with the group column's names mapped to integer ids.

:func:`read_columns` streams any of the four formats as :class:`Chunk` s; :func:`read_predictions`
adds the audit's checks (probabilities in [0, 1], finite logits, labels in the classes) and
yields tensors ready for :meth:`torchcal.audit.Auditor.update`.

- **CSV** (``.csv``): RFC 4180 (a header line naming the columns; quoted fields may hold commas,
  quotes written ``""`` and line breaks; a quote inside an unquoted field, ``5"``, is an error;
  ``\\n``, ``\\r\\n`` or ``\\r`` line ends; an optional UTF-8 BOM), streamed in blocks of
  about ``chunk_rows`` rows: memory is a block or two plus the longest record, whatever the
  file's size. Every row must have the header's number of fields; blank lines are skipped
  (counted in the :class:`ReadLog`); a row's line is the physical line where it starts (the
  header is line 1). Two engines read it alike
  (``engine=``, default :data:`CSV_ENGINE` ``"auto"``):

  - **pyarrow** (the fast path, used when :mod:`pyarrow` is installed) reads files without a
    quote character: its streaming CSV reader (``pyarrow.csv.open_csv``: blocks of 1 MB, only
    the needed columns, the group column dictionary-encoded, parsing in pyarrow's threads), set
    up so that what it accepts it reads exactly as the numpy path. See
    :mod:`torchcal.audit._arrow`.
  - **numpy** (the fallback, standard library and numpy only; all quoted files): see
    :mod:`torchcal.audit._csv` (plain blocks through :func:`numpy.loadtxt` and a vectorised pass
    over the bytes, the rest through :mod:`csv`).

  Where pyarrow cannot go on (a quote, a blank line, a value it cannot parse, a ragged row), the
  numpy path reads the rest of the file (re-reading from the top, skipping the rows already
  delivered), so the error messages, which give the value and the file's line number, are the
  numpy path's whichever engine runs. Both give the same rows, group ids, line numbers, errors
  and reports (``tests/audit/test_io_engines.py``, ``tests/audit/test_readers_differential.py``).
  ``benchmarks/bench_audit.py`` measures both against :func:`numpy.loadtxt`.
- **NPZ** (``.npz``) and **.pt** (a ``dict`` of tensors, arrays or, for the group column, a list of
  strings, loaded with ``weights_only=True``): each key is a column, 1-D (the prediction column
  may also be one ``(N, C)`` array); float16/bfloat16 tensors are read as float64; sparse,
  quantized, meta and complex tensors are errors. Held in memory, then chunked. Messages give
  the 0-based index.
- **Parquet** (``.parquet``, ``.pq``): streamed by row groups with :mod:`pyarrow` when it is
  installed (a clear error otherwise).

Values (:mod:`torchcal.audit._columns` has the exact syntax): numbers are ASCII decimals
(``0.5``, ``.5``, ``1e-3``, white space around ignored; ``nan``/``inf`` read, then rejected by
the checks); ``0_8`` or ``0.0_5`` are not numbers. A **stated confidence** (a probability
column of :func:`read_predictions`) may also be a percent (``85%``, `` 85 % ``: 0.85), mixed
freely with fractions; a row whose confidence is neither is *excluded*: left out, counted in the
:class:`ReadLog` with its first line and value, and the file rejected when more than
``max_unparsed`` (default 1 %) of its rows are. A **label** may also be ``True``/``False`` (any
case: 1/0, as pandas writes booleans); words such as ``yes``/``no`` are no label: with
probabilities (:func:`read_predictions`) such a row, like one whose label or weight is blank,
is rejected by the engines' rule (``label_invalid``, ``weight_invalid``), with logits the
reader names it in an error.

Group values (strings, or integers read as their decimal names) get ids in order of first
appearance, stable across chunks; a name is kept as written but must hold a visible character
(a missing or white-space-only one is ``group_null`` with probabilities, an error otherwise:
:func:`torchcal.engines.rules.blank`) and no NUL character (``"a"`` and ``"a\\0"`` are
rejected, never merged). A column named twice in the header (or the
Parquet schema) is an error when it is one of the columns read. Every error is a
:class:`ValueError` with a one-line message that starts with the column (or the file) it is
about and says where (``line N`` in a CSV, ``row i`` otherwise).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from torchcal.audit import _arrays, _arrow, _csv, _csv_blocks
from torchcal.audit._columns import Chunk, ReadLog, shown
from torchcal.engines._names import locate_columns
from torchcal.engines.rules import REJECT_REASONS, Rows, reasons_of
from torchcal.engines.text import LABEL, NUMBER, STATED, TEXT_KINDS
from torchcal.functional._validation import probability_sum_tolerance

FORMATS = {".csv": "csv", ".npz": "npz", ".pt": "pt", ".pth": "pt", ".parquet": "parquet"}
FORMATS[".pq"] = "parquet"
DEFAULT_CHUNK_ROWS = 1 << 20
ENGINES = ("auto", "pyarrow", "numpy")
#: the CSV engine when none is given ("auto": pyarrow when it is installed, else numpy)
CSV_ENGINE = "auto"
#: the share of rows whose stated confidence may fail to parse (excluded) before a file is rejected
MAX_UNPARSED = 0.01
#: the reader's reasons for a row it leaves out, as the engines name them
READ_REASONS = {"missing value": "preds_null", "not a number nor a percent": "preds_unparsed"}


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
    kinds: dict[str, str] | None = None,
    max_unparsed: float | None = MAX_UNPARSED,
    log: ReadLog | None = None,
    soft: Sequence[str] = (),
) -> Iterator[Chunk]:
    """Stream the numeric ``columns`` (and the ``group`` column's ids) of a file in chunks of
    about ``chunk_rows`` rows (see the module docstring for the formats). ``engine`` (CSV
    only): ``"auto"`` (pyarrow when installed, else numpy), ``"pyarrow"`` or ``"numpy"``;
    ``None`` = :data:`CSV_ENGINE`. ``kinds`` maps a column to how its text values read:
    ``"number"`` (the default), ``"stated"`` (a confidence: also percents; a row whose value
    does not parse is excluded) or ``"label"`` (also True/False). ``log`` (a :class:`ReadLog`)
    is filled while reading; once more than ``max_unparsed`` of the rows are excluded, the end
    of the file raises (``None``: the caller refuses, e.g. over a glob's files together, with
    :func:`refuse_invalid`). ``soft`` names columns left to the row rules of
    :data:`~torchcal.engines.rules.ROW_RULES` instead of raising: a missing or unparsed value
    of a label or weight reads NaN (the first kept in ``log.unparsed``), a missing or blank
    name of the ``group`` column is id -1 (``group_null``).

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
    if isinstance(chunk_rows, bool) or int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows: expected a positive integer, got {chunk_rows}")
    engine = CSV_ENGINE if engine is None else engine
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {ENGINES}, got {engine!r}")
    if max_unparsed is not None:
        check_share(max_unparsed)
    kinds = dict(kinds or {})
    for c, k in kinds.items():
        if k not in TEXT_KINDS:
            raise ValueError(f"kinds: {c!r} has kind {k!r}, expected one of {TEXT_KINDS}")
    columns = list(columns)
    kind_list = [kinds.get(c, NUMBER) for c in columns]
    log = ReadLog() if log is None else log
    kind = file_format(path)
    if not os.path.isfile(path):
        raise ValueError(f"{os.fspath(path)}: no such file")
    if kind == "csv":
        if engine == "pyarrow" and not _arrow.available():
            raise ValueError("engine: 'pyarrow' needs pyarrow (pip install pyarrow)")
        chunks = _read_csv(path, columns, kind_list, group, int(chunk_rows), engine, log, soft)
    elif kind == "parquet":
        chunks = _arrays.read_parquet(path, columns, kind_list, group, int(chunk_rows), log, soft)
    else:
        chunks = _arrays.read_arrays(
            path, kind, columns, kind_list, group, int(chunk_rows), log, soft
        )
    return _counted(chunks, log, max_unparsed, os.fspath(path))


def check_share(max_unparsed: float) -> None:
    """``ValueError`` unless ``max_unparsed`` is a fraction in [0, 1)."""
    if isinstance(max_unparsed, bool) or not isinstance(max_unparsed, (int, float)):
        raise ValueError(f"max_unparsed: expected a fraction in [0, 1), got {max_unparsed!r}")
    if not (0.0 <= max_unparsed < 1.0):
        raise ValueError(f"max_unparsed: expected a fraction in [0, 1), got {max_unparsed}")


def _counted(
    chunks: Iterator[Chunk], log: ReadLog, max_unparsed: float | None, file: str
) -> Iterator[Chunk]:
    """The chunks, with ``log.kept`` kept up to date and (``max_unparsed`` not None: else the
    caller checks, e.g. over a glob's files) the share of excluded rows and a file without
    rows refused at the end."""
    for chunk in chunks:
        log.kept += chunk.rows
        yield chunk
    if max_unparsed is None:
        return
    refuse_invalid(log, max_unparsed, file)
    if log.kept == 0:
        raise ValueError(
            f"{file}: no data rows" + (" after the header" if file.lower().endswith(".csv") else "")
        )


def invalid_rows(log: ReadLog) -> tuple[dict[str, int], int]:
    """The rows ``log`` excluded or rejected so far by reason (as the engines count them),
    and the rows seen."""
    bad: dict[str, int] = {}
    for e in log.excluded.values():
        r = READ_REASONS.get(e.reason, "preds_unparsed")
        bad[r] = bad.get(r, 0) + e.count
    if log.missing:  # an empty CSV field: NULL to an engine (preds_null), not unparsed text
        bad["preds_unparsed"] -= log.missing
        bad["preds_null"] = bad.get("preds_null", 0) + log.missing
    for r, c in log.rejected.items():
        bad[r] = bad.get(r, 0) + c
    return {r: bad[r] for r in REJECT_REASONS if bad.get(r)}, log.rows + sum(log.rejected.values())


def refuse_invalid(
    log: ReadLog, max_unparsed: float, source: str, first: str | None = None
) -> None:
    """``ValueError`` naming ``source`` when more than ``max_unparsed`` of the rows ``log``
    saw are invalid (:func:`refuse_share`), with the first bad row (``first``, else the
    log's own)."""
    bad, n = invalid_rows(log)
    refuse_share(source, bad, n, max_unparsed, lambda: first or first_bad(log))


def refuse_share(
    source: str,
    bad: dict[str, int],
    seen: int,
    max_unparsed: float,
    first: Callable[[], str] | None = None,
) -> None:
    """The one refusal line of every road: ``ValueError`` naming ``source`` when the rows
    ``bad`` (reason -> count) are more than ``max_unparsed`` of the ``seen`` ones; ``first``
    gives the first bad row where the road knows it."""
    k = sum(bad.values())
    if k and k > max_unparsed * seen:
        parts = ", ".join(f"{r} {c}" for r, c in bad.items() if c)
        tail = "" if first is None else f"; the first: {first()}"
        raise ValueError(
            f"{source}: {k} of {seen} rows are invalid ({parts}), more than --max-unparsed "
            f"{max_unparsed:g} of them{tail}"
        )


def first_bad(log: ReadLog) -> str:
    """The first row the reader excluded or a rule rejected, as an error names it."""
    at = [(int(e.where.split()[1]), e) for e in log.excluded.values()]
    if not at or (log.first_rejected and log.first_rejected_at < min(a for a, _ in at)):
        return log.first_rejected
    e = min(at, key=lambda a: a[0])[1]
    if e.reason == "missing value" or not e.text:
        return f"{e.column}: missing value at {e.where}"
    return f"{e.column}: {shown(e.text)} at {e.where} is not a number nor a percent"


@dataclass
class Batch:
    """Checked tensors for the Auditor: ``preds`` float64 ``(n,)`` or ``(n, C)``, ``target``
    int64, ``groups`` int64 ids or None, with ``group_names`` so far; ``log`` is the reader's
    :class:`ReadLog` (the same object in every batch, final after the last one)."""

    preds: Tensor
    target: Tensor
    groups: Tensor | None
    group_names: list[str]
    done: int
    log: ReadLog
    weight: Tensor | None = None


def read_predictions(
    path: str | os.PathLike[str],
    *,
    preds: Sequence[str],
    label: str,
    group: str | None = None,
    input: str = "probs",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    engine: str | None = None,
    max_unparsed: float | None = MAX_UNPARSED,
    log: ReadLog | None = None,
    weight: str | None = None,
    group_null: str = "drop",
) -> Iterator[Batch]:
    """:func:`read_columns` plus the audit's checks: ``preds`` names one column (binary:
    P(y = 1), or a 2-D NPZ/.pt array) or C >= 2 columns (the classes' probabilities or logits);
    labels must be 0/1 (binary, True/False too) or class indices in [0, C); probabilities must
    lie in [0, 1] (percents read as such; a row whose probability does not parse is excluded,
    see ``max_unparsed``; a row a rule of :data:`~torchcal.engines.rules.ROW_RULES` rejects
    -- out of range, NaN, not a class, a bad weight -- is counted in ``log.rejected`` and left
    out, and refused as the engines refuse it above ``max_unparsed``), logits be finite; a
    ``weight`` column (frequency weights) finite and ``>= 0``. Errors name the column, the value and where it is.
    With probabilities a label or weight that is missing or no number, and (``group_null=
    "drop"``) a missing or blank group, are rows the rules reject (``label_invalid``,
    ``weight_invalid``, ``group_null``), as on every engine; ``group_null="error"`` makes a
    blank group an error (a segment column, whose rows must be the main reader's) and
    ``"keep"`` keeps its row with the group id -1 (the mask of the main group's blank rows
    that the segment readers apply).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with open(f"{d}/x.csv", "w") as f:
        ...     _ = f.write("p,y\\n0.9,1\\n85%,True\\nhigh,0\\n0.2,2\\n")
        >>> b = list(read_predictions(f"{d}/x.csv", preds=["p"], label="y", max_unparsed=0.5))
        >>> b[0].target.tolist(), b[0].log.rejected, b[0].log.first_rejected
        ([1, 1], {'label_invalid': 1}, 'y: label 2 at line 5 is not a class (expected 0 or 1)')
        >>> list(read_predictions(f"{d}/x.csv", preds=["p"], label="y", max_unparsed=0.4))
        Traceback (most recent call last):
        ...
        ValueError: ...: 2 of 4 rows are invalid (preds_unparsed 1, label_invalid 1), more than --max-unparsed 0.4 of them; the first: p: 'high' at line 4 is not a number nor a percent
        >>> with open(f"{d}/x.csv", "w") as f:
        ...     _ = f.write("p,y\\n0.9,1\\n85%,True\\nhigh,0\\n")
        >>> b = list(read_predictions(f"{d}/x.csv", preds=["p"], label="y", max_unparsed=0.5))
        >>> b[0].preds.tolist(), b[0].target.tolist(), b[-1].log.excluded["p: not a number nor a percent"].where
        ([0.9, 0.85], [1, 1], 'line 4')
    """
    if input not in ("probs", "logits"):
        raise ValueError(f"input: expected 'probs' or 'logits', got {input!r}")
    names = list(dict.fromkeys([*preds, label] + ([weight] if weight else [])))
    kinds = {c: STATED if input == "probs" else NUMBER for c in preds}
    kinds[label] = LABEL if label not in kinds else kinds[label]
    log = ReadLog() if log is None else log
    # --probs: a bad label, weight or group is a row the rules reject, as on every engine
    if group_null not in ("drop", "error", "keep"):
        raise ValueError(f"group_null: expected 'drop', 'error' or 'keep', got {group_null!r}")
    soft = [c for c in (label, weight, None if group_null == "error" else group) if c]
    soft = soft if input == "probs" else []
    chunks = read_columns(
        path,
        names,
        group=group,
        chunk_rows=chunk_rows,
        engine=engine,
        kinds=kinds,
        max_unparsed=max_unparsed,
        log=log,
        soft=soft,
    )
    for chunk in chunks:
        p = _stack_preds(chunk, list(preds))
        if input == "probs":  # the engines' rules: bad rows are counted by reason, left out
            rule = group_null == "drop"
            chunk, p = _rejected(chunk, p, list(preds), label, group, weight, log, rule)
            if not chunk.rows:
                continue
        _check_preds(chunk, p, list(preds), input)
        y = _check_labels(chunk, chunk.columns[label], label, 1 if p.ndim == 1 else p.shape[1])
        groups = None if chunk.groups is None else torch.from_numpy(chunk.groups)
        tensors = torch.from_numpy(p), torch.from_numpy(y)
        w = None if weight is None else _check_weights(chunk, weight)
        yield Batch(*tensors, groups, chunk.group_names, chunk.done, log, w)


def _rejected(
    chunk: Chunk,
    p: np.ndarray,
    preds: list[str],
    label: str,
    group: str | None,
    weight: str | None,
    log: ReadLog,
    group_rule: bool = True,
) -> tuple[Chunk, np.ndarray]:
    """The chunk without the rows a rule of :data:`~torchcal.engines.rules.ROW_RULES` rejects
    (counted in ``log.rejected`` by reason, the first kept as its error message): the same
    reasons and counts as every engine (docs/design.md section 6c.2). A label or weight that
    did not parse is NaN here, a missing or blank group id -1 (the readers' ``soft``; a row
    ``group_null`` only with ``group_rule``)."""
    y = chunk.columns[label]
    C = 1 if p.ndim == 1 else p.shape[1]
    g = chunk.groups
    if C == 1 and weight is None and p.size:  # the usual case: four passes, no temporaries
        lo, hi = p.min(), p.max()
        if lo >= 0.0 and hi <= 1.0 and y.size and y.min() >= 0.0 and y.max() <= 1.0:
            if np.array_equal(y.astype(np.int64), y) and (g is None or g.min() >= 0):
                return chunk, p  # NaN fails min/max
    n = chunk.rows
    none = np.zeros(n, bool)
    w = None if weight is None else np.asarray(chunk.columns[weight], dtype=np.float64)
    tol = float(probability_sum_tolerance(torch.float64, C))
    g_null = None if g is None or not group_rule else g < 0
    names = None if g_null is None else np.empty(n, dtype=object)  # the rule reads g_null
    y64 = np.asarray(y, np.float64)
    rows = Rows(p.reshape(n, C), y64, none[:, None], none, names, w, none, tol, g_null)
    reason = reasons_of(rows)
    keep = reason < 0
    if keep.all():
        return chunk, p
    for i, r in enumerate(REJECT_REASONS):
        k = int((reason == i).sum())
        if k:
            log.rejected[r] = log.rejected.get(r, 0) + k
    log.kept -= int((~keep).sum())
    if not log.first_rejected:  # the first bad row as the checks name it (column, value, line)
        at = np.flatnonzero(~keep)[:1]
        row = _take(chunk, at)
        log.first_rejected = _problem(row, p[at], preds, label, group, weight, log)
        log.first_rejected_at = int(row.where(0).split()[1])
    idx = np.flatnonzero(keep)
    return _take(chunk, idx), np.ascontiguousarray(p[idx])


def _problem(
    row: Chunk,
    p: np.ndarray,
    preds: list[str],
    label: str,
    group: str | None,
    weight: str | None,
    log: ReadLog,
) -> str:
    """What is wrong with the rejected ``row`` (a one-row chunk), as the checks say it."""
    C = 1 if p.ndim == 1 else p.shape[1]
    try:
        with np.errstate(invalid="ignore"):
            _check_preds(row, p, preds, "probs")
            _check_labels(row, np.asarray(row.columns[label]), label, C, log)
        if row.groups is not None and (row.groups < 0).any():
            raise ValueError(f"{group}: empty group name at {row.where(0)}")
        if weight is not None:
            _check_weights(row, weight, log)
    except ValueError as e:
        return str(e)
    return f"the row at {row.where(0)}"  # not reached: a rule rejected it


def _unparsed(log: ReadLog | None, column: str, where: str) -> str | None:
    """The text of ``column``'s value at ``where`` when it did not parse (it reads NaN)."""
    got = None if log is None else log.unparsed.get(column)
    return got[1] if got is not None and got[0] == where else None


def _take(chunk: Chunk, idx: np.ndarray) -> Chunk:
    """``chunk``'s rows ``idx``."""
    cols = {c: v[idx] for c, v in chunk.columns.items()}
    g = None if chunk.groups is None else chunk.groups[idx]
    lines = None if chunk.lines is None else chunk.lines[idx]
    index = None
    if lines is None:  # each row's index in the file, for where()
        index = chunk.offset + idx if chunk.index is None else chunk.index[idx]
    return Chunk(cols, g, chunk.group_names, lines, chunk.offset, chunk.done, index)


def _check_weights(chunk: Chunk, name: str, log: ReadLog | None = None) -> Tensor:
    """Frequency weights: finite and >= 0; name the row of the first bad one."""
    w = np.ascontiguousarray(chunk.columns[name], dtype=np.float64)
    bad = ~(np.isfinite(w) & (w >= 0))
    if bad.any():
        i, where = _first(chunk, bad)
        if (text := _unparsed(log, name, where)) is not None:
            raise _csv.bad_value(name, text, where, NUMBER)
        raise ValueError(
            f"{name}: weight {float(w[i])!r} at {where} is not a frequency weight (expected a "
            f"finite number >= 0)"
        )
    return torch.from_numpy(w if w.flags.writeable else w.copy())


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
        what = "is not a probability (expected a value in [0, 1]"
    else:
        bad = ~np.isfinite(p)
        what = "is not a finite logit"
    if bad.any():
        i, where = _first(chunk, bad)
        j = int(np.flatnonzero(bad[i].reshape(-1))[0]) if p.ndim == 2 else 0
        col = names[j] if len(names) > 1 else names[0]
        value = float(p[i, j] if p.ndim == 2 else p[i])
        if input == "probs":  # a stated 85 for 85 %: say how to write it
            what += "; a percent is written 85%)" if 1.0 < value <= 100.0 else ")"
        raise ValueError(f"{col}: value {value!r} at {where} {what}")


def _check_labels(
    chunk: Chunk, y: np.ndarray, name: str, num_classes: int, log: ReadLog | None = None
) -> np.ndarray:
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
        if (text := _unparsed(log, name, where)) is not None:
            raise _csv.bad_value(name, text, where, LABEL)
        expected = "0 or 1" if num_classes == 1 else f"an integer class in [0, {top}]"
        v = float(y[i])
        label_text = int(v) if v.is_integer() else v
        raise ValueError(
            f"{name}: label {label_text} at {where} is not a class (expected {expected})"
        )
    return y.astype(np.int64)


# ---------------------------------------------------------------------------------------- CSV


def _read_csv(
    path: str | os.PathLike[str],
    columns: list[str],
    kinds: list[str],
    group: str | None,
    chunk_rows: int,
    engine: str,
    log: ReadLog,
    soft: Sequence[str] = (),
) -> Iterator[Chunk]:
    file = os.fspath(path)
    with open(path, "rb") as f:
        header, start, header_lines = _csv_blocks.read_header(f, file)
        f.seek(start)
        sample = f.read(1 << 16)
    idx = locate_columns(file, header, columns)
    gidx = None if group is None else locate_columns(file, header, [group])[0]
    per_row = max(8, len(sample) // max(1, sample.count(b"\n") + sample.count(b"\r")))
    block_bytes = min(_csv_blocks.MAX_BLOCK, chunk_rows * per_row)
    rows = 0
    if engine != "numpy" and _arrow.available() and header_lines == 1:
        try:
            null_blank = group is not None and group in soft
            for chunk in _arrow.read_csv(path, header, columns, idx, gidx, chunk_rows, null_blank):
                yield chunk
                rows += chunk.rows
            return
        except _arrow.Fallback:
            pass  # the rest the numpy way (which names the line and value of an error)
    numpy_csv = _csv.read_csv(
        path, columns, kinds, header, idx, gidx, block_bytes, start, 1 + header_lines, log, soft
    )
    for chunk in numpy_csv:
        if chunk.offset + chunk.rows > rows:  # rows already read by pyarrow are skipped
            yield _skip(chunk, rows - chunk.offset) if chunk.offset < rows else chunk
            rows = chunk.offset + chunk.rows


def _skip(chunk: Chunk, k: int) -> Chunk:
    """``chunk`` without its first ``k`` rows."""
    cols = {c: v[k:] for c, v in chunk.columns.items()}
    g = None if chunk.groups is None else chunk.groups[k:]
    lines = None if chunk.lines is None else chunk.lines[k:]
    return Chunk(cols, g, chunk.group_names, lines, chunk.offset + k, chunk.done)
