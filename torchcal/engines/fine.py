"""The fine histogram in the portable state (docs/design.md section 6f): per (group, fine bin)
sums of the confidence for the global ECCE and the resolution
(:mod:`torchcal.functional.histogram_scores`), stored in the state table as extra rows.

A state that carries it has ``fine_bins`` (``F = 4096``) in its header and one row per
non-empty (group, fine bin) cell with ``slot = -1``: ``bin`` the fine bin, ``n`` the rows,
``sum_y`` sum w y, ``sum_w`` sum w (weighted states; the count otherwise), ``fine_w2`` sum w w,
``fine_y2`` sum (w w) y, ``fine_gap`` sum w (y - c), ``fine_var_w`` sum w (c (1 - c)) and
``fine_var_w2`` sum (w w) (c (1 - c)); the binned columns are null there, and the ``fine_*``
columns are null on the binned rows. A state without them (written before
the fine histogram, or by a producer that does not keep one) loads with ``fine = None``.
Merging adds counts as integers and every float sum by ``math.fsum`` over the parts (the
same bits for any order of the parts), as the binned cells.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from torchcal.functional.histogram_scores import FINE_BINS, MAX_FINE_GROUPS, FineHistogram

#: the slot of the fine rows in the state table
FINE_SLOT = -1
#: FineHistogram field -> its column (``count`` is ``n``, ``mass`` is ``sum_w`` or ``n``)
_COLUMNS = {
    "mass2": "fine_w2",
    "pos": "sum_y",
    "pos2": "fine_y2",
    "gap": "fine_gap",
    "var_w": "fine_var_w",
    "var_w2": "fine_var_w2",
}


def fine_table(table: Any, fine: FineHistogram | None, groups: Sequence[str]) -> Any:
    """``table`` (the binned rows) with the fine rows appended (unchanged when ``fine`` is
    None)."""
    if fine is None:
        return table
    import pyarrow as pa

    count = fine.count.numpy()
    g, b = np.nonzero(count)
    rows = {
        "group": pa.array([groups[int(i)] for i in g], pa.string()),
        "slot": pa.array(np.full(len(g), FINE_SLOT, np.int32)),
        "bin": pa.array(b.astype(np.int32)),
        "n": pa.array(count[g, b].astype(np.int64)),
    }
    for f, c in _COLUMNS.items():
        rows[c] = pa.array(getattr(fine, f).numpy()[g, b], pa.float64())
    if "sum_w" in table.column_names:
        rows["sum_w"] = pa.array(fine.mass.numpy()[g, b], pa.float64())
    for c in _COLUMNS.values():
        if c == "sum_y":
            continue
        table = table.append_column(c, pa.nulls(table.num_rows, pa.float64()))
    cols = {}
    for f in table.schema:
        cols[f.name] = rows[f.name] if f.name in rows else pa.nulls(len(g), f.type)
    extra = pa.table(cols, schema=table.schema.remove_metadata())
    return pa.concat_tables([table.replace_schema_metadata(None), extra])


def split_fine(table: Any) -> tuple[Any, Any]:
    """``(binned rows, fine rows or None)`` of a state table (no fine rows: None)."""
    if "fine_gap" not in table.column_names:
        return table, None
    import pyarrow.compute as pc

    fine = pc.equal(table.column("slot"), FINE_SLOT)
    return table.filter(pc.invert(fine)), table.filter(fine)


def fine_bins_of(d: dict[str, Any], where: str) -> int | None:
    """The header's ``fine_bins`` (None when absent: a state without the fine histogram)."""
    v = d.get("fine_bins")
    if v is None:
        return None
    if type(v) is not int or v != FINE_BINS:
        raise ValueError(f"{where}: header field fine_bins must be {FINE_BINS}, got {v!r}")
    return v


def fine_from_table(
    rows: Any, names: Sequence[str], header: Any, counts: torch.Tensor, where: str = "state"
) -> FineHistogram | None:
    """The :class:`FineHistogram` ``(G, fine_bins)`` of the fine rows of a state table, groups
    in the order of ``names`` (None when the header has no ``fine_bins``); each group's rows
    must add up to its binned rows ``counts``."""
    bins = header.fine_bins
    if not bins:
        return None
    if len(names) > MAX_FINE_GROUPS:  # bounded before allocating (a hostile header)
        raise ValueError(
            f"{where}: a fine histogram of {len(names)} groups (at most {MAX_FINE_GROUPS} keep one)"
        )
    h = FineHistogram.zeros(len(names), bins)
    if rows is None or rows.num_rows == 0:
        if int(counts.sum()):
            raise ValueError(f"{where}: header field fine_bins is set but no fine rows are stored")
        return h
    d = {c: rows.column(c).to_numpy(zero_copy_only=False) for c in rows.column_names}
    pos = {n: i for i, n in enumerate(names)}
    if not set(d["group"].tolist()) <= set(pos):
        raise ValueError(f"{where}: a fine-histogram row names a group without binned rows")
    gi = np.array([pos[n] for n in d["group"].tolist()], np.int64)
    b = np.asarray(d["bin"], np.float64)
    n = np.asarray(d["n"], np.float64)
    if not (np.isfinite(b).all() and (b == np.floor(b)).all() and b.min() >= 0 and b.max() < bins):
        raise ValueError(f"{where}: fine bins must be whole numbers in [0, {bins})")
    if not (np.isfinite(n).all() and (n == np.floor(n)).all() and n.min() >= 1):
        raise ValueError(f"{where}: a fine-histogram cell's n must be a whole number >= 1")
    flat = gi * bins + b.astype(np.int64)
    if len(np.unique(flat)) != len(flat):
        raise ValueError(f"{where}: a (group, fine bin) cell appears twice")

    def dense(v: np.ndarray, dtype: Any) -> torch.Tensor:
        out = np.zeros(len(names) * bins, dtype=dtype)
        out[flat] = v
        return torch.from_numpy(out.reshape(len(names), bins))

    count = dense(n.astype(np.int64), np.int64)
    if not torch.equal(count.sum(1), counts.to(torch.int64)):
        raise ValueError(f"{where}: the fine-histogram rows do not add up to the binned rows")
    weighted = header.weight is not None
    mass = dense(d["sum_w"].astype(np.float64), np.float64) if weighted else count.double()
    missing = [c for c in _COLUMNS.values() if c not in d]
    if missing:
        raise ValueError(f"{where}: the state table lacks the fine-histogram columns {missing}")
    sums = {f: dense(d[c].astype(np.float64), np.float64) for f, c in _COLUMNS.items()}
    if not all(bool(torch.isfinite(t).all()) for t in (mass, *sums.values())):
        raise ValueError(f"{where}: a fine-histogram sum is not finite")
    return FineHistogram(count=count, mass=mass, **sums)


def merge_fine(
    parts: Sequence[FineHistogram | None],
    part_groups: Sequence[Sequence[str]],
    groups: Sequence[str],
) -> FineHistogram | None:
    """The fine histograms of the parts on the union ``groups``: None when a part has none or
    the union has more than :data:`MAX_FINE_GROUPS` groups; counts added as integers, the
    float sums by ``math.fsum`` per cell over the parts (cells non-zero in one part only are
    copied)."""
    if not parts or any(p is None for p in parts) or len(groups) > MAX_FINE_GROUPS:
        return None
    bins = {p.count.shape[1] for p in parts if p is not None}
    if len(bins) != 1:
        return None
    F = bins.pop()
    where = {g: i for i, g in enumerate(groups)}
    out = []
    for k in range(len(FineHistogram._fields)):
        stack = np.zeros((len(parts), len(groups), F), parts[0][k].numpy().dtype)  # type: ignore[index]
        for j, (p, names) in enumerate(zip(parts, part_groups, strict=True)):
            stack[j, [where[n] for n in names]] = p[k].numpy()  # type: ignore[index]
        if stack.dtype == np.int64:
            out.append(torch.from_numpy(stack.sum(0)))
            continue
        total = stack.sum(0)
        many = (stack != 0).sum(0) > 1
        for gi, bi in zip(*np.nonzero(many), strict=True):
            total[gi, bi] = math.fsum(stack[:, gi, bi].tolist())
        out.append(torch.from_numpy(total))
    return FineHistogram(*out)
