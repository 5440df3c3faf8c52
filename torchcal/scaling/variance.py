"""Variance scaling: one factor ``s > 0`` on the predicted scale (the regression temperature)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from torchcal.functional._checks import fixed_sum
from torchcal.functional._forecast import broadcast_or_none, check_location_scale
from torchcal.functional._solvers import bracketed_newton
from torchcal.functional._validation import (
    check_finite,
    check_finite_value,
    check_floating,
    check_int,
    check_option,
    check_positive,
    check_temperature_bounds,
    check_tensor,
    check_values,
)
from torchcal.functional.crps import crps_scale_sums
from torchcal.scaling._base import FittedMixin, VarianceFit, check_state_finite, warn_all

__all__ = ["VarianceScaler"]

_OBJECTIVES = ("nll", "crps")
_FAMILIES = ("normal", "laplace", "logistic")
# the standard deviation of the unit-scale family (a start point of the CRPS fit)
_UNIT_SD = {"normal": 1.0, "laplace": math.sqrt(2.0), "logistic": math.pi / math.sqrt(3.0)}


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
      (:func:`~torchcal.functional.crps.crps_scale_sums`, closed forms, no autograd) and
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
        shape = target.shape
        with torch.inference_mode(False), torch.no_grad():
            b = scale.detach().to(torch.float64).expand(shape).reshape(-1)
            # r = (y - loc) / b in float64, in place (float32 operands are upcast exactly)
            r = target.detach().to(torch.float64, copy=True).reshape(-1)
            r.view(shape).sub_(loc.detach()).div_(scale.detach())
            if self.objective == "nll":
                return self._fit_nll(r, b)
            return self._fit_crps(r, b)

    def _clamp(self, s: float, msgs: list[str]) -> float:
        lo, hi = self.bounds
        if not lo <= s <= hi:
            msgs.append(
                f"scale_factor: the optimum s = {s:g} lies outside bounds {self.bounds}; "
                f"s is set to the bound (every residual 0 gives s = 0)"
            )
            s = min(max(s, lo), hi)
        return s

    def _nll_at_one(self, stat: float, b: Tensor) -> float:
        """Mean NLL (nats) at ``s = 1`` from ``stat`` (``mean(r^2)``, normal; ``mean|r|``,
        Laplace) and the scales ``b``: ``mean(log b) + stat / 2 + log(2 pi) / 2``, resp.
        ``mean(log 2b) + stat`` (the log densities read through their sufficient statistics:
        one more pass, not a second call of the scores; tested against scipy's logpdf)."""
        log_b = float(torch.log(b).mean())
        if self.family == "normal":
            return log_b + 0.5 * stat + 0.5 * math.log(2.0 * math.pi)
        return log_b + math.log(2.0) + stat

    def _fit_nll(self, r: Tensor, b: Tensor) -> VarianceFit:
        normal = self.family == "normal"
        stat = float((r * r).mean() if normal else r.abs().mean())
        msgs: list[str] = []
        s = self._clamp(math.sqrt(stat) if normal else stat, msgs)
        # NLL(s) - NLL(1) = log s + mean(r^2) (1/s^2 - 1) / 2 (normal), log s + mean|r| (1/s - 1)
        # (Laplace); d NLL / d log s = 1 - mean(r^2) / s^2, resp. 1 - mean|r| / s
        inv = 1.0 / (s * s) if normal else 1.0 / s
        before = self._nll_at_one(stat, b)
        after = before + math.log(s) + stat * (inv - 1.0) * (0.5 if normal else 1.0)
        return self._result(
            s, before, after, abs(1.0 - stat * inv), 0, not msgs, msgs, method="closed_form_nll"
        )

    def _crps_sum(self, r: Tensor, b: Tensor, u: float) -> float:
        """``sum_i b_i CRPS(0, e^u, r_i)`` = the summed CRPS at ``s = e^u``."""
        return crps_scale_sums(self.family, r, math.exp(u), b)[0]

    def _fit_crps(self, r: Tensor, b: Tensor) -> VarianceFit:
        n = r.numel()
        b_sum = float(fixed_sum(b))  # fixed order: the same bits for any thread count
        b_mean = b_sum / n
        count = torch.full((1,), b_sum, dtype=torch.float64)
        lo, hi = (math.log(v) for v in self.bounds)

        def evaluate(u: Tensor) -> tuple[float, Tensor, Tensor, Tensor]:
            # F(u) = sum_i b_i CRPS(0, e^u, r_i): dF/du = s sum b d_i, d2F/du2 = dF/du + s sum b c_i
            # (d_i = dCRPS/ds, c_i = s d2CRPS/ds2, closed forms)
            s = math.exp(float(u[0]))
            f, d, c = crps_scale_sums(self.family, r, s, b)
            g = s * d
            return (
                f,
                torch.tensor([g], dtype=torch.float64),
                torch.tensor([g + s * c], dtype=torch.float64),
                count,
            )

        sd = math.sqrt(float(fixed_sum(r * r)) / n) / _UNIT_SD[self.family]
        u0 = torch.tensor([min(max(math.log(max(sd, 1e-300)), lo), hi)], dtype=torch.float64)
        res = bracketed_newton(
            evaluate,
            u0,
            evaluate(u0),
            lower=lo,
            upper=hi,
            grad_tol=self.grad_tol,
            step_tol=0.0,
            max_iter=self.max_iter,
        )
        msgs: list[str] = []
        if bool(res.at_lower[0] | res.at_upper[0]):
            msgs.append(
                f"scale_factor: the CRPS optimum lies outside bounds {self.bounds}; s is set "
                f"to the bound"
            )
        elif not bool(res.converged[0]):
            msgs.append(f"scale_factor: the CRPS fit stopped after {self.max_iter} iterations")
        u = float(res.u[0])
        before = self._crps_sum(r, b, 0.0) / n
        after = float(res.payload) / n  # type: ignore[arg-type]
        g_mean = abs(float(res.grad[0])) * b_mean  # d mean CRPS / d log s
        return self._result(
            math.exp(u),
            before,
            after,
            g_mean,
            res.iterations,
            not msgs,
            msgs,
            method="newton_crps",
            passes=res.iterations + 2,  # the start, each step, and the value at s = 1
        )

    def _result(
        self,
        s: float,
        before: float,
        after: float,
        grad: float,
        iterations: int,
        converged: bool,
        msgs: list[str],
        *,
        method: str,
        passes: int = 1,
    ) -> VarianceFit:
        self._store("log_scale_factor", math.log(s))
        self._mark_fitted()
        return VarianceFit(
            scale=s,
            objective=self.objective,
            before=before,
            after=after,
            grad_norm=grad,
            iterations=iterations,
            converged=converged,
            warnings=warn_all(msgs, stacklevel=4),
            passes=passes,
            method=method,
        )
