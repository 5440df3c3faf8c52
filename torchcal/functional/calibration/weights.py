"""Sample weights in the binned core: :func:`accumulate_weighted` (docs/design.md section 6f).

The estimates read a row of weight ``w`` as ``w`` repetitions of it, so for integer weights
every estimator gives the numbers of the repeated dataset (to float64 rounding). The statistics
keep ``count`` as the number of rows and add ``weight`` (the sum of ``w`` per bin) and
``weight2`` (the sum of ``w * w``); ``conf``, ``acc``, ``conf2`` and ``conf_acc`` become
``sum w c``, ``sum w y``, ``sum w (c c)`` and ``sum w (c y)`` (that order of operations, which
the engines' SQL repeats). Estimators read :meth:`BinnedStats.mass` (the weight total) where
they read the count; the verdict's variances read the effective sample size ``weight ** 2 /
weight2`` (importance weights, the default) or the weight total (frequency weights).

A weight is ``0`` or lies in ``[WEIGHT_MIN, WEIGHT_MAX]``: outside it ``w * w`` (and the
sums of ``w * c * c``) would underflow or overflow float64, and every verdict is scale-free
(rescale such weights).
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchcal.functional.calibration.binning import BinnedStats, bin_ids
from torchcal.functional.calibration.readings import PreparedInputs

#: the smallest positive and the largest weight read (``w * w`` stays a normal float64)
WEIGHT_MIN, WEIGHT_MAX = 1e-100, 1e100

#: rows per block of the blocked float64 sums (a cell's rounding error stays ~1e-13)
BLOCK = 1 << 14


def check_weight(weight: Tensor, n: int) -> Tensor:
    """``weight`` as float64 ``(n,)``; ``ValueError`` naming it unless every value is ``0`` or
    in ``[WEIGHT_MIN, WEIGHT_MAX]``.

    Example:
        >>> check_weight(torch.tensor([1, 2]), 2).tolist()
        [1.0, 2.0]
    """
    if not isinstance(weight, Tensor) or weight.shape != (n,):
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight: expected a tensor of shape ({n},), got {got}")
    w = weight.to(torch.float64)
    bad = ~(torch.isfinite(w) & (w >= 0))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"weight: expected finite values >= 0, got {float(w[i])!r} at {i}")
    bad = (w != 0) & ((w < WEIGHT_MIN) | (w > WEIGHT_MAX))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"weight: expected 0 or a value in [{WEIGHT_MIN:g}, {WEIGHT_MAX:g}], got "
            f"{float(w[i])!r} at {i} (w * w would under- or overflow float64; the verdict is "
            f"scale-free: rescale the weights)"
        )
    return w


def cell_sums(idx: Tensor, size: int, values: Tensor) -> Tensor:
    """Per-cell float64 sums, blocked: each block of ``BLOCK`` rows is binned on its own and
    the block rows are added by ``torch.sum`` (bounded rounding error at any size)."""
    M = idx.numel()
    nb = M // BLOCK
    if nb < 2:
        return torch.bincount(idx, weights=values, minlength=size)
    head = nb * BLOCK
    offsets = torch.arange(nb, device=idx.device).mul_(size).unsqueeze(1)
    flat = (idx[:head].view(nb, BLOCK) + offsets).view(-1)
    h = torch.bincount(flat, weights=values[:head], minlength=nb * size).view(nb, size).sum(0)
    return h + torch.bincount(idx[head:], weights=values[head:], minlength=size)


def accumulate_weighted(prep: PreparedInputs, n_bins: int, weight: Tensor) -> BinnedStats:
    """Weighted :class:`BinnedStats` ``(G, K, n_bins)`` of prepared inputs (one weight per
    element of ``prep.conf``, i.e. per row for the binary and confidence readings).

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.readings import prepare_inputs
        >>> prep = prepare_inputs(torch.tensor([0.1, 0.6]), torch.tensor([0, 1]),
        ...                       reading="binary", input="probs")
        >>> s = accumulate_weighted(prep, 2, torch.tensor([3.0, 0.5]))
        >>> s.count.tolist(), s.weight.tolist(), s.weight2.tolist(), s.acc.tolist()
        ([[[1, 1]]], [[[3.0, 0.5]]], [[[9.0, 0.25]]], [[[0.0, 0.5]]])
    """
    c = prep.conf.to(torch.float64).reshape(-1)
    w = check_weight(weight.reshape(-1), c.numel())
    idx = bin_ids(c, n_bins)
    if prep.lead is not None:
        idx = idx + prep.lead.reshape(-1) * n_bins
    G, K = prep.num_groups, prep.num_slots
    size = G * K * n_bins
    o = prep.outcome.to(torch.float64).reshape(-1)
    shape = (G, K, n_bins)
    count = torch.bincount(idx, minlength=size)
    if count.numel() != size:
        raise ValueError(f"groups: expected group ids in [0, {G - 1}]")
    s_c, s_o, s_cc, s_co, s_w, s_ww = (
        cell_sums(idx, size, v).view(shape)
        for v in (w * c, w * o, w * (c * c), w * (c * o), w, w * w)
    )
    return BinnedStats(count.view(shape), s_c, s_o, s_cc, s_co, weight=s_w, weight2=s_ww)
