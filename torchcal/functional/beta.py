"""Beta calibration's fit (Kull, Silva Filho & Flach, 2017): :func:`fit_beta`, a float64 damped
Newton on the 1-3 coefficients of a logistic regression on ``(ln p, -ln(1 - p))``.

:class:`~torchcal.scaling.BetaScaler` is the shell (input checks, state, warnings; its
docstring describes the method and ``betacal``'s conventions, ``docs/design.md`` section 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn import functional as F

from torchcal.functional._solvers import cholesky_direction, damped_newton

PARAMETERS = ("abm", "ab", "am")
_LN2 = math.log(2.0)


class BetaSolution(NamedTuple):
    """What :func:`fit_beta` found: the map ``logit = a ln p - b ln(1 - p) + c``."""

    a: float
    b: float
    c: float
    m: float  # the midpoint: the p mapped to 1/2 (betacal's map_[2])
    dropped: str  # "abm": "a" or "b" when that coefficient came out < 0 and was refitted as 0
    nll_before: float  # mean NLL of the input probabilities (after betacal's clip)
    nll_after: float  # mean NLL of the fitted map: the minimised objective
    grad_norm: float
    iterations: int
    passes: int
    messages: tuple[str, ...]


@dataclass
class _Point:
    f: float
    g: Tensor
    h: Tensor

    def gradient(self) -> tuple[float, Tensor]:
        return self.f, self.g

    def hessian(self) -> Tensor:
        return self.h


def beta_features(log_p: Tensor, log_q: Tensor, parameters: str) -> Tensor:
    """The regressors of ``parameters`` (float64 ``(N, k)``), betacal's: ``"abm"``
    ``[ln p, -ln(1-p), 1]``, ``"ab"`` ``[ln 2p, ln 2(1-p)]`` (no intercept), ``"am"``
    ``[ln p - ln(1-p), 1]``; ``log_q`` is ``ln(1 - p)``."""
    one = torch.ones_like(log_p)
    if parameters == "abm":
        return torch.stack([log_p, -log_q, one], 1)
    if parameters == "ab":
        return torch.stack([log_p + _LN2, log_q + _LN2], 1)
    return torch.stack([log_p - log_q, one], 1)


def beta_logits(log_p: Tensor, log_q: Tensor, a: float, b: float, c: float) -> Tensor:
    """The calibrated logit ``a ln p - b ln(1 - p) + c``."""
    return a * log_p - b * log_q + c


def _coefficients(w: list[float], parameters: str) -> tuple[float, float, float]:
    """``(a, b, c)`` of the regression coefficients ``w`` of ``parameters``."""
    if parameters == "abm":
        return w[0], w[1], w[2]
    if parameters == "ab":  # a ln 2p + w1 ln 2(1-p) = a ln p - b ln(1-p) + (a - b) ln 2
        return w[0], -w[1], (w[0] + w[1]) * _LN2
    return w[0], w[0], w[1]


def beta_midpoint(a: float, b: float, c: float, parameters: str) -> float:
    """betacal's ``m``: the ``p`` mapped to probability 1/2. ``"ab"``: 0.5; ``"am"``:
    ``sigmoid(-c / a)``; ``"abm"``: the root of ``a ln m - b ln(1 - m) + c`` (monotone in ``m``
    after the refit rule), by bisection on ``logit(m)`` in ``[-745, 745]`` -- where there is no
    root there (the map stays on one side of 1/2), the end nearer to one (0 or 1)."""
    if parameters == "ab":
        return 0.5
    if parameters == "am" and a != 0.0:
        return 1.0 / (1.0 + math.exp(min(c / a, 709.0)))

    def g(t: float) -> float:  # the calibrated logit at p = sigmoid(t), in log space
        log_m = -math.log1p(math.exp(-t)) if t > 0 else t - math.log1p(math.exp(t))
        log_1m = log_m - t
        return a * log_m - b * log_1m + c

    def sigmoid(t: float) -> float:
        return 1.0 / (1.0 + math.exp(-t)) if t >= 0 else math.exp(t) / (1.0 + math.exp(t))

    lo, hi = -745.0, 745.0
    g_lo, g_hi = g(lo), g(hi)
    if not (g_lo < 0.0 < g_hi or g_hi < 0.0 < g_lo):
        return 0.0 if abs(g_lo) <= abs(g_hi) else 1.0
    rising = g_hi > 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if (g(mid) > 0.0) == rising:
            hi = mid
        else:
            lo = mid
    return sigmoid(0.5 * (lo + hi))


def _solve(
    x: Tensor, y: Tensor, w0: list[float], *, grad_tol: float, max_iter: int
) -> tuple[Tensor, float, float, int, int]:
    """Mean logistic loss of ``x @ w`` against ``y`` by damped Newton (exact Hessian) from the
    better of ``w0`` and the base-rate intercept: ``(w, f, |grad|, iterations, passes)``."""
    n = x.shape[0]
    passes = 0

    def evaluate(w: Tensor) -> _Point:
        nonlocal passes
        passes += 1
        z = x @ w
        p = torch.sigmoid(z)
        f = float((F.softplus(z) - y * z).sum()) / n
        g = x.T @ (p - y) / n
        h = (x * (p * (1 - p)).unsqueeze(1)).T @ x / n
        return _Point(f, g, h)

    start = torch.tensor(w0, dtype=torch.float64)
    first = evaluate(start)
    if x.shape[1] and bool((x[:, -1] == 1).all()):  # an intercept: also try the base rate
        rate = float(y.mean())
        alt = torch.zeros_like(start)
        alt[-1] = math.log(rate / (1.0 - rate))
        second = evaluate(alt)
        if second.f < first.f:
            start, first = alt, second
    res = damped_newton(
        evaluate,
        start,
        direction=cholesky_direction,
        grad_tol=grad_tol,
        max_iter=max_iter,
        first=first,
    )
    return res.x, res.probe.f, res.grad_norm, res.iterations, passes


def _identity(parameters: str, k: int) -> list[float]:
    """The coefficients of the identity map (``logit = logit(p)``) in ``k`` regressors."""
    if parameters == "ab":
        return [1.0, -1.0]
    return [1.0] * (k - 1) + [0.0]


def fit_beta(
    log_p: Tensor,
    log_q: Tensor,
    target: Tensor,
    *,
    parameters: str = "abm",
    grad_tol: float = 1e-12,
    max_iter: int = 100,
) -> BetaSolution:
    """Beta calibration of ``p`` given as ``log_p = ln p`` and ``log_q = ln(1 - p)`` (float64
    ``(N,)``, finite) against 0/1 ``target`` of both classes, not perfectly separated by ``p``
    (checked by :class:`~torchcal.scaling.BetaScaler`, its shell): the exact minimum of
    betacal's objective (the mean NLL of a logistic regression on :func:`beta_features`),
    with its rule for ``"abm"``: a coefficient ``a < 0`` (else ``b < 0``) is dropped (set to
    0) and the rest refitted.

    Example:
        >>> import torch
        >>> from torchcal.functional.beta import fit_beta
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.rand(4000, generator=g, dtype=torch.float64) * 0.98 + 0.01
        >>> truth = 2.0 * p.log() - 0.5 * torch.log1p(-p) + 0.3     # a = 2, b = 0.5, c = 0.3
        >>> y = torch.bernoulli(torch.sigmoid(truth), generator=g)
        >>> sol = fit_beta(p.log(), torch.log1p(-p), y)
        >>> round(sol.a, 1), round(sol.b, 1), sol.dropped, sol.messages
        (1.9, 0.6, '', ())
    """
    y = target.to(device=log_p.device, dtype=torch.float64)
    nll_before = float(-(y * log_p + (1 - y) * log_q).mean())
    x = beta_features(log_p, log_q, parameters)
    w, f, gn, iters, passes = _solve(
        x, y, _identity(parameters, x.shape[1]), grad_tol=grad_tol, max_iter=max_iter
    )
    dropped = ""
    if parameters == "abm" and (float(w[0]) < 0.0 or float(w[1]) < 0.0):
        dropped = "a" if float(w[0]) < 0.0 else "b"
        keep = 1 if dropped == "a" else 0
        w2, f, gn, iters2, passes2 = _solve(
            x[:, [keep, 2]], y, [1.0, 0.0], grad_tol=grad_tol, max_iter=max_iter
        )
        iters, passes = iters + iters2, passes + passes2
        w = torch.zeros(3, dtype=torch.float64)
        w[keep], w[2] = w2[0], w2[1]
    a, b, c = _coefficients([float(v) for v in w], parameters)
    msgs = []
    if not gn <= grad_tol:
        msgs.append(
            f"parameters: stopped before the tolerance was met (|grad| = {gn:.3g} after "
            f"{iters} Newton steps; a set that is nearly separated, or max_iter too small)"
        )
    return BetaSolution(
        a=a,
        b=b,
        c=c,
        m=beta_midpoint(a, b, c, parameters),
        dropped=dropped,
        nll_before=nll_before,
        nll_after=f,
        grad_norm=gn,
        iterations=iters,
        passes=passes,
        messages=tuple(msgs),
    )
