"""Variance scaling's fit: :func:`fit_scale_factor`, the factor ``s`` on a location-scale
forecast's scale minimising the mean NLL (closed form) or the mean CRPS (bracketed Newton on
``log s`` over the closed-form sums of :func:`torchcal.functional.crps_scale.crps_scale_sums`).
:class:`~torchcal.scaling.VarianceScaler` is the shell (its docstring describes the method)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from torchcal.functional._checks import fixed_sum
from torchcal.functional._solvers import bracketed_newton
from torchcal.functional.crps_scale import crps_scale_sums

# the standard deviation of the unit-scale family (a start point of the CRPS fit)
UNIT_SD = {"normal": 1.0, "laplace": math.sqrt(2.0), "logistic": math.pi / math.sqrt(3.0)}


class ScaleSolution(NamedTuple):
    """What :func:`fit_scale_factor` found."""

    scale: float  # the factor s (inside the bounds)
    before: float  # the mean objective at s = 1
    after: float  # the mean objective at s
    grad_norm: float  # |d mean objective / d log s| at s
    iterations: int
    converged: bool
    messages: tuple[str, ...]
    passes: int
    method: str  # "closed_form_nll" or "newton_crps"


def nll_at_unit_scale(family: str, stat: float, b: Tensor) -> float:
    """Mean NLL (nats) at ``s = 1`` from ``stat`` (``mean(r^2)``, normal; ``mean|r|``,
    Laplace) and the scales ``b``: ``mean(log b) + stat / 2 + log(2 pi) / 2``, resp.
    ``mean(log 2b) + stat`` (the log densities read through their sufficient statistics:
    one more pass, not a second call of the scores; tested against scipy's logpdf)."""
    log_b = float(torch.log(b).mean())
    if family == "normal":
        return log_b + 0.5 * stat + 0.5 * math.log(2.0 * math.pi)
    return log_b + math.log(2.0) + stat


def clamp_scale(s: float, bounds: tuple[float, float], msgs: list[str]) -> float:
    lo, hi = bounds
    if not lo <= s <= hi:
        msgs.append(
            f"scale_factor: the optimum s = {s:g} lies outside bounds {bounds}; "
            f"s is set to the bound (every residual 0 gives s = 0)"
        )
        s = min(max(s, lo), hi)
    return s


def fit_nll_scale(r: Tensor, b: Tensor, family: str, bounds: tuple[float, float]) -> ScaleSolution:
    """The NLL-optimal factor in closed form: ``sqrt(mean r^2)`` (normal), ``mean|r|``
    (Laplace), clamped into ``bounds``."""
    normal = family == "normal"
    stat = float((r * r).mean() if normal else r.abs().mean())
    msgs: list[str] = []
    s = clamp_scale(math.sqrt(stat) if normal else stat, bounds, msgs)
    # NLL(s) - NLL(1) = log s + mean(r^2) (1/s^2 - 1) / 2 (normal), log s + mean|r| (1/s - 1)
    # (Laplace); d NLL / d log s = 1 - mean(r^2) / s^2, resp. 1 - mean|r| / s
    inv = 1.0 / (s * s) if normal else 1.0 / s
    before = nll_at_unit_scale(family, stat, b)
    after = before + math.log(s) + stat * (inv - 1.0) * (0.5 if normal else 1.0)
    return ScaleSolution(
        s, before, after, abs(1.0 - stat * inv), 0, not msgs, tuple(msgs), 1, "closed_form_nll"
    )


def fit_crps_scale(
    r: Tensor,
    b: Tensor,
    family: str,
    bounds: tuple[float, float],
    *,
    grad_tol: float,
    max_iter: int,
) -> ScaleSolution:
    """The CRPS-optimal factor by bracketed Newton on ``u = log s`` in ``log(bounds)``."""
    n = r.numel()
    b_sum = float(fixed_sum(b))  # fixed order: the same bits for any thread count
    b_mean = b_sum / n
    count = torch.full((1,), b_sum, dtype=torch.float64)
    lo, hi = (math.log(v) for v in bounds)

    def evaluate(u: Tensor) -> tuple[float, Tensor, Tensor, Tensor]:
        # F(u) = sum_i b_i CRPS(0, e^u, r_i): dF/du = s sum b d_i, d2F/du2 = dF/du + s sum b c_i
        # (d_i = dCRPS/ds, c_i = s d2CRPS/ds2, closed forms)
        s = math.exp(float(u[0]))
        f, d, c = crps_scale_sums(family, r, s, b)
        g = s * d
        return (
            f,
            torch.tensor([g], dtype=torch.float64),
            torch.tensor([g + s * c], dtype=torch.float64),
            count,
        )

    sd = math.sqrt(float(fixed_sum(r * r)) / n) / UNIT_SD[family]
    u0 = torch.tensor([min(max(math.log(max(sd, 1e-300)), lo), hi)], dtype=torch.float64)
    res = bracketed_newton(
        evaluate,
        u0,
        evaluate(u0),
        lower=lo,
        upper=hi,
        grad_tol=grad_tol,
        step_tol=0.0,
        max_iter=max_iter,
    )
    msgs: list[str] = []
    if bool(res.at_lower[0] | res.at_upper[0]):
        msgs.append(
            f"scale_factor: the CRPS optimum lies outside bounds {bounds}; s is set to the bound"
        )
    elif not bool(res.converged[0]):
        msgs.append(f"scale_factor: the CRPS fit stopped after {max_iter} iterations")
    before = crps_scale_sums(family, r, 1.0, b)[0] / n
    after = float(res.payload) / n  # type: ignore[arg-type]
    return ScaleSolution(
        scale=math.exp(float(res.u[0])),
        before=before,
        after=after,
        grad_norm=abs(float(res.grad[0])) * b_mean,  # d mean CRPS / d log s
        iterations=res.iterations,
        converged=not msgs,
        messages=tuple(msgs),
        passes=res.iterations + 2,  # the start, each step, and the value at s = 1
        method="newton_crps",
    )


def fit_scale_factor(
    loc: Tensor,
    scale: Tensor,
    target: Tensor,
    *,
    objective: str = "nll",
    family: str = "normal",
    bounds: tuple[float, float] = (1e-6, 1e6),
    grad_tol: float = 1e-10,
    max_iter: int = 100,
) -> ScaleSolution:
    """The factor ``s`` on ``scale`` minimising the mean ``objective`` (``"nll"``: normal or
    Laplace, closed form; ``"crps"``: normal, Laplace or logistic) of the forecasts
    ``(loc, s * scale)`` for ``target``, in float64; ``loc`` / ``scale`` broadcast to the
    target's shape (checked by :class:`~torchcal.scaling.VarianceScaler`, its shell).

    Example:
        >>> import torch
        >>> from torchcal.functional.variance import fit_scale_factor
        >>> g = torch.Generator().manual_seed(0)
        >>> loc, sd = torch.zeros(4000), torch.ones(4000)
        >>> y = 2 * torch.randn(4000, generator=g)          # twice as spread as forecast
        >>> round(fit_scale_factor(loc, sd, y).scale, 1)
        2.0
        >>> round(fit_scale_factor(loc, sd, y, objective="crps").scale, 1)
        2.0
    """
    shape = target.shape
    b = scale.detach().to(torch.float64).expand(shape).reshape(-1)
    # r = (y - loc) / b in float64, in place (float32 operands are upcast exactly)
    r = target.detach().to(torch.float64, copy=True).reshape(-1)
    r.view(shape).sub_(loc.detach()).div_(scale.detach())
    if objective == "nll":
        return fit_nll_scale(r, b, family, bounds)
    return fit_crps_scale(r, b, family, bounds, grad_tol=grad_tol, max_iter=max_iter)
