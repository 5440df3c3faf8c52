"""The isotonic fits by pool-adjacent-violators: the calibration map of a binary outcome on a
score (:func:`fit_isotonic`, :class:`~torchcal.scaling.IsotonicCalibrator`'s fit) and the
recalibration map of PIT values (:func:`fit_pit_recalibration`,
:class:`~torchcal.scaling.QuantileRecalibrator`'s fit). PAV itself is
:func:`torchcal.functional.recalibration.pool_adjacent_violators`."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional.recalibration import pool_adjacent_violators
from torchcal.functional.scoring import binary_nll


class IsotonicSolution(NamedTuple):
    """An increasing piecewise-linear map through the knots ``(x, y)`` (float64) and how it
    did on the fitting set: ``before`` / ``after`` the objective of the fit (the mean NLL for
    :func:`fit_isotonic`, the mean absolute gap to the nominal ranks for
    :func:`fit_pit_recalibration`), ``rounds`` PAV's pooling rounds."""

    x: Tensor
    y: Tensor
    before: float
    after: float
    rounds: int


def fit_isotonic(score: Tensor, outcome: Tensor) -> IsotonicSolution:
    """The isotonic (non-decreasing) least-squares fit of the 0/1 ``outcome`` on the finite
    float64 ``score`` (its NLL optimum among monotone maps): knots at the distinct scores,
    interior points of flat runs dropped; ``before`` is the NLL of ``sigmoid(score)``.

    Example:
        >>> import torch
        >>> from torchcal.functional.isotonic import fit_isotonic
        >>> sol = fit_isotonic(torch.tensor([0.0, 1.0, 2.0, 3.0]).double(),
        ...                    torch.tensor([0.0, 1.0, 0.0, 1.0]).double())
        >>> sol.x.tolist(), sol.y.tolist()
        ([0.0, 1.0, 2.0, 3.0], [0.0, 0.5, 0.5, 1.0])
    """
    nll_before = float(binary_nll(score, outcome).mean())
    xs, order = torch.sort(score, stable=True)
    os_ = outcome[order]
    ux, inverse, counts = torch.unique_consecutive(xs, return_inverse=True, return_counts=True)
    sums = torch.zeros(ux.numel(), dtype=torch.float64, device=score.device)
    sums.index_add_(0, inverse, os_)
    fitted, rounds = pool_adjacent_violators(sums.cpu(), counts.cpu().to(torch.float64))
    fitted = fitted.to(score.device)
    # keep the ends and the corners; interior points of flat runs add nothing
    keep = torch.ones_like(fitted, dtype=torch.bool)
    if fitted.numel() > 2:
        keep[1:-1] = (fitted[1:-1] != fitted[:-2]) | (fitted[1:-1] != fitted[2:])
    p = fitted[inverse]
    nll_after = float(-(torch.xlogy(os_, p) + torch.xlogy(1 - os_, 1 - p)).mean())
    return IsotonicSolution(ux[keep].clone(), fitted[keep].clone(), nll_before, nll_after, rounds)


def interpolate(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Piecewise-linear ``np.interp(x, xp, fp)`` (``xp`` strictly increasing, clipped ends)."""
    if xp.numel() == 1:
        return fp.expand(x.shape).clone()
    x = x.clamp(float(xp[0]), float(xp[-1]))
    idx = torch.searchsorted(xp, x, right=True).clamp(1, xp.numel() - 1)
    x0, x1, y0, y1 = xp[idx - 1], xp[idx], fp[idx - 1], fp[idx]
    return y0 + ((x - x0) / (x1 - x0)).clamp(0.0, 1.0) * (y1 - y0)


def fit_pit_recalibration(pit: Tensor) -> IsotonicSolution:
    """The increasing map ``R`` of ``[0, 1]`` through ``(0, 0)``, the sorted PIT values at
    their ranks ``k / (n + 1)`` (ties pooled to their mean rank; values of exactly 0 or 1
    are ranked but are no knots, so ``R(0) = 0`` and ``R(1) = 1``) and ``(1, 1)``; ``before`` /
    ``after`` the mean absolute gap between the sorted PIT values (before; after ``R``) and
    their nominal ranks.

    Example:
        >>> import torch
        >>> from torchcal.functional.isotonic import fit_pit_recalibration
        >>> sol = fit_pit_recalibration(torch.tensor([0.1, 0.2, 0.9], dtype=torch.float64))
        >>> sol.x.tolist(), sol.y.tolist(), sol.after
        ([0.0, 0.1, 0.2, 0.9, 1.0], [0.0, 0.25, 0.5, 0.75, 1.0], 0.0)
    """
    p, _ = torch.sort(pit.detach().reshape(-1).to(torch.float64).cpu())
    n = p.numel()
    rank = torch.arange(1, n + 1, dtype=torch.float64) / (n + 1)
    # the points (p_(k), k / (n + 1)) between the anchors (0, 0) and (1, 1); PIT values of
    # exactly 0 or 1 (a float32 CDF rounds there in the tails) keep their ranks but are no
    # knots: pooled with an anchor they moved R(0) above 0 or R(1) below 1, and the
    # recalibrated quantiles at levels near 0 or 1 became infinite
    inside = (p > 0) & (p < 1)
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    px = torch.cat([zero, p[inside], one])
    py = torch.cat([zero, rank[inside], one])
    ux, inverse, counts = torch.unique_consecutive(px, return_inverse=True, return_counts=True)
    sums = torch.zeros(ux.numel(), dtype=torch.float64).index_add_(0, inverse, py)
    # ties pooled to their mean rank; the pooled means strictly increase (the targets
    # are sorted), so PAV pools nothing more and R is strictly increasing
    fitted, rounds = pool_adjacent_violators(sums, counts.to(torch.float64))
    before = float((p - rank).abs().mean())
    after = float((interpolate(p, ux, fitted) - rank).abs().mean())
    return IsotonicSolution(ux, fitted, before, after, rounds)
