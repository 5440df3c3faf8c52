"""The public one-shot functionals (:func:`calibration_error`, :func:`reliability_table`,
:func:`brier_decomposition`, :func:`calibration_error_bootstrap`) and the estimator dispatch
the metrics share (:func:`check_ece_estimator`, :func:`estimate`, :func:`per_group`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from torchcal.functional._checks import check_int, check_option
from torchcal.functional.calibration.adaptive import (
    ece_sweep_from_samples,
    ece_sweep_from_stats,
    equal_mass_calibration_error_from_samples,
    equal_mass_calibration_error_from_stats,
)
from torchcal.functional.calibration.binning import BinnedStats, accumulate
from torchcal.functional.calibration.bootstrap import (
    bootstrap_statistics,
    ece_bootstrap_from_stats,
)
from torchcal.functional.calibration.estimators import (
    NORMS,
    brier_decomposition_from_stats,
    calibration_error_from_stats,
    debiased_calibration_error_from_stats,
)
from torchcal.functional.calibration.intervals import INTERVALS, z_of_level
from torchcal.functional.calibration.readings import (
    READINGS,
    CalibrationSamples,
    prepare_checked,
    samples_from,
)
from torchcal.functional.calibration.results import GroupedResult, ReliabilityTable
from torchcal.functional.calibration.smooth import (
    smooth_calibration_error_from_samples,
    smooth_calibration_error_from_stats,
)
from torchcal.functional.calibration.tables import reliability_table_from_stats

__all__ = [
    "brier_decomposition",
    "calibration_error",
    "calibration_error_bootstrap",
    "reliability_table",
]

ESTIMATORS = ("binned", "debiased", "equal_mass", "sweep", "smooth")
#: estimators that need the fine histogram (or the samples with ``exact=True``)
FINE_ESTIMATORS = ("equal_mass", "sweep", "smooth")


def check_ece_estimator(
    estimator: str, norm: str, reading: str, allowed: tuple[str, ...] = ESTIMATORS
) -> None:
    """Validate an (estimator, norm, reading) combination (functional and metrics)."""
    check_option("estimator", estimator, allowed)
    check_option("norm", norm, NORMS)
    check_option("reading", reading, READINGS)
    if estimator == "debiased" and norm != "l2":
        raise ValueError(
            f"norm: the debiased estimator is an L2 error, expected norm='l2', got {norm!r}"
        )
    if estimator in FINE_ESTIMATORS and reading not in ("binary", "confidence"):
        raise ValueError(
            f"estimator: {estimator!r} is defined for reading='binary' or "
            f"'confidence', got reading={reading!r}"
        )


def estimate(
    estimator: str,
    *,
    stats: BinnedStats,
    fine: BinnedStats | None,
    samples: CalibrationSamples | None,
    n_bins: int,
    norm: str,
    reading: str,
    sigma: float | None = None,
) -> Tensor:
    """One estimate from ``(K, B)`` statistics (and fine ``(K, F)`` or kept samples); the
    combination was checked by :func:`check_ece_estimator`."""
    if estimator == "binned":
        return calibration_error_from_stats(stats, norm=norm, reading=reading)
    if estimator == "debiased":
        return debiased_calibration_error_from_stats(stats, reading=reading)
    if samples is not None:
        if estimator == "equal_mass":
            return equal_mass_calibration_error_from_samples(samples, n_bins, norm=norm)
        if estimator == "sweep":
            return ece_sweep_from_samples(samples, norm=norm)
        return smooth_calibration_error_from_samples(samples, sigma=sigma)
    assert fine is not None
    if estimator == "equal_mass":
        return equal_mass_calibration_error_from_stats(fine, n_bins, norm=norm)
    if estimator == "sweep":
        return ece_sweep_from_stats(fine, norm=norm)
    return smooth_calibration_error_from_stats(fine, sigma=sigma)


def per_group(
    fn: Any,
    stats: BinnedStats,
    fine: BinnedStats | None,
    samples: CalibrationSamples | None,
    counts: Tensor,
) -> GroupedResult:
    """Evaluate ``fn(stats, fine, samples)`` pooled and for each group."""
    pooled = fn(stats.pooled(), None if fine is None else fine.pooled(), samples)
    per = []
    for g in range(stats.count.shape[0]):
        if int(counts[g]) == 0:
            per.append(None)
            continue
        s = None
        if samples is not None:
            m = samples.group == g
            s = CalibrationSamples(samples.conf[m], samples.outcome[m], samples.group[m])
        per.append(fn(stats.group(g), None if fine is None else fine.group(g), s))
    return GroupedResult(pooled, per, counts.cpu())


def stack_scalars(res: GroupedResult) -> GroupedResult:
    vals = [math.nan if v is None else float(v) for v in res.per_group]
    return GroupedResult(res.pooled, torch.tensor(vals, dtype=torch.float64), res.counts)


def calibration_error(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    norm: str = "l1",
    reading: str = "confidence",
    input: str = "logits",
    estimator: str = "binned",
    num_classes: int | None = None,
    groups: Tensor | None = None,
    num_groups: int | None = None,
    fine_bins: int = 4096,
    exact: bool = False,
    sigma: float | None = None,
    ignore_index: int | None = None,
) -> Tensor | GroupedResult:
    """Calibration error of ``preds`` against ``target``.

    Args:
        preds: logits or probabilities (``input``): ``(N,)``/any shape for ``binary``,
            ``(N, C, *)`` otherwise.
        target: ``{0, 1}`` of the shape of ``preds`` (``binary``), else class indices
            ``(N, *)``.
        n_bins: number of equal-width (or equal-mass) bins ``B >= 1``.
        norm: ``"l1"`` (ECE), ``"l2"`` (RMSCE) or ``"max"`` (MCE).
        reading: ``"binary" | "confidence" | "top_label" | "classwise"`` (module docstring).
        input: ``"logits"`` or ``"probs"``.
        estimator: ``"binned"`` (equal-width), ``"debiased"`` (Kumar et al. 2019, needs
            ``norm="l2"``), ``"equal_mass"``, ``"sweep"`` (Roelofs et al. 2022) or
            ``"smooth"`` (Blasiok & Nakkiran 2023; ``norm`` ignored); the last three from a
            ``fine_bins`` histogram, or from the sorted samples with ``exact=True``.
        groups, num_groups: optional domain id per sample; then a
            :class:`~torchcal.GroupedResult` with ``pooled`` (scalar) and
            ``per_group`` (``(G,)``, ``NaN`` for empty groups) is returned.
        sigma: fixed bandwidth for ``estimator="smooth"`` (default: the fixed point).
        ignore_index: a target value whose elements are dropped (as in
            ``F.cross_entropy``); ``ValueError`` if nothing is left.

    ``input="logits"`` whose rows all lie in [0, 1] and sum to 1 warn (``UserWarning``:
    probabilities passed as logits). ``input="probs"`` rows must sum to 1 within
    ``max(1e-4, C * eps(dtype))``.

    Returns:
        A float64 scalar tensor, or a ``GroupedResult`` when ``groups`` is given.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]])
        >>> round(float(calibration_error(logits, torch.tensor([0, 1, 1]), n_bins=10)), 4)
        0.2992
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    check_ece_estimator(estimator, norm, reading)
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
    stats = accumulate(prep, n_bins)
    fine = samples = None
    if estimator in FINE_ESTIMATORS:
        if exact:
            samples = samples_from(prep)
        else:
            fine = accumulate(prep, check_int("fine_bins", fine_bins, minimum=1))

    def fn(s: BinnedStats, f: BinnedStats | None, smp: CalibrationSamples | None) -> Tensor:
        return estimate(
            estimator,
            stats=s,
            fine=f,
            samples=smp,
            n_bins=n_bins,
            norm=norm,
            reading=reading,
            sigma=sigma,
        )

    if groups is None:
        return fn(stats.pooled(), None if fine is None else fine.pooled(), samples)
    return stack_scalars(per_group(fn, stats, fine, samples, prep.group_counts))


def reliability_table(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    reading: str = "confidence",
    input: str = "logits",
    interval: str = "wilson",
    level: float = 0.95,
    num_classes: int | None = None,
    groups: Tensor | None = None,
    num_groups: int | None = None,
    ignore_index: int | None = None,
) -> ReliabilityTable | GroupedResult:
    """Equal-width :class:`~torchcal.ReliabilityTable` with per-bin counts and
    accuracy intervals (``interval="wilson" | "clopper_pearson"`` at ``level``).

    With ``groups`` a :class:`~torchcal.GroupedResult` whose ``per_group`` is a list
    of tables (``None`` for empty groups).

    Example:
        >>> import torch
        >>> t = reliability_table(torch.tensor([0.9] * 4), torch.tensor([1, 1, 1, 0]),
        ...                       n_bins=5, reading="binary", input="probs")
        >>> t.count.tolist(), round(float(t.acc[4]), 2), round(float(t.ci_low[4]), 3)
        ([0, 0, 0, 0, 4], 0.75, 0.301)
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    check_option("interval", interval, INTERVALS)
    z_of_level(level)
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
    stats = accumulate(prep, n_bins)

    def fn(s: BinnedStats, f: Any, smp: Any) -> ReliabilityTable:
        return reliability_table_from_stats(s, interval=interval, level=level, reading=reading)

    if groups is None:
        return fn(stats.pooled(), None, None)
    return per_group(fn, stats, None, None, prep.group_counts)


def brier_decomposition(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    reading: str = "binary",
    input: str = "logits",
    num_classes: int | None = None,
    groups: Tensor | None = None,
    num_groups: int | None = None,
    ignore_index: int | None = None,
) -> dict[str, Tensor] | GroupedResult:
    """Brier score with its exact binned Murphy decomposition (see
    :func:`brier_decomposition_from_stats`): a dict with ``brier``, ``reliability``,
    ``resolution``, ``uncertainty``, ``within_bin_variance`` and ``within_bin_covariance``
    (float64 scalars) with
    ``brier = reliability - resolution + uncertainty + within_bin_variance
    - 2 * within_bin_covariance``.

    With ``groups``: a :class:`~torchcal.GroupedResult` whose ``per_group`` is a dict
    of ``(G,)`` tensors.

    Example:
        >>> import torch
        >>> d = brier_decomposition(torch.tensor([0.9, 0.8, 0.2, 0.1]),
        ...                         torch.tensor([1, 0, 0, 0]), n_bins=5, input="probs")
        >>> round(float(d["brier"]), 4)
        0.175
        >>> parts = (d["reliability"] - d["resolution"] + d["uncertainty"]
        ...          + d["within_bin_variance"] - 2 * d["within_bin_covariance"])
        >>> round(float(parts), 4)
        0.175
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
    stats = accumulate(prep, n_bins)
    pooled = brier_decomposition_from_stats(stats.pooled(), reading=reading)
    if groups is None:
        return pooled
    per = brier_decomposition_from_stats(stats, reading=reading)
    return GroupedResult(pooled, per, prep.group_counts.cpu())


def calibration_error_bootstrap(
    preds: Tensor,
    target: Tensor,
    *,
    n_bins: int = 15,
    reading: str = "confidence",
    input: str = "logits",
    num_classes: int | None = None,
    replicates: int = 200,
    level: float = 0.95,
    seed: int = 0,
    ignore_index: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Equal-width L1 ECE with a seeded Poisson-bootstrap percentile interval:
    ``(ece, low, high)``. Needs at least 2 samples; replicates that drew no sample are
    dropped (see :func:`ece_bootstrap_from_stats`).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(500, generator=g, dtype=torch.float64)
        >>> y = (torch.rand(500, generator=g, dtype=torch.float64) < p).long()
        >>> ece, lo, hi = calibration_error_bootstrap(p, y, reading="binary", input="probs",
        ...                                           n_bins=10, replicates=100)
        >>> bool(lo <= ece <= hi)
        True
    """
    n_bins = check_int("n_bins", n_bins, minimum=1)
    replicates = check_int("replicates", replicates, minimum=2)
    prep = prepare_checked(
        preds,
        target,
        reading=reading,
        input=input,
        num_classes=num_classes,
        ignore_index=ignore_index,
    )
    n = prep.conf.numel() // prep.per_sample
    if n < 2:
        raise ValueError(f"preds: a bootstrap interval needs at least 2 samples, got {n}")
    stats = accumulate(prep, n_bins)
    gen = torch.Generator(device=prep.conf.device).manual_seed(seed)
    wn, wc, wo = bootstrap_statistics(prep, n_bins, replicates, gen)
    lo, hi = ece_bootstrap_from_stats(wn, wc, wo, level=level)
    return calibration_error_from_stats(stats.pooled(), reading=reading), lo, hi
