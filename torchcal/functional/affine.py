"""Vector and matrix scaling's fit: :func:`fit_affine`, the penalised NLL of a per-class affine
map of multiclass logits minimised in float64, full batch (damped Newton with the exact Hessian
up to :data:`NEWTON_MAX_PARAMS` parameters, else LBFGS). The maps, their NLL Hessians and
penalties are :mod:`torchcal.functional.recalibration`'s; the solvers
:mod:`torchcal.functional._solvers`'. :class:`~torchcal.scaling.VectorScaler` and
:class:`~torchcal.scaling.MatrixScaler` are the shells (their docstrings describe the methods).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from torchcal.functional import recalibration as R
from torchcal.functional._solvers import damped_newton, lbfgs, solve_direction
from torchcal.functional.temperature.chunks import Chunk
from torchcal.functional.temperature.validation import validate_masked_target

__all__ = [
    "AffineMap",
    "AffineSolution",
    "NEWTON_MAX_PARAMS",
    "affine_objective",
    "affine_nll_hessian",
    "affine_inputs",
    "fit_affine",
]

# Up to this many parameters the fit is Newton's method with the exact Hessian (P backward
# passes per step, quadratic convergence); beyond it, LBFGS with strong-Wolfe line search.
NEWTON_MAX_PARAMS = 256
MAX_ABS_LOGIT = 1e100


class AffineMap(NamedTuple):
    """An affine map of logits: ``affine(z, weight, bias)``, the Hessian of its mean NLL from
    ``(z, p)`` and the penalty ``penalty(weight, bias)`` added to the fitted objective."""

    affine: Callable[[Tensor, Tensor, Tensor], Tensor]
    hessian: Callable[[Tensor, Tensor], Tensor]
    penalty: Callable[[Tensor, Tensor], Tensor]


class AffineSolution(NamedTuple):
    """What :func:`fit_affine` found."""

    weight: Tensor
    bias: Tensor
    nll_before: float  # mean NLL at the identity map
    nll_after: float  # mean NLL (no penalty) at the fitted map
    grad_norm: float  # L2 norm of the penalised objective's gradient there
    iterations: int
    passes: int
    method: str  # "newton" or "lbfgs"
    messages: tuple[str, ...]


def affine_objective(
    m: AffineMap, z: Tensor, y: Tensor, weight: Tensor, bias: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``(mean NLL + penalty, mean NLL)`` at the given parameters (float64); with ``mask``,
    ``z`` holds 0 at the masked entries, whose outputs are ``-inf``."""
    nll = F.cross_entropy(R.masked_affine(m.affine(z, weight, bias), mask), y)
    return nll + m.penalty(weight, bias), nll


def affine_nll_hessian(
    m: AffineMap, z: Tensor, weight: Tensor, bias: Tensor, mask: Tensor | None = None
) -> Tensor:
    """Exact Hessian of the mean NLL w.r.t. ``cat(weight.flatten(), bias)`` (``z`` holds 0
    at masked entries: their output is constant, ``p = 0`` there)."""
    p = torch.softmax(R.masked_affine(m.affine(z, weight, bias), mask), dim=1)
    return m.hessian(z, p)


@dataclass
class Objective:
    """The penalised NLL of an affine map over float64 inputs, at a flat parameter vector
    ``cat(weight.flatten(), bias)``; counts its passes over the data."""

    m: AffineMap
    z: Tensor
    y: Tensor
    mask: Tensor | None
    weight_shape: torch.Size
    passes: int = 0

    def split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        nw = self.weight_shape.numel()
        return x[:nw].reshape(self.weight_shape), x[nw:]

    def total(self, x: Tensor) -> Tensor:
        self.passes += 1
        return affine_objective(self.m, self.z, self.y, *self.split(x), self.mask)[0]

    def gradient(self, x: Tensor) -> tuple[Tensor, Tensor]:
        xg = x.detach().clone().requires_grad_(True)
        f = self.total(xg)
        (g,) = torch.autograd.grad(f, [xg])
        return f.detach(), g

    def hessian(self, x: Tensor) -> Tensor:
        pen = torch.autograd.functional.hessian(
            lambda v: self.m.penalty(*self.split(v)), x
        )  # tiny: no data involved
        return affine_nll_hessian(self.m, self.z, *self.split(x), self.mask) + pen


class Probe:
    """The objective at ``x``, each piece computed when asked (see ``_solvers.Probe``)."""

    def __init__(self, objective: Objective, x: Tensor) -> None:
        self.objective, self.x = objective, x
        self._f: float | None = None

    @property
    def f(self) -> float:
        if self._f is None:
            self._f = float(self.objective.total(self.x))
        return self._f

    def gradient(self) -> tuple[float, Tensor]:
        f, g = self.objective.gradient(self.x)
        self._f = float(f)
        return self._f, g

    def hessian(self) -> Tensor:
        return self.objective.hessian(self.x.detach())


def affine_inputs(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """Float64 copies of the inputs, masked entries 0, and the mask (``None``: none)."""
    z = logits.detach().to(torch.float64).clone()
    y = target.detach().to(device=z.device, dtype=torch.long).clone()
    big = float(z.masked_fill(torch.isneginf(z), 0.0).abs().max())
    if big > MAX_ABS_LOGIT:
        raise ValueError(
            f"logits: expected |logits| <= {MAX_ABS_LOGIT:g} (their squares "
            f"enter the float64 Hessian), got {big:g}"
        )
    neg = torch.isneginf(z)
    if not bool(neg.any()):
        return z, y, None
    validate_masked_target(Chunk(z, y))
    return z.masked_fill(neg, 0.0), y, neg


def minimise(
    obj: Objective, x: Tensor, grad_tol: float, max_iter: int
) -> tuple[Tensor, int, int, str]:
    """Damped Newton with the exact Hessian up to :data:`NEWTON_MAX_PARAMS` parameters
    (max-abs gradient test, Armijo halving down to ``1e-12``), else full-batch LBFGS."""
    if x.numel() <= NEWTON_MAX_PARAMS:
        res = damped_newton(
            lambda v: Probe(obj, v),
            x,
            direction=solve_direction,
            grad_tol=grad_tol,
            max_iter=max_iter,
            norm="max",
            min_step=1e-12,
        )
        return res.x.detach(), res.iterations, obj.passes, "newton"
    run = lbfgs(
        obj.gradient,
        x,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        grad_tol=grad_tol,
        history_size=50,
    )
    return run.x, run.iterations, run.evaluations, "lbfgs"


def fit_affine(
    logits: Tensor,
    target: Tensor,
    m: AffineMap,
    weight0: Tensor,
    bias0: Tensor,
    *,
    grad_tol: float = 1e-10,
    max_iter: int = 500,
    name: str = "affine map",
) -> AffineSolution:
    """The parameters of the affine map ``m`` minimising the mean NLL plus its penalty on
    multiclass ``logits`` ``(N, C)`` (``-inf`` masks allowed) and class indices ``target``,
    from ``(weight0, bias0)`` (the identity map); ``name`` heads the messages.

    Example:
        >>> import torch
        >>> from torchcal.functional import recalibration as R
        >>> from torchcal.functional.affine import AffineMap, fit_affine
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
        >>> vector = AffineMap(R.vector_affine, R.vector_nll_hessian,
        ...                    lambda w, b: R.vector_penalty(b, 0.0, 3))
        >>> sol = fit_affine(z, y, vector, torch.ones(3).double(), torch.zeros(3).double())
        >>> [round(v, 1) for v in sol.weight.tolist()], sol.messages
        ([0.5, 0.5, 0.5], ())
    """
    z, y, mask = affine_inputs(logits, target)
    w0, b0 = weight0.to(z.device), bias0.to(z.device)
    obj = Objective(m, z, y, mask, w0.shape)
    x = torch.cat([w0.flatten(), b0])
    nll_before = float(affine_objective(m, z, y, w0, b0, mask)[1])
    with torch.enable_grad():
        x, iterations, passes, method = minimise(obj, x, grad_tol, max_iter)
        grad = obj.gradient(x)[1]
    w, b = obj.split(x.detach())
    nll = affine_objective(m, z, y, w, b, mask)[1]
    grad_norm = float(torch.linalg.vector_norm(grad))
    msgs = []
    if z.shape[0] < x.numel():
        msgs.append(
            f"{name}: fewer samples ({z.shape[0]}) than parameters "
            f"({x.numel()}): the map interpolates the fitting set; use more data, "
            f"a regulariser, or TemperatureScaler"
        )
    elif float(nll) <= 1e-8:
        msgs.append(
            f"{name}: the fitted map separates the fitting set (NLL "
            f"{float(nll):.3g}): a separable set has no finite optimum; the "
            f"parameters are where the gradient fell below grad_tol"
        )
    if not grad_norm <= max(1e-8, math.sqrt(x.numel()) * grad_tol):
        msgs.append(
            f"{name}: LBFGS stopped before the tolerance was met "
            f"(|grad| = {grad_norm:.3g}); a separable set without regularisation "
            f"has no finite optimum"
        )
    return AffineSolution(
        w.detach(),
        b.detach(),
        nll_before,
        float(nll.detach()),
        grad_norm,
        iterations,
        passes,
        method,
        tuple(msgs),
    )
