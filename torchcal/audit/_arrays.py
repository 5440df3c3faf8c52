"""(internal) The audit's NPZ, ``.pt`` and Parquet readers (see :mod:`torchcal.audit.io`).

Every column is 1-D (the prediction column may be one ``(N, C)`` array); a tensor is read as
float64 when it is real and dense: float16/bfloat16 are upcast, sparse, quantized, meta, nested
and complex tensors are errors naming the column (an NPZ/.pt column of numbers must hold
numbers). A Parquet string column reads by the CSV syntax (:func:`torchcal.engines.text.parse_value`): a
stated confidence may be a percent, and one that does not parse (or is null) excludes its row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator

import numpy as np
import torch
from torch import Tensor

from torchcal.audit._columns import (
    Chunk,
    GroupIndex,
    ReadLog,
    check_names,
    first_appearance,
    shown,
)
from torchcal.engines._names import locate_columns
from torchcal.engines.text import STATED, parse_value


def _group_ids(
    values: np.ndarray, column: str, groups: GroupIndex, where: Callable[[int], str]
) -> np.ndarray:
    """Ids of a 1-D column of group values (strings, bytes or integers; with
    ``groups.null_blank`` a missing or blank one is id -1, ``group_null``)."""
    if values.ndim != 1:
        raise ValueError(
            f"{column}: expected a 1-D column of group names, got shape {tuple(values.shape)}"
        )
    if values.dtype.kind not in "USOiu":  # booleans read True/False here, true/false in SQL
        raise ValueError(
            f"{column}: expected group names (strings or integers), got {values.dtype}"
        )
    if values.dtype.kind == "O":  # hashed in C: the distinct values in order of appearance
        rows = list(values)

        def ok(v: object) -> bool:
            return isinstance(v, (str, bytes)) or (v is None and groups.null_blank)

        try:
            index = {v: i for i, v in enumerate(dict.fromkeys(rows))}
            names_ok = all(ok(v) for v in index)
        except TypeError:  # an unhashable value (a list, an array): not a name
            index, names_ok = {}, False
        if not names_ok:
            i = next(i for i, v in enumerate(rows) if not ok(v))  # the first bad row
            raise ValueError(f"{column}: empty group name at {where(i)} (got {rows[i]!r})")
        inverse = np.fromiter(map(index.__getitem__, rows), np.int64, len(rows))
        names = ["" if v is None else _name(v) for v in index]  # a missing name is blank
        check_names(column, names, inverse, where, groups.null_blank)
        return groups.ids_of(names, inverse)
    uniques, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    first, inverse = first_appearance(first, inverse.reshape(-1))
    names = [_name(values[i]) for i in first]
    check_names(column, names, inverse, where, groups.null_blank)
    return groups.ids_of(names, inverse)


def _row_of(rows: np.ndarray) -> Callable[[int], str]:
    """Where the ``i``-th of the kept ``rows`` is."""
    return lambda i: f"row {int(rows[i])}"


def _name(v: object) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)


#: the most bytes the arrays of one ``.npz`` file may hold once decompressed (1 GiB, about
#: 130 million float64 values; a 2.4 MB file of zeros can declare 2 GB): checked from the
#: zip directory and each array's header before anything is decompressed. Larger data:
#: Parquet through ``--engine`` (docs/engines.md)
MAX_NPZ_BYTES = 1 << 30


def _check_npz_size(p: str) -> None:
    """``ValueError`` naming ``p`` when its members, or the arrays their headers declare,
    exceed :data:`MAX_NPZ_BYTES` (the bound of a decompression bomb)."""
    import zipfile

    from numpy.lib import format as npy

    try:
        with zipfile.ZipFile(p) as z:
            total = declared = 0
            for info in z.infolist():
                total += info.file_size
                if info.filename.endswith(".npy") and total <= MAX_NPZ_BYTES:
                    with z.open(info) as f:
                        v1 = npy.read_magic(f) == (1, 0)
                        read = npy.read_array_header_1_0 if v1 else npy.read_array_header_2_0
                        shape, _, dtype = read(f)
                    declared += int(np.prod(shape, dtype=object)) * dtype.itemsize
    except (zipfile.BadZipFile, ValueError, OSError):
        return  # not a zip of .npy files: np.load says what it is
    size = max(total, declared)
    if size > MAX_NPZ_BYTES:
        raise ValueError(
            f"{p}: its arrays hold {size / 2**20:.0f} MiB once decompressed, more than the "
            f"{MAX_NPZ_BYTES / 2**20:.0f} MiB an .npz may hold; write Parquet and audit it with "
            f"--engine duckdb"
        )


def _load_mapping(path: str | os.PathLike[str], kind: str) -> dict[str, object]:
    p = os.fspath(path)
    if kind == "npz":
        _check_npz_size(p)
    try:
        if kind == "npz":
            with np.load(p, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        data = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # any unreadable file is bad input
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: cannot be read as a .{kind} file ({msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a dict of columns, got {type(data).__name__}")
    return {str(k): v for k, v in data.items()}


def _as_array(value: object, column: str) -> np.ndarray:
    """A column as a numpy array; tensors must be dense, real and on a real device."""
    if isinstance(value, Tensor):
        t = value.detach()
        what = None
        if t.layout != torch.strided or getattr(t, "is_nested", False):
            what = f"a {str(t.layout).replace('torch.', '')} tensor"
        elif t.is_meta:
            what = "a meta tensor (it holds no values)"
        elif t.is_quantized:
            what = "a quantized tensor"
        elif t.is_complex():
            what = f"a complex tensor ({t.dtype})"
        if what is not None:
            raise ValueError(
                f"{column}: expected a dense tensor of real numbers, got {what}: "
                "save .to_dense() / the real values"
            )
        if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
            t = t.to(torch.float64)  # float16, bfloat16 and the float8s: numpy lacks some
        return t.cpu().numpy()
    if isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged nesting
            raise ValueError(f"{column}: expected a flat list of values") from None
        if arr.dtype.kind in "US":  # keep the strings as written (numpy drops trailing NULs)
            arr = np.array(list(value), dtype=object)
        return arr
    return np.asarray(value)


def _column_values(
    a: np.ndarray,
    column: str,
    kind: str,
    rows: np.ndarray,
    where: Callable[[int], str],
    text: bool = True,
    soft: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """float64 values of a column and, for text (when ``text``), the mask of values that do not
    parse (a stated confidence's, or with ``soft`` -- a label, a weight read for the row rules
    -- any column's: NaN)."""
    if a.dtype.kind in "biuf":
        return a.astype(np.float64), None
    texts = text and (
        a.dtype.kind in "US"
        or (
            a.dtype.kind == "O" and all(v is None or isinstance(v, (str, bytes)) for v in a.ravel())
        )
    )
    if not texts or a.ndim != 1:
        raise ValueError(
            f"{column}: expected a 1-D or 2-D array of numbers, got {a.dtype} of shape {a.shape}"
        )
    out = np.empty(a.shape[0], dtype=np.float64)
    bad = np.zeros(a.shape[0], dtype=bool)
    for i, v in enumerate(a):
        x = None if v is None else parse_value(_name(v), kind)
        if x is None:
            if kind != STATED and not soft:
                from_what = "a number nor True/False" if kind != "number" else "a number"
                raise ValueError(
                    f"{column}: {shown(_name(v))} at {where(int(rows[i]))} is not {from_what}"
                )
            bad[i] = True
            x = np.nan
        out[i] = x
    return out, bad


def _exclude(
    log: ReadLog, column: str, bad: np.ndarray, a: np.ndarray, rows: np.ndarray, reason: str
) -> None:
    k = int(bad.sum())
    if k:
        i = int(np.flatnonzero(bad)[0])
        text = "null" if reason == "missing value" or a[i] is None else _name(a[i])
        log.exclude(column, reason, f"row {int(rows[i])}", text, count=k)


def read_arrays(
    path: str | os.PathLike[str],
    kind: str,
    columns: list[str],
    kinds: list[str],
    group: str | None,
    chunk_rows: int,
    log: ReadLog,
    soft: Collection[str] = (),
) -> Iterator[Chunk]:
    """NPZ/.pt columns (numbers only: nothing is excluded, ``log`` is for symmetry; the group
    in ``soft``: a missing or blank name is id -1)."""
    p = os.fspath(path)
    data = _load_mapping(path, kind)
    locate_columns(p, list(data), [*columns, *([group] if group else [])])
    raw = {c: _as_array(data[c], c) for c in columns}
    for c, a in raw.items():
        if a.ndim not in (1, 2):
            raise ValueError(
                f"{c}: expected a 1-D or 2-D array of numbers, got {a.dtype} of shape {a.shape}"
            )
    gvalues = None if group is None else _as_array(data[group], group)
    n = len(raw[columns[0]])
    named = [*raw.items(), *([(group or "", gvalues)] if gvalues is not None else [])]
    for c, a in named:
        if a.ndim == 0 or len(a) != n:
            got = "a scalar" if a.ndim == 0 else f"{len(a)} rows"
            raise ValueError(f"{c}: {got}, but {columns[0]} has {n}")
    if n == 0:
        raise ValueError(f"{p}: no data rows")
    rows = np.arange(n)
    arrays = {
        c: _column_values(raw[c], c, k, rows, lambda i: f"row {i}", text=False)[0]
        for c, k in zip(columns, kinds)
    }
    groups, gids = GroupIndex(null_blank=group in soft), None
    if group is not None and gvalues is not None:
        gids = _group_ids(gvalues, group, groups, lambda i: f"row {i}")
    for start in range(0, n, chunk_rows):
        stop = min(n, start + chunk_rows)
        cols = {c: arrays[c][start:stop] for c in columns}
        g = None if gids is None else gids[start:stop]
        yield Chunk(cols, g, list(groups.names), None, start, stop)


def read_parquet(
    path: str | os.PathLike[str],
    columns: list[str],
    kinds: list[str],
    group: str | None,
    chunk_rows: int,
    log: ReadLog,
    soft: Collection[str] = (),
) -> Iterator[Chunk]:
    """Parquet row groups (``soft``: columns whose missing or unparsed values read NaN, a
    group's missing or blank names id -1, for the row rules to reject)."""
    p = os.fspath(path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{p}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        pf = pq.ParquetFile(p)
    except Exception as e:
        raise ValueError(f"{p}: cannot be read as a Parquet file ({e})") from None
    wanted = list(dict.fromkeys([*columns, *([group] if group else [])]))
    locate_columns(p, pf.schema_arrow.names, wanted)
    kind_of = dict(zip(columns, kinds))
    groups, offset, kept = GroupIndex(null_blank=group in soft), 0, 0
    batches = pf.iter_batches(batch_size=chunk_rows, columns=wanted)
    while True:
        try:
            batch = next(batches, None)
        except pa.ArrowException as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"{p}: cannot be read as a Parquet file ({msg})") from None
        if batch is None:
            break
        n = batch.num_rows
        rows = np.arange(offset, offset + n)
        keep = np.ones(n, dtype=bool)
        cols = {
            c: _parquet_column(batch.column(c), c, c == group, kind_of, rows, keep, log, soft)
            for c in wanted
        }
        num = {}
        for c in columns:
            lenient = c in soft and kind_of[c] != STATED
            num[c], bad = _column_values(cols[c], c, kind_of[c], rows, _where, soft=lenient)
            if bad is not None and lenient:
                if bad.any() and c not in log.unparsed:
                    i = int(np.flatnonzero(bad)[0])
                    log.unparsed[c] = (f"row {int(rows[i])}", _name(cols[c][i]))
            elif bad is not None:
                null = np.fromiter((v is None for v in cols[c]), bool, n)
                log.missing += int((bad & keep & null).sum())  # a null: NULL to an engine
                _exclude(log, c, bad & keep, cols[c], rows, "not a number nor a percent")
                keep &= ~bad
                _count_percents(log, c, cols[c], keep)
        gids = None
        if group is not None:
            gids = _group_ids(cols[group][keep], group, groups, _row_of(rows[keep]))
        if not keep.all():
            num = {c: v[keep] for c, v in num.items()}
        yield Chunk(num, gids, list(groups.names), None, kept, offset + n, rows[keep])
        offset += n
        kept += int(keep.sum())
    if offset == 0:
        raise ValueError(f"{p}: no data rows")


def _count_percents(log: ReadLog, column: str, texts: np.ndarray, keep: np.ndarray) -> None:
    """Add the kept values of a stated-confidence text column written as percents to
    ``log.percent`` (the report's percent note, as the CSV reader and the engines count it)."""
    k = sum(1 for v, ok in zip(texts.tolist(), keep.tolist()) if ok and "%" in _name(v))
    if k:
        log.percent[column] = log.percent.get(column, 0) + k


def _where(i: int) -> str:
    return f"row {i}"


def _parquet_column(
    arr: object,
    column: str,
    is_group: bool,
    kind_of: dict[str, str],
    rows: np.ndarray,
    keep: np.ndarray,
    log: ReadLog,
    soft: Collection[str] = (),
) -> np.ndarray:
    """A batch's column as numpy; a null is an error, but excludes the row of a stated
    confidence (``keep`` is updated), and in a ``soft`` column reads as a blank text (a
    group: ``group_null``; a label or weight: NaN, for the row rules)."""
    null = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None  # type: ignore[attr-defined]
    values = arr.to_numpy(zero_copy_only=False)  # type: ignore[attr-defined]
    if null is None:
        return values
    if column in soft and kind_of.get(column) != STATED:
        import pyarrow as pa

        t = arr.type  # type: ignore[attr-defined]
        if is_group and pa.types.is_integer(t):  # an integer's name is its decimal digits
            values = arr.cast(pa.string()).to_numpy(zero_copy_only=False)  # type: ignore[attr-defined]
        elif not is_group and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t):
                return arr.cast(pa.float64()).to_numpy(zero_copy_only=False)  # type: ignore[attr-defined]
        if values.dtype.kind == "O":  # text: a missing value is a blank one
            return np.where(null, "", values)
    if is_group or kind_of.get(column) != STATED:
        what = "empty group name" if is_group else "missing value"
        raise ValueError(f"{column}: {what} at row {int(rows[np.flatnonzero(null)[0]])}")
    if values.dtype.kind == "O":  # text: a null is unparsed text (preds_null), as to an engine
        return values
    _exclude(log, column, null & keep, values, rows, "missing value")
    keep &= ~null
    return np.where(null, "nan", values) if values.dtype.kind == "O" else values
