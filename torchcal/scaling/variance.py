"""Variance scaling: one factor ``s > 0`` on the predicted scale (the regression temperature)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from torchcal.functional._checks import (
    check_finite,
    check_floating,
    check_int,
    check_option,
    check_positive,
    check_tensor,
    check_values,
)
from torchcal.functional._forecast import broadcast_or_none, check_location_scale
from torchcal.functional._validation import check_finite_value, check_temperature_bounds
from torchcal.functional.variance import fit_scale_factor
from torchcal.scaling._base import FittedMixin, VarianceFit, check_state_finite, warn_all

__all__ = ["VarianceScaler"]

_OBJECTIVES = ("nll", "crps")
_FAMILIES = ("normal", "laplace", "logistic")


class VarianceScaler(FittedMixin):
    r"""One factor ``s > 0`` multiplying a location-scale forecast's scale (variance scaling).

    ``forward(loc, scale) = (loc, s * scale)``: the regression analogue of a temperature. It
    keeps the mean (the location) and, in every row, the order of every quantile
    (``q_tau -> loc + s (q_tau - loc)`` is increasing), so it repairs a forecast whose spread
    is off by one factor (too narrow: ``s > 1``; too wide: ``s < 1``), not a bias or a wrong
    shape (for those see :class:`~torchcal.scaling.QuantileRecalibrator`).

    Fitted on held-out ``(loc, scale, target)`` by minimising, with ``r = (y - loc) / scale``:

    - ``objective="nll"``: the mean negative log-likelihood. Closed forms: normal
      ``s^2 = mean(r^2)``; Laplace ``s = mean(|r|)`` (``family="logistic"`` has none and is
      not offered with the NLL).
    - ``objective="crps"``: the mean CRPS of the family (:func:`~torchcal.functional.crps_normal`
      and its Laplace/logistic twins). ``CRPS(s) = sum_i scale_i CRPS_0(s, r_i)`` is convex in
      ``s`` (a perspective of a convex function); a bracketed Newton iteration on ``log s``
      (``functional/_solvers.py``) reads its exact gradient and curvature from one pass per step
      (:func:`~torchcal.functional.crps_scale.crps_scale_sums`, closed forms, no autograd) and
      stops on ``grad_tol``.

    All sums are float64. The fitted state ``log_scale_factor`` is a float64 buffer that keeps
    its dtype under ``.to(dtype)`` and is validated on load (finite, ``|log s| <= 700``).

    :class:`~torchcal.scaling.VarianceFit`: ``scale`` is ``s``; ``before`` / ``after`` are
    the mean of the fitted ``objective`` at ``s = 1`` and at the fitted ``s`` (the NLL in nats
    for ``"nll"``, the CRPS for ``"crps"``); ``grad_norm`` is ``|d objective / d log s|``.
    A fit that would leave ``bounds`` (e.g. every residual 0) stops on the bound with a
    :class:`~torchcal.scaling.CalibrationWarning` and ``converged=False``.

    Args:
        objective: ``"nll"`` (default) or ``"crps"``.
        family: ``"normal"`` (default), ``"laplace"`` or ``"logistic"`` (CRPS only).
        bounds: ``(s_min, s_max)`` for the factor.
        grad_tol: the CRPS fit stops when ``|d mean CRPS / d log s| / mean(scale) <= grad_tol``.
        max_iter: Newton iteration cap of the CRPS fit.

    Example:
        >>> import torch
        >>> from torchcal.scaling import VarianceScaler
        >>> g = torch.Generator().manual_seed(0)
        >>> loc, scale = torch.zeros(20000), torch.ones(20000)
        >>> y = 2 * torch.randn(20000, generator=g)          # the model's scale is 2x too small
        >>> vs = VarianceScaler()
        >>> res = vs.fit(loc, scale, y)
        >>> round(res.scale, 1), res.after < res.before
        (2.0, True)
        >>> new_loc, new_scale = vs(loc, scale)
        >>> bool(torch.equal(new_loc, loc)), round(float(new_scale[0]), 1)
        (True, 2.0)
        >>> round(VarianceScaler(objective="crps").fit(loc, scale, y).scale, 1)
        2.0
    """

    log_scale_factor: Tensor

    def __init__(
        self,
        *,
        objective: str = "nll",
        family: str = "normal",
        bounds: tuple[float, float] = (1e-6, 1e6),
        grad_tol: float = 1e-10,
        max_iter: int = 100,
    ) -> None:
        super().__init__()
        check_option("objective", objective, _OBJECTIVES)
        check_option("family", family, _FAMILIES)
        if objective == "nll" and family == "logistic":
            raise ValueError(
                "family: the NLL fit supports 'normal' and 'laplace'; use "
                "objective='crps' for family='logistic'"
            )
        self.objective = objective
        self.family = family
        self.bounds = check_temperature_bounds("bounds", bounds)
        self.grad_tol = check_finite_value("grad_tol", grad_tol, strict=True)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)
        self.register_buffer("log_scale_factor", torch.zeros((), dtype=torch.float64))
        self._init_fitted()

    # ------------------------------------------------------------------ state
    def _check_state(self, state: Mapping[str, Tensor], prefix: str) -> None:
        check_state_finite(state, prefix, "log_scale_factor")
        v = state.get("log_scale_factor")
        if v is not None and (v.numel() != 1 or not abs(float(v)) <= 700.0):
            raise ValueError(
                f"{prefix}log_scale_factor: expected one value with 0 < exp(.) < inf in "
                f"float64 (|log s| <= 700), got {v.flatten()[:4].tolist()}"
            )

    @property
    def scale_factor(self) -> float:
        """The fitted factor ``s = exp(log_scale_factor)``; settable (``> 0``, marks fitted)."""
        return math.exp(float(self.log_scale_factor))

    @scale_factor.setter
    def scale_factor(self, value: float) -> None:
        v = check_finite_value("scale_factor", value, strict=True)
        if not abs(math.log(v)) <= 700.0:  # the range a loaded state may hold
            raise ValueError(f"scale_factor: expected exp(-700) <= s <= exp(700), got {v!r}")
        self._store("log_scale_factor", math.log(v))
        self._mark_fitted()

    def extra_repr(self) -> str:
        return (
            f"objective={self.objective!r}, family={self.family!r}, "
            f"scale_factor={self.scale_factor:.6g}, fitted={self.is_fitted}"
        )

    # ------------------------------------------------------------------ forward
    def forward(self, loc: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
        """``(loc, s * scale)``: ``loc`` unchanged (the same tensor), the scale multiplied in
        float64 and returned in the dtype of ``scale`` (one rounding)."""
        self._check_fitted()
        check_floating("loc", check_tensor("loc", loc))
        check_finite("loc", loc)
        check_floating("scale", check_tensor("scale", scale))
        check_positive("scale", scale)
        if broadcast_or_none([loc.shape, scale.shape]) not in (loc.shape, scale.shape):
            raise ValueError(  # e.g. (N,) and (N, 1): an (N, N) forecast, never meant
                f"scale: expected loc's shape {tuple(loc.shape)} or one of the shapes that "
                f"broadcast to it (or loc's to scale's), got {tuple(scale.shape)}"
            )
        s = torch.exp(self.log_scale_factor).to(scale.device)
        out = (scale.to(torch.float64) * s).to(scale.dtype)
        if scale.dtype != torch.float64:  # a narrow dtype can overflow: say so, never inf
            fmax = torch.finfo(scale.dtype).max
            check_values(
                torch.isfinite(out).all(),
                f"scale: the scaled scale exceeds the largest {scale.dtype} ({fmax:.6g}); "
                f"pass scales in a wider dtype",
            )
        return loc, out

    # ------------------------------------------------------------------ fitting
    def fit(self, loc: Tensor, scale: Tensor, target: Tensor) -> VarianceFit:
        """Fit ``s`` on held-out forecasts ``(loc, scale)`` and observations ``target``
        (``loc`` and ``scale`` broadcast to the target's shape; the target never broadcasts;
        ``scale > 0``, everything finite)."""
        loc, scale, target = check_location_scale(loc, scale, target)
        with torch.inference_mode(False), torch.no_grad():
            sol = fit_scale_factor(
                loc,
                scale,
                target,
                objective=self.objective,
                family=self.family,
                bounds=self.bounds,
                grad_tol=self.grad_tol,
                max_iter=self.max_iter,
            )
        self._store("log_scale_factor", math.log(sol.scale))
        self._mark_fitted()
        return VarianceFit(
            scale=sol.scale,
            objective=self.objective,
            before=sol.before,
            after=sol.after,
            grad_norm=sol.grad_norm,
            iterations=sol.iterations,
            converged=sol.converged,
            warnings=warn_all(sol.messages, stacklevel=3),
            passes=sol.passes,
            method=sol.method,
        )
