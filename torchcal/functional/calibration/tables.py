"""Reliability tables (:class:`~torchcal.ReliabilityTable`) from binned statistics."""

from __future__ import annotations

import torch

from torchcal.functional._checks import check_option
from torchcal.functional.calibration.binning import BinnedStats
from torchcal.functional.calibration.intervals import (
    INTERVALS,
    clopper_pearson_interval,
    wilson_interval,
    z_of_level,
)
from torchcal.functional.calibration.readings import READINGS
from torchcal.functional.calibration.results import ReliabilityTable

__all__ = ["reliability_table_from_stats"]


def _tables(
    stats: BinnedStats, interval: str, level: float, reading: str
) -> list[ReliabilityTable]:
    """One table per row of ``(K, B)`` statistics, with every column computed in one pass."""
    B = stats.n_bins
    edges = torch.arange(B + 1, dtype=torch.float64) / B
    with torch.no_grad():
        count = stats.count.cpu()
        n = stats.mass().cpu()  # the weight total when weighted
        s_acc = stats.acc.cpu()
        conf = stats.conf.cpu() / n
        acc = s_acc / n
        fn = wilson_interval if interval == "wilson" else clopper_pearson_interval
        lo, hi = fn(s_acc, n, level)
    return [
        ReliabilityTable(
            edges[:-1],
            edges[1:],
            count[k],
            conf[k],
            acc[k],
            lo[k],
            hi[k],
            float(level),
            interval,
            reading,
        )
        for k in range(count.shape[0])
    ]


def reliability_table_from_stats(
    stats: BinnedStats,
    *,
    interval: str = "wilson",
    level: float = 0.95,
    reading: str = "confidence",
) -> ReliabilityTable:
    """:class:`~torchcal.ReliabilityTable` of statistics ``(K, B)`` (or ``(B,)``).

    For ``K > 1`` (``top_label``/``classwise``) the table pools the classes bin by bin and
    ``per_class`` holds one table per class; the table's ``ece`` is still the error of the
    reading (count-weighted over predicted classes for ``top_label``, the mean over classes
    for ``classwise``), as :func:`calibration_error` gives it.

    Example:
        >>> import torch
        >>> from torchcal.functional import binned_statistics
        >>> s = binned_statistics(torch.tensor([0.2, 0.8]), torch.tensor([0, 1]), n_bins=2,
        ...                       reading="binary", input="probs")
        >>> reliability_table_from_stats(s.pooled()).count.tolist()
        [1, 1]
    """
    check_option("interval", interval, INTERVALS)
    check_option("reading", reading, READINGS)
    z_of_level(level)
    if stats.count.dim() == 1:
        stats = stats.map(lambda t: t.unsqueeze(0))
    if stats.count.dim() != 2:
        raise ValueError(f"stats: expected (K, B) statistics, got {tuple(stats.count.shape)}")
    if stats.count.shape[0] == 1:
        return _tables(stats, interval, level, reading)[0]
    per_class = tuple(_tables(stats, interval, level, reading))
    table = _tables(stats.map(lambda t: t.sum(0, keepdim=True)), interval, level, reading)[0]
    table.per_class = per_class
    return table
