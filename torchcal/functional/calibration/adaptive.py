"""Adaptive estimators: equal-mass ECE and ECE_sweep (Roelofs et al. 2022), from a fine
histogram or (exact) from kept samples."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchcal.functional._checks import check_int, check_option
from torchcal.functional.calibration.binning import (
    BinnedStats,
    require_nonempty,
    require_single_slot,
)
from torchcal.functional.calibration.estimators import NORMS
from torchcal.functional.calibration.readings import CalibrationSamples

SPLITS = ("whole", "fractional")


def _rank_boundaries(N: int, n_bins: int, split: str) -> Tensor:
    """Rank boundaries of ``n_bins`` equal-mass bins of ``N`` samples: ``"whole"``: the first
    ``N mod B`` bins hold ``ceil(N / B)`` whole samples, the rest ``floor(N / B)`` (as
    ``torch.tensor_split`` / ``np.array_split`` and the peers); ``"fractional"``: ``b N / B``."""
    b = torch.arange(n_bins + 1, dtype=torch.int64)
    if split == "whole":
        return (b * (N // n_bins) + b.clamp(max=N % n_bins)).to(torch.float64)
    return b.to(torch.float64) * (N / n_bins)


def _equal_mass_sums(
    cum_n: Tensor, cum_c: Tensor, cum_o: Tensor, n_bins: int, split: str = "whole"
) -> tuple[Tensor, Tensor, Tensor]:
    """Sums of conf and outcome in ``n_bins`` equal-mass bins of a piecewise-linear
    cumulative distribution (knots ``cum_n``, values ``cum_c``/``cum_o``)."""
    m = _rank_boundaries(int(round(float(cum_n[-1]))), n_bins, split)
    j = (torch.searchsorted(cum_n, m, right=False) - 1).clamp_(0, cum_n.numel() - 2)
    x0, x1 = cum_n[j], cum_n[j + 1]
    t = torch.where(x1 > x0, (m - x0) / (x1 - x0).clamp_min(1e-300), 0.0).clamp_(0, 1)
    vc = cum_c[j] + t * (cum_c[j + 1] - cum_c[j])
    vo = cum_o[j] + t * (cum_o[j + 1] - cum_o[j])
    vc[0], vo[0] = 0.0, 0.0
    vc[-1], vo[-1] = cum_c[-1], cum_o[-1]
    return m.diff(), vc.diff(), vo.diff()


def _norm_of(n: Tensor, gap_sum: Tensor, norm: str) -> Tensor:
    N = n.sum()
    if norm == "l1":
        return gap_sum.abs().sum() / N
    ok = n > 0
    if norm == "l2":
        return torch.sqrt(torch.where(ok, gap_sum * gap_sum / n.clamp_min(1e-300), 0.0).sum() / N)
    return torch.where(ok, gap_sum.abs() / n.clamp_min(1e-300), -math.inf).max()


def _cumulative(stats: BinnedStats) -> tuple[Tensor, Tensor, Tensor]:
    z = torch.zeros(1, dtype=torch.float64)
    cum_n = torch.cat([z, stats.count.to(torch.float64).cpu().cumsum(0)])
    cum_c = torch.cat([z, stats.conf.cpu().cumsum(0)])
    cum_o = torch.cat([z, stats.acc.cpu().cumsum(0)])
    return cum_n, cum_c, cum_o


def _sorted_cumulative(samples: CalibrationSamples) -> tuple[Tensor, Tensor, Tensor]:
    # ties by outcome too, for either split: the bins (and a fractional boundary inside a tie
    # block) do not depend on the row order, so neither does a streamed metric's value
    order = torch.argsort(samples.outcome, stable=True)
    order = order[torch.argsort(samples.conf[order], stable=True)]
    z = torch.zeros(1, dtype=torch.float64)
    c = samples.conf[order].cpu()
    o = samples.outcome[order].cpu()
    cum_n = torch.arange(c.numel() + 1, dtype=torch.float64)
    return cum_n, torch.cat([z, c.cumsum(0)]), torch.cat([z, o.cumsum(0)])


def _equal_mass(
    cum: tuple[Tensor, Tensor, Tensor], n_bins: int, norm: str, split: str = "whole"
) -> Tensor:
    n, sc, so = _equal_mass_sums(*cum, n_bins, split)
    return _norm_of(n, sc - so, norm)


def _sweep(cum: tuple[Tensor, Tensor, Tensor], norm: str, max_bins: int) -> Tensor:
    # bin sums are differences of cumulative sums: each carries an absolute rounding error of
    # a few ulps of the total, so a "decrease" below ``slack / n_b`` is rounding (e.g. two
    # all-correct bins at 1.0 and 0.9999999999999983), not a violation of monotonicity
    slack = 16 * torch.finfo(torch.float64).eps * max(float(cum[2][-1]), 1.0)
    best = _equal_mass(cum, 1, norm, "fractional")
    for b in range(2, max_bins + 1):
        n, sc, so = _equal_mass_sums(*cum, b, "fractional")
        acc = so / n
        if bool((acc.diff() < -2 * slack / n.min()).any()):
            break
        best = _norm_of(n, sc - so, norm)
    return best


def equal_mass_calibration_error_from_stats(
    fine: BinnedStats, n_bins: int = 15, *, norm: str = "l1", split: str = "whole"
) -> Tensor:
    """Equal-mass (adaptive) ECE from a fine histogram (Nguyen & O'Connor 2015; Roelofs et
    al. 2022).

    ``split="whole"`` (default): bins of whole samples in confidence order, the first ``N mod
    B`` of ``ceil(N / B)`` samples and the rest of ``floor(N / B)`` (the convention of
    torch-uncertainty, ``np.array_split`` and the peers). ``split="fractional"``: the ``b``-th
    bin holds ranks ``[b N / B, (b + 1) N / B)``, a boundary inside a sample splitting it.

    **Accuracy against the sorted samples** (:func:`equal_mass_calibration_error_from_samples`,
    same ``split``): a boundary falls inside a fine bin holding several samples only when they
    are (nearly) tied; that fine bin's sums are then shared in proportion to the count taken
    (its samples taken as alike). The bin counts are exact; each such boundary moves at most
    ``m`` samples' outcomes (``m``: the samples of the straddled fine bin on the smaller side)
    between two adjacent bins, so the L1 value differs from the sorted one by at most ``2 *
    sum(m) / N`` (plus ``m`` times the fine-bin width in confidence), and equals it where no
    fine bin holding more than one sample straddles a boundary. With many samples sharing one
    confidence (a stated-confidence grid), use the sorted samples (``exact=True``).

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> p = torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64)
        >>> fine = binned_statistics(p, torch.tensor([0, 1, 1, 1]), n_bins=4096,
        ...                          reading="binary", input="probs").pooled()
        >>> round(float(equal_mass_calibration_error_from_stats(fine, 2)), 4)  # .5*.35 + .5*.15
        0.25
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    check_option("norm", norm, NORMS)
    check_option("split", split, SPLITS)
    fine = require_single_slot(fine, "equal-mass ECE")
    require_nonempty(fine)
    return _equal_mass(_cumulative(fine), n_bins, norm, split)


def equal_mass_calibration_error_from_samples(
    samples: CalibrationSamples, n_bins: int = 15, *, norm: str = "l1", split: str = "whole"
) -> Tensor:
    """Sort-based equal-mass ECE (the exact reference; the ``split`` conventions of
    :func:`equal_mass_calibration_error_from_stats`: whole samples by default; ``"fractional"``:
    a fractional rank boundary splits one sample; either way tied confidences are ordered by
    outcome, so the value does not depend on the row order).

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.readings import CalibrationSamples
        >>> s = CalibrationSamples(torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64),
        ...                        torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64),
        ...                        torch.zeros(4, dtype=torch.long))
        >>> round(float(equal_mass_calibration_error_from_samples(s, 2)), 4)  # .5*.35 + .5*.15
        0.25
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    check_option("norm", norm, NORMS)
    check_option("split", split, SPLITS)
    if samples.conf.numel() == 0:
        raise ValueError("samples: no samples were kept")
    return _equal_mass(_sorted_cumulative(samples), n_bins, norm, split)


def ece_sweep_from_stats(
    fine: BinnedStats, *, norm: str = "l1", max_bins: int | None = None
) -> Tensor:
    """ECE_sweep (Roelofs et al. 2022) from a fine histogram: equal-mass ECE at the largest
    number of bins ``b`` such that the bin accuracies of ``1 .. b`` bins were all monotone
    non-decreasing (the sweep stops at the first non-monotone ``b``). ``max_bins`` defaults
    to ``min(N, number of fine bins)``.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> p = torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64)
        >>> fine = binned_statistics(p, torch.tensor([0, 1, 1, 1]), n_bins=4096,
        ...                          reading="binary", input="probs").pooled()
        >>> round(float(ece_sweep_from_stats(fine)), 4)  # monotone up to 4 bins: mean |f - y|
        0.3
    """
    check_option("norm", norm, NORMS)
    fine = require_single_slot(fine, "ECE_sweep")
    require_nonempty(fine)
    N = int(fine.count.sum())
    limit = min(N, fine.n_bins) if max_bins is None else check_int("max_bins", max_bins, minimum=1)
    return _sweep(_cumulative(fine), norm, limit)


def ece_sweep_from_samples(
    samples: CalibrationSamples, *, norm: str = "l1", max_bins: int | None = None
) -> Tensor:
    """Sort-based ECE_sweep (Roelofs et al. 2022); ``max_bins`` defaults to ``N``.

    Example:
        >>> import torch
        >>> from torchcal.functional.calibration.readings import CalibrationSamples
        >>> s = CalibrationSamples(torch.tensor([0.1, 0.2, 0.8, 0.9], dtype=torch.float64),
        ...                        torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64),
        ...                        torch.zeros(4, dtype=torch.long))
        >>> round(float(ece_sweep_from_samples(s)), 4)
        0.3
    """
    check_option("norm", norm, NORMS)
    N = samples.conf.numel()
    if N == 0:
        raise ValueError("samples: no samples were kept")
    limit = N if max_bins is None else check_int("max_bins", max_bins, minimum=1)
    return _sweep(_sorted_cumulative(samples), norm, limit)
