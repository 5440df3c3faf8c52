"""The cross-validated strength of a regularised affine map, and its guard against one
temperature (docs/design.md section 4, "Strength by cross-validation").

:func:`cross_validate_path` walks a log-spaced path of penalty strengths from the strongest
(the map closest to its limit) to the weakest on the shared folds of
:func:`~torchcal.functional.folds.kfold_indices`: in each fold the map is fitted (float64,
Newton up to :data:`FOLD_NEWTON_MAX` parameters, else diagonally preconditioned LBFGS, to a
fold tolerance of ``1e-6``) from the fold's solution at the neighbouring, stronger strength (the
first from the scaler's start, e.g. the fold's temperature map), and scored by its held-out
NLL. The walk stops at the first strength that does not lower the best fold-summed held-out NLL
by more than :data:`PATH_TOL` (the path is scored strong to weak, so a map that overfits is
never fitted at the weak end). One temperature is fitted on the same folds: the scaler falls
back to it when the chosen map's cross-validated NLL is not below the temperature's (the
guard).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional import recalibration as R
from torchcal.functional.affine import AffineMap, Objective, minimise
from torchcal.functional.folds import fold_complement, kfold_indices

#: the max-abs gradient tolerance of the fold fits (scoring needs no more; the refit on all
#: rows uses the scaler's ``grad_tol``)
FOLD_GRAD_TOL = 1e-6
#: the walk stops at the first strength that lowers the best cross-validated NLL by no more
#: than this (nats per row; well below the folds' noise, ~1e-3 at 5,000 rows)
PATH_TOL = 1e-4
#: the fold fits use Newton up to this many parameters (a cheap exact Hessian), else LBFGS
FOLD_NEWTON_MAX = 64
_BETA_BOUNDS = (1e-3, 1e3)  # inverse temperatures: TemperatureScaler's default T bounds

#: a map's own fold fit: ``fold_solver(z, y, mask)`` is called once per fold with the fold's fit
#: rows and returns ``fit(x0, strength) -> x``, called along the path (strongest first) with
#: the flat ``cat(weight.flatten(), bias)`` start; it may keep state between strengths (e.g.
#: the last Hessian: :class:`~torchcal.functional.vector_folds.VectorFold`)
FoldSolver = Callable[[Tensor, Tensor, Tensor | None], Callable[[Tensor, float], Tensor]]


class CVPath(NamedTuple):
    """What :func:`cross_validate_path` measured (NLLs in nats per row)."""

    strengths: tuple[float, ...]  # the strengths scored, strongest first
    fold_nll: tuple[tuple[float, ...], ...]  # per strength: each fold's held-out mean NLL
    cv_nll: tuple[float, ...]  # per strength: held-out NLL summed over the folds / N
    temperature_fold_nll: tuple[float, ...]
    temperature_cv_nll: float
    best: int  # index of the lowest cv_nll
    start: tuple[Tensor, Tensor]  # mean of the folds' (weight, bias) at the best strength


def strength_path(scale: float, num: int = 8, top: float = 6.0) -> tuple[float, ...]:
    """``num`` strengths ``scale * 10**k``, ``k = top, top - 1, ...`` (strongest first).

    Example:
        >>> from torchcal.functional.cv import strength_path
        >>> strength_path(0.5, num=3, top=1.0)
        (5.0, 0.5, 0.05)
    """
    return tuple(scale * 10.0 ** (top - k) for k in range(num))


def inverse_temperature(logits: Tensor, target: Tensor, tol: float = 1e-12) -> float:
    """The ``beta = 1 / T`` minimising the mean NLL of ``softmax(beta * logits)`` (float64
    ``(N, C)`` logits, ``-inf`` masks allowed), by Newton's method on the convex 1-D
    objective with halving, inside TemperatureScaler's default bounds ``T in [1e-3, 1e3]``.

    Example:
        >>> import torch
        >>> from torchcal.functional.cv import inverse_temperature
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 4 * torch.randn(2000, 10, generator=g, dtype=torch.float64)
        >>> y = torch.multinomial(torch.softmax(z / 4, 1), 1, generator=g).squeeze(1)
        >>> round(1 / inverse_temperature(z, y), 1)
        4.0
    """
    state: dict = {}

    def terms(beta: float) -> tuple[float, float, float]:
        loss, d1, d2 = R.temperature_terms(logits, target, beta, binary=False, state=state)
        return float(loss.mean()), float(d1.mean()), float(d2.mean())

    lo, hi = _BETA_BOUNDS
    beta = 1.0
    f, g, h = terms(beta)
    for _ in range(100):
        if abs(g) * beta <= tol or (beta <= lo and g > 0) or (beta >= hi and g < 0):
            break
        new = beta - g / h if h > 0 else (beta / 2 if g > 0 else beta * 2)
        new = min(max(new, beta / 4, lo), beta * 4, hi)
        while True:
            f_new, g_new, h_new = terms(new)
            if f_new <= f or abs(new - beta) <= 1e-15 * beta:
                break
            new = 0.5 * (beta + new)
        if not f_new <= f:
            break
        beta, f, g, h = new, f_new, g_new, h_new
    return beta


def _held_out_nll(
    m: AffineMap, z: Tensor, y: Tensor, mask: Tensor | None, x: Tensor, shape: torch.Size
) -> float:
    nw = shape.numel()
    out = R.masked_affine(m.affine(z, x[:nw].reshape(shape), x[nw:]), mask)
    return float(F.cross_entropy(out, y, reduction="sum"))


def cross_validate_path(
    z: Tensor,
    y: Tensor,
    mask: Tensor | None,
    make_map: Callable[[float], AffineMap],
    start: Callable[[Tensor, Tensor, Tensor | None, float, float], tuple[Tensor, Tensor]],
    strengths: tuple[float, ...],
    *,
    folds: int = 5,
    seed: int = 0,
    max_iter: int = 500,
    newton_max: int = 0,
    fold_solver: FoldSolver | None = None,
) -> CVPath:
    """Score the map ``make_map(strength)`` on the shared folds along ``strengths`` (strongest
    first; the walk stops at the first strength not improving on the best by :data:`PATH_TOL`) and one
    temperature on the same folds.

    ``z`` are :func:`~torchcal.functional.affine.affine_inputs`' float64 inputs (0 at the
    masked entries, ``mask`` the ``-inf`` positions or ``None``); ``start(z, y, mask, beta,
    strength)`` gives the first fit's ``(weight, bias)`` in a fold from the fold's fit rows,
    temperature ``1 / beta`` and the first strength (e.g. the temperature map). Fold fits use
    LBFGS (Newton up to ``newton_max`` parameters) to :data:`FOLD_GRAD_TOL`, or the map's own
    ``fold_solver`` (:data:`FoldSolver`).

    Example:
        >>> import torch
        >>> from torchcal.functional.affine import vector_map
        >>> from torchcal.functional.cv import cross_validate_path, strength_path
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(300, 3, generator=g, dtype=torch.float64)
        >>> bias = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
        >>> y = torch.multinomial(torch.softmax(z / 3 + bias, 1), 1, generator=g).squeeze(1)
        >>> path = cross_validate_path(
        ...     z, y, None, lambda lam: vector_map(3, lam, lam),
        ...     lambda z, y, mask, beta, lam: (torch.full((3,), beta).double(), torch.zeros(3).double()),
        ...     strength_path(3 / 300))
        >>> min(path.cv_nll) < path.temperature_cv_nll
        True
    """
    n = z.shape[0]
    held = kfold_indices(n, folds, seed)
    zt = z if mask is None else z.masked_fill(mask, -math.inf)
    parts = []
    solvers: list[Callable[[Tensor, float], Tensor]] = []
    t_fold: list[float] = []
    for ho in held:
        fit = fold_complement(n, ho)
        beta = inverse_temperature(zt[fit], y[fit])
        loss = R.temperature_terms(zt[ho], y[ho], beta, binary=False, state={})[0]
        t_fold.append(float(loss.sum()))
        w0, b0 = start(z[fit], y[fit], None if mask is None else mask[fit], beta, strengths[0])
        sub = (fit, ho, None if mask is None else mask[fit], None if mask is None else mask[ho])
        parts.append((sub, torch.cat([w0.flatten(), b0])))
        if fold_solver is not None:
            solvers.append(fold_solver(z[fit], y[fit], sub[2]))
    fold_nll: list[tuple[float, ...]] = []
    cv: list[float] = []
    best_x: list[Tensor] = []
    shape = w0.shape
    for lam in strengths:
        m = make_map(lam)
        sums, xs = [], []
        for i, ((fit, ho, mfit, mho), x0) in enumerate(parts):
            if solvers:
                x = solvers[i](x0, lam)
            else:
                obj = Objective(m, z[fit], y[fit], mfit, shape)
                with torch.enable_grad():
                    x = minimise(obj, x0, FOLD_GRAD_TOL, max_iter, newton_max)[0]
            parts[i] = ((fit, ho, mfit, mho), x)
            xs.append(x)
            sums.append(_held_out_nll(m, z[ho], y[ho], mho, x, shape))
        fold_nll.append(tuple(s / len(ho) for s, ho in zip(sums, held)))
        cv.append(math.fsum(sums) / n)
        if len(cv) == 1 or cv[-1] < min(cv[:-1]):
            best_x = xs
        if len(cv) > 1 and cv[-1] > min(cv[:-1]) - PATH_TOL:
            break
    best = min(range(len(cv)), key=cv.__getitem__)
    mean_x = torch.stack(best_x).mean(0)
    nw = shape.numel()
    return CVPath(
        tuple(strengths[: len(cv)]),
        tuple(fold_nll),
        tuple(cv),
        tuple(s / len(ho) for s, ho in zip(t_fold, held)),
        math.fsum(t_fold) / n,
        best,
        (mean_x[:nw].reshape(shape), mean_x[nw:]),
    )
