"""Platt scaling's fit: :func:`fit_platt`, the float64 damped Newton on ``(a, b)``.

The objective (mean cross-entropy of ``sigmoid(a s + b)``, its gradient and Hessian in one
pass) is :func:`torchcal.functional.recalibration.platt_terms`; the solver is
:func:`torchcal.functional._solvers.damped_newton`. :class:`~torchcal.scaling.PlattScaler` is
the shell (input checks, state, warnings; its docstring describes the method).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional._solvers import (
    NewtonResult,
    active_bounds,
    cholesky_direction,
    damped_newton,
    projected_grad_norm,
)
from torchcal.functional.recalibration import platt_terms
from torchcal.functional.scoring import binary_nll


@dataclass
class Point:
    """Platt's objective, gradient and Hessian at one ``(a, b)`` (one pass, all at once)."""

    f: float
    g: Tensor
    h: Tensor

    def gradient(self) -> tuple[float, Tensor]:
        return self.f, self.g

    def hessian(self) -> Tensor:
        return self.h


class PlattSolution(NamedTuple):
    """What :func:`fit_platt` found."""

    a: float  # slope
    b: float  # offset
    nll_before: float  # mean NLL of the 0/1 labels at (1, 0)
    nll_after: float  # mean NLL of the 0/1 labels at (a, b)
    grad_norm: float  # norm of the free part of the objective's gradient at (a, b)
    iterations: int
    passes: int  # objective evaluations, each one pass over the data
    messages: tuple[str, ...]  # why it did not converge (empty: converged)


def smoothed_targets(y: Tensor, n_pos: float, n_neg: float) -> Tensor:
    """Platt's regularised targets: ``(N+ + 1) / (N+ + 2)`` for positives, ``1 / (N- + 2)``
    for negatives (float64, like ``y``)."""
    return torch.where(
        y > 0.5,
        y.new_tensor((n_pos + 1.0) / (n_pos + 2.0)),
        y.new_tensor(1.0 / (n_neg + 2.0)),
    )


def slope_box(a_lo: float, a_hi: float) -> tuple[Tensor, Tensor]:
    """Bounds on ``(a, b)``: the slope in ``[a_lo, a_hi]``, the offset free."""
    return (
        torch.tensor([a_lo, -math.inf], dtype=torch.float64),
        torch.tensor([a_hi, math.inf], dtype=torch.float64),
    )


def solve_platt(
    evaluate: Callable[[Tensor], Point],
    a_lo: float,
    a_hi: float,
    separated: bool,
    max_neg: float,
    min_pos: float,
    b_prior: float,
    *,
    grad_tol: float,
    max_iter: int,
) -> NewtonResult:
    """Projected damped Newton on ``(a, b)`` with ``a`` in ``[a_lo, a_hi]``.

    Separated (0/1 targets): ``a`` pinned on its upper bound, the threshold starting in
    the middle of the gap, Newton steps on ``b`` only. Else from the better of ``(1, 0)``
    (no change) and ``(a_lo, b_prior)`` (the base rate: no score saturates there).
    """
    lower, upper = slope_box(a_lo, a_hi)
    if separated:
        lower = torch.tensor([a_hi, -math.inf], dtype=torch.float64)  # a pinned
        x = torch.tensor([a_hi, -a_hi * (0.5 * max_neg + 0.5 * min_pos)], dtype=torch.float64)
        first = None
    else:
        x = torch.tensor([1.0, 0.0], dtype=torch.float64)
        first = evaluate(x)
        x2 = torch.tensor([a_lo, b_prior], dtype=torch.float64)
        second = evaluate(x2)
        if second.f < first.f or not math.isfinite(first.f):
            x, first = x2, second
    return damped_newton(
        evaluate,
        x,
        direction=cholesky_direction,
        grad_tol=grad_tol,
        max_iter=max_iter,
        lower=lower,
        upper=upper,
        first=first,
    )


def platt_messages(
    res: NewtonResult,
    pg: float,
    bounds: tuple[float, float],
    grad_tol: float,
    *,
    separated: bool,
    max_neg: float,
    min_pos: float,
) -> list[str]:
    """Warnings for a fit that stopped on the slope bound or before the tolerance."""
    a, a_hi = float(res.x[0]), 1.0 / bounds[0]
    msgs = []
    if separated:
        msgs.append(
            f"a: a perfectly separated set (every negative score <= every positive "
            f"one, max {max_neg:g} <= min {min_pos:g}): with 0/1 targets the NLL "
            f"keeps decreasing as a grows; a is bounded at 1/t_min = {a_hi:g} "
            f"(smooth_targets=True keeps the optimum finite)"
        )
    elif res.at_bound:
        side = (
            "t_min (a perfectly separated set, or nearly)"
            if a >= a_hi
            else "t_max (scores no better than, or anti-correlated with, the target)"
        )
        msgs.append(f"a: the NLL keeps decreasing beyond the slope bound; a is bounded at 1/{side}")
    elif pg > grad_tol:
        msgs.append(f"a, b: stopped before the tolerance was met (|grad| = {pg:.3g})")
    return msgs


def fit_platt(
    logits: Tensor,
    target: Tensor,
    *,
    bounds: tuple[float, float] = (1e-3, 1e3),
    grad_tol: float = 1e-12,
    max_iter: int = 100,
    smooth_targets: bool = True,
) -> PlattSolution:
    """``(a, b)`` minimising the mean cross-entropy of ``sigmoid(a * logits + b)`` against
    ``target`` (Platt's smoothed targets by default), with the slope ``a`` in
    ``[1 / bounds[1], 1 / bounds[0]]``: binary logits ``(N,)``, finite, and 0/1 targets of
    both classes (checked by :class:`~torchcal.scaling.PlattScaler`, its shell).

    Example:
        >>> import torch
        >>> from torchcal.functional.platt import fit_platt
        >>> g = torch.Generator().manual_seed(0)
        >>> s = 2 * torch.randn(5000, generator=g)
        >>> y = torch.bernoulli(torch.sigmoid(0.5 * s - 1.0), generator=g)
        >>> sol = fit_platt(s, y)
        >>> round(sol.a, 1), round(sol.b, 1), sol.messages
        (0.5, -1.0, ())
    """
    s = logits.detach().to(torch.float64)
    y = target.detach().to(device=s.device, dtype=torch.float64)
    if bool((y == y[0]).all()):
        raise ValueError(
            "target: expected both classes 0 and 1 (Platt's offset is unbounded on a single class)"
        )
    n_pos = float(y.sum())
    n_neg = float(y.numel()) - n_pos
    t = smoothed_targets(y, n_pos, n_neg) if smooth_targets else y
    a_lo, a_hi = 1.0 / bounds[1], 1.0 / bounds[0]
    passes = 0  # objective evaluations, each one pass over the data

    def evaluate(x: Tensor) -> Point:
        nonlocal passes
        passes += 1
        return Point(*platt_terms(s, t, float(x[0]), float(x[1])))

    nll_before = float(binary_nll(s, y).mean())
    max_neg = float(s[y < 0.5].max())
    min_pos = float(s[y > 0.5].min())
    separated = not smooth_targets and max_neg <= min_pos
    b_prior = math.log((n_pos + 1.0) / (n_neg + 1.0))
    res = solve_platt(
        evaluate,
        a_lo,
        a_hi,
        separated,
        max_neg,
        min_pos,
        b_prior,
        grad_tol=grad_tol,
        max_iter=max_iter,
    )
    a, b = float(res.x[0]), float(res.x[1])
    g = res.probe.gradient()[1]
    pg = projected_grad_norm(g, active_bounds(res.x, g, *slope_box(a_lo, a_hi)))
    msgs = platt_messages(
        res, pg, bounds, grad_tol, separated=separated, max_neg=max_neg, min_pos=min_pos
    )
    return PlattSolution(
        a=a,
        b=b,
        nll_before=nll_before,
        nll_after=float(binary_nll(s * a + b, y).mean()),
        grad_norm=pg,
        iterations=res.iterations,
        passes=passes,
        messages=tuple(msgs),
    )
