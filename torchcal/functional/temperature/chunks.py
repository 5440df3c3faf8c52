"""The data of a temperature fit as chunks: :class:`Chunk`, sized to ATen's grain.

:func:`tensor_chunks` slices in-memory data (views, no copies) into chunks of
:func:`chunk_rows` rows; :func:`default_workers` is the thread count of an in-memory pass
(docs/design.md section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Chunks stay below ATen's parallel grain sizes (32768 elements for element-wise ops, 2048
# for the MKL-VML exp/log): each op then runs single-threaded on a cache-resident chunk, with
# no OpenMP barrier per op (which costs milliseconds on an oversubscribed machine).
_CHUNK_ELEMENTS = (1 << 15) - 1
_MAX_ROWS = 2047


def chunk_rows(num_columns: int, device: torch.device | None = None) -> int:
    """Rows per chunk: on CPU below 32768 elements and 2048 rows (see ``_CHUNK_ELEMENTS``);
    on accelerators about ``2**24`` elements (few kernel launches, 128 MB of float64)."""
    if device is not None and device.type != "cpu":
        return max(1, (1 << 24) // max(1, num_columns))
    return max(1, min(_MAX_ROWS, _CHUNK_ELEMENTS // max(1, num_columns)))


@dataclass
class Chunk:
    """One slice of the data: logits, target, optional group ids, and its first row index."""

    logits: Tensor
    target: Tensor
    groups: Tensor | None = None
    offset: int = 0


def tensor_chunks(
    logits: Tensor, target: Tensor, groups: Tensor | None = None, rows: int | None = None
) -> list[Chunk]:
    """Row slices (views, no copies) of in-memory data as :class:`Chunk` s."""
    n = target.shape[0]
    if rows is None:
        rows = chunk_rows(logits.shape[1] if logits.dim() == 2 else 1, logits.device)
    return [
        Chunk(
            logits[s : s + rows],
            target[s : s + rows],
            None if groups is None else groups[s : s + rows],
            s,
        )
        for s in range(0, n, rows)
    ]


def default_workers(logits: Tensor) -> int:
    """Threads for an in-memory pass: torch's intra-op thread count on CPU, else 1."""
    if logits.device.type != "cpu" or (logits.dim() == 2 and logits.shape[1] > _CHUNK_ELEMENTS):
        return 1
    return max(1, torch.get_num_threads())
