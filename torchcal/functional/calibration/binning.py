"""Binning: the one bin rule and the float64 sufficient statistics (:class:`BinnedStats`).

``c`` goes to bin ``min(floor(c * B), B - 1)`` computed in float64 after upcasting (bins
``[k/B, (k+1)/B)``, the last closed). Per bin: the count (int64) and the float64 sums of
``c``, ``y``, ``c**2`` and ``c*y``; two streams merge by adding them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_int, sync_free
from torchcal.functional.calibration.readings import PreparedInputs, prepare_checked

__all__ = [
    "BinnedStats",
    "binned_statistics",
]


@dataclass(frozen=True)
class BinnedStats:
    """Per-bin sufficient statistics; every field has shape ``(*lead, n_bins)``.

    ``lead`` is ``(G, K)`` as produced by :func:`binned_statistics`: ``G`` groups (1 without
    ``groups``) and ``K`` slots (1 for ``binary``/``confidence``, the classes for
    ``top_label`` and ``classwise``). Merging two streams is ``a + b``; ``stats.pooled()``
    sums the groups away.

    Attributes:
        count: samples per bin (int64).
        conf: sum of confidences (float64).
        acc: sum of outcomes, 0/1 (float64).
        conf2: sum of squared confidences (float64).
        conf_acc: sum of confidence x outcome (float64).
        weight: ``None`` (unweighted), or the sum of the sample weights per bin (float64);
            then ``conf``, ``acc``, ``conf2`` and ``conf_acc`` are weighted sums
            (``sum w c``, ...) and every estimator reads ``weight`` where it read ``count``
            (:meth:`mass`): frequency weights, so integer weights give the numbers of the
            dataset with each row repeated ``w`` times (docs/design.md section 6f).
            ``count`` stays the number of rows.
        weight2: ``None``, or the sum of the squared weights per bin (float64, with
            ``weight``): the verdict reads importance weights by their effective sample size
            ``weight ** 2 / weight2`` (Kish; docs/design.md section 6f).

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> a = binned_statistics(torch.tensor([0.1, 0.9]), torch.tensor([0, 1]),
        ...                       n_bins=2, reading="binary", input="probs")
        >>> (a + a).count.tolist()
        [[[2, 2]]]
    """

    count: Tensor
    conf: Tensor
    acc: Tensor
    conf2: Tensor
    conf_acc: Tensor
    # --- sample weights (issue 20; docs/design.md section 6f) ---
    weight: Tensor | None = None
    weight2: Tensor | None = None

    def mass(self) -> Tensor:
        """float64 ``count`` (unweighted) or ``weight`` (weighted): the ``n`` of every
        estimator."""
        return self.count.to(torch.float64) if self.weight is None else self.weight

    # --- end sample weights ---

    @classmethod
    def zeros(cls, *shape: int, device: torch.device | str | None = None) -> BinnedStats:
        """All-zero statistics of shape ``shape`` (last entry: number of bins)."""
        z = torch.zeros(shape, dtype=torch.float64, device=device)
        return cls(
            torch.zeros(shape, dtype=torch.int64, device=device), z, z.clone(), z.clone(), z.clone()
        )

    def map(self, fn: Any) -> BinnedStats:
        vals = (getattr(self, f.name) for f in fields(self))
        return BinnedStats(*(None if v is None else fn(v) for v in vals))

    def __add__(self, other: BinnedStats) -> BinnedStats:
        if not isinstance(other, BinnedStats):
            return NotImplemented
        if other.count.shape != self.count.shape:
            raise ValueError(
                f"other: expected statistics of shape {tuple(self.count.shape)}, "
                f"got {tuple(other.count.shape)}"
            )
        if (self.weight is None) != (other.weight is None) or (self.weight2 is None) != (
            other.weight2 is None
        ):
            raise ValueError(
                "other: cannot add weighted and unweighted statistics (one has weight sums, "
                "the other not)"
            )
        pairs = ((getattr(self, f.name), getattr(other, f.name)) for f in fields(self))
        return BinnedStats(*(None if a is None else a + b for a, b in pairs))

    @property
    def n_bins(self) -> int:
        """Number of bins (last dimension)."""
        return int(self.count.shape[-1])

    def pooled(self) -> BinnedStats:
        """Sum over the group axis: ``(G, K, B) -> (K, B)``."""
        return self.map(lambda t: t.sum(0))

    def group(self, g: int) -> BinnedStats:
        """The statistics of group ``g``: ``(G, K, B) -> (K, B)``."""
        return self.map(lambda t: t[g])

    def coarsen(self, n_bins: int) -> BinnedStats:
        """Merge adjacent bins: ``B_fine -> n_bins`` (``n_bins`` must divide ``B_fine``).

        Equal to binning with ``n_bins`` directly except for confidences within float64
        rounding of a coarse edge (``floor(c * B)`` is not always ``floor(c * mB) // m``).
        """
        if self.n_bins % n_bins:
            raise ValueError(f"n_bins: expected a divisor of {self.n_bins}, got {n_bins}")
        m = self.n_bins // n_bins
        return self.map(lambda t: t.reshape(*t.shape[:-1], n_bins, m).sum(-1))


def bin_index(conf: Tensor, n_bins: int) -> Tensor:
    """Equal-width bin of each confidence: ``min(floor(c * n_bins), n_bins - 1)`` in float64.

    Inputs of any floating dtype are upcast to float64 first, so ``k / B`` rounded to the
    input dtype lands in the bin its float64 value times ``B`` says; 1.0 goes to the last bin
    and 0.0 to the first. Values outside [0, 1] (possible only with validation off) are
    clamped into the first/last bin.

    Example:
        >>> import torch
        >>> bin_index(torch.tensor([0.0, 0.1, 0.5, 0.99, 1.0]), 10).tolist()
        [0, 1, 5, 9, 9]
    """
    return bin_ids(conf, check_int("n_bins", n_bins, minimum=1))


#: values per block of :func:`bin_ids` on the CPU (its float64 temporary stays in cache)
_BIN_BLOCK = 1 << 16


def bin_ids(conf: Tensor, n_bins: int) -> Tensor:
    """The binning rule (the one place it is written): ``min(floor(c * B), B - 1)`` in float64.

    ``c * B`` is truncated by the int64 cast and clamped to ``[0, B - 1]``: truncation is the
    floor for ``c >= 0``, and the clamp sends anything below 0 (possible only with validation
    off) to bin 0 either way. On the CPU, large inputs go through one reused float64 block
    buffer (a loop over blocks, not over samples): the same operations per value, without
    full-size float64 temporaries (about 2x faster on 1M float32 values)."""
    if conf.device.type != "cpu" or conf.numel() <= _BIN_BLOCK:
        return (conf.to(torch.float64) * n_bins).to(torch.int64).clamp_(0, n_bins - 1)
    flat = conf.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.int64)
    buf = torch.empty(_BIN_BLOCK, dtype=torch.float64)
    for start in range(0, flat.numel(), _BIN_BLOCK):
        x = flat[start : start + _BIN_BLOCK]
        b = buf[: x.numel()].copy_(x).mul_(n_bins)
        out[start : start + x.numel()].copy_(b).clamp_(0, n_bins - 1)
    return out.view(conf.shape)


def bin_counts(conf: Tensor, n_bins: int) -> Tensor:
    """int64 ``(n_bins,)`` counts of :func:`bin_ids` (a histogram by the one bin rule).

    On the CPU with ``n_bins <= 256``: per reused float64 block, the same ``floor(c * B)``
    clamped to ``[0, B - 1]`` (NaN, possible only with validation off, to bin 0), stored as
    ``uint8`` ids, whose ``bincount`` is about twice as fast as on int64 ids.

    Example:
        >>> import torch
        >>> bin_counts(torch.tensor([0.0, 0.1, 0.5, 0.99, 1.0]), 10).tolist()
        [1, 1, 0, 0, 0, 1, 0, 0, 0, 2]
    """
    if sync_free(conf):  # bincount would read its output size on the host: a scatter
        ids = bin_ids(conf, n_bins).reshape(-1)
        counts = torch.zeros(n_bins, dtype=torch.int64, device=conf.device)
        return counts.index_add_(0, ids, torch.ones_like(ids))
    if conf.device.type != "cpu" or n_bins > 256:
        return torch.bincount(bin_ids(conf, n_bins).reshape(-1), minlength=n_bins)
    flat = conf.reshape(-1)
    counts = torch.zeros(n_bins, dtype=torch.int64)
    m = min(flat.numel(), _BIN_BLOCK)
    buf = torch.empty(m, dtype=torch.float64)
    ids = torch.empty(m, dtype=torch.uint8)
    for start in range(0, flat.numel(), _BIN_BLOCK):
        x = flat[start : start + _BIN_BLOCK]
        b = buf[: x.numel()].copy_(x).mul_(n_bins).floor_().clamp_(0, n_bins - 1).nan_to_num_(0.0)
        counts.add_(torch.bincount(ids[: x.numel()].copy_(b), minlength=n_bins))
    return counts


#: elements per block of the float64 per-bin sums (see :func:`_blocked_bincount`); batches
#: of at most this many elements are binned in one sequential ``bincount`` pass
SUM_BLOCK = 1 << 14
_BLOCK = SUM_BLOCK


def _blocked_bincount(idx: Tensor, size: int) -> Any:
    """``weights -> per-cell float64 sums`` with bounded rounding error.

    ``torch.bincount`` adds sequentially, so one cell collecting M values carries a relative
    error up to ~M * 2^-53 (3e-10 for 20M values of 0.95). Above ``_BLOCK`` elements the
    input is cut into blocks of ``_BLOCK`` that are binned into separate rows, and the rows
    are summed by ``torch.sum`` (blocked/cascade): relative error ~1e-13 at any M.
    """
    M = idx.numel()
    if M <= _BLOCK:
        return lambda w: torch.bincount(idx, weights=w, minlength=size)
    nb = M // _BLOCK
    head = nb * _BLOCK
    offsets = torch.arange(nb, device=idx.device).mul_(size).unsqueeze(1)
    idx_h = (idx[:head].view(nb, _BLOCK) + offsets).view(-1)
    idx_t = idx[head:]

    def wsum(w: Tensor) -> Tensor:
        h = torch.bincount(idx_h, weights=w[:head], minlength=nb * size).view(nb, size).sum(0)
        return h + torch.bincount(idx_t, weights=w[head:], minlength=size)

    return wsum


def accumulate(prep: PreparedInputs, n_bins: int) -> BinnedStats:
    """Bin prepared inputs into :class:`BinnedStats` of shape ``(G, K, n_bins)``.

    On the CPU one ``torch.bincount`` per statistic over the flat cell index ``lead * B +
    bin`` (blocked above 16384 elements to bound the float64 rounding error); on a device
    (and under ``torch.compile``) one ``index_add_`` of the five per-element terms
    (``bincount`` would read its output size on the host: a synchronisation). No loop over
    bins or samples.

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.readings import prepare_inputs
        >>> prep = prepare_inputs(torch.tensor([0.1, 0.6, 0.7]), torch.tensor([0, 1, 0]),
        ...                       reading="binary", input="probs")
        >>> s = accumulate(prep, 2)
        >>> s.count.tolist(), [round(v, 2) for v in s.conf.flatten().tolist()]
        ([[[1, 2]]], [0.1, 1.3])
    """
    c = prep.conf.to(torch.float64)
    idx = bin_ids(c, n_bins)
    if prep.lead is not None:
        idx.add_(prep.lead, alpha=n_bins)
    shape = (prep.num_groups, prep.num_slots, n_bins)
    return _cell_sums(idx, c, prep.outcome.to(torch.float64), shape, blocked=True)


def _cell_sums(
    idx: Tensor, c: Tensor, o: Tensor, shape: tuple[int, ...], blocked: bool
) -> BinnedStats:
    """:class:`BinnedStats` of ``shape`` from the flat cell ``idx`` of each confidence ``c``
    and outcome ``o`` (float64): one scatter on the sync-free path (bincount would read its
    output size on the host), else ``bincount`` s, the float sums by
    :func:`_blocked_bincount` when ``blocked``."""
    size = math.prod(shape)
    if sync_free(c):
        w = torch.stack([torch.ones_like(c), c, o, c * c, c * o], dim=1)
        sums = torch.zeros(size, 5, dtype=torch.float64, device=c.device).index_add_(0, idx, w)
        count = sums[:, 0].to(torch.int64)  # exact: integers below 2^53
        parts = sums[:, 1:].unbind(1)
    else:
        count = torch.bincount(idx, minlength=size)
        if count.numel() != size:  # only with validation off and out-of-range groups
            raise ValueError(f"groups: expected group ids in [0, {shape[-3] - 1}]")
        if blocked:
            wsum = _blocked_bincount(idx, size)
        else:
            wsum = lambda w: torch.bincount(idx, weights=w, minlength=size)  # noqa: E731
        parts = tuple(wsum(v) for v in (c, o, c * c, c * o))
    return BinnedStats(count.view(shape), *(p.reshape(shape) for p in parts))


def accumulate_batches(preps: Sequence[PreparedInputs], n_bins: int) -> BinnedStats:
    """:func:`accumulate` of several batches in one pass: statistics ``(nb, G, K, n_bins)``
    whose slice ``i`` equals ``accumulate(preps[i], n_bins)`` bit for bit when every batch
    holds at most :data:`SUM_BLOCK` elements (each (batch, cell) is its own ``bincount``
    cell, filled in element order, as the batch alone would fill it). The batches share
    ``num_groups`` and ``num_slots``; a streaming metric adds the slices to its states in
    batch order (a sequential ``cumsum``), which is the eager per-batch sum exactly.

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.readings import prepare_inputs
        >>> a = prepare_inputs(torch.tensor([0.1, 0.6]), torch.tensor([0, 1]),
        ...                    reading="binary", input="probs")
        >>> b = prepare_inputs(torch.tensor([0.7]), torch.tensor([0]),
        ...                    reading="binary", input="probs")
        >>> accumulate_batches([a, b], 2).count.tolist()
        [[[[1, 1]]], [[[0, 1]]]]
    """
    first = preps[0]
    return bin_batches(
        [p.conf for p in preps],
        [p.outcome for p in preps],
        [p.lead for p in preps],
        first.num_groups,
        first.num_slots,
        n_bins,
    )


def bin_batches(
    confs: Sequence[Tensor],
    outcomes: Sequence[Tensor],
    leads: Sequence[Tensor | None],
    num_groups: int,
    num_slots: int,
    n_bins: int,
) -> BinnedStats:
    """:func:`accumulate_batches` of the batches' flat ``(conf, outcome, lead)`` tensors (the
    fields of :class:`PreparedInputs`; a ``None`` lead is slot 0 of group 0): statistics
    ``(len(confs), G, K, n_bins)``, slice ``i`` equal to ``accumulate`` of batch ``i`` bit
    for bit when each batch holds at most :data:`SUM_BLOCK` elements.

    Example:
        >>> import torch
        >>> s = bin_batches([torch.tensor([0.1, 0.6]), torch.tensor([0.7])],
        ...                 [torch.tensor([0.0, 1.0]), torch.tensor([0.0])], [None, None], 1, 1, 2)
        >>> s.count.tolist(), s.acc.tolist()
        ([[[[1, 1]]], [[[0, 1]]]], [[[[0.0, 1.0]]], [[[0.0, 0.0]]]])
    """
    G, K, nb = num_groups, num_slots, len(confs)
    size = G * K * n_bins
    c = torch.cat(list(confs)).to(torch.float64)
    device = c.device
    idx = bin_ids(c, n_bins)
    if any(v is not None for v in leads):
        lead = torch.cat(
            [
                torch.zeros(cf.numel(), dtype=torch.int64, device=device) if v is None else v
                for cf, v in zip(confs, leads)
            ]
        )
        idx.add_(lead, alpha=n_bins)
    lengths = [cf.numel() for cf in confs]
    if lengths[0] and lengths.count(lengths[0]) == nb:  # equal batches: one broadcast add
        idx.view(nb, -1).add_(torch.arange(0, nb * size, size, device=device).unsqueeze(1))
    elif sync_free(c):  # offsets without a host-to-device copy
        offsets = torch.cat(
            [
                torch.full((n,), i * size, dtype=torch.int64, device=device)
                for i, n in enumerate(lengths)
            ]
        )
        idx.add_(offsets)
    else:
        offsets = torch.repeat_interleave(torch.arange(nb) * size, torch.tensor(lengths))
        idx.add_(offsets)
    o = torch.cat(list(outcomes)).to(torch.float64)
    return _cell_sums(idx, c, o, (nb, G, K, n_bins), blocked=False)


def binned_statistics(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    reading: str = "confidence",
    input: str = "logits",
    num_classes: int | None = None,
    groups: Tensor | None = None,
    num_groups: int | None = None,
    ignore_index: int | None = None,
) -> BinnedStats:
    """Binned sufficient statistics of shape ``(G, K, n_bins)`` (see :class:`BinnedStats`).

    Example:
        >>> import torch
        >>> s = binned_statistics(torch.tensor([0.05, 0.5, 1.0]), torch.tensor([0, 1, 1]),
        ...                       n_bins=2, reading="binary", input="probs")
        >>> s.count.tolist(), s.acc.tolist()
        ([[[1, 2]]], [[[0.0, 2.0]]])
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    prep = prepare_checked(
        preds,
        target,
        reading=reading,
        input=input,
        num_classes=num_classes,
        groups=groups,
        num_groups=num_groups,
        ignore_index=ignore_index,
    )
    return accumulate(prep, n_bins)


def require_nonempty(stats: BinnedStats) -> None:
    if int(stats.count.sum()) == 0:
        raise ValueError(
            "stats: no samples were accumulated (empty input, or compute() before any update())"
        )


def require_single_slot(stats: BinnedStats, what: str) -> BinnedStats:
    if stats.count.dim() == 2:
        if stats.count.shape[0] != 1:
            raise ValueError(
                f"reading: {what} is defined for reading='binary' or 'confidence' "
                f"(one slot), got statistics with {stats.count.shape[0]} slots"
            )
        stats = stats.map(lambda t: t[0])
    if stats.count.dim() != 1:
        raise ValueError(
            f"stats: expected (B,) or (1, B) statistics, got {tuple(stats.count.shape)}"
        )
    return stats
