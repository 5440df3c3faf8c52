"""One float64 pass over the chunks: the per-group NLL sums and their derivatives.

The formula (per-sample NLL and its derivatives in ``beta = 1 / T``) is
:func:`torchcal.functional.recalibration.temperature_terms`; :func:`temperature_pass` runs it
over chunks of any size (O(chunk) memory), on threads if asked, adds the per-chunk sums in a
fixed order (bit-identical for any number of threads) and all-reduces them under
``torch.distributed`` (docs/design.md section 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional.recalibration import temperature_terms
from torchcal.functional.temperature.chunks import Chunk
from torchcal.functional.temperature.distributed import all_reduce_
from torchcal.functional.temperature.validation import validate_labels

# Columns of the per-group statistics returned by ``temperature_pass``.
# ``misranked`` (rows whose target is not a row maximum; binary: a score on the wrong side of
# 0) does not depend on T and is only filled by identity passes: when it is 0 the set is
# perfectly separated (the NLL decreases all the way to T -> 0).


class TemperatureSums(NamedTuple):
    """The sums of one pass, per group (each ``(G,)`` float64): the rows (``rows``), the NLL
    and its first two derivatives in ``u = log beta`` (``loss``, ``dloss``, ``d2loss``), the
    NLL at ``T = 1`` (``loss_identity``) and the misranked rows (``misranked``).

    A pass returns them stacked as one ``(G, 6)`` tensor (one all-reduce under DDP);
    :meth:`of` names its columns (views: an in-place update of a field updates the tensor).

    Example:
        >>> import torch
        >>> stats = torch.tensor([[4.0, 2.5, -0.5, 1.0, 2.8, 1.0]], dtype=torch.float64)
        >>> sums = TemperatureSums.of(stats)
        >>> float(sums.loss[0] / sums.rows[0])
        0.625
    """

    rows: Tensor
    loss: Tensor
    dloss: Tensor
    d2loss: Tensor
    loss_identity: Tensor
    misranked: Tensor

    @classmethod
    def of(cls, stats: Tensor) -> TemperatureSums:
        """The named columns of a pass's ``(G, 6)`` sums."""
        return cls(*stats.unbind(1))


STAT_FIELDS = TemperatureSums._fields


# A threaded pass hands the threads WINDOW chunks at a time: bounded memory for the per-row
# group terms, and few live small tensors (thousands of them, interleaved with the freed chunk
# buffers, fragment the heap: +0.4x the logits of peak RSS at 100k x 1000). The calling thread
# adds the per-chunk sums in chunk order, BLOCK at a time.
WINDOW = 64
BLOCK = 256


def _chunk_sums(
    chunk: Chunk,
    beta0: float,
    beta_g: Tensor,
    *,
    binary: bool,
    num_classes: int | None,
    identity: bool,
    check_labels: bool,
    state: dict,
) -> tuple[int, Tensor, Tensor | None]:
    """One chunk's contribution: ``(rows, column sums (k,), None)`` without groups, else
    ``(rows, per-row columns (n, 1 + k), group ids)`` to be index-added in chunk order.

    A chunk stays below ATen's parallel grain (see ``_CHUNK_ELEMENTS``), so its sums do not
    depend on the thread count. ``state`` may be shared by threads: it only records that
    masks were seen, which changes when (not whether) masks are floored, not the values.
    """
    if check_labels:
        validate_labels(chunk, binary, num_classes)
    n = chunk.target.shape[0]
    if chunk.groups is None:
        terms = temperature_terms(
            chunk.logits, chunk.target, beta0, binary=binary, identity=identity, state=state
        )
        return n, torch.stack(terms, 1).sum(0), None
    beta = beta_g.to(chunk.logits.device)[chunk.groups]
    terms = temperature_terms(
        chunk.logits, chunk.target, beta, binary=binary, identity=identity, state=state
    )
    ones = torch.ones(n, dtype=torch.float64, device=chunk.logits.device)
    return n, torch.stack([ones, *terms], 1), chunk.groups


Sums = tuple[int, Tensor, Tensor | None]


def _in_order(
    chunks: list[Chunk], compute: Callable[[Chunk], Sums], pool: ThreadPoolExecutor, workers: int
) -> Iterator[Sums]:
    """The chunks' sums computed on ``workers`` threads, yielded in chunk order: one task per
    worker and window, worker k taking every workers-th chunk of the window."""

    def share(part: list[Chunk]) -> list:
        return [compute(c) for c in part]

    for s in range(0, len(chunks), WINDOW):
        win = chunks[s : s + WINDOW]
        futures = [pool.submit(share, win[k::workers]) for k in range(workers)]
        shares = [f.result() for f in futures]
        for i in range(len(win)):
            yield shares[i % workers][i // workers]


def _accumulate(parts: Iterable[Sums], num_groups: int) -> Tensor | None:
    """Add the per-chunk sums in chunk order (ungrouped: BLOCK chunks at a time)."""
    acc: Tensor | None = None
    count = 0
    block: list[Tensor] = []  # ungrouped column sums, added BLOCK chunks at a time
    for n, sums, groups in parts:
        if acc is None:
            acc = torch.zeros(num_groups, len(STAT_FIELDS), dtype=torch.float64, device=sums.device)
        if groups is None:
            count += n
            block.append(sums)
            if len(block) == BLOCK:
                acc[0, 1 : 1 + sums.shape[0]] += torch.stack(block).sum(0)
                block.clear()
        else:
            acc[:, : sums.shape[1]].index_add_(0, groups, sums)
    if acc is not None:
        if block:
            acc[0, 1 : 1 + block[0].shape[0]] += torch.stack(block).sum(0)
        TemperatureSums.of(acc).rows[0] += count
    return acc


def temperature_pass(
    chunks: Iterable[Chunk],
    u: Tensor,
    *,
    binary: bool,
    num_classes: int | None = None,
    num_groups: int = 1,
    identity: bool = False,
    reduce: bool = False,
    workers: int = 1,
    check_labels: bool = True,
) -> Tensor:
    """One pass: per-group sums ``(G, 6)`` of :data:`STAT_FIELDS` at ``u = log beta``.

    ``u`` holds one value per group (``(G,)``, float64). Derivatives are w.r.t. ``beta``.
    ``reduce=True`` all-reduces the sums over the process group. ``workers > 1`` (a list of
    chunks only) computes the chunks' sums on that many threads (torch releases the GIL inside
    its kernels); the sums are always added in chunk order, in fixed blocks, so the result is
    bit-identical for any number of workers or torch threads.
    ``check_labels=False`` skips the per-chunk label check (in-memory data checked once).
    """
    beta_g = torch.exp(u.to(torch.float64))
    beta0 = float(beta_g[0])  # a Python float: no tensor-scalar dispatch per chunk
    state: dict = {}

    def compute(chunk: Chunk) -> Sums:
        return _chunk_sums(
            chunk,
            beta0,
            beta_g,
            binary=binary,
            num_classes=num_classes,
            identity=identity,
            check_labels=check_labels,
            state=state,
        )

    if workers > 1 and isinstance(chunks, list) and len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            acc = _accumulate(_in_order(chunks, compute, pool, workers), num_groups)
    else:
        acc = _accumulate(map(compute, chunks), num_groups)
    stats = torch.zeros(num_groups, len(STAT_FIELDS), dtype=torch.float64)
    if acc is not None:
        stats += acc.cpu()
    if reduce:
        all_reduce_(stats)
    return stats
