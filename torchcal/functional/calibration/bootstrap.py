"""Streaming Poisson bootstrap of the ECE (Hanley & MacGibbon 2006; Chamandy et al. 2012)."""

from __future__ import annotations

import torch
from torch import Tensor

from torchcal.functional.calibration.binning import bin_ids
from torchcal.functional.calibration.intervals import z_of_level
from torchcal.functional.calibration.readings import PreparedInputs


def bootstrap_statistics(
    prep: PreparedInputs, n_bins: int, replicates: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Poisson(1)-weighted binned sums for ``replicates`` bootstrap replicates, pooled over
    groups: weighted counts, confidence sums and outcome sums, each ``(R, K * B)`` float64.

    Each element draws ``R`` independent Poisson(1) weights from ``generator`` (the streaming
    bootstrap of Hanley & MacGibbon 2006 / Chamandy et al. 2012), so the state streams and
    merges by addition like the plain statistics. A weight belongs to a sample: for
    ``classwise`` its ``C`` one-vs-rest elements share it (resampling samples, not pairs).
    Memory per update: ``M x R`` float64 weights.

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.readings import prepare_inputs
        >>> prep = prepare_inputs(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]),
        ...                       reading="binary", input="probs")
        >>> wn, wc, wo = bootstrap_statistics(prep, 2, 3, torch.Generator().manual_seed(0))
        >>> wn.shape
        torch.Size([3, 2])
    """
    c = prep.conf.to(torch.float64)
    idx = bin_ids(c, n_bins)
    K = prep.num_slots
    if prep.lead is not None:
        idx = idx + (prep.lead % K) * n_bins
    size = K * n_bins
    rate = torch.ones(
        c.numel() // prep.per_sample, replicates, dtype=torch.float64, device=c.device
    )
    w = torch.poisson(rate, generator=generator)  # (samples, R)
    if prep.per_sample > 1:
        w = w.repeat_interleave(prep.per_sample, dim=0)  # (M, R)
    cell = (idx.unsqueeze(1) + torch.arange(replicates, device=c.device) * size).reshape(-1)
    o = prep.outcome.to(torch.float64)
    wn = torch.bincount(cell, weights=w.reshape(-1), minlength=replicates * size)
    wc = torch.bincount(cell, weights=(w * c.unsqueeze(1)).reshape(-1), minlength=replicates * size)
    wo = torch.bincount(cell, weights=(w * o.unsqueeze(1)).reshape(-1), minlength=replicates * size)
    shape = (replicates, size)
    return wn.view(shape), wc.view(shape), wo.view(shape)


def ece_bootstrap_from_stats(
    wn: Tensor, wc: Tensor, wo: Tensor, *, level: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Percentile interval of the L1 ECE over bootstrap replicates ``(R, cells)``.

    The ECE of a replicate is ``sum_cells |wc - wo| / sum_cells wn`` in every reading: for
    ``classwise`` the cells are (class, bin) and ``sum wn`` is ``C`` times the weighted
    number of samples, so this is the mean over classes of the one-vs-rest ECE. Replicates
    whose Poisson weights are all 0 (likely for small N: probability ``exp(-N)``) are
    dropped; fewer than two usable replicates raise ``ValueError``.

    Example:
        >>> import torch
        >>> wn = torch.tensor([[2.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
        >>> wc = torch.tensor([[0.4, 0.9], [0.2, 0.9]], dtype=torch.float64)
        >>> wo = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
        >>> [round(float(v), 4) for v in ece_bootstrap_from_stats(wn, wc, wo, level=0.5)]
        [0.1542, 0.1625]
    """
    z_of_level(level)
    total = wn.sum(-1)
    used = total > 0  # a replicate whose weights are all 0 has no ECE: dropped
    if int(used.sum()) < 2:
        raise ValueError(
            f"replicates: only {int(used.sum())} of {wn.shape[0]} bootstrap "
            f"replicates drew a sample; use more samples or more replicates"
        )
    ece = ((wc - wo).abs().sum(-1) / total)[used]
    a = (1 - level) / 2
    q = torch.quantile(ece, torch.tensor([a, 1 - a], dtype=torch.float64, device=ece.device))
    return q[0], q[1]
