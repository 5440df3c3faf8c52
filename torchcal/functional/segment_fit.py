"""The segment repair's fit (docs/design.md section 6g): a binary logit map

    z' = (a + sum_s v_s [row in s]) z + b + sum_s u_s [row in s]

over the segments ``s`` of :func:`~torchcal.functional.multicalibration.segment_spec`, whose
offsets ``u`` and slopes ``v`` are shrunk toward the global map ``(a, b)`` by the ridge
penalty ``reg / 2 * (|u|^2 + |v|^2)`` on the mean NLL. ``reg="cv"`` picks the strength on
held-out folds (:func:`torchcal.functional.folds.kfold_indices`) from a warm-started path that
includes the global map alone (``reg = inf``: Platt on the base logits); the guard keeps the
base logits (the identity map) unless the chosen map's cross-validated NLL is below theirs, so
the repair never raises held-out NLL over the base map by more than noise. The objective is
convex; it is minimised in float64 by LBFGS with its closed-form gradient.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional._solvers import cholesky_direction, damped_newton
from torchcal.functional.folds import fold_complement, kfold_indices

#: the strengths of the path (mean-NLL units), strongest first; ``inf``: the global map alone
REG_PATH = (math.inf, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
#: the fold fits' tolerance (max-abs gradient): their NLLs only rank the strengths
_FOLD_TOL = 1e-7


class SegmentSolution(NamedTuple):
    """What :func:`fit_segment_map` found (float64)."""

    slope: Tensor  # () a
    intercept: Tensor  # () b
    slopes: Tensor  # (S,) v
    offsets: Tensor  # (S,) u
    reg: float  # the strength used (inf: the global map alone; nan: the identity kept)
    cv_nll: tuple[float, ...]  # the cross-validated mean NLL of each strength of the path
    cv_nll_identity: float  # the base logits' mean NLL over the same folds
    fallback: bool  # the guard kept the identity map
    nll_before: float  # mean NLL of the base logits (all rows)
    nll_after: float  # mean NLL after the map (all rows)
    iterations: int
    grad_norm: float  # max-abs gradient of the penalised objective at the returned map
    messages: tuple[str, ...]


def segment_logits(
    z: Tensor, x: Tensor, slope: Tensor, intercept: Tensor, slopes: Tensor, offsets: Tensor
) -> Tensor:
    """``(a + x v) z + b + x u`` for base logits ``z`` ``(N,)`` and segment indicators ``x``
    ``(N, S)`` (float)."""
    return (slope + x @ slopes) * z + intercept + x @ offsets


class _Cells(NamedTuple):
    """The rows grouped by their segment memberships: every row of a cell has the same
    indicators, so the sums over rows become sums over cells (``C <= N``)."""

    z: Tensor  # (N,) base logits
    y: Tensor  # (N,) labels
    cell: Tensor  # (N,) int64 the cell of each row
    xbar: Tensor  # (C, 1 + S) [1, indicators] of each cell


def _cells(z: Tensor, y: Tensor, x: Tensor) -> _Cells:
    patterns, cell = torch.unique(x, dim=0, return_inverse=True)
    xbar = torch.cat([torch.ones(patterns.shape[0], 1, dtype=torch.float64), patterns.double()], 1)
    return _Cells(z, y, cell, xbar)


class _Probe:
    """The penalised mean NLL at ``theta = [a, v..., b, u...]`` (see ``_solvers.Probe``)."""

    def __init__(self, c: _Cells, reg: float, theta: Tensor) -> None:
        self.c, self.reg, self.theta = c, reg, theta
        k = c.xbar.shape[1]
        slope, offset = c.xbar @ theta[:k], c.xbar @ theta[k:]  # (C,) per-cell a + x v, b + x u
        self.t = slope[c.cell] * c.z + offset[c.cell]
        pen = theta[1:k] @ theta[1:k] + theta[k + 1 :] @ theta[k + 1 :]
        self._f = float(F.binary_cross_entropy_with_logits(self.t, c.y)) + 0.5 * reg * float(pen)

    @property
    def f(self) -> float:
        return self._f

    def _sum(self, values: Tensor) -> Tensor:
        out = torch.zeros(self.c.xbar.shape[0], dtype=torch.float64)
        return out.index_add_(0, self.c.cell, values)

    def _penalty_mask(self) -> Tensor:
        k = self.c.xbar.shape[1]
        m = torch.ones(2 * k, dtype=torch.float64)
        m[0] = m[k] = 0.0
        return m

    def gradient(self) -> tuple[float, Tensor]:
        c = self.c
        r = (torch.sigmoid(self.t) - c.y) / c.z.numel()
        g = torch.cat([c.xbar.T @ self._sum(r * c.z), c.xbar.T @ self._sum(r)])
        return self._f, g + self.reg * self._penalty_mask() * self.theta

    def hessian(self) -> Tensor:
        c = self.c
        p = torch.sigmoid(self.t)
        w = p * (1 - p) / c.z.numel()
        sums = torch.zeros(3, c.xbar.shape[0], dtype=torch.float64)
        sums.index_add_(1, c.cell, torch.stack([w * c.z * c.z, w * c.z, w]))
        h11, h12, h22 = c.xbar.T @ (sums[:, :, None] * c.xbar)  # three (1 + S)^2 Grams
        h = torch.cat([torch.cat([h11, h12], 1), torch.cat([h12.T, h22], 1)], 0)
        return h + torch.diag(self.reg * self._penalty_mask())


def _fit(
    c: _Cells, reg: float, start: Tensor, grad_tol: float, max_iter: int
) -> tuple[Tensor, int, float]:
    """Damped Newton (exact Hessian, Cholesky) from ``start``: ``(theta, iterations, max-abs
    gradient)``; ``reg = inf`` fits ``(a, b)`` alone (the segment coordinates held at 0)."""
    if math.isinf(reg):
        k = c.xbar.shape[1]
        glob = _Cells(c.z, c.y, torch.zeros_like(c.cell), torch.ones(1, 1, dtype=torch.float64))
        res = damped_newton(
            lambda v: _Probe(glob, 0.0, v),
            start[[0, k]].clone(),
            direction=cholesky_direction,
            grad_tol=grad_tol,
            max_iter=max_iter,
            norm="max",
            min_step=1e-12,
        )
        theta = torch.zeros_like(start)
        theta[0], theta[k] = res.x[0], res.x[1]
        return theta, res.iterations, res.grad_norm
    res = damped_newton(
        lambda v: _Probe(c, reg, v),
        start.clone(),
        direction=cholesky_direction,
        grad_tol=grad_tol,
        max_iter=max_iter,
        norm="max",
        min_step=1e-12,
    )
    return res.x, res.iterations, res.grad_norm


def _path(
    c: _Cells, regs: tuple[float, ...], grad_tol: float, max_iter: int, start: Tensor | None = None
) -> list[tuple[Tensor, int, float]]:
    """The fits along ``regs`` (strongest first), each warm-started from the one before (the
    first from ``start``, else the identity)."""
    theta = _identity(c.xbar.shape[1]) if start is None else start
    out = []
    for reg in regs:
        theta, it, gnorm = _fit(c, reg, theta, grad_tol, max_iter)
        out.append((theta, it, gnorm))
    return out


def _identity(k: int) -> Tensor:
    theta = torch.zeros(2 * k, dtype=torch.float64)
    theta[0] = 1.0
    return theta


def _nll(c: _Cells, theta: Tensor) -> float:
    """The summed NLL of the rows of ``c`` at ``theta``."""
    return float(_Probe(c, 0.0, theta).f) * c.z.numel()


def _cross_validate(
    z: Tensor, y: Tensor, x: Tensor, folds: int, seed: int, tol: float, max_iter: int
) -> tuple[tuple[float, ...], list[list[Tensor]]]:
    """The CV mean NLL of each strength of :data:`REG_PATH` and the folds' solutions, strength
    by strength (each fold warm-started from its own fit at the stronger neighbour). The path
    stops once the CV NLL has risen at two strengths in a row (it is near convex in log reg);
    the strengths not reached read ``inf``."""
    n = z.numel()
    splits = []
    for held in kfold_indices(n, folds, seed):
        keep = fold_complement(n, held)
        splits.append((_cells(z[keep], y[keep], x[keep]), _cells(z[held], y[held], x[held])))
    thetas = [_identity(x.shape[1] + 1) for _ in splits]
    cv: list[float] = []
    fits: list[list[Tensor]] = []
    for reg in REG_PATH:
        total = 0.0
        for j, (fit_rows, held_rows) in enumerate(splits):
            thetas[j] = _fit(fit_rows, reg, thetas[j], tol, max_iter)[0]
            total += _nll(held_rows, thetas[j])
        cv.append(total / n)
        fits.append(list(thetas))
        if len(cv) >= 3 and cv[-1] > cv[-2] > cv[-3]:
            break
    cv += [math.inf] * (len(REG_PATH) - len(cv))
    return tuple(cv), fits


def fit_segment_map(
    logits: Tensor,
    target: Tensor,
    masks: Tensor,
    *,
    reg: float | str = "cv",
    folds: int = 5,
    seed: int = 0,
    grad_tol: float = 1e-9,
    max_iter: int = 500,
) -> SegmentSolution:
    """Fit the segment map (module docstring) on base binary logits ``(N,)``, labels in
    {0, 1} and the segments' row masks ``(S, N)`` (bool; the whole data set is the global map:
    leave it out). ``reg``: ``"cv"`` or a strength ``>= 0`` (``inf``: the global map alone).
    Inputs are checked by the caller (:class:`~torchcal.scaling.SegmentCalibrator`).

    Example:
        >>> import torch
        >>> from torchcal.functional.segment_fit import fit_segment_map
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(4000, generator=g, dtype=torch.float64)
        >>> seg = torch.rand(4000, generator=g) < 0.3
        >>> y = torch.bernoulli(torch.sigmoid(z + 1.0 * seg), generator=g)
        >>> sol = fit_segment_map(z, y, seg[None, :])
        >>> sol.fallback, round(float(sol.offsets[0]), 1), sol.nll_after < sol.nll_before
        (False, 1.0, True)
    """
    z = logits.detach().to(torch.float64)
    y = target.detach().to(torch.float64)
    x = masks.detach().T.contiguous()  # (N, S) bool
    n, k = z.numel(), x.shape[1] + 1
    nll_before = float(F.binary_cross_entropy_with_logits(z, y))
    identity = _identity(k)
    cv: tuple[float, ...] = ()
    cv_identity = nll_before
    start = None
    if reg == "cv":
        cv, fold_fits = _cross_validate(z, y, x, folds, seed, max(grad_tol, _FOLD_TOL), max_iter)
        best = min(range(len(cv)), key=lambda i: (cv[i], i))
        if not cv[best] < cv_identity:  # the base logits' NLL needs no fit: the same on folds
            msg = (
                f"SegmentCalibrator: no strength's cross-validated NLL ({cv[best]:.6g}) is "
                f"below the base logits' ({cv_identity:.6g}); the base map is kept"
            )
            return SegmentSolution(
                *_split(identity, k),
                math.nan,
                cv,
                cv_identity,
                True,
                nll_before,
                nll_before,
                0,
                math.nan,
                (msg,),
            )
        chosen = REG_PATH[best]
        regs: tuple[float, ...] = (chosen,)
        start = torch.stack(fold_fits[best]).mean(0)  # the folds' solutions: a close start
    else:
        chosen = float(reg)
        regs = (math.inf, chosen) if not math.isinf(chosen) else (math.inf,)
    rows = _cells(z, y, x)
    theta, iterations, gnorm = _path(rows, regs, grad_tol, max_iter, start)[-1]
    msgs: tuple[str, ...] = ()
    if not gnorm <= grad_tol:
        msgs = (
            f"SegmentCalibrator: Newton stopped after {iterations} iterations with a max-abs "
            f"gradient of {gnorm:.3g} > grad_tol {grad_tol:g} (raise max_iter)",
        )
    return SegmentSolution(
        *_split(theta, k),
        chosen,
        cv,
        cv_identity,
        False,
        nll_before,
        _nll(rows, theta) / n,
        iterations,
        gnorm,
        msgs,
    )


def _split(theta: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(a, b, v, u)`` of ``theta = [a, v..., b, u...]``."""
    return theta[0], theta[k], theta[1:k], theta[k + 1 :]
