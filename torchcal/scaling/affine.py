"""Vector and matrix scaling: per-class affine maps of multiclass logits."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from torchcal.functional import recalibration as R
from torchcal.functional._checks import check_class_target, check_finite, check_int
from torchcal.functional._validation import check_finite_value
from torchcal.functional.affine import AffineMap, affine_nll_hessian, affine_objective, fit_affine
from torchcal.scaling._base import (
    FittedMixin,
    NLLFit,
    check_logits_target,
    check_state_finite,
    logits_as,
    warn_if_probabilities,
    working_dtype,
)

__all__ = ["VectorScaler", "MatrixScaler"]


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

    def _map(self) -> AffineMap:
        return AffineMap(self._affine, self._hessian, self._penalty)

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
        out = R.masked_affine(self._affine(z.masked_fill(mask, 0.0), w, b), mask)
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
        return affine_objective(self._map(), logits, target, weight, bias, mask)

    def _nll_hessian(
        self, z: Tensor, weight: Tensor, bias: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        return affine_nll_hessian(self._map(), z, weight, bias, mask)

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
            sol = fit_affine(
                logits,
                target,
                self._map(),
                *self._identity(),
                grad_tol=self.grad_tol,
                max_iter=self.max_iter,
                name=type(self).__name__,
            )
        self._store("weight", sol.weight)
        self._store("bias", sol.bias)
        self._mark_fitted()
        return NLLFit.of(sol, sol.method)


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
