r"""Readings of the calibration of predictive distributions: PIT histograms and their
calibration error, interval coverage, observed quantile frequencies and their calibration
error, sharpness.

The PIT values themselves and the overview live in :mod:`torchcal.functional.regression`,
which re-exports everything here. Counts are int64, everything else float64 (summed in
float64); the ``*_from_counts`` / ``frequency_*`` forms take the summed statistics the
streaming metrics keep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_int,
    check_nonempty,
    check_option,
    check_positive,
    check_probabilities,
    check_reduction,
    check_tensor,
    compute_dtype,
)
from torchcal.functional._forecast import cast_forecast, check_target_shape
from torchcal.functional._validation import (
    check_group_ids,
    check_interval_side,
    check_level_grid,
    check_sorted_last,
    values_within,
)
from torchcal.functional.calibration.binning import bin_counts, bin_ids
from torchcal.functional.continuous import check_interval_width, interval_parts

__all__ = [
    "pit_histogram",
    "pit_calibration_error",
    "pit_calibration_error_from_counts",
    "interval_coverage",
    "observed_frequencies",
    "frequency_calibration_error",
    "quantile_calibration_error",
    "sharpness",
]


def quantile_inputs(
    quantiles: Tensor, levels: Tensor | Sequence[float], target: Tensor, min_levels: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Checked and cast ``(quantiles (..., K), levels (K,), target (..., 1))``."""
    levels = check_level_grid("levels", levels)
    k = levels.shape[0]
    if k < min_levels:
        raise ValueError(f"levels: expected at least {min_levels} levels, got {k}")
    check_tensor("quantiles", quantiles)
    check_tensor("target", target)
    check_floating("quantiles", quantiles)
    if quantiles.dim() < 1 or quantiles.shape[-1] != k:
        raise ValueError(
            f"quantiles: expected shape (..., K) with K = {k} (the number of levels), got "
            f"{tuple(quantiles.shape)}"
        )
    check_floating("target", target)
    check_nonempty("target", target)
    check_target_shape(target.shape, [("quantiles without its last dim", quantiles.shape[:-1])])
    q, y, lv = cast_forecast(
        [("quantiles", quantiles), ("target", target.unsqueeze(-1))], [("levels", levels)]
    )
    check_sorted_last("quantiles", q)
    return q, lv, y


def pit_histogram(
    pit: Tensor, n_bins: int = 10, *, groups: Tensor | None = None, num_groups: int | None = None
) -> Tensor:
    r"""Counts of PIT values in ``n_bins`` equal-width bins of [0, 1], per group.

    The bin rule of torchcal (docs/design.md, section 3): :math:`u` goes to bin
    :math:`\min(\lfloor uB \rfloor, B - 1)` computed in float64, so 1.0 is in the last bin.

    Args:
        pit: PIT values in [0, 1], any shape (may be empty).
        n_bins: the number of bins :math:`B \ge 1`.
        groups: optional integer group ids of ``pit``'s shape.
        num_groups: the number of groups (ids in ``[0, num_groups)``); inferred from
            ``groups`` when ``None``. Requires ``groups``.

    Returns:
        int64 counts of shape ``(G, n_bins)`` (``G = 1`` without groups).

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_histogram
        >>> pit_histogram(torch.tensor([0.0, 0.3, 0.5, 1.0]), 2).tolist()
        [[2, 2]]
    """
    check_int("n_bins", n_bins, minimum=1)
    check_floating("pit", check_tensor("pit", pit))
    if not values_within(pit, 0.0, 1.0):
        check_probabilities("pit", pit)
    if groups is None:
        if num_groups is not None:
            raise ValueError("num_groups: given without groups")
        g, ids = 1, None
    else:
        g = check_group_ids(groups, pit.shape, num_groups)
        ids = groups.reshape(-1).to(device=pit.device, dtype=torch.int64)
    if ids is None:
        return bin_counts(pit, n_bins).reshape(1, n_bins)
    flat = ids * n_bins + bin_ids(pit.reshape(-1), n_bins)
    return torch.bincount(flat, minlength=g * n_bins).reshape(g, n_bins)


def pit_calibration_error(pit: Tensor, n_bins: int = 10) -> Tensor:
    r"""PIT calibration error :math:`\sum_b |n_b / N - 1/B|` of a PIT histogram.

    The L1 distance between the bin shares and the flat histogram: 0 for a flat
    histogram, at most :math:`2(1 - 1/B)` (every value in one bin). Its expectation under
    exact calibration is positive (sampling noise, of order :math:`\sqrt{B/N}`).

    Args:
        pit: non-empty PIT values in [0, 1], any shape.
        n_bins: the number of equal-width bins :math:`B \ge 1`.

    Returns:
        a float64 scalar.

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_calibration_error
        >>> pit_calibration_error(torch.tensor([0.1, 0.2, 0.3, 0.9]), 2).item()
        0.5
    """
    check_nonempty("pit", check_tensor("pit", pit))
    return pit_calibration_error_from_counts(pit_histogram(pit, n_bins)[0])


def pit_calibration_error_from_counts(counts: Tensor) -> Tensor:
    r""":func:`pit_calibration_error` of histogram counts: :math:`\sum_b |c_b/N - 1/B|`.

    Args:
        counts: ``(..., B)`` non-negative bin counts (e.g. :func:`pit_histogram` or a
            metric's summed state); ``N = counts.sum(-1)``.

    Returns:
        float64 ``(...)``; NaN where ``N == 0``.

    Example:
        >>> import torch
        >>> from torchcal.functional import pit_calibration_error_from_counts
        >>> pit_calibration_error_from_counts(torch.tensor([[3, 1], [0, 0]])).tolist()
        [0.5, nan]
    """
    check_tensor("counts", counts)
    if counts.dim() < 1 or counts.shape[-1] == 0:
        raise ValueError(f"counts: expected shape (..., B) with B >= 1, got {tuple(counts.shape)}")
    check_positive("counts", counts, strict=False)  # finite and >= 0 (NaN, -1 read before)
    c = counts.to(torch.float64)
    n = c.sum(dim=-1, keepdim=True)
    return (c / n - 1.0 / c.shape[-1]).abs().sum(dim=-1)


def interval_coverage(
    lower: Tensor, upper: Tensor, target: Tensor, *, reduction: str = "mean"
) -> Tensor:
    r"""Coverage :math:`1\{l \le y \le u\}` of prediction intervals (closed intervals).

    With ``reduction='mean'`` the observed coverage, to compare with the nominal level;
    its standard error is :math:`\sqrt{p(1-p)/n}`.

    Args:
        lower, upper: interval bounds, ``lower <= upper`` (else ``ValueError('upper:
            ...')``, as :func:`~torchcal.functional.interval_score`), broadcastable to
            the target's shape; ``lower = -inf`` / ``upper = +inf`` is an unbounded side
            (e.g. a conformal interval from too few calibration points). For ``L`` levels at once pass ``(N, L)`` bounds and the
            target's values as ``(N, L)`` (e.g. ``target[:, None].expand(-1, L)``).
        target: observations, never broadcast.
        reduction: ``'mean'`` (coverage) | ``'sum'`` (number covered) | ``'none'``
            (indicators of the target's shape).

    Returns:
        float64.

    Example:
        >>> import torch
        >>> from torchcal.functional import interval_coverage
        >>> l, u = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 1.0])
        >>> interval_coverage(l, u, torch.tensor([0.5, 1.0, 2.0])).item()
        0.6666666666666666
    """
    check_reduction(reduction)
    for name, x in (("lower", lower), ("upper", upper), ("target", target)):
        check_tensor(name, x)
    check_target_shape(target.shape, [("lower", lower.shape), ("upper", upper.shape)])
    for name, x in (("lower", lower), ("upper", upper), ("target", target)):
        check_floating(name, x)
        check_nonempty(name, x)
    big = torch.finfo(lower.dtype).max, torch.finfo(upper.dtype).max, torch.finfo(target.dtype).max
    if not values_within(lower, -math.inf, big[0]):  # -inf / +inf: no bound on that side
        check_interval_side("lower", lower, unbounded=-math.inf)
    if not values_within(upper, -big[1], math.inf):
        check_interval_side("upper", upper, unbounded=math.inf)
    if not values_within(target, -big[2], big[2]):
        check_finite("target", target)
    dtype = torch.promote_types(torch.promote_types(lower.dtype, upper.dtype), target.dtype)
    lower, upper, target = (x.to(compute_dtype(dtype)) for x in (lower, upper, target))
    width, penalty = interval_parts(lower, upper, target)
    check_interval_width(width, lower, upper)
    covered = penalty == 0  # exactly lower <= target <= upper
    if reduction == "none":
        return covered.to(torch.float64)
    hits = covered.sum().to(torch.float64)
    return hits if reduction == "sum" else hits / covered.numel()


def observed_frequencies(
    quantiles: Tensor,
    levels: Tensor | Sequence[float],
    target: Tensor,
    *,
    reduction: str = "mean",
) -> Tensor:
    r"""Observed frequency :math:`\hat p_k = \frac1N \sum_i 1\{y_i \le q_{ik}\}` per level.

    For calibrated quantiles :math:`\hat p_k \to \tau_k`; plotting :math:`\hat p_k`
    against :math:`\tau_k` gives the quantile reliability curve.

    Args:
        quantiles: ``(..., K)`` quantiles, non-decreasing along the last dim; the batch
            dims broadcast to the target's shape.
        levels: ``(K,)`` nominal levels, strictly increasing in (0, 1).
        target: non-empty observations, never broadcast.
        reduction: ``'mean'`` (frequencies ``(K,)``) | ``'sum'`` (counts ``(K,)``) |
            ``'none'`` (indicators ``(*target.shape, K)``).

    Returns:
        float64.

    Example:
        >>> import torch
        >>> from torchcal.functional import observed_frequencies
        >>> q = torch.tensor([[-1.0, 1.0], [-1.0, 1.0]])
        >>> observed_frequencies(q, [0.25, 0.75], torch.tensor([0.0, 2.0])).tolist()
        [0.0, 0.5]
    """
    check_reduction(reduction)
    q, _, y = quantile_inputs(quantiles, levels, target, min_levels=1)
    below = (y <= q).expand(*target.shape, q.shape[-1])
    if reduction == "none":
        return below.to(torch.float64)
    counts = below.reshape(-1, q.shape[-1]).sum(dim=0, dtype=torch.float64)
    return counts if reduction == "sum" else counts / target.numel()


def frequency_calibration_error(
    observed: Tensor, levels: Tensor | Sequence[float], *, norm: str = "l1"
) -> Tensor:
    r"""Calibration error of observed frequencies ``(..., K)`` against nominal levels
    ``(K,)``: :math:`\frac1K\sum_k|\hat p_k - \tau_k|` (``'l1'``) or
    :math:`\sqrt{\frac1K\sum_k(\hat p_k - \tau_k)^2}` (``'l2'``), float64 ``(...)``.

    Example:
        >>> import torch
        >>> from torchcal.functional import frequency_calibration_error
        >>> frequency_calibration_error(torch.tensor([0.0, 0.5]), [0.25, 0.75]).item()
        0.25
    """
    check_option("norm", norm, ("l1", "l2"))
    check_tensor("observed", observed)
    tau = check_level_grid("levels", levels)
    if observed.dim() < 1 or observed.shape[-1] != tau.shape[0]:
        raise ValueError(
            f"observed: expected shape (..., K) with K = {tau.shape[0]} (the number of "
            f"levels), got {tuple(observed.shape)}"
        )
    check_probabilities("observed", observed)  # frequencies: in [0, 1], no NaN
    err = observed.to(torch.float64) - tau.to(device=observed.device, dtype=torch.float64)
    return err.abs().mean(dim=-1) if norm == "l1" else err.square().mean(dim=-1).sqrt()


def quantile_calibration_error(
    quantiles: Tensor, levels: Tensor | Sequence[float], target: Tensor, *, norm: str = "l1"
) -> Tensor:
    r"""Quantile calibration error: observed frequency :math:`\hat p_k` vs nominal
    :math:`\tau_k` (:func:`observed_frequencies`).

    ``norm='l1'``: :math:`\frac1K\sum_k |\hat p_k - \tau_k|` (uncertainty-toolbox's mean
    absolute calibration error, the miscalibration area on an equally spaced level grid);
    ``norm='l2'``: :math:`\sqrt{\frac1K\sum_k (\hat p_k - \tau_k)^2}` (its root mean
    squared calibration error). uncertainty-toolbox's grid ``linspace(0, 1, 100)`` adds the
    levels 0 and 1, where the error is 0: its value is ours on the 98 inner levels times
    98/100 (l1) or :math:`\sqrt{98/100}` (l2).

    Args:
        quantiles: ``(..., K)`` quantiles, non-decreasing along the last dim.
        levels: ``(K,)`` nominal levels, strictly increasing in (0, 1).
        target: non-empty observations, never broadcast.
        norm: ``'l1'`` (default) or ``'l2'``.

    Returns:
        a float64 scalar.

    Example:
        >>> import torch
        >>> from torchcal.functional import quantile_calibration_error
        >>> q = torch.tensor([[-1.0, 1.0], [-1.0, 1.0]])
        >>> quantile_calibration_error(q, [0.25, 0.75], torch.tensor([0.0, 2.0])).item()
        0.25
    """
    check_option("norm", norm, ("l1", "l2"))
    observed = observed_frequencies(quantiles, levels, target)
    return frequency_calibration_error(observed, levels, norm=norm)


def sharpness(scale: Tensor) -> Tensor:
    r"""Sharpness :math:`\sqrt{\frac1N\sum_i \sigma_i^2}` of predicted standard deviations
    (uncertainty-toolbox's definition: the root mean predictive variance; lower is sharper).

    Args:
        scale: non-empty predicted standard deviations, all > 0, any shape.

    Returns:
        a float64 scalar.

    Example:
        >>> import torch
        >>> from torchcal.functional import sharpness
        >>> sharpness(torch.tensor([1.0, 7.0])).item()
        5.0
    """
    check_tensor("scale", scale)
    check_floating("scale", scale)
    check_nonempty("scale", scale)
    check_positive("scale", scale)
    return scale.to(torch.float64).square().mean().sqrt()


#: values per block of :func:`central_interval_sums` (its float64 temporaries stay in cache)
COVERAGE_BLOCK = 1 << 16


def central_interval_sums(
    loc: Tensor,
    scale: Tensor,
    target: Tensor,
    factors: Tensor,
    *,
    groups: Tensor | None = None,
    num_groups: int = 1,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Misses, width and penalty sums of the central intervals ``loc -+ k_l scale`` of ``L``
    levels of a location-scale forecast, read from ``(loc, scale)`` without building bounds.

    ``factors`` are the ``k_l`` of the levels (from
    :func:`~torchcal.functional.central_interval_factor`). With :math:`a = |y - \mu|`, the
    target misses level ``l`` when its penalty (distance to the interval, the second part of
    :func:`~torchcal.functional.interval_score`) :math:`\max(a - k_l s, 0)` is positive, and
    every width is :math:`2 k_l s`. So per group: misses :math:`m_l = \#\{a > k_l s\}`,
    width :math:`W_l = 2 k_l \sum s`, penalty :math:`P_l = \sum \max(a - k_l s, 0)`: one fused
    ``a - k s`` per level and column sums, in blocks of :data:`COVERAGE_BLOCK` values on the
    CPU (temporaries that stay in cache; a loop over blocks, not over samples). As everywhere
    in torchcal, each element is computed in the inputs' dtype (at least float32; the interval
    ends are those of that dtype, as :func:`~torchcal.functional.interval_coverage` given
    bounds computed in it) and every sum is accumulated in float64 (the 0/1 hits of a block
    exactly in the compute dtype: a block holds fewer than 2^24 values). Checked input is
    the caller's job (same shapes after broadcasting, ``scale > 0``, finite; a NaN,
    unchecked, counts as a miss). Returns ``(misses, width_sum,
    penalty_sum, rows)``: int64 ``(G, L)``, float64 ``(G, L)`` twice, int64 ``(G,)``.

    Example:
        >>> import torch
        >>> k = torch.tensor([1.0, 2.0], dtype=torch.float64)
        >>> y = torch.tensor([0.5, 1.5, 3.0])
        >>> m, w, p, n = central_interval_sums(torch.zeros(3), torch.ones(3), y, k)
        >>> m.tolist(), w.tolist(), p.tolist(), n.tolist()
        ([[2, 1]], [[6.0, 12.0]], [[2.5, 1.0]], [3])
    """
    loc, scale, target = (x.reshape(-1) for x in torch.broadcast_tensors(loc, scale, target))
    device = target.device
    dtype = torch.promote_types(torch.promote_types(loc.dtype, scale.dtype), target.dtype)
    dtype = torch.promote_types(dtype, torch.float32)
    ks = factors.to(torch.float64).tolist()
    L = len(ks)
    step = COVERAGE_BLOCK if device.type == "cpu" else max(target.numel(), 1)
    m = min(target.numel(), step)
    a = torch.empty(m, dtype=dtype, device=device)
    # per block: rows [s, penalties (L)] summed in float64, rows of 0/1 hits (L) summed as is
    cols = torch.empty((1 + L, m), dtype=dtype, device=device)
    wide = cols if dtype == torch.float64 else torch.empty_like(cols, dtype=torch.float64)
    hits = torch.empty((L, m), dtype=dtype, device=device)
    acc = torch.zeros((1 + 2 * L, num_groups), dtype=torch.float64, device=device)
    g = None if groups is None else groups.reshape(-1).to(device=device, dtype=torch.int64)
    for start in range(0, target.numel(), step):
        part = slice(start, start + step)
        n = target[part].numel()
        ab, cb, hb = a[:n], cols[:, :n], hits[:, :n]
        torch.sub(target[part], loc[part], out=ab).abs_()  # |y - loc|
        sb = cb[0].copy_(scale[part])
        for j, k in enumerate(ks):  # the penalty max(|y - loc| - k s, 0); a miss where > 0
            torch.sub(ab, sb, alpha=k, out=cb[1 + j]).clamp_(min=0.0)
        # 0/1 hits (penalty 0); a NaN (unchecked input) covers nothing, as in the bounds path
        torch.le(cb[1:], 0.0, out=hb)
        cw = wide[:, :n].copy_(cb) if wide is not cols else cb
        if g is None:
            acc[: 1 + L].add_(cw.sum(dim=1, keepdim=True))
            acc[1 + L :].add_(hb.sum(dim=1, keepdim=True))
        else:
            acc[: 1 + L].index_add_(1, g[part], cw)
            acc[1 + L :].index_add_(1, g[part], hb.to(torch.float64))
    k = factors.to(device=device, dtype=torch.float64)
    rows = torch.bincount(g, minlength=num_groups) if g is not None else None
    if rows is None:
        rows = torch.tensor([target.numel()], dtype=torch.int64, device=device)
    acc = acc.T  # (G, 1 + 2L)
    width = 2.0 * k * acc[:, :1]
    misses = rows.unsqueeze(-1) - acc[:, 1 + L :].round().to(torch.int64)
    return misses, width, acc[:, 1 : 1 + L], rows
