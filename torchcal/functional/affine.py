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

# Up to this many parameters the fit is Newton's method with the exact Hessian (P backward
# passes per step, quadratic convergence); beyond it, LBFGS with strong-Wolfe line search.
NEWTON_MAX_PARAMS = 256
MAX_ABS_LOGIT = 1e100


class AffineMap(NamedTuple):
    """An affine map of logits: ``affine(z, weight, bias)``, the Hessian of its mean NLL from
    ``(z, p)`` and the penalty ``penalty(weight, bias)`` added to the fitted objective.

    Optional closed forms (built by :func:`vector_map` / :func:`matrix_map`; without them the
    gradient is autograd's and LBFGS runs unpreconditioned): ``grad(z, R, weight, bias)``, the
    gradient of the penalised objective from the NLL's residual ``R``
    (:func:`~torchcal.functional.recalibration.affine_residual`), and ``curvature(z, p,
    weight, bias)``, the diagonal of its Hessian (the LBFGS preconditioner); and
    ``penalty_hessian()``, the penalty's constant Hessian (else autograd's)."""

    affine: Callable[[Tensor, Tensor, Tensor], Tensor]
    hessian: Callable[[Tensor, Tensor], Tensor]
    penalty: Callable[[Tensor, Tensor], Tensor]
    grad: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None = None
    curvature: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None = None
    penalty_hessian: Callable[[], Tensor] | None = None  # constant; None: autograd's


def vector_map(num_classes: int, weight_reg: float, bias_reg: float) -> AffineMap:
    """Vector scaling ``z * w + b`` with the penalty ``weight_reg / C * ||w - mean(w)||^2 +
    bias_reg / C * ||b||^2`` (:func:`~torchcal.functional.recalibration.vector_penalty`)."""
    C = num_classes

    def grad(z: Tensor, r: Tensor, w: Tensor, b: Tensor) -> Tensor:
        gw, gb = R.vector_nll_grad(z, r)
        pw, pb = R.vector_penalty_grad(w, b, weight_reg, bias_reg)
        return torch.cat([gw + pw, gb + pb])

    def curvature(z: Tensor, p: Tensor, w: Tensor, b: Tensor) -> Tensor:
        pen = torch.cat([torch.full_like(w, weight_reg), torch.full_like(b, bias_reg)])
        return R.vector_nll_hessian_diag(z, p) + 2 / C * pen

    return AffineMap(
        R.vector_affine,
        R.vector_nll_hessian,
        lambda w, b: R.vector_penalty(b, bias_reg, C, w, weight_reg),
        grad,
        curvature,
        lambda: R.vector_penalty_hessian(C, weight_reg, bias_reg),
    )


def matrix_map(num_classes: int, off_diagonal_reg: float, bias_reg: float) -> AffineMap:
    """Matrix scaling ``z @ W.T + b`` with the ODIR penalty
    (:func:`~torchcal.functional.recalibration.matrix_penalty`)."""
    C = num_classes
    off = 1.0 - torch.eye(C, dtype=torch.float64)

    def grad(z: Tensor, r: Tensor, w: Tensor, b: Tensor) -> Tensor:
        gw, gb = R.matrix_nll_grad(z, r)
        pw, pb = R.matrix_penalty_grad(w, b, off_diagonal_reg, bias_reg)
        return torch.cat([(gw + pw).flatten(), gb + pb])

    def curvature(z: Tensor, p: Tensor, w: Tensor, b: Tensor) -> Tensor:
        pen_w = 2 * off_diagonal_reg / (C * (C - 1)) * off.to(w.device)
        pen_b = torch.full_like(b, 2 * bias_reg / C)
        return R.matrix_nll_hessian_diag(z, p) + torch.cat([pen_w.flatten(), pen_b])

    return AffineMap(
        R.matrix_affine,
        R.matrix_nll_hessian,
        lambda w, b: R.matrix_penalty(w, b, off_diagonal_reg, bias_reg),
        grad,
        curvature,
    )


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
        if self.m.grad is not None:  # closed form: one pass, no graph
            self.passes += 1
            w, b = self.split(x.detach())
            out = R.masked_affine(self.m.affine(self.z, w, b), self.mask)
            nll, r = R.affine_residual(out, self.y)
            return nll + self.m.penalty(w, b), self.m.grad(self.z, r, w, b)
        xg = x.detach().clone().requires_grad_(True)
        f = self.total(xg)
        (g,) = torch.autograd.grad(f, [xg])
        return f.detach(), g

    def curvature(self, x: Tensor) -> Tensor | None:
        """The diagonal of the objective's Hessian at ``x`` (``None``: no closed form)."""
        if self.m.curvature is None:
            return None
        w, b = self.split(x.detach())
        p = torch.softmax(R.masked_affine(self.m.affine(self.z, w, b), self.mask), dim=1)
        return self.m.curvature(self.z, p, w, b)

    def hessian(self, x: Tensor) -> Tensor:
        if self.m.penalty_hessian is not None:
            pen = self.m.penalty_hessian().to(x.device)
        else:
            pen = torch.autograd.functional.hessian(
                lambda v: self.m.penalty(*self.split(v)), x, vectorize=True
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
    obj: Objective, x: Tensor, grad_tol: float, max_iter: int, newton_max: int
) -> tuple[Tensor, int, int, str]:
    """Damped Newton with the exact Hessian up to ``newton_max`` parameters (max-abs
    gradient test, Armijo halving down to ``1e-12``), else full-batch LBFGS, diagonally
    preconditioned where the map has a closed-form curvature."""
    if x.numel() <= newton_max:
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
    # diagonal preconditioning (x = s * v, s = curvature^-1/2 at the start, scaled to
    # min(s) = 1): the ODIR-penalised off-diagonal entries and the data-driven diagonal
    # differ in curvature by orders of magnitude; |g| = |g_v| / s <= |g_v| keeps grad_tol
    # a bound on the unscaled gradient
    curv = obj.curvature(x)
    s = torch.ones_like(x) if curv is None else curv.clamp(min=1e-300).rsqrt()
    s = s / s.min()

    def scaled(v: Tensor) -> tuple[Tensor, Tensor]:
        f, g = obj.gradient(v * s)
        return f, g * s

    run = lbfgs(
        scaled,
        x / s,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        grad_tol=grad_tol,
        history_size=20,
    )
    return run.x * s, run.iterations, obj.passes, "lbfgs"


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
    newton_max: int = NEWTON_MAX_PARAMS,
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
        x, iterations, passes, method = minimise(obj, x, grad_tol, max_iter, newton_max)
        grad = obj.gradient(x)[1]
    w, b = obj.split(x.detach())
    nll = affine_objective(m, z, y, w, b, mask)[1]
    grad_norm = float(torch.linalg.vector_norm(grad))
    msgs = []
    # a penalty on every direction but the temperature's keeps the optimum finite and unique
    probe = torch.linspace(0.5, 1.5, x.numel(), dtype=torch.float64, device=z.device)
    penalised = float(m.penalty(*obj.split(probe))) > 0
    if z.shape[0] < x.numel() and not penalised:
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
