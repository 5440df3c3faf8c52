"""Platt scaling: a logistic map ``a * s + b`` of a binary score (Platt, 1999)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from torchcal.functional._checks import check_binary_target, check_finite, check_int
from torchcal.functional._validation import check_finite_value, check_temperature_bounds
from torchcal.functional.platt import fit_platt
from torchcal.scaling._base import (
    FittedMixin,
    NLLFit,
    as_binary_vector,
    check_logits_target,
    check_state_finite,
    logits_as,
    warn_if_probabilities,
    working_dtype,
)

__all__ = ["PlattScaler"]


class PlattScaler(FittedMixin):
    r"""Platt scaling of binary logits: ``forward(s) = a * s + b`` (calibrated logits).

    Fit by minimising the mean cross-entropy of ``sigmoid(a s + b)`` (Platt, 1999,
    "Probabilistic Outputs for Support Vector Machines and Comparisons to Regularized
    Likelihood Methods"), a convex problem in ``(a, b)``, solved in float64 by Newton's method
    with the exact 2x2 Hessian (a Cholesky solve; a gradient step where the Hessian is
    singular, e.g. on saturated scores) and an Armijo backtracking line search, to
    ``grad_tol`` on the gradient norm. Unlike a temperature, ``b`` moves the score level (an
    offset): use it when the model's scores are ranked well but sit at the wrong base rate.

    Targets: by default (``smooth_targets=True``) Platt's regularised targets (section 2.2 of
    the paper; scikit-learn's ``_sigmoid_calibration`` does the same):

        t = (N+ + 1) / (N+ + 2) for positives,     t = 1 / (N- + 2) for negatives,

    a prior that keeps the optimum finite even on a perfectly separated set (the slope then
    grows with N like ``log N``, not without bound). ``smooth_targets=False`` fits the plain
    0/1 labels (maximum likelihood). ``nll_before`` / ``nll_after`` in the
    :class:`~torchcal.scaling.NLLFit` are always the NLL of the 0/1 labels (at ``a = 1,
    b = 0`` and at the fitted map); ``grad_norm`` is that of the optimised objective.

    The slope is kept in ``[1 / t_max, 1 / t_min]`` (``bounds`` as for a temperature), so
    ``a > 0``: when the data push it further (0/1 targets on a perfectly separated set --
    every negative score ``<=`` every positive one -- is detected up front: ``a -> inf``;
    scores anti-correlated with the target: ``a <= 0``) it stops on the bound with a
    :class:`~torchcal.scaling.CalibrationWarning` and ``converged=False`` (separated: ``a =
    1 / t_min`` and the threshold ``-b / a`` in the middle of the gap between the classes).

    Invariance (tested): ``a > 0``, so the ranking of the scores, hence the AUC, is kept (in
    the logits' dtype, rounding can tie adjacent scores, never invert them); the decision
    threshold moves (logit 0 maps to ``b``). The NLL of the fitted objective never
    increases (``a = 1, b = 0`` is feasible).

    State: ``weight`` (``a``) and ``bias`` (``b``), 0-dim float64 parameters, and ``fitted``;
    float64 under ``.to(dtype)`` / ``.half()`` / ``.bfloat16()``; validated on load (finite,
    ``a > 0``). ``forward`` before ``fit`` raises :class:`~torchcal.scaling.NotFittedError`.
    Logits may be ``(N,)`` or ``(N, 1)`` (the output has the input's shape and dtype).

    Example:
        >>> import torch
        >>> from torchcal.scaling import PlattScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> s = 2 * torch.randn(5000, generator=g)
        >>> y = torch.bernoulli(torch.sigmoid(0.5 * s - 1.0), generator=g)   # shifted scores
        >>> platt = PlattScaler()
        >>> res = platt.fit(s, y)
        >>> round(platt.weight.item(), 1), round(platt.bias.item(), 1), res.converged
        (0.5, -1.0, True)
        >>> bool((platt(s).argsort() == s.argsort()).all())    # the ranking (AUC) is kept
        True
    """

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(
        self,
        *,
        bounds: tuple[float, float] = (1e-3, 1e3),
        grad_tol: float = 1e-12,
        max_iter: int = 100,
        smooth_targets: bool = True,
    ) -> None:
        super().__init__()
        self.bounds = check_temperature_bounds("bounds", bounds)
        self.grad_tol = check_finite_value("grad_tol", grad_tol)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        if not isinstance(smooth_targets, bool):
            raise ValueError(f"smooth_targets: expected a bool, got {smooth_targets!r}")
        self.smooth_targets = smooth_targets
        self.weight = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self._init_fitted()

    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "weight", "bias")
        a = state.get("weight")
        if a is not None and a.numel() == 1 and not float(a) > 0:
            raise ValueError(
                f"{prefix}weight: expected a slope a > 0 (a map that keeps the "
                f"ranking), got {float(a)!r}"
            )

    def forward(self, logits: Tensor) -> Tensor:
        """``a * logits + b`` (calibrated binary logits, shape and dtype of ``logits``)."""
        self._check_fitted()
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            raise ValueError("logits: expected a floating-point tensor")
        check_finite("logits", logits, allow_neg_inf=True)
        work = working_dtype(logits)
        a = self.weight.to(device=logits.device, dtype=work)
        b = self.bias.to(device=logits.device, dtype=work)
        return logits_as(logits.to(work) * a + b, logits.dtype, None)

    def fit(self, logits: Tensor, target: Tensor) -> NLLFit:
        """Fit ``(a, b)`` on binary logits ``(N,)`` (or ``(N, 1)``) and targets in {0, 1}."""
        logits, target, _ = as_binary_vector(logits, target)
        check_logits_target(logits, target, binary_only=True)
        check_finite("logits", logits)
        check_binary_target("target", target)
        warn_if_probabilities(logits)
        with torch.inference_mode(False), torch.no_grad():
            sol = fit_platt(
                logits,
                target,
                bounds=self.bounds,
                grad_tol=self.grad_tol,
                max_iter=self.max_iter,
                smooth_targets=self.smooth_targets,
            )
        self._store("weight", sol.a)
        self._store("bias", sol.b)
        self._mark_fitted()
        return NLLFit.of(sol, "newton")
