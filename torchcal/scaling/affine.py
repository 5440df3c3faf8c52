"""Vector and matrix scaling: per-class affine maps of multiclass logits."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchcal.functional import recalibration as R
from torchcal.functional._solvers import damped_newton, lbfgs, solve_direction
from torchcal.functional._validation import (
    check_class_target,
    check_finite,
    check_finite_value,
    check_int,
)
from torchcal.functional.temperature import Chunk, validate_masked_target
from torchcal.scaling._base import (
    FittedMixin,
    NLLFit,
    check_logits_target,
    check_state_finite,
    logits_as,
    warn_all,
    warn_if_probabilities,
    working_dtype,
)

__all__ = ["VectorScaler", "MatrixScaler"]


# Up to this many parameters the fit is Newton's method with the exact Hessian (P backward
# passes per step, quadratic convergence); beyond it, LBFGS with strong-Wolfe line search.
_NEWTON_MAX_PARAMS = 256
_MAX_ABS_LOGIT = 1e100


@dataclass
class _Objective:
    """The penalised NLL of an affine map over float64 inputs, at a flat parameter vector
    ``cat(weight.flatten(), bias)``; counts its passes over the data."""

    scaler: _AffineScaler
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
        return self.scaler.objective(self.z, self.y, *self.split(x), self.mask)[0]

    def gradient(self, x: Tensor) -> tuple[Tensor, Tensor]:
        xg = x.detach().clone().requires_grad_(True)
        f = self.total(xg)
        (g,) = torch.autograd.grad(f, [xg])
        return f.detach(), g

    def hessian(self, x: Tensor) -> Tensor:
        pen = torch.autograd.functional.hessian(
            lambda v: self.scaler._penalty(*self.split(v)), x
        )  # tiny: no data involved
        return self.scaler._nll_hessian(self.z, *self.split(x), self.mask) + pen


class _Probe:
    """The objective at ``x``, each piece computed when asked (see ``_solvers.Probe``)."""

    def __init__(self, objective: _Objective, x: Tensor) -> None:
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


class _AffineScaler(FittedMixin):
    """Shared fit: float64, full batch, on a convex objective (Newton or LBFGS)."""

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(self, num_classes: int, grad_tol: float, max_iter: int) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.grad_tol = float(grad_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self._init_fitted()

    # the map and its NLL Hessian from (z, p): functions of torchcal.functional.recalibration
    _affine: Callable[[Tensor, Tensor, Tensor], Tensor]
    _hessian: Callable[[Tensor, Tensor], Tensor]

    def _penalty(self, weight: Tensor, bias: Tensor) -> Tensor:
        raise NotImplementedError

    def _identity(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "weight", "bias")

    def _masked_affine(
        self, z: Tensor, weight: Tensor, bias: Tensor, mask: Tensor | None
    ) -> Tensor:
        """The affine map of ``z`` (masked entries already 0), masked outputs ``-inf``."""
        return R.masked_affine(self._affine(z, weight, bias), mask)

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated logits ``(N, C)`` in the dtype of ``logits``; a ``-inf`` (masked) logit
        stays ``-inf`` (probability 0) and contributes nothing to the other classes."""
        self._check_fitted()
        if (
            not isinstance(logits, Tensor)
            or not logits.is_floating_point()
            or logits.dim() != 2
            or logits.shape[1] != self.num_classes
        ):
            raise ValueError(
                f"logits: expected a floating-point tensor of shape (N, {self.num_classes})"
            )
        check_finite("logits", logits, allow_neg_inf=True)
        work = working_dtype(logits)
        w = self.weight.to(device=logits.device, dtype=work)
        b = self.bias.to(device=logits.device, dtype=work)
        z = logits.to(work)
        mask = torch.isneginf(z)
        if not bool(mask.any()):
            return logits_as(self._affine(z, w, b), logits.dtype, 1)
        out = self._masked_affine(z.masked_fill(mask, 0.0), w, b, mask)
        return logits_as(out, logits.dtype, 1)

    def objective(
        self,
        logits: Tensor,
        target: Tensor,
        weight: Tensor,
        bias: Tensor,
        mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(mean NLL + penalty, mean NLL)`` at the given parameters (float64); with
        ``mask``, ``logits`` holds 0 at the masked entries (see :meth:`forward`)."""
        nll = F.cross_entropy(self._masked_affine(logits, weight, bias, mask), target)
        return nll + self._penalty(weight, bias), nll

    def fit(self, logits: Tensor, target: Tensor) -> NLLFit:
        """Fit the weights and biases on multiclass logits ``(N, C)`` and class indices."""
        check_logits_target(logits, target, multiclass_only=True)
        if logits.shape[1] != self.num_classes:
            raise ValueError(
                f"logits: expected {self.num_classes} columns (num_classes), got "
                f"shape {tuple(logits.shape)}"
            )
        check_finite("logits", logits, allow_neg_inf=True)
        check_class_target("target", target, self.num_classes)
        warn_if_probabilities(logits)
        with torch.inference_mode(False), torch.no_grad():
            z, y, mask = self._float64_inputs(logits, target)
            w0, b0 = self._identity()
            w0, b0 = w0.to(z.device), b0.to(z.device)
            obj = _Objective(self, z, y, mask, w0.shape)
            x = torch.cat([w0.flatten(), b0])
            nll_before = float(self.objective(z, y, w0, b0, mask)[1])
            with torch.enable_grad():
                x, iterations, passes, method = self._minimise(obj, x)
                grad = obj.gradient(x)[1]
            w, b = obj.split(x.detach())
            nll = self.objective(z, y, w, b, mask)[1]
            grad_norm = float(torch.linalg.vector_norm(grad))
        msgs = []
        if z.shape[0] < x.numel():
            msgs.append(
                f"{type(self).__name__}: fewer samples ({z.shape[0]}) than parameters "
                f"({x.numel()}): the map interpolates the fitting set; use more data, "
                f"a regulariser, or TemperatureScaler"
            )
        elif float(nll) <= 1e-8:
            msgs.append(
                f"{type(self).__name__}: the fitted map separates the fitting set (NLL "
                f"{float(nll):.3g}): a separable set has no finite optimum; the "
                f"parameters are where the gradient fell below grad_tol"
            )
        if not grad_norm <= max(1e-8, math.sqrt(x.numel()) * self.grad_tol):
            msgs.append(
                f"{type(self).__name__}: LBFGS stopped before the tolerance was met "
                f"(|grad| = {grad_norm:.3g}); a separable set without regularisation "
                f"has no finite optimum"
            )
        self._store("weight", w.detach())
        self._store("bias", b.detach())
        self._mark_fitted()
        return NLLFit(
            nll_before=nll_before,
            nll_after=float(nll.detach()),
            grad_norm=grad_norm,
            iterations=iterations,
            converged=not msgs,
            warnings=warn_all(msgs, stacklevel=3),
            passes=passes,
            method=method,
        )

    def _nll_hessian(
        self, z: Tensor, weight: Tensor, bias: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """Exact Hessian of the mean NLL w.r.t. ``cat(weight.flatten(), bias)`` (``z`` holds 0
        at masked entries: their output is constant, ``p = 0`` there)."""
        p = torch.softmax(self._masked_affine(z, weight, bias, mask), dim=1)
        return self._hessian(z, p)

    def _float64_inputs(
        self, logits: Tensor, target: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Float64 copies of the inputs, masked entries 0, and the mask (``None``: none)."""
        z = logits.detach().to(torch.float64).clone()
        y = target.detach().to(device=z.device, dtype=torch.long).clone()
        big = float(z.masked_fill(torch.isneginf(z), 0.0).abs().max())
        if big > _MAX_ABS_LOGIT:
            raise ValueError(
                f"logits: expected |logits| <= {_MAX_ABS_LOGIT:g} (their squares "
                f"enter the float64 Hessian), got {big:g}"
            )
        neg = torch.isneginf(z)
        if not bool(neg.any()):
            return z, y, None
        validate_masked_target(Chunk(z, y))
        return z.masked_fill(neg, 0.0), y, neg

    def _minimise(self, obj: _Objective, x: Tensor) -> tuple[Tensor, int, int, str]:
        """Damped Newton with the exact Hessian up to ``_NEWTON_MAX_PARAMS`` parameters
        (max-abs gradient test, Armijo halving down to ``1e-12``), else full-batch LBFGS."""
        if x.numel() <= _NEWTON_MAX_PARAMS:
            res = damped_newton(
                lambda v: _Probe(obj, v),
                x,
                direction=solve_direction,
                grad_tol=self.grad_tol,
                max_iter=self.max_iter,
                norm="max",
                min_step=1e-12,
            )
            return res.x.detach(), res.iterations, obj.passes, "newton"
        run = lbfgs(
            obj.gradient,
            x,
            max_iter=self.max_iter,
            max_eval=2 * self.max_iter,
            grad_tol=self.grad_tol,
            history_size=50,
        )
        return run.x, run.iterations, run.evaluations, "lbfgs"


class VectorScaler(_AffineScaler):
    r"""Vector scaling: ``forward(z) = z * weight + bias`` with one scale and bias per class.

    Guo et al. (2017, "On Calibration of Modern Neural Networks") fit ``weight, bias in R^C``
    by minimising the NLL; we add an optional L2 penalty ``bias_reg / C * ||bias||^2``. The
    objective is convex; it is minimised in float64, full batch, to ``grad_tol`` (max-abs
    gradient): by Newton's method with the exact Hessian and backtracking while there are at
    most 256 parameters, else by LBFGS with strong-Wolfe line search. The gradient norm is
    reported (``<= 1e-8`` is tested against ``scipy.optimize`` on the same objective).

    Invariance: none guaranteed -- per-class scales and biases can change the argmax (and the
    accuracy). ``-inf`` logits are masks (fit and forward): a masked entry stays ``-inf``
    (probability 0), whatever the sign of its weight. ``forward`` before ``fit`` raises.

    State: ``weight`` ``(C,)``, ``bias`` ``(C,)`` (float64 parameters, float64 under
    ``.to(dtype)``; finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import VectorScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2 + torch.tensor([0.5, 0.0, -0.5]), 1), 1,
        ...                       generator=g).squeeze(1)
        >>> res = VectorScaler(3).fit(z, y)
        >>> res.converged, res.grad_norm <= 1e-8, res.nll_after < res.nll_before
        (True, True, True)
    """

    _affine = staticmethod(R.vector_affine)
    _hessian = staticmethod(R.vector_nll_hessian)

    def __init__(
        self,
        num_classes: int,
        *,
        bias_reg: float = 0.0,
        grad_tol: float = 1e-10,
        max_iter: int = 500,
    ) -> None:
        super().__init__(num_classes, grad_tol, max_iter)
        self.bias_reg = check_finite_value("bias_reg", bias_reg)
        self.weight = nn.Parameter(torch.ones(num_classes, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

    def _penalty(self, weight: Tensor, bias: Tensor) -> Tensor:
        return R.vector_penalty(bias, self.bias_reg, self.num_classes)

    def _identity(self) -> tuple[Tensor, Tensor]:
        C = self.num_classes
        return torch.ones(C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)


class MatrixScaler(_AffineScaler):
    r"""Matrix scaling: ``forward(z) = z @ weight.T + bias`` with a full ``C x C`` matrix.

    Fit by minimising the NLL plus the ODIR penalty of Kull et al. (2019, "Beyond temperature
    scaling: Obtaining well-calibrated multi-class probabilities with Dirichlet calibration"):

        off_diagonal_reg / (C (C - 1)) * sum_{i != j} W_ij^2 + bias_reg / C * sum_j b_j^2,

    which keeps the map near a per-class scaling (``C^2`` free parameters overfit easily).
    Convex; minimised from the identity in float64 as :class:`VectorScaler` (Newton up to 256
    parameters, i.e. ``C <= 15``, LBFGS with strong-Wolfe line search beyond).

    Invariance: none guaranteed (argmax may change). ``-inf`` logits are masks (fit and
    forward): a masked entry contributes nothing to the other classes (it enters the product
    as 0) and its own output stays ``-inf`` (probability 0). ``forward`` before ``fit`` raises.

    State: ``weight`` ``(C, C)``, ``bias`` ``(C,)`` (float64 parameters, float64 under
    ``.to(dtype)``; finite on load), ``fitted``.

    Example:
        >>> import torch
        >>> from torchcal.scaling import MatrixScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(3000, 3, generator=g)
        >>> y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
        >>> res = MatrixScaler(3).fit(z, y)
        >>> res.converged, res.nll_after < res.nll_before
        (True, True)
    """

    _affine = staticmethod(R.matrix_affine)
    _hessian = staticmethod(R.matrix_nll_hessian)

    def __init__(
        self,
        num_classes: int,
        *,
        off_diagonal_reg: float = 1e-2,
        bias_reg: float = 1e-2,
        grad_tol: float = 1e-10,
        max_iter: int = 500,
    ) -> None:
        super().__init__(num_classes, grad_tol, max_iter)
        self.off_diagonal_reg = check_finite_value("off_diagonal_reg", off_diagonal_reg)
        self.bias_reg = check_finite_value("bias_reg", bias_reg)
        self.weight = nn.Parameter(torch.eye(num_classes, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(num_classes, dtype=torch.float64))

    def _penalty(self, weight: Tensor, bias: Tensor) -> Tensor:
        return R.matrix_penalty(weight, bias, self.off_diagonal_reg, self.bias_reg)

    def _identity(self) -> tuple[Tensor, Tensor]:
        C = self.num_classes
        return torch.eye(C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)
