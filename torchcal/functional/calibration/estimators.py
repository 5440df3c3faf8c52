"""Equal-width estimators from binned statistics: ECE / RMSCE / MCE, the debiased L2 error
(Kumar, Liang & Ma 2019) and the exact binned Brier decomposition (Murphy 1973;
Stephenson, Coelho & Jolliffe 2008)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchcal.functional._checks import check_option
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.calibration.readings import READINGS

__all__ = [
    "brier_decomposition_from_stats",
    "calibration_error_from_stats",
]

NORMS = ("l1", "l2", "max")


def calibration_error_from_stats(
    stats: BinnedStats, *, norm: str = "l1", reading: str = "confidence"
) -> Tensor:
    """Equal-width ECE (``norm="l1"``), RMSCE (``"l2"``) or MCE (``"max"``) of ``(..., K, B)``
    statistics; returns shape ``(...)`` (``NaN`` where a leading entry has no samples).

    ``l1``: ``sum_b n_b / N |conf_b - acc_b|`` (Naeini et al. 2015, Guo et al. 2017);
    ``l2``: ``sqrt(sum_b n_b / N (conf_b - acc_b)^2)``; ``max``: ``max_b |conf_b - acc_b|``
    over non-empty bins. ``top_label`` treats each (class, bin) as a bin, which is the
    count-weighted average over predicted classes (Gupta & Ramdas 2021); ``classwise``
    aggregates the one-vs-rest errors ``e_k`` of the classes by the power mean of the norm,
    as the marginal calibration error of Kumar et al. (2019; ``verified_calibration``):
    ``mean_k e_k`` for ``l1`` (Kull et al. 2019), ``sqrt(mean_k e_k^2)`` for ``l2``,
    ``max_k e_k`` for ``max``.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.9, 0.9, 0.2]), torch.tensor([1, 0, 0]),
        ...                       n_bins=10, reading="binary", input="probs")
        >>> round(float(calibration_error_from_stats(s.pooled(), reading="binary")), 4)
        0.3333
    """
    check_option("norm", norm, NORMS)
    check_option("reading", reading, READINGS)
    n = stats.mass()
    gap = stats.conf - stats.acc  # sums
    if reading != "classwise":  # flatten (K, B) cells
        n = n.flatten(-2)
        gap = gap.flatten(-2)
    N = n.sum(-1)
    nonempty = n > 0
    if norm == "l1":
        err = gap.abs().sum(-1) / N
    elif norm == "l2":
        err = torch.sqrt(torch.where(nonempty, gap * gap / n, 0.0).sum(-1) / N)
    else:
        err = torch.where(nonempty, gap.abs() / n, -math.inf).amax(-1)
        err = torch.where(N > 0, err, math.nan)
    if reading == "classwise":
        err = class_mean(err, norm)
    return err


def class_mean(err: Tensor, norm: str) -> Tensor:
    """Aggregate per-class errors ``(..., K)`` by the power mean of the norm, as
    ``verified_calibration`` (Kumar et al. 2019) does for its marginal (classwise) error:
    ``l1`` the mean, ``l2`` the root mean square, ``max`` the maximum (NaN propagates)."""
    if norm == "l1":
        return err.mean(-1)
    if norm == "l2":
        return torch.sqrt((err * err).mean(-1))
    return err.amax(-1)


def debiased_calibration_error_from_stats(
    stats: BinnedStats, *, reading: str = "confidence"
) -> Tensor:
    """Debiased L2 calibration error of Kumar, Liang & Ma (2019), shape ``(...)``.

    Per non-empty bin the plug-in ``(conf_b - acc_b)^2`` minus the variance of the bin's
    accuracy ``acc_b (1 - acc_b) / (n_b - 1)``; bins with fewer than two samples contribute
    0; the weighted sum ``sum_b n_b / N (...)`` is clipped at 0 and square-rooted (as their
    ``unbiased_l2_ce``). ``classwise`` is the root of the mean over classes of the clipped
    squares (their marginal calibration error).

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.9, 0.9, 0.9, 0.9]), torch.tensor([1, 1, 0, 0]),
        ...                       n_bins=10, reading="binary", input="probs")
        >>> round(float(debiased_calibration_error_from_stats(s.pooled())), 4)  # 0.16 - 1/12
        0.2769
    """
    check_option("reading", reading, READINGS)
    n = stats.mass()
    gap = stats.conf - stats.acc
    acc = stats.acc
    if reading != "classwise":
        n, gap, acc = n.flatten(-2), gap.flatten(-2), acc.flatten(-2)
    N = n.sum(-1)
    ok = n >= 2
    a = acc / n
    term = (gap / n) ** 2 - a * (1 - a) / (n - 1)
    sq = torch.where(ok, n * term, 0.0).sum(-1) / N
    if reading == "classwise":  # root of the mean over classes of the clipped squares
        return torch.sqrt(sq.clamp_min(0).mean(-1))
    return torch.sqrt(sq.clamp_min(0))


def brier_decomposition_from_stats(
    stats: BinnedStats, *, reading: str = "confidence"
) -> dict[str, Tensor]:
    """Brier score and its exact Murphy decomposition from ``(..., K, B)`` statistics.

    ``brier = reliability - resolution + uncertainty + within_bin_variance
    - 2 * within_bin_covariance`` holds exactly (Murphy 1973; the two within-bin terms of
    Stephenson, Coelho & Jolliffe 2008 make the binned decomposition exact):

    * ``reliability = sum_b n_b (f_b - o_b)^2 / N``, ``resolution = sum_b n_b (o_b - o)^2 / N``,
      ``uncertainty = o (1 - o)``;
    * ``within_bin_variance = sum_b sum_{i in b} (f_i - f_b)^2 / N``,
      ``within_bin_covariance = sum_b sum_{i in b} (f_i - f_b)(y_i - o_b) / N``.

    ``top_label`` uses the (class, bin) cells as the partition; ``classwise`` sums the
    one-vs-rest decompositions over classes, so ``brier`` is the multiclass Brier score
    ``mean_i sum_k (p_ik - y_ik)^2``.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.9, 0.1]), torch.tensor([1, 1]), n_bins=2,
        ...                       reading="binary", input="probs")
        >>> round(float(brier_decomposition_from_stats(s.pooled())["brier"]), 4)
        0.41
    """
    check_option("reading", reading, READINGS)
    n = stats.mass()
    sc, sa, scc, sca = stats.conf, stats.acc, stats.conf2, stats.conf_acc
    if reading != "classwise":
        n, sc, sa, scc, sca = (t.flatten(-2).unsqueeze(-2) for t in (n, sc, sa, scc, sca))
    N = n.sum(-1)
    safe = torch.where(n > 0, n, 1.0)  # bins of weight below 1 (sample weights)
    fb = sc / safe
    ob = sa / safe
    o = sa.sum(-1) / N
    out = {
        "brier": (scc.sum(-1) - 2 * sca.sum(-1) + sa.sum(-1)) / N,
        "reliability": (n * (fb - ob) ** 2).sum(-1) / N,
        "resolution": (n * (ob - o.unsqueeze(-1)) ** 2).sum(-1) / N,
        "uncertainty": o * (1 - o),
        "within_bin_variance": (scc - sc * fb).sum(-1) / N,
        "within_bin_covariance": (sca - sc * ob).sum(-1) / N,
    }
    return {k: v.sum(-1) for k, v in out.items()}
