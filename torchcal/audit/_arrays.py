"""(internal) The audit's NPZ, ``.pt`` and Parquet readers (see :mod:`torchcal.audit.io`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from torchcal.audit.io import Chunk, GroupIndex, check_names, first_appearance, locate_columns

__all__ = ["read_arrays", "read_parquet"]


def _group_ids(
    values: np.ndarray, column: str, groups: GroupIndex, where: Callable[[int], str]
) -> np.ndarray:
    """Ids of a column of group values (strings, bytes or integers)."""
    if values.dtype.kind not in "USOiub":
        raise ValueError(
            f"{column}: expected group names (strings or integers), got {values.dtype}"
        )
    if values.dtype.kind == "O":
        bad = np.array([not isinstance(v, (str, bytes)) for v in values], dtype=bool)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{column}: empty group name at {where(i)} (got {values[i]!r})")
    uniques, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    first, inverse = first_appearance(first, inverse.reshape(-1))
    names = [_name(values[i]) for i in first]
    check_names(column, names, inverse, where)
    return groups.ids_of(names, inverse)


def _name(v: object) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _load_mapping(path: str | os.PathLike[str], kind: str) -> dict[str, object]:
    p = os.fspath(path)
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


def _as_array(value: object) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _numeric(path: str | os.PathLike[str], data: dict[str, object], column: str) -> np.ndarray:
    if column not in data:
        cols = ", ".join(data)
        raise ValueError(f"{column}: no such column in {os.fspath(path)} (columns: {cols})")
    a = _as_array(data[column])
    if a.dtype.kind not in "biuf" or a.ndim not in (1, 2):
        raise ValueError(
            f"{column}: expected a 1-D or 2-D array of numbers, got {a.dtype} of shape {a.shape}"
        )
    return a.astype(np.float64)


def read_arrays(
    path: str | os.PathLike[str], kind: str, columns: list[str], group: str | None, chunk_rows: int
) -> Iterator[Chunk]:
    data = _load_mapping(path, kind)
    arrays = {c: _numeric(path, data, c) for c in columns}
    groups, gids = GroupIndex(), None
    if group is not None:
        if group not in data:
            raise ValueError(
                f"{group}: no such column in {os.fspath(path)} (columns: {', '.join(data)})"
            )
        values = _as_array(data[group])
        arrays[group] = values
        gids = _group_ids(values.reshape(-1), group, groups, lambda i: f"row {i}")
    n = len(arrays[columns[0]])
    for c, a in arrays.items():
        if len(a) != n:
            raise ValueError(f"{c}: {len(a)} rows, but {columns[0]} has {n}")
    if n == 0:
        raise ValueError(f"{os.fspath(path)}: no data rows")
    for start in range(0, n, chunk_rows):
        stop = min(n, start + chunk_rows)
        cols = {c: arrays[c][start:stop] for c in columns}
        g = None if gids is None else gids[start:stop]
        yield Chunk(cols, g, list(groups.names), None, start, stop)


def read_parquet(
    path: str | os.PathLike[str], columns: list[str], group: str | None, chunk_rows: int
) -> Iterator[Chunk]:
    p = os.fspath(path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{p}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        pf = pq.ParquetFile(p)
    except Exception as e:
        raise ValueError(f"{p}: cannot be read as a Parquet file ({e})") from None
    names = pf.schema_arrow.names
    wanted = list(dict.fromkeys([*columns, *([group] if group else [])]))
    locate_columns(path, names, wanted)
    groups, offset = GroupIndex(), 0
    for batch in pf.iter_batches(batch_size=chunk_rows, columns=wanted):
        cols: dict[str, np.ndarray] = {}
        for c in wanted:
            arr = batch.column(c)
            if arr.null_count:
                i = offset + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                what = "empty group name" if c == group else "missing value"
                raise ValueError(f"{c}: {what} at row {i}")
            cols[c] = arr.to_numpy(zero_copy_only=False)
        gids = None
        if group is not None:
            gids = _group_ids(cols.pop(group), group, groups, lambda i, o=offset: f"row {o + i}")
        num = {c: _parquet_numeric(c, cols[c]) for c in columns}
        yield Chunk(num, gids, list(groups.names), None, offset, offset + batch.num_rows)
        offset += batch.num_rows
    if offset == 0:
        raise ValueError(f"{p}: no data rows")


def _parquet_numeric(column: str, a: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{column}: expected numbers, got {a.dtype} values")
    return a.astype(np.float64)
