r"""Coverage and size of prediction sets on a test split (docs/design.md section 6e, "Set
coverage"): the share of sets that hold the true label with a Wilson interval, and the mean and
median set size, pooled, per true class and per group.

Everything follows from summed integer counts (:class:`SetCoverageCounts`): per true class and
per group, the histogram of set sizes over ``0 .. C`` and the number of covered rows, so the
streamed metric (:class:`~torchcal.metrics.SetCoverage`) sums them across batches and ranks and
gives the same result as one call here. The median is read from the histogram (the mean of the
two middle sizes for an even count, as :func:`numpy.median`); the interval is
:func:`~torchcal.functional.calibration.intervals.wilson_interval` (Wilson 1927) of the covered
count, a binomial interval for the coverage of these test rows (for a fixed calibration; over
calibration draws the coverage varies more, docs/sets.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional._checks import check_class_target, check_tensor
from torchcal.functional._validation import check_group_ids
from torchcal.functional.calibration.intervals import wilson_interval, z_of_level

__all__ = [
    "CoverageSummary",
    "SetCoverageCounts",
    "SetCoverageResult",
    "set_coverage",
    "set_coverage_counts",
    "set_coverage_from_counts",
]


class SetCoverageCounts(NamedTuple):
    """The summed state of set coverage (int64; add two to merge).

    Attributes:
        class_sizes: ``(C, C + 1)``: rows of true class ``c`` whose set has ``k`` labels.
        class_hits: ``(C,)``: rows of true class ``c`` whose set holds ``c``.
        group_sizes: ``(G, C + 1)``: the same per group (``G = 0`` without groups).
        group_hits: ``(G,)``.
    """

    class_sizes: Tensor
    class_hits: Tensor
    group_sizes: Tensor
    group_hits: Tensor


class CoverageSummary(NamedTuple):
    """Coverage and size of one stratum or of several (float64 unless stated; every field of
    the same shape: ``()`` pooled, ``(C,)`` per class, ``(G,)`` per group; ``NaN`` where a
    stratum has no rows).

    Attributes:
        rows: rows, int64.
        coverage: the share of sets holding the true label.
        lower: the Wilson lower bound of the coverage at ``level``.
        upper: the Wilson upper bound.
        mean_size: the mean set size.
        median_size: the median set size.
        empty: the share of empty sets.
    """

    rows: Tensor
    coverage: Tensor
    lower: Tensor
    upper: Tensor
    mean_size: Tensor
    median_size: Tensor
    empty: Tensor


class SetCoverageResult(NamedTuple):
    """What :func:`set_coverage` returns.

    Attributes:
        pooled: every row (0-d fields).
        per_class: per true class (``(C,)`` fields).
        per_group: per group (``(G,)`` fields), ``None`` without groups.
        level: the interval's level.
    """

    pooled: CoverageSummary
    per_class: CoverageSummary
    per_group: CoverageSummary | None
    level: float


def set_coverage_counts(
    sets: Tensor,
    target: Tensor,
    groups: Tensor | None = None,
    num_groups: int | None = None,
) -> SetCoverageCounts:
    """The summed counts of ``sets`` ``(N, C)`` (a boolean mask, e.g. from
    :func:`~torchcal.functional.conformal_sets`) against class ids ``target`` ``(N,)``, per
    group with ``groups`` ``(N,)`` (``num_groups``: their number, else ``max + 1``).

    Example:
        >>> import torch
        >>> from torchcal.functional import set_coverage_counts
        >>> sets = torch.tensor([[True, True, False], [False, False, True], [False, False, False]])
        >>> c = set_coverage_counts(sets, torch.tensor([0, 1, 1]))
        >>> c.class_sizes.tolist(), c.class_hits.tolist()
        ([[0, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], [1, 0, 0])
    """
    check_tensor("sets", sets)
    if sets.dtype != torch.bool or sets.dim() != 2 or sets.shape[1] < 1:
        raise ValueError(
            f"sets: expected an (N, C) boolean mask, got shape {tuple(sets.shape)} and dtype "
            f"{sets.dtype}"
        )
    N, C = sets.shape
    check_tensor("target", target)
    if target.shape != (N,):
        raise ValueError(f"target: expected ({N},) class ids, got shape {tuple(target.shape)}")
    check_class_target("target", target, C)
    y = target.to(device=sets.device, dtype=torch.long)
    size = sets.sum(1)
    hit = sets.gather(1, y[:, None])[:, 0].to(torch.int64)

    def tally(ids: Tensor, S: int) -> tuple[Tensor, Tensor]:
        cell = ids * (C + 1) + size  # a scatter, not bincount (no host read of the size)
        hist = torch.zeros(S * (C + 1), dtype=torch.int64, device=sets.device)
        hist.index_add_(0, cell, torch.ones_like(cell))
        hits = torch.zeros(S, dtype=torch.int64, device=sets.device).index_add_(0, ids, hit)
        return hist.reshape(S, C + 1), hits

    class_sizes, class_hits = tally(y, C)
    if groups is None:
        if num_groups is not None:
            raise ValueError("num_groups: given without groups")
        empty = torch.zeros(0, C + 1, dtype=torch.int64, device=sets.device)
        return SetCoverageCounts(class_sizes, class_hits, empty, empty[:, 0])
    G = check_group_ids(groups, (N,), num_groups)
    g = groups.to(device=sets.device, dtype=torch.long)
    return SetCoverageCounts(class_sizes, class_hits, *tally(g, G))


def _summary(sizes: Tensor, hits: Tensor, level: float) -> CoverageSummary:
    """The summary of histograms ``(..., C + 1)`` and covered counts ``(...)``."""
    n = sizes.sum(-1)
    nf = n.to(torch.float64)
    k = torch.arange(sizes.shape[-1], dtype=torch.float64, device=sizes.device)
    cum = torch.cumsum(sizes, -1)
    # the two middle rows (1-based ceil(n / 2) and floor(n / 2) + 1): their sizes' mean
    mid = torch.stack([(n + 1) // 2, n // 2 + 1], -1)
    at = torch.searchsorted(cum.contiguous(), mid.contiguous()).clamp_max(sizes.shape[-1] - 1)
    median = at.to(torch.float64).mean(-1)
    nan = torch.full_like(nf, math.nan)
    some = n > 0
    lower, upper = wilson_interval(hits, n, level)
    return CoverageSummary(
        rows=n,
        coverage=torch.where(some, hits / nf.clamp_min(1), nan),
        lower=lower,
        upper=upper,
        mean_size=torch.where(some, (sizes * k).sum(-1) / nf.clamp_min(1), nan),
        median_size=torch.where(some, median, nan),
        empty=torch.where(some, sizes[..., 0] / nf.clamp_min(1), nan),
    )


def set_coverage_from_counts(counts: SetCoverageCounts, level: float = 0.95) -> SetCoverageResult:
    """The coverage summary of summed :class:`SetCoverageCounts` (module docstring).

    Example:
        >>> import torch
        >>> from torchcal.functional import set_coverage_counts, set_coverage_from_counts
        >>> sets = torch.tensor([[True, True], [False, True], [True, False], [True, True]])
        >>> c = set_coverage_counts(sets, torch.tensor([0, 0, 0, 1]))
        >>> r = set_coverage_from_counts(c)
        >>> float(r.pooled.coverage), float(r.pooled.median_size), r.per_class.coverage.tolist()
        (0.75, 1.5, [0.6666666666666666, 1.0])
    """
    z_of_level(level)  # the level checked before any work
    per_group = None
    if counts.group_sizes.shape[0]:
        per_group = _summary(counts.group_sizes, counts.group_hits, level)
    return SetCoverageResult(
        pooled=_summary(counts.class_sizes.sum(0), counts.class_hits.sum(), level),
        per_class=_summary(counts.class_sizes, counts.class_hits, level),
        per_group=per_group,
        level=float(level),
    )


def set_coverage(
    sets: Tensor,
    target: Tensor,
    groups: Tensor | None = None,
    num_groups: int | None = None,
    *,
    level: float = 0.95,
) -> SetCoverageResult:
    """Coverage (with a Wilson interval at ``level``), mean and median size and the share of
    empty sets of ``sets`` ``(N, C)`` against ``target`` ``(N,)``: pooled, per true class and,
    with ``groups``, per group (module docstring).

    Example:
        >>> import torch
        >>> from torchcal.functional import set_coverage
        >>> sets = torch.tensor([[True, True, False], [False, True, False], [True, False, False]])
        >>> r = set_coverage(sets, torch.tensor([0, 1, 2]))
        >>> float(r.pooled.coverage), float(r.pooled.mean_size), float(r.pooled.empty)
        (0.6666666666666666, 1.3333333333333333, 0.0)
        >>> [round(float(b), 4) for b in (r.pooled.lower, r.pooled.upper)]
        [0.2077, 0.9385]
    """
    return set_coverage_from_counts(set_coverage_counts(sets, target, groups, num_groups), level)
